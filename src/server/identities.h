// Who a tenant's tasks run as (docs/agent.md#the-task-sandbox): the identity the config gives the
// tenant, else the uid the pool gave it from the sandbox range the first time one of its tasks was
// placed (PoolState::tenant_uids, kept in the store's meta rows). No I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "server/config.h"
#include "server/state.h"

namespace gpupool {

// Meta key of a tenant's uid: the prefix, then the tenant's name.
constexpr char kTenantUidKeyPrefix[] = "tenant_uid:";

// The tenant's identity; nullopt while it has none (no task of it placed yet, or the range full).
std::optional<ServerConfig::Identity> TenantIdentity(const ServerConfig& config, const PoolState& state,
                                                     const std::string& tenant);

// The lowest uid of the sandbox range that neither the config gives a tenant nor the pool gave
// one; nullopt when every one is taken.
std::optional<int64_t> FreeTenantUid(const ServerConfig& config, const PoolState& state);

// What a task of `tenant` in `queue` runs as, for its assignment: {"uid", "gid"}, or {"root":
// true} in a queue of sandbox.rootQueues. A tenant the range had no uid left for runs as nobody
// (65534), which its tasks then share with every other such tenant (the server says so in the
// job's events when it happens).
nlohmann::json RunAsJson(const ServerConfig& config, const PoolState& state, const std::string& tenant,
                         const std::string& queue);

bool QueueListed(const std::vector<std::string>& queues, const std::string& queue);

// Sets each MPS share's owner (TaskRequest::mps_owner: a GPU holds MPS shares of one owner only) to
// whom its GPU's MPS server will run for: the job's tenant, or the tenant marked " (root)" in a
// queue of sandbox.rootQueues, whose tasks run as root and so under a server of their own. Call
// once the job's tenant and queue are settled (at submission, and at recovery, under the config of
// the time).
void SetMpsOwners(const ServerConfig& config, Job& job);

// The runtime class a task of group `g` (its exec) runs in, in `queue`: the queue's
// (sandbox.queueRuntimeClass), else the task's own, else "runc"; "" for a process task. Refused
// (PermissionDenied, naming the field and the config key): a process task or another class in a
// queue that forces one, a class sandbox.runtimeClassQueues keeps from the queue.
Result<std::string> TaskRuntimeClass(const ServerConfig& config, const std::string& queue, const TaskExec& exec,
                                     size_t g);

}  // namespace gpupool
