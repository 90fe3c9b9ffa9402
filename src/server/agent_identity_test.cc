// A real agent against a real server (PoolService behind HttpApi): the node credential the
// registration answers is kept 0600 and replaces the bootstrap token; a revoked credential makes
// the agent register again; a server with a new store (another cluster) makes the agent refuse.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "agent/agent.h"
#include "server/http_api.h"
#include "server/service.h"
#include "store/sqlite_store.h"

namespace gpupool {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

constexpr char kAdmin[] = "admin-token-identity-0123";
constexpr char kBootstrap[] = "agent-token-identity-0123";

bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class AgentIdentityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpupool-identity-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::filesystem::create_directories(dir_ + "/server");
    std::filesystem::create_directories(dir_ + "/agent");
  }
  void TearDown() override {
    if (agent_) agent_->Stop(true);
    agent_.reset();
    StopPool();
    std::filesystem::remove_all(dir_);
  }
  void StartPool(int port = 0) {
    ServerConfig c;
    c.data_dir = dir_ + "/server";
    c.profile = "bestfit";
    c.sync_full = false;
    c.heartbeat_interval_seconds = 1;
    c.heartbeat_timeout_seconds = 6;
    c.http.workers = 4;
    c.tokens[kAdmin] = Principal{"", Role::kAdmin};
    c.tokens[kBootstrap] = Principal{"", Role::kAgent};
    auto store = OpenSqliteStore({c.data_dir + "/gpupool.db", false});
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto service = PoolService::Open(c, std::move(store).value());
    ASSERT_TRUE(service.ok()) << service.status().ToString();
    service_ = std::move(service).value();
    service_->Start();
    api_ = std::make_unique<HttpApi>(*service_, c);
    auto bound = api_->Start("127.0.0.1", port);
    ASSERT_TRUE(bound.ok()) << bound.status().ToString();
    port_ = *bound;
  }
  void StopPool() {
    if (api_) api_->Stop();
    if (service_) service_->Stop();
    api_.reset();
    service_.reset();
  }
  void StartAgent() {
    AgentOptions o;
    o.server = "http://127.0.0.1:" + std::to_string(port_);
    o.token = kBootstrap;
    o.node = "id-node";
    o.cpu = "4";
    o.memory = "8Gi";
    o.simulate = "1xA100-80GB";
    o.state_dir = dir_ + "/agent";
    o.poll_seconds = 0.05;
    o.heartbeat_seconds = 0.2;
    o.assignment_poll_seconds = 0.1;
    auto agent = Agent::Create(o);
    ASSERT_TRUE(agent.ok()) << agent.status().ToString();
    agent_ = std::move(agent).value();
    ASSERT_TRUE(agent_->Start(5s).ok());
  }
  std::string CredentialFile() const { return dir_ + "/agent/node-credential"; }
  std::string Credential() const {
    const json j = json::parse(Slurp(CredentialFile()), nullptr, false);
    return j.is_object() ? j.value("credential", "") : "";
  }

  std::string dir_;
  std::unique_ptr<PoolService> service_;
  std::unique_ptr<HttpApi> api_;
  int port_ = 0;
  std::unique_ptr<Agent> agent_;
};

TEST_F(AgentIdentityTest, TheAgentKeepsItsNodeCredential0600AndRegistersAgainWhenItIsRevoked) {
  ASSERT_NO_FATAL_FAILURE(StartPool());
  ASSERT_NO_FATAL_FAILURE(StartAgent());
  const std::string first = Credential();
  ASSERT_EQ(first.size(), 64u) << Slurp(CredentialFile());
  struct stat st {};
  ASSERT_EQ(::stat(CredentialFile().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  // The server knows the node by the credential, not the bootstrap token.
  ASSERT_TRUE(service_->AuthenticateNode(first).has_value());
  EXPECT_EQ(service_->AuthenticateNode(first)->node, "id-node");
  EXPECT_FALSE(service_->AuthenticateNode(kBootstrap).has_value());
  EXPECT_EQ(Slurp(dir_ + "/agent/cluster-id"), service_->cluster_id() + "\n");
  // Heartbeats with it: last used moves.
  ASSERT_TRUE(WaitFor([&] { return service_->ListNodeCredentials()["items"][0]["lastUsed"].is_string(); }));

  ASSERT_TRUE(service_->RevokeNodeCredential("id-node").ok());
  // The next heartbeat is refused (401); the agent registers again with the bootstrap token,
  // which a revoked credential allows, and keeps the new one.
  ASSERT_TRUE(WaitFor([&] { return Credential().size() == 64 && Credential() != first; }))
      << Slurp(CredentialFile());
  EXPECT_TRUE(service_->AuthenticateNode(Credential()).has_value());
  EXPECT_FALSE(service_->AuthenticateNode(first).has_value());
  EXPECT_EQ(service_->ListNodeCredentials()["items"][0]["state"], "live");
  EXPECT_EQ(service_->GetNode("id-node").value()["state"], "ready");
  EXPECT_TRUE(agent_->cluster_refusal().empty());

  // A restarted agent uses the stored credential: no new one.
  const std::string second = Credential();
  agent_->Stop(false);
  agent_.reset();
  ASSERT_NO_FATAL_FAILURE(StartAgent());
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(Credential(), second);
}

TEST_F(AgentIdentityTest, AServerWithANewStoreIsAnotherClusterAndTheAgentRefusesIt) {
  ASSERT_NO_FATAL_FAILURE(StartPool());
  ASSERT_NO_FATAL_FAILURE(StartAgent());
  const std::string old_cluster = service_->cluster_id();
  ASSERT_EQ(Slurp(dir_ + "/agent/cluster-id"), old_cluster + "\n");
  const int port = port_;
  // The store is lost; a server starts empty on the same address.
  StopPool();
  std::filesystem::remove(dir_ + "/server/gpupool.db");
  std::filesystem::remove(dir_ + "/server/gpupool.db-wal");
  std::filesystem::remove(dir_ + "/server/gpupool.db-shm");
  ASSERT_NO_FATAL_FAILURE(StartPool(port));
  ASSERT_NE(service_->cluster_id(), old_cluster);
  ASSERT_TRUE(WaitFor([&] { return !agent_->cluster_refusal().empty(); })) << "the agent did not refuse";
  EXPECT_NE(agent_->cluster_refusal().find(old_cluster), std::string::npos) << agent_->cluster_refusal();
  EXPECT_NE(agent_->MetricsText().find("gpupool_agent_cluster_mismatch{node=\"id-node\"} 1"), std::string::npos);
  // It did not join: the new pool has no node, and the agent keeps its cluster.
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(service_->ListNodes()["items"].size(), 0u);
  EXPECT_EQ(Slurp(dir_ + "/agent/cluster-id"), old_cluster + "\n");
}

}  // namespace
}  // namespace gpupool
