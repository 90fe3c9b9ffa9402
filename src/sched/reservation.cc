#include "sched/reservation.h"

#include <algorithm>

namespace gpupool {

std::optional<std::vector<uint8_t>> ChooseReservedNodes(const Ledger& ledger, const Job& job, const Resources& demand,
                                                        const std::vector<uint8_t>& excluded) {
  const TaskRequest* largest = nullptr;
  for (const auto& g : job.groups) {
    if (largest == nullptr || g.request.total_gpu_share() > largest->total_gpu_share()) largest = &g.request;
  }
  if (largest == nullptr) return std::nullopt;
  std::vector<NodeIndex> candidates;
  for (NodeIndex n = 0; n < ledger.node_count(); ++n) {
    const NodeSpec& s = ledger.spec(n);
    if (!ledger.state(n).schedulable()) continue;
    if (n < excluded.size() && excluded[n]) continue;
    if (static_cast<int>(s.gpus.size()) < largest->gpu_count || s.cpu < largest->cpu || s.memory < largest->memory)
      continue;
    if (!largest->gpu_models.empty() && !s.gpus.empty() &&
        std::find(largest->gpu_models.begin(), largest->gpu_models.end(), s.gpus[0].model) ==
            largest->gpu_models.end())
      continue;
    candidates.push_back(n);
  }
  std::sort(candidates.begin(), candidates.end(), [&](NodeIndex a, NodeIndex b) {
    const auto& sa = ledger.state(a);
    const auto& sb = ledger.state(b);
    if (sa.free_gpu_share != sb.free_gpu_share) return sa.free_gpu_share > sb.free_gpu_share;
    return a < b;
  });
  Resources covered;
  std::vector<uint8_t> reserved(ledger.node_count(), 0);
  for (NodeIndex n : candidates) {
    if (covered.gpu >= demand.gpu && covered.cpu >= demand.cpu && covered.memory >= demand.memory) break;
    const NodeSpec& s = ledger.spec(n);
    covered.cpu += s.cpu.units();
    covered.memory += s.memory.units();
    covered.gpu += 1000 * static_cast<int64_t>(s.gpus.size());
    reserved[n] = 1;
  }
  if (covered.gpu < demand.gpu || covered.cpu < demand.cpu || covered.memory < demand.memory) return std::nullopt;
  return reserved;
}

}  // namespace gpupool
