// Who may put what into a queue, and how much one tenant may have waiting: the checks a submission
// passes before anything is stored (docs/server.md#tenant-limits, #queue-access).
//
// Pending counts are kept incrementally under the service's mutex: the state counts a job from
// the moment it enters the state until it leaves the pending state (placed, cancelled, failed); a
// requeued job counts again. Submissions between their admission and their durable write hold a
// reservation in a second set of counts (PoolService::in_flight_), which admission adds.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

#include "common/status.h"
#include "model/workload.h"
#include "sched/queue_access.h"
#include "sched/queueing.h"
#include "server/config.h"

namespace gpupool {

struct PendingCount {
  int64_t jobs = 0;
  int64_t tasks = 0;
};

class PendingCounts {
 public:
  // LimitExceeded, naming the limit and its value, when one more job of `tasks` tasks by `tenant`
  // in `queue` would go over the tenant's limits (config) or the queue's own caps (`spec`).
  // `in_flight`: counts reserved by submissions not yet in these counts, added to them.
  Status CheckRoom(const ServerConfig& config, const QueueSpec* spec, const std::string& tenant,
                   const std::string& queue, int64_t tasks, const PendingCounts* in_flight = nullptr) const;
  void Add(const std::string& tenant, const std::string& queue, int64_t tasks);
  void Remove(const std::string& tenant, const std::string& queue, int64_t tasks);

  PendingCount tenant(const std::string& name) const;
  PendingCount queue(const std::string& name) const;
  const std::unordered_map<std::string, PendingCount>& tenants() const { return tenants_; }

 private:
  std::unordered_map<std::string, PendingCount> tenants_, queues_;
};

}  // namespace gpupool
