// The config's people: API tokens and their roles, and tenants (weights, pending limits, sandbox
// identities, Kubernetes namespaces).
#include <fmt/format.h>

#include <map>
#include <string>

#include "api/jobspec.h"
#include "server/config_internal.h"

namespace gpupool::config_internal {

Status ParseTokens(const nlohmann::json& list, ServerConfig& c) {
  if (!list.is_array()) return Status::InvalidArgument("tokens: must be a list");
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& t = list[i];
    const std::string where = fmt::format("tokens[{}]", i);
    if (Status st = CheckKeys(t, where, {"token", "tokenFile", "role", "tenant"}); !st.ok()) return st;
    std::string token;
    if (t.contains("token") == t.contains("tokenFile"))
      return Status::InvalidArgument(where + ": give exactly one of token and tokenFile");
    if (t.contains("token")) {
      auto v = GetString(t["token"], where + ".token");
      if (!v.ok()) return v.status();
      token = *v;
    } else {
      auto f = GetString(t["tokenFile"], where + ".tokenFile");
      if (!f.ok()) return f.status();
      auto v = ReadTokenFile(*f);
      if (!v.ok()) return v.status().WithContext(where);
      token = *v;
    }
    if (token.size() < 16) return Status::InvalidArgument(where + ".token: must be at least 16 characters");
    Principal p;
    if (!t.contains("role")) return Status::InvalidArgument(where + ".role: is required");
    auto role = GetString(t["role"], where + ".role");
    if (!role.ok()) return role.status();
    if (*role == "admin") {
      p.role = Role::kAdmin;
    } else if (*role == "tenant") {
      p.role = Role::kTenant;
    } else if (*role == "agent") {
      p.role = Role::kAgent;
    } else {
      return Status::InvalidArgument(where + ".role: must be admin, tenant or agent");
    }
    if (t.contains("tenant")) {
      auto v = GetString(t["tenant"], where + ".tenant");
      if (!v.ok()) return v.status();
      // A tenant is a name as job specs and queue access lists write it.
      if (Status st = CheckSpecName(*v, where + ".tenant"); !st.ok()) return st;
      p.tenant = *v;
    }
    if (p.role == Role::kTenant && p.tenant.empty())
      return Status::InvalidArgument(where + ".tenant: a tenant token needs its tenant");
    if (!c.tokens.emplace(token, p).second)
      return Status::InvalidArgument(where + ": the same token is listed twice");
  }
  return Status::Ok();
}

Status ParseTenants(const nlohmann::json& t, ServerConfig& c) {
  if (!t.is_object())
    return Status::InvalidArgument(
        "tenants: must be a map of tenant -> {weight, maxPendingJobs, maxPendingTasks, uid, gid, "
        "namespaces}");
  for (auto it = t.begin(); it != t.end(); ++it) {
    const std::string where = "tenants." + it.key();
    if (Status st = CheckSpecName(it.key(), where); !st.ok()) return st;
    if (Status st = CheckKeys(it.value(), where,
                              {"weight", "maxPendingJobs", "maxPendingTasks", "uid", "gid", "namespaces"});
        !st.ok())
      return st;
    if (it.value().contains("uid") || it.value().contains("gid")) {
      if (!it.value().contains("uid")) return Status::InvalidArgument(where + ".gid: needs a uid beside it");
      // Never root, never the ids of system accounts and nobody (65534), never -1.
      auto uid = GetInt(it.value()["uid"], where + ".uid", 1000, 4294967294);
      if (!uid.ok()) return uid.status();
      ServerConfig::Identity id{*uid, *uid};
      if (it.value().contains("gid")) {
        auto gid = GetInt(it.value()["gid"], where + ".gid", 1000, 4294967294);
        if (!gid.ok()) return gid.status();
        id.gid = *gid;
      }
      if (id.uid == 65534 || id.gid == 65534)
        return Status::InvalidArgument(where +
                                       ": 65534 is nobody's id, shared by every daemon that drops to it");
      c.sandbox.identities[it.key()] = id;
    }
    if (it.value().contains("namespaces")) {
      const auto& list = it.value()["namespaces"];
      if (!list.is_array() || list.size() > 1000)
        return Status::InvalidArgument(where + ".namespaces: must be a list of at most 1000 namespaces");
      for (size_t i = 0; i < list.size(); ++i) {
        const std::string at = fmt::format("{}.namespaces[{}]", where, i);
        auto ns = GetString(list[i], at);
        if (!ns.ok()) return ns.status();
        if (Status st = CheckSpecName(*ns, at); !st.ok()) return st;
        auto [owner, fresh] = c.namespace_tenants.emplace(*ns, it.key());
        if (!fresh)
          return Status::InvalidArgument(
              fmt::format("{}: namespace '{}' belongs to tenant '{}' already", at, *ns, owner->second));
      }
    }
    for (const char* key : {"maxPendingJobs", "maxPendingTasks"}) {
      if (!it.value().contains(key)) continue;
      auto v = GetInt(it.value()[key], where + "." + key, 1, 1000000000);
      if (!v.ok()) return v.status();
      auto& l = c.tenant_limits[it.key()];
      (std::string_view(key) == "maxPendingJobs" ? l.max_pending_jobs : l.max_pending_tasks) = *v;
    }
    if (it.value().contains("weight")) {
      const auto& w = it.value()["weight"];
      if (!w.is_number() || w.get<double>() <= 0 || w.get<double>() > 1e6)
        return Status::InvalidArgument(where + ".weight: must be a positive number");
      c.ordering.tenant_weight_milli[it.key()] = static_cast<int64_t>(w.get<double>() * 1000 + 0.5);
    }
  }
  std::map<int64_t, std::string> uid_owner;
  for (const auto& [tenant, id] : c.sandbox.identities) {
    auto [it, fresh] = uid_owner.emplace(id.uid, tenant);
    if (!fresh)
      return Status::InvalidArgument(
          fmt::format("tenants.{}.uid: {} is tenant {}'s already", tenant, id.uid, it->second));
  }
  return Status::Ok();
}

}  // namespace gpupool::config_internal
