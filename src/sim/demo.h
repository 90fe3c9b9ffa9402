// The scheduling demo: the bundled Alibaba cluster and trace, one pod at a time, under each
// placement policy, with the same arrivals for every policy. Until the pool exists this is the
// README's main command.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "common/status.h"

namespace gpupool {

struct DemoOptions {
  std::string nodes_csv;
  std::string pods_csv;
  std::vector<std::string> policies;  // empty: the six published policies
  uint64_t seed = 42;
  double inflate = 1.3;  // GPU demand to reach, as a multiple of GPU capacity
};

struct DemoPolicyResult {
  std::string policy;
  int64_t pods = 0;
  int64_t placed = 0;
  int64_t failed = 0;
  double gpu_alloc_percent = 0;  // allocated GPU share / capacity at the end
  double frag_percent = 0;       // fragmented GPU share (FGD's measure) / capacity at the end
  double decisions_per_second = 0;
  std::string first_failure;  // "<pod> (<request>): <diagnosis>"
};

Result<std::vector<DemoPolicyResult>> RunDemo(const DemoOptions& options);
void PrintDemo(const DemoOptions& options, const std::vector<DemoPolicyResult>& results, std::ostream& out);

}  // namespace gpupool
