#include "server/views.h"

#include <fmt/format.h>

#include <algorithm>

#include "api/jobspec.h"
#include "api/node_codec.h"
#include "server/job_list.h"
#include "server/resources_json.h"
#include "server/service_internal.h"

namespace gpupool {

using nlohmann::json;
using namespace service_internal;


PlacementSnapshot SnapshotPlacement(const PoolState& st, const Placement& p) {
  PlacementSnapshot out;
  const NodeSpec* spec = p.node < st.ledger.node_count() ? &st.ledger.spec(p.node) : nullptr;
  out.node = spec != nullptr ? spec->name : "";
  out.cpu = p.cpu;
  out.memory = p.memory;
  out.share_task = p.share_task;
  for (const GpuGrant& grant : p.gpus) {
    PlacementSnapshot::Gpu g;
    g.index = grant.gpu;
    const bool known = spec != nullptr && grant.gpu >= 0 && static_cast<size_t>(grant.gpu) < spec->gpus.size();
    if (known) g.uuid = spec->gpus[static_cast<size_t>(grant.gpu)].uuid;
    g.share = grant.share.units();
    g.memory = grant.memory;
    if (grant.mig.has_value()) {
      g.mig = grant.mig;
      const MigGeometry* geometry = GeometryOf(st.ledger, p.node, grant.gpu);
      const MigProfile* profile = geometry != nullptr ? ProfileById(*geometry, grant.mig->profile_id) : nullptr;
      if (profile != nullptr) g.mig_profile = profile->name;
    }
    out.gpus.push_back(std::move(g));
  }
  return out;
}

json PlacementView(const PlacementSnapshot& p) {
  json gpus = json::array();
  for (const PlacementSnapshot::Gpu& grant : p.gpus) {
    json g = {{"index", grant.index}, {"uuid", grant.uuid}, {"share", grant.share}, {"memory", FormatMemory(grant.memory)}};
    if (grant.mig.has_value()) {
      json mig = {{"profileId", grant.mig->profile_id}, {"start", grant.mig->start}};
      if (!grant.mig_profile.empty()) mig["profile"] = grant.mig_profile;
      g["mig"] = std::move(mig);
    }
    gpus.push_back(std::move(g));
  }
  return {{"node", p.node},
          {"cpu", FormatCpu(p.cpu)},
          {"memory", FormatMemory(p.memory)},
          {"gpus", std::move(gpus)},
          {"shareTask", p.share_task}};
}

TaskSnapshot SnapshotTask(const PoolState& st, const PoolJob& j, int index) {
  const PoolTask& ts = j.tasks[static_cast<size_t>(index)];
  TaskSnapshot t;
  t.index = index;
  t.group = j.job.groups[static_cast<size_t>(ts.group)].name;
  t.replica = ts.replica;
  t.phase = ts.phase;
  t.exit_code = ts.exit_code;
  t.restarts = ts.restarts;
  if (ts.placed) t.placement = SnapshotPlacement(st, ts.placement);
  if (ts.phase == TaskPhase::kStopping) t.stop_reason = ts.stop_reason;
  t.end_message = ts.end_message;
  t.image = ts.image;
  return t;
}

json TaskView(const TaskSnapshot& ts) {
  json t = {{"index", ts.index},        {"group", ts.group},
            {"replica", ts.replica},    {"state", TaskPhaseName(ts.phase)},
            {"exitCode", ts.exit_code}, {"restarts", ts.restarts}};
  if (ts.placement) {
    json p = PlacementView(*ts.placement);
    t["node"] = p["node"];
    t["cpu"] = p["cpu"];
    t["memory"] = p["memory"];
    t["gpus"] = p["gpus"];
  } else {
    t["node"] = "";
    t["gpus"] = json::array();
  }
  if (ts.phase == TaskPhase::kStopping) t["stopReason"] = ts.stop_reason;
  // How it ended, as its agent said ("exit code 3", "killed by SIGKILL after the grace period").
  if (!ts.end_message.empty()) t["message"] = ts.end_message;
  // A container task's image, pinned by the digest its agent unpacked.
  if (!ts.image.empty()) t["image"] = ts.image;
  return t;
}

JobSnapshot SnapshotJob(const PoolState& st, const PoolJob& j) {
  JobSnapshot out;
  out.rec = j.rec;
  out.phase = j.phase;
  out.qos = j.job.qos;
  out.task_counts = j.task_counts;
  out.tasks.reserve(j.tasks.size());
  for (size_t i = 0; i < j.tasks.size(); ++i) out.tasks.push_back(SnapshotTask(st, j, static_cast<int>(i)));
  return out;
}

json JobView(const JobSnapshot& j, int64_t now_ms) {
  json out = {{"id", j.rec.id},
              {"name", j.rec.name},
              {"tenant", j.rec.tenant},
              {"queue", j.rec.queue},
              {"priority", j.rec.priority},
              {"qos", QosClassName(j.qos)},
              {"state", JobPhaseName(j.phase)},
              {"reason", j.rec.reason},
              {"faults", j.rec.faults},
              {"createdAt", FormatTime(j.rec.created_ms)},
              {"updatedAt", FormatTime(j.rec.updated_ms)}};
  if (j.phase == JobPhase::kPending && j.rec.not_before_ms > now_ms)
    out["notBefore"] = FormatTime(j.rec.not_before_ms);
  // The spec as submitted, in its canonical JSON (stored with the job: JobSpecToJson of its Job).
  out["spec"] = json::parse(j.rec.spec_json, nullptr, /*allow_exceptions=*/false);
  out["taskCounts"] = TaskCountsJson(static_cast<int>(j.tasks.size()), j.task_counts);
  json tasks = json::array();
  for (const TaskSnapshot& t : j.tasks) tasks.push_back(TaskView(t));
  out["tasks"] = std::move(tasks);
  return out;
}

NodeSnapshot SnapshotNode(const PoolState& pool, NodeIndex n) {
  NodeSnapshot out;
  out.spec = pool.ledger.spec(n);
  out.ledger_state = pool.ledger.state(n);
  out.info = pool.nodes[n];
  out.gpu_tasks.resize(out.spec.gpus.size());
  out.mig_instances.resize(out.spec.gpus.size());
  for (size_t i = 0; i < out.spec.gpus.size(); ++i) {
    const GpuState& g = out.ledger_state.gpus[i];
    const MigGeometry* geometry = GeometryOf(pool.ledger, n, static_cast<int>(i));
    if (!g.mig_enabled || geometry == nullptr) continue;
    const MigLayout* present = pool.ledger.mig_present(n, static_cast<int>(i));
    std::vector<MigInstance> all = g.mig.instances();
    if (present != nullptr) {
      for (const MigInstance& m : present->instances())
        if (!g.mig.Contains(m)) all.push_back(m);
    }
    std::sort(all.begin(), all.end(), [](const MigInstance& a, const MigInstance& b) { return a.start < b.start; });
    json list = json::array();
    for (const MigInstance& m : all) {
      const MigProfile* profile = ProfileById(*geometry, m.profile_id);
      list.push_back({{"profile", profile != nullptr ? profile->name : ""},
                      {"profileId", m.profile_id},
                      {"start", m.start},
                      {"exists", present != nullptr && present->Contains(m)},
                      {"held", g.mig.Contains(m)}});
    }
    out.mig_instances[i] = std::move(list);
  }
  for (const auto& [job_id, index] : out.info.tasks) {
    auto it = pool.jobs.find(job_id);
    if (it == pool.jobs.end()) continue;
    const PoolTask& ts = it->second->tasks[static_cast<size_t>(index)];
    for (const GpuGrant& g : ts.placement.gpus) {
      if (g.gpu >= 0 && static_cast<size_t>(g.gpu) < out.gpu_tasks.size())
        out.gpu_tasks[static_cast<size_t>(g.gpu)].push_back(
            {{"job", job_id}, {"index", index}, {"share", g.share.units()}});
    }
  }
  return out;
}

json NodeView(const NodeSnapshot& node) {
  const NodeSpec& spec = node.spec;
  const NodeState& st = node.ledger_state;
  const PoolNode& info = node.info;
  int64_t gpu_capacity = 0;
  json gpus = json::array();
  for (size_t i = 0; i < spec.gpus.size(); ++i) {
    const GpuDevice& d = spec.gpus[i];
    const GpuState& gs = st.gpus[i];
    if (!d.mig_enabled) gpu_capacity += 1000;
    json g = {{"index", d.index},           {"uuid", d.uuid},
              {"model", d.model},           {"memory", FormatMemory(d.memory)},
              {"healthy", gs.healthy},      {"migEnabled", gs.mig_enabled},
              {"freeShare", gs.free_share}, {"freeMemory", FormatMemory(MiB(gs.free_memory))}};
    if (i < info.gpus.size()) {
      const PoolNode::GpuCondition& c = info.gpus[i];
      if (!c.fault.empty()) g["fault"] = c.fault;
      g["hot"] = c.hot;
      if (c.hot) g["hotReason"] = c.hot_reason;
      if (c.temperature_c >= 0) g["temperatureC"] = c.temperature_c;
      if (c.utilization >= 0) g["utilization"] = c.utilization;
      if (c.memory_used_fraction >= 0) g["memoryUsedFraction"] = c.memory_used_fraction;
    }
    g["tasks"] = i < node.gpu_tasks.size() ? json(node.gpu_tasks[i]) : json::array();
    if (gs.mig_enabled && i < node.mig_instances.size()) g["migInstances"] = node.mig_instances[i];
    gpus.push_back(std::move(g));
  }
  return {{"name", spec.name},
          {"state", info.state},
          {"cordoned", st.cordoned},
          {"draining", info.draining},
          {"labels", spec.labels},
          {"lastHeartbeat", FormatTime(info.last_heartbeat_ms)},
          {"capacity",
           {{"cpu", FormatCpu(spec.cpu)},
            {"memory", FormatMemory(spec.memory)},
            {"gpus", spec.gpus.size()},
            {"gpuShare", gpu_capacity}}},
          {"free",
           {{"cpu", FormatCpu(MilliCpu(st.free_cpu))},
            {"memory", FormatMemory(MiB(st.free_memory))},
            {"gpuShare", st.free_gpu_share}}},
          {"tasks", info.tasks.size()},
          {"gpus", std::move(gpus)},
          {"spec", info.spec_json}};
}

}  // namespace gpupool
