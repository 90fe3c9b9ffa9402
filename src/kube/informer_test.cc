// The informer against the test API server: it syncs, follows changes, and repairs its copy with a
// fresh list when it fell behind the server's history (410 Gone).
#include "kube/informer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "kube/kube_test_util.h"

namespace gpupool::kube {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using namespace test;  // NOLINT: the shared test helpers

class InformerTest : public ::testing::Test {
 protected:
  void Serve(const std::vector<std::string>& extra) {
    if (Sh("python3 -c 'import http.server' >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
    server_ = std::make_unique<TestApiServer>(dir_.path(), extra);
    ASSERT_FALSE(server_->url().empty()) << ReadText(dir_.path() + "/server.log");
    client_ = ClientOf(*server_);
    ASSERT_NE(client_, nullptr);
  }
  void Pod(const std::string& name, const std::string& scheduler = "gpupool") {
    const json pod = {{"apiVersion", "v1"},
                      {"kind", "Pod"},
                      {"metadata", {{"name", name}}},
                      {"spec", {{"schedulerName", scheduler}, {"containers", {{{"name", "c"}, {"image", "b"}}}}}}};
    auto r = client_->Request("POST", "/api/v1/namespaces/default/pods", &pod);
    ASSERT_TRUE(r.ok() && r->code == 201) << (r.ok() ? r->body.dump() : r.status().ToString());
  }
  void Label(const std::string& name, const std::string& value) {
    const json patch = {{"metadata", {{"labels", {{"v", value}}}}}};
    auto r = client_->Request("PATCH", "/api/v1/namespaces/default/pods/" + name, &patch, "application/merge-patch+json");
    ASSERT_TRUE(r.ok() && r->code == 200);
  }
  // The server's own view, by key.
  std::map<std::string, std::string> ServerView(const std::string& query) {
    std::map<std::string, std::string> out;
    auto list = client_->List("/api/v1/pods", query);
    EXPECT_TRUE(list.ok());
    if (list.ok())
      for (const json& p : list->items) out[ObjectKey(p)] = p["metadata"].value("resourceVersion", "");
    return out;
  }
  static std::map<std::string, std::string> View(const std::map<std::string, json>& objects) {
    std::map<std::string, std::string> out;
    for (const auto& [k, v] : objects) out[k] = v["metadata"].value("resourceVersion", "");
    return out;
  }

  TempDir dir_;
  std::unique_ptr<TestApiServer> server_;
  std::unique_ptr<KubeClient> client_;
};

TEST_F(InformerTest, SyncsThenFollowsAddsChangesAndDeletesOfItsSelectorOnly) {
  Serve({"--bookmark-seconds", "0.2"});
  Pod("a");
  Pod("other", "default-scheduler");
  std::mutex mu;
  std::vector<std::string> events;
  Informer::Options o;
  o.path = "/api/v1/pods";
  o.query = "fieldSelector=" + KubeClient::Escape("spec.schedulerName=gpupool");
  o.watch_timeout = 2s;
  Informer informer(client_.get(), o, [&](const std::string& type, const json& obj) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(type + " " + ObjectKey(obj));
  });
  informer.Start();
  ASSERT_TRUE(informer.WaitSynced(10s)) << informer.last_error();
  EXPECT_EQ(View(informer.Snapshot()).count("default/a"), 1u);
  EXPECT_EQ(informer.Snapshot().size(), 1u);
  Pod("b");
  Label("a", "1");
  ASSERT_TRUE(client_->Request("DELETE", "/api/v1/namespaces/default/pods/b").ok());
  Pod("c");
  // Past a watch's end (2 s): it watches again from where it was, nothing lost or repeated.
  std::this_thread::sleep_for(2500ms);
  Pod("d");
  ASSERT_TRUE(Eventually([&] { return View(informer.Snapshot()) == ServerView(o.query); }))
      << ::testing::PrintToString(View(informer.Snapshot()));
  informer.Stop();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(events, (std::vector<std::string>{"ADDED default/a", "ADDED default/b", "MODIFIED default/a",
                                              "DELETED default/b", "ADDED default/c", "ADDED default/d"}));
  EXPECT_EQ(informer.lists(), 1u);
}

TEST_F(InformerTest, FallenBehindTheHistoryItListsAgainAndRepairsItsCopy) {
  Serve({"--history", "10", "--bookmark-seconds", "30"});
  for (int i = 0; i < 4; ++i) Pod(fmt::format("p-{}", i));
  std::atomic<bool> slow{false};
  std::atomic<bool> dawdling{false};
  Informer::Options o;
  o.path = "/api/v1/pods";
  o.watch_timeout = 1s;
  o.keep_objects = false;  // as the kube-scheduler's: a relist's DELETED carries the uid still
  std::mutex mu;
  std::vector<std::string> events;
  std::map<std::string, std::string> deleted_uid;
  Informer informer(client_.get(), o, [&](const std::string& type, const json& obj) {
    {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(type + " " + ObjectKey(obj));
      if (type == "DELETED") deleted_uid[ObjectKey(obj)] = obj["metadata"].value("uid", "");
    }
    // A slow consumer: while it dawdles over one event, its watch ends (1 s) and the server's
    // history moves on past where it will watch again from.
    if (slow.exchange(false)) {
      dawdling = true;
      std::this_thread::sleep_for(4s);
    }
  });
  informer.Start();
  ASSERT_TRUE(informer.WaitSynced(10s));
  slow = true;
  Label("p-0", "x");  // the event it will dawdle over
  ASSERT_TRUE(Eventually([&] { return dawdling.load(); }));
  // Its watch (timeoutSeconds 1, begun before that event) is over: what follows reaches no stream.
  std::this_thread::sleep_for(1600ms);
  for (int i = 0; i < 20; ++i) Label("p-1", std::to_string(i));  // 20 writes: past the 10 kept
  ASSERT_TRUE(client_->Request("DELETE", "/api/v1/namespaces/default/pods/p-2").ok());
  Pod("p-9");
  ASSERT_TRUE(Eventually([&] { return informer.lists() >= 2 && View(informer.Snapshot()) == ServerView(""); }, 20s))
      << "lists " << informer.lists() << " " << ::testing::PrintToString(View(informer.Snapshot()));
  informer.Stop();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_NE(std::find(events.begin(), events.end(), "DELETED default/p-2"), events.end());
  EXPECT_NE(std::find(events.begin(), events.end(), "ADDED default/p-9"), events.end());
  EXPECT_FALSE(deleted_uid["default/p-2"].empty());
  const auto copy = informer.Snapshot();
  ASSERT_EQ(copy.count("default/p-0"), 1u);
  EXPECT_FALSE(copy.at("default/p-0").contains("spec")) << copy.at("default/p-0").dump();
  EXPECT_FALSE(copy.at("default/p-0")["metadata"].value("uid", "").empty());
}

// A new leader's resync: a list that begins after Resync() must be applied. Asked before the
// informer starts, its first list is that list (no second one); asked later, one more list.
TEST_F(InformerTest, AResyncIsOneListBegunAfterItAndNoMore) {
  Serve({"--bookmark-seconds", "0.2"});
  Pod("a");
  Informer::Options o;
  o.path = "/api/v1/pods";
  o.watch_timeout = 5s;
  Informer informer(client_.get(), o, [](const std::string&, const json&) {});
  const uint64_t before = informer.Resync();
  EXPECT_FALSE(informer.ListedSince(before));
  informer.Start();
  ASSERT_TRUE(Eventually([&] { return informer.ListedSince(before); })) << informer.last_error();
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(informer.lists(), 1u);
  const uint64_t later = informer.Resync();
  EXPECT_FALSE(informer.ListedSince(later));
  ASSERT_TRUE(Eventually([&] { return informer.ListedSince(later); })) << informer.last_error();
  EXPECT_EQ(informer.lists(), 2u);
  informer.Stop();
}

TEST_F(InformerTest, AnUnreachableServerIsRetriedWithBackoffAndSaysWhy) {
  KubeEndpoint ep;
  ep.server = "http://127.0.0.1:9";  // discard: nothing listens
  auto c = KubeClient::Create(ep);
  ASSERT_TRUE(c.ok());
  Informer::Options o;
  o.path = "/api/v1/nodes";
  o.backoff_min = 50ms;
  o.backoff_max = 200ms;
  Informer informer(c->get(), o, nullptr);
  informer.Start();
  EXPECT_FALSE(informer.WaitSynced(1s));
  informer.Stop();
  EXPECT_GE(informer.failures(), 2u);
  EXPECT_NE(informer.last_error().find("GET /api/v1/nodes"), std::string::npos) << informer.last_error();
}

}  // namespace
}  // namespace gpupool::kube
