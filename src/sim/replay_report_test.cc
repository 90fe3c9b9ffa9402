// The replay's HTML report: its charts, its tables, escaping, and bounded size however long the
// series.
#include "sim/replay_report.h"
#include "sim/replay_test_util.h"

#include <gtest/gtest.h>

namespace gpupool {
namespace {

using testutil::GpuJob;
using testutil::kReplayPolicies;

size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++n;
  return n;
}

TEST(ReplayReportTest, ChartsTablesAndEscaping) {
  auto nodes = ServerCluster("2x2", "V100-16GB", GpuCatalog::Builtin());
  ASSERT_TRUE(nodes.ok());
  ReplayOptions options;
  options.sample_seconds = 10;
  options.migration.max_moves = 1;
  options.policy = "spread";
  options.reserve_after_seconds = -1;
  const std::vector<TimedJob> jobs = {GpuJob("a", 0, 1000, 1, "team-a"), GpuJob("b", 0, 1000, 1, "team-b"),
                                      GpuJob("c", 100, 500, 2, "team-a")};
  auto r = Replay(*nodes, jobs, options, DefaultRegistry());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->migrations, 1);
  const std::string html = RenderReplayHtml(*r, {"trace <b>&'x'", {"policy \"spread\""}}, 10);
  EXPECT_EQ(html.find("<!DOCTYPE html>"), 0u);
  EXPECT_EQ(Count(html, "<svg"), 4u);  // GPUs allocated, asked for by waiting jobs, per queue, moves
  EXPECT_EQ(Count(html, "</svg>"), 4u);
  EXPECT_NE(html.find("team-a"), std::string::npos);
  EXPECT_NE(html.find("team-b"), std::string::npos);
  EXPECT_NE(html.find("trace &lt;b&gt;&amp;&#39;x&#39;"), std::string::npos);
  EXPECT_NE(html.find("policy &quot;spread&quot;"), std::string::npos);
  EXPECT_EQ(html.find("<b>"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http://www.w3.org/2000/svg"), html.find("http"));  // no external assets
  EXPECT_NE(html.find("1 tasks moved"), std::string::npos);
}

TEST(ReplayReportTest, SaysWhatFailuresAndPreemptionCost) {
  ReplayResult r;
  r.capacity_milli = 1000;
  r.node_failures = 3;
  r.interruptions = 2;
  r.failure_lost_milli_seconds = 7'200'000;  // 2 GPU-hours
  r.preemptions = 4;
  r.preemptors = 1;
  const std::string html = RenderReplayHtml(r, {"t", {}}, 60);
  EXPECT_NE(html.find("3 node failures stopped jobs 2 times (2.0 GPU-hours"), std::string::npos);
  EXPECT_NE(html.find("4 evictions started 1 jobs"), std::string::npos);
  EXPECT_EQ(RenderReplayHtml(ReplayResult{}, {"t", {}}, 60).find("node failures"), std::string::npos);
}

// A long series is averaged into at most kMaxChartPoints points a line, and many queues share
// lines past kMaxQueueLines.
TEST(ReplayReportTest, LongSeriesAndManyQueuesStayBounded) {
  ReplayResult r;
  r.capacity_milli = 8000;
  r.makespan = 200000 * 60;
  for (int64_t i = 0; i < 200000; ++i) r.samples.push_back({i * 60, (i % 9) * 1000, 1, 0, 0});
  for (int q = 0; q < 40; ++q) r.queue_names.push_back("<q" + std::to_string(q) + ">");
  r.queue_steps.assign(5000, std::vector<QueueStep>(40, QueueStep{0, 60000}));
  const std::string html = RenderReplayHtml(r, {"long", {}}, 60);
  EXPECT_EQ(Count(html, "<svg"), 3u);
  // Lines: allocated and capacity, waiting; then 9 queues and "31 other queues".
  EXPECT_EQ(Count(html, "<polyline"), 3u + kMaxQueueLines);
  EXPECT_NE(html.find("31 other queues"), std::string::npos);
  EXPECT_EQ(html.find("<q"), std::string::npos);  // queue names escaped
  size_t longest = 0;
  for (size_t pos = html.find("points=\""); pos != std::string::npos; pos = html.find("points=\"", pos + 1)) {
    const size_t end = html.find('"', pos + 8);
    longest = std::max(longest, Count(html.substr(pos, end - pos), ",") );
  }
  EXPECT_LE(longest, kMaxChartPoints);
  EXPECT_LT(html.size(), size_t{2} << 20);
}

}  // namespace
}  // namespace gpupool
