#include "sim/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <vector>

namespace gpupool {

namespace {

constexpr std::string_view kWorkloadPrefix = "openb_pod_list_";

std::string ShortTrace(const std::string& workload) {
  if (workload.size() > kWorkloadPrefix.size() &&
      workload.compare(0, kWorkloadPrefix.size(), kWorkloadPrefix) == 0) {
    return workload.substr(kWorkloadPrefix.size());
  }
  return workload;
}

bool MatchesTrace(const std::string& workload, const std::string& trace) {
  return trace.empty() || workload == trace || ShortTrace(workload) == trace;
}

// Seed-mean curve per sc_policy of one workload (NaN cells are left out of the mean).
using Curves = std::map<std::string, std::array<double, kDemandBins>>;

Curves SeedMeans(const DiscreteTable& table, const std::string& workload) {
  std::map<std::string, std::pair<std::array<double, kDemandBins>, std::array<int, kDemandBins>>> acc;
  for (const DiscreteRow& r : table.rows) {
    if (r.workload != workload) continue;
    auto& [sum, count] = acc[r.sc_policy];
    for (size_t c = 0; c < kDemandBins; ++c) {
      if (std::isnan(r.values[c])) continue;
      sum[c] += r.values[c];
      ++count[c];
    }
  }
  Curves out;
  for (const auto& [policy, sc] : acc) {
    std::array<double, kDemandBins> mean{};
    for (size_t c = 0; c < kDemandBins; ++c) {
      mean[c] = sc.second[c] > 0 ? sc.first[c] / sc.second[c] : std::nan("");
    }
    out[policy] = mean;
  }
  return out;
}

// 1, 2 or 5 times a power of ten, at least `raw`.
double NiceStep(double raw) {
  if (!(raw > 0)) return 1;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * p >= raw) return m * p;
  }
  return 10 * p;
}

const char* Color(size_t i) {
  static const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return kColors[i % (sizeof(kColors) / sizeof(kColors[0]))];
}

std::string LineChart(const std::string& title, const std::string& y_label, const Curves& curves,
                      bool percent_axis_to_100) {
  constexpr double kW = 720, kH = 400, kLeft = 60, kRight = 180, kTop = 40, kBottom = 50;
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  double y_max = 0;
  for (const auto& [policy, values] : curves) {
    for (double v : values) {
      if (!std::isnan(v)) y_max = std::max(y_max, v);
    }
  }
  double step = 10;
  if (percent_axis_to_100 && y_max <= 100) {
    y_max = 100;
  } else {
    step = NiceStep(std::max(y_max, 1.0) / 5);
    y_max = std::ceil(std::max(y_max, 1.0) / step) * step;
  }
  auto x_of = [&](double c) { return kLeft + pw * c / (kDemandBins - 1); };
  auto y_of = [&](double v) { return kTop + ph * (1 - v / y_max); };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "role=\"img\" aria-label=\"{2}\">\n",
      kW, kH, HtmlEscape(title));
  svg += fmt::format("<title>{}</title>\n", HtmlEscape(title));
  svg += fmt::format(
      "<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">{}</text>\n",
      kLeft + pw / 2, HtmlEscape(title));
  // Grid, ticks and tick labels.
  for (int c = 0; c <= kDemandBins - 1; c += 10) {
    const double x = x_of(c);
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#e5e5e5\"/>\n", x,
                       kTop, kTop + ph);
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#333\"/>\n", x,
                       kTop + ph, kTop + ph + 5);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\" font-size=\"11\">{}</text>\n", x,
                       kTop + ph + 18, c);
  }
  for (int i = 0; i * step <= y_max + 1e-9; ++i) {
    const double v = i * step;
    const double y = y_of(v);
    svg += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#e5e5e5\"/>\n", kLeft,
                       y, kLeft + pw, y);
    svg += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#333\"/>\n", kLeft - 5,
                       y, kLeft, y);
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\" font-size=\"11\">{:g}</text>\n",
                       kLeft - 8, y + 4, v);
  }
  // Axes and their labels.
  svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#333\"/>\n", kLeft, kTop,
                     kTop + ph);
  svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#333\"/>\n", kLeft,
                     kTop + ph, kLeft + pw);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"12\">{}</text>\n",
                     kLeft + pw / 2, kH - 10, "Arrived GPU demand (% of GPU capacity)");
  svg += fmt::format(
      "<text x=\"16\" y=\"{0}\" text-anchor=\"middle\" font-size=\"12\" transform=\"rotate(-90 16 "
      "{0})\">{1}</text>\n",
      kTop + ph / 2, HtmlEscape(y_label));
  // One line per policy, and the legend.
  size_t i = 0;
  for (const auto& [policy, values] : curves) {
    std::string points;
    for (size_t c = 0; c < kDemandBins; ++c) {
      if (std::isnan(values[c])) continue;
      points += fmt::format("{}{:.2f},{:.2f}", points.empty() ? "" : " ", x_of(static_cast<double>(c)),
                            y_of(values[c]));
    }
    svg += fmt::format(
        "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\" "
        "points=\"{}\"><title>{}</title></polyline>\n",
        Color(i), points, HtmlEscape(policy));
    const double ly = kTop + 10 + 20 * static_cast<double>(i);
    svg +=
        fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"3\"/>\n",
                    kLeft + pw + 15, ly, kLeft + pw + 40, Color(i));
    svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"12\">{}</text>\n", kLeft + pw + 46, ly + 4,
                       HtmlEscape(policy));
    ++i;
  }
  if (curves.empty()) {
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"13\">no data</text>\n",
                       kLeft + pw / 2, kTop + ph / 2);
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace

std::string HtmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Result<std::string> RenderReportHtml(const DiscreteTable& alloc, const DiscreteTable& frag,
                                     const std::string& trace) {
  std::set<std::string> workloads;
  for (const auto* table : {&alloc, &frag}) {
    for (const DiscreteRow& r : table->rows) {
      if (MatchesTrace(r.workload, trace)) workloads.insert(r.workload);
    }
  }
  if (workloads.empty()) {
    if (trace.empty()) return Status::InvalidArgument("report: the input has no rows");
    return Status::NotFound(fmt::format("report: no rows for trace '{}'", trace));
  }
  std::string html =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<title>gpupool simulator report</title>\n<style>\n"
      "body { font-family: sans-serif; margin: 24px; color: #222; }\n"
      "section { margin-bottom: 32px; }\n"
      "svg { margin: 8px 16px 8px 0; font-family: sans-serif; }\n"
      "</style>\n</head>\n<body>\n<h1>gpupool simulator report</h1>\n"
      "<p>GPU allocation and fragmentation against arrived GPU demand, one line per policy (mean over "
      "seeds).</p>\n";
  for (const std::string& workload : workloads) {
    const std::string name = ShortTrace(workload);
    const Curves a = SeedMeans(alloc, workload);
    const Curves f = SeedMeans(frag, workload);
    std::set<uint64_t> seeds;
    for (const auto* table : {&alloc, &frag}) {
      for (const DiscreteRow& r : table->rows) {
        if (r.workload == workload) seeds.insert(r.seed);
      }
    }
    html += fmt::format("<section>\n<h2>Trace {}</h2>\n<p>{} seed(s)</p>\n", HtmlEscape(name), seeds.size());
    html += LineChart(fmt::format("{}: GPU allocation", name), "GPU allocation (%)", a, true);
    html += LineChart(fmt::format("{}: fragmentation", name), "Fragmented GPUs (% of all GPUs)", f, false);
    html += "</section>\n";
  }
  html += "</body>\n</html>\n";
  return html;
}

Status WriteReportHtml(const DiscreteTable& alloc, const DiscreteTable& frag, const std::string& trace,
                       const std::string& out_path) {
  ASSIGN_OR_RETURN(const std::string html, RenderReportHtml(alloc, frag, trace));
  std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::IoError(fmt::format("{}: cannot open for writing", out_path));
  out << html;
  out.close();
  if (!out) return Status::IoError(fmt::format("{}: write failed", out_path));
  return Status::Ok();
}

}  // namespace gpupool
