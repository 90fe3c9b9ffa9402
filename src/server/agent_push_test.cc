// A real agent against a real server (PoolService behind HttpApi), its heartbeat and its own task
// checks set so far apart that only the push mechanisms can explain a job finishing in time: the
// assignment watch (the server answers the agent's long poll when the task is placed) and the
// child-exit wake (the agent reports the end the moment the task's supervisor exits).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <cstdlib>
#include <thread>

#include <httplib.h>

#include "agent/agent.h"
#include "server/http_api.h"
#include "server/service.h"
#include "store/sqlite_store.h"

namespace gpupool {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

constexpr char kAdmin[] = "admin-token-push-0123456";
constexpr char kBootstrap[] = "agent-token-push-0123456";

class AgentPushTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpupool-push-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::filesystem::create_directories(dir_ + "/server");
    std::filesystem::create_directories(dir_ + "/agent");
    ServerConfig c;
    c.data_dir = dir_ + "/server";
    c.profile = "bestfit";
    c.sync_full = false;
    c.heartbeat_interval_seconds = 30;
    c.heartbeat_timeout_seconds = 120;
    c.http.workers = 4;
    c.tokens[kAdmin] = Principal{"", Role::kAdmin};
    c.tokens[kBootstrap] = Principal{"", Role::kAgent};
    c.tls.agent_ca_file = agent_ca_;
    auto store = OpenSqliteStore({c.data_dir + "/gpupool.db", false});
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto service = PoolService::Open(c, std::move(store).value());
    ASSERT_TRUE(service.ok()) << service.status().ToString();
    service_ = std::move(service).value();
    service_->Start();
    api_ = std::make_unique<HttpApi>(*service_, c);
    auto bound = api_->Start("127.0.0.1", 0);
    ASSERT_TRUE(bound.ok()) << bound.status().ToString();
    port_ = *bound;
  }
  void TearDown() override {
    if (agent_) agent_->Stop(true);
    agent_.reset();
    if (api_) api_->Stop();
    if (service_) service_->Stop();
    api_.reset();
    service_.reset();
    std::filesystem::remove_all(dir_);
  }
  void StartAgent(const std::function<void(AgentOptions&)>& tweak) {
    AgentOptions o;
    o.server = "http://127.0.0.1:" + std::to_string(port_);
    o.token = kBootstrap;
    o.node = "push-node";
    o.cpu = "4";
    o.memory = "8Gi";
    o.simulate = "1xA100-80GB";
    o.state_dir = dir_ + "/agent";
    o.heartbeat_seconds = 30;        // after the first, no heartbeat within the test
    o.assignment_poll_seconds = 0;   // no assignment polls between heartbeats
    o.poll_seconds = 60;             // the loop looks at its tasks only when woken
    tweak(o);
    auto agent = Agent::Create(o);
    ASSERT_TRUE(agent.ok()) << agent.status().ToString();
    agent_ = std::move(agent).value();
    ASSERT_TRUE(agent_->Start(5s).ok());
    std::this_thread::sleep_for(300ms);  // past its first heartbeat
  }
  std::string Submit(const std::string& command) {
    const std::string spec = R"({"name": "push", "tasks": [{"name": "t", "resources": {"cpu": "0.1", "memory": "64Mi",
        "gpu": 0.25}, "command": )" + command + "}]}";
    auto r = service_->SubmitJob(Principal{"", Role::kAdmin}, spec, SpecFormat::kJson);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? (*r)["id"].get<std::string>() : "";
  }
  std::string State(const std::string& id) {
    auto r = service_->GetJob(Principal{"", Role::kAdmin}, id);
    return r.ok() ? r->value("state", "?") : "?";
  }
  // The whole job, for a failure's message: its state alone does not say why.
  std::string Job(const std::string& id) {
    auto r = service_->GetJob(Principal{"", Role::kAdmin}, id);
    return r.ok() ? r->dump() : r.status().ToString();
  }
  bool WaitForState(const std::string& id, const std::string& want, std::chrono::seconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      if (State(id) == want) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

  std::string agent_ca_;  // set before SetUp: the server's tls.agentCA
  std::string dir_;
  std::unique_ptr<PoolService> service_;
  std::unique_ptr<HttpApi> api_;
  int port_ = 0;
  std::unique_ptr<Agent> agent_;
};

// Without the watch nothing would reach the agent before its next heartbeat (30 s), and without
// the child-exit wake its loop would not look at the task again for 60 s.
TEST_F(AgentPushTest, APushedTaskStartsAndItsEndIsReportedWithoutPollsOrHeartbeats) {
  ASSERT_NO_FATAL_FAILURE(StartAgent([](AgentOptions&) {}));
  for (int i = 0; i < 3; ++i) {
    const std::string id = Submit(R"(["true"])");
    EXPECT_TRUE(WaitForState(id, "succeeded", 20s)) << Job(id);
  }
  // A cancel is pushed too: the running task is stopped and its end reported.
  const std::string long_one = Submit(R"(["sleep", "600"])");
  ASSERT_TRUE(WaitForState(long_one, "running", 20s)) << State(long_one);
  auto c = service_->CancelJob(Principal{"", Role::kAdmin}, long_one);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(WaitForState(long_one, "cancelled", 20s)) << State(long_one);
}

// The fallback: an agent told not to watch polls, and still runs what it is given.
TEST_F(AgentPushTest, AnAgentWithoutTheWatchPollsAsBefore) {
  ASSERT_NO_FATAL_FAILURE(StartAgent([](AgentOptions& o) {
    o.watch_assignments = false;
    o.wake_on_child_exit = false;
    o.assignment_poll_seconds = 0.1;
    o.poll_seconds = 0.05;
  }));
  const std::string id = Submit(R"(["true"])");
  EXPECT_TRUE(WaitForState(id, "succeeded", 20s)) << Job(id);
}

// What a node keeps of a task ends with the task: once its end is reported and the task is gone
// from the node's assignments (the next placement pushes the new list), its placement record
// (runs/<run>) and its runtime state go; only its logs stay, for `gpupool logs`.
TEST_F(AgentPushTest, AFinishedTaskLeavesOnlyItsLogsBehind) {
  ASSERT_NO_FATAL_FAILURE(StartAgent([](AgentOptions&) {}));
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    ids.push_back(Submit(R"(["true"])"));
    ASSERT_TRUE(WaitForState(ids.back(), "succeeded", 20s)) << ids.back() << " is " << State(ids.back());
  }
  const std::string runs = dir_ + "/agent/runs/";
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = true;
    for (size_t k = 0; k + 1 < ids.size(); ++k) gone = gone && !std::filesystem::exists(runs + ids[k] + ".0");
    if (!gone) std::this_thread::sleep_for(50ms);
  }
  for (size_t k = 0; k + 1 < ids.size(); ++k) {
    EXPECT_FALSE(std::filesystem::exists(runs + ids[k] + ".0")) << ids[k];
    EXPECT_FALSE(std::filesystem::exists(dir_ + "/agent/process/" + ids[k] + ".0/task.json")) << ids[k];
  }
}

// An agent that serves its log endpoint over TLS (--tls-cert) advertises https://host:port: it
// registers (the server once refused any endpoint but http://) and the server reads its tasks'
// logs over TLS, checking the agent's certificate against tls.agentCA.
class AgentTlsTest : public AgentPushTest {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpupool-agent-tls-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    certs_ = tmpl;
    const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string script =
        "cd " + certs_ + " && openssl req -x509 " + ec +
        " -keyout ca.key -out ca.pem -days 2 -subj /CN=test-ca 2>/dev/null && openssl req " + ec +
        " -keyout agent.key -out agent.csr -subj /CN=push-node 2>/dev/null && printf 'subjectAltName=IP:127.0.0.1' > "
        "san.ext && openssl x509 -req -in agent.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out agent.pem "
        "-days 2 -extfile san.ext 2>/dev/null";
    ASSERT_EQ(std::system(("bash -c \"" + script + "\"").c_str()), 0) << "openssl failed";
    agent_ca_ = certs_ + "/ca.pem";
    AgentPushTest::SetUp();
  }
  void TearDown() override {
    AgentPushTest::TearDown();
    std::filesystem::remove_all(certs_);
  }
  std::string certs_;
};

TEST_F(AgentTlsTest, AnAgentServingItsLogsOverTlsRegistersAndItsLogsAreReadThroughTheServer) {
  ASSERT_NO_FATAL_FAILURE(StartAgent([this](AgentOptions& o) {
    o.metrics_listen = "127.0.0.1:0";
    o.advertise_host = "127.0.0.1";
    o.tls_cert_file = certs_ + "/agent.pem";
    o.tls_key_file = certs_ + "/agent.key";
  }));
  const std::string id = Submit(R"(["sh", "-c", "echo hello over tls"])");
  ASSERT_TRUE(WaitForState(id, "succeeded", 20s)) << Job(id);
  httplib::Client api("127.0.0.1", port_);
  auto r = api.Get("/api/v1/jobs/" + id + "/tasks/0/logs", {{"Authorization", std::string("Bearer ") + kAdmin}});
  ASSERT_TRUE(r) << "no answer";
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->body, "hello over tls\n");
}

}  // namespace
}  // namespace gpupool
