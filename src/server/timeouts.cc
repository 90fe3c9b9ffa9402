#include "server/timeouts.h"

namespace gpupool {

std::vector<SilentNode> SilentNodes(const PoolState& st, double now_mono_s, double timeout_s) {
  std::vector<SilentNode> out;
  for (NodeIndex n = 0; n < st.nodes.size(); ++n) {
    const PoolNode& info = st.nodes[n];
    const double silent = now_mono_s - info.heartbeat_mono;
    if (info.state == "ready" && silent >= timeout_s) out.push_back({n, silent});
  }
  return out;
}

std::vector<OverdueStops> OverdueStopsAt(const PoolState& st, int64_t now_ms) {
  std::vector<OverdueStops> out;
  for (const std::string& id : st.stopping_jobs) {
    const PoolJob* j = st.FindJob(id);
    if (j == nullptr) continue;
    OverdueStops due{id, {}};
    for (size_t i = 0; i < j->tasks.size(); ++i) {
      const PoolTask& ts = j->tasks[i];
      if (ts.phase == TaskPhase::kStopping && ts.stop_deadline_ms <= now_ms && !ts.stop_overdue_noted)
        due.tasks.push_back(static_cast<int>(i));
    }
    if (!due.tasks.empty()) out.push_back(std::move(due));
  }
  return out;
}

}  // namespace gpupool
