// Long polls over real HTTP. Assignments pushed to agents (GET .../assignments?wait=S&since=V): a
// watch is answered once its node's assignments change (and are durable), not for other nodes'
// changes nor for what the agent itself reported; unchanged, it ends with 304 after S seconds.
// Jobs (GET /api/v1/jobs/{id}?wait=S&since=V), for `gpupool run`: answered as the job changes,
// to its own tenant only.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "server/http_api_fixture_test.h"

namespace gpupool {
namespace {

using namespace testing_api;
using Clock = std::chrono::steady_clock;

class LongPollTest : public HttpApiTest {
 protected:
  std::string Base(const std::string& node) { return "/api/v1/agent/nodes/" + node + "/assignments"; }
  std::string Version(const std::string& node) {
    Reply r = Get(Base(node), Cred(node));
    EXPECT_EQ(r.status, 200) << r.raw;
    return r.body.value("version", "");
  }
  // A watch on its own thread: the reply and how long it took.
  std::future<std::pair<Reply, double>> Watch(const std::string& node, const std::string& since, int wait_s) {
    const std::string path = Base(node) + "?wait=" + std::to_string(wait_s) + "&since=" + since;
    const std::string cred = Cred(node);
    const int port = port_;
    return std::async(std::launch::async, [=] {
      const auto t0 = Clock::now();
      Reply r = Call(port, "GET", path, cred);
      return std::make_pair(r, std::chrono::duration<double>(Clock::now() - t0).count());
    });
  }
};

TEST_F(LongPollTest, AWatchIsAnsweredWhenItsNodesAssignmentsChange) {
  AddNode("n1", 1);
  AddNode("n2", 1);
  const std::string v1 = Version("n1"), v2 = Version("n2");
  ASSERT_FALSE(v1.empty());
  auto w1 = Watch("n1", v1, 20);
  auto w2 = Watch("n2", v2, 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // n2 is cordoned: the job can only go to n1.
  ASSERT_EQ(Post("/api/v1/nodes/n2/cordon", "", kAdminToken, "").status, 200);
  const std::string id = Submit(OneTaskJson("w", R"({"cpu": "1", "memory": "1Gi", "gpu": 0.5})"));
  service_->RunCycle();
  auto [r1, t1] = w1.get();
  ASSERT_EQ(r1.status, 200) << r1.raw;
  ASSERT_EQ(r1.body["assignments"].size(), 1u);
  EXPECT_EQ(r1.body["assignments"][0]["jobId"], id);
  EXPECT_NE(r1.body["version"], v1);
  EXPECT_LT(t1, 10.0);  // pushed, not the 20 s timeout
  auto [r2, t2] = w2.get();
  EXPECT_EQ(r2.status, 304) << r2.raw;  // the other node's change did not wake it
  EXPECT_TRUE(r2.raw.empty());
  EXPECT_GE(t2, 1.5);

  // The agent's own "running" report is no change to push back to it.
  const std::string v_placed = r1.body["version"];
  Report(id, 0, "running");
  auto quiet = Watch("n1", v_placed, 1);
  EXPECT_EQ(quiet.get().first.status, 304);

  // A cancel is: the watch hears "stop".
  auto w_stop = Watch("n1", v_placed, 20);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_EQ(Post("/api/v1/jobs/" + id + "/cancel", "", kAdminToken, "").status, 200);
  auto [rs, ts] = w_stop.get();
  ASSERT_EQ(rs.status, 200) << rs.raw;
  ASSERT_EQ(rs.body["assignments"].size(), 1u);
  EXPECT_EQ(rs.body["assignments"][0]["desired"], "stop");
  EXPECT_LT(ts, 10.0);
}

TEST_F(LongPollTest, AnotherVersionIsAnsweredAtOnceAndBadParametersAreNamed) {
  AddNode("n1", 1);
  const auto t0 = Clock::now();
  Reply other_run = Get(Base("n1") + "?wait=20&since=0123abcd-7", Cred("n1"));
  EXPECT_EQ(other_run.status, 200) << other_run.raw;
  Reply none = Get(Base("n1") + "?wait=20", Cred("n1"));  // no version held yet
  EXPECT_EQ(none.status, 200) << none.raw;
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0);
  EXPECT_EQ(Get(Base("n1") + "?wait=0&since=" + Version("n1"), Cred("n1")).status, 304);

  for (const char* wait : {"abc", "-1", "61", "1000000000000", "1.5", ""}) {
    EXPECT_TRUE(IsError(Get(Base("n1") + "?wait=" + wait, Cred("n1")), 400, "InvalidArgument", "wait")) << wait;
  }
  EXPECT_TRUE(IsError(Get(Base("n1") + "?wait=1&since=" + std::string(65, 'a'), Cred("n1")), 400,
                      "InvalidArgument", "since"));
  // Only the node's own credential (or an admin) watches it.
  AddNode("n2", 1);
  EXPECT_TRUE(IsError(Get(Base("n1") + "?wait=1", Cred("n2")), 403, "PermissionDenied"));
  EXPECT_TRUE(IsError(Get(Base("n1") + "?wait=1", kVisionToken), 403, "PermissionDenied"));
  EXPECT_TRUE(IsError(Get(Base("n9") + "?wait=1", kAdminToken), 404, "NotFound"));
}

// One node keeps at most kMaxWatchesPerKey watches waiting: one more, and the oldest is answered
// at once (its agent polls again), so a node's credential cannot pile up watches in the server.
TEST_F(LongPollTest, ANodeHoldsAFewWatchesAtMost) {
  AddNode("n1", 1);
  const std::string v = Version("n1");
  std::vector<std::future<std::pair<Reply, double>>> watches;
  watches.push_back(Watch("n1", v, 20));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (size_t i = 0; i < PoolService::kMaxWatchesPerKey; ++i) watches.push_back(Watch("n1", v, 3));
  auto [first, took] = watches[0].get();
  EXPECT_EQ(first.status, 200) << first.raw;
  EXPECT_LT(took, 10.0);
  for (size_t i = 1; i < watches.size(); ++i) EXPECT_EQ(watches[i].get().first.status, 304);
}

// Stopping the API answers the watches in flight instead of leaving their agents hanging.
TEST_F(LongPollTest, StoppingTheServerAnswersWatchesInFlight) {
  AddNode("n1", 1);
  auto w = Watch("n1", Version("n1"), 30);
  // Stopped once the watch waits in the server, not before it arrived (a loaded machine is slow).
  for (int i = 0; i < 3000 && service_->NodesWatched() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(service_->NodesWatched(), 1u);
  const auto t0 = Clock::now();
  api_->Stop();
  auto [r, took] = w.get();
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
}

TEST_F(LongPollTest, AJobWatchIsAnsweredAsTheJobChangesAndOnlyToItsTenant) {
  AddNode("n1", 1);
  const std::string id = Submit(OneTaskJson("w", R"({"cpu": "1", "memory": "1Gi", "gpu": 0.5})"), kVisionToken);
  Reply job = Get("/api/v1/jobs/" + id, kVisionToken);
  ASSERT_EQ(job.status, 200) << job.raw;
  const std::string v0 = job.body.value("version", "");
  ASSERT_FALSE(v0.empty());
  const int port = port_;
  auto watch = [&](const std::string& since, int wait_s, const std::string& token) {
    const std::string path = "/api/v1/jobs/" + id + "?wait=" + std::to_string(wait_s) + "&since=" + since;
    return std::async(std::launch::async, [=] {
      const auto t0 = Clock::now();
      Reply r = Call(port, "GET", path, token);
      return std::make_pair(r, std::chrono::duration<double>(Clock::now() - t0).count());
    });
  };
  auto placed = watch(v0, 20, kVisionToken);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  service_->RunCycle();
  auto [r, took] = placed.get();
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["state"], "running");
  EXPECT_EQ(r.body["tasks"][0]["state"], "assigned");
  EXPECT_NE(r.body["version"], v0);
  EXPECT_LT(took, 10.0);

  // The task's end reaches a watcher too (this is how `gpupool run` learns its exit code).
  auto ended = watch(r.body["version"], 20, kVisionToken);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Report(id, 0, "succeeded");
  auto [e, took2] = ended.get();
  ASSERT_EQ(e.status, 200) << e.raw;
  EXPECT_EQ(e.body["state"], "succeeded");
  EXPECT_LT(took2, 10.0);

  // Another tenant cannot watch it, nor learn that it exists.
  EXPECT_TRUE(IsError(Get("/api/v1/jobs/" + id + "?wait=1&since=x", kNlpToken), 404, "NotFound"));
  EXPECT_TRUE(IsError(Get("/api/v1/jobs/" + id + "?wait=99", kVisionToken), 400, "InvalidArgument", "wait"));
  EXPECT_EQ(Get("/api/v1/jobs/" + id + "?wait=0&since=" + e.body["version"].get<std::string>(), kVisionToken).status,
            304);
}

}  // namespace
}  // namespace gpupool
