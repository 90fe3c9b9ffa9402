#include "sim/demo.h"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include <chrono>

#include "common/rng.h"
#include "model/ledger.h"
#include "sched/registry.h"
#include "sched/scheduler.h"
#include "sched/typical_pods.h"
#include "sim/trace.h"

namespace gpupool {

Result<std::vector<DemoPolicyResult>> RunDemo(const DemoOptions& options) {
  const GpuCatalog catalog = GpuCatalog::Builtin();
  ASSIGN_OR_RETURN(std::vector<NodeSpec> nodes, ReadOpenbNodes(options.nodes_csv, catalog));
  ASSIGN_OR_RETURN(std::vector<TracePod> pods, ReadOpenbPods(options.pods_csv));
  if (nodes.empty()) return Status::InvalidArgument(options.nodes_csv + ": no nodes");
  if (!(options.inflate > 0 && options.inflate <= 10)) {
    return Status::InvalidArgument(fmt::format("inflate must be in (0, 10], got {}", options.inflate));
  }
  std::vector<TaskRequest> requests;
  requests.reserve(pods.size());
  for (const auto& p : pods) requests.push_back(p.request);
  const std::vector<TypicalPod> typical = ComputeTypicalPods(requests);
  int64_t capacity = 0;
  for (const auto& n : nodes) capacity += static_cast<int64_t>(n.gpus.size()) * kWholeGpu.units();
  SeededRng workload_rng(options.seed);
  const std::vector<TracePod> arrivals = PrepareWorkload(pods, capacity, options.inflate, workload_rng);

  std::vector<std::string> policies = options.policies;
  if (policies.empty()) policies = {"random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd"};
  const PluginRegistry registry = DefaultRegistry();
  const FragmentationModel frag_model(typical);
  std::vector<DemoPolicyResult> results;
  for (const std::string& policy : policies) {
    Ledger ledger(catalog);
    for (const auto& n : nodes) RETURN_IF_ERROR(ledger.AddNode(n).status());
    ASSIGN_OR_RETURN(Profile profile, ProfileForPolicy(policy));
    SeededRng rng(options.seed);
    PluginInit init;
    init.typical_pods = &typical;
    ASSIGN_OR_RETURN(auto scheduler, Scheduler::Create(profile, registry, ledger, rng, init));
    scheduler->ShuffleTieBreakRanks();
    DemoPolicyResult r;
    r.policy = policy;
    const auto start = std::chrono::steady_clock::now();
    for (const TracePod& pod : arrivals) {
      ++r.pods;
      Decision d;
      auto placed = scheduler->Place(pod.request, &d);
      if (placed.ok()) {
        ++r.placed;
        continue;
      }
      if (placed.status().code() != StatusCode::kUnschedulable) return placed.status().WithContext(pod.name);
      ++r.failed;
      if (r.first_failure.empty()) {
        r.first_failure =
            fmt::format("{} ({}): {}", pod.name, DescribeTaskRequest(pod.request), placed.status().message());
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    r.decisions_per_second = seconds > 0 ? static_cast<double>(r.pods) / seconds : 0;
    r.gpu_alloc_percent =
        100.0 * static_cast<double>(ledger.used_gpu_share()) / static_cast<double>(capacity);
    const double frag = frag_model.ClusterFragment(ledger);
    r.frag_percent = 100.0 * frag / static_cast<double>(capacity);
    RETURN_IF_ERROR(ledger.CheckInvariants());
    results.push_back(std::move(r));
  }
  return results;
}

void PrintDemo(const DemoOptions& options, const std::vector<DemoPolicyResult>& results, std::ostream& out) {
  fmt::print(out, "Cluster {}  |  trace {}  |  seed {}  |  GPU demand inflated to {:.0f}% of capacity\n",
             options.nodes_csv, options.pods_csv, options.seed, options.inflate * 100);
  if (results.empty()) return;
  fmt::print(out, "{} pods arrive one at a time; each policy sees the same arrivals.\n\n",
             results.front().pods);
  fmt::print(out, "{:<15} {:>8} {:>8} {:>12} {:>14} {:>14}\n", "policy", "placed", "failed", "GPU alloc %",
             "fragmented %", "decisions/s");
  for (const auto& r : results) {
    fmt::print(out, "{:<15} {:>8} {:>8} {:>12.2f} {:>14.2f} {:>14.0f}\n", r.policy, r.placed, r.failed,
               r.gpu_alloc_percent, r.frag_percent, r.decisions_per_second);
  }
  fmt::print(out, "\nWhy the first pod that did not fit was refused:\n");
  for (const auto& r : results) {
    if (!r.first_failure.empty()) fmt::print(out, "  {:<13} {}\n", r.policy, r.first_failure);
  }
}

}  // namespace gpupool
