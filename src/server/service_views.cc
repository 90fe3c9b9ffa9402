// PoolService, what it shows: the JSON views of tasks, jobs, nodes and queues, health, the
// Prometheus text, the invariant check and GPU usage.
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

#include "api/node_codec.h"
#include "config/profile_yaml.h"
#include "sched/preemption.h"
#include "sched/registry.h"
#include "sched/typical_pods.h"
#include "server/resources_json.h"
#include "server/service_internal.h"

namespace gpupool {

using nlohmann::json;
using namespace service_internal;

json PoolService::TaskJson(const JobState& j, int index) const {
  const TaskState& ts = j.tasks[static_cast<size_t>(index)];
  const TaskGroup& g = j.job.groups[static_cast<size_t>(ts.group)];
  json t = {{"index", index},           {"group", g.name},
            {"replica", ts.replica},    {"state", TaskPhaseName(ts.phase)},
            {"exitCode", ts.exit_code}, {"restarts", ts.restarts}};
  if (ts.placed) {
    json p = PlacementToJson(ts.placement, state_.ledger);
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

json PoolService::JobJson(const JobState& j) const {
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
  if (j.phase == JobPhase::kPending && j.rec.not_before_ms > NowMs())
    out["notBefore"] = FormatTime(j.rec.not_before_ms);
  out["spec"] = JobSpecToJson(j.job);
  out["taskCounts"] = TaskCountsJson(static_cast<int>(j.tasks.size()), j.task_counts);
  json tasks = json::array();
  for (size_t i = 0; i < j.tasks.size(); ++i) tasks.push_back(TaskJson(j, static_cast<int>(i)));
  out["tasks"] = std::move(tasks);
  // For GET /api/v1/jobs/{id}?wait=S&since=VERSION.
  out["version"] = job_watches_->Version(j.rec.id);
  return out;
}

json PoolService::NodeJson(NodeIndex n) const {
  const NodeSpec& spec = state_.ledger.spec(n);
  const NodeState& st = state_.ledger.state(n);
  const NodeInfo& info = state_.nodes[n];
  int64_t gpu_capacity = 0;
  json gpus = json::array();
  std::map<int, json> gpu_tasks;
  for (const auto& [job_id, index] : info.tasks) {
    auto it = state_.jobs.find(job_id);
    if (it == state_.jobs.end()) continue;
    const TaskState& ts = it->second->tasks[static_cast<size_t>(index)];
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
      const NodeInfo::GpuCondition& c = info.gpus[i];
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

json PoolService::QueueJson(const QueueSpec& q) const {
  return QueueSpecJson(q);
}

// ---- jobs --------------------------------------------------------------------------------------

json PoolService::Health() {
  std::lock_guard<std::mutex> lock(mu_);
  json disk = disk_guard_->Health();
  const bool disk_ok = disk.value("ok", true);
  json h = {{"status", disk_ok ? "ok" : "degraded"},
            {"nodes", state_.ledger.node_count()},
            {"jobs",
             {{"pending", state_.job_phase_count[static_cast<size_t>(JobPhase::kPending)]},
              {"running", state_.job_phase_count[static_cast<size_t>(JobPhase::kRunning)]}}},
            {"store", {{"disk", std::move(disk)}}}};
  if (!disk_ok) h["reason"] = disk_guard_->Check().message();
  return h;
}

Status PoolService::CheckStoreSpace() { return disk_guard_->Check(); }

std::string PoolService::MetricsText() {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, int> by_state;
  std::map<std::string, int> pending_by_queue, running_by_queue;
  std::map<std::string, int> pending_by_reason;
  for (const auto& q : order_->options().queues) {
    pending_by_queue[q.name] = 0;
    running_by_queue[q.name] = 0;
  }
  for (const auto& [seq, j] : state_.by_seq) {
    ++by_state[std::string(JobPhaseName(j->phase))];
    if (j->phase == JobPhase::kPending) {
      ++pending_by_queue[j->rec.queue];
      std::string reason = "not tried yet";
      if (!j->waiting_for.empty()) {
        reason = "waiting for preempted jobs";
      } else if (!j->diagnosis.reasons.empty()) {
        reason = j->diagnosis.reasons.front().first;
      } else if (!j->pending_message.empty()) {
        reason = "other";
      }
      ++pending_by_reason[reason];
    } else if (j->phase == JobPhase::kRunning) {
      ++running_by_queue[j->rec.queue];
    }
  }
  RenderHeader("gpupool_jobs", "gauge", "Jobs by state.", out);
  for (const char* s : {"pending", "running", "succeeded", "failed", "cancelled"})
    RenderSample("gpupool_jobs", {{"state", s}}, by_state[s], out);
  RenderHeader("gpupool_queue_pending_jobs", "gauge", "Pending jobs per queue.", out);
  for (const auto& [q, n] : pending_by_queue)
    RenderSample("gpupool_queue_pending_jobs", {{"queue", q}}, n, out);
  RenderHeader("gpupool_queue_running_jobs", "gauge", "Running jobs per queue.", out);
  for (const auto& [q, n] : running_by_queue)
    RenderSample("gpupool_queue_running_jobs", {{"queue", q}}, n, out);
  RenderHeader("gpupool_pending_jobs_by_reason", "gauge",
               "Pending jobs by the most common reason their first unplaced task does not fit.", out);
  for (const auto& [r, n] : pending_by_reason)
    RenderSample("gpupool_pending_jobs_by_reason", {{"reason", r}}, n, out);

  int64_t total_gpu = 0, total_cpu = 0, total_mem = 0;
  for (NodeIndex n = 0; n < state_.ledger.node_count(); ++n) {
    const NodeSpec& s = state_.ledger.spec(n);
    total_cpu += s.cpu.units();
    total_mem += s.memory.units();
    for (const auto& g : s.gpus) total_gpu += g.mig_enabled ? 0 : 1000;
  }
  std::map<std::string, Resources> used_by_queue;
  for (const auto& q : order_->options().queues) used_by_queue[q.name] = Resources{};
  for (const auto& [key, r] : state_.usage) used_by_queue[key.second] += r;
  RenderHeader("gpupool_queue_gpu_allocated", "gauge",
               "GPUs (fractional) held by each queue's running tasks.", out);
  for (const auto& [q, r] : used_by_queue)
    RenderSample("gpupool_queue_gpu_allocated", {{"queue", q}}, r.gpu / 1000.0, out);
  RenderHeader("gpupool_queue_gpu_allocated_ratio", "gauge",
               "Share of the pool's GPUs held by each queue (0..1).", out);
  for (const auto& [q, r] : used_by_queue)
    RenderSample("gpupool_queue_gpu_allocated_ratio", {{"queue", q}},
                 total_gpu > 0 ? static_cast<double>(r.gpu) / static_cast<double>(total_gpu) : 0.0, out);
  RenderHeader("gpupool_queue_gpu_guaranteed", "gauge", "GPUs guaranteed to each queue.", out);
  for (const auto& q : order_->options().queues)
    RenderSample("gpupool_queue_gpu_guaranteed", {{"queue", q.name}}, q.guaranteed.gpu / 1000.0, out);
  RenderHeader("gpupool_pool_gpus", "gauge", "GPUs in the pool (non-MIG GPUs, whole).", out);
  RenderSample("gpupool_pool_gpus", {}, total_gpu / 1000.0, out);
  RenderHeader("gpupool_pool_gpu_allocated", "gauge", "GPUs (fractional) allocated in the pool.", out);
  RenderSample("gpupool_pool_gpu_allocated", {}, state_.ledger.used_gpu_share() / 1000.0, out);
  RenderHeader("gpupool_pool_cpu_cores", "gauge", "CPU cores in the pool.", out);
  RenderSample("gpupool_pool_cpu_cores", {}, total_cpu / 1000.0, out);
  RenderHeader("gpupool_pool_memory_bytes", "gauge", "Memory in the pool.", out);
  RenderSample("gpupool_pool_memory_bytes", {}, static_cast<double>(total_mem) * 1048576.0, out);
  std::map<std::string, int> nodes_by_state;
  int cordoned = 0;
  for (NodeIndex n = 0; n < state_.ledger.node_count(); ++n) {
    ++nodes_by_state[state_.nodes[n].state];
    cordoned += state_.ledger.state(n).cordoned;
  }
  RenderHeader("gpupool_nodes", "gauge", "Registered nodes by state.", out);
  for (const char* s : {"ready", "lost"})
    RenderSample("gpupool_nodes", {{"state", s}}, nodes_by_state[s], out);
  RenderHeader("gpupool_nodes_cordoned", "gauge", "Nodes that take no new placements.", out);
  RenderSample("gpupool_nodes_cordoned", {}, cordoned, out);

  RenderHeader("gpupool_jobs_submitted_total", "counter", "Jobs accepted since the server started.", out);
  RenderSample("gpupool_jobs_submitted_total", {}, static_cast<double>(metrics_.submitted), out);
  RenderHeader("gpupool_placements_total", "counter", "Jobs placed since the server started.", out);
  RenderSample("gpupool_placements_total", {}, static_cast<double>(metrics_.placements), out);
  RenderHeader("gpupool_task_placements_total", "counter", "Tasks placed since the server started.", out);
  RenderSample("gpupool_task_placements_total", {}, static_cast<double>(metrics_.task_placements), out);
  RenderHeader("gpupool_preemptions_total", "counter", "Jobs preempted since the server started.", out);
  RenderSample("gpupool_preemptions_total", {}, static_cast<double>(metrics_.preemptions), out);
  RenderHeader("gpupool_scheduling_cycles_total", "counter", "Scheduling cycles run.", out);
  RenderSample("gpupool_scheduling_cycles_total", {}, static_cast<double>(metrics_.cycles), out);
  RenderHeader("gpupool_jobs_finished_total", "counter", "Jobs that reached an end state, by state.", out);
  for (const char* s : {"succeeded", "failed", "cancelled"})
    RenderSample("gpupool_jobs_finished_total", {{"state", s}}, static_cast<double>(metrics_.finished[s]),
                 out);
  RenderHeader("gpupool_jobs_removed_total", "counter",
               "Finished jobs removed with their tasks and events after store.finishedJobRetentionSeconds.",
               out);
  RenderSample("gpupool_jobs_removed_total", {}, static_cast<double>(metrics_.jobs_removed), out);
  RenderHeader("gpupool_fault_restarts_total", "counter",
               "Faults that stopped a job (each restarts it or, over its retry budget, fails it), by cause.",
               out);
  for (const char* c : {"node_lost", "gpu_fault", "task_failed", "task_stopped"})
    RenderSample("gpupool_fault_restarts_total", {{"cause", c}}, static_cast<double>(metrics_.faults[c]),
                 out);
  RenderHeader("gpupool_nodes_lost_total", "counter", "Nodes declared lost (no heartbeat for the timeout).",
               out);
  RenderSample("gpupool_nodes_lost_total", {}, static_cast<double>(metrics_.nodes_lost), out);
  RenderHeader("gpupool_hotspot_migrations_total", "counter", "Best-effort jobs moved off a hot GPU.", out);
  RenderSample("gpupool_hotspot_migrations_total", {}, static_cast<double>(metrics_.hotspot_migrations), out);
  int faulty = 0, hot = 0;
  for (const NodeInfo& info : state_.nodes) {
    for (const auto& c : info.gpus) {
      faulty += !c.fault.empty();
      hot += c.hot;
    }
  }
  RenderHeader("gpupool_gpus_unusable", "gauge", "GPUs that take no new placements, by cause.", out);
  RenderSample("gpupool_gpus_unusable", {{"cause", "fault"}}, faulty, out);
  RenderSample("gpupool_gpus_unusable", {{"cause", "hot"}}, hot, out);
  metrics_.scheduling_latency.Render("gpupool_scheduling_latency_seconds",
                                     "Time from submission (or requeue) to placement, per job.", out);
  metrics_.cycle_duration.Render("gpupool_scheduling_cycle_seconds", "Duration of one scheduling cycle.",
                                 out);
  return out;
}

Status PoolService::CheckInvariants() {
  std::lock_guard<std::mutex> lock(mu_);
  return CheckInvariantsLocked();
}

std::vector<PoolService::GpuUse> PoolService::GpuUsage() {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.GpuUsage();
}

}  // namespace gpupool
