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

namespace gpupool {

using nlohmann::json;

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

static_assert(static_cast<int>(TaskPhase::kPreempted) + 1 == kTaskPhaseCount);

namespace {

constexpr size_t kRecentTasks = 10000;
// Retention removes at most this many jobs per pass, so that a long history (say, after retention
// was first turned on) is worked off over several cycles instead of stalling one.
constexpr int kMaxRemovalsPerPass = 5000;
// Meta key: the highest sequence number of a job that retention removed (so its id is never reused).
constexpr char kRemovedMaxSeqKey[] = "removed_max_seq";
constexpr char kClusterIdKey[] = "cluster_id";
// A node credential's last use is written to the store when it moved this much (it is kept in
// memory to the millisecond).
constexpr int64_t kCredentialLastUsedStepMs = 60 * 1000;
constexpr uint64_t kLearnEvery = 512;
constexpr int kMinCycleGapMs = 5;

std::optional<JobPhase> ParseJobPhase(const std::string& s) {
  for (JobPhase p : {JobPhase::kPending, JobPhase::kRunning, JobPhase::kSucceeded, JobPhase::kFailed,
                     JobPhase::kCancelled}) {
    if (JobPhaseName(p) == s) return p;
  }
  return std::nullopt;
}

std::optional<TaskPhase> ParseTaskPhase(const std::string& s) {
  for (TaskPhase p :
       {TaskPhase::kPending, TaskPhase::kAssigned, TaskPhase::kRunning, TaskPhase::kStopping,
        TaskPhase::kSucceeded, TaskPhase::kFailed, TaskPhase::kCancelled, TaskPhase::kPreempted}) {
    if (TaskPhaseName(p) == s) return p;
  }
  return std::nullopt;
}

bool IsLive(TaskPhase p) {
  return p == TaskPhase::kAssigned || p == TaskPhase::kRunning || p == TaskPhase::kStopping;
}
bool IsTerminal(JobPhase p) {
  return p == JobPhase::kSucceeded || p == JobPhase::kFailed || p == JobPhase::kCancelled;
}

double MonoSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// What one task holds, in the units of queue accounting (MIG instances count as a whole GPU, as
// JobDemand does).
Resources TaskDemand(const TaskRequest& r) {
  Job one;
  one.groups.push_back({"t", 1, r, {}});
  return JobDemand(one);
}

bool LabelsMatch(const std::map<std::string, std::string>& term,
                 const std::map<std::string, std::string>& labels) {
  for (const auto& [k, v] : term) {
    auto it = labels.find(k);
    if (it == labels.end() || it->second != v) return false;
  }
  return true;
}

// What decides whether a job fits, as a string: every group's request and replicas, and the gang
// size. Empty for jobs with affinity (their fit depends on other jobs' places) — never shared.
std::string JobShapeKey(const Job& job) {
  if (!job.affinity.empty()) return "";
  std::string key = fmt::format("g{}", job.gang_size());
  for (const auto& g : job.groups) {
    const TaskRequest& r = g.request;
    key +=
        fmt::format("|{}x{},{},{},{},{},{},{}", g.replicas, r.cpu.units(), r.memory.units(), r.gpu_count,
                    r.gpu_share.units(), r.gpu_memory.units(), fmt::join(r.gpu_models, "+"), r.mig_profile);
  }
  return key;
}

[[noreturn]] void FailStop(const Status& st) {
  // The in-memory state got ahead of the disk. Stopping is the only safe answer: a restart
  // rebuilds everything from the last acknowledged state.
  std::fprintf(stderr, "gpupool server: cannot write the store, stopping: %s\n", st.ToString().c_str());
  std::fflush(stderr);
  std::_Exit(70);
}

NodeRecord MakeNodeRecord(const std::string& name, const json& spec, bool cordoned, bool draining,
                          const std::string& state, int64_t hb) {
  NodeRecord r;
  r.name = name;
  r.spec_json = spec.dump();
  r.cordoned = cordoned;
  r.draining = draining;
  r.state = state;
  r.last_heartbeat_ms = hb;
  return r;
}

}  // namespace

PoolService::PoolService(ServerConfig config, std::unique_ptr<Store> store)
    : config_(std::move(config)), store_(std::move(store)) {
  committer_ = std::make_unique<GroupCommitter>(*store_);
}

PoolService::~PoolService() {
  Stop();
}

int64_t PoolService::NowMs() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Result<std::unique_ptr<PoolService>> PoolService::Open(ServerConfig config, std::unique_ptr<Store> store) {
  std::unique_ptr<PoolService> svc(new PoolService(std::move(config), std::move(store)));
  svc->run_token_ = RandomHex(8);
  svc->node_watches_.emplace(svc->run_token_, kMaxWatchesPerKey);
  svc->job_watches_.emplace(svc->run_token_, kMaxWatchesPerKey);
  svc->disk_guard_ = std::make_unique<DiskGuard>(svc->config_.data_dir.empty() ? "." : svc->config_.data_dir,
                                                 svc->config_.store_min_free_bytes, svc->config_.free_space_probe);
  std::lock_guard<std::mutex> lock(svc->mu_);
  RETURN_IF_ERROR(svc->Recover());
  return svc;
}

// ---- recovery ----------------------------------------------------------------------------------

Status PoolService::Recover() {
  auto snap = store_->Load();
  if (!snap.ok()) return snap.status().WithContext("loading the store");
  const int64_t now = NowMs();
  WriteBatch batch;

  // Queues: the config seeds an empty store; afterwards the store (and the API) own them.
  if (snap->queues.empty()) {
    queues_ = config_.ordering.queues;
    for (const QueueSpec& q : queues_) batch.Add(PutQueue{{q.name, QueueJson(q).dump()}});
  } else {
    for (const QueueRecord& r : snap->queues) {
      json j = json::parse(r.config_json, nullptr, false);
      if (j.is_discarded()) return Status::Internal("stored queue '" + r.name + "' is not valid JSON");
      j.erase("used");
      j.erase("pending");
      j.erase("running");
      // Stores written before queue names were checked may hold names a job spec cannot name; they
      // load (refusing to start would be worse) and say so.
      auto q = ParseQueueJson(j, "stored queue " + r.name, /*check_names=*/false);
      if (!q.ok()) return q.status();
      if (Status st = CheckSpecName(q->name, "name"); !st.ok())
        std::fprintf(stderr, "gpupool server: stored queue '%s' has a name no job can give (%s); rename it\n",
                     r.name.c_str(), st.message().c_str());
      queues_.push_back(*q);
    }
  }
  RETURN_IF_ERROR(RebuildQueueOrder());

  for (const NodeRecord& r : snap->nodes) {
    json j = json::parse(r.spec_json, nullptr, false);
    if (j.is_discarded()) return Status::Internal("stored node '" + r.name + "' is not valid JSON");
    auto spec = ParseNodeSpec(j, ledger_.catalog());
    if (!spec.ok()) return spec.status().WithContext("stored node " + r.name);
    auto idx = ledger_.AddNode(*spec);
    if (!idx.ok()) return idx.status().WithContext("stored node " + r.name);
    NodeInfo info;
    info.state = r.state.empty() ? "ready" : r.state;
    info.last_heartbeat_ms = now;  // every agent gets a fresh timeout after a server restart
    info.heartbeat_mono = MonoSeconds();
    info.draining = r.draining;
    info.spec_json = std::move(j);
    nodes_.push_back(std::move(info));
    if (r.cordoned) RETURN_IF_ERROR(ledger_.SetCordoned(*idx, true));
  }

  uint64_t max_seq = 0;
  for (const JobRecord& r : snap->jobs) {
    auto job = ParseJobSpec(r.spec_json, SpecFormat::kJson);
    if (!job.ok()) return job.status().WithContext("stored job " + r.id);
    auto phase = ParseJobPhase(r.state);
    if (!phase) return Status::Internal(fmt::format("stored job {} has unknown state '{}'", r.id, r.state));
    auto state = std::make_unique<JobState>();
    state->rec = r;
    state->phase = *phase;
    state->job = std::move(job).value();
    state->job.id = r.id;
    state->job.tenant = r.tenant;
    state->job.queue = r.queue;
    state->demand = JobDemand(state->job);
    state->tasks.resize(static_cast<size_t>(state->job.task_count()));
    state->task_counts[static_cast<size_t>(TaskPhase::kPending)] = static_cast<int32_t>(state->tasks.size());
    int t = 0;
    for (size_t g = 0; g < state->job.groups.size(); ++g) {
      for (int rep = 0; rep < state->job.groups[g].replicas; ++rep, ++t) {
        state->tasks[static_cast<size_t>(t)].group = static_cast<int>(g);
        state->tasks[static_cast<size_t>(t)].replica = rep;
        state->task_group.push_back(static_cast<int>(g));
      }
    }
    state->pending_since_ms = r.updated_ms;
    state->started_ms = r.updated_ms;
    state->submit_mono = MonoSeconds();
    for (const auto& g : state->job.groups) {
      for (int rep = 0; rep < g.replicas && recent_tasks_.size() < kRecentTasks; ++rep) {
        recent_tasks_.push_back(g.request);
      }
    }
    max_seq = std::max(max_seq, r.seq);
    JobState* raw = state.get();
    by_seq_[r.seq] = raw;
    jobs_[r.id] = std::move(state);
    by_tenant_[r.tenant].insert(r.seq);
    ++job_phase_count_[static_cast<size_t>(raw->phase)];
    ++queue_phase_count_[r.queue][static_cast<size_t>(raw->phase)];
    if (raw->phase == JobPhase::kPending) {
      pending_.insert(r.seq);
      pending_counts_.Add(r.tenant, r.queue, static_cast<int64_t>(raw->tasks.size()));
    }
  }
  RETURN_IF_ERROR(credentials_.Load(snap->meta));
  for (const auto& [key, value] : snap->meta) {
    if (key == kClusterIdKey) cluster_id_ = value;
  }
  if (cluster_id_.empty()) {
    // A new store (or one from before cluster ids): the pool gets its identity now, once.
    cluster_id_ = "c-" + RandomHex(16);
    batch.Add(PutMeta{kClusterIdKey, cluster_id_});
  }
  // Retention may have removed the newest jobs; their ids are never handed out again.
  for (const auto& [key, value] : snap->meta) {
    if (key != kRemovedMaxSeqKey) continue;
    uint64_t removed = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), removed);
    if (ec != std::errc() || end != value.data() + value.size())
      return Status::Internal(fmt::format("stored meta {} is not a job sequence number: '{}'", key, value));
    max_seq = std::max(max_seq, removed);
    removed_max_seq_ = removed;
  }
  next_seq_ = max_seq + 1;

  for (const TaskRecord& r : snap->tasks) {
    JobState* j = FindJob(r.job_id);
    if (j == nullptr) return Status::Internal("stored task of unknown job " + r.job_id);
    if (r.index < 0 || static_cast<size_t>(r.index) >= j->tasks.size())
      return Status::Internal(fmt::format("stored task {}[{}] is out of range", r.job_id, r.index));
    auto phase = ParseTaskPhase(r.state);
    if (!phase)
      return Status::Internal(fmt::format("stored task {}[{}] has unknown state", r.job_id, r.index));
    TaskState& ts = j->tasks[static_cast<size_t>(r.index)];
    SetTaskPhase(*j, ts, *phase);
    ts.exit_code = r.exit_code;
    ts.restarts = r.restarts;
    ts.run_id = r.run_id;
    ts.updated_ms = r.updated_ms;
    ts.last_node = r.node;
    if (IsLive(ts.phase)) {
      json pj = json::parse(r.placement_json, nullptr, false);
      if (pj.is_discarded())
        return Status::Internal(fmt::format("stored task {}[{}]: bad placement", r.job_id, r.index));
      auto p = PlacementFromJson(pj, ledger_);
      if (!p.ok()) return p.status().WithContext(fmt::format("stored task {}[{}]", r.job_id, r.index));
      auto id = ledger_.Commit(*p);
      if (!id.ok())
        return id.status().WithContext(fmt::format("restoring the allocation of {}[{}]", r.job_id, r.index));
      ts.placed = true;
      ts.placement = *p;
      ts.allocation = *id;
      nodes_[p->node].tasks.insert({r.job_id, r.index});
      usage_[{j->rec.tenant, j->rec.queue}] +=
          TaskDemand(j->job.groups[static_cast<size_t>(ts.group)].request);
      if (ts.phase == TaskPhase::kStopping) {
        // The reason and the deadline were not stored: give the agent a fresh grace period.
        ts.stop_deadline_ms =
            now + 1000LL * (config_.grace_period_seconds + config_.heartbeat_timeout_seconds);
        ts.stop_outcome = j->phase == JobPhase::kCancelled ? TaskPhase::kCancelled : TaskPhase::kPreempted;
        ts.stop_reason = "stop in progress at restart";
        stopping_jobs_.insert(r.job_id);
      }
    }
  }
  for (auto& [seq, j] : by_seq_) {
    if (j->phase != JobPhase::kRunning) continue;
    for (const TaskState& ts : j->tasks) {
      if (ts.phase == TaskPhase::kPending) partial_.insert(seq);
    }
  }
  RETURN_IF_ERROR(RebuildScheduler());
  RETURN_IF_ERROR(CheckInvariantsLocked());
  if (!batch.empty()) RETURN_IF_ERROR(committer_->Commit(std::move(batch)));
  return Status::Ok();
}

Status PoolService::RebuildQueueOrder() {
  QueueOrderOptions options = config_.ordering;
  options.queues = queues_;
  auto order = QueueOrder::Create(options);
  if (!order.ok()) return order.status();
  order_.emplace(std::move(order).value());
  return Status::Ok();
}

Status PoolService::RebuildScheduler() {
  if (profile_.scores.empty()) {
    const std::string& p = config_.profile;
    const bool file = p.size() > 5 && (p.ends_with(".yaml") || p.ends_with(".yml"));
    auto profile = file ? LoadProfileFile(p) : ProfileForPolicy(p);
    if (!profile.ok()) return profile.status().WithContext("profile");
    profile_ = std::move(profile).value();
  }
  // FGD measures fragmentation against the typical workload: learned from the GPU tasks submitted
  // recently (a single whole-GPU task until there are any).
  std::vector<TaskRequest> gpu_tasks;
  for (const TaskRequest& t : recent_tasks_) {
    if (t.wants_gpu()) gpu_tasks.push_back(t);
  }
  typical_pods_ =
      gpu_tasks.empty() ? std::vector<TypicalPod>{{0, 1000, 1, {}, 1.0}} : ComputeTypicalPods(gpu_tasks);
  PluginInit init;
  init.typical_pods = &typical_pods_;
  auto s = Scheduler::Create(profile_, DefaultRegistry(), ledger_, rng_, init);
  if (!s.ok()) return s.status().WithContext("profile " + profile_.name);
  scheduler_ = std::move(s).value();
  // Policies that learn online (balanced) see the recent window again, oldest first.
  const size_t n = recent_tasks_.size();
  const size_t first = n < kRecentTasks ? 0 : recent_next_;
  for (size_t i = 0; i < n; ++i) scheduler_->Observe(recent_tasks_[(first + i) % n]);
  tasks_since_learn_ = 0;
  return Status::Ok();
}

void PoolService::LearnTypicalPods() {
  if (tasks_since_learn_ < kLearnEvery) return;
  if (Status st = RebuildScheduler(); !st.ok()) {
    std::fprintf(stderr, "gpupool server: keeping the old typical workload: %s\n", st.ToString().c_str());
    tasks_since_learn_ = 0;
  }
}

// ---- helpers -----------------------------------------------------------------------------------

void PoolService::SetJobPhase(JobState& j, JobPhase phase) {
  if (j.phase == phase) return;
  const auto tasks = static_cast<int64_t>(j.tasks.size());
  if (j.phase == JobPhase::kPending) pending_counts_.Remove(j.rec.tenant, j.rec.queue, tasks);
  if (phase == JobPhase::kPending) pending_counts_.Add(j.rec.tenant, j.rec.queue, tasks);
  --job_phase_count_[static_cast<size_t>(j.phase)];
  ++job_phase_count_[static_cast<size_t>(phase)];
  auto& in_queue = queue_phase_count_[j.rec.queue];
  --in_queue[static_cast<size_t>(j.phase)];
  ++in_queue[static_cast<size_t>(phase)];
  j.phase = phase;
}

void PoolService::SetTaskPhase(JobState& j, TaskState& ts, TaskPhase phase) {
  --j.task_counts[static_cast<size_t>(ts.phase)];
  ++j.task_counts[static_cast<size_t>(phase)];
  ts.phase = phase;
}

PoolService::JobState* PoolService::FindJob(const std::string& id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

Result<PoolService::JobState*> PoolService::VisibleJob(const Principal& who, const std::string& id) {
  if (who.role == Role::kAgent || who.role == Role::kNode)
    return Status::PermissionDenied("agent tokens cannot read jobs");
  JobState* j = FindJob(id);
  // Another tenant's job looks exactly like a missing one.
  if (j == nullptr || (who.role == Role::kTenant && j->rec.tenant != who.tenant))
    return Status::NotFound(fmt::format("job '{}' not found", id));
  return j;
}

void PoolService::PutJobOps(JobState& j, WriteBatch& batch) {
  job_watches_->Changed(j.rec.id);
  j.rec.state = std::string(JobPhaseName(j.phase));
  j.rec.updated_ms = NowMs();
  batch.Add(PutJob{j.rec});
}

void PoolService::PutTaskOp(const JobState& j, int index, WriteBatch& batch) {
  job_watches_->Changed(j.rec.id);
  const TaskState& ts = j.tasks[static_cast<size_t>(index)];
  TaskRecord r;
  r.job_id = j.rec.id;
  r.index = index;
  r.state = std::string(TaskPhaseName(ts.phase));
  if (ts.placed) {
    r.node = ledger_.spec(ts.placement.node).name;
    r.placement_json = PlacementToJson(ts.placement, ledger_).dump();
  } else {
    r.node = ts.last_node;  // a finished task remembers where it ran; only live tasks have a placement
  }
  r.exit_code = ts.exit_code;
  r.restarts = ts.restarts;
  r.updated_ms = ts.updated_ms;
  r.run_id = ts.run_id;
  batch.Add(PutTask{r});
}

void PoolService::Event(const std::string& job_id, const std::string& type, const std::string& message,
                        WriteBatch& batch) {
  EventRecord e;
  e.job_id = job_id;
  e.time_ms = NowMs();
  e.type = type;
  e.message = message;
  batch.Add(AppendEvent{e});
}

Status PoolService::CommitLocked(WriteBatch& batch) {
  if (batch.empty()) return Status::Ok();
  Status st = committer_->Commit(std::move(batch));
  batch = WriteBatch{};
  if (!st.ok()) FailStop(st);
  // Batches are written in the order they were enqueued: with this one, every change made before
  // it (the loop's last cycle too) is durable.
  if (st.ok()) NotifyWatchersLocked();
  return st;
}

namespace {
json GoneJob() {
  return json{{"error", {{"code", "NotFound"}, {"message", "the job was removed (retention)"}}}};
}
}  // namespace

json PoolService::AgentFeatures() {
  // What agents may use beyond the basic protocol: long polls on assignments, batched reports.
  return json::array({"watch", "reports"});
}

void PoolService::NotifyWatchersLocked() {
  node_watches_->Flush([this](const NodeIndex& n) -> std::optional<json> { return AssignmentsJsonLocked(n); },
                       json::object());
  job_watches_->Flush(
      [this](const std::string& id) -> std::optional<json> {
        const JobState* j = FindJob(id);
        if (j == nullptr) return std::nullopt;
        return JobJson(*j);
      },
      GoneJob());
}

void PoolService::ReleaseWatchers() {
  std::lock_guard<std::mutex> lock(mu_);
  node_watches_->ReleaseAll([this](const NodeIndex& n) -> std::optional<json> { return AssignmentsJsonLocked(n); },
                            json::object());
  job_watches_->ReleaseAll(
      [this](const std::string& id) -> std::optional<json> {
        const JobState* j = FindJob(id);
        if (j == nullptr) return std::nullopt;
        return JobJson(*j);
      },
      GoneJob());
}

void PoolService::ReleaseTask(JobState& j, int index, bool agent_ended_it) {
  TaskState& ts = j.tasks[static_cast<size_t>(index)];
  if (!ts.placed) return;
  (void)ledger_.Release(ts.allocation);
  nodes_[ts.placement.node].tasks.erase({j.rec.id, index});
  if (!agent_ended_it) MarkAssignmentsChanged(ts.placement.node);
  Resources& u = usage_[{j.rec.tenant, j.rec.queue}];
  u -= TaskDemand(j.job.groups[static_cast<size_t>(ts.group)].request);
  ts.placed = false;
  ts.allocation = 0;
  ++capacity_epoch_;
  wake_pending_ = true;
  wake_.notify_one();
}

void PoolService::StopTask(JobState& j, int index, TaskPhase outcome, const std::string& reason,
                           WriteBatch& batch) {
  TaskState& ts = j.tasks[static_cast<size_t>(index)];
  const int64_t now = NowMs();
  if (ts.phase == TaskPhase::kPending) {
    SetTaskPhase(j, ts, outcome == TaskPhase::kPreempted ? TaskPhase::kPending : outcome);
    ts.updated_ms = now;
    PutTaskOp(j, index, batch);
    return;
  }
  if (!IsLive(ts.phase)) return;
  stopping_jobs_.insert(j.rec.id);
  if (ts.phase != TaskPhase::kStopping) {
    SetTaskPhase(j, ts, TaskPhase::kStopping);
    MarkAssignmentsChanged(ts.placement.node);
    ts.stop_deadline_ms = now + 1000LL * (config_.grace_period_seconds + config_.heartbeat_timeout_seconds);
  }
  ts.stop_outcome = outcome;
  ts.stop_reason = reason;
  ts.updated_ms = now;
  PutTaskOp(j, index, batch);
}

void PoolService::FailJob(JobState& j, const std::string& reason, WriteBatch& batch) {
  SetJobPhase(j, JobPhase::kFailed);
  j.rec.reason = reason;
  for (size_t i = 0; i < j.tasks.size(); ++i)
    StopTask(j, static_cast<int>(i), TaskPhase::kCancelled, "job failed", batch);
  pending_.erase(j.rec.seq);
  partial_.erase(j.rec.seq);
  ++metrics_.finished["failed"];
  Event(j.rec.id, "Failed", j.rec.reason, batch);
  PutJobOps(j, batch);
}

// A task of `j` ended (finished, failed, or stopped). Decides what happens to the job.
void PoolService::AfterTaskEnded(JobState& j, WriteBatch& batch) {
  bool any_live = false, any_failed = false, any_preempted = false, any_pending = false;
  int failed_index = -1;
  for (size_t i = 0; i < j.tasks.size(); ++i) {
    const TaskState& ts = j.tasks[i];
    any_live |= IsLive(ts.phase);
    any_pending |= ts.phase == TaskPhase::kPending;
    any_preempted |= ts.phase == TaskPhase::kPreempted;
    if (ts.phase == TaskPhase::kFailed && failed_index < 0) {
      any_failed = true;
      failed_index = static_cast<int>(i);
    }
  }
  if (IsTerminal(j.phase)) {
    PutJobOps(j, batch);
    return;
  }
  const int64_t now = NowMs();
  if (any_failed) {
    // One failed task fails the gang: stop the rest.
    const TaskState& f = j.tasks[static_cast<size_t>(failed_index)];
    const auto& g = j.job.groups[static_cast<size_t>(f.group)];
    std::string reason = fmt::format("task {}[{}] failed", g.name, f.replica);
    const std::string plain = fmt::format("exit code {}", f.exit_code);
    if (f.exit_code != 0 || f.end_message.empty()) reason += " with " + plain;
    if (!f.end_message.empty() && f.end_message != plain) reason += ": " + f.end_message;
    if (j.job.retry.on_failure)
      reason += fmt::format("; gave up after {} restart(s) (retry.maxRestarts {})", j.rec.faults,
                            j.job.retry.max_restarts);
    FailJob(j, reason, batch);
    return;
  }
  if (any_live) {
    PutJobOps(j, batch);
    return;
  }
  if (any_preempted) {
    // Every task has stopped: the job goes back to its queue, to restart from its checkpoint.
    for (const TaskState& ts : j.tasks) {
      if (ts.phase == TaskPhase::kPreempted && !ts.stop_reason.empty()) {
        j.rec.reason = ts.stop_reason;
        break;
      }
    }
    j.pending_message = j.rec.reason;
    for (size_t i = 0; i < j.tasks.size(); ++i) {
      TaskState& ts = j.tasks[i];
      // Every task that was placed runs again as a new run (its agent tells runs apart by this).
      if (ts.phase != TaskPhase::kPending) ++ts.restarts;
      SetTaskPhase(j, ts, TaskPhase::kPending);
      ts.updated_ms = now;
      PutTaskOp(j, static_cast<int>(i), batch);
    }
    SetJobPhase(j, JobPhase::kPending);
    j.pending_since_ms = now;
    j.submit_mono = MonoSeconds();
    pending_.insert(j.rec.seq);
    partial_.erase(j.rec.seq);
    Event(j.rec.id, "Requeued", "every task stopped; queued again (" + j.rec.reason + ")", batch);
    PutJobOps(j, batch);
    return;
  }
  if (any_pending) {
    PutJobOps(j, batch);
    return;
  }
  SetJobPhase(j, JobPhase::kSucceeded);
  j.rec.reason = "every task exited 0";
  ++metrics_.finished["succeeded"];
  Event(j.rec.id, "Succeeded", "every task exited 0", batch);
  PutJobOps(j, batch);
}

void PoolService::ExpireStops(WriteBatch& batch) {
  const int64_t now = NowMs();
  for (auto sit = stopping_jobs_.begin(); sit != stopping_jobs_.end();) {
    JobState* jp = FindJob(*sit);
    bool still = false;
    if (jp != nullptr) {
      for (const TaskState& ts : jp->tasks) still |= ts.phase == TaskPhase::kStopping;
    }
    if (!still) {
      sit = stopping_jobs_.erase(sit);
      continue;
    }
    ++sit;
    JobState& j = *jp;
    bool ended = false;
    for (size_t i = 0; i < j.tasks.size(); ++i) {
      TaskState& ts = j.tasks[i];
      if (ts.phase != TaskPhase::kStopping || ts.stop_deadline_ms > now) continue;
      ReleaseTask(j, static_cast<int>(i));
      SetTaskPhase(j, ts, ts.stop_outcome);
      ts.updated_ms = now;
      PutTaskOp(j, static_cast<int>(i), batch);
      Event(j.rec.id, "TaskFinished",
            fmt::format("task {} did not confirm its stop in time; released ({})", i, ts.stop_reason), batch);
      ended = true;
    }
    if (ended) AfterTaskEnded(j, batch);
  }
}

void PoolService::FaultJob(JobState& j, const std::string& cause, const std::string& reason,
                           WriteBatch& batch) {
  if (IsTerminal(j.phase)) return;
  bool stopping_already = false;
  for (const TaskState& ts : j.tasks) stopping_already |= ts.phase == TaskPhase::kStopping;
  // A job already on its way out (cancelled, failed, moved) is not restarted twice for one stop.
  if (stopping_already && j.phase != JobPhase::kRunning) return;
  const int64_t now = NowMs();
  ++metrics_.faults[cause];
  if (j.rec.faults >= j.job.retry.max_restarts) {
    FailJob(j,
            fmt::format("{}; gave up after {} restart(s) (retry.maxRestarts {})", reason, j.rec.faults,
                        j.job.retry.max_restarts),
            batch);
    return;
  }
  ++j.rec.faults;
  const int64_t wait = j.job.retry.BackoffSeconds(j.rec.faults);
  j.rec.not_before_ms = now + 1000 * wait;
  for (size_t i = 0; i < j.tasks.size(); ++i)
    StopTask(j, static_cast<int>(i), TaskPhase::kPreempted, reason, batch);
  Event(j.rec.id, "Fault",
        fmt::format("{}: the job restarts from its checkpoint (restart {} of {}{})", reason, j.rec.faults,
                    j.job.retry.max_restarts, wait > 0 ? fmt::format(", after {} s", wait) : ""),
        batch);
  PutJobOps(j, batch);
}

void PoolService::CheckNodes(WriteBatch& batch) {
  const int64_t now = NowMs();
  const double mono = MonoSeconds();
  for (NodeIndex n = 0; n < nodes_.size(); ++n) {
    NodeInfo& info = nodes_[n];
    if (info.state != "ready" || mono - info.heartbeat_mono < config_.heartbeat_timeout_seconds) continue;
    const std::string& name = ledger_.spec(n).name;
    info.state = "lost";
    ++metrics_.nodes_lost;
    const std::string reason =
        fmt::format("node {} lost (no heartbeat for {:.1f} s)", name, mono - info.heartbeat_mono);
    batch.Add(PutNode{MakeNodeRecord(name, info.spec_json, ledger_.state(n).cordoned, info.draining,
                                     info.state, info.last_heartbeat_ms)});
    Event("", "NodeLost", reason, batch);
    // The node's agent fenced its tasks before this timeout (it could not renew its lease), so they
    // are released at once and their jobs restart elsewhere.
    std::set<std::string> job_ids;
    for (const auto& [job_id, index] : info.tasks) job_ids.insert(job_id);
    for (const std::string& job_id : job_ids) {
      JobState* j = FindJob(job_id);
      if (j == nullptr) continue;
      std::vector<int> released;
      for (size_t i = 0; i < j->tasks.size(); ++i) {
        TaskState& ts = j->tasks[i];
        if (!IsLive(ts.phase) || !ts.placed || ts.placement.node != n) continue;
        const TaskPhase outcome = ts.phase == TaskPhase::kStopping ? ts.stop_outcome : TaskPhase::kPreempted;
        ReleaseTask(*j, static_cast<int>(i));
        SetTaskPhase(*j, ts, outcome);
        if (outcome == TaskPhase::kPreempted && ts.stop_reason.empty()) ts.stop_reason = reason;
        ts.updated_ms = now;
        PutTaskOp(*j, static_cast<int>(i), batch);
        released.push_back(static_cast<int>(i));
      }
      Event(job_id, "NodeLost", fmt::format("{}; task(s) {} released", reason, fmt::join(released, ", ")),
            batch);
      if (j->phase == JobPhase::kRunning) {
        for (int i : released) {
          if (j->tasks[static_cast<size_t>(i)].phase == TaskPhase::kPreempted)
            j->tasks[static_cast<size_t>(i)].stop_reason = reason;
        }
        FaultJob(*j, "node_lost", reason, batch);
      }
      AfterTaskEnded(*j, batch);
    }
  }
}

std::vector<PoolService::JobState*> PoolService::JobsOnGpu(NodeIndex n, int gpu) {
  std::vector<JobState*> out;
  for (const auto& [job_id, index] : nodes_[n].tasks) {
    JobState* j = FindJob(job_id);
    if (j == nullptr) continue;
    const TaskState& ts = j->tasks[static_cast<size_t>(index)];
    if (!IsLive(ts.phase)) continue;
    for (const GpuGrant& g : ts.placement.gpus) {
      if (g.gpu == gpu && std::find(out.begin(), out.end(), j) == out.end()) out.push_back(j);
    }
  }
  return out;
}

void PoolService::UpdateGpuUsable(NodeIndex n, int gpu) {
  const NodeInfo::GpuCondition& c = nodes_[n].gpus[static_cast<size_t>(gpu)];
  const bool usable = c.fault.empty() && !c.hot;
  if (ledger_.state(n).gpus[static_cast<size_t>(gpu)].healthy == usable) return;
  (void)ledger_.SetGpuHealthy(n, gpu, usable);
  if (usable) {
    ++capacity_epoch_;
    wake_pending_ = true;
    wake_.notify_one();
  }
}

void PoolService::ApplyGpuReports(NodeIndex n, const std::vector<GpuReport>& reports, WriteBatch& batch) {
  NodeInfo& info = nodes_[n];
  const NodeSpec& spec = ledger_.spec(n);
  info.gpus.resize(spec.gpus.size());
  const int64_t now = NowMs();
  const auto& hs = config_.hotspot;
  for (const GpuReport& r : reports) {
    if (r.index < 0 || static_cast<size_t>(r.index) >= info.gpus.size()) continue;
    NodeInfo::GpuCondition& c = info.gpus[static_cast<size_t>(r.index)];
    const std::string where = fmt::format("GPU {} on {}", r.index, spec.name);
    // Faults: an unhealthy GPU takes no placements; its jobs stop and restart elsewhere.
    if (!r.healthy && c.fault.empty()) {
      c.fault = r.reason.empty() ? "unhealthy" : r.reason;
      UpdateGpuUsable(n, r.index);
      const std::string reason = fmt::format("{} failed: {}", where, c.fault);
      Event("", "GpuFault", reason, batch);
      for (JobState* j : JobsOnGpu(n, r.index)) FaultJob(*j, "gpu_fault", reason, batch);
    } else if (r.healthy && !c.fault.empty()) {
      Event("", "GpuRecovered", fmt::format("{} is healthy again (was: {})", where, c.fault), batch);
      c.fault.clear();
      UpdateGpuUsable(n, r.index);
    }
    // Hot spots: over a threshold for the whole window makes the GPU hot; under every threshold for
    // the cooldown makes it usable again.
    c.temperature_c = r.temperature_c;
    c.utilization = r.utilization;
    c.memory_used_fraction = r.memory_used_fraction;
    std::vector<std::string> over;
    if (hs.temperature_c > 0 && r.temperature_c >= hs.temperature_c)
      over.push_back(fmt::format("temperature {:.0f} C >= {:.0f} C", r.temperature_c, hs.temperature_c));
    if (hs.utilization > 0 && r.utilization >= hs.utilization)
      over.push_back(fmt::format("utilization {:.2f} >= {:.2f}", r.utilization, hs.utilization));
    if (hs.memory_used_fraction > 0 && r.memory_used_fraction >= hs.memory_used_fraction)
      over.push_back(
          fmt::format("memory used {:.2f} >= {:.2f}", r.memory_used_fraction, hs.memory_used_fraction));
    if (!over.empty()) {
      c.under_since_ms = 0;
      if (c.over_since_ms == 0) c.over_since_ms = now;
      if (!c.hot && now - c.over_since_ms >= 1000LL * hs.window_seconds) {
        c.hot = true;
        c.hot_reason = fmt::format("{} for {} s", fmt::join(over, ", "), (now - c.over_since_ms) / 1000);
        UpdateGpuUsable(n, r.index);
        Event("", "GpuHot", fmt::format("{} is hot: {}; no new placements", where, c.hot_reason), batch);
        if (hs.migrate) {
          const std::string reason = fmt::format("migrated off hot {} ({})", where, c.hot_reason);
          for (JobState* j : JobsOnGpu(n, r.index)) {
            if (j->job.qos != QosClass::kBestEffort || j->phase != JobPhase::kRunning) continue;
            bool stopping = false;
            for (const TaskState& ts : j->tasks) stopping |= ts.phase == TaskPhase::kStopping;
            if (stopping) continue;
            ++metrics_.hotspot_migrations;
            for (size_t i = 0; i < j->tasks.size(); ++i)
              StopTask(*j, static_cast<int>(i), TaskPhase::kPreempted, reason, batch);
            Event(j->rec.id, "Migrating", reason + ": the job stops, checkpoints and restarts elsewhere",
                  batch);
          }
        }
      }
    } else {
      c.over_since_ms = 0;
      if (c.under_since_ms == 0) c.under_since_ms = now;
      if (c.hot && now - c.under_since_ms >= 1000LL * hs.cooldown_seconds) {
        c.hot = false;
        Event("", "GpuCooled",
              fmt::format("{} has been under the hot-spot thresholds for {} s; placements again", where,
                          (now - c.under_since_ms) / 1000),
              batch);
        c.hot_reason.clear();
        UpdateGpuUsable(n, r.index);
      }
    }
  }
}

// ---- JSON views --------------------------------------------------------------------------------

json PoolService::TaskJson(const JobState& j, int index) const {
  const TaskState& ts = j.tasks[static_cast<size_t>(index)];
  const TaskGroup& g = j.job.groups[static_cast<size_t>(ts.group)];
  json t = {{"index", index},           {"group", g.name},
            {"replica", ts.replica},    {"state", TaskPhaseName(ts.phase)},
            {"exitCode", ts.exit_code}, {"restarts", ts.restarts}};
  if (ts.placed) {
    json p = PlacementToJson(ts.placement, ledger_);
    t["node"] = p["node"];
    t["cpu"] = p["cpu"];
    t["memory"] = p["memory"];
    t["gpus"] = p["gpus"];
  } else {
    t["node"] = "";
    t["gpus"] = json::array();
  }
  if (ts.phase == TaskPhase::kStopping) t["stopReason"] = ts.stop_reason;
  // How it ended, as its agent said ("exit code 3", "killed by SIGKILL after the grace period").
  if (!ts.end_message.empty()) t["message"] = ts.end_message;
  return t;
}

json PoolService::JobJson(const JobState& j) const {
  json out = {{"id", j.rec.id},
              {"name", j.rec.name},
              {"tenant", j.rec.tenant},
              {"queue", j.rec.queue},
              {"priority", j.rec.priority},
              {"qos", QosClassName(j.job.qos)},
              {"state", JobPhaseName(j.phase)},
              {"reason", j.rec.reason},
              {"faults", j.rec.faults},
              {"createdAt", FormatTime(j.rec.created_ms)},
              {"updatedAt", FormatTime(j.rec.updated_ms)}};
  if (j.phase == JobPhase::kPending && j.rec.not_before_ms > NowMs())
    out["notBefore"] = FormatTime(j.rec.not_before_ms);
  out["spec"] = JobSpecToJson(j.job);
  out["taskCounts"] = TaskCountsJson(static_cast<int>(j.tasks.size()), j.task_counts);
  json tasks = json::array();
  for (size_t i = 0; i < j.tasks.size(); ++i) tasks.push_back(TaskJson(j, static_cast<int>(i)));
  out["tasks"] = std::move(tasks);
  // For GET /api/v1/jobs/{id}?wait=S&since=VERSION.
  out["version"] = job_watches_->Version(j.rec.id);
  return out;
}

json PoolService::NodeJson(NodeIndex n) const {
  const NodeSpec& spec = ledger_.spec(n);
  const NodeState& st = ledger_.state(n);
  const NodeInfo& info = nodes_[n];
  int64_t gpu_capacity = 0;
  json gpus = json::array();
  std::map<int, json> gpu_tasks;
  for (const auto& [job_id, index] : info.tasks) {
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) continue;
    const TaskState& ts = it->second->tasks[static_cast<size_t>(index)];
    for (const GpuGrant& g : ts.placement.gpus) {
      gpu_tasks[g.gpu].push_back({{"job", job_id}, {"index", index}, {"share", g.share.units()}});
    }
  }
  for (size_t i = 0; i < spec.gpus.size(); ++i) {
    const GpuDevice& d = spec.gpus[i];
    const GpuState& gs = st.gpus[i];
    if (!d.mig_enabled) gpu_capacity += 1000;
    json g = {{"index", d.index},           {"uuid", d.uuid},
              {"model", d.model},           {"memory", FormatMemory(d.memory)},
              {"healthy", gs.healthy},      {"migEnabled", gs.mig_enabled},
              {"freeShare", gs.free_share}, {"freeMemory", FormatMemory(MiB(gs.free_memory))}};
    if (i < info.gpus.size()) {
      const NodeInfo::GpuCondition& c = info.gpus[i];
      if (!c.fault.empty()) g["fault"] = c.fault;
      g["hot"] = c.hot;
      if (c.hot) g["hotReason"] = c.hot_reason;
      if (c.temperature_c >= 0) g["temperatureC"] = c.temperature_c;
      if (c.utilization >= 0) g["utilization"] = c.utilization;
      if (c.memory_used_fraction >= 0) g["memoryUsedFraction"] = c.memory_used_fraction;
    }
    auto it = gpu_tasks.find(static_cast<int>(i));
    g["tasks"] = it == gpu_tasks.end() ? json::array() : it->second;
    gpus.push_back(std::move(g));
  }
  return {{"name", spec.name},
          {"state", info.state},
          {"cordoned", st.cordoned},
          {"draining", info.draining},
          {"labels", spec.labels},
          {"lastHeartbeat", FormatTime(info.last_heartbeat_ms)},
          {"capacity",
           {{"cpu", FormatCpu(spec.cpu)},
            {"memory", FormatMemory(spec.memory)},
            {"gpus", spec.gpus.size()},
            {"gpuShare", gpu_capacity}}},
          {"free",
           {{"cpu", FormatCpu(MilliCpu(st.free_cpu))},
            {"memory", FormatMemory(MiB(st.free_memory))},
            {"gpuShare", st.free_gpu_share}}},
          {"tasks", info.tasks.size()},
          {"gpus", std::move(gpus)},
          {"spec", info.spec_json}};
}

json PoolService::QueueJson(const QueueSpec& q) const {
  return QueueSpecJson(q);
}

// ---- jobs --------------------------------------------------------------------------------------

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
  const Resources demand = JobDemand(job);
  const auto task_count = static_cast<int64_t>(job.task_count());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!order_->HasQueue(job.queue))
      return Status::InvalidArgument(fmt::format("queue: unknown queue '{}'", job.queue));
    // Queue access rules bind tenants; admins may submit anywhere.
    if (who.role != Role::kAdmin) RETURN_IF_ERROR(CheckQueueAccess(*order_, job));
    if (Status st = order_->Admit(job.queue, demand); !st.ok()) return st;
    // The room is reserved here, under the lock, before the durable write (which runs without it):
    // concurrent submissions cannot all pass the check and then overshoot together.
    RETURN_IF_ERROR(
        pending_counts_.CheckRoom(config_, order_->FindQueue(job.queue), job.tenant, job.queue, task_count));
    pending_counts_.Add(job.tenant, job.queue, task_count);
    ++submissions_in_flight_;
  }
  const uint64_t seq = next_seq_.fetch_add(1);
  job.id = fmt::format("j-{:012}", seq);
  const int64_t now = NowMs();
  auto state = std::make_unique<JobState>();
  state->rec.id = job.id;
  state->rec.seq = seq;
  state->rec.tenant = job.tenant;
  state->rec.queue = job.queue;
  state->rec.name = job.name;
  state->rec.priority = job.priority;
  state->rec.state = "pending";
  state->rec.spec_json = JobSpecToJson(job).dump();
  state->rec.created_ms = now;
  state->rec.updated_ms = now;
  state->demand = demand;
  state->pending_since_ms = now;
  state->submit_mono = MonoSeconds();
  int t = 0;
  for (size_t g = 0; g < job.groups.size(); ++g) {
    for (int rep = 0; rep < job.groups[g].replicas; ++rep, ++t) {
      TaskState ts;
      ts.group = static_cast<int>(g);
      ts.replica = rep;
      ts.updated_ms = now;
      state->tasks.push_back(ts);
      state->task_group.push_back(static_cast<int>(g));
    }
  }
  state->job = std::move(job);

  WriteBatch batch;
  batch.Add(PutJob{state->rec});
  for (size_t i = 0; i < state->tasks.size(); ++i) {
    TaskRecord r;
    r.job_id = state->rec.id;
    r.index = static_cast<int>(i);
    r.state = "pending";
    r.updated_ms = now;
    batch.Add(PutTask{r});
  }
  EventRecord e;
  e.job_id = state->rec.id;
  e.time_ms = now;
  e.type = "Submitted";
  e.message = fmt::format("by tenant '{}' to queue '{}': {} task(s), needs {}", state->rec.tenant,
                          state->rec.queue, state->tasks.size(), FormatResources(demand));
  batch.Add(AppendEvent{e});
  if (Status st = committer_->Commit(std::move(batch)); !st.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_counts_.Remove(state->rec.tenant, state->rec.queue, task_count);
    --submissions_in_flight_;
    return Status::Internal("the job could not be stored: " + st.message());
  }

  std::lock_guard<std::mutex> lock(mu_);
  --submissions_in_flight_;  // its reservation is now the pending job's count
  JobState* raw = state.get();
  for (const auto& g : raw->job.groups) {
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
  by_seq_[seq] = raw;
  by_tenant_[raw->rec.tenant].insert(seq);
  pending_.insert(seq);
  ++job_phase_count_[static_cast<size_t>(JobPhase::kPending)];
  ++queue_phase_count_[raw->rec.queue][static_cast<size_t>(JobPhase::kPending)];
  raw->task_counts[static_cast<size_t>(TaskPhase::kPending)] = static_cast<int32_t>(raw->tasks.size());
  jobs_[raw->rec.id] = std::move(state);
  ++metrics_.submitted;
  wake_pending_ = true;
  wake_.notify_one();
  return JobJson(*raw);
}

Result<PoolService::LogSource> PoolService::TaskLogSource(const Principal& who, const std::string& job_id,
                                                          int index) {
  std::lock_guard<std::mutex> lock(mu_);
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
  auto n = ledger_.FindNode(ts.last_node);
  if (!n) return Status::FailedPrecondition(fmt::format("node '{}' is no longer registered", ts.last_node));
  const NodeInfo& info = nodes_[*n];
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
  std::lock_guard<std::mutex> lock(mu_);
  auto j = VisibleJob(who, id);
  if (!j.ok()) return j.status();
  return JobJson(**j);
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
  uint64_t last = 0;
  bool more = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
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
      auto t = by_tenant_.find(only_tenant);
      source = t == by_tenant_.end() ? &kNone : &t->second;
    } else if (source == nullptr && q.states.size() == 1 && q.states.count("pending")) {
      source = &pending_;
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
        s.tasks_json = json::array();
        for (size_t i = 0; i < j.tasks.size(); ++i) s.tasks_json.push_back(TaskJson(j, static_cast<int>(i)));
        listed_tasks += s.tasks;
      }
      return true;
    };
    if (source != nullptr) {
      for (auto it = source->upper_bound(q.after_seq); it != source->end(); ++it) {
        auto j = by_seq_.find(*it);
        if (j != by_seq_.end() && !visit(*it, *j->second)) break;
      }
    } else {
      for (auto it = by_seq_.upper_bound(q.after_seq); it != by_seq_.end(); ++it) {
        if (!visit(it->first, *it->second)) break;
      }
    }
  }
  // The JSON is built without the lock.
  json items = json::array();
  for (const JobSummary& s : page) items.push_back(JobSummaryJson(s, q.with_spec, q.with_tasks));
  json out = {{"items", std::move(items)}};
  if (more) out["nextPageToken"] = std::to_string(last);
  return out;
}

Result<json> PoolService::CancelJob(const Principal& who, const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto jr = VisibleJob(who, id);
  if (!jr.ok()) return jr.status();
  JobState& j = **jr;
  if (IsTerminal(j.phase))
    return Status::FailedPrecondition(fmt::format("job '{}' is already {}", id, JobPhaseName(j.phase)));
  WriteBatch batch;
  const std::string by = who.role == Role::kAdmin ? "an admin" : "tenant '" + who.tenant + "'";
  for (size_t i = 0; i < j.tasks.size(); ++i) {
    TaskState& ts = j.tasks[i];
    if (ts.phase == TaskPhase::kPending) {
      SetTaskPhase(j, ts, TaskPhase::kCancelled);
      ts.updated_ms = NowMs();
      PutTaskOp(j, static_cast<int>(i), batch);
    } else {
      StopTask(j, static_cast<int>(i), TaskPhase::kCancelled, "job cancelled", batch);
    }
  }
  SetJobPhase(j, JobPhase::kCancelled);
  j.rec.reason = "cancelled by " + by;
  pending_.erase(j.rec.seq);
  partial_.erase(j.rec.seq);
  if (reserved_for_ == j.rec.id) reserved_for_.clear();
  ++metrics_.finished["cancelled"];
  Event(j.rec.id, "Cancelled", j.rec.reason, batch);
  PutJobOps(j, batch);
  RETURN_IF_ERROR(CommitLocked(batch));
  return JobJson(j);
}

Result<json> PoolService::JobEvents(const Principal& who, const std::string& id, int64_t after_id,
                                    int limit) {
  if (limit < 1 || limit > 1000) return Status::InvalidArgument("limit: must be between 1 and 1000");
  json pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
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
        nodes[ledger_.spec(static_cast<NodeIndex>(n)).name] = why[n].empty() ? "fits" : why[n];
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
  std::lock_guard<std::mutex> lock(mu_);
  json items = json::array();
  for (NodeIndex n = 0; n < ledger_.node_count(); ++n) items.push_back(NodeJson(n));
  return {{"items", std::move(items)}};
}

Result<json> PoolService::GetNode(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto n = ledger_.FindNode(name);
  if (!n) return Status::NotFound(fmt::format("node '{}' not found", name));
  return NodeJson(*n);
}

Result<json> PoolService::SetCordon(const std::string& name, bool cordoned) {
  std::lock_guard<std::mutex> lock(mu_);
  auto n = ledger_.FindNode(name);
  if (!n) return Status::NotFound(fmt::format("node '{}' not found", name));
  NodeInfo& info = nodes_[*n];
  if (!cordoned && info.draining) info.draining = false;
  RETURN_IF_ERROR(ledger_.SetCordoned(*n, cordoned));
  ++capacity_epoch_;
  WriteBatch batch;
  batch.Add(PutNode{
      MakeNodeRecord(name, info.spec_json, cordoned, info.draining, info.state, info.last_heartbeat_ms)});
  Event("", cordoned ? "NodeCordoned" : "NodeUncordoned", name, batch);
  RETURN_IF_ERROR(CommitLocked(batch));
  wake_pending_ = true;
  wake_.notify_one();
  return NodeJson(*n);
}

Result<json> PoolService::DrainNode(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto n = ledger_.FindNode(name);
  if (!n) return Status::NotFound(fmt::format("node '{}' not found", name));
  NodeInfo& info = nodes_[*n];
  RETURN_IF_ERROR(ledger_.SetCordoned(*n, true));
  info.draining = true;
  WriteBatch batch;
  const auto tasks = info.tasks;
  for (const auto& [job_id, index] : tasks) {
    JobState* j = FindJob(job_id);
    if (j == nullptr) continue;
    // Every job on the node goes back to its queue and restarts elsewhere from its checkpoint.
    for (size_t i = 0; i < j->tasks.size(); ++i) {
      StopTask(*j, static_cast<int>(i), TaskPhase::kPreempted, "node " + name + " drained", batch);
    }
    Event(job_id, "Draining", fmt::format("node {} is drained: the job stops and is queued again", name),
          batch);
  }
  batch.Add(PutNode{MakeNodeRecord(name, info.spec_json, true, true, info.state, info.last_heartbeat_ms)});
  Event("", "NodeDrained", name, batch);
  RETURN_IF_ERROR(CommitLocked(batch));
  return NodeJson(*n);
}

// ---- queues ------------------------------------------------------------------------------------

json PoolService::ListQueues() {
  std::lock_guard<std::mutex> lock(mu_);
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
  std::lock_guard<std::mutex> lock(mu_);
  return GetQueueLocked(name);
}

Result<json> PoolService::GetQueueLocked(const std::string& name) {
  const auto& all = order_->options().queues;
  auto it = std::find_if(all.begin(), all.end(), [&](const QueueSpec& q) { return q.name == name; });
  if (it == all.end()) return Status::NotFound(fmt::format("queue '{}' not found", name));
  json j = QueueJson(*it);
  Resources used;
  for (const auto& [key, r] : usage_) {
    if (key.second == name) used += r;
  }
  j["used"] = ResourceMapJson(used);
  int64_t pending = 0, running = 0;
  if (auto c = queue_phase_count_.find(name); c != queue_phase_count_.end()) {
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
  std::lock_guard<std::mutex> lock(mu_);
  if (order_->HasQueue(q->name))
    return Status::FailedPrecondition(fmt::format("queue '{}' already exists", q->name));
  std::vector<QueueSpec> next = queues_;
  next.push_back(*q);
  QueueOrderOptions options = config_.ordering;
  options.queues = next;
  auto order = QueueOrder::Create(options);
  if (!order.ok()) return Status::InvalidArgument(order.status().message());
  WriteBatch batch;
  batch.Add(PutQueue{{q->name, QueueJson(*q).dump()}});
  Event("", "QueueCreated", q->name, batch);
  RETURN_IF_ERROR(CommitLocked(batch));
  queues_ = std::move(next);
  order_.emplace(std::move(order).value());
  ++capacity_epoch_;
  return GetQueueLocked(q->name);
}

Result<json> PoolService::UpdateQueue(const std::string& name, const json& body) {
  RETURN_IF_ERROR(disk_guard_->Check());
  std::lock_guard<std::mutex> lock(mu_);
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
  std::vector<QueueSpec> next;
  bool found = false;
  for (const QueueSpec& s : order_->options().queues) {
    if (s.name == name) {
      next.push_back(*q);
      found = true;
    } else {
      next.push_back(s);
    }
  }
  if (!found) next.push_back(*q);
  QueueOrderOptions options = config_.ordering;
  options.queues = next;
  auto order = QueueOrder::Create(options);
  if (!order.ok()) return Status::InvalidArgument(order.status().message());
  WriteBatch batch;
  batch.Add(PutQueue{{q->name, QueueJson(*q).dump()}});
  Event("", "QueueUpdated", q->name, batch);
  RETURN_IF_ERROR(CommitLocked(batch));
  queues_ = order->options().queues;
  order_.emplace(std::move(order).value());
  ++capacity_epoch_;
  wake_pending_ = true;
  wake_.notify_one();
  return GetQueueLocked(name);
}

// ---- node side ---------------------------------------------------------------------------------

namespace {

// A placement's run id: 128 random bits. Unguessable, and never the same twice, not even in a
// pool whose store was created anew (job ids start again there; run ids do not).
std::string NewRunId() { return "r-" + RandomHex(16); }

// Exit codes an agent may report: a process's own (0..255), a shell's 128+signal, and negative
// values some runtimes use for "killed"; anything else is a broken or hostile agent.
constexpr int64_t kMinExitCode = -255;
constexpr int64_t kMaxExitCode = 255;

// An integer JSON value within [lo, hi] (an unsigned value above INT64_MAX is out of range).
bool InIntRange(const json& v, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) return false;
  if (v.is_number_unsigned()) return v.get<uint64_t>() <= static_cast<uint64_t>(std::max<int64_t>(hi, 0)) &&
                                     static_cast<int64_t>(v.get<uint64_t>()) >= lo;
  const int64_t x = v.get<int64_t>();
  return x >= lo && x <= hi;
}

struct AgentInfo {
  std::string endpoint;
  std::string log_token;
};

// The "agent" member of a registration or heartbeat: {endpoint: "http://host:port", logToken}.
Result<AgentInfo> ParseAgentInfo(const json& v) {
  if (!v.is_object()) return Status::InvalidArgument("agent: must be an object {endpoint, logToken}");
  AgentInfo info;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it.key() != "endpoint" && it.key() != "logToken")
      return Status::InvalidArgument(
          fmt::format("agent.{}: unknown field (known: endpoint, logToken)", it.key()));
    if (!it.value().is_string())
      return Status::InvalidArgument(fmt::format("agent.{}: must be a string", it.key()));
  }
  info.endpoint = v.value("endpoint", "");
  info.log_token = v.value("logToken", "");
  if (!info.endpoint.starts_with("http://") || info.endpoint.size() > 256 ||
      info.endpoint.find_first_of(" /?#", 7) != std::string::npos) {
    return Status::InvalidArgument(
        fmt::format("agent.endpoint: must be http://host:port, got '{}'", info.endpoint.substr(0, 256)));
  }
  if (info.log_token.size() < 16 || info.log_token.size() > 256 ||
      info.log_token.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
    return Status::InvalidArgument("agent.logToken: must be 16 to 256 hex digits");
  }
  return info;
}

}  // namespace

Result<json> PoolService::RegisterNode(const Principal& who, const json& body_in) {
  std::optional<AgentInfo> agent;
  json body = body_in;
  if (body.is_object() && body.contains("agent")) {
    auto a = ParseAgentInfo(body["agent"]);
    if (!a.ok()) return a.status();
    agent = *a;
    body.erase("agent");
  }
  // The cluster the agent belongs to, when it has been in one: a different one is refused, so a
  // node of an old pool never joins a new one (with the old pool's tasks still on it).
  if (body.is_object() && body.contains("clusterId")) {
    if (!body["clusterId"].is_string() || body["clusterId"].get<std::string>().size() > 64)
      return Status::InvalidArgument("clusterId: must be a string of at most 64 characters");
    const std::string theirs = body["clusterId"].get<std::string>();
    body.erase("clusterId");
    if (!theirs.empty() && theirs != cluster_id_)
      return Status::FailedPrecondition(fmt::format(
          "clusterId: the agent belongs to cluster {}, this server is cluster {} (its store was created "
          "anew); the agent does not join another pool: see docs/agent.md#cluster-identity",
          theirs, cluster_id_));
  }
  auto spec = ParseNodeSpec(body, ledger_.catalog());
  if (!spec.ok()) return spec.status();
  const json canonical = NodeSpecToJson(*spec);
  if (who.role == Role::kNode && who.node != spec->name)
    return Status::PermissionDenied(fmt::format(
        "the credential of node '{}' may not register node '{}'", who.node, spec->name));
  if (who.role != Role::kAdmin && who.role != Role::kAgent && who.role != Role::kNode)
    return Status::PermissionDenied("only an agent or an admin registers nodes");
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = NowMs();
  auto existing = ledger_.FindNode(spec->name);
  if (who.role == Role::kAgent && existing && nodes_[*existing].state == "ready" &&
      credentials_.Live(spec->name)) {
    // Someone holding the bootstrap token could otherwise take over a live node's assignments.
    return Status::FailedPrecondition(fmt::format(
        "node '{}' is ready and its node credential is live: its agent registers with that credential; "
        "to replace the agent, an admin revokes it first (gpupool nodes revoke {})",
        spec->name, spec->name));
  }
  NodeIndex n;
  if (existing) {
    n = *existing;
    if (nodes_[n].spec_json != canonical)
      return Status::FailedPrecondition(fmt::format(
          "node '{}' is registered with a different inventory; a changed machine needs a new name",
          spec->name));
  } else {
    auto added = ledger_.AddNode(*spec);
    if (!added.ok()) return Status::InvalidArgument(added.status().message());
    n = *added;
    NodeInfo info;
    info.spec_json = canonical;
    nodes_.push_back(std::move(info));
  }
  NodeInfo& info = nodes_[n];
  const bool was_lost = info.state != "ready";
  info.state = "ready";
  info.last_heartbeat_ms = now;
  info.heartbeat_mono = MonoSeconds();
  info.agent_endpoint = agent ? agent->endpoint : "";
  info.agent_log_token = agent ? agent->log_token : "";
  ++capacity_epoch_;
  WriteBatch batch;
  batch.Add(PutNode{
      MakeNodeRecord(spec->name, canonical, ledger_.state(n).cordoned, info.draining, info.state, now)});
  Event("", existing ? (was_lost ? "NodeReady" : "NodeReregistered") : "NodeRegistered", spec->name, batch);
  std::string secret;
  if (who.role != Role::kNode) secret = credentials_.Issue(spec->name, now, batch);
  if (Status st = CommitLocked(batch); !st.ok()) {
    if (!secret.empty()) credentials_.Forget(spec->name);
    return st;
  }
  wake_pending_ = true;
  wake_.notify_one();
  json out = {{"node", NodeJson(n)},
              {"clusterId", cluster_id_},
              {"features", AgentFeatures()},
              {"heartbeatIntervalSeconds", config_.heartbeat_interval_seconds},
              {"heartbeatTimeoutSeconds", config_.heartbeat_timeout_seconds}};
  if (!secret.empty()) out["credential"] = secret;
  return out;
}

std::optional<Principal> PoolService::AuthenticateNode(std::string_view secret) {
  auto node = credentials_.Authenticate(secret, NowMs());
  if (!node) return std::nullopt;
  return Principal{"", Role::kNode, *node};
}

json PoolService::ListNodeCredentials() { return credentials_.List(); }

Result<json> PoolService::RevokeNodeCredential(const std::string& node) {
  std::lock_guard<std::mutex> lock(mu_);
  WriteBatch batch;
  RETURN_IF_ERROR(credentials_.Revoke(node, NowMs(), batch));
  Event("", "NodeCredentialRevoked", node, batch);
  RETURN_IF_ERROR(CommitLocked(batch));
  return json{{"node", node}, {"state", "revoked"}};
}

Result<json> PoolService::Heartbeat(const std::string& node, const json& body) {
  if (!body.is_null() && !body.is_object())
    return Status::InvalidArgument("heartbeat: the body must be a JSON object");
  std::optional<AgentInfo> agent;
  std::vector<GpuReport> gpu_reports;
  if (body.is_object()) {
    for (auto it = body.begin(); it != body.end(); ++it) {
      if (it.key() != "tasks" && it.key() != "agent" && it.key() != "gpus")
        return Status::InvalidArgument(it.key() + ": unknown field (known: tasks, agent, gpus)");
    }
    if (body.contains("agent")) {
      auto a = ParseAgentInfo(body["agent"]);
      if (!a.ok()) return a.status();
      agent = *a;
    }
    if (body.contains("gpus")) {
      const json& gs = body["gpus"];
      if (!gs.is_array()) return Status::InvalidArgument("gpus: must be a list");
      if (gs.size() > 1024) return Status::InvalidArgument("gpus: at most 1024 entries");
      for (size_t i = 0; i < gs.size(); ++i) {
        const json& g = gs[i];
        const std::string where = fmt::format("gpus[{}]", i);
        if (!g.is_object() || !g.contains("index") || !g["index"].is_number_integer())
          return Status::InvalidArgument(where + ": needs index (integer)");
        if (!InIntRange(g["index"], 0, 1023))
          return Status::InvalidArgument(where + ".index: must be a GPU index of the node (0 to 1023)");
        GpuReport r;
        r.index = static_cast<int>(g["index"].get<int64_t>());
        for (auto it = g.begin(); it != g.end(); ++it) {
          const std::string& k = it.key();
          const json& v = it.value();
          if (k == "index") continue;
          if (k == "healthy") {
            if (!v.is_boolean()) return Status::InvalidArgument(where + ".healthy: must be true or false");
            r.healthy = v.get<bool>();
          } else if (k == "reason") {
            if (!v.is_string()) return Status::InvalidArgument(where + ".reason: must be a string");
            r.reason = v.get<std::string>().substr(0, 256);
          } else if (k == "temperatureC" || k == "utilization" || k == "memoryUsedFraction") {
            const double hi = k == "temperatureC" ? 1000 : 1;
            if (!v.is_number() || !(v.get<double>() >= 0 && v.get<double>() <= hi))
              return Status::InvalidArgument(fmt::format("{}.{}: must be a number in [0, {}]", where, k, hi));
            (k == "temperatureC"  ? r.temperature_c
             : k == "utilization" ? r.utilization
                                  : r.memory_used_fraction) = v.get<double>();
          } else {
            return Status::InvalidArgument(
                fmt::format("{}.{}: unknown field (known: index, healthy, reason, temperatureC, utilization, "
                            "memoryUsedFraction)",
                            where, k));
          }
        }
        gpu_reports.push_back(std::move(r));
      }
    }
    // Every number is checked before anything of the heartbeat is applied: a bad one is a 400
    // naming the field, with nothing stored.
    if (!gpu_reports.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      auto n = ledger_.FindNode(node);
      if (!n) return Status::NotFound(fmt::format("node '{}' is not registered", node));
      const size_t count = ledger_.spec(*n).gpus.size();
      for (size_t i = 0; i < gpu_reports.size(); ++i) {
        if (static_cast<size_t>(gpu_reports[i].index) >= count)
          return Status::InvalidArgument(fmt::format("gpus[{}].index: node '{}' has {} GPU(s), there is no GPU {}",
                                                     i, node, count, gpu_reports[i].index));
      }
    }
    if (body.contains("tasks")) {
      if (!body["tasks"].is_array()) return Status::InvalidArgument("tasks: must be a list");
      if (body["tasks"].size() > 4096) return Status::InvalidArgument("tasks: at most 4096 entries");
      for (size_t i = 0; i < body["tasks"].size(); ++i) {
        const json& t = body["tasks"][i];
        const std::string where = fmt::format("tasks[{}]", i);
        if (!t.is_object() || !t.contains("jobId") || !t["jobId"].is_string() || !t.contains("index") ||
            !t["index"].is_number_integer())
          return Status::InvalidArgument(where + ": needs jobId (string) and index (integer)");
        if (!InIntRange(t["index"], 0, 999999))
          return Status::InvalidArgument(where + ".index: must be a task index, 0 to 999999");
        if (t.contains("exitCode") && !InIntRange(t["exitCode"], kMinExitCode, kMaxExitCode))
          return Status::InvalidArgument(
              fmt::format("{}.exitCode: must be an integer from {} to {}", where, kMinExitCode, kMaxExitCode));
      }
      for (size_t i = 0; i < body["tasks"].size(); ++i) {
        const json& t = body["tasks"][i];
        const std::string where = fmt::format("tasks[{}]", i);
        json status = t;
        status.erase("jobId");
        status.erase("index");
        auto r = ReportTask(node, t["jobId"].get<std::string>(), t["index"].get<int>(), status);
        if (!r.ok()) return r.status().WithContext(where);
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto n = ledger_.FindNode(node);
    if (!n) return Status::NotFound(fmt::format("node '{}' is not registered", node));
    NodeInfo& info = nodes_[*n];
    info.last_heartbeat_ms = NowMs();
    info.heartbeat_mono = MonoSeconds();
    WriteBatch batch;
    if (info.state != "ready") {
      // Back from lost: its tasks were released when it was lost (the agent fenced them), so it
      // comes back empty and its agent stops whatever is not in its assignments.
      info.state = "ready";
      batch.Add(PutNode{MakeNodeRecord(node, info.spec_json, ledger_.state(*n).cordoned, info.draining,
                                       info.state, info.last_heartbeat_ms)});
      Event("", "NodeReady", node + " heartbeats again", batch);
      ++capacity_epoch_;
      wake_pending_ = true;
      wake_.notify_one();
    }
    // After a server restart the agent's endpoint comes back with its first heartbeat.
    if (agent) {
      info.agent_endpoint = agent->endpoint;
      info.agent_log_token = agent->log_token;
    }
    ApplyGpuReports(*n, gpu_reports, batch);
    credentials_.FlushLastUsed(kCredentialLastUsedStepMs, batch);
    if (!batch.empty()) RETURN_IF_ERROR(CommitLocked(batch));
  }
  auto out = Assignments(node);
  if (out.ok()) {
    (*out)["clusterId"] = cluster_id_;
    (*out)["features"] = AgentFeatures();
    (*out)["heartbeatIntervalSeconds"] = config_.heartbeat_interval_seconds;
    (*out)["heartbeatTimeoutSeconds"] = config_.heartbeat_timeout_seconds;
  }
  return out;
}

Result<json> PoolService::Assignments(const std::string& node) {
  std::unique_lock<std::mutex> lock(mu_);
  // An assignment is handed out only once the cycle that made it is on disk: a task must never run
  // that a restart would not know about.
  const uint64_t gen = enqueued_gen_;
  durable_.wait(lock, [&] { return durable_gen_ >= gen; });
  auto n = ledger_.FindNode(node);
  if (!n) return Status::NotFound(fmt::format("node '{}' is not registered", node));
  return AssignmentsJsonLocked(*n);
}

Result<std::optional<json>> PoolService::WatchAssignments(const std::string& node, const std::string& since,
                                                          std::shared_ptr<Watcher> watcher) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t gen = enqueued_gen_;
  durable_.wait(lock, [&] { return durable_gen_ >= gen; });
  auto n = ledger_.FindNode(node);
  if (!n) return Status::NotFound(fmt::format("node '{}' is not registered", node));
  // Changes not yet durable (the loop's cycle in flight) are not announced: the version is the
  // last one whose changes are on disk.
  if (!node_watches_->Wait(*n, since, std::move(watcher), [&] { return AssignmentsJsonLocked(*n); }))
    return {AssignmentsJsonLocked(*n)};
  return {std::nullopt};
}

Result<std::optional<json>> PoolService::WatchJob(const Principal& who, const std::string& id,
                                                  const std::string& since, std::shared_ptr<Watcher> watcher) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t gen = enqueued_gen_;
  durable_.wait(lock, [&] { return durable_gen_ >= gen; });
  ASSIGN_OR_RETURN(JobState * j, VisibleJob(who, id));
  if (!job_watches_->Wait(j->rec.id, since, std::move(watcher), [&] { return JobJson(*j); })) return {JobJson(*j)};
  return {std::nullopt};
}

json PoolService::AssignmentsJsonLocked(NodeIndex n) const {
  json items = json::array();
  for (const auto& [job_id, index] : nodes_[n].tasks) {
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) continue;
    const JobState* j = it->second.get();
    const TaskState& ts = j->tasks[static_cast<size_t>(index)];
    const TaskGroup& g = j->job.groups[static_cast<size_t>(ts.group)];
    json a = {{"jobId", job_id}, {"index", index}, {"state", TaskPhaseName(ts.phase)}};
    if (ts.phase == TaskPhase::kStopping) {
      a["desired"] = "stop";
      a["gracePeriodSeconds"] = config_.grace_period_seconds;
      a["reason"] = ts.stop_reason;
    } else {
      a["desired"] = "run";
    }
    a["name"] = fmt::format("{}/{}-{}", j->rec.name, g.name, ts.replica);
    a["tenant"] = j->rec.tenant;
    a["qos"] = QosClassName(j->job.qos);
    a["isolation"] = IsolationModeName(g.exec.isolation);
    a["command"] = g.exec.command;
    a["env"] = g.exec.env;
    a["bundle"] = g.exec.bundle;
    a["rootfs"] = g.exec.rootfs;
    a["checkpoint"] = {{"dir", g.exec.checkpoint.dir},
                       {"intervalSeconds", g.exec.checkpoint.interval_seconds}};
    a["restarts"] = ts.restarts;
    a["runId"] = ts.run_id;
    json p = PlacementToJson(ts.placement, ledger_);
    a["cpu"] = p["cpu"];
    a["memory"] = p["memory"];
    a["gpus"] = p["gpus"];
    items.push_back(std::move(a));
  }
  // The version of this list; the agent sends it back to wait for the next change.
  return json{{"assignments", std::move(items)}, {"version", node_watches_->Version(n)}};
}

Result<PoolService::TaskReport> PoolService::ParseTaskReport(const std::string& job_id, int index, const json& body,
                                                               bool with_ids) {
  if (!body.is_object()) return Status::InvalidArgument("status: the body must be a JSON object");
  TaskReport r;
  r.job_id = job_id;
  r.index = index;
  std::string& state = r.state;
  int& exit_code = r.exit_code;
  std::string& message = r.message;
  int& run = r.run;
  std::optional<std::string>& run_id = r.run_id;
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& k = it.key();
    if (with_ids && (k == "jobId" || k == "index")) continue;
    if (k == "state") {
      if (!it.value().is_string()) return Status::InvalidArgument("state: must be a string");
      state = it.value().get<std::string>();
    } else if (k == "exitCode") {
      if (!InIntRange(it.value(), kMinExitCode, kMaxExitCode))
        return Status::InvalidArgument(
            fmt::format("exitCode: must be an integer from {} to {}", kMinExitCode, kMaxExitCode));
      exit_code = static_cast<int>(it.value().get<int64_t>());
    } else if (k == "message") {
      if (!it.value().is_string()) return Status::InvalidArgument("message: must be a string");
      message = it.value().get<std::string>().substr(0, 4096);
    } else if (k == "restarts") {
      if (!InIntRange(it.value(), 0, std::numeric_limits<int>::max()))
        return Status::InvalidArgument("restarts: must be a non-negative integer");
      run = static_cast<int>(it.value().get<int64_t>());
    } else if (k == "runId") {
      if (!it.value().is_string() || it.value().get<std::string>().size() > 64)
        return Status::InvalidArgument("runId: must be a string of at most 64 characters");
      run_id = it.value().get<std::string>();
    } else {
      return Status::InvalidArgument(k + ": unknown field (known: state, exitCode, message, restarts, runId" +
                                     std::string(with_ids ? ", jobId, index" : "") + ")");
    }
  }
  if (state != "running" && state != "succeeded" && state != "failed" && state != "stopped")
    return Status::InvalidArgument("state: must be running, succeeded, failed or stopped");
  return r;
}

Result<json> PoolService::ReportTask(const std::string& node, const std::string& job_id, int index,
                                     const json& body) {
  ASSIGN_OR_RETURN(TaskReport report, ParseTaskReport(job_id, index, body, /*with_ids=*/false));
  std::lock_guard<std::mutex> lock(mu_);
  WriteBatch batch;
  ASSIGN_OR_RETURN(json task, ReportTaskLocked(node, report, batch));
  RETURN_IF_ERROR(CommitLocked(batch));
  return task;
}

Result<json> PoolService::ReportTasks(const std::string& node, const json& body) {
  if (!body.is_object() || !body.contains("reports") || !body["reports"].is_array())
    return Status::InvalidArgument("reports: the body must be {\"reports\": [...]}");
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (it.key() != "reports") return Status::InvalidArgument(it.key() + ": unknown field (known: reports)");
  }
  const json& items = body["reports"];
  if (items.size() > kMaxReportsPerCall)
    return Status::InvalidArgument(fmt::format("reports: at most {} entries", kMaxReportsPerCall));
  // Every entry is checked before any is applied: a malformed one is a 400 naming it, nothing stored.
  std::vector<TaskReport> reports;
  for (size_t i = 0; i < items.size(); ++i) {
    const json& t = items[i];
    const std::string where = fmt::format("reports[{}]", i);
    if (!t.is_object() || !t.contains("jobId") || !t["jobId"].is_string() || !t.contains("index") ||
        !InIntRange(t["index"], 0, 999999))
      return Status::InvalidArgument(where + ": needs jobId (string) and index (integer, 0 to 999999)");
    auto r = ParseTaskReport(t["jobId"].get<std::string>(), static_cast<int>(t["index"].get<int64_t>()), t,
                             /*with_ids=*/true);
    if (!r.ok()) {
      // "state: must be ..." becomes "reports[1].state: must be ...": the field is named whole.
      const std::string& m = r.status().message();
      const auto colon = m.find(": ");
      if (r.status().code() == StatusCode::kInvalidArgument && colon != std::string::npos &&
          m.find(' ') > colon)
        return Status::InvalidArgument(where + "." + m);
      return r.status().WithContext(where);
    }
    reports.push_back(std::move(r).value());
  }
  // One critical section and one durable write for all; each report has its own outcome (a late
  // report of a task that moved on is that report's 409, not the others').
  std::lock_guard<std::mutex> lock(mu_);
  WriteBatch batch;
  json results = json::array();
  for (const TaskReport& r : reports) {
    auto task = ReportTaskLocked(node, r, batch);
    if (task.ok()) {
      results.push_back({{"ok", true}});
    } else {
      results.push_back({{"ok", false},
                         {"code", std::string(StatusCodeName(task.status().code()))},
                         {"message", task.status().message()}});
    }
  }
  RETURN_IF_ERROR(CommitLocked(batch));
  return json{{"results", std::move(results)}};
}

Result<json> PoolService::ReportTaskLocked(const std::string& node, const TaskReport& report, WriteBatch& batch) {
  const std::string& job_id = report.job_id;
  const int index = report.index;
  const std::string& state = report.state;
  const int exit_code = report.exit_code;
  std::string message = report.message;
  const int run = report.run;
  const std::optional<std::string>& run_id = report.run_id;
  auto n = ledger_.FindNode(node);
  if (!n) return Status::NotFound(fmt::format("node '{}' is not registered", node));
  JobState* j = FindJob(job_id);
  if (j == nullptr) return Status::NotFound(fmt::format("job '{}' not found", job_id));
  if (index < 0 || static_cast<size_t>(index) >= j->tasks.size())
    return Status::NotFound(fmt::format("job '{}' has no task {}", job_id, index));
  TaskState& ts = j->tasks[static_cast<size_t>(index)];
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
  const int64_t now = NowMs();
  const TaskGroup& g = j->job.groups[static_cast<size_t>(ts.group)];
  const std::string task_name = fmt::format("{}[{}]", g.name, ts.replica);
  if (state == "running") {
    if (ts.phase == TaskPhase::kAssigned) {
      SetTaskPhase(*j, ts, TaskPhase::kRunning);
      ts.updated_ms = now;
      PutTaskOp(*j, index, batch);
      Event(job_id, "TaskStarted", fmt::format("task {} started on {}", task_name, node), batch);
    }
  } else {
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
    SetTaskPhase(*j, ts, end);
    ts.exit_code = exit_code;
    ts.end_message = message;
    ts.updated_ms = now;
    Event(job_id, "TaskFinished",
          fmt::format("task {} on {}: {} (exit code {}){}{}", task_name, node, TaskPhaseName(end), exit_code,
                      message.empty() ? "" : ": ", message),
          batch);
    if (end == TaskPhase::kFailed && (j->job.retry.on_failure || unasked_stop) &&
        j->phase == JobPhase::kRunning && j->rec.faults < j->job.retry.max_restarts) {
      // A fault like a lost node: the gang restarts from its checkpoint.
      const std::string reason = unasked_stop
                                     ? fmt::format("task {} stopped on {}: {}", task_name, node, message)
                                     : fmt::format("task {} failed on {} with exit code {}{}{}", task_name,
                                                   node, exit_code, message.empty() ? "" : ": ", message);
      SetTaskPhase(*j, ts, TaskPhase::kPreempted);
      ts.stop_reason = reason;
      FaultJob(*j, unasked_stop ? "task_stopped" : "task_failed", reason, batch);
    }
    PutTaskOp(*j, index, batch);
    AfterTaskEnded(*j, batch);
  }
  return TaskJson(*j, index);
}

// ---- scheduling --------------------------------------------------------------------------------

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
  const size_t n = ledger_.node_count();
  bool any = false;
  mask.reasons = {"reserved for a waiting gang", "node labels do not match the job's node affinity",
                  "no task of a together-with job on the node", "runs a task of an apart-from job",
                  "node is lost"};
  mask.reason.assign(n, 0);
  for (size_t i = 0; i < n && i < nodes_.size(); ++i) {
    if (nodes_[i].state != "ready") {
      mask.reason[i] = 5;
      any = true;
    }
  }
  if (!reserved_for_.empty() && reserved_for_ != j.rec.id) {
    for (size_t i = 0; i < n && i < reserved_nodes_.size(); ++i) {
      if (reserved_nodes_[i] && mask.reason[i] == 0) {
        mask.reason[i] = 1;
        any = true;
      }
    }
  }
  const Affinity& aff = j.job.affinity;
  if (aff.empty()) return any;
  for (size_t i = 0; i < n; ++i) {
    if (mask.reason[i] != 0) continue;
    const NodeSpec& spec = ledger_.spec(static_cast<NodeIndex>(i));
    uint8_t why = 0;
    for (const auto& req : aff.node) {
      if (!req.Matches(spec.labels)) why = 2;
    }
    if (why == 0 && (!aff.together_with.empty() || !aff.apart_from.empty())) {
      std::set<const JobState*> on_node;
      for (const auto& [job_id, index] : nodes_[i].tasks) {
        auto it = jobs_.find(job_id);
        if (it != jobs_.end()) on_node.insert(it->second.get());
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

void PoolService::RemoveExpiredJobs(WriteBatch& batch) {
  const int64_t keep_ms = config_.finished_job_retention_seconds * 1000;
  if (keep_ms <= 0) return;
  const int64_t now = NowMs();
  if (now < next_removal_ms_) return;
  // One pass over the jobs at most every tenth of the retention period (1 s to 1 min).
  next_removal_ms_ = now + std::clamp<int64_t>(keep_ms / 10, 1000, 60000);
  uint64_t removed_max = removed_max_seq_;
  int removed = 0;
  for (auto it = by_seq_.begin(); it != by_seq_.end();) {
    if (removed == kMaxRemovalsPerPass) {
      next_removal_ms_ = now;  // more to do: the next cycle goes on
      break;
    }
    JobState& j = *it->second;
    bool ended =
        j.phase == JobPhase::kSucceeded || j.phase == JobPhase::kFailed || j.phase == JobPhase::kCancelled;
    int64_t last_change = j.rec.updated_ms;
    for (const TaskState& ts : j.tasks) {
      // A failed or cancelled job may still be stopping tasks: it stays until they have stopped.
      ended &= ts.phase != TaskPhase::kAssigned && ts.phase != TaskPhase::kRunning &&
               ts.phase != TaskPhase::kStopping;
      last_change = std::max(last_change, ts.updated_ms);
    }
    if (!ended || last_change > now - keep_ms) {
      ++it;
      continue;
    }
    batch.Add(DeleteJob{j.rec.id});
    removed_max = std::max(removed_max, it->first);
    pending_.erase(it->first);
    partial_.erase(it->first);
    stopping_jobs_.erase(j.rec.id);
    ++metrics_.jobs_removed;
    ++removed;
    --job_phase_count_[static_cast<size_t>(j.phase)];
    if (auto q = queue_phase_count_.find(j.rec.queue); q != queue_phase_count_.end()) {
      --q->second[static_cast<size_t>(j.phase)];
      if (q->second == std::array<int64_t, 5>{}) queue_phase_count_.erase(q);
    }
    if (auto t = by_tenant_.find(j.rec.tenant); t != by_tenant_.end()) {
      t->second.erase(it->first);
      if (t->second.empty()) by_tenant_.erase(t);
    }
    const std::string id = j.rec.id;
    it = by_seq_.erase(it);
    jobs_.erase(id);
    // Its watchers hear "gone" once the removal is durable.
    job_watches_->Forget(id);
    job_watches_->Changed(id);
  }
  // Cluster events (nodes lost and back, GPU conditions) age out the same way.
  batch.Add(DeleteClusterEvents{now - keep_ms});
  if (removed_max != removed_max_seq_) {
    removed_max_seq_ = removed_max;
    batch.Add(PutMeta{kRemovedMaxSeqKey, std::to_string(removed_max)});
  }
}

int PoolService::CycleLocked(WriteBatch& batch) {
  const double t0 = MonoSeconds();
  ++metrics_.cycles;
  CheckNodes(batch);
  ExpireStops(batch);
  RemoveExpiredJobs(batch);
  LearnTypicalPods();
  const int64_t now = NowMs();

  // Preemptors stop waiting once their victims have stopped.
  for (uint64_t seq : pending_) {
    JobState& j = *by_seq_[seq];
    for (auto it = j.waiting_for.begin(); it != j.waiting_for.end();) {
      JobState* v = FindJob(*it);
      bool stopping = false;
      if (v != nullptr) {
        for (const TaskState& ts : v->tasks) stopping |= ts.phase == TaskPhase::kStopping;
      }
      it = stopping ? std::next(it) : j.waiting_for.erase(it);
    }
  }
  if (!reserved_for_.empty()) {
    JobState* r = FindJob(reserved_for_);
    if (r == nullptr || r->phase != JobPhase::kPending) {
      reserved_for_.clear();
      ++capacity_epoch_;
    }
  }

  std::vector<PendingEntry> entries;
  std::vector<JobState*> states;
  for (uint64_t seq : pending_) {
    JobState* j = by_seq_[seq];
    if (!j->waiting_for.empty()) continue;
    if (j->rec.not_before_ms > now) {
      // Retry backoff after a fault (docs/jobspec.md#retry).
      const std::string message =
          fmt::format("waiting for its retry backoff (restart {} of {}) until {}", j->rec.faults,
                      j->job.retry.max_restarts, FormatTime(j->rec.not_before_ms));
      if (message != j->pending_message) j->pending_message = message;
      continue;
    }
    entries.push_back({seq, j->rec.tenant, j->rec.queue, j->rec.priority, j->demand});
    states.push_back(j);
  }
  std::vector<UsageEntry> usage;
  for (const auto& [key, r] : usage_) usage.push_back({key.first, key.second, r});
  Resources total;
  for (NodeIndex n = 0; n < ledger_.node_count(); ++n) {
    const NodeSpec& s = ledger_.spec(n);
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
  if (!entries.empty() && ledger_.node_count() > 0) {
    QueueOrder::Pass pass = order_->Begin(entries, usage, total);
    while (auto next = pass.Next()) {
      if (placed >= config_.max_jobs_per_cycle) break;
      const size_t i = *next;
      JobState& j = *states[i];
      // Nothing was freed since this job last failed to fit: it cannot fit now either. A job that
      // wants to be together with others may fit after a placement, so it is always tried.
      if (j.failed_epoch == capacity_epoch_ && j.job.affinity.together_with.empty()) {
        pass.Skipped(i);
        const uint64_t preempt_epoch = capacity_epoch_ + metrics_.placements;
        if (config_.preemption && j.preempt_epoch != preempt_epoch) {
          j.preempt_epoch = preempt_epoch;
          if (TryPreempt(j, entries[i], running_view, batch)) continue;
        }
        MaybeReserve(j, batch);
        continue;
      }
      const std::string shape = j.rec.id == reserved_for_ ? "" : JobShapeKey(j.job);
      if (!shape.empty() && failed_shapes.count(shape)) {
        pass.Skipped(i);
        j.failed_epoch = capacity_epoch_;
        const uint64_t preempt_epoch = capacity_epoch_ + metrics_.placements;
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
        std::set<std::string> node_names;
        for (const auto& b : binder.bound) {
          TaskState& ts = j.tasks[static_cast<size_t>(b.task)];
          SetTaskPhase(j, ts, TaskPhase::kAssigned);
          ts.placed = true;
          ts.run_id = NewRunId();
          ts.placement = b.placement;
          ts.last_node = ledger_.spec(b.placement.node).name;
          ts.allocation = b.allocation;
          ts.updated_ms = now;
          nodes_[b.placement.node].tasks.insert({j.rec.id, b.task});
          MarkAssignmentsChanged(b.placement.node);
          usage_[{j.rec.tenant, j.rec.queue}] +=
              TaskDemand(j.job.groups[static_cast<size_t>(ts.group)].request);
          node_names.insert(ledger_.spec(b.placement.node).name);
          PutTaskOp(j, b.task, batch);
        }
        const bool partial = binder.bound.size() < j.tasks.size();
        if (partial) partial_.insert(j.rec.seq);
        SetJobPhase(j, JobPhase::kRunning);
        j.rec.reason = "";
        j.pending_message.clear();
        j.started_ms = now;
        pending_.erase(j.rec.seq);
        if (reserved_for_ == j.rec.id) {
          reserved_for_.clear();
          ++capacity_epoch_;
        }
        Event(j.rec.id, "Scheduled",
              fmt::format("placed {} of {} task(s) on {}", binder.bound.size(), j.tasks.size(),
                          fmt::join(node_names, ", ")),
              batch);
        PutJobOps(j, batch);
        ++metrics_.placements;
        metrics_.task_placements += binder.bound.size();
        metrics_.scheduling_latency.Observe(MonoSeconds() - j.submit_mono);
        pass.Placed(i);
        ++placed;
        continue;
      }
      pass.Skipped(i);
      j.failed_epoch = capacity_epoch_;
      if (!shape.empty()) failed_shapes.insert(shape);
      if (r.first_failed_task >= 0) {
        const TaskState& ft = j.tasks[static_cast<size_t>(r.first_failed_task)];
        j.pending_task = fmt::format("{}[{}]", j.job.groups[static_cast<size_t>(ft.group)].name, ft.replica);
      }
      std::string message = r.status.message();
      if (message.empty()) message = r.diagnosis.ToString();
      j.diagnosis = r.diagnosis;
      if (message != j.pending_message) {
        j.pending_message = message;
        j.rec.reason = message;
        Event(j.rec.id, "Pending", message, batch);
        PutJobOps(j, batch);
      }
      const uint64_t preempt_epoch = capacity_epoch_ + metrics_.placements;
      if (config_.preemption && j.preempt_epoch != preempt_epoch) {
        j.preempt_epoch = preempt_epoch;
        if (TryPreempt(j, entries[i], running_view, batch)) continue;
      }
      MaybeReserve(j, batch);
    }
  }
  // Running jobs whose gang minimum was met place their remaining tasks as room appears.
  for (auto it = partial_.begin(); it != partial_.end();) {
    JobState& j = *by_seq_[*it];
    bool still = false;
    for (size_t t = 0; t < j.tasks.size(); ++t) {
      TaskState& ts = j.tasks[t];
      if (ts.phase != TaskPhase::kPending) continue;
      const bool masked = ComputeMask(j, mask);
      scheduler_->SetNodeMask(masked ? &mask : nullptr);
      const TaskRequest& req = j.job.groups[static_cast<size_t>(ts.group)].request;
      Decision d;
      auto id = scheduler_->Place(req, &d);
      scheduler_->SetNodeMask(nullptr);
      if (!id.ok()) {
        still = true;
        continue;
      }
      SetTaskPhase(j, ts, TaskPhase::kAssigned);
      ts.placed = true;
      ts.run_id = NewRunId();
      ts.placement = d.placement;
      ts.last_node = ledger_.spec(d.placement.node).name;
      ts.allocation = *id;
      ts.updated_ms = now;
      nodes_[d.placement.node].tasks.insert({j.rec.id, static_cast<int>(t)});
      MarkAssignmentsChanged(d.placement.node);
      usage_[{j.rec.tenant, j.rec.queue}] += TaskDemand(req);
      PutTaskOp(j, static_cast<int>(t), batch);
      ++metrics_.task_placements;
    }
    it = still ? std::next(it) : partial_.erase(it);
  }
  metrics_.cycle_duration.Observe(MonoSeconds() - t0);
  return placed;
}

void PoolService::BuildRunningView(RunningView& view) {
  view = RunningView{};
  view.built = true;
  std::vector<Resources> group_demand;
  for (auto& [seq, v] : by_seq_) {
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
  for (const auto& [key, r] : usage_) usage.push_back({key.first, key.second, r});
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
      (void)ledger_.Release(ts.allocation);
      released.push_back({v, static_cast<int>(t), ts.placement});
    }
    needed = c + 1;
    const bool masked = ComputeMask(j, mask);
    scheduler_->SetNodeMask(masked ? &mask : nullptr);
    JobResult trial = scheduler_->ScheduleJob(j.job);
    scheduler_->SetNodeMask(nullptr);
    if (trial.placed) {
      for (AllocationId a : trial.allocations) (void)ledger_.Release(a);
      fits = true;
    }
  }
  for (const Released& r : released) {
    auto id = ledger_.Commit(r.placement);
    if (!id.ok()) FailStop(id.status().WithContext("restoring an allocation after a preemption what-if"));
    r.job->tasks[static_cast<size_t>(r.task)].allocation = *id;
  }
  if (!fits) return false;
  std::vector<std::string> victims;
  for (size_t c = 0; c < needed; ++c) {
    JobState* v = running_jobs[candidates[c].index];
    const std::string why =
        candidates[c].reason == PreemptReason::kPriority
            ? fmt::format("preempted by {} (priority {} > {})", j.rec.id, j.rec.priority, v->rec.priority)
            : fmt::format("preempted by {} (queue '{}' reclaims its guaranteed quota)", j.rec.id,
                          j.rec.queue);
    for (size_t t = 0; t < v->tasks.size(); ++t)
      StopTask(*v, static_cast<int>(t), TaskPhase::kPreempted, why, batch);
    Event(v->rec.id, "Preempted",
          why + fmt::format("; tasks get SIGTERM and {} s to checkpoint", config_.grace_period_seconds),
          batch);
    j.waiting_for.insert(v->rec.id);
    victims.push_back(v->rec.id);
    ++metrics_.preemptions;
  }
  Event(j.rec.id, "Preempting",
        fmt::format("stopping {} to make room: {}", victims.size(), fmt::join(victims, ", ")), batch);
  view.built = false;  // the victims are stopping now
  j.pending_message = fmt::format("waiting for {} preempted job(s) to stop", victims.size());
  j.rec.reason = j.pending_message;
  PutJobOps(j, batch);
  return true;
}

void PoolService::MaybeReserve(JobState& j, WriteBatch& batch) {
  if (!reserved_for_.empty()) return;
  if (NowMs() - j.pending_since_ms < 1000LL * config_.reserve_after_seconds) return;
  // Nodes that could hold this job's largest task when empty, closest to free first.
  const TaskRequest* largest = nullptr;
  for (const auto& g : j.job.groups) {
    if (largest == nullptr || g.request.total_gpu_share() > largest->total_gpu_share()) largest = &g.request;
  }
  std::vector<NodeIndex> candidates;
  for (NodeIndex n = 0; n < ledger_.node_count(); ++n) {
    const NodeSpec& s = ledger_.spec(n);
    if (!ledger_.state(n).schedulable() || nodes_[n].state != "ready") continue;
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
    const auto& sa = ledger_.state(a);
    const auto& sb = ledger_.state(b);
    if (sa.free_gpu_share != sb.free_gpu_share) return sa.free_gpu_share > sb.free_gpu_share;
    return a < b;
  });
  Resources covered;
  std::vector<uint8_t> reserved(ledger_.node_count(), 0);
  std::vector<std::string> names;
  for (NodeIndex n : candidates) {
    if (covered.gpu >= j.demand.gpu && covered.cpu >= j.demand.cpu && covered.memory >= j.demand.memory)
      break;
    const NodeSpec& s = ledger_.spec(n);
    covered.cpu += s.cpu.units();
    covered.memory += s.memory.units();
    covered.gpu += 1000 * static_cast<int64_t>(s.gpus.size());
    reserved[n] = 1;
    names.push_back(s.name);
  }
  if (covered.gpu < j.demand.gpu || covered.cpu < j.demand.cpu || covered.memory < j.demand.memory) return;
  reserved_for_ = j.rec.id;
  reserved_nodes_ = std::move(reserved);
  Event(j.rec.id, "Reserved",
        fmt::format("waited {} s: holding {} for this job; smaller jobs stop backfilling them",
                    (NowMs() - j.pending_since_ms) / 1000, fmt::join(names, ", ")),
        batch);
}

// ---- health, metrics, invariants ---------------------------------------------------------------

json PoolService::Health() {
  std::lock_guard<std::mutex> lock(mu_);
  json disk = disk_guard_->Health();
  const bool disk_ok = disk.value("ok", true);
  json h = {{"status", disk_ok ? "ok" : "degraded"},
            {"nodes", ledger_.node_count()},
            {"jobs",
             {{"pending", job_phase_count_[static_cast<size_t>(JobPhase::kPending)]},
              {"running", job_phase_count_[static_cast<size_t>(JobPhase::kRunning)]}}},
            {"store", {{"disk", std::move(disk)}}}};
  if (!disk_ok) h["reason"] = disk_guard_->Check().message();
  return h;
}

Status PoolService::CheckStoreSpace() { return disk_guard_->Check(); }

std::string PoolService::MetricsText() {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, int> by_state;
  std::map<std::string, int> pending_by_queue, running_by_queue;
  std::map<std::string, int> pending_by_reason;
  for (const auto& q : order_->options().queues) {
    pending_by_queue[q.name] = 0;
    running_by_queue[q.name] = 0;
  }
  for (const auto& [seq, j] : by_seq_) {
    ++by_state[std::string(JobPhaseName(j->phase))];
    if (j->phase == JobPhase::kPending) {
      ++pending_by_queue[j->rec.queue];
      std::string reason = "not tried yet";
      if (!j->waiting_for.empty()) {
        reason = "waiting for preempted jobs";
      } else if (!j->diagnosis.reasons.empty()) {
        reason = j->diagnosis.reasons.front().first;
      } else if (!j->pending_message.empty()) {
        reason = "other";
      }
      ++pending_by_reason[reason];
    } else if (j->phase == JobPhase::kRunning) {
      ++running_by_queue[j->rec.queue];
    }
  }
  RenderHeader("gpupool_jobs", "gauge", "Jobs by state.", out);
  for (const char* s : {"pending", "running", "succeeded", "failed", "cancelled"})
    RenderSample("gpupool_jobs", {{"state", s}}, by_state[s], out);
  RenderHeader("gpupool_queue_pending_jobs", "gauge", "Pending jobs per queue.", out);
  for (const auto& [q, n] : pending_by_queue)
    RenderSample("gpupool_queue_pending_jobs", {{"queue", q}}, n, out);
  RenderHeader("gpupool_queue_running_jobs", "gauge", "Running jobs per queue.", out);
  for (const auto& [q, n] : running_by_queue)
    RenderSample("gpupool_queue_running_jobs", {{"queue", q}}, n, out);
  RenderHeader("gpupool_pending_jobs_by_reason", "gauge",
               "Pending jobs by the most common reason their first unplaced task does not fit.", out);
  for (const auto& [r, n] : pending_by_reason)
    RenderSample("gpupool_pending_jobs_by_reason", {{"reason", r}}, n, out);

  int64_t total_gpu = 0, total_cpu = 0, total_mem = 0;
  for (NodeIndex n = 0; n < ledger_.node_count(); ++n) {
    const NodeSpec& s = ledger_.spec(n);
    total_cpu += s.cpu.units();
    total_mem += s.memory.units();
    for (const auto& g : s.gpus) total_gpu += g.mig_enabled ? 0 : 1000;
  }
  std::map<std::string, Resources> used_by_queue;
  for (const auto& q : order_->options().queues) used_by_queue[q.name] = Resources{};
  for (const auto& [key, r] : usage_) used_by_queue[key.second] += r;
  RenderHeader("gpupool_queue_gpu_allocated", "gauge",
               "GPUs (fractional) held by each queue's running tasks.", out);
  for (const auto& [q, r] : used_by_queue)
    RenderSample("gpupool_queue_gpu_allocated", {{"queue", q}}, r.gpu / 1000.0, out);
  RenderHeader("gpupool_queue_gpu_allocated_ratio", "gauge",
               "Share of the pool's GPUs held by each queue (0..1).", out);
  for (const auto& [q, r] : used_by_queue)
    RenderSample("gpupool_queue_gpu_allocated_ratio", {{"queue", q}},
                 total_gpu > 0 ? static_cast<double>(r.gpu) / static_cast<double>(total_gpu) : 0.0, out);
  RenderHeader("gpupool_queue_gpu_guaranteed", "gauge", "GPUs guaranteed to each queue.", out);
  for (const auto& q : order_->options().queues)
    RenderSample("gpupool_queue_gpu_guaranteed", {{"queue", q.name}}, q.guaranteed.gpu / 1000.0, out);
  RenderHeader("gpupool_pool_gpus", "gauge", "GPUs in the pool (non-MIG GPUs, whole).", out);
  RenderSample("gpupool_pool_gpus", {}, total_gpu / 1000.0, out);
  RenderHeader("gpupool_pool_gpu_allocated", "gauge", "GPUs (fractional) allocated in the pool.", out);
  RenderSample("gpupool_pool_gpu_allocated", {}, ledger_.used_gpu_share() / 1000.0, out);
  RenderHeader("gpupool_pool_cpu_cores", "gauge", "CPU cores in the pool.", out);
  RenderSample("gpupool_pool_cpu_cores", {}, total_cpu / 1000.0, out);
  RenderHeader("gpupool_pool_memory_bytes", "gauge", "Memory in the pool.", out);
  RenderSample("gpupool_pool_memory_bytes", {}, static_cast<double>(total_mem) * 1048576.0, out);
  std::map<std::string, int> nodes_by_state;
  int cordoned = 0;
  for (NodeIndex n = 0; n < ledger_.node_count(); ++n) {
    ++nodes_by_state[nodes_[n].state];
    cordoned += ledger_.state(n).cordoned;
  }
  RenderHeader("gpupool_nodes", "gauge", "Registered nodes by state.", out);
  for (const char* s : {"ready", "lost"})
    RenderSample("gpupool_nodes", {{"state", s}}, nodes_by_state[s], out);
  RenderHeader("gpupool_nodes_cordoned", "gauge", "Nodes that take no new placements.", out);
  RenderSample("gpupool_nodes_cordoned", {}, cordoned, out);

  RenderHeader("gpupool_jobs_submitted_total", "counter", "Jobs accepted since the server started.", out);
  RenderSample("gpupool_jobs_submitted_total", {}, static_cast<double>(metrics_.submitted), out);
  RenderHeader("gpupool_placements_total", "counter", "Jobs placed since the server started.", out);
  RenderSample("gpupool_placements_total", {}, static_cast<double>(metrics_.placements), out);
  RenderHeader("gpupool_task_placements_total", "counter", "Tasks placed since the server started.", out);
  RenderSample("gpupool_task_placements_total", {}, static_cast<double>(metrics_.task_placements), out);
  RenderHeader("gpupool_preemptions_total", "counter", "Jobs preempted since the server started.", out);
  RenderSample("gpupool_preemptions_total", {}, static_cast<double>(metrics_.preemptions), out);
  RenderHeader("gpupool_scheduling_cycles_total", "counter", "Scheduling cycles run.", out);
  RenderSample("gpupool_scheduling_cycles_total", {}, static_cast<double>(metrics_.cycles), out);
  RenderHeader("gpupool_jobs_finished_total", "counter", "Jobs that reached an end state, by state.", out);
  for (const char* s : {"succeeded", "failed", "cancelled"})
    RenderSample("gpupool_jobs_finished_total", {{"state", s}}, static_cast<double>(metrics_.finished[s]),
                 out);
  RenderHeader("gpupool_jobs_removed_total", "counter",
               "Finished jobs removed with their tasks and events after store.finishedJobRetentionSeconds.",
               out);
  RenderSample("gpupool_jobs_removed_total", {}, static_cast<double>(metrics_.jobs_removed), out);
  RenderHeader("gpupool_fault_restarts_total", "counter",
               "Faults that stopped a job (each restarts it or, over its retry budget, fails it), by cause.",
               out);
  for (const char* c : {"node_lost", "gpu_fault", "task_failed", "task_stopped"})
    RenderSample("gpupool_fault_restarts_total", {{"cause", c}}, static_cast<double>(metrics_.faults[c]),
                 out);
  RenderHeader("gpupool_nodes_lost_total", "counter", "Nodes declared lost (no heartbeat for the timeout).",
               out);
  RenderSample("gpupool_nodes_lost_total", {}, static_cast<double>(metrics_.nodes_lost), out);
  RenderHeader("gpupool_hotspot_migrations_total", "counter", "Best-effort jobs moved off a hot GPU.", out);
  RenderSample("gpupool_hotspot_migrations_total", {}, static_cast<double>(metrics_.hotspot_migrations), out);
  int faulty = 0, hot = 0;
  for (const NodeInfo& info : nodes_) {
    for (const auto& c : info.gpus) {
      faulty += !c.fault.empty();
      hot += c.hot;
    }
  }
  RenderHeader("gpupool_gpus_unusable", "gauge", "GPUs that take no new placements, by cause.", out);
  RenderSample("gpupool_gpus_unusable", {{"cause", "fault"}}, faulty, out);
  RenderSample("gpupool_gpus_unusable", {{"cause", "hot"}}, hot, out);
  metrics_.scheduling_latency.Render("gpupool_scheduling_latency_seconds",
                                     "Time from submission (or requeue) to placement, per job.", out);
  metrics_.cycle_duration.Render("gpupool_scheduling_cycle_seconds", "Duration of one scheduling cycle.",
                                 out);
  return out;
}

Status PoolService::CheckInvariants() {
  std::lock_guard<std::mutex> lock(mu_);
  return CheckInvariantsLocked();
}

Status PoolService::CheckInvariantsLocked() const {
  RETURN_IF_ERROR(ledger_.CheckInvariants());
  size_t live = 0;
  std::array<int64_t, 5> phases{};
  std::map<std::string, std::array<int64_t, 5>> by_queue;
  std::map<std::string, PendingCount> pending_by_tenant;
  for (const auto& [id, j] : jobs_) {
    ++phases[static_cast<size_t>(j->phase)];
    ++by_queue[j->rec.queue][static_cast<size_t>(j->phase)];
    if (j->phase == JobPhase::kPending) {
      ++pending_by_tenant[j->rec.tenant].jobs;
      pending_by_tenant[j->rec.tenant].tasks += static_cast<int64_t>(j->tasks.size());
    }
    std::array<int32_t, kTaskPhaseCount> counts{};
    for (const TaskState& ts : j->tasks) ++counts[static_cast<size_t>(ts.phase)];
    if (counts != j->task_counts) return Status::Internal(fmt::format("job {}: per-phase task counts are off", id));
    for (size_t i = 0; i < j->tasks.size(); ++i) {
      const TaskState& ts = j->tasks[i];
      if (IsLive(ts.phase) != ts.placed)
        return Status::Internal(
            fmt::format("task {}[{}] is {} but placed={}", id, i, TaskPhaseName(ts.phase), ts.placed));
      if (!ts.placed) continue;
      ++live;
      const Placement* p = ledger_.Find(ts.allocation);
      if (p == nullptr || !(*p == ts.placement))
        return Status::Internal(fmt::format("task {}[{}]: the ledger does not hold its placement", id, i));
    }
  }
  if (live != ledger_.allocation_count())
    return Status::Internal(
        fmt::format("{} live tasks but {} ledger allocations", live, ledger_.allocation_count()));
  if (phases != job_phase_count_) return Status::Internal("the per-phase job counts are off");
  for (const auto& [queue, counts] : queue_phase_count_) {
    auto it = by_queue.find(queue);
    if (counts != (it == by_queue.end() ? std::array<int64_t, 5>{} : it->second))
      return Status::Internal(fmt::format("queue '{}': the per-phase job counts are off", queue));
  }
  for (const auto& [queue, counts] : by_queue) {
    if (!queue_phase_count_.count(queue))
      return Status::Internal(fmt::format("queue '{}': its jobs are not counted", queue));
  }
  size_t indexed = 0;
  for (const auto& [tenant, seqs] : by_tenant_) {
    indexed += seqs.size();
    for (uint64_t seq : seqs) {
      auto it = by_seq_.find(seq);
      if (it == by_seq_.end() || it->second->rec.tenant != tenant)
        return Status::Internal(fmt::format("the tenant index lists job #{} under '{}' wrongly", seq, tenant));
    }
  }
  if (indexed != by_seq_.size())
    return Status::Internal(fmt::format("the tenant index holds {} jobs, there are {}", indexed, by_seq_.size()));
  // Submissions in flight hold reservations, so the counts may be above what the jobs say, never below;
  // with none in flight they are exact.
  for (const auto& [tenant, want] : pending_by_tenant) {
    const PendingCount have = pending_counts_.tenant(tenant);
    const bool off = submissions_in_flight_ == 0 ? (have.jobs != want.jobs || have.tasks != want.tasks)
                                                 : (have.jobs < want.jobs || have.tasks < want.tasks);
    if (off)
      return Status::Internal(fmt::format("tenant '{}': {} pending jobs ({} tasks) counted, {} ({}) pending",
                                          tenant, have.jobs, have.tasks, want.jobs, want.tasks));
  }
  if (submissions_in_flight_ == 0 && pending_counts_.tenants().size() != pending_by_tenant.size())
    return Status::Internal("pending counts held for tenants with nothing pending");
  return Status::Ok();
}

std::vector<PoolService::GpuUse> PoolService::GpuUsage() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<GpuUse> out;
  std::map<std::pair<NodeIndex, int>, std::pair<int64_t, int64_t>> granted;
  for (const auto& [id, j] : jobs_) {
    for (const TaskState& ts : j->tasks) {
      if (!ts.placed) continue;
      for (const GpuGrant& g : ts.placement.gpus) {
        auto& e = granted[{ts.placement.node, g.gpu}];
        e.first += g.share.units();
        e.second += g.memory.units();
      }
    }
  }
  for (NodeIndex n = 0; n < ledger_.node_count(); ++n) {
    const NodeSpec& s = ledger_.spec(n);
    const NodeState& st = ledger_.state(n);
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
