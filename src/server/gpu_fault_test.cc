// A GPU fault reported in a heartbeat stops every job placed on that GPU, also one the server
// placed a moment before it heard of the fault and whose task has not started yet; the job is
// placed again on a healthy GPU, never on the faulted one.
#include <gtest/gtest.h>

#include <string>

#include "server/http_api_fixture_test.h"

namespace gpupool {
namespace {

using namespace testing_api;

class GpuFaultTest : public HttpApiTest {
 protected:
  Reply Beat(const std::string& node, int faulted_gpu, int gpus) {
    json list = json::array();
    for (int i = 0; i < gpus; ++i) {
      json g = {{"index", i}, {"healthy", i != faulted_gpu}};
      if (i == faulted_gpu) g["reason"] = "XID 79";
      list.push_back(g);
    }
    return Post("/api/v1/agent/nodes/" + node + "/heartbeat", json{{"gpus", list}}.dump(), Cred(node));
  }
  std::string Gpus(const std::string& id) {
    const json task = Job(id)["tasks"][0];
    std::string out;
    for (const json& g : task["gpus"]) out += task["node"].get<std::string>() + ":" + std::to_string(g["index"].get<int>()) + " ";
    return out;
  }
};

TEST_F(GpuFaultTest, AJobPlacedJustBeforeTheFaultIsStoppedBeforeItStartsAndPlacedElsewhere) {
  AddNode("n1", 2);
  const std::string body = R"({"name": "w", "retry": {"backoffSeconds": 0},
    "tasks": [{"name": "w", "resources": {"cpu": "1", "memory": "1Gi", "gpu": 1}, "command": ["x"]}]})";
  const std::string a = Submit(body);
  service_->RunCycle();
  // Placed: the task is assigned, its agent has not started it yet.
  const json placed = Job(a);
  ASSERT_EQ(placed["tasks"][0]["state"], "assigned") << placed.dump();
  const int gpu = placed["tasks"][0]["gpus"][0]["index"];
  // The heartbeat that brings the fault arrives before the task's first report.
  Reply r = Beat("n1", gpu, 2);
  ASSERT_EQ(r.status, 200) << r.raw;
  const json stopped = Job(a);
  EXPECT_NE(stopped["tasks"][0]["state"], "assigned") << stopped.dump();
  EXPECT_NE(stopped["tasks"][0]["state"], "running") << stopped.dump();
  EXPECT_EQ(stopped["faults"], 1) << stopped.dump();
  // Whatever the agent does with the assignment now, the task ends and the job is placed again:
  // on the other GPU, never the faulted one.
  if (stopped["tasks"][0]["state"] == "stopping") Report(a, 0, "stopped");
  service_->RunCycle();
  const json again = Job(a);
  ASSERT_EQ(again["tasks"][0]["state"], "assigned") << again.dump();
  EXPECT_EQ(Gpus(a), "n1:" + std::to_string(1 - gpu) + " ") << again.dump();
  // A second job wanting a whole GPU finds none: the faulted one takes nothing.
  const std::string b = Submit(body);
  service_->RunCycle();
  EXPECT_EQ(State(b), "pending");
  EXPECT_TRUE(service_->CheckInvariants().ok());
}

}  // namespace
}  // namespace gpupool
