#include "server/job_gates.h"

#include <fmt/format.h>

namespace gpupool {

namespace {

std::string Duration(int64_t seconds) {
  if (seconds % 3600 == 0 && seconds >= 3600) return fmt::format("{}h", seconds / 3600);
  if (seconds % 60 == 0 && seconds >= 60) return fmt::format("{}m", seconds / 60);
  return fmt::format("{}s", seconds);
}

}  // namespace

DependencyVerdict CheckDependencies(const PoolState& st, const PoolJob& j) {
  DependencyVerdict out;
  for (const Dependency& d : j.job.depends_on) {
    const PoolJob* dep = st.FindJob(d.job);
    const bool need_success = d.condition == Dependency::Condition::kSucceeded;
    if (dep == nullptr) {
      // Removed by retention (or never there: recovered from a store that lost it).
      return {DependencyVerdict::Kind::kBroken,
              fmt::format("dependency {} no longer exists, so whether it {} is unknown", d.job,
                          need_success ? "succeeded" : "ended")};
    }
    const bool ended = dep->phase == JobPhase::kSucceeded || dep->phase == JobPhase::kFailed ||
                       dep->phase == JobPhase::kCancelled;
    if (!ended) {
      if (out.kind == DependencyVerdict::Kind::kMet)
        out = {DependencyVerdict::Kind::kWaiting,
               fmt::format("waiting for {} to {} (dependsOn)", d.job, need_success ? "succeed" : "end")};
      continue;
    }
    if (need_success && dep->phase != JobPhase::kSucceeded)
      return {DependencyVerdict::Kind::kBroken,
              fmt::format("dependency {} ended {}; this job needed it to succeed", d.job, JobPhaseName(dep->phase))};
  }
  return out;
}

std::vector<TimeLimitDue> PastTimeLimits(const PoolState& st, int64_t now_ms) {
  std::vector<TimeLimitDue> out;
  for (uint64_t seq : st.time_limited) {
    auto it = st.by_seq.find(seq);
    if (it == st.by_seq.end()) continue;
    const PoolJob& j = *it->second;
    if (j.phase != JobPhase::kRunning || j.job.time_limit_seconds <= 0) continue;
    const int64_t ran_ms = now_ms - j.started_ms;
    if (ran_ms < 1000 * j.job.time_limit_seconds) continue;
    out.push_back({j.rec.id, fmt::format("time limit: its run lasted {} s, past its timeLimit of {}", ran_ms / 1000,
                                         Duration(j.job.time_limit_seconds))});
  }
  return out;
}

}  // namespace gpupool
