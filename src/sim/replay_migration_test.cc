// Migration in the replay: the cost model and the cooldown by hand, the budget's window, and a
// replay in which a waiting 2-GPU job starts at once by moving a 1-GPU job, worked by hand.
#include "sim/replay_migration.h"

#include <gtest/gtest.h>

#include "common/rng.h"
#include "sim/replay.h"
#include "sim/replay_test_util.h"

namespace gpupool {
namespace {

using testutil::GpuJob;
using testutil::kReplayPolicies;

MigrationOptions Model(int64_t checkpoint, int64_t restart) {
  MigrationOptions o;
  o.max_moves = 1;
  o.checkpoint_seconds = checkpoint;
  o.restart_seconds = restart;
  return o;
}

TEST(ReplayMigration, AMoveLosesTheWorkSinceTheLastCheckpointAndRestarts) {
  const MigrationOptions o = Model(60, 30);
  RunSegment run{0, 0, 10000, false};
  EXPECT_EQ(run.End(), 10000);
  EXPECT_TRUE(MayMove(run, 0, o));  // never moved: may move at once (and lose what it did)
  EXPECT_EQ(run.WorkDone(100), 100);
  const MoveCost cost = MoveTask(run, 100, o);
  // 100 s done, checkpoints at 60: 40 s lost; 9,940 s left, after a 30 s restart.
  EXPECT_EQ(cost.lost_seconds, 40);
  EXPECT_EQ(cost.restart_seconds, 30);
  EXPECT_EQ(run.start, 100);
  EXPECT_EQ(run.work_left, 9940);
  EXPECT_EQ(run.End(), 100 + 30 + 9940);
  // The cooldown: no move until its next checkpoint, 60 s of work after the restart.
  EXPECT_EQ(run.WorkDone(120), 0);  // still restarting
  EXPECT_FALSE(MayMove(run, 120, o));
  EXPECT_FALSE(MayMove(run, 189, o));
  EXPECT_TRUE(MayMove(run, 190, o));
  // Moved again at 200: 70 s done since the restart, 60 kept, 10 lost.
  const MoveCost again = MoveTask(run, 200, o);
  EXPECT_EQ(again.lost_seconds, 10);
  EXPECT_EQ(run.work_left, 9880);
  EXPECT_EQ(run.End(), 200 + 30 + 9880);
}

TEST(ReplayMigration, AMoveDuringTheRestartLosesNoWorkButRestartsAgain) {
  const MigrationOptions o = Model(60, 30);
  RunSegment run{0, 0, 500, false};
  MoveTask(run, 100, o);  // 40 lost, 440 left, work again from 130
  const MoveCost cost = MoveTask(run, 110, o);
  EXPECT_EQ(cost.lost_seconds, 0);
  EXPECT_EQ(run.work_left, 440);
  EXPECT_EQ(run.End(), 110 + 30 + 440);
}

TEST(ReplayMigration, WorkDoneNeverPassesWhatIsLeft) {
  RunSegment run{0, 0, 50, false};
  EXPECT_EQ(run.WorkDone(1000), 50);
  EXPECT_EQ(run.WorkDone(-5), 0);
}

TEST(ReplayMigration, TheBudgetCountsMovesInTheLastHour) {
  MoveBudget b(3);
  EXPECT_EQ(b.Left(0), 3);
  b.Spend(0, 2);
  EXPECT_EQ(b.Left(10), 1);
  b.Spend(100, 1);
  EXPECT_EQ(b.Left(3599), 0);
  EXPECT_EQ(b.Left(3600), 2);  // the two moves at 0 are an hour old
  EXPECT_EQ(b.Left(3700), 3);
}

TEST(ReplayMigration, BadOptionsAreRefused) {
  MigrationOptions o;
  EXPECT_TRUE(ValidateMigrationOptions(o).ok());
  o.max_moves = 65;
  EXPECT_FALSE(ValidateMigrationOptions(o).ok());
  o = {};
  o.checkpoint_seconds = 0;
  EXPECT_FALSE(ValidateMigrationOptions(o).ok());
  o = {};
  o.restart_seconds = -1;
  EXPECT_FALSE(ValidateMigrationOptions(o).ok());
  o = {};
  o.moves_per_hour = 0;
  EXPECT_FALSE(ValidateMigrationOptions(o).ok());
  o = {};
  o.plans_per_event = 0;
  EXPECT_FALSE(ValidateMigrationOptions(o).ok());
  o = {};
  o.max_candidates = 5000;
  EXPECT_FALSE(ValidateMigrationOptions(o).ok());
  // And the replay refuses them before doing anything.
  ReplayOptions r;
  r.migration.checkpoint_seconds = 0;
  auto nodes = ServerCluster("2x1", "V100-16GB", GpuCatalog::Builtin());
  ASSERT_TRUE(nodes.ok());
  TimedJob j;
  j.name = "a";
  j.duration = 1;
  j.job.name = "a";
  j.job.groups.push_back({});
  j.job.groups[0].name = "t";
  j.job.groups[0].request.gpu_count = 1;
  j.job.groups[0].request.gpu_share = kWholeGpu;
  EXPECT_EQ(Replay(*nodes, {j}, r, DefaultRegistry()).status().code(), StatusCode::kInvalidArgument);
}

// Worked by hand: two servers of 2 GPUs, `spread` placement. A and B (1 GPU, 10,000 s) take one
// GPU of each server at 0; C (2 GPUs, 500 s) arrives at 100 and fits no server. Without migration
// it waits for A or B: 10,000..10,500. With one move allowed (checkpoints every 60 s, 30 s
// restart) it starts at 100 on one server, the 1-GPU job there moving beside the other: that job
// loses the 40 s since its checkpoint at 60 and restarts for 30 s, so it ends at 100 + 30 + 9,940.
TEST(ReplayMigration, AWaitingJobStartsByMovingAnotherWorkedByHand) {
  auto nodes = ServerCluster("2x2", "V100-16GB", GpuCatalog::Builtin());
  ASSERT_TRUE(nodes.ok());
  const std::vector<TimedJob> jobs = {GpuJob("A", 0, 10000, 1), GpuJob("B", 0, 10000, 1),
                                      GpuJob("C", 100, 500, 2)};
  ReplayOptions options;
  options.policy = "spread";
  options.reserve_after_seconds = -1;
  auto base = Replay(*nodes, jobs, options, DefaultRegistry());
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  EXPECT_EQ(base->jobs[2].start, 10000);
  EXPECT_EQ(base->migrations, 0);

  options.migration = Model(60, 30);
  auto r = Replay(*nodes, jobs, options, DefaultRegistry());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->jobs[2].start, 100);
  EXPECT_EQ(r->jobs[2].end, 600);
  // One of A and B moved.
  const int64_t moved_end = 100 + 30 + 9940;
  EXPECT_TRUE((r->jobs[0].end == moved_end && r->jobs[1].end == 10000) ||
              (r->jobs[1].end == moved_end && r->jobs[0].end == 10000))
      << r->jobs[0].end << " " << r->jobs[1].end;
  EXPECT_EQ(r->consolidated, 1);
  EXPECT_EQ(r->migrations, 1);
  EXPECT_EQ(r->lost_milli_seconds, 40 * 1000);
  EXPECT_EQ(r->restart_milli_seconds, 30 * 1000);
  EXPECT_EQ(r->makespan, moved_end);
  // GPUs held: 2 over [0,100); 4 over [100,600) (the moved job holds its new GPU while it
  // restarts); 2 to 10,000; 1 to the moved job's end.
  EXPECT_EQ(r->allocated_milli_seconds, 1000 * (2 * 100 + 4 * 500 + 2 * 9400 + 1 * (moved_end - 10000)));
  // The moved job's stale end (10,000) does not end it twice nor count as running.
  EXPECT_EQ(r->started, 3);
}

// Random traces under every policy, with migration: every job runs its whole duration plus what
// its moves cost, the GPUs held integrate to exactly that, no hour has more moves than the budget,
// and the same inputs give the same replay.
TEST(ReplayMigration, PropertyAccountingAndBudgetHoldUnderEveryPolicy) {
  auto nodes = ServerCluster("8x2,2x4,4x2", "V100-16GB", GpuCatalog::Builtin());
  ASSERT_TRUE(nodes.ok());
  int64_t moves = 0;
  for (const char* policy : kReplayPolicies) {
    SCOPED_TRACE(policy);
    SeededRng rng(23);
    std::vector<TimedJob> jobs;
    int64_t t = 0;
    static constexpr int kGpus[] = {1, 1, 1, 1, 2, 4, 8};
    for (int i = 0; i < 300; ++i) {
      t += static_cast<int64_t>(rng.Uniform(60));
      jobs.push_back(GpuJob("j" + std::to_string(i), t, 1 + static_cast<int64_t>(rng.Uniform(3000)),
                               kGpus[rng.Uniform(7)]));
    }
    ReplayOptions options;
    options.policy = policy;
    options.migration = Model(50, 10);
    options.migration.max_moves = 3;
    options.migration.moves_per_hour = 4;
    auto r = Replay(*nodes, jobs, options, DefaultRegistry());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->started, 300);
    int64_t held = 0, extra = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      ASSERT_GE(r->jobs[i].start, jobs[i].arrival);
      ASSERT_GE(r->jobs[i].end, r->jobs[i].start + jobs[i].duration);
      held += r->jobs[i].gpu_milli * (r->jobs[i].end - r->jobs[i].start);
      extra += r->jobs[i].gpu_milli * (r->jobs[i].end - r->jobs[i].start - jobs[i].duration);
    }
    EXPECT_EQ(extra, r->lost_milli_seconds + r->restart_milli_seconds);
    EXPECT_EQ(r->allocated_milli_seconds, held);
    for (const ReplaySample& s : r->samples) ASSERT_LE(s.allocated_milli, r->capacity_milli);
    ASSERT_EQ(static_cast<int64_t>(r->move_times.size()), r->migrations);
    for (size_t i = 0; i < r->move_times.size(); ++i) {
      size_t in_hour = 0;
      for (size_t k = 0; k <= i; ++k) in_hour += r->move_times[k] > r->move_times[i] - 3600 ? 1 : 0;
      ASSERT_LE(in_hour, 4u) << "at " << r->move_times[i];
    }
    moves += r->migrations;
    auto again = Replay(*nodes, jobs, options, DefaultRegistry());
    ASSERT_TRUE(again.ok());
    for (size_t i = 0; i < jobs.size(); ++i) ASSERT_EQ(again->jobs[i].end, r->jobs[i].end);
  }
  EXPECT_GT(moves, 20);  // the property means something only if jobs moved
}

}  // namespace
}  // namespace gpupool
