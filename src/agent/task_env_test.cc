// The task environment: what a task sees of its allocation, per isolation mode, and the parsing of
// the server's assignments.
#include "agent/task_env.h"

#include <gtest/gtest.h>

#include <string>

namespace gpupool {
namespace {

using nlohmann::json;

// 4 GPUs of 80 GiB; NVLink between (0,1) and (2,3); the pairs under different sockets.
Inventory FourGpus(bool simulated = true) {
  Inventory inv;
  inv.simulated = simulated;
  for (int i = 0; i < 4; ++i) {
    GpuInfo g;
    g.index = i;
    g.uuid = "GPU-test-" + std::to_string(i);
    g.model = "A100-80GB";
    g.memory_bytes = 80LL << 30;
    inv.gpus.push_back(g);
  }
  inv.topology = {{0, 1250, 10, 10}, {1250, 0, 10, 10}, {10, 10, 0, 1250}, {10, 10, 1250, 0}};
  return inv;
}

json RunAssignment(const std::string& isolation, json gpus) {
  return {{"jobId", "j-000000000042"}, {"index", 1}, {"desired", "run"}, {"state", "assigned"},
          {"name", "infer/server-1"}, {"tenant", "vision"}, {"qos", "guaranteed"}, {"isolation", isolation},
          {"command", {"python3", "serve.py"}}, {"env", {{"MODEL", "resnet50"}}}, {"bundle", ""}, {"rootfs", ""},
          {"checkpoint", {{"dir", "/ckpt/r50"}, {"intervalSeconds", 600}}}, {"restarts", 2},
          {"cpu", "2"}, {"memory", "8Gi"}, {"gpus", std::move(gpus)}};
}

Assignment ParseSingle(const json& a) {
  auto parsed = ParseAssignments(json{{"assignments", json::array({a})}});
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  return parsed.ok() ? parsed->front() : Assignment{};
}

std::map<std::string, std::string> Env(const Assignment& a, const Inventory& inv) {
  TaskEnvOptions o;
  o.node = "node-1";
  o.mps_pipe_root = "/var/lib/gpupool/mps";
  auto env = TaskEnvironment(a, inv, o);
  EXPECT_TRUE(env.ok()) << env.status().ToString();
  return env.ok() ? *env : std::map<std::string, std::string>{};
}

TEST(TaskEnvTest, MpsQuarterGpuGetsThreadPercentagePinnedMemoryAndFrameworkCaps) {
  const Assignment a =
      ParseSingle(RunAssignment("mps", json::array({{{"index", 2}, {"uuid", "GPU-test-2"}, {"share", 250}, {"memory", "10Gi"}}})));
  EXPECT_EQ(a.task_id(), "j-000000000042.1");
  EXPECT_EQ(a.cpu_milli, 2000);
  EXPECT_EQ(a.memory_bytes, 8LL << 30);
  auto env = Env(a, FourGpus());
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "GPU-test-2");
  EXPECT_EQ(env["NVIDIA_VISIBLE_DEVICES"], "GPU-test-2");
  EXPECT_EQ(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");
  EXPECT_EQ(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=10240M");
  EXPECT_EQ(env["CUDA_MPS_PIPE_DIRECTORY"], "/var/lib/gpupool/mps/GPU-test-2/pipe");
  EXPECT_EQ(env["GPUPOOL_GPU_MEMORY_FRACTION"], "0.125");
  EXPECT_EQ(env["XLA_PYTHON_CLIENT_MEM_FRACTION"], "0.125");
  EXPECT_EQ(env["TF_FORCE_GPU_ALLOW_GROWTH"], "true");
  EXPECT_EQ(env["GPUPOOL_GPU_SHARES_MILLI"], "250");
  EXPECT_EQ(env["GPUPOOL_GPU_MEMORY_BYTES"], std::to_string(10LL << 30));
  EXPECT_EQ(env["GPUPOOL_CHECKPOINT_DIR"], "/ckpt/r50");
  EXPECT_EQ(env["GPUPOOL_CHECKPOINT_INTERVAL_SECONDS"], "600");
  EXPECT_EQ(env["GPUPOOL_RESTARTS"], "2");
  EXPECT_EQ(env["GPUPOOL_SIMULATED"], "1");
  EXPECT_EQ(env["MODEL"], "resnet50");
  EXPECT_EQ(env.count("NCCL_P2P_LEVEL"), 0u);  // one GPU
}

TEST(TaskEnvTest, WholeGpusGetNoCapsAndNcclLevelFromTheirTopology) {
  auto nvlinked = Env(ParseSingle(RunAssignment(
                          "exclusive", json::array({{{"index", 0}, {"uuid", "GPU-test-0"}, {"share", 1000}},
                                                    {{"index", 1}, {"uuid", "GPU-test-1"}, {"share", 1000}}}))),
                      FourGpus(false));
  EXPECT_EQ(nvlinked["CUDA_VISIBLE_DEVICES"], "GPU-test-0,GPU-test-1");
  EXPECT_EQ(nvlinked["NCCL_P2P_LEVEL"], "NVL");
  EXPECT_EQ(nvlinked["GPUPOOL_NVLINK"], "1");
  EXPECT_EQ(nvlinked.count("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), 0u);
  EXPECT_EQ(nvlinked.count("GPUPOOL_GPU_MEMORY_FRACTION"), 0u);
  EXPECT_EQ(nvlinked.count("GPUPOOL_SIMULATED"), 0u);

  auto across = Env(ParseSingle(RunAssignment(
                        "exclusive", json::array({{{"index", 1}, {"uuid", "GPU-test-1"}, {"share", 1000}},
                                                  {{"index", 2}, {"uuid", "GPU-test-2"}, {"share", 1000}}}))),
                    FourGpus());
  EXPECT_EQ(across["NCCL_P2P_LEVEL"], "SYS");
  EXPECT_EQ(across["GPUPOOL_NVLINK"], "0");
}

TEST(TaskEnvTest, NoGpuMeansNoneVisible) {
  auto env = Env(ParseSingle(RunAssignment("exclusive", json::array())), FourGpus());
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "");
  EXPECT_EQ(env["NVIDIA_VISIBLE_DEVICES"], "void");
}

TEST(TaskEnvTest, MigNamesTheInstance) {
  auto env = Env(ParseSingle(RunAssignment(
                     "mig", json::array({{{"index", 3}, {"uuid", "GPU-test-3"}, {"share", 428}, {"memory", "40Gi"},
                                          {"mig", {{"profileId", 9}, {"start", 4}, {"profile", "3g.40gb"}}}}}))),
                 FourGpus());
  EXPECT_EQ(env["GPUPOOL_MIG_INSTANCES"], "GPU-test-3:3g.40gb@4");
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "GPU-test-3");
}

TEST(TaskEnvTest, TheJobCannotOverrideWhatEnforcesItsAllocation) {
  json a = RunAssignment("exclusive", json::array({{{"index", 0}, {"uuid", "GPU-test-0"}, {"share", 1000}}}));
  a["env"] = {{"CUDA_VISIBLE_DEVICES", "GPU-test-1"}};
  TaskEnvOptions o;
  auto env = TaskEnvironment(ParseSingle(a), FourGpus(), o);
  ASSERT_FALSE(env.ok());
  EXPECT_NE(env.status().message().find("env.CUDA_VISIBLE_DEVICES"), std::string::npos) << env.status().ToString();
}

TEST(TaskEnvTest, AGpuThatIsNotOnTheNodeOrHasAnotherUuidIsRefused) {
  TaskEnvOptions o;
  auto missing = TaskEnvironment(
      ParseSingle(RunAssignment("exclusive", json::array({{{"index", 7}, {"uuid", "GPU-x"}, {"share", 1000}}}))),
      FourGpus(), o);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("GPU 7 is not on this node"), std::string::npos);
  auto other = TaskEnvironment(
      ParseSingle(RunAssignment("exclusive", json::array({{{"index", 0}, {"uuid", "GPU-other"}, {"share", 1000}}}))),
      FourGpus(), o);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("the server says GPU-other"), std::string::npos);
}

TEST(TaskEnvTest, BadAssignmentsNameTheField) {
  struct Case {
    json body;
    std::string want;
  };
  json bad_share = RunAssignment("mps", json::array({{{"index", 0}, {"share", 1500}}}));
  json bad_id = RunAssignment("mps", json::array());
  bad_id["jobId"] = "../../etc";
  json bad_desired = RunAssignment("mps", json::array());
  bad_desired["desired"] = "maybe";
  const std::vector<Case> cases = {
      {json::array(), "assignments: the answer must be an object"},
      {{{"assignments", {bad_share}}}, "assignments[0].gpus[0].share: must be 0..1000"},
      {{{"assignments", {bad_id}}}, "assignments[0].jobId: must be 1-64 of"},
      {{{"assignments", {bad_desired}}}, "assignments[0].desired: must be run or stop"},
      {{{"assignments", {{{"index", 0}, {"desired", "run"}}}}}, "assignments[0].jobId: missing"},
  };
  for (const Case& c : cases) {
    auto r = ParseAssignments(c.body);
    ASSERT_FALSE(r.ok()) << c.body.dump();
    EXPECT_NE(r.status().message().find(c.want), std::string::npos) << r.status().ToString();
  }
  // A stop needs only its identity and grace period.
  auto stop = ParseAssignments(
      json{{"assignments", {{{"jobId", "j-1"}, {"index", 0}, {"desired", "stop"}, {"gracePeriodSeconds", 7}}}}});
  ASSERT_TRUE(stop.ok()) << stop.status().ToString();
  EXPECT_EQ(stop->front().grace_period_seconds, 7);
}

}  // namespace
}  // namespace gpupool
