// What users ask for: tasks, task groups and jobs (gangs).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/quantity.h"
#include "common/status.h"

namespace gpupool {

// One task's request.
//   gpu_count == 0                 CPU-only; every GPU field must be empty
//   gpu_count >= 1, gpu_share      per-GPU share in milli-GPU, 1..1000 (1000 = whole GPU), and
//                  gpu_memory      optionally per-GPU memory (0: no memory reservation)
//   mig_profile                    one MIG instance ("3g.40gb", or "3g" for any 3-slice profile);
//                                  then gpu_count == 1 and no share or GPU memory
struct TaskRequest {
  MilliCpu cpu{0};
  MiB memory{0};
  int gpu_count = 0;
  MilliGpu gpu_share{0};
  MiB gpu_memory{0};
  std::vector<std::string> gpu_models;  // acceptable models; empty: any
  std::string mig_profile;

  bool wants_gpu() const { return gpu_count > 0; }
  bool wants_mig() const { return !mig_profile.empty(); }
  // A share of one GPU (1 GPU, less than all of it) — "share" in GpuClustering's tags.
  bool is_share() const { return gpu_count == 1 && gpu_share < kWholeGpu && !wants_mig(); }
  // GPU share summed over all GPUs of the task.
  MilliGpu total_gpu_share() const { return gpu_share * gpu_count; }
  bool operator==(const TaskRequest&) const = default;
};

Status ValidateTaskRequest(const TaskRequest& request);

// Short human form: "cpu=4 mem=16Gi gpu=2x1 models=[A100-80GB]".
std::string DescribeTaskRequest(const TaskRequest& request);

enum class QosClass : uint8_t {
  kGuaranteed,  // latency-sensitive inference: static, hard-limited partition, never preempted
  kBurstable,
  kBestEffort,  // training: time-sliced and preemptible
};
std::string_view QosClassName(QosClass qos);
Result<QosClass> ParseQosClass(std::string_view name);

struct TaskGroup {
  std::string name;
  int replicas = 1;
  TaskRequest request;
};

// A job is a gang of task groups: either at least `min_available` tasks are placed together, or
// none is. min_available == 0 means all tasks.
struct Job {
  std::string id;
  std::string name;
  std::string tenant;
  std::string queue;
  int priority = 0;
  QosClass qos = QosClass::kBurstable;
  int min_available = 0;
  std::vector<TaskGroup> groups;

  int task_count() const;
  int gang_size() const { return min_available > 0 ? min_available : task_count(); }
};

Status ValidateJob(const Job& job);

}  // namespace gpupool
