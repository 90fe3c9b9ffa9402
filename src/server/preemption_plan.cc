#include "server/preemption_plan.h"

#include <fmt/format.h>

#include "server/node_mask.h"
#include "server/service_internal.h"

namespace gpupool {

using namespace service_internal;

RunningView BuildRunningView(PoolState& st) {
  RunningView view;
  view.built = true;
  std::vector<Resources> group_demand;
  for (auto& [seq, v] : st.by_seq) {
    if (v->phase != JobPhase::kRunning) continue;
    bool stopping = false;
    Resources used;
    group_demand.clear();
    for (const auto& g : v->job.groups) group_demand.push_back(TaskDemand(g.request));
    for (const PoolTask& ts : v->tasks) {
      stopping |= ts.phase == TaskPhase::kStopping;
      if (IsLive(ts.phase)) used += group_demand[static_cast<size_t>(ts.group)];
    }
    if (stopping) continue;
    view.any_best_effort |= v->job.qos == QosClass::kBestEffort;
    view.entries.push_back(
        {seq, v->rec.tenant, v->rec.queue, v->rec.priority, v->job.qos, used, v->started_ms});
    view.jobs.push_back(v);
  }
  return view;
}

std::optional<PreemptOp> PlanPreemption(PoolState& st, Scheduler& scheduler, const QueueOrder& order,
                                        const PoolJob& j, const PendingEntry& entry, RunningView& view,
                                        int grace_period_seconds) {
  if (!view.built) view = BuildRunningView(st);
  // Only best-effort work is ever preempted: with none running there is nothing to look for.
  if (!view.any_best_effort) return std::nullopt;
  const std::vector<RunningEntry>& running = view.entries;
  const std::vector<PoolJob*>& running_jobs = view.jobs;
  std::vector<UsageEntry> usage;
  for (const auto& [key, r] : st.usage) usage.push_back({key.first, key.second, r});
  const std::vector<PreemptionCandidate> candidates =
      PreemptionCandidates(order, entry, j.job.qos, running, usage);
  if (candidates.empty()) return std::nullopt;

  // What-if: release victims in order until the job fits, then put everything back exactly.
  struct Released {
    PoolJob* job;
    int task;
    Placement placement;
  };
  std::vector<Released> released;
  size_t needed = 0;
  bool fits = false;
  std::vector<uint8_t> planned_nodes;
  NodeMask mask;
  for (size_t c = 0; c < candidates.size() && !fits; ++c) {
    PoolJob* v = running_jobs[candidates[c].index];
    for (size_t t = 0; t < v->tasks.size(); ++t) {
      PoolTask& ts = v->tasks[t];
      if (!ts.placed) continue;
      (void)st.ledger.Release(ts.allocation);
      released.push_back({v, static_cast<int>(t), ts.placement});
    }
    needed = c + 1;
    const bool masked = ComputeNodeMask(st, j, mask);
    scheduler.SetNodeMask(masked ? &mask : nullptr);
    JobResult trial = scheduler.ScheduleJob(j.job);
    scheduler.SetNodeMask(nullptr);
    if (trial.placed) {
      for (AllocationId a : trial.allocations) (void)st.ledger.Release(a);
      planned_nodes.assign(st.ledger.node_count(), 0);
      for (const Placement& p : trial.placements) {
        if (p.node < planned_nodes.size()) planned_nodes[p.node] = 1;
      }
      fits = true;
    }
  }
  for (const Released& r : released) {
    auto id = st.ledger.Commit(r.placement);
    // The placement was just released: committing it again cannot fail unless the ledger is broken.
    if (!id.ok()) FailStop(id.status().WithContext("restoring an allocation after a preemption what-if"));
    r.job->tasks[static_cast<size_t>(r.task)].allocation = *id;
  }
  if (!fits) return std::nullopt;
  PreemptOp op;
  op.job_id = j.rec.id;
  op.grace_period_seconds = grace_period_seconds;
  op.nodes = std::move(planned_nodes);
  for (size_t c = 0; c < needed; ++c) {
    PoolJob* v = running_jobs[candidates[c].index];
    const std::string why =
        candidates[c].reason == PreemptReason::kPriority
            ? fmt::format("preempted by {} (priority {} > {})", j.rec.id, j.rec.priority, v->rec.priority)
            : fmt::format("preempted by {} (queue '{}' reclaims its guaranteed quota)", j.rec.id,
                          j.rec.queue);
    op.victims.push_back({v->rec.id, why});
  }
  return op;
}

}  // namespace gpupool
