#include "sim/replay.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <queue>
#include <set>
#include <unordered_map>

#include "common/rng.h"
#include "model/ledger.h"
#include "sched/consolidation.h"
#include "sched/job_shape.h"
#include "sched/preemption.h"
#include "sched/profile.h"
#include "sched/reservation.h"
#include "sched/scheduler.h"
#include "sched/typical_pods.h"

namespace gpupool {

namespace {

struct End {
  int64_t time;
  size_t job;
  uint32_t generation;  // the job's end generation it was pushed under; stale once that moves on
  bool operator>(const End& o) const { return time != o.time ? time > o.time : job > o.job; }
};

}  // namespace

Distribution Summarize(std::vector<int64_t> values) {
  Distribution d;
  d.count = static_cast<int64_t>(values.size());
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  double sum = 0;
  for (int64_t v : values) sum += static_cast<double>(v);
  d.mean = sum / static_cast<double>(values.size());
  const auto rank = [&](double q) {
    const auto n = static_cast<double>(values.size());
    const auto r = static_cast<size_t>(std::max(1.0, std::ceil(q * n)));
    return values[std::min(r, values.size()) - 1];
  };
  d.p50 = rank(0.50);
  d.p95 = rank(0.95);
  d.p99 = rank(0.99);
  d.max = values.back();
  return d;
}

Result<ReplayResult> Replay(const std::vector<NodeSpec>& nodes, const std::vector<TimedJob>& input,
                            const ReplayOptions& options, const PluginRegistry& registry) {
  // Exclusive: every share of a GPU asks for the whole GPU instead (the no-pooling counterfactual).
  std::vector<TimedJob> whole;
  if (options.exclusive) {
    whole = input;
    for (TimedJob& t : whole) {
      for (TaskGroup& g : t.job.groups) {
        if (g.request.wants_gpu() && !g.request.wants_mig() && g.request.gpu_share < kWholeGpu) {
          g.request.gpu_share = kWholeGpu;
          g.request.gpu_memory = MiB(0);
          g.exec.isolation = IsolationMode::kExclusive;
        }
      }
    }
  }
  const std::vector<TimedJob>& jobs = options.exclusive ? whole : input;
  if (options.sample_seconds <= 0)
    return Status::InvalidArgument(fmt::format("sample step must be > 0 seconds, got {}", options.sample_seconds));
  if (nodes.empty()) return Status::InvalidArgument("the cluster has no nodes");
  RETURN_IF_ERROR(ValidateMigrationOptions(options.migration));
  RETURN_IF_ERROR(ValidateFailureOptions(options.failures));
  Ledger ledger;
  int max_node_gpus = 0;
  for (const NodeSpec& n : nodes) {
    RETURN_IF_ERROR(ledger.AddNode(n).status());
    max_node_gpus = std::max(max_node_gpus, static_cast<int>(n.gpus.size()));
  }
  ReplayResult out;
  out.capacity_milli = ledger.total_gpu_share();

  // The queues, and the jobs checked: in order, and able to fit an empty cluster.
  std::vector<QueueSpec> queues = options.queues;
  std::set<std::string> named;
  for (const QueueSpec& q : queues) named.insert(q.name);
  std::vector<TaskRequest> tasks;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const TimedJob& t = jobs[i];
    if (i > 0 && t.arrival < jobs[i - 1].arrival)
      return Status::InvalidArgument(fmt::format("job {} ({}) arrives before the job listed before it", i, t.name));
    if (t.arrival < 0 || t.duration < 1)
      return Status::InvalidArgument(fmt::format("job {} ({}): arrival must be >= 0 and duration >= 1", i, t.name));
    RETURN_IF_ERROR(ValidateJob(t.job).WithContext(fmt::format("job {} ({})", i, t.name)));
    int64_t gpus = 0;
    for (const TaskGroup& g : t.job.groups) {
      if (g.request.gpu_count > max_node_gpus)
        return Status::InvalidArgument(fmt::format("job {} ({}): a task of {} GPUs, and no node has more than {}", i,
                                                   t.name, g.request.gpu_count, max_node_gpus));
      gpus += static_cast<int64_t>(g.replicas) * g.request.total_gpu_share().units();
      for (int r = 0; r < g.replicas; ++r) tasks.push_back(g.request);
    }
    if (gpus > out.capacity_milli)
      return Status::InvalidArgument(fmt::format("job {} ({}) asks for {} GPUs, more than the cluster's {}", i,
                                                 t.name, gpus / 1000.0, out.capacity_milli / 1000.0));
    const std::string queue = t.job.queue.empty() ? "default" : t.job.queue;
    if (options.queues.empty() && named.insert(queue).second) {
      QueueSpec q;
      q.name = queue;
      queues.push_back(std::move(q));
    }
  }
  QueueOrderOptions qo;
  qo.policy = options.ordering;
  qo.queues = std::move(queues);
  ASSIGN_OR_RETURN(QueueOrder order, QueueOrder::Create(std::move(qo)));

  ASSIGN_OR_RETURN(Profile profile, ProfileForPolicy(options.policy));
  const std::vector<TypicalPod> typical = ComputeTypicalPods(tasks);
  SeededRng rng(options.seed);
  PluginInit init;
  init.typical_pods = &typical;
  ASSIGN_OR_RETURN(auto scheduler, Scheduler::Create(profile, registry, ledger, rng, init));

  out.jobs.resize(jobs.size());
  std::vector<Resources> demand(jobs.size());
  std::vector<int64_t> asked(jobs.size());  // GPU share as the trace asked for it (before exclusive)
  // Per job: its shape, and its group: the jobs of one queue, tenant, priority and shape, which
  // every queue order offers among themselves by arrival (seq).
  std::vector<uint32_t> shape(jobs.size());
  std::vector<uint32_t> group(jobs.size());
  std::unordered_map<std::string, uint32_t> shape_ids, group_ids;
  std::vector<std::vector<AllocationId>> held(jobs.size());
  std::vector<uint64_t> failed_epoch(jobs.size(), ~uint64_t{0});
  for (size_t i = 0; i < jobs.size(); ++i) {
    out.jobs[i].arrival = jobs[i].arrival;
    demand[i] = JobDemand(jobs[i].job);
    asked[i] = JobDemand(input[i].job).gpu;
    out.jobs[i].gpu_milli = demand[i].gpu;
    // A job of no shared shape (affinity) gets one of its own.
    std::string key = JobShapeKey(jobs[i].job);
    if (key.empty()) key = fmt::format("job {}", i);
    shape[i] = shape_ids.try_emplace(std::move(key), static_cast<uint32_t>(shape_ids.size())).first->second;
    const Job& job = jobs[i].job;
    group[i] = group_ids
                   .try_emplace(fmt::format("{}\x1f{}\x1f{}\x1f{}", job.queue, job.tenant, job.priority, shape[i]),
                                static_cast<uint32_t>(group_ids.size()))
                   .first->second;
  }
  std::vector<int64_t> offered_of_group(group_ids.size(), 0);
  std::map<std::pair<std::string, std::string>, Resources> usage;
  std::priority_queue<End, std::vector<End>, std::greater<End>> ends;
  std::vector<size_t> pending;  // job indices, in arrival order
  int64_t pending_milli = 0;
  uint64_t epoch = 0;  // bumped whenever something ends: capacity grew
  // The job nodes are held for (one at a time), and the mask the others see.
  std::optional<size_t> reserved;
  NodeMask held_mask;
  held_mask.reasons = {"reserved for a waiting gang"};
  const auto maybe_reserve = [&](size_t j, int64_t now) {
    if (reserved || options.reserve_after_seconds < 0 || now - jobs[j].arrival < options.reserve_after_seconds)
      return;
    auto chosen = ChooseReservedNodes(ledger, jobs[j].job, demand[j], {});
    if (!chosen) return;
    reserved = j;
    held_mask.reason = std::move(*chosen);
    ++out.reservations;
  };
  size_t next_arrival = 0;
  int64_t next_sample = 0;
  int64_t last_time = 0;
  Resources total{0, 0, out.capacity_milli};
  for (const NodeSpec& n : nodes) {
    total.cpu += n.cpu.units();
    total.memory += n.memory.units();
  }
  // The per-queue series: what each queue's jobs ask for (waiting or running) and hold, integrated
  // exactly into steps of sample_seconds.
  std::map<std::string, size_t> queue_index;
  for (const TimedJob& t : jobs) queue_index.emplace(t.job.queue, 0);
  for (auto& [name, index] : queue_index) {
    index = out.queue_names.size();
    out.queue_names.push_back(name);
  }
  std::vector<size_t> queue_of(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) queue_of[i] = queue_index.at(jobs[i].job.queue);
  std::vector<int64_t> asked_milli(out.queue_names.size(), 0), held_milli(out.queue_names.size(), 0);
  const auto integrate = [&](int64_t from, int64_t to) -> Status {
    const int64_t step = options.sample_seconds;
    while (from < to) {
      const auto bucket = static_cast<size_t>(from / step);
      const int64_t until = std::min(to, (from / step + 1) * step);
      if (bucket >= out.queue_steps.size()) {
        if ((bucket + 1) * out.queue_names.size() > kMaxSeriesCells)
          return Status::ResourceExhausted(fmt::format(
              "the per-queue series would pass {} cells at {} s: choose a longer sample step than {} s",
              kMaxSeriesCells, from, step));
        out.queue_steps.resize(bucket + 1, std::vector<QueueStep>(out.queue_names.size()));
      }
      for (size_t q = 0; q < out.queue_names.size(); ++q) {
        out.queue_steps[bucket][q].asked_milli_seconds += asked_milli[q] * (until - from);
        out.queue_steps[bucket][q].held_milli_seconds += held_milli[q] * (until - from);
      }
      from = until;
    }
    return Status::Ok();
  };

  // Running jobs, their runs (for migration's cost model) and the budget of moves.
  const MigrationOptions& mo = options.migration;
  std::set<size_t> running;
  int64_t asked_running = 0;  // Σ asked over the running jobs
  out.window = jobs.empty() ? 0 : jobs.back().arrival;
  std::vector<RunSegment> run(jobs.size());
  MoveBudget budget(mo.moves_per_hour);
  std::vector<uint32_t> end_generation(jobs.size(), 0);
  const auto set_end = [&](size_t j, int64_t end) {
    out.jobs[j].end = end;
    ++end_generation[j];
    if (end >= 0) ends.push({end, j, end_generation[j]});
  };
  std::vector<uint8_t> resumed(jobs.size(), 0);  // stopped by a failure: run[j] holds what is left
  const auto start_job = [&](size_t j, int64_t now) {
    if (resumed[j]) {  // again, from its last checkpoint
      run[j].start = now;
      run[j].restart = mo.restart_seconds;
      out.resume_restart_milli_seconds += mo.restart_seconds * demand[j].gpu;
    } else {
      out.jobs[j].start = now;
      ++out.started;
      run[j] = {now, 0, jobs[j].duration, false};
    }
    set_end(j, run[j].End());
    held_milli[queue_of[j]] += demand[j].gpu;
    running.insert(j);
    asked_running += asked[j];
  };
  // After a pass: plans for waiting one-task jobs (see replay.h).
  std::vector<MovableTask> movable;
  std::unordered_map<AllocationId, size_t> job_of;
  std::vector<size_t> pass_failed;  // the jobs the last pass could not place, in its order
  const auto migrate = [&](int64_t now) -> Status {
    int attempts = 0;
    std::set<uint32_t> failed;  // shapes no plan was found for at this instant
    bool started_any = false;
    for (size_t j : pass_failed) {
      if (attempts >= mo.plans_per_event) break;
      if (running.count(j) != 0) continue;  // started by a preemption
      const Job& job = jobs[j].job;
      if (job.groups.size() != 1 || job.groups[0].replicas != 1) continue;
      const TaskRequest& task = job.groups[0].request;
      if (!task.wants_gpu() || task.wants_mig() || failed.count(shape[j])) continue;
      if (out.capacity_milli - ledger.used_gpu_share() < demand[j].gpu) continue;  // no move adds room
      const int left = budget.Left(now);
      if (left == 0) break;
      ++attempts;
      ++out.consolidation_attempts;
      movable.clear();
      job_of.clear();
      for (size_t r : running) {
        if (held[r].size() != 1 || !MayMove(run[r], now, mo)) continue;
        movable.push_back({held[r][0], &jobs[r].job.groups[0].request});
        job_of[held[r][0]] = r;
      }
      ConsolidationOptions co;
      co.max_moves = std::min(mo.max_moves, left);
      co.max_candidates = mo.max_candidates;
      co.mask = reserved && *reserved != j ? &held_mask : nullptr;
      ConsolidationResult c = Consolidate(*scheduler, task, movable, co);
      scheduler->SetNodeMask(nullptr);
      if (!c.error.ok()) return c.error.WithContext(fmt::format("consolidating for job {} ({})", j, jobs[j].name));
      for (const auto& [from, to] : c.renamed) held[job_of.at(from)] = {to};
      if (!c.placed) {
        failed.insert(shape[j]);
        continue;
      }
      for (const TaskMove& m : c.moves) {
        const size_t r = job_of.at(m.from);
        held[r] = {m.to};
        const MoveCost cost = MoveTask(run[r], now, mo);
        out.lost_milli_seconds += cost.lost_seconds * demand[r].gpu;
        out.restart_milli_seconds += cost.restart_seconds * demand[r].gpu;
        if (run[r].End() != out.jobs[r].end) set_end(r, run[r].End());
        ++out.migrations;
        out.move_times.push_back(now);
      }
      budget.Spend(now, static_cast<int>(c.moves.size()));
      if (reserved == j) reserved.reset();
      held[j] = {c.allocation};
      usage[{job.tenant, job.queue}] += demand[j];
      pending_milli -= demand[j].gpu;
      start_job(j, now);
      ++out.consolidated;
      started_any = true;
    }
    if (started_any) std::erase_if(pending, [&](size_t j) { return running.count(j) != 0; });
    return Status::Ok();
  };
  // A moved job's earlier end stays in the heap: it is stale when it is not the job's end.
  const auto drop_stale = [&] {
    while (!ends.empty() && end_generation[ends.top().job] != ends.top().generation) ends.pop();
  };
  NodeFailures failures(options.failures, static_cast<uint32_t>(ledger.node_count()));
  // A node fails: it takes nothing until its repair, and its jobs stop whole and wait again.
  // Stops running job j, whose allocations are released: it keeps the work up to its last
  // checkpoint (the rest adds to `lost`) and waits again in its place (arrival order).
  const auto stop_job = [&](size_t j, int64_t now, int64_t& lost) {
    held[j].clear();
    lost += StopAtCheckpoint(run[j], now, mo) * demand[j].gpu;
    resumed[j] = 1;
    ++out.jobs[j].interrupted;
    set_end(j, -1);
    running.erase(j);
    asked_running -= asked[j];
    usage[{jobs[j].job.tenant, jobs[j].job.queue}] -= demand[j];
    held_milli[queue_of[j]] -= demand[j].gpu;
    pending_milli += demand[j].gpu;
    failed_epoch[j] = ~uint64_t{0};
    pending.insert(std::lower_bound(pending.begin(), pending.end(), j), j);  // arrival order is index order
  };
  const auto fail_node = [&](NodeIndex n, int64_t now) -> Status {
    RETURN_IF_ERROR(ledger.SetNodeHealthy(n, false));
    ++out.node_failures;
    std::vector<size_t> stopped;
    for (size_t j : running) {
      for (AllocationId id : held[j]) {
        const Placement* p = ledger.Find(id);
        if (p != nullptr && p->node == n) {
          stopped.push_back(j);
          break;
        }
      }
    }
    for (size_t j : stopped) {
      for (AllocationId id : held[j]) RETURN_IF_ERROR(ledger.Release(id));
      stop_job(j, now, out.failure_lost_milli_seconds);
      ++out.interruptions;
    }
    return Status::Ok();
  };
  // After a pass: the server's preemption for the jobs it could not place (see replay.h).
  const auto preempt = [&](int64_t now) -> Status {
    if (std::none_of(running.begin(), running.end(),
                     [&](size_t r) { return jobs[r].job.qos == QosClass::kBestEffort; }))
      return Status::Ok();
    int tries = 0;
    bool started_any = false;
    for (size_t j : pass_failed) {
      if (tries >= mo.plans_per_event) break;
      if (running.count(j) != 0) continue;
      ++tries;
      std::vector<RunningEntry> entries;
      std::vector<size_t> entry_job;
      for (size_t r : running) {
        entries.push_back({r, jobs[r].job.tenant, jobs[r].job.queue, jobs[r].job.priority, jobs[r].job.qos, demand[r],
                           run[r].start * 1000});
        entry_job.push_back(r);
      }
      std::vector<UsageEntry> used;
      for (const auto& [key, res] : usage) used.push_back({key.first, key.second, res});
      const PendingEntry entry{j, jobs[j].job.tenant, jobs[j].job.queue, jobs[j].job.priority, demand[j]};
      const std::vector<PreemptionCandidate> candidates =
          PreemptionCandidates(order, entry, jobs[j].job.qos, entries, used);
      if (candidates.empty()) continue;
      // What-if: release victims in order until the job fits; put them back if it never does.
      std::vector<std::pair<size_t, std::vector<Placement>>> released;
      JobResult trial;
      for (const PreemptionCandidate& c : candidates) {
        const size_t v = entry_job[c.index];
        std::vector<Placement> placements;
        for (AllocationId id : held[v]) {
          placements.push_back(*ledger.Find(id));
          RETURN_IF_ERROR(ledger.Release(id));
        }
        released.emplace_back(v, std::move(placements));
        scheduler->SetNodeMask(reserved && *reserved != j ? &held_mask : nullptr);
        trial = scheduler->ScheduleJob(jobs[j].job);
        scheduler->SetNodeMask(nullptr);
        if (trial.placed) break;
      }
      if (!trial.placed) {
        for (auto& [v, placements] : released) {
          held[v].clear();
          for (const Placement& p : placements) {
            auto id = ledger.Commit(p);
            if (!id.ok()) return id.status().WithContext("restoring a job after a preemption what-if");
            held[v].push_back(*id);
          }
        }
        continue;
      }
      for (auto& [v, placements] : released) {
        stop_job(v, now, out.preempted_lost_milli_seconds);
        ++out.preemptions;
      }
      if (reserved == j) reserved.reset();
      held[j] = std::move(trial.allocations);
      usage[{jobs[j].job.tenant, jobs[j].job.queue}] += demand[j];
      pending_milli -= demand[j].gpu;
      start_job(j, now);
      ++out.preemptors;
      started_any = true;
    }
    if (started_any) std::erase_if(pending, [&](size_t j) { return running.count(j) != 0; });
    return Status::Ok();
  };
  while (drop_stale(), next_arrival < jobs.size() || !ends.empty() || failures.down() > 0) {
    int64_t now = next_arrival < jobs.size() ? jobs[next_arrival].arrival : std::numeric_limits<int64_t>::max();
    if (!ends.empty()) now = std::min(now, ends.top().time);
    if (const NodeEvent* e = failures.Next()) now = std::min(now, e->time);
    // The state is constant between events: the integral, and the samples that fall before `now`.
    out.allocated_milli_seconds += ledger.used_gpu_share() * (now - last_time);
    if (const int64_t until = std::min(now, out.window); until > last_time) {
      out.window_allocated_milli_seconds += ledger.used_gpu_share() * (until - last_time);
      out.window_asked_milli_seconds += asked_running * (until - last_time);
    }
    RETURN_IF_ERROR(integrate(last_time, now));
    while (next_sample < now) {
      if (out.samples.size() >= kMaxSeriesCells)
        return Status::ResourceExhausted(fmt::format(
            "the series would pass {} samples at {} s: choose a longer sample step than {} s", kMaxSeriesCells,
            next_sample, options.sample_seconds));
      out.samples.push_back({next_sample, ledger.used_gpu_share(), static_cast<int64_t>(running.size()),
                             static_cast<int64_t>(pending.size()), pending_milli});
      next_sample += options.sample_seconds;
    }
    last_time = now;
    while (drop_stale(), !ends.empty() && ends.top().time == now) {
      const size_t j = ends.top().job;
      ends.pop();
      ++end_generation[j];
      running.erase(j);
      asked_running -= asked[j];
      for (AllocationId id : held[j]) RETURN_IF_ERROR(ledger.Release(id));
      held[j].clear();
      usage[{jobs[j].job.tenant, jobs[j].job.queue}] -= demand[j];
      asked_milli[queue_of[j]] -= demand[j].gpu;
      held_milli[queue_of[j]] -= demand[j].gpu;
      ++epoch;
    }
    // Idle (no work a failure could stop, judged as the instant begins): failures pass over, so
    // that the repairs run out and the replay ends.
    const bool idle = next_arrival >= jobs.size() && running.empty();
    while (const NodeEvent* e = failures.Next()) {
      if (e->time != now) break;
      const std::optional<NodeEvent> ev = failures.Pop(idle);
      if (!ev) continue;
      if (ev->fails) {
        RETURN_IF_ERROR(fail_node(ev->node, now));
      } else {
        RETURN_IF_ERROR(ledger.SetNodeHealthy(ev->node, true));
        ++epoch;  // capacity grew
      }
    }
    while (next_arrival < jobs.size() && jobs[next_arrival].arrival == now) {
      pending.push_back(next_arrival);
      pending_milli += demand[next_arrival].gpu;
      asked_milli[queue_of[next_arrival]] += demand[next_arrival].gpu;
      ++next_arrival;
    }
    // One pass over the jobs that may fit now. Left out, because the pass could only skip them:
    // - those that failed since the last end (capacity has only shrunk since);
    // - when pruning, in each group, past the first free/demand + 1: a pass places at most
    //   free/demand jobs of a demand, so a later one of the group comes after one of its shape that
    //   failed, and is skipped. (The job nodes are held for is always offered.)
    // One case breaks the second rule: when the job nodes are held for starts, the hold is free
    // mid-pass, and the next job in the pass's order to be skipped takes it, which could be one
    // left out. Then the pass is undone and run again offering every job.
    const SeededRng rng_before = rng;
    const std::optional<size_t> reserved_before = reserved;
    const std::vector<uint8_t> mask_before = held_mask.reason;
    const int64_t reservations_before = out.reservations, attempts_before = out.attempts;
    for (bool prune : {options.prune_pass, false}) {
      pass_failed.clear();
      const int64_t free_milli = out.capacity_milli - ledger.used_gpu_share();
      std::vector<PendingEntry> entries;
      std::vector<size_t> entry_job;
      std::vector<uint32_t> touched;
      std::vector<std::pair<size_t, uint64_t>> epoch_undo;
      bool left_out_may_hold = false;  // a job left out has waited long enough to get a hold
      for (size_t j : pending) {
        if (failed_epoch[j] == epoch) continue;
        if (prune && reserved != j && demand[j].gpu > 0) {
          int64_t& n = offered_of_group[group[j]];
          if (n == 0) touched.push_back(group[j]);
          if (n > free_milli / demand[j].gpu) {
            epoch_undo.emplace_back(j, failed_epoch[j]);
            failed_epoch[j] = epoch;  // as the pass would have: skipped behind its shape's failure
            left_out_may_hold |=
                options.reserve_after_seconds >= 0 && now - jobs[j].arrival >= options.reserve_after_seconds;
            continue;
          }
          ++n;
        }
        entries.push_back({j, jobs[j].job.tenant, jobs[j].job.queue, jobs[j].job.priority, demand[j]});
        entry_job.push_back(j);
      }
      for (uint32_t g : touched) offered_of_group[g] = 0;
      if (entries.empty()) break;
      std::vector<UsageEntry> used;
      used.reserve(usage.size());
      for (const auto& [key, r] : usage) used.push_back({key.first, key.second, r});
      QueueOrder::Pass pass = order.Begin(entries, used, total);
      std::set<uint32_t> failed_shapes;
      std::vector<size_t> placed;
      bool holder_started = false;
      while (auto next = pass.Next()) {
        const size_t j = entry_job[*next];
        const bool holder = reserved == j;  // sees the held nodes, and its own shape
        if (!holder && failed_shapes.count(shape[j])) {
          epoch_undo.emplace_back(j, failed_epoch[j]);
          failed_epoch[j] = epoch;
          pass.Skipped(*next);
          maybe_reserve(j, now);
          continue;
        }
        ++out.attempts;
        scheduler->SetNodeMask(reserved && !holder ? &held_mask : nullptr);
        JobResult r = scheduler->ScheduleJob(jobs[j].job);
        if (!r.placed) {
          pass_failed.push_back(j);
          if (!holder) failed_shapes.insert(shape[j]);
          epoch_undo.emplace_back(j, failed_epoch[j]);
          failed_epoch[j] = epoch;
          pass.Skipped(*next);
          maybe_reserve(j, now);
          continue;
        }
        if (holder) {
          reserved.reset();
          holder_started = true;
        }
        pass.Placed(*next);
        placed.push_back(j);
        held[j] = std::move(r.allocations);
        usage[{jobs[j].job.tenant, jobs[j].job.queue}] += demand[j];
        pending_milli -= demand[j].gpu;
      }
      scheduler->SetNodeMask(nullptr);
      if (prune && holder_started && left_out_may_hold) {  // undo, and offer every job
        for (size_t j : placed) {
          for (AllocationId id : held[j]) RETURN_IF_ERROR(ledger.Release(id));
          held[j].clear();
          usage[{jobs[j].job.tenant, jobs[j].job.queue}] -= demand[j];
          pending_milli += demand[j].gpu;
        }
        for (auto it = epoch_undo.rbegin(); it != epoch_undo.rend(); ++it) failed_epoch[it->first] = it->second;
        rng = rng_before;
        reserved = reserved_before;
        held_mask.reason = mask_before;
        out.reservations = reservations_before;
        out.attempts = attempts_before;
        ++out.redone_passes;
        continue;
      }
      ++out.passes;
      for (size_t j : placed) start_job(j, now);
      if (!placed.empty()) std::erase_if(pending, [&](size_t j) { return running.count(j) != 0; });
      break;
    }
    if (!pass_failed.empty()) RETURN_IF_ERROR(preempt(now));
    if (mo.max_moves > 0 && !pass_failed.empty()) RETURN_IF_ERROR(migrate(now));
  }
  out.makespan = last_time;
  out.samples.push_back({last_time, ledger.used_gpu_share(), 0, static_cast<int64_t>(pending.size()), pending_milli});
  if (out.makespan > 0 && out.capacity_milli > 0)
    out.utilisation = static_cast<double>(out.allocated_milli_seconds) /
                      (static_cast<double>(out.capacity_milli) * static_cast<double>(out.makespan));
  std::vector<int64_t> waits, jcts;
  std::map<std::string, std::vector<int64_t>> by_queue;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const ReplayJob& r = out.jobs[i];
    if (r.start < 0) continue;
    waits.push_back(r.start - r.arrival);
    jcts.push_back(r.end - r.arrival);
    by_queue[jobs[i].job.queue].push_back(r.start - r.arrival);
  }
  for (const ReplayJob& r : out.jobs) out.completed_in_window += r.end >= 0 && r.end <= out.window ? 1 : 0;
  out.wait = Summarize(std::move(waits));
  out.jct = Summarize(std::move(jcts));
  for (auto& [q, v] : by_queue) out.wait_by_queue[q] = Summarize(std::move(v));
  return out;
}

std::string ReplayQueueSeriesCsv(const ReplayResult& result, int64_t step_seconds) {
  std::string out = "time_s,queue,asked_gpus,allocated_gpus\n";
  const auto step = static_cast<double>(step_seconds);
  for (size_t b = 0; b < result.queue_steps.size(); ++b) {
    for (size_t q = 0; q < result.queue_names.size(); ++q) {
      const QueueStep& s = result.queue_steps[b][q];
      out += fmt::format("{},{},{:.3f},{:.3f}\n", static_cast<int64_t>(b) * step_seconds, result.queue_names[q],
                         static_cast<double>(s.asked_milli_seconds) / 1000.0 / step,
                         static_cast<double>(s.held_milli_seconds) / 1000.0 / step);
    }
  }
  return out;
}

std::string ReplaySeriesCsv(const ReplayResult& result) {
  std::string out = "time_s,allocated_gpus,running_jobs,pending_jobs,pending_gpus\n";
  for (const ReplaySample& s : result.samples) {
    out += fmt::format("{},{:.3f},{},{},{:.3f}\n", s.time, s.allocated_milli / 1000.0, s.running_jobs,
                       s.pending_jobs, s.pending_gpus_milli / 1000.0);
  }
  return out;
}

}  // namespace gpupool
