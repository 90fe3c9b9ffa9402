#include "server/hotspots.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <vector>

namespace gpupool {

HotSpotChange ObserveGpuSample(const ServerConfig::Hotspot& rule, const GpuSample& sample, int64_t now_ms,
                               PoolNode::GpuCondition& c) {
  c.temperature_c = sample.temperature_c;
  c.utilization = sample.utilization;
  c.memory_used_fraction = sample.memory_used_fraction;
  std::vector<std::string> over;
  if (rule.temperature_c > 0 && sample.temperature_c >= rule.temperature_c)
    over.push_back(fmt::format("temperature {:.0f} C >= {:.0f} C", sample.temperature_c, rule.temperature_c));
  if (rule.utilization > 0 && sample.utilization >= rule.utilization)
    over.push_back(fmt::format("utilization {:.2f} >= {:.2f}", sample.utilization, rule.utilization));
  if (rule.memory_used_fraction > 0 && sample.memory_used_fraction >= rule.memory_used_fraction)
    over.push_back(
        fmt::format("memory used {:.2f} >= {:.2f}", sample.memory_used_fraction, rule.memory_used_fraction));
  if (!over.empty()) {
    c.under_since_ms = 0;
    if (c.over_since_ms == 0) c.over_since_ms = now_ms;
    if (c.hot || now_ms - c.over_since_ms < 1000LL * rule.window_seconds) return HotSpotChange::kNone;
    c.hot = true;
    c.hot_reason = fmt::format("{} for {} s", fmt::join(over, ", "), (now_ms - c.over_since_ms) / 1000);
    return HotSpotChange::kTurnedHot;
  }
  c.over_since_ms = 0;
  if (c.under_since_ms == 0) c.under_since_ms = now_ms;
  if (!c.hot || now_ms - c.under_since_ms < 1000LL * rule.cooldown_seconds) return HotSpotChange::kNone;
  c.hot = false;
  c.hot_reason.clear();
  return HotSpotChange::kCooled;
}

}  // namespace gpupool
