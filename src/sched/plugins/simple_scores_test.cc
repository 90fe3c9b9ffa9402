// The published baselines (README §4: Random, DotProd, GpuClustering, GpuPacking, BestFit), binpack
// and spread, and the pipeline's tie-breaking, on small clusters scored by hand.
//
// Notation as in the README: c_N free mCPU of a node, G its free mGPU, g_i per GPU, f its fully
// free GPUs out of n; c, k, m the task's mCPU, GPU count and per-GPU share. The normalisation
// constants Cmax and Gmax are the cluster's largest node CPU and largest GPU count x 1000 (128000
// and 8000 on the Alibaba cluster, but not in these scenarios).
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "sched/test_util.h"

namespace gpupool {
namespace {

using testutil::ExpectPlaced;
using testutil::RawScores;
using testutil::Task;
using testutil::TestCluster;

// ---- DotProd ---------------------------------------------------------------------------------

// Cmax = 32000 (both nodes), Gmax = 4000 (A has 4 GPUs). Task c=8000, 1 x 1000: u = (0.25, 0.25).
//   A: 4 T4s, a 3-GPU task holds GPUs 0-2 and 4000 mCPU: c_N=28000, G=1000, v = (0.875, 0.25)
//      v.u = 0.21875 + 0.0625 = 0.28125;  S = trunc(100 (1 - 0.140625)) = trunc(85.94) = 85
//   B: 3 T4s, a 1-GPU task holds GPU 0 and 20000 mCPU: c_N=12000, G=2000, v = (0.375, 0.5)
//      v.u = 0.09375 + 0.125 = 0.21875;   S = trunc(100 (1 - 0.109375)) = trunc(89.06) = 89
//   -> B, on its lowest-index free GPU, 1.
// (With the Alibaba constants 128000/8000 both would score trunc(98.5) = trunc(98.1) = 98 and the
// tie would go to A: the constants must be the cluster's own.)
TEST(DotProd, UsesTheClustersOwnMaxima) {
  TestCluster c;
  const NodeIndex a = c.AddNode("a", 32000, 64000, 4);
  c.Commit(a, 4000, {{0, 1000}, {1, 1000}, {2, 1000}});
  const NodeIndex b = c.AddNode("b", 32000, 64000, 3);
  c.Commit(b, 20000, {{0, 1000}});
  const TaskRequest task = Task().Cpu(8000).Gpus(1, 1000);
  EXPECT_EQ(RawScores(c, "dotprod", task, {a, b}), (std::vector<int64_t>{85, 89}));
  Scheduler& s = c.Build("dotprod");
  ExpectPlaced(s, task, b, {1});
}

// Same nodes, CPU-only task c=8000: u = (0.25, 0).
//   A: v.u = 0.875 * 0.25 = 0.21875; S = trunc(100 (1 - 0.109375)) = 89
//   B: v.u = 0.375 * 0.25 = 0.09375; S = trunc(100 (1 - 0.046875)) = trunc(95.31) = 95 -> B
TEST(DotProd, CpuOnlyTaskUsesTheCpuTermOnly) {
  TestCluster c;
  const NodeIndex a = c.AddNode("a", 32000, 64000, 4);
  c.Commit(a, 4000, {{0, 1000}, {1, 1000}, {2, 1000}});
  const NodeIndex b = c.AddNode("b", 32000, 64000, 3);
  c.Commit(b, 20000, {{0, 1000}});
  const TaskRequest task = Task().Cpu(8000);
  EXPECT_EQ(RawScores(c, "dotprod", task, {a, b}), (std::vector<int64_t>{89, 95}));
  Scheduler& s = c.Build("dotprod");
  ExpectPlaced(s, task, b, {});
}

// Cmax = 64000, Gmax = 2000. Task c=16000, 1 x 250: u = (0.25, 0.125).
//   C: 48000 mCPU used, GPU 0 has 700 used: c_N=16000, G=1300, v = (0.25, 0.65)
//      v.u = 0.0625 + 0.08125 = 0.14375;  S = trunc(100 (1 - 0.071875)) = trunc(92.81) = 92
//   D: empty: v = (1, 1); v.u = 0.25 + 0.125 = 0.375; S = trunc(100 (1 - 0.1875)) = 81
//   -> C; GPU by best fit: the smallest g_i >= 250 is GPU 0 (300 free).
TEST(DotProd, ShareTaskGoesToTheBestFittingGpu) {
  TestCluster c;
  const NodeIndex d = c.AddNode("d", 64000, 64000, 2);
  const NodeIndex cn = c.AddNode("c", 64000, 64000, 2);
  c.Commit(cn, 48000, {{0, 700}});
  const TaskRequest task = Task().Cpu(16000).Gpus(1, 250);
  EXPECT_EQ(RawScores(c, "dotprod", task, {cn, d}), (std::vector<int64_t>{92, 81}));
  Scheduler& s = c.Build("dotprod");
  ExpectPlaced(s, task, cn, {0});
}

// ---- GpuClustering -----------------------------------------------------------------------------

// Four nodes with 4 T4s each: Gmax = 4000, b = floor(25 (4000 - G) / 4000).
//   N0 share-only:  a 500 share on GPU 0;                  G=3500, b=floor(3.125)=3,   A={share}
//   N1 mixed:       500 share on GPU 0, 1-GPU tasks on 1, 2; G=1500, b=floor(15.625)=15,
//                   A={share, 1-gpu, 1-gpu}
//   N2 no GPU task: one CPU-only task;                      G=4000, b=0,               A={}
//   N3 2-gpu only:  a 2-GPU task on GPUs 0, 1;              G=2000, b=floor(12.5)=12,  A={2-gpu}
class GpuClusteringTest : public ::testing::Test {
 protected:
  void SetUp() override {
    n0_ = c_.AddNode("n0", 64000, 64000, 4);
    c_.Commit(n0_, 1000, {{0, 500}});
    n1_ = c_.AddNode("n1", 64000, 64000, 4);
    c_.Commit(n1_, 1000, {{0, 500}});
    c_.Commit(n1_, 1000, {{1, 1000}});
    c_.Commit(n1_, 1000, {{2, 1000}});
    n2_ = c_.AddNode("n2", 64000, 64000, 4);
    c_.Commit(n2_, 8000);
    n3_ = c_.AddNode("n3", 64000, 64000, 4);
    c_.Commit(n3_, 1000, {{0, 1000}, {1, 1000}});
  }
  TestCluster c_;
  NodeIndex n0_ = 0, n1_ = 0, n2_ = 0, n3_ = 0;
};

// Share task 1 x 500, tag "share":
//   N0 only "share": b+75 = 78;  N1 "share" among others: b+50 = 65;  N2 empty: b+25 = 25;
//   N3 only others: b = 12.  -> N0, best-fit GPU 0 (exactly 500 free).
TEST_F(GpuClusteringTest, ShareTaskAllFourCases) {
  const TaskRequest task = Task().Cpu(1000).Gpus(1, 500);
  EXPECT_EQ(RawScores(c_, "gpuclustering", task, {n0_, n1_, n2_, n3_}),
            (std::vector<int64_t>{78, 65, 25, 12}));
  ExpectPlaced(c_.Build("gpuclustering"), task, n0_, {0});
}

// 1-GPU whole task, tag "1-gpu": N0 {share}: b = 3; N1 has it among others: 15+50 = 65;
// N2 empty: 25; N3 {2-gpu}: 12.  -> N1, on its only free GPU, 3.
TEST_F(GpuClusteringTest, WholeGpuTaskJoinsItsKind) {
  const TaskRequest task = Task().Cpu(1000).Gpus(1, 1000);
  EXPECT_EQ(RawScores(c_, "gpuclustering", task, {n0_, n1_, n2_, n3_}),
            (std::vector<int64_t>{3, 65, 25, 12}));
  ExpectPlaced(c_.Build("gpuclustering"), task, n1_, {3});
}

// 2-GPU task, tag "2-gpu" (N1 has one free GPU and is infeasible): N0 {share}: 3; N2 empty: 25;
// N3 only "2-gpu": 12+75 = 87.  -> N3, GPUs 2 and 3.
TEST_F(GpuClusteringTest, TwoGpuTaskJoinsItsKind) {
  const TaskRequest task = Task().Cpu(1000).Gpus(2, 1000);
  EXPECT_EQ(RawScores(c_, "gpuclustering", task, {n0_, n2_, n3_}), (std::vector<int64_t>{3, 25, 87}));
  ExpectPlaced(c_.Build("gpuclustering"), task, n3_, {2, 3});
}

// CPU tasks score 0 everywhere: the node with the lowest tie-break rank takes them.
TEST_F(GpuClusteringTest, CpuTaskScoresZeroAndFollowsTieBreakRanks) {
  const TaskRequest task = Task().Cpu(1000);
  EXPECT_EQ(RawScores(c_, "gpuclustering", task, {n0_, n1_, n2_, n3_}), (std::vector<int64_t>{0, 0, 0, 0}));
  Scheduler& s = c_.Build("gpuclustering");
  ExpectPlaced(s, task, n0_, {});
  ASSERT_TRUE(s.SetTieBreakRanks({3, 1, 2, 0}).ok());
  ExpectPlaced(s, task, n3_, {});
}

// ---- GpuPacking --------------------------------------------------------------------------------

// Share task 1 x 500. In the u = 0 branch the sum runs over the picked GPUs (README §4 leaves the
// range of the sum open; the picked GPUs reproduce the published default/seed-42 run, see
// sim/experiment_test.cc).
//   P0 empty, 4 GPUs:  f = n = 4: max(33-4, 4) = 29
//   P1 empty, 2 GPUs:  f = n = 2: max(33-2, 2) = 31
//   P2 free [200, 1000, 1000, 1000]: f=3; ascending 200 (< 500, skipped), 1000 picked: u=1:
//      max(50-1, 33) = 49
//   P3 free [600, 200, 1000, 1000]: ascending 200 skipped, 600 picked: u=0:
//      sum floor(600*100/1000) = 60; max(100 - floor(6.0), 50) = 94
//      (over all GPUs it would be 60+20+100+100 = 280 -> 72)
//   P4 8 GPUs free [550, 1000 x5, 0, 0]: 550 picked, u=0: sum = 55; 100 - floor(5.5) = 95
//   -> P4 (the tightest partly used GPU), on GPU 0.
class GpuPackingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    p0_ = c_.AddNode("p0", 64000, 64000, 4);
    p1_ = c_.AddNode("p1", 64000, 64000, 2);
    p2_ = c_.AddNode("p2", 64000, 64000, 4);
    c_.Commit(p2_, 1000, {{0, 800}});
    p3_ = c_.AddNode("p3", 64000, 64000, 4);
    c_.Commit(p3_, 1000, {{0, 400}});
    c_.Commit(p3_, 1000, {{1, 800}});
    p4_ = c_.AddNode("p4", 64000, 64000, 8);
    c_.Commit(p4_, 1000, {{0, 450}});
    c_.Commit(p4_, 1000, {{6, 1000}, {7, 1000}});
  }
  TestCluster c_;
  NodeIndex p0_ = 0, p1_ = 0, p2_ = 0, p3_ = 0, p4_ = 0;
};

TEST_F(GpuPackingTest, ShareTaskAllThreeBranches) {
  const TaskRequest task = Task().Cpu(1000).Gpus(1, 500);
  EXPECT_EQ(RawScores(c_, "gpupacking", task, {p0_, p1_, p2_, p3_, p4_}),
            (std::vector<int64_t>{29, 31, 49, 94, 95}));
  ExpectPlaced(c_.Build("gpupacking"), task, p4_, {0});
  // Fill P4's GPU 0 (550 more): P4 falls to the u > 0 branch (49) and P3 wins with 94, on GPU 0.
  c_.Commit(p4_, 0, {{0, 550}});
  ExpectPlaced(c_.Build("gpupacking"), task, p3_, {0});
}

// 2 x 1000: P0 29, P1 31; P2 ascending [200, 1000, 1000, 1000]: two 1000s picked, u=2: 48;
// P3 [200, 600, 1000, 1000]: u=2: 48; P4 [0, 0, 550, 1000...]: u=2: 48.
// Three-way tie at 48 -> lowest rank (node index): P2, on GPUs 1, 2.
TEST_F(GpuPackingTest, MultiGpuTaskTiesGoToTheLowestRank) {
  const TaskRequest task = Task().Cpu(1000).Gpus(2, 1000);
  EXPECT_EQ(RawScores(c_, "gpupacking", task, {p0_, p1_, p2_, p3_, p4_}),
            (std::vector<int64_t>{29, 31, 48, 48, 48}));
  Scheduler& s = c_.Build("gpupacking");
  ExpectPlaced(s, task, p2_, {1, 2});
  // Rank P4 first among the tied: P4, on its lowest free GPUs 1, 2.
  ASSERT_TRUE(s.SetTieBreakRanks({0, 1, 3, 4, 2}).ok());
  ExpectPlaced(s, task, p4_, {1, 2});
}

// The floor of 50 in the u = 0 branch: 6 x 500 on an 8-GPU node whose GPUs 0-5 have 950 free and
// 6-7 none. f = 0; ascending [0, 0, 950 x6]: six 950s picked, u=0: sum = 6 * 95 = 570;
// max(100 - 57, 50) = 50.
TEST(GpuPacking, PartialSharesFloorAtFifty) {
  TestCluster c;
  const NodeIndex n = c.AddNode("n", 64000, 64000, 8);
  for (int g = 0; g < 6; ++g) c.Commit(n, 0, {{g, 50}});
  c.Commit(n, 0, {{6, 1000}, {7, 1000}});
  EXPECT_EQ(RawScores(c, "gpupacking", Task().Cpu(1000).Gpus(6, 500), {n}), (std::vector<int64_t>{50}));
}

TEST_F(GpuPackingTest, CpuTaskScoresZero) {
  EXPECT_EQ(RawScores(c_, "gpupacking", Task().Cpu(1000), {p0_, p1_, p2_, p3_, p4_}),
            (std::vector<int64_t>{0, 0, 0, 0, 0}));
}

// ---- BestFit -----------------------------------------------------------------------------------

// Cmax = 64000, Gmax = 4000. Task c=4000, 1 x 500. r = 0.5 (c_N - c)/Cmax + 0.5 (G - km)/Gmax.
//   N0 empty (64000, 4 GPUs): r = 0.5*60000/64000 + 0.5*3500/4000 = 0.46875 + 0.4375 = 0.90625
//      S = trunc(100 * 0.09375) = 9
//   N1 (64000, 4 GPUs) 32000 mCPU and GPUs 0, 1 used: c_N=32000, G=2000:
//      r = 0.21875 + 0.1875 = 0.40625;  S = trunc(59.375) = 59
//   N2 (32000, 2 GPUs) 24000 mCPU and 300 of GPU 0 used: c_N=8000, G=1700:
//      r = 0.03125 + 0.15 = 0.18125;    S = trunc(81.875) = 81
//   min-max: (S - 9) * 100 / 72 -> 0, floor(69.4) = 69, 100. Same winner: N2, best-fit GPU 0 (700).
TEST(BestFit, RawScoresAndMinMaxNormalisation) {
  TestCluster c;
  const NodeIndex n0 = c.AddNode("n0", 64000, 64000, 4);
  const NodeIndex n1 = c.AddNode("n1", 64000, 64000, 4);
  c.Commit(n1, 32000, {{0, 1000}, {1, 1000}});
  const NodeIndex n2 = c.AddNode("n2", 32000, 64000, 2);
  c.Commit(n2, 24000, {{0, 300}});
  const TaskRequest task = Task().Cpu(4000).Gpus(1, 500);
  std::vector<int64_t> raw = RawScores(c, "bestfit", task, {n0, n1, n2});
  EXPECT_EQ(raw, (std::vector<int64_t>{9, 59, 81}));

  auto plugin = DefaultRegistry().MakeScore("bestfit", Value(), PluginInit{});
  ASSERT_TRUE(plugin.ok());
  (*plugin)->Normalize(raw);
  EXPECT_EQ(raw, (std::vector<int64_t>{0, 69, 100}));
  std::vector<int64_t> equal = {42, 42, 42};
  (*plugin)->Normalize(equal);
  EXPECT_EQ(equal, (std::vector<int64_t>{0, 0, 0}));

  ExpectPlaced(c.Build("bestfit"), task, n2, {0});
}

// Min-max keeps ties tied: two nodes with the same raw score both normalise to 100 and the tie
// goes to the lower rank. n0, n1 identical (16000, 2 GPUs, empty); n2 (32000, 2 GPUs) empty.
// Cmax = 32000, Gmax = 2000; task c=8000, 1 x 1000:
//   n0, n1: r = 0.5*8000/32000 + 0.5*1000/2000 = 0.125 + 0.25 = 0.375; S = 62.5 -> 62
//   n2:     r = 0.5*24000/32000 + 0.25 = 0.375 + 0.25 = 0.625;     S = 37.5 -> 37
//   normalised 100, 100, 0 -> n0; with ranks {1, 0, 2} -> n1.
TEST(BestFit, TiesSurviveNormalisation) {
  TestCluster c;
  const NodeIndex n0 = c.AddNode("n0", 16000, 64000, 2);
  const NodeIndex n1 = c.AddNode("n1", 16000, 64000, 2);
  const NodeIndex n2 = c.AddNode("n2", 32000, 64000, 2);
  const TaskRequest task = Task().Cpu(8000).Gpus(1, 1000);
  EXPECT_EQ(RawScores(c, "bestfit", task, {n0, n1, n2}), (std::vector<int64_t>{62, 62, 37}));
  Scheduler& s = c.Build("bestfit");
  ExpectPlaced(s, task, n0, {0});
  ASSERT_TRUE(s.SetTieBreakRanks({1, 0, 2}).ok());
  ExpectPlaced(s, task, n1, {0});
}

// ---- Random ------------------------------------------------------------------------------------

// Counts the 64-bit draws it hands out.
class CountingRng final : public Rng {
 public:
  explicit CountingRng(uint64_t seed) : inner_(seed) {}
  uint64_t Next() override {
    ++draws;
    return inner_.Next();
  }
  int draws = 0;

 private:
  SeededRng inner_;
};

std::unique_ptr<Scheduler> MakeScheduler(Ledger& ledger, Rng& rng, const std::string& policy) {
  auto s = Scheduler::Create(ProfileForPolicy(policy).value(), DefaultRegistry(), ledger, rng);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

// Four identical nodes, a fifth too small for the task: 4000 decisions spread uniformly over the
// four feasible nodes (expected 1000 each, standard deviation ~27; the bounds are 5.5 sigma) and
// never to the infeasible one.
TEST(Random, UniformAmongFeasibleNodes) {
  TestCluster c(7);
  for (int i = 0; i < 4; ++i) c.AddNode("n" + std::to_string(i), 8000, 8000, 1);
  c.AddNode("small", 1000, 8000, 1);
  Scheduler& s = c.Build("random");
  std::map<NodeIndex, int> hits;
  for (int i = 0; i < 4000; ++i) {
    const Decision d = s.Decide(Task().Cpu(2000));
    ASSERT_TRUE(d.placed);
    ++hits[d.placement.node];
  }
  ASSERT_EQ(hits.size(), 4u);
  for (const auto& [node, n] : hits) {
    EXPECT_LT(node, 4u);
    EXPECT_GT(n, 850) << "node " << node;
    EXPECT_LT(n, 1150) << "node " << node;
  }
}

// Same seed, same choices; the sequence depends on the seed.
TEST(Random, DeterministicForAFixedSeed) {
  auto run = [](uint64_t seed) {
    Ledger ledger;
    for (int i = 0; i < 5; ++i) {
      EXPECT_TRUE(ledger
                      .AddNode(MakeNode("n" + std::to_string(i), MilliCpu(8000), MiB(8000), 2, "T4",
                                        ledger.catalog()))
                      .ok());
    }
    SeededRng rng(seed);
    auto s = MakeScheduler(ledger, rng, "random");
    std::vector<std::pair<NodeIndex, int>> out;
    for (int i = 0; i < 50; ++i) {
      const Decision d = s->Decide(Task().Cpu(100).Gpus(1, 100));
      EXPECT_TRUE(d.placed);
      out.emplace_back(d.placement.node, d.placement.gpus.at(0).gpu);
    }
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

// A single feasible node is taken without scoring: no random number is drawn for a CPU task.
// With two feasible nodes the Random score draws.
TEST(Random, SingleFeasibleNodeDrawsNothing) {
  Ledger ledger;
  ASSERT_TRUE(ledger.AddNode(MakeNode("big", MilliCpu(8000), MiB(8000), 1, "T4", ledger.catalog())).ok());
  ASSERT_TRUE(ledger.AddNode(MakeNode("small", MilliCpu(1000), MiB(8000), 1, "T4", ledger.catalog())).ok());
  CountingRng rng(1);
  auto s = MakeScheduler(ledger, rng, "random");
  const Decision d = s->Decide(Task().Cpu(2000));
  ASSERT_TRUE(d.placed);
  EXPECT_EQ(d.placement.node, 0u);
  EXPECT_EQ(rng.draws, 0);
  // Whole-GPU tasks take the lowest-index free GPU, with no draw either.
  const Decision whole = s->Decide(Task().Cpu(2000).Gpus(1, 1000));
  ASSERT_TRUE(whole.placed);
  EXPECT_EQ(rng.draws, 0);
  ASSERT_TRUE(s->Decide(Task().Cpu(500)).placed);
  EXPECT_GE(rng.draws, 1);
}

// The random GPU choice: a share task 1 x 400 on one node with free [1000, 500, 200] goes to
// GPU 0 or 1 (those with g >= 400), uniformly; never to GPU 2.
TEST(Random, ShareTaskPicksAFittingGpuUniformly) {
  TestCluster c(3);
  const NodeIndex n = c.AddNode("n", 8000, 8000, 3);
  c.Commit(n, 0, {{1, 500}});
  c.Commit(n, 0, {{2, 800}});
  Scheduler& s = c.Build("random");
  std::map<int, int> hits;
  for (int i = 0; i < 2000; ++i) {
    const Decision d = s.Decide(Task().Cpu(100).Gpus(1, 400));
    ASSERT_TRUE(d.placed);
    ++hits[d.placement.gpus.at(0).gpu];
  }
  EXPECT_EQ(hits.count(2), 0u);
  EXPECT_GT(hits[0], 850);
  EXPECT_GT(hits[1], 850);
}

// ---- binpack / spread --------------------------------------------------------------------------

// Task cpu=4000, mem=16000, 1 x 500. S = trunc(100 * mean of (used + request) / capacity).
//   A (16000 mCPU, 64000 MiB, 2 GPUs) holding 8000 mCPU, 16000 MiB and 500 of GPU 0:
//      cpu 12000/16000 = 0.75, mem 32000/64000 = 0.5, gpu 1000/2000 = 0.5; mean 0.5833 -> 58
//   B (same, empty): 0.25, 0.25, 0.25 -> 25
//   binpack -> A (GPU 0, best fit); spread = 100 - S: A 42, B 75 -> B (GPU 0).
//   With weights {cpu 1, memory 0, gpu 0}: A 75, B 25.
TEST(Utilisation, BinpackAndSpread) {
  TestCluster c;
  const NodeIndex a = c.AddNode("a", 16000, 64000, 2);
  c.Commit(a, 8000, {{0, 500}}, 16000);
  const NodeIndex b = c.AddNode("b", 16000, 64000, 2);
  const TaskRequest task = Task().Cpu(4000).Mem(16000).Gpus(1, 500);
  EXPECT_EQ(RawScores(c, "binpack", task, {a, b}), (std::vector<int64_t>{58, 25}));
  EXPECT_EQ(RawScores(c, "spread", task, {a, b}), (std::vector<int64_t>{42, 75}));
  EXPECT_EQ(RawScores(c, "binpack", task, {a, b}, Value(Value::Map{{"cpu", 1}, {"memory", 0}, {"gpu", 0}})),
            (std::vector<int64_t>{75, 25}));
  ExpectPlaced(c.Build("binpack"), task, a, {0});
  ExpectPlaced(c.Build("spread"), task, b, {0});
}

TEST(Utilisation, RejectsUnknownResources) {
  auto p = DefaultRegistry().MakeScore("binpack", Value(Value::Map{{"disk", 1}}), PluginInit{});
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
}

// ---- Tie-breaking and the single-node shortcut -------------------------------------------------

// A score plugin that counts its calls and gives every node the same score.
class CountingScore final : public ScorePlugin {
 public:
  explicit CountingScore(int* calls) : calls_(calls) {}
  std::string_view name() const override { return "counting"; }
  uint32_t fields_read() const override { return kUncacheable; }
  int64_t Score(const ClusterView&, const PreparedTask&, NodeIndex) override {
    ++*calls_;
    return 7;
  }

 private:
  int* calls_;
};

struct CountingSetup {
  explicit CountingSetup(bool skip) {
    registry = DefaultRegistry();
    EXPECT_TRUE(
        registry
            .RegisterScore("counting",
                           [this](const Value&, const PluginInit&) -> Result<std::unique_ptr<ScorePlugin>> {
                             return std::unique_ptr<ScorePlugin>(std::make_unique<CountingScore>(&calls));
                           })
            .ok());
    profile.scores.push_back({"counting", 1, {}});
    profile.skip_scoring_single_node = skip;
  }
  PluginRegistry registry;
  Profile profile;
  int calls = 0;
};

TEST(TieBreak, SingleFeasibleNodeIsTakenWithoutScoring) {
  TestCluster c;
  c.AddNode("small", 1000, 8000, 1);
  const NodeIndex big = c.AddNode("big", 8000, 8000, 1);
  CountingSetup setup(/*skip=*/true);
  Scheduler& s = c.BuildProfile(setup.profile, setup.registry);
  ExpectPlaced(s, Task().Cpu(2000), big, {});
  EXPECT_EQ(setup.calls, 0);
  // Two feasible nodes: both scored.
  ExpectPlaced(s, Task().Cpu(500), 0, {});
  EXPECT_EQ(setup.calls, 2);
}

TEST(TieBreak, SingleNodeIsScoredWhenTheShortcutIsOff) {
  TestCluster c;
  c.AddNode("small", 1000, 8000, 1);
  const NodeIndex big = c.AddNode("big", 8000, 8000, 1);
  CountingSetup setup(/*skip=*/false);
  Scheduler& s = c.BuildProfile(setup.profile, setup.registry);
  ExpectPlaced(s, Task().Cpu(2000), big, {});
  EXPECT_EQ(setup.calls, 1);
}

// Equal totals go to the lowest tie-break rank among the feasible nodes, whatever the node order.
TEST(TieBreak, LowestRankWinsAmongFeasible) {
  TestCluster c;
  for (int i = 0; i < 4; ++i) c.AddNode("n" + std::to_string(i), 8000, 8000, 1);
  CountingSetup setup(/*skip=*/true);
  Scheduler& s = c.BuildProfile(setup.profile, setup.registry);
  ExpectPlaced(s, Task().Cpu(1000), 0, {});  // default ranks: node index
  ASSERT_TRUE(s.SetTieBreakRanks({3, 2, 0, 1}).ok());
  ExpectPlaced(s, Task().Cpu(1000), 2, {});
  // Node 2 full: the next rank, node 3.
  c.Commit(2, 8000);
  ExpectPlaced(s, Task().Cpu(1000), 3, {});
  // One rank per node, or nothing changes.
  EXPECT_EQ(s.SetTieBreakRanks({0, 1}).code(), StatusCode::kInvalidArgument);
}

// A higher total score beats a better rank: DotProd with two nodes, the lower-ranked one scoring
// higher. Cmax = 16000, Gmax = 1000, task c=4000 (CPU only): u = (0.25, 0).
//   n0 (16000 free): v.u = 0.25;     S = trunc(100 (1 - 0.125)) = 87
//   n1 (8000 free):  v.u = 0.125;    S = trunc(100 (1 - 0.0625)) = 93  -> n1 despite rank 1.
TEST(TieBreak, ScoreBeatsRank) {
  TestCluster c;
  const NodeIndex n0 = c.AddNode("n0", 16000, 8000, 1);
  const NodeIndex n1 = c.AddNode("n1", 16000, 8000, 1);
  c.Commit(n1, 8000);
  const TaskRequest task = Task().Cpu(4000);
  EXPECT_EQ(RawScores(c, "dotprod", task, {n0, n1}), (std::vector<int64_t>{87, 93}));
  ExpectPlaced(c.Build("dotprod"), task, n1, {});
}

}  // namespace
}  // namespace gpupool
