#include "sim/trace.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace gpupool {
namespace {

// Each test runs in a process of its own (ctest, in parallel): the pid keeps their files apart.
// They are removed when the process ends.
struct TempFiles {
  std::vector<std::string> paths;
  ~TempFiles() {
    for (const std::string& p : paths) std::remove(p.c_str());
  }
};
TempFiles temp_files;

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + std::to_string(::getpid()) + "-" + name;
  std::ofstream(path) << text;
  temp_files.paths.push_back(path);
  return path;
}

const std::string kData = std::string(GPUPOOL_DATA_DIR) + "/alibaba/";

TEST(TraceTest, ReadsTheBundledCluster) {
  auto nodes = ReadOpenbNodes(kData + "openb_node_list_gpu_node.csv", GpuCatalog::Builtin());
  ASSERT_TRUE(nodes.ok()) << nodes.status().ToString();
  // README: 1,213 nodes, 6,212 GPUs, 107,018,000 mCPU.
  EXPECT_EQ(nodes->size(), 1213u);
  size_t gpus = 0;
  int64_t cpu = 0;
  for (const auto& n : *nodes) {
    gpus += n.gpus.size();
    cpu += n.cpu.units();
    EXPECT_EQ(n.max_tasks, 1001);
  }
  EXPECT_EQ(gpus, 6212u);
  EXPECT_EQ(cpu, 107018000);
}

TEST(TraceTest, ReadsTheBundledPods) {
  auto pods = ReadOpenbPods(kData + "openb_pod_list_default.csv");
  ASSERT_TRUE(pods.ok()) << pods.status().ToString();
  EXPECT_EQ(pods->size(), 8152u);
  // README §2: the default trace's GPU demand is 6,086,800 milli-GPU.
  EXPECT_EQ(GpuDemand(*pods), 6086800);
  EXPECT_EQ((*pods)[1].name, "openb-pod-0001");
  EXPECT_EQ((*pods)[1].request.gpu_share.units(), 460);
}

TEST(TraceTest, SplitsModelSpecsAndClampsShares) {
  const auto path = WriteTemp("pods.csv",
                              "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
                              "p0,1000,2048,1,1500,V100M16|V100M32|V100M32\n"
                              "p1,2000,1024,0,0,\n"
                              "p2,2000,1024,2,1000,|T4|\n");
  auto pods = ReadOpenbPods(path);
  ASSERT_TRUE(pods.ok()) << pods.status().ToString();
  ASSERT_EQ(pods->size(), 3u);
  EXPECT_EQ((*pods)[0].request.gpu_share.units(), 1000);  // clamped
  EXPECT_EQ((*pods)[0].request.gpu_models, (std::vector<std::string>{"V100M16", "V100M32", "V100M32"}));
  EXPECT_FALSE((*pods)[1].request.wants_gpu());
  EXPECT_EQ((*pods)[2].request.gpu_models, (std::vector<std::string>{"T4"}));  // empty tokens dropped
}

TEST(TraceTest, BadRowsNameFileLineAndReason) {
  struct Case {
    const char* text;
    const char* expect;
  };
  const Case cases[] = {
      {"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,x,1,500\n",
       "pods.csv:2: column 'memory_mib' is not an integer"},
      {"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,10,1,500\np1,1000,10,1\n",
       "pods.csv:3: 4 fields, header has 5"},
      {"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,10,0,500\n",
       "pods.csv:2: a pod with num_gpu 0 has gpu_milli set"},
      {"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,-5,10,1,500\n",
       "pods.csv:2: cpu_milli and memory_mib must be 0..2^40 and num_gpu 0..1024"},
      {"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,10,4294967297,500\n",
       "pods.csv:2: cpu_milli and memory_mib must be 0..2^40 and num_gpu 0..1024"},
      {"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,9223372036854775807,10,1,500\n",
       "pods.csv:2: cpu_milli and memory_mib must be 0..2^40"},
      {"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,10,1,500,,,,\n", "pods.csv:2: 9 fields, header has 5"},
      {"name,cpu_milli,memory_mib,num_gpu\np0,1000,10,1\n", "pods.csv:1: header has no column 'gpu_milli'"},
      {"", "empty file"},
  };
  for (const auto& c : cases) {
    auto pods = ReadOpenbPods(WriteTemp("pods.csv", c.text));
    ASSERT_FALSE(pods.ok()) << c.text;
    EXPECT_NE(pods.status().message().find(c.expect), std::string::npos) << pods.status().message();
  }
  auto nodes = ReadOpenbNodes(WriteTemp("nodes.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,1000,10,2,\n"),
                              GpuCatalog::Builtin());
  ASSERT_FALSE(nodes.ok());
  EXPECT_NE(nodes.status().message().find("nodes.csv:2: a node with GPUs needs a model"), std::string::npos);
  auto missing = ReadOpenbPods("/nonexistent.csv");
  EXPECT_EQ(missing.status().code(), StatusCode::kIoError);
}

TEST(TraceTest, PrepareWorkloadReachesTheTargetDemand) {
  auto pods = ReadOpenbPods(kData + "openb_pod_list_default.csv");
  ASSERT_TRUE(pods.ok());
  SeededRng rng(42);
  const int64_t capacity = 6212000;
  auto w = PrepareWorkload(*pods, capacity, 1.3, rng);
  const int64_t target = 8075600;
  const int64_t demand = GpuDemand(w);
  // Stops at the first draw whose per-GPU share would overshoot: at most one 1000-milli step
  // short, and at most 7 x 1000 above (an 8-GPU copy added just under the target).
  EXPECT_LE(demand, target + 7000);
  EXPECT_GT(demand, target - 1000);
  EXPECT_GT(w.size(), pods->size());
  EXPECT_NE(w.back().name.find("-tuned-"), std::string::npos);
  // Every original pod is still there exactly once, just shuffled.
  size_t originals = 0;
  for (const auto& p : w) originals += p.name.find("-tuned-") == std::string::npos;
  EXPECT_EQ(originals, pods->size());
  // Deterministic by seed.
  SeededRng again(42);
  auto w2 = PrepareWorkload(*pods, capacity, 1.3, again);
  ASSERT_EQ(w.size(), w2.size());
  EXPECT_EQ(w.front().name, w2.front().name);

  // Shrinking: a target below the demand drops random pods until demand <= target.
  SeededRng shrink(1);
  auto small = PrepareWorkload(*pods, capacity, 0.5, shrink);
  EXPECT_LE(GpuDemand(small), capacity / 2);
  EXPECT_LT(small.size(), pods->size());
}

}  // namespace
}  // namespace gpupool
