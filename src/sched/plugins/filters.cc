// The built-in filters. Each removes the nodes a task cannot use and counts why.
#include <algorithm>

#include "sched/framework.h"
#include "sched/registry.h"

namespace gpupool {
namespace {

// Keeps the nodes for which `reason(node)` is negative; counts the others under their reason.
template <typename F>
void KeepIf(std::vector<NodeIndex>& nodes, int base, ReasonCounter& counter, F reason) {
  size_t out = 0;
  for (NodeIndex n : nodes) {
    const int r = reason(n);
    if (r < 0) {
      nodes[out++] = n;
    } else {
      counter.Add(base + r);
    }
  }
  nodes.resize(out);
}

// Unhealthy or cordoned nodes take nothing new.
class NodeUnschedulableFilter final : public FilterPlugin {
 public:
  std::string_view name() const override { return "node-unschedulable"; }
  std::vector<std::string> reasons() const override { return {"node unhealthy", "node cordoned"}; }
  void Filter(const ClusterView& view, const PreparedTask&, std::vector<NodeIndex>& nodes, int base,
              ReasonCounter& counter) const override {
    const auto& states = view.ledger->states();
    KeepIf(nodes, base, counter, [&](NodeIndex n) {
      const NodeState& s = states[n];
      if (!s.healthy) return 0;
      if (s.cordoned) return 1;
      return -1;
    });
  }
};

// CPU, memory and the node's task limit.
class NodeResourcesFilter final : public FilterPlugin {
 public:
  std::string_view name() const override { return "node-resources"; }
  std::vector<std::string> reasons() const override {
    return {"insufficient CPU", "insufficient memory", "too many tasks"};
  }
  void Filter(const ClusterView& view, const PreparedTask& task, std::vector<NodeIndex>& nodes, int base,
              ReasonCounter& counter) const override {
    const auto& states = view.ledger->states();
    KeepIf(nodes, base, counter, [&](NodeIndex n) {
      const NodeState& s = states[n];
      if (s.free_cpu < task.cpu) return 0;
      if (s.free_memory < task.memory) return 1;
      if (s.max_tasks > 0 && s.tasks >= s.max_tasks) return 2;
      return -1;
    });
  }
};

// GPU tasks need GPUs of an acceptable model.
class GpuModelFilter final : public FilterPlugin {
 public:
  std::string_view name() const override { return "gpu-model"; }
  std::vector<std::string> reasons() const override { return {"no GPUs", "GPU model not allowed"}; }
  void Filter(const ClusterView& view, const PreparedTask& task, std::vector<NodeIndex>& nodes, int base,
              ReasonCounter& counter) const override {
    if (!task.wants_gpu()) return;
    const auto& states = view.ledger->states();
    KeepIf(nodes, base, counter, [&](NodeIndex n) {
      const NodeState& s = states[n];
      if (s.gpus.empty()) return 0;
      if (!task.ModelAllowed(s.model)) return 1;
      return -1;
    });
  }
};

// Non-MIG GPU tasks: enough usable GPUs, each with the share and the GPU memory asked for.
// A whole-GPU task (share 1000) needs GPUs with nothing allocated. A task that requires NVLink
// also needs such GPUs pairwise joined by NVLink (TopologyBestSet finds the set).
class GpuFitFilter final : public FilterPlugin {
 public:
  std::string_view name() const override { return "gpu-fit"; }
  std::vector<std::string> reasons() const override {
    return {"insufficient GPU count", "insufficient GPU share", "insufficient GPU memory",
            "no NVLink-connected GPU set"};
  }
  void Filter(const ClusterView& view, const PreparedTask& task, std::vector<NodeIndex>& nodes, int base,
              ReasonCounter& counter) const override {
    if (!task.wants_gpu() || task.mig) return;
    const auto& states = view.ledger->states();
    KeepIf(nodes, base, counter, [&](NodeIndex n) {
      const int fit = Fit(states[n], task);
      if (fit != -1 || !task.nvlink) return fit;
      return TopologyBestSet(view.ledger->spec(n), states[n], task).empty() ? 3 : -1;
    });
  }

 private:
  // -1 when the node has the GPUs, else the reason index.
  static int Fit(const NodeState& s, const PreparedTask& task) {
    // Fast paths from the ledger's per-node summary (no walk over the GPUs): a task that names no
    // memory takes its share's part of it, which only a GPU short of memory can refuse.
    if (task.gpu_memory == 0 && s.memory_short_gpus == 0) {
      if (s.usable_gpus < task.gpu_count) return 0;
      if (task.gpu_count == 1) return s.max_free_share >= task.share ? -1 : 1;
      if (task.share == kWholeGpu.units()) return s.fully_free_gpus >= task.gpu_count ? -1 : 1;
    }
    int usable = 0, share_ok = 0, both_ok = 0;
    for (const GpuState& g : s.gpus) {
      if (!g.healthy || g.mig_enabled) continue;
      ++usable;
      if (g.free_share < task.share) continue;
      ++share_ok;
      if (g.free_memory >= task.MemoryOn(g)) ++both_ok;
    }
    if (both_ok >= task.gpu_count) return -1;
    if (usable < task.gpu_count) return 0;
    if (share_ok < task.gpu_count) return 1;
    return 2;
  }
};

// Sharing a GPU under QoS (docs/jobspec.md#qos): a guaranteed share goes only on GPUs whose shares
// are all held to their size (the CUDA limiter, MPS limits), and a share nothing holds on this node
// never joins a GPU that holds a guaranteed one. And an MPS share goes only on GPUs without MPS
// shares of another owner (MpsAllows: one MPS server per GPU at a time). A node passes when enough
// of its GPUs fit the task and the sharing rules let it join them (gpu-fit has already seen to the
// fit alone).
class QosIsolationFilter final : public FilterPlugin {
 public:
  std::string_view name() const override { return "qos-isolation"; }
  std::vector<std::string> reasons() const override {
    return {
        "GPUs with room hold shares not held to their size (a guaranteed share shares only with enforced "
        "ones)",
        "GPUs with room hold a guaranteed share, and nothing on this node would hold the task to its share",
        "GPUs with room hold MPS shares of another tenant (a GPU's MPS server runs for one tenant at a "
        "time)"};
  }
  void Filter(const ClusterView& view, const PreparedTask& task, std::vector<NodeIndex>& nodes, int base,
              ReasonCounter& counter) const override {
    if (!task.wants_gpu() || task.mig || task.share >= kWholeGpu.units()) return;
    // Nothing to keep apart.
    if (!task.guaranteed && view.ledger->guaranteed_gpus() == 0 &&
        (!task.mps || view.ledger->mps_gpus() == 0))
      return;
    const auto& states = view.ledger->states();
    KeepIf(nodes, base, counter, [&](NodeIndex n) {
      const NodeState& s = states[n];
      if (task.SharingFree(s)) return -1;
      int fits = 0, qos_fits = 0;
      for (const GpuState& g : s.gpus) {
        if (!g.healthy || g.mig_enabled) continue;
        if (task.FitsOn(s, g)) ++fits;
        if (g.free_share >= task.share && g.free_memory >= task.MemoryOn(g) &&
            QosAllows(g, task.guaranteed, task.EnforcedOn(s)))
          ++qos_fits;
      }
      if (fits >= task.gpu_count) return -1;
      if (qos_fits >= task.gpu_count) return 2;  // only MPS owners stand in the way
      return task.guaranteed ? 0 : 1;
    });
  }
};

// MIG tasks: a MIG-enabled GPU whose model offers the profile and has room for it now.
class MigFitFilter final : public FilterPlugin {
 public:
  std::string_view name() const override { return "mig-fit"; }
  std::vector<std::string> reasons() const override {
    return {"no MIG-enabled GPUs", "MIG profile not offered by this GPU model",
            "no room for the MIG profile"};
  }
  void Filter(const ClusterView& view, const PreparedTask& task, std::vector<NodeIndex>& nodes, int base,
              ReasonCounter& counter) const override {
    if (!task.mig) return;
    const Ledger& ledger = *view.ledger;
    KeepIf(nodes, base, counter, [&](NodeIndex n) {
      const NodeState& s = ledger.state(n);
      const bool any_mig = std::any_of(s.gpus.begin(), s.gpus.end(),
                                       [](const GpuState& g) { return g.mig_enabled && g.healthy; });
      if (!any_mig) return 0;
      const GpuModelSpec* model = ledger.catalog().Find(ledger.spec(n).gpus.front().model);
      if (model == nullptr || !model->mig || model->mig->Find(task.request->mig_profile) == nullptr) return 1;
      if (!SelectMigGrant(ledger, n, task)) return 2;
      return -1;
    });
  }
};

template <typename T>
FilterFactory Factory() {
  return [](const Value& args, const PluginInit&) -> Result<std::unique_ptr<FilterPlugin>> {
    if (!args.is_null() && !(args.AsMap() && args.AsMap()->empty())) {
      return Status::InvalidArgument("takes no arguments");
    }
    return std::unique_ptr<FilterPlugin>(std::make_unique<T>());
  };
}

}  // namespace

void RegisterFilterPlugins(PluginRegistry& r) {
  (void)r.RegisterFilter("node-unschedulable", Factory<NodeUnschedulableFilter>());
  (void)r.RegisterFilter("node-resources", Factory<NodeResourcesFilter>());
  (void)r.RegisterFilter("gpu-model", Factory<GpuModelFilter>());
  (void)r.RegisterFilter("gpu-fit", Factory<GpuFitFilter>());
  (void)r.RegisterFilter("mig-fit", Factory<MigFitFilter>());
  (void)r.RegisterFilter("qos-isolation", Factory<QosIsolationFilter>());
}

}  // namespace gpupool
