#include "sim/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <vector>

#include "sim/svg_chart.h"

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

std::string LineChart(const std::string& title, const std::string& y_label, const Curves& curves,
                      bool percent_axis_to_100) {
  ChartSpec spec;
  spec.title = title;
  spec.x_label = "Arrived GPU demand (% of GPU capacity)";
  spec.y_label = y_label;
  spec.x_min = 0;
  spec.x_max = kDemandBins - 1;
  spec.y_to_100 = percent_axis_to_100;
  std::vector<ChartLine> lines;
  for (const auto& [policy, values] : curves) {
    ChartLine line;
    line.name = policy;
    for (size_t c = 0; c < kDemandBins; ++c) line.xy.emplace_back(static_cast<double>(c), values[c]);
    lines.push_back(std::move(line));
  }
  return SvgLineChart(spec, lines);
}

}  // namespace

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
