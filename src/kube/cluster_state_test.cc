#include "kube/cluster_state.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include <fmt/format.h>

namespace gpupool::kube {
namespace {

using Json = nlohmann::json;

// A Node as the API server has it: allocatable, Ready, and the GPUs either as kube-node's inventory
// annotation or as GPU feature discovery's labels.
Json NodeObj(const std::string& name, int gpus, const std::string& model = "A100-80GB", bool inventory = true,
             int mig_gpu = -1) {
  Json n = {{"apiVersion", "v1"},
            {"kind", "Node"},
            {"metadata", {{"name", name}, {"labels", {{"kubernetes.io/hostname", name}}}}},
            {"spec", Json::object()},
            {"status",
             {{"allocatable", {{"cpu", "64"}, {"memory", "512Gi"}, {"pods", "110"}}},
              {"conditions", Json::array({{{"type", "Ready"}, {"status", "True"}}})}}}};
  if (inventory) {
    Json inv = {{"gpus", Json::array()}};
    for (int i = 0; i < gpus; ++i)
      inv["gpus"].push_back({{"index", i}, {"uuid", fmt::format("GPU-{}-{}", name, i)}, {"model", model},
                           {"migEnabled", i == mig_gpu}});
    n["metadata"]["annotations"][kInventoryKey] = inv.dump();
  } else {
    n["status"]["allocatable"]["nvidia.com/gpu"] = std::to_string(gpus);
    n["metadata"]["labels"][kGpuProductLabel] = "NVIDIA-A100-SXM4-80GB";
    n["metadata"]["labels"][kGpuMemoryLabel] = "81920";
  }
  return n;
}

Json PodObj(const std::string& name, Json limits, Json annotations = Json::object(),
            const std::string& scheduler = "gpupool") {
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", "ml"}, {"uid", "uid-" + name}, {"annotations", annotations}}},
          {"spec",
           {{"schedulerName", scheduler},
            {"containers", Json::array({{{"name", "main"}, {"resources", {{"limits", limits}}}}})}}},
          {"status", {{"phase", "Pending"}}}};
}

// What the API server shows after a binding: the node and the binding's annotations.
Json Bound(Json pod, const BindOrder& b) {
  pod["spec"]["nodeName"] = b.node;
  pod["metadata"]["annotations"][kAssignmentKey] = b.assignment;
  return pod;
}

class ClusterStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = ClusterState::Create({});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    state = std::move(s).value();
  }
  const BindOrder* Find(const CycleResult& r, const std::string& name) {
    for (const auto& b : r.binds)
      if (b.name == name) return &b;
    return nullptr;
  }
  const PendingReport* FindReport(const CycleResult& r, const std::string& name) {
    for (const auto& p : r.pending)
      if (p.name == name) return &p;
    return nullptr;
  }
  std::unique_ptr<ClusterState> state;
};

// Every 512 new pods the recent window's typical workload is learned again; the pipeline (and its
// caches and best-node indexes, a pass over every node per shape to build) is rebuilt only when
// that workload moved by 1 % or more.
TEST_F(ClusterStateTest, RelearningRebuildsOnlyWhenTheMixMoved) {
  state->ApplyNode("ADDED", NodeObj("n1", 8));
  (void)state->Cycle();  // takes the node in
  int next = 0;
  auto arrive = [&](int n, const Json& limits) {
    for (int i = 0; i < n; ++i) state->ApplyPod("ADDED", PodObj(fmt::format("p{}", next++), limits));
    (void)state->Cycle();
  };
  const Json whole = {{"nvidia.com/gpu", 1}, {"cpu", "4"}};  // not the default (no CPU, one GPU)
  arrive(600, whole);  // from the built-in default to the pods' own shape
  EXPECT_EQ(state->counts().relearned, 1u);
  EXPECT_EQ(state->counts().relearn_kept, 0u);
  arrive(600, whole);  // the same mix: kept
  EXPECT_EQ(state->counts().relearned, 1u);
  EXPECT_EQ(state->counts().relearn_kept, 1u);
  arrive(600, {{"gpupool.io/gpu-milli", 500}});  // a third of the window is another shape now
  EXPECT_EQ(state->counts().relearned, 2u);
  EXPECT_EQ(state->counts().relearn_kept, 1u);
  ASSERT_TRUE(state->CheckInvariants().ok());
}

TEST_F(ClusterStateTest, PlacesWholeFractionalAndMigPodsAndCountsTheirBindingsOnce) {
  state->ApplyNode("ADDED", NodeObj("n1", 8, "A100-80GB", true, 7));
  Json whole = PodObj("whole", {{"nvidia.com/gpu", 4}});
  Json frac = PodObj("frac", {{"gpupool.io/gpu-milli", 250}, {"gpupool.io/gpu-memory", "10Gi"}});
  Json mig = PodObj("mig", Json::object(), {{"gpupool.io/mig", "3g.40gb"}});
  for (const Json* p : {&whole, &frac, &mig}) state->ApplyPod("ADDED", *p);
  CycleResult r = state->Cycle();
  ASSERT_EQ(r.binds.size(), 3u) << (r.pending.empty() ? "" : r.pending[0].message);
  EXPECT_EQ(state->counts().pods_assumed, 3u);
  const BindOrder* w = Find(r, "whole");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->node, "n1");
  Json a = Json::parse(w->assignment);
  EXPECT_EQ(a["podUID"], "uid-whole");
  EXPECT_EQ(a["gpus"].size(), 4u);
  EXPECT_EQ(a["gpus"][0]["uuid"].get<std::string>().rfind("GPU-n1-", 0), 0u);
  Json fa = Json::parse(Find(r, "frac")->assignment);
  EXPECT_EQ(fa["gpus"][0]["share"], 250);
  Json ma = Json::parse(Find(r, "mig")->assignment);
  EXPECT_EQ(ma["gpus"][0]["mig"]["profile"], "3g.40gb");
  const size_t allocations = state->ledger().allocation_count();
  // The informer shows each binding: nothing is charged twice.
  state->ApplyPod("MODIFIED", Bound(whole, *w));
  state->ApplyPod("MODIFIED", Bound(frac, *Find(r, "frac")));
  state->ApplyPod("MODIFIED", Bound(mig, *Find(r, "mig")));
  EXPECT_EQ(state->ledger().allocation_count(), allocations);
  EXPECT_EQ(state->counts().pods_assumed, 0u);
  EXPECT_TRUE(state->CheckInvariants().ok()) << state->CheckInvariants().ToString();
  EXPECT_TRUE(state->Cycle().binds.empty());
}

// kube-node's inventory annotation carries the MIG layout that exists (api/mig_report.h): a MIG
// pod takes the idle instance reported there; a later annotation with another layout is taken in;
// a layout that cannot be keeps the node out, naming the field.
TEST_F(ClusterStateTest, MigPodsTakeTheInstanceTheInventoryReports) {
  auto with_layout = [](const Json& instances) {
    Json n = NodeObj("n1", 1, "A100-80GB", true, 0);
    Json inv = Json::parse(n["metadata"]["annotations"][kInventoryKey].get<std::string>());
    inv["gpus"][0]["migInstances"] = instances;
    n["metadata"]["annotations"][kInventoryKey] = inv.dump();
    return n;
  };
  // A 3g at slice 0 exists; a fresh plan would make one at 4.
  state->ApplyNode("ADDED", with_layout(Json::parse(R"([{"profileId": 9, "start": 0}])")));
  state->ApplyPod("ADDED", PodObj("mig", Json::object(), {{"gpupool.io/mig", "3g.40gb"}}));
  CycleResult r = state->Cycle();
  ASSERT_EQ(r.binds.size(), 1u) << (r.pending.empty() ? "" : r.pending[0].message);
  EXPECT_EQ(Json::parse(r.binds[0].assignment)["gpus"][0]["mig"]["start"], 0) << r.binds[0].assignment;
  // The layout changes: the node takes it in (a 1g at 6 is idle now).
  state->ApplyNode("MODIFIED",
                   with_layout(Json::parse(R"([{"profileId": 9, "start": 0}, {"profileId": 19, "start": 5}])")));
  (void)state->Cycle();
  ASSERT_EQ(state->ledger().node_count(), 1u);
  const MigLayout* present = state->ledger().mig_present(0, 0);
  ASSERT_NE(present, nullptr);
  EXPECT_EQ(present->instances().size(), 2u);
  // One that cannot be: the node is refused, the field named.
  state->ApplyNode("MODIFIED", with_layout(Json::parse(R"([{"profileId": 9, "start": 0, "x": 1}])")));
  (void)state->Cycle();
  EXPECT_EQ(state->ledger().node_count(), 0u);
}

TEST_F(ClusterStateTest, AStandbyRebuildsTheSameHoldingsFromBoundPodsAlone) {
  state->ApplyNode("ADDED", NodeObj("n1", 8));
  Json p1 = PodObj("p1", {{"gpupool.io/gpu-milli", 500}});
  Json p2 = PodObj("p2", {{"nvidia.com/gpu", 2}});
  state->ApplyPod("ADDED", p1);
  state->ApplyPod("ADDED", p2);
  CycleResult r = state->Cycle();
  ASSERT_EQ(r.binds.size(), 2u);
  auto other = ClusterState::Create({});
  ASSERT_TRUE(other.ok());
  // The standby sees the pods before the node (informers start in any order).
  (*other)->ApplyPod("ADDED", Bound(p1, *Find(r, "p1")));
  (*other)->ApplyPod("ADDED", Bound(p2, *Find(r, "p2")));
  EXPECT_EQ((*other)->counts().pods_waiting_node, 2u);
  (*other)->ApplyNode("ADDED", NodeObj("n1", 8));
  EXPECT_EQ((*other)->counts().pods_waiting_node, 0u);
  for (NodeIndex n = 0; n < 1; ++n) {
    for (size_t g = 0; g < 8; ++g)
      EXPECT_EQ((*other)->ledger().state(n).gpus[g].free_share, state->ledger().state(n).gpus[g].free_share) << g;
  }
  EXPECT_TRUE((*other)->CheckInvariants().ok());
}

TEST_F(ClusterStateTest, OtherSchedulersPodsHoldTheirGpusCpuAndMemory) {
  state->ApplyNode("ADDED", NodeObj("n1", 8, "A100-80GB", false));
  Json foreign = PodObj("theirs", {{"nvidia.com/gpu", 6}, {"cpu", "8"}}, Json::object(), "default-scheduler");
  foreign["spec"]["nodeName"] = "n1";
  state->ApplyPod("ADDED", foreign);
  EXPECT_EQ(state->ledger().state(0).fully_free_gpus, 2);
  state->ApplyPod("ADDED", PodObj("big", {{"nvidia.com/gpu", 4}}));
  CycleResult r = state->Cycle();
  EXPECT_TRUE(r.binds.empty());
  ASSERT_NE(FindReport(r, "big"), nullptr);
  EXPECT_EQ(FindReport(r, "big")->reason, "Unschedulable");
  EXPECT_NE(FindReport(r, "big")->message.find("0/1 nodes"), std::string::npos) << FindReport(r, "big")->message;
  // It ends: its GPUs are free again and the pending pod goes.
  foreign["status"]["phase"] = "Succeeded";
  state->ApplyPod("MODIFIED", foreign);
  r = state->Cycle();
  ASSERT_EQ(r.binds.size(), 1u);
  EXPECT_TRUE(state->CheckInvariants().ok());
}

TEST_F(ClusterStateTest, AGangIsBoundWhole_OrNotAtAll) {
  state->ApplyNode("ADDED", NodeObj("n1", 8));
  state->ApplyNode("ADDED", NodeObj("n2", 8));
  Json ann = {{"gpupool.io/gang", "train"}, {"gpupool.io/gang-min", "3"}};
  for (int i = 0; i < 3; ++i) state->ApplyPod("ADDED", PodObj(fmt::format("w{}", i), {{"nvidia.com/gpu", 8}}, ann));
  CycleResult r = state->Cycle();
  EXPECT_TRUE(r.binds.empty());
  EXPECT_EQ(state->ledger().allocation_count(), 0u);
  ASSERT_EQ(r.pending.size(), 3u);
  EXPECT_NE(r.pending[0].message.find("gang ml/train: 3 member(s) must fit together"), std::string::npos)
      << r.pending[0].message;
  // Unchanged capacity: the gang is not tried again and not reported again.
  EXPECT_EQ(state->Cycle().pending.size(), 0u);
  state->ApplyNode("ADDED", NodeObj("n3", 8));
  r = state->Cycle();
  ASSERT_EQ(r.binds.size(), 3u);
  std::set<std::string> nodes;
  for (const auto& b : r.binds) nodes.insert(b.node);
  EXPECT_EQ(nodes.size(), 3u);
}

TEST_F(ClusterStateTest, AGangWaitsForItsMinimumOfMembers) {
  state->ApplyNode("ADDED", NodeObj("n1", 8));
  Json ann = {{"gpupool.io/gang", "g"}, {"gpupool.io/gang-min", "4"}};
  for (int i = 0; i < 2; ++i) state->ApplyPod("ADDED", PodObj(fmt::format("m{}", i), {{"nvidia.com/gpu", 1}}, ann));
  CycleResult r = state->Cycle();
  EXPECT_TRUE(r.binds.empty());
  ASSERT_EQ(r.pending.size(), 2u);
  EXPECT_EQ(r.pending[0].reason, "WaitingForGang");
  EXPECT_NE(r.pending[0].message.find("2 of 4 members"), std::string::npos) << r.pending[0].message;
  EXPECT_EQ(state->PendingByReason()["WaitingForGang"], 2u);
  for (int i = 2; i < 4; ++i) state->ApplyPod("ADDED", PodObj(fmt::format("m{}", i), {{"nvidia.com/gpu", 1}}, ann));
  EXPECT_EQ(state->Cycle().binds.size(), 4u);
}

TEST_F(ClusterStateTest, AFailedBindingReleasesWhatThePodHeld) {
  state->ApplyNode("ADDED", NodeObj("n1", 1));
  state->ApplyPod("ADDED", PodObj("a", {{"nvidia.com/gpu", 1}}));
  state->ApplyPod("ADDED", PodObj("b", {{"nvidia.com/gpu", 1}}));
  CycleResult r = state->Cycle();
  ASSERT_EQ(r.binds.size(), 1u);
  const std::string bound = r.binds[0].name;
  state->BindFailed(r.binds[0].uid);
  EXPECT_EQ(state->ledger().allocation_count(), 0u);
  r = state->Cycle();
  ASSERT_EQ(r.binds.size(), 1u);
  EXPECT_EQ(r.binds[0].name, bound);  // first come, first served again
  EXPECT_TRUE(state->CheckInvariants().ok());
}

// Pods that fit nowhere are tried again when something they depend on changed (a pod ended, a
// node's labels or health), not on every cycle and not for a node's status heartbeat: at 100,000
// pending pods a retry of each on every event was the kube-scheduler's main cost.
TEST_F(ClusterStateTest, PodsThatFitNowhereAreTriedAgainOnlyWhenSomethingChanged) {
  Json node = NodeObj("n1", 1);
  state->ApplyNode("ADDED", node);
  const Json a = PodObj("a", {{"nvidia.com/gpu", 1}});
  state->ApplyPod("ADDED", a);
  state->ApplyPod("ADDED", PodObj("b", {{"nvidia.com/gpu", 1}}));
  state->ApplyPod("ADDED", PodObj("bad", {{"nvidia.com/gpu", 1}}, {{kQueueKey, "no-such-queue"}}));
  CycleResult r = state->Cycle();
  ASSERT_EQ(r.binds.size(), 1u);
  ASSERT_EQ(r.binds[0].name, "a");
  EXPECT_EQ(r.decisions, 2);
  ASSERT_NE(FindReport(r, "bad"), nullptr);
  EXPECT_EQ(FindReport(r, "bad")->reason, "Invalid");
  state->ApplyPod("MODIFIED", Bound(a, r.binds[0]));  // its binding, seen
  r = state->Cycle();
  EXPECT_EQ(r.decisions, 0);
  EXPECT_TRUE(r.pending.empty());

  node["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-12-07T01:00:00Z";
  state->ApplyNode("MODIFIED", node);
  EXPECT_EQ(state->Cycle().decisions, 0) << "a heartbeat retried the pods that fit nowhere";

  node["metadata"]["labels"]["zone"] = "b";  // may open the node to a selector
  state->ApplyNode("MODIFIED", node);
  EXPECT_EQ(state->Cycle().decisions, 1);
  EXPECT_EQ(state->Cycle().decisions, 0);

  state->ApplyPod("DELETED", Bound(a, r.binds.empty() ? BindOrder{} : r.binds[0]));
  r = state->Cycle();
  ASSERT_EQ(r.binds.size(), 1u);
  EXPECT_EQ(r.binds[0].name, "b");
  EXPECT_EQ(state->PendingByReason()["Invalid"], 1u);
  EXPECT_TRUE(state->CheckInvariants().ok());
}

// A gang short of its minimum starts once members bound elsewhere (by a replica before this one)
// make up the difference, though no capacity was freed.
TEST_F(ClusterStateTest, AGangShortOfItsMinimumCountsMembersBoundElsewhere) {
  state->ApplyNode("ADDED", NodeObj("n1", 8));
  Json ann = {{"gpupool.io/gang", "g"}, {"gpupool.io/gang-min", "3"}};
  for (int i = 0; i < 2; ++i) state->ApplyPod("ADDED", PodObj(fmt::format("m{}", i), {{"nvidia.com/gpu", 1}}, ann));
  CycleResult r = state->Cycle();
  ASSERT_EQ(r.pending.size(), 2u);
  EXPECT_EQ(r.pending[0].reason, "WaitingForGang");
  EXPECT_EQ(state->Cycle().decisions, 0);
  Json m2 = PodObj("m2", {{"nvidia.com/gpu", 1}}, ann);
  m2["spec"]["nodeName"] = "n1";
  state->ApplyPod("ADDED", m2);
  EXPECT_EQ(state->Cycle().binds.size(), 2u);
  EXPECT_TRUE(state->CheckInvariants().ok());
}

TEST_F(ClusterStateTest, NodeSelectorsAffinityAndTaintsRestrictNodes) {
  Json n1 = NodeObj("n1", 8);
  n1["metadata"]["labels"]["pool"] = "a";
  Json n2 = NodeObj("n2", 8);
  n2["metadata"]["labels"]["pool"] = "b";
  n2["spec"]["taints"] = Json::array({{{"key", "gpu"}, {"value", "h100"}, {"effect", "NoSchedule"}}});
  state->ApplyNode("ADDED", n1);
  state->ApplyNode("ADDED", n2);
  Json sel = PodObj("sel", {{"nvidia.com/gpu", 1}});
  sel["spec"]["nodeSelector"] = {{"pool", "b"}};
  Json tol = sel;
  tol["metadata"]["name"] = "tol";
  tol["metadata"]["uid"] = "uid-tol";
  tol["spec"]["tolerations"] = Json::array({{{"key", "gpu"}, {"operator", "Exists"}}});
  Json aff = PodObj("aff", {{"nvidia.com/gpu", 1}});
  aff["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] =
      Json::array({{{"matchExpressions", Json::array({{{"key", "pool"}, {"operator", "NotIn"}, {"values", {"b"}}}})}}});
  Json anti = PodObj("anti", {{"nvidia.com/gpu", 1}});
  anti["spec"]["affinity"]["podAntiAffinity"] = {{"requiredDuringSchedulingIgnoredDuringExecution", Json::array({Json::object()})}};
  for (const Json* p : {&sel, &tol, &aff, &anti}) state->ApplyPod("ADDED", *p);
  CycleResult r = state->Cycle();
  EXPECT_EQ(Find(r, "sel"), nullptr);  // n2 is tainted, and it does not tolerate it
  ASSERT_NE(FindReport(r, "sel"), nullptr);
  EXPECT_NE(FindReport(r, "sel")->message.find("node selector, affinity or taints"), std::string::npos);
  ASSERT_NE(Find(r, "tol"), nullptr);
  EXPECT_EQ(Find(r, "tol")->node, "n2");
  ASSERT_NE(Find(r, "aff"), nullptr);
  EXPECT_EQ(Find(r, "aff")->node, "n1");
  ASSERT_NE(FindReport(r, "anti"), nullptr);
  EXPECT_EQ(FindReport(r, "anti")->reason, "Invalid");
  EXPECT_NE(FindReport(r, "anti")->message.find("podAntiAffinity"), std::string::npos);
}

TEST_F(ClusterStateTest, HostilePodsAndNodesAreReportedAndChangeNothing) {
  Json bad_inv = NodeObj("bad", 8);
  bad_inv["metadata"]["annotations"][kInventoryKey] = std::string(100000, '[');
  state->ApplyNode("ADDED", bad_inv);
  Json not_json = NodeObj("bad2", 8);
  not_json["metadata"]["annotations"][kInventoryKey] = "{\"gpus\": 7}";
  state->ApplyNode("ADDED", not_json);
  Json no_label = NodeObj("bad3", 8, "A100-80GB", false);
  no_label["metadata"]["labels"].erase(kGpuProductLabel);
  state->ApplyNode("ADDED", no_label);
  EXPECT_EQ(state->bad_nodes().size(), 3u);
  EXPECT_NE(state->bad_nodes().at("bad3").find(kGpuProductLabel), std::string::npos);
  state->ApplyNode("ADDED", NodeObj("n1", 8));
  state->ApplyPod("ADDED", PodObj("neg", {{"nvidia.com/gpu", -1}}));
  state->ApplyPod("ADDED", PodObj("huge", {{"nvidia.com/gpu", 100000}}));
  state->ApplyPod("ADDED", PodObj("noqueue", {{"nvidia.com/gpu", 1}}, {{"gpupool.io/queue", "nope"}}));
  Json garbage = {{"metadata", {{"uid", "u"}, {"name", 7}}}, {"spec", "x"}};
  state->ApplyPod("ADDED", garbage);
  state->ApplyPod("ADDED", Json::array());
  CycleResult r = state->Cycle();
  EXPECT_TRUE(r.binds.empty());
  ASSERT_NE(FindReport(r, "neg"), nullptr);
  EXPECT_EQ(FindReport(r, "neg")->reason, "Invalid");
  for (const char* name : {"huge", "noqueue"}) ASSERT_NE(FindReport(r, name), nullptr) << name;
  EXPECT_NE(FindReport(r, "huge")->message.find("nvidia.com/gpu"), std::string::npos);
  EXPECT_NE(FindReport(r, "noqueue")->message.find("queue 'nope'"), std::string::npos);
  EXPECT_EQ(state->ledger().allocation_count(), 0u);
  // A binding that names someone else's UID, or another node, is not believed.
  Json liar = PodObj("liar", {{"nvidia.com/gpu", 8}}, Json::object(), "default-scheduler");
  liar["spec"]["nodeName"] = "n1";
  liar["metadata"]["annotations"][kAssignmentKey] = R"({"podUID":"someone-else","node":"n1","gpus":[]})";
  state->ApplyPod("ADDED", liar);
  EXPECT_EQ(state->ledger().state(0).fully_free_gpus, 0);  // charged as 8 whole GPUs all the same
  EXPECT_TRUE(state->CheckInvariants().ok());
}

TEST_F(ClusterStateTest, ANodeThatGoesAwayOrChangesIsRebuiltAround) {
  state->ApplyNode("ADDED", NodeObj("n1", 8));
  state->ApplyNode("ADDED", NodeObj("n2", 8));
  Json p = PodObj("p", {{"nvidia.com/gpu", 8}});
  state->ApplyPod("ADDED", p);
  CycleResult r = state->Cycle();
  ASSERT_EQ(r.binds.size(), 1u);
  Json bound = Bound(p, r.binds[0]);
  state->ApplyPod("MODIFIED", bound);
  const std::string mine = r.binds[0].node;
  const std::string other = mine == "n1" ? "n2" : "n1";
  state->ApplyNode("DELETED", NodeObj(other, 8));
  state->ApplyPod("ADDED", PodObj("q", {{"nvidia.com/gpu", 1}}));
  r = state->Cycle();
  EXPECT_TRUE(r.binds.empty());  // the only node left is full
  EXPECT_EQ(state->counts().nodes, 1u);
  // The node grows two GPUs: rebuilt, the bound pod still holds its eight.
  state->ApplyNode("MODIFIED", NodeObj(mine, 10));
  r = state->Cycle();
  ASSERT_EQ(r.binds.size(), 1u);
  EXPECT_TRUE(state->CheckInvariants().ok()) << state->CheckInvariants().ToString();
  // Not Ready: no new pods there.
  Json down = NodeObj(mine, 10);
  down["status"]["conditions"][0]["status"] = "False";
  state->ApplyNode("MODIFIED", down);
  state->ApplyPod("ADDED", PodObj("z", {{"nvidia.com/gpu", 1}}));
  EXPECT_TRUE(state->Cycle().binds.empty());
}

}  // namespace
}  // namespace gpupool::kube

namespace gpupool::kube {
namespace {

// Preemption: gpupool's best-effort pods of lower priority make room for a pod that does not fit
// otherwise; the rest keep running; nothing else is evicted.
TEST_F(ClusterStateTest, PreemptsLowerPriorityBestEffortPodsOnlyAsFarAsNeeded) {
  state->ApplyNode("ADDED", NodeObj("n1", 4));
  // Four best-effort one-GPU pods (priority 0, 0, 0, 5) and nothing free.
  std::vector<Json> low;
  for (int i = 0; i < 4; ++i) {
    low.push_back(PodObj(fmt::format("be-{}", i), {{"nvidia.com/gpu", 1}},
                         {{"gpupool.io/qos", "best-effort"}, {"gpupool.io/priority", i == 3 ? "5" : "0"}}));
    state->ApplyPod("ADDED", low.back());
  }
  CycleResult r = state->Cycle();
  ASSERT_EQ(r.binds.size(), 4u);
  for (size_t i = 0; i < 4; ++i) state->ApplyPod("MODIFIED", Bound(low[i], *Find(r, low[i]["metadata"]["name"])));
  EXPECT_TRUE(r.evictions.empty());

  // A burstable pod of priority 1 that needs two GPUs: two priority-0 pods go, the most recently
  // started first; the priority-5 one stays, as does the third priority-0 one.
  Json big = PodObj("big", {{"nvidia.com/gpu", 2}}, {{"gpupool.io/priority", "1"}});
  state->ApplyPod("ADDED", big);
  r = state->Cycle();
  EXPECT_TRUE(r.binds.empty());
  ASSERT_EQ(r.evictions.size(), 2u);
  EXPECT_EQ(r.evictions[0].name, "be-2");
  EXPECT_EQ(r.evictions[1].name, "be-1");
  EXPECT_NE(r.evictions[0].message.find("preempted by ml/big (priority 1 > 0)"), std::string::npos) << r.evictions[0].message;
  const PendingReport* rep = FindReport(r, "big");
  ASSERT_NE(rep, nullptr);
  EXPECT_EQ(rep->reason, "Preempting");
  ASSERT_TRUE(state->CheckInvariants().ok()) << state->CheckInvariants().ToString();  // the what-if left the ledger as it was

  // While the victims are on their way out, nothing more is evicted.
  r = state->Cycle();
  EXPECT_TRUE(r.evictions.empty());
  EXPECT_TRUE(r.binds.empty());
  // They end: the preemptor is placed.
  state->ApplyPod("DELETED", low[2]);
  state->ApplyPod("DELETED", low[1]);
  r = state->Cycle();
  ASSERT_NE(Find(r, "big"), nullptr);
  EXPECT_TRUE(r.evictions.empty());
  ASSERT_TRUE(state->CheckInvariants().ok());
}

TEST_F(ClusterStateTest, NeverPreemptsBurstableOrForeignPodsOrForEqualPriority) {
  state->ApplyNode("ADDED", NodeObj("n1", 2));
  Json burst = PodObj("burst", {{"nvidia.com/gpu", 1}});  // burstable: never a victim
  Json theirs = PodObj("theirs", {{"nvidia.com/gpu", 1}}, Json::object(), "default-scheduler");
  theirs["spec"]["nodeName"] = "n1";
  state->ApplyPod("ADDED", theirs);
  state->ApplyPod("ADDED", burst);
  CycleResult r = state->Cycle();
  ASSERT_EQ(r.binds.size(), 1u);
  state->ApplyPod("MODIFIED", Bound(burst, r.binds[0]));
  Json hi = PodObj("hi", {{"nvidia.com/gpu", 1}}, {{"gpupool.io/priority", "100"}});
  state->ApplyPod("ADDED", hi);
  r = state->Cycle();
  EXPECT_TRUE(r.evictions.empty());
  ASSERT_NE(FindReport(r, "hi"), nullptr);
  EXPECT_EQ(FindReport(r, "hi")->reason, "Unschedulable");

  // A best-effort pod of the same priority as the preemptor is not a victim either.
  state->ApplyNode("ADDED", NodeObj("n2", 1));
  Json be = PodObj("be", {{"nvidia.com/gpu", 1}}, {{"gpupool.io/qos", "best-effort"}, {"gpupool.io/priority", "100"}});
  state->ApplyPod("DELETED", hi);
  state->ApplyPod("ADDED", be);
  r = state->Cycle();
  ASSERT_EQ(r.binds.size(), 1u);
  state->ApplyPod("MODIFIED", Bound(be, r.binds[0]));
  Json same = PodObj("same", {{"nvidia.com/gpu", 1}}, {{"gpupool.io/priority", "100"}});
  state->ApplyPod("ADDED", same);
  r = state->Cycle();
  EXPECT_TRUE(r.evictions.empty());

  // A refused eviction (a PodDisruptionBudget): the pod is no victim until its back-off ends, then
  // a candidate again.
  Json higher = PodObj("higher", {{"nvidia.com/gpu", 1}}, {{"gpupool.io/priority", "101"}});
  state->ApplyPod("ADDED", higher);
  r = state->Cycle();
  ASSERT_EQ(r.evictions.size(), 1u);
  EXPECT_EQ(r.evictions[0].name, "be");
  state->EvictFailed(r.evictions[0].uid);
  r = state->Cycle();
  EXPECT_TRUE(r.evictions.empty());
  ASSERT_NE(FindReport(r, "higher"), nullptr);
  EXPECT_EQ(FindReport(r, "higher")->reason, "Unschedulable");
  state->Unprotect("uid-be");
  r = state->Cycle();
  ASSERT_EQ(r.evictions.size(), 1u);
  EXPECT_EQ(r.evictions[0].name, "be");
}

TEST_F(ClusterStateTest, AGangIsEvictedWhole) {
  state->ApplyNode("ADDED", NodeObj("n1", 4));
  std::vector<Json> gang;
  for (int i = 0; i < 2; ++i) {
    gang.push_back(PodObj(fmt::format("g-{}", i), {{"nvidia.com/gpu", 2}},
                          {{"gpupool.io/qos", "best-effort"}, {"gpupool.io/gang", "g"}, {"gpupool.io/gang-min", "2"}}));
    state->ApplyPod("ADDED", gang.back());
  }
  CycleResult r = state->Cycle();
  ASSERT_EQ(r.binds.size(), 2u);
  for (auto& g : gang) state->ApplyPod("MODIFIED", Bound(g, *Find(r, g["metadata"]["name"])));
  // One pod needing 2 GPUs: the whole gang (both members) is the victim, not one member.
  Json p = PodObj("p", {{"nvidia.com/gpu", 2}}, {{"gpupool.io/priority", "3"}});
  state->ApplyPod("ADDED", p);
  r = state->Cycle();
  ASSERT_EQ(r.evictions.size(), 2u);
  std::set<std::string> names = {r.evictions[0].name, r.evictions[1].name};
  EXPECT_EQ(names, (std::set<std::string>{"g-0", "g-1"}));
}

TEST_F(ClusterStateTest, AGangPreemptsForAllItsMembersTogether) {
  state->ApplyNode("ADDED", NodeObj("n1", 4));
  std::vector<Json> low;
  for (int i = 0; i < 4; ++i) {
    low.push_back(PodObj(fmt::format("be-{}", i), {{"nvidia.com/gpu", 1}}, {{"gpupool.io/qos", "best-effort"}}));
    state->ApplyPod("ADDED", low.back());
  }
  CycleResult r = state->Cycle();
  ASSERT_EQ(r.binds.size(), 4u);
  for (auto& p : low) state->ApplyPod("MODIFIED", Bound(p, *Find(r, p["metadata"]["name"])));
  for (int i = 0; i < 2; ++i)
    state->ApplyPod("ADDED", PodObj(fmt::format("m-{}", i), {{"nvidia.com/gpu", 2}},
                                    {{"gpupool.io/priority", "2"}, {"gpupool.io/gang", "m"}, {"gpupool.io/gang-min", "2"}}));
  r = state->Cycle();
  EXPECT_EQ(r.evictions.size(), 4u);  // two members of two GPUs: every one-GPU pod goes
  EXPECT_TRUE(r.binds.empty());
  for (auto& p : low) state->ApplyPod("DELETED", p);
  r = state->Cycle();
  EXPECT_EQ(r.binds.size(), 2u);
  EXPECT_TRUE(state->CheckInvariants().ok());
}

// The space a preemptor's victims free is held for it: a pod of another tenant that DRF offers
// first cannot take it (and make the preemptor preempt again, or wait for nothing).
TEST(ClusterStatePreemption, TheFreedSpaceIsReservedForThePreemptor) {
  ClusterOptions o;
  o.ordering.policy = OrderingPolicy::kDrf;
  auto created = ClusterState::Create(o);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  ClusterState& state = **created;
  state.ApplyNode("ADDED", NodeObj("n1", 2));
  state.ApplyNode("ADDED", NodeObj("n2", 2));
  Json anchor = PodObj("anchor", {{"nvidia.com/gpu", 2}});  // tenant ml uses something: DRF puts it last
  Json be = PodObj("be", {{"nvidia.com/gpu", 2}}, {{"gpupool.io/qos", "best-effort"}});
  for (Json* p : {&anchor, &be}) state.ApplyPod("ADDED", *p);
  CycleResult r = state.Cycle();
  ASSERT_EQ(r.binds.size(), 2u);
  for (const BindOrder& b : r.binds) state.ApplyPod("MODIFIED", Bound(b.name == "be" ? be : anchor, b));
  const std::string be_node = r.binds[0].name == "be" ? r.binds[0].node : r.binds[1].node;

  Json big = PodObj("big", {{"nvidia.com/gpu", 2}}, {{"gpupool.io/priority", "5"}});
  state.ApplyPod("ADDED", big);
  r = state.Cycle();
  ASSERT_EQ(r.evictions.size(), 1u);
  ASSERT_EQ(r.pending.size(), 1u);
  EXPECT_EQ(r.pending[0].nominated_node, be_node);
  Json sneaky = PodObj("sneaky", {{"nvidia.com/gpu", 1}});  // of tenant "other", its namespace
  sneaky["metadata"]["namespace"] = "other";
  state.ApplyPod("ADDED", sneaky);
  state.ApplyPod("DELETED", be);
  r = state.Cycle();
  ASSERT_EQ(r.binds.size(), 1u) << (r.pending.empty() ? "" : r.pending[0].name + ": " + r.pending[0].message);
  EXPECT_EQ(r.binds[0].name, "big");
  EXPECT_EQ(r.binds[0].node, be_node);
  EXPECT_TRUE(r.evictions.empty());
  EXPECT_TRUE(state.CheckInvariants().ok()) << state.CheckInvariants().ToString();  // no reservation left behind
}

// A pod's tenant is its namespace's; the queues' access rules hold for pods as for submissions.
TEST(ClusterStateTenants, APodCannotNameAnotherTenantOrStepOverAQueuesRules) {
  ClusterOptions o;
  o.namespace_tenants = {{"vision-train", "vision"}, {"vision-serve", "vision"}};
  QueueSpec vision;
  vision.name = "vision";
  vision.tenants = {"vision"};
  vision.max_priority = 100;
  vision.allowed_qos = {QosClass::kBurstable, QosClass::kBestEffort};
  QueueSpec open;
  open.name = "default";
  o.ordering.queues = {open, vision};
  auto created = ClusterState::Create(o);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  ClusterState& state = **created;
  state.ApplyNode("ADDED", NodeObj("n1", 8));
  auto pod = [](const std::string& name, const std::string& ns, Json annotations) {
    Json p = PodObj(name, {{"nvidia.com/gpu", 1}}, std::move(annotations));
    p["metadata"]["namespace"] = ns;
    return p;
  };
  const std::vector<Json> pods = {
      pod("ok", "vision-train", {{"gpupool.io/queue", "vision"}, {"gpupool.io/priority", "100"}}),
      pod("ok-named", "vision-serve", {{"gpupool.io/queue", "vision"}, {"gpupool.io/tenant", "vision"}}),
      pod("own-ns", "ml", {{"gpupool.io/tenant", "ml"}}),
      pod("claims", "ml", {{"gpupool.io/tenant", "vision"}, {"gpupool.io/queue", "vision"}}),
      pod("claims-unmapped", "vision-train", {{"gpupool.io/tenant", "vision-train"}}),
      pod("outsider", "ml", {{"gpupool.io/queue", "vision"}}),
      pod("too-high", "vision-train", {{"gpupool.io/queue", "vision"}, {"gpupool.io/priority", "101"}}),
      pod("qos", "vision-train", {{"gpupool.io/queue", "vision"}, {"gpupool.io/qos", "guaranteed"}}),
  };
  for (const Json& p : pods) state.ApplyPod("ADDED", p);
  const CycleResult r = state.Cycle();
  std::set<std::string> bound;
  for (const BindOrder& b : r.binds) bound.insert(b.name);
  EXPECT_EQ(bound, (std::set<std::string>{"ok", "ok-named", "own-ns"}));
  std::map<std::string, std::string> why;
  for (const PendingReport& p : r.pending) {
    EXPECT_EQ(p.reason, "Invalid") << p.name;
    why[p.name] = p.message;
  }
  ASSERT_EQ(why.size(), 5u);
  EXPECT_NE(why["claims"].find("names tenant 'vision', but the pods of namespace 'ml' belong to its own tenant 'ml'"),
            std::string::npos) << why["claims"];
  EXPECT_NE(why["claims-unmapped"].find("belong to tenant 'vision' (tenants.vision.namespaces)"), std::string::npos)
      << why["claims-unmapped"];
  EXPECT_NE(why["outsider"].find("queue 'vision' takes jobs of tenant(s) vision only (queue.tenants), not of 'ml'"),
            std::string::npos) << why["outsider"];
  EXPECT_NE(why["too-high"].find("allows priority up to 100 (queue.maxPriority), the job asks for 101"),
            std::string::npos) << why["too-high"];
  EXPECT_NE(why["qos"].find("(queue.allowedQos), not guaranteed"), std::string::npos) << why["qos"];
  EXPECT_TRUE(state.CheckInvariants().ok()) << state.CheckInvariants().ToString();
}

}  // namespace
}  // namespace gpupool::kube
