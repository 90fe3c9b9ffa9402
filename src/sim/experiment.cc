#include "sim/experiment.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "common/rng.h"
#include "model/ledger.h"
#include "sched/consolidation.h"
#include "sched/registry.h"
#include "sched/scheduler.h"
#include "sched/typical_pods.h"
#include "sim/bound.h"

namespace gpupool {

double PairwiseSum(const double* a, size_t n) {
  if (n < 8) {
    double res = 0.;
    for (size_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (size_t j = 0; j < 8; ++j) r[j] = a[j];
    size_t i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (size_t j = 0; j < 8; ++j) r[j] += a[i + j];
    }
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  size_t n2 = n / 2;
  n2 -= n2 % 8;
  return PairwiseSum(a, n2) + PairwiseSum(a + n2, n - n2);
}

double NpRound2(double x) {
  return std::nearbyint(x * 100.0) / 100.0;
}

double PyRound2(double x) {
  // printf rounds the exact binary value correctly, ties to even: what Python's round(x, 2) does.
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", x);
  return std::strtod(buf, nullptr);
}

std::string PyFloatRepr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", x);  // shortest round-trip digits
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

namespace {
const std::pair<const char*, const char*> kPublishedNames[] = {
    {"random", "01-Random"},         {"dotprod", "02-DotProd"}, {"gpuclustering", "03-GpuClustering"},
    {"gpupacking", "04-GpuPacking"}, {"bestfit", "05-BestFit"}, {"fgd", "06-FGD"},
};
}  // namespace

std::string PublishedPolicyName(const std::string& policy) {
  for (const auto& [ours, theirs] : kPublishedNames) {
    if (policy == ours) return theirs;
  }
  return policy;
}

std::optional<std::string> PolicyFromPublishedName(const std::string& published) {
  for (const auto& [ours, theirs] : kPublishedNames) {
    if (published == theirs) return std::string(ours);
  }
  return std::nullopt;
}

void BinMetrics(const std::vector<MetricsRow>& rows, int total_gpus, ExperimentResult& out) {
  const double tg = static_cast<double>(total_gpus);
  // Bin index of every row; arrived only grows, so each bin is a run of consecutive rows.
  std::map<int64_t, std::pair<size_t, size_t>> runs;  // bin -> [first, last + 1)
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto a =
        static_cast<int64_t>(std::nearbyint(static_cast<double>(rows[i].arrived_gpu_milli) / tg / 10.0));
    auto [it, inserted] = runs.emplace(a, std::make_pair(i, i + 1));
    if (!inserted) it->second.second = i + 1;
  }
  std::vector<double> alloc, frag, ratio;
  for (int c = 0; c < kDemandBins; ++c) {
    alloc.clear();
    frag.clear();
    ratio.clear();
    auto take = [&](int64_t bin) {
      auto it = runs.find(bin);
      if (it == runs.end()) return;
      for (size_t i = it->second.first; i < it->second.second; ++i) {
        alloc.push_back(PyRound2(static_cast<double>(rows[i].used_gpu_milli) / tg / 10.0));
        frag.push_back(rows[i].frag_milli);
        ratio.push_back(rows[i].frag_ratio);
      }
    };
    take(c);
    if (alloc.empty()) {
      take(c - 1);
      take(c);
      take(c + 1);
    }
    if (alloc.empty()) {
      out.alloc[static_cast<size_t>(c)] = out.frag[static_cast<size_t>(c)] =
          out.frag_ratio[static_cast<size_t>(c)] = std::nan("");
      continue;
    }
    const auto n = static_cast<double>(alloc.size());
    out.alloc[static_cast<size_t>(c)] = NpRound2(PairwiseSum(alloc.data(), alloc.size()) / n);
    out.frag[static_cast<size_t>(c)] =
        NpRound2(100.0 * (PairwiseSum(frag.data(), frag.size()) / n) / 1000.0 / tg);
    out.frag_ratio[static_cast<size_t>(c)] = PairwiseSum(ratio.data(), ratio.size()) / n;
  }
}

Result<ExperimentInputs> LoadExperimentInputs(const std::string& nodes_csv, const std::string& pods_csv) {
  ExperimentInputs in;
  ASSIGN_OR_RETURN(in.nodes, ReadOpenbNodes(nodes_csv, GpuCatalog::Builtin()));
  ASSIGN_OR_RETURN(in.pods, ReadOpenbPods(pods_csv));
  if (in.nodes.empty()) return Status::InvalidArgument(nodes_csv + ": no nodes");
  return in;
}

namespace {

double Printed2(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", x);
  return std::strtod(buf, nullptr);
}

// The published arrival order and tie-break ranks of one run.
Status ReadArrivalOrder(const std::string& dir, const std::string& trace, uint64_t seed,
                        const std::vector<TracePod>& originals, const Ledger& ledger,
                        std::vector<const TaskRequest*>& arrivals, std::vector<std::string>& names,
                        std::vector<uint32_t>& ranks) {
  std::unordered_map<std::string, const TaskRequest*> by_name;
  for (const auto& p : originals) by_name[p.name] = &p.request;
  const std::string prefix = fmt::format("{}/{}_{}", dir, trace, seed);
  std::ifstream pods(prefix + "_pods.txt");
  if (!pods) return Status::IoError(fmt::format("cannot read {}_pods.txt", prefix));
  std::string line;
  int line_no = 0;
  while (std::getline(pods, line)) {
    ++line_no;
    if (line.empty()) continue;
    const auto tuned = line.find("-tuned-");
    const std::string name = tuned == std::string::npos ? line : line.substr(0, tuned);
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      return Status::InvalidArgument(
          fmt::format("{}_pods.txt:{}: pod '{}' is not in the trace", prefix, line_no, name));
    }
    arrivals.push_back(it->second);
    names.push_back(line);
  }
  std::ifstream nodes(prefix + "_nodes.txt");
  if (!nodes) return Status::IoError(fmt::format("cannot read {}_nodes.txt", prefix));
  ranks.assign(ledger.node_count(), 0);
  std::vector<bool> seen(ledger.node_count(), false);
  line_no = 0;
  while (std::getline(nodes, line)) {
    ++line_no;
    if (line.empty()) continue;
    char name[256];
    unsigned rank = 0;
    if (std::sscanf(line.c_str(), "%255s %u", name, &rank) != 2) {
      return Status::InvalidArgument(
          fmt::format("{}_nodes.txt:{}: expected '<node> <rank>'", prefix, line_no));
    }
    auto n = ledger.FindNode(name);
    if (!n)
      return Status::InvalidArgument(
          fmt::format("{}_nodes.txt:{}: unknown node '{}'", prefix, line_no, name));
    ranks[*n] = rank;
    seen[*n] = true;
  }
  for (NodeIndex n = 0; n < ledger.node_count(); ++n) {
    if (!seen[n])
      return Status::InvalidArgument(
          fmt::format("{}_nodes.txt: no rank for node '{}'", prefix, ledger.spec(n).name));
  }
  return Status::Ok();
}

}  // namespace

Result<ExperimentResult> RunExperiment(const ExperimentInputs& inputs, const ExperimentOptions& options) {
  const GpuCatalog catalog = GpuCatalog::Builtin();
  Ledger ledger(catalog);
  for (const auto& n : inputs.nodes) RETURN_IF_ERROR(ledger.AddNode(n).status());
  if (ledger.total_gpus() == 0) return Status::InvalidArgument("the cluster has no GPUs");

  // Exclusive mode: every GPU-sharing pod asks for a whole GPU instead.
  std::vector<TracePod> pods = inputs.pods;
  if (options.exclusive) {
    for (auto& p : pods) {
      if (p.request.wants_gpu()) p.request.gpu_share = kWholeGpu;
    }
  }
  std::vector<TaskRequest> originals;
  originals.reserve(pods.size());
  for (const auto& p : pods) originals.push_back(p.request);
  const std::vector<TypicalPod> typical = ComputeTypicalPods(originals);
  // Demand as the pods asked for it (the same arrivals in both modes).
  std::unordered_map<const TaskRequest*, int64_t> asked;
  for (size_t i = 0; i < pods.size(); ++i)
    asked[&pods[i].request] = inputs.pods[i].request.total_gpu_share().units();

  std::vector<const TaskRequest*> arrivals;
  std::vector<std::string> names;
  std::vector<uint32_t> ranks;
  std::vector<TracePod> generated;
  if (options.arrival_order_dir) {
    RETURN_IF_ERROR(ReadArrivalOrder(*options.arrival_order_dir, options.trace, options.seed, pods, ledger,
                                     arrivals, names, ranks));
  } else {
    SeededRng workload_rng(options.seed);
    // Resample the trace as the users asked for it, so that exclusive mode sees the same arrivals.
    generated = PrepareWorkload(inputs.pods, ledger.total_gpu_share(), options.inflate, workload_rng);
    std::unordered_map<std::string, const TaskRequest*> by_name;
    for (const auto& p : pods) by_name[p.name] = &p.request;
    for (const auto& p : generated) {
      const auto tuned = p.name.find("-tuned-");
      arrivals.push_back(by_name.at(tuned == std::string::npos ? p.name : p.name.substr(0, tuned)));
      names.push_back(p.name);
    }
    ranks = workload_rng.Permutation(static_cast<uint32_t>(ledger.node_count()));
  }

  if (options.policy == kBoundPolicy || options.policy == kRelaxedBoundPolicy) {
    // No scheduling: the LP bound of the same arrival sequence (sim/bound.h).
    std::vector<int64_t> demand;
    demand.reserve(arrivals.size());
    for (const TaskRequest* task : arrivals) demand.push_back(asked.at(task));
    ExperimentResult r;
    r.policy = options.policy;
    r.trace = options.trace;
    r.seed = options.seed;
    RETURN_IF_ERROR(FillBoundResult(
        inputs.nodes, arrivals, demand,
        options.policy == kBoundPolicy ? BoundKind::kForcedPlacement : BoundKind::kRelaxed, r));
    return r;
  }

  Profile profile;
  if (options.profile) {
    profile = *options.profile;
  } else {
    ASSIGN_OR_RETURN(profile, ProfileForPolicy(options.policy));
  }
  SeededRng rng(options.seed ^ 0x5eed5eedULL);
  PluginInit init;
  init.typical_pods = &typical;
  ASSIGN_OR_RETURN(auto scheduler, Scheduler::Create(profile, DefaultRegistry(), ledger, rng, init));
  RETURN_IF_ERROR(scheduler->SetTieBreakRanks(ranks));

  ExperimentResult r;
  r.policy = options.policy;
  r.trace = options.trace;
  r.seed = options.seed;
  r.total_gpus = ledger.total_gpus();
  const FragmentationModel frag_model(typical);
  std::vector<double> node_frag(ledger.node_count());
  for (NodeIndex n = 0; n < ledger.node_count(); ++n) node_frag[n] = frag_model.NodeFragment(ledger, n);
  std::vector<MetricsRow> rows;
  rows.reserve(arrivals.size());

  if (options.migrate_moves < 0 || options.migrate_moves > 64 || options.migrate_per_pod < 1 ||
      options.migrate_candidates < 1 || options.migrate_candidates > 4096)
    return Status::InvalidArgument(fmt::format(
        "migration needs 0..64 moves a plan, at least 1 move a pod and 1..4096 candidate nodes; got {}, {}, {}",
        options.migrate_moves, options.migrate_per_pod, options.migrate_candidates));
  // With migration: what each placed pod asked for and how often it has moved.
  struct Held {
    const TaskRequest* request;
    int moves;
  };
  std::unordered_map<AllocationId, Held> held;
  std::vector<MovableTask> movable;
  ConsolidationOptions consolidation;
  consolidation.max_moves = std::max(1, options.migrate_moves);
  consolidation.max_candidates = options.migrate_candidates;

  const auto start = std::chrono::steady_clock::now();
  int64_t arrived = 0;
  for (size_t i = 0; i < arrivals.size(); ++i) {
    const TaskRequest* task = arrivals[i];
    const int64_t demand = asked.at(task);
    arrived += demand;
    ++r.pods_arrived;
    scheduler->Observe(*task);
    Decision d;
    auto placed = scheduler->Place(*task, &d);
    if (!placed.ok() && placed.status().code() == StatusCode::kUnschedulable && options.migrate_moves > 0 &&
        !task->wants_mig() && task->wants_gpu() && (!options.migrate_whole_only || !task->is_share())) {
      ++r.consolidation_attempts;
      movable.clear();
      for (const auto& [id, h] : held) {
        if (h.moves < options.migrate_per_pod) movable.push_back({id, h.request});
      }
      ConsolidationResult c = Consolidate(*scheduler, *task, movable, consolidation);
      if (!c.error.ok()) return c.error;
      if (c.candidates == 0) ++r.consolidation_no_candidate;
      for (const auto& [from, to] : c.renamed) {
        auto node = held.extract(from);
        node.key() = to;
        held.insert(std::move(node));
      }
      if (c.placed) {
        for (const TaskMove& m : c.moves) {
          auto node = held.extract(m.from);
          node.key() = m.to;
          ++node.mapped().moves;
          held.insert(std::move(node));
          ++r.migrations;
          r.migrated_gpu_milli += m.before.gpus.front().share.units();
          node_frag[m.before.node] = frag_model.NodeFragment(ledger, m.before.node);
          node_frag[m.after.node] = frag_model.NodeFragment(ledger, m.after.node);
        }
        ++r.consolidated;
        d.placement = c.placement;
        placed = c.allocation;
      }
    }
    if (placed.ok() && options.migrate_moves > 0) held[*placed] = {task, 0};
    ShareAdmission* share = task->is_share() ? &r.share_admission[task->gpu_share.units()] : nullptr;
    if (share != nullptr) ++share->arrived;
    if (placed.ok()) {
      ++r.pods_scheduled;
      r.served_gpu_milli += demand;
      if (share != nullptr) ++share->placed;
      node_frag[d.placement.node] = frag_model.NodeFragment(ledger, d.placement.node);
    } else if (placed.status().code() == StatusCode::kUnschedulable) {
      ++r.pods_failed;
      if (task->gpu_count > 0 && task->gpu_share.units() >= 1000 && task->mig_profile.empty()) {
        r.failed_whole_gpus += task->gpu_count;
      }
      if (r.first_failure.empty()) {
        r.first_failure =
            fmt::format("{} ({}): {}", names[i], DescribeTaskRequest(*task), placed.status().message());
      }
    } else {
      return placed.status();
    }
    double frag = 0;
    for (double f : node_frag) frag += f;
    const int64_t idle = ledger.total_gpu_share() - ledger.used_gpu_share();
    MetricsRow row;
    row.arrived_gpu_milli = arrived;
    row.used_gpu_milli = ledger.used_gpu_share();
    row.frag_milli = Printed2(frag);
    row.frag_ratio = idle > 0 ? Printed2(100.0 * frag / static_cast<double>(idle)) : 0.0;
    rows.push_back(row);
    r.final_frag_milli = frag;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.arrived_gpu_milli = arrived;
  r.used_gpu_milli = ledger.used_gpu_share();
  BinMetrics(rows, r.total_gpus, r);
  if (inputs.keep_rows) r.rows = std::move(rows);
  if (options.repack) {
    ASSIGN_OR_RETURN(r.repack, RepackSharePods(ledger));
  }
  return r;
}

Status WriteExperimentJson(const ExperimentResult& r, const std::string& path) {
  try {
    nlohmann::json j;
    j["policy"] = r.policy;
    j["trace"] = r.trace;
    j["seed"] = r.seed;
    j["total_gpus"] = r.total_gpus;
    j["alloc"] = r.alloc;
    j["frag"] = r.frag;
    j["frag_ratio"] = r.frag_ratio;
    j["pods_arrived"] = r.pods_arrived;
    j["pods_scheduled"] = r.pods_scheduled;
    j["pods_failed"] = r.pods_failed;
    j["arrived_gpu_milli"] = r.arrived_gpu_milli;
    j["served_gpu_milli"] = r.served_gpu_milli;
    j["used_gpu_milli"] = r.used_gpu_milli;
    j["seconds"] = r.seconds;
    j["failed_whole_gpus"] = r.failed_whole_gpus;
    if (r.consolidation_attempts > 0) {
      j["migration"] = {{"attempts", r.consolidation_attempts},
                        {"consolidated", r.consolidated},
                        {"no_candidate", r.consolidation_no_candidate},
                        {"moves", r.migrations},
                        {"moved_gpu_milli", r.migrated_gpu_milli}};
    }
    if (r.repack) {
      j["repack"] = {{"share_pods", r.repack->share_pods},   {"share_gpus", r.repack->share_gpus},
                     {"share_milli", r.repack->share_milli}, {"min_gpus", r.repack->min_gpus},
                     {"optimal", r.repack->optimal},         {"patterns", r.repack->patterns}};
      nlohmann::json shares = nlohmann::json::array();
      for (const auto& [milli, a] : r.share_admission) {
        shares.push_back({{"gpu_milli", milli}, {"arrived", a.arrived}, {"placed", a.placed}});
      }
      j["repack"]["share_admission"] = std::move(shares);
    }
    std::ofstream out(path);
    if (!out) return Status::IoError(fmt::format("cannot write '{}'", path));
    out << j.dump(2) << "\n";
    if (!out) return Status::IoError(fmt::format("error writing '{}'", path));
  } catch (const std::exception& e) {
    return Status::Internal(fmt::format("writing '{}': {}", path, e.what()));
  }
  return Status::Ok();
}

}  // namespace gpupool
