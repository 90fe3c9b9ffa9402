// The allocation bound: its cuts, hand-checkable clusters, its columns, and the real trace against FGD.
#include "sim/bound.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
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

// u_e is dual feasible on one GPU: every multiset of the trace's shares that fits in 1000 milli-GPU has
// sum u_e <= 1000, for every e of the cuts. Brute force over all such multisets.
TEST(BoundDffTest, CutsAreValidOnEveryFittingMultisetOfTraceShares) {
  const std::set<int64_t> share_set = TraceShares();
  const std::vector<int64_t> shares(share_set.begin(), share_set.end());
  ASSERT_GE(shares.size(), 21u);
  int64_t multisets = 0;
  int64_t tight = 0;  // multisets where some cut reaches exactly 1000 (the cuts are not slack)
  int64_t violations = 0;
  std::string first_violation;
  std::vector<int64_t> sum_u(std::size(kDffEpsilonsMilli), 0);
  std::vector<int64_t> chosen;
  // Multisets as non-decreasing index sequences; `used` is their share sum.
  std::function<void(size_t, int64_t)> visit = [&](size_t from, int64_t used) {
    ++multisets;
    bool any_tight = false;
    for (size_t e = 0; e < sum_u.size(); ++e) {
      if (sum_u[e] > 1000 && violations++ == 0) {
        first_violation =
            "e=" + std::to_string(kDffEpsilonsMilli[e]) + " on " + ::testing::PrintToString(chosen);
      }
      any_tight = any_tight || sum_u[e] == 1000;
    }
    if (any_tight) ++tight;
    for (size_t i = from; i < shares.size(); ++i) {
      if (used + shares[i] > 1000) break;  // shares are sorted
      chosen.push_back(shares[i]);
      for (size_t e = 0; e < sum_u.size(); ++e) sum_u[e] += DffValue(kDffEpsilonsMilli[e], shares[i]);
      visit(i, used + shares[i]);
      for (size_t e = 0; e < sum_u.size(); ++e) sum_u[e] -= DffValue(kDffEpsilonsMilli[e], shares[i]);
      chosen.pop_back();
    }
  };
  visit(0, 0);
  EXPECT_EQ(violations, 0) << first_violation;
  EXPECT_GT(multisets, 1000);
  EXPECT_GT(tight, 0);
  // The function itself, at its thresholds.
  EXPECT_EQ(DffValue(0, 600), 600);
  EXPECT_EQ(DffValue(0, 1000), 1000);
  EXPECT_EQ(DffValue(400, 600), 600);   // 1000 - e is still "s"
  EXPECT_EQ(DffValue(400, 601), 1000);  // above 1000 - e: a whole GPU
  EXPECT_EQ(DffValue(400, 400), 400);
  EXPECT_EQ(DffValue(400, 399), 0);  // below e: nothing
  EXPECT_EQ(DffValue(500, 500), 500);
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
  ASSERT_TRUE(FillBoundResult(nodes, arrivals, {}, r).ok());
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
  ASSERT_TRUE(FillBoundResult(nodes, {&whole, &whole}, {500, 500}, ex).ok());
  EXPECT_EQ(ex.arrived_gpu_milli, 1000);
  EXPECT_EQ(ex.alloc[50], 100.0);
  EXPECT_EQ(ex.alloc[100], 100.0);
  EXPECT_FALSE(FillBoundResult(nodes, {&whole, &whole}, {500}, ex).ok());  // one demand per pod
  // Nothing that takes GPU share (CPU-only pods, no pods): 0, not a GLPK abort.
  const TaskRequest cpu_only = Pod(1, 1, 0, 0);
  ExperimentResult none;
  ASSERT_TRUE(FillBoundResult(nodes, {&cpu_only, &cpu_only}, {}, none).ok());
  EXPECT_EQ(none.alloc[0], 0.0);
  EXPECT_TRUE(std::isnan(none.alloc[2]));
  ASSERT_TRUE(FillBoundResult(nodes, {}, {}, none).ok());
  EXPECT_TRUE(std::isnan(none.alloc[0]));
  EXPECT_FALSE(FillBoundResult({Node("cpu", 8, 8, 0, "")}, {&pod}, {}, none).ok());  // no GPUs
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
  o.policy = "bound";
  auto bound = RunExperiment(*inputs, o);
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  o.policy = "fgd";
  auto fgd = RunExperiment(*inputs, o);
  ASSERT_TRUE(fgd.ok()) << fgd.status().ToString();
  EXPECT_EQ(bound->policy, "bound");
  EXPECT_EQ(bound->total_gpus, 6212);
  EXPECT_EQ(bound->pods_arrived, fgd->pods_arrived);
  EXPECT_EQ(bound->arrived_gpu_milli, fgd->arrived_gpu_milli);
  for (int c = 0; c < kDemandBins; ++c) {
    const auto cell = static_cast<size_t>(c);
    EXPECT_GE(bound->alloc[cell], fgd->alloc[cell]) << "column " << c;
    EXPECT_LE(bound->alloc[cell], 100.0) << "column " << c;
    EXPECT_LE(bound->alloc[cell], static_cast<double>(c) + 0.5) << "column " << c;  // the arrived demand
  }
  EXPECT_GE(bound->alloc[130], fgd->alloc[130]);
  RecordProperty("bound_130", std::to_string(bound->alloc[130]));
  RecordProperty("fgd_130", std::to_string(fgd->alloc[130]));
  std::printf("default/42: bound@130 %.2f (%.2f s), fgd@130 %.2f (%.2f s)\n", bound->alloc[130],
              bound->seconds, fgd->alloc[130], fgd->seconds);
}

}  // namespace
}  // namespace gpupool
