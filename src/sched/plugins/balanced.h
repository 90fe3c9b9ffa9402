// The weights of the balanced policy's score (plugins/balanced.cc), so that a trainer (sim/train.h)
// can search them and a profile can set them: `balanced` args `weights: {name: number, ...}`.
//
// score = point x FGD points (an integer, rounded from `point`)
//   whole-GPU task:  - wholeCpu |CPU surplus| + wholeMemory min(memory surplus, 0)
//                    - wholeFree rho x free GPU share after
//   share task:      + shareMemory min(memory surplus, 0) - shareCpu |CPU surplus|
//                    - shareFree rho x free GPU share after
//   CPU-only task:   + 100 x trunc(cpuOnlyCpu min(CPU surplus, 0) + cpuOnlyMemory min(memory surplus, 0))
// with every surplus in mCPU after the placement, as balanced.cc defines them. The defaults are the
// hand-made policy; a negative *Free weight packs (prefers nodes left with less free share).
//
// Two sets, chosen online by the workload (balanced.cc, "Adapting"): `weights` for workloads whose
// GPUs run out first, `cpuBoundWeights` (default: CpuBound()) for workloads that ask for more CPU
// per GPU than the cluster has.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "common/value.h"
#include "sched/profile.h"

namespace gpupool {

struct BalancedWeights {
  double point = 10'000;
  double whole_cpu = 1;
  double whole_memory = 1;
  double whole_free = 0;
  double share_cpu = 0;
  double share_memory = 1;
  double share_free = 0;
  double cpu_only_cpu = 1;
  double cpu_only_memory = 1;

  // The argument names, in the order of Fields().
  static std::vector<std::string> Names();
  std::vector<double*> Fields();
  Value ToValue() const;
  // Missing names keep their values in `base`; unknown names, non-numbers, non-finite values and a
  // non-positive point are errors.
  static Result<BalancedWeights> FromValue(const Value& v, const BalancedWeights& base);
  static Result<BalancedWeights> FromValue(const Value& v);  // base: the hand-made weights
  // The weights for CPU-bound workloads: trained by `gpupool sim train` on the cpu250 trace
  // (balanced.cc, "Adapting", gives the command).
  static BalancedWeights CpuBound();
  // (1 - s) a + s b, field by field.
  static BalancedWeights Blend(const BalancedWeights& a, const BalancedWeights& b, double s);
  // The weights of the profile's balanced score (its `weights` argument; the defaults without one).
  // A profile without a balanced score is an error.
  static Result<BalancedWeights> FromProfile(const Profile& profile);
};

}  // namespace gpupool
