// PoolService: opening, applying operations to the state machine and taking in their effects,
// durable commits and the watchers they wake. Recovery from the store is in service_recover.cc.
// The other service_*.cc files hold the rest of the class (see service_internal.h).
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
#include "server/hotspots.h"
#include "server/resources_json.h"
#include "server/timeouts.h"
#include "server/service_internal.h"

namespace gpupool {

using nlohmann::json;
using namespace service_internal;

static_assert(static_cast<int>(TaskPhase::kPreempted) + 1 == kTaskPhaseCount);

PoolService::PoolService(ServerConfig config, std::unique_ptr<Store> store)
    : config_(std::move(config)), store_(std::move(store)) {
  committer_ = std::make_unique<GroupCommitter>(*store_);
}

PoolService::~PoolService() {
  Stop();
}

int64_t PoolService::NowMs() const {
  if (config_.wall_clock_ms) return config_.wall_clock_ms();
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double PoolService::MonoNow() const {
  if (config_.mono_clock_s) return config_.mono_clock_s();
  return MonoSeconds();
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

// ---- helpers -----------------------------------------------------------------------------------

Result<PoolService::JobState*> PoolService::VisibleJob(const Principal& who, const std::string& id) {
  if (who.role == Role::kAgent || who.role == Role::kNode)
    return Status::PermissionDenied("agent tokens cannot read jobs");
  JobState* j = state_.FindJob(id);
  // Another tenant's job looks exactly like a missing one.
  if (j == nullptr || (who.role == Role::kTenant && j->rec.tenant != who.tenant))
    return Status::NotFound(fmt::format("job '{}' not found", id));
  return j;
}

Status PoolService::ApplyLocked(Operation op, WriteBatch& batch) {
  std::visit(
      [&](auto& o) {
        if (o.now_ms == 0) {
          o.now_ms = NowMs();
          o.mono = MonoNow();
        }
      },
      op);
  Effects fx(metrics_);
  std::optional<Operation> heard;
  if (operation_observer_) heard = op;  // the machine takes the operation's contents
  RETURN_IF_ERROR(machine_.Apply(std::move(op), fx));
  if (heard) operation_observer_(*heard);
  batch.Append(std::move(fx.batch));
  TakeEffectsLocked(fx);
  return Status::Ok();
}

void PoolService::TakeEffectsLocked(Effects& fx) {
  for (NodeIndex n : fx.nodes_changed) node_watches_->Changed(n);
  for (const std::string& id : fx.jobs_changed) job_watches_->Changed(id);
  for (const std::string& id : fx.jobs_removed) {
    // Its watchers hear "gone" once the removal is durable.
    job_watches_->Forget(id);
    job_watches_->Changed(id);
  }
  if (fx.order) order_.emplace(std::move(*fx.order));
  if (fx.wake) {
    wake_pending_ = true;
    wake_.notify_one();
  }
}

void PoolService::SetOperationObserver(std::function<void(const Operation&)> observer) {
  ServiceLock lock(*this);
  operation_observer_ = std::move(observer);
}

void PoolService::InspectState(const std::function<void(const PoolState&)>& fn) const {
  std::lock_guard<std::mutex> lock(mu_);
  fn(state_);
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

json PoolService::AgentFeatures() {
  // What agents may use beyond the basic protocol: long polls on assignments, batched reports.
  return json::array({"watch", "reports"});
}

void PoolService::NotifyWatchersLocked() {
  // A node's assignments are built here (what an agent runs must be exactly the durable state);
  // a job's view is a snapshot now and its JSON is built after the lock is let go.
  for (auto& due : node_watches_->TakeDue())
    answers_.push_back({std::move(due.watchers), std::make_shared<json>(AssignmentsJsonLocked(due.key)), nullptr, ""});
  for (auto& due : job_watches_->TakeDue()) {
    const JobState* j = state_.FindJob(due.key);
    if (j == nullptr) {
      answers_.push_back({std::move(due.watchers), std::make_shared<json>(GoneJob()), nullptr, ""});
    } else {
      answers_.push_back(
          {std::move(due.watchers), nullptr, std::make_shared<JobSnapshot>(SnapshotJob(state_, *j)), due.version});
    }
  }
  if (!answers_.empty()) has_answers_ = true;
}

void PoolService::DeliverAnswers() {
  std::vector<Answer> answers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    answers.swap(answers_);
    has_answers_ = false;
  }
  for (const Answer& a : answers) {
    const json view = a.view ? *a.view : JobAnswer(*a.job, a.version);
    for (const auto& w : a.watchers) {
      if (w->waiting()) w->Deliver(view);
    }
  }
}

PoolService::ServiceLock::~ServiceLock() {
  if (lock_.owns_lock()) unlock();
}

void PoolService::ServiceLock::unlock() {
  lock_.unlock();
  if (svc_.has_answers_) svc_.DeliverAnswers();
}

size_t PoolService::NodesWatched() const {
  std::lock_guard<std::mutex> lock(mu_);
  return node_watches_->waiting_keys();
}

void PoolService::ReleaseWatchers() {
  ServiceLock lock(*this);
  node_watches_->ReleaseAll([this](const NodeIndex& n) -> std::optional<json> { return AssignmentsJsonLocked(n); },
                            json::object());
  job_watches_->ReleaseAll(
      [this](const std::string& id) -> std::optional<json> {
        const JobState* j = state_.FindJob(id);
        if (j == nullptr) return std::nullopt;
        return JobJson(*j);
      },
      GoneJob());
}

}  // namespace gpupool
