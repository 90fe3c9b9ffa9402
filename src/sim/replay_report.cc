#include "sim/replay_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "sim/svg_chart.h"

namespace gpupool {

namespace {

// `values` sampled every `step` seconds from 0, averaged into at most kMaxChartPoints points; x in
// days.
std::vector<std::pair<double, double>> Downsample(const std::vector<double>& values, double step) {
  std::vector<std::pair<double, double>> out;
  if (values.empty()) return out;
  const size_t per = (values.size() + kMaxChartPoints - 1) / kMaxChartPoints;
  for (size_t i = 0; i < values.size(); i += per) {
    const size_t end = std::min(values.size(), i + per);
    double sum = 0;
    for (size_t k = i; k < end; ++k) sum += values[k];
    out.emplace_back(static_cast<double>(i) * step / 86400.0, sum / static_cast<double>(end - i));
  }
  return out;
}

std::string Seconds(double s) {
  if (s < 120) return fmt::format("{:.0f} s", s);
  if (s < 7200) return fmt::format("{:.1f} min", s / 60);
  if (s < 2 * 86400) return fmt::format("{:.1f} h", s / 3600);
  return fmt::format("{:.1f} d", s / 86400);
}

std::string DistributionRow(const std::string& name, const Distribution& d) {
  return fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                     HtmlEscape(name), d.count, Seconds(d.mean), Seconds(static_cast<double>(d.p50)),
                     Seconds(static_cast<double>(d.p95)), Seconds(static_cast<double>(d.p99)),
                     Seconds(static_cast<double>(d.max)));
}

}  // namespace

std::string RenderReplayHtml(const ReplayResult& r, const ReplayReportInfo& info, int64_t step_seconds) {
  const double days = static_cast<double>(r.makespan) / 86400.0;
  std::string html =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<title>gpupool replay report</title>\n<style>\n"
      "body { font-family: sans-serif; margin: 24px; color: #222; }\n"
      "section { margin-bottom: 32px; }\n"
      "svg { margin: 8px 16px 8px 0; font-family: sans-serif; }\n"
      "table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }\n"
      "td:first-child, th:first-child { text-align: left; }\n"
      "</style>\n</head>\n<body>\n";
  html += fmt::format("<h1>gpupool replay: {}</h1>\n<p>", HtmlEscape(info.title));
  for (size_t i = 0; i < info.settings.size(); ++i) html += (i ? ", " : "") + HtmlEscape(info.settings[i]);
  html += "</p>\n";
  const double cap = static_cast<double>(r.capacity_milli) / 1000.0;
  html += fmt::format(
      "<p>{} jobs, {} started; {:.0f} GPUs; makespan {:.1f} days; GPUs allocated {:.1f} % of capacity over "
      "it.</p>\n",
      r.jobs.size(), r.started, cap, days, 100.0 * r.utilisation);

  if (r.node_failures > 0 || r.preemptions > 0) {
    html += fmt::format(
        "<p>{} node failures stopped jobs {} times ({:.1f} GPU-hours of work done again); {} evictions started {} "
        "jobs ({:.1f} GPU-hours done again); restarts {:.1f} GPU-hours.</p>\n",
        r.node_failures, r.interruptions, static_cast<double>(r.failure_lost_milli_seconds) / 3.6e6, r.preemptions,
        r.preemptors, static_cast<double>(r.preempted_lost_milli_seconds) / 3.6e6,
        static_cast<double>(r.resume_restart_milli_seconds) / 3.6e6);
  }
  // GPUs over time.
  {
    std::vector<double> allocated, pending;
    for (const ReplaySample& s : r.samples) {
      allocated.push_back(static_cast<double>(s.allocated_milli) / 1000.0);
      pending.push_back(static_cast<double>(s.pending_gpus_milli) / 1000.0);
    }
    const double step = r.samples.size() > 1 ? static_cast<double>(r.samples[1].time - r.samples[0].time)
                                             : static_cast<double>(step_seconds);
    ChartSpec spec;
    spec.title = "GPUs allocated";
    spec.x_label = "Days since the first arrival";
    spec.y_label = "GPUs";
    spec.x_max = std::max(days, 1e-3);
    const std::vector<ChartLine> lines = {{"allocated", Downsample(allocated, step)},
                                          {"capacity", {{0, cap}, {spec.x_max, cap}}}};
    ChartSpec waiting = spec;
    waiting.title = "GPUs asked for by waiting jobs";
    html += "<section>\n<h2>Allocation</h2>\n" + SvgLineChart(spec, lines) +
            SvgLineChart(waiting, {{"waiting", Downsample(pending, step)}}) + "</section>\n";
  }
  // Per queue: GPUs held (means over each step).
  if (!r.queue_names.empty() && !r.queue_steps.empty()) {
    ChartSpec spec;
    spec.title = "GPUs held per queue";
    spec.x_label = "Days since the first arrival";
    spec.y_label = "GPUs (mean over each step)";
    spec.x_max = std::max(days, 1e-3);
    // The queues that held the most, one line each; the rest summed into one line.
    std::vector<std::pair<int64_t, size_t>> by_held;
    for (size_t q = 0; q < r.queue_names.size(); ++q) {
      int64_t total = 0;
      for (const auto& step : r.queue_steps) total += step[q].held_milli_seconds;
      by_held.emplace_back(-total, q);
    }
    std::sort(by_held.begin(), by_held.end());
    const size_t shown = by_held.size() <= kMaxQueueLines ? by_held.size() : kMaxQueueLines - 1;
    std::vector<ChartLine> lines;
    const auto series = [&](const std::vector<size_t>& queues) {
      std::vector<double> held;
      held.reserve(r.queue_steps.size());
      for (const auto& step : r.queue_steps) {
        int64_t sum = 0;
        for (size_t q : queues) sum += step[q].held_milli_seconds;
        held.push_back(static_cast<double>(sum) / 1000.0 / static_cast<double>(step_seconds));
      }
      return Downsample(held, static_cast<double>(step_seconds));
    };
    for (size_t i = 0; i < shown; ++i) lines.push_back({r.queue_names[by_held[i].second], series({by_held[i].second})});
    if (shown < by_held.size()) {
      std::vector<size_t> rest;
      for (size_t i = shown; i < by_held.size(); ++i) rest.push_back(by_held[i].second);
      lines.push_back({fmt::format("{} other queues", rest.size()), series(rest)});
    }
    html += "<section>\n<h2>Queues</h2>\n" + SvgLineChart(spec, lines) + "</section>\n";
  }
  // Waits and completion times.
  const std::string head =
      "<table>\n<tr><th></th><th>jobs</th><th>mean</th><th>p50</th><th>p95</th><th>p99</th><th>max</th></tr>\n";
  html += "<section>\n<h2>Waits (start &minus; arrival)</h2>\n" + head + DistributionRow("all", r.wait);
  for (const auto& [q, d] : r.wait_by_queue) html += DistributionRow(q, d);
  html += "</table>\n</section>\n";
  html += "<section>\n<h2>Completion times (end &minus; arrival)</h2>\n" + head + DistributionRow("all", r.jct) +
          "</table>\n</section>\n";
  // Migrations.
  if (!r.move_times.empty() || r.consolidation_attempts > 0) {
    html += fmt::format(
        "<section>\n<h2>Migration</h2>\n<p>{} jobs started by moving others ({} plans sought); {} tasks moved; "
        "{:.1f} GPU-hours of work done again and {:.1f} GPU-hours of restarts.</p>\n",
        r.consolidated, r.consolidation_attempts, r.migrations, static_cast<double>(r.lost_milli_seconds) / 3.6e6,
        static_cast<double>(r.restart_milli_seconds) / 3.6e6);
    ChartSpec spec;
    spec.title = "Tasks moved, cumulative";
    spec.x_label = "Days since the first arrival";
    spec.y_label = "Moves";
    spec.x_max = std::max(days, 1e-3);
    ChartLine line{"moves", {}};
    const size_t per = (r.move_times.size() + kMaxChartPoints - 1) / kMaxChartPoints;
    for (size_t i = 0; i < r.move_times.size(); i += std::max<size_t>(per, 1))
      line.xy.emplace_back(static_cast<double>(r.move_times[i]) / 86400.0, static_cast<double>(i + 1));
    if (!r.move_times.empty())
      line.xy.emplace_back(static_cast<double>(r.move_times.back()) / 86400.0,
                           static_cast<double>(r.move_times.size()));
    html += SvgLineChart(spec, {line}) + "</section>\n";
  }
  html += "</body>\n</html>\n";
  return html;
}

}  // namespace gpupool
