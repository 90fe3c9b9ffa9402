// GPU metrics of one node in the Prometheus text format: the 25 fields of dcgm-exporter's default
// set under snake_case names in base units that `promtool check metrics` accepts
// (gpupool_gpu_power_watts, gpupool_gpu_energy_joules_total, gpupool_gpu_utilization_ratio, ...),
// each sample labelled gpu, uuid, model, node (and simulated="true" on a simulated inventory), plus
// one gpupool_gpu_allocation_share_ratio / _memory_bytes series per task holding a share of a GPU,
// labelled with its job and task.
#pragma once

#include <string>
#include <vector>

#include "agent/inventory.h"
#include "agent/nvml.h"

namespace gpupool {

struct GpuHolder {
  int gpu = 0;              // index on the node
  std::string job;          // "j-000000000042"
  std::string task;         // "resnet50-infer/server-0"
  int64_t share_milli = 0;  // of 1000
  int64_t memory_bytes = 0;
};

// `samples` may be empty (a simulated inventory has no counters: only the inventory gauges —
// total memory, health, holders — are written). Deterministic output order.
std::string RenderGpuMetrics(const std::string& node, const Inventory& inv,
                             const std::vector<GpuSample>& samples, const std::vector<GpuHolder>& holders);

}  // namespace gpupool
