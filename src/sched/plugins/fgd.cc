// FGD — Fragmentation Gradient Descent (Weng et al., "Beware of Fragmentation: Scheduling
// GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC'23).
//
// Assumptions: future tasks look like the typical workload (the most frequent task shapes with
// their weights); a node's fragmentation is the GPU share those typical tasks, weighted, could not
// use there (sched/typical_pods.h). Placing a task moves the node's fragmentation; FGD picks the
// node, and the GPU inside it, where fragmentation grows least:
//   S = trunc(100 * sigmoid((F(N) - F(N')) / 1000)), N' = N with the task placed.
// A share task is tried on every GPU that fits (lowest index wins among equal integer scores);
// a multi-GPU task takes k GPUs with g >= m by ascending free share; a CPU task only moves CPU.
//
// Speed: F(N) is cached per node and generation; the pipeline caches the final score per node
// generation and task shape; GPUs with the same free share give the same N' and are scored once.
#include <fmt/format.h>

#include "sched/framework.h"
#include "sched/plugins/fgd_core.h"
#include "sched/registry.h"
#include "sched/typical_pods.h"

namespace gpupool {
namespace {

class FgdPlugin final : public ScorePlugin, public GpuSelector {
 public:
  explicit FgdPlugin(std::vector<TypicalPod> pods) : core_(std::move(pods)) {}

  std::string_view name() const override { return "fgd"; }
  uint32_t fields_read() const override {
    return kFieldCpu | kFieldGpuCount | kFieldGpuShare | kFieldGpuMemory | kFieldMig | kFieldQos;
  }

  int64_t Score(const ClusterView& view, const PreparedTask& t, NodeIndex node) override {
    return core_.Points(*view.ledger, t, node);
  }

  Result<std::vector<GpuGrant>> Select(const ClusterView& view, const PreparedTask& t,
                                       NodeIndex node) override {
    return core_.Select(*view.ledger, t, node, "fgd");
  }

 private:
  FgdCore core_;
};

Result<std::unique_ptr<FgdPlugin>> MakeFgd(const Value& args, const PluginInit& init) {
  std::vector<TypicalPod> pods;
  if (const Value* v = args.Find("typicalPods")) {
    ASSIGN_OR_RETURN(pods, ParseTypicalPods(*v));
  } else if (init.typical_pods != nullptr && !init.typical_pods->empty()) {
    pods = *init.typical_pods;
  } else {
    return Status::InvalidArgument(
        "needs a typical workload: give 'typicalPods' in its arguments, or run it where the workload "
        "supplies one (the simulator derives it from the trace)");
  }
  if (const Value::Map* m = args.AsMap()) {
    for (const auto& [key, v] : *m) {
      if (key != "typicalPods") return Status::InvalidArgument(fmt::format("unknown argument '{}'", key));
    }
  }
  return std::make_unique<FgdPlugin>(std::move(pods));
}

}  // namespace

void RegisterFgdPlugins(PluginRegistry& r) {
  (void)r.RegisterScore(
      "fgd", [](const Value& args, const PluginInit& init) -> Result<std::unique_ptr<ScorePlugin>> {
        ASSIGN_OR_RETURN(auto p, MakeFgd(args, init));
        return std::unique_ptr<ScorePlugin>(std::move(p));
      });
  (void)r.RegisterSelector(
      "fgd", [](const Value& args, const PluginInit& init) -> Result<std::unique_ptr<GpuSelector>> {
        ASSIGN_OR_RETURN(auto p, MakeFgd(args, init));
        return std::unique_ptr<GpuSelector>(std::move(p));
      });
}

}  // namespace gpupool
