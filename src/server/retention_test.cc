// The retention controller alone over a PoolState.
#include "server/retention.h"

#include <gtest/gtest.h>

namespace gpupool {
namespace {

PoolJob& Add(PoolState& st, uint64_t seq, JobPhase phase, int64_t updated_ms, TaskPhase task = TaskPhase::kSucceeded,
             int64_t task_updated_ms = 0) {
  auto j = std::make_unique<PoolJob>();
  j->rec.id = "j-" + std::to_string(seq);
  j->rec.seq = seq;
  j->rec.tenant = "t";
  j->rec.queue = "q";
  j->rec.updated_ms = updated_ms;
  j->phase = phase;
  j->tasks.resize(1);
  j->tasks[0].phase = task;
  j->tasks[0].updated_ms = task_updated_ms;
  j->task_counts[static_cast<size_t>(task)] = 1;
  return st.AddJob(std::move(j));
}

TEST(RetentionTest, OnlyJobsThatEndedAndRestedForTheWholePeriodAreDue) {
  PoolState st;
  const int64_t keep = 1000, now = 10'000;
  Add(st, 1, JobPhase::kSucceeded, 8'000);                          // rested 2 s: due
  Add(st, 2, JobPhase::kSucceeded, 9'500);                          // rested 0.5 s: stays
  Add(st, 3, JobPhase::kRunning, 1'000, TaskPhase::kRunning);       // not ended
  Add(st, 4, JobPhase::kFailed, 1'000, TaskPhase::kStopping);       // ended, a task still stopping
  Add(st, 5, JobPhase::kCancelled, 1'000, TaskPhase::kCancelled, 9'900);  // a task changed lately
  Add(st, 6, JobPhase::kCancelled, 9'000, TaskPhase::kCancelled, 2'000);  // exactly the period: due
  Add(st, 7, JobPhase::kPending, 1'000, TaskPhase::kPending);
  const RetentionPass pass = ExpiredJobs(st, now, keep, 100);
  EXPECT_EQ(pass.expired, (std::vector<uint64_t>{1, 6}));
  EXPECT_FALSE(pass.more);
}

TEST(RetentionTest, APassTakesAtMostItsShareAndSaysThereIsMore) {
  PoolState st;
  for (uint64_t s = 1; s <= 5; ++s) Add(st, s, JobPhase::kSucceeded, 0);
  RetentionPass pass = ExpiredJobs(st, 10'000, 1000, 3);
  EXPECT_EQ(pass.expired, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_TRUE(pass.more);
  for (uint64_t s : pass.expired) st.RemoveJob(st.by_seq.find(s));
  pass = ExpiredJobs(st, 10'000, 1000, 3);
  EXPECT_EQ(pass.expired, (std::vector<uint64_t>{4, 5}));
  EXPECT_FALSE(pass.more);
  EXPECT_TRUE(st.CheckInvariants().ok());
}

}  // namespace
}  // namespace gpupool
