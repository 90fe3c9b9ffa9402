#include "sched/plugins/fgd_core.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>

namespace gpupool {

namespace {
int64_t SigmoidPoints(double delta) {
  return static_cast<int64_t>(100.0 * (1.0 / (1.0 + std::exp(-delta / 1000.0))));
}
}  // namespace

FgdCore::FgdCore(std::vector<TypicalPod> pods) { SetWorkload(std::move(pods)); }

void FgdCore::SetWorkload(std::vector<TypicalPod> pods) {
  model_ = FragmentationModel(std::move(pods));
  cache_.clear();
  ForgetAll();
  cpu_thresholds_.clear();
  for (const TypicalPod& p : model_.pods()) cpu_thresholds_.push_back(p.cpu);
  std::sort(cpu_thresholds_.begin(), cpu_thresholds_.end());
  cpu_thresholds_.erase(std::unique(cpu_thresholds_.begin(), cpu_thresholds_.end()), cpu_thresholds_.end());
}

double FgdCore::Fragment(const Ledger& ledger, ModelId model, int64_t free_cpu, std::span<const int32_t> free) {
  // NodeFragment reads the shares only through order-free sums and counts, and the free CPU only
  // through `free_cpu >= pod.cpu`: the sorted shares and the number of the typical pods' CPU
  // requests at or below the free CPU are as good a key, and far more nodes share it. Up to 8 GPUs
  // of 0..1023 (10 bits each) pack; anything else is computed every time.
  constexpr size_t kMaxGpus = 8;
  if (free.size() > kMaxGpus) return model_.NodeFragment(ledger, model, free_cpu, free);
  std::array<int32_t, kMaxGpus> sorted{};
  for (size_t i = 0; i < free.size(); ++i) {
    if (free[i] < 0 || free[i] > 1023) return model_.NodeFragment(ledger, model, free_cpu, free);
    sorted[i] = free[i];
  }
  std::sort(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(free.size()));
  FragmentKey key;
  key.shape = uint64_t{model} | (uint64_t{free.size()} << 16);
  for (size_t i = 0; i < 4; ++i) key.shape |= static_cast<uint64_t>(sorted[i]) << (20 + 10 * i);
  for (size_t i = 4; i < kMaxGpus; ++i) key.shares |= static_cast<uint64_t>(sorted[i]) << (10 * (i - 4));
  key.shape |= kUsedBit;
  key.cpu = std::upper_bound(cpu_thresholds_.begin(), cpu_thresholds_.end(), free_cpu) - cpu_thresholds_.begin();
  if (const RememberedSlot& slot = FindSlot(key); slot.key.shape != 0) return slot.value;
  const double value = model_.NodeFragment(ledger, model, free_cpu, free);
  Remember(key, value);
  return value;
}

FgdCore::RememberedSlot& FgdCore::FindSlot(const FragmentKey& key) {
  const size_t mask = remembered_.size() - 1;
  for (size_t i = KeyHash(key) & mask;; i = (i + 1) & mask) {
    RememberedSlot& slot = remembered_[i];
    if (slot.key.shape == 0 || slot.key == key) return slot;
  }
}

void FgdCore::Remember(const FragmentKey& key, double value) {
  if (remembered_count_ >= kMaxRemembered) ForgetAll();
  if (2 * (remembered_count_ + 1) > remembered_.size()) {
    // Past half full: twice the slots, every key placed again.
    std::vector<RememberedSlot> old(2 * remembered_.size());
    old.swap(remembered_);
    for (const RememberedSlot& slot : old)
      if (slot.key.shape != 0) FindSlot(slot.key) = slot;
  }
  FindSlot(key) = RememberedSlot{key, value};
  ++remembered_count_;
}

void FgdCore::ForgetAll() {
  remembered_.assign(1024, RememberedSlot{});
  remembered_count_ = 0;
}

int64_t FgdCore::Points(const Ledger& ledger, const PreparedTask& t, NodeIndex node) {
  const NodeState& s = ledger.state(node);
  const double before = CurrentFragment(ledger, node);
  LoadFree(s);
  if (!t.wants_gpu() || t.mig) {
    return SigmoidPoints(before - Fragment(ledger, s.model, s.free_cpu - t.cpu, free_));
  }
  if (t.share_task) {
    int64_t best = -1;
    BestShareGpu(ledger, s, t, before, &best);
    return best;
  }
  TakeAscending(t);
  return SigmoidPoints(before - Fragment(ledger, s.model, s.free_cpu - t.cpu, free_));
}

Result<std::vector<GpuGrant>> FgdCore::Select(const Ledger& ledger, const PreparedTask& t, NodeIndex node,
                                              std::string_view who) {
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
        fmt::format("{}: node '{}' passed the filters but no GPU fits", who, ledger.spec(node).name));
  }
  std::vector<GpuGrant> out;
  for (int g : gpus)
    out.push_back(GpuGrant{g, MilliGpu(t.share), MiB(t.MemoryOn(s.gpus[static_cast<size_t>(g)])), std::nullopt});
  return out;
}

void FgdCore::LoadFree(const NodeState& s) {
  if (s.compact()) {  // from the node's own struct, without a walk over its GPUs
    const auto n = static_cast<size_t>(s.usable_gpus);
    free_.assign(s.usable_free.begin(), s.usable_free.begin() + n);
    index_.assign(s.usable_index.begin(), s.usable_index.begin() + n);
    return;
  }
  free_.clear();
  index_.clear();
  for (size_t i = 0; i < s.gpus.size(); ++i) {
    const GpuState& g = s.gpus[i];
    if (!g.healthy || g.mig_enabled) continue;
    free_.push_back(g.free_share);
    index_.push_back(static_cast<int>(i));
  }
}

double FgdCore::CurrentFragment(const Ledger& ledger, NodeIndex node) {
  if (cache_.size() < ledger.node_count()) cache_.resize(ledger.node_count());
  const NodeState& s = ledger.state(node);
  auto& [generation, value] = cache_[node];
  if (generation != s.generation + 1) {  // +1: a fresh entry (generation 0) never matches
    LoadFree(s);
    value = Fragment(ledger, s.model, s.free_cpu, free_);
    generation = s.generation + 1;
  }
  return value;
}

// Tries the share task on every fitting GPU (free_ must be loaded); returns the lowest GPU index
// reaching the highest points, and those points in *best.
int FgdCore::BestShareGpu(const Ledger& ledger, const NodeState& s, const PreparedTask& t, double before,
                          int64_t* best) {
  int chosen = -1;
  tried_.clear();
  for (size_t j = 0; j < free_.size(); ++j) {
    const int32_t g = free_[j];
    if (g < t.share) continue;
    if (s.memory_short_gpus > 0 || t.gpu_memory > 0 || !t.SharingFree(s)) {
      if (!t.FitsOn(s, s.gpus[static_cast<size_t>(index_[j])])) continue;
    }
    int64_t points = -1;
    for (const auto& [value, p] : tried_) {
      if (value == g) points = p;
    }
    if (points < 0) {
      free_[j] = static_cast<int32_t>(g - t.share);
      points = SigmoidPoints(before - Fragment(ledger, s.model, s.free_cpu - t.cpu, free_));
      free_[j] = g;
      tried_.emplace_back(g, points);
    }
    if (points > *best) {
      *best = points;
      chosen = index_[j];
    }
  }
  return chosen;
}

// Subtracts the share from k GPUs with g >= m, taken by ascending g (stable), in free_.
void FgdCore::TakeAscending(const PreparedTask& t) {
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

}  // namespace gpupool
