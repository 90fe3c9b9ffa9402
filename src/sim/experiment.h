// One simulator experiment, run exactly as the FGD paper's experiments were (trace README §2, §3,
// §7): pods arrive one at a time into an empty cluster, each is placed by the scheduling core's own
// pipeline or fails for good (no retry, pods never leave), and after every pod one metrics row is
// logged; the rows are binned by arrived GPU demand (0..130 % of capacity) into the published
// columns.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/node.h"
#include "sched/profile.h"
#include "sim/repack.h"
#include "sim/trace.h"

namespace gpupool {

inline constexpr int kDemandBins = 131;  // columns 0..130 (% of GPU capacity)

struct ExperimentOptions {
  std::string trace;           // trace name, e.g. "default" (for the output and arrival files)
  std::string policy = "fgd";  // a name from PolicyNames(), or "bound" (sim/bound.h: no scheduling)
  uint64_t seed = 42;
  double inflate = 1.3;  // GPU demand to reach, x capacity (gpupool's own generator)
  // When set: the published arrival order and node tie-break ranks, read from
  // <dir>/<trace>_<seed>_pods.txt and <dir>/<trace>_<seed>_nodes.txt, replace the generator.
  std::optional<std::string> arrival_order_dir;
  // Every GPU-sharing pod takes a whole GPU (the no-pooling counterfactual).
  bool exclusive = false;
  // When set, the scheduler runs this profile (e.g. one with trained weights) and `policy` only
  // names it in the results.
  std::optional<Profile> profile;
  // After the run, pack its GPU-sharing pods as tightly as possible (sim/repack.h): how much of the
  // stranding the placement caused.
  bool repack = false;
  // Defragmentation by migration (sched/consolidation.h): a pod that fits nowhere may get room by
  // moving up to this many placed single-GPU pods elsewhere, every one of them placed again or
  // none moved; 0: never. The trace says nothing of checkpoints, so every placed single-GPU pod
  // is taken as one that can move; each moves at most migrate_per_pod times.
  int migrate_moves = 0;
  int migrate_per_pod = 1;
  int migrate_candidates = 16;  // nodes tried per plan (ConsolidationOptions::max_candidates)
  // Only pods of whole GPUs may have room made for them (a share pod still fails where it fails).
  bool migrate_whole_only = false;
};

// One metrics row, logged after every pod (placed or failed).
struct MetricsRow {
  int64_t arrived_gpu_milli = 0;  // cumulative GPU demand that has arrived
  int64_t used_gpu_milli = 0;     // allocated GPU share
  double frag_milli = 0;          // cluster fragmentation F (FGD's measure), milli-GPU, %.2f
  double frag_ratio = 0;          // 100 F / idle, %.2f
};

// The single-GPU GPU-sharing pods of one per-GPU share: how many arrived and how many were placed.
struct ShareAdmission {
  int64_t arrived = 0;
  int64_t placed = 0;
};

struct ExperimentResult {
  std::string policy;
  std::string trace;
  uint64_t seed = 0;
  int total_gpus = 0;
  std::array<double, kDemandBins> alloc{};       // GPU allocation ratio, %
  std::array<double, kDemandBins> frag{};        // fragmented GPUs, % of all GPUs
  std::array<double, kDemandBins> frag_ratio{};  // fragmented / idle, % (not rounded)
  int64_t pods_arrived = 0;
  int64_t pods_scheduled = 0;
  int64_t pods_failed = 0;
  int64_t arrived_gpu_milli = 0;       // GPU demand that arrived, as the pods asked for it
  int64_t served_gpu_milli = 0;        // GPU demand of the placed pods, as they asked for it
  int64_t used_gpu_milli = 0;          // GPU share allocated at the end (exclusive: whole GPUs)
  double final_frag_milli = 0;         // cluster fragmentation F after the last pod
  std::string first_failure;           // "<pod> (<request>): <why no node fits>"; empty when none failed
  double seconds = 0;                  // wall time of the scheduling loop (policy "bound": of the LPs)
  std::vector<MetricsRow> rows;        // kept only when asked (ExperimentInputs::keep_rows)
  int64_t failed_whole_gpus = 0;       // GPUs asked for by the whole-GPU pods that found no room
  std::optional<RepackResult> repack;  // when ExperimentOptions::repack
  // Per-GPU share (milli-GPU, below a whole GPU) -> the GPU-sharing pods of that share that arrived
  // and were placed. Which shares a run admits decides what even a perfect repack can reach: a placed
  // 0.81-GPU pod leaves a 0.19-GPU remainder that only smaller pods can use.
  std::map<int64_t, ShareAdmission> share_admission;
  // With migrate_moves: pods placed after a consolidation, the pods they moved (each move counted),
  // the GPU share those moves carried (milli-GPU), and failing pods a plan was sought for.
  int64_t consolidated = 0;
  int64_t migrations = 0;
  int64_t migrated_gpu_milli = 0;
  int64_t consolidation_attempts = 0;
  int64_t consolidation_no_candidate = 0;  // attempts where no node's estimate allowed a plan
};

// Inputs shared by many experiments on one trace (read once).
struct ExperimentInputs {
  std::vector<NodeSpec> nodes;
  std::vector<TracePod> pods;  // the trace's original list
  bool keep_rows = false;
};

Result<ExperimentInputs> LoadExperimentInputs(const std::string& nodes_csv, const std::string& pods_csv);

// Policies "bound" and "bound-relaxed" schedule nothing: they fill alloc with an LP upper bound of the
// same arrival sequence (FillBoundResult in sim/bound.h; frag and frag_ratio NaN, the pod counts
// beyond pods_arrived 0).
Result<ExperimentResult> RunExperiment(const ExperimentInputs& inputs, const ExperimentOptions& options);

// Bins per-pod rows into the 131 published columns (README §7): a = round-half-even(arrived /
// total_gpus / 10); rows with a == c, else c-1 <= a <= c+1; alloc = npround(mean(round(used /
// total_gpus / 10, 2)), 2); frag = npround(100 mean(F) / 1000 / total_gpus, 2); frag_ratio =
// mean(ratio). Means are numpy's pairwise sums divided by the count.
void BinMetrics(const std::vector<MetricsRow>& rows, int total_gpus, ExperimentResult& out);

// numpy's pairwise summation (blocks of 8-way unrolled sums up to 128, recursive halving above).
double PairwiseSum(const double* values, size_t n);
// numpy.round(x, 2): rint(x * 100) / 100, half to even.
double NpRound2(double x);
// Python's round(x, 2) on a double: the correctly rounded decimal, ties to even.
double PyRound2(double x);
// Python's repr of a float ("2.0", "0.25", "13.937500000000002").
std::string PyFloatRepr(double x);

// The published sc_policy name of a policy ("fgd" -> "06-FGD"); the policy name itself otherwise.
std::string PublishedPolicyName(const std::string& policy);
// Inverse; nullopt for an unknown published name.
std::optional<std::string> PolicyFromPublishedName(const std::string& published);

Status WriteExperimentJson(const ExperimentResult& result, const std::string& path);

}  // namespace gpupool
