// Helpers of the replay's tests.
#pragma once

#include <string>

#include "sim/timeline.h"

namespace gpupool::testutil {

// A job of `tasks` tasks of `gpus` whole GPUs each, in queue (and tenant) `queue`.
inline TimedJob GpuJob(const std::string& name, int64_t arrival, int64_t duration, int gpus,
                       const std::string& queue = "q", int tasks = 1) {
  TimedJob t;
  t.name = name;
  t.arrival = arrival;
  t.duration = duration;
  t.job.name = name;
  t.job.tenant = queue;
  t.job.queue = queue;
  TaskGroup g;
  g.name = "t";
  g.replicas = tasks;
  g.request.gpu_count = gpus;
  g.request.gpu_share = kWholeGpu;
  t.job.groups.push_back(g);
  return t;
}

// Every built-in placement policy.
inline constexpr const char* kReplayPolicies[] = {"bestfit",    "fgd",     "balanced",      "spread", "random",
                                                  "topology", "gpupacking", "dotprod", "gpuclustering", "binpack"};

}  // namespace gpupool::testutil
