#include "server/admission.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <vector>

namespace gpupool {

Status PendingCounts::CheckRoom(const ServerConfig& config, const QueueSpec* spec, const std::string& tenant,
                                const std::string& queue, int64_t tasks, const PendingCounts* in_flight) const {
  auto plus = [](PendingCount a, PendingCount b) { return PendingCount{a.jobs + b.jobs, a.tasks + b.tasks}; };
  int64_t max_jobs = config.max_pending_jobs_per_tenant;
  int64_t max_tasks = config.max_pending_tasks_per_tenant;
  std::string jobs_key = "limits.maxPendingJobsPerTenant", tasks_key = "limits.maxPendingTasksPerTenant";
  if (auto it = config.tenant_limits.find(tenant); it != config.tenant_limits.end()) {
    if (it->second.max_pending_jobs > 0) {
      max_jobs = it->second.max_pending_jobs;
      jobs_key = fmt::format("tenants.{}.maxPendingJobs", tenant);
    }
    if (it->second.max_pending_tasks > 0) {
      max_tasks = it->second.max_pending_tasks;
      tasks_key = fmt::format("tenants.{}.maxPendingTasks", tenant);
    }
  }
  const PendingCount t = in_flight ? plus(this->tenant(tenant), in_flight->tenant(tenant)) : this->tenant(tenant);
  if (t.jobs + 1 > max_jobs) {
    return Status::LimitExceeded(fmt::format(
        "tenant '{}' has {} pending job(s), the limit is {} ({}); wait for some to start or cancel some", tenant,
        t.jobs, max_jobs, jobs_key));
  }
  if (t.tasks + tasks > max_tasks) {
    return Status::LimitExceeded(fmt::format(
        "tenant '{}' has {} pending task(s) and this job adds {}, the limit is {} ({}); wait for some to start "
        "or cancel some",
        tenant, t.tasks, tasks, max_tasks, tasks_key));
  }
  if (spec != nullptr) {
    const PendingCount q = in_flight ? plus(this->queue(queue), in_flight->queue(queue)) : this->queue(queue);
    if (spec->max_pending_jobs > 0 && q.jobs + 1 > spec->max_pending_jobs) {
      return Status::LimitExceeded(fmt::format("queue '{}' has {} pending job(s), the limit is {} (queue.maxPendingJobs)",
                                               queue, q.jobs, spec->max_pending_jobs));
    }
    if (spec->max_pending_tasks > 0 && q.tasks + tasks > spec->max_pending_tasks) {
      return Status::LimitExceeded(
          fmt::format("queue '{}' has {} pending task(s) and this job adds {}, the limit is {} (queue.maxPendingTasks)",
                      queue, q.tasks, tasks, spec->max_pending_tasks));
    }
  }
  return Status::Ok();
}

void PendingCounts::Add(const std::string& tenant, const std::string& queue, int64_t tasks) {
  PendingCount& t = tenants_[tenant];
  ++t.jobs;
  t.tasks += tasks;
  PendingCount& q = queues_[queue];
  ++q.jobs;
  q.tasks += tasks;
}

void PendingCounts::Remove(const std::string& tenant, const std::string& queue, int64_t tasks) {
  for (auto* m : {&tenants_, &queues_}) {
    auto it = m->find(m == &tenants_ ? tenant : queue);
    if (it == m->end()) continue;
    --it->second.jobs;
    it->second.tasks -= tasks;
    if (it->second.jobs <= 0) m->erase(it);  // a tenant with nothing pending costs no memory
  }
}

PendingCount PendingCounts::tenant(const std::string& name) const {
  auto it = tenants_.find(name);
  return it == tenants_.end() ? PendingCount{} : it->second;
}

PendingCount PendingCounts::queue(const std::string& name) const {
  auto it = queues_.find(name);
  return it == queues_.end() ? PendingCount{} : it->second;
}

}  // namespace gpupool
