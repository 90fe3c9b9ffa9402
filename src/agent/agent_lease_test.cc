// Whole agents against a fake server: lease fencing (a server that stops answering gets the tasks
// fenced, a closed port does not) and the heartbeat's `gpus` (simulated load, --sim-faults, real
// GPUs through the fake NVML).
#include <sys/mount.h>
#include <sys/stat.h>

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "agent/agent.h"
#include "agent/runtime_internal.h"
#include "agent/sandbox_test_util.h"
#include "agent/scratch_disk.h"

namespace gpupool {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The mount points under `dir` (from /proc/self/mountinfo).
std::vector<std::string> MountsUnder(const std::string& dir) {
  std::vector<std::string> out;
  std::istringstream in(Slurp("/proc/self/mountinfo"));
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string id, parent, devno, root, point;
    f >> id >> parent >> devno >> root >> point;
    if (point.rfind(dir, 0) == 0) out.push_back(point);
  }
  return out;
}

bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 5s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

json Task(const std::string& job, const std::string& script, int share_milli = 500) {
  return {{"jobId", job},        {"index", 0},        {"desired", "run"},   {"state", "assigned"},
          {"name", "t/w-0"},     {"tenant", "t"},     {"qos", "guaranteed"}, {"isolation", "timeslice"},
          {"command", {"/bin/sh", "-c", script}},    {"env", json::object()},
          {"bundle", ""},        {"rootfs", ""},      {"restarts", 0},      {"cpu", "0"}, {"memory", "0"},
          {"gpus", json::array({{{"index", 1}, {"share", share_milli}, {"memory", "10Gi"}}})}};
}

// The same task as the server lists it once it is being preempted.
json Stopping(json task) {
  task["desired"] = "stop";
  task["state"] = "stopping";
  task["gracePeriodSeconds"] = 5;
  task["reason"] = "preempted";
  return task;
}

// Registration, heartbeats and assignment polls that hand out `assignments`, status reports. The
// heartbeat answers 503 while `failing`; both answers carry heartbeatTimeoutSeconds.
class LeaseServer {
 public:
  LeaseServer(json assignments, double timeout_s) : assignments_(std::move(assignments)), timeout_s_(timeout_s) {
    srv_.Post("/api/v1/agent/register", [this](const httplib::Request& req, httplib::Response& res) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        registration_ = json::parse(req.body, nullptr, false);
      }
      res.set_content(json{{"heartbeatIntervalSeconds", 0.2}, {"heartbeatTimeoutSeconds", timeout_s_}}.dump(),
                      "application/json");
    });
    srv_.Post(R"(/api/v1/agent/nodes/([^/]+)/heartbeat)", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard<std::mutex> lock(mu_);
      heartbeats_.push_back(json::parse(req.body));
      if (failing_) {
        res.status = 503;
        res.set_content(R"({"error":{"code":"Unavailable","message":"down"}})", "application/json");
        return;
      }
      json out{{"assignments", assignments_}, {"heartbeatTimeoutSeconds", timeout_s_}};
      if (!version_.empty()) out["version"] = version_;
      res.set_content(out.dump(), "application/json");
    });
    srv_.Get(R"(/api/v1/agent/nodes/([^/]+)/assignments)", [this](const httplib::Request&, httplib::Response& res) {
      std::lock_guard<std::mutex> lock(mu_);
      json out{{"assignments", assignments_}};
      if (!version_.empty()) out["version"] = version_;
      res.set_content(out.dump(), "application/json");
    });
    srv_.Post(R"(/api/v1/agent/nodes/([^/]+)/tasks/([^/]+)/(\d+)/status)",
              [this](const httplib::Request& req, httplib::Response& res) {
                std::lock_guard<std::mutex> lock(mu_);
                if (failing_) {
                  res.status = 503;
                  return;
                }
                json s = json::parse(req.body);
                s["job"] = std::string(req.matches[2]);
                statuses_.push_back(s);
                res.set_content("{}", "application/json");
              });
    port_ = srv_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { srv_.listen_after_bind(); });
  }
  ~LeaseServer() { Close(); }
  void Close() {
    if (!thread_.joinable()) return;
    srv_.stop();
    thread_.join();
  }
  std::string url() const { return fmt::format("http://127.0.0.1:{}", port_); }
  void SetFailing(bool f) {
    std::lock_guard<std::mutex> lock(mu_);
    failing_ = f;
  }
  void SetAssignments(json a, std::string version = "") {
    std::lock_guard<std::mutex> lock(mu_);
    assignments_ = std::move(a);
    version_ = std::move(version);
  }
  json Status(const std::string& job, const std::string& state) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const json& s : statuses_)
      if (s["job"] == job && s["state"] == state) return s;
    return nullptr;
  }
  // Reports about `job` carrying run id `run`.
  size_t Statuses(const std::string& job, const std::string& run) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (const json& st : statuses_) n += st["job"] == job && st.value("runId", "") == run ? 1 : 0;
    return n;
  }
  json Registration() {
    std::lock_guard<std::mutex> lock(mu_);
    return registration_;
  }
  json LastHeartbeat() {
    std::lock_guard<std::mutex> lock(mu_);
    return heartbeats_.empty() ? json(nullptr) : heartbeats_.back();
  }
  size_t HeartbeatCount() {
    std::lock_guard<std::mutex> lock(mu_);
    return heartbeats_.size();
  }

 private:
  httplib::Server srv_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mu_;
  json registration_ = json::object();
  json assignments_;
  std::string version_;  // the lists' "version"; empty: none (a server of before watches)
  double timeout_s_;
  bool failing_ = false;
  std::vector<json> heartbeats_;
  std::vector<json> statuses_;
};

class AgentLeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::unsetenv("GPUPOOL_FAKE_NVML");
    char tmpl[] = "/tmp/gpupool-lease-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    // Sandboxed tasks (as nobody: the fake server sends no runAs) leave their marks here.
    ::chmod(root_.c_str(), 0777);
  }
  void TearDown() override {
    if (agent_) agent_->Stop(true);
    agent_.reset();
    // A scratch disk a failed test left mounted (a run the agent had not forgotten yet).
    for (const std::string& m : MountsUnder(root_ + "/")) (void)::umount2(m.c_str(), MNT_DETACH);
    ::unsetenv("GPUPOOL_FAKE_NVML");
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  AgentOptions Opts(const std::string& server) const {
    AgentOptions o;
    o.server = server;
    o.node = "lease-node";
    o.cpu = "4";
    o.memory = "8Gi";
    o.simulate = "2xA100-80GB";
    o.state_dir = root_ + "/state";
    o.poll_seconds = 0.05;
    o.heartbeat_seconds = 0.2;
    o.assignment_poll_seconds = 0.1;
    return o;
  }
  Agent* Create(const AgentOptions& o) {
    auto agent = Agent::Create(o);
    EXPECT_TRUE(agent.ok()) << agent.status().ToString();
    if (!agent.ok()) return nullptr;
    agent_ = std::move(agent).value();
    return agent_.get();
  }
  std::string ExitJson(const std::string& job) const {
    return Slurp(fmt::format("{}/state/process/{}.0/exit.json", root_, job));
  }

  std::string root_;
  std::unique_ptr<Agent> agent_;
};

TEST(LeaseFenceOffsets, TwoAndOneSecondsBeforeTheEndClampedForShortLeases) {
  int64_t term = 0, kill = 0;
  LeaseFenceOffsets(6, &term, &kill);
  EXPECT_EQ(term, 4000);
  EXPECT_EQ(kill, 5000);
  LeaseFenceOffsets(30, &term, &kill);
  EXPECT_EQ(term, 28000);
  EXPECT_EQ(kill, 29000);
  LeaseFenceOffsets(3, &term, &kill);
  EXPECT_EQ(term, 1000);
  EXPECT_EQ(kill, 2000);
  LeaseFenceOffsets(1.5, &term, &kill);
  EXPECT_EQ(term, 500);
  EXPECT_EQ(kill, 1000);
}

TEST_F(AgentLeaseTest, ServerThatStopsAnsweringGetsTheTasksFencedAndNoNewTaskStarts) {
  const std::string marker = root_ + "/term";
  LeaseServer server(json::array({Task("j-000000000001", fmt::format(
                                           "trap 'echo term > {}' TERM; while true; do sleep 0.1; done", marker))}),
                     3);
  Agent* agent = Create(Opts(server.url()));
  ASSERT_NE(agent, nullptr);
  ASSERT_TRUE(agent->Start(5s).ok());
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000001", "running").is_null(); }, 10s));
  const auto lease = agent_internal::ReadLeaseFile(agent->lease_path());
  ASSERT_TRUE(lease.has_value());
  EXPECT_TRUE(agent->LeaseValid());

  // Heartbeats now fail with 503 (no renewal); assignment polls still answer.
  server.SetFailing(true);
  const auto failed_at = std::chrono::steady_clock::now();
  // TERM at lease end - 2 s, KILL at - 1 s (timeout 3 s: +1 s, +2 s after the last renewal).
  ASSERT_TRUE(WaitFor([&] { return !ExitJson("j-000000000001").empty(); }, 6s));
  EXPECT_LT(std::chrono::steady_clock::now() - failed_at, 3500ms);
  EXPECT_EQ(ExitJson("j-000000000001"), "{\"signal\":9,\"fenced\":true}\n");
  EXPECT_EQ(Slurp(marker), "term\n") << "SIGTERM came before SIGKILL";
  EXPECT_FALSE(agent->LeaseValid());
  // A new task comes with an assignment poll (which renews nothing): it must not start.
  server.SetAssignments(json::array(
      {Task("j-000000000001", fmt::format("trap 'echo term > {}' TERM; while true; do sleep 0.1; done", marker)),
       Task("j-000000000002", "echo ran > " + root_ + "/ran")}));
  std::this_thread::sleep_for(700ms);
  EXPECT_FALSE(fs::exists(root_ + "/ran")) << "no new task while the lease is expired";

  // The server answers again: the fenced task is reported stopped, and the new task starts.
  server.SetFailing(false);
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000001", "stopped").is_null(); }, 10s));
  const std::string message = server.Status("j-000000000001", "stopped").value("message", "");
  EXPECT_NE(message.find("fenced: no contact with the server for"), std::string::npos) << message;
  EXPECT_TRUE(WaitFor([&] { return fs::exists(root_ + "/ran"); }, 10s));
}

// Restarts of the agent never run a task twice: a run an earlier agent started is adopted even when
// the server now wants it stopped, and a run that ended while no agent watched is reported as it
// ended, not started again.
TEST_F(AgentLeaseTest, ARestartedAgentAdoptsARunTheServerWantsStopped) {
  const std::string starts = root_ + "/starts", term = root_ + "/term";
  json task = Task("j-000000000004", fmt::format("echo x >> {}; trap 'echo term > {}; exit 0' TERM; "
                                                 "while true; do sleep 0.1; done",
                                                 starts, term));
  LeaseServer server(json::array({task}), 30);
  ASSERT_NE(Create(Opts(server.url())), nullptr);
  ASSERT_TRUE(agent_->Start(5s).ok());
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000004", "running").is_null(); }, 10s));
  agent_->Stop(false);  // the agent goes; its task runs on
  agent_.reset();
  server.SetAssignments(json::array({Stopping(task)}));
  ASSERT_NE(Create(Opts(server.url())), nullptr);
  ASSERT_TRUE(agent_->Start(5s).ok());
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000004", "stopped").is_null(); }, 10s));
  EXPECT_EQ(server.Status("j-000000000004", "stopped").value("message", ""), "exit code 0");
  EXPECT_EQ(Slurp(term), "term\n") << "the adopted run got its SIGTERM";
  EXPECT_EQ(Slurp(starts), "x\n") << "started once";
}

// A task in its third run (restarts 2) that the server wants stopped, by a live agent and by one
// restarted meanwhile: the stop names the run, the way the run itself was named. A stop entry
// once read without its restarts named the first run ("j-...0"), so a restarted agent never
// adopted the running third run: it ran on unwatched, and the server, told of no stop, placed the
// task again beside it.
TEST_F(AgentLeaseTest, AStopReachesTheRunItNamesAfterRestartsAlsoThroughARestartedAgent) {
  for (const bool restart_agent : {false, true}) {
    SCOPED_TRACE(restart_agent ? "restarted agent" : "live agent");
    const std::string tag = restart_agent ? "-restarted" : "-live";
    const std::string starts = root_ + "/starts" + tag, term = root_ + "/term" + tag;
    const std::string job = restart_agent ? "j-000000000007" : "j-000000000008";
    json task = Task(job, fmt::format("echo x >> {}; trap 'echo term > {}; exit 0' TERM; "
                                      "while true; do sleep 0.1; done",
                                      starts, term));
    task["restarts"] = 2;
    task["runId"] = "r-00000000000000000000000000000002";
    LeaseServer server(json::array({task}), 30);
    ASSERT_NE(Create(Opts(server.url())), nullptr);
    ASSERT_TRUE(agent_->Start(5s).ok());
    ASSERT_TRUE(WaitFor([&] { return !server.Status(job, "running").is_null(); }, 10s));
    if (restart_agent) {
      agent_->Stop(false);  // the agent goes; its task runs on
      agent_.reset();
    }
    server.SetAssignments(json::array({Stopping(task)}));
    if (restart_agent) {
      ASSERT_NE(Create(Opts(server.url())), nullptr);
      ASSERT_TRUE(agent_->Start(5s).ok());
    }
    ASSERT_TRUE(WaitFor([&] { return !server.Status(job, "stopped").is_null(); }, 10s));
    const json stopped = server.Status(job, "stopped");
    EXPECT_EQ(stopped.value("message", ""), "exit code 0") << stopped.dump();
    EXPECT_EQ(stopped.value("restarts", -1), 2) << stopped.dump();
    EXPECT_EQ(stopped.value("runId", ""), "r-00000000000000000000000000000002") << stopped.dump();
    EXPECT_EQ(Slurp(term), "term\n") << "the run got its SIGTERM";
    EXPECT_EQ(Slurp(starts), "x\n") << "started once";
    agent_->Stop(false);
    agent_.reset();
  }
}

// Issue 19: the same task id (a job id handed out again by a server whose store was lost) with
// another placement's run id is not the old process: that one is stopped, never adopted, and the
// new placement's run starts; reports carry the run id.
TEST_F(AgentLeaseTest, AProcessOfAnotherPlacementIsStoppedNotAdopted) {
  const std::string starts = root_ + "/starts", pid = root_ + "/pid";
  json task = Task("j-000000000001", fmt::format("echo old >> {}; echo $$ > {}; exec sleep 60", starts, pid));
  task["runId"] = "r-0123456789abcdef0123456789abcdef";
  LeaseServer server(json::array({task}), 30);
  ASSERT_NE(Create(Opts(server.url())), nullptr);
  ASSERT_TRUE(agent_->Start(5s).ok());
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000001", "running").is_null(); }, 10s));
  EXPECT_EQ(server.Status("j-000000000001", "running").value("runId", ""), "r-0123456789abcdef0123456789abcdef");
  ASSERT_TRUE(WaitFor([&] { return !Slurp(pid).empty(); }));
  const int old_pid = std::stoi(Slurp(pid));
  agent_->Stop(false);  // the agent goes; its task runs on
  agent_.reset();
  ASSERT_EQ(::kill(old_pid, 0), 0) << "the old run keeps running without its agent";

  // Another tenant's job got the same id, placed here: a new run id.
  json other = Task("j-000000000001", fmt::format("echo new >> {}; exec sleep 60", starts));
  other["runId"] = "r-fedcba9876543210fedcba9876543210";
  server.SetAssignments(json::array({other}));
  ASSERT_NE(Create(Opts(server.url())), nullptr);
  ASSERT_TRUE(agent_->Start(5s).ok());
  ASSERT_TRUE(WaitFor([&] { return ::kill(old_pid, 0) != 0; }, 10s)) << "the old run was not stopped";
  ASSERT_TRUE(WaitFor([&] { return Slurp(starts) == "old\nnew\n"; }, 10s)) << Slurp(starts);
  ASSERT_TRUE(WaitFor([&] { return server.Statuses("j-000000000001", "r-fedcba9876543210fedcba9876543210") == 1; },
                      10s));
  std::this_thread::sleep_for(300ms);
  // Nothing was reported of the old run after the restart (it is nobody's task now).
  EXPECT_EQ(server.Statuses("j-000000000001", "r-0123456789abcdef0123456789abcdef"), 1u);
}

TEST_F(AgentLeaseTest, ARunThatEndedWhileNoAgentWatchedIsReportedNotRerun) {
  const std::string starts = root_ + "/starts";
  LeaseServer server(json::array({Task("j-000000000005", fmt::format("echo x >> {}; sleep 0.5; exit 7", starts))}),
                     30);
  ASSERT_NE(Create(Opts(server.url())), nullptr);
  ASSERT_TRUE(agent_->Start(5s).ok());
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000005", "running").is_null(); }, 10s));
  agent_->Stop(false);
  agent_.reset();
  std::this_thread::sleep_for(1s);  // the run ends with no agent
  ASSERT_NE(Create(Opts(server.url())), nullptr);
  ASSERT_TRUE(agent_->Start(5s).ok());
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000005", "failed").is_null(); }, 10s));
  EXPECT_EQ(server.Status("j-000000000005", "failed").value("exitCode", -1), 7);
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(Slurp(starts), "x\n") << "started once";
}

// The heartbeat's answer and the watch's come on two threads, and the later may be the older list:
// one that still names a run the agent has since seen end, reported and forgotten. Started again,
// that run would be a second copy of the task beside its next run (the chaos test's `double`).
TEST_F(AgentLeaseTest, AnOlderListNeverStartsARunAgain) {
  const std::string starts = root_ + "/starts";
  const json task = Task("j-000000000006", fmt::format("echo x >> {}", starts));
  LeaseServer server(json::array({task}), 30);
  server.SetAssignments(json::array({task}), "0123456789abcdef-7");
  ASSERT_NE(Create(Opts(server.url())), nullptr);
  ASSERT_TRUE(agent_->Start(5s).ok());
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000006", "succeeded").is_null(); }, 10s));
  server.SetAssignments(json::array(), "0123456789abcdef-8");  // the server saw it end
  std::this_thread::sleep_for(500ms);                          // the agent forgets it
  server.SetAssignments(json::array({task}), "0123456789abcdef-7");  // a late answer
  std::this_thread::sleep_for(800ms);
  EXPECT_EQ(Slurp(starts), "x\n") << "an older list started the run again";
  EXPECT_NE(agent_->MetricsText().find("gpupool_agent_stale_assignment_lists_total{node=\"lease-node\"} "),
            std::string::npos);
  EXPECT_EQ(agent_->MetricsText().find("gpupool_agent_stale_assignment_lists_total{node=\"lease-node\"} 0\n"),
            std::string::npos)
      << "the older lists were counted";
}

// An older list that also stops what the newer one placed would end a run the server wants.
TEST_F(AgentLeaseTest, AnOlderListDoesNotStopWhatANewerOnePlaced) {
  const std::string starts = root_ + "/starts";
  const json task = Task("j-000000000007", fmt::format("echo x >> {}; exec sleep 30", starts));
  LeaseServer server(json::array(), 30);
  server.SetAssignments(json::array({task}), "0123456789abcdef-5");
  ASSERT_NE(Create(Opts(server.url())), nullptr);
  ASSERT_TRUE(agent_->Start(5s).ok());
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000007", "running").is_null(); }, 10s));
  server.SetAssignments(json::array(), "0123456789abcdef-4");  // from before the placement
  std::this_thread::sleep_for(800ms);
  EXPECT_TRUE(server.Status("j-000000000007", "stopped").is_null()) << "stopped by an older list";
  EXPECT_EQ(Slurp(starts), "x\n");
}

// A restarted server's counter starts again, so lists of two server runs cannot be ordered: a run
// the agent ran, reported and forgot is still never started again by a list naming it.
TEST_F(AgentLeaseTest, ARunEndedAndForgottenIsNotStartedByAnotherServerRunsList) {
  const std::string starts = root_ + "/starts";
  const json task = Task("j-000000000008", fmt::format("echo x >> {}", starts));
  LeaseServer server(json::array(), 30);
  server.SetAssignments(json::array({task}), "aaaaaaaaaaaaaaaa-3");
  ASSERT_NE(Create(Opts(server.url())), nullptr);
  ASSERT_TRUE(agent_->Start(5s).ok());
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000008", "succeeded").is_null(); }, 10s));
  server.SetAssignments(json::array(), "aaaaaaaaaaaaaaaa-4");
  std::this_thread::sleep_for(500ms);
  server.SetAssignments(json::array({task}), "bbbbbbbbbbbbbbbb-1");
  std::this_thread::sleep_for(800ms);
  EXPECT_EQ(Slurp(starts), "x\n") << "a forgotten run started again";
}

// The spec's workingDir reaches the task: it starts there.
TEST_F(AgentLeaseTest, TheTaskStartsInItsWorkingDirectory) {
  const std::string dir = root_ + "/run-1";
  ASSERT_TRUE(agent_internal::MakeDirs(dir).ok());
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  json task = Task("j-000000000009", "pwd > where");
  task["workingDir"] = dir;
  LeaseServer server(json::array({task}), 30);
  ASSERT_NE(Create(Opts(server.url())), nullptr);
  ASSERT_TRUE(agent_->Start(5s).ok());
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000009", "succeeded").is_null(); }, 10s));
  EXPECT_EQ(Slurp(dir + "/where"), dir + "\n");
}

// A root queue's container (runAs root) whose checkpoint directory does not exist yet: the agent
// makes it, root's, under --checkpoint-root, so that runc has something to bind and the task
// writes its checkpoint there; one outside the allowed roots fails the start and names the flag
// (a root container must not get an arbitrary host directory bound in writable).
TEST_F(AgentLeaseTest, ARootContainersCheckpointDirectoryIsMadeOnlyUnderTheAllowedRoots) {
  if (::geteuid() != 0) GTEST_SKIP() << "the sandbox needs root";
  if (::access("/bin/busybox", X_OK) != 0) GTEST_SKIP() << "/bin/busybox is not installed";
  if (!agent_internal::FindExecutable("runc", agent_internal::DefaultPath()).ok()) GTEST_SKIP() << "no runc";
  const std::string images = root_ + "/images";
  ASSERT_TRUE(sandbox_test::MakeBusyboxRootfs(images + "/bb"));
  const std::string allowed = root_ + "/ckpt";
  auto boxed = [&](const std::string& job, const std::string& dir) {
    // A whole GPU: a share would need the CUDA limiter, which this static busybox image cannot load.
    json t = Task(job, "echo saved > \"$GPUPOOL_CHECKPOINT_DIR/ck\"", 1000);
    t["rootfs"] = images + "/bb";
    t["runAs"] = {{"root", true}};
    t["checkpoint"] = {{"dir", dir}, {"intervalSeconds", 60}};
    return t;
  };
  const std::string outside = root_ + "/elsewhere/c-2";
  LeaseServer server(json::array({boxed("j-000000000021", allowed + "/team/c-1"), boxed("j-000000000022", outside)}), 30);
  AgentOptions o = Opts(server.url());
  o.container_roots = {images};
  o.checkpoint_roots = {allowed};
  ASSERT_NE(Create(o), nullptr);
  ASSERT_TRUE(agent_->Start(5s).ok());
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000021", "succeeded").is_null(); }, 20s))
      << server.Status("j-000000000021", "failed").dump();
  EXPECT_EQ(Slurp(allowed + "/team/c-1/ck"), "saved\n");
  struct stat st {};
  ASSERT_EQ(::stat((allowed + "/team/c-1").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000022", "failed").is_null(); }, 20s));
  const std::string why = server.Status("j-000000000022", "failed").value("message", "");
  EXPECT_NE(why.find("checkpoint"), std::string::npos) << why;
  EXPECT_FALSE(fs::exists(outside)) << "made outside the allowed roots";
}

// Disk scratch with a sizeLimit is a file system of that size: a hostile task that writes past it
// gets ENOSPC and the node's disk keeps the rest; the mount and its image go with the run. What an
// earlier agent of the same state directory left (a run nobody will ask for) is unmounted and
// removed once the first list is applied; another agent's scratch beside it is never touched.
TEST_F(AgentLeaseTest, DiskScratchStopsAtItsSizeLimitAndGoesWithItsRun) {
  if (::geteuid() != 0) GTEST_SKIP() << "the sandbox needs root";
  if (::access("/bin/busybox", X_OK) != 0) GTEST_SKIP() << "/bin/busybox is not installed";
  if (!agent_internal::FindExecutable("runc", agent_internal::DefaultPath()).ok()) GTEST_SKIP() << "no runc";
  auto tools = agent_internal::FindScratchDiskTools();
  ASSERT_TRUE(tools.ok()) << tools.status().ToString();
  const std::string images = root_ + "/images";
  ASSERT_TRUE(sandbox_test::MakeBusyboxRootfs(images + "/bb"));
  const std::string scratch = root_ + "/scratch";
  const std::string scope = scratch + "/" + agent_internal::CgroupScope(root_ + "/state");
  // Left by an earlier agent of this state directory: a mounted scratch disk of a run long gone.
  const std::string stale = scope + "/j-000000000099.0.r1";
  ASSERT_TRUE(agent_internal::MakeDirs(stale + "/0").ok());
  ASSERT_TRUE(agent_internal::MountScratchDisk(*tools, stale + "/0.img", stale + "/0", 2 << 20, 0, 0).ok());
  // Another agent's, beside it.
  const std::string other = scratch + "/agent-0000000000000000/j-000000000099.0.r1/0";
  ASSERT_TRUE(agent_internal::MakeDirs(other).ok());

  const std::string ckpt = root_ + "/ckpt";
  json t = Task("j-000000000031",
                "dd if=/dev/zero of=/scratch/big bs=1M count=40 2>$GPUPOOL_CHECKPOINT_DIR/dd.txt; "
                "echo rc=$? >> $GPUPOOL_CHECKPOINT_DIR/dd.txt; touch $GPUPOOL_CHECKPOINT_DIR/ready; sleep 1",
                1000);  // a whole GPU: this static busybox image cannot load the CUDA limiter
  t["rootfs"] = images + "/bb";
  t["checkpoint"] = {{"dir", ckpt + "/c-31"}, {"intervalSeconds", 60}};
  t["volumes"] = json::array({{{"scratch", {{"sizeLimit", "8Mi"}}}, {"mountPath", "/scratch"}}});
  // A limit no disk here has free: refused at start, saying so (it could never hold).
  json huge = Task("j-000000000032", "true", 1000);
  huge["rootfs"] = images + "/bb";
  huge["volumes"] = json::array({{{"scratch", {{"sizeLimit", "64Ti"}}}, {"mountPath", "/scratch"}}});
  LeaseServer server(json::array({t, huge}), 30);
  AgentOptions o = Opts(server.url());
  o.container_roots = {images};
  o.checkpoint_roots = {ckpt};
  o.scratch_root = scratch;
  ASSERT_NE(Create(o), nullptr);
  ASSERT_TRUE(agent_->Start(5s).ok());
  ASSERT_TRUE(WaitFor([&] { return fs::exists(ckpt + "/c-31/ready"); }, 20s))
      << server.Status("j-000000000031", "failed").dump();
  const std::vector<std::string> mounted = MountsUnder(scope + "/");
  ASSERT_EQ(mounted.size(), 1u) << ::testing::PrintToString(mounted);
  EXPECT_EQ(mounted[0].substr(mounted[0].rfind('/')), "/0");
  struct stat st {};
  ASSERT_EQ(::stat(mounted[0].c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 65534u);  // the task's (nobody: this server sends no runAs)
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  const std::string dd = Slurp(ckpt + "/c-31/dd.txt");
  EXPECT_NE(dd.find("No space left on device"), std::string::npos) << dd;
  EXPECT_NE(dd.find("rc=1"), std::string::npos) << dd;
  // Pruned once the first list is applied, which may finish after the task's first writes.
  EXPECT_TRUE(WaitFor([&] { return !fs::exists(stale); }, 10s)) << "an earlier agent's scratch is left";
  EXPECT_TRUE(fs::exists(other)) << "another agent's scratch was removed";
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000031", "succeeded").is_null(); }, 20s));
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000032", "failed").is_null(); }, 20s));
  const std::string why = server.Status("j-000000000032", "failed").value("message", "");
  EXPECT_NE(why.find("volume /scratch"), std::string::npos) << why;
  EXPECT_NE(why.find("a sizeLimit of 67108864 MiB is more than the"), std::string::npos) << why;
  server.SetAssignments(json::array());  // the server is done with them: the agent forgets the runs
  ASSERT_TRUE(WaitFor([&] { return MountsUnder(scope + "/").empty() && fs::is_empty(scope); }, 10s))
      << ::testing::PrintToString(MountsUnder(scope + "/"));
}

// Registry credentials others could read, or a policy skopeo could not use, stop the agent at its
// start, naming the file (not its first task with an image, much later).
TEST_F(AgentLeaseTest, AnUnsafeCredentialsFileOrABadPolicyStopsTheAgentAtItsStart) {
  const std::string auth = root_ + "/auth.json";
  {
    std::ofstream f(auth);
    f << R"({"auths": {}})";
  }
  ASSERT_EQ(::chmod(auth.c_str(), 0640), 0);
  AgentOptions o = Opts("http://127.0.0.1:9");
  o.image_auth_file = auth;
  auto agent = Agent::Create(o);
  ASSERT_FALSE(agent.ok());
  EXPECT_NE(agent.status().message().find(auth), std::string::npos) << agent.status().ToString();
  EXPECT_NE(agent.status().message().find("it is 0640"), std::string::npos) << agent.status().ToString();
  o = Opts("http://127.0.0.1:9");
  o.image_policy = root_ + "/no-policy.json";
  agent = Agent::Create(o);
  ASSERT_FALSE(agent.ok());
  EXPECT_NE(agent.status().message().find("--image-policy"), std::string::npos) << agent.status().ToString();
}

TEST_F(AgentLeaseTest, ClosedServerPortDoesNotFence) {
  auto server = std::make_unique<LeaseServer>(json::array({Task("j-000000000003", "sleep 30")}), 3);
  Agent* agent = Create(Opts(server->url()));
  ASSERT_NE(agent, nullptr);
  ASSERT_TRUE(agent->Start(5s).ok());
  ASSERT_TRUE(WaitFor([&] { return !server->Status("j-000000000003", "running").is_null(); }, 10s));
  server->Close();  // connection refused from now on
  std::this_thread::sleep_for(4500ms);
  EXPECT_EQ(ExitJson("j-000000000003"), "") << "the task still runs";
  EXPECT_TRUE(agent->LeaseValid());
}

TEST_F(AgentLeaseTest, RegistrationAdvertisesTheContainerClassesItCanRunAndNoPodNetworkItLacks) {
  LeaseServer server(json::array(), 30);
  AgentOptions o = Opts(server.url());
  o.labels["gpupool.io/network-pod"] = "true";   // an admin's label cannot promise what is not there
  o.labels["gpupool.io/runtime-kata"] = "true";  // nor a class without a binary
  o.runtime_classes["kata"] = "/nonexistent/kata-runtime";
  o.labels["zone"] = "a";
  Agent* agent = Create(o);
  ASSERT_NE(agent, nullptr);
  ASSERT_TRUE(agent->Start(5s).ok());
  const json labels = server.Registration().value("labels", json::object());
  EXPECT_EQ(labels.value("zone", ""), "a");
  EXPECT_FALSE(labels.contains("gpupool.io/network-pod")) << labels.dump();
  EXPECT_FALSE(labels.contains("gpupool.io/runtime-kata")) << labels.dump();
  const bool have_runc = agent_internal::FindExecutable("runc", agent_internal::DefaultPath()).ok();
  EXPECT_EQ(labels.value("gpupool.io/runtime-runc", ""), have_runc ? "true" : "") << labels.dump();
}

// Issue 23: a quarter GPU, time-sliced, run by the agent with the CUDA limiter it finds beside its
// binary (or is given): a program allocating device memory through the driver until refused gets
// no more than the quarter's memory (20 GiB of 80), and the driver's memory report shows the cap.
// The driver is tests/fake_cuda's; the program tests/fake_cuda/cuda_probe.
TEST_F(AgentLeaseTest, AQuarterGpuTaskCannotAllocateMoreThanItsMemory) {
  const std::string out = root_ + "/probe.out";
  // The second run is the task's own attempt to get out: LD_PRELOAD cleared and its own memory
  // limit (80 GiB) before an exec. The limiter is in its mount namespace (/etc/ld.so.preload and
  // the read-only limits file), so nothing changes.
  json task = Task("j-000000000009",
                   fmt::format("FAKE_CUDA_DEVICES=1 LD_LIBRARY_PATH={0} {1} alloc plain > {2} 2>&1; "
                               "env -u LD_PRELOAD GPUPOOL_GPU_MEMORY_BYTES=85899345920 GPUPOOL_CUDA_LEDGER= "
                               "FAKE_CUDA_DEVICES=1 LD_LIBRARY_PATH={0} {1} alloc plain > {2}.cleared 2>&1",
                               FAKE_CUDA_DIR, CUDA_PROBE_PATH, out),
                   250);
  task["gpus"][0]["memory"] = "20Gi";
  LeaseServer server(json::array({task}), 30);
  AgentOptions o = Opts(server.url());
  o.cuda_limiter = GPUPOOL_CUDA_PRELOAD_PATH;
  // An admin's label cannot claim MPS limits a simulated node does not set.
  o.labels["gpupool.io/enforce-mps"] = "true";
  ASSERT_NE(Create(o), nullptr);
  ASSERT_TRUE(agent_->Start(5s).ok());
  // The scheduler learns that the limiter holds this node's timeslice shares (QoS: guaranteed
  // shares may share a GPU with them).
  EXPECT_EQ(server.Registration()["labels"].value("gpupool.io/enforce-limiter", ""), "true");
  EXPECT_FALSE(server.Registration()["labels"].contains("gpupool.io/enforce-mps"));
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000009", "succeeded").is_null(); }, 20s)) << Slurp(out);
  std::map<std::string, uint64_t> v;
  std::istringstream lines(Slurp(out));
  for (std::string line; std::getline(lines, line);) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos && line.find_first_not_of("0123456789", eq + 1) == std::string::npos && eq + 1 < line.size())
      v[line.substr(0, eq)] = std::stoull(line.substr(eq + 1));
  }
  const uint64_t cap = uint64_t{20} << 30;
  EXPECT_EQ(v["init"], 0u) << Slurp(out);
  EXPECT_LE(v["obtained"], cap) << Slurp(out);
  EXPECT_GT(v["obtained"], cap - (uint64_t{2} << 30)) << Slurp(out);
  EXPECT_EQ(v["obtained_error"], 2u) << "CUDA_ERROR_OUT_OF_MEMORY\n" << Slurp(out);
  EXPECT_EQ(v["info_total"], cap) << Slurp(out);
  const std::string cleared = Slurp(out + ".cleared");
  EXPECT_NE(cleared.find("info_total=" + std::to_string(cap) + "\n"), std::string::npos) << cleared;
  EXPECT_NE(cleared.find("obtained_error=2\n"), std::string::npos) << cleared;
  // Without the limiter (off), the same program takes the whole simulated device.
  agent_->Stop(false);
  agent_.reset();
  json again = Task("j-000000000010", fmt::format("FAKE_CUDA_DEVICES=1 LD_LIBRARY_PATH={} {} alloc plain > {}.off 2>&1",
                                                  FAKE_CUDA_DIR, CUDA_PROBE_PATH, out),
                    250);
  server.SetAssignments(json::array({again}));
  o.cuda_limiter = "none";
  ASSERT_NE(Create(o), nullptr);
  ASSERT_TRUE(agent_->Start(5s).ok());
  EXPECT_FALSE(server.Registration()["labels"].contains("gpupool.io/enforce-limiter"));
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000010", "succeeded").is_null(); }, 20s));
  EXPECT_NE(Slurp(out + ".off").find("info_total=" + std::to_string(uint64_t{81920} << 20)), std::string::npos)
      << Slurp(out + ".off");
}

// A guaranteed task's limiter counts the driver's refusals within its grant (the device is full of
// others' use; here a fake device of 8 GiB under a 20 GiB grant): the agent reads the count from
// the task's ledger and names the job in the next heartbeat, on the GPU it holds.
TEST_F(AgentLeaseTest, AGuaranteedTasksMemoryPressureGoesOutInTheHeartbeat) {
  const std::string out = root_ + "/pressure.out";
  json task = Task("j-000000000011",
                   fmt::format("FAKE_CUDA_DEVICES=1 FAKE_CUDA_MEMORY_MIB=8192 LD_LIBRARY_PATH={} {} alloc plain > {} 2>&1; "
                               "sleep 30",
                               FAKE_CUDA_DIR, CUDA_PROBE_PATH, out),
                   250);
  task["gpus"][0]["memory"] = "20Gi";
  LeaseServer server(json::array({task}), 30);
  AgentOptions o = Opts(server.url());
  o.cuda_limiter = GPUPOOL_CUDA_PRELOAD_PATH;
  ASSERT_NE(Create(o), nullptr);
  ASSERT_TRUE(agent_->Start(5s).ok());
  ASSERT_TRUE(WaitFor([&] {
    json hb = server.LastHeartbeat();
    return hb.is_object() && hb.contains("gpus") && hb["gpus"][1].value("memoryPressureJob", "") == "j-000000000011";
  }, 20s)) << Slurp(out) << server.LastHeartbeat().dump();
  EXPECT_NE(Slurp(out).find("obtained_error=2\n"), std::string::npos) << Slurp(out);
  EXPECT_FALSE(server.LastHeartbeat()["gpus"][0].contains("memoryPressureJob"));
  // Reported once per new refusal, not in every heartbeat after.
  const size_t beats = server.HeartbeatCount();
  ASSERT_TRUE(WaitFor([&] { return server.HeartbeatCount() > beats + 1; }, 10s));
  EXPECT_FALSE(server.LastHeartbeat()["gpus"][1].contains("memoryPressureJob")) << server.LastHeartbeat().dump();
}

TEST_F(AgentLeaseTest, HeartbeatCarriesSimulatedGpuLoad) {
  LeaseServer server(json::array({Task("j-000000000004", "sleep 30", 500)}), 30);
  Agent* agent = Create(Opts(server.url()));
  ASSERT_NE(agent, nullptr);
  ASSERT_TRUE(agent->Start(5s).ok());
  ASSERT_TRUE(WaitFor([&] { return !server.Status("j-000000000004", "running").is_null(); }, 10s));
  const double gpu_memory = static_cast<double>(agent->inventory().gpus.at(1).memory_bytes);
  ASSERT_TRUE(WaitFor([&] {
    json hb = server.LastHeartbeat();
    return hb.is_object() && hb.contains("gpus") && hb["gpus"][1]["utilization"] == 0.5;
  }));
  const json gpus = server.LastHeartbeat()["gpus"];
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0], (json{{"index", 0}, {"healthy", true}, {"reason", ""}, {"temperatureC", 35.0},
                           {"utilization", 0.0}, {"memoryUsedFraction", 0.0}}));
  EXPECT_EQ(gpus[1]["index"], 1);
  EXPECT_EQ(gpus[1]["healthy"], true);
  EXPECT_DOUBLE_EQ(gpus[1]["temperatureC"].get<double>(), 35 + 45 * 0.5);
  EXPECT_DOUBLE_EQ(gpus[1]["memoryUsedFraction"].get<double>(), 10.0 * (1LL << 30) / gpu_memory);
}

TEST_F(AgentLeaseTest, SimFaultsOverrideTheSimulatedValues) {
  AgentOptions o = Opts("http://127.0.0.1:1");
  const std::string faults = root_ + "/faults.json";
  o.sim_faults = faults;
  Agent* agent = Create(o);
  ASSERT_NE(agent, nullptr);
  // No file: no overrides.
  json g = agent->GpuStatusJson();
  EXPECT_EQ(g[1]["healthy"], true);
  EXPECT_EQ(agent->sim_faults_error(), "");

  std::ofstream(faults) << R"({"gpus": {"1": {"xid": 79, "temperatureC": 95, "utilization": 1.0,
                                              "memoryUsedFraction": 0.99}}})";
  g = agent->GpuStatusJson();
  EXPECT_EQ(g[0]["healthy"], true);
  EXPECT_EQ(g[1], (json{{"index", 1}, {"healthy", false}, {"reason", "XID 79"}, {"temperatureC", 95},
                        {"utilization", 1.0}, {"memoryUsedFraction", 0.99}}));

  // A broken file: one clear error naming it; the previous overrides stay.
  std::ofstream(faults) << R"({"gpus": {"1": {"xid": 79)";
  g = agent->GpuStatusJson();
  EXPECT_EQ(g[1]["reason"], "XID 79");
  EXPECT_NE(agent->sim_faults_error().find(faults), std::string::npos) << agent->sim_faults_error();
  EXPECT_NE(agent->sim_faults_error().find("not valid JSON"), std::string::npos) << agent->sim_faults_error();
  std::ofstream(faults) << R"({"gpus": {"7": {"healthy": false}}})";
  g = agent->GpuStatusJson();
  EXPECT_NE(agent->sim_faults_error().find("'7' is not a GPU index"), std::string::npos) << agent->sim_faults_error();
  std::ofstream(faults) << R"({"gpus": {"0": {"temp": 3}}})";
  g = agent->GpuStatusJson();
  EXPECT_NE(agent->sim_faults_error().find("gpus.0.temp: unknown key"), std::string::npos) << agent->sim_faults_error();

  // healthy/reason by hand, and per-node entries on top of the shared ones.
  std::ofstream(faults) << R"({"gpus": {"0": {"healthy": false}},
                               "nodes": {"lease-node": {"gpus": {"1": {"healthy": false, "reason": "too hot"}}},
                                         "other": {"gpus": {"0": {"healthy": true}}}}})";
  g = agent->GpuStatusJson();
  EXPECT_EQ(agent->sim_faults_error(), "");
  EXPECT_EQ(g[0]["healthy"], false);
  EXPECT_EQ(g[0]["reason"], "simulated fault");
  EXPECT_EQ(g[1]["healthy"], false);
  EXPECT_EQ(g[1]["reason"], "too hot");
  EXPECT_EQ(g[1]["temperatureC"], 35.0);

  fs::remove(faults);
  g = agent->GpuStatusJson();
  EXPECT_EQ(g[0]["healthy"], true);
  EXPECT_EQ(g[1]["healthy"], true);
}

TEST_F(AgentLeaseTest, SimFaultsNeedSimulatedGpus) {
  AgentOptions o = Opts("http://127.0.0.1:1");
  o.simulate.clear();
  o.nvml_library = FAKE_NVML_PATH;
  o.sim_faults = root_ + "/faults.json";
  auto agent = Agent::Create(o);
  ASSERT_FALSE(agent.ok());
  EXPECT_NE(agent.status().message().find("--sim-faults"), std::string::npos);
}

TEST_F(AgentLeaseTest, RealGpusReportNvmlHealthAndTelemetry) {
  const std::string config = root_ + "/fake-nvml.conf";
  std::ofstream(config) << "xid.1=79\necc.2=3\n";
  ::setenv("GPUPOOL_FAKE_NVML", config.c_str(), 1);
  AgentOptions o = Opts("http://127.0.0.1:1");
  o.simulate.clear();
  o.nvml_library = FAKE_NVML_PATH;
  Agent* agent = Create(o);
  ASSERT_NE(agent, nullptr);
  ASSERT_FALSE(agent->inventory().simulated);
  const json g = agent->GpuStatusJson();
  ASSERT_EQ(g.size(), 4u);
  EXPECT_EQ(g[0]["healthy"], true);
  EXPECT_EQ(g[0]["reason"], "");
  EXPECT_EQ(g[1]["healthy"], false);
  EXPECT_EQ(g[1]["reason"], "XID 79");
  EXPECT_EQ(g[2]["healthy"], false);
  EXPECT_EQ(g[2]["reason"], "uncorrectable ECC errors: 3");
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_EQ(g[i]["index"], i);
    ASSERT_TRUE(g[i].contains("temperatureC")) << g[i].dump();
    EXPECT_GT(g[i]["temperatureC"].get<double>(), 0);
    ASSERT_TRUE(g[i].contains("utilization")) << g[i].dump();
    EXPECT_GE(g[i]["utilization"].get<double>(), 0);
    EXPECT_LE(g[i]["utilization"].get<double>(), 1);
    ASSERT_TRUE(g[i].contains("memoryUsedFraction")) << g[i].dump();
    EXPECT_GE(g[i]["memoryUsedFraction"].get<double>(), 0);
    EXPECT_LE(g[i]["memoryUsedFraction"].get<double>(), 1);
  }
}

TEST_F(AgentLeaseTest, RealGpusLeaveOutWhatTheDeviceCannotGive) {
  const std::string config = root_ + "/fake-nvml.conf";
  std::ofstream(config) << "unsupported=temperature,utilization\n";
  ::setenv("GPUPOOL_FAKE_NVML", config.c_str(), 1);
  AgentOptions o = Opts("http://127.0.0.1:1");
  o.simulate.clear();
  o.nvml_library = FAKE_NVML_PATH;
  Agent* agent = Create(o);
  ASSERT_NE(agent, nullptr);
  const json g = agent->GpuStatusJson();
  ASSERT_FALSE(g.empty());
  EXPECT_FALSE(g[0].contains("temperatureC")) << g[0].dump();
  EXPECT_FALSE(g[0].contains("utilization")) << g[0].dump();
  EXPECT_TRUE(g[0].contains("memoryUsedFraction")) << g[0].dump();
}

}  // namespace
}  // namespace gpupool
