// gpupool-supervise: the supervisor of one task (see runtime_internal.h and supervisor_protocol.h).
//
// The agent starts it with posix_spawn; it forks the task T (its own process group), tells the
// agent T's pid on the status pipe, lets T exec once the agent has recorded it (a byte on the go
// socket), drains T's output into the bounded log files, enforces the node lease when there is
// one, and writes `exit.json` when T ends. It outlives an agent that dies or restarts; a new agent
// adopts it from the task's record.
//
// A small program of its own, linking only libc and the standard library: its fork of the task
// copies a few pages, not the agent's (or `gpupool up`'s whole server's) address space.
#include <sys/syscall.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "agent/log_pump.h"
#include "agent/supervisor_protocol.h"
#include "agent/supervisor_sandbox.h"

namespace gpupool::agent_internal {
namespace {

// Everything the task's child uses, as plain C data prepared before fork.
struct ChildPlan {
  const char* executable;
  char* const* argv;
  char* const* envp;
  const char* workdir;
  const char* const* cgroup_procs;  // null-terminated
  const char* exit_path;
  const char* exit_tmp_path;
  const char* lease_path;           // null: no fencing
  const char* fence_exe;            // null: no fence command
  char* const* fence_argv;
  char* const* fence_envp;
  LogSink log_out, log_err;         // fds filled in by the supervisor
  const SupervisorPlan* plan;       // the sandbox's fields
  const std::vector<DeviceNode>* devices;
};

// What the supervisor tracks while the task runs: the read ends of the task's output pipes and the
// files they go to, and a pidfd of the task (-1 where the kernel has none) to wake on its exit.
struct PumpState {
  int pipes[2] = {-1, -1};
  LogSink* sinks[2] = {nullptr, nullptr};
  int pidfd = -1;
};

// Drains the task's output for up to `ms` milliseconds (returns early when the task exits).
void Pump(PumpState* ps, int ms) {
  if (PumpLogs(ps->pipes, ps->sinks, ps->pidfd, ms) == 0 && ps->pidfd < 0) {
    struct timespec ts{ms / 1000, (ms % 1000) * 1000L * 1000L};
    ::nanosleep(&ts, nullptr);
  }
}

// The lease file's two deadlines, parsed without allocating. False when missing or malformed.
bool SafeReadLease(const char* path, int64_t* term_ms, int64_t* kill_ms) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[128];
  ssize_t n;
  do {
    n = ::read(fd, buf, sizeof(buf) - 1);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n <= 0) return false;
  int64_t values[2] = {0, 0};
  int found = 0;
  ssize_t i = 0;
  while (found < 2) {
    while (i < n && buf[i] == ' ') ++i;
    if (i >= n || buf[i] < '0' || buf[i] > '9') return false;
    int64_t v = 0;
    while (i < n && buf[i] >= '0' && buf[i] <= '9') {
      if (v > (INT64_MAX - 9) / 10) return false;
      v = v * 10 + (buf[i] - '0');
      ++i;
    }
    values[found++] = v;
  }
  *term_ms = values[0];
  *kill_ms = values[1];
  return true;
}

int64_t SafeBootMs() {
  struct timespec ts;
  if (::clock_gettime(CLOCK_BOOTTIME, &ts) != 0) ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// Waits for the task; with a lease file, enforces it (see runtime_internal.h). Returns the
// waitpid result and sets *fenced when the lease ran out.
pid_t SuperviseTask(const ChildPlan& p, pid_t task, int* status, bool* fenced, PumpState* ps) {
  *fenced = false;
  bool term_sent = false;
  bool kill_sent = false;
  int64_t kill_at = 0;
  pid_t helper = -1;
  int64_t last_kill_ms = 0;
  while (true) {
    pid_t r = ::waitpid(task, status, WNOHANG);
    if (r == task) break;
    if (r < 0 && errno != EINTR) {
      if (helper > 0) ::waitpid(helper, nullptr, 0);
      return r;
    }
    if (helper > 0 && ::waitpid(helper, nullptr, WNOHANG) == helper) helper = -1;
    if (p.lease_path == nullptr) {
      Pump(ps, 100);
      continue;
    }
    const int64_t now = SafeBootMs();
    int64_t term_ms = 0, kill_ms = 0;
    if (!term_sent && SafeReadLease(p.lease_path, &term_ms, &kill_ms) && now >= term_ms) {
      term_sent = true;
      *fenced = true;
      // Once fenced, stay fenced: a later renewal does not take the SIGKILL back.
      kill_at = kill_ms > term_ms ? kill_ms : term_ms;
      ::kill(-task, SIGTERM);
    }
    if (term_sent && now >= kill_at && (!kill_sent || now - last_kill_ms >= 1000)) {
      // Repeated every second while the task lives (a container runc could not kill at once).
      kill_sent = true;
      last_kill_ms = now;
      if (p.fence_exe != nullptr && helper <= 0) {
        helper = ::fork();
        if (helper == 0) {
          int fd = ::open("/dev/null", O_RDWR);
          if (fd >= 0) {
            ::dup2(fd, 0);
            ::dup2(fd, 1);
            ::dup2(fd, 2);
          }
          ::execve(p.fence_exe, p.fence_argv, p.fence_envp);
          ::_exit(127);
        }
        if (helper > 0) {
          // Give runc a moment to kill the container before its `runc run` goes.
          for (int i = 0; i < 50; ++i) {
            if (::waitpid(helper, nullptr, WNOHANG) == helper) {
              helper = -1;
              break;
            }
            Pump(ps, 100);
          }
        }
      }
      ::kill(-task, SIGKILL);
    }
    Pump(ps, 100);
  }
  if (helper > 0) ::waitpid(helper, nullptr, 0);
  return task;
}

[[noreturn]] void RunTask(const ChildPlan& p, int out_w, int err_w) {
  // fd 3 is the status pipe (CLOEXEC), fd 4 the go pipe; 0 is /dev/null, and stdout/stderr become
  // the write ends of the log pipes. Every other descriptor (the log files, the read ends) is
  // CLOEXEC: the task never holds its log files.
  ::setpgid(0, 0);
  if (::dup2(out_w, 1) < 0 || ::dup2(err_w, 2) < 0) {
    SafeSend(3, kMsgStdio, errno);
    ::_exit(127);
  }
  // Wait until the agent has recorded the task: an agent that dies before that closes the pipe,
  // and the task must not run (a restarted agent, knowing nothing of it, starts it again).
  char go = 0;
  ssize_t n;
  do {
    n = ::read(4, &go, 1);
  } while (n < 0 && errno == EINTR);
  if (n != 1) ::_exit(125);
  ::close(4);
  for (const char* const* cg = p.cgroup_procs; *cg != nullptr; ++cg) {
    int fd = ::open(*cg, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || ::write(fd, "0", 1) != 1) {
      SafeSend(3, kMsgCgroup, errno);
      ::_exit(127);
    }
    ::close(fd);
  }
  int32_t stage = 0;
  int err = 0;
  if (!EnterSandbox(*p.plan, *p.devices, &stage, &err)) {
    SafeSend(3, stage, err);
    ::_exit(127);
  }
  // As the task's own identity: a working directory it may not enter is refused here.
  if (::chdir(p.workdir) != 0) {
    SafeSend(3, kMsgChdir, errno);
    ::_exit(127);
  }
  ResetSignals();
  ::execve(p.executable, p.argv, p.envp);
  SafeSend(3, kMsgExec, errno);
  ::_exit(127);
}

[[noreturn]] void RunSupervisor(const ChildPlan& p) {
  if (::setsid() < 0) {
    SafeSend(3, kMsgSetsid, errno);
    ::_exit(126);
  }
  ::fcntl(3, F_SETFD, FD_CLOEXEC);
  ::fcntl(4, F_SETFD, FD_CLOEXEC);
  // Nothing of the agent's beyond 0..4 (posix_spawn closed the rest; this is for a supervisor
  // started some other way).
  CloseFrom(5);
  // The agent may ignore SIGPIPE or SIGCHLD; the supervisor wants the defaults for waitpid.
  ResetSignals();
  // The log files move to 5 and 6 (CLOEXEC); the task's output arrives on two pipes.
  LogSink log_out = p.log_out;
  LogSink log_err = p.log_err;
  log_out.fd = ::fcntl(1, F_DUPFD_CLOEXEC, 5);
  log_err.fd = ::fcntl(2, F_DUPFD_CLOEXEC, 5);
  int out_pipe[2], err_pipe[2];
  if (log_out.fd < 0 || log_err.fd < 0 || ::pipe2(out_pipe, O_CLOEXEC) != 0 ||
      ::pipe2(err_pipe, O_CLOEXEC) != 0) {
    SafeSend(3, kMsgStdio, errno);
    ::_exit(126);
  }

  pid_t task = ::fork();
  if (task < 0) {
    SafeSend(3, kMsgFork, errno);
    ::_exit(126);
  }
  if (task == 0) RunTask(p, out_pipe[1], err_pipe[1]);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  PumpState ps;
  ps.pipes[0] = out_pipe[0];
  ps.pipes[1] = err_pipe[0];
  ps.sinks[0] = &log_out;
  ps.sinks[1] = &log_err;
  for (int fd : ps.pipes) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
#ifdef SYS_pidfd_open
  ps.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, task, 0));
#endif
  ::close(4);
  ::setpgid(task, task);  // also done by the task: whichever runs first wins the race
  // Its own stdio leaves the log files before the agent hears of the task (whoever looks at the
  // supervisor once the start is acknowledged sees it hold them only through 5 and 6).
  int devnull = ::open("/dev/null", O_RDWR);
  if (devnull >= 0) {
    ::dup2(devnull, 0);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
    if (devnull > 2) ::close(devnull);
  }
  SafeSend(3, kMsgTaskPid, static_cast<int32_t>(task));
  ::close(3);

  int status = 0;
  bool fenced = false;
  pid_t r = SuperviseTask(p, task, &status, &fenced, &ps);
  if (ps.pidfd >= 0) ::close(ps.pidfd);
  ps.pidfd = -1;
  // What the task wrote before it ended: drain until the pipes close, for at most a second (a
  // process the task left behind may hold them open; it gets EPIPE once we are gone).
  const int64_t drain_until = SafeBootMs() + 1000;
  while ((ps.pipes[0] >= 0 || ps.pipes[1] >= 0) && SafeBootMs() < drain_until) Pump(&ps, 50);
  if (log_out.fd >= 0) ::close(log_out.fd);
  if (log_err.fd >= 0) ::close(log_err.fd);

  char buf[96];
  size_t len = 0;
  if (r == task && WIFSIGNALED(status)) {
    SafeAppendStr(buf, sizeof(buf), &len, "{\"signal\":");
    SafeAppendInt(buf, sizeof(buf), &len, WTERMSIG(status));
  } else if (r == task && WIFEXITED(status)) {
    SafeAppendStr(buf, sizeof(buf), &len, "{\"code\":");
    SafeAppendInt(buf, sizeof(buf), &len, WEXITSTATUS(status));
  } else {
    SafeAppendStr(buf, sizeof(buf), &len, "{\"code\":-1,\"lost\":true");
  }
  if (fenced) SafeAppendStr(buf, sizeof(buf), &len, ",\"fenced\":true");
  SafeAppendStr(buf, sizeof(buf), &len, "}\n");
  // Through a rename, so the agent reads all of it or nothing. Not fsynced: it must outlive the
  // agent, not the machine (after a power loss the node's tasks are lost and replaced anyway).
  int out = ::open(p.exit_tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out >= 0) {
    ssize_t w = ::write(out, buf, len);
    ::close(out);
    if (w == static_cast<ssize_t>(len)) ::rename(p.exit_tmp_path, p.exit_path);
  }
  ::_exit(0);
}


}  // namespace
}  // namespace gpupool::agent_internal

int main(int argc, char** argv) {
  using namespace gpupool::agent_internal;
  SupervisorPlan plan;
  std::string why;
  // The plan arrives on fd 5 (see EncodeSupervisorArgs), not on the command line.
  std::vector<std::string> plan_args;
  std::vector<const char*> plan_argv;
  bool read_ok = argc == 2 && std::strcmp(argv[1], "--plan-fd=5") == 0 && ReadPlanArgs(kPlanFd, &plan_args, &why);
  if (argc != 2) why = "expected --plan-fd=5";
  ::close(kPlanFd);
  for (const auto& a : plan_args) plan_argv.push_back(a.c_str());
  plan_argv.push_back(nullptr);
  if (!read_ok || !DecodeSupervisorArgs(static_cast<int>(plan_args.size()), plan_argv.data(), &plan, &why)) {
    // Only the agent starts this program; on a terminal, say what is wrong.
    if (::isatty(2)) {
      const char* usage = "gpupool-supervise: started by the gpupool agent only: ";
      (void)!::write(2, usage, std::strlen(usage));
      (void)!::write(2, why.data(), why.size());
      (void)!::write(2, "\n", 1);
    }
    SafeSend(3, kMsgPlan, EINVAL);
    return 126;
  }
  // Everything the task's child touches is built here, before the fork.
  std::vector<char*> task_argv, task_envp, fence_argv;
  for (auto& a : plan.argv) task_argv.push_back(a.data());
  task_argv.push_back(nullptr);
  for (auto& e : plan.envp) task_envp.push_back(e.data());
  task_envp.push_back(nullptr);
  for (auto& f : plan.fence_argv) fence_argv.push_back(f.data());
  fence_argv.push_back(nullptr);
  std::vector<const char*> procs;
  for (const auto& c : plan.cgroup_procs) procs.push_back(c.c_str());
  procs.push_back(nullptr);
  const std::string exit_tmp = plan.exit_path + ".tmp";
  std::string fence_path_env = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  char* fence_envp[] = {fence_path_env.data(), nullptr};

  // Stat'ed now, while /dev is the host's.
  const std::vector<DeviceNode> devices = plan.private_dev ? StatDevices(plan.devices) : std::vector<DeviceNode>{};

  ChildPlan p{plan.executable.c_str(), task_argv.data(), task_envp.data(), plan.workdir.c_str(), procs.data(),
              plan.exit_path.c_str(), exit_tmp.c_str(),
              plan.lease_path.empty() ? nullptr : plan.lease_path.c_str(),
              plan.fence_argv.empty() ? nullptr : plan.fence_argv[0].c_str(), fence_argv.data(), fence_envp,
              LogSink{}, LogSink{}, &plan, &devices};
  std::vector<std::string> rotated_out, rotated_err;
  for (int i = 1; i <= plan.log_keep; ++i) {
    rotated_out.push_back(RotatedLogPath(plan.stdout_path, i));
    rotated_err.push_back(RotatedLogPath(plan.stderr_path, i));
  }
  struct Stream {
    LogSink* sink;
    const std::string* path;
    std::vector<std::string>* rotated;
  };
  for (const Stream& s : {Stream{&p.log_out, &plan.stdout_path, &rotated_out},
                          Stream{&p.log_err, &plan.stderr_path, &rotated_err}}) {
    s.sink->path = s.path->c_str();
    s.sink->keep = plan.log_keep;
    s.sink->max_bytes = plan.log_max_bytes;
    for (int i = 0; i < plan.log_keep; ++i) s.sink->rotated[i] = (*s.rotated)[static_cast<size_t>(i)].c_str();
    // Files a previous run of the same id left behind are not this run's.
    for (const auto& old_file : *s.rotated) ::unlink(old_file.c_str());
  }
  RunSupervisor(p);
}
