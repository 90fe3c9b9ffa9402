// A Kubernetes Node as gpupool sees it: its GPUs, CPU, memory and pod count, whether it takes new
// pods (Ready, not cordoned), its labels and taints; and which nodes a pod may go to (its
// nodeSelector, required node affinity and tolerations). No I/O: Node and Pod JSON in. Every Node
// and Pod is untrusted input (a node's kubelet or daemon writes one, a tenant the other).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/gpu_catalog.h"
#include "model/ledger.h"
#include "model/node.h"

namespace gpupool::kube {

// Node annotation written by `gpupool kube-node`: the node's GPUs as a node spec (the JSON of
// `POST /v1/nodes`, docs/api.md): models, memory, UUIDs, health, MIG mode, NVLink topology.
inline constexpr char kInventoryKey[] = "gpupool.io/inventory";
// Labels of NVIDIA's GPU feature discovery, read when a node has no inventory annotation.
inline constexpr char kGpuProductLabel[] = "nvidia.com/gpu.product";  // "NVIDIA-A100-SXM4-80GB"
inline constexpr char kGpuMemoryLabel[] = "nvidia.com/gpu.memory";    // MiB per GPU: "81920"
// Pod annotation written with the binding: what gpupool gave the pod (AssignmentJson).
inline constexpr char kAssignmentKey[] = "gpupool.io/assignment";

struct Taint {
  std::string key, value, effect;  // effect: NoSchedule or NoExecute (PreferNoSchedule is not kept)
  bool operator==(const Taint&) const = default;
};

struct KubeNode {
  NodeSpec spec;        // name, CPU, memory and pods from status.allocatable; GPUs as above
  bool ready = false;   // the Ready condition is True
  bool cordoned = false;  // spec.unschedulable
  std::map<std::string, std::string> labels;
  std::vector<Taint> taints;
  std::string gpu_source;  // "inventory", "labels" or "" (no GPUs)
  // The MIG layouts the inventory annotation reports (api/mig_report.h): (GPU index, instances).
  std::vector<std::pair<int, std::vector<MigInstance>>> mig_present;
};

// Errors are InvalidArgument "node <name>: <field>: <reason>". A node whose inventory annotation is
// unreadable is an error (not a node without GPUs): the caller keeps it out of placement.
Result<KubeNode> ParseKubeNode(const nlohmann::json& node, const GpuCatalog& catalog);

// Where a pod may go, beyond resources: spec.nodeSelector, spec.affinity.nodeAffinity's required
// terms, and spec.tolerations against NoSchedule/NoExecute taints. Pod affinity and anti-affinity
// are not honoured yet: a pod that asks for them is refused (naming the field)
// rather than placed against its wishes.
class NodeConstraints {
 public:
  static Result<NodeConstraints> FromPod(const nlohmann::json& pod);
  bool Allows(const KubeNode& node) const;
  // The constraints as text: pods with the same key go to the same nodes (a cache key).
  const std::string& key() const { return key_; }
  bool empty() const { return key_.empty(); }

 private:
  struct Requirement {
    std::string key, op;  // In, NotIn, Exists, DoesNotExist, Gt, Lt
    std::vector<std::string> values;
  };
  struct Toleration {
    std::string key, op, value, effect;  // op: Equal or Exists; empty key with Exists: every taint
  };
  std::map<std::string, std::string> selector_;
  std::vector<std::vector<Requirement>> terms_;  // any term, every requirement of it
  std::vector<Toleration> tolerations_;
  std::string key_;
};

// The assignment annotation: {"podUID", "node", "cpu", "memory", "gpus": [{"index", "uuid",
// "share", "memory", "mig"?}], "shareTask"} (the placement JSON of docs/api.md plus the pod's UID,
// so a node never acts on an assignment copied onto another pod).
nlohmann::json AssignmentJson(const std::string& pod_uid, const Placement& placement, const Ledger& ledger);
// The assignment's JSON (≤ 64 KiB, ≤ 8 levels), when it is made out to this pod UID on this node;
// errors otherwise (an assignment copied onto another pod is refused). The scheduler and the node
// daemon both read it through this.
Result<nlohmann::json> ReadAssignment(const std::string& text, const std::string& pod_uid, const std::string& node);
// The placement an assignment gives, when it is for this pod UID on this node; errors otherwise.
Result<Placement> ParseAssignment(const std::string& text, const std::string& pod_uid, const std::string& node,
                                  const Ledger& ledger);

}  // namespace gpupool::kube
