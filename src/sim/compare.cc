#include "sim/compare.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>

namespace gpupool {

namespace {

using Key = std::tuple<std::string, std::string, uint64_t>;

Result<std::map<Key, const DiscreteRow*>> Index(const DiscreteTable& table, const char* side) {
  std::map<Key, const DiscreteRow*> index;
  for (const DiscreteRow& r : table.rows) {
    if (!index.emplace(Key{r.workload, r.sc_policy, r.seed}, &r).second) {
      return Status::InvalidArgument(
          fmt::format("{}: more than one row for {},{},seed {}", side, r.workload, r.sc_policy, r.seed));
    }
  }
  return index;
}

// |a - b|, with two NaNs equal and one NaN infinitely far.
double AbsDiff(double a, double b) {
  if (std::isnan(a) && std::isnan(b)) return 0;
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::infinity();
  return std::fabs(a - b);
}

std::string ShortTrace(const std::string& workload) {
  constexpr std::string_view kPrefix = "openb_pod_list_";
  if (workload.size() > kPrefix.size() && workload.compare(0, kPrefix.size(), kPrefix) == 0) {
    return workload.substr(kPrefix.size());
  }
  return workload;
}

std::string FormatKeys(const std::vector<RowKey>& keys) {
  std::string out;
  constexpr size_t kShown = 10;
  for (size_t i = 0; i < keys.size() && i < kShown; ++i) {
    out += fmt::format("  {} {} seed {}\n", keys[i].workload, keys[i].sc_policy, keys[i].seed);
  }
  if (keys.size() > kShown) out += fmt::format("  ... and {} more\n", keys.size() - kShown);
  return out;
}

}  // namespace

Result<CompareResult> CompareTables(const DiscreteTable& expected, const DiscreteTable& actual,
                                    const CompareOptions& options) {
  if (!(options.tolerance >= 0)) {
    return Status::InvalidArgument(fmt::format("tolerance must be >= 0, got {}", options.tolerance));
  }
  if (options.columns.empty()) return Status::InvalidArgument("no columns to compare");
  for (int c : options.columns) {
    if (c < 0 || c >= kDemandBins) {
      return Status::InvalidArgument(fmt::format("column {} is out of range 0..{}", c, kDemandBins - 1));
    }
  }
  ASSIGN_OR_RETURN(const auto exp_index, Index(expected, "expected"));
  ASSIGN_OR_RETURN(const auto act_index, Index(actual, "actual"));

  CompareResult result;
  result.tolerance = options.tolerance;
  result.baseline = options.baseline;
  for (const auto& [key, row] : exp_index) {
    if (!act_index.contains(key)) {
      result.missing_in_actual.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key)});
    }
  }
  for (const auto& [key, row] : act_index) {
    if (!exp_index.contains(key)) {
      result.missing_in_expected.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key)});
    }
  }

  // Group the common runs by (workload, sc_policy); the maps keep them sorted.
  std::map<std::pair<std::string, std::string>,
           std::vector<std::pair<const DiscreteRow*, const DiscreteRow*>>>
      groups;
  for (const auto& [key, exp_row] : exp_index) {
    auto it = act_index.find(key);
    if (it == act_index.end()) continue;
    groups[{std::get<0>(key), std::get<1>(key)}].emplace_back(exp_row, it->second);
  }

  for (const auto& [group, pairs] : groups) {
    CompareRow row;
    row.workload = group.first;
    row.sc_policy = group.second;
    row.seeds = static_cast<int>(pairs.size());
    row.cells = row.seeds * kDemandBins;
    for (const auto& [e, a] : pairs) {
      for (size_t c = 0; c < kDemandBins; ++c) {
        const double d = AbsDiff(e->values[c], a->values[c]);
        if (d > options.tolerance) ++row.differing_cells;
        row.max_abs_diff = std::max(row.max_abs_diff, d);
      }
    }
    for (int c : options.columns) {
      CompareColumn col;
      col.column = c;
      // NaN cells (columns the bound leaves empty, frag of the bound) are left out of the means; a
      // mean with no number at all is NaN.
      auto mean = [&](bool expected_side) {
        double sum = 0;
        int n = 0;
        for (const auto& [e, a] : pairs) {
          const double v = (expected_side ? e : a)->values[static_cast<size_t>(c)];
          if (std::isnan(v)) continue;
          sum += v;
          ++n;
        }
        return n > 0 ? sum / static_cast<double>(n) : std::nan("");
      };
      col.expected_mean = mean(true);
      col.actual_mean = mean(false);
      col.diff = col.actual_mean - col.expected_mean;
      row.columns.push_back(col);
    }
    result.common_runs += row.seeds;
    result.differing_cells += row.differing_cells;
    result.max_abs_diff = std::max(result.max_abs_diff, row.max_abs_diff);
    result.rows.push_back(std::move(row));
  }

  // Reduction of unallocated GPUs against the baseline of the same workload (actual values).
  for (CompareRow& row : result.rows) {
    auto base = std::find_if(result.rows.begin(), result.rows.end(), [&](const CompareRow& r) {
      return r.workload == row.workload && r.sc_policy == options.baseline;
    });
    if (base == result.rows.end()) continue;
    for (size_t i = 0; i < row.columns.size(); ++i) {
      const double b = base->columns[i].actual_mean;
      const double p = row.columns[i].actual_mean;
      if (100.0 - b > 0 && !std::isnan(p))
        row.columns[i].reduction_vs_baseline = ((100.0 - b) - (100.0 - p)) / (100.0 - b) * 100.0;
    }
  }
  result.exceeds_tolerance = result.max_abs_diff > options.tolerance;
  return result;
}

Result<CompareResult> CompareFiles(const CompareOptions& options) {
  ASSIGN_OR_RETURN(const DiscreteTable expected, ReadDiscreteCsv(options.expected_csv));
  ASSIGN_OR_RETURN(const DiscreteTable actual, ReadDiscreteCsv(options.actual_csv));
  return CompareTables(expected, actual, options);
}

std::string FormatCompare(const CompareResult& result) {
  std::string out;
  const bool has_baseline = std::any_of(result.rows.begin(), result.rows.end(),
                                        [&](const CompareRow& r) { return r.sc_policy == result.baseline; });
  out += fmt::format("{:<12} {:<17} {:>5}", "trace", "sc_policy", "seeds");
  if (!result.rows.empty()) {
    for (const CompareColumn& c : result.rows.front().columns) {
      out += fmt::format(" {:>8} {:>8} {:>8}", fmt::format("exp@{}", c.column),
                         fmt::format("act@{}", c.column), fmt::format("diff@{}", c.column));
      if (has_baseline) out += fmt::format(" {:>8}", fmt::format("red@{}", c.column));
    }
  }
  out += fmt::format(" {:>11} {:>9}\n", "cells>tol", "max|diff|");
  for (const CompareRow& r : result.rows) {
    out += fmt::format("{:<12} {:<17} {:>5}", ShortTrace(r.workload), r.sc_policy, r.seeds);
    for (const CompareColumn& c : r.columns) {
      out += fmt::format(" {:>8.2f} {:>8.2f} {:>+8.3f}", c.expected_mean, c.actual_mean, c.diff);
      if (has_baseline) {
        out += c.reduction_vs_baseline ? fmt::format(" {:>7.1f}%", *c.reduction_vs_baseline)
                                       : fmt::format(" {:>8}", "-");
      }
    }
    out +=
        fmt::format(" {:>11} {:>9.4g}\n", fmt::format("{}/{}", r.differing_cells, r.cells), r.max_abs_diff);
  }
  if (has_baseline) {
    out += fmt::format("red@c: reduction of unallocated GPUs vs {} at column c (actual values)\n",
                       result.baseline);
  }
  if (!result.missing_in_actual.empty()) {
    out += fmt::format("{} run(s) only in the expected file:\n{}", result.missing_in_actual.size(),
                       FormatKeys(result.missing_in_actual));
  }
  if (!result.missing_in_expected.empty()) {
    out += fmt::format("{} run(s) only in the actual file:\n{}", result.missing_in_expected.size(),
                       FormatKeys(result.missing_in_expected));
  }
  out += fmt::format("{} run(s) in common; {} of {} cells differ by more than {} (max |diff| {:.6g}): {}\n",
                     result.common_runs, result.differing_cells, result.common_runs * kDemandBins,
                     result.tolerance, result.max_abs_diff, result.exceeds_tolerance ? "MISMATCH" : "MATCH");
  return out;
}

Result<PolicyTable> MakePolicyTable(const DiscreteTable& expected, const DiscreteTable& actual, int column,
                                    const std::string& reference, const std::vector<std::string>& tuned_on) {
  if (column < 0 || column >= kDemandBins) {
    return Status::InvalidArgument(fmt::format("column {} is out of range 0..{}", column, kDemandBins - 1));
  }
  if (actual.rows.empty()) return Status::InvalidArgument("the actual file has no rows");
  PolicyTable t;
  t.column = column;
  t.reference = reference;
  std::map<std::pair<std::string, std::string>, std::pair<double, int>> sums;  // (trace, policy)
  std::map<std::string, std::pair<double, int>> ref_sums;
  std::map<std::string, bool> in_expected;
  // The reference over the seeds the actual file ran, so both sides average the same runs.
  std::set<std::pair<std::string, uint64_t>> actual_runs;
  for (const DiscreteRow& r : actual.rows) actual_runs.emplace(r.workload, r.seed);
  for (const DiscreteRow& r : expected.rows) {
    in_expected[r.sc_policy] = true;
    const double v = r.values[static_cast<size_t>(column)];
    if (r.sc_policy != reference || std::isnan(v) || !actual_runs.contains({r.workload, r.seed})) continue;
    auto& [sum, n] = ref_sums[r.workload];
    sum += v;
    ++n;
  }
  for (const DiscreteRow& r : actual.rows) {
    auto& [sum, n] = sums[{r.workload, r.sc_policy}];
    const double v = r.values[static_cast<size_t>(column)];
    if (std::isnan(v)) continue;
    sum += v;
    ++n;
    if (std::find(t.traces.begin(), t.traces.end(), r.workload) == t.traces.end())
      t.traces.push_back(r.workload);
    if (std::find(t.policies.begin(), t.policies.end(), r.sc_policy) == t.policies.end())
      t.policies.push_back(r.sc_policy);
  }
  std::sort(t.traces.begin(), t.traces.end());
  std::sort(t.policies.begin(), t.policies.end());
  for (const std::string& p : t.policies) {
    if (!in_expected.contains(p)) t.challengers.push_back(p);
  }
  for (const std::string& trace : t.traces) {
    std::vector<double> row;
    int seeds = -1;
    for (const std::string& p : t.policies) {
      auto it = sums.find({trace, p});
      const bool has = it != sums.end() && it->second.second > 0;
      row.push_back(has ? it->second.first / it->second.second : std::nan(""));
      if (has && seeds < 0) seeds = it->second.second;
    }
    t.means.push_back(std::move(row));
    t.seeds.push_back(std::max(seeds, 0));
    auto ref = ref_sums.find(trace);
    t.reference_means.push_back(ref == ref_sums.end() ? std::nan("")
                                                      : ref->second.first / ref->second.second);
  }
  t.tuned.assign(t.traces.size(), false);
  t.grouped = !tuned_on.empty();
  for (const std::string& name : tuned_on) {
    auto it = std::find_if(t.traces.begin(), t.traces.end(),
                           [&](const std::string& w) { return w == name || ShortTrace(w) == name; });
    if (it == t.traces.end()) {
      std::vector<std::string> known;
      for (const std::string& w : t.traces) known.push_back(ShortTrace(w));
      return Status::InvalidArgument(fmt::format(
          "tuned-on trace '{}' has no rows in the actual file (it has: {})", name, fmt::join(known, ", ")));
    }
    t.tuned[static_cast<size_t>(it - t.traces.begin())] = true;
  }
  return t;
}

std::string FormatPolicyTable(const PolicyTable& t) {
  std::string out = fmt::format("GPU allocation (%) at {} % arrived demand, mean over seeds\n", t.column);
  auto cell = [](double v) {
    return std::isnan(v) ? fmt::format(" {:>12}", "-") : fmt::format(" {:>12.2f}", v);
  };
  out += fmt::format("{:<12} {:>5}", "trace", "seeds");
  for (const std::string& p : t.policies) out += fmt::format(" {:>12}", p.substr(0, 12));
  out += fmt::format(" {:>12}", ("ref:" + t.reference).substr(0, 12));
  for (const std::string& c : t.challengers) out += fmt::format(" {:>12}", (c.substr(0, 8) + " +/-"));
  out += "\n";
  std::vector<size_t> challenger_column;
  for (const std::string& c : t.challengers) {
    challenger_column.push_back(
        static_cast<size_t>(std::find(t.policies.begin(), t.policies.end(), c) - t.policies.begin()));
  }
  // The rows of `traces` (indices; left out unless `rows`), then their mean row, labelled `label`;
  // `summary` gets each challenger's count of traces above the reference, with `what` naming the group.
  auto group = [&](const std::vector<size_t>& traces, bool rows, const std::string& label,
                   const std::string& what, std::string& summary) {
    std::vector<double> col_sum(t.policies.size(), 0), margin_sum(t.challengers.size(), 0);
    std::vector<int> col_n(t.policies.size(), 0), wins(t.challengers.size(), 0),
        compared(t.challengers.size(), 0), clear_wins(t.challengers.size(), 0);
    double ref_sum = 0;
    int ref_n = 0;
    for (size_t i : traces) {
      std::string line = fmt::format("{:<12} {:>5}", ShortTrace(t.traces[i]), t.seeds[i]);
      for (size_t j = 0; j < t.policies.size(); ++j) {
        line += cell(t.means[i][j]);
        if (!std::isnan(t.means[i][j])) {
          col_sum[j] += t.means[i][j];
          ++col_n[j];
        }
      }
      const double ref = t.reference_means[i];
      line += cell(ref);
      if (!std::isnan(ref)) {
        ref_sum += ref;
        ++ref_n;
      }
      for (size_t k = 0; k < t.challengers.size(); ++k) {
        const double v = t.means[i][challenger_column[k]];
        if (std::isnan(v) || std::isnan(ref)) {
          line += fmt::format(" {:>12}", "-");
          continue;
        }
        line += fmt::format(" {:>+12.2f}", v - ref);
        margin_sum[k] += v - ref;
        ++compared[k];
        if (v > ref) ++wins[k];
        if (v > ref + 0.05) ++clear_wins[k];
      }
      if (rows) out += line + "\n";
    }
    out += fmt::format("{:<12} {:>5}", label, "");
    for (size_t j = 0; j < t.policies.size(); ++j)
      out += cell(col_n[j] > 0 ? col_sum[j] / col_n[j] : std::nan(""));
    out += cell(ref_n > 0 ? ref_sum / ref_n : std::nan(""));
    for (size_t k = 0; k < t.challengers.size(); ++k) {
      out += compared[k] > 0 ? fmt::format(" {:>+12.2f}", margin_sum[k] / compared[k])
                             : fmt::format(" {:>12}", "-");
    }
    out += "\n";
    for (size_t k = 0; k < t.challengers.size(); ++k) {
      summary +=
          fmt::format("{} is above {} of the expected file on {} of {} {}traces (by more than 0.05 on {})\n",
                      t.challengers[k], t.reference, wins[k], compared[k], what, clear_wins[k]);
    }
  };
  std::string summary;
  std::vector<size_t> all(t.traces.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  if (!t.grouped) {
    group(all, true, "mean", "", summary);
  } else {
    std::vector<size_t> tuned, held_out;
    for (size_t i : all) (t.tuned[i] ? tuned : held_out).push_back(i);
    out += fmt::format("-- tuned on ({} traces)\n", tuned.size());
    group(tuned, true, "mean tuned", "tuned-on ", summary);
    out += fmt::format("-- held out ({} traces)\n", held_out.size());
    if (!held_out.empty()) group(held_out, true, "mean held", "held-out ", summary);
    out += "--\n";
    group(all, false, "mean all", "", summary);
  }
  return out + summary;
}

}  // namespace gpupool
