// The FGD score and GPU choice (Weng et al., USENIX ATC'23; trace README §6), shared by the plugins
// built on it: `fgd` uses it as is, `balanced` adds its CPU and memory terms to the points.
//
//   points = trunc(100 * sigmoid((F(N) - F(N')) / 1000)), N' = N with the task placed.
// A share task is tried on every GPU that fits (lowest index wins among equal points); a multi-GPU
// task takes k GPUs with g >= m by ascending free share; a CPU task only moves CPU.
//
// Speed: F(N) is cached per node and generation (dropped when the workload changes); GPUs with
// the same free share give the same N' and are scored once.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "sched/framework.h"
#include "sched/typical_pods.h"

namespace gpupool {

class FgdCore {
 public:
  explicit FgdCore(std::vector<TypicalPod> pods) : model_(std::move(pods)) {}

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
};

}  // namespace gpupool
