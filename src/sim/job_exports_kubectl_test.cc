#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "sim/job_exports.h"
#include "sim/test_files.h"

namespace gpupool {
namespace {

using testutil::TempFile;
using testutil::ReadAll;

TEST(KubectlExportTest, ParsesRfc3339) {
  const int64_t base = *ParseUtcTimestamp("2024-01-02 03:04:05") * 1000;
  EXPECT_EQ(*ParseRfc3339Millis("2024-01-02T03:04:05Z"), base);
  EXPECT_EQ(*ParseRfc3339Millis("2024-01-02T03:04:05.5Z"), base + 500);
  EXPECT_EQ(*ParseRfc3339Millis("2024-01-02T03:04:05.123456789Z"), base + 123);
  EXPECT_EQ(*ParseRfc3339Millis("2024-01-02T03:04:05+00:00"), base);
  EXPECT_EQ(*ParseRfc3339Millis("2024-01-02T08:34:05+05:30"), base);
  EXPECT_EQ(*ParseRfc3339Millis("2024-01-01T19:04:05.250-08:00"), base + 250);
  for (const char* bad :
       {"2024-01-02T03:04:05", "2024-01-02 03:04:05Z", "2024-01-02T03:04:05.Z",
        "2024-01-02T03:04:05.1234567890Z", "2024-01-02T03:04:05+5:30", "2024-01-02T03:04:05+24:00",
        "2024-01-02T03:04:60Z", "2024-01-02T03:04:05z", "2024-01-02T03:04:05ZZ", "Z", "",
        "2024-13-02T03:04:05Z", "2024-01-02T03:04:05+05:3x"}) {
    EXPECT_FALSE(ParseRfc3339Millis(bad).ok()) << bad;
  }
}

using nlohmann::json;

json GpuContainer(const std::string& gpus, const std::string& cpu = "1", const std::string& memory = "1Gi") {
  return {{"name", "c"},
          {"resources",
           {{"limits", {{"nvidia.com/gpu", gpus}}}, {"requests", {{"cpu", cpu}, {"memory", memory}}}}}};
}
json Terminated(const std::string& finished) {
  return {{"name", "c"}, {"state", {{"terminated", {{"exitCode", 0}, {"finishedAt", finished}}}}}};
}
json Pod(const std::string& ns, const std::string& name, const std::string& created, json containers,
         json status) {
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", ns}, {"creationTimestamp", created}}},
          {"spec", {{"containers", std::move(containers)}}},
          {"status", std::move(status)}};
}
json Succeeded(const std::string& start, const std::string& end) {
  return {{"phase", "Succeeded"}, {"startTime", start}, {"containerStatuses", {Terminated(end)}}};
}
std::string PodList(const std::vector<json>& pods, const char* kind = "List") {
  return json{{"apiVersion", "v1"}, {"kind", kind}, {"items", pods}}.dump();
}

// data/exports/kubectl-pods.json, written by make_kubectl_pods.py beside it with the Kubernetes
// Python client.
TEST(KubectlExportTest, ReadsThePodListTheKubernetesClientWrites) {
  auto read = ReadKubectlPods(testutil::ExportFile("kubectl-pods.json"));
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->skipped,
            (std::map<std::string, int64_t>{
                {kSkipNoFinish, 1}, {kSkipNeverStarted, 1}, {kSkipNoGpus, 1}, {kSkipStillRunning, 1}}));
  ASSERT_EQ(read->jobs.size(), 3u);
  const auto& j = read->jobs;
  EXPECT_EQ(j[0].name, "train/resnet-0");
  EXPECT_EQ(j[0].arrival, 0);
  EXPECT_EQ(j[0].duration, 3600);  // startTime to the container's finish
  EXPECT_EQ(j[0].job.queue, "train");
  EXPECT_EQ(j[0].job.tenant, "train");
  const TaskRequest& r0 = j[0].job.groups[0].request;
  EXPECT_EQ(r0.gpu_count, 2);
  EXPECT_EQ(r0.cpu.units(), 8000);
  EXPECT_EQ(r0.memory.units(), 32768);
  EXPECT_EQ(j[1].name, "train/resnet-1");
  EXPECT_EQ(j[1].arrival, 60);    // created at .25 s past: rounded down
  EXPECT_EQ(j[1].duration, 601);  // 61.25 s to 661.5 s, the later container: rounded up
  EXPECT_EQ(j[1].job.groups[0].request.gpu_count, 4);
  EXPECT_EQ(j[1].job.groups[0].request.cpu.units(), 16500);
  EXPECT_EQ(j[1].job.groups[0].request.memory.units(), 65536 + 256);
  EXPECT_EQ(j[2].name, "research/warmup-a");
  EXPECT_EQ(j[2].arrival, 90);
  EXPECT_EQ(j[2].duration, 95);
  EXPECT_EQ(j[2].job.groups[0].request.gpu_count, 4);  // the init container's
  EXPECT_EQ(j[2].job.groups[0].request.cpu.units(), 2000);
  for (const TimedJob& t : j) EXPECT_TRUE(ValidateJob(t.job).ok()) << t.name;
}

// When the Kubernetes Python client is here, the committed fixture must be what its generator writes.
TEST(KubectlExportTest, TheFixtureIsWhatItsGeneratorWrites) {
  std::string python;
  for (const char* candidate : {"/usr/bin/python3", "python3"}) {
    if (std::system((std::string(candidate) + " -c 'import kubernetes' >/dev/null 2>&1").c_str()) == 0) {
      python = candidate;
      break;
    }
  }
  if (python.empty()) GTEST_SKIP() << "no python3-kubernetes here";
  const std::string out = ::testing::TempDir() + std::to_string(::getpid()) + "-generated.json";
  ASSERT_EQ(std::system((python + " " + testutil::ExportFile("make_kubectl_pods.py") + " --stdout > " + out).c_str()), 0);
  EXPECT_EQ(ReadAll(out), ReadAll(testutil::ExportFile("kubectl-pods.json")));
  std::remove(out.c_str());
}

TEST(KubectlExportTest, AppliesTheInitContainerRulesAndSkipsWithReasons) {
  json a = Pod("ml", "a", "2024-05-01T10:00:00Z",
               {GpuContainer("2", "1", "1Gi"), GpuContainer("", "500m", "512Mi")},
               Succeeded("2024-05-01T10:00:05Z", "2024-05-01T10:10:05.5Z"));
  a["spec"]["containers"][1]["resources"] = {
      {"requests", {{"nvidia.com/gpu", "1"}, {"cpu", "500m"}, {"memory", "512Mi"}}}};
  json b = Pod("ml", "b", "2024-05-01T09:59:00Z", {GpuContainer("1", "2")},
               {{"phase", "Running"},
                {"startTime", "2024-05-01T09:59:30Z"},
                {"containerStatuses", {Terminated("2024-05-01T10:00:30Z")}}});
  json sidecar = GpuContainer("0", "1");
  sidecar["restartPolicy"] = "Always";
  b["spec"]["initContainers"] = {sidecar, GpuContainer("4", "250m")};
  json c = Pod("ops", "c", "2024-05-01T09:00:00Z", {GpuContainer("1")},
               {{"phase", "Running"},
                {"startTime", "2024-05-01T09:00:01Z"},
                {"containerStatuses",
                 {{{"name", "c"}, {"state", {{"running", {{"startedAt", "2024-05-01T09:00:02Z"}}}}}}}}});
  json d = Pod("ops", "d", "2024-05-01T09:00:00Z", {GpuContainer("1")},
               {{"phase", "Failed"},
                {"startTime", "2024-05-01T09:00:01Z"},
                {"containerStatuses",
                 {{{"name", "c"}, {"state", {{"waiting", {{"reason", "ContainerCreating"}}}}}}}}});
  json e = Pod("ops", "e", "2024-05-01T09:00:00Z", {GpuContainer("0")},
               Succeeded("2024-05-01T09:00:01Z", "2024-05-01T09:00:02Z"));
  json f = Pod("ops", "f", "2024-05-01T09:00:00Z", {GpuContainer("1")}, nullptr);
  json g = Pod("ops", "g", "2024-05-01T09:00:00Z", {GpuContainer("1")}, {{"phase", "Pending"}});
  TempFile file("pods.json", PodList({a, b, c, d, e, f, g}, "PodList"));
  auto read = ReadKubectlPods(file.path());
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->skipped,
            (std::map<std::string, int64_t>{
                {kSkipNoFinish, 1}, {kSkipNeverStarted, 2}, {kSkipNoGpus, 1}, {kSkipStillRunning, 1}}));
  ASSERT_EQ(read->jobs.size(), 2u);
  const TaskRequest& rb = read->jobs[0].job.groups[0].request;
  EXPECT_EQ(read->jobs[0].name, "ml/b");  // every container terminated: replayed though still "Running"
  EXPECT_EQ(read->jobs[0].duration, 60);
  EXPECT_EQ(rb.gpu_count, 4);       // max(1 + 0 of the sidecar, 4 of the init container)
  EXPECT_EQ(rb.cpu.units(), 3000);  // max(2 + 1 of the sidecar, 0.25 + 1 of the sidecar before it)
  const TaskRequest& ra = read->jobs[1].job.groups[0].request;
  EXPECT_EQ(read->jobs[1].name, "ml/a");
  EXPECT_EQ(read->jobs[1].arrival, 60);
  EXPECT_EQ(read->jobs[1].duration, 601);
  EXPECT_EQ(ra.gpu_count, 3);  // 2 from limits, 1 from requests
  EXPECT_EQ(ra.cpu.units(), 1500);
  EXPECT_EQ(ra.memory.units(), 1536);
  // One Pod object on its own.
  TempFile one("pod.json", a.dump());
  auto single = ReadKubectlPods(one.path());
  ASSERT_TRUE(single.ok()) << single.status().ToString();
  EXPECT_EQ(single->jobs.size(), 1u);
  TempFile none("none.json", PodList({e}));
  EXPECT_NE(ReadKubectlPods(none.path()).status().message().find(": no jobs to replay (skipped: 1 no GPUs)"),
            std::string::npos);
}

TEST(KubectlExportTest, WrongTypesAndValuesAreRefusedNamingPodAndField) {
  const json good = Pod("ml", "p", "2024-05-01T10:00:00Z", {GpuContainer("1")},
                        Succeeded("2024-05-01T10:00:05Z", "2024-05-01T10:10:05Z"));
  using Edit = std::function<void(json&)>;
  const std::pair<Edit, std::string> cases[] = {
      {[](json& p) { p["metadata"] = "x"; }, "items[0]: metadata is string, not object"},
      {[](json& p) { p["metadata"]["name"] = 5; }, "items[0]: metadata.name is number, not string"},
      {[](json& p) { p["metadata"].erase("namespace"); }, "items[0]: metadata.namespace: missing"},
      {[](json& p) { p["metadata"]["namespace"] = "Bad.NS"; },
       "metadata.namespace: 'Bad.NS' is not 1..63 characters"},
      {[](json& p) { p["metadata"]["name"] = "a b"; }, "metadata.name: 'a b' is not 1..253 characters"},
      {[](json& p) { p["metadata"]["creationTimestamp"] = "yesterday"; },
       "items[0] (ml/p): metadata.creationTimestamp: timestamp 'yesterday' is not RFC 3339"},
      {[](json& p) { p["kind"] = "Deployment"; }, "items[0]: kind: 'Deployment' is not Pod"},
      {[](json& p) { p.erase("spec"); }, "items[0] (ml/p): spec: missing"},
      {[](json& p) { p["spec"]["containers"] = json::object(); },
       "(ml/p): spec.containers is object, not array"},
      {[](json& p) { p["spec"]["containers"][0] = "x"; }, "(ml/p): spec.containers[0] is string, not object"},
      {[](json& p) { p["spec"]["containers"][0]["resources"]["limits"] = json::array(); },
       "spec.containers[0].resources.limits is array, not object"},
      {[](json& p) { p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 1; },
       "spec.containers[0].resources.limits.nvidia.com/gpu is number, not string"},
      {[](json& p) { p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1.5"; },
       "spec.containers[0]: nvidia.com/gpu '1.5' is not a whole number of GPUs 0..1024"},
      {[](json& p) { p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2000"; },
       "nvidia.com/gpu '2000' is not a whole number of GPUs"},
      {[](json& p) { p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"; },
       "(ml/p): spec.containers[0]: "},
      {[](json& p) { p["spec"]["containers"][0]["resources"]["requests"]["memory"] = "-1Gi"; },
       "(ml/p): spec.containers[0]: "},
      {[](json& p) { p["spec"]["containers"][0]["resources"]["requests"]["memory"] = "1Pi"; },
       "(ml/p): spec.containers[0]: "},
      {[](json& p) {
         p["spec"]["containers"] = {GpuContainer("1000"), GpuContainer("1000")};
       },
       "(ml/p): spec: asks for more than 2^40 mCPU or MiB, or more than 1024 GPUs"},
      {[](json& p) {
         p["spec"]["initContainers"] = {{{"name", "i"}, {"restartPolicy", 1}}};
       },
       "spec.initContainers[0].restartPolicy is number, not string"},
      {[](json& p) { p["status"]["phase"] = "Done"; }, "status.phase: 'Done' is not Pending, Running"},
      {[](json& p) { p["status"] = json::array(); }, "(ml/p): status is array, not object"},
      {[](json& p) { p["status"]["startTime"] = 5; }, "status.startTime is number, not string"},
      {[](json& p) { p["status"]["startTime"] = "2024-05-01"; }, "status.startTime: timestamp '2024-05-01'"},
      {[](json& p) { p["status"]["containerStatuses"] = "x"; },
       "status.containerStatuses is string, not array"},
      {[](json& p) { p["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = "x"; },
       "status.containerStatuses[0].state.terminated.finishedAt: timestamp 'x'"},
      {[](json& p) { p["status"]["containerStatuses"][0]["state"]["terminated"] = true; },
       "status.containerStatuses[0].state.terminated is boolean, not object"},
      {[](json& p) {
         p["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = "2024-05-01T10:00:04Z";
       },
       "(ml/p): status: the last finishedAt is before startTime 2024-05-01T10:00:05Z"},
      {[](json& p) {
         p["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = "9999-05-01T10:00:04Z";
       },
       "(ml/p): status: run time"},
  };
  for (const auto& [edit, error] : cases) {
    json pod = good;
    edit(pod);
    TempFile f("bad.json", PodList({pod}));
    auto read = ReadKubectlPods(f.path());
    ASSERT_FALSE(read.ok()) << pod.dump();
    EXPECT_NE(read.status().message().find(f.path() + ": "), std::string::npos) << read.status().message();
    EXPECT_NE(read.status().message().find(error), std::string::npos) << read.status().message();
    EXPECT_LT(read.status().message().size(), 512u);
  }
  TempFile twice("twice.json", PodList({good, good}));
  EXPECT_NE(
      ReadKubectlPods(twice.path()).status().message().find("items[1] (ml/p): pod 'ml/p' is also items[0]"),
      std::string::npos);
}

TEST(KubectlExportTest, HostileDocumentsAreRefusedNeverThrown) {
  const std::string fixture = ReadAll(testutil::ExportFile("kubectl-pods.json"));
  const std::pair<std::string, std::string> cases[] = {
      {"", ": not JSON: [json.exception.parse_error"},
      {"\xff\xfe{", ": not JSON: "},
      {"null", ": the top level is null, not an object"},
      {"[]", ": the top level is array, not an object"},
      {"{}", ": kind '' is not List, PodList or Pod"},
      {R"({"kind":"Service"})", ": kind 'Service' is not List, PodList or Pod"},
      {R"({"kind":7})", ": kind is number, not string"},
      {R"({"kind":"List"})", ": a List without items"},
      {R"({"kind":"List","items":{}})", ": items is object, not array"},
      {R"({"kind":"List","items":[3]})", ": items[0] is number, not an object"},
      {fixture.substr(0, fixture.size() / 2),
       ": not JSON: [json.exception.parse_error.101] parse error at line"},
      {std::string(100, '[') + std::string(100, ']'), ": JSON nested deeper than 64 levels"},
      {R"({"kind":"List","items":[{"metadata":{"name":")" + std::string(70000, 'a') + "\"}}]}",
       ": a key or string longer than 65536 bytes"},
  };
  for (const auto& [text, error] : cases) {
    TempFile f("hostile.json", text);
    auto read = ReadKubectlPods(f.path());
    ASSERT_FALSE(read.ok()) << text.substr(0, 80);
    EXPECT_NE(read.status().message().find(f.path() + error), std::string::npos) << read.status().message();
  }
  // Nesting and long strings count in the fields the reader drops too; 64 levels are allowed.
  const json good = Pod("ml", "p", "2024-05-01T10:00:00Z", {GpuContainer("1")},
                        Succeeded("2024-05-01T10:00:05Z", "2024-05-01T10:10:05Z"));
  for (int levels : {58, 59}) {  // below a list item's metadata.managedFields[0].fieldsV1, 6 levels deep
    json deep = json::array();
    for (int i = 1; i < levels; ++i) deep = json::array({deep});
    json pod = good;
    pod["metadata"]["managedFields"] = {{{"fieldsV1", deep}}};
    TempFile f("deep.json", PodList({pod}));
    EXPECT_EQ(ReadKubectlPods(f.path()).ok(), levels == 58) << levels;
  }
  json annotated = good;
  annotated["metadata"]["annotations"] = {{"note", std::string(70000, 'x')}};
  TempFile f("long.json", PodList({annotated}));
  EXPECT_FALSE(ReadKubectlPods(f.path()).ok());
  // Any cut of the generated list is refused, never thrown.
  for (size_t cut = 0; cut + 2 < fixture.size(); cut += 97) {
    TempFile part("cut.json", fixture.substr(0, cut));
    EXPECT_FALSE(ReadKubectlPods(part.path()).ok()) << cut;
  }
}

TEST(KubectlExportTest, RefusesFilesPastTheLimits) {
  // A 2 GiB file (sparse: nothing is written) is refused before it is read.
  const std::string huge = ::testing::TempDir() + std::to_string(::getpid()) + "-huge.json";
  { std::ofstream(huge, std::ios::binary) << "{"; }
  std::filesystem::resize_file(huge, uint64_t{2} << 30);
  auto read = ReadKubectlPods(huge);
  std::remove(huge.c_str());
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().message(),
            huge + ": 2147483648 bytes, more than the 1073741824 a job export may have");
  ExportLimits limits;
  limits.max_file_bytes = 1000;
  EXPECT_FALSE(ReadKubectlPods(testutil::ExportFile("kubectl-pods.json"), limits).ok());
  limits = {};
  limits.max_jobs = 6;  // the fixture has 7 pods
  read = ReadKubectlPods(testutil::ExportFile("kubectl-pods.json"), limits);
  EXPECT_EQ(read.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(read.status().message().find("more than 6 pods"), std::string::npos) << read.status().message();
  limits.max_jobs = 7;
  EXPECT_TRUE(ReadKubectlPods(testutil::ExportFile("kubectl-pods.json"), limits).ok());
  limits.max_json_depth = 8;  // the fixture nests 9 levels (managedFields)
  EXPECT_NE(ReadKubectlPods(testutil::ExportFile("kubectl-pods.json"), limits).status().message().find("deeper than 8"),
            std::string::npos);
  EXPECT_EQ(ReadKubectlPods("/no/such/file").status().code(), StatusCode::kIoError);
  // A pipe has no size to check first: it is read up to the limit, not past it. (One write, under
  // PIPE_BUF: whole in the pipe before the reader stops, so the writer never meets a closed pipe.)
  const std::string fifo = ::testing::TempDir() + std::to_string(::getpid()) + "-pods.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::thread writer([&] { std::ofstream(fifo, std::ios::binary) << std::string(200, ' ') << "{}"; });
  limits = {};
  limits.max_file_bytes = 100;
  read = ReadKubectlPods(fifo, limits);
  writer.join();
  std::remove(fifo.c_str());
  EXPECT_EQ(read.status().message(), fifo + ": more than the 100 bytes a job export may have");
}

}  // namespace
}  // namespace gpupool
