// FGD (README §6): the fragmentation of a node against hand-made typical pods, and the FGD score
// S = trunc(100 * sigmoid((F(N) - F(N')) / 1000)) with its own GPU choice, on small clusters
// computed by hand.
//
// Classification of typical pod p = (c, m, k) on node N (free CPU c_N, free shares g_i, G = sum):
//   m = 0: xl if c_N >= c, else xr (all of G);  model not allowed: na (all of G);
//   gpuOK = #{g_i >= m} >= k, cpuOK = c_N >= c:  both: q3, and sum_{g_i < m} g_i goes to q2;
//   only gpuOK: q4;  only cpuOK: q2;  neither: q1 (all of G).
// F(N) = q1 + q2 + q4 + xl + xr + na, each bucket the weighted sum over the typical pods.
// sigmoid values used below: 100 s(-1) = 26.89, 100 s(-0.5) = 37.75, 100 s(-0.375) = 40.73,
// 100 s(-0.2) = 45.02, 100 s(0) = 50, 100 s(0.05) = 51.25, 100 s(0.075) = 51.87,
// 100 s(0.2) = 54.98, 100 s(0.25) = 56.22, 100 s(0.5) = 62.25.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "sched/plugins/fgd_core.h"
#include "sched/test_util.h"

namespace gpupool {
namespace {

using testutil::ExpectPlaced;
using testutil::RawScores;
using testutil::Task;
using testutil::TestCluster;
using testutil::Typical;

// ---- FragmentationModel::NodeFragment ------------------------------------------------------------

// One T4 node and one V100M32 node, for their model ids. The state evaluated: c_N = 3000,
// free [1000, 700, 200], G = 1900.
class NodeFragmentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    t4_ = c_.model_of(c_.AddNode("t4", 8000, 8000, 3));
    v100_ = c_.model_of(c_.AddNode("v100", 8000, 8000, 3, "V100M32"));
  }
  double F(const std::vector<TypicalPod>& pods, ModelId model, int64_t cpu = 3000,
           std::vector<int32_t> free = {1000, 700, 200}) {
    return FragmentationModel(pods).NodeFragment(c_.ledger(), model, cpu, free);
  }
  TestCluster c_;
  ModelId t4_ = 0, v100_ = 0;
};

TEST_F(NodeFragmentTest, EachClassAlone) {
  // xl: CPU pod c=2000 <= 3000: all of G.            xr: CPU pod c=5000 > 3000: all of G.
  EXPECT_EQ(F({Typical(2000, 0, 0, 1.0)}, t4_), 1900.0);
  EXPECT_EQ(F({Typical(5000, 0, 0, 1.0)}, t4_), 1900.0);
  // q3: (1000, 500, 1): GPUs 0, 1 fit, CPU fits; GPU 2's 200 < 500 is stranded -> 200.
  EXPECT_EQ(F({Typical(1000, 500, 1, 1.0)}, t4_), 200.0);
  // q3 with nothing stranded: (1000, 200, 1): every g_i >= 200 -> 0.
  EXPECT_EQ(F({Typical(1000, 200, 1, 1.0)}, t4_), 0.0);
  // q4: (4000, 500, 1): GPUs fit, CPU 3000 < 4000 -> all of G.
  EXPECT_EQ(F({Typical(4000, 500, 1, 1.0)}, t4_), 1900.0);
  // q2: (1000, 1000, 2): one GPU with 1000 < 2, CPU fits -> all of G.
  EXPECT_EQ(F({Typical(1000, 1000, 2, 1.0)}, t4_), 1900.0);
  // q1: (4000, 1000, 2): neither -> all of G.
  EXPECT_EQ(F({Typical(4000, 1000, 2, 1.0)}, t4_), 1900.0);
  // na: (1000, 500, 1) for V100M32 only, on a T4 -> all of G; on a V100M32 it is q3 -> 200.
  EXPECT_EQ(F({Typical(1000, 500, 1, 1.0, {"V100M32"})}, t4_), 1900.0);
  EXPECT_EQ(F({Typical(1000, 500, 1, 1.0, {"V100M32"})}, v100_), 200.0);
  EXPECT_EQ(F({Typical(1000, 500, 1, 1.0, {"P100", "V100M32"})}, v100_), 200.0);
}

TEST_F(NodeFragmentTest, IdleGpusCountForCpuPodsAndEmptyNodesHaveNone) {
  // An empty 3-GPU node (G = 3000) against a CPU pod (w 0.25) and a share pod (w 0.75):
  //   xl 0.25 * 3000 = 750; the share pod fits everywhere: 0.  F = 750.
  const std::vector<TypicalPod> pods = {Typical(2000, 0, 0, 0.25), Typical(1000, 500, 1, 0.75)};
  EXPECT_EQ(F(pods, t4_, 8000, {1000, 1000, 1000}), 750.0);
  // No GPUs (a CPU node): G = 0, F = 0 whatever the pods.
  EXPECT_EQ(F(pods, t4_, 8000, {}), 0.0);
}

// All seven classes at once, weights 4, 2, 8, 1, 7, 7, 10 (/39), in this typical-pod order:
//   p0 xl (2000, 0, 0)      4/39 * 1900       p4 q2 (1000, 1000, 2)  7/39 * 1900
//   p1 q4 (4000, 500, 1)    2/39 * 1900       p5 xr (5000, 0, 0)     7/39 * 1900
//   p2 na (1000, 500, 1, V100M32) 8/39 * 1900 p6 q3 (1000, 500, 1)  10/39 * 200 (stranded)
//   p3 q1 (4000, 1000, 2)   1/39 * 1900
// F = 1900 * 29/39 + 200 * 10/39 = 57100/39 = 1464.10...
// Summed bucket by bucket in the order q1 + q2 + q4 + xl + xr + na (q2 = p4 + p6) this is exactly
// the double 1464.102564102564; a running sum in typical-pod order gives 1464.1025641025642.
TEST_F(NodeFragmentTest, BucketsAreSummedInTheirOrder) {
  const std::vector<TypicalPod> pods = {Typical(2000, 0, 0, 4.0 / 39),
                                        Typical(4000, 500, 1, 2.0 / 39),
                                        Typical(1000, 500, 1, 8.0 / 39, {"V100M32"}),
                                        Typical(4000, 1000, 2, 1.0 / 39),
                                        Typical(1000, 1000, 2, 7.0 / 39),
                                        Typical(5000, 0, 0, 7.0 / 39),
                                        Typical(1000, 500, 1, 10.0 / 39)};
  const double g = 1900;
  const double xl = pods[0].weight * g, q4 = pods[1].weight * g, na = pods[2].weight * g;
  const double q1 = pods[3].weight * g, q2 = pods[4].weight * g + pods[6].weight * 200,
               xr = pods[5].weight * g;
  const double by_bucket = q1 + q2 + q4 + xl + xr + na;
  double running = 0;
  for (double v : {xl, q4, na, q1, pods[4].weight * g, xr, pods[6].weight * 200}) running += v;
  ASSERT_NE(by_bucket, running);  // the scenario tells the two orders apart
  EXPECT_DOUBLE_EQ(by_bucket, 57100.0 / 39);
  EXPECT_EQ(F(pods, t4_), by_bucket);
}

// ---- The FGD score and GPU choice ----------------------------------------------------------------

// Typical pods P1 (4000, 500, 1) w 0.6, P2 (8000, 1000, 1) w 0.4. Task (2000 mCPU, 1 x 500).
//   A: 2 GPUs free [1000, 1000], c_N 32000.  F(A) = 0 (both fit everywhere, nothing stranded).
//      GPU 0 -> [500, 1000]: P1 fits both; P2 fits GPU 1, 500 stranded: 0.4*500 = 200.
//      dF = 0 - 200 = -200 -> trunc(45.02) = 45; GPU 1 gives the same free multiset: 45.
//   B: [500, 1000], c_N 30000 (a 500 share and 2000 mCPU already there). F(B) = 200 (as above).
//      GPU 0 -> [0, 1000]: P1 fits GPU 1, stranded 0; P2 fits GPU 1, stranded 0: F' = 0;
//         dF = +200 -> trunc(54.98) = 54
//      GPU 1 -> [500, 500]: P1 fits, 0; P2 fits none, CPU fits: q2 0.4*1000 = 400: dF = -200 -> 45
//   -> B scores 54 on GPU 0.
TEST(Fgd, ShareTaskFillsThePartlyUsedGpu) {
  TestCluster c;
  c.SetTypicalPods({Typical(4000, 500, 1, 0.6), Typical(8000, 1000, 1, 0.4)});
  const NodeIndex a = c.AddNode("a", 32000, 64000, 2);
  const NodeIndex b = c.AddNode("b", 32000, 64000, 2);
  c.Commit(b, 2000, {{0, 500}});
  const TaskRequest task = Task().Cpu(2000).Gpus(1, 500);
  EXPECT_EQ(RawScores(c, "fgd", task, {a, b}), (std::vector<int64_t>{45, 54}));
  ExpectPlaced(c.Build("fgd"), task, b, {0});
}

// The GPU is the lowest index reaching the highest *integer* score, not the best real one.
// Typical pods P1 (1000, 300, 1) w 0.5, P2 (1000, 1000, 1) w 0.5. Task (1000 mCPU, 1 x 250).
//   A: 2 GPUs [1000, 1000], c_N 10000. F(A) = 0. Either GPU -> [750, 1000]: P2 strands 750:
//      F' = 375, dF = -375 -> trunc(40.73) = 40.
//   B: 3 GPUs [400, 1000, 350], c_N 10000. P1 fits all: 0; P2 fits GPU 1, strands 750: 375.
//      F(B) = 375.
//      GPU 0 -> [150, 1000, 350]: P1 strands 150: 75; P2 strands 500: 250. F' = 325, dF = 50 -> 51
//      GPU 1 -> [400, 750, 350]: P1 0; P2 fits none, CPU fits: q2 0.5*1500 = 750. dF = -375 -> 40
//      GPU 2 -> [400, 1000, 100]: P1 strands 100: 50; P2 strands 500: 250. F' = 300, dF = 75 -> 51
//   -> B (51). GPUs 0 and 2 both reach 51 (GPU 2 is better in real terms, and the best fit), so
//      FGD takes the lower index, GPU 0.
TEST(Fgd, LowestIndexAmongEqualIntegerScores) {
  TestCluster c;
  c.SetTypicalPods({Typical(1000, 300, 1, 0.5), Typical(1000, 1000, 1, 0.5)});
  const NodeIndex a = c.AddNode("a", 10000, 64000, 2);
  const NodeIndex b = c.AddNode("b", 10000, 64000, 3);
  c.Commit(b, 0, {{0, 600}});
  c.Commit(b, 0, {{2, 650}});
  const TaskRequest task = Task().Cpu(1000).Gpus(1, 250);
  EXPECT_EQ(RawScores(c, "fgd", task, {a, b}), (std::vector<int64_t>{40, 51}));
  ExpectPlaced(c.Build("fgd"), task, b, {0});
  // The best-fit selector of the baselines would have taken GPU 2 on the same node.
  ExpectPlaced(c.Build("gpupacking"), task, b, {2});
}

// CPU-only task (4000 mCPU): only c_N changes. Typical pods P1 CPU-only (6000, 0, 0) w 0.5,
// P2 (2000, 500, 1) w 0.5. Both nodes have 2 empty GPUs (G = 2000).
//   B (index 0), c_N 5000: P1 xr 0.5*2000 = 1000; P2 q3, 0. F = 1000.
//      After, c_N 1000: P1 xr 1000; P2 GPUs fit but 1000 < 2000 CPU: q4 1000. F' = 2000.
//      dF = -1000 -> trunc(26.89) = 26
//   A (index 1), c_N 8000: P1 xl 1000; P2 q3 0. F = 1000. After, c_N 4000: P1 xr 1000; P2 still
//      q3: F' = 1000. dF = 0 -> 50.
//   -> A.
TEST(Fgd, CpuOnlyTaskKeepsCpuForGpuPods) {
  TestCluster c;
  c.SetTypicalPods({Typical(6000, 0, 0, 0.5), Typical(2000, 500, 1, 0.5)});
  const NodeIndex b = c.AddNode("b", 5000, 64000, 2);
  const NodeIndex a = c.AddNode("a", 8000, 64000, 2);
  const TaskRequest task = Task().Cpu(4000);
  EXPECT_EQ(RawScores(c, "fgd", task, {b, a}), (std::vector<int64_t>{26, 50}));
  ExpectPlaced(c.Build("fgd"), task, a, {});
}

// Whole-GPU task (1000 mCPU, 1 x 1000). Typical pods P1 (1000, 500, 1) w 0.5, P2 (1000, 1000, 2)
// w 0.5; c_N 8000 everywhere.
//   A [1000, 1000]: F = 0. After [0, 1000]: P1 0; P2 fits 1 < 2: q2 0.5*1000 = 500.
//      dF = -500 -> trunc(37.75) = 37
//   B [400, 1000]: P1 strands 400: 200; P2 fits 1 < 2: q2 0.5*1400 = 700. F = 900.
//      After (the free GPU taken) [400, 0]: P1 fits none: q2 0.5*400 = 200; P2: q2 200. F' = 400.
//      dF = 500 -> trunc(62.25) = 62
//   C [1000 x4]: F = 0; after [0, 1000, 1000, 1000]: P2 still fits 3: F' = 0. dF = 0 -> 50
//   -> B, on its free GPU 1.
TEST(Fgd, WholeGpuTaskCompletesANodeP2CannotUse) {
  TestCluster c;
  c.SetTypicalPods({Typical(1000, 500, 1, 0.5), Typical(1000, 1000, 2, 0.5)});
  const NodeIndex a = c.AddNode("a", 8000, 64000, 2);
  const NodeIndex b = c.AddNode("b", 8000, 64000, 2);
  c.Commit(b, 0, {{0, 600}});
  const NodeIndex cn = c.AddNode("c", 8000, 64000, 4);
  const TaskRequest task = Task().Cpu(1000).Gpus(1, 1000);
  EXPECT_EQ(RawScores(c, "fgd", task, {a, b, cn}), (std::vector<int64_t>{37, 62, 50}));
  ExpectPlaced(c.Build("fgd"), task, b, {1});
}

// Two-GPU whole task (1000 mCPU, 2 x 1000), same typical pods.
//   X [1000 x3]: F = 0. After [0, 0, 1000]: P2 fits 1 < 2: q2 500. dF = -500 -> 37
//   Y [300, 1000, 1000, 300]: P1 strands 600: 300; P2 fits 2, strands 600: 300. F = 600.
//      After [300, 0, 0, 300]: P1 fits none: q2 0.5*600 = 300; P2: q2 300. F' = 600. dF = 0 -> 50
//   -> Y, on its two lowest-index free GPUs, 1 and 2.
TEST(Fgd, MultiGpuTaskTakesTheLowestIndexFreeGpus) {
  TestCluster c;
  c.SetTypicalPods({Typical(1000, 500, 1, 0.5), Typical(1000, 1000, 2, 0.5)});
  const NodeIndex x = c.AddNode("x", 8000, 64000, 3);
  const NodeIndex y = c.AddNode("y", 8000, 64000, 4);
  c.Commit(y, 0, {{0, 700}});
  c.Commit(y, 0, {{3, 700}});
  const TaskRequest task = Task().Cpu(1000).Gpus(2, 1000);
  EXPECT_EQ(RawScores(c, "fgd", task, {x, y}), (std::vector<int64_t>{37, 50}));
  ExpectPlaced(c.Build("fgd"), task, y, {1, 2});
}

// no_access: P1 (1000, 500, 1) w 0.5 for any model, P2 (1000, 500, 1) w 0.5 for V100M32 only.
// Task (1000 mCPU, 1 x 500), any model; 2 empty GPUs and c_N 8000 on both nodes.
//   V (V100M32, index 0): F = 0; after [500, 1000]: both pods fit both GPUs: 0. dF = 0 -> 50
//   T (T4, index 1): P1 0; P2 na 0.5*2000 = 1000: F = 1000. After [500, 1000]: P2 na 0.5*1500
//      = 750. dF = 250 -> trunc(56.22) = 56
//   -> T: its GPUs were fragment for the V100-only pods anyway. GPU 0 (both give 56).
TEST(Fgd, NoAccessPodsMakeOtherModelsCheaper) {
  TestCluster c;
  c.SetTypicalPods({Typical(1000, 500, 1, 0.5), Typical(1000, 500, 1, 0.5, {"V100M32"})});
  const NodeIndex v = c.AddNode("v", 8000, 64000, 2, "V100M32");
  const NodeIndex t = c.AddNode("t", 8000, 64000, 2, "T4");
  const TaskRequest task = Task().Cpu(1000).Gpus(1, 500);
  EXPECT_EQ(RawScores(c, "fgd", task, {v, t}), (std::vector<int64_t>{50, 56}));
  ExpectPlaced(c.Build("fgd"), task, t, {0});
}

// Equal FGD scores fall to the tie-break ranks. Whole-GPU task on two empty 4-GPU nodes with the
// pods of WholeGpuTaskCompletesANodeP2CannotUse: both dF = 0 -> 50.
TEST(Fgd, EqualScoresGoToTheLowestRank) {
  TestCluster c;
  c.SetTypicalPods({Typical(1000, 500, 1, 0.5), Typical(1000, 1000, 2, 0.5)});
  c.AddNode("a", 8000, 64000, 4);
  const NodeIndex b = c.AddNode("b", 8000, 64000, 4);
  Scheduler& s = c.Build("fgd");
  ASSERT_TRUE(s.SetTieBreakRanks({1, 0}).ok());
  ExpectPlaced(s, Task().Cpu(1000).Gpus(1, 1000), b, {0});
}

// Unhealthy GPUs take nothing and are not part of the node's free shares. The node B of
// LowestIndexAmongEqualIntegerScores ([400, 1000, 350], pods P1 (1000, 300, 1) and P2 (1000, 1000, 1),
// w 0.5 each, task 1 x 250), with GPU 0 marked unhealthy: healthy GPUs 1, 2 free [1000, 350].
//   F = P1 0 + P2 strands 350: 175.
//   GPU 1 -> [750, 350]: P1 0; P2 fits none, CPU fits: q2 0.5*1100 = 550. dF = -375 -> 40
//   GPU 2 -> [1000, 100]: P1 strands 100: 50; P2 strands 100: 50. F' = 100. dF = 75 -> 51
//   -> GPU 2 (with GPU 0 healthy it was GPU 0).
TEST(Fgd, UnhealthyGpusAreSkipped) {
  TestCluster c;
  c.SetTypicalPods({Typical(1000, 300, 1, 0.5), Typical(1000, 1000, 1, 0.5)});
  const NodeIndex n = c.AddNode("n", 10000, 64000, 3);
  c.Commit(n, 0, {{0, 600}});
  c.Commit(n, 0, {{2, 650}});
  ASSERT_TRUE(c.ledger().SetGpuHealthy(n, 0, false).ok());
  ExpectPlaced(c.Build("fgd"), Task().Cpu(1000).Gpus(1, 250), n, {2});
}

// FgdCore remembers F by (model, sorted free shares, CPU thresholds reached): a core that has
// scored many nodes gives every node the points a fresh core computes from scratch. The nodes sit
// just below, at and above the typical pods' CPU requests, with the same shares in other GPU
// orders, of two models, so a key that kept too little (the CPU itself, the model) or confused
// orders would show.
TEST(Fgd, RememberedFragmentsGiveTheFreshPoints) {
  TestCluster c;
  const std::vector<TypicalPod> pods = {Typical(4000, 500, 1, 0.4), Typical(8000, 1000, 2, 0.3),
                                        Typical(2000, 0, 0, 0.2), Typical(4000, 300, 1, 0.1, {"V100M32"})};
  const std::vector<std::vector<std::pair<int, int64_t>>> holds = {
      {}, {{0, 500}}, {{1, 500}}, {{3, 500}}, {{0, 700}}, {{2, 700}}, {{0, 1000}, {1, 1000}}, {{2, 1000}, {3, 1000}}};
  std::vector<NodeIndex> nodes;
  for (const int64_t free_cpu : {1999, 2000, 2001, 3999, 4000, 8000, 16000}) {
    for (size_t h = 0; h < holds.size(); ++h) {
      for (const std::string model : {"T4", "V100M32"}) {
        const NodeIndex n = c.AddNode(fmt::format("n{}-{}-{}", free_cpu, h, model), 16000, 64000, 4, model);
        // Every hold is a task; the CPU left is free_cpu.
        int64_t used = 16000 - free_cpu;
        for (size_t i = 0; i < holds[h].size(); ++i) {
          const int64_t cpu = i + 1 == holds[h].size() ? used : 0;
          c.Commit(n, cpu, {holds[h][i]});
          used -= cpu;
        }
        if (holds[h].empty() && used > 0) c.Commit(n, used);
        nodes.push_back(n);
      }
    }
  }
  const std::vector<TaskRequest> tasks = {Task().Cpu(1000).Gpus(1, 500).Build(), Task().Cpu(3000).Gpus(2, 1000).Build(),
                                          Task().Cpu(1000).Build(), Task().Cpu(2000).Gpus(1, 300).Build(),
                                          Task().Cpu(500).Gpus(2, 400).Build()};
  FgdCore remembering(pods);
  int compared = 0;
  for (int round = 0; round < 2; ++round) {
    for (const TaskRequest& task : tasks) {
      const PreparedTask t = testutil::PrepareTask(c.ledger(), task);
      for (NodeIndex n : nodes) {
        const NodeState& s = c.ledger().state(n);
        int64_t free_cpu = s.free_cpu, fits = 0;
        for (const GpuState& g : s.gpus) fits += g.free_share >= t.share ? 1 : 0;
        if (free_cpu < t.cpu || fits < t.gpu_count) continue;  // Points wants a feasible node
        FgdCore fresh(pods);
        EXPECT_EQ(remembering.Points(c.ledger(), t, n), fresh.Points(c.ledger(), t, n))
            << c.ledger().spec(n).name << " task " << compared;
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 500);
}

TEST(Fgd, NeedsATypicalWorkload) {
  TestCluster c;
  c.AddNode("n", 8000, 8000, 1);
  Rng& rng = c.rng();
  auto s = Scheduler::Create(ProfileForPolicy("fgd").value(), DefaultRegistry(), c.ledger(), rng);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
}

// Typical pods given in the plugin's arguments serve as well as the workload's: the scenario of
// WholeGpuTaskCompletesANodeP2CannotUse, from arguments.
TEST(Fgd, TypicalPodsFromArguments) {
  TestCluster c;
  const NodeIndex a = c.AddNode("a", 8000, 64000, 2);
  const NodeIndex b = c.AddNode("b", 8000, 64000, 2);
  c.Commit(b, 0, {{0, 600}});
  Profile profile = ProfileForPolicy("fgd").value();
  auto pod = [](int64_t cpu, int64_t share, int64_t count) {
    return Value(Value::Map{{"cpu", cpu}, {"gpuShare", share}, {"gpuCount", count}, {"weight", 0.5}});
  };
  profile.scores[0].args =
      Value(Value::Map{{"typicalPods", Value(Value::List{pod(1000, 500, 1), pod(1000, 1000, 2)})}});
  Scheduler& s = c.BuildProfile(profile, DefaultRegistry());
  (void)a;
  ExpectPlaced(s, Task().Cpu(1000).Gpus(1, 1000), b, {1});
}

}  // namespace
}  // namespace gpupool
