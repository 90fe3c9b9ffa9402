#include "sim/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace gpupool {

namespace {

const char* Color(size_t i) {
  static const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return kColors[i % (sizeof(kColors) / sizeof(kColors[0]))];
}

}  // namespace

double NiceStep(double raw) {
  if (!(raw > 0)) return 1;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * p >= raw) return m * p;
  }
  return 10 * p;
}

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

std::string SvgLineChart(const ChartSpec& spec, const std::vector<ChartLine>& lines) {
  constexpr double kW = 720, kH = 400, kLeft = 60, kRight = 180, kTop = 40, kBottom = 50;
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  double y_max = 0;
  bool any = false;
  for (const ChartLine& line : lines) {
    for (const auto& [x, y] : line.xy) {
      if (std::isnan(y) || std::isnan(x)) continue;
      y_max = std::max(y_max, y);
      any = true;
    }
  }
  double step = 10;
  if (spec.y_to_100 && y_max <= 100) {
    y_max = 100;
  } else {
    step = NiceStep(std::max(y_max, 1.0) / 5);
    y_max = std::ceil(std::max(y_max, 1.0) / step) * step;
  }
  const double x_min = spec.x_min;
  const double x_span = spec.x_max > spec.x_min ? spec.x_max - spec.x_min : 1;
  const double x_step = NiceStep(x_span / 12);
  auto x_of = [&](double x) { return kLeft + pw * std::clamp((x - x_min) / x_span, 0.0, 1.0); };
  auto y_of = [&](double v) { return kTop + ph * (1 - std::clamp(v / y_max, 0.0, 1.0)); };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "role=\"img\" aria-label=\"{2}\">\n",
      kW, kH, HtmlEscape(spec.title));
  svg += fmt::format("<title>{}</title>\n", HtmlEscape(spec.title));
  svg += fmt::format(
      "<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">{}</text>\n",
      kLeft + pw / 2, HtmlEscape(spec.title));
  // Grid, ticks and tick labels.
  for (double v = std::ceil(x_min / x_step) * x_step; v <= spec.x_max + 1e-9; v += x_step) {
    const double x = x_of(v);
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#e5e5e5\"/>\n", x, kTop,
                       kTop + ph);
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#333\"/>\n", x, kTop + ph,
                       kTop + ph + 5);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\" font-size=\"11\">{:g}</text>\n", x,
                       kTop + ph + 18, v);
  }
  for (int i = 0; i * step <= y_max + 1e-9; ++i) {
    const double v = i * step;
    const double y = y_of(v);
    svg += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#e5e5e5\"/>\n", kLeft, y,
                       kLeft + pw, y);
    svg += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#333\"/>\n", kLeft - 5, y,
                       kLeft, y);
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\" font-size=\"11\">{:g}</text>\n", kLeft - 8,
                       y + 4, v);
  }
  // Axes and their labels.
  svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#333\"/>\n", kLeft, kTop, kTop + ph);
  svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#333\"/>\n", kLeft, kTop + ph,
                     kLeft + pw);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"12\">{}</text>\n", kLeft + pw / 2,
                     kH - 10, HtmlEscape(spec.x_label));
  svg += fmt::format(
      "<text x=\"16\" y=\"{0}\" text-anchor=\"middle\" font-size=\"12\" transform=\"rotate(-90 16 "
      "{0})\">{1}</text>\n",
      kTop + ph / 2, HtmlEscape(spec.y_label));
  // One line per series, and the legend.
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string points;
    for (const auto& [x, y] : lines[i].xy) {
      if (std::isnan(y) || std::isnan(x)) continue;
      points += fmt::format("{}{:.2f},{:.2f}", points.empty() ? "" : " ", x_of(x), y_of(y));
    }
    svg += fmt::format(
        "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\" "
        "points=\"{}\"><title>{}</title></polyline>\n",
        Color(i), points, HtmlEscape(lines[i].name));
    const double ly = kTop + 10 + 20 * static_cast<double>(i);
    svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"3\"/>\n",
                       kLeft + pw + 15, ly, kLeft + pw + 40, Color(i));
    svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"12\">{}</text>\n", kLeft + pw + 46, ly + 4,
                       HtmlEscape(lines[i].name));
  }
  if (!any) {
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"13\">no data</text>\n",
                       kLeft + pw / 2, kTop + ph / 2);
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace gpupool
