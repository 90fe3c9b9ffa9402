// The scheduling pipeline's extension points, after the Kubernetes scheduler framework:
//
//   prepare (pre-filter) -> filter -> score (+ normalise, weighted) -> select node
//     -> select GPUs inside the node -> reserve (ledger commit) -> permit (gang) -> bind
//
// Plugins are registered by name (sched/registry.h); a profile (sched/profile.h) picks the
// plugins and weights. Plugins read the cluster only through the Ledger and never change it;
// reserve/unreserve go through the Scheduler, which owns the decision.
//
// No plugin does I/O, reads a clock or keeps global state; randomness comes from the Rng in the
// context. That is what lets the simulator and the server run the very same decisions.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/rng.h"
#include "common/status.h"
#include "model/gpu_catalog.h"
#include "model/ledger.h"
#include "model/workload.h"

namespace gpupool {

// A task as the pipeline sees it: the request plus what preparation derived from it once, so
// the per-node loops compare integers only.
struct PreparedTask {
  const TaskRequest* request = nullptr;
  int64_t cpu = 0;     // mCPU
  int64_t memory = 0;  // MiB
  int gpu_count = 0;
  int64_t share = 0;        // per-GPU milli-GPU (0 for CPU-only and MIG tasks)
  int64_t gpu_memory = 0;   // per-GPU MiB asked for (0: the share's part of each GPU's, MemoryOn)
  bool share_task = false;  // one GPU, less than all of it
  bool mig = false;
  bool nvlink = false;  // every pair of the chosen GPUs must share NVLink
  bool guaranteed = false;  // a guaranteed share: shares a GPU only with enforced ones (QosAllows)
  uint8_t enforced_by = 0;  // what would hold it to its share (kEnforce* bit; 0: nothing)
  // An MPS share (TaskRequest::mps_owner), and its owner's id in the ledger (0: not seen yet, so no
  // GPU holds its shares): it joins only GPUs without another owner's MPS shares (MpsAllows).
  bool mps = false;
  uint32_t mps_owner = 0;
  // allowed_models[model id] for the ledger's interned models; empty vector: any model.
  std::vector<uint8_t> allowed_models;

  bool wants_gpu() const { return gpu_count > 0; }
  // The GPU memory the task reserves on `g` (model/ledger.h GrantMemory).
  int64_t MemoryOn(const GpuState& g) const { return GrantMemory(share, gpu_memory, g.memory); }
  // Whether node `s` holds the task to its share (its agent offers what the task needs).
  bool EnforcedOn(const NodeState& s) const { return enforced_by != 0 && (s.enforces & enforced_by) != 0; }
  // Whether neither QoS nor an MPS owner can refuse the task any GPU of `s` (the per-GPU walk
  // SharingAllowsOn needs is then moot).
  bool SharingFree(const NodeState& s) const {
    return !guaranteed && s.guaranteed_gpus == 0 && (!mps || s.mps_gpus == 0);
  }
  // Whether the task may share GPU `g` of node `s` with what it holds (QosAllows, MpsAllows).
  bool SharingAllowsOn(const NodeState& s, const GpuState& g) const {
    return share >= kWholeGpu.units() ||
           (QosAllows(g, guaranteed, EnforcedOn(s)) && (!mps || MpsAllows(g, mps_owner)));
  }
  // Whether GPU `g` of node `s` has the task's share and memory free and the sharing rules let it
  // join (its health and MIG mode aside).
  bool FitsOn(const NodeState& s, const GpuState& g) const {
    return g.free_share >= share && g.free_memory >= MemoryOn(g) && SharingAllowsOn(s, g);
  }
  bool ModelAllowed(ModelId m) const {
    return allowed_models.empty() || (m < allowed_models.size() && allowed_models[m]);
  }
};

// What plugins may read about the cluster besides one node's state.
struct ClusterView {
  const Ledger* ledger = nullptr;
  Rng* rng = nullptr;
  // Largest node CPU (mCPU) and largest node GPU capacity (GPUs x 1000) in the cluster: the
  // normalisation constants of the resource-vector policies ("norm max").
  int64_t max_node_cpu = 1;
  int64_t max_node_gpu_share = 1000;
};

// Counts filter failures per reason. Each filter plugin owns a block of reason ids.
class ReasonCounter {
 public:
  void Reset(size_t reasons) { counts_.assign(reasons, 0); }
  void Add(int reason) { ++counts_[static_cast<size_t>(reason)]; }
  const std::vector<int>& counts() const { return counts_; }

 private:
  std::vector<int> counts_;
};

class FilterPlugin {
 public:
  virtual ~FilterPlugin() = default;
  virtual std::string_view name() const = 0;
  // Human reasons this filter can give ("insufficient GPU share"); index = local reason id.
  virtual std::vector<std::string> reasons() const = 0;
  // Removes from `nodes` (in place, keeping order) every node the task cannot use, counting each
  // removal under `reason_base + local reason id`. Batched so the loop over nodes is not a chain of
  // virtual calls.
  virtual void Filter(const ClusterView& view, const PreparedTask& task, std::vector<NodeIndex>& nodes,
                      int reason_base, ReasonCounter& counter) const = 0;
};

// Request fields a score reads. The pipeline caches a plugin's raw score per (node generation,
// values of these fields), so a plugin must declare every field it reads.
enum PodField : uint32_t {
  kFieldCpu = 1u << 0,
  kFieldMemory = 1u << 1,
  kFieldGpuCount = 1u << 2,
  kFieldGpuShare = 1u << 3,
  kFieldGpuMemory = 1u << 4,
  kFieldGpuModels = 1u << 5,
  kFieldMig = 1u << 6,
  // guaranteed, enforced_by and the MPS owner: the score picks among the GPUs the sharing rules let
  // the task join (FitsOn).
  kFieldQos = 1u << 7,
  // The score depends on more than the node's state and the task's fields (random draws):
  // never cached.
  kUncacheable = 1u << 31,
};

class ScorePlugin {
 public:
  virtual ~ScorePlugin() = default;
  virtual std::string_view name() const = 0;
  virtual uint32_t fields_read() const = 0;
  // Sees every task that arrives, placed or not, once (Scheduler::Observe): a plugin that learns
  // the workload online does it here. Default: nothing.
  virtual void Observe(const PreparedTask& /*task*/) {}
  // Changes whenever the plugin's scores may change for an unchanged node (it learned something);
  // the pipeline then drops the scores it cached for this plugin.
  virtual uint64_t epoch() const { return 0; }
  // Called once per decision with the feasible nodes, before any Score call.
  virtual void PreScore(const ClusterView& /*view*/, const PreparedTask& /*task*/,
                        std::span<const NodeIndex> /*feasible*/) {}
  // Raw score of one feasible node; higher is better. May memoise internally (hence non-const),
  // but the result must be a function of the node's state, the declared fields, the plugin's
  // configuration and the static node set (specs) only — unless kUncacheable. The pipeline drops
  // its cache whenever a node is added.
  virtual int64_t Score(const ClusterView& view, const PreparedTask& task, NodeIndex node) = 0;
  // Maps raw scores of all feasible nodes into [0, 100]. Default: clamp.
  virtual void Normalize(std::span<int64_t> scores) const;
  // True when Normalize leaves every score as it is and PreScore does not read `feasible`: a node's
  // total is then its own affair, and the pipeline may keep, per request shape, the nodes ordered
  // by total (updated as nodes change) instead of scoring every feasible node at each decision.
  virtual bool absolute_scores() const { return false; }
};

// Chooses the GPUs inside the chosen node. Called for GPU tasks only.
class GpuSelector {
 public:
  virtual ~GpuSelector() = default;
  virtual std::string_view name() const = 0;
  // As ScorePlugin::Observe (called only when the selector is not also a score plugin).
  virtual void Observe(const PreparedTask& /*task*/) {}
  // The grants for `task` on `node`, which passed every filter. Fails only if the node cannot
  // hold the task after all (a filter and the selector disagree: a bug, reported as Internal).
  virtual Result<std::vector<GpuGrant>> Select(const ClusterView& view, const PreparedTask& task,
                                               NodeIndex node) = 0;
};

// Decides whether a gang may go ahead once its tasks are reserved.
class PermitPlugin {
 public:
  virtual ~PermitPlugin() = default;
  virtual std::string_view name() const = 0;
  // OK to proceed to bind; any other status rolls back every reservation of the job.
  virtual Status Permit(const Job& job, int placed_tasks) const = 0;
};

// Makes a placement real (the simulator: nothing; the server: store it and tell the agent).
// Called after permit, once per task. A failure unreserves the whole job.
class Binder {
 public:
  virtual ~Binder() = default;
  virtual Status Bind(const Job& job, int task_index, AllocationId allocation,
                      const Placement& placement) = 0;
};

// ---- Helpers shared by GPU selectors -------------------------------------------------------

// Fills `out` from `task`: integers for the node loops, and the acceptable models as ledger model
// ids (catalog aliases accepted). `out.request` points at `task`, which must outlive `out`.
void PrepareTask(const Ledger& ledger, const TaskRequest& task, PreparedTask& out);

// GPUs of `node` that can take one GPU of `task` now (healthy, non-MIG, share and memory fit).
void FittingGpus(const NodeState& node, const PreparedTask& task, std::vector<int>& out);

// Best fit for one GPU: the fitting GPU with the least free share, lowest index on ties.
int BestFitGpu(const NodeState& node, const PreparedTask& task);

// Best fit, and on NVLink boards, among equally good fits, the GPU whose use breaks the fewest
// free NVLink pairs (a lone GPU goes before one half of a connected pair). -1 when none fits.
int BestSingleGpu(const NodeSpec& spec, const NodeState& node, const PreparedTask& task);

// For a multi-GPU task: the `k` fitting GPUs with the highest topology set score; ties go to the
// set with least leftover share, then to the lexicographically smallest index set (so on a flat
// topology the k lowest-index fitting GPUs win). Empty when fewer than k fit.
std::vector<int> TopologyBestSet(const NodeSpec& spec, const NodeState& node, const PreparedTask& task);

// The MIG grant for a MIG task: the MIG GPU with the most compute slices already used (packing),
// lowest index on ties, at the lowest free valid start. nullopt when none can take it.
std::optional<GpuGrant> SelectMigGrant(const Ledger& ledger, NodeIndex node, const PreparedTask& task);

}  // namespace gpupool

namespace gpupool {
// NVLink capital of a node: the sum of the NVLink part (100 per link) of the pair scores over
// pairs of fully free GPUs, optionally pretending `taken` GPUs are no longer fully free.
int64_t NvlinkCapital(const NodeSpec& spec, const NodeState& node, std::span<const int> taken = {});
}  // namespace gpupool
