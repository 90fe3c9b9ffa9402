// What cluster_state.cc and cluster_cycle.cc share (internal to src/kube).
#pragma once

#include <vector>

#include "model/workload.h"
#include "sched/queueing.h"

namespace gpupool::kube::cluster_internal {

inline Resources DemandOf(const TaskRequest& r) {
  Resources d;
  d.cpu = r.cpu.units();
  d.memory = r.memory.units();
  d.gpu = r.wants_mig() ? 1000 : static_cast<int64_t>(r.gpu_count) * r.gpu_share.units();
  return d;
}

}  // namespace gpupool::kube::cluster_internal
