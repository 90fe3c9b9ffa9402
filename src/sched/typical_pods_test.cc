// Typical pods (README §5): key = (cpu, per-GPU share, GPU count, model list joined by '|'), sorted
// by count descending then key descending, kept until the running count reaches 95% of the tasks,
// weight (count/N)/(cum/N). Checked on hand-made task lists and on the bundled default trace.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <tuple>

#include "sched/test_util.h"
#include "sim/trace.h"

namespace gpupool {
namespace {

using testutil::Task;

std::vector<TaskRequest> Repeat(const TaskRequest& t, int n) {
  return std::vector<TaskRequest>(static_cast<size_t>(n), t);
}

void Append(std::vector<TaskRequest>& to, const std::vector<TaskRequest>& more) {
  to.insert(to.end(), more.begin(), more.end());
}

struct Shape {
  int64_t cpu, share;
  int count;
  std::vector<std::string> models;
  bool operator==(const Shape&) const = default;
};

std::vector<Shape> Shapes(const std::vector<TypicalPod>& pods) {
  std::vector<Shape> out;
  for (const TypicalPod& p : pods) out.push_back({p.cpu, p.share, p.gpu_count, p.models});
  return out;
}

// N = 20 tasks:
//   K1 (1000, 500, 1)  x10      K2 (2000, CPU-only) x4      K3 (1000, 1000, 1) x4
//   K4 (500, 250, 1)   x1       K5 (4000, 250, 1)   x1
// Order: K1 (10); K2 and K3 tie at 4 -> key descending, cpu 2000 > 1000: K2, K3; K4 and K5 tie at
// 1 -> cpu 4000 > 500: K5, K4.
// Running count 10, 14, 18, 19: 19 >= 0.95 * 20 = 19 -> stop after K5; K4 is dropped.
// Weights (count/20)/(19/20): 10/19, 4/19, 4/19, 1/19.
TEST(TypicalPods, OrderCutoffAndWeights) {
  std::vector<TaskRequest> tasks;
  Append(tasks, Repeat(Task().Cpu(500).Gpus(1, 250), 1));
  Append(tasks, Repeat(Task().Cpu(1000).Gpus(1, 1000), 4));
  Append(tasks, Repeat(Task().Cpu(1000).Gpus(1, 500), 10));
  Append(tasks, Repeat(Task().Cpu(4000).Gpus(1, 250), 1));
  Append(tasks, Repeat(Task().Cpu(2000), 4));
  const std::vector<TypicalPod> pods = ComputeTypicalPods(tasks);
  EXPECT_EQ(
      Shapes(pods),
      (std::vector<Shape>{{1000, 500, 1, {}}, {2000, 0, 0, {}}, {1000, 1000, 1, {}}, {4000, 250, 1, {}}}));
  ASSERT_EQ(pods.size(), 4u);
  const double n = 20, cum = 19;
  EXPECT_EQ(pods[0].weight, (10 / n) / (cum / n));
  EXPECT_EQ(pods[1].weight, (4 / n) / (cum / n));
  EXPECT_EQ(pods[2].weight, (4 / n) / (cum / n));
  EXPECT_EQ(pods[3].weight, (1 / n) / (cum / n));
  EXPECT_NEAR(pods[0].weight, 10.0 / 19, 1e-15);
}

// The cutoff is "running count >= 95%": 19 + 1 tasks stop after the first key (19 >= 19), with
// weight (19/20)/(19/20) = 1; 18 + 2 need both (18 < 19), weights 0.9 and 0.1 (cum = N).
TEST(TypicalPods, CutoffIsInclusive) {
  std::vector<TaskRequest> tasks = Repeat(Task().Cpu(1000), 19);
  Append(tasks, Repeat(Task().Cpu(2000), 1));
  std::vector<TypicalPod> pods = ComputeTypicalPods(tasks);
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_EQ(pods[0].cpu, 1000);
  EXPECT_EQ(pods[0].weight, 1.0);

  tasks = Repeat(Task().Cpu(1000), 18);
  Append(tasks, Repeat(Task().Cpu(2000), 2));
  pods = ComputeTypicalPods(tasks);
  ASSERT_EQ(pods.size(), 2u);
  EXPECT_EQ(pods[0].weight, 18.0 / 20);
  EXPECT_EQ(pods[1].weight, 2.0 / 20);
  EXPECT_TRUE(ComputeTypicalPods({}).empty());
}

// Keys with equal counts, all of the same cpu, sorted descending by share, then GPU count, then
// the model list bytewise ("V100M32" > "T4|V100M32" > "T4" > ""). Six keys of one task each: the
// running count reaches 5.7 only with the sixth, so all are kept, weight 1/6 each.
TEST(TypicalPods, KeyOrderOnTies) {
  const std::vector<TaskRequest> tasks = {
      Task().Cpu(1000).Gpus(1, 500), Task().Cpu(1000).Gpus(1, 500).Models({"T4"}),
      Task().Cpu(1000).Gpus(1, 700), Task().Cpu(1000).Gpus(1, 500).Models({"T4", "V100M32"}),
      Task().Cpu(1000).Gpus(2, 500), Task().Cpu(1000).Gpus(1, 500).Models({"V100M32"}),
  };
  const std::vector<TypicalPod> pods = ComputeTypicalPods(tasks);
  EXPECT_EQ(Shapes(pods), (std::vector<Shape>{{1000, 700, 1, {}},
                                              {1000, 500, 2, {}},
                                              {1000, 500, 1, {"V100M32"}},
                                              {1000, 500, 1, {"T4", "V100M32"}},
                                              {1000, 500, 1, {"T4"}},
                                              {1000, 500, 1, {}}}));
  for (const TypicalPod& p : pods) EXPECT_EQ(p.weight, 1.0 / 6);
}

// The model list is part of the key as written, joined by '|': [T4, V100M32] x2, [V100M32, T4] x1
// and [T4, T4] x1 are three keys (order and duplicates kept). Order: the count-2 key, then
// "V100M32|T4" > "T4|T4". Weights 2/4, 1/4, 1/4.
TEST(TypicalPods, ModelListIsPartOfTheKey) {
  const std::vector<TaskRequest> tasks = {
      Task().Cpu(1000).Gpus(1, 500).Models({"T4", "T4"}),
      Task().Cpu(1000).Gpus(1, 500).Models({"T4", "V100M32"}),
      Task().Cpu(1000).Gpus(1, 500).Models({"V100M32", "T4"}),
      Task().Cpu(1000).Gpus(1, 500).Models({"T4", "V100M32"}),
  };
  const std::vector<TypicalPod> pods = ComputeTypicalPods(tasks);
  EXPECT_EQ(Shapes(pods), (std::vector<Shape>{{1000, 500, 1, {"T4", "V100M32"}},
                                              {1000, 500, 1, {"V100M32", "T4"}},
                                              {1000, 500, 1, {"T4", "T4"}}}));
  ASSERT_EQ(pods.size(), 3u);
  EXPECT_EQ(pods[0].weight, 0.5);
  EXPECT_EQ(pods[1].weight, 0.25);
}

// Memory is not part of the key: three tasks differing only in memory are one key of count 3.
TEST(TypicalPods, MemoryIsNotPartOfTheKey) {
  const std::vector<TaskRequest> tasks = {
      Task().Cpu(1000).Mem(1024).Gpus(1, 500),
      Task().Cpu(1000).Mem(4096).Gpus(1, 500),
      Task().Cpu(1000).Mem(65536).Gpus(1, 500),
  };
  const std::vector<TypicalPod> pods = ComputeTypicalPods(tasks);
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_EQ(Shapes(pods), (std::vector<Shape>{{1000, 500, 1, {}}}));
  EXPECT_EQ(pods[0].weight, 1.0);
}

// ---- The bundled default trace (README §5, §8) ----------------------------------------------------

std::vector<TaskRequest> DefaultTrace() {
  auto pods = ReadOpenbPods(std::string(GPUPOOL_DATA_DIR) + "/alibaba/openb_pod_list_default.csv");
  EXPECT_TRUE(pods.ok()) << pods.status().ToString();
  std::vector<TaskRequest> tasks;
  if (!pods.ok()) return tasks;
  for (const TracePod& p : *pods) tasks.push_back(p.request);
  return tasks;
}

// 8152 pods, 91 keys; 35 are kept, covering 7766 pods = 95.26%; the top key (3152 mCPU, 810, 1)
// has 1047 pods: w = (1047/8152)/(7766/8152) = 13.48%.
TEST(TypicalPods, DefaultTrace) {
  const std::vector<TaskRequest> tasks = DefaultTrace();
  ASSERT_EQ(tasks.size(), 8152u);
  using Key = std::tuple<int64_t, int64_t, int, std::vector<std::string>>;
  std::map<Key, int> counts;
  for (const TaskRequest& t : tasks)
    ++counts[Key{t.cpu.units(), t.gpu_share.units(), t.gpu_count, t.gpu_models}];
  EXPECT_EQ(counts.size(), 91u);

  const std::vector<TypicalPod> pods = ComputeTypicalPods(tasks);
  ASSERT_EQ(pods.size(), 35u);
  int covered = 0;
  double weights = 0;
  for (const TypicalPod& p : pods) {
    covered += counts.at(Key{p.cpu, p.share, p.gpu_count, p.models});
    weights += p.weight;
  }
  EXPECT_EQ(covered, 7766);
  EXPECT_NEAR(100.0 * covered / 8152, 95.26, 0.005);
  EXPECT_NEAR(weights, 1.0, 1e-12);
  EXPECT_EQ(Shapes({pods[0]}), (std::vector<Shape>{{3152, 810, 1, {}}}));
  EXPECT_EQ(pods[0].weight, (1047.0 / 8152) / (7766.0 / 8152));
  EXPECT_NEAR(100 * pods[0].weight, 13.48, 0.005);
  // Counts never increase along the list.
  for (size_t i = 1; i < pods.size(); ++i) EXPECT_LE(pods[i].weight, pods[i - 1].weight) << i;
}

// README §8: with these typical pods, the empty Alibaba cluster (1213 GPU nodes, 6212 GPUs) already
// has F = 13.94% of its capacity — the CPU-only typical pods count every idle GPU as fragment.
TEST(TypicalPods, EmptyAlibabaClusterFragment) {
  const std::vector<TypicalPod> pods = ComputeTypicalPods(DefaultTrace());
  Ledger ledger;
  auto nodes = ReadOpenbNodes(std::string(GPUPOOL_DATA_DIR) + "/alibaba/openb_node_list_gpu_node.csv",
                              ledger.catalog());
  ASSERT_TRUE(nodes.ok()) << nodes.status().ToString();
  for (NodeSpec& n : *nodes) ASSERT_TRUE(ledger.AddNode(std::move(n)).ok());
  ASSERT_EQ(ledger.node_count(), 1213u);
  const FragmentationModel model(pods);
  const double total = model.ClusterFragment(ledger);
  EXPECT_EQ(ledger.total_gpu_share(), 6212000);
  EXPECT_NEAR(100.0 * total / 6212000, 13.94, 0.005);
}

// The distance between workloads: total variation over the shapes of either.
TEST(TypicalPods, WorkloadDistance) {
  const std::vector<TypicalPod> a = {testutil::Typical(1000, 500, 1, 0.5), testutil::Typical(2000, 0, 0, 0.5)};
  EXPECT_EQ(WorkloadDistance(a, a), 0.0);
  // The same shapes in another order are the same workload.
  EXPECT_EQ(WorkloadDistance(a, {a[1], a[0]}), 0.0);
  // 0.5/0.5 against 0.6/0.4: |0.1| + |0.1|, halved.
  EXPECT_NEAR(WorkloadDistance(a, {testutil::Typical(1000, 500, 1, 0.6), testutil::Typical(2000, 0, 0, 0.4)}), 0.1,
              1e-12);
  // No shape in common: 1. A shape differing only in its models or GPU count is another shape.
  EXPECT_NEAR(WorkloadDistance(a, {testutil::Typical(1000, 500, 1, 0.5, {"T4"}), testutil::Typical(2000, 0, 0, 0.5)}),
              0.5, 1e-12);
  EXPECT_NEAR(WorkloadDistance(a, {testutil::Typical(1000, 500, 2, 1.0)}), 1.0, 1e-12);
  // Against nothing: half the weight there is.
  EXPECT_NEAR(WorkloadDistance(a, {}), 0.5, 1e-12);
}

}  // namespace
}  // namespace gpupool

namespace gpupool {
namespace {
using testutil::Typical;

// Counting shapes first (what a plugin learning online keeps) gives the very same typical
// workload as counting tasks: the tasks of KeyOrderOnTies plus repeats, in any shape order.
TEST(TypicalPods, FromCountsMatchesFromTasks) {
  std::vector<TaskRequest> tasks = Repeat(Task().Cpu(1000).Gpus(1, 500), 7);
  Append(tasks, Repeat(Task().Cpu(2000), 3));
  Append(tasks, Repeat(Task().Cpu(1000).Gpus(1, 500).Models({"T4"}), 3));
  Append(tasks, Repeat(Task().Cpu(1000).Gpus(2, 1000), 1));
  const std::vector<TypicalPod> from_tasks = ComputeTypicalPods(tasks, 0.9);
  std::vector<std::pair<TypicalPod, int64_t>> shapes = {
      {Typical(1000, 1000, 2, 0), 1},
      {Typical(2000, 0, 0, 0), 3},
      {Typical(1000, 500, 1, 0, {"T4"}), 3},
      {Typical(1000, 500, 1, 0), 7},
  };
  const std::vector<TypicalPod> from_counts = TypicalPodsFromCounts(shapes, 0.9);
  ASSERT_EQ(from_counts.size(), from_tasks.size());
  for (size_t i = 0; i < from_tasks.size(); ++i) {
    EXPECT_EQ(from_counts[i].cpu, from_tasks[i].cpu) << i;
    EXPECT_EQ(from_counts[i].share, from_tasks[i].share) << i;
    EXPECT_EQ(from_counts[i].gpu_count, from_tasks[i].gpu_count) << i;
    EXPECT_EQ(from_counts[i].models, from_tasks[i].models) << i;
    EXPECT_EQ(from_counts[i].weight, from_tasks[i].weight) << i;
  }
  EXPECT_TRUE(TypicalPodsFromCounts({}).empty());
}
}  // namespace
}  // namespace gpupool
