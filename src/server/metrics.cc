#include "server/metrics.h"

namespace gpupool {

ServerMetrics::ServerMetrics()
    : scheduling_latency(
          {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}),
      cycle_duration({0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5}) {}

}  // namespace gpupool
