// The timeout controllers alone over a PoolState.
#include "server/timeouts.h"

#include <gtest/gtest.h>

namespace gpupool {
namespace {

TEST(TimeoutsTest, OnlyReadyNodesSilentForTheWholeTimeoutAreLost) {
  PoolState st;
  st.nodes.resize(4);
  st.nodes[0].heartbeat_mono = 100;  // silent 20 s
  st.nodes[1].heartbeat_mono = 110;  // silent 10 s: exactly the timeout
  st.nodes[2].heartbeat_mono = 115;  // silent 5 s
  st.nodes[3].heartbeat_mono = 50;
  st.nodes[3].state = "lost";        // already lost: not again
  const auto silent = SilentNodes(st, 120, 10);
  ASSERT_EQ(silent.size(), 2u);
  EXPECT_EQ(silent[0].node, 0u);
  EXPECT_DOUBLE_EQ(silent[0].silent_s, 20);
  EXPECT_EQ(silent[1].node, 1u);
}

TEST(TimeoutsTest, OverdueStopsAreTheStoppingTasksPastTheirDeadline) {
  PoolState st;
  auto j = std::make_unique<PoolJob>();
  j->rec.id = "j-1";
  j->rec.seq = 1;
  j->tasks.resize(4);
  j->tasks[0].phase = TaskPhase::kStopping;
  j->tasks[0].stop_deadline_ms = 1000;  // due
  j->tasks[1].phase = TaskPhase::kStopping;
  j->tasks[1].stop_deadline_ms = 5000;  // not yet
  j->tasks[2].phase = TaskPhase::kRunning;
  j->tasks[2].stop_deadline_ms = 10;    // not stopping
  j->tasks[3].phase = TaskPhase::kStopping;
  j->tasks[3].stop_deadline_ms = 2000;  // exactly now: due
  st.AddJob(std::move(j));
  st.stopping_jobs = {"j-1", "j-gone"};  // a job no longer there is skipped
  const auto due = OverdueStopsAt(st, 2000);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].job_id, "j-1");
  EXPECT_EQ(due[0].tasks, (std::vector<int>{0, 3}));
  EXPECT_TRUE(OverdueStopsAt(st, 999).empty());
}

}  // namespace
}  // namespace gpupool
