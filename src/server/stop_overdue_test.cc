// A stop its agent does not confirm by the deadline: held while the node still heartbeats (its
// run may still be going, and nothing fences it), released once the node is lost.
#include <gtest/gtest.h>

#include <string>

#include "server/http_api_fixture_test.h"

namespace gpupool {
namespace {

using namespace testing_api;

class StopOverdueTest : public HttpApiTest {
 protected:
  void SetUp() override {
    HttpApiTest::SetUp();
    config_.wall_clock_ms = [this] { return wall_ms_; };
    config_.mono_clock_s = [this] { return mono_s_; };
    config_.heartbeat_timeout_seconds = 10;
    config_.grace_period_seconds = 5;
    Open();
  }
  void Pass(int seconds) {
    wall_ms_ += 1000LL * seconds;
    mono_s_ += seconds;
  }
  void Beat(const std::string& node) {
    Reply r = Post("/api/v1/agent/nodes/" + node + "/heartbeat", "{}", Cred(node));
    ASSERT_EQ(r.status, 200) << r.raw;
  }
  json Events(const std::string& id) { return Get("/api/v1/jobs/" + id + "/events?limit=100").body["items"]; }
  int64_t wall_ms_ = 1'780'000'000'000;
  double mono_s_ = 1000;
};

bool HasEvent(const json& items, const std::string& type) {
  for (const json& e : items)
    if (e["type"] == type) return true;
  return false;
}

TEST_F(StopOverdueTest, AnUnconfirmedStopOnANodeThatHeartbeatsIsHeldAndReleasedWhenTheNodeIsLost) {
  AddNode("n1", 1);
  const std::string body = R"({"name": "w", "tasks": [{"name": "w", "resources": {"cpu": "1", "memory": "1Gi", "gpu": 1},
    "command": ["x"]}]})";
  const std::string a = Submit(body);
  service_->RunCycle();
  Report(a, 0, "running");
  ASSERT_EQ(Post("/api/v1/jobs/" + a + "/cancel", "").status, 200);
  ASSERT_EQ(Job(a)["tasks"][0]["state"], "stopping");
  // Waiting for the GPU: a second job.
  const std::string b = Submit(body);
  // Well past the deadline (grace 5 s + timeout 10 s), the agent heartbeating all along but never
  // confirming the stop.
  for (int i = 0; i < 6; ++i) {
    Pass(5);
    Beat("n1");
    service_->RunCycle();
  }
  EXPECT_EQ(Job(a)["tasks"][0]["state"], "stopping") << "released while its run may still go on";
  EXPECT_EQ(State(b), "pending") << "its GPU given while the run may still hold it";
  EXPECT_TRUE(HasEvent(Events(a), "StopOverdue")) << Events(a).dump();
  int overdue = 0;
  for (const json& e : Events(a)) overdue += e["type"] == "StopOverdue" ? 1 : 0;
  EXPECT_EQ(overdue, 1) << "said once";
  // The agent confirms at last: released, and the waiting job placed.
  Report(a, 0, "stopped");
  service_->RunCycle();
  EXPECT_EQ(State(a), "cancelled");
  EXPECT_EQ(Job(b)["tasks"][0]["state"], "assigned");
  // The same again, but the node falls silent: lost after the timeout, its run fenced by its lease,
  // so the stop is released with the node.
  ASSERT_EQ(Post("/api/v1/jobs/" + b + "/cancel", "").status, 200);
  const std::string c = Submit(body);
  Pass(16);
  service_->RunCycle();
  Pass(11);
  service_->RunCycle();
  EXPECT_EQ(State(b), "cancelled") << Job(b).dump();
  EXPECT_TRUE(service_->CheckInvariants().ok());
  (void)c;
}

}  // namespace
}  // namespace gpupool
