// What `gpupool kube-scheduler` knows of a cluster, and its scheduling cycle. Built from Node and
// Pod events alone (the informers'), so a standby replica rebuilds it from the API with nothing
// else. No I/O, no threads, no clock: events in, decisions out (binds to make, pods to report as
// pending); the daemon (kube_scheduler.cc) does the talking.
//
// Accounting. Every pod bound to a node that has not ended holds what it asked for there, whoever
// scheduled it: gpupool's own pods hold what their assignment annotation says (GPUs by index, the
// share, memory or MIG instance); other pods hold their CPU and memory and, for `nvidia.com/gpu` or
// `gpupool.io/gpu`, that many whole GPUs (the lowest-numbered free ones: which ones is the device
// plugin's choice, how many is what matters). A pod gpupool chose a node for holds it from the
// decision on ("assumed"), before its binding is seen, so the next decision never counts it free.
//
// Placement goes through the same `sched` pipeline (Scheduler) and queue order (QueueOrder) as the
// pool server's: pods are jobs of one task; a gang (`gpupool.io/gang`) is one job whose tasks are
// its pending members, placed all together or not at all.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/rng.h"
#include "common/status.h"
#include "kube/kube_node.h"
#include "kube/pod_request.h"
#include "model/ledger.h"
#include "sched/profile.h"
#include "sched/queueing.h"
#include "sched/scheduler.h"
#include "sched/typical_pods.h"

namespace gpupool::kube {

struct ClusterOptions {
  std::string scheduler_name = "gpupool";  // pods with this spec.schedulerName are gpupool's
  Profile profile;                         // the placement pipeline (ProfileForPolicy("balanced"))
  QueueOrderOptions ordering;              // queues and their order
  int max_pods_per_cycle = 5000;           // decisions per cycle (bound: a cycle stays short)
  // Evict gpupool's best-effort pods (gpupool.io/qos: best-effort) of lower priority, or of queues
  // over their guarantee, for a pod or gang that does not fit otherwise (sched/preemption.h's rules,
  // as the pool server applies them).
  bool preemption = true;
  // namespace -> tenant (the config's tenants.<name>.namespaces); a namespace not here is a tenant
  // of its own name, and a pod naming another tenant is refused (BindTenant).
  std::map<std::string, std::string> namespace_tenants;
};

// One pod to evict (the policy/v1 Eviction subresource) so that a preemptor fits.
struct EvictOrder {
  std::string uid, namespace_name, name;
  std::string message;  // "preempted by ns/p (priority 10 > 0)"
};

// One pod to bind: POST its binding with the assignment annotation.
struct BindOrder {
  std::string uid, namespace_name, name, node;
  std::string assignment;  // the annotation's value
};

// A pod that stays pending, and why (gpupool's per-node reasons, or what is wrong with it).
struct PendingReport {
  std::string uid, namespace_name, name;
  std::string reason;  // "Unschedulable" (does not fit now), "Invalid" (can never be placed as
                       // written), "WaitingForGang" or "Preempting"
  std::string message;
  std::string nominated_node;  // Preempting: the node its victims are leaving (status.nominatedNodeName)
};

struct CycleResult {
  std::vector<BindOrder> binds;
  std::vector<EvictOrder> evictions;
  std::vector<PendingReport> pending;  // every pod that was tried and stays pending
  int decisions = 0;
};

struct ClusterCounts {
  size_t nodes = 0, bad_nodes = 0, pods_charged = 0, pods_assumed = 0, pods_pending = 0;
  size_t pods_unaccounted = 0;  // bound pods whose holdings do not fit their node (overcommitted by others)
  size_t pods_waiting_node = 0;  // bound to a node gpupool does not know (yet)
  // Relearning points (every kLearnEvery new pods, or one per node on larger clusters): the
  // pipeline rebuilt on the recent window's typical workload, or kept because that workload moved
  // less than kWorkloadMinChange.
  uint64_t relearned = 0, relearn_kept = 0;
};

class ClusterState {
 public:
  static Result<std::unique_ptr<ClusterState>> Create(ClusterOptions options, GpuCatalog catalog = GpuCatalog::Builtin());

  // Informer events: type ADDED, MODIFIED or DELETED; the object's newest state.
  void ApplyNode(const std::string& type, const nlohmann::json& node);
  void ApplyPod(const std::string& type, const nlohmann::json& pod);

  // One scheduling cycle over the pending pods. The binds it returns are assumed (held) until
  // BindFailed or the pod's binding is seen.
  CycleResult Cycle();
  // The binding was refused or failed: what the pod held is released, and the pod is pending
  // again; `park`: it is not tried again until Unpark (a back-off the caller times).
  void BindFailed(const std::string& uid, bool park = false);
  void Unpark(const std::string& uid);
  // The eviction was refused (a PodDisruptionBudget, say): the pod is not a victim again until
  // Unprotect (a back-off the caller times), and its preemptor may plan anew without it.
  void EvictFailed(const std::string& uid);
  void Unprotect(const std::string& uid);

  ClusterCounts counts() const;
  const Ledger& ledger() const { return *ledger_; }
  // Every node's bad-inventory message, by name (nodes kept out of placement).
  const std::map<std::string, std::string>& bad_nodes() const { return bad_nodes_; }
  // Pending pods per reason of their last report ("Unschedulable", "Invalid", "WaitingForGang").
  std::map<std::string, size_t> PendingByReason() const;
  // Checks the ledger against a recount and every charged pod against it.
  Status CheckInvariants() const;

 private:
  enum class PodPhase : uint8_t { kPending, kAssumed, kBound };
  struct Pod {
    std::string uid, namespace_name, name;
    PodPhase phase = PodPhase::kPending;
    bool ours = false;
    std::string node;                  // bound or assumed: the node it holds on ("" none)
    std::optional<AllocationId> alloc;  // what it holds in the ledger
    std::optional<Placement> placement;  // to charge again after a rebuild
    nlohmann::json object;  // bound pods not charged yet (node unknown) keep the object to retry
    // Pending pods of ours:
    uint64_t seq = 0;
    Result<PodRequest> request{Status::Internal("unparsed")};
    Result<NodeConstraints> constraints{Status::Internal("unparsed")};
    size_t hash = 0;                       // of what its scheduling depends on
    uint64_t failed_epoch = ~uint64_t{0};  // capacity epoch of its last failure
    std::string last_reason, last_message;  // of its last report
    bool unaccounted = false;  // bound, but what it holds does not fit its node
    bool parked = false;       // pending, but held back after a failed binding
    // Accounting of ours (bound or assumed): their tenant, queue, gang and demand.
    bool counted = false;
    std::string tenant, queue, gang;
    Resources demand;
    int priority = 0;
    QosClass qos = QosClass::kBurstable;
    uint64_t held_seq = 0;  // when it started holding (preemption takes the most recent first)
    bool evicting = false;  // a preemption victim whose eviction is on its way
    bool protected_ = false;  // its eviction was refused: no victim until Unprotect
    // A preemptor: where its victims' GPUs are. Once they are gone the space is reserved for it
    // at the start of each cycle (others cannot take it) until it is placed or preempts anew.
    std::optional<Placement> nominated;
    std::optional<AllocationId> reservation;  // within a cycle only
  };
  // A unit of a cycle: a pod alone, or a gang's pending members.
  struct Unit {
    Pod* single = nullptr;            // a pod alone (no allocation per unit: cycles build 100,000s)
    std::vector<Pod*> gang_members;   // a gang's pending members, in first-seen order
    std::string gang;
    int gang_min = 0;
    std::span<Pod* const> members() const {
      return single != nullptr ? std::span<Pod* const>(&single, 1) : std::span<Pod* const>(gang_members);
    }
  };

  ClusterState(ClusterOptions options, GpuCatalog catalog);
  Status Rebuild();
  Status RebuildScheduler(std::vector<TypicalPod> typical);  // typical: TypicalOfGpuTasks(recent_)
  // A relearning point: RebuildScheduler if the recent window's typical workload moved.
  Status Relearn();
  void Observe(const TaskRequest& task);
  void ApplyHealth(NodeIndex idx, const KubeNode& node);
  void Charge(Pod& pod, const nlohmann::json& object);
  // The pod's request with its tenant bound to its namespace's (BindTenant).
  Result<PodRequest> ReadRequest(const nlohmann::json& pod) const;
  void Hold(Pod& pod, const PodRequest& req);
  void Uncharge(Pod& pod);
  void Unpend(Pod& pod);
  void SetPhase(Pod& pod, PodPhase phase);  // keeps assumed_
  void ForgetPod(const std::string& uid);
  void Report(Pod& pod, const std::string& reason, const std::string& message, CycleResult& out,
              const std::string& nominated_node = "");
  void Reserve();          // the nominated preemptors' space, at a cycle's start
  void ReleaseReserved();  // at its end
  void Unreserve(Pod& pod);
  void Assume(Pod& pod, const PodRequest& req, AllocationId id, const Placement& placement, CycleResult& out);
  Result<Placement> ForeignPlacement(NodeIndex n, const nlohmann::json& object) const;
  Job GangJob(const Unit& u, int held, int priority) const;
  // Plans evictions for a unit that does not fit (cluster_preempt.cc): true when it did (the unit
  // is then reported as waiting for them), or when evictions planned earlier are still on their way.
  size_t VictimsLeft(const std::string& preemptor);  // its victims not gone yet (forgets the gone)
  bool TryPreempt(const Unit& u, int held, const PendingEntry& entry, const NodeMask* mask, CycleResult& out);
  const NodeMask* MaskFor(const NodeConstraints& c);
  Resources ClusterTotal() const;

  ClusterOptions options_;
  GpuCatalog catalog_;
  SeededRng rng_{1};
  std::unique_ptr<Ledger> ledger_;
  std::unique_ptr<Scheduler> scheduler_;
  std::optional<QueueOrder> order_;
  std::vector<TypicalPod> typical_pods_;
  // The recent pending pods' requests (a ring), to learn the typical workload from and to show a
  // rebuilt pipeline again; relearned every kLearnEvery new pods, as the pool server does, or on a
  // cluster of more nodes than that once per node (a rebuild costs a pass over every node per shape).
  static constexpr size_t kRecentTasks = 10000;
  static constexpr uint64_t kLearnEvery = 512;
  std::vector<TaskRequest> recent_;
  size_t recent_next_ = 0;
  uint64_t since_learn_ = 0;
  uint64_t relearned_ = 0, relearn_kept_ = 0;

  std::map<std::string, KubeNode> nodes_;             // good nodes by name
  std::map<std::string, std::string> bad_nodes_;      // name -> why it is kept out
  std::vector<std::string> node_of_index_;            // ledger index -> name
  bool rebuild_ = false;
  uint64_t capacity_epoch_ = 0;  // bumped whenever something is released or a node added/changed
  uint64_t mask_epoch_ = 0;      // bumped when nodes or their labels/taints change
  // A cycle tries the pending pods only when one of them could be placed now: one untried since
  // the capacity last changed (AnyToTry), or something else moved (poked_).
  bool poked_ = true;
  uint64_t quiet_cycles_ = 0;
  bool AnyToTry() const;
  void CapacityChanged();  // ++capacity_epoch_, and poked_
  std::unordered_map<std::string, std::pair<uint64_t, NodeMask>> masks_;

  std::unordered_map<std::string, Pod> pods_;  // by uid
  std::map<std::string, std::set<std::string>> waiting_node_;  // node name -> bound pods not charged
  std::set<uint64_t> pending_;                  // seqs of our pending pods
  std::map<uint64_t, Pod*> pending_pods_;  // seq -> pod (pods_ keeps its values in place; ForgetPod unpends first)
  uint64_t next_seq_ = 1;
  std::map<std::pair<std::string, std::string>, Resources> usage_;  // (tenant, queue) -> held
  std::map<std::string, int> gang_held_;  // namespace/gang -> members bound or assumed
  uint64_t next_held_seq_ = 1;
  std::set<std::string> best_effort_held_;  // uids of our best-effort pods that hold (victim candidates)
  std::set<std::string> nominated_uids_;  // preemptors with a nominated placement (pruned lazily)
  // Preemptor (its first member's uid) -> the victims evicted for it, until they are gone.
  std::map<std::string, std::set<std::string>> preempting_;
  size_t unaccounted_ = 0;
  size_t assumed_ = 0;  // pods in PodPhase::kAssumed
};

}  // namespace gpupool::kube
