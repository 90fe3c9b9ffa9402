#include "common/prom_text.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace gpupool {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t i =
      static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  ++counts_[i];
  ++count_;
  sum_ += value;
}

namespace {
std::string FormatValue(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{}", v);
}
}  // namespace

void Histogram::Render(const std::string& name, const std::string& help, std::string& out) const {
  std::lock_guard<std::mutex> lock(mu_);
  RenderHeader(name, "histogram", help, out);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, FormatValue(bounds_[i]), cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, count_);
  out += fmt::format("{}_sum {}\n", name, FormatValue(sum_));
  out += fmt::format("{}_count {}\n", name, count_);
}

std::string EscapeLabel(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void RenderHeader(const std::string& name, const std::string& type, const std::string& help,
                  std::string& out) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void RenderSample(const std::string& name, const std::vector<std::pair<std::string, std::string>>& labels,
                  double value, std::string& out) {
  out += name;
  if (!labels.empty()) {
    out += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i > 0) out += ',';
      out += fmt::format("{}=\"{}\"", labels[i].first, EscapeLabel(labels[i].second));
    }
    out += '}';
  }
  out += ' ';
  out += FormatValue(value);
  out += '\n';
}

}  // namespace gpupool
