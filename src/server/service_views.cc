// PoolService, what it shows: the JSON views (built by views.h from the state) with what only the
// service knows (watch versions, the clock), health, the Prometheus text and GPU usage.
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
#include "server/views.h"

namespace gpupool {

using nlohmann::json;
using namespace service_internal;




json PoolService::TaskJson(const JobState& j, int index) const { return TaskView(state_, j, index); }

json PoolService::JobAnswer(const JobSnapshot& snap, const std::string& version) const {
  json out = JobView(snap, NowMs());
  // For GET /api/v1/jobs/{id}?wait=S&since=VERSION.
  out["version"] = version;
  return out;
}

json PoolService::JobJson(const JobState& j) const {
  json out = JobView(state_, j, NowMs());
  // For GET /api/v1/jobs/{id}?wait=S&since=VERSION.
  out["version"] = job_watches_->Version(j.rec.id);
  return out;
}

json PoolService::NodeJson(NodeIndex n) const { return NodeView(state_, n); }

json PoolService::QueueJson(const QueueSpec& q) const {
  return QueueSpecJson(q);
}

// ---- jobs --------------------------------------------------------------------------------------

json PoolService::Health() {
  ServiceLock lock(*this);
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
  ServiceLock lock(*this);
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
  ServiceLock lock(*this);
  return CheckInvariantsLocked();
}

std::vector<PoolService::GpuUse> PoolService::GpuUsage() {
  ServiceLock lock(*this);
  return state_.GpuUsage();
}

}  // namespace gpupool
