#include "agent/mps_control.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <thread>

#include "agent/runtime_internal.h"

namespace gpupool::mps_internal {

namespace {

using Clock = std::chrono::steady_clock;
using agent_internal::ErrnoText;
using agent_internal::FdCloser;

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

std::string Trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

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
  if (in_r.get() < 0 || in_w.get() < 0 || out_r.get() < 0 || out_w.get() < 0 || ex_r.get() < 0 ||
      ex_w.get() < 0)
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
    if (::dup2(in_fd, 0) < 0 || ::dup2(out_fd, 1) < 0 || ::dup2(out_fd, 2) < 0 || ::dup2(ex_fd, 3) < 0)
      ::_exit(127);
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
      const size_t room = kMaxOutput - result.output.size();
      if (static_cast<size_t>(n) > room) result.truncated = true;
      result.output.append(buf, std::min(static_cast<size_t>(n), room));
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
  if (exec_failed)
    return Status::FailedPrecondition(fmt::format("cannot execute '{}': {}", exe, ErrnoText(exec_errno)));
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
  return text.empty() ? std::string("no output") : fmt::format("output: {}", Excerpt(text));
}

std::string Excerpt(std::string_view text) {
  constexpr size_t kMax = 200;
  while (!text.empty() &&
         (text.back() == '\n' || text.back() == '\r' || text.back() == ' ' || text.back() == '\t'))
    text.remove_suffix(1);
  std::string out = "'";
  for (size_t i = 0; i < text.size() && i < kMax; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c >= 0x7f || c == '\\' || c == '\'') {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += text.size() > kMax ? "'..." : "'";
  return out;
}

namespace {

bool IsBlank(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

std::string_view Strip(std::string_view s) {
  while (!s.empty() && IsBlank(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsBlank(s.back())) s.remove_suffix(1);
  return s;
}

// A whole number of at most `max_digits` digits and nothing else; -1 otherwise.
int64_t Digits(std::string_view s, size_t max_digits) {
  if (s.empty() || s.size() > max_digits) return -1;
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 0) return -1;
  for (char c : s)
    if (c < '0' || c > '9') return -1;
  return v;
}

// "25" or "25.000": the whole number, -1 for anything else (a fraction that is not zero included).
int64_t WholeNumber(std::string_view s, size_t max_digits) {
  if (const size_t dot = s.find('.'); dot != std::string_view::npos) {
    const std::string_view fraction = s.substr(dot + 1);
    if (fraction.empty() || fraction.size() > 6 || fraction.find_first_not_of('0') != std::string_view::npos)
      return -1;
    s = s.substr(0, dot);
  }
  return Digits(s, max_digits);
}

Status BadReply(const char* what, std::string_view output, const char* expected) {
  return Status::Internal(
      fmt::format("unexpected reply to {}: {} (expected {})", what, Excerpt(output), expected));
}

}  // namespace

Result<std::vector<pid_t>> ParseServerList(std::string_view output) {
  constexpr int64_t kMaxPid = 4194304;  // PID_MAX_LIMIT on 64-bit Linux
  constexpr size_t kMaxLines = 1024;
  std::vector<pid_t> pids;
  size_t lines = 0;
  std::string_view rest = output;
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    const std::string_view line = Strip(rest.substr(0, nl));
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    if (++lines > kMaxLines) return BadReply("get_server_list", output, "at most 1024 lines");
    if (line.empty()) continue;
    const int64_t pid = Digits(line, 7);
    if (pid < 1 || pid > kMaxPid) return BadReply("get_server_list", output, "one server PID a line");
    if (std::find(pids.begin(), pids.end(), static_cast<pid_t>(pid)) == pids.end())
      pids.push_back(static_cast<pid_t>(pid));
  }
  return pids;
}

Result<int> ParsePercentage(std::string_view output) {
  const std::string_view text = Strip(output);
  const int64_t v = WholeNumber(text, 3);
  if (v < 0 || v > 100) return BadReply("get_active_thread_percentage", output, "a percentage such as 25.0");
  return static_cast<int>(v);
}

Result<int64_t> ParsePinnedMib(std::string_view output) {
  constexpr int64_t kMaxMib = int64_t{1} << 40;
  std::string_view text = Strip(output);
  const size_t unit_at = text.find_first_not_of("0123456789.");
  if (unit_at == std::string_view::npos || unit_at == 0)
    return BadReply("get_device_pinned_mem_limit", output, "a whole number of MiB or GiB such as 20480M");
  std::string_view number = text.substr(0, unit_at);
  std::string_view unit = text.substr(unit_at);
  if (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  int64_t scale = 0;
  if (unit == "M" || unit == "MB" || unit == "MiB") scale = 1;
  if (unit == "G" || unit == "GB" || unit == "GiB") scale = 1024;
  const int64_t v = WholeNumber(number, 13);
  if (scale == 0 || v < 0 || v > kMaxMib / scale)
    return BadReply("get_device_pinned_mem_limit", output, "a whole number of MiB or GiB such as 20480M");
  return v * scale;
}

Result<int64_t> ProcUid(pid_t pid, const std::string& proc_root) {
  const std::string path = fmt::format("{}/{}/status", proc_root, pid);
  auto text = agent_internal::ReadFile(path);
  if (!text.ok())
    return Status::NotFound(fmt::format("process {} is gone ({})", pid, text.status().message()));
  // The kernel escapes the command name (the Name: line), so a line that starts "Uid:" is the uid's.
  const std::string& s = *text;
  size_t at = s.rfind("Uid:", 0) == 0 ? 0 : s.find("\nUid:");
  if (at == std::string::npos) return Status::Internal(fmt::format("{} has no Uid line", path));
  at = s.find(':', at) + 1;
  while (at < s.size() && (s[at] == '\t' || s[at] == ' ')) ++at;
  const size_t end = s.find_first_of("\t \n", at);
  const int64_t uid =
      Digits(std::string_view(s).substr(at, end == std::string::npos ? std::string::npos : end - at), 10);
  if (uid < 0 || uid > 0xfffffffe) return Status::Internal(fmt::format("{}: unreadable Uid line", path));
  return uid;
}

}  // namespace gpupool::mps_internal
