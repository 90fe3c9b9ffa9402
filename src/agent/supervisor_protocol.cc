#include "agent/supervisor_protocol.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string_view>

namespace gpupool::agent_internal {

// ---- the command line ------------------------------------------------------------------------------

std::vector<std::string> EncodeSupervisorArgs(const SupervisorPlan& p) {
  std::vector<std::string> out;
  out.reserve(16 + p.envp.size() + p.argv.size() + p.cgroup_procs.size() + p.fence_argv.size());
  out.push_back("--exe=" + p.executable);
  out.push_back("--workdir=" + p.workdir);
  out.push_back("--exit=" + p.exit_path);
  if (!p.lease_path.empty()) out.push_back("--lease=" + p.lease_path);
  out.push_back("--stdout=" + p.stdout_path);
  out.push_back("--stderr=" + p.stderr_path);
  out.push_back("--log-max-bytes=" + std::to_string(p.log_max_bytes));
  out.push_back("--log-keep=" + std::to_string(p.log_keep));
  for (const auto& c : p.cgroup_procs) out.push_back("--cgroup-procs=" + c);
  for (const auto& f : p.fence_argv) out.push_back("--fence=" + f);
  for (const auto& e : p.envp) out.push_back("--env=" + e);
  if (p.uid >= 0) out.push_back("--uid=" + std::to_string(p.uid));
  if (p.gid >= 0) out.push_back("--gid=" + std::to_string(p.gid));
  if (p.no_new_privs) out.push_back("--no-new-privs=1");
  for (const auto& h : p.hide_paths) out.push_back("--hide=" + h);
  for (const auto& k : p.keep_paths) out.push_back("--keep=" + k);
  if (p.private_dev) out.push_back("--private-dev=1");
  for (const auto& d : p.devices) out.push_back("--dev=" + d);
  for (const auto& f : p.run_files)
    out.push_back("--run-file=" + std::string(f.writable ? "rw:" : "ro:") + f.name + ":" + f.source);
  if (!p.preload_list.empty()) out.push_back("--preload-list=" + p.preload_list);
  out.push_back("--");
  for (const auto& a : p.argv) out.push_back(a);
  return out;
}

namespace {

bool ParseInt(std::string_view s, int64_t lo, int64_t hi, int64_t* out) {
  if (s.empty() || s.size() > 19) return false;
  bool neg = s[0] == '-';
  if (neg) s.remove_prefix(1);
  if (s.empty()) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (neg) v = -v;
  if (v < lo || v > hi) return false;
  *out = v;
  return true;
}

}  // namespace

bool DecodeSupervisorArgs(int argc, const char* const* argv, SupervisorPlan* plan, std::string* why) {
  *plan = SupervisorPlan{};
  bool have_exe = false, have_exit = false, have_workdir = false, have_out = false, have_err = false;
  int i = 1;
  for (; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    const size_t eq = a.find('=');
    if (a.substr(0, 2) != "--" || eq == std::string_view::npos) {
      *why = "unexpected argument '" + std::string(a) + "'";
      return false;
    }
    const std::string_view name = a.substr(2, eq - 2);
    const std::string value(a.substr(eq + 1));
    if (name == "exe") {
      plan->executable = value;
      have_exe = true;
    } else if (name == "workdir") {
      plan->workdir = value;
      have_workdir = true;
    } else if (name == "exit") {
      plan->exit_path = value;
      have_exit = true;
    } else if (name == "lease") {
      plan->lease_path = value;
    } else if (name == "stdout") {
      plan->stdout_path = value;
      have_out = true;
    } else if (name == "stderr") {
      plan->stderr_path = value;
      have_err = true;
    } else if (name == "log-max-bytes") {
      if (!ParseInt(value, INT64_MIN + 1, INT64_MAX, &plan->log_max_bytes)) {
        *why = "--log-max-bytes is not an integer";
        return false;
      }
    } else if (name == "log-keep") {
      int64_t keep = 0;
      if (!ParseInt(value, 0, 9, &keep)) {
        *why = "--log-keep is not an integer in [0, 9]";
        return false;
      }
      plan->log_keep = static_cast<int>(keep);
    } else if (name == "cgroup-procs") {
      plan->cgroup_procs.push_back(value);
    } else if (name == "fence") {
      plan->fence_argv.push_back(value);
    } else if (name == "env") {
      plan->envp.push_back(value);
    } else if (name == "uid" || name == "gid") {
      if (!ParseInt(value, 0, 0xfffffffe, name == "uid" ? &plan->uid : &plan->gid)) {
        *why = "--" + std::string(name) + " is not an id in [0, 2^32-2]";
        return false;
      }
    } else if (name == "no-new-privs") {
      plan->no_new_privs = value == "1";
    } else if (name == "hide" || name == "keep" || name == "dev") {
      if (value.empty() || value[0] != '/') {
        *why = "--" + std::string(name) + " is not an absolute path";
        return false;
      }
      (name == "hide" ? plan->hide_paths : name == "keep" ? plan->keep_paths : plan->devices).push_back(value);
    } else if (name == "private-dev") {
      plan->private_dev = value == "1";
    } else if (name == "run-file") {
      // "ro:NAME:/source" or "rw:NAME:/source"
      const size_t colon = value.find(':', 3);
      SupervisorPlan::RunFile f;
      if (value.size() < 3 || (value.compare(0, 3, "ro:") != 0 && value.compare(0, 3, "rw:") != 0) ||
          colon == std::string::npos || !ValidRunFileName(std::string_view(value).substr(3, colon - 3)) ||
          colon + 1 >= value.size() || value[colon + 1] != '/') {
        *why = "--run-file is not ro:NAME:/path or rw:NAME:/path";
        return false;
      }
      f.writable = value[1] == 'w';
      f.name = value.substr(3, colon - 3);
      f.source = value.substr(colon + 1);
      for (const auto& other : plan->run_files)
        if (other.name == f.name) {
          *why = "--run-file names " + f.name + " twice";
          return false;
        }
      plan->run_files.push_back(std::move(f));
    } else if (name == "preload-list") {
      if (value.empty() || value[0] != '/') {
        *why = "--preload-list is not an absolute path";
        return false;
      }
      plan->preload_list = value;
    } else {
      *why = "unknown option '--" + std::string(name) + "'";
      return false;
    }
  }
  for (; i < argc; ++i) plan->argv.emplace_back(argv[i]);
  if (!have_exe || plan->executable.empty()) *why = "no --exe";
  else if (!have_workdir) *why = "no --workdir";
  else if (!have_exit || plan->exit_path.empty()) *why = "no --exit";
  else if (!have_out || !have_err) *why = "no --stdout or --stderr";
  else if (plan->argv.empty()) *why = "no task argv after --";
  else return true;
  return false;
}

bool ValidRunFileName(std::string_view name) {
  if (name.empty() || name.size() > 64 || name == "." || name == "..") return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
      return false;
  return true;
}

std::string JoinPlanArgs(const std::vector<std::string>& args) {
  std::string out;
  for (const auto& a : args) {
    out += a;
    out.push_back('\0');
  }
  return out;
}

bool ReadPlanArgs(int fd, std::vector<std::string>* args, std::string* why) {
  std::string buf;
  char chunk[65536];
  while (true) {
    ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *why = "cannot read the plan";
      return false;
    }
    if (n == 0) break;
    if (buf.size() + static_cast<size_t>(n) > kMaxPlanBytes) {
      *why = "the plan is too large";
      return false;
    }
    buf.append(chunk, static_cast<size_t>(n));
  }
  if (buf.empty() || buf.back() != '\0') {
    *why = "the plan is empty or cut short";
    return false;
  }
  args->clear();
  size_t start = 0;
  while (start < buf.size()) {
    size_t end = buf.find('\0', start);
    args->emplace_back(buf, start, end - start);
    start = end + 1;
  }
  return true;
}

// ---- the status pipe ---------------------------------------------------------------------------

const char* StageText(int32_t kind) {
  switch (kind) {
    case kMsgExec: return "cannot execute";
    case kMsgChdir: return "cannot change to the working directory";
    case kMsgCgroup: return "cannot join the task's cgroup";
    case kMsgStdio: return "cannot set up stdio";
    case kMsgFork: return "cannot fork the task";
    case kMsgSetsid: return "cannot start a session";
    case kMsgPlan: return "the supervisor could not read its command line for";
    case kMsgNamespace: return "cannot set up the task's mount namespace for";
    case kMsgIdentity: return "cannot drop to the task's identity for";
    default: return "unknown failure";
  }
}

// ---- async-signal-safe helpers -----------------------------------------------------------------

void SafeSend(int fd, int32_t kind, int32_t value) {
  int32_t msg[2] = {kind, value};
  ssize_t r;
  do {
    r = ::write(fd, msg, sizeof(msg));
  } while (r < 0 && errno == EINTR);
}

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

void CloseFrom(int first) {
  if (::close_range(static_cast<unsigned>(first), ~0U, 0) == 0) return;
  const long max = ::sysconf(_SC_OPEN_MAX);
  const int limit = max > 0 && max < 65536 ? static_cast<int>(max) : 65536;
  for (int fd = first; fd < limit; ++fd) ::close(fd);
}

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

}  // namespace gpupool::agent_internal
