#include "server/reservations.h"

#include <algorithm>

#include "server/node_mask.h"

namespace gpupool {

std::optional<ReserveOp> PlanReservation(const PoolState& st, const PoolJob& j, int64_t now_ms,
                                         int reserve_after_seconds) {
  if (!st.reserved_for.empty()) return std::nullopt;
  if (now_ms - j.pending_since_ms < 1000LL * reserve_after_seconds) return std::nullopt;
  // Nodes that could hold this job's largest task when empty, closest to free first.
  const TaskRequest* largest = nullptr;
  for (const auto& g : j.job.groups) {
    if (largest == nullptr || g.request.total_gpu_share() > largest->total_gpu_share()) largest = &g.request;
  }
  // Never nodes a preemptor holds from this job: it would block the very job that outranks it.
  const std::vector<uint8_t> held = NodesHeldFrom(st, j);
  std::vector<NodeIndex> candidates;
  for (NodeIndex n = 0; n < st.ledger.node_count(); ++n) {
    const NodeSpec& s = st.ledger.spec(n);
    if (!st.ledger.state(n).schedulable() || st.nodes[n].state != "ready") continue;
    if (n < held.size() && held[n]) continue;
    if (static_cast<int>(s.gpus.size()) < largest->gpu_count || s.cpu < largest->cpu ||
        s.memory < largest->memory)
      continue;
    if (!largest->gpu_models.empty() && !s.gpus.empty() &&
        std::find(largest->gpu_models.begin(), largest->gpu_models.end(), s.gpus[0].model) ==
            largest->gpu_models.end())
      continue;
    candidates.push_back(n);
  }
  std::sort(candidates.begin(), candidates.end(), [&](NodeIndex a, NodeIndex b) {
    const auto& sa = st.ledger.state(a);
    const auto& sb = st.ledger.state(b);
    if (sa.free_gpu_share != sb.free_gpu_share) return sa.free_gpu_share > sb.free_gpu_share;
    return a < b;
  });
  Resources covered;
  std::vector<uint8_t> reserved(st.ledger.node_count(), 0);
  for (NodeIndex n : candidates) {
    if (covered.gpu >= j.demand.gpu && covered.cpu >= j.demand.cpu && covered.memory >= j.demand.memory)
      break;
    const NodeSpec& s = st.ledger.spec(n);
    covered.cpu += s.cpu.units();
    covered.memory += s.memory.units();
    covered.gpu += 1000 * static_cast<int64_t>(s.gpus.size());
    reserved[n] = 1;
  }
  if (covered.gpu < j.demand.gpu || covered.cpu < j.demand.cpu || covered.memory < j.demand.memory)
    return std::nullopt;
  ReserveOp op;
  op.job_id = j.rec.id;
  op.nodes = std::move(reserved);
  return op;
}

}  // namespace gpupool
