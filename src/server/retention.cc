#include "server/retention.h"

#include <algorithm>

namespace gpupool {

RetentionPass ExpiredJobs(const PoolState& st, int64_t now_ms, int64_t keep_ms, int max_jobs) {
  RetentionPass pass;
  for (const auto& [seq, j] : st.by_seq) {
    bool ended =
        j->phase == JobPhase::kSucceeded || j->phase == JobPhase::kFailed || j->phase == JobPhase::kCancelled;
    int64_t last_change = j->rec.updated_ms;
    for (const PoolTask& ts : j->tasks) {
      // A failed or cancelled job may still be stopping tasks: it stays until they have stopped.
      ended &= ts.phase != TaskPhase::kAssigned && ts.phase != TaskPhase::kRunning &&
               ts.phase != TaskPhase::kStopping;
      last_change = std::max(last_change, ts.updated_ms);
    }
    if (!ended || last_change > now_ms - keep_ms) continue;
    if (static_cast<int>(pass.expired.size()) == max_jobs) {
      pass.more = true;
      break;
    }
    pass.expired.push_back(seq);
  }
  return pass;
}

}  // namespace gpupool
