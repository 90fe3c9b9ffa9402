// The time-based replay (`gpupool sim replay`): jobs arrive at their trace times, wait in the
// server's queueing order (sched/queueing.h) until the same placement pipeline as the server's
// (sched/scheduler.h, whole gangs) finds them room, run for their durations and leave. Nothing is
// dropped: a job that does not fit waits. Unlike the FGD protocol (sim/experiment.h), time passes,
// so it measures what an operator sees over days: GPUs allocated over time, how long jobs wait,
// how long they take end to end.
//
// How a scheduling pass works, as in the server's cycle: after each instant at which jobs arrive
// or end, one pass offers the pending jobs in queue order; each is placed whole or skipped, and a
// later job may go ahead of one that does not fit (backfill). A job shape that failed is not tried
// again until something ends. A job that has waited reserve_after_seconds gets nodes held for it
// (sched/reservation.h, as the server's reserveAfterSeconds), one job at a time, until it starts, so
// that backfill cannot starve a large gang.
//
// Migration (options.migration.max_moves > 0): after each pass, for the first plans_per_event jobs
// the pass tried and could not place, in the pass's (the queue's) order, that have one task and
// whose GPU share is free in the cluster in total, sched/consolidation.h looks for a plan that
// moves running one-task jobs (those that may move: sim/replay_migration.h) so the job fits; a
// plan is taken whole or not at all, within the cluster's budget of moves an hour. A moved job
// ends later by the work it lost and its restart.
//
// Node failures (options.failures): a failed node takes no work until its repair, and every job
// with a task on it stops whole, loses the work since its last checkpoint and waits again in its
// place in the queue (its arrival). Its wait counts to its first start; its JCT to its last end.
//
// Preemption, as the server's (sched/preemption.h): after each pass, for the first jobs it could
// not place (in its order, up to migration.plans_per_event an instant), the running jobs that may
// be evicted for it (best-effort only, by priority or to reclaim a queue's guarantee) are
// released in the server's eviction order until the job fits; it starts, and they stop as a
// failure stops a job (work since the last checkpoint lost, waiting again in their place). When
// even all of them would not make room, nothing is evicted. The server gives victims a grace
// period to checkpoint and the preemptor waits for it; the replay stops them at once.
//
// No I/O here; deterministic for the same inputs.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/node.h"
#include "sched/queueing.h"
#include "sched/registry.h"
#include "sim/replay_failures.h"
#include "sim/replay_migration.h"
#include "sim/timeline.h"

namespace gpupool {

struct ReplayOptions {
  std::string policy = "balanced";  // placement policy (sched/profile.h ProfileForPolicy)
  OrderingPolicy ordering = OrderingPolicy::kFifo;
  // The queues; empty: one per queue the jobs name, each weight 1, no guarantee, no limit.
  std::vector<QueueSpec> queues;
  int64_t sample_seconds = 900;  // the allocation series' step (> 0)
  uint64_t seed = 1;             // the scheduler's tie-breaks
  // After this long pending a job gets nodes held for it (the server's default); < 0: never.
  int64_t reserve_after_seconds = 60;
  // Leave out of each pass the jobs it could only skip (see replay.cc; a pass where that could
  // matter is undone and run again in full). Off offers every pending job, which decides the same,
  // only slower: ReplayTest.PruningThePassNeverChangesADecision.
  bool prune_pass = true;
  // Every share of a GPU takes the whole GPU (no pooling): the status quo pooling is measured
  // against. The result's window_asked_milli_seconds still counts what the jobs asked for.
  bool exclusive = false;
  // Defragmentation by migration (sim/replay_migration.h, sched/consolidation.h); off while
  // migration.max_moves is 0.
  MigrationOptions migration;
  // Node failures (sim/replay_failures.h); off while node_mtbf_hours is 0 and none are scripted.
  // A job with a task on a failed node stops whole and waits again; placed again, it restarts
  // from its last checkpoint (migration.checkpoint_seconds of work apart) after
  // migration.restart_seconds.
  FailureOptions failures;
};

// What happened to one job.
struct ReplayJob {
  int64_t arrival = 0;
  int64_t start = -1;  // -1: never started
  int64_t end = -1;
  int64_t gpu_milli = 0;  // GPU share over all its tasks (1000: one whole GPU)
  int interrupted = 0;    // times a node failure or a preemption stopped it
};

struct ReplaySample {
  int64_t time = 0;              // seconds
  int64_t allocated_milli = 0;   // GPU share allocated at that instant
  int64_t running_jobs = 0;
  int64_t pending_jobs = 0;
  int64_t pending_gpus_milli = 0;  // what the waiting jobs ask for
};

// One step of one queue's series: GPU-seconds (in milli-GPU-seconds) its jobs asked for, waiting
// or running, and held.
struct QueueStep {
  int64_t asked_milli_seconds = 0;
  int64_t held_milli_seconds = 0;
};

// The most samples, and per-queue steps × queues, a replay keeps (a short step over a long trace
// is refused, not allowed to take the memory).
inline constexpr size_t kMaxSeriesCells = 20'000'000;

struct Distribution {
  int64_t count = 0;
  double mean = 0;
  int64_t p50 = 0, p95 = 0, p99 = 0, max = 0;
};
// Of `values` (seconds); the percentiles are nearest-rank.
Distribution Summarize(std::vector<int64_t> values);

struct ReplayResult {
  std::vector<ReplayJob> jobs;  // in the input's order
  std::vector<ReplaySample> samples;
  // Per queue (sorted by name), per step of sample_seconds from 0 to the makespan: what its jobs
  // asked for and held. The demand series a forecaster learns from.
  std::vector<std::string> queue_names;
  std::vector<std::vector<QueueStep>> queue_steps;  // [step][queue]
  int64_t capacity_milli = 0;  // GPU share of the cluster
  int64_t makespan = 0;        // the last end (or the last arrival, when later)
  // Allocated GPU-seconds (in milli-GPU-seconds) over [0, makespan], and as a share of capacity.
  int64_t allocated_milli_seconds = 0;
  double utilisation = 0;
  Distribution wait;  // start - arrival, started jobs
  Distribution jct;   // end - arrival, finished jobs
  std::map<std::string, Distribution> wait_by_queue;
  int64_t started = 0;
  int64_t passes = 0;       // scheduling passes run
  int64_t attempts = 0;     // gangs offered to the pipeline
  int64_t reservations = 0; // jobs nodes were held for
  int64_t redone_passes = 0; // pruned passes undone and run again in full (see replay.cc)
  // Over the window the trace covers, [0, last arrival] (a long job's tail past it would weigh on
  // any measure over the makespan): GPU share allocated, the share the running jobs asked for
  // (with exclusive, before it was rounded up to whole GPUs) — in milli-GPU-seconds — and the jobs
  // that ended in it.
  int64_t window = 0;
  int64_t window_allocated_milli_seconds = 0;
  int64_t window_asked_milli_seconds = 0;
  int64_t completed_in_window = 0;
  // Migration: jobs started by a consolidation, tasks moved, and what the moves cost in
  // milli-GPU-seconds (work since the last checkpoint done again; restarts).
  int64_t consolidated = 0;
  int64_t consolidation_attempts = 0;
  int64_t migrations = 0;
  int64_t lost_milli_seconds = 0;
  int64_t restart_milli_seconds = 0;
  std::vector<int64_t> move_times;  // when each move was made
  // Node failures: how many, the jobs they stopped (each stop counted), and the work those jobs
  // lost since their last checkpoint, in milli-GPU-seconds.
  int64_t node_failures = 0;
  int64_t interruptions = 0;
  int64_t failure_lost_milli_seconds = 0;
  // Preemption: jobs stopped for another (each stop counted), the jobs that started by it, and
  // the work the stopped ones lost since their last checkpoint.
  int64_t preemptions = 0;
  int64_t preemptors = 0;
  int64_t preempted_lost_milli_seconds = 0;
  // The restarts of jobs stopped by a failure or a preemption, placed again.
  int64_t resume_restart_milli_seconds = 0;
};

// Replays `jobs` (sorted by arrival; each with its tenant and queue) on `nodes`. InvalidArgument
// for jobs out of order, a job that could never fit the cluster (more GPUs than it has, or a task
// larger than every node), or bad options; ResourceExhausted when a series would pass
// kMaxSeriesCells.
Result<ReplayResult> Replay(const std::vector<NodeSpec>& nodes, const std::vector<TimedJob>& jobs,
                            const ReplayOptions& options, const PluginRegistry& registry);

// The series as CSV: time_s,allocated_gpus,running_jobs,pending_jobs,pending_gpus.
std::string ReplaySeriesCsv(const ReplayResult& result);
// The per-queue series as CSV, means over each step: time_s,queue,asked_gpus,allocated_gpus.
std::string ReplayQueueSeriesCsv(const ReplayResult& result, int64_t step_seconds);

}  // namespace gpupool
