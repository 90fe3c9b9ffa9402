// The time-based replay's HTML report (`gpupool sim replay --html`): a self-contained page (inline
// SVG, no scripts or external assets) with GPUs allocated and asked for by waiting jobs over time, each queue's
// GPUs held over time, the wait and completion-time distributions per queue, and the migrations.
// Long series are averaged into at most kMaxChartPoints points per line, so the page stays small
// whatever the trace.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "sim/replay.h"

namespace gpupool {

inline constexpr size_t kMaxChartPoints = 1500;
// Queues drawn one line each (those that held the most GPU-seconds); the others share one line.
inline constexpr size_t kMaxQueueLines = 10;

// What the page says the run was (shown as given, escaped).
struct ReplayReportInfo {
  std::string title;                    // e.g. the trace's file name
  std::vector<std::string> settings;    // e.g. "policy balanced", "load x2"
};

std::string RenderReplayHtml(const ReplayResult& result, const ReplayReportInfo& info, int64_t step_seconds);

}  // namespace gpupool
