// The FGD score and GPU choice (Weng et al., USENIX ATC'23; trace README §6), shared by the plugins
// built on it: `fgd` uses it as is, `balanced` adds its CPU and memory terms to the points.
//
//   points = trunc(100 * sigmoid((F(N) - F(N')) / 1000)), N' = N with the task placed.
// A share task is tried on every GPU that fits (lowest index wins among equal points); a multi-GPU
// task takes k GPUs with g >= m by ascending free share; a CPU task only moves CPU.
//
// Speed: F(N) is cached per node and generation (dropped when the workload changes); GPUs with
// the same free share give the same N' and are scored once; F is a pure function of the node's
// model, free CPU and multiset of free GPU shares, so its values are remembered by those (a
// bounded table, dropped with the workload): across a cluster many nodes look alike — all of them
// at the start — and a shape's first pass over 10,000 nodes computes a few hundred.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "sched/framework.h"
#include "sched/typical_pods.h"

namespace gpupool {

class FgdCore {
 public:
  explicit FgdCore(std::vector<TypicalPod> pods);

  // Measures fragmentation against `pods` from now on.
  void SetWorkload(std::vector<TypicalPod> pods);
  const std::vector<TypicalPod>& workload() const { return model_.pods(); }

  // FGD's integer points (0..100) for `t` on `node`, which passed the filters.
  int64_t Points(const Ledger& ledger, const PreparedTask& t, NodeIndex node);
  // The GPUs FGD gives `t` on `node`; `who` names the plugin in the error when none fits.
  Result<std::vector<GpuGrant>> Select(const Ledger& ledger, const PreparedTask& t, NodeIndex node,
                                       std::string_view who);

 private:
  void LoadFree(const NodeState& s);
  // model_.NodeFragment, remembered.
  double Fragment(const Ledger& ledger, ModelId model, int64_t free_cpu, std::span<const int32_t> free);
  double CurrentFragment(const Ledger& ledger, NodeIndex node);
  int BestShareGpu(const Ledger& ledger, const NodeState& s, const PreparedTask& t, double before,
                   int64_t* best);
  void TakeAscending(const PreparedTask& t);

  FragmentationModel model_;
  std::vector<std::pair<uint64_t, double>> cache_;  // per node: (generation + 1, F(N))
  std::vector<int32_t> free_;                       // scratch: healthy, non-MIG GPUs' free shares
  std::vector<int> index_;                          // ... and their indices
  std::vector<size_t> order_;
  std::vector<std::pair<int32_t, int64_t>> tried_;

  // Fragment's table: (model, count, sorted free shares) packed into two words, and how many of
  // cpu_thresholds_ (the typical pods' CPU requests, sorted, distinct) the free CPU reaches. Open
  // addressing with linear probing in one array (a decision at 10,000 nodes looks up thousands of
  // keys: no node per entry to chase); `shape` always has kUsedBit, so an empty slot is all zero.
  struct FragmentKey {
    uint64_t shape = 0;
    uint64_t shares = 0;
    int64_t cpu = 0;  // thresholds reached
    bool operator==(const FragmentKey&) const = default;
  };
  struct RememberedSlot {
    FragmentKey key;
    double value = 0;
  };
  static constexpr uint64_t kUsedBit = uint64_t{1} << 63;
  static constexpr size_t kMaxRemembered = size_t{1} << 16;  // then it starts again, empty
  static size_t KeyHash(const FragmentKey& k) {
    uint64_t h = k.shape * 0x9e3779b97f4a7c15ULL;
    h = (h ^ (h >> 29) ^ k.shares) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 32) ^ static_cast<uint64_t>(k.cpu)) * 0x94d049bb133111ebULL;
    return static_cast<size_t>(h ^ (h >> 31));
  }
  // The slot holding `key`, or the empty one where it goes.
  RememberedSlot& FindSlot(const FragmentKey& key);
  void Remember(const FragmentKey& key, double value);
  void ForgetAll();
  std::vector<RememberedSlot> remembered_;  // size a power of two, at most half full
  size_t remembered_count_ = 0;
  std::vector<int64_t> cpu_thresholds_;
};

}  // namespace gpupool
