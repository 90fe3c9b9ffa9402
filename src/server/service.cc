// PoolService: opening, the job and task lifecycle (phases, stops, releases, faults, GPU
// reports), durable commits and the watchers they wake. Recovery from the store is in
// service_recover.cc. The other service_*.cc files
// hold the rest of the class (see service_internal.h).
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
#include "server/hotspots.h"
#include "server/resources_json.h"
#include "server/timeouts.h"
#include "server/service_internal.h"

namespace gpupool {

using nlohmann::json;
using namespace service_internal;

static_assert(static_cast<int>(TaskPhase::kPreempted) + 1 == kTaskPhaseCount);

PoolService::PoolService(ServerConfig config, std::unique_ptr<Store> store)
    : config_(std::move(config)), store_(std::move(store)) {
  committer_ = std::make_unique<GroupCommitter>(*store_);
}

PoolService::~PoolService() {
  Stop();
}

int64_t PoolService::NowMs() const {
  if (config_.wall_clock_ms) return config_.wall_clock_ms();
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double PoolService::MonoNow() const {
  if (config_.mono_clock_s) return config_.mono_clock_s();
  return MonoSeconds();
}

Result<std::unique_ptr<PoolService>> PoolService::Open(ServerConfig config, std::unique_ptr<Store> store) {
  std::unique_ptr<PoolService> svc(new PoolService(std::move(config), std::move(store)));
  svc->run_token_ = RandomHex(8);
  svc->node_watches_.emplace(svc->run_token_, kMaxWatchesPerKey);
  svc->job_watches_.emplace(svc->run_token_, kMaxWatchesPerKey);
  svc->disk_guard_ = std::make_unique<DiskGuard>(svc->config_.data_dir.empty() ? "." : svc->config_.data_dir,
                                                 svc->config_.store_min_free_bytes, svc->config_.free_space_probe);
  std::lock_guard<std::mutex> lock(svc->mu_);
  RETURN_IF_ERROR(svc->Recover());
  return svc;
}

// ---- helpers -----------------------------------------------------------------------------------

Result<PoolService::JobState*> PoolService::VisibleJob(const Principal& who, const std::string& id) {
  if (who.role == Role::kAgent || who.role == Role::kNode)
    return Status::PermissionDenied("agent tokens cannot read jobs");
  JobState* j = state_.FindJob(id);
  // Another tenant's job looks exactly like a missing one.
  if (j == nullptr || (who.role == Role::kTenant && j->rec.tenant != who.tenant))
    return Status::NotFound(fmt::format("job '{}' not found", id));
  return j;
}

void PoolService::PutJobOps(JobState& j, WriteBatch& batch) {
  job_watches_->Changed(j.rec.id);
  j.rec.state = std::string(JobPhaseName(j.phase));
  j.rec.updated_ms = NowMs();
  batch.Add(PutJob{j.rec});
}

void PoolService::PutTaskOp(const JobState& j, int index, WriteBatch& batch) {
  job_watches_->Changed(j.rec.id);
  const TaskState& ts = j.tasks[static_cast<size_t>(index)];
  TaskRecord r;
  r.job_id = j.rec.id;
  r.index = index;
  r.state = std::string(TaskPhaseName(ts.phase));
  if (ts.placed) {
    r.node = state_.ledger.spec(ts.placement.node).name;
    r.placement_json = PlacementToJson(ts.placement, state_.ledger).dump();
  } else {
    r.node = ts.last_node;  // a finished task remembers where it ran; only live tasks have a placement
  }
  r.exit_code = ts.exit_code;
  r.restarts = ts.restarts;
  r.updated_ms = ts.updated_ms;
  r.run_id = ts.run_id;
  r.message = ts.end_message;
  r.stop_reason = ts.stop_reason;
  if (ts.phase == TaskPhase::kStopping) r.stop_outcome = std::string(TaskPhaseName(ts.stop_outcome));
  batch.Add(PutTask{r});
}

void PoolService::Event(const std::string& job_id, const std::string& type, const std::string& message,
                        WriteBatch& batch) {
  EventRecord e;
  e.job_id = job_id;
  e.time_ms = NowMs();
  e.type = type;
  e.message = message;
  batch.Add(AppendEvent{e});
}

Status PoolService::CommitLocked(WriteBatch& batch) {
  if (batch.empty()) return Status::Ok();
  Status st = committer_->Commit(std::move(batch));
  batch = WriteBatch{};
  if (!st.ok()) FailStop(st);
  // Batches are written in the order they were enqueued: with this one, every change made before
  // it (the loop's last cycle too) is durable.
  if (st.ok()) NotifyWatchersLocked();
  return st;
}

json PoolService::AgentFeatures() {
  // What agents may use beyond the basic protocol: long polls on assignments, batched reports.
  return json::array({"watch", "reports"});
}

void PoolService::NotifyWatchersLocked() {
  node_watches_->Flush([this](const NodeIndex& n) -> std::optional<json> { return AssignmentsJsonLocked(n); },
                       json::object());
  job_watches_->Flush(
      [this](const std::string& id) -> std::optional<json> {
        const JobState* j = state_.FindJob(id);
        if (j == nullptr) return std::nullopt;
        return JobJson(*j);
      },
      GoneJob());
}

void PoolService::ReleaseWatchers() {
  std::lock_guard<std::mutex> lock(mu_);
  node_watches_->ReleaseAll([this](const NodeIndex& n) -> std::optional<json> { return AssignmentsJsonLocked(n); },
                            json::object());
  job_watches_->ReleaseAll(
      [this](const std::string& id) -> std::optional<json> {
        const JobState* j = state_.FindJob(id);
        if (j == nullptr) return std::nullopt;
        return JobJson(*j);
      },
      GoneJob());
}

void PoolService::ReleaseTask(JobState& j, int index, bool agent_ended_it) {
  TaskState& ts = j.tasks[static_cast<size_t>(index)];
  if (!ts.placed) return;
  (void)state_.ledger.Release(ts.allocation);
  state_.nodes[ts.placement.node].tasks.erase({j.rec.id, index});
  if (!agent_ended_it) MarkAssignmentsChanged(ts.placement.node);
  Resources& u = state_.usage[{j.rec.tenant, j.rec.queue}];
  u -= TaskDemand(j.job.groups[static_cast<size_t>(ts.group)].request);
  ts.placed = false;
  ts.allocation = 0;
  ++state_.capacity_epoch;
  wake_pending_ = true;
  wake_.notify_one();
}

void PoolService::StopTask(JobState& j, int index, TaskPhase outcome, const std::string& reason,
                           WriteBatch& batch) {
  TaskState& ts = j.tasks[static_cast<size_t>(index)];
  const int64_t now = NowMs();
  if (ts.phase == TaskPhase::kPending) {
    state_.SetTaskPhase(j, ts, outcome == TaskPhase::kPreempted ? TaskPhase::kPending : outcome);
    ts.updated_ms = now;
    PutTaskOp(j, index, batch);
    return;
  }
  if (!IsLive(ts.phase)) return;
  state_.stopping_jobs.insert(j.rec.id);
  if (ts.phase != TaskPhase::kStopping) {
    state_.SetTaskPhase(j, ts, TaskPhase::kStopping);
    MarkAssignmentsChanged(ts.placement.node);
    ts.stop_deadline_ms = now + 1000LL * (config_.grace_period_seconds + config_.heartbeat_timeout_seconds);
  }
  ts.stop_outcome = outcome;
  ts.stop_reason = reason;
  ts.updated_ms = now;
  PutTaskOp(j, index, batch);
}

void PoolService::FailJob(JobState& j, const std::string& reason, WriteBatch& batch) {
  state_.SetJobPhase(j, JobPhase::kFailed);
  j.rec.reason = reason;
  for (size_t i = 0; i < j.tasks.size(); ++i)
    StopTask(j, static_cast<int>(i), TaskPhase::kCancelled, "job failed", batch);
  state_.pending.erase(j.rec.seq);
  state_.partial.erase(j.rec.seq);
  ++metrics_.finished["failed"];
  Event(j.rec.id, "Failed", j.rec.reason, batch);
  PutJobOps(j, batch);
}

// A task of `j` ended (finished, failed, or stopped). Decides what happens to the job.
void PoolService::AfterTaskEnded(JobState& j, WriteBatch& batch) {
  bool any_live = false, any_failed = false, any_preempted = false, any_pending = false;
  int failed_index = -1;
  for (size_t i = 0; i < j.tasks.size(); ++i) {
    const TaskState& ts = j.tasks[i];
    any_live |= IsLive(ts.phase);
    any_pending |= ts.phase == TaskPhase::kPending;
    any_preempted |= ts.phase == TaskPhase::kPreempted;
    if (ts.phase == TaskPhase::kFailed && failed_index < 0) {
      any_failed = true;
      failed_index = static_cast<int>(i);
    }
  }
  if (IsTerminal(j.phase)) {
    PutJobOps(j, batch);
    return;
  }
  const int64_t now = NowMs();
  if (any_failed) {
    // One failed task fails the gang: stop the rest.
    const TaskState& f = j.tasks[static_cast<size_t>(failed_index)];
    const auto& g = j.job.groups[static_cast<size_t>(f.group)];
    std::string reason = fmt::format("task {}[{}] failed", g.name, f.replica);
    const std::string plain = fmt::format("exit code {}", f.exit_code);
    if (f.exit_code != 0 || f.end_message.empty()) reason += " with " + plain;
    if (!f.end_message.empty() && f.end_message != plain) reason += ": " + f.end_message;
    if (j.job.retry.on_failure)
      reason += fmt::format("; gave up after {} restart(s) (retry.maxRestarts {})", j.rec.faults,
                            j.job.retry.max_restarts);
    FailJob(j, reason, batch);
    return;
  }
  if (any_live) {
    PutJobOps(j, batch);
    return;
  }
  if (any_preempted) {
    // Every task has stopped: the job goes back to its queue, to restart from its checkpoint.
    for (const TaskState& ts : j.tasks) {
      if (ts.phase == TaskPhase::kPreempted && !ts.stop_reason.empty()) {
        j.rec.reason = ts.stop_reason;
        break;
      }
    }
    j.pending_message = j.rec.reason;
    for (size_t i = 0; i < j.tasks.size(); ++i) {
      TaskState& ts = j.tasks[i];
      // Every task that was placed runs again as a new run (its agent tells runs apart by this).
      if (ts.phase != TaskPhase::kPending) ++ts.restarts;
      state_.SetTaskPhase(j, ts, TaskPhase::kPending);
      ts.updated_ms = now;
      PutTaskOp(j, static_cast<int>(i), batch);
    }
    state_.SetJobPhase(j, JobPhase::kPending);
    j.pending_since_ms = now;
    j.submit_mono = MonoNow();
    state_.pending.insert(j.rec.seq);
    state_.partial.erase(j.rec.seq);
    Event(j.rec.id, "Requeued", "every task stopped; queued again (" + j.rec.reason + ")", batch);
    PutJobOps(j, batch);
    return;
  }
  if (any_pending) {
    PutJobOps(j, batch);
    return;
  }
  state_.SetJobPhase(j, JobPhase::kSucceeded);
  j.rec.reason = "every task exited 0";
  ++metrics_.finished["succeeded"];
  Event(j.rec.id, "Succeeded", "every task exited 0", batch);
  PutJobOps(j, batch);
}

void PoolService::ExpireStops(WriteBatch& batch) {
  const int64_t now = NowMs();
  // Jobs no longer stopping anything leave the list.
  for (auto sit = state_.stopping_jobs.begin(); sit != state_.stopping_jobs.end();) {
    const JobState* jp = state_.FindJob(*sit);
    bool still = false;
    if (jp != nullptr) {
      for (const TaskState& ts : jp->tasks) still |= ts.phase == TaskPhase::kStopping;
    }
    sit = still ? std::next(sit) : state_.stopping_jobs.erase(sit);
  }
  for (const OverdueStops& due : OverdueStopsAt(state_, now)) {
    JobState& j = *state_.FindJob(due.job_id);
    for (int i : due.tasks) {
      TaskState& ts = j.tasks[static_cast<size_t>(i)];
      ReleaseTask(j, i);
      state_.SetTaskPhase(j, ts, ts.stop_outcome);
      ts.updated_ms = now;
      PutTaskOp(j, i, batch);
      Event(j.rec.id, "TaskFinished",
            fmt::format("task {} did not confirm its stop in time; released ({})", i, ts.stop_reason), batch);
    }
    AfterTaskEnded(j, batch);
  }
}

void PoolService::FaultJob(JobState& j, const std::string& cause, const std::string& reason,
                           WriteBatch& batch) {
  if (IsTerminal(j.phase)) return;
  bool stopping_already = false;
  for (const TaskState& ts : j.tasks) stopping_already |= ts.phase == TaskPhase::kStopping;
  // A job already on its way out (cancelled, failed, moved) is not restarted twice for one stop.
  if (stopping_already && j.phase != JobPhase::kRunning) return;
  const int64_t now = NowMs();
  ++metrics_.faults[cause];
  if (j.rec.faults >= j.job.retry.max_restarts) {
    FailJob(j,
            fmt::format("{}; gave up after {} restart(s) (retry.maxRestarts {})", reason, j.rec.faults,
                        j.job.retry.max_restarts),
            batch);
    return;
  }
  ++j.rec.faults;
  const int64_t wait = j.job.retry.BackoffSeconds(j.rec.faults);
  j.rec.not_before_ms = now + 1000 * wait;
  for (size_t i = 0; i < j.tasks.size(); ++i)
    StopTask(j, static_cast<int>(i), TaskPhase::kPreempted, reason, batch);
  Event(j.rec.id, "Fault",
        fmt::format("{}: the job restarts from its checkpoint (restart {} of {}{})", reason, j.rec.faults,
                    j.job.retry.max_restarts, wait > 0 ? fmt::format(", after {} s", wait) : ""),
        batch);
  PutJobOps(j, batch);
}

void PoolService::CheckNodes(WriteBatch& batch) {
  const int64_t now = NowMs();
  const double mono = MonoNow();
  for (const SilentNode& silent : SilentNodes(state_, mono, config_.heartbeat_timeout_seconds)) {
    const NodeIndex n = silent.node;
    NodeInfo& info = state_.nodes[n];
    const std::string& name = state_.ledger.spec(n).name;
    info.state = "lost";
    ++metrics_.nodes_lost;
    const std::string reason = fmt::format("node {} lost (no heartbeat for {:.1f} s)", name, silent.silent_s);
    batch.Add(PutNode{MakeNodeRecord(name, info.spec_json, state_.ledger.state(n).cordoned, info.draining,
                                     info.state, info.last_heartbeat_ms)});
    Event("", "NodeLost", reason, batch);
    // The node's agent fenced its tasks before this timeout (it could not renew its lease), so they
    // are released at once and their jobs restart elsewhere.
    std::set<std::string> job_ids;
    for (const auto& [job_id, index] : info.tasks) job_ids.insert(job_id);
    for (const std::string& job_id : job_ids) {
      JobState* j = state_.FindJob(job_id);
      if (j == nullptr) continue;
      std::vector<int> released;
      for (size_t i = 0; i < j->tasks.size(); ++i) {
        TaskState& ts = j->tasks[i];
        if (!IsLive(ts.phase) || !ts.placed || ts.placement.node != n) continue;
        const TaskPhase outcome = ts.phase == TaskPhase::kStopping ? ts.stop_outcome : TaskPhase::kPreempted;
        ReleaseTask(*j, static_cast<int>(i));
        state_.SetTaskPhase(*j, ts, outcome);
        // A running job restarts because of this loss: it is the reason its requeue shows.
        if (outcome == TaskPhase::kPreempted && (ts.stop_reason.empty() || j->phase == JobPhase::kRunning))
          ts.stop_reason = reason;
        ts.updated_ms = now;
        PutTaskOp(*j, static_cast<int>(i), batch);
        released.push_back(static_cast<int>(i));
      }
      Event(job_id, "NodeLost", fmt::format("{}; task(s) {} released", reason, fmt::join(released, ", ")),
            batch);
      if (j->phase == JobPhase::kRunning) FaultJob(*j, "node_lost", reason, batch);
      AfterTaskEnded(*j, batch);
    }
  }
}

std::vector<PoolService::JobState*> PoolService::JobsOnGpu(NodeIndex n, int gpu) {
  std::vector<JobState*> out;
  for (const auto& [job_id, index] : state_.nodes[n].tasks) {
    JobState* j = state_.FindJob(job_id);
    if (j == nullptr) continue;
    const TaskState& ts = j->tasks[static_cast<size_t>(index)];
    if (!IsLive(ts.phase)) continue;
    for (const GpuGrant& g : ts.placement.gpus) {
      if (g.gpu == gpu && std::find(out.begin(), out.end(), j) == out.end()) out.push_back(j);
    }
  }
  return out;
}

void PoolService::UpdateGpuUsable(NodeIndex n, int gpu) {
  const NodeInfo::GpuCondition& c = state_.nodes[n].gpus[static_cast<size_t>(gpu)];
  const bool usable = c.fault.empty() && !c.hot;
  if (state_.ledger.state(n).gpus[static_cast<size_t>(gpu)].healthy == usable) return;
  (void)state_.ledger.SetGpuHealthy(n, gpu, usable);
  if (usable) {
    ++state_.capacity_epoch;
    wake_pending_ = true;
    wake_.notify_one();
  }
}

void PoolService::ApplyGpuReports(NodeIndex n, const std::vector<GpuReport>& reports, WriteBatch& batch) {
  NodeInfo& info = state_.nodes[n];
  const NodeSpec& spec = state_.ledger.spec(n);
  info.gpus.resize(spec.gpus.size());
  const int64_t now = NowMs();
  const auto& hs = config_.hotspot;
  for (const GpuReport& r : reports) {
    if (r.index < 0 || static_cast<size_t>(r.index) >= info.gpus.size()) continue;
    NodeInfo::GpuCondition& c = info.gpus[static_cast<size_t>(r.index)];
    const std::string where = fmt::format("GPU {} on {}", r.index, spec.name);
    // Faults: an unhealthy GPU takes no placements; its jobs stop and restart elsewhere.
    if (!r.healthy && c.fault.empty()) {
      c.fault = r.reason.empty() ? "unhealthy" : r.reason;
      UpdateGpuUsable(n, r.index);
      const std::string reason = fmt::format("{} failed: {}", where, c.fault);
      Event("", "GpuFault", reason, batch);
      for (JobState* j : JobsOnGpu(n, r.index)) FaultJob(*j, "gpu_fault", reason, batch);
    } else if (r.healthy && !c.fault.empty()) {
      Event("", "GpuRecovered", fmt::format("{} is healthy again (was: {})", where, c.fault), batch);
      c.fault.clear();
      UpdateGpuUsable(n, r.index);
    }
    // Hot spots (hotspots.h): a GPU that turned hot takes no placements and its best-effort jobs
    // move; one that cooled takes placements again.
    const GpuSample sample{r.temperature_c, r.utilization, r.memory_used_fraction};
    switch (ObserveGpuSample(hs, sample, now, c)) {
      case HotSpotChange::kNone:
        break;
      case HotSpotChange::kTurnedHot:
        UpdateGpuUsable(n, r.index);
        Event("", "GpuHot", fmt::format("{} is hot: {}; no new placements", where, c.hot_reason), batch);
        if (hs.migrate) MigrateOffHotGpu(n, r.index, fmt::format("migrated off hot {} ({})", where, c.hot_reason), batch);
        break;
      case HotSpotChange::kCooled:
        Event("", "GpuCooled",
              fmt::format("{} has been under the hot-spot thresholds for {} s; placements again", where,
                          (now - c.under_since_ms) / 1000),
              batch);
        UpdateGpuUsable(n, r.index);
        break;
    }
  }
}

void PoolService::MigrateOffHotGpu(NodeIndex n, int gpu, const std::string& reason, WriteBatch& batch) {
  for (JobState* j : JobsOnGpu(n, gpu)) {
    if (j->job.qos != QosClass::kBestEffort || j->phase != JobPhase::kRunning) continue;
    bool stopping = false;
    for (const TaskState& ts : j->tasks) stopping |= ts.phase == TaskPhase::kStopping;
    if (stopping) continue;
    ++metrics_.hotspot_migrations;
    for (size_t i = 0; i < j->tasks.size(); ++i) StopTask(*j, static_cast<int>(i), TaskPhase::kPreempted, reason, batch);
    Event(j->rec.id, "Migrating", reason + ": the job stops, checkpoints and restarts elsewhere", batch);
  }
}

}  // namespace gpupool
