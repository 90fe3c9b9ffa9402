// Balanced — gpupool's default placement policy: FGD's fragmentation, learned online, plus the
// balance of CPU to GPU left on each node.
//
// Assumptions:
//  1. Future tasks look like the tasks seen so far. The plugin counts every arriving task
//     (Observe) and derives a typical workload from the counts (FGD's definition: the most frequent
//     shapes covering 95 % of tasks, sched/typical_pods.h), relearned at 1, 2, 4, ... 1,024 tasks
//     and then every 1,024. It never sees the tasks still to come; FGD as published is given the
//     typical workload of the whole trace in advance.
//  2. A GPU is only as usable as the CPU and memory left beside it. The workload needs rho mCPU
//     per milli-GPU (the typical GPU tasks' CPU over their GPU share, weighted) and mu MiB per
//     milli-GPU (all GPU tasks seen). A node's CPU surplus after a placement is
//     free CPU - rho * free GPU share: negative means its free GPUs will starve for CPU, positive
//     means CPU that GPU tasks will not need. Its memory deficit is the same for memory, counted
//     only when negative and converted to mCPU-equivalents ((free memory / mu - free share) * rho).
//
// Why it works (measured on the 17 Alibaba trace variants; docs/performance.md): FGD's score,
// S = trunc(100 * sigmoid(dF / 1000)), is coarse on purpose — ranking nodes by the exact
// fragmentation change does worse than FGD (94.45 % vs 95.39 % allocated on the default trace),
// because F counts only what the typical tasks could not use *now*. Within FGD's coarse classes
// the tie-break decides, and FGD leaves it to chance. Balanced spends it on CPU and memory:
//  - a whole-GPU task goes, among nodes within a few FGD points, to the node whose CPU surplus
//    stays closest to zero and whose memory does not run short: tasks with much CPU go where CPU
//    is plentiful, light ones where it is short, so fewer GPUs end up stranded beside exhausted
//    CPU or memory (and less CPU beside no GPU);
//  - a CPU-only task avoids, almost absolutely, nodes whose CPU surplus or memory it would drive
//    below what the node's free GPUs need: it brings no GPU demand to pay for them;
//  - a GPU-sharing task keeps FGD's choice, except that among equal FGD points it avoids nodes
//    whose memory it would drive below what their free GPUs need: its best node is decided by how
//    the remaining share fits the typical tasks, and CPU balance made that worse (cpu250 and
//    multigpu30 fell below FGD), while the memory deficit alone lifted every trace.
// Score (int64): 10,000 per FGD point; then, in mCPU, minus |CPU surplus| plus the memory deficit
// (<= 0) for whole-GPU tasks (one point is worth 10 cores of imbalance); plus the memory deficit
// for share tasks; plus 100 x (min(CPU surplus, 0) + memory deficit) for CPU-only tasks. Without
// memory, the free GPUs of the multigpu40 trace's nodes ended beside 1.5-4.7 GiB of memory (0.15
// points below FGD; with it for whole-GPU tasks 0.04 above, and for share tasks too 0.06). The
// scores are not in [0, 100]: use it alone, or give other plugins weights to match.
//
// Weights: each term above has a weight, an argument of the plugin (`weights`, plugins/balanced.h);
// the defaults are the hand-made score described here, to the bit. `gpupool sim train` learns other
// weights in the simulator (sim/train.h) and writes them as a profile.
//
// Adapting (argument `adapt`, default true): which weights are best depends on which resource runs
// out first. On the trace where the workload asks for more CPU per GPU than the cluster has (cpu250:
// 1.03 x the cluster's ratio), the hand-made weights strand CPU-starved GPUs, and weights trained
// there by `gpupool sim train` (BalancedWeights::CpuBound(): pack whole-GPU tasks, balance CPU for
// share tasks too) allocate 1.4 points more — but cost 0.1-0.3 points on GPU-bound traces. So the
// plugin measures the mix online: the CPU per milli-GPU of every task seen (all tasks, CPU-only
// included; with a given workload, of its typical tasks) over the cluster's CPU per milli-GPU. Below
// `cpuBoundFrom` (0.95) it uses `weights`, from `cpuBoundTo` (1.0) on `cpuBoundWeights`, blended
// linearly between (the ramp sits just below 1, where CPU starts to run out with the GPUs). It judges
// only after 256 tasks (fewer say little about the mix: after 128, the ratio still swung by 5 %);
// the weights change at the plugin's relearning points, which drop the cached scores. Measured
// (docs/performance.md): cpu250 +1.3 points, the held-out cpu235 and cpu300 (never used in
// training) +0.05 and +2.1, cpu300 from below FGD to above it; the GPU-bound traces are unchanged
// to within 0.03 points.
//
// GPU choice: a share task takes the GPU FGD's score picked (lowest index among equal scores);
// whole GPUs go to the topology's best set (the k lowest-index free GPUs on flat boards).
#include "sched/plugins/balanced.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <span>

#include "sched/framework.h"
#include "sched/plugins/fgd_core.h"
#include "sched/registry.h"
#include "sched/typical_pods.h"

namespace gpupool {
namespace {

constexpr int64_t kCpuDeficitWeight = 100;  // score units per mCPU a CPU-only task digs below
constexpr uint64_t kRelearnEvery = 1024;    // after the doubling phase
// From here on relearning waits for a quarter more tasks than were seen: the shapes are counted
// since the start, so the learned workload moves less and less per task, while every relearning
// makes every cached score stale (a filter and score pass over every node for every shape). Runs
// of the published traces (8,152 pods or fewer) never get here.
constexpr uint64_t kRelearnGeometricFrom = 16384;
constexpr uint64_t kAdaptAfter = 256;       // tasks seen before the CPU scarcity counts

// Adapting the weights to the workload's CPU scarcity (see CpuScarcity).
struct Adapt {
  BalancedWeights cpu_bound;
  double from = 0.95;  // CPU-per-GPU ratio, workload / cluster, where cpu_bound starts to count
  double to = 1.0;     // ... and where it is used alone
};

// CPU per milli-GPU of the typical GPU tasks, weighted; 0 when there are none.
double CpuPerShare(const std::vector<TypicalPod>& pods) {
  double cpu = 0, share = 0;
  for (const TypicalPod& p : pods) {
    if (p.gpu_count == 0) continue;
    cpu += p.weight * static_cast<double>(p.cpu);
    share += p.weight * static_cast<double>(p.share * p.gpu_count);
  }
  return share > 0 ? cpu / share : 0.0;
}

}  // namespace

std::vector<std::string> BalancedWeights::Names() {
  return {"point",       "wholeCpu",  "wholeMemory", "wholeFree",    "shareCpu",
          "shareMemory", "shareFree", "cpuOnlyCpu",  "cpuOnlyMemory"};
}

std::vector<double*> BalancedWeights::Fields() {
  return {&point,        &whole_cpu,  &whole_memory, &whole_free,     &share_cpu,
          &share_memory, &share_free, &cpu_only_cpu, &cpu_only_memory};
}

Value BalancedWeights::ToValue() const {
  BalancedWeights copy = *this;
  Value::Map m;
  const std::vector<std::string> names = Names();
  const std::vector<double*> fields = copy.Fields();
  for (size_t i = 0; i < names.size(); ++i) m.emplace_back(names[i], Value(*fields[i]));
  return Value(std::move(m));
}

Result<BalancedWeights> BalancedWeights::FromValue(const Value& v, const BalancedWeights& base) {
  BalancedWeights w = base;
  const Value::Map* m = v.AsMap();
  if (m == nullptr) return Status::InvalidArgument("weights must be a map of name: number");
  const std::vector<std::string> names = Names();
  const std::vector<double*> fields = w.Fields();
  for (const auto& [key, value] : *m) {
    auto it = std::find(names.begin(), names.end(), key);
    if (it == names.end()) {
      return Status::InvalidArgument(
          fmt::format("unknown weight '{}' (known: {})", key, fmt::join(names, ", ")));
    }
    ASSIGN_OR_RETURN(const double x, value.AsDouble("weights." + key));
    if (!std::isfinite(x)) return Status::InvalidArgument(fmt::format("weights.{} must be finite", key));
    *fields[static_cast<size_t>(it - names.begin())] = x;
  }
  if (!(w.point > 0)) {
    return Status::InvalidArgument(fmt::format("weights.point must be positive, got {}", w.point));
  }
  return w;
}

Result<BalancedWeights> BalancedWeights::FromValue(const Value& v) {
  return FromValue(v, BalancedWeights{});
}

BalancedWeights BalancedWeights::CpuBound() {
  // Written by: gpupool sim train --traces ../shared/traces/alibaba-gpu-v2023 --arrival-order
  //   ../shared/traces/fgd-arrival-orders --trace-list cpu250 --seeds 42,43 --generations 12
  //   --pairs 6 --sigma 0.2 --learning-rate 0.1 --jobs 2 (objective 93.97 -> 95.02, 314 runs).
  BalancedWeights w;
  w.whole_cpu = 0.8564707446632542;
  w.whole_memory = 1.1002456634073339;
  w.whole_free = -0.3404799875276227;
  w.share_cpu = 0.6315970007074743;
  w.share_memory = 0.9278713542518885;
  w.share_free = 0.07334340959833041;
  w.cpu_only_cpu = 1.1423240768515663;
  w.cpu_only_memory = 1.1752223304950407;
  return w;
}

BalancedWeights BalancedWeights::Blend(const BalancedWeights& a, const BalancedWeights& b, double s) {
  if (s <= 0) return a;
  if (s >= 1) return b;
  BalancedWeights out = a, bb = b;
  const std::vector<double*> o = out.Fields(), y = bb.Fields();
  for (size_t i = 0; i < o.size(); ++i) *o[i] = (1 - s) * *o[i] + s * *y[i];
  return out;
}

Result<BalancedWeights> BalancedWeights::FromProfile(const Profile& profile) {
  for (const PluginRef& s : profile.scores) {
    if (s.name != "balanced") continue;
    const Value::Map* m = s.args.AsMap();
    if (m != nullptr) {
      for (const auto& [key, v] : *m) {
        if (key == "weights") return FromValue(v);
      }
    }
    return BalancedWeights{};
  }
  return Status::InvalidArgument(fmt::format("profile '{}' has no balanced score", profile.name));
}

namespace {

class BalancedPlugin final : public ScorePlugin, public GpuSelector {
 public:
  BalancedPlugin(std::vector<TypicalPod> prior, bool learn, double coverage, BalancedWeights gpu_bound,
                 std::optional<Adapt> adapt)
      : learn_(learn), coverage_(coverage), gpu_bound_(gpu_bound), adapt_(std::move(adapt)) {
    SetWeights(gpu_bound_);
    SetWorkload(std::move(prior));
  }

  std::string_view name() const override { return "balanced"; }
  uint32_t fields_read() const override {
    return kFieldCpu | kFieldMemory | kFieldGpuCount | kFieldGpuShare | kFieldGpuMemory | kFieldMig | kFieldQos;
  }
  uint64_t epoch() const override { return epoch_; }
  // Scores are points x 10,000 plus the balance terms: keep them as they are.
  void Normalize(std::span<int64_t> /*scores*/) const override {}
  bool absolute_scores() const override { return true; }  // and PreScore reads the ledger alone

  void Observe(const PreparedTask& t) override {
    if (!learn_) return;
    // A MIG task's GPU slice is not a share of a whole GPU: count it by its CPU only.
    const bool gpu = t.wants_gpu() && !t.mig;
    shapes_.Add(t.cpu, gpu ? t.share : 0, gpu ? t.gpu_count : 0, t.request->gpu_models);
    if (gpu) {
      mem_seen_ += static_cast<double>(t.memory);
      share_seen_ += static_cast<double>(t.share) * t.gpu_count;
    }
    cpu_seen_ += static_cast<double>(t.cpu);
    ++observed_;
    if (observed_ == next_learn_) {
      Relearn();
      // Past the doubling phase, at least one task per two nodes between relearnings: each costs a
      // pass over every node for every shape decided again (the published traces' 1,213 nodes keep
      // kRelearnEvery).
      const uint64_t linear = std::max<uint64_t>(kRelearnEvery, nodes_ / 2);
      next_learn_ = next_learn_ < kRelearnEvery           ? next_learn_ * 2
                    : next_learn_ < kRelearnGeometricFrom ? next_learn_ + linear
                                                          : next_learn_ + std::max(linear, next_learn_ / 4);
    }
  }

  // Adapting: the first decision after the plugin relearned (or after nodes joined) sets the
  // weights for the workload's CPU scarcity; a change drops the cached scores (epoch).
  void PreScore(const ClusterView& view, const PreparedTask& /*t*/,
                std::span<const NodeIndex> /*feasible*/) override {
    nodes_ = view.ledger->node_count();  // for the relearning spacing, adapting or not
    if (!adapt_) return;
    const Ledger& ledger = *view.ledger;
    if (!scarcity_dirty_ && ledger.node_count() == cluster_nodes_) return;
    scarcity_dirty_ = false;
    // The cluster's side too (O(nodes), once per relearning point): nodes may have been replaced.
    cluster_nodes_ = ledger.node_count();
    double cpu = 0;
    for (NodeIndex n = 0; n < cluster_nodes_; ++n) cpu += static_cast<double>(ledger.spec(n).cpu.units());
    const double share = static_cast<double>(ledger.total_gpu_share());
    cluster_cpu_per_share_ = share > 0 ? cpu / share : 0.0;
    const double s = CpuScarcity();
    if (s == blend_) return;
    blend_ = s;
    SetWeights(BalancedWeights::Blend(gpu_bound_, adapt_->cpu_bound, s));
    ++epoch_;
  }

  int64_t Score(const ClusterView& view, const PreparedTask& t, NodeIndex node) override {
    const NodeState& s = view.ledger->state(node);
    const int64_t points = core_.Points(*view.ledger, t, node);
    // The terms are in mCPU (free share counts as the CPU its GPUs would need, x rho); with the
    // default weights each expression is the hand-made score's, to the bit.
    if (!t.wants_gpu() || t.mig) {
      const double surplus = Surplus(s.free_cpu - t.cpu, s.free_gpu_share);
      const double mem = MemorySurplus(s.free_memory - t.memory, s.free_gpu_share);
      return points * point_ +
             kCpuDeficitWeight * static_cast<int64_t>(w_.cpu_only_cpu * std::min(surplus, 0.0) +
                                                      w_.cpu_only_memory * std::min(mem, 0.0));
    }
    if (t.share_task) {
      const int64_t share_after = s.free_gpu_share - t.share;
      const double mem = MemorySurplus(s.free_memory - t.memory, share_after);
      const double surplus = Surplus(s.free_cpu - t.cpu, share_after);
      return points * point_ +
             static_cast<int64_t>(w_.share_memory * std::min(mem, 0.0) - w_.share_cpu * std::abs(surplus) -
                                  w_.share_free * rho_ * static_cast<double>(share_after));
    }
    const int64_t share_after = s.free_gpu_share - static_cast<int64_t>(t.gpu_count) * t.share;
    const double surplus = Surplus(s.free_cpu - t.cpu, share_after);
    const double mem = MemorySurplus(s.free_memory - t.memory, share_after);
    return points * point_ -
           static_cast<int64_t>(w_.whole_cpu * std::abs(surplus) - w_.whole_memory * std::min(mem, 0.0) +
                                w_.whole_free * rho_ * static_cast<double>(share_after));
  }

  Result<std::vector<GpuGrant>> Select(const ClusterView& view, const PreparedTask& t,
                                       NodeIndex node) override {
    return core_.Select(*view.ledger, t, node, "balanced");
  }

 private:
  double Surplus(int64_t free_cpu, int64_t free_share) const {
    return static_cast<double>(free_cpu) - rho_ * static_cast<double>(free_share);
  }

  // Memory short of what the free GPU share needs (mu MiB per milli-GPU), in mCPU-equivalents
  // (x rho / mu: the same GPU share's worth of CPU), so CPU and memory weigh alike.
  double MemorySurplus(int64_t free_memory, int64_t free_share) const {
    if (mu_ <= 0) return 0;
    return (static_cast<double>(free_memory) / mu_ - static_cast<double>(free_share)) * rho_;
  }

  void SetWeights(const BalancedWeights& w) {
    w_ = w;
    point_ = static_cast<int64_t>(std::llround(w_.point));
  }

  // How CPU-bound the workload is, in [0, 1]: its CPU per milli-GPU (every task seen, or the given
  // typical workload) over the cluster's, mapped linearly from adapt_->from (0) to adapt_->to (1).
  // 0 until kAdaptAfter tasks were seen: a handful of tasks says little about the mix.
  double CpuScarcity() const {
    double demand = 0;
    if (learn_) {
      if (observed_ < kAdaptAfter || share_seen_ <= 0) return 0;
      demand = cpu_seen_ / share_seen_;
    } else {
      double cpu = 0, share = 0;
      for (const TypicalPod& p : core_.workload()) {
        cpu += p.weight * static_cast<double>(p.cpu);
        share += p.weight * static_cast<double>(p.share * p.gpu_count);
      }
      if (share <= 0) return 0;
      demand = cpu / share;
    }
    if (cluster_cpu_per_share_ <= 0) return 0;
    const double ratio = demand / cluster_cpu_per_share_;
    return std::clamp((ratio - adapt_->from) / (adapt_->to - adapt_->from), 0.0, 1.0);
  }

  void SetWorkload(std::vector<TypicalPod> pods) {
    scarcity_dirty_ = true;
    rho_ = CpuPerShare(pods);
    mu_ = share_seen_ > 0 ? mem_seen_ / share_seen_ : 0.0;
    core_.SetWorkload(std::move(pods));
    ++epoch_;
  }

  void Relearn() {
    std::vector<TypicalPod> learned = shapes_.Typical(coverage_);
    // Within kWorkloadMinChange of the one in use: not taken, so that the scores, the score cache
    // and the best-node index survive while the mix holds still (at 10,000 nodes a relearning
    // costs a pass over every node for every shape decided again).
    if (WorkloadDistance(learned, core_.workload()) < kWorkloadMinChange) return;
    SetWorkload(std::move(learned));
  }

  const bool learn_;
  const double coverage_;
  const BalancedWeights gpu_bound_;
  const std::optional<Adapt> adapt_;  // none: always gpu_bound_
  BalancedWeights w_;                 // the weights in use
  int64_t point_ = 0;                 // score units per FGD point
  double blend_ = 0;                  // 0: gpu_bound_, 1: adapt_->cpu_bound
  bool scarcity_dirty_ = true;
  size_t cluster_nodes_ = 0;
  size_t nodes_ = 0;  // the cluster's nodes at the last decision
  double cluster_cpu_per_share_ = 0;
  double cpu_seen_ = 0;  // mCPU of every task seen
  FgdCore core_{{}};
  double rho_ = 0;
  double mu_ = 0;  // MiB of memory per milli-GPU of the GPU tasks seen
  double mem_seen_ = 0, share_seen_ = 0;
  uint64_t epoch_ = 0;
  TaskShapeCounter shapes_;  // every task observed
  uint64_t observed_ = 0;
  uint64_t next_learn_ = 1;
};

Result<std::unique_ptr<BalancedPlugin>> MakeBalanced(const Value& args, const PluginInit& init) {
  std::vector<TypicalPod> prior;
  std::string workload = "observed";
  double coverage = 0.95;
  BalancedWeights weights;
  bool adapt = true;
  Adapt a{BalancedWeights::CpuBound()};
  if (const Value::Map* m = args.AsMap()) {
    for (const auto& [key, v] : *m) {
      if (key == "weights") {
        ASSIGN_OR_RETURN(weights, BalancedWeights::FromValue(v));
      } else if (key == "adapt") {
        ASSIGN_OR_RETURN(adapt, v.AsBool("adapt"));
      } else if (key == "cpuBoundWeights") {
        auto w = BalancedWeights::FromValue(v, a.cpu_bound);
        if (!w.ok()) return Status::InvalidArgument("cpuBoundWeights: " + std::string(w.status().message()));
        a.cpu_bound = *w;
      } else if (key == "cpuBoundFrom") {
        ASSIGN_OR_RETURN(a.from, v.AsDouble("cpuBoundFrom"));
      } else if (key == "cpuBoundTo") {
        ASSIGN_OR_RETURN(a.to, v.AsDouble("cpuBoundTo"));
      } else if (key == "typicalPods") {
        ASSIGN_OR_RETURN(prior, ParseTypicalPods(v));
      } else if (key == "workload") {
        ASSIGN_OR_RETURN(workload, v.AsString("workload"));
      } else if (key == "coverage") {
        ASSIGN_OR_RETURN(coverage, v.AsDouble("coverage"));
      } else {
        return Status::InvalidArgument(fmt::format(
            "unknown argument '{}' (typicalPods, workload, coverage, weights, adapt, cpuBoundWeights, "
            "cpuBoundFrom, cpuBoundTo)",
            key));
      }
    }
  } else if (!args.is_null()) {
    return Status::InvalidArgument("arguments must be a map");
  }
  if (!(coverage > 0 && coverage <= 1)) {
    return Status::InvalidArgument(fmt::format("coverage must be in (0, 1], got {}", coverage));
  }
  if (!(std::isfinite(a.from) && std::isfinite(a.to) && a.from > 0 && a.from < a.to)) {
    return Status::InvalidArgument(
        fmt::format("cpuBoundFrom and cpuBoundTo must satisfy 0 < from < to, got {} and {}", a.from, a.to));
  }
  bool learn = true;
  if (workload == "given") {
    learn = false;
    if (prior.empty() && init.typical_pods != nullptr) prior = *init.typical_pods;
    if (prior.empty()) {
      return Status::InvalidArgument(
          "workload 'given' needs a typical workload: 'typicalPods' in the arguments, or an embedder "
          "that supplies one");
    }
  } else if (workload != "observed") {
    return Status::InvalidArgument(fmt::format(
        "workload must be 'observed' (learn from arriving tasks) or 'given', got '{}'", workload));
  }
  // Until the first task is seen: one whole GPU with no CPU (the prior is replaced on the first
  // observation when learning).
  if (prior.empty()) prior.push_back(TypicalPod{0, 1000, 1, {}, 1.0});
  return std::make_unique<BalancedPlugin>(std::move(prior), learn, coverage, weights,
                                          adapt ? std::optional<Adapt>(a) : std::nullopt);
}

}  // namespace

void RegisterBalancedPlugins(PluginRegistry& r) {
  (void)r.RegisterScore(
      "balanced", [](const Value& args, const PluginInit& init) -> Result<std::unique_ptr<ScorePlugin>> {
        ASSIGN_OR_RETURN(auto p, MakeBalanced(args, init));
        return std::unique_ptr<ScorePlugin>(std::move(p));
      });
  (void)r.RegisterSelector(
      "balanced", [](const Value& args, const PluginInit& init) -> Result<std::unique_ptr<GpuSelector>> {
        ASSIGN_OR_RETURN(auto p, MakeBalanced(args, init));
        return std::unique_ptr<GpuSelector>(std::move(p));
      });
}

}  // namespace gpupool
