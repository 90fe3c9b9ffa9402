// Dynamic MIG (agent_mig.cc): whole agents on the fake NVML of tests/fake_nvml, whose MIG layout
// they change before a mig task starts, and report in registration and heartbeats.
#include <dlfcn.h>

#include "agent/mps_test_util.h"

namespace gpupool {
namespace {

using mps_test::MpsTest;
using mps_test::Slurp;
using mps_test::WaitFor;
using nlohmann::json;
namespace fs = std::filesystem;

// Registration, heartbeats that hand out the current assignments (the test changes them), and the
// task status reports, each with the task ("<job>/<index>") it is about.
class MigServer {
 public:
  MigServer() {
    srv_.Post("/api/v1/agent/register", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"heartbeatIntervalSeconds":0.1})", "application/json");
    });
    srv_.Post(R"(/api/v1/agent/nodes/([^/]+)/heartbeat)", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard<std::mutex> lock(mu_);
      last_heartbeat_ = json::parse(req.body, nullptr, false);
      res.set_content(json{{"assignments", assignments_}}.dump(), "application/json");
    });
    srv_.Post(R"(/api/v1/agent/nodes/([^/]+)/tasks/([^/]+)/(\d+)/status)",
              [this](const httplib::Request& req, httplib::Response& res) {
                std::lock_guard<std::mutex> lock(mu_);
                json s = json::parse(req.body);
                s["task"] = fmt::format("{}/{}", req.matches[2].str(), req.matches[3].str());
                statuses_.push_back(std::move(s));
                res.set_content("{}", "application/json");
              });
    port_ = srv_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { srv_.listen_after_bind(); });
  }
  ~MigServer() {
    srv_.stop();
    thread_.join();
  }
  MigServer(const MigServer&) = delete;
  MigServer& operator=(const MigServer&) = delete;

  std::string url() const { return fmt::format("http://127.0.0.1:{}", port_); }
  void SetAssignments(json a) {
    std::lock_guard<std::mutex> lock(mu_);
    assignments_ = std::move(a);
  }
  // The newest status of `task` in `state` ("" any state); null while there is none.
  json Status(const std::string& task, const std::string& state = "") {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = statuses_.rbegin(); it != statuses_.rend(); ++it) {
      if ((*it)["task"] == task && (state.empty() || (*it)["state"] == state)) return *it;
    }
    return nullptr;
  }
  json LastHeartbeat() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_heartbeat_;
  }

 private:
  httplib::Server srv_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mu_;
  json assignments_ = json::array();
  json last_heartbeat_;
  std::vector<json> statuses_;
};

// A mig task of job `job` on GPU 1: profile id / name and start as given (the mps task of
// MpsAssignment, made a mig one with all of the GPU's share).
json MigTask(const std::string& job, int profile_id, const std::string& profile, int start, const std::string& script) {
  json mig = {{"start", start}};
  if (profile_id >= 0) mig["profileId"] = profile_id;
  if (!profile.empty()) mig["profile"] = profile;
  json task = mps_test::MpsAssignment(script, 1000)[0];
  task["jobId"] = job;
  task["name"] = "mig/" + job;
  task["isolation"] = "mig";
  task["gpus"][0]["mig"] = mig;
  return task;
}

class AgentMigTest : public MpsTest {
 protected:
  void SetUp() override {
    MpsTest::SetUp();
    config_ = root_ + "-nvml.conf";
    // The driver's MIG capability minors: every GPU/compute instance id of GPUs 0..3.
    const std::string caps = root_ + "/driver/proc/driver/nvidia-caps";
    fs::create_directories(caps);
    std::ofstream minors(caps + "/mig-minors");
    int minor = 1;
    for (int gpu = 0; gpu < 4; ++gpu) {
      for (int gi = 0; gi < 16; ++gi) {
        minors << fmt::format("gpu{}/gi{}/access {}\n", gpu, gi, minor++);
        for (int ci = 0; ci < 8; ++ci) minors << fmt::format("gpu{}/gi{}/ci{}/access {}\n", gpu, gi, ci, minor++);
      }
    }
  }
  void TearDown() override {
    if (agent_) agent_->Stop(true);
    agent_.reset();
    ::unsetenv("GPUPOOL_FAKE_NVML");
    std::error_code ec;
    fs::remove(config_, ec);
    MpsTest::TearDown();
  }
  Agent* StartAgent(const MigServer& server, const std::string& nvml_config) {
    std::ofstream(config_) << nvml_config;
    ::setenv("GPUPOOL_FAKE_NVML", config_.c_str(), 1);
    AgentOptions o;
    o.server = server.url();
    o.node = "mig-node";
    o.cpu = "4";
    o.memory = "8Gi";
    o.nvml_library = FAKE_NVML_PATH;
    o.state_dir = root_;
    o.driver_root = root_ + "/driver";
    o.cdi_spec_dirs = {root_ + "/cdi"};  // the test's, never the host's
    o.poll_seconds = 0.05;
    o.heartbeat_seconds = 0.1;
    o.cuda_limiter = "none";
    auto agent = Agent::Create(o);
    EXPECT_TRUE(agent.ok()) << agent.status().ToString();
    if (!agent.ok()) return nullptr;
    agent_ = std::move(agent).value();
    EXPECT_FALSE(agent_->inventory().simulated) << agent_->summary();
    Status st = agent_->Start(std::chrono::seconds(5));
    EXPECT_TRUE(st.ok()) << st.ToString();
    return st.ok() ? agent_.get() : nullptr;
  }
  // GPU 1's layout in the heartbeat's migInstances, as "profileId@start,...".
  static std::string Reported(const json& gpus) {
    std::string out;
    if (!gpus.is_array() || gpus.size() < 2 || !gpus[1].contains("migInstances")) return "none";
    for (const json& m : gpus[1]["migInstances"])
      out += fmt::format("{}{}@{}", out.empty() ? "" : ",", m["profileId"].get<int>(), m["start"].get<int>());
    return out;
  }
  // The fake's count of MIG instances created or destroyed since the agent loaded it.
  static long MigChanges() {
    void* lib = dlopen(FAKE_NVML_PATH, RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) return -1;
    auto fn = reinterpret_cast<long (*)()>(dlsym(lib, "fake_nvml_mig_changes"));
    const long n = fn != nullptr ? fn() : -1;
    dlclose(lib);
    return n;
  }
  std::string EnvScript() const {
    return fmt::format("echo \"$CUDA_VISIBLE_DEVICES $NVIDIA_VISIBLE_DEVICES\" > {0}/env.tmp; mv {0}/env.tmp {0}/env",
                       out_);
  }

  std::string config_;
  std::unique_ptr<Agent> agent_;
};

constexpr const char* kIdleOnes = "gpus=2\nmig=1\nmig_instances.1=19@0,19@4,19@5,19@6\n";

TEST_F(AgentMigTest, IdleInstancesInTheWayAreReplacedByTheWantedOne) {
  MigServer server;
  Agent* agent = StartAgent(server, kIdleOnes);
  ASSERT_NE(agent, nullptr);
  // Registration carries the layout the agent found.
  const json reg = NodeRegistration(agent->inventory(), "mig-node", "4", "8Gi", {});
  EXPECT_EQ(reg["gpus"][1]["migInstances"].dump(),
            R"([{"profileId":19,"start":0},{"profileId":19,"start":4},{"profileId":19,"start":5},)"
            R"({"profileId":19,"start":6}])");
  EXPECT_FALSE(reg["gpus"][0].contains("migInstances"));
  ASSERT_TRUE(WaitFor([&] { return Reported(server.LastHeartbeat()["gpus"]) == "19@0,19@4,19@5,19@6"; }))
      << server.LastHeartbeat().dump();

  server.SetAssignments(json::array({MigTask("j-000000000001", 9, "3g.40gb", 4, EnvScript())}));
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000001/0", "succeeded").is_null(); },
                      std::chrono::seconds(10)))
      << server.Status("j-000000000001/0").dump();
  // The three 1g (GPU instances 2..4) made room; the 3g took the lowest free GPU instance id, 2.
  const std::string uuid = "MIG-fa6e0001-0002-4000-8001-000000000000";
  EXPECT_EQ(Slurp(out_ + "/env"), uuid + " " + uuid + "\n");
  EXPECT_EQ(MigChanges(), 3 * 2 + 2);  // three compute + GPU instances destroyed, one of each created
  // The next heartbeat reports the new layout.
  EXPECT_TRUE(WaitFor([&] { return Reported(server.LastHeartbeat()["gpus"]) == "19@0,9@4"; }))
      << server.LastHeartbeat().dump();
}

// A node whose CDI spec is the toolkit's, which names GPU 1 and its MIG devices of then by index:
// after the agent made a new instance, the index names (which now mean other instances) are gone,
// and the new instance is in that spec by its UUID, with the device nodes the agent's own generator
// gives it (the GPU's node and the instance's capability nodes), beside the spec's driver mounts.
TEST_F(AgentMigTest, AToolkitSpecGetsTheInstanceTheAgentMade) {
  fs::create_directories(root_ + "/cdi");
  std::ofstream(root_ + "/cdi/nvidia.json")
      << R"({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [)"
      << R"({"name": "1", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}]}},)"
      << R"({"name": "1:0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}]}}],)"
      << R"("containerEdits": {"mounts": [{"hostPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",)"
      << R"("containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "options": ["ro", "bind"]}]}})";
  MigServer server;
  Agent* agent = StartAgent(server, kIdleOnes);
  ASSERT_NE(agent, nullptr);
  ASSERT_EQ(agent->CdiSpecs().size(), 1u) << agent->summary();
  server.SetAssignments(json::array({MigTask("j-000000000001", 9, "3g.40gb", 4, EnvScript())}));
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000001/0", "succeeded").is_null(); },
                      std::chrono::seconds(10)))
      << server.Status("j-000000000001/0").dump();
  const std::vector<CdiSpec> specs = agent->CdiSpecs();
  ASSERT_EQ(specs.size(), 1u);
  EXPECT_NE(specs[0].source.find("nvidia.json"), std::string::npos);
  EXPECT_TRUE(specs[0].devices.contains("1"));
  EXPECT_FALSE(specs[0].devices.contains("1:0"));
  const std::string uuid = "MIG-fa6e0001-0002-4000-8001-000000000000";
  ASSERT_TRUE(specs[0].devices.contains(uuid));
  std::vector<std::string> nodes;
  for (const CdiDeviceNode& n : specs[0].devices.at(uuid).device_nodes) nodes.push_back(n.path);
  ASSERT_EQ(nodes.size(), 3u);
  EXPECT_EQ(nodes[0], "/dev/nvidia1");
  EXPECT_EQ(nodes[1].rfind("/dev/nvidia-caps/nvidia-cap", 0), 0u);
  auto edits = ResolveCdiDevices(specs, "nvidia.com/gpu", {uuid});
  ASSERT_TRUE(edits.ok()) << edits.status().ToString();
  EXPECT_EQ(edits->mounts.size(), 1u);  // the toolkit's driver mount comes with it
}

TEST_F(AgentMigTest, AnInstanceInUseByARunningTaskIsNeverDestroyed) {
  MigServer server;
  Agent* agent = StartAgent(server, kIdleOnes);
  ASSERT_NE(agent, nullptr);
  // A task on the 1g at slice 5, running until told otherwise.
  const std::string wait = fmt::format("n=0; while [ ! -e {0}/finish ] && [ $n -lt 400 ]; do sleep 0.05; n=$((n+1)); done", out_);
  json first = MigTask("j-000000000001", 19, "", 5, wait);
  server.SetAssignments(json::array({first}));
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000001/0", "running").is_null(); },
                      std::chrono::seconds(10)))
      << server.Status("j-000000000001/0").dump();
  // A 3g at 4 would need it.
  server.SetAssignments(json::array({first, MigTask("j-000000000002", 9, "", 4, EnvScript())}));
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000002/0", "failed").is_null(); },
                      std::chrono::seconds(10)))
      << server.Status("j-000000000002/0").dump();
  const std::string msg = server.Status("j-000000000002/0", "failed")["message"];
  EXPECT_NE(msg.find("cannot create MIG instance 3g.40gb@4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1g.10gb@5 (GPU instance 3, MIG-fa6e0001-0003-4000-8000-000000000000)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("in use by task j-000000000001"), std::string::npos) << msg;
  EXPECT_EQ(MigChanges(), 0);  // nothing destroyed
  EXPECT_FALSE(fs::exists(out_ + "/env"));
  std::ofstream(out_ + "/finish") << "\n";
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000001/0", "succeeded").is_null(); },
                      std::chrono::seconds(10)));
}

TEST_F(AgentMigTest, AnInstanceWithAProcessOnItIsNeverDestroyed) {
  MigServer server;
  Agent* agent = StartAgent(server, std::string(kIdleOnes) + "mig_busy.1=6\n");
  ASSERT_NE(agent, nullptr);
  server.SetAssignments(json::array({MigTask("j-000000000002", 9, "", 4, EnvScript())}));
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000002/0", "failed").is_null(); },
                      std::chrono::seconds(10)));
  const std::string msg = server.Status("j-000000000002/0", "failed")["message"];
  EXPECT_NE(msg.find("1g.10gb@6 (GPU instance 4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("where process 5004 runs"), std::string::npos) << msg;
  EXPECT_EQ(MigChanges(), 0);
}

TEST_F(AgentMigTest, AFailedCreationNamesTheCallAndRestoresTheLayout) {
  MigServer server;
  Agent* agent = StartAgent(server, std::string(kIdleOnes) + "mig_create_fail=1\n");
  ASSERT_NE(agent, nullptr);
  server.SetAssignments(json::array({MigTask("j-000000000003", 9, "3g.40gb", 4, EnvScript())}));
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000003/0", "failed").is_null(); },
                      std::chrono::seconds(10)));
  const std::string msg = server.Status("j-000000000003/0", "failed")["message"];
  EXPECT_NE(msg.find("nvmlDeviceCreateGpuInstanceWithPlacement(GPU 1, profile 3g.40gb (id 9), start 4, size 4): "
                     "Insufficient resources (NVML error 23)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("created again: 1g.10gb@4, 1g.10gb@5, 1g.10gb@6"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(out_ + "/env"));
  // The layout is as before (the instances made again have new UUIDs).
  EXPECT_TRUE(WaitFor([&] { return Reported(server.LastHeartbeat()["gpus"]) == "19@0,19@4,19@5,19@6"; }))
      << server.LastHeartbeat().dump();
}

TEST_F(AgentMigTest, AHostileAssignmentIsRefusedBeforeAnyNvmlCall) {
  MigServer server;
  Agent* agent = StartAgent(server, kIdleOnes);
  ASSERT_NE(agent, nullptr);
  server.SetAssignments(json::array({MigTask("j-000000000004", 9, "", 9, EnvScript()),
                                     MigTask("j-000000000005", 42, "", 0, EnvScript()),
                                     MigTask("j-000000000006", 9, "", 2, EnvScript()),
                                     MigTask("j-000000000007", 9, "1g.10gb", 4, EnvScript())}));
  for (const char* job : {"j-000000000004", "j-000000000005", "j-000000000006", "j-000000000007"}) {
    ASSERT_TRUE(WaitFor([&] { return !server.Status(std::string(job) + "/0", "failed").is_null(); },
                        std::chrono::seconds(10)))
        << job << ": " << server.Status(std::string(job) + "/0").dump();
  }
  auto message = [&](const char* job) {
    return server.Status(std::string(job) + "/0", "failed")["message"].get<std::string>();
  };
  EXPECT_NE(message("j-000000000004").find("slice 9 is not a valid start of MIG profile 3g.40gb (valid: 0, 4)"),
            std::string::npos)
      << message("j-000000000004");
  EXPECT_NE(message("j-000000000005").find("MIG profile id 42 is not a profile of H100-80GB"), std::string::npos)
      << message("j-000000000005");
  EXPECT_NE(message("j-000000000006").find("slice 2 is not a valid start"), std::string::npos)
      << message("j-000000000006");
  EXPECT_NE(message("j-000000000007").find("MIG profile '1g.10gb' is not profile id 9"), std::string::npos)
      << message("j-000000000007");
  EXPECT_EQ(MigChanges(), 0);
  EXPECT_FALSE(fs::exists(out_ + "/env"));
}

TEST_F(AgentMigTest, AGpuNotInMigModeIsNeverSwitched) {
  MigServer server;
  Agent* agent = StartAgent(server, "gpus=2\n");
  ASSERT_NE(agent, nullptr);
  EXPECT_FALSE(NodeRegistration(agent->inventory(), "mig-node", "4", "8Gi", {})["gpus"][1].contains("migInstances"));
  server.SetAssignments(json::array({MigTask("j-000000000008", 19, "", 0, EnvScript())}));
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000008/0", "failed").is_null(); },
                      std::chrono::seconds(10)));
  const std::string msg = server.Status("j-000000000008/0", "failed")["message"];
  EXPECT_NE(msg.find("is not in MIG mode; gpupool does not change MIG mode"), std::string::npos) << msg;
  EXPECT_EQ(MigChanges(), 0);
}

}  // namespace
}  // namespace gpupool
