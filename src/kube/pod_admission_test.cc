#include "kube/pod_admission.h"

#include <gtest/gtest.h>

#include "kube/kube_node.h"

namespace gpupool::kube {
namespace {

using Json = nlohmann::json;

Json Assignment(const std::string& uid, const std::string& node, const std::vector<Json>& gpus) {
  Json list = Json::array();
  for (const Json& g : gpus) list.push_back(g);
  return Json{{"podUID", uid}, {"node", node}, {"cpu", "1"}, {"memory", "2Gi"}, {"gpus", list}, {"shareTask", false}};
}

Json Gpu(int index, const std::string& uuid, int share = 1000, const std::string& memory = "0") {
  return Json{{"index", index}, {"uuid", uuid}, {"share", share}, {"memory", memory}};
}

// A pod bound to `node` with containers asking for `counts` of gpupool.io/gpu each.
Json Pod(const std::string& name, const std::string& created, const std::vector<int>& counts,
         const Json& assignment, const Json& annotations = Json::object()) {
  Json containers = Json::array();
  for (size_t i = 0; i < counts.size(); ++i)
    containers.push_back({{"name", "c" + std::to_string(i)},
                          {"resources", {{"limits", {{"gpupool.io/gpu", std::to_string(counts[i])}}}}}});
  Json meta = {{"name", name}, {"namespace", "ml"}, {"uid", "uid-" + name}, {"creationTimestamp", created},
               {"annotations", annotations}};
  if (!assignment.is_null()) meta["annotations"][kAssignmentKey] = assignment.dump();
  return {{"metadata", meta},
          {"spec", {{"schedulerName", "gpupool"}, {"nodeName", "n1"}, {"containers", containers}}},
          {"status", {{"phase", "Pending"}}}};
}

Inventory Sim(int gpus = 4) {
  auto inv = SimulatedInventory(std::to_string(gpus) + "xA100-80GB", "n1");
  EXPECT_TRUE(inv.ok()) << inv.status().ToString();
  return *inv;
}

AdmissionQuery Query(size_t count) {
  AdmissionQuery q;
  q.node = "n1";
  q.resource = "gpupool.io/gpu";
  q.count = count;
  return q;
}

TEST(SlotIds, RoundTripAndRejects) {
  EXPECT_EQ(SlotId("GPU-abc", 7), "GPU-abc::7");
  EXPECT_EQ(SlotGpu("GPU-abc::7"), "GPU-abc");
  EXPECT_EQ(SlotGpu("GPU-a::b::12"), "GPU-a::b");
  for (const char* bad : {"GPU-abc", "GPU-abc::", "::3", "GPU-abc::x", "GPU-abc::-1", ""}) EXPECT_EQ(SlotGpu(bad), "") << bad;
}

TEST(NodeAssignment, ReadsGpusAndRefusesAnotherPodsOrNodes) {
  const Inventory inv = Sim();
  const Json a = Assignment("u1", "n1", {Gpu(1, inv.gpus[1].uuid, 250, "10Gi")});
  auto gpus = ParseNodeAssignment(a.dump(), "u1", "n1");
  ASSERT_TRUE(gpus.ok()) << gpus.status().ToString();
  ASSERT_EQ(gpus->size(), 1u);
  EXPECT_EQ((*gpus)[0].index, 1);
  EXPECT_EQ((*gpus)[0].share_milli, 250);
  EXPECT_EQ((*gpus)[0].memory_bytes, int64_t{10} << 30);

  auto copied = ParseNodeAssignment(a.dump(), "u2", "n1");
  ASSERT_FALSE(copied.ok());
  EXPECT_NE(copied.status().message().find("pod UID 'u1'"), std::string::npos) << copied.status().message();
  EXPECT_FALSE(ParseNodeAssignment(a.dump(), "u1", "n2").ok());
  EXPECT_FALSE(ParseNodeAssignment("{", "u1", "n1").ok());
  EXPECT_FALSE(ParseNodeAssignment(std::string(70000, ' '), "u1", "n1").ok());
  EXPECT_FALSE(ParseNodeAssignment(std::string(100, '[') + std::string(100, ']'), "u1", "n1").ok());
  Json bad_share = Assignment("u1", "n1", {Gpu(0, "x", 1001)});
  EXPECT_FALSE(ParseNodeAssignment(bad_share.dump(), "u1", "n1").ok());
  Json bad_index = Assignment("u1", "n1", {Gpu(-1, "x")});
  EXPECT_FALSE(ParseNodeAssignment(bad_index.dump(), "u1", "n1").ok());
  std::vector<Json> many;
  for (int i = 0; i < 65; ++i) many.push_back(Gpu(0, "x"));
  EXPECT_FALSE(ParseNodeAssignment(Assignment("u1", "n1", many).dump(), "u1", "n1").ok());
}

TEST(FindAdmitted, KubeletsListDecidesWhichPod) {
  const Inventory inv = Sim();
  std::vector<Json> pods = {
      Pod("a", "2026-01-01T00:00:00Z", {1}, Assignment("uid-a", "n1", {Gpu(0, inv.gpus[0].uuid)})),
      Pod("b", "2026-01-01T00:00:05Z", {1}, Assignment("uid-b", "n1", {Gpu(2, inv.gpus[2].uuid)})),
  };
  // kubelet holds only b: b is the pod it is admitting, although a is older.
  AdmissionQuery q = Query(1);
  q.kubelet = std::vector<KubeletPod>{{"ml", "b", {}}};
  auto c = FindAdmittedContainer(pods, q);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->uid, "uid-b");
  EXPECT_EQ(c->container, "c0");
  ASSERT_EQ(c->assignment.gpus.size(), 1u);
  EXPECT_EQ(c->assignment.gpus[0].index, 2);

  // Without kubelet's list: the oldest waiting pod (kubelet's admission order).
  q.kubelet.reset();
  c = FindAdmittedContainer(pods, q);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->uid, "uid-a");
  // Once answered, the next one.
  q.answered.insert("uid-a/c0");
  c = FindAdmittedContainer(pods, q);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->uid, "uid-b");
  // kubelet lists a with its devices: a is not waiting any more.
  q.answered.clear();
  q.kubelet = std::vector<KubeletPod>{{"ml", "a", {{"c0", {{"gpupool.io/gpu", {"x::0"}}}}}}, {"ml", "b", {}}};
  c = FindAdmittedContainer(pods, q);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->uid, "uid-b");
}

TEST(FindAdmitted, ContainersTakeTheirOwnGpusInOrder) {
  const Inventory inv = Sim();
  std::vector<Json> pods = {Pod("p", "2026-01-01T00:00:00Z", {1, 2},
                                Assignment("uid-p", "n1",
                                           {Gpu(0, inv.gpus[0].uuid), Gpu(1, inv.gpus[1].uuid),
                                            Gpu(3, inv.gpus[3].uuid)}))};
  AdmissionQuery q = Query(1);
  auto c = FindAdmittedContainer(pods, q);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->container, "c0");
  ASSERT_EQ(c->assignment.gpus.size(), 1u);
  EXPECT_EQ(c->assignment.gpus[0].index, 0);
  // The second container asks for 2: a request for 1 now finds nothing, naming why.
  q.answered.insert("uid-p/c0");
  auto none = FindAdmittedContainer(pods, q);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("container c1 asks for 2"), std::string::npos) << none.status().message();
  q.count = 2;
  c = FindAdmittedContainer(pods, q);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->container, "c1");
  ASSERT_EQ(c->assignment.gpus.size(), 2u);
  EXPECT_EQ(c->assignment.gpus[0].index, 1);
  EXPECT_EQ(c->assignment.gpus[1].index, 3);
}

TEST(FindAdmitted, HostilePodsAreNotAnswered) {
  const Inventory inv = Sim();
  // A tenant copies another pod's assignment onto its own pod: refused (made out to another UID).
  Json copied = Pod("thief", "2026-01-01T00:00:00Z", {1}, Assignment("uid-victim", "n1", {Gpu(0, inv.gpus[0].uuid)}));
  // A pod without an assignment (another scheduler's, asking for gpupool.io/gpu), a running pod,
  // a pod being deleted, a pod on another node, a pod with a malformed count.
  Json foreign = Pod("foreign", "2026-01-01T00:00:00Z", {1}, Json());
  Json running = Pod("running", "2026-01-01T00:00:00Z", {1}, Assignment("uid-running", "n1", {Gpu(1, inv.gpus[1].uuid)}));
  running["status"]["phase"] = "Running";
  Json deleting = Pod("deleting", "2026-01-01T00:00:00Z", {1}, Assignment("uid-deleting", "n1", {Gpu(1, inv.gpus[1].uuid)}));
  deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z";
  Json elsewhere = Pod("elsewhere", "2026-01-01T00:00:00Z", {1}, Assignment("uid-elsewhere", "n1", {Gpu(1, inv.gpus[1].uuid)}));
  elsewhere["spec"]["nodeName"] = "n2";
  Json weird = Pod("weird", "2026-01-01T00:00:00Z", {1}, Assignment("uid-weird", "n1", {Gpu(1, inv.gpus[1].uuid)}));
  weird["spec"]["containers"][0]["resources"]["limits"]["gpupool.io/gpu"] = "1e3";
  auto r = FindAdmittedContainer({copied, foreign, running, deleting, elsewhere, weird}, Query(1));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("ml/thief: the assignment is for pod UID 'uid-victim'"), std::string::npos) << m;
  EXPECT_NE(m.find("ml/foreign: no gpupool.io/assignment annotation"), std::string::npos) << m;
  EXPECT_NE(m.find("ml/weird: spec.containers[0].resources gpupool.io/gpu: not a device count"), std::string::npos) << m;
  EXPECT_EQ(m.find("running"), std::string::npos) << m;
}

TEST(Grant, SimulatedGpusGiveTheAgentsEnvironment) {
  const Inventory inv = Sim();
  std::vector<Json> pods = {Pod("p", "t", {2},
                                Assignment("uid-p", "n1", {Gpu(1, inv.gpus[1].uuid), Gpu(2, inv.gpus[2].uuid)}))};
  auto c = FindAdmittedContainer(pods, Query(2));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  GrantOptions o;
  o.node = "n1";
  auto g = GrantFor(*c, inv, o);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->env.at("CUDA_VISIBLE_DEVICES"), inv.gpus[1].uuid + "," + inv.gpus[2].uuid);
  EXPECT_EQ(g->env.at("NVIDIA_VISIBLE_DEVICES"), g->env.at("CUDA_VISIBLE_DEVICES"));
  EXPECT_EQ(g->env.at("GPUPOOL_POD_UID"), "uid-p");
  EXPECT_EQ(g->env.count("NCCL_P2P_LEVEL"), 1u);
  EXPECT_EQ(g->env.count("PATH"), 0u);
  EXPECT_EQ(g->env.count("GPUPOOL_JOB_ID"), 0u);
  EXPECT_TRUE(g->devices.empty());  // simulated: no device nodes
}

TEST(Grant, MpsFractionGetsLimitsAndThePipe) {
  const Inventory inv = Sim();
  Json ann = {{"gpupool.io/gpu-milli", "250"}, {"gpupool.io/gpu-memory", "20Gi"}, {"gpupool.io/isolation", "mps"}};
  std::vector<Json> pods = {
      Pod("p", "t", {1}, Assignment("uid-p", "n1", {Gpu(3, inv.gpus[3].uuid, 250, "20Gi")}), ann)};
  auto c = FindAdmittedContainer(pods, Query(1));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->assignment.isolation, "mps");
  GrantOptions o;
  o.node = "n1";
  o.mps_pipe_root = "/run/gpupool/mps";
  auto g = GrantFor(*c, inv, o);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->env.at("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "25");
  EXPECT_EQ(g->env.at("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "0=20480M");
  EXPECT_EQ(g->env.at("GPUPOOL_GPU_MEMORY_FRACTION"), "0.25");
  const std::string pipe = "/run/gpupool/mps/" + inv.gpus[3].uuid + "/pipe";
  EXPECT_EQ(g->env.at("CUDA_MPS_PIPE_DIRECTORY"), pipe);
  ASSERT_EQ(g->mounts.size(), 1u);
  EXPECT_EQ(g->mounts[0].host_path, pipe);
}

TEST(Grant, RealGpusGetDeviceNodesOrCdiNames) {
  Inventory inv = Sim(2);
  inv.simulated = false;
  inv.gpus[0].minor_number = 4;
  inv.gpus[1].minor_number = 7;
  std::vector<Json> pods = {Pod("p", "t", {1}, Assignment("uid-p", "n1", {Gpu(1, inv.gpus[1].uuid)}))};
  auto c = FindAdmittedContainer(pods, Query(1));
  ASSERT_TRUE(c.ok());
  GrantOptions o;
  o.node = "n1";
  o.control_devices = {"/dev/nvidiactl", "/dev/nvidia-uvm"};
  auto g = GrantFor(*c, inv, o);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const std::vector<ContainerGrant::Device> want = {
      {"/dev/nvidiactl", "rw"}, {"/dev/nvidia-uvm", "rw"}, {"/dev/nvidia7", "rw"}};
  EXPECT_EQ(g->devices, want);
  EXPECT_TRUE(g->cdi_devices.empty());
  o.cdi_kind = "nvidia.com/gpu";
  g = GrantFor(*c, inv, o);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(g->devices.empty());
  EXPECT_EQ(g->cdi_devices, std::vector<std::string>{"nvidia.com/gpu=" + inv.gpus[1].uuid});
  // An assignment naming a GPU this node does not have is refused.
  std::vector<Json> wrong = {Pod("w", "t", {1}, Assignment("uid-w", "n1", {Gpu(1, "GPU-elsewhere")}))};
  auto cw = FindAdmittedContainer(wrong, Query(1));
  ASSERT_TRUE(cw.ok());
  auto gw = GrantFor(*cw, inv, o);
  ASSERT_FALSE(gw.ok());
  EXPECT_NE(gw.status().message().find("GPU-elsewhere"), std::string::npos) << gw.status().message();
}

// A tenant that writes an assignment itself (no admission policy installed) gets nothing that a
// pod already on the node holds, and nothing the GPU does not have.
TEST(NodeCapacity, AForgedAssignmentCannotOvercommitAGpu) {
  const Inventory inv = Sim();
  const std::string g0 = inv.gpus[0].uuid, g1 = inv.gpus[1].uuid;
  Json running = Pod("a", "t1", {1}, Assignment("uid-a", "n1", {Gpu(0, g0, 600, "40Gi")}));
  running["status"]["phase"] = "Running";
  Json whole = Pod("w", "t1", {1}, Assignment("uid-w", "n1", {Gpu(2, inv.gpus[2].uuid, 1000, "80Gi")}));
  whole["status"]["phase"] = "Running";
  auto check = [&](const Json& pod, std::vector<Json> others) {
    others.push_back(pod);
    auto c = FindAdmittedContainer(others, Query(1));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? CheckNodeCapacity(others, *c, inv, "n1") : c.status();
  };
  // What fits beside them is let through.
  EXPECT_TRUE(check(Pod("b", "t2", {1}, Assignment("uid-b", "n1", {Gpu(0, g0, 400, "40Gi")})), {running, whole}).ok());
  EXPECT_TRUE(check(Pod("b", "t2", {1}, Assignment("uid-b", "n1", {Gpu(1, g1, 1000, "80Gi")})), {running, whole}).ok());
  // Shares over 1000 milli, memory over the GPU's, a whole GPU another pod has.
  Status over = check(Pod("b", "t2", {1}, Assignment("uid-b", "n1", {Gpu(0, g0, 500, "10Gi")})), {running, whole});
  EXPECT_EQ(over.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(over.message().find("1100 milli-GPU of 1000"), std::string::npos) << over.message();
  EXPECT_NE(over.message().find("pod ml/a holds part of it"), std::string::npos) << over.message();
  Status memory = check(Pod("b", "t2", {1}, Assignment("uid-b", "n1", {Gpu(0, g0, 100, "50Gi")})), {running, whole});
  EXPECT_NE(memory.message().find("memory grants would add up to 92160 MiB"), std::string::npos) << memory.message();
  EXPECT_FALSE(check(Pod("b", "t2", {1}, Assignment("uid-b", "n1", {Gpu(2, inv.gpus[2].uuid, 1000)})), {running, whole}).ok());
  // One pod claiming the same GPU twice, a GPU under another UUID, an index the node lacks.
  EXPECT_FALSE(check(Pod("b", "t2", {1}, Assignment("uid-b", "n1", {Gpu(1, g1, 1000), Gpu(1, g1, 1000)})), {}).ok());
  Status uuid = check(Pod("b", "t2", {1}, Assignment("uid-b", "n1", {Gpu(1, g0, 1000)})), {});
  EXPECT_NE(uuid.message().find("node n1 has " + g1), std::string::npos) << uuid.message();
  EXPECT_FALSE(check(Pod("b", "t2", {1}, Assignment("uid-b", "n1", {Gpu(9, "GPU-x", 1000)})), {}).ok());
  // Pods that ended hold nothing; nor do pods of other nodes, or the pod itself seen twice.
  Json ended = running;
  ended["status"]["phase"] = "Succeeded";
  Json elsewhere = running;
  elsewhere["spec"]["nodeName"] = "n2";
  EXPECT_TRUE(check(Pod("b", "t2", {1}, Assignment("uid-b", "n1", {Gpu(0, g0, 1000, "80Gi")})), {ended, elsewhere}).ok());
  // A terminating pod still holds its GPU until it is gone.
  Json leaving = running;
  leaving["metadata"]["deletionTimestamp"] = "2026-12-06T00:00:00Z";
  EXPECT_FALSE(check(Pod("b", "t2", {1}, Assignment("uid-b", "n1", {Gpu(0, g0, 1000, "80Gi")})), {leaving}).ok());
}

TEST(NodeCapacity, AMigInstanceGoesToOnePodAndSharesStayOffMigGpus) {
  auto mig = SimulatedInventory("{gpuModel: A100-80GB, gpus: 2, migGpus: [0]}", "n1");
  ASSERT_TRUE(mig.ok()) << mig.status().ToString();
  const Inventory& inv = *mig;
  auto instance = [&](int start) {
    Json g = Gpu(0, inv.gpus[0].uuid, 0);
    g["mig"] = {{"profile", "3g.40gb"}, {"profileId", 9}, {"start", start}};
    return g;
  };
  Json holder = Pod("a", "t1", {1}, Assignment("uid-a", "n1", {instance(0)}));
  holder["status"]["phase"] = "Running";
  auto check = [&](const Json& pod) {
    std::vector<Json> pods = {holder, pod};
    auto c = FindAdmittedContainer(pods, Query(1));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? CheckNodeCapacity(pods, *c, inv, "n1") : c.status();
  };
  EXPECT_TRUE(check(Pod("b", "t2", {1}, Assignment("uid-b", "n1", {instance(4)}))).ok());
  Status taken = check(Pod("b", "t2", {1}, Assignment("uid-b", "n1", {instance(0)})));
  EXPECT_NE(taken.message().find("is pod ml/a's"), std::string::npos) << taken.message();
  Status share = check(Pod("b", "t2", {1}, Assignment("uid-b", "n1", {Gpu(0, inv.gpus[0].uuid, 500)})));
  EXPECT_NE(share.message().find("in MIG mode"), std::string::npos) << share.message();
  Json wrong = instance(0);
  wrong["index"] = 1;
  wrong["uuid"] = inv.gpus[1].uuid;
  EXPECT_FALSE(check(Pod("b", "t2", {1}, Assignment("uid-b", "n1", {wrong}))).ok());
}

TEST(MpsUsers, PodsOfMpsIsolationThatKubeletAdmittedOrThatRunAndHaveNotEnded) {
  const Inventory inv = Sim();
  const Json mps = {{"gpupool.io/isolation", "mps"}, {"gpupool.io/gpu-milli", "250"}};
  auto pod = [&](const std::string& name, int gpu, const std::string& phase, const Json& annotations) {
    Json p = Pod(name, "t", {1}, Assignment("uid-" + name, "n1", {Gpu(gpu, inv.gpus[gpu].uuid, 250, "10Gi")}),
                 annotations);
    p["status"]["phase"] = phase;
    return p;
  };
  Json elsewhere = pod("elsewhere", 1, "Running", mps);
  elsewhere["spec"]["nodeName"] = "n2";
  Json copied = pod("copied", 1, "Running", mps);
  copied["metadata"]["uid"] = "uid-someone-else";
  const std::vector<Json> pods = {
      pod("running", 0, "Running", mps),    pod("admitted", 0, "Pending", mps), pod("waiting", 1, "Pending", mps),
      pod("ended", 1, "Succeeded", mps),    pod("failed", 1, "Failed", mps),    pod("sliced", 2, "Running", {}),
      elsewhere,                            copied,
  };
  const auto users = MpsUsers(pods, "n1", inv, {"uid-admitted", "uid-ended"});
  const std::map<std::string, std::set<std::string>> want = {{inv.gpus[0].uuid, {"uid-running", "uid-admitted"}}};
  EXPECT_EQ(users, want);
}

TEST(PreferredSlots, AssignedGpusFirstThenAny) {
  const std::vector<std::string> available = {"A::0", "A::1", "B::0", "B::1", "C::0"};
  EXPECT_EQ(PreferredSlots(available, {}, 2, {"B"}), (std::vector<std::string>{"B::0", "B::1"}));
  EXPECT_EQ(PreferredSlots(available, {}, 2, {"C", "A"}), (std::vector<std::string>{"C::0", "A::0"}));
  EXPECT_EQ(PreferredSlots(available, {"A::1"}, 2, {"B"}), (std::vector<std::string>{"A::1", "B::0"}));
  EXPECT_EQ(PreferredSlots(available, {}, 3, {"C"}), (std::vector<std::string>{"C::0", "A::0", "A::1"}));
  EXPECT_EQ(PreferredSlots(available, {}, 9, {}).size(), 5u);
}

}  // namespace
}  // namespace gpupool::kube
