// What cluster_state.cc and cluster_cycle.cc share (internal to src/kube).
#pragma once

#include <vector>

#include "model/workload.h"
#include "sched/framework.h"
#include "sched/queueing.h"

namespace gpupool::kube::cluster_internal {

inline Resources DemandOf(const TaskRequest& r) {
  Resources d;
  d.cpu = r.cpu.units();
  d.memory = r.memory.units();
  d.gpu = r.wants_mig() ? 1000 : static_cast<int64_t>(r.gpu_count) * r.gpu_share.units();
  return d;
}

// Which task of the job each reservation was for.
class TaskBinder : public Binder {
 public:
  Status Bind(const Job&, int task_index, AllocationId allocation, const Placement& placement) override {
    bound.push_back({task_index, allocation, placement});
    return Status::Ok();
  }
  struct Bound {
    int task;
    AllocationId allocation;
    Placement placement;
  };
  std::vector<Bound> bound;
};

}  // namespace gpupool::kube::cluster_internal
