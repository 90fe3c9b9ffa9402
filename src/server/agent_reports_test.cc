// Batched task reports (POST /api/v1/agent/nodes/{name}/reports) over real HTTP: one call, one
// durable write, one outcome per report; a malformed entry refuses the whole call and applies
// nothing; the feature is announced to agents.
#include <gtest/gtest.h>

#include <string>

#include "server/http_api_fixture_test.h"

namespace gpupool {
namespace {

using namespace testing_api;

class AgentReportsTest : public HttpApiTest {};

TEST_F(AgentReportsTest, ReportsAreAppliedTogetherEachWithItsOwnOutcome) {
  AddNode("n1", 1);
  AddNode("n2", 1);
  ASSERT_EQ(Post("/api/v1/nodes/n2/cordon", "", kAdminToken, "").status, 200);
  const std::string a = Submit(OneTaskJson("a", R"({"cpu": "1", "memory": "1Gi", "gpu": 0.25})"));
  const std::string b = Submit(OneTaskJson("b", R"({"cpu": "1", "memory": "1Gi", "gpu": 0.25})"));
  service_->RunCycle();
  ASSERT_EQ(Job(a)["tasks"][0]["node"], "n1");
  const std::string path = "/api/v1/agent/nodes/n1/reports";
  const json body = {{"reports",
                      {{{"jobId", a}, {"index", 0}, {"state", "running"}},
                       {{"jobId", b}, {"index", 0}, {"state", "failed"}, {"exitCode", 3}, {"message", "exit code 3"}},
                       {{"jobId", "j-000000000999"}, {"index", 0}, {"state", "running"}},
                       {{"jobId", a}, {"index", 7}, {"state", "running"}}}}};
  Reply r = Post(path, body.dump(), Cred("n1"));
  ASSERT_EQ(r.status, 200) << r.raw;
  ASSERT_EQ(r.body["results"].size(), 4u);
  EXPECT_EQ(r.body["results"][0]["ok"], true);
  EXPECT_EQ(r.body["results"][1]["ok"], true);
  EXPECT_EQ(r.body["results"][2]["code"], "NotFound");
  EXPECT_EQ(r.body["results"][3]["code"], "NotFound");
  EXPECT_EQ(Job(a)["tasks"][0]["state"], "running");
  EXPECT_EQ(Job(b)["state"], "failed");
  EXPECT_EQ(Job(b)["tasks"][0]["message"], "exit code 3");
  // A report of a task that has moved on is that report's refusal.
  Reply late = Post(path, json{{"reports", {{{"jobId", b}, {"index", 0}, {"state", "succeeded"}}}}}.dump(), Cred("n1"));
  ASSERT_EQ(late.status, 200) << late.raw;
  EXPECT_EQ(late.body["results"][0]["code"], "FailedPrecondition");
  EXPECT_TRUE(service_->CheckInvariants().ok());
}

TEST_F(AgentReportsTest, AMalformedEntryRefusesTheCallAndAppliesNothing) {
  AddNode("n1", 1);
  AddNode("n2", 1);
  const std::string a = Submit(OneTaskJson("a", R"({"cpu": "1", "memory": "1Gi", "gpu": 0.25})"));
  service_->RunCycle();
  const std::string node = Job(a)["tasks"][0]["node"];
  const std::string path = "/api/v1/agent/nodes/" + node + "/reports";
  const json good = {{"jobId", a}, {"index", 0}, {"state", "running"}};
  struct Case {
    json body;
    std::string field;
  };
  const std::vector<Case> cases = {
      {json{{"reports", {good, {{"jobId", a}, {"index", 0}, {"state", "exploded"}}}}}, "reports[1].state"},
      {json{{"reports", {good, {{"jobId", a}, {"index", 0}, {"state", "failed"}, {"exitCode", 1LL << 40}}}}},
       "reports[1].exitCode"},
      {json{{"reports", {good, {{"index", 0}, {"state", "running"}}}}}, "reports[1]"},
      {json{{"reports", {good, {{"jobId", a}, {"index", -1}, {"state", "running"}}}}}, "reports[1]"},
      {json{{"reports", {good, {{"jobId", a}, {"index", 0}, {"state", "running"}, {"extra", 1}}}}},
       "reports[1].extra"},
      {json{{"reports", good}}, "reports"},
      {json{{"reports", json::array()}, {"more", 1}}, "more"},
  };
  for (const Case& c : cases) {
    Reply r = Post(path, c.body.dump(), Cred(node));
    EXPECT_TRUE(IsError(r, 400, "InvalidArgument", c.field)) << c.body.dump();
  }
  json many = json::array();
  for (size_t i = 0; i <= PoolService::kMaxReportsPerCall; ++i) many.push_back(good);
  // The body limit of this fixture refuses it first (413); either way nothing is applied.
  Reply big = Post(path, json{{"reports", many}}.dump(), Cred(node));
  EXPECT_TRUE(big.status == 400 || big.status == 413) << big.status;
  EXPECT_EQ(Job(a)["tasks"][0]["state"], "assigned");  // nothing of any call was applied
  // Only the node's own credential reports for it.
  const std::string other = node == "n1" ? "n2" : "n1";
  EXPECT_TRUE(IsError(Post(path, json{{"reports", {good}}}.dump(), Cred(other)), 403, "PermissionDenied"));
  EXPECT_EQ(Job(a)["tasks"][0]["state"], "assigned");
}

TEST_F(AgentReportsTest, RegistrationAndHeartbeatsAnnounceTheFeatures) {
  AddNode("n1", 1);
  Reply hb = Post("/api/v1/agent/nodes/n1/heartbeat", "{}", Cred("n1"));
  ASSERT_EQ(hb.status, 200) << hb.raw;
  EXPECT_EQ(hb.body["features"], json({"watch", "reports"}));
}

}  // namespace
}  // namespace gpupool
