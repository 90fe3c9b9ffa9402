// The rendezvous of a job of several tasks, as each task's assignment carries it: where rank 0
// listens and who is who, so that torchrun / torch.distributed, JAX and MPI find each other
// (docs/jobspec.md#distributed-jobs). Pure: no I/O.
#pragma once

#include <nlohmann/json.hpp>

#include "server/state.h"

namespace gpupool {

// The node's address for its peers: its label `gpupool.io/address`, else its name (a host name,
// by default).
std::string NodeAddress(const NodeSpec& node);

// The job's port on its master's node: 20000 + seq mod 10000, the same for all its tasks and
// restarts; two jobs share one only when their sequence numbers differ by a multiple of 10,000.
int RendezvousPort(uint64_t seq);

// {masterAddr, masterPort, worldSize, rank, localRank, localWorldSize, nodeRank, nodes,
// hosts: ["addr:tasks", ...] in node-rank order} for task `index` of `job`, placed; null for a
// job of one task. Ranks are task indices; the master is rank 0's node (the lowest placed rank's
// while rank 0 is not placed); nodes are ranked by their lowest rank. Only placed tasks (assigned,
// running, stopping) count as on a node.
nlohmann::json RendezvousJson(const PoolState& state, const PoolJob& job, int index);

}  // namespace gpupool
