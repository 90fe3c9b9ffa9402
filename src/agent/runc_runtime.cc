// The runc runtime: each task is an OCI container. The supervisor (runtime_internal.h) runs
// `runc run <id>` in the foreground: runc passes its own stdio (the log files) to the container
// and exits with the container's status (128+signal when killed), which the supervisor records
// in exit.json. runc's own state lives under <state_dir>/runc-root.
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <ctime>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "agent/runtime.h"
#include "agent/runtime_internal.h"

namespace gpupool {

namespace agent_internal {

Result<std::string> BuildOciConfig(const LaunchSpec& spec, const std::string& rootfs_abs,
                                   const std::string& cgroup_parent) {
  using nlohmann::json;
  if (spec.argv.empty()) return Status::InvalidArgument(fmt::format("task {}: argv is empty", spec.id));
  json env = json::array();
  for (const auto& [k, v] : spec.env) {
    if (k.empty() || k.find('=') != std::string::npos)
      return Status::InvalidArgument(fmt::format("task {}: bad environment variable name '{}'", spec.id, k));
    env.push_back(k + "=" + v);
  }
  const json caps = {"CAP_CHOWN",  "CAP_DAC_OVERRIDE", "CAP_FSETID",           "CAP_FOWNER",
                     "CAP_MKNOD",  "CAP_NET_RAW",      "CAP_SETGID",           "CAP_SETUID",
                     "CAP_SETFCAP", "CAP_SETPCAP",     "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT",
                     "CAP_KILL",   "CAP_AUDIT_WRITE"};
  json process = {
      {"terminal", false},
      {"user", {{"uid", 0}, {"gid", 0}}},
      {"args", spec.argv},
      {"env", env},
      {"cwd", spec.workdir.empty() ? std::string("/") : spec.workdir},
      {"capabilities", {{"bounding", caps}, {"effective", caps}, {"permitted", caps}}},
      // No rlimits: the container inherits the agent's (a fixed RLIMIT_NOFILE above the host's
      // hard limit would make every start fail).
      {"noNewPrivileges", true},
  };
  json mounts = json::array({
      {{"destination", "/proc"}, {"type", "proc"}, {"source", "proc"}},
      {{"destination", "/dev"},
       {"type", "tmpfs"},
       {"source", "tmpfs"},
       {"options", {"nosuid", "strictatime", "mode=755", "size=65536k"}}},
      {{"destination", "/dev/pts"},
       {"type", "devpts"},
       {"source", "devpts"},
       {"options", {"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}}},
      {{"destination", "/dev/shm"},
       {"type", "tmpfs"},
       {"source", "shm"},
       {"options", {"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}}},
      {{"destination", "/dev/mqueue"}, {"type", "mqueue"}, {"source", "mqueue"}, {"options", {"nosuid", "noexec", "nodev"}}},
      {{"destination", "/sys"}, {"type", "sysfs"}, {"source", "sysfs"}, {"options", {"nosuid", "noexec", "nodev", "ro"}}},
      {{"destination", "/sys/fs/cgroup"},
       {"type", "cgroup"},
       {"source", "cgroup"},
       {"options", {"nosuid", "noexec", "nodev", "relatime", "ro"}}},
      // A writable scratch directory: the root filesystem is read-only.
      {{"destination", "/tmp"}, {"type", "tmpfs"}, {"source", "tmpfs"}, {"options", {"nosuid", "nodev", "mode=1777"}}},
  });
  for (const auto& path : spec.readonly_binds) {
    if (path.empty() || path[0] != '/' || !PathExists(path)) continue;  // absent on this host
    mounts.push_back({{"destination", path},
                      {"type", "bind"},
                      {"source", path},
                      {"options", {"rbind", "ro", "nosuid", "nodev"}}});
  }

  // Device cgroup: deny everything, runc adds its defaults (null, zero, tty, ...), we allow GPUs.
  json device_rules = json::array({{{"allow", false}, {"access", "rwm"}}});
  json devices = json::array();
  for (const auto& path : spec.devices) {
    struct stat st;
    if (path.empty() || ::stat(path.c_str(), &st) != 0) continue;  // absent on this host
    if (!S_ISCHR(st.st_mode) && !S_ISBLK(st.st_mode)) continue;
    const char* type = S_ISCHR(st.st_mode) ? "c" : "b";
    int64_t major_n = major(st.st_rdev), minor_n = minor(st.st_rdev);
    devices.push_back({{"path", path},
                       {"type", type},
                       {"major", major_n},
                       {"minor", minor_n},
                       {"fileMode", st.st_mode & 07777},
                       {"uid", 0},
                       {"gid", 0}});
    device_rules.push_back({{"allow", true}, {"type", type}, {"major", major_n}, {"minor", minor_n}, {"access", "rwm"}});
  }

  json resources = {{"devices", device_rules}};
  if (spec.cpu_milli > 0) {
    constexpr int64_t kPeriod = 100000;
    resources["cpu"] = {{"quota", std::max<int64_t>(1000, spec.cpu_milli * kPeriod / 1000)}, {"period", kPeriod}};
  }
  if (spec.memory_bytes > 0) resources["memory"] = {{"limit", spec.memory_bytes}};

  json linux_section = {
      // No network namespace: the task shares the host's network. The agent sets up no container
      // networking (no CNI), and GPU jobs talk to each other (NCCL, RDMA) over the host's NICs.
      {"namespaces",
       json::array({{{"type", "pid"}}, {{"type", "ipc"}}, {{"type", "uts"}}, {{"type", "mount"}}})},
      {"cgroupsPath", cgroup_parent + "/" + spec.id},
      {"resources", resources},
      {"devices", devices},
      {"maskedPaths",
       {"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
        "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware"}},
      {"readonlyPaths", {"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}},
  };
  json config = {
      {"ociVersion", "1.0.2"},
      {"process", process},
      {"root", {{"path", rootfs_abs}, {"readonly", true}}},
      {"hostname", spec.id},
      {"mounts", mounts},
      {"linux", linux_section},
  };
  return config.dump(2) + "\n";
}

}  // namespace agent_internal

namespace {

using namespace agent_internal;

constexpr std::chrono::seconds kHelperTimeout{20};

std::string AbsolutePath(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) != nullptr) return buf;
  return path;
}

class RuncRuntime final : public SupervisedRuntime {
 public:
  RuncRuntime(std::string state_dir, const RuntimeOptions& options, std::string runc)
      : SupervisedRuntime(std::move(state_dir), options), runc_(std::move(runc)), runc_root_(state_dir_ + "/runc-root") {
    AdoptExisting();
    for (auto it = tasks_.begin(); it != tasks_.end();) {
      if (!it->second.runc)
        it = tasks_.erase(it);
      else
        ++it;
    }
  }

  // runc removes each container's group; the agent's scope goes with the runtime, if empty.
  ~RuncRuntime() override { RemoveEmptyCgroupScope("/sys/fs/cgroup", CgroupScope(state_dir_)); }

  std::string name() const override { return "runc"; }

  Status Start(const LaunchSpec& spec) override {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(ValidateLaunchSpec(spec));
    std::string bundle;
    std::string generated;
    if (!spec.bundle.empty()) {
      bundle = AbsolutePath(spec.bundle);
      if (!PathExists(bundle + "/config.json"))
        return Status::InvalidArgument(fmt::format("task {}: bundle {} has no config.json", spec.id, bundle));
      RETURN_IF_ERROR(PrepareTaskDir(spec.id));
    } else {
      if (spec.rootfs.empty())
        return Status::InvalidArgument(fmt::format("task {}: neither a bundle nor a rootfs was given", spec.id));
      struct stat st;
      if (::stat(spec.rootfs.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        return Status::InvalidArgument(fmt::format("task {}: rootfs {} is not a directory", spec.id, spec.rootfs));
      ASSIGN_OR_RETURN(std::string config, BuildOciConfig(spec, AbsolutePath(spec.rootfs), "/gpupool/" + CgroupScope(state_dir_)));
      RETURN_IF_ERROR(PrepareTaskDir(spec.id));
      generated = TaskDir(spec.id) + "/bundle";
      RETURN_IF_ERROR(MakeDirs(generated));
      RETURN_IF_ERROR(WriteFileAtomic(generated + "/config.json", config, /*sync=*/false));  // rewritten every start
      bundle = generated;
    }
    RETURN_IF_ERROR(MakeDirs(runc_root_));
    // A container of this name left in runc's state (an earlier crash) would make `run` fail.
    std::string ignored;
    (void)RunCommand({runc_, "--root", runc_root_, "delete", "--force", spec.id}, &ignored, kHelperTimeout);

    SpawnRequest req;
    req.executable = runc_;
    req.argv = {runc_, "--root", runc_root_, "run", "--bundle", bundle, spec.id};
    req.envp = {"PATH=" + DefaultPath()};
    req.workdir = TaskDir(spec.id);
    SetLogFiles(spec.id, &req);
    req.exit_path = ExitPath(spec.id);
    req.lease_path = spec.lease_path;
    // Killing the group of `runc run` alone may leave the container running: fence through runc.
    if (!spec.lease_path.empty()) req.fence_kill_argv = {runc_, "--root", runc_root_, "kill", "--all", spec.id, "KILL"};
    // The record is written before `runc run` may exec (see SpawnRequest::before_exec).
    req.before_exec = [&](const SpawnResult& spawned) {
      TaskRecord rec = RecordFor(spec.id, spec.argv, spawned);
      rec.runc = true;
      rec.bundle_dir = generated;
      return Register(std::move(rec));
    };
    auto spawned = SpawnSupervised(req);
    if (!spawned.ok()) {
      Unregister(spec.id);
      return spawned.status().WithContext(fmt::format("starting container {}", spec.id));
    }
    return Status::Ok();
  }

 protected:
  Status Signal(TaskRecord& rec, int sig) override {
    std::string out;
    const char* name = sig == SIGKILL ? "KILL" : sig == SIGTERM ? "TERM" : nullptr;
    if (name != nullptr) {
      auto rc = RunCommand({runc_, "--root", runc_root_, "kill", rec.id, name}, &out, kHelperTimeout);
      if (rc.ok() && *rc == 0) return Status::Ok();
    }
    // The container is not (yet, or any more) known to runc: signal the foreground `runc run`,
    // which forwards the signal to the container or, before the container exists, just ends.
    if (ProcessAlive(rec.pid, rec.start_time) && ::kill(-rec.pgid, sig) != 0 && errno != ESRCH)
      return Status::Internal(fmt::format("runc kill {} failed ({}) and kill(-{}) failed: {}", rec.id, out,
                                          rec.pgid, ErrnoText(errno)));
    return Status::Ok();
  }

  Status Cleanup(TaskRecord& rec) override {
    std::string out;
    ASSIGN_OR_RETURN(int rc, RunCommand({runc_, "--root", runc_root_, "delete", "--force", rec.id}, &out,
                                        kHelperTimeout));
    if (rc != 0 && out.find("not exist") == std::string::npos)
      return Status::Internal(fmt::format("runc delete {} exited with {}: {}", rec.id, rc, out));
    if (!rec.bundle_dir.empty()) RETURN_IF_ERROR(RemoveTree(rec.bundle_dir));
    return Status::Ok();
  }

 private:
  std::string runc_;
  std::string runc_root_;
};

}  // namespace

Result<std::unique_ptr<Runtime>> MakeRuncRuntime(const RuntimeOptions& options) {
  if (options.state_dir.empty()) return Status::InvalidArgument("runc runtime: state_dir is empty");
  const char* path_env = std::getenv("PATH");
  auto runc = FindExecutable(options.runc_binary, path_env != nullptr ? path_env : DefaultPath());
  if (runc.ok() && ::access(runc->c_str(), X_OK) != 0)
    runc = Status::NotFound(fmt::format("{}: {}", *runc, ErrnoText(errno)));
  if (!runc.ok())
    return Status::FailedPrecondition(fmt::format("runc runtime: the runc binary '{}' is not available ({})",
                                                  options.runc_binary, runc.status().message()));
  RETURN_IF_ERROR(MakeDirs(options.state_dir).WithContext("runc runtime"));
  std::string state_dir = AbsolutePath(options.state_dir);
  std::unique_ptr<Runtime> rt = std::make_unique<RuncRuntime>(state_dir, options, AbsolutePath(*runc));
  return rt;
}

}  // namespace gpupool
