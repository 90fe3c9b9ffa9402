// StateMachine: applying an operation, and the job and task lifecycle its handlers share (phases,
// stops, releases, failures, faults). The handlers are in state_machine_jobs.cc and
// state_machine_nodes.cc.
#include "server/state_machine.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <type_traits>

#include "api/node_codec.h"
#include "server/resources_json.h"
#include "server/service_internal.h"

namespace gpupool {

using namespace service_internal;

const char* OperationName(const Operation& op) {
  static constexpr const char* kNames[] = {"SubmitJob",  "CancelJob",    "ReportTask", "CycleStart",
                                           "PlaceTasks", "JobWaits",     "Preempt",    "Reserve",
                                           "StopsOverdue", "RemoveJobs", "RegisterNode", "Heartbeat",
                                           "NodeLost",   "CordonNode",   "DrainNode",  "PutQueue",
                                           "FailJob"};
  static_assert(std::size(kNames) == std::variant_size_v<Operation>);
  return kNames[op.index()];
}

Status StateMachine::Apply(Operation op, Effects& fx) {
  return std::visit(
      [&](auto& o) -> Status {
        now_ = o.now_ms;
        mono_ = o.mono;
        fx_ = &fx;
        Status st = On(o);
        fx_ = nullptr;
        return st;
      },
      op);
}

WriteBatch StateMachine::SubmissionWrites(const SubmitJobOp& op) {
  WriteBatch batch;
  batch.Add(PutJob{op.rec});
  for (int i = 0; i < op.job.task_count(); ++i) {
    TaskRecord r;
    r.job_id = op.rec.id;
    r.index = i;
    r.state = "pending";
    r.updated_ms = op.now_ms;
    batch.Add(PutTask{r});
  }
  EventRecord e;
  e.job_id = op.rec.id;
  e.time_ms = op.now_ms;
  e.type = "Submitted";
  e.message = fmt::format("by tenant '{}' to queue '{}': {} task(s), needs {}", op.rec.tenant, op.rec.queue,
                          op.job.task_count(), FormatResources(op.demand));
  batch.Add(AppendEvent{e});
  return batch;
}

void StateMachine::CapacityGrew() {
  ++st_.capacity_epoch;
  fx_->wake = true;
}

void StateMachine::WriteNode(NodeIndex n) {
  const PoolNode& info = st_.nodes[n];
  fx_->batch.Add(PutNode{MakeNodeRecord(st_.ledger.spec(n).name, info.spec_json, st_.ledger.state(n).cordoned,
                                        info.draining, info.state, info.last_heartbeat_ms)});
}

void StateMachine::WriteJob(PoolJob& j) {
  fx_->jobs_changed.insert(j.rec.id);
  j.rec.state = std::string(JobPhaseName(j.phase));
  j.rec.updated_ms = now_;
  fx_->batch.Add(PutJob{j.rec});
}

void StateMachine::WriteTask(const PoolJob& j, int index) {
  fx_->jobs_changed.insert(j.rec.id);
  const PoolTask& ts = j.tasks[static_cast<size_t>(index)];
  TaskRecord r;
  r.job_id = j.rec.id;
  r.index = index;
  r.state = std::string(TaskPhaseName(ts.phase));
  if (ts.placed) {
    r.node = st_.ledger.spec(ts.placement.node).name;
    r.placement_json = PlacementToJson(ts.placement, st_.ledger).dump();
  } else {
    r.node = ts.last_node;  // a finished task remembers where it ran; only live tasks have a placement
  }
  r.exit_code = ts.exit_code;
  r.restarts = ts.restarts;
  r.updated_ms = ts.updated_ms;
  r.run_id = ts.run_id;
  r.message = ts.end_message;
  r.image = ts.image;
  r.stop_reason = ts.stop_reason;
  if (ts.phase == TaskPhase::kStopping) r.stop_outcome = std::string(TaskPhaseName(ts.stop_outcome));
  fx_->batch.Add(PutTask{r});
}

void StateMachine::Event(const std::string& job_id, const std::string& type, const std::string& message) {
  fx_->batch.Add(AppendEvent{MakeEvent(job_id, now_, type, message)});
}

void StateMachine::ReleaseTask(PoolJob& j, int index, bool agent_ended_it) {
  PoolTask& ts = j.tasks[static_cast<size_t>(index)];
  if (!ts.placed) return;
  (void)st_.ledger.Release(ts.allocation);
  st_.nodes[ts.placement.node].tasks.erase({j.rec.id, index});
  if (!agent_ended_it) fx_->nodes_changed.insert(ts.placement.node);
  Resources& u = st_.usage[{j.rec.tenant, j.rec.queue}];
  u -= TaskDemand(j.job.groups[static_cast<size_t>(ts.group)].request);
  ts.placed = false;
  ts.allocation = 0;
  CapacityGrew();
}

void StateMachine::StopTask(PoolJob& j, int index, TaskPhase outcome, const std::string& reason) {
  PoolTask& ts = j.tasks[static_cast<size_t>(index)];
  const int64_t now = now_;
  if (ts.phase == TaskPhase::kPending) {
    st_.SetTaskPhase(j, ts, outcome == TaskPhase::kPreempted ? TaskPhase::kPending : outcome);
    ts.updated_ms = now;
    WriteTask(j, index);
    return;
  }
  if (!IsLive(ts.phase)) return;
  if (ts.phase != TaskPhase::kStopping) {
    st_.SetTaskPhase(j, ts, TaskPhase::kStopping);
    fx_->nodes_changed.insert(ts.placement.node);
    ts.stop_deadline_ms = now + 1000LL * (config_.grace_period_seconds + config_.heartbeat_timeout_seconds);
    ts.stop_overdue_noted = false;
  }
  ts.stop_outcome = outcome;
  ts.stop_reason = reason;
  ts.updated_ms = now;
  WriteTask(j, index);
}

void StateMachine::FailJob(PoolJob& j, const std::string& reason) {
  st_.SetJobPhase(j, JobPhase::kFailed);
  j.rec.reason = reason;
  for (size_t i = 0; i < j.tasks.size(); ++i)
    StopTask(j, static_cast<int>(i), TaskPhase::kCancelled, "job failed");
  st_.pending.erase(j.rec.seq);
  st_.partial.erase(j.rec.seq);
  ++fx_->metrics.finished["failed"];
  Event(j.rec.id, "Failed", j.rec.reason);
  WriteJob(j);
}

// A task of `j` ended (finished, failed, or stopped). Decides what happens to the job.
void StateMachine::AfterTaskEnded(PoolJob& j) {
  bool any_live = false, any_failed = false, any_preempted = false, any_pending = false;
  int failed_index = -1;
  for (size_t i = 0; i < j.tasks.size(); ++i) {
    const PoolTask& ts = j.tasks[i];
    any_live |= IsLive(ts.phase);
    any_pending |= ts.phase == TaskPhase::kPending;
    any_preempted |= ts.phase == TaskPhase::kPreempted;
    if (ts.phase == TaskPhase::kFailed && failed_index < 0) {
      any_failed = true;
      failed_index = static_cast<int>(i);
    }
  }
  if (IsTerminal(j.phase)) {
    WriteJob(j);
    return;
  }
  const int64_t now = now_;
  if (any_failed) {
    // One failed task fails the gang: stop the rest.
    const PoolTask& f = j.tasks[static_cast<size_t>(failed_index)];
    const auto& g = j.job.groups[static_cast<size_t>(f.group)];
    std::string reason = fmt::format("task {}[{}] failed", g.name, f.replica);
    const std::string plain = fmt::format("exit code {}", f.exit_code);
    if (f.exit_code != 0 || f.end_message.empty()) reason += " with " + plain;
    if (!f.end_message.empty() && f.end_message != plain) reason += ": " + f.end_message;
    if (j.job.retry.on_failure)
      reason += fmt::format("; gave up after {} restart(s) (retry.maxRestarts {})", j.rec.faults,
                            j.job.retry.max_restarts);
    FailJob(j, reason);
    return;
  }
  if (any_live) {
    WriteJob(j);
    return;
  }
  if (any_preempted) {
    // Every task has stopped: the job goes back to its queue, to restart from its checkpoint.
    for (const PoolTask& ts : j.tasks) {
      if (ts.phase == TaskPhase::kPreempted && !ts.stop_reason.empty()) {
        j.rec.reason = ts.stop_reason;
        break;
      }
    }
    j.pending_message = j.rec.reason;
    for (size_t i = 0; i < j.tasks.size(); ++i) {
      PoolTask& ts = j.tasks[i];
      // Every task that was placed runs again as a new run (its agent tells runs apart by this).
      if (ts.phase != TaskPhase::kPending) ++ts.restarts;
      st_.SetTaskPhase(j, ts, TaskPhase::kPending);
      ts.updated_ms = now;
      WriteTask(j, static_cast<int>(i));
    }
    st_.SetJobPhase(j, JobPhase::kPending);
    j.pending_since_ms = now;
    j.submit_mono = mono_;
    st_.pending.insert(j.rec.seq);
    st_.partial.erase(j.rec.seq);
    Event(j.rec.id, "Requeued", "every task stopped; queued again (" + j.rec.reason + ")");
    WriteJob(j);
    return;
  }
  if (any_pending) {
    WriteJob(j);
    return;
  }
  st_.SetJobPhase(j, JobPhase::kSucceeded);
  j.rec.reason = "every task exited 0";
  ++fx_->metrics.finished["succeeded"];
  Event(j.rec.id, "Succeeded", "every task exited 0");
  WriteJob(j);
}

void StateMachine::FaultJob(PoolJob& j, const std::string& cause, const std::string& reason) {
  if (IsTerminal(j.phase)) return;
  bool stopping_already = false;
  for (const PoolTask& ts : j.tasks) stopping_already |= ts.phase == TaskPhase::kStopping;
  // A job already on its way out (cancelled, failed, moved) is not restarted twice for one stop.
  if (stopping_already && j.phase != JobPhase::kRunning) return;
  const int64_t now = now_;
  ++fx_->metrics.faults[cause];
  if (j.rec.faults >= j.job.retry.max_restarts) {
    FailJob(j,
            fmt::format("{}; gave up after {} restart(s) (retry.maxRestarts {})", reason, j.rec.faults,
                        j.job.retry.max_restarts));
    return;
  }
  ++j.rec.faults;
  const int64_t wait = j.job.retry.BackoffSeconds(j.rec.faults);
  j.rec.not_before_ms = now + 1000 * wait;
  for (size_t i = 0; i < j.tasks.size(); ++i)
    StopTask(j, static_cast<int>(i), TaskPhase::kPreempted, reason);
  Event(j.rec.id, "Fault",
        fmt::format("{}: the job restarts from its checkpoint (restart {} of {}{})", reason, j.rec.faults,
                    j.job.retry.max_restarts, wait > 0 ? fmt::format(", after {} s", wait) : ""));
  WriteJob(j);
}

}  // namespace gpupool
