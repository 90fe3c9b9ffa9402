#include "sim/replay.h"

#include <gtest/gtest.h>

#include "common/rng.h"
#include "sim/replay_test_util.h"

namespace gpupool {
namespace {

using testutil::GpuJob;
using testutil::kReplayPolicies;


std::vector<NodeSpec> Cluster(const std::string& shape) {
  auto nodes = ServerCluster(shape, "V100-16GB", GpuCatalog::Builtin());
  EXPECT_TRUE(nodes.ok()) << nodes.status().ToString();
  return nodes.ok() ? *nodes : std::vector<NodeSpec>{};
}

ReplayResult MustReplay(const std::vector<NodeSpec>& nodes, const std::vector<TimedJob>& jobs,
                        ReplayOptions options = {}) {
  auto r = Replay(nodes, jobs, options, DefaultRegistry());
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : ReplayResult{};
}

// Worked by hand: one server of 2 GPUs. A (1 GPU, 0..10) runs at once; B (2 GPUs) waits for all
// of it; C (1 GPU, arriving at 1) goes ahead of B into the free GPU (1..4); B runs 10..15.
TEST(ReplayTest, AHandWorkedTraceWaitsBackfillsAndAccounts) {
  const std::vector<TimedJob> jobs = {GpuJob("A", 0, 10, 1), GpuJob("B", 0, 5, 2), GpuJob("C", 1, 3, 1)};
  ReplayOptions options;
  options.sample_seconds = 5;
  const ReplayResult r = MustReplay(Cluster("2x1"), jobs, options);
  ASSERT_EQ(r.jobs.size(), 3u);
  EXPECT_EQ(r.jobs[0].start, 0);
  EXPECT_EQ(r.jobs[0].end, 10);
  EXPECT_EQ(r.jobs[1].start, 10);
  EXPECT_EQ(r.jobs[1].end, 15);
  EXPECT_EQ(r.jobs[2].start, 1);
  EXPECT_EQ(r.jobs[2].end, 4);
  EXPECT_EQ(r.started, 3);
  EXPECT_EQ(r.makespan, 15);
  EXPECT_EQ(r.capacity_milli, 2000);
  // 1 GPU over [0,1), 2 over [1,4), 1 over [4,10), 2 over [10,15).
  EXPECT_EQ(r.allocated_milli_seconds, 1000 + 6000 + 6000 + 10000);
  EXPECT_DOUBLE_EQ(r.utilisation, 23000.0 / 30000.0);
  EXPECT_EQ(r.wait.count, 3);
  EXPECT_DOUBLE_EQ(r.wait.mean, 10.0 / 3);
  EXPECT_EQ(r.wait.p50, 0);
  EXPECT_EQ(r.wait.max, 10);
  EXPECT_EQ(r.jct.max, 15);
  EXPECT_EQ(r.jct.p50, 10);
  EXPECT_EQ(ReplaySeriesCsv(r),
            "time_s,allocated_gpus,running_jobs,pending_jobs,pending_gpus\n"
            "0,1.000,1,1,2.000\n"
            "5,1.000,1,1,2.000\n"
            "10,2.000,1,0,0.000\n"
            "15,0.000,0,0,0.000\n");
  // Per queue, means over each 5 s: asked A+B+C over [0,5) is 5+10+3 GPU-seconds, held A+C 5+3.
  EXPECT_EQ(ReplayQueueSeriesCsv(r, 5),
            "time_s,queue,asked_gpus,allocated_gpus\n"
            "0,q,3.600,1.600\n"
            "5,q,3.000,1.000\n"
            "10,q,2.000,2.000\n");
}

// A step so short over so long a trace that the series would take gigabytes: refused, saying so.
TEST(ReplayTest, ASeriesPastItsBoundIsRefused) {
  ReplayOptions fine;
  fine.sample_seconds = 1;
  auto r = Replay(Cluster("1x1"), {GpuJob("long", 0, 100'000'000, 1)}, fine, DefaultRegistry());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("choose a longer sample step than 1 s"), std::string::npos)
      << r.status().message();
}

// Hand-worked: two GPUs; a1 (long) and a2 take them at 0; a3 (queue a) and b1 (queue b, at 1)
// wait. When a2 ends at 10, FIFO runs a3 (it came first); the server's hierarchical order runs
// b1, whose queue uses nothing while a's uses a GPU.
TEST(ReplayTest, TheQueueingOrderIsTheServers) {
  const std::vector<TimedJob> jobs = {GpuJob("a1", 0, 100, 1, "a"), GpuJob("a2", 0, 10, 1, "a"),
                                      GpuJob("a3", 0, 10, 1, "a"), GpuJob("b1", 1, 10, 1, "b")};
  ReplayOptions fifo;
  const ReplayResult f = MustReplay(Cluster("2x1"), jobs, fifo);
  EXPECT_EQ(f.jobs[2].start, 10);
  EXPECT_EQ(f.jobs[3].start, 20);
  ReplayOptions fair;
  fair.ordering = OrderingPolicy::kHierarchical;
  const ReplayResult h = MustReplay(Cluster("2x1"), jobs, fair);
  EXPECT_EQ(h.jobs[3].start, 10);
  EXPECT_EQ(h.jobs[2].start, 20);
  EXPECT_EQ(h.wait_by_queue.at("b").max, 9);
  EXPECT_EQ(h.wait_by_queue.at("a").max, 20);
}

// A gang starts whole or not at all: two tasks of 8 GPUs need two 8-GPU servers at once.
TEST(ReplayTest, AGangWaitsForAllItsTasksAndOneThatNeverFitsIsReported) {
  std::vector<TimedJob> jobs = {GpuJob("one", 0, 50, 8), GpuJob("gang", 1, 10, 8, "q", 2)};
  const ReplayResult r = MustReplay(Cluster("8x2"), jobs);
  EXPECT_EQ(r.jobs[1].start, 50);
  // On one 8-GPU server and eight of 2, it never fits (16 GPUs exist, but not two servers of 8).
  const ReplayResult never = MustReplay(Cluster("8x1,2x8"), jobs);
  EXPECT_EQ(never.jobs[1].start, -1);
  EXPECT_EQ(never.started, 1);
  EXPECT_EQ(never.samples.back().pending_jobs, 1);
}

// A gang among a stream of small jobs: without reservations the small ones keep backfilling the
// GPUs it needs and it waits for the stream to end; with them (after 60 s, the server's default)
// its nodes are held from the first failure past 60 s, and it starts as soon as they drain.
TEST(ReplayTest, AReservationKeepsBackfillFromStarvingAGang) {
  std::vector<TimedJob> jobs = {GpuJob("s1", 0, 100, 1), GpuJob("gang", 1, 10, 2, "q", 2)};
  for (int k = 0; k < 20; ++k) jobs.push_back(GpuJob("small" + std::to_string(k), 5 + 10 * k, 15, 1));
  ReplayOptions none;
  none.reserve_after_seconds = -1;
  const ReplayResult starved = MustReplay(Cluster("2x2"), jobs, none);
  EXPECT_GE(starved.jobs[1].start, 200);
  EXPECT_EQ(starved.reservations, 0);
  const ReplayResult held = MustReplay(Cluster("2x2"), jobs);
  EXPECT_EQ(held.jobs[1].start, 100);  // s1 ends at 100; the last small job on its nodes at 80
  EXPECT_EQ(held.reservations, 1);
  for (size_t i = 2; i < jobs.size(); ++i) {  // nothing started on the held nodes meanwhile
    if (held.jobs[i].start > 70 && held.jobs[i].start < 100) ADD_FAILURE() << jobs[i].name << " started at " << held.jobs[i].start;
  }
  EXPECT_EQ(held.started, static_cast<int64_t>(jobs.size()));
}

// Shares of a GPU run side by side; in exclusive form (whole GPUs) the same jobs take turns.
TEST(ReplayTest, SharesOfAGpuRunTogether) {
  std::vector<TimedJob> jobs;
  for (int i = 0; i < 4; ++i) {
    TimedJob t = GpuJob("quarter" + std::to_string(i), 0, 100, 1);
    t.job.groups[0].request.gpu_share = MilliGpu(250);
    t.job.groups[0].exec.isolation = IsolationMode::kTimeslice;
    jobs.push_back(t);
  }
  const ReplayResult shared = MustReplay(Cluster("1x1"), jobs);
  EXPECT_EQ(shared.makespan, 100);
  EXPECT_EQ(shared.wait.max, 0);
  EXPECT_DOUBLE_EQ(shared.utilisation, 1.0);
  for (TimedJob& t : jobs) {
    t.job.groups[0].request.gpu_share = kWholeGpu;
    t.job.groups[0].exec.isolation = IsolationMode::kExclusive;
  }
  const ReplayResult whole = MustReplay(Cluster("1x1"), jobs);
  EXPECT_EQ(whole.makespan, 400);
  EXPECT_EQ(whole.wait.max, 300);
}

// Exclusive (the no-pooling counterfactual) rounds each share up to the whole GPU, and the window
// measures count what the jobs asked for, not what exclusive gave them. Worked by hand: four
// quarter-GPU jobs on one GPU, arriving at 0, 0, 0 and 300, each running 100 s; the window is
// [0, 300]. Pooled: the first three run together over [0, 100), the fourth over [300, 400).
// Exclusive: one at a time, 0..100, 100..200, 200..300, 300..400.
TEST(ReplayTest, ExclusiveRoundsSharesUpAndTheWindowCountsWhatWasAsked) {
  std::vector<TimedJob> jobs;
  for (int i = 0; i < 4; ++i) {
    TimedJob t = GpuJob("quarter" + std::to_string(i), i == 3 ? 300 : 0, 100, 1);
    t.job.groups[0].request.gpu_share = MilliGpu(250);
    t.job.groups[0].exec.isolation = IsolationMode::kTimeslice;
    jobs.push_back(t);
  }
  const ReplayResult pooled = MustReplay(Cluster("1x1"), jobs);
  EXPECT_EQ(pooled.window, 300);
  EXPECT_EQ(pooled.window_allocated_milli_seconds, 750 * 100);
  EXPECT_EQ(pooled.window_asked_milli_seconds, 750 * 100);
  EXPECT_EQ(pooled.completed_in_window, 3);
  EXPECT_EQ(pooled.wait.max, 0);
  ReplayOptions options;
  options.exclusive = true;
  const ReplayResult whole = MustReplay(Cluster("1x1"), jobs, options);
  EXPECT_EQ(whole.jobs[2].start, 200);
  EXPECT_EQ(whole.jobs[3].start, 300);
  EXPECT_EQ(whole.window_allocated_milli_seconds, 1000 * 300);
  EXPECT_EQ(whole.window_asked_milli_seconds, 250 * 300);
  EXPECT_EQ(whole.completed_in_window, 3);  // the third ends at 300, in the window
  EXPECT_EQ(whole.wait.max, 200);
  EXPECT_EQ(whole.jobs[0].gpu_milli, 1000);  // what it held
  // The input is not changed.
  EXPECT_EQ(jobs[0].job.groups[0].request.gpu_share, MilliGpu(250));
}

// The shape a failure makes others skip is the server's (sched/job_shape.h): GPU models are in it,
// so a job that asks for a model the cluster lacks does not hold back one of the same size.
TEST(ReplayTest, AFailedShapeIsTheServersShape) {
  TimedJob picky = GpuJob("picky", 0, 10, 1);
  picky.job.groups[0].request.gpu_models = {"A100-80GB"};
  const ReplayResult r = MustReplay(Cluster("1x1"), {picky, GpuJob("any", 0, 10, 1)});
  EXPECT_EQ(r.jobs[0].start, -1);
  EXPECT_EQ(r.jobs[1].start, 0);
}

TEST(ReplayTest, BadInputsAreRefusedNamingTheJob) {
  const auto nodes = Cluster("8x1");
  auto too_big = Replay(nodes, {GpuJob("big", 0, 1, 16)}, {}, DefaultRegistry());
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().message(), "job 0 (big): a task of 16 GPUs, and no node has more than 8");
  auto over = Replay(nodes, {GpuJob("wide", 0, 1, 4, "q", 3)}, {}, DefaultRegistry());
  EXPECT_EQ(over.status().message(), "job 0 (wide) asks for 12 GPUs, more than the cluster's 8");
  auto order = Replay(nodes, {GpuJob("x", 5, 1, 1), GpuJob("y", 4, 1, 1)}, {}, DefaultRegistry());
  EXPECT_EQ(order.status().message(), "job 1 (y) arrives before the job listed before it");
  auto zero = Replay(nodes, {GpuJob("z", 0, 0, 1)}, {}, DefaultRegistry());
  EXPECT_FALSE(zero.ok());
  ReplayOptions step;
  step.sample_seconds = 0;
  EXPECT_FALSE(Replay(nodes, {GpuJob("x", 0, 1, 1)}, step, DefaultRegistry()).ok());
  ReplayOptions policy;
  policy.policy = "no-such-policy";
  EXPECT_FALSE(Replay(nodes, {GpuJob("x", 0, 1, 1)}, policy, DefaultRegistry()).ok());
  EXPECT_FALSE(Replay({}, {GpuJob("x", 0, 1, 1)}, {}, DefaultRegistry()).ok());
}

// Random traces under every policy: no job starts before it arrives or ends other than a
// duration after its start; every job ends (each fits the empty cluster); at no instant is more
// allocated than exists; the integral matches the jobs' own GPU-seconds; the same inputs give the
// same result.
TEST(ReplayTest, PropertyAccountingHoldsUnderEveryPolicy) {
  for (const char* policy : kReplayPolicies) {
    SCOPED_TRACE(policy);
    SeededRng rng(17);
    std::vector<TimedJob> jobs;
    int64_t t = 0;
    static constexpr int kGpus[] = {1, 1, 1, 2, 4, 8};
    for (int i = 0; i < 300; ++i) {
      t += static_cast<int64_t>(rng.Uniform(20));
      const int gpus = kGpus[rng.Uniform(6)];
      const int tasks = gpus == 8 && rng.Uniform(4) == 0 ? 2 : 1;
      jobs.push_back(GpuJob("j" + std::to_string(i), t, 1 + static_cast<int64_t>(rng.Uniform(300)), gpus,
                             "q" + std::to_string(rng.Uniform(3)), tasks));
    }
    ReplayOptions options;
    options.policy = policy;
    options.ordering = OrderingPolicy::kHierarchical;
    options.sample_seconds = 7;
    const auto nodes = Cluster("8x3,2x4");
    const ReplayResult r = MustReplay(nodes, jobs, options);
    int64_t gpu_seconds = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      ASSERT_GE(r.jobs[i].start, jobs[i].arrival) << jobs[i].name;
      ASSERT_EQ(r.jobs[i].end, r.jobs[i].start + jobs[i].duration);
      gpu_seconds += r.jobs[i].gpu_milli * jobs[i].duration;
    }
    EXPECT_EQ(r.started, 300);
    EXPECT_EQ(r.allocated_milli_seconds, gpu_seconds);
    for (const ReplaySample& s : r.samples) ASSERT_LE(s.allocated_milli, r.capacity_milli);
    EXPECT_GT(r.wait.max, 0);  // the trace queues
    EXPECT_LE(r.utilisation, 1.0);
    const ReplayResult again = MustReplay(nodes, jobs, options);
    for (size_t i = 0; i < jobs.size(); ++i) ASSERT_EQ(again.jobs[i].start, r.jobs[i].start);
  }
}

// The pass leaves out jobs it could only skip; offering every pending job instead decides exactly
// the same, under every policy and queue order (random draws included: no decision more or less).
// It caught a pass that was pruned while the job nodes were held for could start in it.
TEST(ReplayTest, PruningThePassNeverChangesADecision) {
  static constexpr OrderingPolicy kOrders[] = {OrderingPolicy::kFifo, OrderingPolicy::kPriority,
                                               OrderingPolicy::kDrf, OrderingPolicy::kHierarchical};
  for (const char* policy : {"random", "balanced", "fgd"}) {
    for (OrderingPolicy order : kOrders) {
      SCOPED_TRACE(::testing::Message() << policy << " " << OrderingPolicyName(order));
      SeededRng rng(5);
      std::vector<TimedJob> jobs;
      int64_t t = 0;
      static constexpr int kGpus[] = {1, 1, 2, 4, 8};
      for (int i = 0; i < 400; ++i) {
        t += static_cast<int64_t>(rng.Uniform(6));
        const int gpus = kGpus[rng.Uniform(5)];
        TimedJob j = GpuJob("j" + std::to_string(i), t, 1 + static_cast<int64_t>(rng.Uniform(400)), gpus,
                             "q" + std::to_string(rng.Uniform(3)), gpus == 8 ? 1 + static_cast<int>(rng.Uniform(2)) : 1);
        j.job.priority = static_cast<int>(rng.Uniform(2));
        jobs.push_back(std::move(j));
      }
      ReplayOptions pruned;
      pruned.policy = policy;
      pruned.ordering = order;
      ReplayOptions all = pruned;
      all.prune_pass = false;
      const auto nodes = Cluster("8x3,2x4");
      const ReplayResult a = MustReplay(nodes, jobs, pruned);
      const ReplayResult b = MustReplay(nodes, jobs, all);
      EXPECT_GT(a.wait.mean, 100);  // it queues
      EXPECT_EQ(a.attempts, b.attempts);
      EXPECT_EQ(a.reservations, b.reservations);
      for (size_t i = 0; i < jobs.size(); ++i) ASSERT_EQ(a.jobs[i].start, b.jobs[i].start) << jobs[i].name;
    }
  }
}

}  // namespace
}  // namespace gpupool
