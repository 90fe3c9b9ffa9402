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
#include "sched/recording_binder.h"
#include "server/job_gates.h"
#include "sched/registry.h"
#include "sched/typical_pods.h"
#include "server/resources_json.h"
#include "server/node_mask.h"
#include "server/reservations.h"
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
    ServiceLock lock(*this);
    stopping_ = true;
    wake_.notify_all();
  }
  if (loop_.joinable()) loop_.join();
}

void PoolService::Loop() {
  ServiceLock lock(*this);
  while (!stopping_) {
    wake_.wait_for(lock.get(), std::chrono::milliseconds(config_.cycle_interval_ms),
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
  ServiceLock lock(*this);
  WriteBatch batch;
  const int placed = CycleLocked(batch);
  (void)CommitLocked(batch);
  return placed;
}

bool PoolService::ComputeMask(const JobState& j, NodeMask& mask) const { return ComputeNodeMask(state_, j, mask); }

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
    waits |= !j.waiting_for.empty() || !j.nominated_nodes.empty() || j.rec.not_before_ms > now;
  }
  if (waits) (void)ApplyLocked(CycleStartOp{{now, MonoNow()}}, batch);

  EndJobsPastTimeLimits(now, batch);
  GateDependencies(batch);

  std::vector<PendingEntry> entries;
  std::vector<JobState*> states;
  for (uint64_t seq : state_.pending) {
    JobState* j = state_.by_seq[seq];
    if (!j->waiting_for.empty() || j->rec.not_before_ms > now) continue;  // preempting, or in its backoff
    if (!j->job.depends_on.empty() && !j->dependencies_met) continue;       // waits for other jobs
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

// Running jobs past their time limit fail; their tasks get the grace period.
void PoolService::EndJobsPastTimeLimits(int64_t now_ms, WriteBatch& batch) {
  for (TimeLimitDue& due : PastTimeLimits(state_, now_ms)) {
    FailJobOp op;
    op.job_id = std::move(due.job_id);
    op.reason = std::move(due.reason);
    (void)ApplyLocked(std::move(op), batch);
  }
}

// Pending jobs with dependencies: met ones may be placed; waiting ones say what for; a job whose
// dependency ended otherwise than it needed can never start, and fails.
void PoolService::GateDependencies(WriteBatch& batch) {
  std::vector<FailJobOp> broken;
  for (uint64_t seq : state_.pending) {
    JobState& j = *state_.by_seq[seq];
    if (j.job.depends_on.empty() || j.dependencies_met) continue;
    if (j.rec.started_ms > 0) {  // it ran before (requeued since): its dependencies were met then
      j.dependencies_met = true;
      continue;
    }
    DependencyVerdict v = CheckDependencies(state_, j);
    if (v.kind == DependencyVerdict::Kind::kMet) {
      j.dependencies_met = true;  // dependencies that ended stay ended
    } else if (v.kind == DependencyVerdict::Kind::kBroken) {
      broken.push_back({{}, j.rec.id, std::move(v.message)});
    } else if (v.message != j.pending_message) {
      JobWaitsOp wait;
      wait.job_id = j.rec.id;
      wait.message = std::move(v.message);
      (void)ApplyLocked(std::move(wait), batch);
    }
  }
  for (FailJobOp& op : broken) (void)ApplyLocked(std::move(op), batch);
}

bool PoolService::TryPreempt(JobState& j, const PendingEntry& entry, RunningView& view, WriteBatch& batch) {
  auto op = PlanPreemption(state_, *scheduler_, *order_, j, entry, view, config_.grace_period_seconds);
  if (!op) return false;
  view.built = false;  // the victims are stopping now
  return ApplyLocked(std::move(*op), batch).ok();
}

void PoolService::MaybeReserve(JobState& j, WriteBatch& batch) {
  if (auto op = PlanReservation(state_, j, NowMs(), config_.reserve_after_seconds)) (void)ApplyLocked(std::move(*op), batch);
}

// ---- health, metrics, invariants ---------------------------------------------------------------

}  // namespace gpupool
