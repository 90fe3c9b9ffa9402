// Topology-aware GPU choice and node scoring on NVLink machines (model/topology.h presets).
//
// Pair score = PCIe level score + 100 per NVLink link. "pcie-4gpu-nvlink-pairs": GPUs 0, 1 under one
// switch (50) with a 12-link bridge -> 1250, likewise 2, 3; pairs across the two sockets: 10.
// "dgx-h100": NVSwitch, 18 links between every pair; GPUs i, i^1 share a leaf switch (50 + 1800 =
// 1850), GPUs on one socket share a root switch (40 + 1800 = 1840), across sockets 10 + 1800.
//
// The topology score (integer arithmetic): capital C = 100 x links over pairs of fully free GPUs,
// C0 = C of the empty node, lost = C destroyed by the placement.
//   k >= 2: S = floor(75 best / ideal) + floor(25 (C0 - lost) / C0), best = SetScore(set taken
//           here), ideal = best k-set score of any empty node in the cluster;
//   k = 1:  S = floor(100 (C0 - lost) / C0); C0 = 0: the capital term is full.
// The "topology" policy adds binpack: total = 2 x topology + binpack.
#include <gtest/gtest.h>

#include "sched/test_util.h"

namespace gpupool {
namespace {

using testutil::ExpectPlaced;
using testutil::RawScores;
using testutil::Task;
using testutil::TestCluster;

constexpr const char* kPairs = "pcie-4gpu-nvlink-pairs";

// A 2-GPU task on a pcie-4gpu-nvlink-pairs node whose GPU 0 holds a share: the free GPUs are 1, 2,
// 3. Sets: {1,2} 10, {1,3} 10, {2,3} 1250 -> {2, 3}, not the lowest-index pair {1, 2}.
TEST(Topology, MultiGpuTaskTakesTheNvlinkPair) {
  TestCluster c;
  const NodeIndex n = c.AddMachine("n", 64000, 256000, kPairs);
  c.Commit(n, 0, {{0, 500}});
  ExpectPlaced(c.Build("topology"), Task().Cpu(1000).Gpus(2, 1000), n, {2, 3});
  // The baselines' best selector makes the same choice.
  ExpectPlaced(c.Build("bestfit"), Task().Cpu(1000).Gpus(2, 1000), n, {2, 3});
}

// dgx-h100 with GPU 0 busy: the best 2-set is a leaf-switch pair, {2, 3} (1850), ahead of {1, 2}
// (1840, one root switch). Best 4-set: socket 1, {4, 5, 6, 7}: 2 x 1850 + 4 x 1840 = 11060,
// ahead of any set crossing sockets.
// Topology score of the 2-GPU task: 75 x 1850 / 1850 = 75. Capital: empty 28 pairs x 1800 = 50400;
// now 7 free GPUs, 21 pairs: 37800; after {2, 3}, 5 free, 10 pairs: 18000; lost = 19800.
// S = 75 + floor(25 x 30600 / 50400) = 75 + 15 = 90.
TEST(Topology, DgxPrefersLeafSwitchPairsAndOneSocket) {
  TestCluster c;
  const NodeIndex n = c.AddMachine("dgx", 224000, 2048000, "dgx-h100");
  c.Commit(n, 0, {{0, 1000}});
  const TaskRequest two = Task().Cpu(1000).Gpus(2, 1000);
  EXPECT_EQ(RawScores(c, "topology", two, {n}), (std::vector<int64_t>{90}));
  Scheduler& s = c.Build("topology");
  ExpectPlaced(s, two, n, {2, 3});
  ExpectPlaced(s, Task().Cpu(1000).Gpus(4, 1000), n, {4, 5, 6, 7});
}

// Single whole-GPU task (8000 mCPU, 32000 MiB, 1 x 1000); nodes of 64000 mCPU, 256000 MiB, 4 GPUs.
//   X (index 0): pcie-4gpu-nvlink-pairs, all GPUs free, CPU and memory 3/4 used by CPU tasks.
//      Any GPU breaks one pair: capital 2400 -> 1200, lost 1200.
//      topology = 100 x 1200 / 2400 = 50
//      binpack: cpu 56000/64000 = 0.875, mem 224000/256000 = 0.875, gpu 1000/4000 = 0.25;
//      mean 0.6667 -> 66.  total = 2*50 + 66 = 166
//   Y (index 1): pcie-4gpu-nvlink-pairs, GPU 3 busy (with 8000 mCPU, 32000 MiB). Free 0, 1, 2:
//      GPU 2 is the lone one (its partner 3 is busy); taking it leaves pair 0-1 whole: capital
//      1200 -> 1200, lost 0.  topology = 100
//      binpack: 0.25, 0.25, gpu 2000/4000 = 0.5; mean 0.3333 -> 33.  total = 200 + 33 = 233
//   -> Y, on GPU 2 (not the lowest index 0, which would break the 0-1 pair), although binpack
//      alone prefers X.
TEST(Topology, SingleGpuTaskKeepsAnEmptyNvlinkPairWhole) {
  TestCluster c;
  const NodeIndex x = c.AddMachine("x", 64000, 256000, kPairs);
  c.Commit(x, 48000, {}, 192000);
  const NodeIndex y = c.AddMachine("y", 64000, 256000, kPairs);
  c.Commit(y, 8000, {{3, 1000}}, 32000);
  const TaskRequest task = Task().Cpu(8000).Mem(32000).Gpus(1, 1000);
  EXPECT_EQ(RawScores(c, "topology", task, {x, y}), (std::vector<int64_t>{50, 100}));
  EXPECT_EQ(RawScores(c, "binpack", task, {x, y}), (std::vector<int64_t>{66, 33}));
  ExpectPlaced(c.Build("topology"), task, y, {2});
  ExpectPlaced(c.Build("binpack"), task, x, {0});
}

// 2-GPU task (8000 mCPU, 32000 MiB); both nodes have no CPU or memory in use.
//   Cluster ideal 2-set: an NVLink pair, 1250.
//   A (index 0): GPU 0 busy, free 1, 2, 3. Best set {2, 3}: 75 x 1250 / 1250 = 75. Capital 1200
//      (pair 2-3) -> 0 of C0 = 2400: floor(25 x 1200 / 2400) = 12.  topology = 87
//      binpack: 0.125, 0.125, gpu 3000/4000 = 0.75 -> 33.  total = 174 + 33 = 207
//   B (index 1): GPUs 0, 2 busy, free 1, 3. Set {1, 3}: 10; floor(75 x 10 / 1250) = 0. Capital
//      0 -> 0, nothing lost: 25.  topology = 25
//      binpack: 0.125, 0.125, gpu 4000/4000 = 1 -> 41.  total = 50 + 41 = 91
//   -> A, on {2, 3}.
TEST(Topology, MultiGpuTaskPrefersTheNodeWithAWholePair) {
  TestCluster c;
  const NodeIndex a = c.AddMachine("a", 64000, 256000, kPairs);
  c.Commit(a, 0, {{0, 1000}});
  const NodeIndex b = c.AddMachine("b", 64000, 256000, kPairs);
  c.Commit(b, 0, {{0, 1000}});
  c.Commit(b, 0, {{2, 1000}});
  const TaskRequest task = Task().Cpu(8000).Mem(32000).Gpus(2, 1000);
  EXPECT_EQ(RawScores(c, "topology", task, {a, b}), (std::vector<int64_t>{87, 25}));
  EXPECT_EQ(RawScores(c, "binpack", task, {a, b}), (std::vector<int64_t>{33, 41}));
  ExpectPlaced(c.Build("topology"), task, a, {2, 3});
}

// Share tasks (1 x 300):
//   E (index 0), empty pairs node: best fit ties on four free GPUs; each breaks one pair
//      (capital 2400 -> 1200): 100 x 1200 / 2400 = 50; GPU 0.
//   S (index 1), 500 already used on GPU 0: best fit is GPU 0 (500 free); it is not fully free,
//      so nothing is destroyed: 100.
//   F (index 2), GPU 3 used whole: free 0, 1, 2 tie on best fit; GPU 2 breaks no pair (its partner
//      is busy): capital 1200 -> 1200 of 2400, nothing lost: 100; GPU 2.
TEST(Topology, ShareTasksGoWhereTheyBreakNoPair) {
  TestCluster c;
  const NodeIndex e = c.AddMachine("e", 64000, 256000, kPairs);
  const NodeIndex s = c.AddMachine("s", 64000, 256000, kPairs);
  c.Commit(s, 0, {{0, 500}});
  const NodeIndex f = c.AddMachine("f", 64000, 256000, kPairs);
  c.Commit(f, 0, {{3, 1000}});
  const TaskRequest task = Task().Cpu(1000).Gpus(1, 300);
  EXPECT_EQ(RawScores(c, "topology", task, {e, s, f}), (std::vector<int64_t>{50, 100, 100}));
  // On F alone (E and S cordoned) the best selector takes GPU 2; on E, GPU 0.
  Scheduler& sched = c.Build("bestfit");
  ASSERT_TRUE(c.ledger().SetCordoned(e, true).ok());
  ASSERT_TRUE(c.ledger().SetCordoned(s, true).ok());
  ExpectPlaced(sched, task, f, {2});
  ASSERT_TRUE(c.ledger().SetCordoned(e, false).ok());
  ASSERT_TRUE(c.ledger().SetCordoned(f, true).ok());
  ExpectPlaced(sched, task, e, {0});
}

// Without NVLink there is nothing to lose (capital term 25), and the link quality decides: the
// cluster's best 2-set is pcie-2gpu's host-bridge pair (30). P: 75 x 30 / 30 + 25 = 100. T (flat:
// every pair 10, across CPUs): floor(75 x 10 / 30) + 25 = 25 + 25 = 50. CPU tasks: 0 (no opinion).
TEST(Topology, NoNvlinkNoLossAndCpuTasksScoreZero) {
  TestCluster c;
  const NodeIndex p = c.AddMachine("p", 32000, 64000, "pcie-2gpu");
  const NodeIndex t = c.AddNode("t", 32000, 64000, 4);
  c.Commit(t, 0, {{1, 1000}});
  EXPECT_EQ(RawScores(c, "topology", Task().Cpu(1000).Gpus(2, 1000), {p, t}),
            (std::vector<int64_t>{100, 50}));
  EXPECT_EQ(RawScores(c, "topology", Task().Cpu(1000), {p, t}), (std::vector<int64_t>{0, 0}));
}

}  // namespace
}  // namespace gpupool

namespace gpupool {
namespace {

// A mixed cluster: a 2-GPU task prefers a whole NVLink pair on a busier board over an empty PCIe
// server. Cluster ideal 2-set: 1250 (the NVLink pair).
//   P (index 0, pcie-2gpu, empty): set {0, 1} = 30: floor(75 x 30 / 1250) = 1; no NVLink: +25 -> 26.
//   N (index 1, pcie-4gpu-nvlink-pairs, GPU 0 busy): set {2, 3} = 1250: 75; capital 1200 -> 0 of
//      2400: floor(25 x 1200 / 2400) = 12 -> 87.
TEST(Topology, NvlinkPairBeatsPcieServerInAMixedCluster) {
  testutil::TestCluster c;
  const NodeIndex p = c.AddMachine("p", 64000, 256000, "pcie-2gpu");
  const NodeIndex n = c.AddMachine("n", 64000, 256000, "pcie-4gpu-nvlink-pairs");
  c.Commit(n, 0, {{0, 1000}});
  const TaskRequest task = testutil::Task().Cpu(1000).Gpus(2, 1000);
  EXPECT_EQ(testutil::RawScores(c, "topology", task, {p, n}), (std::vector<int64_t>{26, 87}));
  testutil::ExpectPlaced(c.Build("topology"), task, n, {2, 3});
}

}  // namespace
}  // namespace gpupool
