// Who tasks run as (server side of the task sandbox): configured identities, uids given from the
// range at a tenant's first placement and kept across restarts, root only in root queues, the
// host's network only in the queues the admin allows it for, and the config's refusals.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>
#include <fstream>
#include <string>

#include "server/config.h"
#include "server/node_mask.h"
#include "server/service.h"
#include "server/service_test_util.h"

namespace gpupool {
namespace {

using nlohmann::json;

const Principal kAdmin{"", Role::kAdmin};
const Principal kVision{"vision", Role::kTenant};
const Principal kNlp{"nlp", Role::kTenant};
const Principal kAudio{"audio", Role::kTenant};

class SandboxIdentityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpupool-sbid-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    config_.data_dir = dir_;
    config_.profile = "bestfit";
    config_.sync_full = false;
    config_.sandbox.uid_base = 300000;
    config_.sandbox.uid_count = 2;
    config_.sandbox.identities["vision"] = {20001, 20002};
    config_.sandbox.root_queues = {"ops"};
    config_.sandbox.host_network_queues = {"hpc"};
    config_.sandbox.runtime_class_queues["kata"] = {"hpc"};
    config_.sandbox.queue_runtime_class["secure"] = "runsc";
    Open();
    // Its agent offers runc, runsc and kata and a pod network (not crun).
    json body = {{"name", "n1"}, {"cpu", "64"}, {"memory", "512Gi"},
                 {"gpus", json::array({{{"index", 0}, {"model", "A100-80GB"}}})},
                 {"labels", {{"gpupool.io/runtime-runc", "true"}, {"gpupool.io/runtime-runsc", "true"},
                             {"gpupool.io/runtime-kata", "true"}, {"gpupool.io/network-pod", "true"}}}};
    ASSERT_TRUE(service_->RegisterNode(body).ok());
    for (const char* q : {"ops", "hpc", "secure"}) ASSERT_TRUE(service_->CreateQueue({{"name", q}}).ok());
  }
  void TearDown() override {
    service_.reset();
    std::filesystem::remove_all(dir_);
  }
  void Open() {
    service_.reset();
    auto s = testing_util::OpenServiceIn(dir_, config_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    service_ = std::move(s).value();
  }
  Result<json> Submit(const Principal& who, const std::string& extra = "", const std::string& container = "") {
    return service_->SubmitJob(who,
                               "name: t\n" + extra + "tasks: [{name: w, resources: {cpu: 1}, command: [sleep, '1']" +
                                   container + "}]\n",
                               SpecFormat::kYaml);
  }
  // The runAs of the assignment of `job` on n1.
  json RunAs(const std::string& job) {
    auto a = service_->Assignments("n1");
    EXPECT_TRUE(a.ok()) << a.status().ToString();
    if (!a.ok()) return {};
    for (const auto& item : (*a)["assignments"])
      if (item["jobId"] == job) return item["runAs"];
    return {};
  }

  std::string dir_;
  ServerConfig config_;
  std::unique_ptr<PoolService> service_;
};

TEST_F(SandboxIdentityTest, ConfiguredDynamicRootAndNobodyIdentitiesAndTheyOutliveARestart) {
  auto v = Submit(kVision);
  auto n = Submit(kNlp);
  auto o = Submit(kAdmin, "queue: ops\n");
  ASSERT_TRUE(v.ok() && n.ok() && o.ok());
  service_->RunCycle();
  EXPECT_EQ(RunAs((*v)["id"]), json({{"uid", 20001}, {"gid", 20002}}));
  EXPECT_EQ(RunAs((*n)["id"]), json({{"uid", 300000}, {"gid", 300000}}));
  EXPECT_EQ(RunAs((*o)["id"]), json({{"root", true}}));
  // The second dynamic tenant gets the next uid; the range (2) is then full.
  auto a = Submit(kAudio);
  ASSERT_TRUE(a.ok());
  service_->RunCycle();
  EXPECT_EQ(RunAs((*a)["id"]), json({{"uid", 300001}, {"gid", 300001}}));
  // Kept in the store: the same after a restart, and a new tenant cannot take them.
  Open();
  EXPECT_EQ(RunAs((*n)["id"]), json({{"uid", 300000}, {"gid", 300000}}));
  EXPECT_EQ(RunAs((*a)["id"]), json({{"uid", 300001}, {"gid", 300001}}));
  auto late = Submit(kAdmin, "tenant: speech\n");
  ASSERT_TRUE(late.ok());
  service_->RunCycle();
  EXPECT_EQ(RunAs((*late)["id"]), json({{"uid", 65534}, {"gid", 65534}}));
  auto job = service_->GetJob(kAdmin, (*late)["id"]);
  ASSERT_TRUE(job.ok());
  auto events = service_->JobEvents(kAdmin, (*late)["id"], 0, 100);
  ASSERT_TRUE(events.ok()) << events.status().ToString();
  EXPECT_NE(events->dump().find("SandboxRangeFull"), std::string::npos) << events->dump();
  EXPECT_TRUE(service_->CheckInvariants().ok());
}

TEST_F(SandboxIdentityTest, TheHostsNetworkOnlyInTheQueuesTheAdminAllowsItFor) {
  const std::string host = ", container: {rootfs: /var/lib/gpupool/images/x, network: host}";
  auto refused = Submit(kVision, "", host);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(refused.status().message().find("sandbox.hostNetworkQueues"), std::string::npos) << refused.status().ToString();
  EXPECT_FALSE(Submit(kAdmin, "", host).ok()) << "admins too";
  auto ok = Submit(kVision, "queue: hpc\n", host);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  auto none = Submit(kVision, "", ", container: {rootfs: /var/lib/gpupool/images/x, network: none}");
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  // A pod's network needs no permission: out only, never to the host (docs/agent.md#pod-network).
  auto pod = Submit(kVision, "", ", container: {rootfs: /var/lib/gpupool/images/x, network: pod}");
  ASSERT_TRUE(pod.ok()) << pod.status().ToString();
  service_->RunCycle();
  auto a = service_->Assignments("n1");
  ASSERT_TRUE(a.ok());
  for (const auto& item : (*a)["assignments"])
    EXPECT_EQ(item["network"], item["jobId"] == (*ok)["id"] ? "host" : item["jobId"] == (*pod)["id"] ? "pod" : "none")
        << item.dump();
  auto bridge = Submit(kVision, "queue: hpc\n", ", container: {rootfs: /x, network: bridge}");
  ASSERT_FALSE(bridge.ok());
  EXPECT_NE(bridge.status().message().find("must be none, pod or host"), std::string::npos) << bridge.status().ToString();
  EXPECT_FALSE(Submit(kVision, "", ", container: {network: none}").ok()) << "a container needs a rootfs or bundle";
}

TEST_F(SandboxIdentityTest, RuntimeClassesAreKeptToTheirQueuesAndAQueueMayForceOne) {
  const std::string rootfs = ", container: {rootfs: /var/lib/gpupool/images/x";
  auto cls = [&](const std::string& job) {
    auto a = service_->Assignments("n1");
    EXPECT_TRUE(a.ok());
    for (const auto& item : (*a)["assignments"])
      if (item["jobId"] == job) return item.value("runtimeClass", std::string("(none)"));
    return std::string("(not assigned)");
  };
  // kata only in hpc; runsc and crun anywhere; a queue forcing runsc takes containers only.
  auto kata = Submit(kVision, "", rootfs + ", runtimeClass: kata}");
  ASSERT_FALSE(kata.ok());
  EXPECT_EQ(kata.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(kata.status().message().find("sandbox.runtimeClassQueues.kata"), std::string::npos) << kata.status().ToString();
  auto kata_hpc = Submit(kVision, "queue: hpc\n", rootfs + ", runtimeClass: kata}");
  ASSERT_TRUE(kata_hpc.ok()) << kata_hpc.status().ToString();
  auto gvisor = Submit(kVision, "", rootfs + ", runtimeClass: runsc}");
  ASSERT_TRUE(gvisor.ok()) << gvisor.status().ToString();
  auto plain = Submit(kVision, "", rootfs + "}");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  auto process = Submit(kVision, "queue: secure\n");
  ASSERT_FALSE(process.ok());
  EXPECT_EQ(process.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(process.status().message().find("a process task cannot run there"), std::string::npos)
      << process.status().ToString();
  auto other = Submit(kAdmin, "queue: secure\n", rootfs + ", runtimeClass: crun}");
  ASSERT_FALSE(other.ok()) << "admins too";
  EXPECT_NE(other.status().message().find("sandbox.queueRuntimeClass"), std::string::npos) << other.status().ToString();
  auto forced = Submit(kVision, "queue: secure\n", rootfs + "}");
  ASSERT_TRUE(forced.ok()) << forced.status().ToString();
  // The forced class is written into the job's spec: the owner sees what it runs in.
  EXPECT_EQ((*forced)["spec"]["tasks"][0]["container"].value("runtimeClass", ""), "runsc") << forced->dump();
  service_->RunCycle();
  EXPECT_EQ(cls((*kata_hpc)["id"]), "kata");
  EXPECT_EQ(cls((*gvisor)["id"]), "runsc");
  EXPECT_EQ(cls((*plain)["id"]), "runc");
  EXPECT_EQ(cls((*forced)["id"]), "runsc");
}

TEST_F(SandboxIdentityTest, ContainersGoOnlyWhereTheAgentOffersTheirClassAndNetwork) {
  const std::string rootfs = ", container: {rootfs: /var/lib/gpupool/images/x";
  // n1 offers no crun: a crun job waits and says why; a runsc job with a pod network runs there.
  // (The pod job first: a job that cannot be placed holds the ones behind it in its queue.)
  auto pod = Submit(kVision, "", rootfs + ", runtimeClass: runsc, network: pod}");
  ASSERT_TRUE(pod.ok()) << pod.status().ToString();
  auto crun = Submit(kVision, "", rootfs + ", runtimeClass: crun}");
  ASSERT_TRUE(crun.ok()) << crun.status().ToString();
  service_->RunCycle();
  auto job = service_->GetJob(kAdmin, (*crun)["id"]);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ((*job)["state"], "pending");
  auto ev = service_->JobEvents(kAdmin, (*crun)["id"], 0, 100);
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ((*ev)["pending"]["nodes"]["n1"], "its agent does not offer runtime class crun (the job's containers need it)")
      << ev->dump();
  job = service_->GetJob(kAdmin, (*pod)["id"]);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ((*job)["state"], "running") << job->dump();
  // A node whose agent offers crun (and no pod network) takes the crun job; a pod job needing crun
  // finds no node offering both.
  json n2 = {{"name", "n2"}, {"cpu", "64"}, {"memory", "512Gi"},
             {"gpus", json::array({{{"index", 0}, {"model", "A100-80GB"}}})},
             {"labels", {{"gpupool.io/runtime-crun", "true"}, {"gpupool.io/network-pod", "false"}}}};
  ASSERT_TRUE(service_->RegisterNode(n2).ok());
  auto both = Submit(kVision, "", rootfs + ", runtimeClass: crun, network: pod}");
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  service_->RunCycle();
  job = service_->GetJob(kAdmin, (*crun)["id"]);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ((*job)["state"], "running") << job->dump();
  EXPECT_EQ((*job)["tasks"][0]["node"], "n2");
  ev = service_->JobEvents(kAdmin, (*both)["id"], 0, 100);
  ASSERT_TRUE(ev.ok());
  for (const char* node : {"n1", "n2"})
    EXPECT_EQ((*ev)["pending"]["nodes"][node],
              "its agent does not offer runtime class crun and a pod network (the job's containers need it)")
        << node << " " << ev->dump();
  // Process tasks and plain runc containers need nothing of the agent's.
  Job plain;
  plain.groups.resize(2);
  plain.groups[1].exec.rootfs = "/x";
  EXPECT_TRUE(ContainerNeeds(plain).empty());
  plain.groups[0].exec.network = "pod";  // a process task's network is the agent's to refuse
  plain.groups[1].exec.runtime_class = "runsc";
  EXPECT_EQ(ContainerNeeds(plain), (std::vector<std::pair<std::string, std::string>>{
                                       {"gpupool.io/runtime-runsc", "runtime class runsc"}}));
}

TEST(SandboxConfig, IdentitiesAndTheRangeAreChecked) {
  char tmpl[] = "/tmp/gpupool-sbcfg-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  auto load = [&](const std::string& text) {
    std::ofstream(dir + "/c.yaml") << text;
    return LoadServerConfig(dir + "/c.yaml");
  };
  auto good = load("tenants: {vision: {uid: 20001}, nlp: {uid: 20002, gid: 3000}}\n"
                   "sandbox: {uidBase: 100000, uidCount: 50, rootQueues: [ops], hostNetworkQueues: [hpc],\n"
                   "          runtimeClassQueues: {kata: [hpc], runsc: ['*']}, queueRuntimeClass: {secure: runsc}}\n");
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_EQ(good->sandbox.identities.at("vision"), (ServerConfig::Identity{20001, 20001}));
  EXPECT_EQ(good->sandbox.identities.at("nlp"), (ServerConfig::Identity{20002, 3000}));
  EXPECT_EQ(good->sandbox.uid_base, 100000);
  EXPECT_EQ(good->sandbox.root_queues, std::vector<std::string>{"ops"});
  EXPECT_EQ(good->sandbox.runtime_class_queues.at("kata"), std::vector<std::string>{"hpc"});
  EXPECT_EQ(good->sandbox.runtime_class_queues.at("runsc"), std::vector<std::string>{"*"});
  EXPECT_EQ(good->sandbox.queue_runtime_class.at("secure"), "runsc");
  const std::pair<const char*, const char*> bad[] = {
      {"tenants: {vision: {uid: 0}}\n", "tenants.vision.uid"},
      {"tenants: {vision: {uid: 999}}\n", "tenants.vision.uid"},
      {"tenants: {vision: {uid: 65534}}\n", "nobody"},
      {"tenants: {vision: {gid: 2000}}\n", "needs a uid"},
      {"tenants: {vision: {uid: 20001}, nlp: {uid: 20001}}\n", "is tenant"},
      {"sandbox: {uidBase: 60000, uidCount: 10000}\n", "65534"},
      {"sandbox: {uidBase: 4000000001}\n", "sandbox.uidBase"},
      {"sandbox: {rootQueues: ops}\n", "sandbox.rootQueues"},
      {"sandbox: {rootQueues: ['Bad Name']}\n", "sandbox.rootQueues[0]"},
      {"sandbox: {uidbase: 1}\n", "uidbase"},
      {"sandbox: {runtimeClassQueues: {docker: [a]}}\n", "sandbox.runtimeClassQueues.docker"},
      {"sandbox: {runtimeClassQueues: {runc: [a]}}\n", "runc is every queue's"},
      {"sandbox: {runtimeClassQueues: {kata: hpc}}\n", "must be a list"},
      {"sandbox: {runtimeClassQueues: {kata: ['Bad Name']}}\n", "sandbox.runtimeClassQueues.kata[0]"},
      {"sandbox: {queueRuntimeClass: {secure: docker}}\n", "sandbox.queueRuntimeClass.secure"},
      {"sandbox: {queueRuntimeClass: [secure]}\n", "must map queue names"},
  };
  for (const auto& [text, needle] : bad) {
    auto c = load(text);
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_NE(c.status().message().find(needle), std::string::npos) << text << " -> " << c.status().ToString();
  }
  std::filesystem::remove_all(dir);
}

// The Kubernetes scheduler's namespace -> tenant map: one owner per namespace, names checked.
TEST(SandboxConfig, TenantNamespacesHaveOneOwnerEach) {
  char tmpl[] = "/tmp/gpupool-nscfg-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  auto load = [&](const std::string& text) {
    std::ofstream(dir + "/c.yaml") << text;
    return LoadServerConfig(dir + "/c.yaml");
  };
  auto good = load("tenants: {vision: {namespaces: [vision-train, vision-serve]}, nlp: {namespaces: [nlp]}}\n");
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_EQ(good->namespace_tenants, (std::map<std::string, std::string>{
                                         {"vision-train", "vision"}, {"vision-serve", "vision"}, {"nlp", "nlp"}}));
  const std::pair<const char*, const char*> bad[] = {
      {"tenants: {vision: {namespaces: [a]}, nlp: {namespaces: [a]}}\n", "namespace 'a' belongs to tenant"},
      {"tenants: {vision: {namespaces: a}}\n", "tenants.vision.namespaces: must be a list"},
      {"tenants: {vision: {namespaces: ['Bad Name']}}\n", "tenants.vision.namespaces[0]"},
      {"tenants: {vision: {namespaces: [1]}}\n", "tenants.vision.namespaces[0]"},
  };
  for (const auto& [text, needle] : bad) {
    auto c = load(text);
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_NE(c.status().message().find(needle), std::string::npos) << text << " -> " << c.status().ToString();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gpupool

namespace gpupool {
namespace {

TEST(Rendezvous, ATwoTaskGangOnTwoNodesGetsOneConsistentRendezvous) {
  char tmpl[] = "/tmp/gpupool-rdv-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  ServerConfig config;
  config.data_dir = dir;
  config.profile = "bestfit";
  config.sync_full = false;
  auto service = testing_util::OpenServiceIn(dir, config);
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  PoolService& s = **service;
  for (const char* name : {"n1", "n2"}) {
    json body = {{"name", name}, {"cpu", "64"}, {"memory", "512Gi"},
                 {"gpus", json::array({{{"index", 0}, {"model", "A100-80GB"}}})}};
    if (std::string(name) == "n2") body["labels"] = {{"gpupool.io/address", "10.0.0.2"}};
    ASSERT_TRUE(s.RegisterNode(body).ok());
  }
  auto job = s.SubmitJob(Principal{"", Role::kAdmin},
                         "name: ddp\ntasks: [{name: w, replicas: 2, resources: {cpu: 1, gpu: 1}, command: [torchrun]}]\n",
                         SpecFormat::kYaml);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  auto one = s.SubmitJob(Principal{"", Role::kAdmin}, "name: one\ntasks: [{name: w, resources: {cpu: 1}}]\n",
                         SpecFormat::kYaml);
  ASSERT_TRUE(one.ok());
  s.RunCycle();
  std::map<int, json> by_rank;
  std::set<std::string> nodes;
  for (const char* node : {"n1", "n2"}) {
    auto a = s.Assignments(node);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    for (const auto& item : (*a)["assignments"]) {
      if (item["jobId"] == (*one)["id"]) {
        EXPECT_FALSE(item.contains("rendezvous")) << "a job of one task has none";
        continue;
      }
      by_rank[item["index"].get<int>()] = item["rendezvous"];
      nodes.insert(node);
    }
  }
  ASSERT_EQ(by_rank.size(), 2u);
  EXPECT_EQ(nodes.size(), 2u) << "one GPU per node: the gang spans both";
  const json& r0 = by_rank[0];
  const json& r1 = by_rank[1];
  for (const char* same : {"masterAddr", "masterPort", "worldSize", "nodes", "hosts"}) EXPECT_EQ(r0[same], r1[same]) << same;
  EXPECT_EQ(r0["worldSize"], 2);
  EXPECT_EQ(r0["nodes"], 2);
  EXPECT_EQ(r0["rank"], 0);
  EXPECT_EQ(r1["rank"], 1);
  EXPECT_EQ(r0["nodeRank"], 0);
  EXPECT_EQ(r1["nodeRank"], 1);
  EXPECT_EQ(r0["localRank"], 0);
  EXPECT_EQ(r1["localRank"], 0);
  EXPECT_EQ(r0["masterPort"], 20000 + 1);  // the job's seq is 1
  // Rank 0's node is the master; a node's address label wins over its name.
  const std::string n0 = r0["hosts"][0].get<std::string>();
  EXPECT_EQ(r0["masterAddr"].get<std::string>() + ":1", n0);
  EXPECT_TRUE((n0 == "n1:1" && r0["hosts"][1] == "10.0.0.2:1") || (n0 == "10.0.0.2:1" && r0["hosts"][1] == "n1:1"))
      << r0.dump();
  service->reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gpupool
