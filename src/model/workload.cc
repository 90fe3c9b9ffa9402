#include "model/workload.h"

#include <fmt/format.h>

namespace gpupool {

Status ValidateTaskRequest(const TaskRequest& r) {
  if (r.cpu.units() < 0) return Status::InvalidArgument("cpu must not be negative");
  if (r.memory.units() < 0) return Status::InvalidArgument("memory must not be negative");
  if (r.gpu_count < 0)
    return Status::InvalidArgument(fmt::format("gpu count must not be negative, got {}", r.gpu_count));
  if (r.gpu_count == 0) {
    if (!r.gpu_share.is_zero() || !r.gpu_memory.is_zero() || r.wants_mig() || !r.gpu_models.empty()) {
      return Status::InvalidArgument(
          "a task without GPUs cannot ask for GPU share, GPU memory, GPU models or a MIG profile");
    }
    return Status::Ok();
  }
  if (r.gpu_memory.units() < 0) return Status::InvalidArgument("GPU memory must not be negative");
  for (const auto& m : r.gpu_models) {
    if (m.empty()) return Status::InvalidArgument("an acceptable GPU model name is empty");
  }
  if (r.wants_mig()) {
    if (r.gpu_count != 1) {
      return Status::InvalidArgument(
          fmt::format("a MIG request takes exactly one instance, got gpu count {}", r.gpu_count));
    }
    if (!r.gpu_share.is_zero() || !r.gpu_memory.is_zero()) {
      return Status::InvalidArgument("a MIG request cannot also ask for GPU share or GPU memory");
    }
    return Status::Ok();
  }
  if (r.gpu_share.units() < 1 || r.gpu_share > kWholeGpu) {
    return Status::InvalidArgument(
        fmt::format("GPU share must be between 1 and 1000 milli-GPU per GPU, got {}", r.gpu_share.units()));
  }
  return Status::Ok();
}

std::string DescribeTaskRequest(const TaskRequest& r) {
  std::string out = fmt::format("cpu={} mem={}", FormatCpu(r.cpu), FormatMemory(r.memory));
  if (r.wants_mig()) {
    out += fmt::format(" mig={}", r.mig_profile);
  } else if (r.wants_gpu()) {
    out += fmt::format(" gpu={}x{}", r.gpu_count, FormatGpu(r.gpu_share));
    if (!r.gpu_memory.is_zero()) out += fmt::format(" gpumem={}", FormatMemory(r.gpu_memory));
  }
  if (!r.gpu_models.empty()) out += fmt::format(" models=[{}]", fmt::join(r.gpu_models, ","));
  return out;
}

std::string_view QosClassName(QosClass qos) {
  switch (qos) {
    case QosClass::kGuaranteed: return "guaranteed";
    case QosClass::kBurstable: return "burstable";
    case QosClass::kBestEffort: return "best-effort";
  }
  return "burstable";
}

Result<QosClass> ParseQosClass(std::string_view name) {
  if (name == "guaranteed") return QosClass::kGuaranteed;
  if (name == "burstable") return QosClass::kBurstable;
  if (name == "best-effort" || name == "besteffort") return QosClass::kBestEffort;
  return Status::InvalidArgument(
      fmt::format("unknown QoS class '{}' (use guaranteed, burstable or best-effort)", name));
}

int Job::task_count() const {
  int n = 0;
  for (const auto& g : groups) n += g.replicas;
  return n;
}

Status ValidateJob(const Job& job) {
  const std::string who = job.name.empty() ? std::string("job") : fmt::format("job '{}'", job.name);
  if (job.groups.empty()) return Status::InvalidArgument(who + ": has no tasks");
  for (size_t i = 0; i < job.groups.size(); ++i) {
    const TaskGroup& g = job.groups[i];
    const std::string where =
        fmt::format("{}: task group {}", who, g.name.empty() ? std::to_string(i) : "'" + g.name + "'");
    if (g.replicas < 1)
      return Status::InvalidArgument(
          fmt::format("{}: replicas must be at least 1, got {}", where, g.replicas));
    RETURN_IF_ERROR(ValidateTaskRequest(g.request).WithContext(where));
  }
  if (job.min_available < 0 || job.min_available > job.task_count()) {
    return Status::InvalidArgument(
        fmt::format("{}: gang minAvailable {} must be between 1 and the task count {}", who,
                    job.min_available, job.task_count()));
  }
  return Status::Ok();
}

}  // namespace gpupool
