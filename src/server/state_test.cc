// PoolState alone: jobs enter and leave every index and count together, phase changes keep the
// counts in step, and CheckInvariants notices when something does not agree.
#include "server/state.h"

#include <gtest/gtest.h>

namespace gpupool {
namespace {

std::unique_ptr<PoolJob> MakeJob(uint64_t seq, const std::string& tenant, const std::string& queue, int tasks) {
  auto j = std::make_unique<PoolJob>();
  j->rec.id = "j-" + std::to_string(seq);
  j->rec.seq = seq;
  j->rec.tenant = tenant;
  j->rec.queue = queue;
  j->tasks.resize(static_cast<size_t>(tasks));
  j->task_counts[static_cast<size_t>(TaskPhase::kPending)] = tasks;
  return j;
}

TEST(PoolStateTest, JobsEnterAndLeaveEveryIndexTogether) {
  PoolState st;
  st.AddJob(MakeJob(1, "vision", "q", 3));
  PoolJob& b = st.AddJob(MakeJob(2, "vision", "q", 1));
  ASSERT_TRUE(st.CheckInvariants().ok()) << st.CheckInvariants().ToString();
  EXPECT_EQ(st.pending_counts.tenant("vision").jobs, 2);
  EXPECT_EQ(st.pending_counts.tenant("vision").tasks, 4);
  EXPECT_EQ(st.pending.size(), 2u);
  EXPECT_EQ(st.FindJob("j-2"), &b);

  // Running, then one task done and the job succeeded: the pending counts drop at once.
  st.SetJobPhase(b, JobPhase::kRunning);
  st.pending.erase(2);
  EXPECT_EQ(st.pending_counts.tenant("vision").jobs, 1);
  st.SetTaskPhase(b, b.tasks[0], TaskPhase::kSucceeded);
  st.SetJobPhase(b, JobPhase::kSucceeded);
  ASSERT_TRUE(st.CheckInvariants().ok()) << st.CheckInvariants().ToString();
  EXPECT_EQ(st.job_phase_count[static_cast<size_t>(JobPhase::kSucceeded)], 1);

  // Removing both leaves nothing behind: no tenant, no queue, no counts.
  auto it = st.RemoveJob(st.by_seq.find(2));
  EXPECT_EQ(it, st.by_seq.end());
  st.RemoveJob(st.by_seq.find(1));
  ASSERT_TRUE(st.CheckInvariants().ok()) << st.CheckInvariants().ToString();
  EXPECT_TRUE(st.jobs.empty());
  EXPECT_TRUE(st.by_tenant.empty());
  EXPECT_TRUE(st.queue_phase_count.empty());
  EXPECT_TRUE(st.pending_counts.tenants().empty());
  EXPECT_EQ(st.job_phase_count, PoolState::JobCounts{});
}

TEST(PoolStateTest, CheckInvariantsNoticesWhatDoesNotAgree) {
  {
    PoolState st;
    PoolJob& j = st.AddJob(MakeJob(1, "t", "q", 2));
    ++j.task_counts[static_cast<size_t>(TaskPhase::kRunning)];
    EXPECT_NE(st.CheckInvariants().message().find("task counts are off"), std::string::npos);
  }
  {
    PoolState st;
    st.AddJob(MakeJob(1, "t", "q", 2));
    ++st.job_phase_count[static_cast<size_t>(JobPhase::kFailed)];
    EXPECT_NE(st.CheckInvariants().message().find("per-phase job counts"), std::string::npos);
  }
  {
    PoolState st;
    st.AddJob(MakeJob(1, "t", "q", 2));
    st.by_tenant["other"].insert(1);
    EXPECT_NE(st.CheckInvariants().message().find("tenant index"), std::string::npos);
  }
  {
    // A pending count no job holds (submissions in flight hold theirs apart, in the service).
    PoolState st;
    st.AddJob(MakeJob(1, "t", "q", 2));
    st.pending_counts.Add("t", "q", 5);
    EXPECT_NE(st.CheckInvariants().message().find("pending jobs"), std::string::npos);
  }
  {
    // The stopping index and held nodes follow the phases.
    PoolState st;
    PoolJob& j = st.AddJob(MakeJob(1, "t", "q", 2));
    st.reserved_for = j.rec.id;
    ASSERT_TRUE(st.CheckInvariants().ok()) << st.CheckInvariants().ToString();
    st.SetJobPhase(j, JobPhase::kRunning);
    EXPECT_TRUE(st.reserved_for.empty());  // left the queue: the nodes are free for others
    st.SetTaskPhase(j, j.tasks[0], TaskPhase::kStopping);
    EXPECT_EQ(st.stopping_jobs.count(j.rec.id), 1u);
    st.SetTaskPhase(j, j.tasks[0], TaskPhase::kCancelled);
    EXPECT_EQ(st.stopping_jobs.count(j.rec.id), 0u);
    st.reserved_for = "j-404";
    EXPECT_NE(st.CheckInvariants().message().find("not pending"), std::string::npos);
  }
  {
    // A placed task the ledger does not hold.
    PoolState st;
    PoolJob& j = st.AddJob(MakeJob(1, "t", "q", 1));
    st.SetTaskPhase(j, j.tasks[0], TaskPhase::kRunning);
    j.tasks[0].placed = true;
    EXPECT_NE(st.CheckInvariants().message().find("ledger"), std::string::npos) << st.CheckInvariants().ToString();
  }
}

}  // namespace
}  // namespace gpupool
