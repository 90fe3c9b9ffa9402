// A Binder that only records which task of the job each reservation was for: the embedder (the
// pool server's cycle, the Kubernetes scheduler's) applies the placements itself afterwards.
#pragma once

#include <vector>

#include "sched/framework.h"

namespace gpupool {

class RecordingBinder : public Binder {
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

}  // namespace gpupool
