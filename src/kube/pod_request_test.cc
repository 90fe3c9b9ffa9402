// What a pod asks of gpupool: the resource names and annotations of docs/kubernetes.md, and what a
// hostile or careless pod gets (an error naming the pod and the field, never a crash or a guess).
#include "kube/pod_request.h"

#include <gtest/gtest.h>

#include <string>

namespace gpupool::kube {
namespace {

using nlohmann::json;

json PodWith(const json& limits, const json& annotations = json::object(), const json& labels = json::object()) {
  json meta = {{"name", "p"}, {"namespace", "team-a"}, {"uid", "u-1"}, {"annotations", annotations}, {"labels", labels}};
  json resources = {{"limits", limits}, {"requests", {{"cpu", "500m"}, {"memory", "2Gi"}}}};
  json container = {{"name", "main"}, {"resources", resources}};
  json spec = {{"schedulerName", "gpupool"}, {"containers", json::array({container})}};
  return {{"metadata", meta}, {"spec", spec}};
}

TEST(PodRequest, WholeGpusFromEitherResourceName) {
  for (const char* name : {"gpupool.io/gpu", "nvidia.com/gpu"}) {
    auto r = ParsePodRequest(PodWith({{name, "2"}}));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->request.gpu_count, 2) << name;
    EXPECT_EQ(r->request.gpu_share, kWholeGpu);
    EXPECT_EQ(r->request.cpu, MilliCpu(500));
    EXPECT_EQ(r->request.memory, MiB(2048));
    EXPECT_EQ(r->isolation, IsolationMode::kExclusive);
    EXPECT_EQ(r->tenant, "team-a");  // the namespace, when no tenant is named
    EXPECT_EQ(r->queue, "default");
    EXPECT_EQ(r->uid, "u-1");
    EXPECT_EQ(r->scheduler_name, "gpupool");
  }
  // Integers as JSON numbers are what some clients write.
  auto n = ParsePodRequest(PodWith({{"nvidia.com/gpu", 4}}));
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(n->request.gpu_count, 4);
}

TEST(PodRequest, AFractionWithMemoryAsResourcesOrAnnotations) {
  auto res = ParsePodRequest(PodWith({{"gpupool.io/gpu-milli", "250"}, {"gpupool.io/gpu-memory", "10Gi"}}));
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->request.gpu_count, 1);
  EXPECT_EQ(res->request.gpu_share, MilliGpu(250));
  EXPECT_EQ(res->request.gpu_memory, MiB(10240));
  EXPECT_EQ(res->isolation, IsolationMode::kTimeslice);  // burstable share
  auto ann = ParsePodRequest(PodWith(json::object(), {{"gpupool.io/gpu-milli", "500"}, {"gpupool.io/qos", "guaranteed"}}));
  ASSERT_TRUE(ann.ok()) << ann.status().ToString();
  EXPECT_EQ(ann->request.gpu_share, MilliGpu(500));
  EXPECT_EQ(ann->qos, QosClass::kGuaranteed);
  EXPECT_EQ(ann->isolation, IsolationMode::kMps);  // a guaranteed share: MPS, as in a job spec
}

TEST(PodRequest, MigModelsInterconnectQueueAndGang) {
  auto mig = ParsePodRequest(PodWith({{"nvidia.com/mig-3g.40gb", "1"}}));
  ASSERT_TRUE(mig.ok()) << mig.status().ToString();
  EXPECT_EQ(mig->request.mig_profile, "3g.40gb");
  EXPECT_EQ(mig->isolation, IsolationMode::kMig);
  // One gpupool.io/gpu device beside it: the slot the device plugin gives the instance through.
  auto slot = ParsePodRequest(PodWith({{"nvidia.com/mig-3g.40gb", "1"}, {"gpupool.io/gpu", "1"}}));
  ASSERT_TRUE(slot.ok()) << slot.status().ToString();
  EXPECT_EQ(slot->request.mig_profile, "3g.40gb");
  EXPECT_EQ(slot->request.gpu_count, 1);
  auto ann = ParsePodRequest(PodWith({{"gpupool.io/gpu", "4"}},
                                     {{"gpupool.io/gpu-models", "A100-80GB, H100-80GB"},
                                      {"gpupool.io/interconnect", "nvlink"},
                                      {"gpupool.io/priority", "-20"},
                                      {"gpupool.io/gang", "llama"},
                                      {"gpupool.io/gang-min", "4"}},
                                     {{"gpupool.io/queue", "research"}, {"gpupool.io/tenant", "vision"}}));
  ASSERT_TRUE(ann.ok()) << ann.status().ToString();
  EXPECT_EQ(ann->request.gpu_models, (std::vector<std::string>{"A100-80GB", "H100-80GB"}));
  EXPECT_TRUE(ann->request.nvlink);
  EXPECT_EQ(ann->priority, -20);
  EXPECT_EQ(ann->queue, "research");  // from a label
  EXPECT_EQ(ann->tenant, "vision");
  EXPECT_EQ(ann->gang, "llama");
  EXPECT_EQ(ann->gang_min, 4);
  // An annotation wins over a label of the same key.
  auto both = ParsePodRequest(PodWith(json::object(), {{"gpupool.io/queue", "a"}}, {{"gpupool.io/queue", "b"}}));
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(both->queue, "a");
}

TEST(PodRequest, InitContainersCountAsKubernetesCountsThem) {
  json pod = PodWith({{"gpupool.io/gpu", "1"}});
  pod["spec"]["containers"].push_back({{"name", "side"}, {"resources", {{"requests", {{"cpu", "250m"}}}}}});
  pod["spec"]["initContainers"] = {{{"name", "init"}, {"resources", {{"requests", {{"cpu", "2"}, {"memory", "1Gi"}}}}}}};
  auto r = ParsePodRequest(pod);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->request.cpu, MilliCpu(2000));   // the init container's 2 > 0.5 + 0.25
  EXPECT_EQ(r->request.memory, MiB(2048));     // the app's 2Gi > 1Gi
  EXPECT_EQ(r->request.gpu_count, 1);
}

TEST(PodRequest, AHostilePodGetsAnErrorNamingItsField) {
  struct Case {
    json pod;
    std::string needle;
  };
  std::vector<Case> cases = {
      {json::array(), "must be a JSON object"},
      {{{"metadata", {{"name", "p"}}}}, "needs a name and a uid"},
      {PodWith({{"gpupool.io/gpu", "-1"}}), "must be in [0, 64]"},
      {PodWith({{"gpupool.io/gpu", "65"}}), "must be in [0, 64]"},
      {PodWith({{"gpupool.io/gpu", "1.5"}}), "must be an integer"},
      {PodWith({{"gpupool.io/gpu", "99999999999999999999"}}), "must be an integer"},
      {PodWith({{"gpupool.io/gpu", json::array()}}), "must be a quantity"},
      {PodWith({{"gpupool.io/gpu", "2"}, {"nvidia.com/gpu", "3"}}), "disagree"},
      {PodWith({{"gpupool.io/gpu-milli", "1001"}}), "must be in [0, 1000]"},
      {PodWith({{"gpupool.io/gpu-memory", "lots"}}), "gpupool.io/gpu-memory"},
      {PodWith({{"nvidia.com/mig-3g.40gb", "2"}}), "must be in [0, 1]"},
      {PodWith({{"nvidia.com/mig-3g.40gb", "1"}, {"nvidia.com/mig-1g.10gb", "1"}}), "two MIG instances"},
      {PodWith({{"nvidia.com/mig-3g.40gb", "1"}, {"gpupool.io/gpu", "2"}}), "a MIG instance is the pod's whole"},
      {PodWith({{"nvidia.com/mig-3g.40gb", "1"}, {"nvidia.com/gpu", "1"}}), "a MIG instance is the pod's whole"},
      {PodWith({{"gpupool.io/gpu-milli", "250"}}, {{"gpupool.io/gpu-milli", "250"}}), "both as a resource"},
      {PodWith({{"gpupool.io/gpu-milli", "250"}}, {{"gpupool.io/isolation", "exclusive"}}), "'exclusive' needs whole"},
      {PodWith({{"gpupool.io/gpu", "1"}}, {{"gpupool.io/isolation", "magic"}}), "gpupool.io/isolation"},
      {PodWith({{"gpupool.io/gpu", "1"}}, {{"gpupool.io/qos", "platinum"}}), "gpupool.io/qos"},
      {PodWith({{"gpupool.io/gpu", "1"}}, {{"gpupool.io/priority", "1e9"}}), "must be an integer"},
      {PodWith({{"gpupool.io/gpu", "1"}}, {{"gpupool.io/priority", "2000000"}}), "must be in [-1000000, 1000000]"},
      {PodWith({{"gpupool.io/gpu", "1"}}, {{"gpupool.io/gang-min", "2"}}), "needs gpupool.io/gang"},
      {PodWith({{"gpupool.io/gpu", "1"}}, {{"gpupool.io/gang", "g"}, {"gpupool.io/gang-min", "0"}}), "must be in [1,"},
      {PodWith({{"gpupool.io/gpu", "1"}}, {{"gpupool.io/interconnect", "infiniband"}}), "must be nvlink or any"},
      {PodWith({{"gpupool.io/gpu", "1"}}, {{"gpupool.io/queue", std::string(5000, 'q')}}), "longer than 1024"},
      {PodWith({{"gpupool.io/gpu", "1"}}, {{"gpupool.io/queue", 7}}), "must be a string"},
      {PodWith({{"gpupool.io/gpu", "1"}}, {{"gpupool.io/interconnect", "nvlink"}}), "resources"},  // 1 GPU
  };
  json many = PodWith({{"gpupool.io/gpu", "1"}});
  for (int i = 0; i < 70; ++i) many["spec"]["containers"].push_back({{"name", "c" + std::to_string(i)}});
  cases.push_back({many, "more than 64 containers"});
  json init_gpu = PodWith(json::object());
  init_gpu["spec"]["initContainers"] = {{{"name", "i"}, {"resources", {{"limits", {{"gpupool.io/gpu", "1"}}}}}}};
  cases.push_back({init_gpu, "GPUs belong to the app containers"});
  json not_list = PodWith(json::object());
  not_list["spec"]["containers"] = "main";
  cases.push_back({not_list, "spec.containers: must be a list"});
  for (const auto& c : cases) {
    auto r = ParsePodRequest(c.pod);
    ASSERT_FALSE(r.ok()) << c.pod.dump().substr(0, 300);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos)
        << "want '" << c.needle << "' in: " << r.status().ToString();
  }
}

}  // namespace
}  // namespace gpupool::kube
