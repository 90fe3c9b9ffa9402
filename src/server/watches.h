// Long polls on versioned views (a node's assignments, a job): each key has a version that
// changes when what it shows changes; a watcher holding version V waits for the next one. No
// I/O and no locking of its own: the owner (PoolService) calls it under its mutex, marks keys
// changed as it changes state, and flushes once those changes are durable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace gpupool {

// Who waits: answered at most once, with the view as it is after the change.
class Watcher {
 public:
  virtual ~Watcher() = default;
  virtual void Deliver(const nlohmann::json& view) = 0;
  virtual bool waiting() const = 0;  // false once answered (here, or by its own timeout)
};

template <class Key>
class WatchSet {
 public:
  // `run_token` tells this run's versions from an earlier server run's (whose counters restarted).
  WatchSet(std::string run_token, size_t max_per_key) : run_(std::move(run_token)), max_per_key_(max_per_key) {}

  std::string Version(const Key& k) const {
    auto it = versions_.find(k);
    return run_ + "-" + std::to_string(it == versions_.end() ? 1 : it->second);
  }
  // What `k` shows changed; its watchers hear of it at the next Flush.
  void Changed(const Key& k) { changed_.insert(k); }

  // A watcher that holds `since`: false when the key is no longer at `since` (the caller answers
  // at once); else it waits. A key keeps at most max_per_key waiting: one more answers the oldest
  // with `view()` now.
  bool Wait(const Key& k, const std::string& since, std::shared_ptr<Watcher> w,
            const std::function<nlohmann::json()>& view) {
    if (since != Version(k)) return false;
    auto& ws = waiting_[k];
    std::erase_if(ws, [](const auto& x) { return !x->waiting(); });
    if (ws.size() >= max_per_key_) {
      ws.front()->Deliver(view());
      ws.erase(ws.begin());
    }
    ws.push_back(std::move(w));
    return true;
  }

  // The changes marked so far are durable: bumps their keys' versions and answers their watchers
  // with `view(key)` (nothing: the key is gone, they are answered with `gone`).
  void Flush(const std::function<std::optional<nlohmann::json>(const Key&)>& view, const nlohmann::json& gone) {
    for (const Key& k : changed_) {
      ++Counter(k);
      auto it = waiting_.find(k);
      if (it == waiting_.end()) continue;
      std::vector<std::shared_ptr<Watcher>> ws = std::move(it->second);
      waiting_.erase(it);
      std::optional<nlohmann::json> now;
      for (auto& w : ws) {
        if (!w->waiting()) continue;
        if (!now) now = view(k).value_or(gone);
        w->Deliver(*now);
      }
    }
    changed_.clear();
  }
  // As Flush, but the watchers to answer are handed back instead of answered: the owner takes a
  // snapshot of each key under its lock and builds and delivers the views after letting go.
  struct Due {
    Key key;
    std::string version;  // the key's version after the change
    std::vector<std::shared_ptr<Watcher>> watchers;
  };
  std::vector<Due> TakeDue() {
    std::vector<Due> out;
    for (const Key& k : changed_) {
      ++Counter(k);
      auto it = waiting_.find(k);
      if (it == waiting_.end()) continue;
      Due d{k, Version(k), std::move(it->second)};
      waiting_.erase(it);
      std::erase_if(d.watchers, [](const auto& w) { return !w->waiting(); });
      if (!d.watchers.empty()) out.push_back(std::move(d));
    }
    changed_.clear();
    return out;
  }
  // A key that no longer exists (a removed job): its version is forgotten; a watcher still waiting
  // is answered by the next Flush that names the key, or its timeout.
  void Forget(const Key& k) { versions_.erase(k); }
  // Answers every waiting watcher with its view as it is now.
  void ReleaseAll(const std::function<std::optional<nlohmann::json>(const Key&)>& view, const nlohmann::json& gone) {
    for (auto& [k, ws] : waiting_) {
      std::optional<nlohmann::json> now;
      for (auto& w : ws) {
        if (!w->waiting()) continue;
        if (!now) now = view(k).value_or(gone);
        w->Deliver(*now);
      }
    }
    waiting_.clear();
  }
  size_t waiting_keys() const { return waiting_.size(); }

 private:
  uint64_t& Counter(const Key& k) { return versions_.try_emplace(k, 1).first->second; }

  std::string run_;
  size_t max_per_key_;
  std::map<Key, uint64_t> versions_;
  std::set<Key> changed_;
  std::map<Key, std::vector<std::shared_ptr<Watcher>>> waiting_;
};

}  // namespace gpupool
