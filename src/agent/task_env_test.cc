// The task environment: what a task sees of its allocation, per isolation mode, and the parsing of
// the server's assignments.
#include "agent/task_env.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

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

TEST(TaskEnvTest, MpsLimitsAreTheSmallestShareInPercentAndEachGpusMemory) {
  const Assignment a = ParseSingle(RunAssignment(
      "mps", json::array({{{"index", 0}, {"share", 500}, {"memory", "20Gi"}}, {{"index", 1}, {"share", 333}},
                          {{"index", 2}, {"share", 4}, {"memory", "1Mi"}}})));
  const MpsTaskLimits limits = TaskMpsLimits(a);
  EXPECT_EQ(limits.active_thread_percentage, 1);  // 0.4 % rounds to 0: at least 1
  EXPECT_EQ(limits.pinned_mem_mib, (std::vector<int64_t>{20480, 0, 1}));
  auto env = Env(a, FourGpus());
  EXPECT_EQ(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "1");
  EXPECT_EQ(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=20480M,2=1M");
  EXPECT_EQ(TaskMpsLimits(ParseSingle(RunAssignment("mps", json::array({{{"index", 0}, {"share", 335}}}))))
                .active_thread_percentage,
            34);
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

json MigGpu(int index, const std::string& profile, int profile_id, int start) {
  return {{"index", index},
          {"uuid", "GPU-test-" + std::to_string(index)},
          {"share", 428},
          {"memory", "40Gi"},
          {"mig", {{"profileId", profile_id}, {"start", start}, {"profile", profile}}}};
}

// Real (NVML) GPUs with minors 0..3; GPU 3 and GPU 2 in MIG mode with existing instances.
Inventory RealMigGpus() {
  Inventory inv = FourGpus(false);
  for (GpuInfo& g : inv.gpus) g.minor_number = g.index;
  GpuInfo& g2 = inv.gpus[2];
  g2.mig_enabled = true;
  g2.mig_instances = {
      {.uuid = "MIG-two-a",
       .profile_id = 19,
       .profile = "1g.10gb",
       .start = 0,
       .size = 1,
       .gpu_instance_id = 7,
       .compute_instance_id = 0},
      {.uuid = "MIG-two-b",
       .profile_id = 9,
       .profile = "3g.40gb",
       .start = 4,
       .size = 4,
       .gpu_instance_id = 2,
       .compute_instance_id = 0},
  };
  GpuInfo& g3 = inv.gpus[3];
  g3.mig_enabled = true;
  g3.mig_instances = {
      {.uuid = "MIG-three-a",
       .profile_id = 19,
       .profile = "1g.10gb",
       .start = 4,
       .size = 1,
       .gpu_instance_id = 9,
       .compute_instance_id = 0},
      // Two compute instances in one GPU instance: the lower compute instance id is taken.
      {.uuid = "MIG-three-b",
       .profile_id = 9,
       .profile = "3g.40gb",
       .start = 0,
       .size = 4,
       .gpu_instance_id = 1,
       .compute_instance_id = 1},
      {.uuid = "MIG-three-c",
       .profile_id = 9,
       .profile = "3g.40gb",
       .start = 0,
       .size = 4,
       .gpu_instance_id = 1,
       .compute_instance_id = 0},
  };
  return inv;
}

TEST(TaskEnvTest, MigOnSimulatedGpusGetsASyntheticInstanceUuid) {
  const Assignment a = ParseSingle(RunAssignment("mig", json::array({MigGpu(3, "3g.40gb", 9, 4)})));
  ASSERT_EQ(a.gpus.size(), 1u);
  EXPECT_EQ(a.gpus[0].mig_profile_id, 9);
  EXPECT_EQ(a.gpus[0].mig_start, 4);
  auto env = Env(a, FourGpus());
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "MIG-sim-node-1-3-3g.40gb@4");
  EXPECT_EQ(env["NVIDIA_VISIBLE_DEVICES"], "MIG-sim-node-1-3-3g.40gb@4");
  EXPECT_EQ(env["GPUPOOL_MIG_INSTANCES"], "GPU-test-3:3g.40gb@4:MIG-sim-node-1-3-3g.40gb@4");
  EXPECT_EQ(env["GPUPOOL_GPU_UUIDS"], "GPU-test-3");
  EXPECT_EQ(env["GPUPOOL_SIMULATED"], "1");
}

TEST(TaskEnvTest, MigOnRealGpusSeesExactlyItsExistingInstances) {
  const Inventory inv = RealMigGpus();
  const Assignment a = ParseSingle(
      RunAssignment("mig", json::array({MigGpu(2, "3g.40gb", 9, 4), MigGpu(3, "3g.40gb", 9, 0)})));
  auto env = Env(a, inv);
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "MIG-two-b,MIG-three-c");
  EXPECT_EQ(env["NVIDIA_VISIBLE_DEVICES"], "MIG-two-b,MIG-three-c");
  EXPECT_EQ(env["GPUPOOL_MIG_INSTANCES"], "GPU-test-2:3g.40gb@4:MIG-two-b,GPU-test-3:3g.40gb@0:MIG-three-c");
  EXPECT_EQ(env["GPUPOOL_GPU_UUIDS"], "GPU-test-2,GPU-test-3");
  EXPECT_EQ(env.count("GPUPOOL_SIMULATED"), 0u);

  // The driver's own name for a profile may differ from the server's: the profile id decides.
  Inventory renamed = inv;
  renamed.gpus[2].mig_instances[1].profile = "3g.39gb";
  auto by_id = Env(ParseSingle(RunAssignment("mig", json::array({MigGpu(2, "3g.40gb", 9, 4)}))), renamed);
  EXPECT_EQ(by_id["CUDA_VISIBLE_DEVICES"], "MIG-two-b");
  // Without a profile id, the name does.
  json no_id = MigGpu(3, "1g.10gb", 0, 4);
  no_id["mig"].erase("profileId");
  auto by_name = Env(ParseSingle(RunAssignment("mig", json::array({no_id}))), inv);
  EXPECT_EQ(by_name["CUDA_VISIBLE_DEVICES"], "MIG-three-a");
}

TEST(TaskEnvTest, MigWithoutAMatchingInstanceOnRealGpusIsAClearError) {
  TaskEnvOptions o;
  o.node = "node-1";
  const Inventory inv = RealMigGpus();
  auto missing =
      TaskEnvironment(ParseSingle(RunAssignment("mig", json::array({MigGpu(2, "3g.40gb", 9, 0)}))), inv, o);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(missing.status().message(),
            "GPU 2 (GPU-test-2) has no MIG instance of profile 3g.40gb at slice 0 (existing: 1g.10gb@0, "
            "3g.40gb@4); the agent creates missing instances only when a task starts");
  // Same start, other profile: no match either.
  auto other_profile =
      TaskEnvironment(ParseSingle(RunAssignment("mig", json::array({MigGpu(2, "1g.10gb", 19, 4)}))), inv, o);
  ASSERT_FALSE(other_profile.ok());
  EXPECT_NE(other_profile.status().message().find("no MIG instance of profile 1g.10gb at slice 4"),
            std::string::npos)
      << other_profile.status().message();

  Inventory none = inv;
  none.gpus[2].mig_instances.clear();
  auto empty =
      TaskEnvironment(ParseSingle(RunAssignment("mig", json::array({MigGpu(2, "3g.40gb", 9, 4)}))), none, o);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("(existing: none)"), std::string::npos) << empty.status().message();

  auto not_mig =
      TaskEnvironment(ParseSingle(RunAssignment("mig", json::array({MigGpu(1, "3g.40gb", 9, 4)}))), inv, o);
  ASSERT_FALSE(not_mig.ok());
  EXPECT_NE(not_mig.status().message().find("GPU 1 (GPU-test-1) is not in MIG mode"), std::string::npos)
      << not_mig.status().message();

  json no_profile = MigGpu(2, "3g.40gb", 9, 4);
  no_profile.erase("mig");
  for (const Inventory& where : {inv, FourGpus()}) {
    auto unnamed = TaskEnvironment(ParseSingle(RunAssignment("mig", json::array({no_profile}))), where, o);
    ASSERT_FALSE(unnamed.ok());
    EXPECT_NE(
        unnamed.status().message().find("isolation mig needs the instance's MIG profile and start slice"),
        std::string::npos)
        << unnamed.status().message();
  }
}

constexpr const char* kMigMinors =
    "config 1\n"
    "monitor 2\n"
    "gpu0/gi1/access 12\n"
    "gpu0/gi1/ci0/access 13\n"
    "gpu2/gi2/access 21\n"
    "gpu2/gi2/ci0/access 22\n"
    "gpu3/gi1/access 30\n"
    "gpu3/gi1/ci0/access 31\n"
    "gpu3/gi1/ci1/access 32\n"
    "gpu13/gi1/access 99\n";

TEST(TaskEnvTest, MigCapDevicesFromMigMinors) {
  auto caps = MigCapDevices(kMigMinors, 3, 1, 1);
  ASSERT_TRUE(caps.ok()) << caps.status().ToString();
  EXPECT_EQ(*caps,
            (std::vector<std::string>{"/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap32"}));
  auto first = MigCapDevices("gpu0/gi1/access   12\r\ngpu0/gi1/ci0/access\t13", 0, 1, 0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(*first,
            (std::vector<std::string>{"/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"}));

  auto missing = MigCapDevices(kMigMinors, 1, 1, 0);  // "gpu13/..." is not "gpu1/..."
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("gpu1/gi1/access"), std::string::npos)
      << missing.status().message();
  auto no_ci = MigCapDevices(kMigMinors, 3, 1, 2);
  ASSERT_FALSE(no_ci.ok());
  EXPECT_NE(no_ci.status().message().find("gpu3/gi1/ci2/access"), std::string::npos)
      << no_ci.status().message();
  auto bad = MigCapDevices("gpu0/gi1/access x12\n", 0, 1, 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(MigCapDevices(kMigMinors, -1, 1, 0).ok());

  // A task's caps: its instances' GPU and compute instances, on real GPUs only.
  const Assignment a = ParseSingle(
      RunAssignment("mig", json::array({MigGpu(2, "3g.40gb", 9, 4), MigGpu(3, "3g.40gb", 9, 0)})));
  auto task = TaskMigCapDevices(a, RealMigGpus(), kMigMinors);
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  EXPECT_EQ(*task,
            (std::vector<std::string>{"/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22",
                                      "/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31"}));
  auto simulated = TaskMigCapDevices(a, FourGpus(), kMigMinors);
  ASSERT_TRUE(simulated.ok());
  EXPECT_TRUE(simulated->empty());
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
  // A stop entry is read whole: a forged run count or grace period is refused there too.
  json bad_restarts = RunAssignment("mps", json::array());
  bad_restarts["desired"] = "stop";
  bad_restarts["restarts"] = -1;
  json huge_restarts = RunAssignment("mps", json::array());
  huge_restarts["restarts"] = int64_t{1} << 40;
  json huge_grace = RunAssignment("mps", json::array());
  huge_grace["desired"] = "stop";
  huge_grace["gracePeriodSeconds"] = int64_t{1} << 40;
  json negative_grace = RunAssignment("mps", json::array());
  negative_grace["gracePeriodSeconds"] = -5;
  json relative_dir = RunAssignment("mps", json::array());
  relative_dir["workingDir"] = "data";
  json long_dir = RunAssignment("mps", json::array());
  long_dir["workingDir"] = "/" + std::string(5000, 'a');
  // An image reaches skopeo's command line: the agent checks it as the server did.
  json option_image = RunAssignment("mps", json::array());
  option_image["image"] = "oci:/srv/-x";
  json image_and_rootfs = RunAssignment("mps", json::array());
  image_and_rootfs["image"] = "oci:/srv/i:v1";
  image_and_rootfs["rootfs"] = "/srv/r";
  json bad_class = RunAssignment("mps", json::array());
  bad_class["runtimeClass"] = "docker";
  // Volumes as the job spec reads them: containers only, normalised paths, none over the checkpoint.
  json process_volume = RunAssignment("mps", json::array());
  process_volume["volumes"] = json::array({{{"hostPath", "/etc"}}});
  json sneaky_volume = RunAssignment("mps", json::array());
  sneaky_volume["rootfs"] = "/srv/r";
  sneaky_volume["volumes"] = json::array({{{"hostPath", "/srv/data/../../etc"}}});
  json ckpt_volume = RunAssignment("mps", json::array());
  ckpt_volume["rootfs"] = "/srv/r";
  ckpt_volume["checkpoint"] = {{"dir", "/ck/job"}};
  ckpt_volume["volumes"] = json::array({{{"hostPath", "/srv/x"}, {"mountPath", "/ck"}}});
  // The network: a container's, one of three.
  json process_pod = RunAssignment("mps", json::array());
  process_pod["network"] = "pod";
  json bridge = RunAssignment("mps", json::array());
  bridge["rootfs"] = "/srv/r";
  bridge["network"] = "bridge";
  const std::vector<Case> cases = {
      {{{"assignments", {process_pod}}}, "assignments[0].network: is for containers (bundle, rootfs or image) only"},
      {{{"assignments", {bridge}}}, "assignments[0].network: must be none, pod or host"},
      {{{"assignments", {process_volume}}}, "assignments[0].volumes: need a container"},
      {{{"assignments", {sneaky_volume}}}, "assignments[0].volumes[0].hostPath: must be a normalised path"},
      {{{"assignments", {ckpt_volume}}}, "assignments[0].volumes[0].mountPath: '/ck' overlaps the checkpoint"},
      {json::array(), "assignments: the answer must be an object"},
      {{{"assignments", {option_image}}}, "assignments[0].image: 'oci:/srv/-x': no part of the path may start"},
      {{{"assignments", {image_and_rootfs}}}, "assignments[0].image: goes with neither bundle nor rootfs"},
      {{{"assignments", {bad_class}}}, "assignments[0].runtimeClass: must be runc, crun, runsc or kata"},
      {{{"assignments", {bad_share}}}, "assignments[0].gpus[0].share: must be 0..1000"},
      {{{"assignments", {bad_id}}}, "assignments[0].jobId: must be 1-64 of"},
      {{{"assignments", {bad_desired}}}, "assignments[0].desired: must be run or stop"},
      {{{"assignments", {bad_restarts}}}, "assignments[0].restarts: must be 0..1000000000"},
      {{{"assignments", {huge_restarts}}}, "assignments[0].restarts: must be 0..1000000000"},
      {{{"assignments", {huge_grace}}}, "assignments[0].gracePeriodSeconds: must be 0..86400"},
      {{{"assignments", {negative_grace}}}, "assignments[0].gracePeriodSeconds: must be 0..86400"},
      {{{"assignments", {relative_dir}}}, "assignments[0].workingDir: must be an absolute path"},
      {{{"assignments", {long_dir}}}, "assignments[0].workingDir: must be an absolute path of at most 4096"},
      {{{"assignments", {{{"index", 0}, {"desired", "run"}}}}}, "assignments[0].jobId: missing"},
  };
  for (const Case& c : cases) {
    auto r = ParseAssignments(c.body);
    ASSERT_FALSE(r.ok()) << c.body.dump();
    EXPECT_NE(r.status().message().find(c.want), std::string::npos) << r.status().ToString();
  }
  json pod = RunAssignment("mps", json::array());
  pod["image"] = "oci:/srv/i:v1";
  pod["network"] = "pod";
  EXPECT_EQ(ParseSingle(pod).network, "pod");
  // A stop needs only its identity and grace period.
  auto stop = ParseAssignments(
      json{{"assignments", {{{"jobId", "j-1"}, {"index", 0}, {"desired", "stop"}, {"gracePeriodSeconds", 7}}}}});
  ASSERT_TRUE(stop.ok()) << stop.status().ToString();
  EXPECT_EQ(stop->front().grace_period_seconds, 7);
}

// The framework comes from the server like any other field: one of four names, or none at all.
TEST(TaskEnvTest, AnUnknownFrameworkFromTheServerIsRefused) {
  const json bads[] = {"caffe", "auto", "PyTorch", 7, std::string(5000, 'x')};
  for (const json& bad : bads) {
    json a = RunAssignment("timeslice", json::array({{{"index", 0}, {"share", 500}}}));
    a["framework"] = bad;
    auto r = ParseAssignments(json{{"assignments", {a}}});
    ASSERT_FALSE(r.ok()) << bad.dump().substr(0, 40);
    EXPECT_EQ(r.status().message().rfind("assignments[0].framework: ", 0), 0u) << r.status().ToString();
  }
  json a = RunAssignment("timeslice", json::array({{{"index", 0}, {"share", 500}}}));
  EXPECT_EQ(ParseSingle(a).framework, Framework::kAuto);
  a["framework"] = "jax";
  EXPECT_EQ(ParseSingle(a).framework, Framework::kJax);
}

// A fractional task gets the allocator advice of its framework and no other's; one that names none
// gets all of it, as before frameworks could be named. GPUPOOL_GPU_MEMORY_BYTES is not advice: always.
TEST(TaskEnvTest, EachFrameworkGetsExactlyItsAdvice) {
  const std::string fraction = "0.25";
  const std::string alloc_conf = "expandable_segments:True,garbage_collection_threshold:0.8";
  using Vars = std::map<std::string, std::string>;
  const Vars all = {{"GPUPOOL_GPU_MEMORY_FRACTION", fraction}, {"PYTORCH_CUDA_ALLOC_CONF", alloc_conf},
                    {"TF_FORCE_GPU_ALLOW_GROWTH", "true"},     {"XLA_PYTHON_CLIENT_PREALLOCATE", "false"},
                    {"XLA_PYTHON_CLIENT_MEM_FRACTION", fraction}};
  const struct {
    std::string framework;  // "": not sent
    Vars want;
  } cases[] = {
      {"", all},
      {"pytorch", {{"GPUPOOL_GPU_MEMORY_FRACTION", fraction}, {"PYTORCH_CUDA_ALLOC_CONF", alloc_conf}}},
      {"tensorflow",
       {{"GPUPOOL_GPU_MEMORY_FRACTION", fraction}, {"TF_FORCE_GPU_ALLOW_GROWTH", "true"},
        {"TF_GPU_ALLOCATOR", "cuda_malloc_async"}}},
      {"jax",
       {{"GPUPOOL_GPU_MEMORY_FRACTION", fraction}, {"XLA_PYTHON_CLIENT_PREALLOCATE", "false"},
        {"XLA_PYTHON_CLIENT_MEM_FRACTION", fraction}}},
      {"none", {}},
  };
  const std::vector<std::string> advice = {"GPUPOOL_GPU_MEMORY_FRACTION",   "PYTORCH_CUDA_ALLOC_CONF",
                                           "TF_FORCE_GPU_ALLOW_GROWTH",     "TF_GPU_ALLOCATOR",
                                           "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION"};
  for (const auto& c : cases) {
    for (const std::string isolation : {"timeslice", "mps"}) {
      json a = RunAssignment(isolation, json::array({{{"index", 0}, {"share", 500}, {"memory", "20Gi"}}}));
      if (!c.framework.empty()) a["framework"] = c.framework;
      auto env = Env(ParseSingle(a), FourGpus());
      Vars got;
      for (const std::string& k : advice) {
        if (auto it = env.find(k); it != env.end()) got[k] = it->second;
      }
      EXPECT_EQ(got, c.want) << "framework '" << c.framework << "', " << isolation;
      EXPECT_EQ(env["GPUPOOL_GPU_MEMORY_BYTES"], std::to_string(20LL << 30)) << c.framework;
    }
    // Whole GPUs get no advice, whatever the framework: nothing to keep inside.
    json whole = RunAssignment("exclusive", json::array({{{"index", 0}, {"share", 1000}}}));
    if (!c.framework.empty()) whole["framework"] = c.framework;
    auto env = Env(ParseSingle(whole), FourGpus());
    for (const std::string& k : advice) EXPECT_EQ(env.count(k), 0u) << k << " for '" << c.framework << "'";
  }
}

TEST(TaskEnvTest, AnImagesConfigYieldsToTheTasksAndThePoolsButReplacesTheDefaults) {
  ImageConfig image;
  image.entrypoint = {"/usr/bin/python3", "-u"};
  image.cmd = {"train.py"};
  image.env = {"PATH=/opt/conda/bin:/usr/bin", "HOME=/root", "LANG=C.UTF-8", "CUDA_VISIBLE_DEVICES=0,1,2,3",
               "GPUPOOL_JOB_ID=j-forged", "RANK=9", "FOO=image", "=bad", "NOEQUALS"};
  image.working_dir = "/workspace";
  LaunchSpec spec;
  spec.env = {{"PATH", "/usr/local/bin:/usr/bin:/bin"}, {"HOME", "/tmp"}, {"CUDA_VISIBLE_DEVICES", "2"},
              {"GPUPOOL_JOB_ID", "j-1"}, {"RANK", "0"}, {"FOO", "job"}};
  ApplyImageConfig(image, {{"FOO", "job"}}, &spec);
  EXPECT_EQ(spec.argv, (std::vector<std::string>{"/usr/bin/python3", "-u", "train.py"}));
  EXPECT_EQ(spec.workdir, "/workspace");
  EXPECT_EQ(spec.env["PATH"], "/opt/conda/bin:/usr/bin");  // the default gives way
  EXPECT_EQ(spec.env["HOME"], "/root");
  EXPECT_EQ(spec.env["LANG"], "C.UTF-8");                 // new: taken
  EXPECT_EQ(spec.env["CUDA_VISIBLE_DEVICES"], "2");       // the allocation: never the image's
  EXPECT_EQ(spec.env["GPUPOOL_JOB_ID"], "j-1");
  EXPECT_EQ(spec.env["RANK"], "0");
  EXPECT_EQ(spec.env["FOO"], "job");                      // the job's own wins
  EXPECT_EQ(spec.env.count(""), 0u);
  EXPECT_EQ(spec.env.count("NOEQUALS"), 0u);
  // The task's command replaces entrypoint and cmd; its working directory and PATH stay.
  LaunchSpec own;
  own.argv = {"/bin/sh", "-c", "true"};
  own.workdir = "/srv";
  own.env = {{"PATH", "/mine"}};
  ApplyImageConfig(image, {{"PATH", "/mine"}}, &own);
  EXPECT_EQ(own.argv, (std::vector<std::string>{"/bin/sh", "-c", "true"}));
  EXPECT_EQ(own.workdir, "/srv");
  EXPECT_EQ(own.env["PATH"], "/mine");
}

}  // namespace
}  // namespace gpupool

namespace gpupool {
namespace {

TEST(AssignmentRunId, ARestartIsANewRunOnTheNode) {
  Assignment a;
  a.job_id = "j-000000000042";
  a.index = 3;
  EXPECT_EQ(a.task_id(), "j-000000000042.3");
  EXPECT_EQ(a.run_id(), "j-000000000042.3");
  a.restarts = 2;
  EXPECT_EQ(a.task_id(), "j-000000000042.3");
  EXPECT_EQ(a.run_id(), "j-000000000042.3.r2");
}

}  // namespace
}  // namespace gpupool

namespace gpupool {
namespace {

TEST(TaskEnvTest, ARendezvousGivesTorchJaxAndMpiTheirVariables) {
  json a = RunAssignment("exclusive", json::array({{{"index", 0}, {"uuid", "GPU-test-0"}, {"share", 1000}}}));
  a["rendezvous"] = {{"masterAddr", "node-a"}, {"masterPort", 20042}, {"worldSize", 4}, {"rank", 1},
                     {"localRank", 1}, {"localWorldSize", 2}, {"nodeRank", 0}, {"nodes", 2},
                     {"hosts", {"node-a:2", "node-b:2"}}};
  auto env = Env(ParseSingle(a), FourGpus());
  const std::map<std::string, std::string> want = {
      {"MASTER_ADDR", "node-a"}, {"MASTER_PORT", "20042"}, {"WORLD_SIZE", "4"}, {"RANK", "1"},
      {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}, {"NODE_RANK", "0"}, {"GROUP_RANK", "0"},
      {"JAX_COORDINATOR_ADDRESS", "node-a:20042"}, {"JAX_NUM_PROCESSES", "4"}, {"JAX_PROCESS_ID", "1"},
      {"GPUPOOL_NNODES", "2"}, {"GPUPOOL_HOSTS", "node-a:2,node-b:2"}};
  for (const auto& [k, v] : want) EXPECT_EQ(env[k], v) << k;
  a["rendezvous"]["masterAddr"] = "fd00::1";
  EXPECT_EQ(Env(ParseSingle(a), FourGpus())["JAX_COORDINATOR_ADDRESS"], "[fd00::1]:20042");
  // A task of one: none of them.
  a.erase("rendezvous");
  env = Env(ParseSingle(a), FourGpus());
  EXPECT_EQ(env.count("MASTER_ADDR"), 0u);
  EXPECT_EQ(env.count("WORLD_SIZE"), 0u);
}

TEST(TaskEnvTest, AHostileRendezvousIsRefusedNamingTheField) {
  const json base = RunAssignment("exclusive", json::array());
  const std::pair<json, const char*> bad[] = {
      {{{"masterAddr", "a b"}, {"masterPort", 1}, {"worldSize", 2}, {"rank", 0}, {"localRank", 0},
        {"localWorldSize", 1}, {"nodeRank", 0}, {"nodes", 2}}, "masterAddr"},
      {{{"masterAddr", "$(reboot)"}, {"masterPort", 1}, {"worldSize", 2}, {"rank", 0}, {"localRank", 0},
        {"localWorldSize", 1}, {"nodeRank", 0}, {"nodes", 2}}, "masterAddr"},
      {{{"masterAddr", "a"}, {"masterPort", 70000}, {"worldSize", 2}, {"rank", 0}, {"localRank", 0},
        {"localWorldSize", 1}, {"nodeRank", 0}, {"nodes", 2}}, "masterPort"},
      {{{"masterAddr", "a"}, {"masterPort", 1}, {"worldSize", 2}, {"rank", 2}, {"localRank", 0},
        {"localWorldSize", 1}, {"nodeRank", 0}, {"nodes", 2}}, "below their sizes"},
      {{{"masterAddr", "a"}, {"masterPort", 1}, {"worldSize", 2}, {"rank", 0}, {"localRank", 0},
        {"localWorldSize", 1}, {"nodeRank", 0}, {"nodes", 2}, {"hosts", {"a:1,b:1"}}}, "hosts"},
      {{{"masterAddr", "a"}}, "masterPort"},
      {"node-a", "must be an object"},
  };
  for (const auto& [r, needle] : bad) {
    json a = base;
    a["rendezvous"] = r;
    auto parsed = ParseAssignments(json{{"assignments", json::array({a})}});
    ASSERT_FALSE(parsed.ok()) << r.dump();
    EXPECT_NE(parsed.status().message().find(needle), std::string::npos) << parsed.status().ToString();
    EXPECT_NE(parsed.status().message().find("rendezvous"), std::string::npos) << parsed.status().ToString();
  }
}

TEST(TaskEnvTest, TheMpiHostfileHasOneLinePerNodeInRankOrder) {
  Assignment::Rendezvous z;
  z.hosts = {"10.0.0.7:2", "fe80::1:4", "node-c:1"};
  EXPECT_EQ(MpiHostfile(z), "10.0.0.7 slots=2\nfe80::1 slots=4\nnode-c slots=1\n");
  // Nothing that is not "addr:count" reaches the file.
  z.hosts = {":3", "a:", "b:x", "c", "d:2"};
  EXPECT_EQ(MpiHostfile(z), "d slots=2\n");
}

}  // namespace
}  // namespace gpupool

namespace gpupool {
namespace {

// The CUDA limiter goes first in LD_PRELOAD of a fractional time-sliced task, before what the job
// preloads itself (a job cannot take it out: an empty LD_PRELOAD of its own gets it too); in a
// container at the path the runtime binds it to; nowhere else (MPS shares, whole GPUs, no limiter
// configured). TaskGetsCudaLimiter is the one decision (the launch's ledger and binds follow it).
TEST(TaskEnvTest, TheCudaLimiterIsPreloadedIntoFractionalTimeslicedTasksOnly) {
  TaskEnvOptions o;
  o.node = "node-1";
  o.cuda_limiter = "/opt/gpupool/lib/libgpupool-cuda.so";
  const json quarter = json::array({{{"index", 2}, {"uuid", "GPU-test-2"}, {"share", 250}, {"memory", "20Gi"}}});
  const json whole = json::array({{{"index", 2}, {"uuid", "GPU-test-2"}, {"share", 1000}, {"memory", "80Gi"}}});
  auto env_of = [&](json a, const TaskEnvOptions& opts) {
    auto env = TaskEnvironment(ParseSingle(a), FourGpus(), opts);
    EXPECT_TRUE(env.ok()) << env.status().ToString();
    return env.ok() ? *env : std::map<std::string, std::string>{};
  };
  auto env = env_of(RunAssignment("timeslice", quarter), o);
  EXPECT_EQ(env["LD_PRELOAD"], "/opt/gpupool/lib/libgpupool-cuda.so");
  EXPECT_EQ(env["GPUPOOL_GPU_MEMORY_BYTES"], std::to_string(20LL << 30));
  EXPECT_EQ(env["GPUPOOL_GPU_SHARES_MILLI"], "250");
  EXPECT_TRUE(TaskGetsCudaLimiter(ParseSingle(RunAssignment("timeslice", quarter)), o));
  json own = RunAssignment("timeslice", quarter);
  own["env"]["LD_PRELOAD"] = "/usr/lib/libjemalloc.so.2";
  EXPECT_EQ(env_of(own, o)["LD_PRELOAD"], "/opt/gpupool/lib/libgpupool-cuda.so:/usr/lib/libjemalloc.so.2");
  own["env"]["LD_PRELOAD"] = "";
  EXPECT_EQ(env_of(own, o)["LD_PRELOAD"], "/opt/gpupool/lib/libgpupool-cuda.so");
  EXPECT_EQ(env_of(RunAssignment("mps", quarter), o).count("LD_PRELOAD"), 0u);
  EXPECT_FALSE(TaskGetsCudaLimiter(ParseSingle(RunAssignment("mps", quarter)), o));
  EXPECT_EQ(env_of(RunAssignment("timeslice", whole), o).count("LD_PRELOAD"), 0u);
  EXPECT_FALSE(TaskGetsCudaLimiter(ParseSingle(RunAssignment("timeslice", whole)), o));
  // Containers: the library's path inside the container, the job's own preloads after it.
  for (const char* field : {"rootfs", "bundle", "image"}) {
    json boxed = RunAssignment("timeslice", quarter);
    boxed[field] = std::string(field) == "image" ? "docker://docker.io/library/debian:12" : "/srv/images/x";
    EXPECT_TRUE(TaskGetsCudaLimiter(ParseSingle(boxed), o)) << field;
    EXPECT_EQ(env_of(boxed, o)["LD_PRELOAD"], "/usr/lib/gpupool/libgpupool-cuda.so") << field;
    boxed["env"]["LD_PRELOAD"] = "/usr/lib/libjemalloc.so.2";
    EXPECT_EQ(env_of(boxed, o)["LD_PRELOAD"], "/usr/lib/gpupool/libgpupool-cuda.so:/usr/lib/libjemalloc.so.2") << field;
    json whole_box = RunAssignment("timeslice", whole);
    whole_box[field] = boxed[field];
    EXPECT_FALSE(TaskGetsCudaLimiter(ParseSingle(whole_box), o)) << field;
    EXPECT_EQ(env_of(whole_box, o).count("LD_PRELOAD"), 0u) << field;
  }
  EXPECT_EQ(env_of(RunAssignment("timeslice", quarter), TaskEnvOptions{}).count("LD_PRELOAD"), 0u);
  EXPECT_FALSE(TaskGetsCudaLimiter(ParseSingle(RunAssignment("timeslice", quarter)), TaskEnvOptions{}));
}

}  // namespace
}  // namespace gpupool
