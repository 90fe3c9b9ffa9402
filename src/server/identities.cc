#include "server/identities.h"

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

nlohmann::json RunAsJson(const ServerConfig& config, const PoolState& state, const std::string& tenant,
                         const std::string& queue) {
  if (QueueListed(config.sandbox.root_queues, queue)) return {{"root", true}};
  auto id = TenantIdentity(config, state, tenant);
  if (!id) return {{"uid", 65534}, {"gid", 65534}};
  return {{"uid", id->uid}, {"gid", id->gid}};
}

}  // namespace gpupool
