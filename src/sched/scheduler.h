// The pipeline runner. One Scheduler serves one Ledger; it is not thread-safe (the owner — the
// scheduling loop or the simulator — calls it from one thread).
//
// Decisions are deterministic: the same ledger state, task, tie-break ranks and Rng state give the
// same placement. Ties among equal total scores go to the node with the lowest tie-break rank.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/rng.h"
#include "common/status.h"
#include "model/ledger.h"
#include "model/workload.h"
#include "sched/framework.h"
#include "sched/profile.h"
#include "sched/registry.h"

namespace gpupool {

// Why a task did not fit: per-reason node counts. ToString():
//   "0/1213 nodes fit: 900 insufficient GPU share, 313 GPU model not allowed"
struct Diagnosis {
  int total_nodes = 0;
  int feasible_nodes = 0;
  std::vector<std::pair<std::string, int>> reasons;  // most frequent first
  std::string ToString() const;
};

// Node restrictions the embedder computes for the next decisions (nodes held for a waiting gang,
// affinity to other jobs' tasks): a node whose `reason` entry is non-zero is skipped before the
// filters run and counted under reasons[entry - 1]. Nodes past the end of `reason` are allowed.
struct NodeMask {
  std::vector<uint8_t> reason;
  std::vector<std::string> reasons;
};

struct Decision {
  bool placed = false;
  Placement placement;
  Diagnosis diagnosis;  // filled when not placed; total/feasible always
  Status error;         // a selector/plugin error (Internal); OK otherwise
};

struct JobResult {
  bool placed = false;
  std::vector<AllocationId> allocations;  // one per placed task, in task order
  std::vector<Placement> placements;
  Diagnosis diagnosis;         // the first task that did not fit
  int first_failed_task = -1;  // its position in the job's task order; -1 when every task fit
  Status status;               // why the job was not placed (Unschedulable, permit or bind failure)
};

class Scheduler {
 public:
  // Builds every plugin of `profile`. The ledger and rng must outlive the scheduler.
  static Result<std::unique_ptr<Scheduler>> Create(const Profile& profile, const PluginRegistry& registry,
                                                   Ledger& ledger, Rng& rng, PluginInit init = {});

  // Tie-break ranks, one per node (a permutation is typical; lower wins). Default: node index.
  Status SetTieBreakRanks(std::vector<uint32_t> ranks);
  // Draws a fresh random permutation of ranks from the scheduler's Rng.
  void ShuffleTieBreakRanks();

  // A task arrived (call once per task, before deciding it, whether it will fit or not): plugins
  // that learn the workload online see it. Invalid tasks are ignored.
  void Observe(const TaskRequest& task);
  // Filter, score and select only; changes nothing.
  Decision Decide(const TaskRequest& task);
  // Decide, then commit to the ledger (reserve). Unschedulable with the diagnosis when it does
  // not fit.
  Result<AllocationId> Place(const TaskRequest& task, Decision* decision = nullptr);
  // A whole job: every task is reserved in turn; if fewer than the gang size fit, or a permit
  // plugin or the binder refuses, every reservation is rolled back and nothing changes.
  // `on_reserve`, when set, is called after each task's reservation (the embedder may update the
  // node mask it set, e.g. to spread a job's own replicas).
  JobResult ScheduleJob(const Job& job, Binder* binder = nullptr,
                        const std::function<void(const Placement&)>& on_reserve = {});

  // Restricts the next decisions to the nodes `mask` allows; nullptr lifts it. The mask is read at
  // every decision and must outlive its use.
  void SetNodeMask(const NodeMask* mask) { mask_ = mask; }

  // The reasons every node gives for not taking `task` (empty string: fits), for "why pending".
  std::vector<std::string> ExplainNodes(const TaskRequest& task);

  const Profile& profile() const { return profile_; }
  Ledger& ledger() { return ledger_; }

  // The best-node index (scheduler_index.cc): with a profile whose score plugins all give absolute
  // scores (ScorePlugin::absolute_scores, e.g. balanced), cached, and no node mask set, a decision
  // keeps per request shape the feasible nodes ordered by total score and tie-break rank, updated
  // from the ledger's change log (only the nodes that changed since the shape was last decided are
  // filtered and scored again) instead of a filter and score pass over every node. The choice is
  // the one the full pass makes, node for node; a task that fits nowhere takes the full pass (for
  // its diagnosis). On by default; off for comparisons.
  void SetBestNodeIndex(bool on) {
    index_enabled_ = on;
    index_.clear();
  }

  // Counters for benchmarks and metrics.
  struct Stats {
    uint64_t decisions = 0;
    uint64_t score_cache_hits = 0;
    uint64_t score_cache_misses = 0;
    uint64_t index_decisions = 0;  // decided through the best-node index
    uint64_t index_builds = 0;     // full passes that (re)built a shape's index
    uint64_t index_rescores = 0;   // a shape's feasible nodes scored again (epochs or ranks moved)
    uint64_t index_updates = 0;    // nodes filtered and scored again because they changed
  };
  const Stats& stats() const { return stats_; }

 private:
  Scheduler(Profile profile, Ledger& ledger, Rng& rng);

  void Prepare(const TaskRequest& task, PreparedTask& out);
  void RefreshClusterView();
  void RunFilters(const PreparedTask& task);
  Diagnosis MakeDiagnosis() const;
  // Raw scores of one plugin for the feasible nodes, using the cache when allowed.
  void ScoreWith(size_t plugin, const PreparedTask& task, std::vector<int64_t>& out);
  Result<std::vector<GpuGrant>> SelectGpus(const PreparedTask& task, NodeIndex node);

  struct ShapeKey {
    int64_t cpu, memory, share, gpu_memory;
    int32_t gpu_count, models_id, mig_id;
    int32_t qos;         // guaranteed and enforced_by, for plugins that read kFieldQos
    uint32_t mps_owner;  // the MPS owner's id (PreparedTask::mps_owner), for the same
    bool operator==(const ShapeKey&) const = default;
  };
  struct ShapeKeyHash {
    size_t operator()(const ShapeKey& k) const;
  };
  struct CacheEntry {
    uint64_t generation = ~uint64_t{0};
    int64_t score = 0;
  };
  struct ScoreSlot {
    std::unique_ptr<ScorePlugin> plugin;
    int64_t weight = 1;
    uint32_t fields = 0;
    uint64_t epoch = 0;  // the plugin's epoch() the cache was filled under
    std::unordered_map<ShapeKey, uint32_t, ShapeKeyHash> shapes;
    std::vector<std::vector<CacheEntry>> cache;  // [shape][node]
  };

  struct IndexEntry {
    int64_t total;
    uint32_t rank;
    NodeIndex node;
    uint64_t generation;
  };
  struct ShapeIndex {
    std::vector<IndexEntry> heap;  // max-heap by (total, lower rank, lower node); stale entries too
    std::vector<uint64_t> seen;    // per node: the generation last filtered and scored
    std::vector<uint8_t> live;     // per node: feasible at that generation (its entry is in the heap)
    size_t live_count = 0;
    uint64_t log_position = 0;     // the ledger's change log read up to here
    uint64_t signature = 0;        // plugin epochs and tie-break version it was built under
    uint64_t last_used = 0;        // index_clock_ at its last decision (the least used goes first)
  };
  bool IndexUsable() const;
  uint64_t IndexSignature() const;
  std::string IndexKey(const TaskRequest& task) const;
  void BuildIndex(ShapeIndex& index);
  void RescoreIndex(ShapeIndex& index);
  void ScoreIntoHeap(ShapeIndex& index);
  void UpdateIndex(ShapeIndex& index);
  bool NodeFeasible(NodeIndex node);
  int64_t NodeTotal(NodeIndex node);
  // The node the full pass would choose for prepared_, through the shape's index; nullopt when no
  // node is feasible (the caller runs the full pass for the diagnosis).
  std::optional<NodeIndex> ChooseFromIndex(const TaskRequest& task);

  Profile profile_;
  Ledger& ledger_;
  Rng& rng_;
  ClusterView view_;
  size_t view_nodes_ = 0;

  std::vector<std::unique_ptr<FilterPlugin>> filters_;
  std::vector<int> filter_reason_base_;
  std::vector<std::string> reason_names_;
  std::vector<ScoreSlot> scores_;
  std::unique_ptr<GpuSelector> owned_selector_;
  GpuSelector* selector_ = nullptr;  // owned_selector_, or a score plugin that also selects GPUs
  std::vector<std::unique_ptr<PermitPlugin>> permits_;
  std::vector<uint32_t> ranks_;
  const NodeMask* mask_ = nullptr;

  std::unordered_map<std::string, int32_t> string_ids_;  // model lists and MIG names in shape keys

  // Scratch reused across decisions.
  PreparedTask prepared_;
  std::vector<NodeIndex> all_nodes_;
  std::vector<NodeIndex> feasible_;
  ReasonCounter reasons_;
  std::vector<int64_t> raw_;
  std::vector<int64_t> total_;
  Stats stats_;

  bool index_enabled_ = true;
  uint64_t ranks_version_ = 0;  // bumped when the tie-break ranks change
  std::unordered_map<std::string, ShapeIndex> index_;
  uint64_t index_clock_ = 0;
  size_t index_feasible_ = 0;      // the feasible nodes of the last decision through the index
  std::vector<NodeIndex> one_;     // scratch: one node through the filters
  ReasonCounter one_reasons_;
};

}  // namespace gpupool
