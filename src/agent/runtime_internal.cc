#include "agent/runtime_internal.h"

#include <sys/syscall.h>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/resource.h>
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
#include <filesystem>
#include <thread>
#include <tuple>

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

Status WriteFileAtomic(const std::string& path, const std::string& content, bool sync) {
  std::string tmp = path + ".tmp";
  {
    // A stale temporary (an earlier crash) is removed, never written through: a link planted at
    // its name makes the open fail rather than write wherever it points.
    if (::unlink(tmp.c_str()) != 0 && errno != ENOENT)
      return Status::IoError(fmt::format("cannot remove {}: {}", tmp, ErrnoText(errno)));
    FdCloser fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
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
    if (sync && ::fsync(fd.get()) != 0)
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

Status MakeOwnedDir(const std::string& path, int64_t uid, int64_t gid) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
    return Status::IoError(fmt::format("cannot create {}: {}", path, ErrnoText(errno)));
  FdCloser fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) return Status::IoError(fmt::format("cannot open {}: {}", path, ErrnoText(errno)));
  if (::fchown(fd.get(), static_cast<uid_t>(uid), static_cast<gid_t>(gid < 0 ? uid : gid)) != 0 ||
      ::fchmod(fd.get(), 0700) != 0)
    return Status::IoError(fmt::format("cannot give {} to {}:{}: {}", path, uid, gid, ErrnoText(errno)));
  return Status::Ok();
}

Status EnsureOwnedDirUnder(const std::vector<std::string>& roots, const std::string& path, int64_t uid, int64_t gid) {
  if (path.empty() || path[0] != '/') return Status::InvalidArgument(fmt::format("'{}' is not an absolute path", path));
  std::vector<std::string> parts;
  for (size_t pos = 1; pos <= path.size();) {
    size_t next = path.find('/', pos);
    if (next == std::string::npos) next = path.size();
    std::string part = path.substr(pos, next - pos);
    if (part == "." || part == "..")
      return Status::InvalidArgument(fmt::format("'{}' has a '{}' part", path, part));
    if (!part.empty()) parts.push_back(std::move(part));
    pos = next + 1;
  }
  std::string normal;
  for (const auto& p : parts) normal += "/" + p;
  for (std::string root : roots) {
    while (root.size() > 1 && root.back() == '/') root.pop_back();
    if (root.empty() || root[0] != '/' || normal.size() <= root.size() + 1 ||
        normal.compare(0, root.size(), root) != 0 || (root != "/" && normal[root.size()] != '/'))
      continue;
    RETURN_IF_ERROR(MakeDirs(root));
    FdCloser dir(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dir.get() < 0) return Status::IoError(fmt::format("cannot open {}: {}", root, ErrnoText(errno)));
    const std::string rest = normal.substr(root == "/" ? 1 : root.size() + 1);
    size_t pos = 0;
    while (pos <= rest.size()) {
      size_t next = rest.find('/', pos);
      if (next == std::string::npos) next = rest.size();
      const std::string part = rest.substr(pos, next - pos);
      const bool last = next == rest.size();
      if (last) {
        // Made under a temporary name, given to the task, then renamed into place: nobody (another
        // agent starting a replica of the same job) ever sees it root's.
        static std::atomic<uint64_t> serial{0};
        const std::string tmp = fmt::format(".{}.gpupool-{}-{}", part, ::getpid(), serial.fetch_add(1));
        if (::mkdirat(dir.get(), tmp.c_str(), 0700) == 0) {
          FdCloser t(::openat(dir.get(), tmp.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
          const bool given = t.get() >= 0 && ::fchown(t.get(), static_cast<uid_t>(uid), static_cast<gid_t>(gid)) == 0 &&
                             ::fchmod(t.get(), 0700) == 0;
          if (!given || ::renameat2(dir.get(), tmp.c_str(), dir.get(), part.c_str(), RENAME_NOREPLACE) != 0) {
            const int e = errno;
            ::unlinkat(dir.get(), tmp.c_str(), AT_REMOVEDIR);
            if (!given || e != EEXIST)
              return Status::IoError(fmt::format("cannot create {} for uid {}: {}", normal, uid, ErrnoText(e)));
          }
        } else if (errno != EEXIST) {
          return Status::IoError(fmt::format("cannot create {}: {}", normal, ErrnoText(errno)));
        }
      } else if (::mkdirat(dir.get(), part.c_str(), 0755) != 0 && errno != EEXIST) {
        return Status::IoError(fmt::format("cannot create {}: {}", normal, ErrnoText(errno)));
      }
      FdCloser sub(::openat(dir.get(), part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (sub.get() < 0)
        return Status::PermissionDenied(fmt::format("{}: '{}' is a link or not a directory ({})", normal, part, ErrnoText(errno)));
      if (last) {
        struct stat st;
        if (::fstat(sub.get(), &st) != 0) return Status::IoError(fmt::format("stat {}: {}", normal, ErrnoText(errno)));
        if (static_cast<int64_t>(st.st_uid) != uid) {
          return Status::PermissionDenied(
              fmt::format("{} exists and belongs to uid {}, not to this task's uid {}", normal, st.st_uid, uid));
        }
        return Status::Ok();
      }
      dir.reset(sub.release());
      pos = next + 1;
    }
  }
  return Status::PermissionDenied(fmt::format("{} is not below an allowed checkpoint root ({})", normal,
                                              roots.empty() ? std::string("none is configured") : fmt::format("{}", fmt::join(roots, ", "))));
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
  for (const auto* list : {&plan.hide_paths, &plan.keep_paths, &plan.devices})
    for (const auto& p : *list)
      if (p.empty() || p[0] != '/' || has_nul(p)) return Status::InvalidArgument(fmt::format("sandbox path '{}' is not absolute", p));
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
