// Readers for the Alibaba GPU-sharing trace ("openb", cluster-trace-gpu-v2023) and the workload
// preparation of the FGD experiments. A malformed row is an error naming file, line and reason;
// no row is skipped silently.
#pragma once

#include <string>
#include <vector>

#include "common/rng.h"
#include "common/status.h"
#include "model/gpu_catalog.h"
#include "model/node.h"
#include "model/workload.h"

namespace gpupool {

struct TracePod {
  std::string name;
  TaskRequest request;
};

// openb_node_list_*.csv: sn, cpu_milli, memory_mib, gpu, model. Every node gets `max_tasks`
// (the reference simulator's limit is 1001 pods per node).
Result<std::vector<NodeSpec>> ReadOpenbNodes(const std::string& path, const GpuCatalog& catalog,
                                             int max_tasks = 1001);

// openb_pod_list_*.csv: name, cpu_milli, memory_mib, num_gpu, gpu_milli[, gpu_spec, ...].
//   num_gpu = 0: CPU-only (gpu_milli must be 0); num_gpu >= 1: gpu_milli per GPU, clamped to 1000;
//   gpu_spec split on '|' with empty tokens dropped.
Result<std::vector<TracePod>> ReadOpenbPods(const std::string& path);

class CsvFile;
// One row of a pod list as ReadOpenbPods reads it (the errors name file and line).
Result<TracePod> ReadOpenbPodRow(const CsvFile& f);

// GPU demand of a pod list in milli-GPU: sum of gpu_count * share.
int64_t GpuDemand(const std::vector<TracePod>& pods);

// Resamples `pods` (sorted by name first, then shuffled with `rng`) so that the GPU demand reaches
// `ratio` x `capacity_milli`, as the FGD experiments do: draw uniformly with replacement from the
// name-sorted originals and append copies named "<name>-tuned-<i>" until the next draw's per-GPU
// share would overshoot; or, when demand already exceeds the target, drop random entries.
std::vector<TracePod> PrepareWorkload(std::vector<TracePod> pods, int64_t capacity_milli, double ratio,
                                      Rng& rng);

}  // namespace gpupool
