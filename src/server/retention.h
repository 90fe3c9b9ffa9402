// Retention (docs/server.md#retention): a job that has ended — every task stopped — and not changed
// for the retention period is removed, from memory and the store. This controller only reads the
// state and says which jobs are due; PoolService removes them (store, watchers, metrics).
#pragma once

#include <cstdint>
#include <vector>

#include "server/state.h"

namespace gpupool {

struct RetentionPass {
  std::vector<uint64_t> expired;  // sequence numbers, oldest first
  bool more = false;              // stopped at `max_jobs`: more may be due
};

// The ended jobs whose last change (the job's or any task's) is at least `keep_ms` before
// `now_ms`, at most `max_jobs` of them.
RetentionPass ExpiredJobs(const PoolState& st, int64_t now_ms, int64_t keep_ms, int max_jobs);

}  // namespace gpupool
