#include "agent/runtime_internal.h"

#include <sys/syscall.h>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <thread>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "agent/log_pump.h"

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

// ---- async-signal-safe helpers for the forked children -----------------------------------------

// Message kinds on the status pipe. Each message is 8 bytes, written atomically.
enum : int32_t {
  kMsgTaskPid = 1,
  kMsgExec = 2,
  kMsgChdir = 3,
  kMsgCgroup = 4,
  kMsgStdio = 5,
  kMsgFork = 6,
  kMsgSetsid = 7,
};

void SafeSend(int fd, int32_t kind, int32_t value) {
  int32_t msg[2] = {kind, value};
  ssize_t r;
  do {
    r = ::write(fd, msg, sizeof(msg));
  } while (r < 0 && errno == EINTR);
}

// Appends the decimal form of `v` to buf at *len.
void SafeAppendInt(char* buf, size_t cap, size_t* len, long v) {
  char tmp[24];
  size_t n = 0;
  bool neg = v < 0;
  unsigned long u = neg ? 0UL - static_cast<unsigned long>(v) : static_cast<unsigned long>(v);
  do {
    tmp[n++] = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u != 0 && n < sizeof(tmp));
  if (neg && *len < cap) buf[(*len)++] = '-';
  while (n > 0 && *len < cap) buf[(*len)++] = tmp[--n];
}

void SafeAppendStr(char* buf, size_t cap, size_t* len, const char* s) {
  while (*s != '\0' && *len < cap) buf[(*len)++] = *s++;
}

void ResetSignals() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    ::sigaction(sig, &sa, nullptr);  // fails harmlessly for the signals glibc reserves
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
}

// Closes every descriptor from `first` up, without allocating.
void CloseFrom(int first, int max_fd) {
  if (::close_range(static_cast<unsigned>(first), ~0U, 0) == 0) return;
  for (int fd = first; fd < max_fd; ++fd) ::close(fd);
}

// Everything the children use, as plain C data prepared before fork.
struct ChildPlan {
  const char* executable;
  char* const* argv;
  char* const* envp;
  const char* workdir;
  const char* const* cgroup_procs;  // null-terminated
  const char* exit_path;
  const char* exit_tmp_path;
  int devnull, out, err, pipe_w;
  int max_fd;
  int go_r;                         // the task execs only after reading a byte here (EOF: exit)
  const char* lease_path;           // null: no fencing
  const char* fence_exe;            // null: no fence command
  char* const* fence_argv;
  char* const* fence_envp;
  LogSink log_out, log_err;         // fds filled in by the supervisor
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
    SafeSend(p.pipe_w, kMsgSetsid, errno);
    ::_exit(126);
  }
  if (::dup2(p.devnull, 0) < 0 || ::dup2(p.out, 1) < 0 || ::dup2(p.err, 2) < 0) {
    SafeSend(p.pipe_w, kMsgStdio, errno);
    ::_exit(126);
  }
  if (p.pipe_w != 3 && ::dup2(p.pipe_w, 3) < 0) {
    SafeSend(p.pipe_w, kMsgStdio, errno);
    ::_exit(126);
  }
  ::fcntl(3, F_SETFD, FD_CLOEXEC);
  if (::dup2(p.go_r, 4) < 0) {
    SafeSend(3, kMsgStdio, errno);
    ::_exit(126);
  }
  ::fcntl(4, F_SETFD, FD_CLOEXEC);
  // Drop every other descriptor of the agent (listening sockets, databases, the go pipe's write
  // end): the supervisor outlives the agent and must not hold them.
  CloseFrom(5, p.max_fd);
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
  SafeSend(3, kMsgTaskPid, static_cast<int32_t>(task));
  ::close(3);
  // The supervisor keeps no log descriptors open beyond the task's lifetime needs.
  int fd = ::open("/dev/null", O_RDWR);
  if (fd >= 0) {
    ::dup2(fd, 0);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    if (fd > 2) ::close(fd);
  }

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
  int out = ::open(p.exit_tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out >= 0) {
    ssize_t w = ::write(out, buf, len);
    ::fsync(out);
    ::close(out);
    if (w == static_cast<ssize_t>(len)) ::rename(p.exit_tmp_path, p.exit_path);
  }
  ::_exit(0);
}

std::string StageText(int32_t kind) {
  switch (kind) {
    case kMsgExec: return "cannot execute";
    case kMsgChdir: return "cannot change to the working directory";
    case kMsgCgroup: return "cannot join the task's cgroup";
    case kMsgStdio: return "cannot set up stdio";
    case kMsgFork: return "cannot fork the task";
    case kMsgSetsid: return "cannot start a session";
    default: return "unknown failure";
  }
}

bool WritableDir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && ::access(path.c_str(), W_OK) == 0;
}

// v2: the hierarchy at `mount` must offer cpu and memory, let us create gpupool/ and enable both
// controllers for its children.
bool TryV2(const std::string& mount, CgroupLayout* layout, std::string* why) {
  auto controllers = ReadFile(mount + "/cgroup.controllers");
  if (!controllers.ok()) {
    *why += fmt::format("{}: not a cgroup v2 hierarchy; ", mount);
    return false;
  }
  const std::string& c = *controllers;
  auto has = [&](const char* name) {
    std::string padded = " " + c + " ";
    for (char& ch : padded)
      if (ch == '\n') ch = ' ';
    return padded.find(std::string(" ") + name + " ") != std::string::npos;
  };
  if (!has("cpu") || !has("memory")) {
    *why += fmt::format("{}: cgroup v2 without the cpu and memory controllers; ", mount);
    return false;
  }
  std::string base = mount + "/gpupool";
  if (::mkdir(base.c_str(), 0755) != 0 && errno != EEXIST) {
    *why += fmt::format("{}: cannot create gpupool/ ({}); ", mount, ErrnoText(errno));
    return false;
  }
  Status s1 = WriteControlFile(mount + "/cgroup.subtree_control", "+cpu +memory");
  Status s2 = WriteControlFile(base + "/cgroup.subtree_control", "+cpu +memory");
  if (!s1.ok() || !s2.ok()) {
    *why += fmt::format("{}: cannot enable cpu and memory: {}; ", mount,
                        (!s1.ok() ? s1 : s2).message());
    return false;
  }
  layout->kind = CgroupLayout::Kind::kV2;
  layout->v2_base = base;
  return true;
}

bool TryV1(const std::string& root, CgroupLayout* layout, std::string* why) {
  std::string cpu = root + "/cpu";
  std::string mem = root + "/memory";
  if (!PathExists(cpu + "/cpu.cfs_quota_us") || !PathExists(mem + "/memory.limit_in_bytes")) {
    *why += fmt::format("{}: no cgroup v1 cpu and memory hierarchies; ", root);
    return false;
  }
  if (!WritableDir(cpu) || !WritableDir(mem)) {
    *why += fmt::format("{}: cgroup v1 cpu/memory not writable; ", root);
    return false;
  }
  for (const std::string& dir : {cpu + "/gpupool", mem + "/gpupool"}) {
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      *why += fmt::format("cannot create {} ({}); ", dir, ErrnoText(errno));
      return false;
    }
  }
  layout->kind = CgroupLayout::Kind::kV1;
  layout->v1_cpu_base = cpu + "/gpupool";
  layout->v1_mem_base = mem + "/gpupool";
  return true;
}

constexpr int64_t kCpuPeriodUs = 100000;

int64_t CpuQuotaUs(int64_t cpu_milli) {
  return std::max<int64_t>(1000, cpu_milli * kCpuPeriodUs / 1000);
}

}  // namespace

// ---- files -------------------------------------------------------------------------------------

std::string ErrnoText(int err) { return std::strerror(err); }

Result<std::string> ReadFile(const std::string& path) {
  FdCloser fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return Status::IoError(fmt::format("cannot open {}: {}", path, ErrnoText(errno)));
  std::string out;
  char buf[4096];
  while (true) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IoError(fmt::format("cannot read {}: {}", path, ErrnoText(errno)));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

Status WriteFileAtomic(const std::string& path, const std::string& content) {
  std::string tmp = path + ".tmp";
  {
    FdCloser fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) return Status::IoError(fmt::format("cannot create {}: {}", tmp, ErrnoText(errno)));
    size_t off = 0;
    while (off < content.size()) {
      ssize_t n = ::write(fd.get(), content.data() + off, content.size() - off);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::IoError(fmt::format("cannot write {}: {}", tmp, ErrnoText(errno)));
      }
      off += static_cast<size_t>(n);
    }
    if (::fsync(fd.get()) != 0)
      return Status::IoError(fmt::format("cannot sync {}: {}", tmp, ErrnoText(errno)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return Status::IoError(fmt::format("cannot rename {} to {}: {}", tmp, path, ErrnoText(errno)));
  return Status::Ok();
}

Status WriteControlFile(const std::string& path, const std::string& content) {
  FdCloser fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (fd.get() < 0) return Status::IoError(fmt::format("cannot open {}: {}", path, ErrnoText(errno)));
  ssize_t n = ::write(fd.get(), content.data(), content.size());
  if (n != static_cast<ssize_t>(content.size()))
    return Status::IoError(fmt::format("cannot write '{}' to {}: {}", content, path, ErrnoText(errno)));
  return Status::Ok();
}

Status MakeDirs(const std::string& path) {
  if (path.empty()) return Status::InvalidArgument("empty directory path");
  std::string cur;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t next = path.find('/', pos);
    if (next == std::string::npos) next = path.size();
    cur = path.substr(0, next);
    if (!cur.empty() && ::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
      return Status::IoError(fmt::format("cannot create directory {}: {}", cur, ErrnoText(errno)));
    pos = next + 1;
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return Status::IoError(fmt::format("{} is not a directory", path));
  return Status::Ok();
}

Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return Status::IoError(fmt::format("cannot stat {}: {}", path, ErrnoText(errno)));
  }
  if (S_ISDIR(st.st_mode)) {
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) return Status::IoError(fmt::format("cannot open {}: {}", path, ErrnoText(errno)));
    std::vector<std::string> names;
    while (dirent* e = ::readdir(dir)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(dir);
    for (const auto& n : names) RETURN_IF_ERROR(RemoveTree(path + "/" + n));
    if (::rmdir(path.c_str()) != 0)
      return Status::IoError(fmt::format("cannot remove {}: {}", path, ErrnoText(errno)));
    return Status::Ok();
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    return Status::IoError(fmt::format("cannot remove {}: {}", path, ErrnoText(errno)));
  return Status::Ok();
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

Status ValidateTaskId(const std::string& id) {
  if (id.empty()) return Status::InvalidArgument("task id is empty");
  if (id.size() > 128) return Status::InvalidArgument(fmt::format("task id '{}' is longer than 128 characters", id));
  if (id[0] == '.') return Status::InvalidArgument(fmt::format("task id '{}' starts with '.'", id));
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '_' || c == '-';
    if (!ok)
      return Status::InvalidArgument(
          fmt::format("task id '{}' may hold only letters, digits, '.', '_' and '-'", id));
  }
  if (id == "runc-root") return Status::InvalidArgument("task id 'runc-root' is reserved");
  return Status::Ok();
}

Status ValidateLaunchSpec(const LaunchSpec& spec) {
  RETURN_IF_ERROR(ValidateTaskId(spec.id));
  if (spec.argv.empty() || spec.argv[0].empty())
    return Status::InvalidArgument(fmt::format("task {}: argv is empty", spec.id));
  if (spec.cpu_milli < 0 || spec.memory_bytes < 0)
    return Status::InvalidArgument(fmt::format("task {}: negative CPU or memory limit", spec.id));
  return Status::Ok();
}

std::string DefaultPath() { return "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"; }

Result<std::string> FindExecutable(const std::string& name, const std::string& path_var) {
  if (name.empty()) return Status::InvalidArgument("the command is empty");
  if (name.find('/') != std::string::npos) return name;
  size_t pos = 0;
  while (pos <= path_var.size()) {
    size_t next = path_var.find(':', pos);
    if (next == std::string::npos) next = path_var.size();
    std::string_view dir = std::string_view(path_var).substr(pos, next - pos);
    std::string candidate = fmt::format("{}/{}", dir.empty() ? std::string_view(".") : dir, name);
    struct stat st;
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    pos = next + 1;
  }
  return Status::NotFound(fmt::format("no such command '{}' (searched PATH={})", name, path_var));
}

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
  }
  ps.start_time = std::strtoull(text->c_str() + pos, nullptr, 10);
  return ps;
}

bool ProcessAlive(pid_t pid, uint64_t start_time) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  auto ps = ReadProcStat(pid);
  if (!ps) return false;
  if (ps->state == 'Z' || ps->state == 'X') return false;
  return start_time == 0 || ps->start_time == start_time;
}

// ---- cgroups -----------------------------------------------------------------------------------

CgroupLayout DetectCgroups(const std::string& root) {
  CgroupLayout layout;
  if (root == "none") {
    layout.note = "cgroup limits turned off (cgroup_root=none); tasks run without CPU/memory limits";
    return layout;
  }
  std::string why;
  std::string base = root.empty() ? "/sys/fs/cgroup" : root;
  if (TryV2(base, &layout, &why)) return layout;
  if (root.empty() && TryV2(base + "/unified", &layout, &why)) return layout;
  if (TryV1(base, &layout, &why)) return layout;
  if (!why.empty() && why.size() >= 2) why.resize(why.size() - 2);
  layout.note = fmt::format("no writable cgroup, tasks run without CPU/memory limits ({})", why);
  return layout;
}

Result<std::vector<std::string>> CreateTaskCgroups(const CgroupLayout& layout, const std::string& id,
                                                   int64_t cpu_milli, int64_t memory_bytes) {
  std::vector<std::string> dirs;
  auto make = [&](const std::string& dir) -> Status {
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
      return Status::IoError(fmt::format("cannot create cgroup {}: {}", dir, ErrnoText(errno)));
    dirs.push_back(dir);
    return Status::Ok();
  };
  Status st;
  if (layout.kind == CgroupLayout::Kind::kV2) {
    std::string dir = layout.v2_base + "/" + id;
    st = make(dir);
    if (st.ok() && cpu_milli > 0)
      st = WriteControlFile(dir + "/cpu.max", fmt::format("{} {}", CpuQuotaUs(cpu_milli), kCpuPeriodUs));
    if (st.ok() && memory_bytes > 0) {
      st = WriteControlFile(dir + "/memory.max", std::to_string(memory_bytes));
      // Without swap accounting the file is absent; a limit on swap is then moot.
      if (st.ok() && PathExists(dir + "/memory.swap.max")) st = WriteControlFile(dir + "/memory.swap.max", "0");
    }
  } else if (layout.kind == CgroupLayout::Kind::kV1) {
    std::string cpu = layout.v1_cpu_base + "/" + id;
    std::string mem = layout.v1_mem_base + "/" + id;
    st = make(cpu);
    if (st.ok()) st = make(mem);
    if (st.ok() && cpu_milli > 0) {
      st = WriteControlFile(cpu + "/cpu.cfs_period_us", std::to_string(kCpuPeriodUs));
      if (st.ok()) st = WriteControlFile(cpu + "/cpu.cfs_quota_us", std::to_string(CpuQuotaUs(cpu_milli)));
    }
    if (st.ok() && memory_bytes > 0)
      st = WriteControlFile(mem + "/memory.limit_in_bytes", std::to_string(memory_bytes));
  }
  if (!st.ok()) {
    (void)RemoveCgroupDirs(dirs);
    return st.WithContext(fmt::format("setting the limits of task {}", id));
  }
  return dirs;
}

Status RemoveCgroupDirs(const std::vector<std::string>& dirs) {
  Status result;
  for (const std::string& dir : dirs) {
    if (!PathExists(dir)) continue;
    bool removed = false;
    for (int attempt = 0; attempt < 50 && !removed; ++attempt) {
      if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) {
        removed = true;
        break;
      }
      if (errno != EBUSY) break;
      // Stragglers that left the process group: kill them, then give the kernel a moment.
      auto procs = ReadFile(dir + "/cgroup.procs");
      if (procs.ok()) {
        size_t pos = 0;
        while (pos < procs->size()) {
          long pid = std::strtol(procs->c_str() + pos, nullptr, 10);
          if (pid > 0) ::kill(static_cast<pid_t>(pid), SIGKILL);
          size_t nl = procs->find('\n', pos);
          if (nl == std::string::npos) break;
          pos = nl + 1;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!removed && result.ok())
      result = Status::IoError(fmt::format("cannot remove cgroup {}: {}", dir, ErrnoText(errno)));
  }
  return result;
}

// ---- the supervisor ------------------------------------------------------------------------------

Result<SpawnResult> SpawnSupervised(const SpawnRequest& req) {
  if (req.argv.empty()) return Status::InvalidArgument("argv is empty");
  auto has_nul = [](const std::string& s) { return s.find('\0') != std::string::npos; };
  for (const auto& a : req.argv)
    if (has_nul(a)) return Status::InvalidArgument("an argument contains a NUL byte");
  for (const auto& e : req.envp)
    if (has_nul(e)) return Status::InvalidArgument("an environment entry contains a NUL byte");

  // Everything the children touch is built here, before fork.
  std::vector<char*> argv;
  for (const auto& a : req.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : req.envp) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  std::vector<std::string> procs_files;
  for (const auto& dir : req.cgroup_dirs) procs_files.push_back(dir + "/cgroup.procs");
  std::vector<const char*> procs;
  for (const auto& f : procs_files) procs.push_back(f.c_str());
  procs.push_back(nullptr);
  std::string exit_tmp = req.exit_path + ".tmp";

  FdCloser devnull(OpenHigh("/dev/null", O_RDWR));
  if (devnull.get() < 0) return Status::IoError(fmt::format("cannot open /dev/null: {}", ErrnoText(errno)));
  FdCloser out(OpenHigh(req.stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
  if (out.get() < 0)
    return Status::IoError(fmt::format("cannot create {}: {}", req.stdout_path, ErrnoText(errno)));
  FdCloser err(OpenHigh(req.stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
  if (err.get() < 0)
    return Status::IoError(fmt::format("cannot create {}: {}", req.stderr_path, ErrnoText(errno)));
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0)
    return Status::IoError(fmt::format("cannot create a pipe: {}", ErrnoText(errno)));
  FdCloser pipe_r(DupHigh(pipefd[0]));
  FdCloser pipe_w(DupHigh(pipefd[1]));
  if (pipe_r.get() < 0 || pipe_w.get() < 0) return Status::IoError("cannot place the status pipe");
  // The go channel, above the descriptors the supervisor rearranges (0..4). A socket pair rather
  // than a pipe: send() with MSG_NOSIGNAL, so a task that died early costs no SIGPIPE here.
  int gofd[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, gofd) != 0)
    return Status::IoError(fmt::format("cannot create a socket pair: {}", ErrnoText(errno)));
  FdCloser go_r(::fcntl(gofd[0], F_DUPFD_CLOEXEC, 10));
  FdCloser go_w(::fcntl(gofd[1], F_DUPFD_CLOEXEC, 10));
  ::close(gofd[0]);
  ::close(gofd[1]);
  if (go_r.get() < 0 || go_w.get() < 0) return Status::IoError("cannot place the go pipe");

  struct rlimit rl;
  int max_fd = 1024;
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    max_fd = static_cast<int>(std::min<rlim_t>(rl.rlim_cur, 65536));

  std::vector<char*> fence_argv;
  for (const auto& a : req.fence_kill_argv) fence_argv.push_back(const_cast<char*>(a.c_str()));
  fence_argv.push_back(nullptr);
  std::string fence_path_env = "PATH=" + DefaultPath();
  char* fence_envp[] = {fence_path_env.data(), nullptr};

  ChildPlan plan{req.executable.c_str(), argv.data(), envp.data(), req.workdir.c_str(), procs.data(),
                 req.exit_path.c_str(), exit_tmp.c_str(), devnull.get(), out.get(), err.get(),
                 pipe_w.get(), max_fd, go_r.get(),
                 req.lease_path.empty() ? nullptr : req.lease_path.c_str(),
                 req.fence_kill_argv.empty() ? nullptr : req.fence_kill_argv[0].c_str(),
                 fence_argv.data(), fence_envp, LogSink{}, LogSink{}};
  const int keep = std::clamp(req.log_keep, 0, kMaxLogKeep);
  std::vector<std::string> rotated_out, rotated_err;
  for (int i = 1; i <= keep; ++i) {
    rotated_out.push_back(RotatedLogPath(req.stdout_path, i));
    rotated_err.push_back(RotatedLogPath(req.stderr_path, i));
  }
  for (auto [sink, path, rotated] : {std::tuple{&plan.log_out, &req.stdout_path, &rotated_out},
                                     std::tuple{&plan.log_err, &req.stderr_path, &rotated_err}}) {
    sink->path = path->c_str();
    sink->keep = keep;
    sink->max_bytes = req.log_max_bytes;
    for (int i = 0; i < keep; ++i) sink->rotated[i] = (*rotated)[static_cast<size_t>(i)].c_str();
    // Files a previous run of the same id left behind are not this run's.
    for (const auto& old_file : *rotated) ::unlink(old_file.c_str());
  }

  ::unlink(req.exit_path.c_str());
  pid_t sup = ::fork();
  if (sup < 0) return Status::Internal(fmt::format("cannot fork the supervisor: {}", ErrnoText(errno)));
  if (sup == 0) RunSupervisor(plan);
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
  if (argv.empty()) return Status::InvalidArgument("empty command");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::string path_env = "PATH=" + DefaultPath();
  char* envp[] = {path_env.data(), nullptr};

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
    if (::dup2(nfd, 0) < 0 || ::dup2(wfd, 1) < 0 || ::dup2(wfd, 2) < 0) ::_exit(127);
    ResetSignals();
    ::execve(exe, args.data(), envp);
    SafeSend(efd, kMsgExec, errno);
    ::_exit(127);
  }
  w.reset();
  ew.reset();
  int32_t msg[2];
  ssize_t en;
  do {
    en = ::read(er.get(), msg, sizeof(msg));
  } while (en < 0 && errno == EINTR);
  bool exec_failed = en == static_cast<ssize_t>(sizeof(msg));

  auto deadline = Clock::now() + timeout;
  bool timed_out = false;
  char buf[4096];
  while (!exec_failed) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd pfd{r.get(), POLLIN, 0};
    int pr = ::poll(&pfd, 1, static_cast<int>(left));
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) continue;
    ssize_t n = ::read(r.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (output != nullptr && output->size() < (1 << 20)) output->append(buf, static_cast<size_t>(n));
  }
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (exec_failed)
    return Status::FailedPrecondition(fmt::format("cannot execute '{}': {}", argv[0], ErrnoText(msg[1])));
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
  Status st = WriteFileAtomic(RecordPath(rec.id), TaskRecordToJson(rec));
  std::string id = rec.id;
  tasks_[id] = std::move(rec);
  return st.WithContext(fmt::format("task {} runs, but its state could not be saved", id));
}

void SupervisedRuntime::Unregister(const std::string& id) {
  tasks_.erase(id);
  ::unlink(RecordPath(id).c_str());
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
    }
    if (info.fenced) info.message = "fenced (lease expired): " + info.message;
    return info;
  }
  if (!alive) {
    info.state = RunState::kUnknown;
    info.message = fmt::format("the supervisor of task {} is gone and recorded no exit status", id);
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
    if (exited || !alive) return Status::Ok();
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
