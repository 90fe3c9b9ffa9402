// `gpupool sim report`: a self-contained HTML page (inline SVG, no scripts or external assets)
// with, for each trace, the GPU allocation and fragmentation curves of each policy (seed-mean)
// against arrived GPU demand 0..130 %.
#pragma once

#include <string>

#include "common/status.h"
#include "sim/svg_chart.h"
#include "sim/sweep.h"

namespace gpupool {

// `alloc` and `frag` are published-layout tables (analysis_allo_discrete.csv and
// analysis_frag_discrete.csv). `trace` restricts the page to one trace ("default" or
// "openb_pod_list_default"); empty: every trace in the input.
Result<std::string> RenderReportHtml(const DiscreteTable& alloc, const DiscreteTable& frag,
                                     const std::string& trace = "");
Status WriteReportHtml(const DiscreteTable& alloc, const DiscreteTable& frag, const std::string& trace,
                       const std::string& out_path);

}  // namespace gpupool
