#include "api/jobspec.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace gpupool {
namespace {

using Json = nlohmann::json;

// The spec of the issue, made valid: the issue lists every field at once, and a real task takes
// either a GPU share or a MIG profile, and a bundle or a rootfs.
constexpr const char* kResnetYaml = R"(
name: resnet50-infer
tenant: vision
queue: vision
priority: 100
qos: guaranteed
labels: {app: resnet}
gang: {minAvailable: 4}
affinity:
  nodeSelector: {zone: a}
  nodeAffinity: [{key: gpu-class, operator: In, values: [a100, h100]}]
  togetherWith: [{app: cache}]
  apartFrom: [{app: resnet}]
tasks:
  - name: server
    replicas: 4
    resources: {cpu: 2, memory: 8Gi, gpu: 0.25, gpuMemory: 10Gi, gpuModels: [A100-80GB, H100-80GB]}
    isolation: mps
    command: [python3, serve.py]
    env: {MODEL: resnet50}
    container: {rootfs: /var/lib/gpupool/images/resnet50}
    checkpoint: {dir: /var/lib/gpupool/checkpoints/resnet50, intervalSeconds: 600}
)";

constexpr const char* kResnetJson = R"({
  "name": "resnet50-infer", "tenant": "vision", "queue": "vision", "priority": 100, "qos": "guaranteed",
  "labels": {"app": "resnet"}, "gang": {"minAvailable": 4},
  "affinity": {"nodeSelector": {"zone": "a"},
               "nodeAffinity": [{"key": "gpu-class", "operator": "In", "values": ["a100", "h100"]}],
               "togetherWith": [{"app": "cache"}], "apartFrom": [{"app": "resnet"}]},
  "tasks": [{"name": "server", "replicas": 4,
             "resources": {"cpu": "2", "memory": "8Gi", "gpu": 0.25, "gpuMemory": "10Gi",
                           "gpuModels": ["A100-80GB", "H100-80GB"]},
             "isolation": "mps", "command": ["python3", "serve.py"], "env": {"MODEL": "resnet50"},
             "container": {"rootfs": "/var/lib/gpupool/images/resnet50"},
             "checkpoint": {"dir": "/var/lib/gpupool/checkpoints/resnet50", "intervalSeconds": 600}}]
})";

Job ExpectedResnet() {
  Job job;
  job.name = "resnet50-infer";
  job.tenant = "vision";
  job.queue = "vision";
  job.priority = 100;
  job.qos = QosClass::kGuaranteed;
  job.labels = {{"app", "resnet"}};
  job.min_available = 0;  // 4 of 4 tasks: all
  job.affinity.node = {{"zone", LabelRequirement::Op::kIn, {"a"}},
                       {"gpu-class", LabelRequirement::Op::kIn, {"a100", "h100"}}};
  job.affinity.together_with = {{{"app", "cache"}}};
  job.affinity.apart_from = {{{"app", "resnet"}}};
  TaskGroup g;
  g.name = "server";
  g.replicas = 4;
  g.request.cpu = MilliCpu(2000);
  g.request.memory = MiB(8192);
  g.request.gpu_count = 1;
  g.request.gpu_share = MilliGpu(250);
  g.request.gpu_memory = MiB(10240);
  g.request.gpu_models = {"A100-80GB", "H100-80GB"};
  g.exec.isolation = IsolationMode::kMps;
  g.exec.command = {"python3", "serve.py"};
  g.exec.env = {{"MODEL", "resnet50"}};
  g.exec.rootfs = "/var/lib/gpupool/images/resnet50";
  g.exec.checkpoint = {"/var/lib/gpupool/checkpoints/resnet50", 600};
  // A share of a guaranteed job, held by the MPS limits its agent sets (DeriveSharing).
  g.request.guaranteed = true;
  g.request.enforced_by = kEnforceMps;
  g.request.mps_owner = "vision";  // its GPU's MPS server runs for the tenant
  job.groups.push_back(g);
  return job;
}

// SameJobSpec, with both jobs' canonical specs in the failure message.
::testing::AssertionResult SameJob(const Job& a, const Job& b) {
  if (SameJobSpec(a, b)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "jobs differ:\n  " << JobSpecToJson(a).dump() << "\n  " << JobSpecToJson(b).dump();
}

Job MustParse(std::string_view text, SpecFormat format) {
  Result<Job> job = ParseJobSpec(text, format);
  EXPECT_TRUE(job.ok()) << job.status().ToString() << "\n" << text;
  return job.ok() ? *job : Job{};
}

// Refused with InvalidArgument, ErrorField() == field, and the message contains `needle`.
::testing::AssertionResult Refused(const Result<Job>& r, const std::string& field,
                                   const std::string& needle) {
  if (r.ok()) return ::testing::AssertionFailure() << "accepted: " << JobSpecToJson(*r).dump();
  const Status& st = r.status();
  if (st.code() != StatusCode::kInvalidArgument) return ::testing::AssertionFailure() << st.ToString();
  if (ErrorField(st) != field) {
    return ::testing::AssertionFailure()
           << "field '" << ErrorField(st) << "', want '" << field << "': " << st.message();
  }
  const std::string prefix = (field.empty() ? std::string("spec") : field) + ": ";
  if (st.message().rfind(prefix, 0) != 0) {
    return ::testing::AssertionFailure() << "'" << st.message() << "' does not start with '" << prefix << "'";
  }
  if (st.message().find(needle) == std::string::npos) {
    return ::testing::AssertionFailure() << "'" << st.message() << "' does not mention '" << needle << "'";
  }
  return ::testing::AssertionSuccess();
}

// ---- the example spec ------------------------------------------------------------------------

// What would hold each share to its size, and whether it is guaranteed, follow from the job's QoS
// and the task's isolation; a spec cannot say so itself.
TEST(JobSpec, SharingIsDerivedFromQosAndIsolation) {
  const Job job = MustParse(R"({"name": "mix", "qos": "guaranteed", "tasks": [
      {"name": "p", "command": ["x"], "isolation": "timeslice", "resources": {"gpu": 0.5}},
      {"name": "c", "command": ["x"], "isolation": "timeslice", "container": {"image": "oci:/srv/i"},
       "resources": {"gpu": 0.5}},
      {"name": "m", "command": ["x"], "resources": {"gpu": 0.25}},
      {"name": "w", "command": ["x"], "resources": {"gpu": 2}},
      {"name": "cpu", "command": ["x"], "resources": {"cpu": 1}}]})",
                            SpecFormat::kJson);
  ASSERT_EQ(job.groups.size(), 5u);
  const uint8_t want[] = {kEnforceLimiter, kEnforceLimiterContainer, kEnforceMps, 0, 0};
  const bool guaranteed[] = {true, true, true, false, false};
  for (size_t i = 0; i < 5; ++i) {
    SCOPED_TRACE(job.groups[i].name);
    EXPECT_EQ(job.groups[i].request.enforced_by, want[i]);
    EXPECT_EQ(job.groups[i].request.guaranteed, guaranteed[i]);
  }
  const Job burstable = MustParse(R"({"name": "b", "tasks": [
      {"name": "p", "command": ["x"], "resources": {"gpu": 0.5}}]})",
                                  SpecFormat::kJson);
  EXPECT_FALSE(burstable.groups[0].request.guaranteed);
  EXPECT_EQ(burstable.groups[0].request.enforced_by, kEnforceLimiter);  // timeslice by default
  // Forged fields are unknown fields.
  EXPECT_FALSE(ParseJobSpec(R"({"name": "f", "tasks": [{"name": "p", "command": ["x"],
      "resources": {"gpu": 0.5, "guaranteed": true}}]})",
                            SpecFormat::kJson)
                   .ok());
}

TEST(JobSpec, ExampleYamlParsesToTheExpectedJob) {
  EXPECT_TRUE(SameJob(MustParse(kResnetYaml, SpecFormat::kYaml), ExpectedResnet()));
}

TEST(JobSpec, YamlAndJsonOfOneSpecGiveEqualJobs) {
  EXPECT_TRUE(SameJob(MustParse(kResnetJson, SpecFormat::kJson), MustParse(kResnetYaml, SpecFormat::kYaml)));
}

TEST(JobSpec, JsonIsAlsoYaml) {
  // JSON is YAML's flow style: a client may send JSON as application/yaml.
  EXPECT_TRUE(SameJob(MustParse(kResnetJson, SpecFormat::kYaml), ExpectedResnet()));
}

TEST(JobSpec, TheIssuesLiteralExampleIsRefused) {
  // The issue lists every field at once; a share of a GPU together with a MIG profile is not a task.
  std::string text = kResnetYaml;
  const std::string from = "gpuModels: [A100-80GB, H100-80GB]}";
  text.replace(text.find(from), from.size(), "gpuModels: [A100-80GB, H100-80GB], migProfile: 3g.40gb}");
  EXPECT_TRUE(Refused(ParseJobSpec(text, SpecFormat::kYaml), "tasks[0].resources.gpu", "with migProfile"));
}

TEST(JobSpec, MinimalSpecGetsDefaults) {
  const Job job = MustParse(R"({"name": "j", "tasks": [{"name": "t"}]})", SpecFormat::kJson);
  EXPECT_EQ(job.id, "");
  EXPECT_EQ(job.tenant, "");
  EXPECT_EQ(job.queue, "");
  EXPECT_EQ(job.priority, 0);
  EXPECT_EQ(job.qos, QosClass::kBurstable);
  EXPECT_EQ(job.min_available, 0);
  ASSERT_EQ(job.groups.size(), 1u);
  EXPECT_EQ(job.groups[0].replicas, 1);
  EXPECT_EQ(job.groups[0].request, TaskRequest{});
  EXPECT_EQ(job.groups[0].exec, TaskExec{});
  EXPECT_TRUE(job.affinity.empty());
  EXPECT_EQ(job.retry, RetryPolicy{});
}

TEST(JobSpec, RetryPolicyAndItsBackoff) {
  const Job job = MustParse(
      "name: j\nretry: {maxRestarts: 5, backoffSeconds: 2, maxBackoffSeconds: 10, onFailure: true}\n"
      "tasks: [{name: t}]\n",
      SpecFormat::kYaml);
  EXPECT_EQ(job.retry.max_restarts, 5);
  EXPECT_TRUE(job.retry.on_failure);
  // The first restart at once, then doubling from backoffSeconds up to maxBackoffSeconds.
  EXPECT_EQ(job.retry.BackoffSeconds(1), 0);
  EXPECT_EQ(job.retry.BackoffSeconds(2), 2);
  EXPECT_EQ(job.retry.BackoffSeconds(3), 4);
  EXPECT_EQ(job.retry.BackoffSeconds(4), 8);
  EXPECT_EQ(job.retry.BackoffSeconds(5), 10);
  EXPECT_EQ(job.retry.BackoffSeconds(60), 10);
  // The canonical form writes the policy out and reads back the same.
  const Job again = MustParse(JobSpecToJson(job).dump(), SpecFormat::kJson);
  EXPECT_EQ(again.retry, job.retry);
  EXPECT_TRUE(SameJobSpec(job, again));
}

TEST(JobSpec, NullCountsAsAbsent) {
  const Job job =
      MustParse("name: j\ntenant:\nlabels: ~\ntasks:\n  - name: t\n    env: null\n", SpecFormat::kYaml);
  EXPECT_EQ(job.tenant, "");
  EXPECT_TRUE(job.labels.empty());
}

// ---- quantities and the gpu rule -------------------------------------------------------------

struct GpuCase {
  std::string resources;  // YAML flow map
  int count;
  int64_t share;
  std::string mig;
};

TEST(JobSpec, GpuRule) {
  const std::vector<GpuCase> cases = {
      {"{}", 0, 0, ""},
      {"{gpu: 0}", 0, 0, ""},
      {"{gpu: 0.25}", 1, 250, ""},
      {"{gpu: 0.001}", 1, 1, ""},
      {"{gpu: .5}", 1, 500, ""},
      {"{gpu: 0.9996}", 1, 1000, ""},  // rounds to a whole GPU
      {"{gpu: 1}", 1, 1000, ""},
      {"{gpu: 1.0}", 1, 1000, ""},
      {"{gpu: 8}", 8, 1000, ""},
      {"{gpu: 64}", 64, 1000, ""},
      {"{gpu: 2e1}", 20, 1000, ""},
      {"{migProfile: 3g.40gb}", 1, 0, "3g.40gb"},
      {"{gpu: 1, migProfile: 1g.10gb+me}", 1, 0, "1g.10gb+me"},
      {"{migProfile: 3g}", 1, 0, "3g"},
  };
  for (const GpuCase& c : cases) {
    SCOPED_TRACE(c.resources);
    const Job job =
        MustParse("name: j\ntasks: [{name: t, resources: " + c.resources + "}]", SpecFormat::kYaml);
    if (job.groups.empty()) continue;
    const TaskRequest& r = job.groups[0].request;
    EXPECT_EQ(r.gpu_count, c.count);
    EXPECT_EQ(r.gpu_share.units(), c.share);
    EXPECT_EQ(r.mig_profile, c.mig);
  }
}

TEST(JobSpec, CpuAndMemoryForms) {
  const std::vector<std::pair<std::string, int64_t>> cpus = {
      {"2", 2000}, {"0.5", 500}, {"'500m'", 500}, {"'2'", 2000}, {"'0.25'", 250}, {"'1.5'", 1500}, {"0", 0}};
  for (const auto& [text, milli] : cpus) {
    SCOPED_TRACE(text);
    const Job job =
        MustParse("name: j\ntasks: [{name: t, resources: {cpu: " + text + "}}]", SpecFormat::kYaml);
    if (job.groups.empty()) continue;
    EXPECT_EQ(job.groups[0].request.cpu.units(), milli);
  }
  const std::vector<std::pair<std::string, int64_t>> memories = {
      {"8Gi", 8192}, {"512Mi", 512}, {"1Ti", 1 << 20}, {"1G", 954}, {"1.5Gi", 1536}, {"1Ki", 1}, {"0Mi", 0}};
  for (const auto& [text, mib] : memories) {
    SCOPED_TRACE(text);
    const Job job =
        MustParse("name: j\ntasks: [{name: t, resources: {memory: " + text + "}}]", SpecFormat::kYaml);
    if (job.groups.empty()) continue;
    EXPECT_EQ(job.groups[0].request.memory.units(), mib);
  }
}

// ---- isolation defaults ------------------------------------------------------------------------

TEST(JobSpec, IsolationDefaults) {
  struct Case {
    std::string qos;
    std::string resources;
    IsolationMode want;
  };
  const std::vector<Case> cases = {
      {"guaranteed", "{gpu: 0.5}", IsolationMode::kMps},
      {"burstable", "{gpu: 0.5}", IsolationMode::kTimeslice},
      {"best-effort", "{gpu: 0.5}", IsolationMode::kTimeslice},
      {"guaranteed", "{gpu: 2}", IsolationMode::kExclusive},
      {"best-effort", "{gpu: 1}", IsolationMode::kExclusive},
      {"guaranteed", "{migProfile: 2g.20gb}", IsolationMode::kMig},
      {"burstable", "{cpu: 1}", IsolationMode::kExclusive},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.qos + " " + c.resources);
    const Job job = MustParse(
        "name: j\nqos: " + c.qos + "\ntasks: [{name: t, resources: " + c.resources + "}]", SpecFormat::kYaml);
    if (job.groups.empty()) continue;
    EXPECT_EQ(job.groups[0].exec.isolation, c.want);
  }
}

// The framework a task names picks its allocator advice; none named is auto, written as nothing.
TEST(JobSpec, FrameworkIsReadWrittenAndCompared) {
  const std::pair<std::string, Framework> cases[] = {{"pytorch", Framework::kPyTorch},
                                                     {"tensorflow", Framework::kTensorFlow},
                                                     {"jax", Framework::kJax},
                                                     {"none", Framework::kNone}};
  for (const auto& [name, want] : cases) {
    SCOPED_TRACE(name);
    const Job job = MustParse("name: j\ntasks: [{name: t, resources: {gpu: 0.5}, framework: " + name + "}]",
                              SpecFormat::kYaml);
    if (job.groups.empty()) continue;
    EXPECT_EQ(job.groups[0].exec.framework, want);
    EXPECT_EQ(JobSpecToJson(job)["tasks"][0]["framework"], name);
    Result<Job> again = ParseJobSpec(JobSpecToJson(job).dump(), SpecFormat::kJson);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_TRUE(SameJobSpec(job, *again));
    Job other = job;
    other.groups[0].exec.framework = Framework::kAuto;
    EXPECT_FALSE(SameJobSpec(job, other));
  }
  const Job plain = MustParse("name: j\ntasks: [{name: t}]", SpecFormat::kYaml);
  ASSERT_FALSE(plain.groups.empty());
  EXPECT_EQ(plain.groups[0].exec.framework, Framework::kAuto);
  EXPECT_FALSE(JobSpecToJson(plain)["tasks"][0].contains("framework"));
}

// ---- refusals ---------------------------------------------------------------------------------

// A valid spec as a JSON tree, to be broken one way per case.
Json BaseSpec() {
  return Json::parse(R"({
    "name": "j", "priority": 1, "qos": "burstable", "labels": {"app": "x"}, "gang": {"minAvailable": 1},
    "affinity": {"nodeSelector": {"zone": "a"},
                 "nodeAffinity": [{"key": "k", "operator": "In", "values": ["v"]}],
                 "togetherWith": [{"app": "cache"}], "apartFrom": [{"app": "x"}]},
    "tasks": [{"name": "t", "replicas": 2,
               "resources": {"cpu": 1, "memory": "1Gi", "gpu": 0.5, "gpuMemory": "4Gi", "gpuModels": ["T4"]},
               "isolation": "timeslice", "command": ["run"], "env": {"A": "1"},
               "container": {"bundle": "/b"}, "checkpoint": {"dir": "/c", "intervalSeconds": 60}}]
  })");
}

struct BadCase {
  std::string what;
  std::function<void(Json&)> breaks;
  std::string field;
  std::string needle;
};

TEST(JobSpec, TimeLimitsInSecondsOrDurations) {
  const std::vector<std::pair<std::string, int64_t>> cases = {
      {"3600", 3600}, {"'90m'", 5400}, {"1h30m", 5400}, {"2d", 172800}, {"45s", 45}, {"1d2h3m4s", 93784},
      {"365d", 31536000}};
  for (const auto& [text, want] : cases) {
    auto job = ParseJobSpec("name: t\ntimeLimit: " + text + "\ntasks: [{name: w}]", SpecFormat::kYaml);
    ASSERT_TRUE(job.ok()) << text << ": " << job.status().ToString();
    EXPECT_EQ(job->time_limit_seconds, want) << text;
  }
}

TEST(JobSpec, VolumesParseToTheirMeaning) {
  auto job = ParseJobSpec(
      "name: v\ntasks: [{name: t, container: {rootfs: /r}, volumes: [{hostPath: /srv/data},"
      " {hostPath: /srv/out, mountPath: /out, readOnly: false}, {scratch: {}, mountPath: /s},"
      " {scratch: {medium: memory, sizeLimit: 512Mi}, mountPath: /m},"
      " {scratch: {medium: disk, sizeLimit: 20Gi}, mountPath: /d}, {scratch: {sizeLimit: 64Ti}, mountPath: /big}]}]",
      SpecFormat::kYaml);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  const auto& v = job->groups[0].exec.volumes;
  ASSERT_EQ(v.size(), 6u);
  EXPECT_EQ(v[0], (Volume{"/srv/data", "/srv/data", true, false, 0}));  // mounted where it is, read-only
  EXPECT_EQ(v[1], (Volume{"/out", "/srv/out", false, false, 0}));
  EXPECT_EQ(v[2], (Volume{"/s", "", false, false, 0}));
  EXPECT_EQ(v[3], (Volume{"/m", "", false, true, int64_t{512} << 20}));
  EXPECT_EQ(v[4], (Volume{"/d", "", false, false, int64_t{20} << 30}));  // disk scratch of its own size
  EXPECT_EQ(v[5], (Volume{"/big", "", false, false, int64_t{64} << 40}));
  // The canonical spec writes the disk limit back.
  const Json out = VolumesToJson(v);
  EXPECT_EQ(out[4]["scratch"], (Json{{"medium", "disk"}, {"sizeLimit", "20Gi"}}));
  EXPECT_EQ(out[2]["scratch"], (Json{{"medium", "disk"}}));
}

TEST(JobSpec, BaseSpecIsValid) {
  EXPECT_TRUE(ParseJobSpec(BaseSpec().dump(), SpecFormat::kJson).ok());
}

TEST(JobSpec, BadInputsNameTheirField) {
  const std::vector<BadCase> cases = {
      // Unknown fields at each level.
      {"unknown top", [](Json& j) { j["nmae"] = "x"; }, "nmae", "unknown field (known: name, tenant"},
      {"unknown task", [](Json& j) { j["tasks"][0]["resoures"] = Json::object(); }, "tasks[0].resoures",
       "unknown field (known: name, replicas, resources, isolation, framework, command, env, workingDir, container, "
       "checkpoint, volumes)"},
      {"unknown resource", [](Json& j) { j["tasks"][0]["resources"]["gpus"] = 1; }, "tasks[0].resources.gpus",
       "unknown field"},
      {"unknown gang", [](Json& j) { j["gang"]["min"] = 1; }, "gang.min",
       "unknown field (known: minAvailable)"},
      {"unknown affinity", [](Json& j) { j["affinity"]["antiAffinity"] = Json::array(); },
       "affinity.antiAffinity", "unknown field"},
      {"unknown requirement", [](Json& j) { j["affinity"]["nodeAffinity"][0]["op"] = "In"; },
       "affinity.nodeAffinity[0].op", "unknown field"},
      {"unknown container", [](Json& j) { j["tasks"][0]["container"]["imag"] = "x"; },
       "tasks[0].container.imag", "unknown field (known: image, bundle, rootfs, network, runtimeClass)"},
      // Volumes: the shapes a hostile tenant tries.
      {"volumes not a list", [](Json& j) { j["tasks"][0]["volumes"] = "/etc"; }, "tasks[0].volumes", "expected"},
      {"volumes too many", [](Json& j) {
         for (int i = 0; i < 33; ++i) j["tasks"][0]["volumes"].push_back({{"hostPath", "/d" + std::to_string(i)}});
       }, "tasks[0].volumes", "33"},
      {"volume on a process task", [](Json& j) {
         j["tasks"][0].erase("container");
         j["tasks"][0]["volumes"] = Json::array({{{"hostPath", "/data"}}});
       }, "tasks[0].volumes", "need a container"},
      {"volume neither", [](Json& j) { j["tasks"][0]["volumes"] = Json::array({{{"mountPath", "/d"}}}); },
       "tasks[0].volumes[0]", "takes one of hostPath or scratch"},
      {"volume both", [](Json& j) {
         j["tasks"][0]["volumes"] = Json::array({{{"hostPath", "/d"}, {"scratch", Json::object()}}});
       }, "tasks[0].volumes[0]", "takes one of hostPath or scratch"},
      {"volume relative", [](Json& j) { j["tasks"][0]["volumes"] = Json::array({{{"hostPath", "data"}}}); },
       "tasks[0].volumes[0].hostPath", "must be an absolute path"},
      {"volume dotdot", [](Json& j) { j["tasks"][0]["volumes"] = Json::array({{{"hostPath", "/srv/../etc"}}}); },
       "tasks[0].volumes[0].hostPath", "normalised"},
      {"volume double slash", [](Json& j) {
         j["tasks"][0]["volumes"] = Json::array({{{"hostPath", "/srv"}, {"mountPath", "/a//b"}}});
       }, "tasks[0].volumes[0].mountPath", "normalised"},
      {"volume trailing slash", [](Json& j) { j["tasks"][0]["volumes"] = Json::array({{{"hostPath", "/srv/"}}}); },
       "tasks[0].volumes[0].hostPath", "normalised"},
      {"volume root", [](Json& j) { j["tasks"][0]["volumes"] = Json::array({{{"hostPath", "/"}}}); },
       "tasks[0].volumes[0].hostPath", "must not be the container's root"},
      {"volume over dev", [](Json& j) {
         j["tasks"][0]["volumes"] = Json::array({{{"hostPath", "/srv"}, {"mountPath", "/dev/nvidia0"}}});
       }, "tasks[0].volumes[0].mountPath", "must not be under /dev"},
      {"volume over the checkpoint", [](Json& j) {
         j["tasks"][0]["volumes"] = Json::array({{{"hostPath", "/srv"}, {"mountPath", "/c"}}});
       }, "tasks[0].volumes[0].mountPath", "overlaps the checkpoint directory"},
      {"volume under the checkpoint", [](Json& j) {
         j["tasks"][0]["volumes"] = Json::array({{{"hostPath", "/srv"}, {"mountPath", "/c/x"}}});
       }, "tasks[0].volumes[0].mountPath", "overlaps the checkpoint directory"},
      {"volume twice", [](Json& j) {
         j["tasks"][0]["volumes"] = Json::array({{{"hostPath", "/a"}, {"mountPath", "/d"}},
                                                 {{"scratch", Json::object()}, {"mountPath", "/d"}}});
       }, "tasks[0].volumes[1].mountPath", "is mounted twice"},
      {"volume readOnly type", [](Json& j) {
         j["tasks"][0]["volumes"] = Json::array({{{"hostPath", "/a"}, {"readOnly", "no"}}});
       }, "tasks[0].volumes[0].readOnly", "expected"},
      {"scratch readOnly", [](Json& j) {
         j["tasks"][0]["volumes"] = Json::array({{{"scratch", Json::object()}, {"mountPath", "/s"}, {"readOnly", true}}});
       }, "tasks[0].volumes[0].readOnly", "is for hostPath volumes"},
      {"scratch without mountPath", [](Json& j) {
         j["tasks"][0]["volumes"] = Json::array({{{"scratch", Json::object()}}});
       }, "tasks[0].volumes[0].mountPath", "is required for scratch"},
      {"scratch medium", [](Json& j) {
         j["tasks"][0]["volumes"] = Json::array({{{"scratch", {{"medium", "nvme"}}}, {"mountPath", "/s"}}});
       }, "tasks[0].volumes[0].scratch.medium", "must be disk or memory"},
      {"scratch memory without size", [](Json& j) {
         j["tasks"][0]["volumes"] = Json::array({{{"scratch", {{"medium", "memory"}}}, {"mountPath", "/s"}}});
       }, "tasks[0].volumes[0].scratch.sizeLimit", "is required for medium: memory"},
      {"scratch disk over 64Ti", [](Json& j) {
         j["tasks"][0]["volumes"] = Json::array({{{"scratch", {{"sizeLimit", "65Ti"}}}, {"mountPath", "/s"}}});
       }, "tasks[0].volumes[0].scratch.sizeLimit", ""},
      {"scratch disk under 1Mi", [](Json& j) {
         j["tasks"][0]["volumes"] = Json::array({{{"scratch", {{"medium", "disk"}, {"sizeLimit", "0Mi"}}},
                                                  {"mountPath", "/s"}}});
       }, "tasks[0].volumes[0].scratch.sizeLimit", "must be at least 1Mi"},
      {"scratch size huge", [](Json& j) {
         j["tasks"][0]["volumes"] = Json::array({{{"scratch", {{"medium", "memory"}, {"sizeLimit", "9999Pi"}}},
                                                  {"mountPath", "/s"}}});
       }, "tasks[0].volumes[0].scratch.sizeLimit", ""},
      {"runtime class", [](Json& j) { j["tasks"][0]["container"]["runtimeClass"] = "docker"; },
       "tasks[0].container.runtimeClass", "must be runc, crun, runsc or kata"},
      {"runtime class long", [](Json& j) { j["tasks"][0]["container"]["runtimeClass"] = std::string(40, 'r'); },
       "tasks[0].container.runtimeClass", "over the limit of 16"},
      {"timeLimit zero", [](Json& j) { j["timeLimit"] = 0; }, "timeLimit", "must be between 1 and 31536000"},
      {"timeLimit unit", [](Json& j) { j["timeLimit"] = "3w"; }, "timeLimit", "units d, h, m, s, each once"},
      {"timeLimit twice", [](Json& j) { j["timeLimit"] = "1h1h"; }, "timeLimit", "each once"},
      {"timeLimit no number", [](Json& j) { j["timeLimit"] = "h"; }, "timeLimit", "expected a duration"},
      {"timeLimit trailing", [](Json& j) { j["timeLimit"] = "90"; }, "timeLimit", "expected a duration"},
      {"timeLimit long", [](Json& j) { j["timeLimit"] = "366d"; }, "timeLimit", "must be between 1 s and 31536000 s"},
      {"timeLimit huge", [](Json& j) { j["timeLimit"] = "99999999999999h"; }, "timeLimit", "expected a duration"},
      {"timeLimit bool", [](Json& j) { j["timeLimit"] = true; }, "timeLimit", "expected seconds or a duration"},
      {"dependsOn object", [](Json& j) { j["dependsOn"] = Json::object(); }, "dependsOn", "expected an array"},
      {"dependsOn not an id", [](Json& j) { j["dependsOn"] = Json::parse(R"([{"job": "../x"}])"); },
       "dependsOn[0].job", "must be a job id"},
      {"dependsOn no job", [](Json& j) { j["dependsOn"] = Json::parse(R"([{"condition": "ended"}])"); },
       "dependsOn[0].job", "is required"},
      {"dependsOn condition", [](Json& j) { j["dependsOn"] = Json::parse(R"([{"job": "j-1", "condition": "ok"}])"); },
       "dependsOn[0].condition", "must be succeeded or ended"},
      {"dependsOn twice", [](Json& j) { j["dependsOn"] = Json::parse(R"([{"job": "j-1"}, {"job": "j-1"}])"); },
       "dependsOn[1].job", "is also dependsOn[0]"},
      {"dependsOn unknown", [](Json& j) { j["dependsOn"] = Json::parse(R"([{"job": "j-1", "after": 1}])"); },
       "dependsOn[0].after", "unknown field"},
      {"dependsOn too many", [](Json& j) {
         j["dependsOn"] = Json::array();
         for (int i = 0; i < 65; ++i) j["dependsOn"].push_back({{"job", "j-" + std::to_string(i)}});
       }, "dependsOn", "over the limit"},
      {"relative workingDir", [](Json& j) { j["tasks"][0]["workingDir"] = "data"; }, "tasks[0].workingDir",
       "must be an absolute path, got 'data'"},
      {"workingDir number", [](Json& j) { j["tasks"][0]["workingDir"] = 7; }, "tasks[0].workingDir",
       "expected a string"},
      {"unknown checkpoint", [](Json& j) { j["tasks"][0]["checkpoint"]["every"] = 1; },
       "tasks[0].checkpoint.every", "unknown field"},
      {"odd unknown name", [](Json& j) { j["tasks"][0]["a b"] = 1; }, "tasks[0]", "unknown field 'a b'"},
      // Wrong types.
      {"name number", [](Json& j) { j["name"] = 5; }, "name",
       "expected a string, got integer 5 (quote it in YAML)"},
      {"tasks object", [](Json& j) { j["tasks"] = Json::object(); }, "tasks",
       "expected an array, got object"},
      {"task string", [](Json& j) { j["tasks"][0] = "t"; }, "tasks[0]", "expected an object, got string"},
      {"priority string", [](Json& j) { j["priority"] = "high"; }, "priority", "expected an integer"},
      {"priority fraction", [](Json& j) { j["priority"] = 1.5; }, "priority",
       "expected an integer, got number 1.5"},
      {"replicas bool", [](Json& j) { j["tasks"][0]["replicas"] = true; }, "tasks[0].replicas",
       "expected an integer, got boolean"},
      {"gpu string", [](Json& j) { j["tasks"][0]["resources"]["gpu"] = "0.5"; }, "tasks[0].resources.gpu",
       "expected a number"},
      {"cpu bool", [](Json& j) { j["tasks"][0]["resources"]["cpu"] = false; }, "tasks[0].resources.cpu",
       "expected a number of cores"},
      {"command string", [](Json& j) { j["tasks"][0]["command"] = "run it"; }, "tasks[0].command",
       "expected an array"},
      {"command arg number", [](Json& j) { j["tasks"][0]["command"][0] = 8080; }, "tasks[0].command[0]",
       "expected a string"},
      {"env value number", [](Json& j) { j["tasks"][0]["env"]["A"] = 1; }, "tasks[0].env.A",
       "expected a string"},
      {"label value number", [](Json& j) { j["labels"]["app"] = 1; }, "labels",
       "label 'app' must have a string"},
      {"values string", [](Json& j) { j["affinity"]["nodeAffinity"][0]["values"] = "v"; },
       "affinity.nodeAffinity[0].values", "expected an array"},
      {"togetherWith object",
       [](Json& j) {
         j["affinity"]["togetherWith"] = {{"app", "x"}};
       },
       "affinity.togetherWith", "expected an array"},
      // Names.
      {"name missing", [](Json& j) { j.erase("name"); }, "name", "is required"},
      {"name upper", [](Json& j) { j["name"] = "Job"; }, "name", "lowercase letters"},
      {"name dash end", [](Json& j) { j["name"] = "job-"; }, "name", "ending with a letter or digit"},
      {"name too long", [](Json& j) { j["name"] = std::string(64, 'a'); }, "name", "over the limit of 63"},
      {"name empty", [](Json& j) { j["name"] = ""; }, "name", "must not be empty"},
      {"queue slash", [](Json& j) { j["queue"] = "a/b"; }, "queue", "lowercase letters"},
      {"tenant space", [](Json& j) { j["tenant"] = "a b"; }, "tenant", "lowercase letters"},
      {"task name missing", [](Json& j) { j["tasks"][0].erase("name"); }, "tasks[0].name", "is required"},
      {"task name long", [](Json& j) { j["tasks"][0]["name"] = std::string(100, 'x'); }, "tasks[0].name",
       "over the limit"},
      {"duplicate task names", [](Json& j) { j["tasks"].push_back(j["tasks"][0]); }, "tasks[1].name",
       "'t' is also the name of tasks[0]"},
      // Scalars out of range.
      {"priority high", [](Json& j) { j["priority"] = 1000001; }, "priority", "between -1000000 and 1000000"},
      {"priority huge", [](Json& j) { j["priority"] = 1e300; }, "priority", "between"},
      {"priority unsigned", [](Json& j) { j["priority"] = uint64_t{18446744073709551615u}; }, "priority",
       "between"},
      {"qos unknown", [](Json& j) { j["qos"] = "gold"; }, "qos",
       "must be guaranteed, burstable or best-effort"},
      {"isolation unknown", [](Json& j) { j["tasks"][0]["isolation"] = "vm"; }, "tasks[0].isolation",
       "must be exclusive, mps, mig or timeslice, got 'vm'"},
      {"framework unknown", [](Json& j) { j["tasks"][0]["framework"] = "x"; }, "tasks[0].framework",
       "must be pytorch, tensorflow, jax or none, got 'x'"},
      {"framework auto", [](Json& j) { j["tasks"][0]["framework"] = "auto"; }, "tasks[0].framework",
       "must be pytorch, tensorflow, jax or none, got 'auto'"},
      {"framework not a string", [](Json& j) { j["tasks"][0]["framework"] = 1; }, "tasks[0].framework", ""},
      {"framework long", [](Json& j) { j["tasks"][0]["framework"] = std::string(100, 'x'); }, "tasks[0].framework",
       "over the limit"},
      {"replicas zero", [](Json& j) { j["tasks"][0]["replicas"] = 0; }, "tasks[0].replicas", "between 1 and"},
      {"replicas over limit", [](Json& j) { j["tasks"][0]["replicas"] = 10001; }, "tasks[0].replicas",
       "between 1 and 10000"},
      {"total replicas over limit",
       [](Json& j) {
         j["tasks"][0]["replicas"] = 6000;
         Json second = j["tasks"][0];
         second["name"] = "u";
         j["tasks"].push_back(second);
       },
       "tasks[1].replicas", "brings the job to 12000 tasks, over the limit of 10000"},
      {"tasks empty", [](Json& j) { j["tasks"] = Json::array(); }, "tasks", "at least one task"},
      {"tasks missing", [](Json& j) { j.erase("tasks"); }, "tasks", "is required"},
      // Quantities.
      {"cpu negative", [](Json& j) { j["tasks"][0]["resources"]["cpu"] = -1; }, "tasks[0].resources.cpu",
       "must not be negative"},
      {"cpu absurd", [](Json& j) { j["tasks"][0]["resources"]["cpu"] = 1e9; }, "tasks[0].resources.cpu",
       "at most 4096 cores"},
      {"cpu absurd string", [](Json& j) { j["tasks"][0]["resources"]["cpu"] = "99999999m"; },
       "tasks[0].resources.cpu", "at most 4096 cores"},
      {"cpu unit", [](Json& j) { j["tasks"][0]["resources"]["cpu"] = "2Gi"; }, "tasks[0].resources.cpu",
       "unknown unit"},
      {"cpu hex", [](Json& j) { j["tasks"][0]["resources"]["cpu"] = "0x10"; }, "tasks[0].resources.cpu",
       "must be a number of cores"},
      {"cpu negative string", [](Json& j) { j["tasks"][0]["resources"]["cpu"] = "-1"; },
       "tasks[0].resources.cpu", "must be a number of cores"},
      {"memory bare number", [](Json& j) { j["tasks"][0]["resources"]["memory"] = 1024; },
       "tasks[0].resources.memory", "needs a unit"},
      {"memory unitless string", [](Json& j) { j["tasks"][0]["resources"]["memory"] = "1024"; },
       "tasks[0].resources.memory", "needs a unit"},
      {"memory bad unit", [](Json& j) { j["tasks"][0]["resources"]["memory"] = "8GB"; },
       "tasks[0].resources.memory", "unknown unit 'GB'"},
      {"memory negative", [](Json& j) { j["tasks"][0]["resources"]["memory"] = "-8Gi"; },
       "tasks[0].resources.memory", "must be an amount with a unit"},
      {"memory absurd", [](Json& j) { j["tasks"][0]["resources"]["memory"] = "1000Ti"; },
       "tasks[0].resources.memory", "at most 64Ti"},
      {"gpu 1.5", [](Json& j) { j["tasks"][0]["resources"]["gpu"] = 1.5; }, "tasks[0].resources.gpu",
       "must be below 1 (a share of one GPU) or a whole number of GPUs, got 1.5"},
      {"gpu negative", [](Json& j) { j["tasks"][0]["resources"]["gpu"] = -1; }, "tasks[0].resources.gpu",
       "must not be negative, got -1"},
      {"gpu absurd", [](Json& j) { j["tasks"][0]["resources"]["gpu"] = 1e9; }, "tasks[0].resources.gpu",
       "at most 64 GPUs, got 1000000000"},
      {"gpu tiny", [](Json& j) { j["tasks"][0]["resources"]["gpu"] = 0.0004; }, "tasks[0].resources.gpu",
       "at least 0.001"},
      {"gpuMemory without gpu",
       [](Json& j) {
         j["tasks"][0]["resources"].erase("gpu");
         j["tasks"][0]["resources"].erase("gpuModels");
         j["tasks"][0]["isolation"] = "exclusive";
       },
       "tasks[0].resources.gpuMemory", "needs gpu"},
      {"gpuModels without gpu",
       [](Json& j) {
         j["tasks"][0]["resources"].erase("gpu");
         j["tasks"][0]["resources"].erase("gpuMemory");
       },
       "tasks[0].resources.gpuModels", "needs gpu"},
      {"gpuModels empty name", [](Json& j) { j["tasks"][0]["resources"]["gpuModels"][0] = ""; },
       "tasks[0].resources.gpuModels[0]", "must not be empty"},
      {"gpuInterconnect unknown", [](Json& j) { j["tasks"][0]["resources"]["gpuInterconnect"] = "pcie"; },
       "tasks[0].resources.gpuInterconnect", "must be \"any\" or \"nvlink\", got 'pcie'"},
      {"gpuInterconnect not a string", [](Json& j) { j["tasks"][0]["resources"]["gpuInterconnect"] = true; },
       "tasks[0].resources.gpuInterconnect", "expected a string, got boolean"},
      {"gpuInterconnect nvlink on a share",
       [](Json& j) { j["tasks"][0]["resources"]["gpuInterconnect"] = "nvlink"; },
       "tasks[0].resources.gpuInterconnect", "needs gpu of 2 or more"},
      {"gpuInterconnect nvlink on one GPU",
       [](Json& j) {
         j["tasks"][0]["resources"]["gpu"] = 1;
         j["tasks"][0]["resources"]["gpuInterconnect"] = "nvlink";
       },
       "tasks[0].resources.gpuInterconnect", "needs gpu of 2 or more (the link joins the task's GPUs), got 1"},
      {"gpuMemory with mig",
       [](Json& j) {
         j["tasks"][0]["resources"].erase("gpu");
         j["tasks"][0]["resources"]["migProfile"] = "3g.40gb";
         j["tasks"][0]["isolation"] = "mig";
       },
       "tasks[0].resources.gpuMemory", "cannot be combined with migProfile"},
      {"mig with 2 gpus",
       [](Json& j) {
         j["tasks"][0]["resources"]["gpu"] = 2;
         j["tasks"][0]["resources"].erase("gpuMemory");
         j["tasks"][0]["resources"]["migProfile"] = "3g.40gb";
       },
       "tasks[0].resources.gpu", "must be 1 or absent with migProfile"},
      {"bad mig profile", [](Json& j) { j["tasks"][0]["resources"]["migProfile"] = "big"; },
       "tasks[0].resources.migProfile", "must be a MIG profile"},
      // Isolation against the request.
      {"exclusive with a share", [](Json& j) { j["tasks"][0]["isolation"] = "exclusive"; },
       "tasks[0].isolation", "'exclusive' needs whole GPUs"},
      {"mig without profile", [](Json& j) { j["tasks"][0]["isolation"] = "mig"; }, "tasks[0].isolation",
       "'mig' needs resources.migProfile"},
      {"profile without mig isolation",
       [](Json& j) {
         j["tasks"][0]["resources"].erase("gpu");
         j["tasks"][0]["resources"].erase("gpuMemory");
         j["tasks"][0]["resources"]["migProfile"] = "3g.40gb";
       },
       "tasks[0].isolation", "runs with isolation 'mig', not 'timeslice'"},
      {"mps on a cpu task",
       [](Json& j) {
         j["tasks"][0]["resources"] = {{"cpu", 1}};
         j["tasks"][0]["isolation"] = "mps";
       },
       "tasks[0].isolation", "'mps' applies to GPU shares"},
      // Exec.
      {"env name", [](Json& j) { j["tasks"][0]["env"]["1A"] = "x"; }, "tasks[0].env", "variable name '1A'"},
      {"env reserved", [](Json& j) { j["tasks"][0]["env"]["CUDA_VISIBLE_DEVICES"] = "0,1"; },
       "tasks[0].env.CUDA_VISIBLE_DEVICES", "set by gpupool"},
      {"env reserved prefix", [](Json& j) { j["tasks"][0]["env"]["GPUPOOL_GPU_UUIDS"] = "x"; },
       "tasks[0].env.GPUPOOL_GPU_UUIDS", "set by gpupool"},
      {"env NUL", [](Json& j) { j["tasks"][0]["env"]["A"] = std::string("a\0b", 3); }, "tasks[0].env.A",
       "NUL"},
      {"arg too long", [](Json& j) { j["tasks"][0]["command"][0] = std::string(5000, 'x'); },
       "tasks[0].command[0]", "over the limit of 4096"},
      {"too many args", [](Json& j) { j["tasks"][0]["command"] = std::vector<std::string>(1025, "x"); },
       "tasks[0].command", "1025 entries, over the limit of 1024"},
      {"bundle and rootfs", [](Json& j) { j["tasks"][0]["container"]["rootfs"] = "/r"; },
       "tasks[0].container", "takes one of image, bundle or rootfs"},
      {"image and bundle", [](Json& j) { j["tasks"][0]["container"]["image"] = "oci:/srv/i:1"; },
       "tasks[0].container", "takes one of image, bundle or rootfs"},
      {"no root at all", [](Json& j) { j["tasks"][0]["container"] = Json{{"network", "host"}}; },
       "tasks[0].container", "needs an image, a bundle or a rootfs"},
      {"image transport", [](Json& j) { j["tasks"][0]["container"] = Json{{"image", "file:/etc/passwd"}}; },
       "tasks[0].container.image", "must start with oci:, oci-archive:, docker-archive: or docker://"},
      {"image relative", [](Json& j) { j["tasks"][0]["container"] = Json{{"image", "oci:srv/i"}}; },
       "tasks[0].container.image", "'oci:srv/i': the path must be absolute"},
      {"image dotdot", [](Json& j) { j["tasks"][0]["container"] = Json{{"image", "oci:/srv/../etc:x"}}; },
       "tasks[0].container.image", "'.' or '..'"},
      {"image option", [](Json& j) { j["tasks"][0]["container"] = Json{{"image", "oci:/srv/-x"}}; },
       "tasks[0].container.image", "may start with '-'"},
      {"image space", [](Json& j) { j["tasks"][0]["container"] = Json{{"image", "docker://a b"}}; },
       "tasks[0].container.image", "without spaces"},
      {"image long", [](Json& j) { j["tasks"][0]["container"] = Json{{"image", "docker://" + std::string(1100, 'a')}}; },
       "tasks[0].container.image", "over the limit of 1024"},
      {"image number", [](Json& j) { j["tasks"][0]["container"] = Json{{"image", 7}}; },
       "tasks[0].container.image", "string"},
      {"relative bundle", [](Json& j) { j["tasks"][0]["container"]["bundle"] = "b"; },
       "tasks[0].container.bundle", "absolute path"},
      {"interval without dir", [](Json& j) { j["tasks"][0]["checkpoint"].erase("dir"); },
       "tasks[0].checkpoint.dir", "is required when intervalSeconds is set"},
      {"interval negative", [](Json& j) { j["tasks"][0]["checkpoint"]["intervalSeconds"] = -5; },
       "tasks[0].checkpoint.intervalSeconds", "between 0 and"},
      // Gang.
      {"minAvailable zero", [](Json& j) { j["gang"]["minAvailable"] = 0; }, "gang.minAvailable",
       "between 1 and the task count 2, got 0"},
      {"minAvailable over", [](Json& j) { j["gang"]["minAvailable"] = 3; }, "gang.minAvailable",
       "between 1 and the task count 2, got 3"},
      {"minAvailable string", [](Json& j) { j["gang"]["minAvailable"] = "all"; }, "gang.minAvailable",
       "expected an integer"},
      // Labels and affinity.
      {"label key", [](Json& j) { j["labels"]["-x"] = "y"; }, "labels", "label name '-x'"},
      {"label value", [](Json& j) { j["labels"]["app"] = "a b"; }, "labels", "has value 'a b'"},
      {"label prefix", [](Json& j) { j["labels"]["Example.com/x"] = "y"; }, "labels", "label name"},
      {"too many labels",
       [](Json& j) {
         for (int i = 0; i < 65; ++i) j["labels"][fmt::format("l{}", i)] = "v";
       },
       "labels", "over the limit of 64"},
      {"operator unknown", [](Json& j) { j["affinity"]["nodeAffinity"][0]["operator"] = "Gt"; },
       "affinity.nodeAffinity[0].operator", "must be In, NotIn, Exists or DoesNotExist, got 'Gt'"},
      {"operator missing", [](Json& j) { j["affinity"]["nodeAffinity"][0].erase("operator"); },
       "affinity.nodeAffinity[0].operator", "is required"},
      {"In without values", [](Json& j) { j["affinity"]["nodeAffinity"][0].erase("values"); },
       "affinity.nodeAffinity[0].values", "In needs at least one value"},
      {"Exists with values", [](Json& j) { j["affinity"]["nodeAffinity"][0]["operator"] = "Exists"; },
       "affinity.nodeAffinity[0].values", "Exists takes no values"},
      {"requirement key", [](Json& j) { j["affinity"]["nodeAffinity"][0]["key"] = ""; },
       "affinity.nodeAffinity[0].key", "is not a label name"},
      {"empty together term", [](Json& j) { j["affinity"]["togetherWith"][0] = Json::object(); },
       "affinity.togetherWith[0]", "at least one label"},
      {"apart term label",
       [](Json& j) {
         j["affinity"]["apartFrom"][0] = {{"app", "a/b"}};
       },
       "affinity.apartFrom[0]", "has value 'a/b'"},
      {"selector value", [](Json& j) { j["affinity"]["nodeSelector"]["zone"] = 1; }, "affinity.nodeSelector",
       "must have a string value"},
      // Retry policy.
      {"unknown retry", [](Json& j) { j["retry"] = {{"limit", 3}}; }, "retry.limit",
       "unknown field (known: maxRestarts, backoffSeconds, maxBackoffSeconds, onFailure)"},
      {"negative restarts", [](Json& j) { j["retry"] = {{"maxRestarts", -1}}; }, "retry.maxRestarts", ""},
      {"onFailure string", [](Json& j) { j["retry"] = {{"onFailure", "yes"}}; }, "retry.onFailure",
       "must be true or false"},
      {"max below base", [](Json& j) { j["retry"] = {{"backoffSeconds", 10}, {"maxBackoffSeconds", 5}}; },
       "retry.maxBackoffSeconds", "at least backoffSeconds (10)"},
      // The document.
      {"not an object", [](Json& j) { j = Json::array({1}); }, "", "expected an object, got array"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    Json spec = BaseSpec();
    c.breaks(spec);
    EXPECT_TRUE(Refused(ParseJobSpec(spec.dump(), SpecFormat::kJson), c.field, c.needle));
  }
}

struct TextCase {
  std::string what;
  SpecFormat format;
  std::string text;
  std::string field;
  std::string needle;
};

TEST(JobSpec, BadTextsNameTheirField) {
  const std::string deep_json = std::string(40, '[') + std::string(40, ']');
  std::string deep_path = "tasks";  // the 32nd container opens at tasks[0]...[0] (31 indices)
  for (int i = 0; i < 31; ++i) deep_path += "[0]";
  const std::vector<TextCase> cases = {
      {"malformed JSON", SpecFormat::kJson, "{\"name\": \"j\",\n \"tasks\": [}", "",
       "malformed JSON: parse error at line 2, column 12"},
      {"empty JSON", SpecFormat::kJson, "", "", "malformed JSON"},
      {"trailing garbage", SpecFormat::kJson, "{} x", "", "malformed JSON"},
      {"JSON duplicate key", SpecFormat::kJson, R"({"name": "a", "tasks": [{"name": "t", "name": "u"}]})",
       "tasks[0].name", "duplicate field"},
      {"JSON duplicate top key", SpecFormat::kJson, R"({"name": "a", "name": "b"})", "name",
       "duplicate field"},
      {"JSON deep", SpecFormat::kJson, R"({"name": "a", "tasks": )" + deep_json + "}", deep_path,
       "nested deeper than 32 levels"},
      {"malformed YAML", SpecFormat::kYaml, "name: j\ntasks: [\n  {name: t}\n", "", "malformed YAML at line"},
      {"YAML bad indentation", SpecFormat::kYaml, "name: j\n  tasks: x\n", "", "malformed YAML at line 2"},
      {"empty YAML", SpecFormat::kYaml, "", "", "is empty"},
      {"YAML comment only", SpecFormat::kYaml, "# nothing\n", "", "is empty"},
      {"YAML two documents", SpecFormat::kYaml, "name: a\n---\nname: b\n", "", "a second YAML document"},
      // yaml-cpp reports empty documents without end after this (LoadAll() never returned; fuzzer).
      {"YAML text after a flow map", SpecFormat::kYaml, "{},", "", "a second YAML document"},
      {"YAML text after a flow map 2", SpecFormat::kYaml, "{\"name\": \"j\"},\n", "",
       "a second YAML document"},
      {"YAML scalar document", SpecFormat::kYaml, "just text", "", "expected an object, got string"},
      {"YAML duplicate key", SpecFormat::kYaml, "name: a\ntasks: [{name: t}]\nname: b\n", "name",
       "duplicate field"},
      {"YAML quoted gpu", SpecFormat::kYaml, "name: j\ntasks: [{name: t, resources: {gpu: \"0.25\"}}]",
       "tasks[0].resources.gpu", "expected a number, got string '0.25'"},
      {"YAML nan gpu", SpecFormat::kYaml, "name: j\ntasks: [{name: t, resources: {gpu: .nan}}]",
       "tasks[0].resources.gpu", "finite"},
      {"YAML inf cpu", SpecFormat::kYaml, "name: j\ntasks: [{name: t, resources: {cpu: .inf}}]",
       "tasks[0].resources.cpu", "finite"},
      {"YAML unquoted env number", SpecFormat::kYaml, "name: j\ntasks: [{name: t, env: {PORT: 8080}}]",
       "tasks[0].env.PORT", "expected a string, got integer 8080 (quote it in YAML)"},
      {"YAML bool name", SpecFormat::kYaml, "name: true\ntasks: [{name: t}]", "name", "got boolean true"},
      {"YAML custom tag", SpecFormat::kYaml, "name: !secret j\ntasks: [{name: t}]", "name",
       "unsupported YAML tag"},
      {"YAML complex key", SpecFormat::kYaml, "? [a]\n: b\n", "", "member name must be a plain string"},
      {"YAML deep", SpecFormat::kYaml, "name: j\ntasks: " + deep_json, deep_path,
       "nested deeper than 32 levels"},
      {"YAML bad UTF-8", SpecFormat::kYaml, "name: j\ntasks: [{name: t, command: [\"\xff\xfe\"]}]",
       "tasks[0].command[0]", "not valid UTF-8"},
  };
  for (const TextCase& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_TRUE(Refused(ParseJobSpec(c.text, c.format), c.field, c.needle));
  }
}

// The server sends messages in JSON bodies, so they must be valid UTF-8 whatever the input held.
// (Found by the fuzzer: nlohmann's parse errors quote the raw bytes they stopped at.)
TEST(JobSpec, ErrorMessagesAreValidUtf8) {
  const std::vector<std::pair<std::string, SpecFormat>> inputs = {
      {"{\"name\": \"j\", \"tasks\": [{\"name\": \"\xff\xfe\"}]}", SpecFormat::kJson},
      {"{\"name\": \"\xe2\x82\"}", SpecFormat::kJson},
      {"name: !\xff j\ntasks: []", SpecFormat::kYaml},
      {"name: j\ntasks: [{name: t, isolation: " + std::string(39, 'x') + "\xe2\x82\xac}]", SpecFormat::kYaml},
  };
  for (const auto& [text, format] : inputs) {
    Result<Job> job = ParseJobSpec(text, format);
    ASSERT_FALSE(job.ok());
    EXPECT_NO_THROW((void)Json(job.status().message()).dump()) << job.status().message();
  }
}

TEST(JobSpec, BodyOverMaxBytesIsRefusedBeforeParsing) {
  JobSpecLimits limits;
  limits.max_bytes = 64;
  const std::string text = R"({"name": "j", "tasks": [{"name": "t"}], "labels": {"a": "b", "c": "d"}})";
  ASSERT_GT(text.size(), 64u);
  EXPECT_TRUE(Refused(ParseJobSpec(text, SpecFormat::kJson, limits), "", "over the limit of 64"));
  EXPECT_TRUE(Refused(ParseJobSpec(text, SpecFormat::kYaml, limits), "", "over the limit of 64"));
  EXPECT_TRUE(ParseJobSpec(text, SpecFormat::kJson).ok());
}

TEST(JobSpec, YamlAliasBombIsRefused) {
  // Each level doubles the tree: 2^30 values from a few hundred bytes.
  std::string text = "a0: &a0 [x, x]\n";
  for (int i = 1; i <= 30; ++i) {
    text += fmt::format("a{0}: &a{0} [*a{1}, *a{1}]\n", i, i - 1);
  }
  EXPECT_TRUE(Refused(ParseJobSpec(text, SpecFormat::kYaml), "", "expands to more than 200000 values"));
  // Long strings repeated through aliases hit the byte budget.
  std::string wide = "s: &s " + std::string(100000, 'x') + "\nl: [";
  for (int i = 0; i < 60; ++i) wide += "*s, ";
  wide += "*s]\n";
  EXPECT_TRUE(Refused(ParseJobSpec(wide, SpecFormat::kYaml), "", "more than 4194304 bytes"));
}

TEST(JobSpec, YamlAliasesWithinLimitsWork) {
  const Job job = MustParse(R"(
name: j
labels: &l {app: web}
affinity: {apartFrom: [*l]}
tasks:
  - name: a
    env: &env {MODE: prod}
  - name: b
    env: *env
)",
                            SpecFormat::kYaml);
  ASSERT_EQ(job.groups.size(), 2u);
  EXPECT_EQ(job.groups[1].exec.env, job.groups[0].exec.env);
  ASSERT_EQ(job.affinity.apart_from.size(), 1u);
  EXPECT_EQ(job.affinity.apart_from[0], job.labels);
}

TEST(JobSpec, ErrorFieldSplitsThePath) {
  EXPECT_EQ(ErrorField(Status::InvalidArgument("tasks[0].resources.gpu: bad")), "tasks[0].resources.gpu");
  EXPECT_EQ(ErrorField(Status::InvalidArgument("spec: malformed JSON: x: y")), "");
  EXPECT_EQ(ErrorField(Status::InvalidArgument("node 'a': cpu: bad")), "");
  EXPECT_EQ(ErrorField(Status::InvalidArgument("no colon")), "");
  EXPECT_EQ(ErrorField(Status::NotFound("name: x")), "");
  EXPECT_EQ(ErrorField(Status::Ok()), "");
}

TEST(JobSpec, MinAvailableOfAllIsStoredAsZero) {
  const Job all =
      MustParse(R"({"name": "j", "gang": {"minAvailable": 3}, "tasks": [{"name": "t", "replicas": 3}]})",
                SpecFormat::kJson);
  EXPECT_EQ(all.min_available, 0);
  const Job some =
      MustParse(R"({"name": "j", "gang": {"minAvailable": 2}, "tasks": [{"name": "t", "replicas": 3}]})",
                SpecFormat::kJson);
  EXPECT_EQ(some.min_available, 2);
  EXPECT_EQ(JobSpecToJson(all)["gang"]["minAvailable"], 3);
}

TEST(JobSpec, CanonicalForm) {
  const Json j = JobSpecToJson(ExpectedResnet());
  EXPECT_EQ(j["tasks"][0]["resources"]["cpu"], "2");
  EXPECT_EQ(j["tasks"][0]["resources"]["memory"], "8Gi");
  EXPECT_EQ(j["tasks"][0]["resources"]["gpu"], 0.25);
  EXPECT_EQ(j["tasks"][0]["resources"]["gpuMemory"], "10Gi");
  EXPECT_EQ(j["tasks"][0]["isolation"], "mps");
  EXPECT_EQ(j["qos"], "guaranteed");
  EXPECT_EQ(j["gang"]["minAvailable"], 4);
  EXPECT_FALSE(j.contains("id"));
  // The nodeSelector shorthand is written out as requirements.
  EXPECT_FALSE(j["affinity"].contains("nodeSelector"));
  EXPECT_EQ(j["affinity"]["nodeAffinity"].size(), 2u);

  const Job minimal =
      MustParse(R"({"name": "j", "tasks": [{"name": "t", "resources": {"gpu": 2}}]})", SpecFormat::kJson);
  const Json m = JobSpecToJson(minimal);
  EXPECT_EQ(m["tasks"][0]["resources"]["gpu"], 2);
  EXPECT_TRUE(m["tasks"][0]["resources"]["gpu"].is_number_integer());
  EXPECT_EQ(m["priority"], 0);
  EXPECT_EQ(m["qos"], "burstable");
  EXPECT_EQ(m["tasks"][0]["isolation"], "exclusive");
  EXPECT_EQ(m["labels"], Json::object());
  EXPECT_EQ(m["tasks"][0]["command"], Json::array());
  EXPECT_FALSE(m.contains("tenant"));
  EXPECT_FALSE(m["tasks"][0].contains("checkpoint"));
}

// ---- round trip -------------------------------------------------------------------------------

// ParseJobSpec(JobSpecToJson(j)) == j, and the canonical form is a fixed point.
::testing::AssertionResult RoundTrips(const Job& job) {
  const Json canonical = JobSpecToJson(job);
  const std::string text = canonical.dump();
  for (SpecFormat format : {SpecFormat::kJson, SpecFormat::kYaml}) {
    Result<Job> again = ParseJobSpec(text, format);
    if (!again.ok()) return ::testing::AssertionFailure() << again.status().ToString() << "\n" << text;
    if (!SameJobSpec(job, *again)) {
      return ::testing::AssertionFailure()
             << "differs after the round trip:\n  " << text << "\n  " << JobSpecToJson(*again).dump();
    }
    if (JobSpecToJson(*again) != canonical) return ::testing::AssertionFailure() << "canonical form moved";
  }
  return ::testing::AssertionSuccess();
}

TEST(JobSpec, RoundTripOverSpecs) {
  const std::vector<std::pair<std::string, SpecFormat>> specs = {
      {kResnetYaml, SpecFormat::kYaml},
      {kResnetJson, SpecFormat::kJson},
      {R"({"name": "j", "tasks": [{"name": "t"}]})", SpecFormat::kJson},
      {"name: m\nqos: guaranteed\ntasks: [{name: t, resources: {migProfile: 1g.10gb, gpuModels: "
       "[A100-80GB]}}]",
       SpecFormat::kYaml},
      {"name: s\ntasks: [{name: a, replicas: 3, resources: {gpu: 0.001}}, {name: b, resources: {gpu: "
       "0.999}}]\n"
       "gang: {minAvailable: 2}",
       SpecFormat::kYaml},
      {"name: w\ntasks: [{name: t, resources: {gpu: 8, cpu: '2.125', memory: 1G}, isolation: timeslice}]",
       SpecFormat::kYaml},
      {"name: e\naffinity: {nodeAffinity: [{key: example.com/rack, operator: NotIn, values: ['', r1]},"
       " {key: gpu, operator: Exists}]}\ntasks: [{name: t, env: {'a.b-c': \"line\\nbreak \\u00e9\"}}]",
       SpecFormat::kYaml},
      {"name: c\ntasks: [{name: t, checkpoint: {dir: /c}}]", SpecFormat::kYaml},
      {"name: w\ntasks: [{name: t, workingDir: /data/run-1, command: [./train]}]", SpecFormat::kYaml},
      {"name: l\ntimeLimit: 2d\ntasks: [{name: t}]", SpecFormat::kYaml},
      {"name: v\ntasks: [{name: t, container: {image: 'oci:/srv/i:1'}, checkpoint: {dir: /ck},\n"
       "  volumes: [{hostPath: /srv/data}, {hostPath: /srv/out, mountPath: /out, readOnly: false},\n"
       "            {scratch: {}, mountPath: /scratch}, {scratch: {medium: memory, sizeLimit: 2Gi}, mountPath: /m},\n"
       "            {scratch: {medium: disk}, mountPath: /ck2}]}]",
       SpecFormat::kYaml},
      {"name: d\ndependsOn: [{job: j-000000000007}, {job: j-8, condition: ended}]\ntasks: [{name: t}]",
       SpecFormat::kYaml},
      {"name: n\ntasks: [{name: t, resources: {gpu: 4, gpuInterconnect: nvlink}}]", SpecFormat::kYaml},
      {"name: f\ntasks: [{name: t, resources: {gpu: 0.5}, framework: jax}, {name: u, framework: none}]",
       SpecFormat::kYaml},
      {"name: p\npriority: -1000000\ntenant: t1\nqueue: q.1\ntasks: [{name: t}]", SpecFormat::kYaml},
  };
  for (const auto& [text, format] : specs) {
    SCOPED_TRACE(text);
    Result<Job> job = ParseJobSpec(text, format);
    ASSERT_TRUE(job.ok()) << job.status().ToString();
    EXPECT_TRUE(RoundTrips(*job));
  }
}

// Random valid Jobs, built to the rules ParseJobSpec enforces.
class JobGenerator {
 public:
  explicit JobGenerator(uint32_t seed) : rng_(seed) {}

  Job Make() {
    Job job;
    job.name = Name();
    if (Coin()) job.tenant = Name();
    if (Coin()) job.queue = Name();
    job.priority = Int(-1000000, 1000000);
    job.qos = static_cast<QosClass>(Int(0, 2));
    job.labels = Labels(Int(0, 3));
    const int groups = Int(1, 4);
    for (int i = 0; i < groups; ++i) job.groups.push_back(Group(i));
    const int tasks = job.task_count();
    job.min_available = tasks > 1 && Coin() ? Int(1, tasks - 1) : 0;
    for (int i = Int(0, 2); i > 0; --i) {
      LabelRequirement req;
      req.key = LabelKey();
      req.op = static_cast<LabelRequirement::Op>(Int(0, 3));
      if (req.op == LabelRequirement::Op::kIn || req.op == LabelRequirement::Op::kNotIn) {
        for (int k = Int(1, 3); k > 0; --k) req.values.push_back(Coin() ? LabelValue() : "");
      }
      job.affinity.node.push_back(std::move(req));
    }
    for (int i = Int(0, 2); i > 0; --i) job.affinity.together_with.push_back(Labels(Int(1, 2)));
    for (int i = Int(0, 2); i > 0; --i) job.affinity.apart_from.push_back(Labels(Int(1, 2)));
    DeriveSharing(job);  // what reading the spec derives
    return job;
  }

 private:
  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool Coin() { return Int(0, 1) == 1; }

  std::string From(std::string_view alphabet, int n) {
    std::string s;
    for (int i = 0; i < n; ++i)
      s += alphabet[static_cast<size_t>(Int(0, static_cast<int>(alphabet.size()) - 1))];
    return s;
  }
  std::string Name() {
    const int n = Int(1, 63);
    if (n == 1) return From("abcdefghijklmnopqrstuvwxyz0123456789", 1);
    return From("abcdefghijklmnopqrstuvwxyz0123456789", 1) +
           From("abcdefghijklmnopqrstuvwxyz0123456789-._", n - 2) +
           From("abcdefghijklmnopqrstuvwxyz0123456789", 1);
  }
  std::string LabelValue() {
    const int n = Int(1, 20);
    const std::string_view alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    if (n == 1) return From(alnum, 1);
    return From(alnum, 1) + From("abcXYZ019-_.", n - 2) + From(alnum, 1);
  }
  std::string LabelKey() { return Coin() ? LabelValue() : "example.com/" + LabelValue(); }
  std::map<std::string, std::string> Labels(int n) {
    std::map<std::string, std::string> labels;
    for (int i = 0; i < n; ++i) labels[LabelKey()] = Coin() ? LabelValue() : "";
    return labels;
  }
  // Any text without NUL, including quotes, backslashes, newlines and non-ASCII.
  std::string Text() {
    static const std::vector<std::string> pieces = {"a",
                                                    "Z",
                                                    "0",
                                                    " ",
                                                    "\"",
                                                    "'",
                                                    "\\",
                                                    "\n",
                                                    "\t",
                                                    ":",
                                                    "-",
                                                    "#",
                                                    "{",
                                                    "[",
                                                    "&",
                                                    "*",
                                                    "!",
                                                    "%",
                                                    "\xc3\xa9",
                                                    "\xe2\x82\xac",
                                                    "\xf0\x9f\x9a\x80",
                                                    "null",
                                                    "true",
                                                    "1.5",
                                                    "~"};
    std::string s;
    for (int i = Int(0, 12); i > 0; --i)
      s += pieces[static_cast<size_t>(Int(0, static_cast<int>(pieces.size()) - 1))];
    return s;
  }

  TaskGroup Group(int index) {
    TaskGroup g;
    g.name = Name().substr(0, 55) + "-" + std::to_string(index);  // unique within the job
    g.replicas = Int(1, 5);
    TaskRequest& r = g.request;
    r.cpu = MilliCpu(Int(0, 64000));
    r.memory = MiB(Int(0, 1 << 20));
    switch (Int(0, 3)) {
      case 0: g.exec.isolation = IsolationMode::kExclusive; break;  // CPU only
      case 1:                                                       // a share of one GPU
        r.gpu_count = 1;
        r.gpu_share = MilliGpu(Int(1, 999));
        g.exec.isolation = Coin() ? IsolationMode::kMps : IsolationMode::kTimeslice;
        break;
      case 2:  // whole GPUs
        r.gpu_count = Int(1, 64);
        r.gpu_share = kWholeGpu;
        r.nvlink = r.gpu_count >= 2 && Coin();
        g.exec.isolation =
            static_cast<IsolationMode>(std::vector<int>{0, 1, 3}[static_cast<size_t>(Int(0, 2))]);
        break;
      default:  // a MIG instance
        r.gpu_count = 1;
        r.mig_profile = std::vector<std::string>{"1g.10gb", "3g.40gb", "1g.10gb+me", "7g",
                                                 "2g.35gb"}[static_cast<size_t>(Int(0, 4))];
        g.exec.isolation = IsolationMode::kMig;
        break;
    }
    if (r.wants_gpu() && !r.wants_mig() && Coin()) r.gpu_memory = MiB(Int(1, 200000));
    if (r.wants_gpu() && Coin()) r.gpu_models = {"A100-80GB", Text() + "x"};
    for (int i = Int(0, 4); i > 0; --i) g.exec.command.push_back(Text());
    for (int i = Int(0, 3); i > 0; --i)
      g.exec.env[From("ABC_xyz.-", 1) + From("ABC_019.-", Int(0, 8))] = Text();
    switch (Int(0, 3)) {
      case 1: g.exec.bundle = "/" + Text(); break;
      case 2: g.exec.rootfs = "/" + Text(); break;
      case 3: g.exec.image = Coin() ? "docker://registry.example:5000/team/" + From("abc019", 1) + ":v1" : "oci:/srv/i:t"; break;
      default: break;
    }
    if (!g.exec.image.empty() || !g.exec.bundle.empty() || !g.exec.rootfs.empty())
      g.exec.runtime_class = std::vector<std::string>{"", "crun", "runsc", "kata"}[static_cast<size_t>(Int(0, 3))];
    if (Coin()) g.exec.checkpoint = {"/ckpt/" + Text(), Int(0, 86400)};
    if (!g.exec.image.empty() || !g.exec.bundle.empty() || !g.exec.rootfs.empty()) {
      for (int i = Int(0, 3); i > 0; --i) {
        Volume v;
        v.mount_path = "/vol/" + std::to_string(i) + From("abc019_-", Int(0, 6));
        switch (Int(0, 2)) {
          case 0: v.host_path = "/srv/" + From("abc019_-.", 1) + "x"; v.read_only = Coin(); break;
          case 1: v.read_only = false; break;
          default: v.read_only = false; v.memory = true; v.size_bytes = Int(1, 4096) * (int64_t{1} << 20); break;
        }
        g.exec.volumes.push_back(std::move(v));
      }
    }
    g.exec.framework = static_cast<Framework>(Int(0, 4));  // kAuto .. kNone
    return g;
  }

  std::mt19937 rng_;
};

TEST(JobSpec, RoundTripOverRandomJobs) {
  JobGenerator gen(20261202);
  for (int i = 0; i < 300; ++i) {
    const Job job = gen.Make();
    ASSERT_TRUE(ValidateJob(job).ok()) << ValidateJob(job).ToString();
    ASSERT_TRUE(RoundTrips(job)) << "job " << i;
  }
}

// ---- the example files ------------------------------------------------------------------------

TEST(JobSpec, EveryExampleFileParses) {
  const std::filesystem::path dir = std::filesystem::path(GPUPOOL_DATA_DIR) / ".." / "examples" / "jobs";
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".yaml" && ext != ".yml" && ext != ".json") continue;
    SCOPED_TRACE(entry.path().string());
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    Result<Job> job = ParseJobSpec(text.str(), ext == ".json" ? SpecFormat::kJson : SpecFormat::kYaml);
    ASSERT_TRUE(job.ok()) << job.status().ToString();
    EXPECT_EQ(job->name + ext, entry.path().filename().string()) << "file name and job name differ";
    EXPECT_TRUE(RoundTrips(*job));
    ++files;
  }
  EXPECT_GE(files, 3);
}

TEST(JobSpec, ResnetExampleFileIsTheIssuesSpec) {
  const std::filesystem::path file =
      std::filesystem::path(GPUPOOL_DATA_DIR) / ".." / "examples" / "jobs" / "resnet50-infer.yaml";
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_TRUE(SameJob(MustParse(text.str(), SpecFormat::kYaml), ExpectedResnet()));
}

}  // namespace
}  // namespace gpupool
