// Topology: give multi-GPU tasks the best-connected GPU sets, and keep NVLink-connected sets
// whole for the tasks that need them.
//
// NVLink capital of a node: 100 per NVLink link over pairs of fully free GPUs (NvlinkCapital).
// lost = the capital the placement destroys; C0 = the node's capital when empty.
//   multi-GPU task (k >= 2): S = floor(75 * best / ideal) + floor(25 * (C0 - lost) / C0), where
//     best = link score of the set the task would get here (TopologyBestSet) and ideal = the best
//     k-set score on any node of the cluster when empty; so an NVLink pair beats a PCIe pair
//     anywhere in the cluster, and among equal sets the node that loses least wins.
//   one GPU (whole or share): S = floor(100 * (C0 - lost) / C0): a share that lands on a GPU in
//     use destroys nothing, and a lone GPU goes before one half of a free NVLink pair.
//   C0 = 0 (no NVLink): the capital term is full (25 or 100). CPU and MIG tasks: 0 (no opinion).
// Integer arithmetic throughout, so equal situations score equal.
// Assumptions: link scores are comparable across nodes (same scoring convention everywhere); a
// multi-GPU task's speed is dominated by its slowest links, which the set score tracks.
#include <algorithm>
#include <map>

#include "sched/framework.h"
#include "sched/registry.h"

namespace gpupool {

int64_t NvlinkCapital(const NodeSpec& spec, const NodeState& node, std::span<const int> taken) {
  const int n = spec.topology.gpu_count();
  if (!spec.topology.has_nvlink() || n != static_cast<int>(node.gpus.size())) return 0;
  auto free = [&](int i) {
    const GpuState& g = node.gpus[static_cast<size_t>(i)];
    if (!g.healthy || g.mig_enabled || g.free_share != kWholeGpu.units()) return false;
    return std::find(taken.begin(), taken.end(), i) == taken.end();
  };
  int64_t total = 0;
  for (int a = 0; a < n; ++a) {
    if (!free(a)) continue;
    for (int b = a + 1; b < n; ++b) {
      if (free(b)) total += 100 * spec.topology.NvLinks(a, b);
    }
  }
  return total;
}

namespace {

class TopologyScore final : public ScorePlugin {
 public:
  std::string_view name() const override { return "topology"; }
  uint32_t fields_read() const override {
    return kFieldGpuCount | kFieldGpuShare | kFieldGpuMemory | kFieldMig | kFieldQos;
  }

  int64_t Score(const ClusterView& view, const PreparedTask& t, NodeIndex node) override {
    if (!t.wants_gpu() || t.mig) return 0;
    const Ledger& ledger = *view.ledger;
    const NodeSpec& spec = ledger.spec(node);
    const NodeState& s = ledger.state(node);
    std::vector<int> set;
    if (t.gpu_count == 1) {
      const int g = BestSingleGpu(spec, s, t);
      if (g >= 0) set.push_back(g);
    } else {
      set = TopologyBestSet(spec, s, t);
    }
    const int64_t empty_capital = EmptyCapital(ledger, node);
    const int64_t capital_weight = t.gpu_count == 1 ? 100 : 25;
    int64_t capital_term = capital_weight;
    if (empty_capital > 0) {
      const int64_t lost = NvlinkCapital(spec, s) - NvlinkCapital(spec, s, set);
      capital_term = capital_weight * (empty_capital - lost) / empty_capital;
    }
    if (t.gpu_count == 1) return capital_term;
    const int64_t ideal = ClusterIdeal(ledger, t.gpu_count);
    const int64_t quality_term = ideal > 0 ? 75 * spec.topology.SetScore(set) / ideal : 75;
    return quality_term + capital_term;
  }

 private:
  // Topology is static, so these are computed once (per node count: adding nodes recomputes).
  int64_t ClusterIdeal(const Ledger& ledger, int k) {
    if (ideal_nodes_ != ledger.node_count()) {
      ideal_.clear();
      ideal_nodes_ = ledger.node_count();
    }
    auto it = ideal_.find(k);
    if (it != ideal_.end()) return it->second;
    int64_t best = 0;
    PreparedTask whole;
    whole.gpu_count = k;
    whole.share = kWholeGpu.units();
    for (NodeIndex n = 0; n < ledger.node_count(); ++n) {
      const NodeSpec& spec = ledger.spec(n);
      if (static_cast<int>(spec.gpus.size()) < k) continue;
      NodeState empty;
      empty.gpus.resize(spec.gpus.size());
      best = std::max<int64_t>(best, spec.topology.SetScore(TopologyBestSet(spec, empty, whole)));
    }
    ideal_.emplace(k, best);
    return best;
  }
  int64_t EmptyCapital(const Ledger& ledger, NodeIndex node) {
    if (empty_capital_.size() < ledger.node_count()) empty_capital_.resize(ledger.node_count(), -1);
    if (empty_capital_[node] < 0) {
      const NodeSpec& spec = ledger.spec(node);
      NodeState empty;
      empty.gpus.resize(spec.gpus.size());
      empty_capital_[node] = NvlinkCapital(spec, empty);
    }
    return empty_capital_[node];
  }

  std::map<int, int64_t> ideal_;  // k -> best k-set score of any empty node
  size_t ideal_nodes_ = 0;
  std::vector<int64_t> empty_capital_;
};

}  // namespace

void RegisterTopologyPlugins(PluginRegistry& r) {
  (void)r.RegisterScore("topology",
                        [](const Value& args, const PluginInit&) -> Result<std::unique_ptr<ScorePlugin>> {
                          if (!args.is_null() && !(args.AsMap() && args.AsMap()->empty())) {
                            return Status::InvalidArgument("takes no arguments");
                          }
                          return std::unique_ptr<ScorePlugin>(std::make_unique<TopologyScore>());
                        });
}

}  // namespace gpupool
