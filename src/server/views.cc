#include "server/views.h"

#include <fmt/format.h>

#include <map>

#include "api/node_codec.h"
#include "server/job_list.h"
#include "server/resources_json.h"
#include "server/service_internal.h"

namespace gpupool {

using nlohmann::json;
using namespace service_internal;

json TaskView(const PoolState& st, const PoolJob& j, int index) {
  const PoolTask& ts = j.tasks[static_cast<size_t>(index)];
  const TaskGroup& g = j.job.groups[static_cast<size_t>(ts.group)];
  json t = {{"index", index},           {"group", g.name},
            {"replica", ts.replica},    {"state", TaskPhaseName(ts.phase)},
            {"exitCode", ts.exit_code}, {"restarts", ts.restarts}};
  if (ts.placed) {
    json p = PlacementToJson(ts.placement, st.ledger);
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
  return t;
}

json JobView(const PoolState& st, const PoolJob& j, int64_t now_ms) {
  json out = {{"id", j.rec.id},
              {"name", j.rec.name},
              {"tenant", j.rec.tenant},
              {"queue", j.rec.queue},
              {"priority", j.rec.priority},
              {"qos", QosClassName(j.job.qos)},
              {"state", JobPhaseName(j.phase)},
              {"reason", j.rec.reason},
              {"faults", j.rec.faults},
              {"createdAt", FormatTime(j.rec.created_ms)},
              {"updatedAt", FormatTime(j.rec.updated_ms)}};
  if (j.phase == JobPhase::kPending && j.rec.not_before_ms > now_ms)
    out["notBefore"] = FormatTime(j.rec.not_before_ms);
  out["spec"] = JobSpecToJson(j.job);
  out["taskCounts"] = TaskCountsJson(static_cast<int>(j.tasks.size()), j.task_counts);
  json tasks = json::array();
  for (size_t i = 0; i < j.tasks.size(); ++i) tasks.push_back(TaskView(st, j, static_cast<int>(i)));
  out["tasks"] = std::move(tasks);
  return out;
}

json NodeView(const PoolState& pool, NodeIndex n) {
  const NodeSpec& spec = pool.ledger.spec(n);
  const NodeState& st = pool.ledger.state(n);
  const PoolNode& info = pool.nodes[n];
  int64_t gpu_capacity = 0;
  json gpus = json::array();
  std::map<int, json> gpu_tasks;
  for (const auto& [job_id, index] : info.tasks) {
    auto it = pool.jobs.find(job_id);
    if (it == pool.jobs.end()) continue;
    const PoolTask& ts = it->second->tasks[static_cast<size_t>(index)];
    for (const GpuGrant& g : ts.placement.gpus) {
      gpu_tasks[g.gpu].push_back({{"job", job_id}, {"index", index}, {"share", g.share.units()}});
    }
  }
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
    auto it = gpu_tasks.find(static_cast<int>(i));
    g["tasks"] = it == gpu_tasks.end() ? json::array() : it->second;
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
