#include "sim/demo.h"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include "sim/experiment.h"

namespace gpupool {

Result<std::vector<DemoPolicyResult>> RunDemo(const DemoOptions& options) {
  if (!(options.inflate > 0 && options.inflate <= 10)) {
    return Status::InvalidArgument(fmt::format("inflate must be in (0, 10], got {}", options.inflate));
  }
  ASSIGN_OR_RETURN(const ExperimentInputs inputs, LoadExperimentInputs(options.nodes_csv, options.pods_csv));
  std::vector<std::string> policies = options.policies;
  if (policies.empty())
    policies = {"random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "balanced"};
  std::vector<DemoPolicyResult> results;
  for (const std::string& policy : policies) {
    ExperimentOptions o;
    o.trace = "demo";
    o.policy = policy;
    o.seed = options.seed;
    o.inflate = options.inflate;
    ASSIGN_OR_RETURN(const ExperimentResult e, RunExperiment(inputs, o));
    const double capacity = 1000.0 * e.total_gpus;
    DemoPolicyResult r;
    r.policy = policy;
    r.pods = e.pods_arrived;
    r.placed = e.pods_scheduled;
    r.failed = e.pods_failed;
    r.gpu_alloc_percent = 100.0 * static_cast<double>(e.used_gpu_milli) / capacity;
    r.frag_percent = 100.0 * e.final_frag_milli / capacity;
    r.decisions_per_second = e.seconds > 0 ? static_cast<double>(e.pods_arrived) / e.seconds : 0;
    r.first_failure = e.first_failure;
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
