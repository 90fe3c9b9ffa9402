// The allocation ledger: the only place that changes free capacity. A placement is committed
// all-or-nothing and never overcommits CPU, memory, GPU share, GPU memory or MIG slices;
// releasing restores exactly what was taken.
//
// Thread safety: not internally synchronised. One owner (the scheduling loop, the simulator)
// mutates it; concurrent submitters go through that owner.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/quantity.h"
#include "common/status.h"
#include "model/gpu_catalog.h"
#include "model/mig.h"
#include "model/node.h"

namespace gpupool {

using NodeIndex = uint32_t;
using AllocationId = uint64_t;
using ModelId = uint16_t;

// Dynamic state of one GPU.
// The GPU memory a share of a GPU reserves when its task names none: the share's part of the GPU's
// memory, rounded down, so that shares that fit a GPU always fit its memory too (rounded up, shares
// adding up to the whole GPU could ask a MiB more than it has).
constexpr int64_t ShareMemory(int64_t share_milli, int64_t gpu_memory_mib) {
  return share_milli * gpu_memory_mib / 1000;
}
// What a grant of `share_milli` on a GPU of `gpu_memory_mib` reserves: the memory asked for, or
// without one, the share's part (ShareMemory).
constexpr int64_t GrantMemory(int64_t share_milli, int64_t asked_mib, int64_t gpu_memory_mib) {
  return asked_mib > 0 ? asked_mib : ShareMemory(share_milli, gpu_memory_mib);
}

struct GpuState {
  int32_t free_share = 1000;  // milli-GPU
  int32_t tasks = 0;
  int64_t free_memory = 0;  // MiB
  int64_t memory = 0;       // MiB, all of it (the spec's)
  // Shares (grants of less than the whole GPU) held for guaranteed tasks, and shares nothing holds
  // to their size (Placement::enforced false): a GPU never has one of each from different tasks
  // (QosAllows). At most 1,000 each (a share is at least 1 milli-GPU); 16 bits keep the struct at
  // the size it had before, which the node walks feel.
  int16_t guaranteed_shares = 0;
  int16_t unlimited_shares = 0;
  // MPS shares (Placement::mps_owner) here, and their owner (an id the ledger interned; meaningful
  // while mps_shares > 0): the GPU's MPS server runs for one owner at a time (MpsAllows).
  int16_t mps_shares = 0;
  bool healthy = true;
  bool mig_enabled = false;
  uint32_t mps_owner = 0;
  MigLayout mig;
  // Usable for new placements: healthy, and its node schedulable.
  bool usable() const { return healthy; }
};

// Whether a share of a task that is (not) `guaranteed` and (not) `enforced` may join GPU `g`: a
// guaranteed share shares a GPU only with shares held to their size (docs/jobspec.md#qos), so neither
// joins a GPU that holds the other kind.
constexpr bool QosAllows(const GpuState& g, bool guaranteed, bool enforced) {
  return !(guaranteed && g.unlimited_shares > 0) && !(!enforced && g.guaranteed_shares > 0);
}

// Whether an MPS share of the owner with interned id `owner` (0: one the ledger has not seen, so no
// GPU holds its shares) may join GPU `g`: only where no MPS share of another owner is. The GPU's MPS
// control daemon runs one server at a time, for one uid, and a client of another uid waits until
// that server exits; and a fatal fault in a client tears down every client of its server.
constexpr bool MpsAllows(const GpuState& g, uint32_t owner) {
  return g.mps_shares == 0 || g.mps_owner == owner;
}

// Dynamic state of one node. Fields the placement policies read are kept up to date
// incrementally, so a score never has to walk the allocations.
struct NodeState {
  // Hot fields first: the filters and caches read these for every node of every decision, so
  // they share one cache line; the vectors come last.
  int64_t free_cpu = 0;     // mCPU
  int64_t free_memory = 0;  // MiB
  // Bumped on every change to this node; caches keyed by it stay valid while it is unchanged.
  uint64_t generation = 0;
  int64_t free_gpu_share = 0;  // Σ free_share over healthy, non-MIG GPUs
  int32_t tasks = 0;
  int32_t max_tasks = 0;        // copy of the spec's limit (0: none), so filters stay in this struct
  int32_t fully_free_gpus = 0;  // healthy, non-MIG GPUs with free_share == 1000
  int32_t usable_gpus = 0;      // healthy, non-MIG GPUs
  int32_t max_free_share = 0;   // largest free_share among them (0 when none)
  ModelId model = 0;            // interned GPU model of the node (see Ledger::model_name)
  bool healthy = true;
  bool cordoned = false;
  // The usable GPUs (healthy, non-MIG) in GPU order, kept beside the summary for scores that walk
  // a node's GPUs (FGD's free-share lists): their free shares and their indices in `gpus`. Filled
  // for nodes of up to kCompactGpus GPUs (compact()); past that, readers walk `gpus`.
  static constexpr size_t kCompactGpus = 16;
  std::array<int16_t, kCompactGpus> usable_free{};
  std::array<uint8_t, kCompactGpus> usable_index{};
  // Usable GPUs whose free memory is less than their free share's part of it (tasks that named
  // their GPU memory took more than their share's): only on these can memory, not share, refuse a
  // task that names no memory (ShareMemory). 0 on a node of share-only tasks.
  int32_t memory_short_gpus = 0;
  // Usable GPUs holding a guaranteed share: only on these can QoS, not capacity, refuse a task that
  // is not guaranteed itself. And what holds shares to their size here (kEnforce* bits, from the
  // spec's labels).
  int32_t guaranteed_gpus = 0;
  uint8_t enforces = 0;
  // Usable GPUs holding MPS shares: only on these can an MPS share be refused for its owner.
  int32_t mps_gpus = 0;
  // GpuClustering's tags of the GPU tasks on the node: share tasks, and tasks by GPU count.
  int32_t share_tasks = 0;
  std::vector<int32_t> tasks_by_gpu_count;  // index k: tasks using k GPUs (k >= 1, not share)
  std::vector<GpuState> gpus;

  bool schedulable() const { return healthy && !cordoned; }
  bool compact() const { return gpus.size() <= kCompactGpus; }
};

struct GpuGrant {
  int gpu = 0;
  MilliGpu share{0};
  MiB memory{0};
  std::optional<MigInstance> mig;
  bool operator==(const GpuGrant&) const = default;
};

// Everything one task takes on one node.
struct Placement {
  NodeIndex node = 0;
  MilliCpu cpu{0};
  MiB memory{0};
  std::vector<GpuGrant> gpus;
  // True for a share task (one GPU, less than all of it) — GpuClustering's "share" tag.
  bool share_task = false;
  // For its grants of less than a whole GPU: the task is QoS guaranteed; something on the node
  // holds it to its share (its TaskRequest::enforced_by is among the node's `enforces`).
  bool guaranteed = false;
  bool enforced = false;
  // An MPS share's owner (TaskRequest::mps_owner): its grants of less than a whole GPU join only
  // GPUs without MPS shares of another owner (MpsAllows). nullopt: not an MPS share.
  std::optional<std::string> mps_owner;
  bool operator==(const Placement&) const = default;
};

class Ledger {
 public:
  explicit Ledger(GpuCatalog catalog = GpuCatalog::Builtin());
  // Copying would leave node_model_spec_ pointing into the source's catalog.
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;
  Ledger(Ledger&&) = default;
  Ledger& operator=(Ledger&&) = default;

  // Adds a node; validates the spec. Names are unique.
  Result<NodeIndex> AddNode(NodeSpec spec);

  size_t node_count() const { return specs_.size(); }
  const NodeSpec& spec(NodeIndex n) const { return specs_[n]; }
  const NodeState& state(NodeIndex n) const { return states_[n]; }
  const std::vector<NodeState>& states() const { return states_; }
  std::optional<NodeIndex> FindNode(const std::string& name) const;
  const GpuCatalog& catalog() const { return catalog_; }

  // Interned GPU models (ModelId -> name). Id 0 is "" (a node without GPUs).
  const std::string& model_name(ModelId id) const { return model_names_[id]; }
  std::optional<ModelId> FindModel(const std::string& name) const;
  size_t model_count() const { return model_names_.size(); }

  // Commits a placement or changes nothing. Fails with InvalidArgument for a malformed placement
  // (unknown node or GPU, negative amounts, a GPU twice) and ResourceExhausted when it does not
  // fit (names the resource).
  Result<AllocationId> Commit(const Placement& placement);
  // Returns exactly what the allocation took. NotFound for an unknown id.
  Status Release(AllocationId id);
  const Placement* Find(AllocationId id) const;
  size_t allocation_count() const { return allocations_.size(); }
  const std::unordered_map<AllocationId, Placement>& allocations() const { return allocations_; }

  // Health and cordon. An unhealthy GPU keeps its allocations but takes no new ones.
  Status SetCordoned(NodeIndex node, bool cordoned);
  Status SetNodeHealthy(NodeIndex node, bool healthy);
  Status SetGpuHealthy(NodeIndex node, int gpu, bool healthy);
  // Turns MIG mode on or off. Fails when the model is not MIG-capable or the GPU is in use.
  Status SetMigEnabled(NodeIndex node, int gpu, bool enabled);

  // The MIG instances that exist on a MIG-enabled GPU, as its agent last reported them (at
  // registration and in heartbeats), whether or not a task uses them: what placement prefers, so
  // that a layout changes only when no instance there fits (sched/mig_planner.h). Not capacity: what
  // tasks hold is GpuState::mig. Fails, changing nothing, for a GPU not in MIG mode or an invalid
  // layout (MigLayoutOf); nullopt forgets the report.
  Status SetMigPresent(NodeIndex node, int gpu, std::optional<std::vector<MigInstance>> instances);
  // What SetMigPresent would say of `instances`, without changing anything.
  Status CheckMigPresent(NodeIndex node, int gpu, const std::vector<MigInstance>& instances) const;
  // The reported layout; nullptr when none was reported (the scheduler then knows of no instance).
  const MigLayout* mig_present(NodeIndex node, int gpu) const;

  // Totals over the non-MIG GPUs of all nodes (what the traces' metrics count).
  int64_t total_gpu_share() const { return total_gpu_share_; }
  int64_t used_gpu_share() const { return used_gpu_share_; }
  int total_gpus() const { return total_gpus_; }
  // Usable GPUs holding a guaranteed share, over all nodes: while 0, QoS refuses no task that is not
  // guaranteed itself anywhere (the qos-isolation filter then skips the walk over the nodes).
  int64_t guaranteed_gpus() const { return guaranteed_gpus_; }
  // Usable GPUs holding MPS shares, over all nodes: while 0, no MPS share is refused for its owner.
  int64_t mps_gpus() const { return mps_gpus_; }
  // The interned id of an MPS owner some placement named (ids from 1, never reused); nullopt when
  // none ever did, which no GPU's MPS shares can then belong to.
  std::optional<uint32_t> FindMpsOwner(const std::string& owner) const;
  const std::string& mps_owner_name(uint32_t id) const { return mps_owner_names_[id]; }

  // Recomputes every free amount and counter from the node specs and the live allocations and
  // compares with the incremental state; also checks no amount is negative or above capacity.
  Status CheckInvariants() const;

  // The nodes whose state changed, in order: every change that grows a node's generation appends
  // the node, so a reader that keeps a position learns which nodes changed since it last looked
  // (the scheduler's per-shape best-node index) without a pass over every node. Positions count
  // from the ledger's creation; entries before change_log_begin() are dropped as the log grows
  // (a reader that fell behind them must look at every node again).
  uint64_t change_log_begin() const { return log_base_; }
  uint64_t change_log_end() const { return log_base_ + log_.size(); }
  NodeIndex changed_node(uint64_t position) const { return log_[position - log_base_]; }

 private:
  void Changed(NodeIndex node);  // ++generation and a log entry
  const MigGeometry* GeometryOf(NodeIndex node) const;
  Status CheckFits(const Placement& p) const;
  void Apply(const Placement& p, int sign);
  ModelId InternModel(const std::string& name);
  uint32_t InternMpsOwner(const std::string& owner);
  void RecountNode(NodeState& s) const;
  void Recount(NodeState& s);  // RecountNode, keeping guaranteed_gpus_ and mps_gpus_ in step

  GpuCatalog catalog_;
  std::vector<NodeSpec> specs_;
  std::vector<NodeState> states_;
  std::vector<const GpuModelSpec*> node_model_spec_;  // per node; nullptr when not in the catalog
  // Per node, per GPU: the reported MIG layout (SetMigPresent). Beside the states, not in GpuState,
  // which the node walks keep small.
  std::vector<std::vector<std::optional<MigLayout>>> mig_present_;
  std::unordered_map<std::string, NodeIndex> by_name_;
  std::vector<std::string> model_names_;
  std::vector<std::string> mps_owner_names_;  // by id; [0] is "" (none)
  std::unordered_map<std::string, uint32_t> mps_owner_ids_;
  std::unordered_map<AllocationId, Placement> allocations_;
  AllocationId next_id_ = 1;
  int64_t total_gpu_share_ = 0;
  int64_t used_gpu_share_ = 0;
  int total_gpus_ = 0;
  int64_t guaranteed_gpus_ = 0;
  int64_t mps_gpus_ = 0;
  std::vector<NodeIndex> log_;
  uint64_t log_base_ = 0;
};

}  // namespace gpupool
