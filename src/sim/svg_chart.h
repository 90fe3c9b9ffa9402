// Line charts as inline SVG for the simulator's self-contained HTML reports (sim/report.h,
// sim/replay_report.h): no scripts, no external assets, every label escaped.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace gpupool {

struct ChartLine {
  std::string name;                            // the legend's label
  std::vector<std::pair<double, double>> xy;   // points in x order; NaN y values are left out
};

struct ChartSpec {
  std::string title;
  std::string x_label;
  std::string y_label;
  double x_min = 0;
  double x_max = 1;
  // The y axis runs from 0 to the largest value rounded up to a tick, or to 100 when asked and
  // nothing passes it.
  bool y_to_100 = false;
};

// One chart; "no data" when no line has a point.
std::string SvgLineChart(const ChartSpec& spec, const std::vector<ChartLine>& lines);

// &, <, >, " and ' as character references.
std::string HtmlEscape(const std::string& text);

// 1, 2 or 5 times a power of ten, at least `raw`.
double NiceStep(double raw);

}  // namespace gpupool
