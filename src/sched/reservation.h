// Backfill reservations, the choice of nodes: a gang that has waited too long gets nodes held for
// it, so that smaller jobs stop backfilling them and it does not starve. The server's controller
// (server/reservations.h) and the time-based replay (sim/replay.h) both ask this what to hold.
// Pure: reads the ledger only.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "model/ledger.h"
#include "model/workload.h"
#include "sched/queueing.h"

namespace gpupool {

// The nodes to hold for `job` (its demand `demand`, JobDemand): of the schedulable nodes not
// `excluded` (a node past the end of it is not) that could hold its largest task when empty, those
// with the most free GPU share first (then by index), as many as cover its demand in CPU, memory
// and GPUs. One entry per node, 1 = held. nullopt when all of them together do not cover it.
std::optional<std::vector<uint8_t>> ChooseReservedNodes(const Ledger& ledger, const Job& job, const Resources& demand,
                                                        const std::vector<uint8_t>& excluded);

}  // namespace gpupool
