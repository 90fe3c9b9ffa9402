#include "sim/sweep.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <tuple>

#include "sched/profile.h"
#include "sim/bound.h"
#include "sim/parallel.h"

namespace gpupool {

namespace {

constexpr const char* kWorkloadPrefix = "openb_pod_list_";

std::vector<std::string> Split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text) {
    if (c == sep) {
      out.push_back(std::move(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(std::move(cur));
  return out;
}

std::string Trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

Result<uint64_t> ParseSeedNumber(const std::string& s, const std::string& whole) {
  uint64_t v = 0;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, v);
  if (s.empty() || ec != std::errc() || ptr != end) {
    return Status::InvalidArgument(
        fmt::format("seeds '{}': '{}' is not a non-negative integer (use e.g. 42-51 or 42,43)", whole, s));
  }
  return v;
}

bool ParseDouble(const std::string& s, double& out) {
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, out);
  return !s.empty() && ec == std::errc() && ptr == end;
}

bool ParseInt(const std::string& s, int64_t& out) {
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, out);
  return !s.empty() && ec == std::errc() && ptr == end;
}

std::vector<std::string> ExpectedHeader(bool with_total_gpus) {
  std::vector<std::string> h = {"workload", "sc_policy", "tune", "seed"};
  if (with_total_gpus) h.push_back("total_gpus");
  for (int c = 0; c < kDemandBins; ++c) h.push_back(std::to_string(c));
  return h;
}

template <typename T>
Status CheckUnique(const std::vector<T>& items, const char* what) {
  std::set<T> seen;
  for (const auto& x : items) {
    if (!seen.insert(x).second)
      return Status::InvalidArgument(fmt::format("{} '{}' is listed twice", what, x));
  }
  return Status::Ok();
}

}  // namespace

std::vector<std::string> PublishedTraces() {
  return {"default",    "cpu050",     "cpu100",      "cpu200",     "cpu250",    "gpushare40",
          "gpushare60", "gpushare80", "gpushare100", "gpuspec10",  "gpuspec20", "gpuspec25",
          "gpuspec33",  "multigpu20", "multigpu30",  "multigpu40", "multigpu50"};
}

std::vector<std::string> SweepPolicyNames() {
  std::vector<std::string> names = PolicyNames();
  names.emplace_back(kBoundPolicy);
  names.emplace_back(kRelaxedBoundPolicy);
  return names;
}

std::vector<std::string> PublishedPolicies() {
  return {"random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd"};
}

Result<std::vector<uint64_t>> ParseSeeds(const std::string& text) {
  std::vector<uint64_t> seeds;
  if (Trim(text).empty()) return Status::InvalidArgument("seeds: empty (use e.g. 42-51 or 42,43)");
  for (const std::string& raw : Split(text, ',')) {
    const std::string item = Trim(raw);
    if (item.empty()) return Status::InvalidArgument(fmt::format("seeds '{}': empty item", text));
    const auto dash = item.find('-');
    if (dash == std::string::npos) {
      ASSIGN_OR_RETURN(const uint64_t v, ParseSeedNumber(item, text));
      seeds.push_back(v);
      continue;
    }
    ASSIGN_OR_RETURN(const uint64_t lo, ParseSeedNumber(Trim(item.substr(0, dash)), text));
    ASSIGN_OR_RETURN(const uint64_t hi, ParseSeedNumber(Trim(item.substr(dash + 1)), text));
    if (hi < lo) {
      return Status::InvalidArgument(fmt::format("seeds '{}': range '{}' ends before it starts", text, item));
    }
    if (hi - lo >= 1000000) {
      return Status::InvalidArgument(fmt::format("seeds '{}': range '{}' is too long", text, item));
    }
    for (uint64_t s = lo;; ++s) {
      seeds.push_back(s);
      if (s == hi) break;
    }
  }
  std::set<uint64_t> seen;
  for (uint64_t s : seeds) {
    if (!seen.insert(s).second)
      return Status::InvalidArgument(fmt::format("seeds '{}': {} is listed twice", text, s));
  }
  return seeds;
}

Result<std::vector<std::string>> ParseNameList(const std::string& text, const char* what) {
  std::vector<std::string> out;
  for (const std::string& raw : Split(text, ',')) {
    std::string item = Trim(raw);
    if (item.empty()) return Status::InvalidArgument(fmt::format("{} '{}': empty item", what, text));
    out.push_back(std::move(item));
  }
  RETURN_IF_ERROR(CheckUnique(out, what));
  return out;
}

void SortDiscreteRows(std::vector<DiscreteRow>& rows) {
  std::sort(rows.begin(), rows.end(), [](const DiscreteRow& a, const DiscreteRow& b) {
    return std::tie(a.workload, a.sc_policy, a.seed, a.tune) <
           std::tie(b.workload, b.sc_policy, b.seed, b.tune);
  });
}

std::string FormatDiscreteCsv(const DiscreteTable& table) {
  std::string out = fmt::format("{}\n", fmt::join(ExpectedHeader(table.has_total_gpus), ","));
  for (const DiscreteRow& r : table.rows) {
    out += fmt::format("{},{},{},{}", r.workload, r.sc_policy, PyFloatRepr(r.tune), r.seed);
    if (table.has_total_gpus) out += fmt::format(",{}", r.total_gpus);
    for (double v : r.values) {
      out += ',';
      out += PyFloatRepr(v);
    }
    out += '\n';
  }
  return out;
}

Status WriteDiscreteCsv(const DiscreteTable& table, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::IoError(fmt::format("{}: cannot open for writing", path));
  out << FormatDiscreteCsv(table);
  out.close();
  if (!out) return Status::IoError(fmt::format("{}: write failed", path));
  return Status::Ok();
}

Result<DiscreteTable> ReadDiscreteCsv(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IoError(fmt::format("{}: cannot open", path));
  std::string line;
  if (!std::getline(in, line))
    return Status::InvalidArgument(fmt::format("{}:1: empty file, no header", path));
  if (!line.empty() && line.back() == '\r') line.pop_back();
  DiscreteTable table;
  const auto header = Split(line, ',');
  if (header == ExpectedHeader(true)) {
    table.has_total_gpus = true;
  } else if (header != ExpectedHeader(false)) {
    return Status::InvalidArgument(fmt::format(
        "{}:1: header is not the published layout 'workload,sc_policy,tune,seed[,total_gpus],0,1,...,130'",
        path));
  }
  const size_t first_value = table.has_total_gpus ? 5 : 4;
  std::set<std::tuple<std::string, std::string, double, uint64_t>> keys;
  int line_no = 1;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const auto f = Split(line, ',');
    auto bad = [&](const std::string& why) {
      return Status::InvalidArgument(fmt::format("{}:{}: {}", path, line_no, why));
    };
    if (f.size() != header.size())
      return bad(fmt::format("{} fields, header has {}", f.size(), header.size()));
    DiscreteRow r;
    r.workload = f[0];
    r.sc_policy = f[1];
    if (r.workload.empty()) return bad("empty workload");
    if (r.sc_policy.empty()) return bad("empty sc_policy");
    if (!ParseDouble(f[2], r.tune)) return bad(fmt::format("tune is not a number: '{}'", f[2]));
    int64_t seed = 0;
    if (!ParseInt(f[3], seed) || seed < 0)
      return bad(fmt::format("seed is not a non-negative integer: '{}'", f[3]));
    r.seed = static_cast<uint64_t>(seed);
    if (table.has_total_gpus) {
      int64_t t = 0;
      if (!ParseInt(f[4], t) || t < 0 || t > 1000000000) {
        return bad(fmt::format("total_gpus is not a count: '{}'", f[4]));
      }
      r.total_gpus = static_cast<int>(t);
    }
    for (int c = 0; c < kDemandBins; ++c) {
      const std::string& cell = f[first_value + static_cast<size_t>(c)];
      if (!ParseDouble(cell, r.values[static_cast<size_t>(c)])) {
        return bad(fmt::format("column {} is not a number: '{}'", c, cell));
      }
    }
    if (!keys.emplace(r.workload, r.sc_policy, r.tune, r.seed).second) {
      return bad(fmt::format("duplicate row {},{},{},{}", r.workload, r.sc_policy, f[2], r.seed));
    }
    table.rows.push_back(std::move(r));
  }
  if (in.bad()) return Status::IoError(fmt::format("{}: read failed", path));
  return table;
}

DiscreteTable MakeDiscreteTable(const std::vector<ExperimentResult>& results, DiscreteMetric metric,
                                double inflate) {
  DiscreteTable table;
  table.has_total_gpus = metric == DiscreteMetric::kAlloc;
  for (const ExperimentResult& e : results) {
    DiscreteRow r;
    r.workload = kWorkloadPrefix + e.trace;
    r.sc_policy = PublishedPolicyName(e.policy);
    r.tune = inflate;
    r.seed = e.seed;
    r.total_gpus = e.total_gpus;
    switch (metric) {
      case DiscreteMetric::kAlloc: r.values = e.alloc; break;
      case DiscreteMetric::kFrag: r.values = e.frag; break;
      case DiscreteMetric::kFragRatio: r.values = e.frag_ratio; break;
    }
    table.rows.push_back(std::move(r));
  }
  SortDiscreteRows(table.rows);
  return table;
}

Status WriteSweepCsvs(const std::vector<ExperimentResult>& results, double inflate,
                      const std::string& out_dir) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return Status::IoError(fmt::format("{}: cannot create folder: {}", out_dir, ec.message()));
  const std::filesystem::path dir(out_dir);
  RETURN_IF_ERROR(WriteDiscreteCsv(MakeDiscreteTable(results, DiscreteMetric::kAlloc, inflate),
                                   (dir / "analysis_allo_discrete.csv").string()));
  RETURN_IF_ERROR(WriteDiscreteCsv(MakeDiscreteTable(results, DiscreteMetric::kFrag, inflate),
                                   (dir / "analysis_frag_discrete.csv").string()));
  RETURN_IF_ERROR(WriteDiscreteCsv(MakeDiscreteTable(results, DiscreteMetric::kFragRatio, inflate),
                                   (dir / "analysis_frag_ratio_discrete.csv").string()));
  return Status::Ok();
}

Result<SweepResult> RunSweep(const SweepOptions& options,
                             const std::function<void(const SweepProgress&)>& progress) {
  const auto start = std::chrono::steady_clock::now();
  if (options.traces.empty()) return Status::InvalidArgument("sweep: no traces");
  if (options.policies.empty()) return Status::InvalidArgument("sweep: no policies");
  if (options.seeds.empty()) return Status::InvalidArgument("sweep: no seeds");
  RETURN_IF_ERROR(CheckUnique(options.traces, "trace"));
  RETURN_IF_ERROR(CheckUnique(options.policies, "policy"));
  RETURN_IF_ERROR(CheckUnique(options.seeds, "seed"));
  const auto known = SweepPolicyNames();
  for (const auto& [name, profile] : options.profiles) {
    if (std::find(known.begin(), known.end(), name) != known.end()) {
      return Status::InvalidArgument(
          fmt::format("profile '{}' has the name of a built-in policy; rename it", name));
    }
  }
  for (const auto& p : options.policies) {
    if (std::find(known.begin(), known.end(), p) == known.end() && !options.profiles.contains(p)) {
      return Status::InvalidArgument(
          fmt::format("unknown policy '{}' (known: {})", p, fmt::join(known, ", ")));
    }
  }
  const std::filesystem::path traces_dir(options.traces_dir);
  const std::string nodes_csv =
      options.nodes_csv.empty() ? (traces_dir / "openb_node_list_gpu_node.csv").string() : options.nodes_csv;

  // Each trace's inputs, read once and shared read-only by the workers.
  std::vector<ExperimentInputs> inputs;
  inputs.reserve(options.traces.size());
  for (const auto& trace : options.traces) {
    const std::string pods_csv = (traces_dir / (kWorkloadPrefix + trace + ".csv")).string();
    auto loaded = LoadExperimentInputs(nodes_csv, pods_csv);
    if (!loaded.ok()) return loaded.status().WithContext(fmt::format("trace '{}'", trace));
    inputs.push_back(std::move(loaded).value());
  }

  struct Task {
    size_t trace;
    ExperimentOptions options;
  };
  std::vector<Task> tasks;
  for (size_t t = 0; t < options.traces.size(); ++t) {
    for (const auto& policy : options.policies) {
      for (uint64_t seed : options.seeds) {
        ExperimentOptions e;
        e.trace = options.traces[t];
        e.policy = policy;
        e.seed = seed;
        e.inflate = options.inflate;
        e.arrival_order_dir = options.arrival_order_dir;
        e.exclusive = options.exclusive;
        if (auto it = options.profiles.find(policy); it != options.profiles.end()) e.profile = it->second;
        tasks.push_back({t, std::move(e)});
      }
    }
  }

  std::vector<std::optional<ExperimentResult>> slots(tasks.size());
  std::mutex mu;  // guards done and the progress callback
  int done = 0;
  const int total = static_cast<int>(tasks.size());
  const Status status = ParallelFor(tasks.size(), options.jobs, [&](size_t i) -> Status {
    const Task& task = tasks[i];
    Result<ExperimentResult> r = Status::Internal("not run");
    try {
      r = RunExperiment(inputs[task.trace], task.options);
    } catch (const std::exception& ex) {
      r = Status::Internal(fmt::format("exception: {}", ex.what()));
    }
    if (!r.ok()) {
      return r.status().WithContext(fmt::format("experiment trace={} policy={} seed={}", task.options.trace,
                                                task.options.policy, task.options.seed));
    }
    std::lock_guard<std::mutex> lock(mu);
    slots[i] = std::move(r).value();
    ++done;
    if (progress) {
      SweepProgress p;
      p.done = done;
      p.total = total;
      p.last = &*slots[i];
      p.elapsed_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      progress(p);
    }
    return Status::Ok();
  });
  if (!status.ok()) return status;

  SweepResult result;
  result.results.reserve(slots.size());
  for (auto& s : slots) result.results.push_back(std::move(*s));
  std::sort(result.results.begin(), result.results.end(),
            [](const ExperimentResult& a, const ExperimentResult& b) {
              return std::tie(a.trace, a.policy, a.seed) < std::tie(b.trace, b.policy, b.seed);
            });
  if (!options.out_dir.empty())
    RETURN_IF_ERROR(WriteSweepCsvs(result.results, options.inflate, options.out_dir));
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace gpupool
