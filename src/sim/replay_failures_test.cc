// Jobs stopped in the replay. Node failures: the drawn failures, a failure worked by hand (the job
// stops, loses the work since its checkpoint, waits for the repair, restarts), and accounting
// under every policy with many failures. Preemption, the server's: worked by hand.
#include "sim/replay_failures.h"

#include <gtest/gtest.h>

#include <cmath>

#include "common/rng.h"
#include "sim/replay.h"
#include "sim/replay_test_util.h"

namespace gpupool {
namespace {

using testutil::GpuJob;
using testutil::kReplayPolicies;

TEST(ReplayFailures, DrawnFailuresAreRepairedAndDeterministic) {
  FailureOptions o;
  o.node_mtbf_hours = 1;
  o.repair_seconds = 600;
  NodeFailures a(o, 3), b(o, 3);
  int64_t last = 0;
  int fails = 0;
  for (int i = 0; i < 200; ++i) {
    ASSERT_NE(a.Next(), nullptr);
    ASSERT_EQ(a.Next()->time, b.Next()->time);
    ASSERT_GE(a.Next()->time, last);
    last = a.Next()->time;
    const auto e = a.Pop(false);
    (void)b.Pop(false);
    ASSERT_TRUE(e.has_value());
    if (e->fails) {
      ++fails;
      EXPECT_TRUE(a.is_down(e->node));
    } else {
      EXPECT_FALSE(a.is_down(e->node));
    }
    EXPECT_GE(a.down(), 0);
    EXPECT_LE(a.down(), 3);
  }
  EXPECT_GT(fails, 50);
  // Idle: failures are passed over, so repairs run out and nothing is down.
  for (int i = 0; i < 20; ++i) (void)a.Pop(true);
  EXPECT_EQ(a.down(), 0);
}

TEST(ReplayFailures, BadOptionsAreRefused) {
  FailureOptions o;
  EXPECT_TRUE(ValidateFailureOptions(o).ok());
  o.node_mtbf_hours = -1;
  EXPECT_FALSE(ValidateFailureOptions(o).ok());
  o.node_mtbf_hours = 0.001;
  EXPECT_FALSE(ValidateFailureOptions(o).ok());
  o.node_mtbf_hours = std::nan("");
  EXPECT_FALSE(ValidateFailureOptions(o).ok());
  o = {};
  o.repair_seconds = 0;
  EXPECT_FALSE(ValidateFailureOptions(o).ok());
  o = {};
  o.scripted = {{-5, 0}};
  EXPECT_FALSE(ValidateFailureOptions(o).ok());
}

// Worked by hand: one server of one GPU. A (1 GPU, 1,000 s) starts at 0; checkpoints every 300 s
// of work, 60 s restarts. The node fails at 500 and is back at 600: A has done 500 s, kept 300,
// lost 200; it starts again at 600, restarts until 660 and works its 700 s left: it ends at 1,360.
// B (1 GPU, 100 s) arriving at 550 waits for the repair too, behind A (which arrived first).
TEST(ReplayFailures, AFailedNodesJobRestartsFromItsCheckpointWorkedByHand) {
  auto nodes = ServerCluster("1x1", "V100-16GB", GpuCatalog::Builtin());
  ASSERT_TRUE(nodes.ok());
  ReplayOptions options;
  options.migration.checkpoint_seconds = 300;
  options.migration.restart_seconds = 60;
  options.failures.scripted = {{500, 0}};
  options.failures.repair_seconds = 100;
  auto r = Replay(*nodes, {GpuJob("A", 0, 1000, 1), GpuJob("B", 550, 100, 1)}, options, DefaultRegistry());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->node_failures, 1);
  EXPECT_EQ(r->interruptions, 1);
  EXPECT_EQ(r->jobs[0].start, 0);  // its first start
  EXPECT_EQ(r->jobs[0].end, 1360);
  EXPECT_EQ(r->jobs[0].interrupted, 1);
  EXPECT_EQ(r->jobs[1].start, 1360);
  EXPECT_EQ(r->jobs[1].end, 1460);
  EXPECT_EQ(r->failure_lost_milli_seconds, 200 * 1000);
  EXPECT_EQ(r->resume_restart_milli_seconds, 60 * 1000);
  EXPECT_EQ(r->started, 2);
  EXPECT_EQ(r->makespan, 1460);
  // Held: [0,500) and [600,1360) by A, [1360,1460) by B.
  EXPECT_EQ(r->allocated_milli_seconds, 1000 * (500 + 760 + 100));
  // The wait counts to the first start, the JCT to the last end.
  EXPECT_EQ(r->wait.max, 810);
  EXPECT_EQ(r->jct.max, 1360);
}

// A gang stops whole when one of its nodes fails, and a failure of a node that holds nothing
// stops nothing.
TEST(ReplayFailures, AGangStopsWholeAndAnIdleNodeStopsNothing) {
  auto nodes = ServerCluster("1x3", "V100-16GB", GpuCatalog::Builtin());
  ASSERT_TRUE(nodes.ok());
  ReplayOptions options;
  options.policy = "spread";
  options.migration.checkpoint_seconds = 1000;  // no checkpoint before the failure: all work lost
  options.migration.restart_seconds = 0;
  options.failures.repair_seconds = 50;
  // The gang takes two of the three servers; find which one it left free and fail that one too.
  auto base = Replay(*nodes, {GpuJob("G", 0, 400, 1, "q", 2)}, options, DefaultRegistry());
  ASSERT_TRUE(base.ok());
  options.failures.scripted = {{100, 0}, {100, 1}, {100, 2}};
  auto r = Replay(*nodes, {GpuJob("G", 0, 400, 1, "q", 2)}, options, DefaultRegistry());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->node_failures, 3);
  EXPECT_EQ(r->interruptions, 1);  // one gang, stopped once, though two of its nodes failed
  EXPECT_EQ(r->jobs[0].end, 150 + 400);
  EXPECT_EQ(r->failure_lost_milli_seconds, 100 * 2000);
}

// Random traces and failures under every policy: every job ends, each has run its whole duration
// (what it lost done again), GPUs are never over capacity, and the same inputs replay the same.
TEST(ReplayFailures, PropertyEveryJobEndsUnderEveryPolicy) {
  auto nodes = ServerCluster("8x2,2x4,4x2", "V100-16GB", GpuCatalog::Builtin());
  ASSERT_TRUE(nodes.ok());
  int64_t interruptions = 0;
  for (const char* policy : kReplayPolicies) {
    SCOPED_TRACE(policy);
    SeededRng rng(31);
    std::vector<TimedJob> jobs;
    int64_t t = 0;
    static constexpr int kGpus[] = {1, 1, 2, 4, 8};
    for (int i = 0; i < 200; ++i) {
      t += static_cast<int64_t>(rng.Uniform(100));
      const int gpus = kGpus[rng.Uniform(5)];
      jobs.push_back(GpuJob("j" + std::to_string(i), t, 1 + static_cast<int64_t>(rng.Uniform(2000)), gpus,
                           "q", gpus == 8 && rng.Uniform(3) == 0 ? 2 : 1));
    }
    ReplayOptions options;
    options.policy = policy;
    options.failures.node_mtbf_hours = 2;
    options.failures.repair_seconds = 300;
    options.migration.checkpoint_seconds = 120;
    options.migration.restart_seconds = 20;
    if (std::string(policy) == "balanced") options.migration.max_moves = 2;  // with migration too
    auto r = Replay(*nodes, jobs, options, DefaultRegistry());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->started, 200);
    int64_t extra_lower_bound = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      ASSERT_GE(r->jobs[i].start, jobs[i].arrival);
      ASSERT_GE(r->jobs[i].end, r->jobs[i].start + jobs[i].duration) << jobs[i].name;
      if (r->jobs[i].interrupted == 0 && r->migrations == 0) {
        ASSERT_EQ(r->jobs[i].end, r->jobs[i].start + jobs[i].duration) << jobs[i].name;
      }
      extra_lower_bound += r->jobs[i].interrupted;
    }
    EXPECT_EQ(extra_lower_bound, r->interruptions);
    for (const ReplaySample& s : r->samples) ASSERT_LE(s.allocated_milli, r->capacity_milli);
    interruptions += r->interruptions;
    auto again = Replay(*nodes, jobs, options, DefaultRegistry());
    ASSERT_TRUE(again.ok());
    for (size_t i = 0; i < jobs.size(); ++i) ASSERT_EQ(again->jobs[i].end, r->jobs[i].end);
  }
  EXPECT_GT(interruptions, 20);  // the property means something only if jobs were stopped
}

}  // namespace
}  // namespace gpupool

namespace gpupool {
namespace {

TimedJob Prioritised(const std::string& name, int64_t arrival, int64_t duration, int gpus, int priority, QosClass qos) {
  TimedJob t = GpuJob(name, arrival, duration, gpus);
  t.job.priority = priority;
  t.job.qos = qos;
  return t;
}

// Worked by hand: one server of one GPU. A best-effort job (priority 0, 1,000 s) runs from 0; a
// burstable one of priority 5 (200 s) arrives at 100 and preempts it, as the server would. The
// victim has done 100 s, kept 60 (checkpoints every 60 s), lost 40; it waits, and once the GPU is
// free at 300 restarts (10 s) and works its 940 s left: it ends at 1,250.
TEST(ReplayPreemption, AHigherPriorityJobEvictsBestEffortWorkWorkedByHand) {
  auto nodes = ServerCluster("1x1", "V100-16GB", GpuCatalog::Builtin());
  ASSERT_TRUE(nodes.ok());
  ReplayOptions options;
  options.migration.checkpoint_seconds = 60;
  options.migration.restart_seconds = 10;
  auto r = Replay(*nodes,
                  {Prioritised("be", 0, 1000, 1, 0, QosClass::kBestEffort),
                   Prioritised("urgent", 100, 200, 1, 5, QosClass::kBurstable)},
                  options, DefaultRegistry());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->preemptions, 1);
  EXPECT_EQ(r->preemptors, 1);
  EXPECT_EQ(r->jobs[1].start, 100);
  EXPECT_EQ(r->jobs[1].end, 300);
  EXPECT_EQ(r->jobs[0].start, 0);
  EXPECT_EQ(r->jobs[0].end, 1250);
  EXPECT_EQ(r->jobs[0].interrupted, 1);
  EXPECT_EQ(r->preempted_lost_milli_seconds, 40 * 1000);
  EXPECT_EQ(r->resume_restart_milli_seconds, 10 * 1000);
  EXPECT_EQ(r->allocated_milli_seconds, 1000 * (100 + 200 + 950));
  // Without the priority, nobody is evicted: the second job waits.
  auto fifo = Replay(*nodes,
                     {Prioritised("be", 0, 1000, 1, 0, QosClass::kBestEffort),
                      Prioritised("urgent", 100, 200, 1, 0, QosClass::kBurstable)},
                     options, DefaultRegistry());
  ASSERT_TRUE(fifo.ok());
  EXPECT_EQ(fifo->preemptions, 0);
  EXPECT_EQ(fifo->jobs[1].start, 1000);
}

// Only best-effort work is evicted, and only when evicting it makes room: a 2-GPU job of high
// priority on a 2-GPU server where one GPU holds burstable work evicts nothing while that work
// runs (100..500); once it ends, evicting the best-effort job makes room, and it is evicted then.
// Default checkpoints (1,800 s) and restarts (60 s): the victim loses its 500 s, restarts at 600
// when the big job ends, and runs its whole 1,000 s again.
TEST(ReplayPreemption, NothingIsEvictedWhileEvictingWouldNotMakeRoom) {
  auto nodes = ServerCluster("2x1", "V100-16GB", GpuCatalog::Builtin());
  ASSERT_TRUE(nodes.ok());
  auto r = Replay(*nodes,
                  {Prioritised("be", 0, 1000, 1, 0, QosClass::kBestEffort),
                   Prioritised("steady", 0, 500, 1, 0, QosClass::kBurstable),
                   Prioritised("big", 100, 100, 2, 9, QosClass::kBurstable)},
                  {}, DefaultRegistry());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->jobs[1].end, 500);  // the burstable job is never a victim
  EXPECT_EQ(r->jobs[1].interrupted, 0);
  EXPECT_EQ(r->jobs[2].start, 500);
  EXPECT_EQ(r->preemptions, 1);
  EXPECT_EQ(r->jobs[0].interrupted, 1);
  EXPECT_EQ(r->preempted_lost_milli_seconds, 500 * 1000);
  EXPECT_EQ(r->jobs[0].end, 600 + 60 + 1000);
}

}  // namespace
}  // namespace gpupool
