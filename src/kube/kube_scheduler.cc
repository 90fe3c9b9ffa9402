#include "kube/kube_scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <random>

#include "kube/json_fields.h"

namespace gpupool::kube {

namespace {

using Json = nlohmann::json;
using json_fields::At;
using json_fields::Str;
using Clock = std::chrono::steady_clock;

int64_t NowNs() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }
double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string PodPath(const std::string& ns, const std::string& name) {
  return fmt::format("/api/v1/namespaces/{}/pods/{}", KubeClient::Escape(ns), KubeClient::Escape(name));
}

std::string EventName(const std::string& pod) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}.{:016x}", pod.substr(0, 200), rng());
}

}  // namespace

Result<std::unique_ptr<KubeScheduler>> KubeScheduler::Create(KubeClient* client, KubeSchedulerOptions options) {
  if (options.bind_workers < 1 || options.bind_workers > 256)
    return Status::InvalidArgument("bind workers must be 1 to 256");
  if (!(options.report_qps > 0)) return Status::InvalidArgument("the report rate must be above 0");
  if (options.leader_elect) RETURN_IF_ERROR(LeaderElector::Validate(options.leader));
  ASSIGN_OR_RETURN(auto state, ClusterState::Create(options.cluster));
  return std::unique_ptr<KubeScheduler>(new KubeScheduler(client, std::move(options), std::move(state)));
}

KubeScheduler::KubeScheduler(KubeClient* client, KubeSchedulerOptions options, std::unique_ptr<ClusterState> state)
    : client_(client), options_(std::move(options)), state_(std::move(state)) {
  Informer::Options nodes;
  nodes.path = "/api/v1/nodes";
  nodes_ = std::make_unique<Informer>(client_, nodes, [this](const std::string& type, const Json& o) { Inbox(true, type, o); });
  // Every pod that has not ended: gpupool's pending ones, and whatever holds a node's resources.
  Informer::Options pods;
  pods.path = "/api/v1/pods";
  pods.query = "fieldSelector=" + KubeClient::Escape("status.phase!=Succeeded,status.phase!=Failed");
  pods.keep_objects = false;  // the cluster state keeps what it needs of each pod
  pods_ = std::make_unique<Informer>(client_, pods, [this](const std::string& type, const Json& o) { Inbox(false, type, o); });
  if (options_.leader_elect) {
    elector_ = std::make_unique<LeaderElector>(client_, options_.leader, [this](bool leading) {
      leading_ = leading;
      if (leading) {
        std::cerr << fmt::format("gpupool kube-scheduler: {} leads (lease {}/{})\n", options_.leader.identity,
                                 options_.leader.namespace_name, options_.leader.name);
        // Lists that begin from now on: one under way may have read the pods before this replica
        // led. Asked here, on becoming leader: a list not begun yet (at start) needs no second one.
        std::lock_guard<std::mutex> lock(mu_);
        node_ticket_ = nodes_->Resync();
        pod_ticket_ = pods_->Resync();
        resync_wanted_ = true;
      } else {
        std::cerr << fmt::format("gpupool kube-scheduler: {} no longer leads\n", options_.leader.identity);
        if (on_lost_ && !stop_.load()) on_lost_();
      }
      loop_cv_.notify_all();
    });
  }
}

KubeScheduler::~KubeScheduler() { Stop(); }

void KubeScheduler::Start() {
  if (loop_.joinable()) return;
  stop_ = false;
  report_refill_ = Clock::now();
  report_tokens_ = options_.report_qps;
  // The election's first round before the lists: a replica that leads from the start then lists
  // once, after it leads, instead of a second time (100,000 pods are seconds of listing).
  if (elector_) {
    elector_->Start();
    auto decided = [this] {
      const std::string holder = elector_->holder();
      return resync_wanted_.load() || !elector_->last_error().empty() ||
             (!holder.empty() && holder != options_.leader.identity);
    };
    for (int i = 0; i < 100 && !decided(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } else {
    leading_ = true;
  }
  // Nodes first: pods bound to a node not known yet wait in the state with their whole object.
  nodes_->Start();
  (void)nodes_->WaitSynced(std::chrono::seconds(30));
  pods_->Start();
  loop_ = std::thread([this] { Loop(); });
  for (int i = 0; i < options_.bind_workers; ++i) workers_.emplace_back([this] { Worker(); });
}

void KubeScheduler::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_.exchange(true)) return;
  }
  loop_cv_.notify_all();
  work_cv_.notify_all();
  if (loop_.joinable()) loop_.join();
  for (auto& w : workers_) w.join();
  workers_.clear();
  if (elector_) elector_->Stop();  // gives the lease up
  nodes_->Stop();
  pods_->Stop();
}

void KubeScheduler::Inbox(bool node, const std::string& type, const Json& object) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back({node, type, object});
  }
  loop_cv_.notify_one();
}

bool KubeScheduler::Healthy(std::string* why) const {
  auto say = [&](std::string text) {
    if (why) *why = std::move(text);
    return false;
  };
  if (!nodes_->WaitSynced(std::chrono::milliseconds(0)))
    return say("nodes not listed yet: " + nodes_->last_error());
  if (!pods_->WaitSynced(std::chrono::milliseconds(0)))
    return say("pods not listed yet: " + pods_->last_error());
  if (NowNs() - loop_beat_ns_.load() > int64_t{10} * 1000000000)
    return say("the scheduling loop has not turned for 10 s");
  if (why) *why = leading_.load() ? "ok: leading" : "ok: standby";
  return true;
}

void KubeScheduler::Loop() {
  uint64_t node_ticket = 0, pod_ticket = 0;
  bool resyncing = false;
  auto last_cycle = Clock::now() - options_.cycle_interval;
  auto last_views = last_cycle - std::chrono::seconds(1);
  std::vector<Event> events;
  std::vector<BindResult> results;
  while (!stop_.load()) {
    loop_beat_ns_ = NowNs();
    {
      std::unique_lock<std::mutex> lock(mu_);
      loop_cv_.wait_for(lock, std::chrono::milliseconds(500), [this] {
        return stop_.load() || !inbox_.empty() || !results_.empty() || resync_wanted_.load();
      });
      if (stop_.load()) break;
    }
    // Batch: events that arrive within the cycle interval go into one cycle.
    const auto since = Clock::now() - last_cycle;
    if (since < options_.cycle_interval) std::this_thread::sleep_for(options_.cycle_interval - since);
    {
      std::lock_guard<std::mutex> lock(mu_);
      events.swap(inbox_);
      results.swap(results_);
    }
    for (const Event& e : events) {
      if (e.node) {
        state_->ApplyNode(e.type, e.object);
        continue;
      }
      state_->ApplyPod(e.type, e.object);
      const std::string uid = At(At(e.object, "metadata"), "uid").is_string() ? At(At(e.object, "metadata"), "uid").get<std::string>() : "";
      const bool waiting = e.type != "DELETED" && At(At(e.object, "spec"), "nodeName").is_null() &&
                           At(At(e.object, "spec"), "schedulerName") == options_.cluster.scheduler_name;
      if (!uid.empty()) {
        if (waiting) {
          first_seen_.try_emplace(uid, Clock::now());
        } else if (auto it = first_seen_.find(uid); it != first_seen_.end()) {
          // Bound (by this replica or the one before), or gone.
          if (e.type != "DELETED" && At(At(e.object, "spec"), "nodeName").is_string())
            latency_.Observe(Seconds(Clock::now() - it->second));
          first_seen_.erase(it);
        }
        if (e.type == "DELETED") backoff_.erase(uid);
      }
    }
    events.clear();
    for (const BindResult& r : results) {
      if (r.eviction) {
        if (!r.ok) {
          // Not a victim again for 10 s, doubling to 5 minutes: a budget that forbids it is not
          // asked again at the cycle rate.
          state_->EvictFailed(r.uid);
          Backoff& b = evict_backoff_[r.uid];
          b.due = Clock::now() + std::chrono::milliseconds(std::min<int64_t>(300000, int64_t{10000} << std::min(b.failures, 5)));
          ++b.failures;
          b.unparked = false;
        }
        continue;
      }
      if (r.ok) {
        backoff_.erase(r.uid);
      } else {
        // Held back a while (1 s, doubling to a minute): a binding the API server refuses (RBAC,
        // an admission webhook) is not retried at the cycle rate.
        state_->BindFailed(r.uid, true);
        Backoff& b = backoff_[r.uid];
        b.due = Clock::now() + std::chrono::milliseconds(std::min<int64_t>(60000, int64_t{1000} << std::min(b.failures, 6)));
        ++b.failures;
        b.unparked = false;
      }
    }
    results.clear();
    // Back-offs that ended: the pod is tried (or a victim) again; forgotten once long over (a pod
    // bound or gone meanwhile leaves no trace).
    auto sweep = [](std::unordered_map<std::string, Backoff>& backoffs, auto&& release, std::chrono::minutes forget) {
      for (auto it = backoffs.begin(); it != backoffs.end();) {
        if (it->second.due <= Clock::now() && !it->second.unparked) {
          release(it->first);
          it->second.unparked = true;
        }
        if (Clock::now() - it->second.due > forget) it = backoffs.erase(it);
        else ++it;
      }
    };
    sweep(backoff_, [this](const std::string& uid) { state_->Unpark(uid); }, std::chrono::minutes(10));
    sweep(evict_backoff_, [this](const std::string& uid) { state_->Unprotect(uid); }, std::chrono::minutes(30));

    // A new leader lists everything again before its first decision: whatever the previous leader
    // bound is then in the state, seen as a quorum read would see it.
    if (resync_wanted_.exchange(false) && leading_.load()) {
      ready_ = false;
      resyncing = true;
      std::lock_guard<std::mutex> lock(mu_);
      node_ticket = node_ticket_;
      pod_ticket = pod_ticket_;
    }
    if (resyncing && nodes_->ListedSince(node_ticket) && pods_->ListedSince(pod_ticket)) {
      resyncing = false;
      ready_ = true;
    }
    if (!elector_ && !ready_) ready_ = nodes_->WaitSynced(std::chrono::milliseconds(0)) && pods_->WaitSynced(std::chrono::milliseconds(0));
    if (!leading_.load()) ready_ = false;

    const auto t0 = Clock::now();
    CycleResult r;
    if (ready_) r = state_->Cycle();
    last_cycle = Clock::now();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (ready_) {
        cycle_.Observe(Seconds(last_cycle - t0));
        ++stats_.cycles;
        stats_.decisions += static_cast<uint64_t>(r.decisions);
      }
      for (BindOrder& b : r.binds) binds_.push_back(std::move(b));
      for (EvictOrder& e : r.evictions) evictions_.push_back(std::move(e));
      for (PendingReport& p : r.pending) {
        const std::string uid = p.uid;
        if (!reports_.count(uid)) report_order_.push_back(uid);
        reports_[uid] = Report{std::move(p), ""};
      }
      // The views walk every pod: refreshed after a cycle that decided or reported something, else
      // a few times a second (at 100,000 pods, a walk after every cycle was most of the loop's time).
      const bool moved = !r.binds.empty() || !r.pending.empty() || !r.evictions.empty();
      if (moved || last_cycle - last_views >= std::chrono::milliseconds(200)) {
        counts_ = state_->counts();
        pending_by_reason_ = state_->PendingByReason();
        last_views = last_cycle;
      }
    }
    if (!r.binds.empty() || !r.pending.empty() || !r.evictions.empty()) work_cv_.notify_all();
  }
}

void KubeScheduler::Worker() {
  while (true) {
    BindOrder order;
    EvictOrder eviction;
    Report report;
    bool have_bind = false, have_report = false, have_eviction = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      while (true) {
        if (stop_.load()) return;
        if (!evictions_.empty()) {
          eviction = std::move(evictions_.front());
          evictions_.pop_front();
          have_eviction = true;
          break;
        }
        if (!binds_.empty()) {
          order = std::move(binds_.front());
          binds_.pop_front();
          have_bind = true;
          break;
        }
        if (!report_order_.empty()) {
          const auto now = Clock::now();
          report_tokens_ = std::min(options_.report_qps,
                                    report_tokens_ + Seconds(now - report_refill_) * options_.report_qps);
          report_refill_ = now;
          if (report_tokens_ >= 1) {
            report_tokens_ -= 1;
            const std::string uid = std::move(report_order_.front());
            report_order_.pop_front();
            auto it = reports_.find(uid);
            if (it != reports_.end()) {
              report = std::move(it->second);
              reports_.erase(it);
              have_report = true;
              break;
            }
            continue;
          }
          work_cv_.wait_for(lock, std::chrono::milliseconds(static_cast<int64_t>(1000 / options_.report_qps) + 1));
          continue;
        }
        work_cv_.wait(lock);
      }
    }
    if (have_eviction) Evict(eviction);
    if (have_bind) Bind(order);
    if (have_report) Write(report);
  }
}

void KubeScheduler::Evict(const EvictOrder& order) {
  bool ok = false;
  std::string why = "not leading";
  // Through the Eviction subresource (PodDisruptionBudgets are honoured), for that very pod (uid).
  if (!elector_ || elector_->IsLeader()) {
    Json eviction = {{"apiVersion", "policy/v1"},
                     {"kind", "Eviction"},
                     {"metadata", {{"name", order.name}, {"namespace", order.namespace_name}}},
                     {"deleteOptions", {{"preconditions", {{"uid", order.uid}}}}}};
    if (options_.eviction_grace_seconds >= 0)
      eviction["deleteOptions"]["gracePeriodSeconds"] = options_.eviction_grace_seconds;
    auto r = client_->Request("POST", PodPath(order.namespace_name, order.name) + "/eviction", &eviction);
    if (!r.ok()) {
      why = r.status().message();
    } else if (r->code == 201 || r->code == 200 || r->code == 404) {
      ok = true;  // 404: gone already
    } else {
      why = ErrorOf(*r, "eviction").message();
    }
  }
  if (ok && options_.events) PostEvent(order.namespace_name, order.name, order.uid, "Preempted", order.message, "Normal");
  {
    std::lock_guard<std::mutex> lock(mu_);
    results_.push_back({order.uid, ok, true});
    ++(ok ? stats_.evictions : stats_.eviction_failures);
  }
  if (!ok)
    std::cerr << fmt::format("gpupool kube-scheduler: evicting {}/{}: {}\n", order.namespace_name, order.name, why);
  loop_cv_.notify_one();
}

void KubeScheduler::Bind(const BindOrder& order) {
  bool ok = false;
  std::string why;
  // A replica that is not sure it still leads binds nothing: the next leader decides again.
  if (!elector_ || elector_->IsLeader()) {
    Json binding = {{"apiVersion", "v1"},
                    {"kind", "Binding"},
                    {"metadata",
                     {{"name", order.name},
                      {"namespace", order.namespace_name},
                      {"uid", order.uid},
                      {"annotations", {{kAssignmentKey, order.assignment}}}}},
                    {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", order.node}}}};
    auto r = client_->Request("POST", PodPath(order.namespace_name, order.name) + "/binding", &binding);
    if (!r.ok()) {
      why = r.status().message();
    } else if (r->code == 201 || r->code == 200) {
      ok = true;
    } else {
      why = ErrorOf(*r, "binding").message();
    }
  } else {
    why = "not leading";
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    results_.push_back({order.uid, ok});
    if (ok) {
      ++stats_.bound;
      if (options_.events) {
        if (!reports_.count(order.uid)) report_order_.push_back(order.uid);
        reports_[order.uid] = Report{{order.uid, order.namespace_name, order.name, "", "", ""}, order.node};
      }
    } else {
      ++stats_.bind_failures;
      reports_.erase(order.uid);
    }
  }
  if (!ok) std::cerr << fmt::format("gpupool kube-scheduler: binding {}/{} to {}: {}\n", order.namespace_name, order.name, order.node, why);
  loop_cv_.notify_one();
  work_cv_.notify_one();
}

void KubeScheduler::Write(const Report& report) {
  const PendingReport& p = report.pending;
  const std::string now = MicroTimeNow();
  const std::string stamp = now.substr(0, 19) + "Z";  // a condition's Time: whole seconds
  if (!p.reason.empty()) {
    // PodScheduled=False with gpupool's words, as kube-scheduler writes it for the pods it cannot place.
    Json patch = {{"status",
                   {{"conditions", Json::array({{{"type", "PodScheduled"},
                                                  {"status", "False"},
                                                  {"reason", "Unschedulable"},
                                                  {"message", p.message},
                                                  {"lastProbeTime", nullptr},
                                                  {"lastTransitionTime", stamp}}})}}}};
    // A preemptor names the node its victims leave, as kube-scheduler does; any other report
    // clears a nomination that no longer holds (null deletes the field).
    patch["status"]["nominatedNodeName"] = p.nominated_node.empty() ? Json(nullptr) : Json(p.nominated_node);
    auto r = client_->Request("PATCH", PodPath(p.namespace_name, p.name) + "/status", &patch,
                              "application/strategic-merge-patch+json");
    (void)r;  // a pod that is gone or bound meanwhile: nothing to say
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.reports;
  }
  if (!options_.events) return;
  const bool scheduled = p.reason.empty();
  PostEvent(p.namespace_name, p.name, p.uid, scheduled ? "Scheduled" : "FailedScheduling",
            scheduled ? fmt::format("Successfully assigned {}/{} to {}", p.namespace_name, p.name, report.node) : p.message,
            scheduled ? "Normal" : "Warning");
}

void KubeScheduler::PostEvent(const std::string& ns, const std::string& name, const std::string& uid,
                              const char* reason, const std::string& message, const char* type) {
  const std::string stamp = MicroTimeNow().substr(0, 19) + "Z";  // Events' Time: whole seconds
  Json event = {{"apiVersion", "v1"},
                {"kind", "Event"},
                {"metadata", {{"name", EventName(name)}, {"namespace", ns}}},
                {"involvedObject", {{"apiVersion", "v1"}, {"kind", "Pod"}, {"namespace", ns}, {"name", name}, {"uid", uid}}},
                {"reason", reason},
                {"message", message},
                {"type", type},
                {"source", {{"component", "gpupool-scheduler"}}},
                {"reportingComponent", "gpupool-scheduler"},
                {"reportingInstance", options_.leader.identity},
                {"firstTimestamp", stamp},
                {"lastTimestamp", stamp},
                {"count", 1}};
  (void)client_->Request("POST", fmt::format("/api/v1/namespaces/{}/events", KubeClient::Escape(ns)), &event);
}

KubeScheduler::Stats KubeScheduler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::string KubeScheduler::MetricsText() const {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  RenderHeader("gpupool_kube_leader", "gauge", "1 while this replica leads (holds the lease)", out);
  RenderSample("gpupool_kube_leader", {}, leading_.load() ? 1 : 0, out);
  RenderHeader("gpupool_kube_pods_bound_total", "counter", "Pods bound by this replica", out);
  RenderSample("gpupool_kube_pods_bound_total", {}, static_cast<double>(stats_.bound), out);
  RenderHeader("gpupool_kube_bind_failures_total", "counter", "Bindings the API server refused or that failed", out);
  RenderSample("gpupool_kube_bind_failures_total", {}, static_cast<double>(stats_.bind_failures), out);
  RenderHeader("gpupool_kube_preemption_evictions_total", "counter", "Pods evicted to make room for a preemptor", out);
  RenderSample("gpupool_kube_preemption_evictions_total", {}, static_cast<double>(stats_.evictions), out);
  RenderHeader("gpupool_kube_preemption_eviction_failures_total", "counter", "Evictions the API server refused (a PodDisruptionBudget, ...)", out);
  RenderSample("gpupool_kube_preemption_eviction_failures_total", {}, static_cast<double>(stats_.eviction_failures), out);
  RenderHeader("gpupool_kube_cycles_total", "counter", "Scheduling cycles run", out);
  RenderSample("gpupool_kube_cycles_total", {}, static_cast<double>(stats_.cycles), out);
  RenderHeader("gpupool_kube_decisions_total", "counter", "Placement decisions (a gang is one)", out);
  RenderSample("gpupool_kube_decisions_total", {}, static_cast<double>(stats_.decisions), out);
  RenderHeader("gpupool_kube_reports_total", "counter", "Pod conditions and Events written", out);
  RenderSample("gpupool_kube_reports_total", {}, static_cast<double>(stats_.reports), out);
  latency_.Render("gpupool_kube_scheduling_latency_seconds",
                  "From a pod first seen pending to its binding seen by the informer", out);
  cycle_.Render("gpupool_kube_cycle_duration_seconds", "One scheduling cycle", out);
  RenderHeader("gpupool_kube_pending_pods", "gauge", "gpupool's pending pods by the reason of their last report", out);
  for (const auto& [reason, n] : pending_by_reason_)
    RenderSample("gpupool_kube_pending_pods", {{"reason", reason}}, static_cast<double>(n), out);
  RenderHeader("gpupool_kube_nodes", "gauge", "Nodes known, by whether their GPUs could be read", out);
  RenderSample("gpupool_kube_nodes", {{"state", "ok"}}, static_cast<double>(counts_.nodes), out);
  RenderSample("gpupool_kube_nodes", {{"state", "unreadable"}}, static_cast<double>(counts_.bad_nodes), out);
  RenderHeader("gpupool_kube_pods_unaccounted", "gauge",
               "Bound pods whose holdings do not fit their node (overcommitted by someone else)", out);
  RenderSample("gpupool_kube_pods_unaccounted", {}, static_cast<double>(counts_.pods_unaccounted), out);
  RenderHeader("gpupool_kube_relearn_total", "counter",
               "Relearning points (every 512 new pods, one per node on larger clusters): pipeline rebuilt on the "
               "recent typical workload, or kept because it moved less than 1 %",
               out);
  RenderSample("gpupool_kube_relearn_total", {{"outcome", "rebuilt"}}, static_cast<double>(counts_.relearned), out);
  RenderSample("gpupool_kube_relearn_total", {{"outcome", "kept"}}, static_cast<double>(counts_.relearn_kept), out);
  RenderHeader("gpupool_kube_bind_queue", "gauge", "Bindings waiting for a worker", out);
  RenderSample("gpupool_kube_bind_queue", {}, static_cast<double>(binds_.size()), out);
  RenderHeader("gpupool_kube_informer_lists_total", "counter", "Full lists (the first, and after a 410 or failure)", out);
  RenderSample("gpupool_kube_informer_lists_total", {{"resource", "nodes"}}, static_cast<double>(nodes_->lists()), out);
  RenderSample("gpupool_kube_informer_lists_total", {{"resource", "pods"}}, static_cast<double>(pods_->lists()), out);
  return out;
}

}  // namespace gpupool::kube
