// The built-in filter chain (node-unschedulable, node-resources, gpu-model, gpu-fit, mig-fit):
// each reason string, the Diagnosis text and ExplainNodes, on small hand-made clusters. The rules
// are the trace README's §3 filter, plus health, cordon, GPU memory and MIG.
#include <gtest/gtest.h>

#include "sched/test_util.h"

namespace gpupool {
namespace {

using testutil::ExpectPlaced;
using testutil::GpuIndices;
using testutil::Task;
using testutil::TestCluster;

NodeSpec WithMaxTasks(NodeSpec spec, int max_tasks) {
  spec.max_tasks = max_tasks;
  return spec;
}

// One node per reason, for the task cpu=4000 mem=4000, 2 GPUs x 500 with 4096 MiB each, models
// T4 or G2:
//   ok          T4 x2, 8 CPUs, 8000 MiB          fits
//   sick        node marked unhealthy             node unhealthy
//   cordoned    node cordoned                     node cordoned
//   small-cpu   2000 mCPU < 4000                  insufficient CPU
//   small-mem   2000 MiB < 4000 (CPU also fine)   insufficient memory
//   full        max 1 task, holds 1 CPU task      too many tasks
//   no-gpu      no GPUs                           no GPUs
//   v100        V100M32, not in the model list    GPU model not allowed
//   one-gpu     one T4 < 2 GPUs                   insufficient GPU count
//   half-sick   T4 x2, GPU 1 unhealthy: 1 usable  insufficient GPU count
//   busy        T4 x2, 600 used on each: 400 free insufficient GPU share
//   g2          G2 x2: GPU memory unknown (0)     insufficient GPU memory
class ReasonCluster : public ::testing::Test {
 protected:
  void SetUp() override {
    const GpuCatalog& cat = c_.ledger().catalog();
    ok_ = c_.AddNode("ok", 8000, 8000, 2);
    sick_ = c_.AddNode("sick", 8000, 8000, 2);
    ASSERT_TRUE(c_.ledger().SetNodeHealthy(sick_, false).ok());
    cordoned_ = c_.AddNode("cordoned", 8000, 8000, 2);
    ASSERT_TRUE(c_.ledger().SetCordoned(cordoned_, true).ok());
    c_.AddNode("small-cpu", 2000, 8000, 2);
    c_.AddNode("small-mem", 8000, 2000, 2);
    const NodeIndex full =
        c_.AddSpec(WithMaxTasks(MakeNode("full", MilliCpu(8000), MiB(8000), 2, "T4", cat), 1));
    c_.Commit(full, 1000);
    c_.AddNode("no-gpu", 8000, 8000, 0);
    c_.AddNode("v100", 8000, 8000, 2, "V100M32");
    c_.AddNode("one-gpu", 8000, 8000, 1);
    const NodeIndex half = c_.AddNode("half-sick", 8000, 8000, 2);
    ASSERT_TRUE(c_.ledger().SetGpuHealthy(half, 1, false).ok());
    const NodeIndex busy = c_.AddNode("busy", 8000, 8000, 2);
    c_.Commit(busy, 0, {{0, 600}});
    c_.Commit(busy, 0, {{1, 600}});
    c_.AddNode("g2", 8000, 8000, 2, "G2");
    c_.Build("bestfit");
  }

  TaskRequest task_ = Task().Cpu(4000).Mem(4000).Gpus(2, 500).GpuMem(4096).Models({"T4", "G2"});
  TestCluster c_;
  NodeIndex ok_ = 0, sick_ = 0, cordoned_ = 0;
};

TEST_F(ReasonCluster, ExplainNodesGivesEachNodesReason) {
  const std::vector<std::string> want = {"",
                                         "node unhealthy",
                                         "node cordoned",
                                         "insufficient CPU",
                                         "insufficient memory",
                                         "too many tasks",
                                         "no GPUs",
                                         "GPU model not allowed",
                                         "insufficient GPU count",
                                         "insufficient GPU count",
                                         "insufficient GPU share",
                                         "insufficient GPU memory"};
  EXPECT_EQ(c_.sched().ExplainNodes(task_), want);
}

TEST_F(ReasonCluster, OnlyTheFittingNodeIsFeasible) {
  // Eleven nodes fail, "ok" is the single feasible node: taken, on its two GPUs.
  const Decision d = c_.sched().Decide(task_);
  ASSERT_TRUE(d.placed);
  EXPECT_EQ(d.diagnosis.total_nodes, 12);
  EXPECT_EQ(d.diagnosis.feasible_nodes, 1);
  EXPECT_EQ(d.placement.node, ok_);
  EXPECT_EQ(GpuIndices(d.placement), (std::vector<int>{0, 1}));
}

TEST_F(ReasonCluster, DiagnosisListsEveryReasonMostFrequentFirst) {
  // With "ok" cordoned as well: 2 cordoned, 2 short of GPUs, 1 of everything else. Equal counts
  // keep the order of the filter chain and of each filter's reasons.
  ASSERT_TRUE(c_.ledger().SetCordoned(ok_, true).ok());
  const Decision d = c_.sched().Decide(task_);
  ASSERT_TRUE(d.error.ok());
  ASSERT_FALSE(d.placed);
  EXPECT_EQ(
      d.diagnosis.ToString(),
      "0/12 nodes fit: 2 node cordoned, 2 insufficient GPU count, 1 node unhealthy, 1 insufficient CPU, "
      "1 insufficient memory, 1 too many tasks, 1 no GPUs, 1 GPU model not allowed, "
      "1 insufficient GPU share, 1 insufficient GPU memory");
  // Place reports the same text as Unschedulable and commits nothing.
  const size_t before = c_.ledger().allocation_count();
  auto id = c_.sched().Place(task_);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kUnschedulable);
  EXPECT_EQ(id.status().message(), d.diagnosis.ToString());
  EXPECT_EQ(c_.ledger().allocation_count(), before);
}

TEST(Filters, DiagnosisSortsReasonsByCount) {
  // Share task 1 x 500 of a T4. Nodes a and b are T4s whose GPUs have 400 free each; c is a V100M32.
  //   a, b: insufficient GPU share;  c: GPU model not allowed.
  TestCluster c;
  const NodeIndex v100 = c.AddNode("c", 8000, 8000, 2, "V100M32");
  for (const char* name : {"a", "b"}) {
    const NodeIndex n = c.AddNode(name, 8000, 8000, 2);
    c.Commit(n, 0, {{0, 600}});
    c.Commit(n, 0, {{1, 600}});
  }
  (void)v100;
  Scheduler& s = c.Build("dotprod");
  const Decision d = s.Decide(Task().Cpu(1000).Gpus(1, 500).Models({"T4"}));
  ASSERT_FALSE(d.placed);
  EXPECT_EQ(d.diagnosis.ToString(), "0/3 nodes fit: 2 insufficient GPU share, 1 GPU model not allowed");
  ASSERT_EQ(d.diagnosis.reasons.size(), 2u);
  EXPECT_EQ(d.diagnosis.reasons[0], (std::pair<std::string, int>{"insufficient GPU share", 2}));
}

TEST(Filters, CpuIsCheckedBeforeMemory) {
  // A node short of both CPU and memory counts once, under CPU.
  TestCluster c;
  c.AddNode("tiny", 1000, 1000, 1);
  Scheduler& s = c.Build("dotprod");
  const Decision d = s.Decide(Task().Cpu(2000).Mem(2000));
  EXPECT_EQ(d.diagnosis.ToString(), "0/1 nodes fit: 1 insufficient CPU");
}

TEST(Filters, ExactFitIsAllowed) {
  // cpuReq + c <= cpu and memReq + mem <= memory: a task taking exactly what is left fits.
  TestCluster c;
  const NodeIndex n = c.AddNode("n", 8000, 8000, 1);
  c.Commit(n, 3000, {{0, 400}}, 3000);
  Scheduler& s = c.Build("dotprod");
  ExpectPlaced(s, Task().Cpu(5000).Mem(5000).Gpus(1, 600), n, {0});
}

TEST(Filters, WholeGpuTaskNeedsAFullyFreeGpu) {
  // Task 1 x 1000. Node a: both GPUs have 1 mGPU used (999 free each) -> insufficient GPU share.
  // Node b: GPU 0 has 1 used, GPU 1 is free -> fits, on GPU 1.
  TestCluster c;
  const NodeIndex a = c.AddNode("a", 8000, 8000, 2);
  c.Commit(a, 0, {{0, 1}});
  c.Commit(a, 0, {{1, 1}});
  const NodeIndex b = c.AddNode("b", 8000, 8000, 2);
  c.Commit(b, 0, {{0, 1}});
  Scheduler& s = c.Build("bestfit");
  const TaskRequest whole = Task().Cpu(1000).Gpus(1, 1000);
  EXPECT_EQ(s.ExplainNodes(whole), (std::vector<std::string>{"insufficient GPU share", ""}));
  ExpectPlaced(s, whole, b, {1});
  // With b's GPU 1 taken as well, nothing fits, although 1998 mGPU are free on a.
  c.Commit(b, 0, {{1, 1}});
  EXPECT_EQ(s.Decide(whole).diagnosis.ToString(), "0/2 nodes fit: 2 insufficient GPU share");
}

TEST(Filters, MultiGpuTaskNeedsKGpusEachWithTheShare) {
  // One node, 4 T4s with free [600, 600, 400, 1000] (2600 in all).
  //   3 x 500: GPUs with free >= 500 are {0, 1, 3}: 3 >= 3 -> fits, on exactly those.
  //   3 x 700: only GPU 3 has >= 700: 1 < 3 -> insufficient GPU share, although 2600 >= 2100.
  //   4 x 400: all four have >= 400 -> fits.
  //   5 x 100: 4 GPUs < 5 -> insufficient GPU count.
  TestCluster c;
  const NodeIndex n = c.AddNode("n", 16000, 16000, 4);
  c.Commit(n, 0, {{0, 400}});
  c.Commit(n, 0, {{1, 400}});
  c.Commit(n, 0, {{2, 600}});
  Scheduler& s = c.Build("bestfit");
  ExpectPlaced(s, Task().Cpu(1000).Gpus(3, 500), n, {0, 1, 3});
  EXPECT_EQ(s.Decide(Task().Cpu(1000).Gpus(3, 700)).diagnosis.ToString(),
            "0/1 nodes fit: 1 insufficient GPU share");
  ExpectPlaced(s, Task().Cpu(1000).Gpus(4, 400), n, {0, 1, 2, 3});
  EXPECT_EQ(s.Decide(Task().Cpu(1000).Gpus(5, 100)).diagnosis.ToString(),
            "0/1 nodes fit: 1 insufficient GPU count");
}

TEST(Filters, NvlinkTaskNeedsGpusPairwiseJoinedByNvlink) {
  // pcie-4gpu-nvlink-pairs: NVLink bridges join (0,1) and (2,3) only.
  //   2 x 1000 nvlink on the empty node: a bridged pair.
  //   4 x 1000 nvlink: no set of four is pairwise linked -> no NVLink-connected GPU set, although
  //   four GPUs are free; the same task without the requirement fits.
  //   With GPUs 0 and 2 taken, 1 and 3 are free but not linked: 2 x 1000 nvlink does not fit.
  // dgx-a100 (NVSwitch, every pair linked): 4 x 1000 nvlink fits.
  TestCluster c;
  const NodeIndex pairs = c.AddMachine("pairs", 64000, 64000, "pcie-4gpu-nvlink-pairs");
  Scheduler& s = c.Build("bestfit");
  const Decision two = s.Decide(Task().Cpu(1000).Gpus(2, 1000).Nvlink());
  ASSERT_TRUE(two.placed);
  const std::vector<int> got = GpuIndices(two.placement);
  EXPECT_TRUE(got == (std::vector<int>{0, 1}) || got == (std::vector<int>{2, 3})) << got.size();
  EXPECT_EQ(s.Decide(Task().Cpu(1000).Gpus(4, 1000).Nvlink()).diagnosis.ToString(),
            "0/1 nodes fit: 1 no NVLink-connected GPU set");
  EXPECT_TRUE(s.Decide(Task().Cpu(1000).Gpus(4, 1000)).placed);
  c.Commit(pairs, 0, {{0, 1000}});
  c.Commit(pairs, 0, {{2, 1000}});
  EXPECT_EQ(s.Decide(Task().Cpu(1000).Gpus(2, 1000).Nvlink()).diagnosis.ToString(),
            "0/1 nodes fit: 1 no NVLink-connected GPU set");
  ExpectPlaced(s, Task().Cpu(1000).Gpus(2, 1000), pairs, {1, 3});
  // Under fgd as well: on "pairs" GPUs 1 and 3 have room but no link; a second node with GPU 1
  // taken still has the bridged pair (2,3).
  const NodeIndex other = c.AddMachine("other", 64000, 64000, "pcie-4gpu-nvlink-pairs");
  c.Commit(other, 0, {{1, 1000}});
  c.SetTypicalPods({testutil::Typical(1000, 1000, 1, 0.5), testutil::Typical(1000, 500, 1, 0.5)});
  Scheduler& s2 = c.Build("fgd");
  ExpectPlaced(s2, Task().Cpu(1000).Gpus(2, 1000).Nvlink(), other, {2, 3});

  TestCluster d;
  const NodeIndex dgx = d.AddMachine("dgx", 256000, 256000, "dgx-a100");
  Scheduler& sd = d.Build("bestfit");
  const Decision four = sd.Decide(Task().Cpu(1000).Gpus(4, 1000).Nvlink());
  ASSERT_TRUE(four.placed);
  EXPECT_EQ(four.placement.node, dgx);
  EXPECT_EQ(four.placement.gpus.size(), 4u);
}

TEST(Filters, CpuOnlyTaskIgnoresGpusAndModels) {
  // A CPU-only task fits a node without GPUs, and a node whose GPUs are all taken.
  TestCluster c;
  c.AddNode("cpu", 8000, 8000, 0);
  const NodeIndex full = c.AddNode("full", 8000, 8000, 1, "V100M32");
  c.Commit(full, 0, {{0, 1000}});
  Scheduler& s = c.Build("dotprod");
  const Decision d = s.Decide(Task().Cpu(1000).Mem(1000));
  ASSERT_TRUE(d.placed);
  EXPECT_EQ(d.diagnosis.feasible_nodes, 2);
  EXPECT_TRUE(d.placement.gpus.empty());
}

TEST(Filters, ModelListAcceptsAnyListedModelAndCatalogAliases) {
  // Nodes: t4 (T4), a100 (A100-80GB). "A100-SXM4-80GB" is a catalog alias of A100-80GB.
  TestCluster c;
  c.AddNode("t4", 8000, 8000, 1);
  c.AddNode("a100", 8000, 8000, 1, "A100-80GB");
  Scheduler& s = c.Build("dotprod");
  EXPECT_EQ(s.ExplainNodes(Task().Cpu(1000).Gpus(1, 500).Models({"A100-SXM4-80GB"})),
            (std::vector<std::string>{"GPU model not allowed", ""}));
  EXPECT_EQ(s.ExplainNodes(Task().Cpu(1000).Gpus(1, 500).Models({"P100", "T4"})),
            (std::vector<std::string>{"", "GPU model not allowed"}));
  // A model no node has: every GPU node refuses.
  EXPECT_EQ(s.Decide(Task().Cpu(1000).Gpus(1, 500).Models({"H100-80GB"})).diagnosis.ToString(),
            "0/2 nodes fit: 2 GPU model not allowed");
}

TEST(Filters, MigReasons) {
  // MIG task "3g.40gb" (an A100-80GB / H100-80GB profile: 3 compute, 4 memory slices).
  //   t4       no MIG-enabled GPU                         no MIG-enabled GPUs
  //   a100-40  MIG on GPU 0, but A100-40GB has 3g.20gb    MIG profile not offered by this GPU model
  //   a100-80  MIG on GPU 0, holding a 7g.80gb            no room for the MIG profile
  TestCluster c;
  c.AddNode("t4", 8000, 8000, 1);
  const NodeIndex a40 = c.AddNode("a100-40", 8000, 8000, 1, "A100-40GB");
  ASSERT_TRUE(c.ledger().SetMigEnabled(a40, 0, true).ok());
  const NodeIndex a80 = c.AddNode("a100-80", 8000, 8000, 2, "A100-80GB");
  ASSERT_TRUE(c.ledger().SetMigEnabled(a80, 0, true).ok());
  Placement seven;
  seven.node = a80;
  seven.gpus.push_back(GpuGrant{0, MilliGpu(0), MiB(0), MigInstance{0, 0}});  // 7g.80gb, profile id 0
  ASSERT_TRUE(c.ledger().Commit(seven).ok());
  Scheduler& s = c.Build("bestfit");
  const TaskRequest mig = Task().Cpu(1000).Mig("3g.40gb");
  EXPECT_EQ(s.ExplainNodes(mig),
            (std::vector<std::string>{"no MIG-enabled GPUs", "MIG profile not offered by this GPU model",
                                      "no room for the MIG profile"}));
  EXPECT_EQ(s.Decide(mig).diagnosis.ToString(),
            "0/3 nodes fit: 1 no MIG-enabled GPUs, 1 MIG profile not offered by this GPU model, "
            "1 no room for the MIG profile");

  // A fourth node, A100-80GB with MIG on its GPU 1 only: the instance goes there at start 4, which
  // keeps the 4g (start 0 only) placeable (sched/mig_planner.h; profile id 9 is 3g).
  const NodeIndex fresh = c.AddNode("a100-80b", 8000, 8000, 2, "A100-80GB");
  ASSERT_TRUE(c.ledger().SetMigEnabled(fresh, 1, true).ok());
  const Decision d = s.Decide(mig);
  ASSERT_TRUE(d.placed) << d.diagnosis.ToString();
  EXPECT_EQ(d.placement.node, fresh);
  ASSERT_EQ(d.placement.gpus.size(), 1u);
  EXPECT_EQ(d.placement.gpus[0].gpu, 1);
  EXPECT_EQ(d.placement.gpus[0].mig, (MigInstance{9, 4}));
  EXPECT_EQ(d.placement.gpus[0].share, MilliGpu(0));
}

TEST(Filters, MigGpusTakeNoShareTasks) {
  // A100-80GB x2 with MIG on GPU 0: a share task goes to GPU 1; a 2-GPU task finds 1 usable GPU.
  TestCluster c;
  const NodeIndex n = c.AddNode("a100", 8000, 8000, 2, "A100-80GB");
  ASSERT_TRUE(c.ledger().SetMigEnabled(n, 0, true).ok());
  Scheduler& s = c.Build("bestfit");
  ExpectPlaced(s, Task().Cpu(1000).Gpus(1, 300), n, {1});
  EXPECT_EQ(s.Decide(Task().Cpu(1000).Gpus(2, 300)).diagnosis.ToString(),
            "0/1 nodes fit: 1 insufficient GPU count");
}

TEST(Filters, GpuMemoryIsPerGpu) {
  // T4: 15360 MiB per GPU. GPU 0 already gives 12000 MiB away (3360 left), GPU 1 is free.
  //   1 x 100 with 4096 MiB: only GPU 1 has the memory -> GPU 1 (best fit by share would be GPU 0).
  //   2 x 100 with 4096 MiB: GPU 0 lacks memory -> insufficient GPU memory.
  TestCluster c;
  const NodeIndex n = c.AddNode("t4", 8000, 8000, 2);
  Placement p;
  p.node = n;
  p.gpus.push_back(GpuGrant{0, MilliGpu(200), MiB(12000), std::nullopt});
  p.share_task = true;
  ASSERT_TRUE(c.ledger().Commit(p).ok());
  Scheduler& s = c.Build("bestfit");
  ExpectPlaced(s, Task().Cpu(1000).Gpus(1, 100).GpuMem(4096), n, {1});
  EXPECT_EQ(s.Decide(Task().Cpu(1000).Gpus(2, 100).GpuMem(4096)).diagnosis.ToString(),
            "0/1 nodes fit: 1 insufficient GPU memory");
}

TEST(Filters, InvalidTaskIsAnErrorNotADiagnosis) {
  TestCluster c;
  c.AddNode("n", 8000, 8000, 1);
  Scheduler& s = c.Build("bestfit");
  const Decision d = s.Decide(Task().Cpu(1000).Gpus(1, 1500));
  EXPECT_FALSE(d.placed);
  EXPECT_EQ(d.error.code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gpupool
