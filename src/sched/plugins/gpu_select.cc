// GPU selection inside the chosen node.
//   best    share task: the fitting GPU with the least free share (best fit), lowest index on
//           ties (on NVLink boards: the one breaking the fewest free NVLink pairs); multi-GPU task: the
//           fitting set with the highest topology score (TopologyBestSet), which on a flat topology is the
//           lowest-index fitting GPUs.
//   random  share task: uniform among the fitting GPUs; otherwise as best.
#include <fmt/format.h>

#include "sched/framework.h"
#include "sched/registry.h"

namespace gpupool {
namespace {

std::vector<GpuGrant> Grants(const NodeState& node, const std::vector<int>& gpus, const PreparedTask& task) {
  std::vector<GpuGrant> out;
  out.reserve(gpus.size());
  for (int g : gpus)
    out.push_back(GpuGrant{g, MilliGpu(task.share), MiB(task.MemoryOn(node.gpus[static_cast<size_t>(g)])), std::nullopt});
  return out;
}

Status NoFit(const Ledger& ledger, NodeIndex node) {
  return Status::Internal(
      fmt::format("node '{}' passed the filters but no GPU set fits", ledger.spec(node).name));
}

class BestSelector final : public GpuSelector {
 public:
  std::string_view name() const override { return "best"; }
  Result<std::vector<GpuGrant>> Select(const ClusterView& view, const PreparedTask& task,
                                       NodeIndex node) override {
    const Ledger& ledger = *view.ledger;
    std::vector<int> set;
    if (task.gpu_count == 1) {
      const int g = BestSingleGpu(ledger.spec(node), ledger.state(node), task);
      if (g >= 0) set.push_back(g);
    } else {
      set = TopologyBestSet(ledger.spec(node), ledger.state(node), task);
    }
    if (set.empty()) return NoFit(ledger, node);
    return Grants(ledger.state(node), set, task);
  }
};

class RandomSelector final : public GpuSelector {
 public:
  std::string_view name() const override { return "random"; }
  Result<std::vector<GpuGrant>> Select(const ClusterView& view, const PreparedTask& task,
                                       NodeIndex node) override {
    const Ledger& ledger = *view.ledger;
    std::vector<int> set;
    if (task.share_task) {
      FittingGpus(ledger.state(node), task, fitting_);
      if (!fitting_.empty()) set.push_back(fitting_[view.rng->Uniform(fitting_.size())]);
    } else {
      set = TopologyBestSet(ledger.spec(node), ledger.state(node), task);
    }
    if (set.empty()) return NoFit(ledger, node);
    return Grants(ledger.state(node), set, task);
  }

 private:
  std::vector<int> fitting_;
};

template <typename T>
SelectorFactory Factory() {
  return [](const Value& args, const PluginInit&) -> Result<std::unique_ptr<GpuSelector>> {
    if (!args.is_null() && !(args.AsMap() && args.AsMap()->empty())) {
      return Status::InvalidArgument("takes no arguments");
    }
    return std::unique_ptr<GpuSelector>(std::make_unique<T>());
  };
}

}  // namespace

void RegisterSelectorPlugins(PluginRegistry& r) {
  (void)r.RegisterSelector("best", Factory<BestSelector>());
  (void)r.RegisterSelector("random", Factory<RandomSelector>());
}

}  // namespace gpupool
