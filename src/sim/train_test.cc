// Training the balanced policy's weights (sim/train.h) on a small cluster and trace written here:
// the result is never worse than the start on the training runs, training is deterministic, the
// default weights are the hand-made policy, and the written profile reproduces the trained figure.
#include "sim/train.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>

#include "config/profile_yaml.h"
#include "sim/experiment.h"

namespace gpupool {
namespace {

// Eight GPU nodes of three shapes and 60 pods: whole GPUs, shares of 0.3, 0.5 and 0.8, two 2-GPU
// pods and CPU-only pods, with CPU and memory that vary, so the weights change placements.
std::string MakeTraceDir() {
  // One directory per test process: ctest runs every test as its own process, in parallel, and
  // gtest's random seed (the time in ms) is the same for two that start together.
  const auto dir = std::filesystem::temp_directory_path() /
                   ("gpupool_train_test_" + std::to_string(::getpid()) + "_" +
                    std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream nodes(dir / "openb_node_list_gpu_node.csv");
  nodes << "sn,cpu_milli,memory_mib,gpu,model\n";
  for (int i = 0; i < 8; ++i) {
    const int gpus = i % 3 == 0 ? 8 : i % 3 == 1 ? 4 : 2;
    const int cpu = i % 3 == 0 ? 64000 : i % 3 == 1 ? 48000 : 16000;
    nodes << "node-" << i << "," << cpu << "," << 262144 << "," << gpus << ",T4\n";
  }
  std::ofstream pods(dir / "openb_pod_list_small.csv");
  pods << "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n";
  for (int i = 0; i < 60; ++i) {
    const int kind = i % 6;
    const int cpu = 2000 + 2000 * (i % 5);
    const int mem = 4096 * (1 + i % 4);
    int num_gpu = 1, milli = 1000;
    if (kind == 1) milli = 300;
    if (kind == 2) milli = 500;
    if (kind == 3) milli = 800;
    if (kind == 4) num_gpu = i % 12 == 4 ? 2 : 1;
    if (kind == 5) num_gpu = 0, milli = 0;
    pods << "pod-" << i << "," << cpu << "," << mem << "," << num_gpu << "," << milli << "\n";
  }
  return dir.string();
}

// The mean allocation at 130 % of `policy` (run with `profile` when given) on the small trace.
Result<double> MeanAlloc130(const std::string& dir, const std::vector<uint64_t>& seeds,
                            const std::string& policy, const std::optional<Profile>& profile) {
  ASSIGN_OR_RETURN(auto inputs, LoadExperimentInputs(dir + "/openb_node_list_gpu_node.csv",
                                                     dir + "/openb_pod_list_small.csv"));
  double sum = 0;
  for (uint64_t seed : seeds) {
    ExperimentOptions e;
    e.trace = "small";
    e.policy = policy;
    e.seed = seed;
    e.profile = profile;
    ASSIGN_OR_RETURN(const ExperimentResult run, RunExperiment(inputs, e));
    if (run.policy != policy) return Status::Internal("the result names policy '" + run.policy + "'");
    sum += run.alloc[130];
  }
  return sum / static_cast<double>(seeds.size());
}

TrainOptions SmallOptions(const std::string& dir) {
  TrainOptions o;
  o.traces_dir = dir;
  o.traces = {"small"};
  o.seeds = {1, 2};
  o.generations = 3;
  o.pairs = 2;
  o.sigma = 0.5;
  o.learning_rate = 0.5;
  o.jobs = 2;
  return o;
}

TEST(TrainTest, KeepsTheBestWeightsSeenAndIsDeterministic) {
  const std::string dir = MakeTraceDir();
  const TrainOptions o = SmallOptions(dir);
  std::vector<TrainGeneration> seen;
  auto r = TrainBalancedWeights(o, [&](const TrainGeneration& g) { seen.push_back(g); });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->generations.size(), 4u);  // generations 0..3: theta is run once more after the last step
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(r->runs, (1 + 2 * 2) * 3 * 2 + 2);  // candidates x generations x runs each, plus the final theta
  EXPECT_GE(r->best_objective, r->start_objective);
  double best = r->start_objective;
  for (const TrainGeneration& g : r->generations) {
    best = std::max(best, g.objective);
    EXPECT_EQ(g.best, best) << "generation " << g.generation;
  }
  EXPECT_EQ(r->best_objective, best);

  // The start is the hand-made policy: its objective is plain balanced's on the same runs.
  auto plain = MeanAlloc130(dir, o.seeds, "balanced", std::nullopt);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_DOUBLE_EQ(r->start_objective, *plain);

  // The same options give the same weights, with one worker or two.
  TrainOptions one = o;
  one.jobs = 1;
  auto again = TrainBalancedWeights(one);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->best_objective, r->best_objective);
  BalancedWeights a = r->weights, b = again->weights;
  const auto fa = a.Fields(), fb = b.Fields();
  for (size_t i = 0; i < fa.size(); ++i) EXPECT_EQ(*fa[i], *fb[i]) << BalancedWeights::Names()[i];
  std::filesystem::remove_all(dir);
}

TEST(TrainTest, ZeroGenerationsReturnsTheStart) {
  const std::string dir = MakeTraceDir();
  TrainOptions o = SmallOptions(dir);
  o.generations = 0;
  o.start.whole_free = -0.75;
  auto r = TrainBalancedWeights(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->runs, 2);
  EXPECT_EQ(r->weights.whole_free, -0.75);
  EXPECT_EQ(r->best_objective, r->start_objective);
  std::filesystem::remove_all(dir);
}

// The profile file: it parses, names the trained weights exactly, and running it reproduces the
// trained objective.
TEST(TrainTest, TheWrittenProfileRunsTheTrainedWeights) {
  const std::string dir = MakeTraceDir();
  const TrainOptions o = SmallOptions(dir);
  auto r = TrainBalancedWeights(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::string text =
      FormatTrainedProfile(*r, o, "learned-small", "gpupool sim train --trace-list small");
  EXPECT_NE(text.find("# Trained by gpupool sim train"), std::string::npos) << text;
  EXPECT_NE(text.find("--trace-list small"), std::string::npos) << text;
  auto profile = ParseProfileYaml(text, "trained");
  ASSERT_TRUE(profile.ok()) << profile.status().ToString() << "\n" << text;
  EXPECT_EQ(profile->name, "learned-small");
  ASSERT_EQ(profile->scores.size(), 1u);
  EXPECT_EQ(profile->scores[0].name, "balanced");
  EXPECT_EQ(profile->gpu_selector.name, "balanced");
  const Value::Map* args = profile->scores[0].args.AsMap();
  ASSERT_NE(args, nullptr);
  ASSERT_EQ(args->size(), 2u);
  EXPECT_EQ(args->front().first, "adapt");
  EXPECT_EQ(args->front().second.AsBool("adapt").value(), false);
  auto w = BalancedWeights::FromValue(args->back().second);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  BalancedWeights got = *w, want = r->weights;
  const auto fg = got.Fields(), fw = want.Fields();
  for (size_t i = 0; i < fg.size(); ++i) EXPECT_EQ(*fg[i], *fw[i]) << BalancedWeights::Names()[i];

  auto rerun = MeanAlloc130(dir, o.seeds, "learned-small", *profile);
  ASSERT_TRUE(rerun.ok()) << rerun.status().ToString();
  EXPECT_DOUBLE_EQ(*rerun, r->best_objective);
  std::filesystem::remove_all(dir);
}

TEST(TrainTest, BadOptionsAreNamed) {
  const std::string dir = MakeTraceDir();
  auto message = [&](auto change) {
    TrainOptions o = SmallOptions(dir);
    change(o);
    auto r = TrainBalancedWeights(o);
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : r.status().ToString();
  };
  EXPECT_NE(message([](TrainOptions& o) { o.traces.clear(); }).find("no traces"), std::string::npos);
  EXPECT_NE(message([](TrainOptions& o) { o.seeds.clear(); }).find("no seeds"), std::string::npos);
  EXPECT_NE(message([](TrainOptions& o) { o.sigma = 0; }).find("sigma"), std::string::npos);
  EXPECT_NE(message([](TrainOptions& o) { o.learning_rate = -1; }).find("learning rate"), std::string::npos);
  EXPECT_NE(message([](TrainOptions& o) { o.pairs = 0; }).find("pairs"), std::string::npos);
  EXPECT_NE(message([](TrainOptions& o) { o.generations = -1; }).find("generations"), std::string::npos);
  EXPECT_NE(message([](TrainOptions& o) {
              o.traces = {"small", "absent"};
            }).find("trace 'absent'"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gpupool
