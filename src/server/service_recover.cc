// PoolService: recovery from the store (the state exactly as last acknowledged, or an error when
// the stored state does not fit together) and the scheduler built over it (profile, typical
// workload). See service_internal.h for how the class is spread over files.
#include "server/service.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>

#include "api/node_codec.h"
#include "config/profile_yaml.h"
#include "sched/registry.h"
#include "sched/typical_pods.h"
#include "server/resources_json.h"
#include "server/identities.h"
#include "server/service_internal.h"

namespace gpupool {

using nlohmann::json;
using namespace service_internal;

// ---- recovery ----------------------------------------------------------------------------------

Status PoolService::Recover() {
  auto snap = store_->Load();
  if (!snap.ok()) return snap.status().WithContext("loading the store");
  const int64_t now = NowMs();
  WriteBatch batch;

  // Queues: the config seeds an empty store; afterwards the store (and the API) own them.
  if (snap->queues.empty()) {
    state_.queues = config_.ordering.queues;
    for (const QueueSpec& q : state_.queues) batch.Add(PutQueue{{q.name, QueueJson(q).dump()}});
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
      state_.queues.push_back(*q);
    }
  }
  RETURN_IF_ERROR(RebuildQueueOrder());

  for (const NodeRecord& r : snap->nodes) {
    json j = json::parse(r.spec_json, nullptr, false);
    if (j.is_discarded()) return Status::Internal("stored node '" + r.name + "' is not valid JSON");
    auto spec = ParseNodeSpec(j, state_.ledger.catalog());
    if (!spec.ok()) return spec.status().WithContext("stored node " + r.name);
    auto idx = state_.ledger.AddNode(*spec);
    if (!idx.ok()) return idx.status().WithContext("stored node " + r.name);
    NodeInfo info;
    info.state = r.state.empty() ? "ready" : r.state;
    info.last_heartbeat_ms = now;  // every agent gets a fresh timeout after a server restart
    info.heartbeat_mono = MonoNow();
    info.draining = r.draining;
    info.spec_json = std::move(j);
    state_.nodes.push_back(std::move(info));
    if (r.cordoned) RETURN_IF_ERROR(state_.ledger.SetCordoned(*idx, true));
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
    SetMpsOwners(config_, state->job);
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
    state->started_ms = r.started_ms > 0 ? r.started_ms : r.updated_ms;
    state->submit_mono = MonoNow();
    for (const auto& g : state->job.groups) {
      for (int rep = 0; rep < g.replicas && recent_tasks_.size() < kRecentTasks; ++rep) {
        recent_tasks_.push_back(g.request);
      }
    }
    max_seq = std::max(max_seq, r.seq);
    state_.AddJob(std::move(state));
  }
  RETURN_IF_ERROR(credentials_.Load(snap->meta));
  for (const auto& [key, value] : snap->meta) {
    if (key == kClusterIdKey) cluster_id_ = value;
    if (key.rfind(kTenantUidKeyPrefix, 0) == 0) {
      int64_t uid = -1;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), uid);
      if (ec != std::errc() || end != value.data() + value.size() || uid < 0)
        return Status::Internal(fmt::format("stored meta {} is not a uid: '{}'", key, value));
      state_.tenant_uids[key.substr(sizeof(kTenantUidKeyPrefix) - 1)] = uid;
    }
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
    state_.removed_max_seq = removed;
  }
  next_seq_ = max_seq + 1;

  for (const TaskRecord& r : snap->tasks) {
    JobState* j = state_.FindJob(r.job_id);
    if (j == nullptr) return Status::Internal("stored task of unknown job " + r.job_id);
    if (r.index < 0 || static_cast<size_t>(r.index) >= j->tasks.size())
      return Status::Internal(fmt::format("stored task {}[{}] is out of range", r.job_id, r.index));
    auto phase = ParseTaskPhase(r.state);
    if (!phase)
      return Status::Internal(fmt::format("stored task {}[{}] has unknown state", r.job_id, r.index));
    TaskState& ts = j->tasks[static_cast<size_t>(r.index)];
    state_.SetTaskPhase(*j, ts, *phase);
    ts.exit_code = r.exit_code;
    ts.restarts = r.restarts;
    ts.run_id = r.run_id;
    ts.updated_ms = r.updated_ms;
    ts.last_node = r.node;
    ts.end_message = r.message;
    ts.image = r.image;
    ts.stop_reason = r.stop_reason;
    if (IsLive(ts.phase)) {
      json pj = json::parse(r.placement_json, nullptr, false);
      if (pj.is_discarded())
        return Status::Internal(fmt::format("stored task {}[{}]: bad placement", r.job_id, r.index));
      auto p = PlacementFromJson(pj, state_.ledger);
      if (!p.ok()) return p.status().WithContext(fmt::format("stored task {}[{}]", r.job_id, r.index));
      auto id = state_.ledger.Commit(*p);
      if (!id.ok())
        return id.status().WithContext(fmt::format("restoring the allocation of {}[{}]", r.job_id, r.index));
      ts.placed = true;
      ts.placement = *p;
      ts.allocation = *id;
      state_.nodes[p->node].tasks.insert({r.job_id, r.index});
      state_.usage[{j->rec.tenant, j->rec.queue}] +=
          TaskDemand(j->job.groups[static_cast<size_t>(ts.group)].request);
      if (ts.phase == TaskPhase::kStopping) {
        // The deadline is not stored: the agent gets a fresh grace period (the server was away).
        ts.stop_deadline_ms =
            now + 1000LL * (config_.grace_period_seconds + config_.heartbeat_timeout_seconds);
        const auto outcome = ParseTaskPhase(r.stop_outcome);
        if (outcome == TaskPhase::kCancelled || outcome == TaskPhase::kPreempted) {
          ts.stop_outcome = *outcome;
        } else {
          // A store written before outcomes were kept: an ended job's tasks are cancelled (a cancel
          // or a failure stopped them), a live job's are preempted (it runs again).
          ts.stop_outcome = IsTerminal(j->phase) ? TaskPhase::kCancelled : TaskPhase::kPreempted;
        }
        if (ts.stop_reason.empty()) ts.stop_reason = "stop in progress at restart";
        state_.stopping_jobs.insert(r.job_id);
      }
    }
  }
  for (auto& [seq, j] : state_.by_seq) {
    if (j->phase != JobPhase::kRunning) continue;
    for (const TaskState& ts : j->tasks) {
      if (ts.phase == TaskPhase::kPending) state_.partial.insert(seq);
    }
  }
  RETURN_IF_ERROR(RebuildScheduler(TypicalOfGpuTasks(recent_tasks_)));
  RETURN_IF_ERROR(CheckInvariantsLocked());
  if (!batch.empty()) RETURN_IF_ERROR(committer_->Commit(std::move(batch)));
  return Status::Ok();
}

Status PoolService::RebuildQueueOrder() {
  QueueOrderOptions options = config_.ordering;
  options.queues = state_.queues;
  auto order = QueueOrder::Create(options);
  if (!order.ok()) return order.status();
  order_.emplace(std::move(order).value());
  return Status::Ok();
}

Status PoolService::RebuildScheduler(std::vector<TypicalPod> typical) {
  if (profile_.scores.empty()) {
    const std::string& p = config_.profile;
    const bool file = p.size() > 5 && (p.ends_with(".yaml") || p.ends_with(".yml"));
    auto profile = file ? LoadProfileFile(p) : ProfileForPolicy(p);
    if (!profile.ok()) return profile.status().WithContext("profile");
    profile_ = std::move(profile).value();
  }
  // FGD measures fragmentation against the typical workload: learned from the GPU tasks submitted
  // recently (a single whole-GPU task until there are any).
  typical_pods_ = std::move(typical);
  PluginInit init;
  init.typical_pods = &typical_pods_;
  auto s = Scheduler::Create(profile_, DefaultRegistry(), state_.ledger, rng_, init);
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
  // A rebuilt pipeline starts its caches and best-node indexes over: not while the mix holds still
  // (balanced keeps learning from every task meanwhile).
  std::vector<TypicalPod> learned = TypicalOfGpuTasks(recent_tasks_);
  if (scheduler_ != nullptr && WorkloadDistance(learned, typical_pods_) < kWorkloadMinChange) {
    tasks_since_learn_ = 0;
    return;
  }
  if (Status st = RebuildScheduler(std::move(learned)); !st.ok()) {
    std::fprintf(stderr, "gpupool server: keeping the old typical workload: %s\n", st.ToString().c_str());
    tasks_since_learn_ = 0;
  }
}

}  // namespace gpupool
