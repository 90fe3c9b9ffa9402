// kube-node's inventory annotation against the test API server, read back by the scheduler's own
// reader (ParseKubeNode).
#include "kube/node_publisher.h"

#include <gtest/gtest.h>

#include "kube/kube_node.h"
#include "kube/kube_test_util.h"

namespace gpupool::kube {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using namespace test;  // NOLINT: the shared test helpers

class NodePublisherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<TestApiServer>(dir_.path(), std::vector<std::string>{});
    ASSERT_FALSE(server_->url().empty()) << ReadText(dir_.path() + "/server.log");
    client_ = ClientOf(*server_);
    ASSERT_NE(client_, nullptr);
  }
  void AddNode(const std::string& name) {
    json node = {{"metadata", {{"name", name}}},
                 {"status", {{"allocatable", {{"cpu", "64"}, {"memory", "512Gi"}, {"pods", "110"}}},
                             {"conditions", json::array({{{"type", "Ready"}, {"status", "True"}}})}}}};
    auto r = client_->Request("POST", "/api/v1/nodes", &node);
    ASSERT_TRUE(r.ok() && r->code == 201);
  }
  Result<KubeNode> Read(const std::string& name) {
    auto r = client_->Get("/api/v1/nodes/" + name);
    if (!r.ok()) return r.status();
    return ParseKubeNode(r->body, GpuCatalog::Builtin());
  }
  TempDir dir_;
  std::unique_ptr<TestApiServer> server_;
  std::unique_ptr<KubeClient> client_;
};

TEST_F(NodePublisherTest, TheSchedulerReadsWhatItPublishesAndAFaultIsOneMoreWriteOnly) {
  auto inv = SimulatedInventory("4xA100-80GB", "n1");
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  std::vector<GpuHealthSample> health;
  NodePublisher::Options o;
  o.node = "n1";
  o.resync = 0ms;  // read the Node every turn in this test
  NodePublisher p(client_.get(), *inv, o, [&]() -> Result<std::vector<GpuHealthSample>> { return health; });
  // No Node yet: said, nothing written.
  Status st = p.PublishOnce();
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.ToString();
  EXPECT_FALSE(p.published());
  AddNode("n1");
  ASSERT_TRUE(p.PublishOnce().ok()) << p.last_error();
  auto node = Read("n1");
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  EXPECT_EQ(node->gpu_source, "inventory");
  ASSERT_EQ(node->spec.gpus.size(), 4u);
  EXPECT_EQ(node->spec.gpus[2].uuid, (*inv).gpus[2].uuid);
  EXPECT_EQ(node->spec.gpus[2].model, "A100-80GB");
  EXPECT_EQ(node->spec.cpu.units(), 64000);  // the Node's allocatable, not the inventory's
  // Nothing changed: nothing written.
  ASSERT_TRUE(p.PublishOnce().ok());
  EXPECT_EQ(p.writes(), 1u);
  // An XID on GPU 2: one write, and the scheduler sees the GPU unhealthy.
  health = {{2, false, "XID 79", {}, {}, {}}};
  ASSERT_TRUE(p.PublishOnce().ok());
  EXPECT_EQ(p.writes(), 2u);
  node = Read("n1");
  ASSERT_TRUE(node.ok());
  EXPECT_FALSE(node->spec.gpus[2].healthy);
  EXPECT_TRUE(node->spec.gpus[1].healthy);
  // It stays unhealthy when the next sample is clean (an XID is an event), with no more writes.
  health.clear();
  ASSERT_TRUE(p.PublishOnce().ok());
  EXPECT_EQ(p.writes(), 2u);
  // Someone removes the annotation: it is written again.
  json patch = {{"metadata", {{"annotations", {{kInventoryKey, nullptr}}}}}};
  auto r = client_->Request("PATCH", "/api/v1/nodes/n1", &patch, "application/merge-patch+json");
  ASSERT_TRUE(r.ok() && r->code == 200);
  ASSERT_TRUE(p.PublishOnce().ok());
  EXPECT_EQ(p.writes(), 3u);
  EXPECT_TRUE(Read("n1").ok());
}

TEST_F(NodePublisherTest, UnchangedItReadsTheNodeOnlyEveryResyncPeriod) {
  auto inv = SimulatedInventory("2xH100-80GB", "n2");
  ASSERT_TRUE(inv.ok());
  AddNode("n2");
  NodePublisher::Options o;
  o.node = "n2";
  NodePublisher p(client_.get(), *inv, o, nullptr);
  ASSERT_TRUE(p.PublishOnce().ok());
  // The API server goes away: with nothing changed, no request is made, so nothing fails.
  server_.reset();
  EXPECT_TRUE(p.PublishOnce().ok());
  EXPECT_EQ(p.writes(), 1u);
}

}  // namespace
}  // namespace gpupool::kube
