// MPS control daemons, against the fake nvidia-cuda-mps-control of tests/fake_mps: real processes,
// real FIFOs; every check looks at what the fake daemon recorded or at the process table.
#include "agent/mps.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "agent/agent.h"
#include "agent/runtime_internal.h"

#if !defined(FAKE_MPS_CONTROL) || !defined(FAKE_NVML_PATH)
#error "FAKE_MPS_CONTROL must name tests/fake_mps/nvidia-cuda-mps-control, FAKE_NVML_PATH the fake NVML"
#endif

namespace gpupool {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> Lines(const std::string& path) {
  std::vector<std::string> out;
  std::istringstream in(Slurp(path));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

bool Alive(pid_t pid) {
  auto st = agent_internal::ReadProcStat(pid);
  return st.has_value() && st->state != 'Z';
}

bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

bool IsFifo(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
}

class MpsTest : public ::testing::Test {
 protected:
  // The fake daemons detach from the control program; as a subreaper this process inherits and reaps
  // them, rather than leaving zombies to an init that may not reap.
  static void SetUpTestSuite() { ::prctl(PR_SET_CHILD_SUBREAPER, 1); }
  static void Reap() {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
  }

  void SetUp() override {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = fmt::format("{}/gpupool-mps-XXXXXX", tmp != nullptr && *tmp != '\0' ? tmp : "/tmp");
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    // Sandboxed tasks (as nobody: the fake server sends no runAs) see nothing of the agent's state
    // directory (root_): they leave their marks in out_.
    out_ = root_ + "-out";
    ASSERT_EQ(::mkdir(out_.c_str(), 0777), 0);
    ::chmod(out_.c_str(), 0777);
  }

  void TearDown() override {
    // Whatever a failed test left running: the fake daemons it started, by their recorded pids.
    std::error_code ec;
    for (const auto& entry : fs::recursive_directory_iterator(root_, ec)) {
      if (entry.path().filename() != "starts") continue;
      for (const std::string& line : Lines(entry.path().string())) {
        const pid_t pid = static_cast<pid_t>(std::atol(line.c_str()));
        if (pid > 0 && Alive(pid)) ::kill(pid, SIGKILL);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    Reap();
    fs::remove_all(root_, ec);
    fs::remove_all(out_, ec);
  }

  MpsOptions Options(std::string binary = FAKE_MPS_CONTROL) const {
    MpsOptions o;
    o.control_binary = std::move(binary);
    o.root = root_;
    o.start_timeout = std::chrono::seconds(5);
    o.command_timeout = std::chrono::seconds(5);
    return o;
  }

  std::string Pipe(const std::string& uuid) const { return fmt::format("{}/{}/pipe", root_, uuid); }
  std::vector<std::string> Starts(const std::string& uuid) const { return Lines(Pipe(uuid) + "/starts"); }
  std::vector<std::string> Commands(const std::string& uuid) const { return Lines(Pipe(uuid) + "/commands"); }
  // The daemon's pid as its pid file says; -1 when there is none.
  pid_t DaemonPid(const std::string& uuid) const {
    const std::string text = Slurp(Pipe(uuid) + "/nvidia-cuda-mps-control.pid");
    return text.empty() ? -1 : static_cast<pid_t>(std::atol(text.c_str()));
  }
  pid_t LastStartedPid(const std::string& uuid) const {
    auto s = Starts(uuid);
    return s.empty() ? -1 : static_cast<pid_t>(std::atol(s.back().c_str()));
  }
  static bool Contains(const std::vector<std::string>& v, const std::string& x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  }

  std::string root_;
  std::string out_;
};

TEST_F(MpsTest, EnsureStartsOneDaemonPerGpuWithItsOwnEnvironment) {
  MpsDaemons mps(Options());
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-1.0").ok());
  ASSERT_TRUE(mps.Ensure("GPU-bbbb", "j-2.0").ok());

  for (const std::string uuid : {"GPU-aaaa", "GPU-bbbb"}) {
    SCOPED_TRACE(uuid);
    ASSERT_EQ(Starts(uuid).size(), 1u);
    const pid_t pid = LastStartedPid(uuid);
    EXPECT_TRUE(Alive(pid));
    EXPECT_EQ(DaemonPid(uuid), pid);
    EXPECT_TRUE(IsFifo(Pipe(uuid) + "/control"));
    EXPECT_TRUE(fs::is_directory(fmt::format("{}/{}/log", root_, uuid)));
    EXPECT_EQ(Slurp(Pipe(uuid) + "/env"),
              fmt::format("CUDA_VISIBLE_DEVICES={0}\nCUDA_MPS_PIPE_DIRECTORY={1}/{0}/pipe\n"
                          "CUDA_MPS_LOG_DIRECTORY={1}/{0}/log\n",
                          uuid, root_));
    EXPECT_EQ(mps.PipeDir(uuid), Pipe(uuid));
    EXPECT_TRUE(mps.Healthy(uuid));
  }
  EXPECT_NE(LastStartedPid("GPU-aaaa"), LastStartedPid("GPU-bbbb"));
  EXPECT_EQ(mps.Gpus(), (std::vector<std::string>{"GPU-aaaa", "GPU-bbbb"}));
  EXPECT_EQ(mps.starts(), 2);
  EXPECT_FALSE(mps.Healthy("GPU-cccc"));
  EXPECT_TRUE(mps.StopAll().ok());
}

TEST_F(MpsTest, EnsureAgainUsesTheRunningDaemon) {
  MpsDaemons mps(Options());
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-1.0").ok());
  const pid_t pid = LastStartedPid("GPU-aaaa");
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-2.0").ok());
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-1.0").ok());
  EXPECT_EQ(Starts("GPU-aaaa").size(), 1u);
  EXPECT_EQ(mps.starts(), 1);
  EXPECT_TRUE(Alive(pid));
  EXPECT_EQ(mps.Users("GPU-aaaa"), (std::vector<std::string>{"j-1.0", "j-2.0"}));
  // The health check went through the control program each time.
  EXPECT_GE(Commands("GPU-aaaa").size(), 2u);
  EXPECT_TRUE(mps.StopAll().ok());
}

TEST_F(MpsTest, ReleaseStopsTheDaemonOnlyWithItsLastUser) {
  MpsDaemons mps(Options());
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-1.0").ok());
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-2.0").ok());
  const pid_t pid = LastStartedPid("GPU-aaaa");

  ASSERT_TRUE(mps.Release("GPU-aaaa", "j-1.0").ok());
  // Releasing the same user twice, or one never counted, changes nothing.
  ASSERT_TRUE(mps.Release("GPU-aaaa", "j-1.0").ok());
  ASSERT_TRUE(mps.Release("GPU-aaaa", "j-9.0").ok());
  EXPECT_TRUE(Alive(pid));
  EXPECT_TRUE(IsFifo(Pipe("GPU-aaaa") + "/control"));
  EXPECT_FALSE(Contains(Commands("GPU-aaaa"), "quit"));
  EXPECT_EQ(mps.Gpus(), std::vector<std::string>{"GPU-aaaa"});

  ASSERT_TRUE(mps.Release("GPU-aaaa", "j-2.0").ok());
  EXPECT_TRUE(Contains(Commands("GPU-aaaa"), "quit"));
  EXPECT_TRUE(WaitFor([&] { return !Alive(pid); }));
  EXPECT_FALSE(fs::exists(Pipe("GPU-aaaa") + "/control"));
  EXPECT_TRUE(mps.Gpus().empty());
  EXPECT_FALSE(mps.Healthy("GPU-aaaa"));
  // A release for a GPU without a daemon is fine too.
  EXPECT_TRUE(mps.Release("GPU-aaaa", "j-2.0").ok());
  EXPECT_TRUE(mps.Release("GPU-zzzz", "j-2.0").ok());
}

TEST_F(MpsTest, DeadDaemonIsRestartedByTheNextEnsure) {
  MpsDaemons mps(Options());
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-1.0").ok());
  const pid_t first = LastStartedPid("GPU-aaaa");
  ASSERT_EQ(::kill(first, SIGKILL), 0);
  ASSERT_TRUE(WaitFor([&] { return !Alive(first); }));
  // Its control pipe is left behind, but nothing answers on it.
  EXPECT_TRUE(IsFifo(Pipe("GPU-aaaa") + "/control"));
  EXPECT_FALSE(mps.Healthy("GPU-aaaa"));

  Status st = mps.Ensure("GPU-aaaa", "j-2.0");
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(Starts("GPU-aaaa").size(), 2u);
  const pid_t second = LastStartedPid("GPU-aaaa");
  EXPECT_NE(second, first);
  EXPECT_TRUE(Alive(second));
  EXPECT_TRUE(mps.Healthy("GPU-aaaa"));
  EXPECT_EQ(mps.starts(), 2);
  EXPECT_TRUE(mps.StopAll().ok());
  EXPECT_TRUE(WaitFor([&] { return !Alive(second); }));
}

TEST_F(MpsTest, ReleaseToleratesADaemonThatAlreadyDied) {
  MpsDaemons mps(Options());
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-1.0").ok());
  const pid_t pid = LastStartedPid("GPU-aaaa");
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  ASSERT_TRUE(WaitFor([&] { return !Alive(pid); }));
  Status st = mps.Release("GPU-aaaa", "j-1.0");
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(mps.Gpus().empty());
}

TEST_F(MpsTest, MissingBinaryIsAClearError) {
  {
    MpsDaemons mps(Options(fmt::format("{}/nowhere/nvidia-cuda-mps-control", root_)));
    Status st = mps.Ensure("GPU-aaaa", "j-1.0");
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(st.message().find("MPS isolation requested for GPU GPU-aaaa"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(fmt::format("{}/nowhere/nvidia-cuda-mps-control", root_)), std::string::npos)
        << st.message();
    EXPECT_TRUE(mps.Gpus().empty());
    EXPECT_EQ(mps.starts(), 0);
  }
  {
    // A bare name is looked up in PATH.
    MpsDaemons mps(Options("gpupool-no-such-mps-control"));
    Status st = mps.Ensure("GPU-aaaa", "j-1.0");
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("gpupool-no-such-mps-control was not found"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("PATH="), std::string::npos) << st.message();
  }
}

TEST_F(MpsTest, FailedStartReportsTheExitStatusAndStderr) {
  fs::create_directories(Pipe("GPU-aaaa"));
  std::ofstream(Pipe("GPU-aaaa") + "/fail-start") << "no CUDA-capable device is detected\n";
  MpsDaemons mps(Options());
  Status st = mps.Ensure("GPU-aaaa", "j-1.0");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("GPU GPU-aaaa"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("exit status 3"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("no CUDA-capable device is detected"), std::string::npos) << st.message();
  EXPECT_TRUE(mps.Gpus().empty());
  EXPECT_TRUE(Starts("GPU-aaaa").empty());
}

TEST_F(MpsTest, DaemonThatNeverAnswersIsAnError) {
  // A control program whose -d succeeds but starts nothing.
  const std::string fake = fmt::format("{}/silent-mps-control", root_);
  std::ofstream(fake) << "#!/bin/sh\nexit 0\n";
  ASSERT_EQ(::chmod(fake.c_str(), 0755), 0);
  MpsOptions o = Options(fake);
  o.start_timeout = std::chrono::milliseconds(300);
  MpsDaemons mps(o);
  Status st = mps.Ensure("GPU-aaaa", "j-1.0");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("GPU GPU-aaaa"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("no daemon answers"), std::string::npos) << st.message();
  EXPECT_TRUE(mps.Gpus().empty());
}

TEST_F(MpsTest, StopAllStopsEveryDaemon) {
  MpsDaemons mps(Options());
  std::vector<pid_t> pids;
  for (const std::string uuid : {"GPU-aaaa", "GPU-bbbb", "GPU-cccc"}) {
    ASSERT_TRUE(mps.Ensure(uuid, "j-1.0").ok());
    ASSERT_TRUE(mps.Ensure(uuid, "j-2.0").ok());
    pids.push_back(LastStartedPid(uuid));
  }
  ASSERT_TRUE(mps.StopAll().ok());
  for (pid_t pid : pids) EXPECT_TRUE(WaitFor([&] { return !Alive(pid); })) << pid;
  for (const std::string uuid : {"GPU-aaaa", "GPU-bbbb", "GPU-cccc"}) {
    EXPECT_TRUE(Contains(Commands(uuid), "quit")) << uuid;
    EXPECT_FALSE(fs::exists(Pipe(uuid) + "/control")) << uuid;
  }
  EXPECT_TRUE(mps.Gpus().empty());
}

TEST_F(MpsTest, AHealthyDaemonLeftByAnEarlierAgentIsAdopted) {
  MpsDaemons before(Options());
  ASSERT_TRUE(before.Ensure("GPU-aaaa", "j-1.0").ok());
  const pid_t pid = LastStartedPid("GPU-aaaa");

  MpsDaemons after(Options());  // the restarted agent
  ASSERT_TRUE(after.Ensure("GPU-aaaa", "j-1.0").ok());
  EXPECT_EQ(after.starts(), 0);
  EXPECT_EQ(Starts("GPU-aaaa").size(), 1u);
  ASSERT_TRUE(after.Release("GPU-aaaa", "j-1.0").ok());
  EXPECT_TRUE(WaitFor([&] { return !Alive(pid); }));
}

TEST_F(MpsTest, UnusableUuidsAreRefused) {
  MpsDaemons mps(Options());
  for (const std::string uuid : {"", "../etc", "GPU/0", ".hidden", "GPU 0"}) {
    Status st = mps.Ensure(uuid, "j-1.0");
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << uuid;
  }
  EXPECT_TRUE(fs::is_empty(root_));
}


// ---- the agent: mps tasks on real (fake NVML) GPUs get a daemon, simulated ones do not ----------

using nlohmann::json;

// Just enough of the server for an agent: registration, heartbeats that hand out `assignments`,
// and the task status reports, kept for the test to read.
class FakeServer {
 public:
  explicit FakeServer(json assignments) : assignments_(std::move(assignments)) {
    srv_.Post("/api/v1/agent/register", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"heartbeatIntervalSeconds":0.1})", "application/json");
    });
    srv_.Post(R"(/api/v1/agent/nodes/([^/]+)/heartbeat)", [this](const httplib::Request&, httplib::Response& res) {
      std::lock_guard<std::mutex> lock(mu_);
      res.set_content(json{{"assignments", assignments_}}.dump(), "application/json");
    });
    srv_.Post(R"(/api/v1/agent/nodes/([^/]+)/tasks/([^/]+)/(\d+)/status)",
              [this](const httplib::Request& req, httplib::Response& res) {
                std::lock_guard<std::mutex> lock(mu_);
                statuses_.push_back(json::parse(req.body));
                res.set_content("{}", "application/json");
              });
    port_ = srv_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { srv_.listen_after_bind(); });
  }
  ~FakeServer() {
    srv_.stop();
    thread_.join();
  }
  std::string url() const { return fmt::format("http://127.0.0.1:{}", port_); }
  // The last status reported with a final state (not "running"); null while there is none.
  json FinalStatus() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = statuses_.rbegin(); it != statuses_.rend(); ++it)
      if ((*it)["state"] != "running") return *it;
    return nullptr;
  }
  bool Reported(const std::string& state) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const json& s : statuses_)
      if (s["state"] == state) return true;
    return false;
  }

 private:
  httplib::Server srv_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mu_;
  json assignments_;
  std::vector<json> statuses_;
};

json MpsAssignment(const std::string& script) {
  return json::array({{{"jobId", "j-000000000007"}, {"index", 0}, {"desired", "run"}, {"state", "assigned"},
                       {"name", "infer/server-0"}, {"tenant", "vision"}, {"qos", "guaranteed"},
                       {"isolation", "mps"}, {"command", {"/bin/sh", "-c", script}}, {"env", json::object()},
                       {"bundle", ""}, {"rootfs", ""}, {"restarts", 0}, {"cpu", "0"}, {"memory", "0"},
                       {"gpus", json::array({{{"index", 1}, {"share", 500}, {"memory", "10Gi"}}})}}});
}

class AgentMpsTest : public MpsTest {
 protected:
  void SetUp() override {
    MpsTest::SetUp();
    ::unsetenv("GPUPOOL_FAKE_NVML");  // the fake's default machine: 4 GPUs
  }
  // Tasks outlive a plain agent stop: a failed test must not leave its task running.
  void TearDown() override {
    if (agent_) agent_->Stop(true);
    agent_.reset();
    MpsTest::TearDown();
  }
  // Creates the agent (kept for TearDown); null, with a test failure, when that fails.
  Agent* CreateAgent(const AgentOptions& o) {
    auto agent = Agent::Create(o);
    EXPECT_TRUE(agent.ok()) << agent.status().ToString();
    if (!agent.ok()) return nullptr;
    agent_ = std::move(agent).value();
    return agent_.get();
  }
  AgentOptions AgentOpts(const FakeServer& server, std::string mps_binary) const {
    AgentOptions o;
    o.server = server.url();
    o.node = "mps-node";
    o.cpu = "4";
    o.memory = "8Gi";
    o.nvml_library = FAKE_NVML_PATH;
    o.mps_control_binary = std::move(mps_binary);
    o.state_dir = root_;
    o.poll_seconds = 0.05;
    o.heartbeat_seconds = 0.1;
    return o;
  }
  // Where the agent keeps GPU `uuid`'s MPS pipe directory.
  std::string AgentPipe(const std::string& uuid) const { return fmt::format("{}/mps/{}/pipe", root_, uuid); }

  std::unique_ptr<Agent> agent_;
};

TEST_F(AgentMpsTest, MpsTaskOnRealGpusRunsWithItsGpusDaemonWhichStopsAfterIt) {
  // The task records its MPS directories and runs until told to finish.
  const std::string script = fmt::format(
      "echo \"$CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY\" > {0}/task-env.tmp; "
      "mv {0}/task-env.tmp {0}/task-env; "  // appears whole: the test reads it as soon as it exists
      "n=0; while [ ! -e {0}/finish ] && [ $n -lt 400 ]; do sleep 0.05; n=$((n+1)); done",
      out_);
  FakeServer server(MpsAssignment(script));
  Agent* agent = CreateAgent(AgentOpts(server, FAKE_MPS_CONTROL));
  ASSERT_NE(agent, nullptr);
  ASSERT_FALSE(agent->inventory().simulated) << agent->summary();
  const std::string uuid = agent->inventory().gpus.at(1).uuid;
  ASSERT_TRUE(agent->Start(std::chrono::seconds(5)).ok());

  ASSERT_TRUE(WaitFor([&] { return fs::exists(out_ + "/task-env"); }, std::chrono::seconds(10)));
  // One daemon, for GPU 1 only, in the very directories the task was pointed at.
  ASSERT_EQ(Lines(AgentPipe(uuid) + "/starts").size(), 1u);
  const pid_t daemon = static_cast<pid_t>(std::atol(Lines(AgentPipe(uuid) + "/starts")[0].c_str()));
  EXPECT_TRUE(Alive(daemon));
  EXPECT_EQ(Slurp(AgentPipe(uuid) + "/env"),
            fmt::format("CUDA_VISIBLE_DEVICES={0}\nCUDA_MPS_PIPE_DIRECTORY={1}/mps/{0}/pipe\n"
                        "CUDA_MPS_LOG_DIRECTORY={1}/mps/{0}/log\n",
                        uuid, root_));
  EXPECT_EQ(Slurp(out_ + "/task-env"), fmt::format("{0}/mps/{1}/pipe {0}/mps/{1}/log\n", root_, uuid));
  EXPECT_FALSE(fs::exists(AgentPipe(agent->inventory().gpus.at(0).uuid)));
  EXPECT_NE(agent->MetricsText().find("gpupool_agent_mps_daemons{node=\"mps-node\"} 1\n"), std::string::npos);

  std::ofstream(out_ + "/finish") << "\n";
  ASSERT_TRUE(WaitFor([&] { return server.Reported("succeeded"); }, std::chrono::seconds(10)))
      << server.FinalStatus().dump();
  EXPECT_TRUE(WaitFor([&] { return !Alive(daemon); }));
  EXPECT_TRUE(Contains(Lines(AgentPipe(uuid) + "/commands"), "quit"));
  EXPECT_FALSE(fs::exists(AgentPipe(uuid) + "/control"));
  EXPECT_NE(agent->MetricsText().find("gpupool_agent_mps_daemons{node=\"mps-node\"} 0\n"), std::string::npos);
  agent->Stop(true);
}

TEST_F(AgentMpsTest, AgentStopWithTasksStopsTheDaemons) {
  FakeServer server(MpsAssignment("sleep 30"));
  Agent* agent = CreateAgent(AgentOpts(server, FAKE_MPS_CONTROL));
  ASSERT_NE(agent, nullptr);
  const std::string uuid = agent->inventory().gpus.at(1).uuid;
  ASSERT_TRUE(agent->Start(std::chrono::seconds(5)).ok());
  ASSERT_TRUE(WaitFor([&] { return server.Reported("running"); }, std::chrono::seconds(10)));
  const auto starts = Lines(AgentPipe(uuid) + "/starts");
  ASSERT_EQ(starts.size(), 1u);
  const pid_t daemon = static_cast<pid_t>(std::atol(starts[0].c_str()));
  ASSERT_TRUE(Alive(daemon));
  agent->Stop(true);
  EXPECT_TRUE(WaitFor([&] { return !Alive(daemon); }));
  EXPECT_TRUE(Contains(Lines(AgentPipe(uuid) + "/commands"), "quit"));
}

TEST_F(AgentMpsTest, MissingControlProgramFailsTheMpsTaskClearly) {
  FakeServer server(MpsAssignment("echo ran > " + root_ + "/ran"));
  Agent* agent = CreateAgent(AgentOpts(server, root_ + "/not-installed/nvidia-cuda-mps-control"));
  ASSERT_NE(agent, nullptr);
  ASSERT_TRUE(agent->Start(std::chrono::seconds(5)).ok());
  ASSERT_TRUE(WaitFor([&] { return !server.FinalStatus().is_null(); }, std::chrono::seconds(10)));
  const json st = server.FinalStatus();
  EXPECT_EQ(st["state"], "failed");
  const std::string message = st.value("message", "");
  EXPECT_NE(message.find("MPS isolation requested"), std::string::npos) << message;
  EXPECT_NE(message.find("nvidia-cuda-mps-control"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(root_ + "/ran"));
  agent->Stop(true);
}

TEST_F(AgentMpsTest, SimulatedGpusGetTheVariablesButNoDaemon) {
  FakeServer server(MpsAssignment("echo \"$CUDA_MPS_PIPE_DIRECTORY\" > " + out_ + "/task-env"));
  AgentOptions o = AgentOpts(server, FAKE_MPS_CONTROL);
  o.simulate = "4xA100-80GB";
  Agent* agent = CreateAgent(o);
  ASSERT_NE(agent, nullptr);
  ASSERT_TRUE(agent->inventory().simulated);
  const std::string uuid = agent->inventory().gpus.at(1).uuid;
  ASSERT_TRUE(agent->Start(std::chrono::seconds(5)).ok());
  ASSERT_TRUE(WaitFor([&] { return server.Reported("succeeded"); }, std::chrono::seconds(10)))
      << server.FinalStatus().dump();
  EXPECT_EQ(Slurp(out_ + "/task-env"), fmt::format("{}/mps/{}/pipe\n", root_, uuid));
  EXPECT_FALSE(fs::exists(AgentPipe(uuid) + "/starts"));
  agent->Stop(true);
}

}  // namespace
}  // namespace gpupool
