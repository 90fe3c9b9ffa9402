#include "model/workload.h"

#include <fmt/format.h>

#include <algorithm>

namespace gpupool {

IsolationMode DefaultIsolation(const TaskRequest& r, QosClass qos) {
  if (r.wants_mig()) return IsolationMode::kMig;
  if (r.wants_gpu() && r.gpu_share < kWholeGpu) {
    return qos == QosClass::kGuaranteed ? IsolationMode::kMps : IsolationMode::kTimeslice;
  }
  return IsolationMode::kExclusive;
}

void DeriveSharing(Job& job) {
  for (TaskGroup& g : job.groups) {
    TaskRequest& r = g.request;
    const bool shares = r.wants_gpu() && !r.wants_mig() && r.gpu_share < kWholeGpu;
    r.guaranteed = shares && job.qos == QosClass::kGuaranteed;
    r.enforced_by = 0;
    r.mps_owner.clear();
    if (!shares) continue;
    const bool container = !g.exec.bundle.empty() || !g.exec.rootfs.empty() || !g.exec.image.empty();
    if (g.exec.isolation == IsolationMode::kMps) {
      r.enforced_by = kEnforceMps;
      r.mps_owner = job.tenant;
    }
    if (g.exec.isolation == IsolationMode::kTimeslice)
      r.enforced_by = container ? kEnforceLimiterContainer : kEnforceLimiter;
  }
}

Status CheckIsolation(const TaskRequest& r, IsolationMode mode) {
  const std::string_view name = IsolationModeName(mode);
  if (r.wants_mig() && mode != IsolationMode::kMig) {
    return Status::InvalidArgument(
        fmt::format("a MIG instance (resources.migProfile) runs with isolation 'mig', not '{}'", name));
  }
  switch (mode) {
    case IsolationMode::kMig:
      if (!r.wants_mig()) return Status::InvalidArgument("'mig' needs resources.migProfile");
      break;
    case IsolationMode::kExclusive:
      if (r.is_share())
        return Status::InvalidArgument("'exclusive' needs whole GPUs; a share of one GPU runs with mps or timeslice");
      break;
    case IsolationMode::kMps:
    case IsolationMode::kTimeslice:
      if (!r.wants_gpu())
        return Status::InvalidArgument(fmt::format("'{}' applies to GPU shares, and the task asks for no GPU", name));
      break;
  }
  return Status::Ok();
}

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
  if (r.nvlink && (r.gpu_count < 2 || r.wants_mig())) {
    return Status::InvalidArgument(
        fmt::format("an NVLink requirement needs 2 or more whole or shared GPUs, got gpu count {}{}", r.gpu_count,
                    r.wants_mig() ? " with a MIG profile" : ""));
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
  if (r.enforced_by != 0 && r.enforced_by != kEnforceLimiter && r.enforced_by != kEnforceLimiterContainer &&
      r.enforced_by != kEnforceMps) {
    return Status::InvalidArgument(fmt::format("unknown share enforcement {}", r.enforced_by));
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
  if (r.nvlink) out += " nvlink";
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

std::string_view IsolationModeName(IsolationMode mode) {
  switch (mode) {
    case IsolationMode::kExclusive: return "exclusive";
    case IsolationMode::kMps: return "mps";
    case IsolationMode::kMig: return "mig";
    case IsolationMode::kTimeslice: return "timeslice";
  }
  return "?";
}

Result<IsolationMode> ParseIsolationMode(std::string_view name) {
  if (name == "exclusive") return IsolationMode::kExclusive;
  if (name == "mps") return IsolationMode::kMps;
  if (name == "mig") return IsolationMode::kMig;
  if (name == "timeslice") return IsolationMode::kTimeslice;
  return Status::InvalidArgument(
      fmt::format("unknown isolation mode '{}' (use exclusive, mps, mig or timeslice)", name));
}

std::string_view FrameworkName(Framework framework) {
  switch (framework) {
    case Framework::kAuto: return "auto";
    case Framework::kPyTorch: return "pytorch";
    case Framework::kTensorFlow: return "tensorflow";
    case Framework::kJax: return "jax";
    case Framework::kNone: return "none";
  }
  return "?";
}

Result<Framework> ParseFramework(std::string_view name) {
  for (Framework f : {Framework::kPyTorch, Framework::kTensorFlow, Framework::kJax, Framework::kNone}) {
    if (name == FrameworkName(f)) return f;
  }
  return Status::InvalidArgument("must be pytorch, tensorflow, jax or none");
}

bool LabelRequirement::Matches(const std::map<std::string, std::string>& labels) const {
  auto it = labels.find(key);
  const bool has = it != labels.end();
  switch (op) {
    case Op::kExists: return has;
    case Op::kDoesNotExist: return !has;
    case Op::kIn: return has && std::find(values.begin(), values.end(), it->second) != values.end();
    case Op::kNotIn: return !has || std::find(values.begin(), values.end(), it->second) == values.end();
  }
  return false;
}

std::string_view LabelOpName(LabelRequirement::Op op) {
  switch (op) {
    case LabelRequirement::Op::kIn: return "In";
    case LabelRequirement::Op::kNotIn: return "NotIn";
    case LabelRequirement::Op::kExists: return "Exists";
    case LabelRequirement::Op::kDoesNotExist: return "DoesNotExist";
  }
  return "?";
}

Result<LabelRequirement::Op> ParseLabelOp(std::string_view name) {
  if (name == "In") return LabelRequirement::Op::kIn;
  if (name == "NotIn") return LabelRequirement::Op::kNotIn;
  if (name == "Exists") return LabelRequirement::Op::kExists;
  if (name == "DoesNotExist") return LabelRequirement::Op::kDoesNotExist;
  return Status::InvalidArgument(
      fmt::format("unknown operator '{}' (use In, NotIn, Exists or DoesNotExist)", name));
}

int Job::task_count() const {
  int n = 0;
  for (const auto& g : groups) n += g.replicas;
  return n;
}

int64_t RetryPolicy::BackoffSeconds(int n) const {
  if (n < 2 || backoff_seconds <= 0) return 0;
  int64_t wait = backoff_seconds;
  for (int i = 2; i < n && wait < max_backoff_seconds; ++i) wait *= 2;
  return std::min<int64_t>(wait, max_backoff_seconds);
}

std::string_view DependencyConditionName(Dependency::Condition c) {
  return c == Dependency::Condition::kEnded ? "ended" : "succeeded";
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
    const TaskRequest& r = g.request;
    switch (g.exec.isolation) {
      case IsolationMode::kMig:
        if (!r.wants_mig())
          return Status::InvalidArgument(where + ": isolation 'mig' needs a MIG profile");
        break;
      case IsolationMode::kExclusive:
        if (r.wants_gpu() && !r.wants_mig() && r.gpu_share < kWholeGpu)
          return Status::InvalidArgument(where +
                                         ": isolation 'exclusive' needs whole GPUs; use mps or timeslice "
                                         "for a share");
        break;
      case IsolationMode::kMps:
      case IsolationMode::kTimeslice:
        if (!r.wants_gpu() || r.wants_mig())
          return Status::InvalidArgument(
              fmt::format("{}: isolation '{}' applies to GPU shares, not to {}", where,
                          IsolationModeName(g.exec.isolation), r.wants_mig() ? "a MIG instance" : "a CPU task"));
        break;
    }
    if (g.exec.checkpoint.interval_seconds < 0)
      return Status::InvalidArgument(where + ": checkpoint interval must not be negative");
    if (g.exec.checkpoint.interval_seconds > 0 && g.exec.checkpoint.dir.empty())
      return Status::InvalidArgument(where + ": a checkpoint interval needs a checkpoint directory");
  }
  for (const auto& req : job.affinity.node) {
    if (req.key.empty()) return Status::InvalidArgument(who + ": a node affinity requirement has no key");
    const bool set_op = req.op == LabelRequirement::Op::kIn || req.op == LabelRequirement::Op::kNotIn;
    if (set_op && req.values.empty())
      return Status::InvalidArgument(fmt::format("{}: node affinity on '{}' with {} needs values", who,
                                                 req.key, LabelOpName(req.op)));
    if (!set_op && !req.values.empty())
      return Status::InvalidArgument(fmt::format("{}: node affinity on '{}' with {} takes no values", who,
                                                 req.key, LabelOpName(req.op)));
  }
  for (const auto* terms : {&job.affinity.together_with, &job.affinity.apart_from}) {
    for (const auto& t : *terms) {
      if (t.empty()) return Status::InvalidArgument(who + ": a job affinity term has no labels");
    }
  }
  if (job.min_available < 0 || job.min_available > job.task_count()) {
    return Status::InvalidArgument(
        fmt::format("{}: gang minAvailable {} must be between 1 and the task count {}", who,
                    job.min_available, job.task_count()));
  }
  return Status::Ok();
}

}  // namespace gpupool
