// The node side's first duty (`gpupool kube-node`, docs/kubernetes.md): publish this node's GPUs —
// models, memory, UUIDs, NUMA placement, MIG mode, NVLink topology and health, as NVML reports them
// (or a simulated inventory) — as the Node's `gpupool.io/inventory` annotation, which the scheduler
// reads. It writes only when something changed (a GPU's health, mostly), never per pod or per
// allocation: device state kept in Node annotations and rewritten on every change is what rate-
// limited HAMi's and Volcano's API servers at a few hundred nodes.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/inventory.h"
#include "agent/nvml.h"
#include "kube/kube_client.h"

namespace gpupool::kube {

// The annotation's value for `inv`: the node spec of docs/api.md without name, CPU, memory and
// labels (the Node object has those), GPUs and topology only.
std::string InventoryAnnotation(const Inventory& inv, const std::string& node);

class NodePublisher {
 public:
  struct Options {
    std::string node;                           // the Node object's name
    std::chrono::milliseconds interval{10000};  // health checked this often
    std::chrono::milliseconds resync{300000};   // the Node read again this often when nothing changed
  };
  // Health samples of the GPUs now (NVML's XIDs and ECC errors); nullptr: the inventory's as is.
  using HealthFn = std::function<Result<std::vector<GpuHealthSample>>()>;

  NodePublisher(KubeClient* client, Inventory inventory, Options options, HealthFn health);
  ~NodePublisher();
  NodePublisher(const NodePublisher&) = delete;
  NodePublisher& operator=(const NodePublisher&) = delete;

  // Reads the health, and writes the annotation when it differs from the Node's. Errors name the
  // request that failed (a Node that does not exist yet is NotFound: retried at the next turn).
  Status PublishOnce();
  void Start();  // PublishOnce now and every interval, on a thread of its own
  void Stop();

  Inventory inventory() const;
  uint64_t writes() const { return writes_.load(); }
  bool published() const { return published_.load(); }  // the Node carries the current inventory
  std::string last_error() const;

 private:
  KubeClient* client_;
  Options options_;
  HealthFn health_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Inventory inventory_;     // guarded by mu_
  std::string last_error_;  // guarded by mu_
  std::string last_seen_;   // guarded by mu_: the annotation the Node carried at the last check
  std::chrono::steady_clock::time_point last_check_{};  // guarded by mu_
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> published_{false};
  std::atomic<uint64_t> writes_{0};
};

}  // namespace gpupool::kube
