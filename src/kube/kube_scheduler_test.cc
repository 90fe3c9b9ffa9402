// Leader election and the scheduler daemon against the test API server (tests/kube/apiserver.py,
// itself checked with kubectl and python3-kubernetes).
#include "kube/kube_scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
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

const char kLease[] = "/apis/coordination.k8s.io/v1/namespaces/sys/leases/gpupool-scheduler";

class KubeSchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<TestApiServer>(
        dir_.path(), std::vector<std::string>{"--bookmark-seconds", "0.5", "--refuse-eviction", "ml/guarded"});
    ASSERT_FALSE(server_->url().empty()) << ReadText(dir_.path() + "/server.log");
    client_ = ClientOf(*server_);
    ASSERT_NE(client_, nullptr);
    for (const char* ns : {"sys", "ml"}) Post("/api/v1/namespaces", {{"metadata", {{"name", ns}}}});
  }
  json Post(const std::string& path, const json& body) {
    auto r = client_->Request("POST", path, &body);
    EXPECT_TRUE(r.ok() && (r->code == 201 || r->code == 200)) << path << ": " << (r.ok() ? r->body.dump() : r.status().ToString());
    return r.ok() ? r->body : json();
  }
  json Get(const std::string& path) {
    auto r = client_->Get(path);
    return r.ok() && r->code == 200 ? r->body : json();
  }
  LeaderElector::Options Lease(const std::string& identity) {
    LeaderElector::Options o;
    o.namespace_name = "sys";
    o.identity = identity;
    o.lease_duration = 4000ms;
    o.renew_deadline = 3000ms;
    o.retry_period = 200ms;
    return o;
  }
  void AddNode(const std::string& name, int gpus) {
    json inv = {{"gpus", json::array()}};
    for (int i = 0; i < gpus; ++i) inv["gpus"].push_back({{"index", i}, {"uuid", fmt::format("GPU-{}-{}", name, i)}, {"model", "A100-80GB"}});
    Post("/api/v1/nodes", {{"metadata", {{"name", name}, {"annotations", {{kInventoryKey, inv.dump()}}}}},
                           {"status",
                            {{"allocatable", {{"cpu", "64"}, {"memory", "512Gi"}, {"pods", "110"}}},
                             {"conditions", json::array({{{"type", "Ready"}, {"status", "True"}}})}}}});
  }
  void AddPod(const std::string& name, int gpus, const json& annotations = json::object()) {
    Post("/api/v1/namespaces/ml/pods",
         {{"metadata", {{"name", name}, {"annotations", annotations}}},
          {"spec",
           {{"schedulerName", "gpupool"},
            {"containers", json::array({{{"name", "c"}, {"image", "x"}, {"resources", {{"limits", {{"nvidia.com/gpu", gpus}}}}}}})}}}});
  }
  // A scheduler without leader election (it leads at once), started.
  Result<std::unique_ptr<KubeScheduler>> StartAlone() {
    KubeSchedulerOptions o;
    o.leader_elect = false;
    o.bind_workers = 2;
    auto s = KubeScheduler::Create(client_.get(), o);
    if (s.ok()) (*s)->Start();
    return s;
  }
  std::string NodeOf(const std::string& pod) {
    json p = Get("/api/v1/namespaces/ml/pods/" + pod);
    return p.is_object() ? p["spec"].value("nodeName", "") : "";
  }

  TempDir dir_;
  std::unique_ptr<TestApiServer> server_;
  std::unique_ptr<KubeClient> client_;
};

TEST_F(KubeSchedulerTest, OneOfTwoCandidatesLeadsAndTheOtherTakesOverWhenItGivesUp) {
  std::atomic<int> a_changes{0}, b_changes{0};
  LeaderElector a(client_.get(), Lease("a"), [&](bool) { ++a_changes; });
  LeaderElector b(client_.get(), Lease("b"), [&](bool) { ++b_changes; });
  a.Start();
  ASSERT_TRUE(Eventually([&] { return a.IsLeader(); }));
  b.Start();
  std::this_thread::sleep_for(4500ms);  // longer than the lease: a renews it, b never takes it
  EXPECT_TRUE(a.IsLeader());
  EXPECT_FALSE(b.IsLeader());
  EXPECT_EQ(b.holder(), "a");
  EXPECT_EQ(Get(kLease)["spec"]["holderIdentity"], "a");
  // a stops: it gives the lease up, and b takes it within a retry period or two, not a lease.
  const auto t0 = std::chrono::steady_clock::now();
  a.Stop();
  EXPECT_FALSE(a.IsLeader());
  ASSERT_TRUE(Eventually([&] { return b.IsLeader(); }));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4000ms);  // sooner than the lease duration
  json lease = Get(kLease);
  EXPECT_EQ(lease["spec"]["holderIdentity"], "b");
  EXPECT_EQ(lease["spec"]["leaseTransitions"], 1);
  EXPECT_EQ(a_changes.load(), 2);  // led, stopped
  EXPECT_EQ(b_changes.load(), 1);
}

TEST_F(KubeSchedulerTest, ASilentHoldersLeaseIsTakenOnlyAfterTheLeaseDurationByTheCandidatesClock) {
  // Someone holds the lease with a renew time far in the future (a skewed clock): that must not
  // keep a candidate out once the lease stopped changing for a lease duration.
  Post("/apis/coordination.k8s.io/v1/namespaces/sys/leases",
       {{"metadata", {{"name", "gpupool-scheduler"}}},
        {"spec", {{"holderIdentity", "ghost"}, {"leaseDurationSeconds", 1}, {"renewTime", "2099-01-01T00:00:00.000000Z"},
                  {"leaseTransitions", 4}}}});
  LeaderElector b(client_.get(), Lease("b"), nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  b.Start();
  std::this_thread::sleep_for(600ms);
  EXPECT_FALSE(b.IsLeader());
  ASSERT_TRUE(Eventually([&] { return b.IsLeader(); }, 5s));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 1000ms);
  EXPECT_EQ(Get(kLease)["spec"]["leaseTransitions"], 5);
}

TEST_F(KubeSchedulerTest, ALeaderWhoseLeaseWasTakenStepsDownWithinTheRenewDeadlineForGood) {
  std::atomic<int> lost{0};
  LeaderElector a(client_.get(), Lease("a"), [&](bool leading) {
    if (!leading) ++lost;
  });
  a.Start();
  ASSERT_TRUE(Eventually([&] { return a.IsLeader(); }));
  // Someone else writes itself into the lease (a partitioned leader's view of the world).
  json lease = Get(kLease);
  lease["spec"]["holderIdentity"] = "thief";
  lease["spec"]["leaseDurationSeconds"] = 30;
  auto put = client_->Request("PUT", kLease, &lease);
  ASSERT_TRUE(put.ok() && put->code == 200);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(Eventually([&] { return !a.IsLeader(); }, 6s));
  // It stops at its renew deadline (3 s after its last renewal), before anyone may take the lease
  // from it (4 s): two leaders never bind at once.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4000ms);
  ASSERT_TRUE(Eventually([&] { return lost.load() == 1; }, 6s));
  // The thief's lease lapses after 1 s: a replica that lost the lease never leads again (it exits,
  // and a fresh process stands by).
  lease = Get(kLease);
  lease["spec"]["leaseDurationSeconds"] = 1;
  put = client_->Request("PUT", kLease, &lease);
  ASSERT_TRUE(put.ok() && put->code == 200);
  std::this_thread::sleep_for(2500ms);
  EXPECT_FALSE(a.IsLeader());
  EXPECT_EQ(Get(kLease)["spec"]["holderIdentity"], "thief");
}

TEST_F(KubeSchedulerTest, AMalformedLeaseIsOverwrittenNotTrusted) {
  Post("/apis/coordination.k8s.io/v1/namespaces/sys/leases",
       {{"metadata", {{"name", "gpupool-scheduler"}}}, {"spec", {{"holderIdentity", ""}, {"leaseTransitions", "many"}}}});
  LeaderElector b(client_.get(), Lease("b"), nullptr);
  b.Start();
  ASSERT_TRUE(Eventually([&] { return b.IsLeader(); }, 5s)) << b.last_error();
  EXPECT_EQ(Get(kLease)["spec"]["holderIdentity"], "b");
  EXPECT_FALSE(LeaderElector::Validate(Lease("")).ok());
  LeaderElector::Options bad = Lease("x");
  bad.renew_deadline = bad.lease_duration;
  EXPECT_FALSE(LeaderElector::Validate(bad).ok());
}

TEST_F(KubeSchedulerTest, BindsWithTheAssignmentAndSaysWhyAPodStaysPending) {
  AddNode("n1", 8);
  AddNode("n2", 8);
  auto s = StartAlone();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  for (int i = 0; i < 6; ++i) AddPod(fmt::format("p{}", i), 2);
  AddPod("big", 16);
  ASSERT_TRUE(Eventually([&] {
    for (int i = 0; i < 6; ++i)
      if (NodeOf(fmt::format("p{}", i)).empty()) return false;
    return true;
  }));
  json p0 = Get("/api/v1/namespaces/ml/pods/p0");
  json a = json::parse(p0["metadata"]["annotations"][kAssignmentKey].get<std::string>());
  EXPECT_EQ(a["podUID"], p0["metadata"]["uid"]);
  EXPECT_EQ(a["node"], p0["spec"]["nodeName"]);
  EXPECT_EQ(a["gpus"].size(), 2u);
  ASSERT_TRUE(Eventually([&] {
    json big = Get("/api/v1/namespaces/ml/pods/big");
    for (const auto& c : big["status"].value("conditions", json::array()))
      if (c["type"] == "PodScheduled" && c["status"] == "False" &&
          c["message"].get<std::string>().find("0/2 nodes fit") != std::string::npos)
        return true;
    return false;
  }));
  ASSERT_TRUE(Eventually([&] {
    auto events = client_->List("/api/v1/namespaces/ml/events", "fieldSelector=involvedObject.name%3Dbig");
    return events.ok() && !events->items.empty() && events->items[0]["reason"] == "FailedScheduling";
  }));
  EXPECT_EQ((*s)->stats().bound, 6u);
  std::string why;
  EXPECT_TRUE((*s)->Healthy(&why)) << why;
  const std::string metrics = (*s)->MetricsText();
  EXPECT_NE(metrics.find("gpupool_kube_pods_bound_total 6"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("gpupool_kube_pending_pods{reason=\"Unschedulable\"} 1"), std::string::npos) << metrics;
  (*s)->Stop();
}

TEST_F(KubeSchedulerTest, ANewLeaderSeesWhatTheOldOneBoundAndOvercommitsNothing) {
  AddNode("n1", 4);
  KubeSchedulerOptions o;
  o.bind_workers = 2;
  o.leader = Lease("first");
  auto first = KubeScheduler::Create(client_.get(), o);
  ASSERT_TRUE(first.ok());
  (*first)->Start();
  ASSERT_TRUE(Eventually([&] { return (*first)->leading(); }));
  AddPod("a", 3);
  ASSERT_TRUE(Eventually([&] { return !NodeOf("a").empty(); }));
  o.leader = Lease("second");
  auto second = KubeScheduler::Create(client_.get(), o);
  ASSERT_TRUE(second.ok());
  (*second)->Start();
  (*first)->Stop();
  ASSERT_TRUE(Eventually([&] { return (*second)->leading(); }));
  AddPod("b", 2);  // does not fit beside a: the new leader must know a holds three of four GPUs
  AddPod("c", 1);
  ASSERT_TRUE(Eventually([&] { return !NodeOf("c").empty(); }));
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(NodeOf("b"), "");
  json pc = Get("/api/v1/namespaces/ml/pods/c");
  json pa = Get("/api/v1/namespaces/ml/pods/a");
  json ac = json::parse(pc["metadata"]["annotations"][kAssignmentKey].get<std::string>());
  json aa = json::parse(pa["metadata"]["annotations"][kAssignmentKey].get<std::string>());
  for (const auto& g : aa["gpus"]) EXPECT_NE(g["index"], ac["gpus"][0]["index"]);
  (*second)->Stop();
}

TEST_F(KubeSchedulerTest, PreemptsThroughTheEvictionSubresourceAndBacksOffWhenABudgetRefuses) {
  AddNode("n1", 4);
  AddNode("n2", 2);
  auto s = StartAlone();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const json be = {{"gpupool.io/qos", "best-effort"}};
  AddPod("guarded", 4, be);  // its eviction is refused (the test server's stand-in for a budget)
  AddPod("free", 2, be);
  ASSERT_TRUE(Eventually([&] { return !NodeOf("guarded").empty() && !NodeOf("free").empty(); }));
  const json urgent = {{"gpupool.io/priority", "10"}};
  AddPod("urgent", 4, urgent);
  AddPod("urgent2", 2, urgent);
  ASSERT_TRUE(Eventually([&] { return NodeOf("urgent2") == "n2"; }));
  EXPECT_TRUE(Get("/api/v1/namespaces/ml/pods/free").is_null());  // evicted
  ASSERT_TRUE(Eventually([&] {
    auto events = client_->List("/api/v1/namespaces/ml/events", "fieldSelector=involvedObject.name%3Dfree");
    if (!events.ok()) return false;
    for (const auto& e : events->items)
      if (e["reason"] == "Preempted" && e["message"].get<std::string>().find("preempted by ml/urgent") != std::string::npos)
        return true;
    return false;
  }));
  // The guarded pod stays; its eviction is not asked again at the cycle rate (10 s back-off).
  ASSERT_TRUE(Eventually([&] { return (*s)->stats().eviction_failures >= 1; }));
  std::this_thread::sleep_for(2s);
  EXPECT_EQ((*s)->stats().eviction_failures, 1u);
  EXPECT_EQ((*s)->stats().evictions, 1u);
  EXPECT_EQ(NodeOf("guarded"), "n1");
  EXPECT_TRUE(NodeOf("urgent").empty());
  const std::string metrics = (*s)->MetricsText();
  EXPECT_NE(metrics.find("gpupool_kube_preemption_evictions_total 1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("gpupool_kube_preemption_eviction_failures_total 1"), std::string::npos) << metrics;
  (*s)->Stop();
}

}  // namespace
}  // namespace gpupool::kube
