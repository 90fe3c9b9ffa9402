// A local copy of one collection of the API server (nodes, or the pods gpupool schedules), kept in
// step: list, then watch from the list's resourceVersion; when the watch ends, watch again from the
// last resourceVersion seen; when that is too old (410 Gone) or a request fails, list again (after
// a back-off on failures) and tell the handler what differs from the copy. The scheduler's model is
// built from these events alone, so a standby replica rebuilds it from the API with nothing else.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "kube/kube_client.h"

namespace gpupool::kube {

class Informer {
 public:
  struct Options {
    std::string path;   // "/api/v1/nodes", "/api/v1/pods"
    std::string query;  // "fieldSelector=..." (URL-encoded), for the list and the watch alike
    std::chrono::seconds watch_timeout{300};
    std::chrono::milliseconds backoff_min{200};
    std::chrono::milliseconds backoff_max{10000};
    // false: the copy keeps each object's metadata name, namespace, uid and resourceVersion only
    // (enough to tell what changed on a relist; DELETED then carries just those), for a handler
    // that keeps what it needs itself: 100,000 pods are not held twice.
    bool keep_objects = true;
  };
  // type: ADDED, MODIFIED or DELETED; `object` is the new state (the last one for DELETED). Called
  // on the informer's thread, one event at a time, in the API server's order.
  using Handler = std::function<void(const std::string& type, const nlohmann::json& object)>;

  Informer(KubeClient* client, Options options, Handler handler);
  ~Informer();  // stops
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  void Start();
  void Stop();
  // Lists again soon (within about a second), ending the watch: the copy is then as fresh as a
  // quorum read, e.g. for a new leader that must see every write of the one before. Returns a
  // ticket for ListedSince: a list that began after this call has been applied. A list under way
  // when it is called does not count (it may have read the pods before the call); one that has
  // not begun yet (the informer not started, or waiting out a back-off) does, and no second list
  // is made for it.
  uint64_t Resync();
  bool ListedSince(uint64_t ticket) const;
  // Whether the first list has been applied; waits at most `timeout` for it.
  bool WaitSynced(std::chrono::milliseconds timeout);
  // The copy: every object, by "<namespace>/<name>" (cluster-scoped: "/<name>"); without
  // keep_objects, only their metadata's name, namespace, uid and resourceVersion.
  std::map<std::string, nlohmann::json> Snapshot() const;
  uint64_t lists() const { return lists_.load(); }     // lists done (the first one included)
  uint64_t failures() const { return failures_.load(); }
  std::string last_error() const;

 private:
  void Run();
  bool Relist();  // false: failed (after recording why)
  Result<std::string> ListOverCopy();  // Relist's diff against a copy; the list's resourceVersion
  void Apply(const std::string& type, const nlohmann::json& object);
  void SleepFor(std::chrono::milliseconds d);

  KubeClient* client_;
  Options options_;
  Handler handler_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> resync_{false};
  std::atomic<bool> interrupt_{false};  // stop_ or resync_: ends the watch
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, nlohmann::json> objects_;  // guarded by mu_
  std::string resource_version_;                   // the informer thread's own
  bool synced_ = false;                            // guarded by mu_
  uint64_t list_starts_ = 0;                       // guarded by mu_: lists begun
  uint64_t listed_start_ = 0;                      // guarded by mu_: the number of the last list applied
  std::string last_error_;                         // guarded by mu_
  std::atomic<uint64_t> lists_{0};
  std::atomic<uint64_t> failures_{0};
};

// "<namespace>/<name>" of an object ("/<name>" when cluster-scoped); empty when it has no name.
std::string ObjectKey(const nlohmann::json& object);

}  // namespace gpupool::kube
