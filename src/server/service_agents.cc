// PoolService, the agent protocol: registration and node credentials, heartbeats (liveness, GPU
// reports, agent info), assignments and their long polls, task status reports (one or batched).
#include "server/service.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <optional>

#include "api/jobspec.h"
#include "api/mig_report.h"
#include "api/node_codec.h"
#include "common/image_source.h"
#include "config/profile_yaml.h"
#include "sched/preemption.h"
#include "sched/registry.h"
#include "sched/typical_pods.h"
#include "server/agent_endpoint.h"
#include "server/resources_json.h"
#include "server/identities.h"
#include "server/rendezvous.h"
#include "server/service_internal.h"

namespace gpupool {

using nlohmann::json;
using namespace service_internal;


Result<json> PoolService::RegisterNode(const Principal& who, const json& body_in) {
  std::optional<AgentInfo> agent;
  json body = body_in;
  if (body.is_object() && body.contains("agent")) {
    auto a = ParseAgentInfo(body["agent"]);
    if (!a.ok()) return a.status();
    agent = *a;
    body.erase("agent");
  }
  // The cluster the agent belongs to, when it has been in one: a different one is refused, so a
  // node of an old pool never joins a new one (with the old pool's tasks still on it).
  if (body.is_object() && body.contains("clusterId")) {
    if (!body["clusterId"].is_string() || body["clusterId"].get<std::string>().size() > 64)
      return Status::InvalidArgument("clusterId: must be a string of at most 64 characters");
    const std::string theirs = body["clusterId"].get<std::string>();
    body.erase("clusterId");
    if (!theirs.empty() && theirs != cluster_id_)
      return Status::FailedPrecondition(fmt::format(
          "clusterId: the agent belongs to cluster {}, this server is cluster {} (its store was created "
          "anew); the agent does not join another pool: see docs/agent.md#cluster-identity",
          theirs, cluster_id_));
  }
  // The MIG layouts are not inventory (they change while the node serves): taken out before the
  // spec is read, so a node re-registers as itself whatever instances exist.
  auto mig_present = TakeMigInstances(body);
  if (!mig_present.ok()) return mig_present.status();
  auto spec = ParseNodeSpec(body, state_.ledger.catalog());
  if (!spec.ok()) return spec.status();
  const json canonical = NodeSpecToJson(*spec);
  if (who.role == Role::kNode && who.node != spec->name)
    return Status::PermissionDenied(fmt::format(
        "the credential of node '{}' may not register node '{}'", who.node, spec->name));
  if (who.role != Role::kAdmin && who.role != Role::kAgent && who.role != Role::kNode)
    return Status::PermissionDenied("only an agent or an admin registers nodes");
  ServiceLock lock(*this);
  const int64_t now = NowMs();
  auto existing = state_.ledger.FindNode(spec->name);
  if (who.role == Role::kAgent && existing && state_.nodes[*existing].state == "ready" &&
      credentials_.Live(spec->name)) {
    // Someone holding the bootstrap token could otherwise take over a live node's assignments.
    return Status::FailedPrecondition(fmt::format(
        "node '{}' is ready and its node credential is live: its agent registers with that credential; "
        "to replace the agent, an admin revokes it first (gpupool nodes revoke {})",
        spec->name, spec->name));
  }
  WriteBatch batch;
  RegisterNodeOp op;
  op.spec = *spec;
  op.spec_json = canonical;
  op.agent = agent;
  op.max_nodes = config_.max_nodes;
  op.mig_present = std::move(mig_present).value();
  RETURN_IF_ERROR(ApplyLocked(std::move(op), batch));
  const NodeIndex n = *state_.ledger.FindNode(spec->name);
  std::string secret;
  if (who.role != Role::kNode) secret = credentials_.Issue(spec->name, now, batch);
  if (Status st = CommitLocked(batch); !st.ok()) {
    if (!secret.empty()) credentials_.Forget(spec->name);
    return st;
  }
  json out = {{"node", NodeJson(n)},
              {"clusterId", cluster_id_},
              {"features", AgentFeatures()},
              {"heartbeatIntervalSeconds", config_.heartbeat_interval_seconds},
              {"heartbeatTimeoutSeconds", config_.heartbeat_timeout_seconds}};
  if (!secret.empty()) out["credential"] = secret;
  return out;
}

std::optional<Principal> PoolService::AuthenticateNode(std::string_view secret) {
  auto node = credentials_.Authenticate(secret, NowMs());
  if (!node) return std::nullopt;
  return Principal{"", Role::kNode, *node};
}

json PoolService::ListNodeCredentials() { return credentials_.List(); }

Result<json> PoolService::RevokeNodeCredential(const std::string& node) {
  ServiceLock lock(*this);
  WriteBatch batch;
  RETURN_IF_ERROR(credentials_.Revoke(node, NowMs(), batch));
  batch.Add(AppendEvent{MakeEvent("", NowMs(), "NodeCredentialRevoked", node)});
  RETURN_IF_ERROR(CommitLocked(batch));
  return json{{"node", node}, {"state", "revoked"}};
}

Result<json> PoolService::Heartbeat(const std::string& node, const json& body) {
  if (!body.is_null() && !body.is_object())
    return Status::InvalidArgument("heartbeat: the body must be a JSON object");
  std::optional<AgentInfo> agent;
  std::vector<GpuReport> gpu_reports;
  if (body.is_object()) {
    for (auto it = body.begin(); it != body.end(); ++it) {
      if (it.key() != "tasks" && it.key() != "agent" && it.key() != "gpus")
        return Status::InvalidArgument(it.key() + ": unknown field (known: tasks, agent, gpus)");
    }
    if (body.contains("agent")) {
      auto a = ParseAgentInfo(body["agent"]);
      if (!a.ok()) return a.status();
      agent = *a;
    }
    if (body.contains("gpus")) {
      const json& gs = body["gpus"];
      if (!gs.is_array()) return Status::InvalidArgument("gpus: must be a list");
      if (gs.size() > 1024) return Status::InvalidArgument("gpus: at most 1024 entries");
      for (size_t i = 0; i < gs.size(); ++i) {
        const json& g = gs[i];
        const std::string where = fmt::format("gpus[{}]", i);
        if (!g.is_object() || !g.contains("index") || !g["index"].is_number_integer())
          return Status::InvalidArgument(where + ": needs index (integer)");
        if (!InIntRange(g["index"], 0, 1023))
          return Status::InvalidArgument(where + ".index: must be a GPU index of the node (0 to 1023)");
        GpuReport r;
        r.index = static_cast<int>(g["index"].get<int64_t>());
        for (auto it = g.begin(); it != g.end(); ++it) {
          const std::string& k = it.key();
          const json& v = it.value();
          if (k == "index") continue;
          if (k == "healthy") {
            if (!v.is_boolean()) return Status::InvalidArgument(where + ".healthy: must be true or false");
            r.healthy = v.get<bool>();
          } else if (k == "reason") {
            if (!v.is_string()) return Status::InvalidArgument(where + ".reason: must be a string");
            r.reason = v.get<std::string>().substr(0, 256);
          } else if (k == "memoryPressureJob") {
            if (!v.is_string() || v.get<std::string>().empty() || v.get<std::string>().size() > 128)
              return Status::InvalidArgument(where + ".memoryPressureJob: must be a job id (1 to 128 characters)");
            r.memory_pressure_job = v.get<std::string>();
          } else if (k == "migInstances") {
            auto instances = ParseMigInstances(v, where + ".migInstances");
            if (!instances.ok()) return instances.status();
            r.mig_instances = std::move(instances).value();
          } else if (k == "temperatureC" || k == "utilization" || k == "memoryUsedFraction") {
            const double hi = k == "temperatureC" ? 1000 : 1;
            if (!v.is_number() || !(v.get<double>() >= 0 && v.get<double>() <= hi))
              return Status::InvalidArgument(fmt::format("{}.{}: must be a number in [0, {}]", where, k, hi));
            (k == "temperatureC"  ? r.temperature_c
             : k == "utilization" ? r.utilization
                                  : r.memory_used_fraction) = v.get<double>();
          } else {
            return Status::InvalidArgument(
                fmt::format("{}.{}: unknown field (known: index, healthy, reason, temperatureC, utilization, "
                            "memoryUsedFraction, migInstances, memoryPressureJob)",
                            where, k));
          }
        }
        gpu_reports.push_back(std::move(r));
      }
    }
    // Every number is checked before anything of the heartbeat is applied (GPU indexes against the
    // node's by the state machine): a bad one is a 400 naming the field, with nothing stored.
    if (body.contains("tasks")) {
      if (!body["tasks"].is_array()) return Status::InvalidArgument("tasks: must be a list");
      if (body["tasks"].size() > 4096) return Status::InvalidArgument("tasks: at most 4096 entries");
      for (size_t i = 0; i < body["tasks"].size(); ++i) {
        const json& t = body["tasks"][i];
        const std::string where = fmt::format("tasks[{}]", i);
        if (!t.is_object() || !t.contains("jobId") || !t["jobId"].is_string() || !t.contains("index") ||
            !t["index"].is_number_integer())
          return Status::InvalidArgument(where + ": needs jobId (string) and index (integer)");
        if (!InIntRange(t["index"], 0, 999999))
          return Status::InvalidArgument(where + ".index: must be a task index, 0 to 999999");
        if (t.contains("exitCode") && !InIntRange(t["exitCode"], kMinExitCode, kMaxExitCode))
          return Status::InvalidArgument(
              fmt::format("{}.exitCode: must be an integer from {} to {}", where, kMinExitCode, kMaxExitCode));
      }
      for (size_t i = 0; i < body["tasks"].size(); ++i) {
        const json& t = body["tasks"][i];
        const std::string where = fmt::format("tasks[{}]", i);
        json status = t;
        status.erase("jobId");
        status.erase("index");
        auto r = ReportTask(node, t["jobId"].get<std::string>(), t["index"].get<int>(), status);
        if (!r.ok()) return r.status().WithContext(where);
      }
    }
  }
  {
    ServiceLock lock(*this);
    WriteBatch batch;
    HeartbeatOp op;
    op.node = node;
    op.agent = agent;
    op.gpus = std::move(gpu_reports);
    RETURN_IF_ERROR(ApplyLocked(std::move(op), batch));
    credentials_.FlushLastUsed(kCredentialLastUsedStepMs, batch);
    if (!batch.empty()) RETURN_IF_ERROR(CommitLocked(batch));
  }
  auto out = Assignments(node);
  if (out.ok()) {
    (*out)["clusterId"] = cluster_id_;
    (*out)["features"] = AgentFeatures();
    (*out)["heartbeatIntervalSeconds"] = config_.heartbeat_interval_seconds;
    (*out)["heartbeatTimeoutSeconds"] = config_.heartbeat_timeout_seconds;
  }
  return out;
}

Result<json> PoolService::Assignments(const std::string& node) {
  ServiceLock lock(*this);
  // An assignment is handed out only once the cycle that made it is on disk: a task must never run
  // that a restart would not know about.
  const uint64_t gen = enqueued_gen_;
  durable_.wait(lock.get(), [&] { return durable_gen_ >= gen; });
  auto n = state_.ledger.FindNode(node);
  if (!n) return Status::NotFound(fmt::format("node '{}' is not registered", node));
  return AssignmentsJsonLocked(*n);
}

Result<std::optional<json>> PoolService::WatchAssignments(const std::string& node, const std::string& since,
                                                          std::shared_ptr<Watcher> watcher) {
  ServiceLock lock(*this);
  const uint64_t gen = enqueued_gen_;
  durable_.wait(lock.get(), [&] { return durable_gen_ >= gen; });
  auto n = state_.ledger.FindNode(node);
  if (!n) return Status::NotFound(fmt::format("node '{}' is not registered", node));
  // Changes not yet durable (the loop's cycle in flight) are not announced: the version is the
  // last one whose changes are on disk.
  if (!node_watches_->Wait(*n, since, std::move(watcher), [&] { return AssignmentsJsonLocked(*n); }))
    return {AssignmentsJsonLocked(*n)};
  return {std::nullopt};
}

Result<std::optional<json>> PoolService::WatchJob(const Principal& who, const std::string& id,
                                                  const std::string& since, std::shared_ptr<Watcher> watcher) {
  ServiceLock lock(*this);
  const uint64_t gen = enqueued_gen_;
  durable_.wait(lock.get(), [&] { return durable_gen_ >= gen; });
  ASSIGN_OR_RETURN(JobState * j, VisibleJob(who, id));
  if (!job_watches_->Wait(j->rec.id, since, std::move(watcher), [&] { return JobJson(*j); })) return {JobJson(*j)};
  return {std::nullopt};
}

json PoolService::AssignmentsJsonLocked(NodeIndex n) const {
  json items = json::array();
  for (const auto& [job_id, index] : state_.nodes[n].tasks) {
    auto it = state_.jobs.find(job_id);
    if (it == state_.jobs.end()) continue;
    const JobState* j = it->second.get();
    const TaskState& ts = j->tasks[static_cast<size_t>(index)];
    const TaskGroup& g = j->job.groups[static_cast<size_t>(ts.group)];
    json a = {{"jobId", job_id}, {"index", index}, {"state", TaskPhaseName(ts.phase)}};
    if (ts.phase == TaskPhase::kStopping) {
      a["desired"] = "stop";
      a["gracePeriodSeconds"] = config_.grace_period_seconds;
      a["reason"] = ts.stop_reason;
    } else {
      a["desired"] = "run";
    }
    a["name"] = fmt::format("{}/{}-{}", j->rec.name, g.name, ts.replica);
    a["tenant"] = j->rec.tenant;
    a["qos"] = QosClassName(j->job.qos);
    a["isolation"] = IsolationModeName(g.exec.isolation);
    if (g.exec.framework != Framework::kAuto) a["framework"] = FrameworkName(g.exec.framework);
    a["command"] = g.exec.command;
    a["env"] = g.exec.env;
    a["bundle"] = g.exec.bundle;
    a["rootfs"] = g.exec.rootfs;
    if (!g.exec.image.empty()) a["image"] = g.exec.image;
    a["network"] = g.exec.network.empty() ? "none" : g.exec.network;
    // Settled at submission (a queue's forced class is written into the spec then).
    if (!g.exec.image.empty() || !g.exec.bundle.empty() || !g.exec.rootfs.empty())
      a["runtimeClass"] = g.exec.runtime_class.empty() ? "runc" : g.exec.runtime_class;
    if (!g.exec.working_dir.empty()) a["workingDir"] = g.exec.working_dir;
    a["runAs"] = RunAsJson(config_, state_, j->rec.tenant, j->rec.queue);
    if (json r = RendezvousJson(state_, *j, index); !r.is_null()) a["rendezvous"] = std::move(r);
    a["checkpoint"] = {{"dir", g.exec.checkpoint.dir},
                       {"intervalSeconds", g.exec.checkpoint.interval_seconds}};
    if (!g.exec.volumes.empty()) a["volumes"] = VolumesToJson(g.exec.volumes);
    a["restarts"] = ts.restarts;
    a["runId"] = ts.run_id;
    json p = PlacementToJson(ts.placement, state_.ledger);
    a["cpu"] = p["cpu"];
    a["memory"] = p["memory"];
    a["gpus"] = p["gpus"];
    items.push_back(std::move(a));
  }
  // The version of this list; the agent sends it back to wait for the next change.
  return json{{"assignments", std::move(items)}, {"version", node_watches_->Version(n)}};
}

Result<TaskReport> PoolService::ParseTaskReport(const std::string& job_id, int index, const json& body,
                                                               bool with_ids) {
  if (!body.is_object()) return Status::InvalidArgument("status: the body must be a JSON object");
  TaskReport r;
  r.job_id = job_id;
  r.index = index;
  std::string& state = r.state;
  int& exit_code = r.exit_code;
  std::string& message = r.message;
  int& run = r.run;
  std::optional<std::string>& run_id = r.run_id;
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& k = it.key();
    if (with_ids && (k == "jobId" || k == "index")) continue;
    if (k == "state") {
      if (!it.value().is_string()) return Status::InvalidArgument("state: must be a string");
      state = it.value().get<std::string>();
    } else if (k == "exitCode") {
      if (!InIntRange(it.value(), kMinExitCode, kMaxExitCode))
        return Status::InvalidArgument(
            fmt::format("exitCode: must be an integer from {} to {}", kMinExitCode, kMaxExitCode));
      exit_code = static_cast<int>(it.value().get<int64_t>());
    } else if (k == "message") {
      if (!it.value().is_string()) return Status::InvalidArgument("message: must be a string");
      message = it.value().get<std::string>();
      if (message.size() > 4096) {
        // Cut on a character boundary: a continuation byte never starts the cut-off part.
        size_t cut = 4096;
        while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;
        message.resize(cut);
      }
    } else if (k == "restarts") {
      if (!InIntRange(it.value(), 0, std::numeric_limits<int>::max()))
        return Status::InvalidArgument("restarts: must be a non-negative integer");
      run = static_cast<int>(it.value().get<int64_t>());
    } else if (k == "runId") {
      if (!it.value().is_string() || it.value().get<std::string>().size() > 64)
        return Status::InvalidArgument("runId: must be a string of at most 64 characters");
      run_id = it.value().get<std::string>();
    } else if (k == "image") {
      if (!it.value().is_string()) return Status::InvalidArgument("image: must be a string");
      // "<source>@sha256:<64 hex>": shown to the job's owner and stored, so checked whole.
      const std::string text = it.value().get<std::string>();
      const size_t at = text.rfind('@');
      if (at == std::string::npos || !IsSha256Digest(std::string_view(text).substr(at + 1)) ||
          !ParseImageSource(std::string_view(text).substr(0, at)).ok())
        return Status::InvalidArgument("image: must be an image source pinned by digest (<source>@sha256:<64 hex>)");
      r.image = text;
    } else {
      return Status::InvalidArgument(k + ": unknown field (known: state, exitCode, message, restarts, runId, image" +
                                     std::string(with_ids ? ", jobId, index" : "") + ")");
    }
  }
  if (state != "running" && state != "succeeded" && state != "failed" && state != "stopped")
    return Status::InvalidArgument("state: must be running, succeeded, failed or stopped");
  return r;
}

Result<json> PoolService::ReportTask(const std::string& node, const std::string& job_id, int index,
                                     const json& body) {
  ASSIGN_OR_RETURN(TaskReport report, ParseTaskReport(job_id, index, body, /*with_ids=*/false));
  ServiceLock lock(*this);
  WriteBatch batch;
  ReportTaskOp op;
  op.node = node;
  op.report = std::move(report);
  RETURN_IF_ERROR(ApplyLocked(std::move(op), batch));
  RETURN_IF_ERROR(CommitLocked(batch));
  return TaskJson(*state_.FindJob(job_id), index);  // one task: small enough to build here
}

Result<json> PoolService::ReportTasks(const std::string& node, const json& body) {
  if (!body.is_object() || !body.contains("reports") || !body["reports"].is_array())
    return Status::InvalidArgument("reports: the body must be {\"reports\": [...]}");
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (it.key() != "reports") return Status::InvalidArgument(it.key() + ": unknown field (known: reports)");
  }
  const json& items = body["reports"];
  if (items.size() > kMaxReportsPerCall)
    return Status::InvalidArgument(fmt::format("reports: at most {} entries", kMaxReportsPerCall));
  // Every entry is checked before any is applied: a malformed one is a 400 naming it, nothing stored.
  std::vector<TaskReport> reports;
  for (size_t i = 0; i < items.size(); ++i) {
    const json& t = items[i];
    const std::string where = fmt::format("reports[{}]", i);
    if (!t.is_object() || !t.contains("jobId") || !t["jobId"].is_string() || !t.contains("index") ||
        !InIntRange(t["index"], 0, 999999))
      return Status::InvalidArgument(where + ": needs jobId (string) and index (integer, 0 to 999999)");
    auto r = ParseTaskReport(t["jobId"].get<std::string>(), static_cast<int>(t["index"].get<int64_t>()), t,
                             /*with_ids=*/true);
    if (!r.ok()) {
      // "state: must be ..." becomes "reports[1].state: must be ...": the field is named whole.
      const std::string& m = r.status().message();
      const auto colon = m.find(": ");
      if (r.status().code() == StatusCode::kInvalidArgument && colon != std::string::npos &&
          m.find(' ') > colon)
        return Status::InvalidArgument(where + "." + m);
      return r.status().WithContext(where);
    }
    reports.push_back(std::move(r).value());
  }
  // One critical section and one durable write for all; each report has its own outcome (a late
  // report of a task that moved on is that report's 409, not the others').
  ServiceLock lock(*this);
  WriteBatch batch;
  json results = json::array();
  for (const TaskReport& r : reports) {
    ReportTaskOp op;
    op.node = node;
    op.report = r;
    const Status task = ApplyLocked(std::move(op), batch);
    if (task.ok()) {
      results.push_back({{"ok", true}});
    } else {
      results.push_back({{"ok", false},
                         {"code", std::string(StatusCodeName(task.code()))},
                         {"message", task.message()}});
    }
  }
  RETURN_IF_ERROR(CommitLocked(batch));
  return json{{"results", std::move(results)}};
}

// ---- scheduling --------------------------------------------------------------------------------

}  // namespace gpupool
