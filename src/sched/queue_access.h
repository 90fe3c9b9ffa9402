// Who may put what into a queue: a queue's access rules (queue.tenants, queue.maxPriority,
// queue.allowedQos) and those of its ancestors, checked the same way wherever work enters the pool —
// a submission to the server (docs/server.md#queue-access) and a pod offered to the Kubernetes
// scheduler (docs/kubernetes.md#tenants-and-queues). No I/O.
#pragma once

#include <string>

#include "common/status.h"
#include "model/workload.h"
#include "sched/queueing.h"

namespace gpupool {

// PermissionDenied naming the queue and the rule that refuses work of `tenant` at `priority` and
// `qos` in `queue` ("" is "default"); Ok when every rule on the way to the root lets it in.
// REQUIRES: order.HasQueue(queue).
Status CheckQueueAccess(const QueueOrder& order, const std::string& queue, const std::string& tenant, int priority,
                        QosClass qos);

inline Status CheckQueueAccess(const QueueOrder& order, const Job& job) {
  return CheckQueueAccess(order, job.queue, job.tenant, job.priority, job.qos);
}

}  // namespace gpupool
