#include "cli/sim_commands.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/replay_command.h"
#include "config/profile_yaml.h"
#include "sched/profile.h"
#include "sim/compare.h"
#include "sim/experiment.h"
#include "sim/report.h"
#include "sim/sweep.h"
#include "sim/train.h"

namespace gpupool {

namespace {

int Fail(const Status& st) {
  std::cerr << "gpupool: " << st.ToString() << "\n";
  const bool bad_input = st.code() == StatusCode::kInvalidArgument || st.code() == StatusCode::kNotFound;
  return bad_input ? 2 : 1;
}

// "openb_pod_list_default.csv" -> "default"; otherwise the file stem.
std::string TraceNameFromPods(const std::string& pods_csv) {
  std::string stem = std::filesystem::path(pods_csv).stem().string();
  constexpr std::string_view kPrefix = "openb_pod_list_";
  if (stem.size() > kPrefix.size() && stem.compare(0, kPrefix.size(), kPrefix) == 0) {
    return stem.substr(kPrefix.size());
  }
  return stem;
}

std::string Duration(double seconds) {
  if (!(seconds >= 0)) seconds = 0;
  const auto s = static_cast<long long>(seconds + 0.5);
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m{:02}s", s / 3600, (s % 3600) / 60, s % 60);
}

Result<std::vector<int>> ParseColumns(const std::string& text) {
  ASSIGN_OR_RETURN(const auto items, ParseNameList(text, "--at"));
  std::vector<int> out;
  for (const std::string& item : items) {
    int v = 0;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (ec != std::errc() || ptr != item.data() + item.size() || v < 0 || v >= kDemandBins) {
      return Status::InvalidArgument(
          fmt::format("--at '{}': '{}' is not a column 0..{}", text, item, kDemandBins - 1));
    }
    out.push_back(v);
  }
  return out;
}

struct RunArgs {
  std::string nodes_csv;
  std::string pods_csv;
  std::string policy = "balanced";
  uint64_t seed = 42;
  double inflate = 1.3;
  std::string arrival_order_dir;
  bool exclusive = false;
  std::string json_out;
  std::string trace;
  bool repack = false;
  int migrate = 0;
  int migrate_per_pod = 1;
  bool migrate_whole_only = false;
};

struct SweepArgs {
  std::string traces_dir;
  std::string nodes_csv;
  std::string policies = "all";
  std::string seeds = "42-51";
  std::string arrival_order_dir;
  std::string out_dir;
  int jobs = 0;
  std::string trace_list;
  double inflate = 1.3;
  bool exclusive = false;
};

struct CompareArgs {
  std::string expected_csv;
  std::string actual_csv;
  std::string at = "100,130";
  double tolerance = 0;
  std::string baseline = "05-BestFit";
  bool table = false;
  std::string reference = "06-FGD";
  std::string tuned_on;
};

struct ReportArgs {
  std::string alloc_csv;
  std::string frag_csv;
  std::string out;
  std::string trace;
};

struct TrainArgs {
  std::string traces_dir;
  std::string nodes_csv;
  std::string trace_list;
  std::string seeds = "42-44";
  std::string arrival_order_dir;
  int generations = 15;
  int pairs = 6;
  double sigma = 0.2;
  double learning_rate = 0.1;
  uint64_t es_seed = 1;
  int jobs = 0;
  double inflate = 1.3;
  std::string start;  // a profile YAML whose balanced weights to start from
  std::string name = "learned";
  std::string out;
};

struct SimState {
  std::function<int()> replay;
  CLI::App* train = nullptr;
  TrainArgs train_args;
  CLI::App* run = nullptr;
  CLI::App* sweep = nullptr;
  CLI::App* compare = nullptr;
  CLI::App* report = nullptr;
  RunArgs run_args;
  SweepArgs sweep_args;
  CompareArgs compare_args;
  ReportArgs report_args;
};

int RunCommand(const RunArgs& a) {
  auto inputs = LoadExperimentInputs(a.nodes_csv, a.pods_csv);
  if (!inputs.ok()) return Fail(inputs.status());
  ExperimentOptions options;
  options.trace = a.trace.empty() ? TraceNameFromPods(a.pods_csv) : a.trace;
  options.policy = a.policy;
  options.seed = a.seed;
  options.inflate = a.inflate;
  if (!a.arrival_order_dir.empty()) options.arrival_order_dir = a.arrival_order_dir;
  options.exclusive = a.exclusive;
  options.repack = a.repack;
  options.migrate_moves = a.migrate;
  options.migrate_per_pod = a.migrate_per_pod;
  options.migrate_whole_only = a.migrate_whole_only;
  if (a.repack && (a.policy == "bound" || a.policy == "bound-relaxed")) {
    return Fail(
        Status::InvalidArgument("--repack needs a placement policy; '" + a.policy + "' places no pods"));
  }
  auto result = RunExperiment(*inputs, options);
  if (!result.ok()) return Fail(result.status());
  const ExperimentResult& r = *result;
  fmt::print("policy {} ({}), trace {}, seed {}{}\n", r.policy, PublishedPolicyName(r.policy), r.trace,
             r.seed, a.exclusive ? ", exclusive GPUs" : "");
  fmt::print("pods: {} arrived, {} scheduled, {} failed\n", r.pods_arrived, r.pods_scheduled, r.pods_failed);
  fmt::print("GPU allocation: {:.2f}% at 100% arrived demand, {:.2f}% at 130%\n", r.alloc[100], r.alloc[130]);
  fmt::print("fragmentation at 130%: {:.2f}% of all GPUs ({:.2f}% of idle GPU)\n", r.frag[130],
             r.frag_ratio[130]);
  fmt::print("time: {:.3f} s ({} GPUs)\n", r.seconds, r.total_gpus);
  if (a.migrate > 0) {
    const double idle = static_cast<double>(int64_t{r.total_gpus} * 1000 - r.used_gpu_milli) / 1000.0;
    fmt::print(
        "migration: {} of {} pods that fit nowhere were placed by moving others ({} had no node where movers with "
        "room elsewhere could make room); {} moves carrying {:.1f} GPUs' worth; idle at the end {:.1f} GPUs "
        "({:.2f}%)\n",
        r.consolidated, r.consolidation_attempts, r.consolidation_no_candidate, r.migrations,
        static_cast<double>(r.migrated_gpu_milli) / 1000.0, idle, 100.0 * idle / r.total_gpus);
  }
  if (r.repack) {
    const RepackResult& p = *r.repack;
    const double held = static_cast<double>(p.share_milli) / 1000.0;
    fmt::print(
        "repack: {} GPU-sharing pods hold {:.1f} GPUs' worth on {} GPUs ({:.1f} idle beside them); packed as "
        "tightly as possible (nodes, CPU, memory and GPU models ignored) they need {}{} ({:.1f} idle)\n",
        p.share_pods, held, p.share_gpus, static_cast<double>(p.share_gpus) - held, p.min_gpus,
        p.optimal ? "" : " or more (the LP bound: branch and bound ran out of time)",
        static_cast<double>(p.min_gpus) - held);
    const int64_t freed = std::min(p.share_gpus - p.min_gpus, r.failed_whole_gpus);
    const double idle = static_cast<double>(int64_t{r.total_gpus} * 1000 - r.used_gpu_milli) / 1000.0;
    fmt::print(
        "repack: idle at the end {:.1f} GPUs ({:.2f}%); if the {} GPUs it frees went to whole-GPU pods "
        "that found no room ({} GPUs asked), {:.1f} ({:.2f}%)\n",
        idle, 100.0 * idle / r.total_gpus, freed, r.failed_whole_gpus, idle - static_cast<double>(freed),
        100.0 * (idle - static_cast<double>(freed)) / r.total_gpus);
    std::string admitted;
    for (const auto& [milli, share] : r.share_admission) {
      admitted += fmt::format("{}{:.2f} {}/{}", admitted.empty() ? "" : ", ",
                              static_cast<double>(milli) / 1000.0, share.placed, share.arrived);
    }
    fmt::print("repack: GPU-sharing pods placed/arrived by per-GPU share: {}\n",
               admitted.empty() ? "none" : admitted);
  }
  if (!a.json_out.empty()) {
    if (Status st = WriteExperimentJson(r, a.json_out); !st.ok()) return Fail(st);
    fmt::print("wrote {}\n", a.json_out);
  }
  return 0;
}

int SweepCommand(const SweepArgs& a) {
  SweepOptions options;
  options.traces_dir = a.traces_dir;
  options.nodes_csv = a.nodes_csv;
  if (!a.trace_list.empty()) {
    auto traces = ParseNameList(a.trace_list, "trace");
    if (!traces.ok()) return Fail(traces.status().WithContext("--trace-list"));
    options.traces = *traces;
  }
  // "all" is the six published policies. Otherwise the items run in the order given: profile files
  // (.yaml/.yml) as policies named by the profile's name, other items as built-in policies, which
  // RunSweep checks against SweepPolicyNames().
  std::vector<std::string> names;
  if (a.policies == "all") {
    names = PublishedPolicies();
  } else {
    auto items = ParseNameList(a.policies, "policy");
    if (!items.ok()) return Fail(items.status().WithContext("--policies"));
    for (const std::string& item : *items) {
      const std::string ext = std::filesystem::path(item).extension().string();
      if (ext != ".yaml" && ext != ".yml") {
        if (item == "all") {
          return Fail(Status::InvalidArgument("--policies: 'all' cannot be combined with other policies"));
        }
        names.push_back(item);
        continue;
      }
      auto profile = LoadProfileFile(item);
      if (!profile.ok()) return Fail(profile.status().WithContext("--policies"));
      const std::string name =
          profile->name.empty() ? std::filesystem::path(item).stem().string() : profile->name;
      if (!options.profiles.emplace(name, *profile).second) {
        return Fail(Status::InvalidArgument(fmt::format("--policies: two profiles are named '{}'", name)));
      }
      names.push_back(name);
    }
  }
  options.policies = names;
  auto seeds = ParseSeeds(a.seeds);
  if (!seeds.ok()) return Fail(seeds.status().WithContext("--seeds"));
  options.seeds = *seeds;
  if (!a.arrival_order_dir.empty()) options.arrival_order_dir = a.arrival_order_dir;
  options.out_dir = a.out_dir;
  options.jobs = a.jobs;
  options.inflate = a.inflate;
  options.exclusive = a.exclusive;

  const bool tty = isatty(STDERR_FILENO) != 0;
  int last_step = 0;  // 5 % steps reported so far (not a terminal)
  auto progress = [&](const SweepProgress& p) {
    const double eta = p.done > 0 ? p.elapsed_seconds / p.done * (p.total - p.done) : 0;
    const double pct = 100.0 * p.done / p.total;
    if (tty) {
      std::fprintf(stderr, "\r\033[Ksweep: %d/%d (%.0f%%), elapsed %s, ETA %s", p.done, p.total, pct,
                   Duration(p.elapsed_seconds).c_str(), Duration(eta).c_str());
      if (p.done == p.total) std::fputc('\n', stderr);
      std::fflush(stderr);
      return;
    }
    const int step = p.done * 20 / p.total;
    if (step > last_step) {
      last_step = step;
      std::fprintf(stderr, "sweep: %d/%d (%.0f%%), elapsed %s, ETA %s\n", p.done, p.total, pct,
                   Duration(p.elapsed_seconds).c_str(), Duration(eta).c_str());
      std::fflush(stderr);
    }
  };
  auto result = RunSweep(options, progress);
  if (!result.ok()) {
    if (tty) std::fputc('\n', stderr);
    return Fail(result.status());
  }
  fmt::print("{} experiments ({} traces x {} policies x {} seeds) in {:.1f} s\n", result->results.size(),
             options.traces.size(), options.policies.size(), options.seeds.size(), result->seconds);
  const std::filesystem::path out(a.out_dir);
  for (const char* name :
       {"analysis_allo_discrete.csv", "analysis_frag_discrete.csv", "analysis_frag_ratio_discrete.csv"}) {
    fmt::print("wrote {}\n", (out / name).string());
  }
  return 0;
}

int CompareCommand(const CompareArgs& a) {
  CompareOptions options;
  options.expected_csv = a.expected_csv;
  options.actual_csv = a.actual_csv;
  auto columns = ParseColumns(a.at);
  if (!columns.ok()) return Fail(columns.status());
  options.columns = *columns;
  options.tolerance = a.tolerance;
  options.baseline = a.baseline;
  if (a.table) {
    auto expected = ReadDiscreteCsv(a.expected_csv);
    if (!expected.ok()) return Fail(expected.status());
    auto actual = ReadDiscreteCsv(a.actual_csv);
    if (!actual.ok()) return Fail(actual.status());
    std::vector<std::string> tuned_on;
    if (!a.tuned_on.empty()) {
      auto names = ParseNameList(a.tuned_on, "tuned-on trace");
      if (!names.ok()) return Fail(names.status());
      tuned_on = *names;
    }
    auto table = MakePolicyTable(*expected, *actual, options.columns.back(), a.reference, tuned_on);
    if (!table.ok()) return Fail(table.status());
    fmt::print("{}", FormatPolicyTable(*table));
    return 0;
  }
  auto result = CompareFiles(options);
  if (!result.ok()) return Fail(result.status());
  fmt::print("{}", FormatCompare(*result));
  return result->exceeds_tolerance ? 1 : 0;
}

int TrainCommand(const TrainArgs& a, const std::string& command) {
  TrainOptions options;
  options.traces_dir = a.traces_dir;
  options.nodes_csv = a.nodes_csv;
  auto traces = ParseNameList(a.trace_list, "trace");
  if (!traces.ok()) return Fail(traces.status().WithContext("--trace-list"));
  options.traces = *traces;
  auto seeds = ParseSeeds(a.seeds);
  if (!seeds.ok()) return Fail(seeds.status().WithContext("--seeds"));
  options.seeds = *seeds;
  if (!a.arrival_order_dir.empty()) options.arrival_order_dir = a.arrival_order_dir;
  options.generations = a.generations;
  options.pairs = a.pairs;
  options.sigma = a.sigma;
  options.learning_rate = a.learning_rate;
  options.seed = a.es_seed;
  options.jobs = a.jobs;
  options.inflate = a.inflate;
  if (!a.start.empty()) {
    auto profile = LoadProfileFile(a.start);
    if (!profile.ok()) return Fail(profile.status().WithContext("--start"));
    auto w = BalancedWeights::FromProfile(*profile);
    if (!w.ok()) return Fail(w.status().WithContext(fmt::format("--start {}", a.start)));
    options.start = *w;
  }
  if (a.name.empty()) return Fail(Status::InvalidArgument("--name must not be empty"));
  auto result = TrainBalancedWeights(options, [](const TrainGeneration& g) {
    std::fprintf(stderr, "train: generation %d: objective %.4f, best %.4f (%.0f s)\n", g.generation,
                 g.objective, g.best, g.seconds);
  });
  if (!result.ok()) return Fail(result.status());
  const std::string text = FormatTrainedProfile(*result, options, a.name, command);
  // Written whole or not at all: a temporary file renamed over the target.
  const std::filesystem::path out(a.out);
  const std::filesystem::path tmp = out.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    f.close();
    if (!f) return Fail(Status::Internal(fmt::format("cannot write '{}'", tmp.string())));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, out, ec);
  if (ec)
    return Fail(
        Status::Internal(fmt::format("cannot rename '{}' to '{}': {}", tmp.string(), a.out, ec.message())));
  fmt::print("objective {:.4f} -> {:.4f} in {} runs, {:.0f} s\nwrote {}\n", result->start_objective,
             result->best_objective, result->runs, result->seconds, a.out);
  return 0;
}

int ReportCommand(const ReportArgs& a) {
  auto alloc = ReadDiscreteCsv(a.alloc_csv);
  if (!alloc.ok()) return Fail(alloc.status());
  auto frag = ReadDiscreteCsv(a.frag_csv);
  if (!frag.ok()) return Fail(frag.status());
  if (Status st = WriteReportHtml(*alloc, *frag, a.trace, a.out); !st.ok()) return Fail(st);
  fmt::print("wrote {}\n", a.out);
  return 0;
}

}  // namespace

std::function<int()> AddSimCommands(CLI::App& app) {
  auto state = std::make_shared<SimState>();
  auto* sim = app.add_subcommand("sim", "Trace-driven simulator: the FGD experiments, and replays over time");
  sim->require_subcommand(1);

  RunArgs& r = state->run_args;
  state->run = sim->add_subcommand("run", "Run one experiment");
  state->run->add_option("--nodes", r.nodes_csv, "Node list (openb_node_list_*.csv)")->required();
  state->run->add_option("--pods", r.pods_csv, "Pod list (openb_pod_list_*.csv)")->required();
  state->run->add_option("--policy", r.policy, "Placement policy")
      ->check(CLI::IsMember(SweepPolicyNames()))
      ->capture_default_str();
  state->run->add_option("--seed", r.seed, "Seed of the arrival order and tie-breaks")->capture_default_str();
  state->run->add_option("--inflate", r.inflate, "GPU demand to reach, x GPU capacity")
      ->capture_default_str();
  state->run->add_option(
      "--arrival-order", r.arrival_order_dir,
      "Folder with <trace>_<seed>_pods.txt and <trace>_<seed>_nodes.txt (a published run)");
  state->run->add_flag("--exclusive", r.exclusive, "Every GPU-sharing pod takes a whole GPU");
  state->run->add_option("--json", r.json_out, "Write the result as JSON to this file");
  state->run->add_option("--trace", r.trace, "Trace name (default: from the pods file name)");
  state->run->add_flag(
      "--repack", r.repack,
      "After the run, the fewest GPUs its GPU-sharing pods could be packed on (sim/repack.h)");
  state->run
      ->add_option("--migrate", r.migrate,
                   "A pod that fits nowhere may get room by moving up to this many placed single-GPU pods "
                   "(sched/consolidation.h); 0: never")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  state->run->add_option("--migrate-per-pod", r.migrate_per_pod, "How often one pod may move")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  state->run->add_flag("--migrate-whole-only", r.migrate_whole_only,
                       "Make room only for pods of whole GPUs (a share pod that fits nowhere still fails)");

  SweepArgs& s = state->sweep_args;
  state->sweep = sim->add_subcommand("sweep", "Run a grid of traces x policies x seeds in parallel");
  state->sweep->add_option("--traces", s.traces_dir, "Folder with openb_pod_list_<trace>.csv")->required();
  state->sweep->add_option("--nodes", s.nodes_csv,
                           "Node list (default: <traces>/openb_node_list_gpu_node.csv)");
  state->sweep
      ->add_option("--policies", s.policies,
                   "'all' or a comma-separated list of policy names and profile files (.yaml, e.g. "
                   "one written by 'sim train')")
      ->capture_default_str();
  state->sweep->add_option("--seeds", s.seeds, "Seeds, e.g. 42-51 or 42,43")->capture_default_str();
  state->sweep->add_option("--arrival-order", s.arrival_order_dir,
                           "Folder with the published arrival orders");
  state->sweep->add_option("--out", s.out_dir, "Folder for the three analysis_*_discrete.csv files")
      ->required();
  state->sweep->add_option("--jobs", s.jobs, "Worker threads (0: one per hardware thread)")
      ->capture_default_str();
  state->sweep->add_option("--trace-list", s.trace_list,
                           "Comma-separated traces (default: the 17 published variants)");
  state->sweep->add_option("--inflate", s.inflate, "GPU demand to reach, x GPU capacity")
      ->capture_default_str();
  state->sweep->add_flag("--exclusive", s.exclusive, "Every GPU-sharing pod takes a whole GPU");

  CompareArgs& c = state->compare_args;
  state->compare = sim->add_subcommand("compare", "Compare two published-layout result CSVs");
  state->compare->add_option("--expected", c.expected_csv, "Expected CSV (e.g. the published one)")
      ->required();
  state->compare->add_option("--actual", c.actual_csv, "Actual CSV (e.g. from sim sweep)")->required();
  state->compare->add_option("--at", c.at, "Columns to show (arrived demand %)")->capture_default_str();
  state->compare->add_option("--tolerance", c.tolerance, "Largest difference that still counts as equal")
      ->capture_default_str();
  state->compare->add_option("--baseline", c.baseline, "sc_policy of the baseline for the reduction")
      ->capture_default_str();
  state->compare->add_flag("--table", c.table,
                           "Every policy of --actual side by side per trace at the last --at column, with "
                           "the --reference policy of --expected and each new policy's margin over it");
  state->compare->add_option("--tuned-on", c.tuned_on,
                             "With --table: comma-separated traces the new policies were tuned on; they and "
                             "the held-out rest are reported as two groups");
  state->compare->add_option("--reference", c.reference, "sc_policy of --expected that --table compares to")
      ->capture_default_str();

  TrainArgs& t = state->train_args;
  state->train = sim->add_subcommand(
      "train", "Train the balanced policy's weights by evolution strategies and write them as a profile");
  state->train->add_option("--traces", t.traces_dir, "Folder with openb_pod_list_<trace>.csv")->required();
  state->train->add_option("--nodes", t.nodes_csv,
                           "Node list (default: <traces>/openb_node_list_gpu_node.csv)");
  state->train->add_option("--trace-list", t.trace_list, "Comma-separated traces to train on")->required();
  state->train->add_option("--seeds", t.seeds, "Seeds of the training runs")->capture_default_str();
  state->train->add_option("--arrival-order", t.arrival_order_dir,
                           "Folder with the published arrival orders");
  state->train->add_option("--generations", t.generations, "ES generations")->capture_default_str();
  state->train->add_option("--pairs", t.pairs, "Antithetic pairs per generation")->capture_default_str();
  state->train->add_option("--sigma", t.sigma, "Perturbation size")->capture_default_str();
  state->train->add_option("--learning-rate", t.learning_rate, "Step size")->capture_default_str();
  state->train->add_option("--es-seed", t.es_seed, "Seed of the perturbations")->capture_default_str();
  state->train->add_option("--jobs", t.jobs, "Worker threads (0: one per hardware thread)")
      ->capture_default_str();
  state->train->add_option("--inflate", t.inflate, "GPU demand to reach, x GPU capacity")
      ->capture_default_str();
  state->train->add_option("--start", t.start,
                           "Profile YAML whose balanced weights to start from (default: balanced's)");
  state->train->add_option("--name", t.name, "Name of the written profile")->capture_default_str();
  state->train->add_option("--out", t.out, "Profile YAML to write")->required();

  ReportArgs& p = state->report_args;
  state->report = sim->add_subcommand("report", "Write an HTML page of allocation and fragmentation curves");
  state->report->add_option("--alloc", p.alloc_csv, "analysis_allo_discrete.csv")->required();
  state->report->add_option("--frag", p.frag_csv, "analysis_frag_discrete.csv")->required();
  state->report->add_option("--out", p.out, "HTML file to write")->required();
  state->report->add_option("--trace", p.trace, "Only this trace (default: every trace in the input)");

  state->replay = AddReplayCommand(*sim);

  return [state]() -> int {
    try {
      if (int rc = state->replay(); rc >= 0) return rc;
      if (*state->train) {
        // The command as given, for the profile's header.
        std::string command = "gpupool sim train";
        for (const CLI::Option* o : state->train->get_options()) {
          if (o->count() == 0 || o->get_name() == "--help") continue;
          command += " " + o->get_name() + " " + o->as<std::string>();
        }
        return TrainCommand(state->train_args, command);
      }
      if (*state->run) return RunCommand(state->run_args);
      if (*state->sweep) return SweepCommand(state->sweep_args);
      if (*state->compare) return CompareCommand(state->compare_args);
      if (*state->report) return ReportCommand(state->report_args);
    } catch (const std::exception& ex) {
      std::cerr << "gpupool: " << ex.what() << "\n";
      return 1;
    }
    return -1;
  };
}

}  // namespace gpupool
