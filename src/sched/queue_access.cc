#include "sched/queue_access.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string_view>
#include <vector>

namespace gpupool {

Status CheckQueueAccess(const QueueOrder& order, const std::string& queue_name, const std::string& tenant,
                        int priority, QosClass qos) {
  const std::string queue = queue_name.empty() ? "default" : queue_name;
  for (const std::string& name : order.Ancestry(queue)) {
    const QueueSpec* q = order.FindQueue(name);
    if (q == nullptr) continue;
    const std::string which =
        name == queue ? fmt::format("queue '{}'", name) : fmt::format("queue '{}' (parent of '{}')", name, queue);
    if (!q->tenants.empty() && std::find(q->tenants.begin(), q->tenants.end(), tenant) == q->tenants.end()) {
      return Status::PermissionDenied(fmt::format("queue: {} takes jobs of tenant(s) {} only (queue.tenants), not of '{}'",
                                                  which, fmt::join(q->tenants, ", "), tenant));
    }
    if (q->max_priority && priority > *q->max_priority) {
      return Status::PermissionDenied(fmt::format("priority: {} allows priority up to {} (queue.maxPriority), the job asks for {}",
                                                  which, *q->max_priority, priority));
    }
    if (!q->allowed_qos.empty() && std::find(q->allowed_qos.begin(), q->allowed_qos.end(), qos) == q->allowed_qos.end()) {
      std::vector<std::string_view> allowed;
      for (QosClass c : q->allowed_qos) allowed.push_back(QosClassName(c));
      return Status::PermissionDenied(fmt::format("qos: {} allows QoS {} only (queue.allowedQos), not {}", which,
                                                  fmt::join(allowed, ", "), QosClassName(qos)));
    }
  }
  return Status::Ok();
}

}  // namespace gpupool
