// What holds a job back or ends it besides capacity: the jobs it depends on (dependsOn) and its
// time limit. Reads the state only; the cycle turns the verdicts into operations.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/state.h"

namespace gpupool {

struct DependencyVerdict {
  enum class Kind { kMet, kWaiting, kBroken };
  Kind kind = Kind::kMet;
  std::string message;  // waiting: what for; broken: why the job can never start
};
// Where the pending job `j`'s dependencies stand: met when every one ended as asked, broken when
// one ended otherwise or no longer exists, else waiting (the message names the first unmet one).
DependencyVerdict CheckDependencies(const PoolState& st, const PoolJob& j);

struct TimeLimitDue {
  std::string job_id;
  std::string reason;  // "time limit: ..."
};
// The running jobs whose current run has lasted their timeLimit or longer at `now_ms`.
std::vector<TimeLimitDue> PastTimeLimits(const PoolState& st, int64_t now_ms);

}  // namespace gpupool
