// The MIG layout that agents report, through the API (api/mig_report.h, sched/mig_planner.h): at
// registration and in heartbeats; a MIG task takes an idle instance that exists before the scheduler
// asks for a new one; the node view shows what exists and what is held; a report that cannot be is
// refused with the field named and changes nothing; a changed layout is no new inventory.
#include <gtest/gtest.h>

#include <string>

#include "server/http_api_fixture_test.h"

namespace gpupool {
namespace {

using namespace testing_api;

class MigLayoutTest : public HttpApiTest {
 protected:
  // Two A100-80GB in MIG mode; GPU 1 reports `instances`.
  Reply Register(const json& instances, const std::string& token = kAgentToken) {
    json body = {{"name", "m1"},
                 {"cpu", "64"},
                 {"memory", "512Gi"},
                 {"gpus",
                  {{{"index", 0}, {"model", "A100-80GB"}, {"migEnabled", true}},
                   {{"index", 1}, {"model", "A100-80GB"}, {"migEnabled", true}, {"migInstances", instances}}}}};
    Reply r = Post("/api/v1/agent/register", body.dump(), token);
    if (r.status == 200 && r.body.contains("credential")) creds_["m1"] = r.body["credential"].get<std::string>();
    return r;
  }
  Reply Heartbeat(const json& gpus) {
    return Post("/api/v1/agent/nodes/m1/heartbeat", json{{"gpus", gpus}}.dump(), Cred("m1"));
  }
  std::string SubmitMig(const std::string& name, const std::string& profile) {
    return Submit(R"({"name": ")" + name + R"(", "tasks": [{"name": "t", "command": ["x"], "isolation": "mig",
      "resources": {"cpu": "1", "memory": "1Gi", "migProfile": ")" + profile + R"("}}]})");
  }
  json Gpu(const std::string& id) { return Job(id)["tasks"][0]["gpus"][0]; }
  json NodeGpus() {
    Reply r = Get("/api/v1/nodes/m1");
    EXPECT_EQ(r.status, 200) << r.raw;
    return r.body["gpus"];
  }
};

TEST_F(MigLayoutTest, AnIdleInstanceThatExistsIsTakenBeforeANewOneIsMade) {
  // GPU 1 has a 3g at slice 0 (profile id 9). GPU 0 reports nothing.
  ASSERT_EQ(Register(json::parse(R"([{"profileId": 9, "start": 0}])")).status, 200);
  const std::string a = SubmitMig("a", "3g.40gb");
  service_->RunCycle();
  ASSERT_EQ(Job(a)["tasks"][0]["state"], "assigned") << Job(a).dump();
  EXPECT_EQ(Gpu(a)["index"], 1) << Gpu(a).dump();
  EXPECT_EQ(Gpu(a)["mig"]["start"], 0) << Gpu(a).dump();
  // The node view: the instance exists and is held.
  json gpus = NodeGpus();
  EXPECT_EQ(gpus[1]["migInstances"],
            json::parse(R"([{"profile": "3g.40gb", "profileId": 9, "start": 0, "exists": true, "held": true}])"))
      << gpus.dump();
  // A second 3g: none is idle anywhere; GPU 1 is fuller, so it is made there, at slice 4.
  const std::string b = SubmitMig("b", "3g.40gb");
  service_->RunCycle();
  ASSERT_EQ(Job(b)["tasks"][0]["state"], "assigned") << Job(b).dump();
  EXPECT_EQ(Gpu(b)["index"], 1);
  EXPECT_EQ(Gpu(b)["mig"]["start"], 4);
  // The agent made it and says so in its next heartbeat; GPU 0 now has an idle 1g at slice 3.
  ASSERT_EQ(Heartbeat(json::parse(R"([{"index": 1, "migInstances": [{"profileId": 9, "start": 0},
                                                                    {"profileId": 9, "start": 4}]},
                                      {"index": 0, "migInstances": [{"profileId": 19, "start": 3}]}])"))
                .status,
            200);
  gpus = NodeGpus();
  EXPECT_EQ(gpus[1]["migInstances"][1]["exists"], true) << gpus.dump();
  EXPECT_EQ(gpus[0]["migInstances"][0], json::parse(R"({"profile": "1g.10gb", "profileId": 19, "start": 3,
                                                          "exists": true, "held": false})"))
      << gpus.dump();
  // A 1g goes to the idle one, where a fresh plan would have chosen slice 6.
  const std::string c = SubmitMig("c", "1g.10gb");
  service_->RunCycle();
  ASSERT_EQ(Job(c)["tasks"][0]["state"], "assigned") << Job(c).dump();
  EXPECT_EQ(Gpu(c)["index"], 0);
  EXPECT_EQ(Gpu(c)["mig"]["start"], 3);
  // The agent re-registers (a restart) with another layout: the same node, not a new inventory.
  Reply again = Register(json::parse(R"([{"profileId": 9, "start": 0}, {"profileId": 9, "start": 4}])"), Cred("m1"));
  EXPECT_EQ(again.status, 200) << again.raw;
}

TEST_F(MigLayoutTest, ReportsThatCannotBeAreRefusedAndChangeNothing) {
  // Overlapping instances, a start the profile does not allow, an unknown profile, a layout on a GPU
  // not in MIG mode, too many entries: each refused at registration, naming the field.
  Reply r = Register(json::parse(R"([{"profileId": 9, "start": 0}, {"profileId": 5, "start": 0}])"));
  EXPECT_EQ(r.status, 400) << r.raw;
  EXPECT_NE(r.raw.find("gpus[1].migInstances"), std::string::npos) << r.raw;
  EXPECT_NE(r.raw.find("overlaps"), std::string::npos) << r.raw;
  r = Register(json::parse(R"([{"profileId": 9, "start": 2}])"));
  EXPECT_EQ(r.status, 400) << r.raw;
  EXPECT_NE(r.raw.find("cannot start at memory slice 2"), std::string::npos) << r.raw;
  r = Register(json::parse(R"([{"profileId": 77, "start": 0}])"));
  EXPECT_EQ(r.status, 400) << r.raw;
  EXPECT_NE(r.raw.find("unknown MIG profile id 77"), std::string::npos) << r.raw;
  json many = json::array();
  for (int i = 0; i < 9; ++i) many.push_back({{"profileId", 19}, {"start", 0}});
  r = Register(many);
  EXPECT_EQ(r.status, 400) << r.raw;
  json plain = {{"name", "p1"}, {"cpu", "8"}, {"memory", "8Gi"},
                {"gpus", {{{"model", "A100-80GB"}, {"migInstances", {{{"profileId", 9}, {"start", 0}}}}}}}};
  r = Post("/api/v1/agent/register", plain.dump(), kAgentToken);
  EXPECT_EQ(r.status, 400) << r.raw;
  EXPECT_NE(r.raw.find("gpus[0].migInstances: the GPU is not in MIG mode"), std::string::npos) << r.raw;
  EXPECT_EQ(Get("/api/v1/nodes/m1").status, 404);
  EXPECT_EQ(Get("/api/v1/nodes/p1").status, 404);

  // A good registration, then bad heartbeats: 400, and the layout stays as it was.
  ASSERT_EQ(Register(json::parse(R"([{"profileId": 9, "start": 4}])")).status, 200);
  const json before = NodeGpus();
  r = Heartbeat(json::parse(R"([{"index": 1, "migInstances": [{"profileId": 0, "start": 0},
                                                              {"profileId": 19, "start": 6}]}])"));
  EXPECT_EQ(r.status, 400) << r.raw;
  EXPECT_NE(r.raw.find("gpus[0].migInstances"), std::string::npos) << r.raw;
  r = Heartbeat(json::parse(R"([{"index": 1, "migInstances": {"profileId": 0}}])"));
  EXPECT_EQ(r.status, 400) << r.raw;
  r = Heartbeat(json::parse(R"([{"index": 1, "migInstances": [{"profileId": 9, "start": 4, "x": 1}]}])"));
  EXPECT_EQ(r.status, 400) << r.raw;
  EXPECT_NE(r.raw.find("unknown field"), std::string::npos) << r.raw;
  EXPECT_EQ(NodeGpus(), before);
  // An empty list on a GPU: nothing exists there any more.
  ASSERT_EQ(Heartbeat(json::parse(R"([{"index": 1, "migInstances": []}])")).status, 200);
  EXPECT_EQ(NodeGpus()[1]["migInstances"], json::array());
}

}  // namespace
}  // namespace gpupool
