// The allocation bound: its cuts, hand-checkable clusters, its columns, and the real trace against FGD.
#include "sim/bound.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include "sim/trace.h"

namespace gpupool {
namespace {

const std::string kTraces = std::string(GPUPOOL_SHARED_DIR) + "/traces/";

NodeSpec Node(const std::string& name, int64_t cores, int64_t gib, int gpus, const std::string& model) {
  return MakeNode(name, MilliCpu(cores * 1000), MiB(gib * 1024), gpus, model, GpuCatalog::Builtin());
}

TaskRequest Pod(int64_t cores, int64_t gib, int gpus, int64_t share, std::vector<std::string> models = {}) {
  TaskRequest t;
  t.cpu = MilliCpu(cores * 1000);
  t.memory = MiB(gib * 1024);
  t.gpu_count = gpus;
  t.gpu_share = MilliGpu(gpus > 0 ? share : 0);
  t.gpu_models = std::move(models);
  return t;
}

double Bound(const std::vector<NodeSpec>& nodes, const std::vector<TaskRequest>& pods) {
  auto r = GpuAllocationBound(nodes, pods);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::nan("");
}

// The per-GPU shares of the trace: the 21 values of all 25 pod lists (gpu_milli of the GPU pods,
// clamped to 1000), plus whatever the lists in ../shared hold when they are there.
std::set<int64_t> TraceShares() {
  std::set<int64_t> shares = {50,  110, 140, 160, 220, 230, 270, 290, 320, 330, 350,
                              370, 440, 460, 470, 480, 550, 590, 650, 810, 1000};
  const std::string dir = kTraces + "alibaba-gpu-v2023";
  if (std::filesystem::exists(dir)) {
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      const std::string file = entry.path().filename().string();
      if (file.rfind("openb_pod_list_", 0) != 0) continue;
      auto pods = ReadOpenbPods(entry.path().string());
      EXPECT_TRUE(pods.ok()) << pods.status().ToString();
      if (!pods.ok()) continue;
      for (const TracePod& p : *pods) {
        if (p.request.wants_gpu()) shares.insert(p.request.gpu_share.units());
      }
    }
  }
  return shares;
}

// Every cut is dual feasible on one GPU: every multiset of the trace's shares that fits in 1000
// milli-GPU has sum u <= 1000. Brute force over all such multisets.
TEST(BoundDffTest, CutsAreValidOnEveryFittingMultisetOfTraceShares) {
  const std::set<int64_t> share_set = TraceShares();
  const std::vector<int64_t> shares(share_set.begin(), share_set.end());
  ASSERT_GE(shares.size(), 21u);
  int64_t multisets = 0;
  std::vector<int64_t> tight(kDffCuts, 0);  // multisets where the cut reaches 1000 (it is not slack)
  int64_t violations = 0;
  std::string first_violation;
  std::vector<double> sum_u(kDffCuts, 0);
  std::vector<int64_t> chosen;
  // Multisets as non-decreasing index sequences; `used` is their share sum.
  std::function<void(size_t, int64_t)> visit = [&](size_t from, int64_t used) {
    ++multisets;
    for (size_t e = 0; e < kDffCuts; ++e) {
      if (sum_u[e] > 1000 + 1e-6 && violations++ == 0) {
        first_violation = DffCutName(e) + " on " + ::testing::PrintToString(chosen);
      }
      if (sum_u[e] > 1000 - 1e-6) ++tight[e];
    }
    for (size_t i = from; i < shares.size(); ++i) {
      if (used + shares[i] > 1000) break;  // shares are sorted
      chosen.push_back(shares[i]);
      for (size_t e = 0; e < kDffCuts; ++e) sum_u[e] += DffCutValue(e, shares[i]);
      visit(i, used + shares[i]);
      for (size_t e = 0; e < kDffCuts; ++e) sum_u[e] -= DffCutValue(e, shares[i]);
      chosen.pop_back();
    }
  };
  visit(0, 0);
  EXPECT_EQ(violations, 0) << first_violation;
  EXPECT_GT(multisets, 1000);
  for (size_t e = 0; e < kDffCuts; ++e) EXPECT_GT(tight[e], 0) << DffCutName(e);
  // The functions themselves, at their thresholds.
  EXPECT_EQ(DffValue(0, 600), 600);
  EXPECT_EQ(DffValue(0, 1000), 1000);
  EXPECT_EQ(DffValue(400, 600), 600);   // 1000 - e is still "s"
  EXPECT_EQ(DffValue(400, 601), 1000);  // above 1000 - e: a whole GPU
  EXPECT_EQ(DffValue(400, 400), 400);
  EXPECT_EQ(DffValue(400, 399), 0);  // below e: nothing
  EXPECT_EQ(DffValue(500, 500), 500);
  EXPECT_EQ(FsDffValue(2, 340), 500);  // 3 x 0.34 > 1: two fill a GPU
  EXPECT_EQ(FsDffValue(2, 320), 0);    // 3 x 0.32 < 1
  EXPECT_EQ(FsDffValue(2, 1000), 1000);
  EXPECT_EQ(FsDffValue(3, 250), 250);  // 4 x 0.25 = 1 exactly: the share itself
  EXPECT_NEAR(FsDffValue(3, 260), 1000.0 / 3, 1e-9);
  EXPECT_NEAR(FsDffValue(3, 810), 1000.0, 1e-9);
  EXPECT_EQ(DffCutValue(0, 470), 470.0);
  EXPECT_EQ(DffCutValue(std::size(kDffEpsilonsMilli), 340), 500.0);  // the first u^(k) is u^(2)
}

// One GPU, three 0.34-GPU pods: two fit (0.68 GPU). The u_e cuts allow a whole GPU (each counts 0.34);
// u^(2) counts each as half a GPU.
TEST(BoundTest, FeketeSchepersCutBoundsThreeThirdPlusPodsOnOneGpu) {
  const std::vector<NodeSpec> nodes = {Node("n0", 32, 128, 1, "T4")};
  EXPECT_NEAR(Bound(nodes, {Pod(1, 1, 1, 340), Pod(1, 1, 1, 340), Pod(1, 1, 1, 340)}), 680.0, 1e-6);
}

// One GPU, three 0.6-GPU pods: only one fits, and the e = 0.5 cut (each counts a whole GPU) says so;
// GPU capacity alone would allow 1.0 GPU.
TEST(BoundTest, CutsBoundThreeSixTenthsPodsOnOneGpu) {
  const std::vector<NodeSpec> nodes = {Node("n0", 32, 128, 1, "T4")};
  EXPECT_DOUBLE_EQ(Bound(nodes, {Pod(1, 1, 1, 600), Pod(1, 1, 1, 600), Pod(1, 1, 1, 600)}), 600);
  // Two 0.5-GPU pods fill it exactly.
  EXPECT_DOUBLE_EQ(Bound(nodes, {Pod(1, 1, 1, 500), Pod(1, 1, 1, 500), Pod(1, 1, 1, 500)}), 1000);
  // 0.7 + 0.3 fits; a second 0.7 adds nothing.
  EXPECT_DOUBLE_EQ(Bound(nodes, {Pod(1, 1, 1, 700), Pod(1, 1, 1, 700), Pod(1, 1, 1, 300)}), 1000);
  // A whole-GPU pod next to a share pod: one of them.
  EXPECT_DOUBLE_EQ(Bound(nodes, {Pod(1, 1, 1, 1000), Pod(1, 1, 1, 200)}), 1000);
  EXPECT_DOUBLE_EQ(Bound(nodes, {}), 0);
}

// Eight GPUs but 16 cores: 4-core whole-GPU pods fill at most 4 GPUs; likewise memory.
TEST(BoundTest, CpuAndMemoryLimitGpus) {
  const std::vector<NodeSpec> nodes = {Node("n0", 16, 64, 8, "V100M32")};
  std::vector<TaskRequest> pods(8, Pod(4, 1, 1, 1000));
  EXPECT_DOUBLE_EQ(Bound(nodes, pods), 4000);
  pods.assign(8, Pod(1, 32, 1, 1000));
  EXPECT_DOUBLE_EQ(Bound(nodes, pods), 2000);
  // A pod larger than any node adds nothing; CPU-only pods add nothing either.
  EXPECT_DOUBLE_EQ(Bound(nodes, {Pod(17, 1, 1, 1000), Pod(1, 1, 0, 0)}), 0);
  // Two identical nodes pool their CPU (the LP ignores the node boundary within a type): three
  // 10-core pods get 3 GPUs although an integral placement fits only one per node.
  const std::vector<NodeSpec> two = {Node("a", 16, 64, 8, "V100M32"), Node("b", 16, 64, 8, "V100M32")};
  EXPECT_DOUBLE_EQ(Bound(two, std::vector<TaskRequest>(3, Pod(10, 1, 1, 1000))), 3000);
}

// Pods that accept only some models, GPU counts beyond a node's, and catalog aliases.
TEST(BoundTest, ModelAndGpuCountConstraints) {
  const std::vector<NodeSpec> nodes = {Node("t4", 64, 256, 2, "T4"), Node("p100", 64, 256, 4, "P100")};
  std::vector<TaskRequest> pods(5, Pod(1, 1, 1, 1000, {"T4"}));
  EXPECT_DOUBLE_EQ(Bound(nodes, pods), 2000);  // only the two T4s
  pods.push_back(Pod(1, 1, 1, 1000, {"P100", "T4"}));
  EXPECT_DOUBLE_EQ(Bound(nodes, pods), 3000);
  EXPECT_DOUBLE_EQ(Bound(nodes, {Pod(1, 1, 1, 1000, {"A10"})}), 0);                // no such node
  EXPECT_DOUBLE_EQ(Bound(nodes, {Pod(1, 1, 4, 1000), Pod(1, 1, 4, 1000)}), 4000);  // only P100 has 4
  EXPECT_DOUBLE_EQ(Bound(nodes, {Pod(1, 1, 8, 1000)}), 0);                         // no node has 8
}

// The bound never exceeds the demand or the capacity, and never shrinks as pods arrive.
TEST(BoundTest, MonotoneInThePrefixAndNeverAboveDemand) {
  const std::vector<NodeSpec> nodes = {Node("a", 32, 128, 2, "T4"), Node("b", 16, 64, 4, "P100"),
                                       Node("c", 96, 384, 8, "V100M32")};
  const std::vector<TaskRequest> shapes = {
      Pod(4, 8, 1, 500), Pod(8, 16, 1, 1000), Pod(2, 4, 1, 250),           Pod(16, 32, 2, 1000),
      Pod(6, 8, 1, 650), Pod(3, 2, 0, 0),     Pod(12, 48, 1, 810, {"T4"}), Pod(24, 96, 4, 1000)};
  std::vector<TaskRequest> pods;
  int64_t demand = 0;
  double last = 0;
  for (int i = 0; i < 40; ++i) {
    pods.push_back(shapes[static_cast<size_t>(i * 5 + i / 3) % shapes.size()]);
    demand += pods.back().total_gpu_share().units();
    const double b = Bound(nodes, pods);
    EXPECT_GE(b, last - 1e-6) << "prefix " << i + 1;
    EXPECT_LE(b, static_cast<double>(demand) + 1e-6) << "prefix " << i + 1;
    EXPECT_LE(b, 14000 + 1e-6) << "prefix " << i + 1;
    last = b;
  }
  EXPECT_LT(last, 14000);  // the cuts and the CPU of node b keep it below full
}

TEST(BoundTest, MigIsAnErrorNotACrash) {
  const std::vector<NodeSpec> nodes = {Node("n0", 32, 128, 1, "A100-80GB")};
  TaskRequest mig;
  mig.cpu = MilliCpu(1000);
  mig.gpu_count = 1;
  mig.mig_profile = "3g";
  auto r = GpuAllocationBound(nodes, std::vector<TaskRequest>{mig});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("MIG"), std::string::npos) << r.status().ToString();
  std::vector<NodeSpec> mig_nodes = nodes;
  mig_nodes[0].gpus[0].mig_enabled = true;
  EXPECT_FALSE(GpuAllocationBound(mig_nodes, std::vector<TaskRequest>{Pod(1, 1, 1, 500)}).ok());
}

// One GPU, ten 0.13-GPU pods: arrived demand 13 %, 26 %, ..., 130 %, one pod per column 13c. Seven
// pods (91 %) fit; from the eighth the LP reaches the GPU (the integral answer would stay at 91 %).
TEST(BoundTest, FillsColumnsFromTheLastRowOfEachBin) {
  const std::vector<NodeSpec> nodes = {Node("n0", 32, 128, 1, "T4")};
  const TaskRequest pod = Pod(1, 1, 1, 130);
  const std::vector<const TaskRequest*> arrivals(10, &pod);
  ExperimentResult r;
  ASSERT_TRUE(FillBoundResult(nodes, arrivals, {}, BoundKind::kRelaxed, r).ok());
  EXPECT_EQ(r.total_gpus, 1);
  EXPECT_EQ(r.pods_arrived, 10);
  EXPECT_EQ(r.arrived_gpu_milli, 1300);
  EXPECT_TRUE(std::isnan(r.alloc[0]));  // no row within 0..1
  EXPECT_TRUE(std::isnan(r.alloc[20]));
  EXPECT_EQ(r.alloc[12], 13.0);  // bin 13 by BinMetrics' fallback
  EXPECT_EQ(r.alloc[13], 13.0);
  EXPECT_EQ(r.alloc[14], 13.0);
  EXPECT_EQ(r.alloc[91], 91.0);
  EXPECT_EQ(r.alloc[104], 100.0);
  EXPECT_EQ(r.alloc[130], 100.0);
  for (int c = 0; c < kDemandBins; ++c) {
    EXPECT_TRUE(std::isnan(r.frag[static_cast<size_t>(c)]));
    EXPECT_TRUE(std::isnan(r.frag_ratio[static_cast<size_t>(c)]));
  }
  // Columns follow the demand as asked (exclusive mode: the pods take whole GPUs but asked for 0.5).
  const TaskRequest whole = Pod(1, 1, 1, 1000);
  ExperimentResult ex;
  ASSERT_TRUE(FillBoundResult(nodes, {&whole, &whole}, {500, 500}, BoundKind::kRelaxed, ex).ok());
  EXPECT_EQ(ex.arrived_gpu_milli, 1000);
  EXPECT_EQ(ex.alloc[50], 100.0);
  EXPECT_EQ(ex.alloc[100], 100.0);
  EXPECT_FALSE(
      FillBoundResult(nodes, {&whole, &whole}, {500}, BoundKind::kRelaxed, ex).ok());  // one demand per pod
  // Nothing that takes GPU share (CPU-only pods, no pods): 0, not a GLPK abort.
  const TaskRequest cpu_only = Pod(1, 1, 0, 0);
  ExperimentResult none;
  ASSERT_TRUE(FillBoundResult(nodes, {&cpu_only, &cpu_only}, {}, BoundKind::kRelaxed, none).ok());
  EXPECT_EQ(none.alloc[0], 0.0);
  EXPECT_TRUE(std::isnan(none.alloc[2]));
  ASSERT_TRUE(FillBoundResult(nodes, {}, {}, BoundKind::kRelaxed, none).ok());
  EXPECT_TRUE(std::isnan(none.alloc[0]));
  EXPECT_FALSE(
      FillBoundResult({Node("cpu", 8, 8, 0, "")}, {&pod}, {}, BoundKind::kRelaxed, none).ok());  // no GPUs
}

// The published cluster, default trace, seed 42, published arrival order: the bound is at least what
// FGD allocates in every column, and at most 100 %.
TEST(BoundTest, BoundsFgdOnTheDefaultTrace) {
  if (!std::filesystem::exists(kTraces + "fgd-arrival-orders/default_42_pods.txt")) {
    GTEST_SKIP() << "shared traces not found at " << kTraces;
  }
  auto inputs = LoadExperimentInputs(kTraces + "alibaba-gpu-v2023/openb_node_list_gpu_node.csv",
                                     kTraces + "alibaba-gpu-v2023/openb_pod_list_default.csv");
  ASSERT_TRUE(inputs.ok()) << inputs.status().ToString();
  ExperimentOptions o;
  o.trace = "default";
  o.seed = 42;
  o.arrival_order_dir = kTraces + "fgd-arrival-orders";
  std::map<std::string, ExperimentResult> r;
  for (const char* policy : {"bound", "bound-relaxed", "fgd", "balanced"}) {
    o.policy = policy;
    auto result = RunExperiment(*inputs, o);
    ASSERT_TRUE(result.ok()) << policy << ": " << result.status().ToString();
    r[policy] = *result;
  }
  const ExperimentResult& bound = r["bound"];
  const ExperimentResult& relaxed = r["bound-relaxed"];
  EXPECT_EQ(bound.policy, "bound");
  EXPECT_EQ(bound.total_gpus, 6212);
  for (const auto& [policy, result] : r) {
    EXPECT_EQ(result.pods_arrived, bound.pods_arrived) << policy;
    EXPECT_EQ(result.arrived_gpu_milli, bound.arrived_gpu_milli) << policy;
  }
  for (int c = 0; c < kDemandBins; ++c) {
    const auto cell = static_cast<size_t>(c);
    EXPECT_GE(bound.alloc[cell], r["fgd"].alloc[cell]) << "column " << c;
    EXPECT_GE(bound.alloc[cell], r["balanced"].alloc[cell]) << "column " << c;
    EXPECT_LE(bound.alloc[cell], relaxed.alloc[cell]) << "column " << c;  // forcing only removes options
    EXPECT_LE(relaxed.alloc[cell], 100.0) << "column " << c;
    EXPECT_LE(relaxed.alloc[cell], static_cast<double>(c) + 0.5) << "column " << c;  // the arrived demand
  }
  // Forcing binds on this trace: the 0.81-GPU pods that arrive while GPUs are free must be placed, and
  // only pods under 0.2 GPU can use what they leave (the relaxed bound reaches 100 %).
  EXPECT_EQ(relaxed.alloc[130], 100.0);
  EXPECT_LT(bound.alloc[130], 99.0);
  RecordProperty("bound_130", std::to_string(bound.alloc[130]));
  RecordProperty("fgd_130", std::to_string(r["fgd"].alloc[130]));
  std::printf(
      "default/42: bound@130 %.2f (%.2f s), bound-relaxed@130 %.2f (%.2f s), fgd@130 %.2f, balanced@130 "
      "%.2f\n",
      bound.alloc[130], bound.seconds, relaxed.alloc[130], relaxed.seconds, r["fgd"].alloc[130],
      r["balanced"].alloc[130]);
}

// Forced placement, worked out by hand on one GPU (32 cores): pod A (0.51 GPU) arrives first and B
// (0.79) second, 130 % of the GPU in all. Both take more than half a GPU, so they cannot share it (the
// e = 0.5 cut counts each as a whole GPU). Left free to choose, the LP keeps B (79 %); but A arrived on
// an empty cluster, so every policy placed it, and then B could not fit: 51 %.
TEST(BoundForcedTest, APodThatArrivedOnAnEmptyClusterIsPlaced) {
  const std::vector<NodeSpec> nodes = {Node("n0", 32, 128, 1, "T4")};
  const TaskRequest a = Pod(1, 1, 1, 510);
  const TaskRequest b = Pod(1, 1, 1, 790);
  ExperimentResult forced;
  ExperimentResult relaxed;
  ASSERT_TRUE(FillBoundResult(nodes, {&a, &b}, {}, BoundKind::kForcedPlacement, forced).ok());
  ASSERT_TRUE(FillBoundResult(nodes, {&a, &b}, {}, BoundKind::kRelaxed, relaxed).ok());
  EXPECT_EQ(forced.alloc[51], 51.0);
  EXPECT_EQ(relaxed.alloc[51], 51.0);
  EXPECT_EQ(relaxed.alloc[130], 79.0);
  EXPECT_EQ(forced.alloc[130], 51.0);
}

// Two GPUs: A (0.51) and B (0.79) cannot both be kept off the node (A blocks one GPU, and B needs only
// one), so both are forced; C, a whole GPU, arrives after them and finds no free GPU. Forced: A + B =
// 65 % at 115 % arrived. Relaxed: C + B = 89.5 %.
TEST(BoundForcedTest, PodsForcedUntilTheArrivalsCouldBlockEveryGpu) {
  const std::vector<NodeSpec> nodes = {Node("n0", 32, 128, 2, "T4")};
  const TaskRequest a = Pod(1, 1, 1, 510);
  const TaskRequest b = Pod(1, 1, 1, 790);
  const TaskRequest c = Pod(1, 1, 1, 1000);
  ExperimentResult forced;
  ExperimentResult relaxed;
  ASSERT_TRUE(FillBoundResult(nodes, {&a, &b, &c}, {}, BoundKind::kForcedPlacement, forced).ok());
  ASSERT_TRUE(FillBoundResult(nodes, {&a, &b, &c}, {}, BoundKind::kRelaxed, relaxed).ok());
  EXPECT_EQ(forced.alloc[65], 65.0);
  EXPECT_EQ(forced.alloc[115], 65.0);
  EXPECT_EQ(relaxed.alloc[115], 89.5);
}

// CPU blocks too, and CPU-only pods count: X (CPU-only, all 4 cores of the node) arrives first and is
// forced; the GPU pod after it could have been blocked by X (it needs a core), so it is not forced,
// and with X placed it never fits: 0 %. Relaxed, X is left out and the GPU pod placed: 50 %.
TEST(BoundForcedTest, ACpuOnlyPodThatTookTheNodesCpuBlocksTheGpuPodAfterIt) {
  const std::vector<NodeSpec> nodes = {Node("n0", 4, 16, 1, "T4")};
  const TaskRequest x = Pod(4, 1, 0, 0);
  const TaskRequest y = Pod(1, 1, 1, 500);
  ExperimentResult forced;
  ExperimentResult relaxed;
  ASSERT_TRUE(FillBoundResult(nodes, {&x, &y}, {}, BoundKind::kForcedPlacement, forced).ok());
  ASSERT_TRUE(FillBoundResult(nodes, {&x, &y}, {}, BoundKind::kRelaxed, relaxed).ok());
  EXPECT_EQ(forced.alloc[50], 0.0);
  EXPECT_EQ(relaxed.alloc[50], 50.0);
  // With a core to spare, X cannot block the GPU pod: both are forced, and the GPU pod is placed.
  const TaskRequest x3 = Pod(3, 1, 0, 0);
  ASSERT_TRUE(FillBoundResult(nodes, {&x3, &y}, {}, BoundKind::kForcedPlacement, forced).ok());
  EXPECT_EQ(forced.alloc[50], 50.0);
  // A task limit of one blocks the node as well as its CPU would.
  std::vector<NodeSpec> limited = nodes;
  limited[0].max_tasks = 1;
  ASSERT_TRUE(FillBoundResult(limited, {&x3, &y}, {}, BoundKind::kForcedPlacement, forced).ok());
  EXPECT_EQ(forced.alloc[50], 0.0);
}

// Monotone rejection. Two one-GPU nodes; S1 and S2 (0.3 each) are forced, Q (0.81) and R (a whole
// GPU) are not: S1 and S2 spread over both GPUs block them. Without the rule the LP keeps R and 1/3
// of Q (u^(3) prices each 0.3 at 1/3 GPU, so Q + R <= 4/3): 0.6 + 1 + 0.27 = 1.87 GPUs, 93.5 %. But
// pods never leave, so a run that turns Q away has no room for R after it either (R asks for at
// least what Q does): n_Q = 0 leaves 0.6 GPU; n_Q = 1 gives 0.6 + 0.81 + 1/3 of R = 1.743 GPUs. The
// best real run, S1 and S2 on one GPU and Q on the other, allocates 1.41 GPUs (70.5 %).
TEST(BoundForcedTest, APodTurnedAwayTurnsAwayEveryLaterPodThatAsksForMore) {
  const std::vector<NodeSpec> nodes = {Node("n0", 32, 128, 1, "T4"), Node("n1", 32, 128, 1, "T4")};
  const TaskRequest s = Pod(1, 1, 1, 300);
  const TaskRequest q = Pod(1, 1, 1, 810);
  const TaskRequest r = Pod(1, 1, 1, 1000);
  ExperimentResult forced;
  ASSERT_TRUE(FillBoundResult(nodes, {&s, &s, &q, &r}, {}, BoundKind::kForcedPlacement, forced).ok());
  EXPECT_NEAR(forced.alloc[120], 87.17, 1e-9);  // 2.41 GPUs arrived of 2: column 120
  EXPECT_GE(forced.alloc[120], 70.5);
  // R asking for less CPU than Q does not dominate Q, and the LP may keep it as before.
  const TaskRequest q2 = Pod(2, 1, 1, 810);
  ASSERT_TRUE(FillBoundResult(nodes, {&s, &s, &q2, &r}, {}, BoundKind::kForcedPlacement, forced).ok());
  EXPECT_NEAR(forced.alloc[120], 93.5, 1e-9);
}

}  // namespace
}  // namespace gpupool
