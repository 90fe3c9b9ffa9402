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

#include <cmath>

#include "sched/framework.h"
#include "sched/registry.h"
#include "sched/typical_pods.h"

namespace gpupool {
namespace {

int64_t SigmoidScore(double delta) {
  return static_cast<int64_t>(100.0 * (1.0 / (1.0 + std::exp(-delta / 1000.0))));
}

class FgdPlugin final : public ScorePlugin, public GpuSelector {
 public:
  explicit FgdPlugin(std::vector<TypicalPod> pods) : model_(std::move(pods)) {}

  std::string_view name() const override { return "fgd"; }
  uint32_t fields_read() const override {
    return kFieldCpu | kFieldGpuCount | kFieldGpuShare | kFieldGpuMemory | kFieldMig;
  }

  int64_t Score(const ClusterView& view, const PreparedTask& t, NodeIndex node) override {
    const Ledger& ledger = *view.ledger;
    const NodeState& s = ledger.state(node);
    const double before = CurrentFragment(ledger, node);
    LoadFree(s);
    if (!t.wants_gpu() || t.mig) {
      return SigmoidScore(before - model_.NodeFragment(ledger, s.model, s.free_cpu - t.cpu, free_));
    }
    if (t.share_task) {
      int64_t best = -1;
      BestShareGpu(ledger, s, t, before, &best);
      return best;
    }
    TakeAscending(t);
    return SigmoidScore(before - model_.NodeFragment(ledger, s.model, s.free_cpu - t.cpu, free_));
  }

  Result<std::vector<GpuGrant>> Select(const ClusterView& view, const PreparedTask& t,
                                       NodeIndex node) override {
    const Ledger& ledger = *view.ledger;
    const NodeState& s = ledger.state(node);
    std::vector<int> gpus;
    if (t.share_task) {
      LoadFree(s);
      int64_t best = -1;
      const int g = BestShareGpu(ledger, s, t, CurrentFragment(ledger, node), &best);
      if (g >= 0) gpus.push_back(g);
    } else if (t.share == kWholeGpu.units() || t.nvlink) {
      // All candidates are fully free, so every choice leaves the same free multiset: let the
      // topology pick (on a flat topology: the k lowest-index free GPUs). An NVLink requirement
      // also goes to the topology, which alone knows which sets qualify.
      gpus = TopologyBestSet(ledger.spec(node), s, t);
    } else {
      // Multi-GPU partial shares: exactly the GPUs the score assumed.
      std::vector<int> fit;
      FittingGpus(s, t, fit);
      std::stable_sort(fit.begin(), fit.end(), [&](int a, int b) {
        return s.gpus[static_cast<size_t>(a)].free_share < s.gpus[static_cast<size_t>(b)].free_share;
      });
      if (fit.size() >= static_cast<size_t>(t.gpu_count)) gpus.assign(fit.begin(), fit.begin() + t.gpu_count);
    }
    if (gpus.empty()) {
      return Status::Internal(
          fmt::format("fgd: node '{}' passed the filters but no GPU fits", ledger.spec(node).name));
    }
    std::vector<GpuGrant> out;
    for (int g : gpus) out.push_back(GpuGrant{g, MilliGpu(t.share), MiB(t.gpu_memory), std::nullopt});
    return out;
  }

 private:
  // Healthy, non-MIG GPUs' free shares, in index order, into free_ (and their indices).
  void LoadFree(const NodeState& s) {
    free_.clear();
    index_.clear();
    for (size_t i = 0; i < s.gpus.size(); ++i) {
      const GpuState& g = s.gpus[i];
      if (!g.healthy || g.mig_enabled) continue;
      free_.push_back(g.free_share);
      index_.push_back(static_cast<int>(i));
    }
  }

  double CurrentFragment(const Ledger& ledger, NodeIndex node) {
    if (cache_.size() < ledger.node_count()) cache_.resize(ledger.node_count());
    const NodeState& s = ledger.state(node);
    auto& [generation, value] = cache_[node];
    if (generation != s.generation + 1) {  // +1: a fresh entry (generation 0) never matches
      LoadFree(s);
      value = model_.NodeFragment(ledger, s.model, s.free_cpu, free_);
      generation = s.generation + 1;
    }
    return value;
  }

  // Tries the share task on every fitting GPU (free_ must be loaded); returns the lowest GPU
  // index reaching the highest integer score, and that score in *best.
  int BestShareGpu(const Ledger& ledger, const NodeState& s, const PreparedTask& t, double before,
                   int64_t* best) {
    int chosen = -1;
    tried_.clear();
    for (size_t j = 0; j < free_.size(); ++j) {
      const int32_t g = free_[j];
      const GpuState& gs = s.gpus[static_cast<size_t>(index_[j])];
      if (g < t.share || gs.free_memory < t.gpu_memory) continue;
      int64_t score = -1;
      for (const auto& [value, sc] : tried_) {
        if (value == g) score = sc;
      }
      if (score < 0) {
        free_[j] = static_cast<int32_t>(g - t.share);
        score = SigmoidScore(before - model_.NodeFragment(ledger, s.model, s.free_cpu - t.cpu, free_));
        free_[j] = g;
        tried_.emplace_back(g, score);
      }
      if (score > *best) {
        *best = score;
        chosen = index_[j];
      }
    }
    return chosen;
  }

  // Subtracts the share from k GPUs with g >= m, taken by ascending g (stable), in free_.
  void TakeAscending(const PreparedTask& t) {
    order_.resize(free_.size());
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = i;
    std::stable_sort(order_.begin(), order_.end(), [&](size_t a, size_t b) { return free_[a] < free_[b]; });
    int taken = 0;
    for (size_t i : order_) {
      if (taken == t.gpu_count) break;
      if (free_[i] >= t.share) {
        free_[i] = static_cast<int32_t>(free_[i] - t.share);
        ++taken;
      }
    }
  }

  FragmentationModel model_;
  std::vector<std::pair<uint64_t, double>> cache_;  // per node: (generation + 1, F(N))
  std::vector<int32_t> free_;
  std::vector<int> index_;
  std::vector<size_t> order_;
  std::vector<std::pair<int32_t, int64_t>> tried_;
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
