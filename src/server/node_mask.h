// Which nodes a job may not use now, and why (the scheduler's NodeMask): nodes that are not ready,
// nodes held for another waiting gang, nodes a preemptor holds from the best-effort jobs it could
// evict in turn, and the job's affinity — node labels, together-with and
// apart-from other jobs' tasks. Reads the state only.
#pragma once

#include "sched/scheduler.h"
#include "server/state.h"

namespace gpupool {

// The nodes preemptors hold from `j` while their victims stop (by NodeIndex, 1: held; shorter than
// the pool or empty where none is): `j` is best-effort and one of them could evict it.
std::vector<uint8_t> NodesHeldFrom(const PoolState& st, const PoolJob& j);

// The node labels the job's containers need (label, what it means): a runtime class other than
// runc, a pod network (model/node.h).
std::vector<std::pair<std::string, std::string>> ContainerNeeds(const Job& job);

// Fills `mask` for job `j`; false when no node is masked (the scheduler may skip the mask).
bool ComputeNodeMask(const PoolState& st, const PoolJob& j, NodeMask& mask);

}  // namespace gpupool
