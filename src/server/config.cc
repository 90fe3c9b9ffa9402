#include "server/config.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "api/jobspec.h"
#include "server/config_internal.h"
#include "server/resources_json.h"

namespace gpupool {

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kAdmin: return "admin";
    case Role::kTenant: return "tenant";
    case Role::kAgent: return "agent (bootstrap)";
    case Role::kNode: return "node";
  }
  return "?";
}

namespace {

// Tenants one queue's access list may name.
constexpr size_t kMaxQueueTenants = 1000;

}  // namespace

using config_internal::CheckKeys;
using config_internal::GetInt;
using config_internal::GetString;
using config_internal::ParseTenants;
using config_internal::ParseTokens;
using config_internal::ReadTokenFile;

Result<QueueSpec> ParseQueueJson(const nlohmann::json& q, const std::string& where, bool check_names) {
  RETURN_IF_ERROR(CheckKeys(q, where,
                            {"name", "parent", "weight", "guaranteed", "limit", "tenants", "maxPriority",
                             "allowedQos", "maxPendingJobs", "maxPendingTasks"}));
  QueueSpec spec;
  if (!q.contains("name")) return Status::InvalidArgument(where + ".name: is required");
  auto name = GetString(q["name"], where + ".name");
  if (!name.ok()) return name.status();
  if (check_names) RETURN_IF_ERROR(CheckSpecName(*name, where + ".name"));
  spec.name = *name;
  if (q.contains("parent") && !q["parent"].is_null()) {
    auto parent = GetString(q["parent"], where + ".parent");
    if (!parent.ok()) return parent.status();
    if (check_names && !parent->empty()) RETURN_IF_ERROR(CheckSpecName(*parent, where + ".parent"));
    spec.parent = *parent;
  }
  if (q.contains("weight")) {
    if (!q["weight"].is_number() || q["weight"].get<double>() <= 0 || q["weight"].get<double>() > 1e6)
      return Status::InvalidArgument(where + ".weight: must be a positive number up to 1000000");
    spec.weight_milli = static_cast<int64_t>(q["weight"].get<double>() * 1000 + 0.5);
    if (spec.weight_milli < 1) spec.weight_milli = 1;
  }
  if (q.contains("guaranteed")) {
    auto g = ParseResourceMap(q["guaranteed"], where + ".guaranteed", 0);
    if (!g.ok()) return g.status();
    spec.guaranteed = *g;
  }
  if (q.contains("limit")) {
    auto l = ParseResourceMap(q["limit"], where + ".limit", kUnlimited);
    if (!l.ok()) return l.status();
    spec.limit = *l;
  }
  // Admission rules. null clears a rule (so that PATCH {"tenants": null} opens a queue again).
  if (q.contains("tenants") && !q["tenants"].is_null()) {
    const auto& t = q["tenants"];
    const std::string path = where + ".tenants";
    if (!t.is_array()) return Status::InvalidArgument(path + ": must be a list of tenant names");
    if (t.size() > kMaxQueueTenants)
      return Status::InvalidArgument(
          fmt::format("{}: has {} entries, over the limit of {}", path, t.size(), kMaxQueueTenants));
    std::set<std::string> seen;
    for (size_t i = 0; i < t.size(); ++i) {
      const std::string item = fmt::format("{}[{}]", path, i);
      auto v = GetString(t[i], item);
      if (!v.ok()) return v.status();
      RETURN_IF_ERROR(CheckSpecName(*v, item));
      if (!seen.insert(*v).second)
        return Status::InvalidArgument(fmt::format("{}: tenant '{}' is listed twice", item, *v));
      spec.tenants.push_back(*v);
    }
  }
  if (q.contains("maxPriority") && !q["maxPriority"].is_null()) {
    auto v = GetInt(q["maxPriority"], where + ".maxPriority", -1000000, 1000000);
    if (!v.ok()) return v.status();
    spec.max_priority = static_cast<int>(*v);
  }
  if (q.contains("allowedQos") && !q["allowedQos"].is_null()) {
    const auto& a = q["allowedQos"];
    const std::string path = where + ".allowedQos";
    if (!a.is_array() || a.empty() || a.size() > 3)
      return Status::InvalidArgument(path + ": must be a list of QoS classes (guaranteed, burstable, best-effort)");
    for (size_t i = 0; i < a.size(); ++i) {
      const std::string item = fmt::format("{}[{}]", path, i);
      auto v = GetString(a[i], item);
      if (!v.ok()) return v.status();
      auto qos = ParseQosClass(*v);
      if (!qos.ok())
        return Status::InvalidArgument(
            fmt::format("{}: must be guaranteed, burstable or best-effort, got '{}'", item, v->substr(0, 40)));
      if (std::find(spec.allowed_qos.begin(), spec.allowed_qos.end(), *qos) != spec.allowed_qos.end())
        return Status::InvalidArgument(fmt::format("{}: '{}' is listed twice", item, *v));
      spec.allowed_qos.push_back(*qos);
    }
  }
  for (const auto& [key, out] : {std::pair<const char*, int64_t*>{"maxPendingJobs", &spec.max_pending_jobs},
                                 std::pair<const char*, int64_t*>{"maxPendingTasks", &spec.max_pending_tasks}}) {
    if (!q.contains(key) || q[key].is_null()) continue;
    auto v = GetInt(q[key], where + "." + key, 1, 1000000000);
    if (!v.ok()) return v.status();
    *out = *v;
  }
  return spec;
}

nlohmann::json QueueSpecJson(const QueueSpec& q) {
  nlohmann::json j = {{"name", q.name},
                      {"parent", q.parent},
                      {"weight", static_cast<double>(q.weight_milli) / 1000.0},
                      {"guaranteed", ResourceMapJson(q.guaranteed)},
                      {"limit", ResourceMapJson(q.limit)}};
  if (!q.tenants.empty()) j["tenants"] = q.tenants;
  if (q.max_priority) j["maxPriority"] = *q.max_priority;
  if (!q.allowed_qos.empty()) {
    nlohmann::json a = nlohmann::json::array();
    for (QosClass c : q.allowed_qos) a.push_back(QosClassName(c));
    j["allowedQos"] = std::move(a);
  }
  if (q.max_pending_jobs > 0) j["maxPendingJobs"] = q.max_pending_jobs;
  if (q.max_pending_tasks > 0) j["maxPendingTasks"] = q.max_pending_tasks;
  return j;
}

Result<ServerConfig> LoadServerConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::IoError("cannot read config file " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  auto tree = YamlToJson(ss.str());
  if (!tree.ok()) return tree.status().WithContext(path);
  const nlohmann::json& j = *tree;
  ServerConfig c;
  if (j.is_null()) return c;
  auto fail = [&](const Status& st) -> Result<ServerConfig> { return st.WithContext(path); };
  if (Status st = CheckKeys(j, "",
                            {"listen", "dataDir", "tokens", "ordering", "tenants", "queues", "profile",
                             "preemption", "backfill", "heartbeat", "hotspot", "limits", "store", "httpThreads",
                             "http", "tls", "sandbox"});
      !st.ok())
    return fail(st);
  try {
    if (j.contains("listen")) {
      auto v = GetString(j["listen"], "listen");
      if (!v.ok()) return fail(v.status());
      c.listen = *v;
      std::string host;
      int port = 0;
      if (Status st = ParseListen(c.listen, &host, &port); !st.ok()) return fail(st);
    }
    if (j.contains("dataDir")) {
      auto v = GetString(j["dataDir"], "dataDir");
      if (!v.ok()) return fail(v.status());
      c.data_dir = *v;
    }
    if (j.contains("tokens")) {
      if (Status st = ParseTokens(j["tokens"], c); !st.ok()) return fail(st);
    }
    if (j.contains("ordering")) {
      auto v = GetString(j["ordering"], "ordering");
      if (!v.ok()) return fail(v.status());
      auto policy = ParseOrderingPolicy(*v);
      if (!policy.ok()) return fail(policy.status().WithContext("ordering"));
      c.ordering.policy = *policy;
    }
    if (j.contains("tenants")) {
      if (Status st = ParseTenants(j["tenants"], c); !st.ok()) return fail(st);
    }
    if (j.contains("sandbox")) {
      const auto& sb = j["sandbox"];
      if (Status st = CheckKeys(sb, "sandbox", {"uidBase", "uidCount", "rootQueues", "hostNetworkQueues",
                                                "runtimeClassQueues", "queueRuntimeClass"});
          !st.ok())
        return fail(st);
      auto known_class = [](const std::string& k) { return k == "runc" || k == "crun" || k == "runsc" || k == "kata"; };
      if (sb.contains("runtimeClassQueues")) {
        const auto& m = sb["runtimeClassQueues"];
        if (!m.is_object() || m.size() > 4)
          return fail(Status::InvalidArgument("sandbox.runtimeClassQueues: must map crun, runsc or kata to queue lists"));
        for (auto it = m.begin(); it != m.end(); ++it) {
          const std::string where = "sandbox.runtimeClassQueues." + it.key();
          if (!known_class(it.key()) || it.key() == "runc")
            return fail(Status::InvalidArgument(where + ": the classes are crun, runsc and kata (runc is every queue's)"));
          if (!it.value().is_array() || it.value().size() > 10000)
            return fail(Status::InvalidArgument(where + ": must be a list of queue names (or \"*\")"));
          auto& list = c.sandbox.runtime_class_queues[it.key()];
          for (size_t i = 0; i < it.value().size(); ++i) {
            auto v = GetString(it.value()[i], fmt::format("{}[{}]", where, i));
            if (!v.ok()) return fail(v.status());
            if (*v != "*") {
              if (Status st = CheckSpecName(*v, fmt::format("{}[{}]", where, i)); !st.ok()) return fail(st);
            }
            list.push_back(*v);
          }
        }
      }
      if (sb.contains("queueRuntimeClass")) {
        const auto& m = sb["queueRuntimeClass"];
        if (!m.is_object() || m.size() > 10000)
          return fail(Status::InvalidArgument("sandbox.queueRuntimeClass: must map queue names to a runtime class"));
        for (auto it = m.begin(); it != m.end(); ++it) {
          const std::string where = "sandbox.queueRuntimeClass." + it.key();
          if (Status st = CheckSpecName(it.key(), where); !st.ok()) return fail(st);
          auto v = GetString(it.value(), where);
          if (!v.ok()) return fail(v.status());
          if (!known_class(*v)) return fail(Status::InvalidArgument(where + ": must be runc, crun, runsc or kata"));
          c.sandbox.queue_runtime_class[it.key()] = *v;
        }
      }
      if (sb.contains("uidBase")) {
        auto v = GetInt(sb["uidBase"], "sandbox.uidBase", 1000, 4000000000);
        if (!v.ok()) return fail(v.status());
        c.sandbox.uid_base = *v;
      }
      if (sb.contains("uidCount")) {
        auto v = GetInt(sb["uidCount"], "sandbox.uidCount", 1, 100000000);
        if (!v.ok()) return fail(v.status());
        c.sandbox.uid_count = *v;
      }
      if (c.sandbox.uid_base <= 65534 && c.sandbox.uid_base + c.sandbox.uid_count > 65534)
        return fail(Status::InvalidArgument("sandbox.uidBase: the range may not hold 65534 (nobody)"));
      if (c.sandbox.uid_base + c.sandbox.uid_count > 4294967295)
        return fail(Status::InvalidArgument("sandbox.uidCount: the range goes past the largest uid"));
      for (const char* key : {"rootQueues", "hostNetworkQueues"}) {
        if (!sb.contains(key)) continue;
        const std::string where = std::string("sandbox.") + key;
        if (!sb[key].is_array()) return fail(Status::InvalidArgument(where + ": must be a list of queue names"));
        auto& list = std::string_view(key) == "rootQueues" ? c.sandbox.root_queues : c.sandbox.host_network_queues;
        for (size_t i = 0; i < sb[key].size(); ++i) {
          auto v = GetString(sb[key][i], fmt::format("{}[{}]", where, i));
          if (!v.ok()) return fail(v.status());
          if (Status st = CheckSpecName(*v, fmt::format("{}[{}]", where, i)); !st.ok()) return fail(st);
          list.push_back(*v);
        }
      }
    }
    if (j.contains("queues")) {
      if (!j["queues"].is_array()) return fail(Status::InvalidArgument("queues: must be a list"));
      for (size_t i = 0; i < j["queues"].size(); ++i) {
        auto q = ParseQueueJson(j["queues"][i], fmt::format("queues[{}]", i));
        if (!q.ok()) return fail(q.status());
        c.ordering.queues.push_back(*q);
      }
    }
    if (j.contains("profile")) {
      auto v = GetString(j["profile"], "profile");
      if (!v.ok()) return fail(v.status());
      c.profile = *v;
    }
    if (j.contains("preemption")) {
      const auto& p = j["preemption"];
      if (Status st = CheckKeys(p, "preemption", {"enabled", "gracePeriodSeconds"}); !st.ok())
        return fail(st);
      if (p.contains("enabled")) {
        if (!p["enabled"].is_boolean())
          return fail(Status::InvalidArgument("preemption.enabled: must be true or false"));
        c.preemption = p["enabled"].get<bool>();
      }
      if (p.contains("gracePeriodSeconds")) {
        auto v = GetInt(p["gracePeriodSeconds"], "preemption.gracePeriodSeconds", 0, 86400);
        if (!v.ok()) return fail(v.status());
        c.grace_period_seconds = static_cast<int>(*v);
      }
    }
    if (j.contains("backfill")) {
      const auto& b = j["backfill"];
      if (Status st = CheckKeys(b, "backfill", {"reserveAfterSeconds"}); !st.ok()) return fail(st);
      if (b.contains("reserveAfterSeconds")) {
        auto v = GetInt(b["reserveAfterSeconds"], "backfill.reserveAfterSeconds", 0, 86400 * 7);
        if (!v.ok()) return fail(v.status());
        c.reserve_after_seconds = static_cast<int>(*v);
      }
    }
    if (j.contains("heartbeat")) {
      const auto& h = j["heartbeat"];
      if (Status st = CheckKeys(h, "heartbeat", {"intervalSeconds", "timeoutSeconds"}); !st.ok())
        return fail(st);
      if (h.contains("intervalSeconds")) {
        auto v = GetInt(h["intervalSeconds"], "heartbeat.intervalSeconds", 1, 3600);
        if (!v.ok()) return fail(v.status());
        c.heartbeat_interval_seconds = static_cast<int>(*v);
      }
      if (h.contains("timeoutSeconds")) {
        auto v = GetInt(h["timeoutSeconds"], "heartbeat.timeoutSeconds", 1, 86400);
        if (!v.ok()) return fail(v.status());
        c.heartbeat_timeout_seconds = static_cast<int>(*v);
      }
      // Agents fence their tasks 2 s before the timeout (docs/agent.md#lease-fencing), so the lease
      // must outlast two heartbeat intervals even then: one late heartbeat stops nothing.
      if (c.heartbeat_timeout_seconds < 2 * c.heartbeat_interval_seconds + 2)
        return fail(Status::InvalidArgument(fmt::format(
            "heartbeat.timeoutSeconds: must be at least twice intervalSeconds plus two ({}), got {}: agents "
            "stop their tasks 2 s before the timeout, and one late heartbeat must not do that",
            2 * c.heartbeat_interval_seconds + 2, c.heartbeat_timeout_seconds)));
    }
    if (j.contains("hotspot")) {
      const auto& h = j["hotspot"];
      if (Status st = CheckKeys(h, "hotspot",
                                {"temperatureC", "utilization", "memoryUsedFraction", "windowSeconds",
                                 "cooldownSeconds", "migrate"});
          !st.ok())
        return fail(st);
      auto number = [&](const char* key, double lo, double hi, double* out) -> Status {
        if (!h.contains(key)) return Status::Ok();
        if (!h[key].is_number())
          return Status::InvalidArgument(fmt::format("hotspot.{}: must be a number", key));
        const double v = h[key].get<double>();
        if (!(v >= lo && v <= hi))
          return Status::InvalidArgument(fmt::format("hotspot.{}: must be in [{}, {}] (0: off), got {}", key,
                                                     lo, hi, v));
        *out = v;
        return Status::Ok();
      };
      if (Status st = number("temperatureC", 0, 200, &c.hotspot.temperature_c); !st.ok()) return fail(st);
      if (Status st = number("utilization", 0, 1, &c.hotspot.utilization); !st.ok()) return fail(st);
      if (Status st = number("memoryUsedFraction", 0, 1, &c.hotspot.memory_used_fraction); !st.ok())
        return fail(st);
      if (h.contains("windowSeconds")) {
        auto v = GetInt(h["windowSeconds"], "hotspot.windowSeconds", 0, 86400);
        if (!v.ok()) return fail(v.status());
        c.hotspot.window_seconds = static_cast<int>(*v);
      }
      if (h.contains("cooldownSeconds")) {
        auto v = GetInt(h["cooldownSeconds"], "hotspot.cooldownSeconds", 0, 7 * 86400);
        if (!v.ok()) return fail(v.status());
        c.hotspot.cooldown_seconds = static_cast<int>(*v);
      }
      if (h.contains("migrate")) {
        if (!h["migrate"].is_boolean()) return fail(Status::InvalidArgument("hotspot.migrate: must be true or false"));
        c.hotspot.migrate = h["migrate"].get<bool>();
      }
    }
    if (j.contains("limits")) {
      const auto& l = j["limits"];
      if (Status st = CheckKeys(l, "limits",
                                {"maxBodyBytes", "maxJobsPerCycle", "maxPendingJobsPerTenant",
                                 "maxPendingTasksPerTenant", "maxTasksPerJob", "maxNodes"});
          !st.ok())
        return fail(st);
      if (l.contains("maxPendingJobsPerTenant")) {
        auto v = GetInt(l["maxPendingJobsPerTenant"], "limits.maxPendingJobsPerTenant", 1, 1000000000);
        if (!v.ok()) return fail(v.status());
        c.max_pending_jobs_per_tenant = *v;
      }
      if (l.contains("maxPendingTasksPerTenant")) {
        auto v = GetInt(l["maxPendingTasksPerTenant"], "limits.maxPendingTasksPerTenant", 1, 1000000000);
        if (!v.ok()) return fail(v.status());
        c.max_pending_tasks_per_tenant = *v;
      }
      if (l.contains("maxTasksPerJob")) {
        auto v = GetInt(l["maxTasksPerJob"], "limits.maxTasksPerJob", 1, 100000);
        if (!v.ok()) return fail(v.status());
        c.max_tasks_per_job = static_cast<int>(*v);
      }
      if (l.contains("maxNodes")) {
        auto v = GetInt(l["maxNodes"], "limits.maxNodes", 1, 1000000);
        if (!v.ok()) return fail(v.status());
        c.max_nodes = static_cast<int>(*v);
      }
      if (l.contains("maxBodyBytes")) {
        auto v = GetInt(l["maxBodyBytes"], "limits.maxBodyBytes", 1024, int64_t{64} << 20);
        if (!v.ok()) return fail(v.status());
        c.max_body_bytes = static_cast<size_t>(*v);
      }
      if (l.contains("maxJobsPerCycle")) {
        auto v = GetInt(l["maxJobsPerCycle"], "limits.maxJobsPerCycle", 1, 1000000);
        if (!v.ok()) return fail(v.status());
        c.max_jobs_per_cycle = static_cast<int>(*v);
      }
    }
    if (j.contains("store")) {
      const auto& s = j["store"];
      if (Status st = CheckKeys(s, "store", {"synchronous", "finishedJobRetentionSeconds", "minFreeBytes"}); !st.ok())
        return fail(st);
      if (s.contains("synchronous")) {
        auto v = GetString(s["synchronous"], "store.synchronous");
        if (!v.ok()) return fail(v.status());
        if (*v != "full" && *v != "normal")
          return fail(Status::InvalidArgument("store.synchronous: must be full or normal"));
        c.sync_full = *v == "full";
      }
      if (s.contains("finishedJobRetentionSeconds")) {
        auto v = GetInt(s["finishedJobRetentionSeconds"], "store.finishedJobRetentionSeconds", 0,
                        int64_t{3650} * 86400);
        if (!v.ok()) return fail(v.status());
        c.finished_job_retention_seconds = *v;
      }
      if (s.contains("minFreeBytes")) {
        auto v = GetInt(s["minFreeBytes"], "store.minFreeBytes", 0, int64_t{1} << 50);
        if (!v.ok()) return fail(v.status());
        c.store_min_free_bytes = *v;
      }
    }
    if (j.contains("httpThreads")) {  // the older name of http.workers
      auto v = GetInt(j["httpThreads"], "httpThreads", 1, 1024);
      if (!v.ok()) return fail(v.status());
      c.http.workers = static_cast<int>(*v);
    }
    if (j.contains("http")) {
      const auto& h = j["http"];
      if (Status st = CheckKeys(h, "http",
                                {"workers", "priorityWorkers", "ioThreads", "requestTimeoutSeconds",
                                 "idleTimeoutSeconds", "maxConnections", "maxConnectionsPerAddress",
                                 "maxQueuedPerLane"});
          !st.ok())
        return fail(st);
      const struct {
        const char* key;
        int* out;
        int64_t lo, hi;
      } ints[] = {{"workers", &c.http.workers, 1, 1024},
                  {"priorityWorkers", &c.http.priority_workers, 1, 256},
                  {"ioThreads", &c.http.io_threads, 1, 64},
                  {"requestTimeoutSeconds", &c.http.request_timeout_seconds, 1, 3600},
                  {"idleTimeoutSeconds", &c.http.idle_timeout_seconds, 1, 86400},
                  {"maxConnections", &c.http.max_connections, 16, 1000000},
                  {"maxConnectionsPerAddress", &c.http.max_connections_per_address, 1, 1000000},
                  {"maxQueuedPerLane", &c.http.max_queued_per_lane, 1, 1000000}};
      for (const auto& f : ints) {
        if (!h.contains(f.key)) continue;
        auto v = GetInt(h[f.key], std::string("http.") + f.key, f.lo, f.hi);
        if (!v.ok()) return fail(v.status());
        *f.out = static_cast<int>(*v);
      }
    }
    if (j.contains("tls")) {
      const auto& t = j["tls"];
      if (Status st = CheckKeys(t, "tls", {"cert", "key", "clientCA", "agentCA"}); !st.ok()) return fail(st);
      const struct {
        const char* key;
        std::string* out;
      } paths[] = {{"cert", &c.tls.cert_file}, {"key", &c.tls.key_file}, {"clientCA", &c.tls.client_ca_file},
                     {"agentCA", &c.tls.agent_ca_file}};
      for (const auto& f : paths) {
        if (!t.contains(f.key)) continue;
        auto v = GetString(t[f.key], std::string("tls.") + f.key);
        if (!v.ok()) return fail(v.status());
        *f.out = *v;
      }
      if (c.tls.cert_file.empty() != c.tls.key_file.empty())
        return fail(Status::InvalidArgument("tls: cert and key go together"));
      if (!c.tls.client_ca_file.empty() && c.tls.cert_file.empty())
        return fail(Status::InvalidArgument("tls.clientCA: needs tls.cert and tls.key"));
    }
  } catch (const nlohmann::json::exception& e) {
    return fail(Status::InvalidArgument(e.what()));
  }
  // Validate the queue tree once here so a bad config fails at start, naming the queue.
  auto order = QueueOrder::Create(c.ordering);
  if (!order.ok()) return fail(order.status().WithContext("queues"));
  return c;
}

Result<std::string> EnsureAdminToken(const std::string& data_dir) {
  const std::string path = data_dir + "/admin.token";
  if (::access(path.c_str(), F_OK) == 0) return ReadTokenFile(path);
  std::random_device rd;
  std::string token;
  static const char kHex[] = "0123456789abcdef";
  for (int i = 0; i < 40; ++i) token += kHex[rd() % 16];
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return Status::IoError("cannot create " + tmp);
  const std::string line = token + "\n";
  const bool ok =
      ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) return Status::IoError("cannot write " + path);
  return token;
}

Status ParseListen(const std::string& listen, std::string* host, int* port) {
  const auto colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0)
    return Status::InvalidArgument(fmt::format("listen address '{}' must be host:port", listen));
  *host = listen.substr(0, colon);
  const std::string p = listen.substr(colon + 1);
  if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(p) > 65535)
    return Status::InvalidArgument(fmt::format("listen address '{}': port must be 0..65535", listen));
  *port = std::stoi(p);
  return Status::Ok();
}

}  // namespace gpupool
