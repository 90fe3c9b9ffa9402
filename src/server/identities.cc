#include "server/identities.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace gpupool {

std::optional<ServerConfig::Identity> TenantIdentity(const ServerConfig& config, const PoolState& state,
                                                     const std::string& tenant) {
  if (auto it = config.sandbox.identities.find(tenant); it != config.sandbox.identities.end()) return it->second;
  if (auto it = state.tenant_uids.find(tenant); it != state.tenant_uids.end())
    return ServerConfig::Identity{it->second, it->second};
  return std::nullopt;
}

std::optional<int64_t> FreeTenantUid(const ServerConfig& config, const PoolState& state) {
  std::set<int64_t> used;
  for (const auto& [tenant, id] : config.sandbox.identities) used.insert(id.uid);
  for (const auto& [tenant, uid] : state.tenant_uids) used.insert(uid);
  const int64_t end = config.sandbox.uid_base + config.sandbox.uid_count;
  for (int64_t uid = config.sandbox.uid_base; uid < end; ++uid) {
    if (uid == 65534) continue;
    if (!used.count(uid)) return uid;
  }
  return std::nullopt;
}

bool QueueListed(const std::vector<std::string>& queues, const std::string& queue) {
  return std::find(queues.begin(), queues.end(), queue) != queues.end();
}

void SetMpsOwners(const ServerConfig& config, Job& job) {
  const bool root = QueueListed(config.sandbox.root_queues, job.queue);
  for (TaskGroup& g : job.groups) {
    if (g.request.enforced_by != kEnforceMps) continue;
    g.request.mps_owner = root ? job.tenant + " (root)" : job.tenant;
  }
}

Result<std::string> TaskRuntimeClass(const ServerConfig& config, const std::string& queue, const TaskExec& exec,
                                     size_t g) {
  const bool container = !exec.image.empty() || !exec.bundle.empty() || !exec.rootfs.empty();
  const std::string own = exec.runtime_class.empty() ? "runc" : exec.runtime_class;
  std::string cls = container ? own : "";
  if (auto forced = config.sandbox.queue_runtime_class.find(queue); forced != config.sandbox.queue_runtime_class.end()) {
    if (!container)
      return Status::PermissionDenied(fmt::format(
          "tasks[{}]: queue '{}' runs every task in runtime class {} (sandbox.queueRuntimeClass): a process task "
          "cannot run there; give it a container",
          g, queue, forced->second));
    if (!exec.runtime_class.empty() && exec.runtime_class != forced->second)
      return Status::PermissionDenied(fmt::format(
          "tasks[{}].container.runtimeClass: queue '{}' runs every task in runtime class {} "
          "(sandbox.queueRuntimeClass), not {}",
          g, queue, forced->second, exec.runtime_class));
    cls = forced->second;
  }
  if (auto allowed = config.sandbox.runtime_class_queues.find(cls); allowed != config.sandbox.runtime_class_queues.end()) {
    if (!QueueListed(allowed->second, queue) && !QueueListed(allowed->second, "*"))
      return Status::PermissionDenied(fmt::format(
          "tasks[{}].container.runtimeClass: {} is not allowed in queue '{}' (the admin lists its queues in "
          "sandbox.runtimeClassQueues.{})",
          g, cls, queue, cls));
  }
  return cls;
}

nlohmann::json RunAsJson(const ServerConfig& config, const PoolState& state, const std::string& tenant,
                         const std::string& queue) {
  if (QueueListed(config.sandbox.root_queues, queue)) return {{"root", true}};
  auto id = TenantIdentity(config, state, tenant);
  if (!id) return {{"uid", 65534}, {"gid", 65534}};
  return {{"uid", id->uid}, {"gid", id->gid}};
}

}  // namespace gpupool
