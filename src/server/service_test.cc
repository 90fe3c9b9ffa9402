// PoolService without HTTP: the job lifecycle, gangs, preemption, reservations, affinity, and
// recovery from the store. Cycles are driven by RunCycle(), so every step is deterministic.
#include "server/service.h"
#include "server/watches.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <future>
#include <mutex>
#include <filesystem>
#include <string>
#include <thread>

#include "server/service_test_util.h"
#include "store/sqlite_store.h"

namespace gpupool {
namespace {

using nlohmann::json;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/gpupool-service-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

const Principal kAdmin{"", Role::kAdmin};
const Principal kVision{"vision", Role::kTenant};
const Principal kNlp{"nlp", Role::kTenant};

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.data_dir = dir_.path();
    config_.profile = "bestfit";
    config_.grace_period_seconds = 30;
    config_.reserve_after_seconds = 0;
    config_.sync_full = false;
    Open();
  }
  void Open() {
    service_.reset();
    auto s = testing_util::OpenServiceIn(dir_.path(), config_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    service_ = std::move(s).value();
  }
  // As an agent that holds shares to their size registers: the CUDA limiter and MPS limits (a
  // guaranteed share then shares a GPU; qos_sharing_test.cc has nodes without).
  void AddNode(const std::string& name, int gpus, const std::string& model = "A100-80GB",
               json labels = json::object()) {
    labels["gpupool.io/enforce-limiter"] = "true";
    labels["gpupool.io/enforce-mps"] = "true";
    json body = {{"name", name}, {"cpu", "64"}, {"memory", "512Gi"}, {"labels", labels}};
    json g = json::array();
    for (int i = 0; i < gpus; ++i) g.push_back({{"index", i}, {"model", model}});
    body["gpus"] = g;
    auto r = service_->RegisterNode(body);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  std::string Submit(const Principal& who, const std::string& yaml) {
    auto r = service_->SubmitJob(who, yaml, SpecFormat::kYaml);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? (*r)["id"].get<std::string>() : "";
  }
  json Get(const std::string& id) {
    auto r = service_->GetJob(kAdmin, id);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : json();
  }
  std::string State(const std::string& id) { return Get(id)["state"].get<std::string>(); }
  void Report(const std::string& id, int index, const std::string& state, int exit_code = 0) {
    const json job = Get(id);
    const std::string node = job["tasks"][static_cast<size_t>(index)]["node"];
    auto r = service_->ReportTask(node, id, index, {{"state", state}, {"exitCode", exit_code}});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  void ExpectConsistent() {
    Status st = service_->CheckInvariants();
    EXPECT_TRUE(st.ok()) << st.ToString();
    for (const auto& g : service_->GpuUsage()) {
      EXPECT_LE(g.granted_share, 1000) << g.node << "/" << g.gpu;
      EXPECT_LE(g.granted_memory, g.capacity_memory) << g.node << "/" << g.gpu;
      EXPECT_EQ(g.granted_share, g.ledger_used_share) << g.node << "/" << g.gpu;
    }
  }

  TempDir dir_;
  ServerConfig config_;
  std::unique_ptr<PoolService> service_;
};

constexpr char kQuarter[] = R"(
name: infer
qos: guaranteed
tasks:
  - name: server
    replicas: 4
    resources: {cpu: 2, memory: 8Gi, gpu: 0.25, gpuMemory: 10Gi}
    framework: pytorch
    command: [python3, serve.py]
)";

TEST_F(ServiceTest, LifecycleFromSubmitToSuccess) {
  AddNode("n1", 2);
  const std::string id = Submit(kVision, kQuarter);
  EXPECT_EQ(id, "j-000000000001");
  EXPECT_EQ(State(id), "pending");
  EXPECT_EQ(service_->RunCycle(), 1);
  json job = Get(id);
  EXPECT_EQ(job["state"], "running");
  EXPECT_EQ(job["tenant"], "vision");
  EXPECT_EQ(job["queue"], "default");
  // Best fit packs the four quarters onto one GPU.
  for (const auto& t : job["tasks"]) {
    EXPECT_EQ(t["state"], "assigned");
    EXPECT_EQ(t["node"], "n1");
    EXPECT_EQ(t["gpus"][0]["index"], job["tasks"][0]["gpus"][0]["index"]);
    EXPECT_EQ(t["gpus"][0]["share"], 250);
  }
  auto assignments = service_->Assignments("n1");
  ASSERT_TRUE(assignments.ok());
  ASSERT_EQ((*assignments)["assignments"].size(), 4u);
  EXPECT_EQ((*assignments)["assignments"][0]["desired"], "run");
  EXPECT_EQ((*assignments)["assignments"][0]["isolation"], "mps");
  EXPECT_EQ((*assignments)["assignments"][0]["framework"], "pytorch");
  ExpectConsistent();
  for (int i = 0; i < 4; ++i) Report(id, i, "running");
  EXPECT_EQ(Get(id)["tasks"][0]["state"], "running");
  for (int i = 0; i < 4; ++i) Report(id, i, "succeeded");
  EXPECT_EQ(State(id), "succeeded");
  ExpectConsistent();
  auto events = service_->JobEvents(kAdmin, id, 0, 100);
  ASSERT_TRUE(events.ok());
  std::vector<std::string> types;
  for (const auto& e : (*events)["items"]) types.push_back(e["type"]);
  EXPECT_EQ(types.front(), "Submitted");
  EXPECT_EQ(types.back(), "Succeeded");
}

TEST_F(ServiceTest, RetentionRemovesEndedJobsWithTheirEventsAndNeverReusesTheirIds) {
  config_.finished_job_retention_seconds = 1;
  Open();
  AddNode("n1", 2);
  const std::string done = Submit(kVision, kQuarter);
  const std::string live = Submit(kVision, kQuarter);
  EXPECT_EQ(service_->RunCycle(), 2);
  for (int i = 0; i < 4; ++i) Report(done, i, "succeeded");
  const std::string cancelled = Submit(kNlp, kQuarter);
  ASSERT_TRUE(service_->CancelJob(kAdmin, cancelled).ok());
  ASSERT_EQ(State(done), "succeeded");
  ASSERT_EQ(State(cancelled), "cancelled");
  EXPECT_EQ(live, "j-000000000002");
  EXPECT_EQ(cancelled, "j-000000000003");
  // Not before the retention period has passed since their last change.
  service_->RunCycle();
  EXPECT_TRUE(service_->GetJob(kAdmin, done).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  service_->RunCycle();
  EXPECT_EQ(service_->GetJob(kAdmin, done).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(service_->GetJob(kAdmin, cancelled).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(service_->JobEvents(kAdmin, done, 0, 100).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(State(live), "running");  // a job that has not ended stays, however old
  auto list = service_->ListJobs(kAdmin, {});
  ASSERT_TRUE(list.ok());
  ASSERT_EQ((*list)["items"].size(), 1u);
  EXPECT_EQ((*list)["items"][0]["id"], live);
  EXPECT_NE(service_->MetricsText().find("gpupool_jobs_removed_total 2"), std::string::npos);
  ExpectConsistent();
  {
    // In the file: the removed jobs' events and the old cluster event (n1 registered) are gone.
    service_.reset();
    SqliteStoreOptions o;
    o.path = dir_.path() + "/gpupool.db";
    auto store = OpenSqliteStore(o);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    EXPECT_TRUE((*store)->ListEvents(done, 0, 100)->empty());
    EXPECT_TRUE((*store)->ListEvents("", 0, 100)->empty());
    EXPECT_FALSE((*store)->ListEvents(live, 0, 100)->empty());
  }

  // Gone from the store too; the newest id (the cancelled job's) is not handed out again; and
  // with retention off nothing is removed.
  config_.finished_job_retention_seconds = 0;
  Open();
  EXPECT_EQ(service_->GetJob(kAdmin, done).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(service_->GetJob(kAdmin, cancelled).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(State(live), "running");
  ExpectConsistent();
  EXPECT_EQ(Submit(kVision, kQuarter), "j-000000000004");
  for (int i = 0; i < 4; ++i) Report(live, i, "succeeded");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  service_->RunCycle();
  EXPECT_EQ(State(live), "succeeded");
}

TEST_F(ServiceTest, TenantsSeeOnlyTheirOwnJobs) {
  AddNode("n1", 1);
  const std::string id = Submit(kVision, kQuarter);
  EXPECT_EQ(service_->GetJob(kNlp, id).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(service_->CancelJob(kNlp, id).status().code(), StatusCode::kNotFound);
  auto list = service_->ListJobs(kNlp, {});
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE((*list)["items"].empty());
  EXPECT_EQ((*service_->ListJobs(kVision, {}))["items"].size(), 1u);
  // A tenant cannot submit in another tenant's name.
  auto r = service_->SubmitJob(kNlp, std::string(kQuarter) + "tenant: vision\n", SpecFormat::kYaml);
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(service_->SubmitJob({"", Role::kAgent}, kQuarter, SpecFormat::kYaml).status().code(),
            StatusCode::kPermissionDenied);
}

TEST_F(ServiceTest, BadSpecsChangeNothing) {
  AddNode("n1", 1);
  for (const char* bad :
       {"name: x\ntasks: []\n", "name: x\ntasks: [{name: a, resources: {gpu: 1.5}}]\n", "{not yaml: [",
        "name: x\nqueue: nope\ntasks: [{name: a, resources: {cpu: 1}}]\n"}) {
    auto r = service_->SubmitJob(kVision, bad, SpecFormat::kYaml);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  }
  EXPECT_TRUE((*service_->ListJobs(kAdmin, {}))["items"].empty());
  Open();  // and nothing reached the store either
  EXPECT_TRUE((*service_->ListJobs(kAdmin, {}))["items"].empty());
}

TEST_F(ServiceTest, GangWaitsWholeAndSmallJobsBackfill) {
  config_.reserve_after_seconds = 3600;  // no reservation in this test
  Open();
  AddNode("n1", 2);
  AddNode("n2", 2);
  const std::string hog = Submit(
      kAdmin, "name: hog\ntasks: [{name: w, replicas: 3, resources: {cpu: 1, memory: 1Gi, gpu: 1}}]\n");
  service_->RunCycle();
  ASSERT_EQ(State(hog), "running");
  // A gang of 2 whole GPUs cannot fit (1 GPU free); a single GPU job behind it can.
  const std::string gang = Submit(
      kAdmin, "name: gang\ntasks: [{name: w, replicas: 2, resources: {cpu: 1, memory: 1Gi, gpu: 1}}]\n");
  const std::string small =
      Submit(kAdmin, "name: small\ntasks: [{name: w, resources: {cpu: 1, memory: 1Gi, gpu: 0.5}}]\n");
  service_->RunCycle();
  EXPECT_EQ(State(gang), "pending");
  EXPECT_EQ(State(small), "running");
  json g = Get(gang);
  for (const auto& t : g["tasks"]) EXPECT_EQ(t["node"], "");  // nothing of the gang is held
  auto events = service_->JobEvents(kAdmin, gang, 0, 100);
  ASSERT_TRUE(events.ok());
  ASSERT_TRUE((*events).contains("pending"));
  EXPECT_NE((*events)["pending"]["message"].get<std::string>().find("gang needs 2"), std::string::npos)
      << (*events)["pending"].dump();
  ExpectConsistent();
}

TEST_F(ServiceTest, WaitingGangGetsNodesReserved) {
  config_.reserve_after_seconds = 0;  // reserve at once
  Open();
  AddNode("n1", 2);
  AddNode("n2", 2);
  const std::string a =
      Submit(kAdmin, "name: a\ntasks: [{name: w, resources: {cpu: 1, memory: 1Gi, gpu: 1}}]\n");
  const std::string b =
      Submit(kAdmin, "name: b\ntasks: [{name: w, resources: {cpu: 1, memory: 1Gi, gpu: 1}}]\n");
  service_->RunCycle();  // best fit: a and b share n1
  const std::string big = Submit(
      kAdmin, "name: big\ntasks: [{name: w, replicas: 4, resources: {cpu: 1, memory: 1Gi, gpu: 1}}]\n");
  service_->RunCycle();  // big cannot fit (2 GPUs free) and reserves both nodes
  const std::string filler =
      Submit(kAdmin, "name: filler\ntasks: [{name: w, resources: {cpu: 1, memory: 1Gi, gpu: 1}}]\n");
  service_->RunCycle();
  EXPECT_EQ(State(filler), "pending") << "a small job must not take the reserved GPUs";
  auto ev = service_->JobEvents(kAdmin, filler, 0, 100);
  ASSERT_TRUE(ev.ok());
  EXPECT_NE((*ev)["pending"]["message"].get<std::string>().find("reserved"), std::string::npos) << ev->dump();
  Report(a, 0, "succeeded");
  Report(b, 0, "succeeded");
  service_->RunCycle();
  EXPECT_EQ(State(big), "running");
  EXPECT_EQ(State(filler), "pending");
  ExpectConsistent();
}

TEST_F(ServiceTest, PriorityPreemptsBestEffortOnly) {
  AddNode("n1", 2);
  const std::string be = Submit(kAdmin, R"(
name: train
qos: best-effort
priority: 0
tasks: [{name: w, replicas: 2, resources: {cpu: 1, memory: 1Gi, gpu: 1}, checkpoint: {dir: /ckpt/train}}]
)");
  service_->RunCycle();
  ASSERT_EQ(State(be), "running");
  const std::string urgent = Submit(kAdmin, R"(
name: urgent
qos: guaranteed
priority: 100
tasks: [{name: w, resources: {cpu: 1, memory: 1Gi, gpu: 1}}]
)");
  service_->RunCycle();
  json victim = Get(be);
  EXPECT_EQ(victim["tasks"][0]["state"], "stopping");
  auto assignments = service_->Assignments("n1");
  ASSERT_TRUE(assignments.ok());
  EXPECT_EQ((*assignments)["assignments"][0]["desired"], "stop");
  EXPECT_EQ((*assignments)["assignments"][0]["gracePeriodSeconds"], 30);
  EXPECT_EQ(State(urgent), "pending");
  // The agent stops the victim's tasks after they checkpoint.
  Report(be, 0, "stopped");
  Report(be, 1, "stopped");
  EXPECT_EQ(State(be), "pending");  // queued again, to restart from its checkpoint
  EXPECT_EQ(Get(be)["tasks"][0]["restarts"], 1);
  service_->RunCycle();
  EXPECT_EQ(State(urgent), "running");
  ExpectConsistent();

  // A guaranteed job is never a victim, whatever the priority.
  const std::string top = Submit(kAdmin, R"(
name: top
qos: guaranteed
priority: 1000
tasks: [{name: w, replicas: 2, resources: {cpu: 1, memory: 1Gi, gpu: 1}}]
)");
  service_->RunCycle();
  EXPECT_EQ(Get(urgent)["tasks"][0]["state"], "assigned");
  EXPECT_EQ(State(top), "pending");
}

// A preemptor's victims stop one by one. What the first frees must wait for the preemptor: given to
// another best-effort job it outranks (here the first victim, queued again), it would only be
// preempted again when the last victim stops, and again, for as long as the churn lasts (the
// chaos test saw one job preempt 37 times before it ran).
TEST_F(ServiceTest, WhatAPreemptorsVictimsFreeWaitsForIt) {
  AddNode("n1", 2);
  const char* be = R"(
name: {}
qos: best-effort
priority: 0
tasks: [{{name: w, resources: {{cpu: 1, memory: 1Gi, gpu: 1}}, checkpoint: {{dir: /ckpt/{}}}}}]
)";
  const std::string a = Submit(kAdmin, fmt::format(fmt::runtime(be), "a", "a"));
  const std::string b = Submit(kAdmin, fmt::format(fmt::runtime(be), "b", "b"));
  service_->RunCycle();
  ASSERT_EQ(State(a), "running");
  ASSERT_EQ(State(b), "running");
  const std::string urgent = Submit(kAdmin, R"(
name: urgent
qos: guaranteed
priority: 100
tasks: [{name: w, resources: {cpu: 1, memory: 1Gi, gpu: 2}}]
)");
  service_->RunCycle();
  ASSERT_EQ(Get(a)["tasks"][0]["state"], "stopping");
  ASSERT_EQ(Get(b)["tasks"][0]["state"], "stopping");
  Report(a, 0, "stopped");  // the first victim has checkpointed; the second takes its time
  ASSERT_EQ(State(a), "pending");
  service_->RunCycle();
  EXPECT_EQ(State(a), "pending") << "the first victim took back the GPU its preemptor waits for";
  auto explained = service_->JobEvents(kAdmin, a, 0, 100);
  ASSERT_TRUE(explained.ok()) << explained.status().ToString();
  const json why = (*explained)["pending"];
  EXPECT_EQ(why["nodes"]["n1"], "held for a higher-priority job that preempted for room there") << why.dump();
  Report(b, 0, "stopped");
  service_->RunCycle();
  EXPECT_EQ(State(urgent), "running") << service_->JobEvents(kAdmin, urgent, 0, 100)->dump();
  EXPECT_EQ(Get(a)["tasks"][0]["restarts"], 1) << "preempted once, not again";
  auto events = service_->JobEvents(kAdmin, urgent, 0, 100);
  ASSERT_TRUE(events.ok()) << events.status().ToString();
  int preempting = 0;
  for (const auto& e : (*events)["items"]) preempting += e["type"] == "Preempting" ? 1 : 0;
  EXPECT_EQ(preempting, 1);
  ExpectConsistent();

  // Once the preemptor runs, the nodes are free for anyone again.
  Report(urgent, 0, "succeeded");
  service_->RunCycle();
  EXPECT_EQ(State(a), "running");
  EXPECT_EQ(State(b), "running");
  ExpectConsistent();
}

// A preemptor that cannot use what it freed (here its victims' room was taken meanwhile by a job it
// may not evict) holds the nodes no longer than its next try: best-effort work may use them again.
TEST_F(ServiceTest, APreemptorThatCannotPlaceHoldsNothing) {
  config_.reserve_after_seconds = 3600;  // no backfill reservation: it would hold the node too
  Open();
  AddNode("n1", 2);
  const std::string a = Submit(kAdmin, R"(
name: a
qos: best-effort
priority: 0
tasks: [{name: w, resources: {cpu: 1, memory: 1Gi, gpu: 1}}]
)");
  service_->RunCycle();
  ASSERT_EQ(State(a), "running");
  const std::string urgent = Submit(kAdmin, R"(
name: urgent
qos: guaranteed
priority: 100
tasks: [{name: w, resources: {cpu: 1, memory: 1Gi, gpu: 2}}]
)");
  // The free GPU goes to a guaranteed job the preemptor may not evict, right after it preempted.
  service_->RunCycle();
  ASSERT_EQ(Get(a)["tasks"][0]["state"], "stopping");
  const std::string steady = Submit(kAdmin, R"(
name: steady
qos: guaranteed
priority: 0
tasks: [{name: w, resources: {cpu: 1, memory: 1Gi, gpu: 1}}]
)");
  service_->RunCycle();
  ASSERT_EQ(State(steady), "running");
  Report(a, 0, "stopped");
  service_->RunCycle();  // the preemptor's try: it does not fit and has nobody left to evict
  EXPECT_EQ(State(urgent), "pending");
  service_->RunCycle();
  EXPECT_EQ(State(a), "running") << service_->JobEvents(kAdmin, a, 0, 100)->dump();
  ExpectConsistent();
}

// dependsOn: a job starts only once the jobs it names ended as it asked; one that can never start
// (its dependency failed, and it needed success) fails, naming it; `ended` takes any end.
TEST_F(ServiceTest, DependenciesHoldAJobUntilTheyEndAsAsked) {
  AddNode("n1", 2);
  const char* one = R"(
name: {}
tasks: [{{name: w, resources: {{cpu: 1, memory: 1Gi, gpu: 1}}}}]
)";
  const std::string prep = Submit(kVision, fmt::format(fmt::runtime(one), "prep"));
  const std::string train = Submit(kVision, fmt::format(R"(
name: train
dependsOn: [{{job: {}}}]
tasks: [{{name: w, resources: {{cpu: 1, memory: 1Gi, gpu: 1}}}}]
)", prep));
  const std::string cleanup = Submit(kVision, fmt::format(R"(
name: cleanup
dependsOn: [{{job: {}, condition: ended}}]
tasks: [{{name: w, resources: {{cpu: 1, memory: 1Gi}}}}]
)", train));
  service_->RunCycle();
  EXPECT_EQ(State(prep), "running");
  EXPECT_EQ(State(train), "pending");
  EXPECT_EQ(Get(train)["reason"], fmt::format("waiting for {} to succeed (dependsOn)", prep));
  EXPECT_EQ(State(cleanup), "pending");
  Report(prep, 0, "succeeded");
  service_->RunCycle();
  EXPECT_EQ(State(train), "running");
  EXPECT_EQ(State(cleanup), "pending");
  Report(train, 0, "failed", 3);
  service_->RunCycle();
  EXPECT_EQ(State(train), "failed");
  EXPECT_EQ(State(cleanup), "running") << "ended is any end";

  // Needing the success of a job that failed: it can never start.
  const std::string eval = Submit(kVision, fmt::format(R"(
name: eval
dependsOn: [{{job: {}, condition: succeeded}}]
tasks: [{{name: w}}]
)", train));
  service_->RunCycle();
  EXPECT_EQ(State(eval), "failed");
  EXPECT_EQ(Get(eval)["reason"], fmt::format("dependency {} ended failed; this job needed it to succeed", train));
  ExpectConsistent();

  // The same after a restart: recovered from the store, the dependency is judged again.
  const std::string later = Submit(kVision, fmt::format(R"(
name: later
dependsOn: [{{job: {}}}]
tasks: [{{name: w}}]
)", cleanup));
  service_->RunCycle();
  EXPECT_EQ(State(later), "pending");
  Open();
  service_->RunCycle();
  EXPECT_EQ(State(later), "pending");
  const json c = Get(cleanup);
  Report(cleanup, 0, "succeeded");
  service_->RunCycle();
  EXPECT_EQ(State(later), "running");
}

// A hostile tenant's dependsOn: another tenant's job reads as absent (no probing which ids exist),
// and so does one that does not exist.
TEST_F(ServiceTest, ADependencyOnAnotherTenantsJobIsRefusedAsAbsent) {
  AddNode("n1", 1);
  const std::string theirs = Submit(kVision, R"(
name: theirs
tasks: [{name: w}]
)");
  for (const std::string& id : {theirs, std::string("j-000000009999")}) {
    auto r = service_->SubmitJob(kNlp, fmt::format("name: probe\ndependsOn: [{{job: {}}}]\ntasks: [{{name: w}}]\n", id),
                                 SpecFormat::kYaml);
    ASSERT_FALSE(r.ok()) << id;
    EXPECT_EQ(r.status().message(), fmt::format("dependsOn[0].job: no job '{}' of tenant 'nlp'", id));
  }
  // An admin may chain any tenant's jobs.
  auto admin = service_->SubmitJob(kAdmin, fmt::format("name: a\ntenant: nlp\ndependsOn: [{{job: {}}}]\ntasks: [{{name: w}}]\n", theirs),
                                   SpecFormat::kYaml);
  EXPECT_TRUE(admin.ok()) << admin.status().ToString();
}

// timeLimit: a run past it fails the job with reason `time limit`, its tasks stopped with the
// grace period; the start time survives a server restart.
TEST_F(ServiceTest, ARunPastItsTimeLimitFailsTheJob) {
  int64_t wall = 1'800'000'000'000;
  config_.wall_clock_ms = [&wall] { return wall; };
  Open();
  AddNode("n1", 1);
  const std::string id = Submit(kVision, R"(
name: bounded
timeLimit: 1h30m
tasks: [{name: w, resources: {cpu: 1, memory: 1Gi, gpu: 1}}]
)");
  service_->RunCycle();
  ASSERT_EQ(State(id), "running");
  EXPECT_EQ(Get(id)["spec"]["timeLimit"], 5400);
  wall += 5399'000;
  service_->RunCycle();
  EXPECT_EQ(State(id), "running");
  Open();  // a restart must not give the run a fresh limit
  wall += 1'000;
  service_->RunCycle();
  EXPECT_EQ(State(id), "failed");
  EXPECT_EQ(Get(id)["reason"], "time limit: its run lasted 5400 s, past its timeLimit of 90m");
  EXPECT_EQ(Get(id)["tasks"][0]["state"], "stopping");
  auto a = service_->Assignments("n1");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)["assignments"][0]["desired"], "stop");
  EXPECT_EQ((*a)["assignments"][0]["gracePeriodSeconds"], 30);
  Report(id, 0, "stopped");
  EXPECT_EQ(State(id), "failed");
  ExpectConsistent();
}

TEST_F(ServiceTest, CancelStopsRunningTasksAndReleasesOnReport) {
  AddNode("n1", 1);
  const std::string id = Submit(kVision, kQuarter);
  service_->RunCycle();
  auto r = service_->CancelJob(kVision, id);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)["state"], "cancelled");
  EXPECT_EQ((*r)["tasks"][0]["state"], "stopping");
  EXPECT_EQ(service_->CancelJob(kVision, id).status().code(), StatusCode::kFailedPrecondition);
  for (int i = 0; i < 4; ++i) Report(id, i, "stopped");
  json job = Get(id);
  for (const auto& t : job["tasks"]) EXPECT_EQ(t["state"], "cancelled");
  ExpectConsistent();
}

TEST_F(ServiceTest, AffinityAndSpread) {
  AddNode("a1", 2, "A100-80GB", {{"zone", "a"}});
  AddNode("a2", 2, "A100-80GB", {{"zone", "a"}});
  AddNode("b1", 2, "A100-80GB", {{"zone", "b"}});
  const std::string spread = Submit(kAdmin, R"(
name: spread
labels: {app: web}
affinity:
  nodeSelector: {zone: a}
  apartFrom: [{app: web}]
tasks: [{name: w, replicas: 2, resources: {cpu: 1, memory: 1Gi, gpu: 0.5}}]
)");
  service_->RunCycle();
  json job = Get(spread);
  ASSERT_EQ(job["state"], "running");
  std::set<std::string> nodes = {job["tasks"][0]["node"], job["tasks"][1]["node"]};
  EXPECT_EQ(nodes, (std::set<std::string>{"a1", "a2"}));
  const std::string third = Submit(kAdmin, R"(
name: third
labels: {app: web}
affinity:
  nodeSelector: {zone: a}
  apartFrom: [{app: web}]
tasks: [{name: w, resources: {cpu: 1, memory: 1Gi, gpu: 0.5}}]
)");
  const std::string buddy = Submit(kAdmin, R"(
name: buddy
affinity:
  togetherWith: [{app: web}]
tasks: [{name: w, resources: {cpu: 1, memory: 1Gi, gpu: 0.5}}]
)");
  service_->RunCycle();
  EXPECT_EQ(State(third), "pending");
  auto ev = service_->JobEvents(kAdmin, third, 0, 100);
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ((*ev)["pending"]["nodes"]["b1"], "node labels do not match the job's node affinity");
  EXPECT_EQ((*ev)["pending"]["nodes"]["a1"], "runs a task of an apart-from job");
  json b = Get(buddy);
  ASSERT_EQ(b["state"], "running");
  EXPECT_TRUE(b["tasks"][0]["node"] == "a1" || b["tasks"][0]["node"] == "a2");
  ExpectConsistent();
}

TEST_F(ServiceTest, QueueLimitsAdmissionAndHierarchy) {
  config_.ordering.policy = OrderingPolicy::kHierarchical;
  Open();
  auto q = service_->CreateQueue({{"name", "vision"}, {"weight", 2}, {"limit", {{"gpu", 2}}}});
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(service_->CreateQueue({{"name", "vision"}}).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(service_->CreateQueue({{"name", "x"}, {"weight", -1}}).status().code(),
            StatusCode::kInvalidArgument);
  AddNode("n1", 4);
  // Three whole GPUs can never run under a 2-GPU limit: refused at admission.
  auto r = service_->SubmitJob(
      kVision,
      "name: big\nqueue: vision\ntasks: [{name: w, replicas: 3, resources: {cpu: 1, memory: 1Gi, gpu: 1}}]\n",
      SpecFormat::kYaml);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  // Two one-GPU jobs fit the limit; the third waits even though GPUs are free.
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i)
    ids.push_back(Submit(
        kVision, "name: j\nqueue: vision\ntasks: [{name: w, resources: {cpu: 1, memory: 1Gi, gpu: 1}}]\n"));
  service_->RunCycle();
  EXPECT_EQ(State(ids[0]), "running");
  EXPECT_EQ(State(ids[1]), "running");
  EXPECT_EQ(State(ids[2]), "pending");
  auto updated = service_->UpdateQueue("vision", {{"limit", {{"gpu", 3}}}});
  ASSERT_TRUE(updated.ok()) << updated.status().ToString();
  service_->RunCycle();
  EXPECT_EQ(State(ids[2]), "running");
  auto listed = service_->GetQueue("vision");
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ((*listed)["used"]["gpu"], 3.0);
  EXPECT_EQ((*listed)["running"], 3);
}

TEST_F(ServiceTest, RestartRecoversQueuesAllocationsAndTasksExactly) {
  AddNode("n1", 2);
  AddNode("n2", 2, "H100-80GB");
  ASSERT_TRUE(service_->CreateQueue({{"name", "vision"}, {"weight", 3}}).ok());
  const std::string a = Submit(kVision, std::string(kQuarter) + "queue: vision\n");
  const std::string b = Submit(kAdmin,
                               "name: b\ntasks: [{name: w, replicas: 2, resources: {cpu: 1, memory: 1Gi, "
                               "gpu: 1, gpuModels: [H100-80GB]}}]\n");
  const std::string c =
      Submit(kAdmin, "name: c\ntasks: [{name: w, replicas: 8, resources: {cpu: 1, memory: 1Gi, gpu: 1}}]\n");
  service_->RunCycle();
  Report(a, 0, "running");
  ASSERT_TRUE(service_->SetCordon("n2", true).ok());
  const json before_a = Get(a), before_b = Get(b), before_c = Get(c);
  const json nodes_before = service_->ListNodes();
  const json queues_before = service_->ListQueues();
  auto usage_before = service_->GpuUsage();

  Open();  // a new process over the same store
  EXPECT_EQ(Get(a)["tasks"], before_a["tasks"]);
  EXPECT_EQ(Get(a)["state"], "running");
  EXPECT_EQ(Get(b)["tasks"], before_b["tasks"]);
  EXPECT_EQ(Get(c)["state"], "pending");
  EXPECT_EQ(Get(c)["spec"], before_c["spec"]);
  json nodes_after = service_->ListNodes();
  for (auto& n : nodes_after["items"]) n.erase("lastHeartbeat");
  json nodes_expected = nodes_before;
  for (auto& n : nodes_expected["items"]) n.erase("lastHeartbeat");
  EXPECT_EQ(nodes_after, nodes_expected);
  EXPECT_EQ(service_->ListQueues(), queues_before);
  auto usage_after = service_->GpuUsage();
  ASSERT_EQ(usage_after.size(), usage_before.size());
  for (size_t i = 0; i < usage_after.size(); ++i)
    EXPECT_EQ(usage_after[i].ledger_used_share, usage_before[i].ledger_used_share);
  ExpectConsistent();
  // New ids continue after the old ones.
  EXPECT_EQ(Submit(kAdmin, "name: d\ntasks: [{name: w, resources: {cpu: 1}}]\n"), "j-000000000004");
}

// What a restart used to lose: why a task is being stopped, what its "stopped" turns into, and how
// a task that ended said it ended.
TEST_F(ServiceTest, RestartKeepsWhyAndToWhatEndTasksStopAndHowTheyEnded) {
  AddNode("n1", 2);
  const std::string id =
      Submit(kAdmin, "name: pair\ntasks: [{name: w, replicas: 2, resources: {cpu: 1, memory: 1Gi, gpu: 1}}]\n");
  service_->RunCycle();
  Report(id, 0, "running");
  Report(id, 1, "running");
  // Task 0 fails; without retry.onFailure the job fails and task 1 is stopped: cancelled, not
  // preempted (a preempted task's job would run again).
  auto r = service_->ReportTask("n1", id, 0, {{"state", "failed"}, {"exitCode", 3}, {"message", "exit code 3: OOM"}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(State(id), "failed");
  const json before = Get(id);
  ASSERT_EQ(before["tasks"][1]["state"], "stopping");
  const std::string why = before["tasks"][1]["stopReason"];
  EXPECT_FALSE(why.empty());

  Open();
  const json after = Get(id);
  EXPECT_EQ(after["tasks"][0]["message"], "exit code 3: OOM");
  EXPECT_EQ(after["tasks"][1]["stopReason"], why);
  Report(id, 1, "stopped");
  EXPECT_EQ(Get(id)["tasks"][1]["state"], "cancelled");
  EXPECT_EQ(State(id), "failed");
  ExpectConsistent();
}

// An agent's end message is kept to 4 KiB, cut on a character boundary: a report of many
// multi-byte characters never leaves half a character for the JSON views to choke on.
TEST_F(ServiceTest, ALongEndMessageIsCutWholeCharactersAndStillRendersAndRecovers) {
  AddNode("n1", 1);
  const std::string id = Submit(kAdmin, kQuarter);
  service_->RunCycle();
  Report(id, 0, "running");
  std::string message = "xx";  // two bytes first, so that byte 4096 falls inside a three-byte character
  for (int i = 0; i < 3000; ++i) message += "\u20ac";  // the euro sign: 3 bytes in UTF-8
  auto r = service_->ReportTask("n1", id, 0, {{"state", "failed"}, {"exitCode", 1}, {"message", message}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::string kept = Get(id)["tasks"][0]["message"];
  EXPECT_EQ(kept.size(), 4094u);  // 2 + 1364 whole characters
  EXPECT_EQ(kept, message.substr(0, kept.size()));
  EXPECT_NO_THROW((void)json(kept).dump());  // valid UTF-8 (dump throws on a broken sequence)
  Open();
  EXPECT_EQ(Get(id)["tasks"][0]["message"], kept);
  ExpectConsistent();
}

// A job's watchers are answered once the service's lock is let go: their JSON, and whatever the
// HTTP layer does with it, never holds up the scheduler or another request. The probe's answer
// asks the service for something from another thread: under the lock that would wait.
TEST_F(ServiceTest, JobWatchersAreAnsweredWithoutTheServicesLock) {
  AddNode("n1", 1);
  const std::string id = Submit(kAdmin, kQuarter);
  struct Probe : Watcher {
    PoolService* svc = nullptr;
    std::atomic<bool> answered{false};
    bool lock_free = false;
    json view;
    std::future<json> other;  // outlives Deliver: never waited for under the lock
    void Deliver(const json& v) override {
      view = v;
      other = std::async(std::launch::async, [this] { return svc->Health(); });
      lock_free = other.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
      answered = true;
    }
    bool waiting() const override { return !answered; }
  };
  auto probe = std::make_shared<Probe>();
  probe->svc = service_.get();
  auto w = service_->WatchJob(kAdmin, id, Get(id)["version"], probe);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_FALSE(w->has_value());  // it waits
  service_->RunCycle();          // placed: the job changed
  ASSERT_TRUE(probe->answered);
  EXPECT_TRUE(probe->lock_free);
  EXPECT_EQ(probe->view["state"], "running");
  EXPECT_EQ(probe->view["version"], Get(id)["version"]);
  probe->other.wait();
}

TEST_F(ServiceTest, MetricsNameQueuesReasonsAndLatency) {
  AddNode("n1", 1);
  Submit(kVision, kQuarter);
  Submit(kVision, "name: toolarge\ntasks: [{name: w, resources: {cpu: 1, memory: 1Gi, gpu: 2}}]\n");
  service_->RunCycle();
  const std::string m = service_->MetricsText();
  EXPECT_NE(m.find("gpupool_queue_pending_jobs{queue=\"default\"} 1"), std::string::npos) << m;
  EXPECT_NE(m.find("gpupool_pending_jobs_by_reason{reason=\"insufficient GPU count\"} 1"), std::string::npos)
      << m;
  EXPECT_NE(m.find("gpupool_scheduling_latency_seconds_count 1"), std::string::npos) << m;
  EXPECT_NE(m.find("gpupool_placements_total 1"), std::string::npos) << m;
  EXPECT_NE(m.find("gpupool_queue_gpu_allocated{queue=\"default\"} 1"), std::string::npos) << m;
}

TEST_F(ServiceTest, ReregistrationMustMatchTheInventory) {
  AddNode("n1", 2);
  AddNode("n1", 2);  // the same inventory again: fine (an agent restart)
  json body = {
      {"name", "n1"}, {"cpu", "64"}, {"memory", "512Gi"}, {"gpus", json::array({{{"model", "A100-80GB"}}})}};
  EXPECT_EQ(service_->RegisterNode(body).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(service_->RegisterNode({{"name", "n2"}, {"cpu", -1}}).status().code(),
            StatusCode::kInvalidArgument);
}

// Whoever holds the bootstrap token registers node names; the node table does not grow past
// limits.maxNodes (what a leaked token could otherwise fill memory and the store with), and a
// refused name leaves nothing behind. Known names still re-register.
TEST_F(ServiceTest, NodeNamesPastTheLimitAreRefusedAndNothingIsStored) {
  config_.max_nodes = 3;
  Open();
  const Principal bootstrap{"", Role::kAgent};
  auto node = [](const std::string& name) {
    return json{{"name", name}, {"cpu", "8"}, {"memory", "64Gi"}, {"gpus", json::array({{{"model", "A100-80GB"}}})}};
  };
  for (const char* name : {"n1", "n2", "n3"}) ASSERT_TRUE(service_->RegisterNode(bootstrap, node(name)).ok()) << name;
  auto refused = service_->RegisterNode(bootstrap, node("n4"));
  ASSERT_EQ(refused.status().code(), StatusCode::kLimitExceeded);
  EXPECT_NE(refused.status().message().find("limits.maxNodes"), std::string::npos) << refused.status().message();
  EXPECT_NE(refused.status().message().find("'n4'"), std::string::npos);
  EXPECT_EQ(service_->ListNodes()["items"].size(), 3u);
  EXPECT_EQ(service_->GetNode("n4").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(service_->ListNodeCredentials()["items"].size(), 3u);
  // An admin is bound by it too; a known name re-registers (an agent restart).
  EXPECT_EQ(service_->RegisterNode(node("n5")).status().code(), StatusCode::kLimitExceeded);
  EXPECT_TRUE(service_->RegisterNode(node("n2")).ok());
  // After a restart the stored nodes count: still three, still full.
  Open();
  EXPECT_EQ(service_->ListNodes()["items"].size(), 3u);
  EXPECT_EQ(service_->RegisterNode(bootstrap, node("n4")).status().code(), StatusCode::kLimitExceeded);
  ExpectConsistent();
}

// ---- faults --------------------------------------------------------------------------------------

std::vector<std::string> EventTypes(PoolService& s, const std::string& id) {
  auto events = s.JobEvents(kAdmin, id, 0, 1000);
  std::vector<std::string> types;
  if (events.ok()) {
    for (const auto& e : (*events)["items"]) types.push_back(e["type"]);
  }
  return types;
}

bool Has(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

constexpr char kGangTwoNodes[] = R"(
name: train
retry: {maxRestarts: 3, backoffSeconds: 0}
tasks:
  - name: w
    replicas: 2
    resources: {cpu: 4, memory: 16Gi, gpu: 2}
    command: [python3, train.py]
    checkpoint: {dir: /ckpt/train, intervalSeconds: 60}
)";

TEST_F(ServiceTest, LostNodeReleasesItsTasksAndTheGangRestartsElsewhere) {
  config_.heartbeat_timeout_seconds = 1;
  Open();
  AddNode("n1", 2);
  AddNode("n2", 2);
  AddNode("n3", 2);
  const std::string id = Submit(kAdmin, kGangTwoNodes);
  service_->RunCycle();
  Report(id, 0, "running");
  Report(id, 1, "running");
  json job = Get(id);
  const std::string dead = job["tasks"][0]["node"];
  const std::string alive = job["tasks"][1]["node"];
  ASSERT_NE(dead, alive);
  std::string spare;
  for (const char* n : {"n1", "n2", "n3"}) {
    if (n != dead && n != alive) spare = n;
  }
  // Every node but `dead` keeps heartbeating.
  for (int i = 0; i < 6; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ASSERT_TRUE(service_->Heartbeat(alive, json::object()).ok());
    ASSERT_TRUE(service_->Heartbeat(spare, json::object()).ok());
    service_->RunCycle();
  }
  auto node = service_->GetNode(dead);
  ASSERT_TRUE(node.ok());
  EXPECT_EQ((*node)["state"], "lost");
  EXPECT_EQ((*service_->GetNode(alive))["state"], "ready");
  job = Get(id);
  // The lost node's task is released at once; the rest of the gang is asked to stop (checkpoint).
  EXPECT_EQ(job["tasks"][0]["state"], "preempted");
  EXPECT_EQ(job["tasks"][1]["state"], "stopping");
  EXPECT_NE(job["tasks"][1]["stopReason"].get<std::string>().find("node " + dead + " lost"), std::string::npos)
      << job.dump();
  EXPECT_EQ(job["faults"], 1);
  // A late report from the lost node is refused: its task was released.
  EXPECT_EQ(service_->ReportTask(dead, id, 0, {{"state", "running"}}).status().code(),
            StatusCode::kFailedPrecondition);
  Report(id, 1, "stopped");
  EXPECT_EQ(State(id), "pending");
  service_->RunCycle();
  job = Get(id);
  EXPECT_EQ(job["state"], "running");
  for (const auto& t : job["tasks"]) {
    EXPECT_NE(t["node"], dead) << "placed on the lost node";
    EXPECT_EQ(t["restarts"], 1);
  }
  const auto types = EventTypes(*service_, id);
  EXPECT_TRUE(Has(types, "NodeLost"));
  EXPECT_TRUE(Has(types, "Fault"));
  EXPECT_TRUE(Has(types, "Requeued"));
  ExpectConsistent();
  // The node comes back: ready again, empty, and placements may use it.
  ASSERT_TRUE(service_->Heartbeat(dead, json::object()).ok());
  EXPECT_EQ((*service_->GetNode(dead))["state"], "ready");
  EXPECT_EQ((*service_->GetNode(dead))["tasks"], 0);
  EXPECT_NE(service_->MetricsText().find("gpupool_nodes_lost_total 1"), std::string::npos);
}

TEST_F(ServiceTest, RetryBudgetBackoffAndAClearFinalReason) {
  AddNode("n1", 1);
  const std::string id = Submit(kAdmin, R"(
name: flaky
retry: {maxRestarts: 2, backoffSeconds: 30, onFailure: true}
tasks: [{name: w, resources: {cpu: 1, memory: 1Gi, gpu: 1}, command: [x]}]
)");
  service_->RunCycle();
  Report(id, 0, "running");
  Report(id, 0, "failed", 3);
  // First restart: at once.
  json job = Get(id);
  EXPECT_EQ(job["state"], "pending");
  EXPECT_EQ(job["faults"], 1);
  EXPECT_FALSE(job.contains("notBefore"));
  service_->RunCycle();
  EXPECT_EQ(State(id), "running");
  // The restart runs on the same node as run 1; a late report about run 0 must not end it.
  auto late = service_->ReportTask("n1", id, 0, {{"state", "failed"}, {"exitCode", 3}, {"restarts", 0}});
  EXPECT_EQ(late.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(late.status().message().find("run 0"), std::string::npos) << late.status().message();
  EXPECT_EQ(State(id), "running");
  ASSERT_TRUE(service_->ReportTask("n1", id, 0, {{"state", "running"}, {"restarts", 1}}).ok());
  Report(id, 0, "failed", 3);
  // Second: after the backoff; the job waits and says until when.
  job = Get(id);
  EXPECT_EQ(job["faults"], 2);
  ASSERT_TRUE(job.contains("notBefore")) << job.dump();
  service_->RunCycle();
  EXPECT_EQ(State(id), "pending");
  // The budget survives a restart of the server.
  Open();
  job = Get(id);
  EXPECT_EQ(job["faults"], 2);
  EXPECT_TRUE(job.contains("notBefore"));
  service_->RunCycle();
  EXPECT_EQ(State(id), "pending");
  ExpectConsistent();

  // A task stopped without being asked (its agent fenced it) is a fault even without onFailure.
  const std::string fenced = Submit(kAdmin, "name: fenced\ntasks: [{name: w, resources: {cpu: 1}, command: [x]}]\n");
  service_->RunCycle();
  {
    const std::string node = Get(fenced)["tasks"][0]["node"];
    ASSERT_TRUE(service_->ReportTask(node, fenced, 0, {{"state", "stopped"}, {"message", "fenced: no contact"}}).ok());
  }
  EXPECT_EQ(State(fenced), "pending");
  EXPECT_EQ(Get(fenced)["faults"], 1);
  EXPECT_NE(Get(fenced)["reason"].get<std::string>().find("fenced: no contact"), std::string::npos);

  // Without onFailure a failed task fails the job at once.
  const std::string once = Submit(kAdmin, "name: once\ntasks: [{name: w, resources: {cpu: 1}, command: [x]}]\n");
  service_->RunCycle();
  Report(once, 0, "failed", 1);
  EXPECT_EQ(State(once), "failed");
  EXPECT_EQ(Get(once)["reason"], "task w[0] failed with exit code 1");
}

TEST_F(ServiceTest, RetryBudgetExhaustedFailsTheJobNamingTheFault) {
  AddNode("n1", 1);
  const std::string id = Submit(kAdmin, R"(
name: flaky
retry: {maxRestarts: 1, backoffSeconds: 0, onFailure: true}
tasks: [{name: w, resources: {cpu: 1, memory: 1Gi, gpu: 1}, command: [x]}]
)");
  service_->RunCycle();
  Report(id, 0, "failed", 3);
  service_->RunCycle();
  EXPECT_EQ(State(id), "running");
  Report(id, 0, "failed", 4);
  const json job = Get(id);
  EXPECT_EQ(job["state"], "failed");
  EXPECT_EQ(job["reason"], "task w[0] failed with exit code 4; gave up after 1 restart(s) (retry.maxRestarts 1)");
  EXPECT_EQ(Get(id)["tasks"][0]["restarts"], 1);
  ExpectConsistent();
  // Every terminal job says why.
  const std::string ok = Submit(kAdmin, "name: ok\ntasks: [{name: w, resources: {cpu: 1}, command: [x]}]\n");
  service_->RunCycle();
  Report(ok, 0, "succeeded");
  EXPECT_EQ(Get(ok)["reason"], "every task exited 0");
  // A task killed by a signal: the reason says so rather than "exit code 0".
  const std::string killed = Submit(kAdmin, "name: k\ntasks: [{name: w, resources: {cpu: 1}, command: [x]}]\n");
  service_->RunCycle();
  const std::string node = Get(killed)["tasks"][0]["node"];
  ASSERT_TRUE(service_->ReportTask(node, killed, 0, {{"state", "failed"}, {"message", "killed by SIGKILL"}}).ok());
  EXPECT_EQ(Get(killed)["reason"], "task w[0] failed: killed by SIGKILL");
}

constexpr char kOneGpu[] = R"(
name: one
retry: {backoffSeconds: 0}
tasks: [{name: w, resources: {cpu: 1, memory: 1Gi, gpu: 1}, command: [x]}]
)";

TEST_F(ServiceTest, GpuFaultEvictsItsJobsAndKeepsTheRestOfTheNode) {
  AddNode("n1", 2);
  const std::string a = Submit(kAdmin, kOneGpu);
  const std::string b = Submit(kAdmin, kOneGpu);
  service_->RunCycle();
  Report(a, 0, "running");
  Report(b, 0, "running");
  const int gpu_a = Get(a)["tasks"][0]["gpus"][0]["index"];
  json beat = {{"gpus", json::array({{{"index", gpu_a}, {"healthy", false}, {"reason", "XID 79"}},
                                     {{"index", 1 - gpu_a}, {"healthy", true}}})}};
  ASSERT_TRUE(service_->Heartbeat("n1", beat).ok());
  json ja = Get(a);
  EXPECT_EQ(ja["tasks"][0]["state"], "stopping");
  EXPECT_NE(ja["tasks"][0]["stopReason"].get<std::string>().find("XID 79"), std::string::npos);
  EXPECT_EQ(Get(b)["tasks"][0]["state"], "running");  // the other GPU stays in service
  const json node = *service_->GetNode("n1");
  EXPECT_EQ(node["gpus"][static_cast<size_t>(gpu_a)]["healthy"], false);
  EXPECT_EQ(node["gpus"][static_cast<size_t>(gpu_a)]["fault"], "XID 79");
  // Reported again: nothing new happens (one fault, one restart).
  ASSERT_TRUE(service_->Heartbeat("n1", beat).ok());
  EXPECT_EQ(Get(a)["faults"], 1);
  Report(a, 0, "stopped");
  service_->RunCycle();
  EXPECT_EQ(State(a), "pending");  // the faulty GPU takes nothing, the other is b's
  AddNode("n2", 1);
  service_->RunCycle();
  EXPECT_EQ(Get(a)["tasks"][0]["node"], "n2");
  // Healthy again: usable again.
  beat["gpus"][0] = {{"index", gpu_a}, {"healthy", true}};
  ASSERT_TRUE(service_->Heartbeat("n1", beat).ok());
  EXPECT_EQ((*service_->GetNode("n1"))["gpus"][static_cast<size_t>(gpu_a)]["healthy"], true);
  ExpectConsistent();
  // A bad report names the field and changes nothing.
  auto bad = service_->Heartbeat("n1", {{"gpus", json::array({{{"index", 0}, {"temperatureC", "hot"}}})}});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("gpus[0].temperatureC"), std::string::npos) << bad.status().message();
}

// A best-effort half GPU and a guaranteed quarter, which share a GPU.
constexpr char kBestEffortHalf[] = R"(
name: be
qos: best-effort
tasks: [{name: w, resources: {cpu: 1, memory: 1Gi, gpu: 0.5}, command: [x]}]
)";
constexpr char kGuaranteedQuarter[] = R"(
name: g
qos: guaranteed
tasks: [{name: w, resources: {cpu: 1, memory: 1Gi, gpu: 0.25, gpuMemory: 10Gi}, command: [x]}]
)";

TEST_F(ServiceTest, HotGpuTakesNoPlacementsMigratesBestEffortAndCoolsDown) {
  config_.hotspot.temperature_c = 85;
  config_.hotspot.window_seconds = 0;
  config_.hotspot.cooldown_seconds = 1;
  Open();
  AddNode("n1", 1);
  const std::string be = Submit(kAdmin, kBestEffortHalf);
  const std::string g = Submit(kAdmin, kGuaranteedQuarter);
  service_->RunCycle();
  Report(be, 0, "running");
  Report(g, 0, "running");
  auto beat = [&](double temp) {
    auto r = service_->Heartbeat("n1", {{"gpus", json::array({{{"index", 0}, {"temperatureC", temp}}})}});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  };
  beat(95);
  json j = Get(be);
  EXPECT_EQ(j["tasks"][0]["state"], "stopping");
  EXPECT_NE(j["tasks"][0]["stopReason"].get<std::string>().find("hot"), std::string::npos);
  EXPECT_EQ(Get(g)["tasks"][0]["state"], "running");  // only best-effort work moves
  EXPECT_EQ((*service_->GetNode("n1"))["gpus"][0]["hot"], true);
  Report(be, 0, "stopped");
  EXPECT_EQ(Get(be)["faults"], 0);  // a move, not a fault
  service_->RunCycle();
  EXPECT_EQ(State(be), "pending");  // the hot GPU takes no new work
  beat(60);
  service_->RunCycle();
  EXPECT_EQ(State(be), "pending");  // cooling down: no flapping
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  beat(60);
  EXPECT_EQ((*service_->GetNode("n1"))["gpus"][0]["hot"], false);
  service_->RunCycle();
  EXPECT_EQ(State(be), "running");
  EXPECT_NE(service_->MetricsText().find("gpupool_hotspot_migrations_total 1"), std::string::npos);
  ExpectConsistent();
}

// A guaranteed job's limiter reports memory pressure on its GPU: the GPU is treated as hot (its
// best-effort neighbours move, nothing new is placed there until the cooldown); a report naming a
// job that is not guaranteed, or not on that GPU, changes nothing.
TEST_F(ServiceTest, MemoryPressureOfAGuaranteedJobMovesItsBestEffortNeighbours) {
  config_.hotspot.cooldown_seconds = 1;
  Open();
  AddNode("n1", 2);
  const std::string whole = Submit(kAdmin, kOneGpu);  // the other GPU is taken
  service_->RunCycle();
  Report(whole, 0, "running");
  const std::string be = Submit(kAdmin, kBestEffortHalf);
  const std::string g = Submit(kAdmin, kGuaranteedQuarter);
  service_->RunCycle();
  Report(be, 0, "running");
  Report(g, 0, "running");
  const int gpu = Get(g)["tasks"][0]["gpus"][0]["index"].get<int>();
  ASSERT_EQ(Get(be)["tasks"][0]["gpus"][0]["index"].get<int>(), gpu) << Get(be).dump();
  auto beat = [&](int index, const std::string& job) {
    json e = {{"index", index}, {"temperatureC", 40}};
    if (!job.empty()) e["memoryPressureJob"] = job;
    auto r = service_->Heartbeat("n1", {{"gpus", json::array({e})}});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  };
  beat(gpu, be);           // not guaranteed: a claim that counts for nothing
  beat(1 - gpu, g);        // not where the job runs
  beat(gpu, "j-unknown");  // no such job
  EXPECT_EQ(Get(be)["tasks"][0]["state"], "running");
  EXPECT_EQ((*service_->GetNode("n1"))["gpus"][static_cast<size_t>(gpu)]["hot"], false);
  beat(gpu, g);
  EXPECT_EQ(Get(be)["tasks"][0]["state"], "stopping");
  EXPECT_NE(Get(be)["tasks"][0]["stopReason"].get<std::string>().find("memory pressure of guaranteed job " + g),
            std::string::npos)
      << Get(be).dump();
  EXPECT_EQ(Get(g)["tasks"][0]["state"], "running");
  EXPECT_EQ((*service_->GetNode("n1"))["gpus"][static_cast<size_t>(gpu)]["hot"], true);
  Report(be, 0, "stopped");
  EXPECT_EQ(Get(be)["faults"], 0);
  service_->RunCycle();
  EXPECT_EQ(State(be), "pending");  // not back onto the GPU under pressure
  AddNode("n2", 1);
  service_->RunCycle();
  EXPECT_EQ(Get(be)["tasks"][0]["node"], "n2");
  // A bad claim is a 400 naming the field.
  auto bad = service_->Heartbeat("n1", {{"gpus", json::array({{{"index", 0}, {"memoryPressureJob", 7}}})}});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("gpus[0].memoryPressureJob"), std::string::npos) << bad.status().message();
  for (const std::string& id : {std::string(), std::string(129, 'j')}) {  // empty, or past the bound
    auto refused = service_->Heartbeat("n1", {{"gpus", json::array({{{"index", 0}, {"memoryPressureJob", id}}})}});
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << id.size();
    EXPECT_NE(refused.status().message().find("1 to 128 characters"), std::string::npos) << refused.status().message();
  }
  // Quiet for the cooldown: usable again.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  beat(gpu, "");
  EXPECT_EQ((*service_->GetNode("n1"))["gpus"][static_cast<size_t>(gpu)]["hot"], false);
  ExpectConsistent();
}

TEST_F(ServiceTest, DrainMovesEveryJobOffThroughTheSameRequeue) {
  AddNode("n1", 1);
  const std::string id = Submit(kAdmin, kOneGpu);
  service_->RunCycle();
  Report(id, 0, "running");
  ASSERT_TRUE(service_->DrainNode("n1").ok());
  EXPECT_EQ(Get(id)["tasks"][0]["state"], "stopping");
  Report(id, 0, "stopped");
  AddNode("n2", 1);
  service_->RunCycle();
  const json job = Get(id);
  EXPECT_EQ(job["tasks"][0]["node"], "n2");
  EXPECT_EQ(job["tasks"][0]["restarts"], 1);
  EXPECT_EQ(job["faults"], 0);
  ExpectConsistent();
}

// Forwards to a real store; while closed, every Apply waits until Open(). Lets a test hold the
// scheduling loop's write in flight.
class GatedStore : public Store {
 public:
  explicit GatedStore(std::unique_ptr<Store> inner) : inner_(std::move(inner)) {}
  Status Apply(const WriteBatch& batch) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++entered_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
    lock.unlock();
    return inner_->Apply(batch);
  }
  Result<StoreSnapshot> Load() override { return inner_->Load(); }
  Result<std::vector<EventRecord>> ListEvents(const std::string& job_id, int64_t after_id,
                                              int limit) override {
    return inner_->ListEvents(job_id, after_id, limit);
  }
  int schema_version() const override { return inner_->schema_version(); }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = false;
    entered_ = 0;
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  bool WaitEntered(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return entered_ > 0; });
  }

 private:
  std::unique_ptr<Store> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  int entered_ = 0;
};

// The loop writes its batch without the service lock, so the service goes on answering while the
// write is in flight; but an agent is handed an assignment only once it is durable, so no task
// runs that a restart would not know about.
TEST(ServiceLoopTest, AssignmentsWaitUntilTheCycleThatMadeThemIsDurable) {
  TempDir dir;
  ServerConfig config;
  config.data_dir = dir.path();
  config.profile = "bestfit";
  config.cycle_interval_ms = 10;
  SqliteStoreOptions o;
  o.path = dir.path() + "/gpupool.db";
  o.synchronous_full = false;
  auto inner = OpenSqliteStore(o);
  ASSERT_TRUE(inner.ok()) << inner.status().ToString();
  auto gated_owner = std::make_unique<GatedStore>(std::move(inner).value());
  GatedStore* gated = gated_owner.get();
  auto opened = PoolService::Open(config, std::move(gated_owner));
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::unique_ptr<PoolService> service = std::move(opened).value();
  json node = {{"name", "n1"},
               {"cpu", "64"},
               {"memory", "512Gi"},
               {"labels", {{"gpupool.io/enforce-mps", "true"}}},  // the quarters share the GPU
               {"gpus", {{{"index", 0}, {"model", "A100-80GB"}}}}};
  ASSERT_TRUE(service->RegisterNode(node).ok());
  auto job = service->SubmitJob(kAdmin, kQuarter, SpecFormat::kYaml);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  const std::string id = (*job)["id"];

  gated->Close();
  service->Start();
  ASSERT_TRUE(gated->WaitEntered(std::chrono::seconds(10))) << "the loop never wrote its cycle";
  // The placement is in memory, its write is held: reads go on, the assignment waits.
  auto got = service->GetJob(kAdmin, id);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)["state"], "running");
  auto assignments = std::async(std::launch::async, [&] { return service->Assignments("n1"); });
  EXPECT_EQ(assignments.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout)
      << "an assignment was handed out before the cycle that made it was on disk";
  gated->Open();
  auto a = assignments.get();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ((*a)["assignments"].size(), 4u);
  service->Stop();
  service.reset();

  // And it was durable: a restart finds the four tasks placed.
  auto again = OpenSqliteStore(o);
  ASSERT_TRUE(again.ok());
  auto reopened = PoolService::Open(config, std::move(again).value());
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  auto after = (*reopened)->GetJob(kAdmin, id);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ((*after)["state"], "running");
}

}  // namespace
}  // namespace gpupool
