// Prometheus text exposition (format 0.0.4) for the server's own metrics: counters and
// histograms kept here, gauges rendered from the service's state at scrape time.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace gpupool {

// A cumulative histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  // Appends "# HELP", "# TYPE" and the _bucket/_sum/_count lines.
  void Render(const std::string& name, const std::string& help, std::string& out) const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative
  uint64_t count_ = 0;
  double sum_ = 0;
};

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

// Helpers for rendering.
std::string EscapeLabel(const std::string& value);
void RenderHeader(const std::string& name, const std::string& type, const std::string& help,
                  std::string& out);
void RenderSample(const std::string& name, const std::vector<std::pair<std::string, std::string>>& labels,
                  double value, std::string& out);

}  // namespace gpupool
