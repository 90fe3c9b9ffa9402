// Compares two published-layout result files (e.g. the FGD paper's analysis_allo_discrete.csv and a
// gpupool sweep's): per (workload, sc_policy), the seed-means side by side, their differences, the
// number of cells that differ, and each policy's reduction of unallocated GPUs against a baseline.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "sim/sweep.h"

namespace gpupool {

struct CompareOptions {
  std::string expected_csv;
  std::string actual_csv;
  std::vector<int> columns = {100, 130};  // arrived-demand columns to show (0..130)
  double tolerance = 0;                   // a cell "differs" when |expected - actual| > tolerance
  std::string baseline = "05-BestFit";    // sc_policy of the baseline; skipped where absent
};

struct CompareColumn {
  int column = 0;
  double expected_mean = 0;  // over the seeds common to both files, NaN cells left out (all NaN: NaN)
  double actual_mean = 0;
  double diff = 0;  // actual - expected
  // ((100 - baseline) - (100 - policy)) / (100 - baseline) in %, on the actual seed-means;
  // absent when the workload has no baseline row or the baseline leaves nothing unallocated.
  std::optional<double> reduction_vs_baseline;
};

struct CompareRow {
  std::string workload;
  std::string sc_policy;
  int seeds = 0;  // seeds present in both files
  int cells = 0;  // seeds x 131
  // Cells with |diff| > tolerance, over all 131 columns and common seeds. Two NaN cells are equal (the
  // same empty column, or the bound's frag columns on both sides); NaN against a number always differs.
  int differing_cells = 0;
  double max_abs_diff = 0;
  std::vector<CompareColumn> columns;
};

struct RowKey {
  std::string workload;
  std::string sc_policy;
  uint64_t seed = 0;
};

struct CompareResult {
  std::vector<CompareRow> rows;  // sorted by workload, sc_policy
  std::vector<RowKey> missing_in_actual;
  std::vector<RowKey> missing_in_expected;
  int common_runs = 0;
  int differing_cells = 0;
  double max_abs_diff = 0;  // over all common cells
  double tolerance = 0;
  std::string baseline;
  bool exceeds_tolerance = false;  // max_abs_diff > tolerance
};

// Compares two tables. Rows are matched by (workload, sc_policy, seed); tune is not part of the key.
Result<CompareResult> CompareTables(const DiscreteTable& expected, const DiscreteTable& actual,
                                    const CompareOptions& options);
// Reads both files and compares them.
Result<CompareResult> CompareFiles(const CompareOptions& options);

// The terminal table.
std::string FormatCompare(const CompareResult& result);

// Every policy side by side: one row per trace of `actual`, one column per sc_policy of `actual`
// (its seed-mean at `column`), then the reference policy's mean in `expected` over the same
// (trace, seed) runs (e.g. FGD's published figures), and for each policy of `actual` that `expected` does not
// have, its margin over that reference. A bottom row gives the means over the traces, and a line per such
// policy says on how many traces it beats the reference. With `tuned_on` (traces a policy was tuned or
// trained on), those traces and the held-out rest are two groups, each with its own means and counts,
// so that the held-out figures show generalisation rather than fit.
struct PolicyTable {
  int column = 130;
  std::string reference;                 // sc_policy in `expected`
  std::vector<std::string> traces;       // workloads, sorted
  std::vector<std::string> policies;     // sc_policies of `actual`, sorted
  std::vector<std::string> challengers;  // policies of `actual` absent from `expected`
  // means[trace][policy]: NaN where the trace has no run of the policy.
  std::vector<std::vector<double>> means;
  std::vector<double> reference_means;  // per trace; NaN where `expected` lacks it
  std::vector<int> seeds;               // per trace: seeds of the first policy
  std::vector<bool> tuned;              // per trace: listed in tuned_on (all false without it)
  bool grouped = false;                 // tuned_on was given
};
// `tuned_on`: trace names (short, e.g. "default", or the workload) that must all be in `actual`.
Result<PolicyTable> MakePolicyTable(const DiscreteTable& expected, const DiscreteTable& actual, int column,
                                    const std::string& reference,
                                    const std::vector<std::string>& tuned_on = {});
std::string FormatPolicyTable(const PolicyTable& table);

}  // namespace gpupool
