// Typical pods and GPU fragmentation, as defined by the FGD paper (Weng et al., USENIX ATC'23)
// and pinned down precisely in the trace README's §5 and §6 (see docs/design.md).
//
// A typical workload is the set of most frequent task shapes with their weights. The
// fragmentation of a node is the GPU share that the typical tasks, weighted, could not use.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/value.h"
#include "model/ledger.h"
#include "model/workload.h"

namespace gpupool {

struct TypicalPod {
  int64_t cpu = 0;    // mCPU
  int64_t share = 0;  // per-GPU milli-GPU (0: CPU-only)
  int gpu_count = 0;
  std::vector<std::string> models;  // acceptable GPU models; empty: any
  double weight = 0;
};

// The typical workload of `tasks`: group by (cpu, share, gpu count, model list joined by '|'),
// sort by count descending then key descending, keep keys until the running count reaches
// `coverage` of all tasks, weight = (count/N)/(cum/N). Memory is not part of the key.
std::vector<TypicalPod> ComputeTypicalPods(std::span<const TaskRequest> tasks, double coverage = 0.95);

// What gpupool's schedulers learn FGD's typical workload from: ComputeTypicalPods of the GPU tasks
// among `tasks`, or a single whole-GPU pod (no CPU) when there are none.
std::vector<TypicalPod> TypicalOfGpuTasks(std::span<const TaskRequest> tasks);

// Counts task shapes (cpu, share, GPU count, model list) as tasks arrive: what ComputeTypicalPods
// does in one pass, kept open for a plugin that learns the workload online.
class TaskShapeCounter {
 public:
  // One task of this shape; `models` is kept only when gpu_count > 0.
  void Add(int64_t cpu, int64_t share, int gpu_count, const std::vector<std::string>& models);
  // The typical workload of the tasks added so far (TypicalPodsFromCounts).
  std::vector<TypicalPod> Typical(double coverage = 0.95) const;

 private:
  std::map<std::tuple<int64_t, int64_t, int, std::string>, std::pair<TypicalPod, int64_t>> counts_;
};

// The same from shapes already counted: each (shape, count) once, the shape's weight ignored.
std::vector<TypicalPod> TypicalPodsFromCounts(std::vector<std::pair<TypicalPod, int64_t>> shapes,
                                              double coverage = 0.95);

// How far apart two typical workloads are: the total variation distance between their weights,
// ½ Σ |a(shape) − b(shape)| over the shapes (cpu, share, GPU count, models) of either, a shape
// missing from one weighing 0 there. 0 for the same workload, 1 for workloads with no shape in
// common (weights that sum to 1). Relearning skips a workload closer than a threshold to the one in
// use, so that scores (and the indexes built from them) survive while the mix holds still.
double WorkloadDistance(const std::vector<TypicalPod>& a, const std::vector<TypicalPod>& b);
// The threshold: a relearned workload closer than this to the one in use is not taken.
constexpr double kWorkloadMinChange = 0.01;

// A typical workload written out by hand (profile arguments): a list of maps with cpu (mCPU),
// gpuShare (0..1000 per GPU), gpuCount, models (optional list) and weight (> 0).
Result<std::vector<TypicalPod>> ParseTypicalPods(const Value& list);

// A typical workload resolved against a ledger's interned models, ready for fast evaluation.
class FragmentationModel {
 public:
  FragmentationModel() = default;
  explicit FragmentationModel(std::vector<TypicalPod> pods) : pods_(std::move(pods)) {}

  const std::vector<TypicalPod>& pods() const { return pods_; }

  // Fragmentation (milli-GPU, weighted) of a node of GPU model `model` with `free_cpu` mCPU and
  // per-GPU free shares `free` (healthy, non-MIG GPUs only). Buckets q1 + q2 + q4 + xl + xr + na,
  // each summed in typical-pod order, then added in that order.
  double NodeFragment(const Ledger& ledger, ModelId model, int64_t free_cpu,
                      std::span<const int32_t> free) const;
  // The fragmentation of a node as the ledger has it now (healthy, non-MIG GPUs).
  double NodeFragment(const Ledger& ledger, NodeIndex node) const;
  // Σ NodeFragment over all nodes.
  double ClusterFragment(const Ledger& ledger) const;

 private:
  // access[model id][pod]: the pod may use GPUs of that model.
  const std::vector<uint8_t>& AccessFor(const Ledger& ledger, ModelId model) const;

  std::vector<TypicalPod> pods_;
  mutable std::vector<std::vector<uint8_t>> access_;
  mutable std::vector<uint8_t> access_ready_;
};

}  // namespace gpupool
