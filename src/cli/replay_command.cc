#include "cli/replay_command.h"

#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "sim/job_exports.h"
#include "sim/replay.h"
#include "sim/replay_report.h"
#include "sim/trace.h"

namespace gpupool {

namespace {

struct ReplayArgs {
  std::string trace;
  std::string format = "philly";
  std::string cluster = "8x56,2x32";
  std::string model = "P100";
  std::string nodes_csv;
  std::string policy = "balanced";
  std::string ordering = "hierarchical";
  double load = 1.0;
  int64_t sample_seconds = 900;
  uint64_t seed = 1;
  std::string series_csv;
  std::string queue_series_csv;
  std::string jobs_csv;
  std::string json_out;
  std::string html_out;
  MigrationOptions migration;
  bool exclusive = false;
  int64_t reserve_after = 60;
  FailureOptions failures;
};

nlohmann::json DistributionJson(const Distribution& d) {
  return {{"count", d.count}, {"mean", d.mean}, {"p50", d.p50}, {"p95", d.p95}, {"p99", d.p99}, {"max", d.max}};
}

int ReplayCommand(const ReplayArgs& a) {
  const auto fail = [](const Status& st) {
    std::cerr << "gpupool: " << st.ToString() << "\n";
    return 1;
  };
  if (!(a.load > 0) || a.load > 1000) return fail(Status::InvalidArgument("--load must be in (0, 1000]"));
  const GpuCatalog catalog = GpuCatalog::Builtin();
  Result<std::vector<NodeSpec>> nodes =
      a.nodes_csv.empty() ? ServerCluster(a.cluster, a.model, catalog) : ReadOpenbNodes(a.nodes_csv, catalog);
  if (!nodes.ok()) return fail(nodes.status());
  int max_gpus = 1;
  for (const NodeSpec& n : *nodes) max_gpus = std::max(max_gpus, static_cast<int>(n.gpus.size()));
  const int gpus_per_task = std::min(max_gpus, 64);
  Result<ExportRead> read = ExportRead{};
  if (a.format == "sacct") {
    read = ReadSacctJobs(a.trace, gpus_per_task);
  } else if (a.format == "kubectl") {
    read = ReadKubectlPods(a.trace);
  } else {
    auto jobs = a.format == "openb" ? ReadOpenbTimedPods(a.trace) : ReadPhillyJobs(a.trace, gpus_per_task);
    if (!jobs.ok()) return fail(jobs.status());
    read->jobs = std::move(*jobs);
  }
  if (!read.ok()) return fail(read.status());
  if (!read->skipped.empty()) {
    int64_t total = 0;
    for (const auto& [reason, n] : read->skipped) total += n;
    fmt::print("{}: skipped {} records: {}\n", a.trace, total, DescribeSkipped(read->skipped));
  }
  auto ordering = ParseOrderingPolicy(a.ordering);
  if (!ordering.ok()) return fail(ordering.status());
  ReplayOptions options;
  options.policy = a.policy;
  options.ordering = *ordering;
  options.sample_seconds = a.sample_seconds;
  options.seed = a.seed;
  options.migration = a.migration;
  options.exclusive = a.exclusive;
  options.reserve_after_seconds = a.reserve_after;
  options.failures = a.failures;
  const std::vector<TimedJob> offered = ScaleLoad(std::move(read->jobs), a.load);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = Replay(*nodes, offered, options, DefaultRegistry());
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!r.ok()) return fail(r.status());
  const double days = static_cast<double>(r->makespan) / 86400.0;
  fmt::print("{} jobs on {} nodes ({} GPUs), policy {}, {} order, load x{}: replayed in {:.2f} s\n", offered.size(),
             nodes->size(), r->capacity_milli / 1000, a.policy, a.ordering, a.load, wall);
  fmt::print("  started {} of {}; makespan {:.1f} days; GPUs allocated {:.1f} % of capacity over it\n", r->started,
             offered.size(), days, 100.0 * r->utilisation);
  if (r->window > 0) {
    const double cap = static_cast<double>(r->capacity_milli) * static_cast<double>(r->window);
    fmt::print("  over the arrivals' {:.1f} days: GPUs allocated {:.1f} %, asked for by running jobs {:.1f} %; {} jobs "
               "ended in it\n",
               static_cast<double>(r->window) / 86400.0, 100.0 * static_cast<double>(r->window_allocated_milli_seconds) / cap,
               100.0 * static_cast<double>(r->window_asked_milli_seconds) / cap, r->completed_in_window);
  }
  fmt::print("  wait (s): mean {:.0f}, p50 {}, p95 {}, p99 {}, max {}\n", r->wait.mean, r->wait.p50, r->wait.p95,
             r->wait.p99, r->wait.max);
  fmt::print("  JCT (s):  mean {:.0f}, p50 {}, p95 {}, p99 {}\n", r->jct.mean, r->jct.p50, r->jct.p95, r->jct.p99);
  fmt::print("  {} scheduling passes ({} pruned ones run again in full), {} gangs offered to placement, {} held nodes "
             "for\n",
             r->passes, r->redone_passes, r->attempts, r->reservations);
  if (r->node_failures > 0 || a.failures.node_mtbf_hours > 0) {
    fmt::print("  node failures: {}, stopping jobs {} times; {:.1f} GPU-hours of work done again\n", r->node_failures,
               r->interruptions, static_cast<double>(r->failure_lost_milli_seconds) / 3.6e6);
  }
  if (r->preemptions > 0) {
    fmt::print("  preemption: {} jobs started by evicting best-effort work, {} evictions; {:.1f} GPU-hours of work done "
               "again\n",
               r->preemptors, r->preemptions, static_cast<double>(r->preempted_lost_milli_seconds) / 3.6e6);
  }
  if (r->resume_restart_milli_seconds > 0) {
    fmt::print("  restarts of stopped jobs placed again: {:.1f} GPU-hours\n",
               static_cast<double>(r->resume_restart_milli_seconds) / 3.6e6);
  }
  if (a.migration.max_moves > 0) {
    fmt::print("  migration: {} jobs started by moving others ({} plans sought); {} tasks moved, costing {:.1f} "
               "GPU-hours of work done again and {:.1f} GPU-hours of restarts\n",
               r->consolidated, r->consolidation_attempts, r->migrations,
               static_cast<double>(r->lost_milli_seconds) / 3.6e6, static_cast<double>(r->restart_milli_seconds) / 3.6e6);
  }
  if (!a.series_csv.empty()) {
    std::ofstream out(a.series_csv, std::ios::binary | std::ios::trunc);
    out << ReplaySeriesCsv(*r);
    if (!out.flush()) return fail(Status::IoError(fmt::format("{}: cannot write", a.series_csv)));
    fmt::print("wrote {}\n", a.series_csv);
  }
  if (!a.queue_series_csv.empty()) {
    std::ofstream out(a.queue_series_csv, std::ios::binary | std::ios::trunc);
    out << ReplayQueueSeriesCsv(*r, a.sample_seconds);
    if (!out.flush()) return fail(Status::IoError(fmt::format("{}: cannot write", a.queue_series_csv)));
    fmt::print("wrote {}\n", a.queue_series_csv);
  }
  if (!a.jobs_csv.empty()) {
    std::ofstream out(a.jobs_csv, std::ios::binary | std::ios::trunc);
    out << "name,queue,gpus,arrival_s,start_s,end_s\n";
    for (size_t i = 0; i < offered.size(); ++i) {
      const ReplayJob& j = r->jobs[i];
      out << fmt::format("{},{},{:.3f},{},{},{}\n", offered[i].name, offered[i].job.queue, j.gpu_milli / 1000.0,
                         j.arrival, j.start, j.end);
    }
    if (!out.flush()) return fail(Status::IoError(fmt::format("{}: cannot write", a.jobs_csv)));
    fmt::print("wrote {}\n", a.jobs_csv);
  }
  if (!a.html_out.empty()) {
    ReplayReportInfo info;
    info.title = a.trace;
    info.settings = {fmt::format("format {}", a.format),
                     a.nodes_csv.empty() ? fmt::format("cluster {} ({})", a.cluster, a.model)
                                         : fmt::format("nodes {}", a.nodes_csv),
                     fmt::format("policy {}", a.policy), fmt::format("{} order", a.ordering),
                     fmt::format("load x{}", a.load)};
    if (a.exclusive) info.settings.push_back("exclusive GPUs");
    if (a.failures.node_mtbf_hours > 0)
      info.settings.push_back(fmt::format("node failures: mean {} h up, {} s down", a.failures.node_mtbf_hours,
                                          a.failures.repair_seconds));
    if (a.migration.max_moves > 0)
      info.settings.push_back(fmt::format("migration: {} moves a plan, {} an hour, checkpoints every {} s, {} s restarts",
                                          a.migration.max_moves, a.migration.moves_per_hour,
                                          a.migration.checkpoint_seconds, a.migration.restart_seconds));
    std::ofstream out(a.html_out, std::ios::binary | std::ios::trunc);
    out << RenderReplayHtml(*r, info, a.sample_seconds);
    if (!out.flush()) return fail(Status::IoError(fmt::format("{}: cannot write", a.html_out)));
    fmt::print("wrote {}\n", a.html_out);
  }
  if (!a.json_out.empty()) {
    nlohmann::json j = {{"trace", a.trace},
                        {"format", a.format},
                        {"jobs", offered.size()},
                        {"skipped", read->skipped},
                        {"nodes", nodes->size()},
                        {"gpus", r->capacity_milli / 1000},
                        {"policy", a.policy},
                        {"ordering", a.ordering},
                        {"load", a.load},
                        {"started", r->started},
                        {"reservations", r->reservations},
                        {"makespanSeconds", r->makespan},
                        {"utilisation", r->utilisation},
                        {"wait", DistributionJson(r->wait)},
                        {"jct", DistributionJson(r->jct)},
                        {"exclusive", a.exclusive},
                        {"preemption",
                         {{"preemptors", r->preemptors},
                          {"evictions", r->preemptions},
                          {"lostGpuSeconds", static_cast<double>(r->preempted_lost_milli_seconds) / 1000.0}}},
                        {"resumeRestartGpuSeconds", static_cast<double>(r->resume_restart_milli_seconds) / 1000.0},
                        {"failures",
                         {{"nodeMtbfHours", a.failures.node_mtbf_hours},
                          {"repairSeconds", a.failures.repair_seconds},
                          {"nodeFailures", r->node_failures},
                          {"interruptions", r->interruptions},
                          {"lostGpuSeconds", static_cast<double>(r->failure_lost_milli_seconds) / 1000.0}}},
                        {"window",
                         {{"seconds", r->window},
                          {"allocatedGpuSeconds", static_cast<double>(r->window_allocated_milli_seconds) / 1000.0},
                          {"askedGpuSeconds", static_cast<double>(r->window_asked_milli_seconds) / 1000.0},
                          {"jobsEnded", r->completed_in_window}}},
                        {"migration",
                         {{"maxMoves", a.migration.max_moves},
                          {"consolidated", r->consolidated},
                          {"attempts", r->consolidation_attempts},
                          {"moves", r->migrations},
                          {"lostGpuSeconds", static_cast<double>(r->lost_milli_seconds) / 1000.0},
                          {"restartGpuSeconds", static_cast<double>(r->restart_milli_seconds) / 1000.0}}},
                        {"wallSeconds", wall}};
    nlohmann::json queues = nlohmann::json::object();
    for (const auto& [q, d] : r->wait_by_queue) queues[q] = DistributionJson(d);
    j["waitByQueue"] = std::move(queues);
    std::ofstream out(a.json_out, std::ios::binary | std::ios::trunc);
    out << j.dump(2) << "\n";
    if (!out.flush()) return fail(Status::IoError(fmt::format("{}: cannot write", a.json_out)));
    fmt::print("wrote {}\n", a.json_out);
  }
  return 0;
}

}  // namespace

std::function<int()> AddReplayCommand(CLI::App& sim) {
  auto args = std::make_shared<ReplayArgs>();
  CLI::App* cmd = sim.add_subcommand(
      "replay", "Replay a job trace over time: queueing, waits, completion times, GPUs allocated (docs/replay.md)");
  cmd->add_option("--trace", args->trace, "Job list with arrival and run time (traces/philly/philly.csv)")
      ->required();
  cmd->add_option("--format", args->format,
                  "philly (the Philly job list), openb (a pod list with its times), sacct (sacct --parsable2 "
                  "output) or kubectl (kubectl get pods -A -o json)")
      ->check(CLI::IsMember({"philly", "openb", "sacct", "kubectl"}))
      ->capture_default_str();
  cmd->add_option("--cluster", args->cluster, "Servers as <GPUs>x<count>,... (ignored with --nodes)")
      ->capture_default_str();
  cmd->add_option("--model", args->model, "GPU model of those servers")->capture_default_str();
  cmd->add_option("--nodes", args->nodes_csv, "Replay on this node list instead (openb_node_list_*.csv)");
  cmd->add_option("--policy", args->policy, "Placement policy")->capture_default_str();
  cmd->add_option("--ordering", args->ordering, "Queue order: fifo, priority, drf or hierarchical")
      ->capture_default_str();
  cmd->add_option("--load", args->load, "Arrivals compressed by this factor (2: twice the load)")
      ->capture_default_str();
  cmd->add_option("--sample", args->sample_seconds, "Step of the allocation series, seconds")
      ->check(CLI::Range(int64_t{1}, int64_t{86400 * 365}))
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "Seed of the placement tie-breaks")->capture_default_str();
  cmd->add_option("--series", args->series_csv, "Write the allocation series as CSV to this file");
  cmd->add_option("--queue-series", args->queue_series_csv,
                  "Write per queue and step what its jobs asked for and held (mean GPUs) as CSV to this file");
  cmd->add_option("--jobs", args->jobs_csv, "Write each job's arrival, start and end as CSV to this file");
  cmd->add_option("--json", args->json_out, "Write the summary as JSON to this file");
  cmd->add_option("--html", args->html_out,
                  "Write a self-contained HTML report (GPUs over time, per queue, waits, migrations) to this file");
  cmd->add_option("--node-mtbf", args->failures.node_mtbf_hours,
                  "Each node fails after an exponential time up with this mean, in hours (0: never); its jobs stop "
                  "and restart from their last checkpoint (--checkpoint, --restart)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  cmd->add_option("--repair", args->failures.repair_seconds, "Seconds a failed node stays down")
      ->check(CLI::Range(int64_t{1}, int64_t{86400} * 365))
      ->capture_default_str();
  cmd->add_option("--reserve-after", args->reserve_after,
                  "Seconds a job waits before nodes are held for it (the server's reserveAfterSeconds); -1: never")
      ->check(CLI::Range(int64_t{-1}, int64_t{86400} * 365))
      ->capture_default_str();
  cmd->add_flag("--exclusive", args->exclusive,
                "Every share of a GPU takes the whole GPU (no pooling), to measure what pooling gains");
  cmd->add_option("--migrate", args->migration.max_moves,
                  "A waiting one-task job may start by moving up to this many running one-task jobs "
                  "(sched/consolidation.h); 0: never")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  cmd->add_option("--moves-per-hour", args->migration.moves_per_hour, "Budget of moves in any hour, cluster-wide")
      ->check(CLI::Range(1, 1'000'000))
      ->capture_default_str();
  cmd->add_option("--checkpoint", args->migration.checkpoint_seconds,
                  "Seconds of work between a task's checkpoints (a move loses the work since the last one)")
      ->check(CLI::Range(int64_t{1}, int64_t{86400} * 365))
      ->capture_default_str();
  cmd->add_option("--restart", args->migration.restart_seconds, "Seconds from a move's stop to work again")
      ->check(CLI::Range(int64_t{0}, int64_t{86400}))
      ->capture_default_str();
  return [cmd, args]() -> int {
    if (!*cmd) return -1;
    return ReplayCommand(*args);
  };
}

}  // namespace gpupool
