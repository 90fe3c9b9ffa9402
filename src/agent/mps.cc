#include "agent/mps.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>

#include "agent/runtime_internal.h"

extern char** environ;

namespace gpupool {

namespace {

using Clock = std::chrono::steady_clock;
using agent_internal::ErrnoText;
using agent_internal::FdCloser;

constexpr const char* kPidFile = "nvidia-cuda-mps-control.pid";
constexpr size_t kMaxOutput = 64 * 1024;

// GPU UUIDs become directory names: "GPU-8f6b...", "MIG-...". Nothing that could leave the root.
Status ValidateUuid(const std::string& uuid) {
  if (uuid.empty()) return Status::InvalidArgument("MPS: a GPU UUID is needed");
  if (uuid.size() > 128 || uuid[0] == '.')
    return Status::InvalidArgument(fmt::format("MPS: '{}' is not a usable GPU UUID", uuid));
  for (char c : uuid) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                    c == '_' || c == '.';
    if (!ok) return Status::InvalidArgument(fmt::format("MPS: '{}' is not a usable GPU UUID", uuid));
  }
  return Status::Ok();
}

// Moves a descriptor to 10 or above with FD_CLOEXEC, so the dup2 calls onto 0..3 in the child
// never clobber one that is still needed. Closes the original.
int MoveHigh(int fd) {
  if (fd < 0) return fd;
  const int high = ::fcntl(fd, F_DUPFD_CLOEXEC, 10);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  return high;
}

struct CommandResult {
  int status = 0;          // the exit status, or 128 + signal
  bool timed_out = false;  // killed after the timeout
  std::string output;      // stdout and stderr together, at most kMaxOutput bytes
};

std::string Trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// Runs `exe` with `argv` and exactly `env`, `input` on its stdin, and its stdout and stderr
// captured, until it exits or `timeout` passes (then it is killed). No shell. The child gets its own
// session and no descriptor of ours beyond stdio, so a daemon it leaves behind holds neither the
// agent's terminal nor its sockets. A daemonizing program may leave a grandchild holding the output
// pipe: the exit of the child, not the end of its output, ends the wait.
Result<CommandResult> RunCommand(const std::string& exe, const std::vector<std::string>& argv,
                                 const std::vector<std::string>& env, const std::string& input,
                                 std::chrono::milliseconds timeout) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  int in[2], out[2], ex[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return Status::IoError(fmt::format("pipe: {}", ErrnoText(errno)));
  FdCloser in_r(MoveHigh(in[0])), in_w(MoveHigh(in[1]));
  if (::pipe2(out, O_CLOEXEC) != 0) return Status::IoError(fmt::format("pipe: {}", ErrnoText(errno)));
  FdCloser out_r(MoveHigh(out[0])), out_w(MoveHigh(out[1]));
  if (::pipe2(ex, O_CLOEXEC) != 0) return Status::IoError(fmt::format("pipe: {}", ErrnoText(errno)));
  FdCloser ex_r(MoveHigh(ex[0])), ex_w(MoveHigh(ex[1]));
  if (in_r.get() < 0 || in_w.get() < 0 || out_r.get() < 0 || out_w.get() < 0 || ex_r.get() < 0 || ex_w.get() < 0)
    return Status::IoError(fmt::format("setting up pipes: {}", ErrnoText(errno)));
  // The input is a command or two: it fits the pipe buffer, so it is written before the fork and
  // nothing can block or raise SIGPIPE here.
  if (input.size() > 4096) return Status::InvalidArgument("control input too long");
  if (!input.empty() && ::write(in_w.get(), input.data(), input.size()) != static_cast<ssize_t>(input.size()))
    return Status::IoError(fmt::format("writing the control input: {}", ErrnoText(errno)));
  in_w.reset();
  if (::fcntl(out_r.get(), F_SETFL, O_NONBLOCK) != 0)
    return Status::IoError(fmt::format("fcntl: {}", ErrnoText(errno)));
  long max_fd = ::sysconf(_SC_OPEN_MAX);
  if (max_fd < 0 || max_fd > 65536) max_fd = 65536;
  const int in_fd = in_r.get(), out_fd = out_w.get(), ex_fd = ex_w.get();
  const char* path = exe.c_str();

  const pid_t pid = ::fork();
  if (pid < 0) return Status::Internal(fmt::format("fork: {}", ErrnoText(errno)));
  if (pid == 0) {
    // Only async-signal-safe calls from here on.
    ::setsid();
    if (::dup2(in_fd, 0) < 0 || ::dup2(out_fd, 1) < 0 || ::dup2(out_fd, 2) < 0 || ::dup2(ex_fd, 3) < 0) ::_exit(127);
    ::fcntl(3, F_SETFD, FD_CLOEXEC);
    if (::close_range(4, ~0U, 0) != 0) {
      for (long fd = 4; fd < max_fd; ++fd) ::close(static_cast<int>(fd));
    }
    sigset_t none;
    ::sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD}) ::signal(sig, SIG_DFL);
    ::execve(path, args.data(), envp.data());
    const int err = errno;
    [[maybe_unused]] ssize_t n = ::write(3, &err, sizeof(err));
    ::_exit(127);
  }
  in_r.reset();
  out_w.reset();
  ex_w.reset();
  // The exec pipe closes on a successful exec; an errno arrives when it failed.
  int exec_errno = 0;
  ssize_t en;
  do {
    en = ::read(ex_r.get(), &exec_errno, sizeof(exec_errno));
  } while (en < 0 && errno == EINTR);
  const bool exec_failed = en == static_cast<ssize_t>(sizeof(exec_errno));

  CommandResult result;
  const auto deadline = Clock::now() + timeout;
  bool eof = false;
  int wstatus = 0;
  char buf[4096];
  auto drain = [&] {
    for (;;) {
      const ssize_t n = ::read(out_r.get(), buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) eof = true;
      if (n <= 0) return;
      if (result.output.size() < kMaxOutput)
        result.output.append(buf, std::min(static_cast<size_t>(n), kMaxOutput - result.output.size()));
    }
  };
  for (;;) {
    pid_t w = ::waitpid(pid, &wstatus, WNOHANG);
    if (w < 0 && errno == EINTR) continue;
    if (w == pid || w < 0) break;
    if (Clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
      }
      result.timed_out = true;
      break;
    }
    if (eof) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    pollfd pfd{out_r.get(), POLLIN, 0};
    if (::poll(&pfd, 1, 20) > 0) drain();
  }
  if (!eof) drain();
  if (exec_failed) return Status::FailedPrecondition(fmt::format("cannot execute '{}': {}", exe, ErrnoText(exec_errno)));
  if (WIFEXITED(wstatus)) {
    result.status = WEXITSTATUS(wstatus);
  } else if (WIFSIGNALED(wstatus)) {
    result.status = 128 + WTERMSIG(wstatus);
  }
  return result;
}

std::string DescribeStatus(const CommandResult& r) {
  if (r.timed_out) return "killed after the timeout";
  if (r.status > 128) return fmt::format("killed by signal {}", r.status - 128);
  return fmt::format("exit status {}", r.status);
}

std::string DescribeOutput(const CommandResult& r) {
  const std::string text = Trimmed(r.output);
  return text.empty() ? std::string("no output") : fmt::format("output: {}", text);
}

// The pid in the daemon's pid file, or -1 when there is none (or it is unreadable).
pid_t ReadPidFile(const std::string& path) {
  auto text = agent_internal::ReadFile(path);
  if (!text.ok()) return -1;
  const long v = std::strtol(text->c_str(), nullptr, 10);
  return v > 0 ? static_cast<pid_t>(v) : -1;
}

// Alive and not a zombie. The daemon detaches from us, so it is not our child to reap.
bool PidAlive(pid_t pid) {
  auto st = agent_internal::ReadProcStat(pid);
  return st.has_value() && st->state != 'Z';
}

}  // namespace

MpsDaemons::MpsDaemons(MpsOptions options) : options_(std::move(options)) {
  if (options_.control_binary.empty()) options_.control_binary = "nvidia-cuda-mps-control";
}

std::string MpsDaemons::PipeDir(const std::string& gpu_uuid) const {
  return fmt::format("{}/{}/pipe", options_.root, gpu_uuid);
}

std::string MpsDaemons::LogDir(const std::string& gpu_uuid) const {
  return fmt::format("{}/{}/log", options_.root, gpu_uuid);
}

Result<std::string> MpsDaemons::ResolveBinary(const std::string& gpu_uuid) const {
  const std::string& bin = options_.control_binary;
  if (bin.find('/') != std::string::npos) {
    if (::access(bin.c_str(), X_OK) != 0)
      return Status::FailedPrecondition(
          fmt::format("MPS isolation requested for GPU {}, but the MPS control program {} cannot be run: {}",
                      gpu_uuid, bin, ErrnoText(errno)));
    return bin;
  }
  const char* path = std::getenv("PATH");
  const std::string search = path != nullptr && *path != '\0' ? std::string(path) : agent_internal::DefaultPath();
  auto found = agent_internal::FindExecutable(bin, search);
  if (!found.ok())
    return Status::FailedPrecondition(fmt::format(
        "MPS isolation requested for GPU {}, but {} was not found (searched PATH={})", gpu_uuid, bin, search));
  return found;
}

// The agent's environment without anything that would point the daemon elsewhere, plus its GPU and
// directories.
std::vector<std::string> MpsDaemons::DaemonEnv(const std::string& gpu_uuid) const {
  std::vector<std::string> env;
  bool have_path = false;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view kv(*e);
    if (kv.rfind("CUDA_MPS_", 0) == 0 || kv.rfind("CUDA_VISIBLE_DEVICES=", 0) == 0 ||
        kv.rfind("NVIDIA_VISIBLE_DEVICES=", 0) == 0)
      continue;
    if (kv.rfind("PATH=", 0) == 0) have_path = true;
    env.emplace_back(kv);
  }
  if (!have_path) env.push_back(fmt::format("PATH={}", agent_internal::DefaultPath()));
  env.push_back(fmt::format("CUDA_VISIBLE_DEVICES={}", gpu_uuid));
  env.push_back(fmt::format("CUDA_MPS_PIPE_DIRECTORY={}", PipeDir(gpu_uuid)));
  env.push_back(fmt::format("CUDA_MPS_LOG_DIRECTORY={}", LogDir(gpu_uuid)));
  return env;
}

bool MpsDaemons::Healthy(const std::string& gpu_uuid) const {
  if (!ValidateUuid(gpu_uuid).ok()) return false;
  const std::string pipe = PipeDir(gpu_uuid);
  if (!agent_internal::PathExists(fmt::format("{}/control", pipe))) return false;
  const pid_t pid = ReadPidFile(fmt::format("{}/{}", pipe, kPidFile));
  if (pid > 0 && !PidAlive(pid)) return false;
  auto exe = ResolveBinary(gpu_uuid);
  if (!exe.ok()) return false;
  auto r = RunCommand(*exe, {*exe}, DaemonEnv(gpu_uuid), "get_server_list\n", options_.command_timeout);
  return r.ok() && !r->timed_out && r->status == 0;
}

// REQUIRES: mu_ held.
Status MpsDaemons::Start(const std::string& gpu_uuid) {
  ASSIGN_OR_RETURN(const std::string exe, ResolveBinary(gpu_uuid));
  const std::string pipe = PipeDir(gpu_uuid);
  const std::string log = LogDir(gpu_uuid);
  const std::string what = fmt::format("starting the MPS control daemon for GPU {}", gpu_uuid);
  RETURN_IF_ERROR(agent_internal::MakeDirs(pipe).WithContext(what));
  RETURN_IF_ERROR(agent_internal::MakeDirs(log).WithContext(what));
  const auto deadline = Clock::now() + options_.start_timeout;
  auto r = RunCommand(exe, {exe, "-d"}, DaemonEnv(gpu_uuid), "", options_.start_timeout);
  if (!r.ok()) return r.status().WithContext(what);
  if (r->timed_out || r->status != 0)
    return Status::FailedPrecondition(fmt::format("{}: '{} -d' failed ({}; {})", what, exe, DescribeStatus(*r),
                                                  DescribeOutput(*r)));
  ++starts_;
  // The daemonizing parent has exited; the daemon creates its control pipe shortly after.
  auto pause = std::chrono::milliseconds(10);
  for (;;) {
    if (Healthy(gpu_uuid)) return Status::Ok();
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
  return Status::FailedPrecondition(
      fmt::format("{}: '{} -d' exited 0, but no daemon answers on {}/control after {} ms (see {}/control.log)",
                  what, exe, pipe, options_.start_timeout.count(), log));
}

// REQUIRES: mu_ held.
Status MpsDaemons::Quit(const std::string& gpu_uuid) {
  const std::string pipe = PipeDir(gpu_uuid);
  const std::string control = fmt::format("{}/control", pipe);
  const pid_t pid = ReadPidFile(fmt::format("{}/{}", pipe, kPidFile));
  auto gone = [&] { return pid > 0 ? !PidAlive(pid) : !agent_internal::PathExists(control); };
  // Nothing answers: already dead (or never started); nothing to stop.
  if (!Healthy(gpu_uuid)) return Status::Ok();
  const std::string what = fmt::format("stopping the MPS control daemon for GPU {}", gpu_uuid);
  ASSIGN_OR_RETURN(const std::string exe, ResolveBinary(gpu_uuid));
  auto r = RunCommand(exe, {exe}, DaemonEnv(gpu_uuid), "quit\n", options_.command_timeout);
  if (!r.ok()) return r.status().WithContext(what);
  if (r->timed_out || r->status != 0) {
    if (gone()) return Status::Ok();  // it died on its own meanwhile
    return Status::Internal(
        fmt::format("{}: 'quit' failed ({}; {})", what, DescribeStatus(*r), DescribeOutput(*r)));
  }
  // Wait for it to go, so that an Ensure right after does not take a daemon on its way out for a
  // healthy one.
  const auto deadline = Clock::now() + options_.command_timeout;
  while (!gone()) {
    if (Clock::now() >= deadline)
      return Status::Internal(fmt::format("{}: still running {} ms after 'quit'", what,
                                          options_.command_timeout.count()));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Status::Ok();
}

Status MpsDaemons::Ensure(const std::string& gpu_uuid, const std::string& user) {
  RETURN_IF_ERROR(ValidateUuid(gpu_uuid));
  std::lock_guard<std::mutex> lock(mu_);
  if (!Healthy(gpu_uuid)) RETURN_IF_ERROR(Start(gpu_uuid));
  users_[gpu_uuid].insert(user);
  return Status::Ok();
}

Status MpsDaemons::Release(const std::string& gpu_uuid, const std::string& user) {
  RETURN_IF_ERROR(ValidateUuid(gpu_uuid));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = users_.find(gpu_uuid);
  if (it == users_.end() || it->second.erase(user) == 0 || !it->second.empty()) return Status::Ok();
  users_.erase(it);
  return Quit(gpu_uuid);
}

Status MpsDaemons::StopAll() {
  std::lock_guard<std::mutex> lock(mu_);
  Status first;
  for (const auto& [uuid, users] : users_) {
    Status st = Quit(uuid);
    if (first.ok() && !st.ok()) first = st;
  }
  users_.clear();
  return first;
}

std::vector<std::string> MpsDaemons::Gpus() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [uuid, users] : users_) out.push_back(uuid);
  return out;
}

std::vector<std::string> MpsDaemons::Users(const std::string& gpu_uuid) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = users_.find(gpu_uuid);
  if (it == users_.end()) return {};
  return {it->second.begin(), it->second.end()};
}

int MpsDaemons::starts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return starts_;
}

}  // namespace gpupool
