// The device plugin's question, answered without I/O: kubelet asks `Allocate` for N device IDs of
// `gpupool.io/gpu` and never says for which pod (docs/kubernetes.md#the-device-plugin). gpupool's
// answer is keyed by pod UID: the pod is one that gpupool's scheduler bound to this node with an
// assignment annotation made out to that very UID, and of those, the one kubelet is admitting now —
// the pod kubelet's pod-resources API lists whose container has no devices of the resource yet,
// (kubelet admits one pod at a time, adding it to its pod list just before) — and then what the
// container gets: the assignment's GPUs as the agent's task environment gives them
// (CUDA_VISIBLE_DEVICES, MPS limits, framework limits), their device nodes or CDI names.
//
// The advertised devices are slots: "<GPU UUID>::<n>", n < slots per GPU, for every GPU. Which slots
// kubelet takes does not matter for what the container sees (the assignment decides); how many it
// takes is the container's request. GetPreferredAllocation steers kubelet to slots of the assigned
// GPUs, so that pod-resources (and what reads it, dcgm-exporter's pod labels) names the right GPUs.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/inventory.h"
#include "agent/task_env.h"
#include "common/status.h"

namespace gpupool::kube {

// A slot's device ID, and the GPU UUID of one ("" when `id` is not a slot ID).
std::string SlotId(const std::string& gpu_uuid, int slot);
std::string SlotGpu(std::string_view id);

// A pod as kubelet's pod-resources List gives it: device IDs per container and resource.
struct KubeletPod {
  std::string namespace_name, name;
  std::map<std::string, std::map<std::string, std::vector<std::string>>> devices;  // container -> resource -> IDs
};

// The container kubelet is allocating for, and what gpupool gave its pod.
struct AdmittedContainer {
  std::string uid, namespace_name, name, container;
  int64_t requested = 0;       // devices of the resource the container asks for
  Assignment assignment;       // the pod's GPUs (this container's part of them), as the agent reads one
  std::vector<AssignedGpu> pod_gpus;  // all the pod's GPUs, as its assignment names them
};

// Reads the assignment annotation on the node side (no ledger here): the GPUs by index with UUID,
// share, memory and MIG instance. Errors name what is wrong, including an assignment made out to
// another pod UID or node (one copied onto another pod is refused).
Result<std::vector<AssignedGpu>> ParseNodeAssignment(const std::string& text, const std::string& pod_uid,
                                                     const std::string& node);

struct AdmissionQuery {
  std::string node;
  std::string resource;   // "gpupool.io/gpu"
  size_t count = 0;       // device IDs kubelet is allocating
  std::set<std::string> answered;  // "<pod uid>/<container>" the plugin has answered already
  // kubelet's pods (pod-resources List); nullopt when kubelet's API cannot be read, and the pod is
  // then the oldest (creationTimestamp, then namespace/name: kubelet's admission order) of those waiting.
  std::optional<std::vector<KubeletPod>> kubelet;
};

// `pods` are this node's pods (the node daemon's informer). NotFound, saying what each pod near it
// lacks, when no pod waits for exactly `count` devices; the caller waits for its informer then.
Result<AdmittedContainer> FindAdmittedContainer(const std::vector<nlohmann::json>& pods, const AdmissionQuery& q);

// Defence in depth against an assignment a tenant wrote rather than gpupool's scheduler (the
// admission policy in deploy/kubernetes keeps tenants from writing one; a cluster without it must not
// be overcommitted either): what `c`'s pod takes, added to what the assignments of this node's other
// live pods (`pods`: bound here, not Succeeded or Failed) hold, stays within every GPU — at most
// 1000 milli-GPU, at most the GPU's memory, a MIG instance to one pod, a GPU of the UUID the node
// has, MIG instances only on a MIG GPU and shares only on a whole one. FailedPrecondition naming
// the GPU and a pod already holding it when not: kubelet then refuses the pod being admitted and
// the pods that run keep what they have.
Status CheckNodeCapacity(const std::vector<nlohmann::json>& pods, const AdmittedContainer& c, const Inventory& inv,
                         const std::string& node);

// The MPS control daemons this node's pods need (docs/kubernetes.md#mps): GPU UUID -> the UIDs of
// the pods that use it — pods bound here with an `mps` isolation and a readable assignment, not
// Succeeded or Failed, that kubelet has admitted (their UID in `admitted`: Allocate answered them)
// or that run. A daemon with no user left is quit; a user whose daemon died gets it started again.
std::map<std::string, std::set<std::string>> MpsUsers(const std::vector<nlohmann::json>& pods, const std::string& node,
                                                      const Inventory& inv, const std::set<std::string>& admitted);

// What one container gets.
struct ContainerGrant {
  std::map<std::string, std::string> env;
  struct Device {
    std::string path, permissions;
    bool operator==(const Device&) const = default;
  };
  std::vector<Device> devices;  // device nodes (real GPUs, without CDI)
  struct Mount {
    std::string container_path, host_path;
    bool read_only = false;
    bool operator==(const Mount&) const = default;
  };
  std::vector<Mount> mounts;  // the MPS pipe directory of an mps pod
  std::vector<std::string> cdi_devices;  // "<kind>=<UUID>" (MIG: the instance UUID)
};

struct GrantOptions {
  std::string node;
  std::string mps_pipe_root;  // as the agent's (TaskEnvOptions)
  bool mps_daemons = false;
  std::string cdi_kind;  // "nvidia.com/gpu": name devices through CDI; "": device nodes
  std::vector<std::string> control_devices;  // /dev/nvidiactl, /dev/nvidia-uvm, ... (real GPUs)
  std::string mig_minors;  // the text of /proc/driver/nvidia-caps/mig-minors (real MIG GPUs)
};

// The environment (the agent's TaskEnvironment, less what describes a gpupool job rather than a
// pod's GPUs), device nodes or CDI names, and mounts for `c` on this node. Errors name the GPU that
// does not match the node (a UUID the node does not have, a MIG instance that does not exist).
Result<ContainerGrant> GrantFor(const AdmittedContainer& c, const Inventory& inv, const GrantOptions& options);

// GetPreferredAllocation: `size` IDs of `available` including `must_include`, slots of the GPUs in
// `prefer` first (round robin over them), then any.
std::vector<std::string> PreferredSlots(const std::vector<std::string>& available,
                                        const std::vector<std::string>& must_include, size_t size,
                                        const std::vector<std::string>& prefer);

}  // namespace gpupool::kube
