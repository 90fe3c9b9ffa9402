// What the MPS tests share (mps_test.cc, agent_mps_test.cc): a fixture that gives each test its own
// directories for the fake nvidia-cuda-mps-control of tests/fake_mps and stops whatever fake
// daemons and servers a test left running; and for whole agents, a fake server that hands out
// assignments and keeps the status reports.
#pragma once

#include <fmt/format.h>
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
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "agent/agent.h"
#include "agent/mps.h"
#include "agent/runtime_internal.h"

#if !defined(FAKE_MPS_CONTROL) || !defined(FAKE_NVML_PATH) || !defined(FAKE_MPS_CLIENT)
#error \
    "FAKE_MPS_CONTROL and FAKE_MPS_CLIENT must name the fakes of tests/fake_mps, FAKE_NVML_PATH the fake NVML"
#endif

namespace gpupool::mps_test {

namespace fs = std::filesystem;

inline std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::vector<std::string> Lines(const std::string& path) {
  std::vector<std::string> out;
  std::istringstream in(Slurp(path));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

inline bool Alive(pid_t pid) {
  auto st = agent_internal::ReadProcStat(pid);
  return st.has_value() && st->state != 'Z';
}

inline bool WaitFor(const std::function<bool()>& pred,
                    std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

inline bool IsFifo(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
}

// What the fake daemon with pipe directory `pipe` holds for the MPS server of `uid` (its
// servers/<uid> file: pid, threads, pinned); empty when it has none.
inline std::map<std::string, std::string> ServerState(const std::string& pipe, int64_t uid) {
  std::map<std::string, std::string> out;
  for (const std::string& line : Lines(fmt::format("{}/servers/{}", pipe, uid))) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
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
    // Whatever a failed test left running: the fake daemons it started and their servers, by their
    // recorded pids.
    std::error_code ec;
    for (const auto& entry : fs::recursive_directory_iterator(root_, ec)) {
      const bool starts = entry.path().filename() == "starts";
      const bool server = entry.path().parent_path().filename() == "servers";
      if (!starts && !server) continue;
      for (std::string line : Lines(entry.path().string())) {
        if (server && line.rfind("pid=", 0) != 0) continue;
        if (server) line = line.substr(4);
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

// ---- whole agents: mps tasks on real (fake NVML) GPUs -------------------------------------------

using nlohmann::json;

// Just enough of the server for an agent: registration, heartbeats that hand out `assignments`,
// and the task status reports, kept for the test to read.
class FakeServer {
 public:
  explicit FakeServer(json assignments) : assignments_(std::move(assignments)) {
    srv_.Post("/api/v1/agent/register", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"heartbeatIntervalSeconds":0.1})", "application/json");
    });
    srv_.Post(R"(/api/v1/agent/nodes/([^/]+)/heartbeat)",
              [this](const httplib::Request&, httplib::Response& res) {
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

// One mps task on GPU 1 running `script` (a share of `share_milli` and `memory` of its memory).
inline json MpsAssignment(const std::string& script, int share_milli = 500,
                          const std::string& memory = "10Gi") {
  return json::array({{{"jobId", "j-000000000007"},
                       {"index", 0},
                       {"desired", "run"},
                       {"state", "assigned"},
                       {"name", "infer/server-0"},
                       {"tenant", "vision"},
                       {"qos", "guaranteed"},
                       {"isolation", "mps"},
                       {"command", {"/bin/sh", "-c", script}},
                       {"env", json::object()},
                       {"bundle", ""},
                       {"rootfs", ""},
                       {"restarts", 0},
                       {"cpu", "0"},
                       {"memory", "0"},
                       {"gpus", json::array({{{"index", 1}, {"share", share_milli}, {"memory", memory}}})}}});
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
  // The uid the agent runs a task without runAs as: nobody in its sandbox (as root), else its own.
  static int64_t DefaultTaskUid() { return ::geteuid() == 0 ? 65534 : ::geteuid(); }
  // Where the agent keeps GPU `uuid`'s MPS pipe directory.
  std::string AgentPipe(const std::string& uuid) const { return fmt::format("{}/mps/{}/pipe", root_, uuid); }

  std::unique_ptr<Agent> agent_;
};

}  // namespace gpupool::mps_test
