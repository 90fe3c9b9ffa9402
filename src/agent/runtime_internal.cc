#include "agent/runtime_internal.h"

#include <sys/syscall.h>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <ctime>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "agent/log_pump.h"
#include "agent/supervisor_protocol.h"

namespace gpupool::agent_internal {

namespace {

using Clock = std::chrono::steady_clock;

// Opens with O_CLOEXEC and keeps the descriptor above stdio, so the dup2 onto 0..2 in the child
// never clobbers a descriptor that is still needed.
int OpenHigh(const char* path, int flags, mode_t mode = 0) {
  int fd = ::open(path, flags | O_CLOEXEC, mode);
  if (fd >= 0 && fd < 3) {
    int high = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
    int saved = errno;
    ::close(fd);
    errno = saved;
    fd = high;
  }
  return fd;
}

int DupHigh(int fd) {
  if (fd >= 3) return fd;
  int high = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  ::close(fd);
  return high;
}

}  // namespace

// ---- /proc -------------------------------------------------------------------------------------

std::optional<ProcStat> ReadProcStat(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  auto text = ReadFile(fmt::format("/proc/{}/stat", pid));
  if (!text.ok()) return std::nullopt;
  // The command name (field 2) is in parentheses and may contain anything: parse after the last ')'.
  size_t close = text->rfind(')');
  if (close == std::string::npos || close + 2 >= text->size()) return std::nullopt;
  ProcStat ps;
  ps.state = (*text)[close + 2];
  // Fields after ')' start with field 3 (state); field 22 is the 20th of them.
  size_t pos = close + 2;
  for (int field = 3; field < 22; ++field) {
    pos = text->find(' ', pos);
    if (pos == std::string::npos) return std::nullopt;
    ++pos;
    if (field + 1 == 5) ps.pgrp = static_cast<pid_t>(std::strtol(text->c_str() + pos, nullptr, 10));
  }
  ps.start_time = std::strtoull(text->c_str() + pos, nullptr, 10);
  return ps;
}

bool GroupHasLiveMember(pid_t pgid) {
  if (pgid <= 1) return false;
  DIR* dir = ::opendir("/proc");
  if (dir == nullptr) return false;
  bool found = false;
  while (dirent* e = ::readdir(dir)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || pid <= 0) continue;
    auto ps = ReadProcStat(static_cast<pid_t>(pid));
    if (ps && ps->pgrp == pgid && ps->state != 'Z' && ps->state != 'X') {
      found = true;
      break;
    }
  }
  ::closedir(dir);
  return found;
}

bool ProcessAlive(pid_t pid, uint64_t start_time) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  auto ps = ReadProcStat(pid);
  if (!ps) return false;
  if (ps->state == 'Z' || ps->state == 'X') return false;
  return start_time == 0 || ps->start_time == start_time;
}

// ---- the supervisor ------------------------------------------------------------------------------

namespace {

// Above every descriptor the supervisor's start rearranges (0..4), close-on-exec.
int Above(int fd, int min_fd) {
  if (fd < 0 || fd >= min_fd) return fd;
  int high = ::fcntl(fd, F_DUPFD_CLOEXEC, min_fd);
  ::close(fd);
  return high;
}

std::string FindSupervisor() {
  if (const char* env = std::getenv("GPUPOOL_SUPERVISOR"); env != nullptr && *env != '\0') return env;
  char self[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    std::string dir(self, static_cast<size_t>(n));
    dir.resize(dir.rfind('/') + 1);
    std::string beside = dir + kSupervisorName;
    if (::access(beside.c_str(), X_OK) == 0) return beside;
  }
#ifdef GPUPOOL_SUPERVISOR_BUILD_PATH
  if (::access(GPUPOOL_SUPERVISOR_BUILD_PATH, X_OK) == 0) return GPUPOOL_SUPERVISOR_BUILD_PATH;
#endif
  return {};
}

}  // namespace

const std::string& SupervisorPath() {
  static const std::string path = FindSupervisor();
  return path;
}

Result<SpawnResult> SpawnSupervised(const SpawnRequest& req) {
  if (req.argv.empty()) return Status::InvalidArgument("argv is empty");
  auto has_nul = [](const std::string& s) { return s.find('\0') != std::string::npos; };
  for (const auto& a : req.argv)
    if (has_nul(a)) return Status::InvalidArgument("an argument contains a NUL byte");
  for (const auto& e : req.envp)
    if (has_nul(e)) return Status::InvalidArgument("an environment entry contains a NUL byte");
  // Every descriptor handed over sits at 10 or above, so the dup2s onto 0..5 never clobber one
  // that a later dup2 still reads.
  constexpr int kHigh = 10;
  const std::string& supervisor = SupervisorPath();
  if (supervisor.empty())
    return Status::FailedPrecondition(fmt::format(
        "the task supervisor '{}' is neither beside this program nor at GPUPOOL_SUPERVISOR (build it with "
        "the '{}' target)",
        kSupervisorName, kSupervisorName));

  SupervisorPlan plan;
  plan.executable = req.executable;
  plan.argv = req.argv;
  plan.envp = req.envp;
  plan.workdir = req.workdir;
  for (const auto& dir : req.cgroup_dirs) plan.cgroup_procs.push_back(dir + "/cgroup.procs");
  plan.exit_path = req.exit_path;
  plan.lease_path = req.lease_path;
  plan.fence_argv = req.fence_kill_argv;
  plan.stdout_path = req.stdout_path;
  plan.stderr_path = req.stderr_path;
  plan.log_max_bytes = req.log_max_bytes;
  plan.log_keep = std::clamp(req.log_keep, 0, kMaxLogKeep);
  plan.uid = req.uid;
  plan.gid = req.gid;
  plan.no_new_privs = req.no_new_privs;
  plan.hide_paths = req.hide_paths;
  plan.keep_paths = req.keep_paths;
  plan.private_dev = req.private_dev;
  plan.devices = req.devices;
  plan.run_files = req.run_files;
  plan.preload_list = req.preload_list;
  for (const auto* list : {&plan.hide_paths, &plan.keep_paths, &plan.devices})
    for (const auto& p : *list)
      if (p.empty() || p[0] != '/' || has_nul(p)) return Status::InvalidArgument(fmt::format("sandbox path '{}' is not absolute", p));
  for (const auto& f : plan.run_files)
    if (!ValidRunFileName(f.name) || f.source.empty() || f.source[0] != '/' || has_nul(f.source))
      return Status::InvalidArgument(fmt::format("run file '{}' ({}) is not a plain name and an absolute path", f.name, f.source));
  if (!plan.preload_list.empty() && (plan.preload_list[0] != '/' || has_nul(plan.preload_list)))
    return Status::InvalidArgument(fmt::format("preload list '{}' is not absolute", plan.preload_list));
  std::vector<std::string> args = EncodeSupervisorArgs(plan);
  args.insert(args.begin(), std::string(kSupervisorName));
  // The plan travels in a sealed memory file on fd 5: a command line is readable by every local
  // user (/proc/<pid>/cmdline), and the plan holds the task's environment.
  const std::string plan_text = JoinPlanArgs(args);
  if (plan_text.size() > kMaxPlanBytes) return Status::InvalidArgument("the task's command and environment are too large");
  FdCloser plan_fd(Above(::memfd_create("gpupool-plan", MFD_CLOEXEC | MFD_ALLOW_SEALING), kHigh));
  if (plan_fd.get() < 0) return Status::IoError(fmt::format("memfd_create: {}", ErrnoText(errno)));
  for (size_t off = 0; off < plan_text.size();) {
    ssize_t w = ::write(plan_fd.get(), plan_text.data() + off, plan_text.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Status::IoError(fmt::format("writing the supervisor's plan: {}", ErrnoText(errno)));
    off += static_cast<size_t>(w);
  }
  if (::fcntl(plan_fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0 ||
      ::lseek(plan_fd.get(), 0, SEEK_SET) != 0)
    return Status::IoError(fmt::format("sealing the supervisor's plan: {}", ErrnoText(errno)));
  std::string plan_arg = "--plan-fd=5";
  std::string name_arg = kSupervisorName;
  char* sup_argv[] = {name_arg.data(), plan_arg.data(), nullptr};
  // The supervisor's own environment: not the task's (see supervisor_protocol.h).
  std::string path_env = "PATH=" + DefaultPath();
  char* sup_envp[] = {path_env.data(), nullptr};

  FdCloser devnull(Above(OpenHigh("/dev/null", O_RDWR), kHigh));
  if (devnull.get() < 0) return Status::IoError(fmt::format("cannot open /dev/null: {}", ErrnoText(errno)));
  FdCloser out(Above(OpenHigh(req.stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600), kHigh));
  if (out.get() < 0)
    return Status::IoError(fmt::format("cannot create {}: {}", req.stdout_path, ErrnoText(errno)));
  FdCloser err(Above(OpenHigh(req.stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600), kHigh));
  if (err.get() < 0)
    return Status::IoError(fmt::format("cannot create {}: {}", req.stderr_path, ErrnoText(errno)));
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0)
    return Status::IoError(fmt::format("cannot create a pipe: {}", ErrnoText(errno)));
  FdCloser pipe_r(Above(pipefd[0], kHigh));
  FdCloser pipe_w(Above(pipefd[1], kHigh));
  if (pipe_r.get() < 0 || pipe_w.get() < 0) return Status::IoError("cannot place the status pipe");
  // The go channel. A socket pair rather than a pipe: send() with MSG_NOSIGNAL, so a task that
  // died early costs no SIGPIPE here.
  int gofd[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, gofd) != 0)
    return Status::IoError(fmt::format("cannot create a socket pair: {}", ErrnoText(errno)));
  FdCloser go_r(Above(gofd[0], kHigh));
  FdCloser go_w(Above(gofd[1], kHigh));
  if (go_r.get() < 0 || go_w.get() < 0) return Status::IoError("cannot place the go socket");

  // Log files of a previous run of the same id are not this run's; the supervisor removes the
  // rotated ones, the current ones were truncated above.
  ::unlink(req.exit_path.c_str());
  posix_spawn_file_actions_t actions;
  if (int e = ::posix_spawn_file_actions_init(&actions); e != 0)
    return Status::Internal(fmt::format("posix_spawn_file_actions_init: {}", ErrnoText(e)));
  const int moves[][2] = {{devnull.get(), 0}, {out.get(), 1},     {err.get(), 2},
                          {pipe_w.get(), 3},  {go_r.get(), 4},    {plan_fd.get(), kPlanFd}};
  int fa_err = 0;
  for (const auto& m : moves)
    if (fa_err == 0) fa_err = ::posix_spawn_file_actions_adddup2(&actions, m[0], m[1]);
  if (fa_err == 0) fa_err = ::posix_spawn_file_actions_addclosefrom_np(&actions, kPlanFd + 1);
  pid_t sup = -1;
  int spawn_err = fa_err != 0 ? fa_err : ::posix_spawn(&sup, supervisor.c_str(), &actions, nullptr,
                                                        sup_argv, sup_envp);
  ::posix_spawn_file_actions_destroy(&actions);
  if (spawn_err != 0)
    return Status::Internal(
        fmt::format("cannot start the task supervisor {}: {}", supervisor, ErrnoText(spawn_err)));
  pipe_w.reset();
  go_r.reset();

  SpawnResult result;
  result.supervisor = sup;
  int32_t fail_kind = 0, fail_errno = 0;
  Status recorded = Status::Ok();
  while (true) {
    int32_t msg[2];
    ssize_t n = ::read(pipe_r.get(), msg, sizeof(msg));
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof(msg))) break;  // EOF: the task exec'd or everyone exited
    if (msg[0] == kMsgTaskPid) {
      result.task = msg[1];
      // The task waits for this byte; without it (a failed record, or this process dying first)
      // it exits without running.
      if (req.before_exec) recorded = req.before_exec(result);
      if (recorded.ok()) {
        ssize_t w;
        do {
          w = ::send(go_w.get(), "g", 1, MSG_NOSIGNAL);
        } while (w < 0 && errno == EINTR);
      }
      go_w.reset();
    } else if (fail_kind == 0) {
      fail_kind = msg[0];
      fail_errno = msg[1];
    }
  }
  if (fail_kind == 0 && result.task > 0 && recorded.ok()) return result;

  // Failed: the task (if any) exits at once, so the supervisor follows; reap it.
  int status;
  while (::waitpid(sup, &status, 0) < 0 && errno == EINTR) {
  }
  ::unlink(req.exit_path.c_str());
  if (fail_kind == kMsgExec && (fail_errno == ENOENT || fail_errno == ENOTDIR))
    return Status::NotFound(fmt::format("no such command '{}'", req.executable));
  if (fail_kind == kMsgChdir)
    return Status::FailedPrecondition(
        fmt::format("cannot change to the working directory '{}': {}", req.workdir, ErrnoText(fail_errno)));
  if (!recorded.ok()) return recorded;
  if (fail_kind == 0) return Status::Internal("the supervisor exited before starting the task");
  return Status::FailedPrecondition(
      fmt::format("{} '{}': {}", StageText(fail_kind), req.executable, ErrnoText(fail_errno)));
}

Result<int> RunCommand(const std::vector<std::string>& argv, std::string* output,
                       std::chrono::milliseconds timeout) {
  return RunCommand(argv, output, timeout, nullptr, {});
}

Result<int> RunCommand(const std::vector<std::string>& argv, std::string* output,
                       std::chrono::milliseconds timeout, const std::atomic<bool>* cancel,
                       const std::vector<std::string>& extra_env) {
  if (argv.empty()) return Status::InvalidArgument("empty command");
  constexpr size_t kKeep = 64 << 10;
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env = {"PATH=" + DefaultPath()};
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return Status::IoError(fmt::format("pipe: {}", ErrnoText(errno)));
  FdCloser r(DupHigh(pipefd[0]));
  FdCloser w(DupHigh(pipefd[1]));
  FdCloser devnull(OpenHigh("/dev/null", O_RDONLY));
  if (r.get() < 0 || w.get() < 0 || devnull.get() < 0) return Status::IoError("cannot set up a helper's stdio");
  int execpipe[2];
  if (::pipe2(execpipe, O_CLOEXEC) != 0) return Status::IoError(fmt::format("pipe: {}", ErrnoText(errno)));
  FdCloser er(DupHigh(execpipe[0]));
  FdCloser ew(DupHigh(execpipe[1]));
  const char* exe = args[0];
  int wfd = w.get(), nfd = devnull.get(), efd = ew.get();

  pid_t pid = ::fork();
  if (pid < 0) return Status::Internal(fmt::format("fork: {}", ErrnoText(errno)));
  if (pid == 0) {
    // A group of its own: a timeout or cancellation kills what the helper started too.
    ::setpgid(0, 0);
    if (::dup2(nfd, 0) < 0 || ::dup2(wfd, 1) < 0 || ::dup2(wfd, 2) < 0) ::_exit(127);
    ResetSignals();
    ::execve(exe, args.data(), envp.data());
    SafeSend(efd, kMsgExec, errno);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: the kill below may come before the child ran at all
  w.reset();
  ew.reset();
  int32_t msg[2];
  ssize_t en;
  do {
    en = ::read(er.get(), msg, sizeof(msg));
  } while (en < 0 && errno == EINTR);
  bool exec_failed = en == static_cast<ssize_t>(sizeof(msg));

  auto deadline = Clock::now() + timeout;
  bool timed_out = false, cancelled = false;
  char buf[4096];
  while (!exec_failed) {
    if (cancel != nullptr && cancel->load()) {
      cancelled = true;
      break;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd pfd{r.get(), POLLIN, 0};
    int pr = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 100)));
    if (pr <= 0) continue;
    ssize_t n = ::read(r.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (output != nullptr) {
      output->append(buf, static_cast<size_t>(n));
      if (output->size() > 2 * kKeep) output->erase(0, output->size() - kKeep);
    }
  }
  if (timed_out || cancelled) ::kill(-pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (output != nullptr && output->size() > kKeep) output->erase(0, output->size() - kKeep);
  if (exec_failed)
    return Status::FailedPrecondition(fmt::format("cannot execute '{}': {}", argv[0], ErrnoText(msg[1])));
  if (cancelled) return Status::Internal(fmt::format("'{}' was cancelled", argv[0]));
  if (timed_out)
    return Status::Internal(fmt::format("'{}' did not finish within {} ms", fmt::format("{}", fmt::join(argv, " ")),
                                        timeout.count()));
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::optional<ExitRecord> ReadExitRecord(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return std::nullopt;
  auto j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  ExitRecord rec;
  auto code = j.find("code");
  auto sig = j.find("signal");
  if (code != j.end() && code->is_number_integer()) rec.code = code->get<int>();
  if (sig != j.end() && sig->is_number_integer()) rec.signal = sig->get<int>();
  rec.fenced = j.value("fenced", false);
  return rec;
}

std::optional<LeaseDeadlines> ReadLeaseFile(const std::string& path) {
  LeaseDeadlines d;
  if (!SafeReadLease(path.c_str(), &d.term_ms, &d.kill_ms)) return std::nullopt;
  return d;
}

int64_t BootTimeMs() { return SafeBootMs(); }

}  // namespace gpupool::agent_internal
