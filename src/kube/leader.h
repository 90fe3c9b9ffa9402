// Leader election on a coordination.k8s.io/v1 Lease, as Kubernetes' own controllers do it: the
// leader renews the lease every retry period; a candidate takes it over only when the holder has
// not renewed it for a whole lease duration, timed by the candidate's own clock from when it last
// saw the lease change (no two machines' clocks are compared); a leader that could not renew for
// the renew deadline stops leading, which it does before anyone else may take over (renew
// deadline < lease duration). Writes are optimistic (the lease's resourceVersion): of two
// candidates, one wins, the other gets a conflict.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "kube/kube_client.h"

namespace gpupool::kube {

class LeaderElector {
 public:
  struct Options {
    std::string namespace_name = "gpupool-system";
    std::string name = "gpupool-scheduler";
    std::string identity;  // unique per replica (the pod name and a random suffix)
    std::chrono::milliseconds lease_duration{15000};
    std::chrono::milliseconds renew_deadline{10000};
    std::chrono::milliseconds retry_period{2000};
  };

  // `on_change(true)` when this replica starts leading, `on_change(false)` when it stops (it never
  // leads again: a replica that lost the lease should exit and start afresh). Called on the
  // elector's thread.
  LeaderElector(KubeClient* client, Options options, std::function<void(bool)> on_change);
  ~LeaderElector();  // stops, giving the lease up if held
  LeaderElector(const LeaderElector&) = delete;
  LeaderElector& operator=(const LeaderElector&) = delete;

  static Status Validate(const Options& options);
  void Start();
  // Stops; a leader gives the lease up (holder cleared) so a standby takes over at once.
  void Stop();
  // Leading now: it holds the lease and renewed it within the renew deadline.
  bool IsLeader() const;
  std::string holder() const;  // as last seen
  uint64_t transitions() const { return transitions_.load(); }
  std::string last_error() const;

 private:
  void Run();
  bool TryAcquireOrRenew();  // true: holds the lease now (renewed)
  void Release();

  KubeClient* client_;
  Options options_;
  std::function<void(bool)> on_change_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // The lease as last seen, and when (our clock) it last changed.
  std::string seen_record_;
  std::chrono::steady_clock::time_point seen_at_{};
  std::string holder_;      // guarded by mu_
  std::string last_error_;  // guarded by mu_
  std::atomic<int64_t> renewed_at_ns_{0};  // steady clock of the last successful renewal; 0: never
  std::atomic<bool> leading_{false};
  bool lost_ = false;
  std::atomic<uint64_t> transitions_{0};
};

// Kubernetes' MicroTime, "2026-12-06T09:30:00.123456Z", of the system clock now.
std::string MicroTimeNow();

}  // namespace gpupool::kube
