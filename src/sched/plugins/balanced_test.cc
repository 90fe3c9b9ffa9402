// Balanced (sched/plugins/balanced.cc): FGD's points x 10,000, then CPU balance. Surplus after a
// placement = free CPU - rho x free GPU share, rho = the typical GPU tasks' CPU per milli-GPU;
// memory deficit = min(0, (free memory / mu - free share) x rho), mu = MiB per milli-GPU seen (0
// when no task with memory was observed: no memory term; the tests with a given workload have none).
//   whole-GPU task: score = points x 10,000 - |surplus| + memory deficit
//   CPU-only task:  score = points x 10,000 + 100 x (min(surplus, 0) + memory deficit)
//   share task:     score = points x 10,000 + memory deficit (FGD's own choice when memory is ample)
// Cases computed by hand; where FGD would choose differently the test says so.
#include "sched/plugins/balanced.h"

#include <gtest/gtest.h>

#include <limits>

#include "sched/test_util.h"

namespace gpupool {
namespace {

using testutil::ExpectPlaced;
using testutil::RawScores;
using testutil::Task;
using testutil::TestCluster;
using testutil::Typical;

// The hand-made weights alone: these cases are about the score, not about adapting it.
const Value kGiven(Value::Map{{"workload", "given"}, {"adapt", false}});

Profile BalancedGiven() {
  Profile p = ProfileForPolicy("balanced").value();
  p.scores[0].args = kGiven;
  return p;
}

// Typical pod (8000, 1000, 1): rho = 8 mCPU per milli-GPU. Whole-GPU task (8000 mCPU).
//   A (index 0): 64000 mCPU, 4 GPUs. FGD: the pod fits before and after -> dF 0 -> 50 points.
//      surplus after = 56000 - 8 x 3000 = 32000 -> 500000 - 32000 = 468000
//   B (index 1): 40000 mCPU, 4 GPUs. 50 points; surplus 32000 - 24000 = 8000 -> 492000
//   -> B, where CPU and GPU run out together. FGD ties at 50 and takes A (lower rank).
TEST(Balanced, WholeGpuTaskKeepsTheNodeBalanced) {
  TestCluster c;
  c.SetTypicalPods({Typical(8000, 1000, 1, 1.0)});
  const NodeIndex a = c.AddNode("a", 64000, 64000, 4);
  const NodeIndex b = c.AddNode("b", 40000, 64000, 4);
  const TaskRequest task = Task().Cpu(8000).Gpus(1, 1000);
  EXPECT_EQ(RawScores(c, "balanced", task, {a, b}, kGiven), (std::vector<int64_t>{468000, 492000}));
  EXPECT_EQ(RawScores(c, "fgd", task, {a, b}), (std::vector<int64_t>{50, 50}));
  ExpectPlaced(c.BuildProfile(BalancedGiven(), DefaultRegistry()), task, b, {0});
  ExpectPlaced(c.Build("fgd"), task, a, {0});
}

// The weights scale each term (plugins/balanced.h). The case above with point 1000, wholeCpu 2 and
// wholeFree -1 (pack: prefer nodes left with less free share; rho x free share after = 8 x 3000 =
// 24000 on both nodes):
//   A: 50 x 1000 - (2 x 32000 - 24000) = 10000;  B: 50 x 1000 - (2 x 8000 - 24000) = 58000.
// An empty weights map is the hand-made score.
TEST(Balanced, WeightsScaleEachTerm) {
  TestCluster c;
  c.SetTypicalPods({Typical(8000, 1000, 1, 1.0)});
  const NodeIndex a = c.AddNode("a", 64000, 64000, 4);
  const NodeIndex b = c.AddNode("b", 40000, 64000, 4);
  const TaskRequest task = Task().Cpu(8000).Gpus(1, 1000);
  const Value w(Value::Map{{"point", 1000}, {"wholeCpu", 2}, {"wholeFree", -1}});
  EXPECT_EQ(RawScores(c, "balanced", task, {a, b}, Value(Value::Map{{"workload", "given"}, {"weights", w}})),
            (std::vector<int64_t>{10000, 58000}));
  EXPECT_EQ(RawScores(c, "balanced", task, {a, b},
                      Value(Value::Map{{"workload", "given"}, {"weights", Value(Value::Map{})}})),
            (std::vector<int64_t>{468000, 492000}));
  // Round trip through Value.
  BalancedWeights trained;
  trained.share_cpu = 0.25;
  trained.whole_free = -0.5;
  auto back = BalancedWeights::FromValue(trained.ToValue());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->share_cpu, 0.25);
  EXPECT_EQ(back->whole_free, -0.5);
  EXPECT_EQ(back->point, 10000);
}

// FGD points come first: one point is worth 10 cores of imbalance. Typical pods (8000, 1000, 1)
// w 0.5 and (8000, 1000, 2) w 0.5: rho = 8000 / 1500 = 16/3. Whole-GPU task, 8000 mCPU.
//   A: 2 GPUs, 40000 mCPU. Before F = 0. After [0, 1000]: the 2-GPU pod no longer fits: q2
//      0.5 x 1000 = 500 -> dF = -500 -> trunc(37.75) = 37 points; surplus 32000 - 16000/3 =
//      26666.7 (truncated to 26666) -> 370000 - 26666 = 343334
//   B: 4 GPUs, 96000 mCPU: both still fit -> 50 points; surplus 88000 - 16000 = 72000
//      -> 500000 - 72000 = 428000
//   -> B, though its balance is worse.
TEST(Balanced, FgdPointsComeBeforeBalance) {
  TestCluster c;
  c.SetTypicalPods({Typical(8000, 1000, 1, 0.5), Typical(8000, 1000, 2, 0.5)});
  const NodeIndex a = c.AddNode("a", 40000, 64000, 2);
  const NodeIndex b = c.AddNode("b", 96000, 64000, 4);
  const TaskRequest task = Task().Cpu(8000).Gpus(1, 1000);
  EXPECT_EQ(RawScores(c, "balanced", task, {a, b}, kGiven), (std::vector<int64_t>{343334, 428000}));
  ExpectPlaced(c.BuildProfile(BalancedGiven(), DefaultRegistry()), task, b, {0});
}

// Typical pods (8000, 1000, 1) w 0.9 and the CPU pod (4000) w 0.1: rho = 8. CPU-only task, 4000.
//   B (index 0): 34000 mCPU, 4 free GPUs. FGD: the GPU pod still fits (30000 >= 8000), the CPU
//      pod counts all idle GPUs either way -> 50 points. Surplus 30000 - 32000 = -2000
//      -> 500000 + 100 x -2000 = 300000
//   A (index 1): 36000 mCPU: 50 points; surplus 32000 - 32000 = 0 -> 500000
//   -> A: on B the task would take CPU that B's four free GPUs need. FGD takes B (lower rank).
TEST(Balanced, CpuOnlyTaskLeavesTheCpuFreeGpusNeed) {
  TestCluster c;
  c.SetTypicalPods({Typical(8000, 1000, 1, 0.9), Typical(4000, 0, 0, 0.1)});
  const NodeIndex b = c.AddNode("b", 34000, 64000, 4);
  const NodeIndex a = c.AddNode("a", 36000, 64000, 4);
  const TaskRequest task = Task().Cpu(4000);
  EXPECT_EQ(RawScores(c, "balanced", task, {b, a}, kGiven), (std::vector<int64_t>{300000, 500000}));
  ExpectPlaced(c.BuildProfile(BalancedGiven(), DefaultRegistry()), task, a, {});
  ExpectPlaced(c.Build("fgd"), task, b, {});
}

// A share task is placed as FGD places it (the scenario of Fgd.ShareTaskFillsThePartlyUsedGpu's
// kind: a partly used GPU that the task completes beats an empty node).
TEST(Balanced, ShareTaskIsPlacedAsFgdPlacesIt) {
  TestCluster c;
  c.SetTypicalPods({Typical(1000, 500, 1, 0.5), Typical(1000, 1000, 1, 0.5)});
  const NodeIndex a = c.AddNode("a", 16000, 64000, 2);
  const NodeIndex b = c.AddNode("b", 16000, 64000, 2);
  c.Commit(b, 1000, {{1, 500}});
  const TaskRequest task = Task().Cpu(1000).Gpus(1, 500);
  const auto fgd = RawScores(c, "fgd", task, {a, b});
  const auto balanced = RawScores(c, "balanced", task, {a, b}, kGiven);
  ASSERT_EQ(balanced.size(), 2u);
  EXPECT_EQ(balanced[0], fgd[0] * 10000);
  EXPECT_EQ(balanced[1], fgd[1] * 10000);
  ExpectPlaced(c.BuildProfile(BalancedGiven(), DefaultRegistry()), task, b, {1});
  ExpectPlaced(c.Build("fgd"), task, b, {1});
}

// Learning online: with nothing observed the workload is one whole GPU with no CPU (rho 0), so a
// whole-GPU task goes where the least CPU is left: the nodes of WholeGpuTaskKeepsTheNodeBalanced,
// task (16000, 1 x 1000): A surplus 48000, B 24000 -> B. After observing tasks of 16000 mCPU per
// GPU (rho 16): A 48000 - 48000 = 0, B 24000 - 48000 = -24000 -> A. The scheduler's cached scores
// from the first decision must not survive what the plugin learned.
TEST(Balanced, LearnsTheWorkloadFromArrivingTasks) {
  TestCluster c;
  const NodeIndex a = c.AddNode("a", 64000, 64000, 4);
  const NodeIndex b = c.AddNode("b", 40000, 64000, 4);
  Scheduler& s = c.Build("balanced");
  const TaskRequest task = Task().Cpu(16000).Gpus(1, 1000);
  Decision before = s.Decide(task);
  ASSERT_TRUE(before.placed);
  EXPECT_EQ(before.placement.node, b);
  for (int i = 0; i < 4; ++i) s.Observe(task);
  s.Observe(Task().Cpu(2000));
  Decision after = s.Decide(task);
  ASSERT_TRUE(after.placed);
  EXPECT_EQ(after.placement.node, a);
}

// Memory: tasks of 8000 mCPU, 16000 MiB and one GPU observed -> rho 8 mCPU and mu 16 MiB per
// milli-GPU. The same task on two 4-GPU nodes of 64000 mCPU: FGD ties (50 points), the CPU
// surplus ties (56000 - 24000 = 32000). A has 40000 MiB: 24000 left, the 3 free GPUs need 48000
// -> deficit (24000 / 16 - 3000) x 8 = -12000 -> 500000 - 32000 - 12000 = 456000. B has 200000 MiB:
// no deficit -> 468000. -> B; without the memory term the tie goes to A (lower rank).
TEST(Balanced, WholeGpuTaskLeavesTheMemoryFreeGpusNeed) {
  TestCluster c;
  const NodeIndex a = c.AddNode("a", 64000, 40000, 4);
  const NodeIndex b = c.AddNode("b", 64000, 200000, 4);
  Scheduler& s = c.Build("balanced");
  const TaskRequest task = Task().Cpu(8000).Mem(16000).Gpus(1, 1000);
  for (int i = 0; i < 3; ++i) s.Observe(task);
  Decision d = s.Decide(task);
  ASSERT_TRUE(d.placed);
  EXPECT_EQ(d.placement.node, b);
  (void)a;
}

// The same for a share task (8000 mCPU, 16000 MiB, 0.5 GPU) after observing it: mu = 16000 / 500
// = 32 MiB, rho = 8000 / 500 = 16 mCPU per milli-GPU. FGD ties at 50 on both empty nodes. A keeps
// 24000 MiB for 3500 milli-GPU free: (24000 / 32 - 3500) x 16 = -44000 -> 456000; B none -> 500000.
TEST(Balanced, ShareTaskLeavesTheMemoryFreeGpusNeed) {
  TestCluster c;
  const NodeIndex a = c.AddNode("a", 64000, 40000, 4);
  const NodeIndex b = c.AddNode("b", 64000, 200000, 4);
  Scheduler& s = c.Build("balanced");
  const TaskRequest task = Task().Cpu(8000).Mem(16000).Gpus(1, 500);
  for (int i = 0; i < 3; ++i) s.Observe(task);
  Decision d = s.Decide(task);
  ASSERT_TRUE(d.placed);
  EXPECT_EQ(d.placement.node, b);
  (void)a;
}

// Observing never changes the cluster, and invalid tasks are ignored.
TEST(Balanced, ObservingChangesNothingInTheLedger) {
  TestCluster c;
  c.AddNode("a", 64000, 64000, 4);
  Scheduler& s = c.Build("balanced");
  const uint64_t generation = c.ledger().state(0).generation;
  s.Observe(Task().Cpu(4000).Gpus(1, 500));
  s.Observe(Task().Cpu(-5).Gpus(1, 5000));  // invalid: ignored
  EXPECT_EQ(c.ledger().state(0).generation, generation);
  EXPECT_EQ(c.ledger().used_gpu_share(), 0);
}

TEST(Balanced, WeightsFromProfile) {
  Profile p = ProfileForPolicy("balanced").value();
  auto defaults = BalancedWeights::FromProfile(p);
  ASSERT_TRUE(defaults.ok()) << defaults.status().ToString();
  BalancedWeights d = *defaults, expected;
  const auto got = d.Fields(), want = expected.Fields();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(*got[i], *want[i]) << BalancedWeights::Names()[i];
  p.scores[0].args = Value(Value::Map{{"weights", Value(Value::Map{{"wholeFree", -0.5}})}});
  auto set = BalancedWeights::FromProfile(p);
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->whole_free, -0.5);
  EXPECT_EQ(set->whole_cpu, BalancedWeights{}.whole_cpu);
  p.scores[0].args = Value(Value::Map{{"weights", Value(Value::Map{{"nosuch", 1}})}});
  EXPECT_FALSE(BalancedWeights::FromProfile(p).ok());
  Profile fgd = ProfileForPolicy("fgd").value();
  fgd.name = "mine";
  auto none = BalancedWeights::FromProfile(fgd);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("profile 'mine' has no balanced score"), std::string::npos)
      << none.status().message();
}

TEST(Balanced, BadArgumentsAreNamed) {
  TestCluster c;
  c.AddNode("a", 64000, 64000, 4);
  auto make = [&](Value args) {
    Profile p = ProfileForPolicy("balanced").value();
    p.scores[0].args = std::move(args);
    Rng& rng = c.rng();
    return Scheduler::Create(p, DefaultRegistry(), c.ledger(), rng);
  };
  auto bad_workload = make(Value(Value::Map{{"workload", "later"}}));
  ASSERT_FALSE(bad_workload.ok());
  EXPECT_NE(bad_workload.status().message().find("workload must be"), std::string::npos);
  auto bad_key = make(Value(Value::Map{{"weight", 1}}));
  ASSERT_FALSE(bad_key.ok());
  EXPECT_NE(bad_key.status().message().find("unknown argument 'weight'"), std::string::npos);
  // Weights: a map of known names to finite numbers, point positive.
  auto weights = [&](Value w) { return make(Value(Value::Map{{"weights", std::move(w)}})); };
  auto not_map = weights(Value(1));
  ASSERT_FALSE(not_map.ok());
  EXPECT_NE(not_map.status().message().find("weights must be a map"), std::string::npos);
  auto unknown = weights(Value(Value::Map{{"wholeGpu", 1}}));
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("unknown weight 'wholeGpu'"), std::string::npos);
  auto text = weights(Value(Value::Map{{"wholeCpu", "x"}}));
  ASSERT_FALSE(text.ok());
  EXPECT_NE(text.status().message().find("weights.wholeCpu must be a number"), std::string::npos);
  auto zero_point = weights(Value(Value::Map{{"point", 0}}));
  ASSERT_FALSE(zero_point.ok());
  EXPECT_NE(zero_point.status().message().find("weights.point must be positive"), std::string::npos);
  auto inf = weights(Value(Value::Map{{"shareFree", std::numeric_limits<double>::infinity()}}));
  ASSERT_FALSE(inf.ok());
  EXPECT_NE(inf.status().message().find("weights.shareFree must be finite"), std::string::npos);
  EXPECT_TRUE(weights(Value(Value::Map{{"point", 1000}, {"cpuOnlyMemory", -2.5}})).ok());
  auto bad_coverage = make(Value(Value::Map{{"coverage", 0}}));
  ASSERT_FALSE(bad_coverage.ok());
  EXPECT_NE(bad_coverage.status().message().find("coverage"), std::string::npos);
  // 'given' with no typical workload anywhere.
  auto given = make(kGiven);
  ASSERT_FALSE(given.ok());
  EXPECT_NE(given.status().message().find("typical workload"), std::string::npos);
  // 'given' with typical pods in the arguments works.
  auto pod = Value(Value::Map{{"cpu", 8000}, {"gpuShare", 1000}, {"gpuCount", 1}, {"weight", 1.0}});
  EXPECT_TRUE(make(Value(Value::Map{{"workload", "given"}, {"typicalPods", Value(Value::List{pod})}})).ok());
  // Adapting: a bool, a ramp with 0 < from < to, CPU-bound weights by known names.
  auto adapt_text = make(Value(Value::Map{{"adapt", "yes"}}));
  ASSERT_FALSE(adapt_text.ok());
  EXPECT_NE(adapt_text.status().message().find("adapt"), std::string::npos);
  auto ramp = make(Value(Value::Map{{"cpuBoundFrom", 1.0}, {"cpuBoundTo", 0.9}}));
  ASSERT_FALSE(ramp.ok());
  EXPECT_NE(
      ramp.status().message().find("cpuBoundFrom and cpuBoundTo must satisfy 0 < from < to, got 1 and 0.9"),
      std::string::npos)
      << ramp.status().message();
  auto cpu_bound = make(Value(Value::Map{{"cpuBoundWeights", Value(Value::Map{{"wholeGpu", 1}})}}));
  ASSERT_FALSE(cpu_bound.ok());
  EXPECT_NE(cpu_bound.status().message().find("cpuBoundWeights: unknown weight 'wholeGpu'"),
            std::string::npos)
      << cpu_bound.status().message();
  EXPECT_TRUE(make(Value(Value::Map{{"adapt", false}, {"cpuBoundFrom", 0.5}, {"cpuBoundTo", 2}})).ok());
}

// Adapting to CPU scarcity. Nodes A (64000 mCPU) and B (40000 mCPU), 4 GPUs each: the cluster has
// 104000 / 8000 = 13 mCPU per milli-GPU. The workload, tasks of 16000 mCPU and one GPU, asks for
// 16: ratio 16 / 13 = 1.23, past cpuBoundTo (1.0), so the CPU-bound weights apply alone — once
// 256 tasks were seen. The task (16000, 1 GPU), rho 16, 50 FGD points on both nodes, equal free
// share after (the wholeFree terms tie): CPU surplus after A 48000 - 48000 = 0, B 24000 - 48000 =
// -24000. Hand-made weights (wholeCpu 1): A 0, B -24000 -> A. CPU-bound weights with wholeCpu -1
// (this test's, to make the switch visible): A 0, B +24000 -> B.
TEST(Balanced, AdaptsItsWeightsToACpuBoundWorkload) {
  const TaskRequest task = Task().Cpu(16000).Gpus(1, 1000);
  const Value flip(Value::Map{{"wholeCpu", -1}});
  auto run = [&](Value args, int observed) {
    TestCluster c;
    const NodeIndex a = c.AddNode("a", 64000, 64000, 4);
    const NodeIndex b = c.AddNode("b", 40000, 64000, 4);
    Profile p = ProfileForPolicy("balanced").value();
    p.scores[0].args = std::move(args);
    Scheduler& s = c.BuildProfile(p, DefaultRegistry());
    for (int i = 0; i < observed; ++i) s.Observe(task);
    Decision d = s.Decide(task);
    EXPECT_TRUE(d.placed);
    return d.placement.node == a ? "a" : d.placement.node == b ? "b" : "?";
  };
  const Value adapting(Value::Map{{"cpuBoundWeights", flip}});
  EXPECT_STREQ(run(adapting, 255), "a");  // too few tasks seen to judge the mix
  EXPECT_STREQ(run(adapting, 256), "b");
  EXPECT_STREQ(run(Value(Value::Map{{"cpuBoundWeights", flip}, {"adapt", false}}), 256), "a");
  // A ramp the workload does not reach (ratio 1.23 < 1.3): the hand-made weights.
  EXPECT_STREQ(
      run(Value(Value::Map{{"cpuBoundWeights", flip}, {"cpuBoundFrom", 1.3}, {"cpuBoundTo", 2}}), 256), "a");
  // Half-way up the ramp (from 1.0 to 1.4615: s = 0.5): wholeCpu 0.5 x 1 + 0.5 x -1 = 0, a tie on
  // CPU; the tie goes to the lower rank, A.
  EXPECT_STREQ(
      run(Value(Value::Map{
              {"cpuBoundWeights", flip}, {"cpuBoundFrom", 1.0}, {"cpuBoundTo", 1.0 + 2 * (16.0 / 13 - 1)}}),
          256),
      "a");
  // Given workload: its typical tasks say 16 mCPU per milli-GPU from the start.
  auto pod = Value(Value::Map{{"cpu", 16000}, {"gpuShare", 1000}, {"gpuCount", 1}, {"weight", 1.0}});
  EXPECT_STREQ(
      run(Value(Value::Map{
              {"workload", "given"}, {"typicalPods", Value(Value::List{pod})}, {"cpuBoundWeights", flip}}),
          0),
      "b");
}

TEST(Balanced, BlendAndTheCpuBoundWeights) {
  BalancedWeights a, b;
  a.whole_cpu = 1;
  b.whole_cpu = -1;
  b.share_free = 2;
  EXPECT_EQ(BalancedWeights::Blend(a, b, 0).whole_cpu, 1);
  EXPECT_EQ(BalancedWeights::Blend(a, b, -3).whole_cpu, 1);
  EXPECT_EQ(BalancedWeights::Blend(a, b, 1).whole_cpu, -1);
  EXPECT_EQ(BalancedWeights::Blend(a, b, 7).share_free, 2);
  const BalancedWeights half = BalancedWeights::Blend(a, b, 0.25);
  EXPECT_DOUBLE_EQ(half.whole_cpu, 0.5);
  EXPECT_DOUBLE_EQ(half.share_free, 0.5);
  EXPECT_DOUBLE_EQ(half.point, 10000);
  // The built-in CPU-bound set packs whole-GPU tasks and balances CPU for share tasks too.
  const BalancedWeights cpu = BalancedWeights::CpuBound();
  EXPECT_LT(cpu.whole_free, 0);
  EXPECT_GT(cpu.share_cpu, BalancedWeights{}.share_cpu);
  EXPECT_EQ(cpu.point, BalancedWeights{}.point);
  // cpuBoundWeights start from the CPU-bound set: a partial map changes only what it names.
  auto partial = BalancedWeights::FromValue(Value(Value::Map{{"wholeCpu", -1}}), cpu);
  ASSERT_TRUE(partial.ok());
  EXPECT_EQ(partial->whole_cpu, -1);
  EXPECT_EQ(partial->share_cpu, cpu.share_cpu);
}

}  // namespace
}  // namespace gpupool
