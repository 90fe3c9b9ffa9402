// "Who goes next": the order in which pending jobs are offered to placement, with queue quotas
// (guarantee, limit, weight) and fairness across tenants. "Where it goes" (nodes, GPUs) is the
// pipeline's business (sched/scheduler.h); this file never looks at nodes, and the pipeline never
// looks at queues. Mesos keeps its sorter apart from its allocator for the same reason.
//
// Everything here is plain computation: no I/O, no threads, no clock, no globals. A QueueOrder is
// immutable after Create and may be shared by threads; a Pass is not thread-safe (one owner).
//
// Arithmetic is integer only. Shares are exact fractions compared by cross-multiplication in
// 128 bits (or, for operands that do not fit, by an exact continued-fraction comparison), so two
// equal shares compare equal on every machine and ties always fall to the documented tie-breaker.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/workload.h"

namespace gpupool {

// A resource vector: milli-CPU, MiB of host memory, milli-GPU. Arithmetic is unchecked: values are
// far below 2^63 in practice (the QueueOrder saturates its own running sums).
struct Resources {
  int64_t cpu = 0;     // milli-CPU
  int64_t memory = 0;  // MiB
  int64_t gpu = 0;     // milli-GPU (1000 = one whole GPU)

  Resources& operator+=(const Resources& o) {
    cpu += o.cpu;
    memory += o.memory;
    gpu += o.gpu;
    return *this;
  }
  Resources& operator-=(const Resources& o) {
    cpu -= o.cpu;
    memory -= o.memory;
    gpu -= o.gpu;
    return *this;
  }
  friend Resources operator+(Resources a, const Resources& b) { return a += b; }
  friend Resources operator-(Resources a, const Resources& b) { return a -= b; }
  bool operator==(const Resources&) const = default;

  // Componentwise <=.
  bool AllLE(const Resources& o) const { return cpu <= o.cpu && memory <= o.memory && gpu <= o.gpu; }
  bool IsZero() const { return cpu == 0 && memory == 0 && gpu == 0; }
};

// A limit component with this value does not limit.
inline constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max();

// What a whole job asks for: the sum over every task of every group (replicas included) of CPU,
// memory and GPU share (gpu_count * gpu_share). A gang with min_available < task count still
// counts all its tasks: quotas are charged for the job as submitted.
// A MIG task counts 1000 milli-GPU (one whole GPU) per instance, whatever its profile: the
// workload model carries no slice counts per GPU model, and charging the whole GPU never
// understates what a MIG-mode GPU takes away from non-MIG work.
Resources JobDemand(const Job& job);

// "cpu=2 mem=8Gi gpu=0.25"; a kUnlimited component prints as "unlimited".
std::string FormatResources(const Resources& r);

struct QueueSpec {
  std::string name;                                     // unique, non-empty
  std::string parent;                                   // "" = a child of the (implicit) root
  int64_t weight_milli = 1000;                          // > 0; 1000 = weight 1
  Resources guaranteed;                                 // what the queue may always reclaim (0 = nothing)
  Resources limit{kUnlimited, kUnlimited, kUnlimited};  // never more than this (per component)

  // Admission rules, checked when a job is submitted (the ordering never reads them). A rule of
  // the queue or of any of its ancestors applies to every job submitted to the queue.
  std::vector<std::string> tenants;  // who may submit; empty: any tenant
  std::optional<int> max_priority;   // the highest priority a job may ask for
  std::vector<QosClass> allowed_qos; // empty: any QoS class
  // Caps on this queue's pending jobs and their tasks (0: no cap of the queue's own).
  int64_t max_pending_jobs = 0;
  int64_t max_pending_tasks = 0;
};

enum class OrderingPolicy { kFifo, kPriority, kDrf, kHierarchical };
// "fifo", "priority", "drf", "hierarchical".
std::string_view OrderingPolicyName(OrderingPolicy policy);
Result<OrderingPolicy> ParseOrderingPolicy(std::string_view name);

// A job waiting to run. `queue` "" means "default" (here and in UsageEntry, RunningEntry).
struct PendingEntry {
  uint64_t seq = 0;  // submission order; unique
  std::string tenant;
  std::string queue;
  int priority = 0;  // higher goes first
  Resources demand;  // JobDemand(job)
};

// What running work holds now, per (tenant, queue). Several entries for the same pair add up.
// A queue that does not exist (deleted while its jobs run) still counts for the tenant.
struct UsageEntry {
  std::string tenant;
  std::string queue;
  Resources used;
};

struct QueueOrderOptions {
  OrderingPolicy policy = OrderingPolicy::kHierarchical;
  std::vector<QueueSpec> queues;
  std::map<std::string, int64_t> tenant_weight_milli;  // DRF across tenants; absent tenant = 1000
};

// The queue tree and the ordering policy.
//
// Rules common to every policy:
//  - Limits. A job is never offered when its demand, added to what its queue (or any ancestor)
//    uses now plus what this pass placed there, would exceed that queue's limit on any component.
//    A queue's usage is the sum over its whole subtree. A child's limit may exceed its parent's;
//    the parent's still applies.
//  - A job whose queue does not exist is never offered (Admit rejects it at submit time).
//  - Negative components of usage, demand or cluster total are read as zero.
//  - Every tie ends in seq, then the job's index: the order is a pure function of the inputs.
//
// Policies:
//  - kFifo: by seq.
//  - kPriority: priority descending, then seq.
//  - kDrf (dominant resource fairness across tenants): the tenant with the lowest weighted
//    dominant share among those that still have an offerable job goes next (ties: tenant name);
//    within a tenant, priority descending, then seq. Dominant share = max over cpu, memory, gpu of
//    used / cluster_total, skipping components whose total is 0; weighted = share * 1000 /
//    weight_milli. Placed() raises the tenant's share, so a pass interleaves tenants.
//  - kHierarchical: walks from the root. Among the children that still have an offerable job
//    below them, first those under their guarantee, lowest guarantee ratio first; then the others,
//    lowest weighted dominant share first (of the whole subtree's usage over the cluster total);
//    ties by queue name. At a leaf: priority descending, then seq. Here
//      guarantee ratio = max over components with guaranteed > 0 of used / guaranteed, and
//      "under guarantee" = guaranteed is non-zero and the guarantee ratio is < 1 (every
//      guaranteed component strictly below its guarantee). Components without a guarantee are
//      ignored, so a queue guaranteed GPUs does not lose that by using CPU. A queue just under
//      its guarantee may go over it with the job it is offered.
//    Jobs may sit on an inner queue (one with child queues). They compete with its children as an
//    implicit leaf child named "" (so it wins ties), weight 1000, no guarantee, whose usage is what
//    is recorded on the inner queue itself.
class QueueOrder {
 public:
  // Validates: names non-empty and unique, parents exist, no cycles, weights > 0, guaranteed and
  // limit non-negative, guaranteed <= limit per component, tenant weights > 0. The error
  // (InvalidArgument) names the queue and the field. When no queue is named "default", one is
  // added under the root with weight 1000, no guarantee and no limit (options() shows it).
  static Result<QueueOrder> Create(QueueOrderOptions options);

  const QueueOrderOptions& options() const;
  bool HasQueue(const std::string& name) const;               // "" reads as "default"
  const QueueSpec* FindQueue(const std::string& name) const;  // nullptr when absent
  // The queue and its ancestors, the queue first, the top-level queue last; empty when absent.
  std::vector<std::string> Ancestry(const std::string& name) const;

  // Admission at submit time. NotFound when the queue does not exist. ResourceExhausted, naming
  // the queue and the resource, when `demand` alone exceeds the limit of the job's queue or of
  // any ancestor: such a job could never run.
  Status Admit(const std::string& queue, const Resources& demand) const;

  // One scheduling pass over the pending jobs. The order is computed incrementally: per-group
  // sorted lists and ordered sets of groups, updated on Placed(), not a full re-sort per Next().
  // A pass does not keep references to the vectors it was built from, and stays valid after the
  // QueueOrder that began it is destroyed.
  class Pass {
   public:
    Pass(Pass&&) noexcept;
    Pass& operator=(Pass&&) noexcept;
    ~Pass();

    // The index into `pending` of the next job to try; nullopt when none is left that may go.
    // Until that job is Placed() or Skipped() (or the pass otherwise changes), Next() returns it
    // again.
    std::optional<size_t> Next();
    // The job was placed: its demand is added to its tenant's and its queues' usage, and it is not
    // offered again. Any index of `pending` may be passed, once: a job the pass dropped (skipped,
    // over a limit) that the caller places anyway still counts. Repeats and out-of-range indices
    // are ignored.
    void Placed(size_t i);
    // The job did not fit: it is not offered again in this pass. Usage does not change.
    void Skipped(size_t i);

   private:
    friend class QueueOrder;
    struct State;
    explicit Pass(std::unique_ptr<State> state);
    std::unique_ptr<State> state_;
  };
  Pass Begin(const std::vector<PendingEntry>& pending, const std::vector<UsageEntry>& usage,
             Resources cluster_total) const;

  // For metrics and tests, in parts per million (floor): the weighted dominant share of a queue
  // (its whole subtree's usage over the cluster total, * 1000 / weight_milli) and of a tenant
  // (* 1000 / its tenant weight). An unknown queue has share 0.
  int64_t QueueSharePpm(const std::string& queue, const std::vector<UsageEntry>& usage,
                        const Resources& cluster_total) const;
  int64_t TenantSharePpm(const std::string& tenant, const std::vector<UsageEntry>& usage,
                         const Resources& cluster_total) const;
  // Usage per existing queue, each the sum over its subtree (negative components read as zero).
  // Every queue appears, with zero when nothing runs there.
  std::map<std::string, Resources> QueueUsage(const std::vector<UsageEntry>& usage) const;

  // The queue's guarantee ratio in ppm (floor) given its subtree usage: max over components with
  // guaranteed > 0 of used / guaranteed. 0 when the queue guarantees nothing or does not exist.
  int64_t GuaranteeRatioPpm(const std::string& queue, const std::vector<UsageEntry>& usage) const;

  struct Tree;  // the validated queue tree (internal, shared with passes)

 private:
  explicit QueueOrder(std::shared_ptr<const Tree> tree);
  std::shared_ptr<const Tree> tree_;
};

}  // namespace gpupool
