// Topology: keep NVLink-connected GPU sets whole for the tasks that need them.
//
// For a multi-GPU task, quality q = (link score of the best free k-set on the node) / (link score
// of the best k-set on the empty node): 1 when the task can get the node's best-connected set.
// For every GPU task, loss l = NVLink capital the placement destroys / the node's NVLink capital
// when empty (NvlinkCapital: NVLink links between fully free GPUs). A share task that lands on a
// GPU already in use destroys none; a single whole GPU whose partners are busy destroys none.
//   S = trunc(100 * (0.5 q + 0.5 (1 - l))); CPU and MIG tasks: 0 (no opinion).
// On nodes without NVLink l = 0, and q compares PCIe levels only.
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
  uint32_t fields_read() const override { return kFieldGpuCount | kFieldGpuShare | kFieldGpuMemory | kFieldMig; }

  int64_t Score(const ClusterView& view, const PreparedTask& t, NodeIndex node) override {
    if (!t.wants_gpu() || t.mig) return 0;
    const NodeSpec& spec = view.ledger->spec(node);
    const NodeState& s = view.ledger->state(node);
    std::vector<int> set;
    double quality = 1.0;
    if (t.gpu_count == 1) {
      const int g = BestSingleGpu(spec, s, t);
      if (g >= 0) set.push_back(g);
    } else {
      set = TopologyBestSet(spec, s, t);
      const int ideal = IdealSetScore(view.ledger, node, t.gpu_count);
      if (ideal > 0) quality = static_cast<double>(spec.topology.SetScore(set)) / ideal;
    }
    double loss = 0;
    const int64_t empty_capital = EmptyCapital(view.ledger, node);
    if (empty_capital > 0) {
      loss = static_cast<double>(NvlinkCapital(spec, s) - NvlinkCapital(spec, s, set)) /
             static_cast<double>(empty_capital);
    }
    return static_cast<int64_t>(100.0 * (0.5 * quality + 0.5 * (1.0 - loss)));
  }

 private:
  // Topology is static per node, so these are computed once per (node, k).
  int IdealSetScore(const Ledger* ledger, NodeIndex node, int k) {
    auto key = std::make_pair(node, k);
    auto it = ideal_.find(key);
    if (it != ideal_.end()) return it->second;
    const NodeSpec& spec = ledger->spec(node);
    NodeState empty;
    empty.gpus.resize(spec.gpus.size());
    PreparedTask whole;
    whole.gpu_count = k;
    whole.share = kWholeGpu.units();
    const int score = spec.topology.SetScore(TopologyBestSet(spec, empty, whole));
    ideal_.emplace(key, score);
    return score;
  }
  int64_t EmptyCapital(const Ledger* ledger, NodeIndex node) {
    if (empty_capital_.size() < ledger->node_count()) empty_capital_.resize(ledger->node_count(), -1);
    if (empty_capital_[node] < 0) {
      const NodeSpec& spec = ledger->spec(node);
      NodeState empty;
      empty.gpus.resize(spec.gpus.size());
      empty_capital_[node] = NvlinkCapital(spec, empty);
    }
    return empty_capital_[node];
  }

  std::map<std::pair<NodeIndex, int>, int> ideal_;
  std::vector<int64_t> empty_capital_;
};

}  // namespace

void RegisterTopologyPlugins(PluginRegistry& r) {
  (void)r.RegisterScore("topology", [](const Value& args, const PluginInit&) -> Result<std::unique_ptr<ScorePlugin>> {
    if (!args.is_null() && !(args.AsMap() && args.AsMap()->empty())) {
      return Status::InvalidArgument("takes no arguments");
    }
    return std::unique_ptr<ScorePlugin>(std::make_unique<TopologyScore>());
  });
}

}  // namespace gpupool
