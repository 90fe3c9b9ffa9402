// What a pod asks of gpupool, read from the Pod object (docs/kubernetes.md#pod-requests): its GPUs
// (whole, a fraction with memory, a MIG instance), models and interconnect, CPU and memory, and
// the queue, tenant, priority, QoS, isolation and gang it belongs to. No I/O: a Pod's JSON in, a
// request or an error naming the field out. Every pod is untrusted input (a tenant writes it).
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/workload.h"

namespace gpupool::kube {

// Resource names and annotation keys.
inline constexpr char kGpuResource[] = "gpupool.io/gpu";
inline constexpr char kNvidiaGpuResource[] = "nvidia.com/gpu";
inline constexpr char kGpuMilliKey[] = "gpupool.io/gpu-milli";
inline constexpr char kGpuMemoryKey[] = "gpupool.io/gpu-memory";
inline constexpr char kMigKey[] = "gpupool.io/mig";                // annotation: "3g.40gb"
inline constexpr char kNvidiaMigPrefix[] = "nvidia.com/mig-";      // resource: nvidia.com/mig-3g.40gb: 1
inline constexpr char kGpuModelsKey[] = "gpupool.io/gpu-models";   // "A100-80GB,H100-80GB"
inline constexpr char kInterconnectKey[] = "gpupool.io/interconnect";  // "nvlink"
inline constexpr char kQueueKey[] = "gpupool.io/queue";
inline constexpr char kTenantKey[] = "gpupool.io/tenant";
inline constexpr char kPriorityKey[] = "gpupool.io/priority";
inline constexpr char kQosKey[] = "gpupool.io/qos";
inline constexpr char kIsolationKey[] = "gpupool.io/isolation";
inline constexpr char kGangKey[] = "gpupool.io/gang";
inline constexpr char kGangMinKey[] = "gpupool.io/gang-min";

struct PodRequest {
  std::string uid, namespace_name, name;
  std::string scheduler_name;  // spec.schedulerName
  std::string node_name;       // spec.nodeName: bound already when set
  TaskRequest request;
  QosClass qos = QosClass::kBurstable;
  IsolationMode isolation = IsolationMode::kExclusive;
  std::string queue = "default";
  std::string tenant;         // the pod's namespace, or what gpupool.io/tenant names (BindTenant decides)
  std::string named_tenant;   // what gpupool.io/tenant names ("" when it is absent)
  int priority = 0;
  std::string gang;    // empty: the pod alone
  int gang_min = 0;    // gang only: members that must fit together (0: every member seen)
};

// Errors are InvalidArgument "<namespace>/<name>: <field>: <reason>".
Result<PodRequest> ParsePodRequest(const nlohmann::json& pod);

// The tenant a pod belongs to is its namespace's: `namespace_tenants[namespace]` (the config's
// tenants.<name>.namespaces), else the namespace's own name. A namespace is the boundary Kubernetes'
// RBAC draws around who may create pods, so a pod cannot step over it by naming another tenant in
// gpupool.io/tenant: InvalidArgument when it names any but its own. Sets `r.tenant`.
Status BindTenant(PodRequest& r, const std::map<std::string, std::string>& namespace_tenants);

}  // namespace gpupool::kube
