// PoolState: the indexes and counts kept in step (see state.h).
#include "server/state.h"

#include <fmt/format.h>

#include "server/service_internal.h"

namespace gpupool {

using namespace service_internal;

std::string_view JobPhaseName(JobPhase p) {
  switch (p) {
    case JobPhase::kPending: return "pending";
    case JobPhase::kRunning: return "running";
    case JobPhase::kSucceeded: return "succeeded";
    case JobPhase::kFailed: return "failed";
    case JobPhase::kCancelled: return "cancelled";
  }
  return "?";
}

std::string_view TaskPhaseName(TaskPhase p) {
  switch (p) {
    case TaskPhase::kPending: return "pending";
    case TaskPhase::kAssigned: return "assigned";
    case TaskPhase::kRunning: return "running";
    case TaskPhase::kStopping: return "stopping";
    case TaskPhase::kSucceeded: return "succeeded";
    case TaskPhase::kFailed: return "failed";
    case TaskPhase::kCancelled: return "cancelled";
    case TaskPhase::kPreempted: return "preempted";
  }
  return "?";
}

PoolJob& PoolState::AddJob(std::unique_ptr<PoolJob> job) {
  PoolJob& j = *job;
  const uint64_t seq = j.rec.seq;
  by_seq[seq] = &j;
  by_tenant[j.rec.tenant].insert(seq);
  ++job_phase_count[static_cast<size_t>(j.phase)];
  ++queue_phase_count[j.rec.queue][static_cast<size_t>(j.phase)];
  if (j.phase == JobPhase::kPending) {
    pending.insert(seq);
    pending_counts.Add(j.rec.tenant, j.rec.queue, static_cast<int64_t>(j.tasks.size()));
  }
  if (j.phase == JobPhase::kRunning && j.job.time_limit_seconds > 0) time_limited.insert(seq);
  jobs[j.rec.id] = std::move(job);
  return j;
}

std::map<uint64_t, PoolJob*>::iterator PoolState::RemoveJob(std::map<uint64_t, PoolJob*>::iterator it) {
  const uint64_t seq = it->first;
  PoolJob& j = *it->second;
  if (j.phase == JobPhase::kPending)
    pending_counts.Remove(j.rec.tenant, j.rec.queue, static_cast<int64_t>(j.tasks.size()));
  pending.erase(seq);
  partial.erase(seq);
  nominators.erase(seq);
  time_limited.erase(seq);
  stopping_jobs.erase(j.rec.id);
  --job_phase_count[static_cast<size_t>(j.phase)];
  if (auto q = queue_phase_count.find(j.rec.queue); q != queue_phase_count.end()) {
    --q->second[static_cast<size_t>(j.phase)];
    if (q->second == JobCounts{}) queue_phase_count.erase(q);
  }
  if (auto t = by_tenant.find(j.rec.tenant); t != by_tenant.end()) {
    t->second.erase(seq);
    if (t->second.empty()) by_tenant.erase(t);
  }
  const std::string id = j.rec.id;
  auto next = by_seq.erase(it);
  jobs.erase(id);
  return next;
}

void PoolState::SetJobPhase(PoolJob& j, JobPhase phase) {
  if (j.phase == phase) return;
  const auto tasks = static_cast<int64_t>(j.tasks.size());
  if (j.phase == JobPhase::kPending) pending_counts.Remove(j.rec.tenant, j.rec.queue, tasks);
  if (phase == JobPhase::kPending) pending_counts.Add(j.rec.tenant, j.rec.queue, tasks);
  --job_phase_count[static_cast<size_t>(j.phase)];
  ++job_phase_count[static_cast<size_t>(phase)];
  auto& in_queue = queue_phase_count[j.rec.queue];
  --in_queue[static_cast<size_t>(j.phase)];
  ++in_queue[static_cast<size_t>(phase)];
  j.phase = phase;
  if (phase != JobPhase::kPending) ClearNomination(j);
  if (phase == JobPhase::kRunning && j.job.time_limit_seconds > 0) {
    time_limited.insert(j.rec.seq);
  } else {
    time_limited.erase(j.rec.seq);
  }
  if (phase != JobPhase::kPending && reserved_for == j.rec.id) {
    // The job the nodes were held for has left the queue: smaller jobs may backfill them again.
    reserved_for.clear();
    reserved_nodes.clear();
    ++capacity_epoch;
  }
}

void PoolState::ClearNomination(PoolJob& j) {
  if (j.nominated_nodes.empty() && j.nominated_from_queues.empty()) return;
  j.nominated_nodes.clear();
  j.nominated_from_queues.clear();
  nominators.erase(j.rec.seq);
  ++capacity_epoch;  // masked nodes are open again
}

void PoolState::SetTaskPhase(PoolJob& j, PoolTask& ts, TaskPhase phase) {
  --j.task_counts[static_cast<size_t>(ts.phase)];
  ++j.task_counts[static_cast<size_t>(phase)];
  if (phase == TaskPhase::kStopping && ts.phase != phase) {
    stopping_jobs.insert(j.rec.id);
  } else if (ts.phase == TaskPhase::kStopping && phase != TaskPhase::kStopping &&
             j.task_counts[static_cast<size_t>(TaskPhase::kStopping)] == 0) {
    stopping_jobs.erase(j.rec.id);
  }
  ts.phase = phase;
}

PoolJob* PoolState::FindJob(const std::string& id) {
  auto it = jobs.find(id);
  return it == jobs.end() ? nullptr : it->second.get();
}

const PoolJob* PoolState::FindJob(const std::string& id) const {
  auto it = jobs.find(id);
  return it == jobs.end() ? nullptr : it->second.get();
}

Status PoolState::CheckInvariants() const {
  RETURN_IF_ERROR(ledger.CheckInvariants());
  size_t live = 0;
  std::array<int64_t, 5> phases{};
  std::map<std::string, std::array<int64_t, 5>> by_queue;
  std::map<std::string, PendingCount> pending_by_tenant;
  for (const auto& [id, j] : jobs) {
    ++phases[static_cast<size_t>(j->phase)];
    ++by_queue[j->rec.queue][static_cast<size_t>(j->phase)];
    if (j->phase == JobPhase::kPending) {
      ++pending_by_tenant[j->rec.tenant].jobs;
      pending_by_tenant[j->rec.tenant].tasks += static_cast<int64_t>(j->tasks.size());
    }
    std::array<int32_t, kTaskPhaseCount> counts{};
    for (const PoolTask& ts : j->tasks) ++counts[static_cast<size_t>(ts.phase)];
    if (counts != j->task_counts) return Status::Internal(fmt::format("job {}: per-phase task counts are off", id));
    for (size_t i = 0; i < j->tasks.size(); ++i) {
      const PoolTask& ts = j->tasks[i];
      if (IsLive(ts.phase) != ts.placed)
        return Status::Internal(
            fmt::format("task {}[{}] is {} but placed={}", id, i, TaskPhaseName(ts.phase), ts.placed));
      if (!ts.placed) continue;
      ++live;
      const Placement* p = ledger.Find(ts.allocation);
      if (p == nullptr || !(*p == ts.placement))
        return Status::Internal(fmt::format("task {}[{}]: the ledger does not hold its placement", id, i));
    }
  }
  if (live != ledger.allocation_count())
    return Status::Internal(
        fmt::format("{} live tasks but {} ledger allocations", live, ledger.allocation_count()));
  if (phases != job_phase_count) return Status::Internal("the per-phase job counts are off");
  for (const auto& [queue, counts] : queue_phase_count) {
    auto it = by_queue.find(queue);
    if (counts != (it == by_queue.end() ? std::array<int64_t, 5>{} : it->second))
      return Status::Internal(fmt::format("queue '{}': the per-phase job counts are off", queue));
  }
  for (const auto& [queue, counts] : by_queue) {
    if (!queue_phase_count.count(queue))
      return Status::Internal(fmt::format("queue '{}': its jobs are not counted", queue));
  }
  size_t indexed = 0;
  for (const auto& [tenant, seqs] : by_tenant) {
    indexed += seqs.size();
    for (uint64_t seq : seqs) {
      auto it = by_seq.find(seq);
      if (it == by_seq.end() || it->second->rec.tenant != tenant)
        return Status::Internal(fmt::format("the tenant index lists job #{} under '{}' wrongly", seq, tenant));
    }
  }
  if (indexed != by_seq.size())
    return Status::Internal(fmt::format("the tenant index holds {} jobs, there are {}", indexed, by_seq.size()));
  for (const auto& [tenant, want] : pending_by_tenant) {
    const PendingCount have = pending_counts.tenant(tenant);
    if (have.jobs != want.jobs || have.tasks != want.tasks)
      return Status::Internal(fmt::format("tenant '{}': {} pending jobs ({} tasks) counted, {} ({}) pending",
                                          tenant, have.jobs, have.tasks, want.jobs, want.tasks));
  }
  if (pending_counts.tenants().size() != pending_by_tenant.size())
    return Status::Internal("pending counts held for tenants with nothing pending");
  for (const auto& [id, j] : jobs) {
    const bool stopping = j->task_counts[static_cast<size_t>(TaskPhase::kStopping)] > 0;
    if (stopping != (stopping_jobs.count(id) > 0))
      return Status::Internal(fmt::format("job {}: the stopping index says {}", id, !stopping));
  }
  if (stopping_jobs.size() > jobs.size()) return Status::Internal("the stopping index lists jobs that are gone");
  if (!reserved_for.empty()) {
    const PoolJob* r = FindJob(reserved_for);
    if (r == nullptr || r->phase != JobPhase::kPending)
      return Status::Internal(fmt::format("nodes are held for job '{}', which is not pending", reserved_for));
  }
  return Status::Ok();
}

std::vector<GpuUse> PoolState::GpuUsage() const {
  std::vector<GpuUse> out;
  std::map<std::pair<NodeIndex, int>, std::pair<int64_t, int64_t>> granted;
  for (const auto& [id, j] : jobs) {
    for (const PoolTask& ts : j->tasks) {
      if (!ts.placed) continue;
      for (const GpuGrant& g : ts.placement.gpus) {
        auto& e = granted[{ts.placement.node, g.gpu}];
        e.first += g.share.units();
        e.second += g.memory.units();
      }
    }
  }
  for (NodeIndex n = 0; n < ledger.node_count(); ++n) {
    const NodeSpec& s = ledger.spec(n);
    const NodeState& st = ledger.state(n);
    for (size_t g = 0; g < s.gpus.size(); ++g) {
      GpuUse u;
      u.node = s.name;
      u.gpu = static_cast<int>(g);
      u.ledger_used_share = 1000 - st.gpus[g].free_share;
      u.ledger_used_memory = s.gpus[g].memory.units() - st.gpus[g].free_memory;
      auto it = granted.find({n, static_cast<int>(g)});
      if (it != granted.end()) {
        u.granted_share = it->second.first;
        u.granted_memory = it->second.second;
      }
      u.capacity_memory = s.gpus[g].memory.units();
      out.push_back(u);
    }
  }
  return out;
}

}  // namespace gpupool
