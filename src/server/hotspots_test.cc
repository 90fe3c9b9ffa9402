// The hot-spot rule alone, sample by sample with a clock the test moves.
#include "server/hotspots.h"

#include <gtest/gtest.h>

namespace gpupool {
namespace {

ServerConfig::Hotspot Rule() {
  ServerConfig::Hotspot r;
  r.temperature_c = 85;
  r.utilization = 0.95;
  r.memory_used_fraction = 0;  // off
  r.window_seconds = 30;
  r.cooldown_seconds = 120;
  return r;
}

GpuSample Hot() { return {90, 0.5, 0.99}; }
GpuSample Cool() { return {60, 0.5, 0.99}; }

TEST(HotSpotRule, HotOnlyAfterAWholeWindowOverAThreshold) {
  PoolNode::GpuCondition c;
  EXPECT_EQ(ObserveGpuSample(Rule(), Hot(), 1'000, c), HotSpotChange::kNone);
  EXPECT_EQ(ObserveGpuSample(Rule(), Hot(), 20'000, c), HotSpotChange::kNone);
  // One sample under every threshold starts the spell again.
  EXPECT_EQ(ObserveGpuSample(Rule(), Cool(), 25'000, c), HotSpotChange::kNone);
  EXPECT_EQ(ObserveGpuSample(Rule(), Hot(), 26'000, c), HotSpotChange::kNone);
  EXPECT_EQ(ObserveGpuSample(Rule(), Hot(), 55'000, c), HotSpotChange::kNone);
  EXPECT_FALSE(c.hot);
  EXPECT_EQ(ObserveGpuSample(Rule(), Hot(), 56'000, c), HotSpotChange::kTurnedHot);
  EXPECT_TRUE(c.hot);
  EXPECT_EQ(c.hot_reason, "temperature 90 C >= 85 C for 30 s");  // memory 0.99: that threshold is off
  // Still over: no second change.
  EXPECT_EQ(ObserveGpuSample(Rule(), Hot(), 90'000, c), HotSpotChange::kNone);
  EXPECT_EQ(c.temperature_c, 90);
}

TEST(HotSpotRule, CoolsAfterTheWholeCooldownUnderEveryThreshold) {
  PoolNode::GpuCondition c;
  ObserveGpuSample(Rule(), {50, 0.99, -1}, 10'000, c);
  ASSERT_EQ(ObserveGpuSample(Rule(), {50, 0.99, -1}, 40'000, c), HotSpotChange::kTurnedHot);
  EXPECT_EQ(c.hot_reason, "utilization 0.99 >= 0.95 for 30 s");
  EXPECT_EQ(ObserveGpuSample(Rule(), Cool(), 45'000, c), HotSpotChange::kNone);
  EXPECT_EQ(ObserveGpuSample(Rule(), Cool(), 150'000, c), HotSpotChange::kNone);
  // Over again: the cooldown starts over.
  EXPECT_EQ(ObserveGpuSample(Rule(), Hot(), 155'000, c), HotSpotChange::kNone);
  EXPECT_EQ(ObserveGpuSample(Rule(), Cool(), 160'000, c), HotSpotChange::kNone);
  EXPECT_EQ(ObserveGpuSample(Rule(), Cool(), 279'000, c), HotSpotChange::kNone);
  EXPECT_TRUE(c.hot);
  EXPECT_EQ(ObserveGpuSample(Rule(), Cool(), 280'000, c), HotSpotChange::kCooled);
  EXPECT_FALSE(c.hot);
  EXPECT_TRUE(c.hot_reason.empty());
  EXPECT_EQ(c.under_since_ms, 160'000);
}

TEST(HotSpotRule, UnreportedTelemetryAndThresholdsThatAreOffNeverMakeAGpuHot) {
  ServerConfig::Hotspot off = Rule();
  off.temperature_c = 0;
  off.utilization = 0;
  PoolNode::GpuCondition c;
  for (int64_t t = 0; t <= 600'000; t += 10'000) EXPECT_EQ(ObserveGpuSample(off, Hot(), t, c), HotSpotChange::kNone);
  PoolNode::GpuCondition d;
  for (int64_t t = 0; t <= 600'000; t += 10'000) EXPECT_EQ(ObserveGpuSample(Rule(), {}, t, d), HotSpotChange::kNone);
  EXPECT_FALSE(c.hot || d.hot);
}

}  // namespace
}  // namespace gpupool
