// StateMachine, the operations on jobs and tasks: submissions, cancels, agents' task reports, and
// what the scheduling loop's controllers decide (placements, waits, preemptions, reservations,
// overdue stops, retention).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "server/identities.h"
#include "server/resources_json.h"
#include "server/service_internal.h"
#include "server/state_machine.h"

namespace gpupool {

using namespace service_internal;

namespace {

std::string FormatTimeMs(int64_t ms) { return FormatTime(ms); }

}  // namespace

Status StateMachine::On(SubmitJobOp& op) {
  if (st_.FindJob(op.rec.id) != nullptr || st_.by_seq.count(op.rec.seq))
    return Status::FailedPrecondition(fmt::format("job '{}' (#{}) exists already", op.rec.id, op.rec.seq));
  auto job = std::make_unique<PoolJob>();
  job->rec = op.rec;
  job->demand = op.demand;
  job->pending_since_ms = now_;
  job->submit_mono = mono_;
  for (size_t g = 0; g < op.job.groups.size(); ++g) {
    for (int rep = 0; rep < op.job.groups[g].replicas; ++rep) {
      PoolTask ts;
      ts.group = static_cast<int>(g);
      ts.replica = rep;
      ts.updated_ms = now_;
      job->tasks.push_back(ts);
      job->task_group.push_back(static_cast<int>(g));
    }
  }
  if (!op.written) fx_->batch.Append(SubmissionWrites(op));
  job->job = std::move(op.job);
  job->task_counts[static_cast<size_t>(TaskPhase::kPending)] = static_cast<int32_t>(job->tasks.size());
  st_.AddJob(std::move(job));
  ++fx_->metrics.submitted;
  fx_->wake = true;
  return Status::Ok();
}

Status StateMachine::On(const CancelJobOp& op) {
  PoolJob* jp = st_.FindJob(op.job_id);
  if (jp == nullptr) return Status::NotFound(fmt::format("job '{}' not found", op.job_id));
  PoolJob& j = *jp;
  if (IsTerminal(j.phase))
    return Status::FailedPrecondition(fmt::format("job '{}' is already {}", op.job_id, JobPhaseName(j.phase)));
  for (size_t i = 0; i < j.tasks.size(); ++i) {
    PoolTask& ts = j.tasks[i];
    if (ts.phase == TaskPhase::kPending) {
      st_.SetTaskPhase(j, ts, TaskPhase::kCancelled);
      ts.updated_ms = now_;
      WriteTask(j, static_cast<int>(i));
    } else {
      StopTask(j, static_cast<int>(i), TaskPhase::kCancelled, "job cancelled");
    }
  }
  st_.SetJobPhase(j, JobPhase::kCancelled);
  j.rec.reason = "cancelled by " + op.by;
  st_.pending.erase(j.rec.seq);
  st_.partial.erase(j.rec.seq);
  ++fx_->metrics.finished["cancelled"];
  Event(j.rec.id, "Cancelled", j.rec.reason);
  WriteJob(j);
  return Status::Ok();
}

Status StateMachine::On(const ReportTaskOp& op) {
  const TaskReport& report = op.report;
  const std::string& node = op.node;
  const std::string& job_id = report.job_id;
  const int index = report.index;
  const std::string& state = report.state;
  const int exit_code = report.exit_code;
  std::string message = report.message;
  const int run = report.run;
  const std::optional<std::string>& run_id = report.run_id;
  auto n = st_.ledger.FindNode(node);
  if (!n) return Status::NotFound(fmt::format("node '{}' is not registered", node));
  PoolJob* j = st_.FindJob(job_id);
  if (j == nullptr) return Status::NotFound(fmt::format("job '{}' not found", job_id));
  if (index < 0 || static_cast<size_t>(index) >= j->tasks.size())
    return Status::NotFound(fmt::format("job '{}' has no task {}", job_id, index));
  PoolTask& ts = j->tasks[static_cast<size_t>(index)];
  if (run_id && ts.placed && ts.placement.node == *n && !ConstantTimeEqual(*run_id, ts.run_id))
    return Status::FailedPrecondition(fmt::format(
        "runId: task {}[{}] is at another run than the report's (a process of an earlier placement, or of "
        "another pool): ignored",
        job_id, index));
  if (!ts.placed || ts.placement.node != *n || (run >= 0 && run != ts.restarts)) {
    // A late report for a task that has moved on (released, requeued): harmless, say so.
    if (run >= 0 && run != ts.restarts && ts.placed && ts.placement.node == *n)
      return Status::FailedPrecondition(fmt::format(
          "task {}[{}]: the report is about run {}, the task is at run {}", job_id, index, run, ts.restarts));
    return Status::FailedPrecondition(fmt::format("task {}[{}] is not assigned to node '{}' (it is {})",
                                                  job_id, index, node, TaskPhaseName(ts.phase)));
  }
  const TaskGroup& g = j->job.groups[static_cast<size_t>(ts.group)];
  const std::string task_name = fmt::format("{}[{}]", g.name, ts.replica);
  if (state == "running") {
    if (ts.phase == TaskPhase::kAssigned) {
      st_.SetTaskPhase(*j, ts, TaskPhase::kRunning);
      ts.updated_ms = now_;
      ts.image = report.image;
      WriteTask(*j, index);
      Event(job_id, "TaskStarted",
            report.image.empty() ? fmt::format("task {} started on {}", task_name, node)
                                 : fmt::format("task {} started on {} from image {}", task_name, node, report.image));
    }
    return Status::Ok();
  }
  TaskPhase end;
  bool unasked_stop = false;
  if (ts.phase == TaskPhase::kStopping) {
    end = (state == "succeeded") && ts.stop_outcome == TaskPhase::kCancelled ? TaskPhase::kCancelled
                                                                             : ts.stop_outcome;
  } else if (state == "succeeded") {
    end = TaskPhase::kSucceeded;
  } else if (state == "failed") {
    end = TaskPhase::kFailed;
  } else {
    // Stopped without being asked: the agent fenced it (its lease ran out), or the machine
    // killed it. Not the task's own doing, so it is a fault, not a failure.
    end = TaskPhase::kFailed;
    unasked_stop = true;
    if (message.empty()) message = "stopped without being asked to";
  }
  ReleaseTask(*j, index, /*agent_ended_it=*/true);
  st_.SetTaskPhase(*j, ts, end);
  ts.exit_code = exit_code;
  ts.end_message = message;
  ts.updated_ms = now_;
  Event(job_id, "TaskFinished",
        fmt::format("task {} on {}: {} (exit code {}){}{}", task_name, node, TaskPhaseName(end), exit_code,
                    message.empty() ? "" : ": ", message));
  if (end == TaskPhase::kFailed && (j->job.retry.on_failure || unasked_stop) && j->phase == JobPhase::kRunning &&
      j->rec.faults < j->job.retry.max_restarts) {
    // A fault like a lost node: the gang restarts from its checkpoint.
    const std::string reason = unasked_stop
                                   ? fmt::format("task {} stopped on {}: {}", task_name, node, message)
                                   : fmt::format("task {} failed on {} with exit code {}{}{}", task_name, node,
                                                 exit_code, message.empty() ? "" : ": ", message);
    st_.SetTaskPhase(*j, ts, TaskPhase::kPreempted);
    ts.stop_reason = reason;
    FaultJob(*j, unasked_stop ? "task_stopped" : "task_failed", reason);
  }
  WriteTask(*j, index);
  AfterTaskEnded(*j);
  return Status::Ok();
}

Status StateMachine::On(const CycleStartOp&) {
  for (uint64_t seq : st_.pending) {
    PoolJob& j = *st_.by_seq[seq];
    // A preemptor whose victims had stopped before this cycle had its chance at the nodes it held
    // (the last cycle): placed, it is no longer pending; not, it holds them no longer (a new
    // preemption holds them again).
    if (j.waiting_for.empty()) st_.ClearNomination(j);
    // Preemptors stop waiting once their victims have stopped.
    for (auto it = j.waiting_for.begin(); it != j.waiting_for.end();) {
      const PoolJob* v = st_.FindJob(*it);
      const bool stopping = v != nullptr && v->task_counts[static_cast<size_t>(TaskPhase::kStopping)] > 0;
      it = stopping ? std::next(it) : j.waiting_for.erase(it);
    }
    if (j.waiting_for.empty() && j.rec.not_before_ms > now_) {
      // Retry backoff after a fault (docs/jobspec.md#retry).
      j.pending_message = fmt::format("waiting for its retry backoff (restart {} of {}) until {}", j.rec.faults,
                                      j.job.retry.max_restarts, FormatTimeMs(j.rec.not_before_ms));
    }
  }
  return Status::Ok();
}

void StateMachine::GiveTenantIdentity(const PoolJob& j) {
  if (QueueListed(config_.sandbox.root_queues, j.rec.queue) || TenantIdentity(config_, st_, j.rec.tenant)) return;
  auto uid = FreeTenantUid(config_, st_);
  if (!uid) {
    Event(j.rec.id, "SandboxRangeFull",
          fmt::format("every uid of the sandbox range [{}, {}) belongs to a tenant: tenant '{}' runs as nobody (65534) "
                      "until the admin widens sandbox.uidCount or gives it tenants.{}.uid",
                      config_.sandbox.uid_base, config_.sandbox.uid_base + config_.sandbox.uid_count, j.rec.tenant,
                      j.rec.tenant.empty() ? "<name>" : j.rec.tenant));
    return;
  }
  st_.tenant_uids[j.rec.tenant] = *uid;
  fx_->batch.Add(PutMeta{kTenantUidKeyPrefix + j.rec.tenant, std::to_string(*uid)});
}

Status StateMachine::On(const PlaceTasksOp& op) {
  PoolJob* jp = st_.FindJob(op.job_id);
  if (jp == nullptr) return Status::NotFound(fmt::format("job '{}' not found", op.job_id));
  PoolJob& j = *jp;
  const bool starts = j.phase == JobPhase::kPending;
  if (!starts && j.phase != JobPhase::kRunning)
    return Status::FailedPrecondition(fmt::format("job '{}' is {}: nothing to place", op.job_id, JobPhaseName(j.phase)));
  if (op.tasks.empty()) return Status::InvalidArgument("no task to place");
  std::set<int> seen;
  for (const TaskPlacement& p : op.tasks) {
    if (p.task < 0 || static_cast<size_t>(p.task) >= j.tasks.size() || !seen.insert(p.task).second ||
        j.tasks[static_cast<size_t>(p.task)].phase != TaskPhase::kPending)
      return Status::FailedPrecondition(fmt::format("task {}[{}] is not a pending task", op.job_id, p.task));
  }
  // Every allocation is committed before anything else changes; one that does not fit undoes the
  // others.
  std::vector<AllocationId> ids;
  for (const TaskPlacement& p : op.tasks) {
    auto id = st_.ledger.Commit(p.placement);
    if (!id.ok()) {
      for (AllocationId a : ids) (void)st_.ledger.Release(a);
      return id.status().WithContext(fmt::format("placing {}[{}]", op.job_id, p.task));
    }
    ids.push_back(*id);
  }
  std::set<std::string> node_names;
  for (size_t k = 0; k < op.tasks.size(); ++k) {
    const TaskPlacement& p = op.tasks[k];
    PoolTask& ts = j.tasks[static_cast<size_t>(p.task)];
    st_.SetTaskPhase(j, ts, TaskPhase::kAssigned);
    ts.placed = true;
    ts.run_id = p.run_id;
    ts.placement = p.placement;
    ts.last_node = st_.ledger.spec(p.placement.node).name;
    ts.allocation = ids[k];
    ts.updated_ms = now_;
    st_.nodes[p.placement.node].tasks.insert({j.rec.id, p.task});
    fx_->nodes_changed.insert(p.placement.node);
    st_.usage[{j.rec.tenant, j.rec.queue}] += TaskDemand(j.job.groups[static_cast<size_t>(ts.group)].request);
    node_names.insert(ts.last_node);
    WriteTask(j, p.task);
  }
  fx_->metrics.task_placements += op.tasks.size();
  GiveTenantIdentity(j);
  const bool all = j.task_counts[static_cast<size_t>(TaskPhase::kPending)] == 0;
  if (!starts) {
    if (all) st_.partial.erase(j.rec.seq);
    return Status::Ok();
  }
  if (!all) st_.partial.insert(j.rec.seq);
  st_.SetJobPhase(j, JobPhase::kRunning);
  j.rec.reason = "";
  j.pending_message.clear();
  j.started_ms = now_;
  j.rec.started_ms = now_;
  st_.pending.erase(j.rec.seq);
  Event(j.rec.id, "Scheduled",
        fmt::format("placed {} of {} task(s) on {}", op.tasks.size(), j.tasks.size(), fmt::join(node_names, ", ")));
  WriteJob(j);
  ++fx_->metrics.placements;
  fx_->metrics.scheduling_latency.Observe(mono_ - j.submit_mono);
  return Status::Ok();
}

Result<PoolJob*> StateMachine::PendingJob(const std::string& id) {
  PoolJob* j = st_.FindJob(id);
  if (j == nullptr || j->phase != JobPhase::kPending)
    return Status::FailedPrecondition(fmt::format("job '{}' is not pending", id));
  return j;
}

Status StateMachine::On(const JobWaitsOp& op) {
  ASSIGN_OR_RETURN(PoolJob * j, PendingJob(op.job_id));
  if (!op.pending_task.empty()) j->pending_task = op.pending_task;
  j->diagnosis = op.diagnosis;
  if (op.message != j->pending_message) {
    j->pending_message = op.message;
    j->rec.reason = op.message;
    Event(j->rec.id, "Pending", op.message);
    WriteJob(*j);
  }
  return Status::Ok();
}

Status StateMachine::On(const PreemptOp& op) {
  ASSIGN_OR_RETURN(PoolJob * j, PendingJob(op.job_id));
  if (op.victims.empty()) return Status::InvalidArgument("no victim");
  std::vector<PoolJob*> victims;
  for (const PreemptOp::Victim& v : op.victims) {
    PoolJob* vj = st_.FindJob(v.job_id);
    if (vj == nullptr || vj->phase != JobPhase::kRunning)
      return Status::FailedPrecondition(fmt::format("victim '{}' is not running", v.job_id));
    victims.push_back(vj);
  }
  std::vector<std::string> names;
  for (size_t k = 0; k < victims.size(); ++k) {
    PoolJob& v = *victims[k];
    for (size_t t = 0; t < v.tasks.size(); ++t) StopTask(v, static_cast<int>(t), TaskPhase::kPreempted, op.victims[k].reason);
    Event(v.rec.id, "Preempted",
          op.victims[k].reason +
              fmt::format("; tasks get SIGTERM and {} s to checkpoint", op.grace_period_seconds));
    j->waiting_for.insert(v.rec.id);
    names.push_back(v.rec.id);
    ++fx_->metrics.preemptions;
  }
  if (!op.nodes.empty() && op.nodes.size() != st_.ledger.node_count())
    return Status::InvalidArgument("the node set is not the pool's");
  st_.ClearNomination(*j);
  if (!op.nodes.empty()) {
    j->nominated_nodes = op.nodes;
    for (const PoolJob* v : victims) j->nominated_from_queues.insert(v->rec.queue);
    st_.nominators.insert(j->rec.seq);
  }
  Event(j->rec.id, "Preempting", fmt::format("stopping {} to make room: {}", names.size(), fmt::join(names, ", ")));
  j->pending_message = fmt::format("waiting for {} preempted job(s) to stop", names.size());
  j->rec.reason = j->pending_message;
  WriteJob(*j);
  return Status::Ok();
}

Status StateMachine::On(const ReserveOp& op) {
  ASSIGN_OR_RETURN(PoolJob * j, PendingJob(op.job_id));
  if (!st_.reserved_for.empty())
    return Status::FailedPrecondition(fmt::format("nodes are held for job '{}' already", st_.reserved_for));
  if (op.nodes.size() != st_.ledger.node_count()) return Status::InvalidArgument("the node set is not the pool's");
  std::vector<std::string> names;
  for (NodeIndex n = 0; n < op.nodes.size(); ++n) {
    if (op.nodes[n]) names.push_back(st_.ledger.spec(n).name);
  }
  st_.reserved_for = op.job_id;
  st_.reserved_nodes = op.nodes;
  Event(j->rec.id, "Reserved",
        fmt::format("waited {} s: holding {} for this job; smaller jobs stop backfilling them",
                    (now_ - j->pending_since_ms) / 1000, fmt::join(names, ", ")));
  return Status::Ok();
}

Status StateMachine::On(const FailJobOp& op) {
  PoolJob* j = st_.FindJob(op.job_id);
  if (j == nullptr) return Status::NotFound(fmt::format("job '{}' not found", op.job_id));
  if (IsTerminal(j->phase))
    return Status::FailedPrecondition(fmt::format("job '{}' is already {}", op.job_id, JobPhaseName(j->phase)));
  if (op.reason.empty()) return Status::InvalidArgument("a job fails with a reason");
  FailJob(*j, op.reason);
  return Status::Ok();
}

Status StateMachine::On(const StopsOverdueOp& op) {
  PoolJob* jp = st_.FindJob(op.job_id);
  if (jp == nullptr) return Status::NotFound(fmt::format("job '{}' not found", op.job_id));
  PoolJob& j = *jp;
  for (int i : op.tasks) {
    if (i < 0 || static_cast<size_t>(i) >= j.tasks.size() || j.tasks[static_cast<size_t>(i)].phase != TaskPhase::kStopping)
      return Status::FailedPrecondition(fmt::format("task {}[{}] is not stopping", op.job_id, i));
  }
  bool released = false;
  for (int i : op.tasks) {
    PoolTask& ts = j.tasks[static_cast<size_t>(i)];
    if (ts.phase != TaskPhase::kStopping) continue;  // listed twice
    const NodeIndex n = ts.placement.node;
    if (ts.placed && n < st_.nodes.size() && st_.nodes[n].state == "ready") {
      // Its node still heartbeats, so its agent renews its lease and nothing fences the run: the
      // run may still be going. Released, the task could be placed again beside it (a second run
      // writing the same checkpoint, a GPU given twice). Held until the agent confirms the stop,
      // or the node is lost (its agent gone: the run fenced, then released with the node).
      if (!ts.stop_overdue_noted) {
        ts.stop_overdue_noted = true;
        Event(j.rec.id, "StopOverdue",
              fmt::format("task {} has not confirmed its stop ({}) on {}, which still heartbeats: its resources "
                          "stay held until its agent confirms the stop or the node is lost",
                          i, ts.stop_reason, st_.ledger.spec(n).name));
      }
      continue;
    }
    released = true;
    ReleaseTask(j, i);
    st_.SetTaskPhase(j, ts, ts.stop_outcome);
    ts.updated_ms = now_;
    WriteTask(j, i);
    Event(j.rec.id, "TaskFinished",
          fmt::format("task {} did not confirm its stop in time; released ({})", i, ts.stop_reason));
  }
  if (released) AfterTaskEnded(j);
  return Status::Ok();
}

Status StateMachine::On(const RemoveJobsOp& op) {
  for (uint64_t seq : op.seqs) {
    auto it = st_.by_seq.find(seq);
    const auto live = [&](TaskPhase p) { return it->second->task_counts[static_cast<size_t>(p)]; };
    if (it == st_.by_seq.end() || !IsTerminal(it->second->phase) ||
        live(TaskPhase::kAssigned) + live(TaskPhase::kRunning) + live(TaskPhase::kStopping) > 0)
      return Status::FailedPrecondition(fmt::format("job #{} is not an ended job", seq));
  }
  uint64_t removed_max = st_.removed_max_seq;
  for (uint64_t seq : op.seqs) {
    auto it = st_.by_seq.find(seq);
    if (it == st_.by_seq.end()) continue;  // listed twice
    const std::string id = it->second->rec.id;
    fx_->batch.Add(DeleteJob{id});
    removed_max = std::max(removed_max, seq);
    ++fx_->metrics.jobs_removed;
    st_.RemoveJob(it);
    fx_->jobs_removed.push_back(id);
  }
  // Cluster events (nodes lost and back, GPU conditions) age out the same way.
  if (op.events_before_ms > 0) fx_->batch.Add(DeleteClusterEvents{op.events_before_ms});
  if (removed_max != st_.removed_max_seq) {
    st_.removed_max_seq = removed_max;
    fx_->batch.Add(PutMeta{kRemovedMaxSeqKey, std::to_string(removed_max)});
  }
  return Status::Ok();
}

}  // namespace gpupool
