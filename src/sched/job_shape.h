// A job's shape: what decides whether it fits, as a string. A scheduling pass that saw one job
// of a shape fail skips the others of that shape until capacity grows — the server's cycle and the
// time-based replay (sim/replay.h) alike. No I/O.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>

#include "model/workload.h"

namespace gpupool {

// What decides whether a job fits, as a string: every group's request and replicas, and the gang
// size. Empty for jobs with affinity (their fit depends on other jobs' places) — never shared.
inline std::string JobShapeKey(const Job& job) {
  if (!job.affinity.empty()) return "";
  std::string key = fmt::format("g{}", job.gang_size());
  for (const auto& g : job.groups) {
    const TaskRequest& r = g.request;
    key +=
        fmt::format("|{}x{},{},{},{},{},{},{}", g.replicas, r.cpu.units(), r.memory.units(), r.gpu_count,
                    r.gpu_share.units(), r.gpu_memory.units(), fmt::join(r.gpu_models, "+"), r.mig_profile);
    // What decides which GPUs a share may join: a shape that failed for its QoS or its MPS owner says
    // nothing of a share of another kind or owner.
    key += fmt::format(",{}{}{},{}:{}", r.nvlink ? 'n' : '-', r.guaranteed ? 'g' : '-', r.enforced_by,
                       r.mps_owner.size(), r.mps_owner);
  }
  return key;
}

}  // namespace gpupool
