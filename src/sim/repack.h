// How much of a run's stranded GPU share is the placement's doing, and how much the pods' own: the
// GPU-sharing pods a run ends with, packed as tightly as any placement of them could be.
//
// Every GPU-sharing pod (Placement::share_task) counts by its share. The fewest GPUs that hold all
// of them is a cutting-stock problem: one integer variable per pattern (a multiset of the pods'
// shares that fits one GPU of 1,000 milli-GPU, using no share more often than there are such pods),
// minimise the GPUs used, cover every pod. GLPK solves it (simplex, then branch and bound with a time
// limit). Nodes, CPU, memory, GPU models and GPU memory are all ignored, so the result is a lower
// bound on the GPUs these pods need however they are placed — and share_gpus - min_gpus an upper
// bound on what moving them could free.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "model/ledger.h"

namespace gpupool {

struct RepackResult {
  int64_t share_pods = 0;   // GPU-sharing pods placed
  int64_t share_gpus = 0;   // GPUs that hold at least one of them
  int64_t share_milli = 0;  // milli-GPU they hold
  int64_t min_gpus = 0;     // the fewest GPUs that could hold them
  // True when min_gpus is the integer optimum; false when branch and bound ran out of time and
  // min_gpus is the LP optimum rounded up (still a valid lower bound).
  bool optimal = true;
  int64_t patterns = 0;  // per-GPU patterns considered
};

// Errors: a share task's grant of 0 or at least a whole GPU, more than kMaxRepackPatterns patterns
// (named with the count), or GLPK failing.
inline constexpr int64_t kMaxRepackPatterns = 200'000;
Result<RepackResult> RepackSharePods(const Ledger& ledger);

}  // namespace gpupool
