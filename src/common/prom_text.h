// Prometheus text exposition (format 0.0.4): a histogram with fixed bounds and the helpers every
// /metrics endpoint of gpupool renders with (the server's, the Kubernetes scheduler's).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
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

// Helpers for rendering.
std::string EscapeLabel(const std::string& value);
void RenderHeader(const std::string& name, const std::string& type, const std::string& help,
                  std::string& out);
void RenderSample(const std::string& name, const std::vector<std::pair<std::string, std::string>>& labels,
                  double value, std::string& out);

}  // namespace gpupool
