// PoolService, the scheduling loop and its controllers: the cycle (queue order, the placement
// pipeline, gang placement), preemption, backfill reservations, node timeouts, overdue stops and
// retention. Each reads the state and applies what it decides as operations (operations.h); none
// touches the store or HTTP. Runs on the loop thread.
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
#include "server/retention.h"
#include "server/timeouts.h"
#include "server/service_internal.h"

namespace gpupool {

using nlohmann::json;
using namespace service_internal;

void PoolService::Start() {
  if (loop_.joinable()) return;
  stopping_ = false;
  loop_ = std::thread([this] { Loop(); });
}

void PoolService::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    wake_.notify_all();
  }
  if (loop_.joinable()) loop_.join();
}

void PoolService::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    wake_.wait_for(lock, std::chrono::milliseconds(config_.cycle_interval_ms),
                   [this] { return wake_pending_ || stopping_.load(); });
    if (stopping_) break;
    wake_pending_ = false;
    WriteBatch batch;
    CycleLocked(batch);
    // The batch takes its place in the write order under the lock, so every later change is
    // written after it; the write itself happens without the lock, so submitters and agents are
    // not held up by the loop's fsync. Agents see this cycle's assignments only once they are
    // durable (Assignments waits for durable_gen_).
    GroupCommitter::Ticket ticket = committer_->Enqueue(std::move(batch));
    const uint64_t gen = ++enqueued_gen_;
    lock.unlock();
    if (Status st = committer_->Wait(std::move(ticket)); !st.ok()) FailStop(st);
    lock.lock();
    durable_gen_ = gen;
    durable_.notify_all();
    NotifyWatchersLocked();
    // Let submitters and agents in between cycles: under a stream of submissions the loop would
    // otherwise run back to back and hold the lock nearly all the time. Work that arrives in the
    // gap is picked up by the next cycle, in one pass.
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(kMinCycleGapMs));
    lock.lock();
  }
}

int PoolService::RunCycle() {
  std::lock_guard<std::mutex> lock(mu_);
  WriteBatch batch;
  const int placed = CycleLocked(batch);
  (void)CommitLocked(batch);
  return placed;
}

namespace {

// Records which task each reservation belongs to.
class RecordingBinder : public Binder {
 public:
  Status Bind(const Job&, int task_index, AllocationId allocation, const Placement& placement) override {
    bound.push_back({task_index, allocation, placement});
    return Status::Ok();
  }
  struct Bound {
    int task;
    AllocationId allocation;
    Placement placement;
  };
  std::vector<Bound> bound;
};

}  // namespace

bool PoolService::ComputeMask(const JobState& j, NodeMask& mask) const {
  const size_t n = state_.ledger.node_count();
  bool any = false;
  mask.reasons = {"reserved for a waiting gang", "node labels do not match the job's node affinity",
                  "no task of a together-with job on the node", "runs a task of an apart-from job",
                  "node is lost"};
  mask.reason.assign(n, 0);
  for (size_t i = 0; i < n && i < state_.nodes.size(); ++i) {
    if (state_.nodes[i].state != "ready") {
      mask.reason[i] = 5;
      any = true;
    }
  }
  if (!state_.reserved_for.empty() && state_.reserved_for != j.rec.id) {
    for (size_t i = 0; i < n && i < state_.reserved_nodes.size(); ++i) {
      if (state_.reserved_nodes[i] && mask.reason[i] == 0) {
        mask.reason[i] = 1;
        any = true;
      }
    }
  }
  const Affinity& aff = j.job.affinity;
  if (aff.empty()) return any;
  for (size_t i = 0; i < n; ++i) {
    if (mask.reason[i] != 0) continue;
    const NodeSpec& spec = state_.ledger.spec(static_cast<NodeIndex>(i));
    uint8_t why = 0;
    for (const auto& req : aff.node) {
      if (!req.Matches(spec.labels)) why = 2;
    }
    if (why == 0 && (!aff.together_with.empty() || !aff.apart_from.empty())) {
      std::set<const JobState*> on_node;
      for (const auto& [job_id, index] : state_.nodes[i].tasks) {
        auto it = state_.jobs.find(job_id);
        if (it != state_.jobs.end()) on_node.insert(it->second.get());
      }
      for (const auto& term : aff.together_with) {
        bool found = false;
        for (const JobState* other : on_node) {
          if (other != &j && LabelsMatch(term, other->job.labels)) found = true;
        }
        if (!found) why = 3;
      }
      for (const auto& term : aff.apart_from) {
        for (const JobState* other : on_node) {
          if (LabelsMatch(term, other->job.labels)) why = 4;
        }
      }
    }
    if (why != 0) mask.reason[i] = why;
  }
  return true;
}

// Retention: ended jobs unchanged for finishedJobRetentionSeconds leave memory and the store.
void PoolService::RemoveExpiredJobs(WriteBatch& batch) {
  const int64_t keep_ms = config_.finished_job_retention_seconds * 1000;
  if (keep_ms <= 0) return;
  const int64_t now = NowMs();
  if (now < next_removal_ms_) return;
  // One pass over the jobs at most every tenth of the retention period (1 s to 1 min).
  next_removal_ms_ = now + std::clamp<int64_t>(keep_ms / 10, 1000, 60000);
  const RetentionPass pass = ExpiredJobs(state_, now, keep_ms, kMaxRemovalsPerPass);
  if (pass.more) next_removal_ms_ = now;  // more to do: the next cycle goes on
  RemoveJobsOp op;
  op.seqs = pass.expired;
  op.events_before_ms = now - keep_ms;
  (void)ApplyLocked(std::move(op), batch);
}

// Nodes silent past the heartbeat timeout are lost.
void PoolService::CheckNodes(WriteBatch& batch) {
  for (const SilentNode& silent : SilentNodes(state_, MonoNow(), config_.heartbeat_timeout_seconds)) {
    NodeLostOp op;
    op.node = silent.node;
    op.silent_s = silent.silent_s;
    (void)ApplyLocked(op, batch);
  }
}

// Stops past their deadline are released as if confirmed.
void PoolService::ExpireStops(WriteBatch& batch) {
  for (const OverdueStops& due : OverdueStopsAt(state_, NowMs())) {
    StopsOverdueOp op;
    op.job_id = due.job_id;
    op.tasks = due.tasks;
    (void)ApplyLocked(std::move(op), batch);
  }
}

int PoolService::CycleLocked(WriteBatch& batch) {
  const double t0 = MonoNow();
  ++metrics_.cycles;
  CheckNodes(batch);
  ExpireStops(batch);
  RemoveExpiredJobs(batch);
  LearnTypicalPods();
  const int64_t now = NowMs();
  // Preemptors whose victims stopped stop waiting; jobs in their backoff say until when.
  bool waits = false;
  for (uint64_t seq : state_.pending) {
    const JobState& j = *state_.by_seq[seq];
    waits |= !j.waiting_for.empty() || j.rec.not_before_ms > now;
  }
  if (waits) (void)ApplyLocked(CycleStartOp{{now, MonoNow()}}, batch);

  std::vector<PendingEntry> entries;
  std::vector<JobState*> states;
  for (uint64_t seq : state_.pending) {
    JobState* j = state_.by_seq[seq];
    if (!j->waiting_for.empty() || j->rec.not_before_ms > now) continue;  // preempting, or in its backoff
    entries.push_back({seq, j->rec.tenant, j->rec.queue, j->rec.priority, j->demand});
    states.push_back(j);
  }
  std::vector<UsageEntry> usage;
  for (const auto& [key, r] : state_.usage) usage.push_back({key.first, key.second, r});
  Resources total;
  for (NodeIndex n = 0; n < state_.ledger.node_count(); ++n) {
    const NodeSpec& s = state_.ledger.spec(n);
    total.cpu += s.cpu.units();
    total.memory += s.memory.units();
    for (const auto& g : s.gpus) total.gpu += g.mig_enabled ? 0 : 1000;
  }

  int placed = 0;
  NodeMask mask;
  RunningView running_view;
  // Job shapes that failed in this cycle: capacity only shrinks during a cycle, so a job of the
  // same shape cannot fit either and skips the pass over the nodes.
  std::set<std::string> failed_shapes;
  if (!entries.empty() && state_.ledger.node_count() > 0) {
    QueueOrder::Pass pass = order_->Begin(entries, usage, total);
    while (auto next = pass.Next()) {
      if (placed >= config_.max_jobs_per_cycle) break;
      const size_t i = *next;
      JobState& j = *states[i];
      // Nothing was freed since this job last failed to fit: it cannot fit now either. A job that
      // wants to be together with others may fit after a placement, so it is always tried.
      if (j.failed_epoch == state_.capacity_epoch && j.job.affinity.together_with.empty()) {
        pass.Skipped(i);
        const uint64_t preempt_epoch = state_.capacity_epoch + metrics_.placements;
        if (config_.preemption && j.preempt_epoch != preempt_epoch) {
          j.preempt_epoch = preempt_epoch;
          if (TryPreempt(j, entries[i], running_view, batch)) continue;
        }
        MaybeReserve(j, batch);
        continue;
      }
      const std::string shape = j.rec.id == state_.reserved_for ? "" : JobShapeKey(j.job);
      if (!shape.empty() && failed_shapes.count(shape)) {
        pass.Skipped(i);
        j.failed_epoch = state_.capacity_epoch;
        const uint64_t preempt_epoch = state_.capacity_epoch + metrics_.placements;
        if (config_.preemption && j.preempt_epoch != preempt_epoch) {
          j.preempt_epoch = preempt_epoch;
          if (TryPreempt(j, entries[i], running_view, batch)) continue;
        }
        MaybeReserve(j, batch);
        continue;
      }
      const bool masked = ComputeMask(j, mask);
      scheduler_->SetNodeMask(masked ? &mask : nullptr);
      bool spread_self = false;
      for (const auto& term : j.job.affinity.apart_from) spread_self |= LabelsMatch(term, j.job.labels);
      RecordingBinder binder;
      JobResult r = scheduler_->ScheduleJob(j.job, &binder, [&](const Placement& p) {
        if (spread_self && p.node < mask.reason.size()) mask.reason[p.node] = 4;
      });
      scheduler_->SetNodeMask(nullptr);
      if (r.placed) {
        // The scheduler committed its choice to the ledger while choosing; the operation commits
        // it again as the state's change.
        PlaceTasksOp op;
        op.job_id = j.rec.id;
        for (const auto& b : binder.bound) {
          (void)state_.ledger.Release(b.allocation);
          op.tasks.push_back({b.task, b.placement, NewRunId()});
        }
        if (Status st = ApplyLocked(std::move(op), batch); !st.ok())
          FailStop(st.WithContext("applying the scheduler's placement"));
        pass.Placed(i);
        ++placed;
        continue;
      }
      pass.Skipped(i);
      j.failed_epoch = state_.capacity_epoch;
      if (!shape.empty()) failed_shapes.insert(shape);
      std::string pending_task;
      if (r.first_failed_task >= 0) {
        const TaskState& ft = j.tasks[static_cast<size_t>(r.first_failed_task)];
        pending_task = fmt::format("{}[{}]", j.job.groups[static_cast<size_t>(ft.group)].name, ft.replica);
      }
      JobWaitsOp wait;
      wait.job_id = j.rec.id;
      wait.message = r.status.message();
      if (wait.message.empty()) wait.message = r.diagnosis.ToString();
      wait.pending_task = pending_task;
      wait.diagnosis = r.diagnosis;
      // Said only when something of it changed: a job that keeps not fitting adds nothing.
      const Diagnosis& had = j.diagnosis;
      if (wait.message != j.pending_message || (!pending_task.empty() && pending_task != j.pending_task) ||
          wait.diagnosis.total_nodes != had.total_nodes || wait.diagnosis.feasible_nodes != had.feasible_nodes ||
          wait.diagnosis.reasons != had.reasons)
        (void)ApplyLocked(std::move(wait), batch);
      const uint64_t preempt_epoch = state_.capacity_epoch + metrics_.placements;
      if (config_.preemption && j.preempt_epoch != preempt_epoch) {
        j.preempt_epoch = preempt_epoch;
        if (TryPreempt(j, entries[i], running_view, batch)) continue;
      }
      MaybeReserve(j, batch);
    }
  }
  // Running jobs whose gang minimum was met place their remaining tasks as room appears.
  const std::vector<uint64_t> partial(state_.partial.begin(), state_.partial.end());
  for (uint64_t seq : partial) {
    JobState& j = *state_.by_seq[seq];
    for (size_t t = 0; t < j.tasks.size(); ++t) {
      TaskState& ts = j.tasks[t];
      if (ts.phase != TaskPhase::kPending) continue;
      const bool masked = ComputeMask(j, mask);
      scheduler_->SetNodeMask(masked ? &mask : nullptr);
      const TaskRequest& req = j.job.groups[static_cast<size_t>(ts.group)].request;
      Decision d;
      auto id = scheduler_->Place(req, &d);
      scheduler_->SetNodeMask(nullptr);
      if (!id.ok()) continue;
      (void)state_.ledger.Release(*id);
      PlaceTasksOp op;
      op.job_id = j.rec.id;
      op.tasks.push_back({static_cast<int>(t), d.placement, NewRunId()});
      if (Status st = ApplyLocked(std::move(op), batch); !st.ok())
        FailStop(st.WithContext("applying the scheduler's placement"));
    }
  }
  metrics_.cycle_duration.Observe(MonoNow() - t0);
  return placed;
}

void PoolService::BuildRunningView(RunningView& view) {
  view = RunningView{};
  view.built = true;
  std::vector<Resources> group_demand;
  for (auto& [seq, v] : state_.by_seq) {
    if (v->phase != JobPhase::kRunning) continue;
    bool stopping = false;
    Resources used;
    group_demand.clear();
    for (const auto& g : v->job.groups) group_demand.push_back(TaskDemand(g.request));
    for (const TaskState& ts : v->tasks) {
      stopping |= ts.phase == TaskPhase::kStopping;
      if (IsLive(ts.phase)) used += group_demand[static_cast<size_t>(ts.group)];
    }
    if (stopping) continue;
    view.any_best_effort |= v->job.qos == QosClass::kBestEffort;
    view.entries.push_back(
        {seq, v->rec.tenant, v->rec.queue, v->rec.priority, v->job.qos, used, v->started_ms});
    view.jobs.push_back(v);
  }
}

bool PoolService::TryPreempt(JobState& j, const PendingEntry& entry, RunningView& view, WriteBatch& batch) {
  if (!view.built) BuildRunningView(view);
  // Only best-effort work is ever preempted: with none running there is nothing to look for.
  if (!view.any_best_effort) return false;
  const std::vector<RunningEntry>& running = view.entries;
  const std::vector<JobState*>& running_jobs = view.jobs;
  std::vector<UsageEntry> usage;
  for (const auto& [key, r] : state_.usage) usage.push_back({key.first, key.second, r});
  const std::vector<PreemptionCandidate> candidates =
      PreemptionCandidates(*order_, entry, j.job.qos, running, usage);
  if (candidates.empty()) return false;

  // What-if: release victims in order until the job fits, then put everything back exactly.
  struct Released {
    JobState* job;
    int task;
    Placement placement;
  };
  std::vector<Released> released;
  size_t needed = 0;
  bool fits = false;
  NodeMask mask;
  for (size_t c = 0; c < candidates.size() && !fits; ++c) {
    JobState* v = running_jobs[candidates[c].index];
    for (size_t t = 0; t < v->tasks.size(); ++t) {
      TaskState& ts = v->tasks[t];
      if (!ts.placed) continue;
      (void)state_.ledger.Release(ts.allocation);
      released.push_back({v, static_cast<int>(t), ts.placement});
    }
    needed = c + 1;
    const bool masked = ComputeMask(j, mask);
    scheduler_->SetNodeMask(masked ? &mask : nullptr);
    JobResult trial = scheduler_->ScheduleJob(j.job);
    scheduler_->SetNodeMask(nullptr);
    if (trial.placed) {
      for (AllocationId a : trial.allocations) (void)state_.ledger.Release(a);
      fits = true;
    }
  }
  for (const Released& r : released) {
    auto id = state_.ledger.Commit(r.placement);
    if (!id.ok()) FailStop(id.status().WithContext("restoring an allocation after a preemption what-if"));
    r.job->tasks[static_cast<size_t>(r.task)].allocation = *id;
  }
  if (!fits) return false;
  PreemptOp op;
  op.job_id = j.rec.id;
  op.grace_period_seconds = config_.grace_period_seconds;
  for (size_t c = 0; c < needed; ++c) {
    JobState* v = running_jobs[candidates[c].index];
    const std::string why =
        candidates[c].reason == PreemptReason::kPriority
            ? fmt::format("preempted by {} (priority {} > {})", j.rec.id, j.rec.priority, v->rec.priority)
            : fmt::format("preempted by {} (queue '{}' reclaims its guaranteed quota)", j.rec.id,
                          j.rec.queue);
    op.victims.push_back({v->rec.id, why});
  }
  view.built = false;  // the victims are stopping now
  return ApplyLocked(std::move(op), batch).ok();
}

void PoolService::MaybeReserve(JobState& j, WriteBatch& batch) {
  if (!state_.reserved_for.empty()) return;
  if (NowMs() - j.pending_since_ms < 1000LL * config_.reserve_after_seconds) return;
  // Nodes that could hold this job's largest task when empty, closest to free first.
  const TaskRequest* largest = nullptr;
  for (const auto& g : j.job.groups) {
    if (largest == nullptr || g.request.total_gpu_share() > largest->total_gpu_share()) largest = &g.request;
  }
  std::vector<NodeIndex> candidates;
  for (NodeIndex n = 0; n < state_.ledger.node_count(); ++n) {
    const NodeSpec& s = state_.ledger.spec(n);
    if (!state_.ledger.state(n).schedulable() || state_.nodes[n].state != "ready") continue;
    if (static_cast<int>(s.gpus.size()) < largest->gpu_count || s.cpu < largest->cpu ||
        s.memory < largest->memory)
      continue;
    if (!largest->gpu_models.empty() && !s.gpus.empty() &&
        std::find(largest->gpu_models.begin(), largest->gpu_models.end(), s.gpus[0].model) ==
            largest->gpu_models.end())
      continue;
    candidates.push_back(n);
  }
  std::sort(candidates.begin(), candidates.end(), [&](NodeIndex a, NodeIndex b) {
    const auto& sa = state_.ledger.state(a);
    const auto& sb = state_.ledger.state(b);
    if (sa.free_gpu_share != sb.free_gpu_share) return sa.free_gpu_share > sb.free_gpu_share;
    return a < b;
  });
  Resources covered;
  std::vector<uint8_t> reserved(state_.ledger.node_count(), 0);
  for (NodeIndex n : candidates) {
    if (covered.gpu >= j.demand.gpu && covered.cpu >= j.demand.cpu && covered.memory >= j.demand.memory)
      break;
    const NodeSpec& s = state_.ledger.spec(n);
    covered.cpu += s.cpu.units();
    covered.memory += s.memory.units();
    covered.gpu += 1000 * static_cast<int64_t>(s.gpus.size());
    reserved[n] = 1;
  }
  if (covered.gpu < j.demand.gpu || covered.cpu < j.demand.cpu || covered.memory < j.demand.memory) return;
  ReserveOp op;
  op.job_id = j.rec.id;
  op.nodes = std::move(reserved);
  (void)ApplyLocked(std::move(op), batch);
}

// ---- health, metrics, invariants ---------------------------------------------------------------

}  // namespace gpupool
