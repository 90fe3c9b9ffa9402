// QoS when tasks share a GPU, through the API: a guaranteed job's share waits rather than share a
// GPU with a share nothing holds to its size (here: a timeslice container, which the CUDA limiter does
// not reach yet; an MPS share on a node whose agent sets no MPS limits), and a share nothing holds
// waits rather than join a guaranteed one. What the node holds comes from its agent's labels; the
// placements keep it across a server restart.
#include <gtest/gtest.h>

#include <string>

#include "server/http_api_fixture_test.h"
#include "server/identities.h"

namespace gpupool {
namespace {

using namespace testing_api;

class QosSharingTest : public HttpApiTest {
 protected:
  // A node of one A100 whose agent offers the CUDA limiter (process tasks), as a real agent says.
  void AddLimiterNode(const std::string& name, const std::string& label = "gpupool.io/enforce-limiter") {
    json body = {{"name", name},
                 {"cpu", "64"},
                 {"memory", "512Gi"},
                 {"labels", {{label, "true"}}},
                 {"gpus", {{{"index", 0}, {"model", "A100-80GB"}}}}};
    Reply r = Post("/api/v1/agent/register", body.dump(), kAgentToken);
    ASSERT_EQ(r.status, 200) << r.raw;
    creds_[name] = r.body["credential"].get<std::string>();
  }
  std::string Share(const std::string& name, const std::string& qos, const std::string& isolation,
                    const std::string& extra = "", const std::string& token = kAdminToken) {
    return Submit(R"({"name": ")" + name + R"(", "qos": ")" + qos + R"(", "tasks": [{"name": "t", "command": ["x"],
      "isolation": ")" + isolation + R"(", "resources": {"cpu": "1", "memory": "1Gi", "gpu": 0.25})" + extra + "}]}",
                  token);
  }
  std::string Reason(const std::string& id) { return Job(id).value("reason", ""); }
};

TEST_F(QosSharingTest, AGuaranteedShareNeverSharesAGpuWithOneNothingHolds) {
  AddLimiterNode("n1");
  // A timeslice container: the limiter is not in containers, so nothing holds it to its quarter.
  const std::string loose = Share("loose", "best-effort", "timeslice", R"(, "container": {"rootfs": "/srv/r"})");
  service_->RunCycle();
  ASSERT_EQ(Job(loose)["tasks"][0]["state"], "assigned") << Job(loose).dump();
  // An inference job: waits, and says why.
  const std::string infer = Share("infer", "guaranteed", "timeslice");
  service_->RunCycle();
  EXPECT_EQ(State(infer), "pending");
  EXPECT_NE(Reason(infer).find("hold shares not held to their size"), std::string::npos) << Reason(infer);
  // The loose share goes: the guaranteed one takes the GPU.
  ASSERT_EQ(Post("/api/v1/jobs/" + loose + "/cancel", "").status, 200);
  Report(loose, 0, "stopped");
  service_->RunCycle();
  ASSERT_EQ(Job(infer)["tasks"][0]["state"], "assigned") << Job(infer).dump();
  // A timeslice process share, held by the limiter on this node: joins it.
  const std::string held = Share("held", "best-effort", "timeslice");
  // An MPS share: this agent sets no MPS limits, so nothing holds it; it waits.
  const std::string mps = Share("mps", "burstable", "mps");
  service_->RunCycle();
  EXPECT_EQ(Job(held)["tasks"][0]["state"], "assigned") << Job(held).dump();
  EXPECT_EQ(State(mps), "pending");
  EXPECT_NE(Reason(mps).find("nothing on this node would hold the task to its share"), std::string::npos)
      << Reason(mps);
  // A restarted server restores the placements with what they were: the MPS share still waits, and
  // the held one is still beside the guaranteed one.
  Open();
  service_->RunCycle();
  EXPECT_EQ(State(mps), "pending");
  EXPECT_EQ(Job(held)["tasks"][0]["state"], "assigned");
  EXPECT_EQ(Job(infer)["tasks"][0]["state"], "assigned");
}

// A guaranteed share that QoS keeps off the GPU says nothing of a best-effort share of the same
// size: the cycle still tries (and places) it.
TEST_F(QosSharingTest, AShareQosRefusesDoesNotHoldBackAnotherKindOfTheSameSize) {
  AddLimiterNode("n1");
  const std::string loose = Share("loose", "best-effort", "timeslice", R"(, "container": {"rootfs": "/srv/r"})");
  service_->RunCycle();
  ASSERT_EQ(Job(loose)["tasks"][0]["state"], "assigned") << Job(loose).dump();
  const std::string infer = Share("infer", "guaranteed", "timeslice");
  const std::string batch = Share("batch", "best-effort", "timeslice");
  service_->RunCycle();
  EXPECT_EQ(State(infer), "pending");
  EXPECT_EQ(Job(batch)["tasks"][0]["state"], "assigned") << Job(batch).dump();
}

TEST_F(QosSharingTest, WithoutAnyEnforcementGuaranteedSharesTakeAGpuAlone) {
  AddNode("n1", 2);  // no enforcement labels: an agent without the limiter
  const std::string a = Share("a", "guaranteed", "mps");
  const std::string b = Share("b", "guaranteed", "mps");
  const std::string c = Share("c", "guaranteed", "mps");
  service_->RunCycle();
  const json ja = Job(a), jb = Job(b);
  ASSERT_EQ(ja["tasks"][0]["state"], "assigned");
  ASSERT_EQ(jb["tasks"][0]["state"], "assigned");
  EXPECT_NE(ja["tasks"][0]["gpus"][0]["index"], jb["tasks"][0]["gpus"][0]["index"]) << ja.dump() << jb.dump();
  EXPECT_EQ(State(c), "pending");
}

// A GPU's MPS control daemon runs one server at a time, for one uid (a tenant's), and makes another
// uid's clients wait: two tenants' MPS shares never share a GPU, while one tenant's pack together
// and shares of other kinds join them. The owner survives a restart in the stored placements.
TEST_F(QosSharingTest, MpsSharesOfTwoTenantsNeverShareAGpu) {
  AddLimiterNode("n1", "gpupool.io/enforce-mps");
  const std::string v1 = Share("v1", "burstable", "mps", "", kVisionToken);
  service_->RunCycle();
  ASSERT_EQ(Job(v1)["tasks"][0]["state"], "assigned") << Job(v1).dump();
  // Two jobs of one shape, nlp's first: nlp's waits, and its failure does not keep vision's (which
  // fits beside vision's first) from being tried in the same cycle.
  const std::string n1 = Share("n1", "burstable", "mps", "", kNlpToken);
  const std::string v2 = Share("v2", "burstable", "mps", "", kVisionToken);
  service_->RunCycle();
  EXPECT_EQ(Job(v2)["tasks"][0]["state"], "assigned") << Job(v2).dump();
  EXPECT_EQ(State(n1), "pending");
  EXPECT_NE(Reason(n1).find("hold MPS shares of another tenant"), std::string::npos) << Reason(n1);
  Open();
  service_->RunCycle();
  EXPECT_EQ(State(n1), "pending");
  // vision's shares go: nlp's takes the GPU, and vision's next one waits in turn.
  for (const std::string& id : {v1, v2}) {
    ASSERT_EQ(Post("/api/v1/jobs/" + id + "/cancel", "").status, 200);
    Report(id, 0, "stopped");
  }
  service_->RunCycle();
  ASSERT_EQ(Job(n1)["tasks"][0]["state"], "assigned") << Job(n1).dump();
  const std::string v3 = Share("v3", "burstable", "mps", "", kVisionToken);
  service_->RunCycle();
  EXPECT_EQ(State(v3), "pending");
}

TEST_F(QosSharingTest, ARootQueuesMpsSharesHaveAServerOfTheirOwn) {
  gpupool::Job job;
  job.tenant = "vision";
  job.queue = "ops";
  job.groups.resize(2);
  job.groups[0].request.enforced_by = kEnforceMps;
  job.groups[1].request.enforced_by = kEnforceLimiter;
  SetMpsOwners(config_, job);
  EXPECT_EQ(job.groups[0].request.mps_owner, "vision");
  EXPECT_EQ(job.groups[1].request.mps_owner, "");
  config_.sandbox.root_queues = {"ops"};
  SetMpsOwners(config_, job);
  EXPECT_EQ(job.groups[0].request.mps_owner, "vision (root)");
}

}  // namespace
}  // namespace gpupool
