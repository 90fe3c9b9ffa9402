// Backfill reservations, the controller: a pending job that waited reserve_after_seconds gets the
// nodes that could hold it held for it (those closest to free first, as many as its demand
// needs), so that smaller jobs stop backfilling them and it does not starve. Reads the state and
// says what to hold; the state machine applies it (ReserveOp), and the hold ends when the job
// leaves the pending state (PoolState::SetJobPhase).
#pragma once

#include <cstdint>
#include <optional>

#include "server/operations.h"
#include "server/state.h"

namespace gpupool {

// Nothing while nodes are held for a job already, the job has not waited long enough, or the
// ready schedulable nodes together cannot cover its demand.
std::optional<ReserveOp> PlanReservation(const PoolState& st, const PoolJob& j, int64_t now_ms,
                                         int reserve_after_seconds);

}  // namespace gpupool
