// The hot-spot rule (docs/server.md#hot-spots): a GPU whose telemetry stays over a threshold for
// the whole window turns hot — it takes no new placements and its best-effort jobs are migrated —
// and is usable again once it has been under every threshold for the cooldown. The rule only reads
// the samples and the GPU's condition and says what changed; PoolService acts on it (usable or not,
// events, migrations). No I/O, no clock of its own.
#pragma once

#include <cstdint>

#include "server/config.h"
#include "server/state.h"

namespace gpupool {

// One heartbeat's telemetry of one GPU; -1: not reported.
struct GpuSample {
  double temperature_c = -1;
  double utilization = -1;
  double memory_used_fraction = -1;
};

enum class HotSpotChange { kNone, kTurnedHot, kCooled };

// Feeds `sample`, taken at `now_ms`, to the GPU's condition `c` (its spells over and under the
// thresholds, its telemetry). kTurnedHot: `c.hot` is now set and `c.hot_reason` says which
// thresholds and for how long; kCooled: `c.hot` is clear and `c.under_since_ms` tells since when.
HotSpotChange ObserveGpuSample(const ServerConfig::Hotspot& rule, const GpuSample& sample, int64_t now_ms,
                               PoolNode::GpuCondition& c);

}  // namespace gpupool
