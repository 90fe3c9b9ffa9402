// The process runtime: each task is a plain process tree in its own process group, started by a
// supervisor (see runtime_internal.h), optionally inside cgroups that carry its CPU and memory
// limits.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <ctime>
#include <map>

#include <fmt/format.h>

#include "agent/process_preload.h"
#include "agent/runtime.h"
#include "agent/runtime_internal.h"

namespace gpupool {
namespace {

using namespace agent_internal;

class ProcessRuntime final : public SupervisedRuntime {
 public:
  ProcessRuntime(std::string state_dir, const RuntimeOptions& options, CgroupLayout cgroups)
      : SupervisedRuntime(std::move(state_dir), options), cgroups_(std::move(cgroups)) {
    AdoptExisting();
    // A process runtime adopts only its own kind of task.
    for (auto it = tasks_.begin(); it != tasks_.end();) {
      if (it->second.runc)
        it = tasks_.erase(it);
      else
        ++it;
    }
    PruneCgroups(cgroups_, TaskIds(), false);
  }
  // Every empty group goes, also an ended task's that no Remove has freed yet (its Cleanup, by a
  // successor, finds nothing to do); a running task's group holds its processes and stays.
  ~ProcessRuntime() override { PruneCgroups(cgroups_, {}, true); }

  std::string name() const override { return "process"; }
  std::string limits_note() const override { return cgroups_.note; }

  Status Start(const LaunchSpec& spec) override {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(ValidateLaunchSpec(spec));
    auto path_it = spec.env.find("PATH");
    std::string path_var = path_it != spec.env.end() ? path_it->second : DefaultPath();
    ASSIGN_OR_RETURN(std::string exe, FindExecutable(spec.argv[0], path_var));
    RETURN_IF_ERROR(PrepareTaskDir(spec.id));

    SpawnRequest req;
    req.executable = exe;
    req.argv = spec.argv;
    std::map<std::string, std::string> env = spec.env;
    if (spec.cuda_ledger) {
      const std::string ledger = CudaLedgerPath(spec.id);
      RETURN_IF_ERROR(MakeCudaLedger(ledger, spec.uid, spec.gid));
      env["GPUPOOL_CUDA_LEDGER"] = ledger;
      // As root the task gets a mount namespace that holds the limiter as a container's does
      // (process_preload.h); otherwise (an agent without root cannot build one) the environment
      // names the library and the limits, and a task can clear them (docs/cuda_limiter.md).
      if (!spec.cuda_limiter.empty() && ::geteuid() == 0) {
        auto files = PrepareProcessCudaLimiter(spec.cuda_limiter, TaskDir(spec.id), ledger, &env);
        if (!files.ok()) return files.status().WithContext(fmt::format("task {}: the CUDA limiter", spec.id));
        req.run_files = std::move(files->run_files);
        req.preload_list = std::move(files->preload_list);
      }
    }
    for (const auto& [k, v] : env) {
      if (k.empty() || k.find('=') != std::string::npos)
        return Status::InvalidArgument(fmt::format("task {}: bad environment variable name '{}'", spec.id, k));
      req.envp.push_back(k + "=" + v);
    }
    req.workdir = spec.workdir.empty() ? TaskDir(spec.id) : spec.workdir;
    if (spec.uid >= 0) {
      // Its own directory, its uid's alone; the rest of the state directory stays root's.
      const std::string work = TaskDir(spec.id) + "/work";
      RETURN_IF_ERROR(MakeOwnedDir(work, spec.uid, spec.gid));
      if (spec.workdir.empty()) req.workdir = work;
      req.keep_paths.push_back(work);
      req.hide_paths.push_back(state_dir_);
      if (!log_dir_.empty()) req.hide_paths.push_back(log_dir_);
    }
    req.uid = spec.uid;
    req.gid = spec.gid;
    req.no_new_privs = spec.no_new_privs;
    req.hide_paths.insert(req.hide_paths.end(), spec.hide_paths.begin(), spec.hide_paths.end());
    req.keep_paths.insert(req.keep_paths.end(), spec.keep_paths.begin(), spec.keep_paths.end());
    // Whatever hides the state directory must leave the task its working directory (a root
    // queue's task runs in its task directory, under the state directory). Never one the job
    // chose: kept, a hidden path (another task's directory, the agent's state) would show again.
    if (!req.hide_paths.empty() && spec.workdir.empty()) req.keep_paths.push_back(req.workdir);
    req.private_dev = spec.private_dev;
    req.devices = spec.devices;
    SetLogFiles(spec.id, &req);
    req.exit_path = ExitPath(spec.id);
    req.lease_path = spec.lease_path;
    if (cgroups_.kind != CgroupLayout::Kind::kNone && (spec.cpu_milli > 0 || spec.memory_bytes > 0 || spec.pids_max > 0)) {
      ASSIGN_OR_RETURN(req.cgroup_dirs,
                       CreateTaskCgroups(cgroups_, spec.id, spec.cpu_milli, spec.memory_bytes, spec.pids_max));
    }

    // The record is written before the task may exec (see SpawnRequest::before_exec).
    req.before_exec = [&](const SpawnResult& spawned) {
      TaskRecord rec = RecordFor(spec.id, spec.argv, spawned);
      rec.cgroup_dirs = req.cgroup_dirs;
      return Register(std::move(rec));
    };
    auto spawned = SpawnSupervised(req);
    if (!spawned.ok()) {
      Unregister(spec.id);
      (void)RemoveCgroupDirs(req.cgroup_dirs);
      return spawned.status().WithContext(fmt::format("starting task {}", spec.id));
    }
    return Status::Ok();
  }

 protected:
  Status Signal(TaskRecord& rec, int sig) override {
    if (rec.pgid <= 1) return Status::Internal(fmt::format("task {} has no process group", rec.id));
    // The group outlives its leader while members remain; the leader's start time guards against
    // signalling a stranger only while the leader is known. A pid (and so a pgid) is not reused
    // while any process still belongs to the group.
    if (::kill(-rec.pgid, sig) != 0 && errno != ESRCH)
      return Status::Internal(fmt::format("kill(-{}, {}): {}", rec.pgid, sig, ErrnoText(errno)));
    return Status::Ok();
  }

  Status Cleanup(TaskRecord& rec) override { return RemoveCgroupDirs(rec.cgroup_dirs); }

  // REQUIRES: mu_ held, or the constructor.
  std::set<std::string> TaskIds() const {
    std::set<std::string> ids;
    for (const auto& entry : tasks_) ids.insert(entry.first);
    return ids;
  }

 private:
  CgroupLayout cgroups_;
};

}  // namespace

Result<std::unique_ptr<Runtime>> MakeProcessRuntime(const RuntimeOptions& options) {
  if (options.state_dir.empty()) return Status::InvalidArgument("process runtime: state_dir is empty");
  RETURN_IF_ERROR(agent_internal::MakeDirs(options.state_dir).WithContext("process runtime"));
  // Absolute, so the default working directory stays right whatever the agent's cwd.
  std::string state_dir = options.state_dir;
  char buf[PATH_MAX];
  if (::realpath(options.state_dir.c_str(), buf) != nullptr) state_dir = buf;
  std::unique_ptr<Runtime> rt =
      std::make_unique<ProcessRuntime>(state_dir, options, agent_internal::DetectCgroups(options.cgroup_root, agent_internal::CgroupScope(state_dir)));
  return rt;
}

}  // namespace gpupool
