// MpsDaemons: the limits of the MPS servers (mps.h, "Server limits"): which server is a uid's, and
// setting and reading back its active-thread percentage and pinned-memory limit through the GPU's
// control daemon.
#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "agent/mps.h"
#include "agent/mps_control.h"

namespace gpupool {

namespace {

using Clock = std::chrono::steady_clock;
using mps_internal::DescribeOutput;
using mps_internal::DescribeStatus;
using mps_internal::Excerpt;

std::string Prefix(const std::string& gpu_uuid, int64_t uid) {
  return fmt::format("MPS server limits for uid {} on GPU {}", uid, gpu_uuid);
}

// " ('<cmd>' answered '...')" when a set command printed something; "" when it printed nothing.
std::string SetAnswer(const std::string& command, const std::string& output) {
  if (output.find_first_not_of(" \t\r\n") == std::string::npos) return "";
  return fmt::format(" ('{}' answered {})", command, Excerpt(output));
}

}  // namespace

Status ValidateMpsClientLimits(const MpsClientLimits& limits) {
  if (limits.uid < 0 || limits.uid > 0xfffffffe)
    return Status::InvalidArgument(fmt::format("uid {} is not a uid (0..4294967294)", limits.uid));
  if (limits.active_thread_percentage < 1 || limits.active_thread_percentage > 100)
    return Status::InvalidArgument(
        fmt::format("active-thread percentage {} is not 1..100", limits.active_thread_percentage));
  if (limits.pinned_mem_mib < 1 || limits.pinned_mem_mib > kMaxPinnedMemMib)
    return Status::InvalidArgument(
        fmt::format("pinned memory limit {} MiB is not 1..{} MiB", limits.pinned_mem_mib, kMaxPinnedMemMib));
  return Status::Ok();
}

// REQUIRES: mu_ held.
std::optional<MpsClientLimits> MpsDaemons::SumLocked(const std::string& gpu_uuid, int64_t uid) const {
  auto it = users_.find(gpu_uuid);
  if (it == users_.end()) return std::nullopt;
  std::optional<MpsClientLimits> sum;
  for (const auto& [user, limits] : it->second) {
    if (!limits || limits->uid != uid) continue;
    if (!sum) {
      sum = MpsClientLimits{uid, 0, 0};
    }
    // Each term is bounded (ValidateMpsClientLimits): no overflow for any number of users a node has.
    sum->active_thread_percentage =
        std::min(100, sum->active_thread_percentage + limits->active_thread_percentage);
    sum->pinned_mem_mib += limits->pinned_mem_mib;
  }
  return sum;
}

std::optional<MpsClientLimits> MpsDaemons::ServerLimits(const std::string& gpu_uuid, int64_t uid) const {
  std::lock_guard<std::mutex> lock(mu_);
  return SumLocked(gpu_uuid, uid);
}

Result<std::string> MpsDaemons::Control(const std::string& exe, const std::string& gpu_uuid, int64_t uid,
                                        const std::string& command) const {
  auto r =
      mps_internal::RunCommand(exe, {exe}, DaemonEnv(gpu_uuid), command + "\n", options_.command_timeout);
  if (!r.ok()) return r.status().WithContext(fmt::format("{}: '{}'", Prefix(gpu_uuid, uid), command));
  if (r->timed_out || r->status != 0)
    return Status::FailedPrecondition(fmt::format("{}: '{}' failed ({}; {})", Prefix(gpu_uuid, uid), command,
                                                  DescribeStatus(*r), DescribeOutput(*r)));
  if (r->truncated)
    return Status::FailedPrecondition(fmt::format("{}: '{}' printed more than {} bytes",
                                                  Prefix(gpu_uuid, uid), command, mps_internal::kMaxOutput));
  return std::move(r->output);
}

Result<std::vector<pid_t>> MpsDaemons::ServersOf(const std::string& exe, const std::string& gpu_uuid,
                                                 int64_t uid) {
  ASSIGN_OR_RETURN(const std::string listed, Control(exe, gpu_uuid, uid, "get_server_list"));
  auto pids = mps_internal::ParseServerList(listed);
  if (!pids.ok())
    return Status::FailedPrecondition(fmt::format("{}: {}", Prefix(gpu_uuid, uid), pids.status().message()));
  std::vector<pid_t> mine;
  for (pid_t pid : *pids) {
    auto owner = mps_internal::ProcUid(pid, options_.proc_root);
    if (!owner.ok() && owner.status().code() == StatusCode::kNotFound) continue;  // exited since
    if (!owner.ok())
      return Status::FailedPrecondition(fmt::format("{}: server {} listed by get_server_list: {}",
                                                    Prefix(gpu_uuid, uid), pid, owner.status().message()));
    if (*owner == uid) mine.push_back(pid);
  }
  return mine;
}

// REQUIRES: mu_ held.
Status MpsDaemons::ApplyServerLimits(const std::string& gpu_uuid, const MpsClientLimits& limits) {
  const int64_t uid = limits.uid;
  const std::string prefix = Prefix(gpu_uuid, uid);
  ASSIGN_OR_RETURN(const std::string exe, ResolveBinary(gpu_uuid));
  ASSIGN_OR_RETURN(std::vector<pid_t> servers, ServersOf(exe, gpu_uuid, uid));
  if (servers.empty()) {
    const std::string start = fmt::format("start_server -uid {}", uid);
    ASSIGN_OR_RETURN(const std::string started, Control(exe, gpu_uuid, uid, start));
    const auto deadline = Clock::now() + options_.command_timeout;
    auto pause = std::chrono::milliseconds(10);
    for (;;) {
      ASSIGN_OR_RETURN(servers, ServersOf(exe, gpu_uuid, uid));
      if (!servers.empty()) break;
      if (Clock::now() >= deadline)
        return Status::FailedPrecondition(
            fmt::format("{}: '{}' exited 0{}, but get_server_list shows no server of uid {} after {} ms",
                        prefix, start, SetAnswer(start, started), uid, options_.command_timeout.count()));
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(200));
    }
  }
  for (pid_t pid : servers) {
    const std::string set_pct =
        fmt::format("set_active_thread_percentage {} {}", pid, limits.active_thread_percentage);
    const std::string set_mem =
        fmt::format("set_device_pinned_mem_limit {} 0 {}M", pid, limits.pinned_mem_mib);
    const std::string get_pct = fmt::format("get_active_thread_percentage {}", pid);
    const std::string get_mem = fmt::format("get_device_pinned_mem_limit {} 0", pid);
    ASSIGN_OR_RETURN(const std::string pct_set, Control(exe, gpu_uuid, uid, set_pct));
    ASSIGN_OR_RETURN(const std::string mem_set, Control(exe, gpu_uuid, uid, set_mem));

    ASSIGN_OR_RETURN(const std::string pct_text, Control(exe, gpu_uuid, uid, get_pct));
    auto pct = mps_internal::ParsePercentage(pct_text);
    if (!pct.ok())
      return Status::FailedPrecondition(fmt::format("{}: '{}' not verified{}: {}", prefix, set_pct,
                                                    SetAnswer(set_pct, pct_set), pct.status().message()));
    if (*pct != limits.active_thread_percentage)
      return Status::FailedPrecondition(fmt::format(
          "{}: '{}' did not take effect{}: '{}' answered {}, not {}", prefix, set_pct,
          SetAnswer(set_pct, pct_set), get_pct, Excerpt(pct_text), limits.active_thread_percentage));

    ASSIGN_OR_RETURN(const std::string mem_text, Control(exe, gpu_uuid, uid, get_mem));
    auto mib = mps_internal::ParsePinnedMib(mem_text);
    if (!mib.ok())
      return Status::FailedPrecondition(fmt::format("{}: '{}' not verified{}: {}", prefix, set_mem,
                                                    SetAnswer(set_mem, mem_set), mib.status().message()));
    if (*mib != limits.pinned_mem_mib)
      return Status::FailedPrecondition(
          fmt::format("{}: '{}' did not take effect{}: '{}' answered {}, not {}M", prefix, set_mem,
                      SetAnswer(set_mem, mem_set), get_mem, Excerpt(mem_text), limits.pinned_mem_mib));
  }
  return Status::Ok();
}

}  // namespace gpupool
