// SupervisedRuntime (runtime_internal.h): the tasks started through the supervisor, their records
// on disk, and how they are polled, stopped, adopted after a restart and removed.
#include "agent/runtime_internal.h"

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "agent/log_pump.h"

namespace gpupool::agent_internal {

using Clock = std::chrono::steady_clock;

// ---- task records ------------------------------------------------------------------------------

TaskRecord RecordFor(const std::string& id, const std::vector<std::string>& argv, const SpawnResult& spawned) {
  TaskRecord rec;
  rec.id = id;
  rec.argv = argv;
  rec.pid = spawned.task;
  rec.pgid = spawned.task;
  if (auto ps = ReadProcStat(rec.pid)) rec.start_time = ps->start_time;
  rec.supervisor_pid = spawned.supervisor;
  if (auto ps = ReadProcStat(rec.supervisor_pid)) rec.supervisor_start_time = ps->start_time;
  rec.started_unix = static_cast<int64_t>(::time(nullptr));
  return rec;
}

std::string TaskRecordToJson(const TaskRecord& rec) {
  nlohmann::json j;
  j["id"] = rec.id;
  j["argv"] = rec.argv;
  j["pid"] = rec.pid;
  j["pgid"] = rec.pgid;
  j["start_time"] = rec.start_time;
  j["supervisor_pid"] = rec.supervisor_pid;
  j["supervisor_start_time"] = rec.supervisor_start_time;
  j["started_unix"] = rec.started_unix;
  j["cgroup_dirs"] = rec.cgroup_dirs;
  j["bundle_dir"] = rec.bundle_dir;
  j["runtime"] = rec.runc ? "runc" : "process";
  return j.dump(2) + "\n";
}

Result<TaskRecord> TaskRecordFromJson(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument("task.json is not a JSON object");
  try {
    TaskRecord rec;
    rec.id = j.at("id").get<std::string>();
    rec.argv = j.value("argv", std::vector<std::string>{});
    rec.pid = j.at("pid").get<pid_t>();
    rec.pgid = j.value("pgid", rec.pid);
    rec.start_time = j.value("start_time", uint64_t{0});
    rec.supervisor_pid = j.at("supervisor_pid").get<pid_t>();
    rec.supervisor_start_time = j.value("supervisor_start_time", uint64_t{0});
    rec.started_unix = j.value("started_unix", int64_t{0});
    rec.cgroup_dirs = j.value("cgroup_dirs", std::vector<std::string>{});
    rec.bundle_dir = j.value("bundle_dir", std::string{});
    rec.runc = j.value("runtime", std::string{"process"}) == "runc";
    return rec;
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument(fmt::format("task.json: {}", e.what()));
  }
}

// ---- SupervisedRuntime -------------------------------------------------------------------------

namespace {

std::string SignalName(int sig) {
  switch (sig) {
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGPIPE: return "SIGPIPE";
    default: return fmt::format("signal {}", sig);
  }
}

}  // namespace

SupervisedRuntime::SupervisedRuntime(std::string state_dir, const RuntimeOptions& options)
    : state_dir_(std::move(state_dir)),
      log_dir_(options.log_dir),
      log_max_bytes_(options.log_max_bytes),
      log_keep_(std::clamp(options.log_keep, 0, kMaxLogKeep)) {
  // Absolute, like the state dir; a directory that cannot be made fails each Start with its error.
  if (!log_dir_.empty() && MakeDirs(log_dir_).ok()) {
    char buf[PATH_MAX];
    if (::realpath(log_dir_.c_str(), buf) != nullptr) log_dir_ = buf;
  }
}

void SupervisedRuntime::SetLogFiles(const std::string& id, SpawnRequest* req) const {
  req->stdout_path = StdoutPath(id);
  req->stderr_path = StderrPath(id);
  req->log_max_bytes = log_max_bytes_;
  req->log_keep = log_keep_;
}

std::string SupervisedRuntime::TaskDir(const std::string& id) const { return state_dir_ + "/" + id; }
std::string SupervisedRuntime::ExitPath(const std::string& id) const { return TaskDir(id) + "/exit.json"; }
std::string SupervisedRuntime::RecordPath(const std::string& id) const { return TaskDir(id) + "/task.json"; }
std::string SupervisedRuntime::StdoutPath(const std::string& id) const {
  return (log_dir_.empty() ? TaskDir(id) : log_dir_ + "/" + id) + "/stdout.log";
}
std::string SupervisedRuntime::StderrPath(const std::string& id) const {
  return (log_dir_.empty() ? TaskDir(id) : log_dir_ + "/" + id) + "/stderr.log";
}

void SupervisedRuntime::AdoptExisting() {
  DIR* dir = ::opendir(state_dir_.c_str());
  if (dir == nullptr) return;
  std::vector<std::string> names;
  while (dirent* e = ::readdir(dir)) names.emplace_back(e->d_name);
  ::closedir(dir);
  for (const auto& name : names) {
    if (!ValidateTaskId(name).ok()) continue;
    auto text = ReadFile(RecordPath(name));
    if (!text.ok()) continue;
    auto rec = TaskRecordFromJson(*text);
    if (!rec.ok() || rec->id != name) continue;
    rec->our_child = false;
    tasks_[name] = std::move(rec).value();
  }
}

Status SupervisedRuntime::PrepareTaskDir(const std::string& id) {
  RETURN_IF_ERROR(ValidateTaskId(id));
  if (tasks_.count(id) != 0 || PathExists(RecordPath(id)))
    return Status::AlreadyExists(fmt::format("task {} already exists; remove it first", id));
  RETURN_IF_ERROR(MakeDirs(TaskDir(id)));
  if (!log_dir_.empty()) RETURN_IF_ERROR(MakeDirs(log_dir_ + "/" + id));
  return Status::Ok();
}

Status SupervisedRuntime::Register(TaskRecord rec) {
  rec.our_child = true;
  // Not fsynced: the record is for an agent that restarts while the task runs; after a power loss
  // there is no task to adopt (and a record lost with it leaves nothing behind to adopt).
  Status st = WriteFileAtomic(RecordPath(rec.id), TaskRecordToJson(rec), /*sync=*/false);
  std::string id = rec.id;
  tasks_[id] = std::move(rec);
  return st.WithContext(fmt::format("task {} runs, but its state could not be saved", id));
}

void SupervisedRuntime::Unregister(const std::string& id) {
  tasks_.erase(id);
  ::unlink(RecordPath(id).c_str());
}

bool SupervisedRuntime::TaskMayRun(TaskRecord& rec) {
  if (ProcessAlive(rec.pid, rec.start_time)) return true;
  // The leader ended, members of its group may not have (a pgid is not reused while it has any;
  // zombies, which nobody may reap soon once the supervisor is gone, do not count).
  return GroupHasLiveMember(rec.pgid);
}

bool SupervisedRuntime::SupervisorAlive(TaskRecord& rec) {
  if (rec.supervisor_reaped) return false;
  // Our own child, or (in a process that outlived an earlier runtime object) still our child:
  // reap it if it is done. The start-time check keeps us from reaping a reused pid.
  bool mine = rec.our_child;
  if (!mine) {
    auto ps = ReadProcStat(rec.supervisor_pid);
    mine = ps && (rec.supervisor_start_time == 0 || ps->start_time == rec.supervisor_start_time);
    if (!mine) {
      rec.supervisor_reaped = true;  // gone (or the pid belongs to someone else now)
      return false;
    }
  }
  int status;
  pid_t r = ::waitpid(rec.supervisor_pid, &status, WNOHANG);
  if (r == rec.supervisor_pid) {
    rec.supervisor_reaped = true;
    return false;
  }
  if (r == 0) return true;  // our child, still running
  // ECHILD: not our child (adopted): look at /proc.
  if (ProcessAlive(rec.supervisor_pid, rec.supervisor_start_time)) return true;
  rec.supervisor_reaped = true;
  return false;
}

Result<TaskStatusInfo> SupervisedRuntime::Poll(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tasks_.find(id);
  if (it == tasks_.end()) return Status::NotFound(fmt::format("no task {}", id));
  TaskRecord& rec = it->second;
  bool alive = SupervisorAlive(rec);
  auto exit_rec = ReadExitRecord(ExitPath(id));
  if (rec.stop_requested && !rec.kill_sent && Clock::now() >= rec.kill_deadline) {
    // Also after the task itself ended: its children may have ignored SIGTERM.
    rec.exited_before_kill = exit_rec.has_value();
    rec.kill_sent = true;
    (void)Signal(rec, SIGKILL);
  }
  if (!exit_rec && !alive) exit_rec = ReadExitRecord(ExitPath(id));  // it may have just finished
  TaskStatusInfo info;
  if (exit_rec) {
    info.state = RunState::kExited;
    int sig = exit_rec->signal;
    int code = exit_rec->code;
    // runc run reports a container killed by a signal as 128+signal.
    if (rec.runc && sig == 0 && code > 128 && code < 128 + 65) sig = code - 128;
    info.exit_code = code;
    info.term_signal = sig;
    info.fenced = exit_rec->fenced;
    if (sig != 0) {
      info.message = fmt::format("killed by {}", SignalName(sig));
      if (sig == SIGKILL && rec.kill_sent && !rec.exited_before_kill) info.message += " after the grace period";
      if (rec.runc) info.message += fmt::format(" (exit status {})", code);
    } else {
      info.message = fmt::format("exit code {}", code);
      if (rec.runc && code != 0) {
        // runc's own failure (a mount, the executable) is in the container's stderr.
        const std::string why = RuncErrorIn(ReadTail(StderrPath(id), 8192));
        if (!why.empty()) info.message += "; runc: " + why;
      }
    }
    if (info.fenced) info.message = "fenced (lease expired): " + info.message;
    return info;
  }
  if (!alive) {
    if (!TaskMayRun(rec)) {
      // Ended after its supervisor: how is not known (never a success), but it runs no more, so a
      // stop asked of it is done.
      info.state = RunState::kExited;
      info.exit_code = -1;
      info.message = fmt::format("ended after its supervisor was gone; no exit status was recorded{}",
                                 rec.stop_requested ? " (stopped)" : "");
      return info;
    }
    info.state = RunState::kUnknown;
    info.message = fmt::format("the supervisor of task {} is gone and recorded no exit status; the task may still run", id);
    return info;
  }
  info.state = RunState::kRunning;
  info.message = rec.stop_requested ? "stopping" : "running";
  return info;
}

Status SupervisedRuntime::Stop(const std::string& id, std::chrono::seconds grace) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tasks_.find(id);
  if (it == tasks_.end()) return Status::NotFound(fmt::format("no task {}", id));
  TaskRecord& rec = it->second;
  bool alive = SupervisorAlive(rec);
  bool exited = ReadExitRecord(ExitPath(id)).has_value();
  if (!rec.stop_requested) {
    if (exited) return Status::Ok();
    // A supervisor gone without an exit record (killed, or with the agent's process group) may
    // have left its task running: it is signalled all the same (Signal checks it is still ours).
    if (!alive && !TaskMayRun(rec)) return Status::Ok();
    rec.stop_requested = true;
    rec.kill_deadline = Clock::now() + grace;
    Status st = Signal(rec, SIGTERM);
    if (grace.count() <= 0) {
      rec.kill_sent = true;
      st = Signal(rec, SIGKILL);
    }
    return st.WithContext(fmt::format("stopping task {}", id));
  }
  if (!rec.kill_sent && Clock::now() >= rec.kill_deadline) {
    rec.exited_before_kill = exited;
    rec.kill_sent = true;
    return Signal(rec, SIGKILL).WithContext(fmt::format("killing task {}", id));
  }
  return Status::Ok();
}

Status SupervisedRuntime::Remove(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tasks_.find(id);
  if (it == tasks_.end()) return Status::NotFound(fmt::format("no task {}", id));
  TaskRecord& rec = it->second;
  bool alive = SupervisorAlive(rec);
  if (alive && !ReadExitRecord(ExitPath(id)))
    return Status::FailedPrecondition(fmt::format("task {} is still running; stop it first", id));
  RETURN_IF_ERROR(Cleanup(rec).WithContext(fmt::format("removing task {}", id)));
  ::unlink(ExitPath(id).c_str());
  ::unlink(RecordPath(id).c_str());
  tasks_.erase(it);
  return Status::Ok();
}

std::vector<std::string> SupervisedRuntime::List() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> ids;
  for (const auto& [id, rec] : tasks_) ids.push_back(id);
  return ids;
}

}  // namespace gpupool::agent_internal
