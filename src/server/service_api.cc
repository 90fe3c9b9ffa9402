// PoolService, the client side: submissions, job reads, lists, cancels and events; node cordon
// and drain; queues. Every request is checked here before anything changes.
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
#include "server/identities.h"
#include "server/service_internal.h"
#include "server/views.h"

namespace gpupool {

using nlohmann::json;
using namespace service_internal;

Result<json> PoolService::SubmitJob(const Principal& who, std::string_view body, SpecFormat format) {
  if (who.role == Role::kAgent || who.role == Role::kNode)
    return Status::PermissionDenied("agent tokens cannot submit jobs");
  RETURN_IF_ERROR(disk_guard_->Check());
  JobSpecLimits limits;
  limits.max_bytes = config_.max_body_bytes;
  limits.max_tasks = config_.max_tasks_per_job;
  auto parsed = ParseJobSpec(body, format, limits);
  if (!parsed.ok()) return parsed.status();
  Job job = std::move(parsed).value();
  if (who.role == Role::kTenant) {
    if (!job.tenant.empty() && job.tenant != who.tenant)
      return Status::PermissionDenied(
          fmt::format("tenant: this token submits as tenant '{}' only, not '{}'", who.tenant, job.tenant));
    job.tenant = who.tenant;
  } else if (job.tenant.empty()) {
    job.tenant = who.tenant.empty() ? "default" : who.tenant;
  }
  if (job.queue.empty()) job.queue = "default";
  SetMpsOwners(config_, job);
  // The host's network is the admin's to grant, per queue, to admins' jobs too.
  for (size_t g = 0; g < job.groups.size(); ++g) {
    if (job.groups[g].exec.network == "host" && !QueueListed(config_.sandbox.host_network_queues, job.queue))
      return Status::PermissionDenied(fmt::format(
          "tasks[{}].container.network: host is not allowed in queue '{}' (the admin lists the queues that may use it "
          "in sandbox.hostNetworkQueues)",
          g, job.queue));
    // The class is settled now: a queue's forced class is written into the spec (and shown).
    ASSIGN_OR_RETURN(std::string cls, TaskRuntimeClass(config_, job.queue, job.groups[g].exec, g));
    if (!cls.empty()) job.groups[g].exec.runtime_class = cls == "runc" ? "" : cls;
  }
  const Resources demand = JobDemand(job);
  const auto task_count = static_cast<int64_t>(job.task_count());
  {
    ServiceLock lock(*this);
    if (!order_->HasQueue(job.queue))
      return Status::InvalidArgument(fmt::format("queue: unknown queue '{}'", job.queue));
    // Queue access rules bind tenants; admins may submit anywhere.
    if (who.role != Role::kAdmin) RETURN_IF_ERROR(CheckQueueAccess(*order_, job));
    if (Status st = order_->Admit(job.queue, demand); !st.ok()) return st;
    // A job depends only on jobs its submitter may see (another tenant's reads as absent).
    for (size_t i = 0; i < job.depends_on.size(); ++i) {
      const PoolJob* dep = state_.FindJob(job.depends_on[i].job);
      if (dep == nullptr || (who.role != Role::kAdmin && dep->rec.tenant != job.tenant))
        return Status::InvalidArgument(
            fmt::format("dependsOn[{}].job: no job '{}'{}", i, job.depends_on[i].job,
                        who.role == Role::kAdmin ? "" : fmt::format(" of tenant '{}'", job.tenant)));
    }
    // The room is reserved here, under the lock, before the durable write (which runs without it):
    // concurrent submissions cannot all pass the check and then overshoot together.
    RETURN_IF_ERROR(state_.pending_counts.CheckRoom(config_, order_->FindQueue(job.queue), job.tenant, job.queue,
                                                    task_count, &in_flight_));
    in_flight_.Add(job.tenant, job.queue, task_count);
  }
  const uint64_t seq = next_seq_.fetch_add(1);
  job.id = fmt::format("j-{:012}", seq);
  SubmitJobOp op;
  op.now_ms = NowMs();
  op.mono = MonoNow();
  op.rec.id = job.id;
  op.rec.seq = seq;
  op.rec.tenant = job.tenant;
  op.rec.queue = job.queue;
  op.rec.name = job.name;
  op.rec.priority = job.priority;
  op.rec.state = "pending";
  op.rec.spec_json = JobSpecToJson(job).dump();
  op.rec.created_ms = op.now_ms;
  op.rec.updated_ms = op.now_ms;
  op.demand = demand;
  op.job = std::move(job);

  // Durable first, without the lock (group commit batches concurrent submitters); the job enters
  // the state only once it is on disk, so memory never holds what the disk does not.
  const Status written = committer_->Commit(StateMachine::SubmissionWrites(op));
  ServiceLock lock(*this);
  // Its reservation becomes the pending job's count (or is dropped).
  in_flight_.Remove(op.rec.tenant, op.rec.queue, task_count);
  if (!written.ok()) return Status::Internal("the job could not be stored: " + written.message());
  for (const auto& g : op.job.groups) {
    for (int rep = 0; rep < g.replicas; ++rep) {
      if (scheduler_ != nullptr) scheduler_->Observe(g.request);  // policies that learn online
      if (recent_tasks_.size() < kRecentTasks) {
        recent_tasks_.push_back(g.request);
      } else {
        recent_tasks_[recent_next_] = g.request;
        recent_next_ = (recent_next_ + 1) % kRecentTasks;
      }
      ++tasks_since_learn_;
    }
  }
  const std::string id = op.rec.id;
  op.written = true;
  WriteBatch already_written;
  if (Status st = ApplyLocked(std::move(op), already_written); !st.ok())
    FailStop(st.WithContext("a stored submission"));
  const JobSnapshot snap = SnapshotJob(state_, *state_.FindJob(id));
  const std::string version = job_watches_->Version(id);
  lock.unlock();
  return JobAnswer(snap, version);
}

Result<PoolService::LogSource> PoolService::TaskLogSource(const Principal& who, const std::string& job_id,
                                                          int index) {
  ServiceLock lock(*this);
  auto j = VisibleJob(who, job_id);
  if (!j.ok()) return j.status();
  const JobState& job = **j;
  if (index < 0 || static_cast<size_t>(index) >= job.tasks.size()) {
    return Status::NotFound(
        fmt::format("job '{}' has no task {} (it has {})", job_id, index, job.tasks.size()));
  }
  const TaskState& ts = job.tasks[static_cast<size_t>(index)];
  if (ts.last_node.empty()) {
    return Status::FailedPrecondition(
        fmt::format("task {} of job '{}' has not run yet: no logs", index, job_id));
  }
  auto n = state_.ledger.FindNode(ts.last_node);
  if (!n) return Status::FailedPrecondition(fmt::format("node '{}' is no longer registered", ts.last_node));
  const NodeInfo& info = state_.nodes[*n];
  if (info.agent_endpoint.empty()) {
    return Status::FailedPrecondition(
        fmt::format("node '{}' has not told the server where its agent serves logs (an agent started with "
                    "--metrics-listen does)",
                    ts.last_node));
  }
  return LogSource{ts.last_node, info.agent_endpoint, info.agent_log_token,
                   fmt::format("{}.{}", job_id, index)};
}

Result<json> PoolService::GetJob(const Principal& who, const std::string& id) {
  JobSnapshot snap;
  std::string version;
  {
    ServiceLock lock(*this);
    auto j = VisibleJob(who, id);
    if (!j.ok()) return j.status();
    snap = SnapshotJob(state_, **j);
    version = job_watches_->Version(id);
  }
  // The JSON is built from the snapshot, without the lock.
  return JobAnswer(snap, version);
}

Result<json> PoolService::ListJobs(const Principal& who, const ListJobsQuery& q) {
  if (who.role == Role::kAgent || who.role == Role::kNode)
    return Status::PermissionDenied("agent tokens cannot list jobs");
  const bool detailed = q.with_tasks || q.with_spec;
  const int max_limit = detailed ? kMaxDetailedPage : kMaxListLimit;
  if (q.limit < 1 || q.limit > max_limit)
    return Status::InvalidArgument(fmt::format("limit: must be between 1 and {}{}", max_limit,
                                               detailed ? " when fields asks for tasks or spec" : ""));
  std::vector<JobSummary> page;
  std::vector<std::vector<TaskSnapshot>> page_tasks;  // fields=tasks: per job of the page
  uint64_t last = 0;
  bool more = false;
  {
    ServiceLock lock(*this);
    // Where to look: one tenant's jobs when the caller or the filter names one tenant, the pending
    // set when only pending jobs are asked for, otherwise every job. Each source is ordered by seq.
    static const std::set<uint64_t> kNone;
    const std::set<uint64_t>* source = nullptr;
    std::string only_tenant;
    if (who.role == Role::kTenant) {
      only_tenant = who.tenant;
      if (!q.tenants.empty() && !q.tenants.count(who.tenant)) source = &kNone;
    } else if (q.tenants.size() == 1) {
      only_tenant = *q.tenants.begin();
    }
    if (source == nullptr && !only_tenant.empty()) {
      auto t = state_.by_tenant.find(only_tenant);
      source = t == state_.by_tenant.end() ? &kNone : &t->second;
    } else if (source == nullptr && q.states.size() == 1 && q.states.count("pending")) {
      source = &state_.pending;
    }
    int scanned = 0, listed_tasks = 0;
    auto visit = [&](uint64_t seq, const JobState& j) -> bool {  // false: the page is full
      if (scanned++ == kMaxListScan) {
        more = true;  // the token resumes after the last job examined
        return false;
      }
      const bool match = (who.role != Role::kTenant || j.rec.tenant == who.tenant) &&
                         (q.states.empty() || q.states.count(std::string(JobPhaseName(j.phase)))) &&
                         (q.tenants.empty() || q.tenants.count(j.rec.tenant)) &&
                         (q.queues.empty() || q.queues.count(j.rec.queue));
      if (!match) {
        last = seq;
        return true;
      }
      if (static_cast<int>(page.size()) == q.limit || (q.with_tasks && listed_tasks >= kMaxListedTasks)) {
        more = true;  // a matching job follows the page
        return false;
      }
      last = seq;
      JobSummary& s = page.emplace_back();
      s.id = j.rec.id;
      s.name = j.rec.name;
      s.tenant = j.rec.tenant;
      s.queue = j.rec.queue;
      s.reason = j.rec.reason;
      s.priority = j.rec.priority;
      s.qos = j.job.qos;
      s.state = JobPhaseName(j.phase);
      s.faults = j.rec.faults;
      s.created_ms = j.rec.created_ms;
      s.updated_ms = j.rec.updated_ms;
      if (j.phase == JobPhase::kPending && j.rec.not_before_ms > NowMs()) s.not_before_ms = j.rec.not_before_ms;
      s.tasks = static_cast<int>(j.tasks.size());
      s.task_counts = j.task_counts;
      if (q.with_spec) s.spec_json = j.rec.spec_json;
      if (q.with_tasks) {
        std::vector<TaskSnapshot>& tasks = page_tasks.emplace_back();
        for (size_t i = 0; i < j.tasks.size(); ++i) tasks.push_back(SnapshotTask(state_, j, static_cast<int>(i)));
        listed_tasks += s.tasks;
      }
      return true;
    };
    if (source != nullptr) {
      for (auto it = source->upper_bound(q.after_seq); it != source->end(); ++it) {
        auto j = state_.by_seq.find(*it);
        if (j != state_.by_seq.end() && !visit(*it, *j->second)) break;
      }
    } else {
      for (auto it = state_.by_seq.upper_bound(q.after_seq); it != state_.by_seq.end(); ++it) {
        if (!visit(it->first, *it->second)) break;
      }
    }
  }
  // The JSON is built without the lock.
  json items = json::array();
  for (size_t k = 0; k < page.size(); ++k) {
    JobSummary& s = page[k];
    if (q.with_tasks) {
      s.tasks_json = json::array();
      for (const TaskSnapshot& t : page_tasks[k]) s.tasks_json.push_back(TaskView(t));
    }
    items.push_back(JobSummaryJson(s, q.with_spec, q.with_tasks));
  }
  json out = {{"items", std::move(items)}};
  if (more) out["nextPageToken"] = std::to_string(last);
  return out;
}

Result<json> PoolService::CancelJob(const Principal& who, const std::string& id) {
  ServiceLock lock(*this);
  auto jr = VisibleJob(who, id);
  if (!jr.ok()) return jr.status();
  JobState& j = **jr;
  if (IsTerminal(j.phase))
    return Status::FailedPrecondition(fmt::format("job '{}' is already {}", id, JobPhaseName(j.phase)));
  WriteBatch batch;
  CancelJobOp op;
  op.job_id = j.rec.id;
  op.by = who.role == Role::kAdmin ? "an admin" : "tenant '" + who.tenant + "'";
  RETURN_IF_ERROR(ApplyLocked(std::move(op), batch));
  RETURN_IF_ERROR(CommitLocked(batch));
  const JobSnapshot snap = SnapshotJob(state_, j);
  const std::string version = job_watches_->Version(id);
  lock.unlock();
  return JobAnswer(snap, version);
}

Result<json> PoolService::JobEvents(const Principal& who, const std::string& id, int64_t after_id,
                                    int limit) {
  if (limit < 1 || limit > 1000) return Status::InvalidArgument("limit: must be between 1 and 1000");
  json pending;
  {
    ServiceLock lock(*this);
    auto jr = VisibleJob(who, id);
    if (!jr.ok()) return jr.status();
    JobState& j = **jr;
    if (j.phase == JobPhase::kPending) {
      pending = {{"message", j.pending_message.empty() ? "not tried yet" : j.pending_message},
                 {"task", j.pending_task},
                 {"totalNodes", j.diagnosis.total_nodes},
                 {"feasibleNodes", j.diagnosis.feasible_nodes}};
      json reasons = json::array();
      for (const auto& [reason, count] : j.diagnosis.reasons)
        reasons.push_back({{"reason", reason}, {"nodes", count}});
      pending["reasons"] = std::move(reasons);
      // Per-node reasons for the first task group, as the filters see it now.
      json nodes = json::object();
      const TaskRequest& first = j.job.groups.front().request;
      NodeMask mask;
      const bool masked = ComputeMask(j, mask);
      scheduler_->SetNodeMask(masked ? &mask : nullptr);
      const std::vector<std::string> why = scheduler_->ExplainNodes(first);
      scheduler_->SetNodeMask(nullptr);
      size_t shown = 0;
      for (size_t n = 0; n < why.size() && shown < 200; ++n, ++shown) {
        nodes[state_.ledger.spec(static_cast<NodeIndex>(n)).name] = why[n].empty() ? "fits" : why[n];
      }
      pending["nodes"] = std::move(nodes);
      if (why.size() > shown) pending["nodesTruncated"] = true;
      if (!j.waiting_for.empty()) pending["waitingFor"] = j.waiting_for;
    }
  }
  auto events = store_->ListEvents(id, after_id, limit);
  if (!events.ok()) return events.status();
  json items = json::array();
  for (const EventRecord& e : *events) {
    items.push_back(
        {{"id", e.id}, {"time", FormatTime(e.time_ms)}, {"type", e.type}, {"message", e.message}});
  }
  json out = {{"items", std::move(items)}};
  if (!pending.is_null()) out["pending"] = std::move(pending);
  return out;
}

// ---- nodes -------------------------------------------------------------------------------------

json PoolService::ListNodes() {
  std::vector<NodeSnapshot> nodes;
  {
    ServiceLock lock(*this);
    nodes.reserve(state_.ledger.node_count());
    for (NodeIndex n = 0; n < state_.ledger.node_count(); ++n) nodes.push_back(SnapshotNode(state_, n));
  }
  json items = json::array();
  for (const NodeSnapshot& n : nodes) items.push_back(NodeView(n));
  return {{"items", std::move(items)}};
}

Result<json> PoolService::GetNode(const std::string& name) {
  NodeSnapshot node;
  {
    ServiceLock lock(*this);
    auto n = state_.ledger.FindNode(name);
    if (!n) return Status::NotFound(fmt::format("node '{}' not found", name));
    node = SnapshotNode(state_, *n);
  }
  return NodeView(node);
}

Result<json> PoolService::SetCordon(const std::string& name, bool cordoned) {
  ServiceLock lock(*this);
  WriteBatch batch;
  CordonNodeOp op;
  op.node = name;
  op.cordoned = cordoned;
  RETURN_IF_ERROR(ApplyLocked(std::move(op), batch));
  RETURN_IF_ERROR(CommitLocked(batch));
  return NodeJson(*state_.ledger.FindNode(name));
}

Result<json> PoolService::DrainNode(const std::string& name) {
  ServiceLock lock(*this);
  WriteBatch batch;
  DrainNodeOp op;
  op.node = name;
  RETURN_IF_ERROR(ApplyLocked(std::move(op), batch));
  RETURN_IF_ERROR(CommitLocked(batch));
  return NodeJson(*state_.ledger.FindNode(name));
}

// ---- queues ------------------------------------------------------------------------------------

json PoolService::ListQueues() {
  ServiceLock lock(*this);
  json items = json::array();
  std::vector<QueueSpec> all = order_->options().queues;
  std::sort(all.begin(), all.end(), [](const QueueSpec& a, const QueueSpec& b) { return a.name < b.name; });
  for (const QueueSpec& q : all) {
    auto r = GetQueueLocked(q.name);
    if (r.ok()) items.push_back(*r);
  }
  return {{"items", std::move(items)}};
}

Result<json> PoolService::GetQueue(const std::string& name) {
  ServiceLock lock(*this);
  return GetQueueLocked(name);
}

Result<json> PoolService::GetQueueLocked(const std::string& name) {
  const auto& all = order_->options().queues;
  auto it = std::find_if(all.begin(), all.end(), [&](const QueueSpec& q) { return q.name == name; });
  if (it == all.end()) return Status::NotFound(fmt::format("queue '{}' not found", name));
  json j = QueueJson(*it);
  Resources used;
  for (const auto& [key, r] : state_.usage) {
    if (key.second == name) used += r;
  }
  j["used"] = ResourceMapJson(used);
  int64_t pending = 0, running = 0;
  if (auto c = state_.queue_phase_count.find(name); c != state_.queue_phase_count.end()) {
    pending = c->second[static_cast<size_t>(JobPhase::kPending)];
    running = c->second[static_cast<size_t>(JobPhase::kRunning)];
  }
  j["pending"] = pending;
  j["running"] = running;
  return j;
}

Result<json> PoolService::CreateQueue(const json& body) {
  RETURN_IF_ERROR(disk_guard_->Check());
  auto q = ParseQueueJson(body, "queue");
  if (!q.ok()) return q.status();
  ServiceLock lock(*this);
  WriteBatch batch;
  PutQueueOp op;
  op.spec = *q;
  op.create = true;
  RETURN_IF_ERROR(ApplyLocked(std::move(op), batch));
  RETURN_IF_ERROR(CommitLocked(batch));
  return GetQueueLocked(q->name);
}

Result<json> PoolService::UpdateQueue(const std::string& name, const json& body) {
  RETURN_IF_ERROR(disk_guard_->Check());
  ServiceLock lock(*this);
  const auto& all = order_->options().queues;
  auto it = std::find_if(all.begin(), all.end(), [&](const QueueSpec& q) { return q.name == name; });
  if (it == all.end()) return Status::NotFound(fmt::format("queue '{}' not found", name));
  json merged = QueueJson(*it);
  if (!body.is_object()) return Status::InvalidArgument("queue: the body must be a JSON object");
  for (auto b = body.begin(); b != body.end(); ++b) {
    if (b.key() == "name" && b.value() != name)
      return Status::InvalidArgument("queue.name: a queue cannot be renamed");
    if (b.key() == "parent" && b.value() != merged["parent"])
      return Status::InvalidArgument("queue.parent: the parent of a queue is fixed");
    merged[b.key()] = b.value();
  }
  auto q = ParseQueueJson(merged, "queue");
  if (!q.ok()) return q.status();
  WriteBatch batch;
  PutQueueOp op;
  op.spec = *q;
  RETURN_IF_ERROR(ApplyLocked(std::move(op), batch));
  RETURN_IF_ERROR(CommitLocked(batch));
  return GetQueueLocked(name);
}

// ---- node side ---------------------------------------------------------------------------------

}  // namespace gpupool
