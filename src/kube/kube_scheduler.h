// `gpupool kube-scheduler`: the Kubernetes secondary scheduler for pods with `schedulerName:
// gpupool` (docs/kubernetes.md). Informers keep the cluster state (cluster_state.h) in step with
// the API server; the leader (a Lease, leader.h) runs scheduling cycles on it and binds each placed
// pod with the `pods/binding` subresource, the GPU assignment going onto the pod with the binding
// itself (one write: a pod is never annotated without being bound, nor bound without its
// assignment). Pods that stay pending get `PodScheduled=False` with gpupool's reasons and an Event.
//
// Threads: one loop owns the cluster state (events in, cycles, results); binding workers talk to
// the API server; informers and the elector have their own. Nothing else touches the state.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/prom_text.h"
#include "kube/cluster_state.h"
#include "kube/informer.h"
#include "kube/kube_client.h"
#include "kube/leader.h"

namespace gpupool::kube {

struct KubeSchedulerOptions {
  ClusterOptions cluster;
  bool leader_elect = true;
  LeaderElector::Options leader;
  int bind_workers = 16;
  std::chrono::milliseconds cycle_interval{20};  // the least time between cycles (events batch up)
  double report_qps = 50;  // pending-pod conditions and Events written per second, at most
  bool events = true;      // write Events (FailedScheduling, Scheduled, Preempted)
  int eviction_grace_seconds = -1;  // a preemption victim's grace period (-1: the pod's own)
};

class KubeScheduler {
 public:
  // `client` must outlive the scheduler.
  static Result<std::unique_ptr<KubeScheduler>> Create(KubeClient* client, KubeSchedulerOptions options);
  ~KubeScheduler();
  KubeScheduler(const KubeScheduler&) = delete;
  KubeScheduler& operator=(const KubeScheduler&) = delete;

  void Start();
  // Stops every thread; a leader gives up its lease.
  void Stop();
  // Set before Start: called (once, on the elector's thread) when this replica lost the lease.
  void OnLostLeadership(std::function<void()> f) { on_lost_ = std::move(f); }

  bool leading() const { return leading_.load(); }
  // Healthy: both informers listed once and the loop is turning. `why` says what is not.
  bool Healthy(std::string* why) const;
  std::string MetricsText() const;

  struct Stats {
    uint64_t bound = 0, bind_failures = 0, cycles = 0, decisions = 0, reports = 0;
    uint64_t evictions = 0, eviction_failures = 0;
  };
  Stats stats() const;

 private:
  struct Report {
    PendingReport pending;  // reason empty: a Scheduled event for `node`
    std::string node;
  };
  struct BindResult {
    std::string uid;
    bool ok = false;
    bool eviction = false;  // the result of an eviction, not of a binding
  };

  KubeScheduler(KubeClient* client, KubeSchedulerOptions options, std::unique_ptr<ClusterState> state);
  void Loop();
  void Worker();
  void Bind(const BindOrder& order);
  void Evict(const EvictOrder& order);
  void Write(const Report& report);
  void PostEvent(const std::string& ns, const std::string& name, const std::string& uid, const char* reason,
                 const std::string& message, const char* type);
  void Inbox(bool node, const std::string& type, const nlohmann::json& object);

  KubeClient* client_;
  KubeSchedulerOptions options_;
  std::unique_ptr<ClusterState> state_;  // the loop's alone
  std::unique_ptr<Informer> nodes_, pods_;
  std::unique_ptr<LeaderElector> elector_;
  std::function<void()> on_lost_;
  std::thread loop_;
  std::vector<std::thread> workers_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> leading_{false};    // the elector says so
  std::atomic<bool> resync_wanted_{false};
  uint64_t node_ticket_ = 0, pod_ticket_ = 0;  // guarded by mu_: the informers' Resync tickets
  std::atomic<int64_t> loop_beat_ns_{0};

  mutable std::mutex mu_;
  std::condition_variable loop_cv_, work_cv_;
  struct Event {
    bool node;
    std::string type;
    nlohmann::json object;
  };
  std::vector<Event> inbox_;             // guarded by mu_
  std::vector<BindResult> results_;      // guarded by mu_
  std::deque<BindOrder> binds_;          // guarded by mu_
  std::deque<EvictOrder> evictions_;     // guarded by mu_
  std::deque<std::string> report_order_;  // guarded by mu_: uids, each once, oldest first
  std::unordered_map<std::string, Report> reports_;  // guarded by mu_: the newest per pod
  double report_tokens_ = 0;             // guarded by mu_
  std::chrono::steady_clock::time_point report_refill_{};
  std::unordered_map<std::string, std::chrono::steady_clock::time_point> first_seen_;  // the loop's
  struct Backoff {
    int failures = 0;
    std::chrono::steady_clock::time_point due;
    bool unparked = false;
  };
  std::unordered_map<std::string, Backoff> backoff_;  // the loop's: pods whose binding failed
  std::unordered_map<std::string, Backoff> evict_backoff_;  // the loop's: pods whose eviction was refused

  // Metrics (guarded by mu_ unless atomic).
  Histogram latency_{{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}};
  Histogram cycle_{{0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5}};
  Stats stats_;
  ClusterCounts counts_;
  std::map<std::string, size_t> pending_by_reason_;
  bool ready_ = false;  // leading and resynced: cycles run (the loop's)
};

}  // namespace gpupool::kube
