// Which nodes a job may not use now, and why (the scheduler's NodeMask): nodes that are not ready,
// nodes held for another waiting gang, and the job's affinity — node labels, together-with and
// apart-from other jobs' tasks. Reads the state only.
#pragma once

#include "sched/scheduler.h"
#include "server/state.h"

namespace gpupool {

// Fills `mask` for job `j`; false when no node is masked (the scheduler may skip the mask).
bool ComputeNodeMask(const PoolState& st, const PoolJob& j, NodeMask& mask);

}  // namespace gpupool
