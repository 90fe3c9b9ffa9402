#include "server/reservations.h"

#include <algorithm>

#include "sched/reservation.h"
#include "server/node_mask.h"

namespace gpupool {

std::optional<ReserveOp> PlanReservation(const PoolState& st, const PoolJob& j, int64_t now_ms,
                                         int reserve_after_seconds) {
  if (!st.reserved_for.empty()) return std::nullopt;
  if (now_ms - j.pending_since_ms < 1000LL * reserve_after_seconds) return std::nullopt;
  // Never nodes a preemptor holds from this job (it would block the very job that outranks it),
  // nor nodes that are not ready.
  std::vector<uint8_t> excluded = NodesHeldFrom(st, j);
  excluded.resize(st.ledger.node_count(), 0);
  for (NodeIndex n = 0; n < st.ledger.node_count(); ++n) {
    if (n >= st.nodes.size() || st.nodes[n].state != "ready") excluded[n] = 1;
  }
  auto nodes = ChooseReservedNodes(st.ledger, j.job, j.demand, excluded);
  if (!nodes) return std::nullopt;
  ReserveOp op;
  op.job_id = j.rec.id;
  op.nodes = std::move(*nodes);
  return op;
}

}  // namespace gpupool
