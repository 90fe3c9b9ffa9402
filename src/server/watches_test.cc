#include "server/watches.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace gpupool {
namespace {

using nlohmann::json;

struct Recorder : Watcher {
  std::vector<json> got;
  bool answered_elsewhere = false;
  void Deliver(const json& v) override { got.push_back(v); }
  bool waiting() const override { return got.empty() && !answered_elsewhere; }
};

json View(int k) { return json{{"key", k}}; }

TEST(WatchSet, VersionsChangeOnlyAtFlushAndCarryTheRun) {
  WatchSet<int> ws("run1", 4);
  EXPECT_EQ(ws.Version(7), "run1-1");
  ws.Changed(7);
  EXPECT_EQ(ws.Version(7), "run1-1");  // not durable yet
  ws.Flush([](const int& k) { return std::optional<json>(View(k)); }, json::object());
  EXPECT_EQ(ws.Version(7), "run1-2");
  EXPECT_EQ(ws.Version(8), "run1-1");
  WatchSet<int> next_run("run2", 4);
  EXPECT_NE(next_run.Version(7), ws.Version(7));
}

TEST(WatchSet, AWatcherAtTheVersionWaitsAndIsAnsweredOnceByTheFlushOfItsKey) {
  WatchSet<int> ws("r", 4);
  auto stale = std::make_shared<Recorder>();
  EXPECT_FALSE(ws.Wait(1, "r-0", stale, [] { return View(1); }));  // not at the version: answer now
  EXPECT_TRUE(stale->got.empty());
  auto a = std::make_shared<Recorder>(), b = std::make_shared<Recorder>();
  EXPECT_TRUE(ws.Wait(1, "r-1", a, [] { return View(1); }));
  EXPECT_TRUE(ws.Wait(2, "r-1", b, [] { return View(2); }));
  ws.Changed(1);
  ws.Flush([](const int& k) { return std::optional<json>(View(k)); }, json::object());
  ASSERT_EQ(a->got.size(), 1u);
  EXPECT_EQ(a->got[0]["key"], 1);
  EXPECT_TRUE(b->got.empty());  // another key's change
  ws.Changed(1);
  ws.Flush([](const int& k) { return std::optional<json>(View(k)); }, json::object());
  EXPECT_EQ(a->got.size(), 1u);  // once only
}

TEST(WatchSet, AKeyHoldsAFewWaitersAndAnsweredOnesAreDropped) {
  WatchSet<int> ws("r", 2);
  auto w1 = std::make_shared<Recorder>(), w2 = std::make_shared<Recorder>(), w3 = std::make_shared<Recorder>();
  ASSERT_TRUE(ws.Wait(1, "r-1", w1, [] { return View(1); }));
  ASSERT_TRUE(ws.Wait(1, "r-1", w2, [] { return View(1); }));
  ASSERT_TRUE(ws.Wait(1, "r-1", w3, [] { return View(1); }));
  EXPECT_EQ(w1->got.size(), 1u);  // the oldest gave way
  EXPECT_TRUE(w2->got.empty());
  w2->answered_elsewhere = true;  // its own timeout answered it
  auto w4 = std::make_shared<Recorder>();
  ASSERT_TRUE(ws.Wait(1, "r-1", w4, [] { return View(1); }));
  EXPECT_TRUE(w3->got.empty());  // w2's place was free
  ws.Changed(1);
  ws.Flush([](const int& k) { return std::optional<json>(View(k)); }, json::object());
  EXPECT_EQ(w3->got.size(), 1u);
  EXPECT_EQ(w4->got.size(), 1u);
  EXPECT_TRUE(w2->got.empty());
}

TEST(WatchSet, AGoneKeyAnswersGoneAndReleaseAllAnswersEveryone) {
  WatchSet<std::string> ws("r", 4);
  auto w = std::make_shared<Recorder>();
  ASSERT_TRUE(ws.Wait("j-1", "r-1", w, [] { return json::object(); }));
  ws.Forget("j-1");
  ws.Changed("j-1");
  const json gone = {{"error", "gone"}};
  ws.Flush([](const std::string&) { return std::optional<json>(); }, gone);
  ASSERT_EQ(w->got.size(), 1u);
  EXPECT_EQ(w->got[0], gone);
  auto a = std::make_shared<Recorder>(), b = std::make_shared<Recorder>();
  ASSERT_TRUE(ws.Wait("j-2", "r-1", a, [] { return json::object(); }));
  ASSERT_TRUE(ws.Wait("j-3", "r-1", b, [] { return json::object(); }));
  ws.ReleaseAll([](const std::string& k) { return std::optional<json>(json{{"id", k}}); }, gone);
  ASSERT_EQ(a->got.size(), 1u);
  EXPECT_EQ(a->got[0]["id"], "j-2");
  EXPECT_EQ(b->got.size(), 1u);
  EXPECT_EQ(ws.waiting_keys(), 0u);
}

}  // namespace
}  // namespace gpupool
