// A policy sweep: every (trace, policy, seed) of a grid run as one experiment each, in parallel,
// written as the FGD paper's published result files (analysis_{allo,frag,frag_ratio}_discrete.csv).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "sim/experiment.h"

namespace gpupool {

// The 17 trace variants of the published results.
std::vector<std::string> PublishedTraces();
// The 6 published policies, in published order: random, dotprod, gpuclustering, gpupacking, bestfit, fgd.
std::vector<std::string> PublishedPolicies();

// "42-51" (inclusive range), "42,43", "42", or a mix ("42-44,50"). Duplicates are an error.
Result<std::vector<uint64_t>> ParseSeeds(const std::string& text);
// The scheduler's policies (PolicyNames()) and the pseudo-policy "bound" (sim/bound.h).
std::vector<std::string> SweepPolicyNames();
// A comma-separated list of names; empty items are an error.
Result<std::vector<std::string>> ParseNameList(const std::string& text, const char* what);

// One row of a published-layout CSV.
struct DiscreteRow {
  std::string workload;   // "openb_pod_list_<trace>"
  std::string sc_policy;  // "06-FGD"
  double tune = 1.3;
  uint64_t seed = 0;
  int total_gpus = 0;  // only when the table has the column
  std::array<double, kDemandBins> values{};
};

struct DiscreteTable {
  bool has_total_gpus = false;  // analysis_allo_discrete.csv has it; the frag files do not
  std::vector<DiscreteRow> rows;
};

// Sorts rows as the published files are: by workload, sc_policy, seed (then tune).
void SortDiscreteRows(std::vector<DiscreteRow>& rows);

// Writes `table` in the published layout: header `workload,sc_policy,tune,seed[,total_gpus],0,...,130`,
// numbers as Python float repr, '\n' line ends.
Status WriteDiscreteCsv(const DiscreteTable& table, const std::string& path);
std::string FormatDiscreteCsv(const DiscreteTable& table);
// Reads a published-layout CSV; errors name file:line. Duplicate (workload, sc_policy, tune, seed)
// keys are an error.
Result<DiscreteTable> ReadDiscreteCsv(const std::string& path);

// Which metric of an experiment a table holds.
enum class DiscreteMetric { kAlloc, kFrag, kFragRatio };
// One table row per result (sorted), for `metric`; `inflate` is the tune column.
DiscreteTable MakeDiscreteTable(const std::vector<ExperimentResult>& results, DiscreteMetric metric,
                                double inflate);

struct SweepOptions {
  std::string traces_dir;  // holds openb_pod_list_<trace>.csv
  std::string nodes_csv;   // empty: traces_dir/openb_node_list_gpu_node.csv
  std::vector<std::string> traces = PublishedTraces();
  std::vector<std::string> policies = PublishedPolicies();
  std::vector<uint64_t> seeds = {42};
  std::optional<std::string> arrival_order_dir;
  std::string out_dir;  // empty: write nothing
  int jobs = 1;         // worker threads; <= 0: the number of hardware threads
  double inflate = 1.3;
  bool exclusive = false;
  // Policies named here run with these profiles (e.g. one trained by `gpupool sim train`); their names
  // must not be those of SweepPolicyNames().
  std::map<std::string, Profile> profiles;
};

struct SweepProgress {
  int done = 0;
  int total = 0;
  const ExperimentResult* last = nullptr;  // the experiment that just finished
  double elapsed_seconds = 0;
};

struct SweepResult {
  std::vector<ExperimentResult> results;  // sorted by trace, policy, seed
  double seconds = 0;                     // wall time of the whole sweep
};

// Runs the grid on `options.jobs` threads. Each trace's inputs are read once and shared. `progress`
// (may be empty) is called after each finished experiment, one call at a time. The first failing
// experiment fails the sweep (remaining experiments are not started). With out_dir set, writes the
// three CSVs there (creating the folder).
Result<SweepResult> RunSweep(const SweepOptions& options,
                             const std::function<void(const SweepProgress&)>& progress = {});

// Writes analysis_allo_discrete.csv, analysis_frag_discrete.csv, analysis_frag_ratio_discrete.csv.
Status WriteSweepCsvs(const std::vector<ExperimentResult>& results, double inflate,
                      const std::string& out_dir);

}  // namespace gpupool
