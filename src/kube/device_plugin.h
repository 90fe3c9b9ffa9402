// `gpupool kube-node`'s second duty: the kubelet device plugin (API v1beta1, gRPC over Unix
// sockets; docs/kubernetes.md#the-device-plugin). It serves `gpupool.io/gpu` as slots on the node's
// GPUs (pod_admission.h), registers with kubelet — again whenever kubelet restarts and removes the
// plugin's socket —, streams the slots' health from NVML (ListAndWatch), steers kubelet's choice of
// slots to the GPUs gpupool assigned (GetPreferredAllocation), and answers Allocate with what the
// pod's assignment annotation grants: found by pod UID through kubelet's pod-resources API, never
// by a lock on the Node object.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <optional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/inventory.h"
#include "common/status.h"
#include "agent/mps.h"
#include "kube/pod_admission.h"

namespace gpupool::kube {

class DevicePlugin {
 public:
  struct Options {
    std::string node;
    std::string resource = "gpupool.io/gpu";
    std::string plugin_dir = "/var/lib/kubelet/device-plugins";  // kubelet.sock is in it
    std::string socket_name;  // the plugin's socket in plugin_dir (default "gpupool-<resource, / as _>.sock")
    // kubelet's pod-resources socket; "": do without (the oldest waiting pod is taken).
    std::string pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock";
    int slots_per_gpu = 110;  // pods that may share one GPU, as kubelet counts them
    std::chrono::milliseconds find_wait{10000};  // Allocate waits this long for the pod to be seen
    std::chrono::milliseconds check_interval{1000};  // socket and registration checked this often
    GrantOptions grant;
    // Real GPUs with --mps-pipe-root: the node's MPS control daemons (shared by the plugins), one
    // per GPU, started before Allocate answers an `mps` pod (grant.mps_daemons) and quit by
    // kube-node once no pod uses them (MpsUsers). Null: mps pods get the variables alone.
    MpsDaemons* mps = nullptr;
  };
  using PodsFn = std::function<std::vector<nlohmann::json>()>;  // the node's pods now
  using InventoryFn = std::function<Inventory()>;               // the GPUs and their health now

  DevicePlugin(Options options, PodsFn pods, InventoryFn inventory);
  ~DevicePlugin();
  DevicePlugin(const DevicePlugin&) = delete;
  DevicePlugin& operator=(const DevicePlugin&) = delete;

  // Serves on the socket and registers, on a thread that keeps both up. Errors: the options.
  Status Start();
  void Stop();
  // The inventory's health changed: ListAndWatch streams send the devices again.
  void Notify();

  bool registered() const { return registered_.load(); }
  uint64_t registrations() const { return registrations_.load(); }
  uint64_t allocations() const { return allocations_.load(); }
  uint64_t allocate_failures() const { return allocate_failures_.load(); }
  std::string last_error() const;
  // UIDs of the pods Allocate has answered (kubelet admitted them).
  std::set<std::string> AdmittedPods() const;
  const std::string& resource() const { return options_.resource; }
  std::string socket_path() const { return options_.plugin_dir + "/" + options_.socket_name; }

  // The devices as ListAndWatch sends them: (ID, healthy, NUMA node).
  struct Slot {
    std::string id;
    bool healthy = true;
    int numa = -1;
  };
  std::vector<Slot> Slots() const;
  // Allocate's and GetPreferredAllocation's work, without gRPC (the service calls these).
  Result<ContainerGrant> AllocateOne(const std::vector<std::string>& device_ids);
  std::vector<std::string> Prefer(const std::vector<std::string>& available,
                                  const std::vector<std::string>& must_include, size_t size);

  class Service;  // the gRPC service (device_plugin.cc)

 private:
  void Run();
  Status Serve();     // (re)starts the gRPC server on a fresh socket
  Status Register();  // kubelet's Registration.Register
  std::optional<std::vector<KubeletPod>> KubeletPods();
  // The container kubelet admits now; with `capacity`, one whose pod's assignment fits beside what
  // this node's other pods hold (CheckNodeCapacity).
  Result<AdmittedContainer> Find(size_t count, std::chrono::milliseconds wait, const Inventory* capacity = nullptr);
  void SetError(const std::string& e);

  Options options_;
  PodsFn pods_;
  InventoryFn inventory_;
  struct Grpc;
  std::unique_ptr<Grpc> grpc_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  mutable std::mutex alloc_mu_;  // Allocate calls one at a time (kubelet admits one pod at a time)
  std::set<std::string> answered_;  // guarded by alloc_mu_: "<uid>/<container>"
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;  // guarded by mu_: bumped by Notify and Stop
  std::string last_error_;   // guarded by mu_
  std::atomic<bool> registered_{false};
  std::atomic<uint64_t> registrations_{0}, allocations_{0}, allocate_failures_{0};
};

// Prometheus text for the plugins: registered, allocations and failed allocations, by resource.
std::string DevicePluginMetrics(const std::vector<std::unique_ptr<DevicePlugin>>& plugins);

}  // namespace gpupool::kube
