// Preemption, the controller: for a pending job that does not fit, which running best-effort jobs
// to stop (in the order sched/preemption.h's PreemptionCandidates gives: lower priority, or queues
// over their guarantee when the job's queue is under its own) so that it fits. It tries: releases
// the candidates' allocations one job at a time on the real ledger, asks the scheduler whether the
// job fits, and puts every released placement back exactly (the tasks' allocation ids renumbered)
// before it answers. Only the prefix that made the job fit becomes victims. Says what to do as a
// PreemptOp; the state machine stops the victims and makes the job wait for them.
#pragma once

#include <optional>
#include <vector>

#include "sched/preemption.h"
#include "sched/queueing.h"
#include "sched/scheduler.h"
#include "server/operations.h"
#include "server/state.h"

namespace gpupool {

// Running jobs that could be preemption victims (none of their tasks stopping), built at most once
// per cycle and again after a preemption changed them.
struct RunningView {
  bool built = false;
  bool any_best_effort = false;
  std::vector<RunningEntry> entries;
  std::vector<PoolJob*> jobs;
};
RunningView BuildRunningView(PoolState& st);

std::optional<PreemptOp> PlanPreemption(PoolState& st, Scheduler& scheduler, const QueueOrder& order,
                                        const PoolJob& j, const PendingEntry& entry, RunningView& view,
                                        int grace_period_seconds);

}  // namespace gpupool
