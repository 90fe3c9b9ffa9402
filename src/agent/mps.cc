#include "agent/mps.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>

#include "agent/mps_control.h"
#include "agent/runtime_internal.h"

extern char** environ;

namespace gpupool {

namespace {

using Clock = std::chrono::steady_clock;
using agent_internal::ErrnoText;
using mps_internal::DescribeOutput;
using mps_internal::DescribeStatus;
using mps_internal::RunCommand;

constexpr const char* kPidFile = "nvidia-cuda-mps-control.pid";

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
  users_[gpu_uuid].try_emplace(user);  // a user that has limits keeps them
  return Status::Ok();
}

Status MpsDaemons::Ensure(const std::string& gpu_uuid, const std::string& user, const MpsClientLimits& limits) {
  RETURN_IF_ERROR(ValidateUuid(gpu_uuid));
  RETURN_IF_ERROR(
      ValidateMpsClientLimits(limits).WithContext(fmt::format("MPS limits of {} on GPU {}", user, gpu_uuid)));
  std::lock_guard<std::mutex> lock(mu_);
  if (!Healthy(gpu_uuid)) RETURN_IF_ERROR(Start(gpu_uuid));
  std::optional<std::optional<MpsClientLimits>> before;  // the user's entry before this call
  {
    auto& users = users_[gpu_uuid];
    if (auto it = users.find(user); it != users.end()) before = it->second;
    users[user] = limits;
  }
  Status st = ApplyServerLimits(gpu_uuid, *SumLocked(gpu_uuid, limits.uid));
  const bool moved = before && *before && (*before)->uid != limits.uid;  // not something the agent does
  if (st.ok() && moved) {
    if (auto rest = SumLocked(gpu_uuid, (*before)->uid)) st = ApplyServerLimits(gpu_uuid, *rest);
  }
  if (st.ok()) return st;
  // The user's entry as it was; the daemon and the servers as they were, as far as that goes.
  auto& users = users_[gpu_uuid];
  if (before) {
    users[user] = *before;
  } else {
    users.erase(user);
  }
  if (users.empty()) {
    users_.erase(gpu_uuid);
    (void)Quit(gpu_uuid);  // st says what went wrong; a daemon that will not quit is tried again later
  } else if (auto rest = SumLocked(gpu_uuid, limits.uid)) {
    (void)ApplyServerLimits(gpu_uuid, *rest);  // best effort: st is the error to report
  }
  return st;
}

Status MpsDaemons::Release(const std::string& gpu_uuid, const std::string& user) {
  RETURN_IF_ERROR(ValidateUuid(gpu_uuid));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = users_.find(gpu_uuid);
  if (it == users_.end()) return Status::Ok();
  auto u = it->second.find(user);
  if (u == it->second.end()) return Status::Ok();
  const std::optional<MpsClientLimits> gone = u->second;
  it->second.erase(u);
  if (it->second.empty()) {
    users_.erase(it);
    return Quit(gpu_uuid);
  }
  if (!gone) return Status::Ok();
  // The uid's remaining users on this GPU hold its server to their sum, now lower.
  const std::optional<MpsClientLimits> rest = SumLocked(gpu_uuid, gone->uid);
  if (!rest) return Status::Ok();
  return ApplyServerLimits(gpu_uuid, *rest).WithContext(fmt::format("releasing {}", user));
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
  std::vector<std::string> out;
  for (const auto& [user, limits] : it->second) out.push_back(user);
  return out;
}

int MpsDaemons::starts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return starts_;
}

}  // namespace gpupool
