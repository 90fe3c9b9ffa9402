// Prometheus text exposition (format 0.0.4) for the server's own metrics: counters and
// histograms kept here, gauges rendered from the service's state at scrape time.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/prom_text.h"

namespace gpupool {

struct ServerMetrics {
  ServerMetrics();
  Histogram scheduling_latency;  // submission to placement, per job
  Histogram cycle_duration;      // one scheduling cycle
  uint64_t submitted = 0;        // guarded by the service mutex, like the rest below
  uint64_t placements = 0;       // jobs placed
  uint64_t task_placements = 0;
  uint64_t preemptions = 0;  // victim jobs
  uint64_t cycles = 0;
  std::map<std::string, uint64_t> finished;  // job end state -> count
  std::map<std::string, uint64_t> faults;    // fault cause (node_lost, gpu_fault, task_failed) -> count
  uint64_t nodes_lost = 0;
  uint64_t hotspot_migrations = 0;  // jobs moved off a hot GPU
  uint64_t jobs_removed = 0;        // finished jobs removed by retention
};

}  // namespace gpupool
