#include "sched/framework.h"

#include <algorithm>

#include "sched/mig_planner.h"

namespace gpupool {

void ScorePlugin::Normalize(std::span<int64_t> scores) const {
  for (auto& s : scores) s = std::clamp<int64_t>(s, 0, 100);
}

void PrepareTask(const Ledger& ledger, const TaskRequest& task, PreparedTask& out) {
  out.request = &task;
  out.cpu = task.cpu.units();
  out.memory = task.memory.units();
  out.gpu_count = task.gpu_count;
  out.mig = task.wants_mig();
  out.share = out.mig ? 0 : task.gpu_share.units();
  out.gpu_memory = task.gpu_memory.units();
  out.share_task = task.is_share();
  out.nvlink = task.nvlink;
  out.guaranteed = task.guaranteed;
  out.enforced_by = task.enforced_by;
  out.mps = task.enforced_by == kEnforceMps && out.share > 0 && out.share < kWholeGpu.units();
  out.mps_owner = out.mps ? ledger.FindMpsOwner(task.mps_owner).value_or(0) : 0;
  out.allowed_models.clear();
  if (!task.gpu_models.empty()) {
    out.allowed_models.assign(ledger.model_count(), 0);
    for (const std::string& name : task.gpu_models) {
      std::optional<ModelId> id = ledger.FindModel(name);
      if (!id) {
        // Accept catalog aliases ("A100-SXM4-80GB" for "A100-80GB").
        if (const GpuModelSpec* spec = ledger.catalog().Find(name)) id = ledger.FindModel(spec->name);
      }
      if (id) out.allowed_models[*id] = 1;
    }
  }
}

void FittingGpus(const NodeState& node, const PreparedTask& task, std::vector<int>& out) {
  out.clear();
  for (size_t i = 0; i < node.gpus.size(); ++i) {
    const GpuState& g = node.gpus[i];
    if (!g.healthy || g.mig_enabled) continue;
    if (task.FitsOn(node, g)) out.push_back(static_cast<int>(i));
  }
}

int BestFitGpu(const NodeState& node, const PreparedTask& task) {
  int best = -1;
  int32_t best_free = 0;
  for (size_t i = 0; i < node.gpus.size(); ++i) {
    const GpuState& g = node.gpus[i];
    if (!g.healthy || g.mig_enabled) continue;
    if (!task.FitsOn(node, g)) continue;
    if (best < 0 || g.free_share < best_free) {
      best = static_cast<int>(i);
      best_free = g.free_share;
    }
  }
  return best;
}

int BestSingleGpu(const NodeSpec& spec, const NodeState& node, const PreparedTask& task) {
  const int best = BestFitGpu(node, task);
  if (best < 0 || !spec.topology.has_nvlink()) return best;
  const int32_t best_free = node.gpus[static_cast<size_t>(best)].free_share;
  int chosen = best;
  int64_t chosen_capital = -1;
  std::vector<int> fit;
  FittingGpus(node, task, fit);
  for (int g : fit) {
    if (node.gpus[static_cast<size_t>(g)].free_share != best_free) continue;
    const int taken[] = {g};
    const int64_t capital = NvlinkCapital(spec, node, taken);
    if (capital > chosen_capital) {
      chosen_capital = capital;
      chosen = g;
    }
  }
  return chosen;
}

namespace {

bool AllPairsNvlinked(const Topology& topology, std::span<const int> set) {
  for (size_t i = 0; i < set.size(); ++i) {
    for (size_t j = i + 1; j < set.size(); ++j) {
      if (topology.NvLinks(set[i], set[j]) <= 0) return false;
    }
  }
  return true;
}

// Too many fitting GPUs for the exhaustive search: grow an NVLink clique from each GPU in turn,
// adding the lowest-index GPU linked to all members; the first clique of k wins.
std::vector<int> GreedyNvlinkSet(const Topology& topology, const std::vector<int>& fit, size_t k) {
  for (size_t start = 0; start < fit.size(); ++start) {
    std::vector<int> set = {fit[start]};
    for (size_t i = 0; i < fit.size() && set.size() < k; ++i) {
      if (i == start) continue;
      bool linked = true;
      for (int member : set) linked = linked && topology.NvLinks(member, fit[i]) > 0;
      if (linked) set.push_back(fit[i]);
    }
    if (set.size() == k) {
      std::sort(set.begin(), set.end());
      return set;
    }
  }
  return {};
}

}  // namespace

std::vector<int> TopologyBestSet(const NodeSpec& spec, const NodeState& node, const PreparedTask& task) {
  std::vector<int> fit;
  FittingGpus(node, task, fit);
  const auto k = static_cast<size_t>(task.gpu_count);
  if (fit.size() < k || k == 0) return {};
  const bool topology_known = spec.topology.gpu_count() == static_cast<int>(node.gpus.size());
  if (task.nvlink && k > 1) {
    // A hard requirement: without a known topology no set can be shown to qualify.
    if (!topology_known) return {};
    if (fit.size() == k) return AllPairsNvlinked(spec.topology, fit) ? fit : std::vector<int>{};
    if (fit.size() > 16) return GreedyNvlinkSet(spec.topology, fit, k);
  } else {
    if (fit.size() == k) return fit;
    if (k == 1) return {BestSingleGpu(spec, node, task)};
    // Exhaustive over k-subsets in lexicographic order; bounded (C(16,8) = 12,870 sets at most).
    if (fit.size() > 16 || !topology_known) {
      return std::vector<int>(fit.begin(), fit.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  std::vector<size_t> idx(k);
  for (size_t i = 0; i < k; ++i) idx[i] = i;
  std::vector<int> best;
  int best_score = -1;
  int64_t best_left = 0;
  std::vector<int> set(k);
  while (true) {
    int64_t left = 0;
    for (size_t i = 0; i < k; ++i) {
      set[i] = fit[idx[i]];
      left += node.gpus[static_cast<size_t>(set[i])].free_share - task.share;
    }
    const int score = task.nvlink && !AllPairsNvlinked(spec.topology, set) ? -1 : spec.topology.SetScore(set);
    if (score >= 0 && (score > best_score || (score == best_score && left < best_left))) {
      best = set;
      best_score = score;
      best_left = left;
    }
    // Next combination.
    size_t i = k;
    while (i > 0 && idx[i - 1] == fit.size() - k + (i - 1)) --i;
    if (i == 0) break;
    ++idx[i - 1];
    for (size_t j = i; j < k; ++j) idx[j] = idx[j - 1] + 1;
  }
  return best;
}

std::optional<GpuGrant> SelectMigGrant(const Ledger& ledger, NodeIndex node, const PreparedTask& task) {
  const NodeSpec& spec = ledger.spec(node);
  if (spec.gpus.empty() || task.request == nullptr) return std::nullopt;
  const GpuModelSpec* model = ledger.catalog().Find(spec.gpus.front().model);
  if (model == nullptr || !model->mig) return std::nullopt;
  const MigProfile* profile = model->mig->Find(task.request->mig_profile);
  if (profile == nullptr) return std::nullopt;
  const NodeState& s = ledger.state(node);
  // The GPU where the instance changes the fewest existing instances (none, when an idle one of
  // the profile exists), then the fullest one (packing), then the plan that leaves most room.
  std::optional<GpuGrant> best;
  std::optional<MigPlan> best_plan;
  int best_used = -1;
  for (size_t i = 0; i < s.gpus.size(); ++i) {
    const GpuState& g = s.gpus[i];
    if (!g.healthy || !g.mig_enabled) continue;
    const auto plan = PlanMigInstance(*model->mig, g.mig, ledger.mig_present(node, static_cast<int>(i)), *profile);
    if (!plan) continue;
    const int used = g.mig.used_compute_slices(*model->mig);
    const bool better = !best_plan || plan->changes() < best_plan->changes() ||
                        (plan->changes() == best_plan->changes() &&
                         (used > best_used || (used == best_used && BetterMigPlan(*plan, *best_plan))));
    if (better) {
      best_used = used;
      best_plan = plan;
      GpuGrant grant;
      grant.gpu = static_cast<int>(i);
      grant.mig = plan->instance;
      best = grant;
    }
  }
  return best;
}

}  // namespace gpupool
