#include "sched/profile.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace gpupool {

std::vector<std::string> DefaultFilterNames() {
  return {"node-unschedulable", "node-resources", "gpu-model", "gpu-fit", "mig-fit", "qos-isolation"};
}

std::vector<std::string> PolicyNames() {
  return {"random", "dotprod",  "gpuclustering", "gpupacking", "bestfit",
          "fgd",    "balanced", "binpack",       "spread",     "topology"};
}

Result<Profile> ProfileForPolicy(const std::string& policy) {
  Profile p;
  p.name = policy;
  // The published policies: one score plugin each, with the GPU choice of the reference runs
  // (random: uniform among fitting GPUs; fgd: its own; the rest: best fit).
  if (policy == "random") {
    p.scores.push_back({"random", 1, {}});
    p.gpu_selector = {"random", 1, {}};
  } else if (policy == "fgd") {
    p.scores.push_back({"fgd", 1, {}});
    p.gpu_selector = {"fgd", 1, {}};
  } else if (policy == "balanced") {
    // FGD's fragmentation learned online from the arriving tasks, plus CPU balance
    // (sched/plugins/balanced.cc); it chooses GPUs too.
    p.scores.push_back({"balanced", 1, {}});
    p.gpu_selector = {"balanced", 1, {}};
  } else if (policy == "dotprod" || policy == "gpuclustering" || policy == "gpupacking" ||
             policy == "bestfit" || policy == "binpack" || policy == "spread") {
    p.scores.push_back({policy, 1, {}});
  } else if (policy == "topology") {
    // Topology alone cannot rank CPU-only tasks or tell nodes with the same links apart; binpack
    // breaks those ties towards fuller nodes, keeping empty NVLink boards whole.
    p.scores.push_back({"topology", 2, {}});
    p.scores.push_back({"binpack", 1, {}});
  } else {
    return Status::InvalidArgument(
        fmt::format("unknown policy '{}' (known: {})", policy, fmt::join(PolicyNames(), ", ")));
  }
  return p;
}

}  // namespace gpupool
