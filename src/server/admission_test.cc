// Tenant limits, queue access rules and cheap job lists (docs/server.md#tenant-limits,
// #queue-access; docs/api.md#list-jobs), on PoolService without HTTP. Cycles are driven by
// RunCycle(), so every step is deterministic.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "server/service.h"
#include "store/sqlite_store.h"

namespace gpupool {
namespace {

using nlohmann::json;

const Principal kAdmin{"", Role::kAdmin};
const Principal kVision{"vision", Role::kTenant};
const Principal kNlp{"nlp", Role::kTenant};

class AdmissionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpupool-admission-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    config_.data_dir = dir_;
    config_.profile = "bestfit";
    config_.sync_full = false;
    Open();
  }
  void TearDown() override {
    service_.reset();
    std::filesystem::remove_all(dir_);
  }
  // A new service over the same store: what a restarted server sees.
  void Open() {
    service_.reset();
    auto store = OpenSqliteStore({dir_ + "/gpupool.db", false});
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto s = PoolService::Open(config_, std::move(store).value());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    service_ = std::move(s).value();
  }
  void AddNode(const std::string& name, int gpus) {
    json g = json::array();
    for (int i = 0; i < gpus; ++i) g.push_back({{"index", i}, {"model", "A100-80GB"}});
    auto r = service_->RegisterNode({{"name", name}, {"cpu", "64"}, {"memory", "512Gi"}, {"gpus", g}});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  static std::string WithReplicas(const std::string& name, int replicas, const std::string& extra) {
    json j = {{"name", name},
              {"tasks",
               {{{"name", "t"},
                 {"replicas", replicas},
                 {"resources", {{"cpu", 1}, {"memory", "1Gi"}, {"gpu", 1}}},
                 {"command", {"true"}}}}}};
    if (!extra.empty()) j.update(json::parse(extra));
    return j.dump();
  }
  Result<json> Submit(const Principal& who, const std::string& name, int replicas = 1,
                      const std::string& extra = "") {
    return service_->SubmitJob(who, WithReplicas(name, replicas, extra), SpecFormat::kJson);
  }
  std::string MustSubmit(const Principal& who, const std::string& name, int replicas = 1,
                         const std::string& extra = "") {
    auto r = Submit(who, name, replicas, extra);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? (*r)["id"].get<std::string>() : "";
  }
  size_t Listed(const Principal& who = kAdmin) {
    auto r = service_->ListJobs(who, {});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? (*r)["items"].size() : 0;
  }
  void ExpectConsistent() {
    Status st = service_->CheckInvariants();
    EXPECT_TRUE(st.ok()) << st.ToString();
  }

  std::string dir_;
  ServerConfig config_;
  std::unique_ptr<PoolService> service_;
};

void ExpectRefused(const Result<json>& r, StatusCode code, const std::vector<std::string>& words) {
  ASSERT_FALSE(r.ok()) << "accepted: " << r->dump();
  EXPECT_EQ(r.status().code(), code) << r.status().ToString();
  for (const auto& w : words) EXPECT_NE(r.status().message().find(w), std::string::npos) << w << " not in: " << r.status().message();
}

TEST_F(AdmissionTest, PendingJobsPerTenantAreCappedUntilJobsStartOrEnd) {
  config_.max_pending_jobs_per_tenant = 2;
  Open();
  const std::string a = MustSubmit(kVision, "a");
  MustSubmit(kVision, "b");
  ExpectRefused(Submit(kVision, "c"), StatusCode::kLimitExceeded,
                {"tenant 'vision'", "2 pending job(s)", "the limit is 2", "limits.maxPendingJobsPerTenant"});
  MustSubmit(kNlp, "other-tenant");  // one tenant's limit is not another's
  EXPECT_EQ(Listed(), 3u) << "the refused job is not stored";
  ExpectConsistent();

  // The counts come back from the store after a restart.
  Open();
  EXPECT_EQ(Listed(), 3u);
  ExpectRefused(Submit(kVision, "c"), StatusCode::kLimitExceeded, {"limits.maxPendingJobsPerTenant"});
  ExpectConsistent();

  // A cancel frees room.
  ASSERT_TRUE(service_->CancelJob(kVision, a).ok());
  const std::string c = MustSubmit(kVision, "c");
  ExpectRefused(Submit(kVision, "d"), StatusCode::kLimitExceeded, {"limits.maxPendingJobsPerTenant"});
  // So does a start: one GPU, one job placed.
  AddNode("n1", 1);
  EXPECT_EQ(service_->RunCycle(), 1);
  MustSubmit(kVision, "d");
  ExpectRefused(Submit(kVision, "e"), StatusCode::kLimitExceeded, {"limits.maxPendingJobsPerTenant"});
  ExpectConsistent();
  // A per-tenant override wins over the default, and the message names it.
  config_.tenant_limits["vision"].max_pending_jobs = 3;
  Open();
  MustSubmit(kVision, "e");
  ExpectRefused(Submit(kVision, "f"), StatusCode::kLimitExceeded, {"the limit is 3", "tenants.vision.maxPendingJobs"});
  ExpectConsistent();
}

TEST_F(AdmissionTest, PendingTasksPerTenantAndTasksPerJob) {
  config_.max_pending_tasks_per_tenant = 6;
  config_.max_tasks_per_job = 5;
  Open();
  MustSubmit(kVision, "four", 4);
  ExpectRefused(Submit(kVision, "three", 3), StatusCode::kLimitExceeded,
                {"4 pending task(s)", "adds 3", "the limit is 6", "limits.maxPendingTasksPerTenant"});
  MustSubmit(kVision, "two", 2);
  // Over the per-job cap is a bad spec, whatever is pending: 400 naming the field.
  ExpectRefused(Submit(kNlp, "big", 6), StatusCode::kInvalidArgument, {"tasks[0].replicas", "between 1 and 5"});
  EXPECT_EQ(Listed(), 2u);
  ExpectConsistent();
}

TEST_F(AdmissionTest, QueueCapsOnPendingJobsAndTasks) {
  ASSERT_TRUE(service_->CreateQueue({{"name", "small"}, {"maxPendingJobs", 1}, {"maxPendingTasks", 3}}).ok());
  MustSubmit(kVision, "a", 2, R"({"queue": "small"})");
  ExpectRefused(Submit(kNlp, "b", 1, R"({"queue": "small"})"), StatusCode::kLimitExceeded,
                {"queue 'small'", "the limit is 1", "queue.maxPendingJobs"});
  MustSubmit(kNlp, "elsewhere", 1);  // the default queue has no cap
  Open();                            // the caps are stored with the queue
  ExpectRefused(Submit(kNlp, "b", 1, R"({"queue": "small"})"), StatusCode::kLimitExceeded, {"queue.maxPendingJobs"});
  ASSERT_TRUE(service_->UpdateQueue("small", {{"maxPendingJobs", 5}}).ok());
  ExpectRefused(Submit(kNlp, "b", 2, R"({"queue": "small"})"), StatusCode::kLimitExceeded,
                {"2 pending task(s)", "adds 2", "queue.maxPendingTasks"});
  MustSubmit(kNlp, "b", 1, R"({"queue": "small"})");
  ExpectConsistent();
}

TEST_F(AdmissionTest, ConcurrentSubmissionsNeverOvershootTheLimit) {
  config_.max_pending_jobs_per_tenant = 40;
  Open();
  std::atomic<int> accepted{0}, refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        auto r = Submit(kVision, "j" + std::to_string(t) + "-" + std::to_string(i));
        if (r.ok()) {
          ++accepted;
        } else {
          EXPECT_EQ(r.status().code(), StatusCode::kLimitExceeded) << r.status().ToString();
          ++refused;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(accepted.load(), 40);
  EXPECT_EQ(refused.load(), 40);
  EXPECT_EQ(Listed(), 40u);
  ExpectConsistent();
}

TEST_F(AdmissionTest, QueueAccessRulesBindTenantsNotAdmins) {
  ASSERT_TRUE(service_
                  ->CreateQueue({{"name", "vision-only"},
                                 {"tenants", {"vision"}},
                                 {"maxPriority", 10},
                                 {"allowedQos", {"burstable", "best-effort"}}})
                  .ok());
  ASSERT_TRUE(service_->CreateQueue({{"name", "vision-child"}, {"parent", "vision-only"}}).ok());
  ExpectRefused(Submit(kNlp, "intruder", 1, R"({"queue": "vision-only"})"), StatusCode::kPermissionDenied,
                {"queue 'vision-only'", "tenant(s) vision only", "queue.tenants", "'nlp'"});
  // A parent's rules bind its children.
  ExpectRefused(Submit(kNlp, "intruder", 1, R"({"queue": "vision-child"})"), StatusCode::kPermissionDenied,
                {"queue 'vision-only' (parent of 'vision-child')", "queue.tenants"});
  ExpectRefused(Submit(kVision, "greedy", 1, R"({"queue": "vision-only", "priority": 1000000})"),
                StatusCode::kPermissionDenied, {"priority up to 10", "queue.maxPriority", "asks for 1000000"});
  ExpectRefused(Submit(kVision, "greedy", 1, R"({"queue": "vision-child", "qos": "guaranteed"})"),
                StatusCode::kPermissionDenied, {"burstable, best-effort", "queue.allowedQos", "not guaranteed"});
  MustSubmit(kVision, "fine", 1, R"({"queue": "vision-only", "priority": 10, "qos": "best-effort"})");
  // Admins may submit anywhere, for any tenant.
  MustSubmit(kAdmin, "ops", 1, R"({"queue": "vision-only", "tenant": "nlp", "priority": 1000000, "qos": "guaranteed"})");
  EXPECT_EQ(Listed(), 2u);
  // The rules are stored with the queue, and shown.
  Open();
  auto q = service_->GetQueue("vision-only");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ((*q)["tenants"], json({"vision"}));
  EXPECT_EQ((*q)["maxPriority"], 10);
  EXPECT_EQ((*q)["allowedQos"], json({"burstable", "best-effort"}));
  ExpectRefused(Submit(kNlp, "intruder", 1, R"({"queue": "vision-only"})"), StatusCode::kPermissionDenied,
                {"queue.tenants"});
  // null lifts a rule.
  ASSERT_TRUE(service_->UpdateQueue("vision-only", {{"tenants", nullptr}}).ok());
  MustSubmit(kNlp, "welcome", 1, R"({"queue": "vision-only"})");
  ExpectRefused(Submit(kNlp, "greedy", 1, R"({"queue": "vision-only", "priority": 11})"),
                StatusCode::kPermissionDenied, {"queue.maxPriority"});
  // Without rules (the default queue) every tenant may submit: `gpupool up` keeps working.
  MustSubmit(kNlp, "plain", 1, R"({"priority": 1000000, "qos": "guaranteed"})");
  ExpectConsistent();
}

TEST_F(AdmissionTest, QueueNamesAreCheckedAsJobSpecsCheckThem) {
  const std::vector<std::string> bad = {"a/b", "../etc", std::string("a\0b", 3), std::string(300, 'q'), "Upper",
                                        "", "-lead"};
  for (const std::string& name : bad) {
    auto r = service_->CreateQueue({{"name", name}});
    ExpectRefused(r, StatusCode::kInvalidArgument, {"queue.name: "});
  }
  ExpectRefused(service_->CreateQueue({{"name", "ok"}, {"parent", "../etc"}}), StatusCode::kInvalidArgument,
                {"queue.parent: "});
  ExpectRefused(service_->CreateQueue({{"name", "ok"}, {"tenants", {"a/b"}}}), StatusCode::kInvalidArgument,
                {"queue.tenants[0]: "});
  ExpectRefused(service_->CreateQueue({{"name", "ok"}, {"allowedQos", {"platinum"}}}),
                StatusCode::kInvalidArgument, {"queue.allowedQos[0]: "});
  ExpectRefused(service_->CreateQueue({{"name", "ok"}, {"maxPriority", 2000000}}), StatusCode::kInvalidArgument,
                {"queue.maxPriority: "});
  ExpectRefused(service_->CreateQueue({{"name", "ok"}, {"maxPendingJobs", 0}}), StatusCode::kInvalidArgument,
                {"queue.maxPendingJobs: "});
  auto list = service_->ListQueues();
  EXPECT_EQ(list["items"].size(), 1u) << list.dump();  // only "default"
  // A 63-byte name is the longest a job spec takes, and so the longest a queue may have.
  EXPECT_TRUE(service_->CreateQueue({{"name", std::string(63, 'q')}}).ok());
  ExpectRefused(service_->CreateQueue({{"name", std::string(64, 'q')}}), StatusCode::kInvalidArgument,
                {"over the limit of 63"});

  // The config's queues the same way.
  const std::string path = dir_ + "/config.yaml";
  std::ofstream(path) << "queues:\n  - name: a/b\n";
  auto c = LoadServerConfig(path);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("queues[0].name: "), std::string::npos) << c.status().message();
}

TEST_F(AdmissionTest, ListItemsAreSummariesUnlessTasksAreAskedFor) {
  const std::string id = MustSubmit(kVision, "four", 4);
  MustSubmit(kNlp, "one", 1);
  AddNode("n1", 1);
  EXPECT_EQ(service_->RunCycle(), 1);  // one GPU: "four" waits, "one" runs
  auto list = service_->ListJobs(kAdmin, {});
  ASSERT_TRUE(list.ok());
  ASSERT_EQ((*list)["items"].size(), 2u);
  const json& first = (*list)["items"][0];
  EXPECT_EQ(first["id"], id);
  EXPECT_FALSE(first.contains("tasks")) << first.dump();
  EXPECT_FALSE(first.contains("spec")) << first.dump();
  EXPECT_EQ(first["taskCounts"]["total"], 4);
  EXPECT_EQ(first["taskCounts"]["pending"], 4);
  EXPECT_EQ(first["state"], "pending");
  const json& second = (*list)["items"][1];
  EXPECT_EQ(second["state"], "running");
  EXPECT_EQ(second["taskCounts"]["assigned"], 1);
  EXPECT_EQ(second["taskCounts"]["pending"], 0);

  ListJobsQuery q;
  q.with_tasks = true;
  q.with_spec = true;
  list = service_->ListJobs(kVision, q);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ((*list)["items"].size(), 1u) << "a tenant sees its own jobs only";
  EXPECT_EQ((*list)["items"][0]["tasks"].size(), 4u);
  EXPECT_EQ((*list)["items"][0]["spec"]["name"], "four");
  q.limit = 101;
  ExpectRefused(service_->ListJobs(kAdmin, q), StatusCode::kInvalidArgument, {"limit", "100"});
  // The task counts follow the tasks.
  auto job = service_->GetJob(kAdmin, (*list)["items"][0]["id"]);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ((*job)["taskCounts"]["total"], 4);
  ExpectConsistent();
}

TEST_F(AdmissionTest, PagesWithTasksEndOnceTheyHoldTenThousandTasks) {
  for (int i = 0; i < 4; ++i) MustSubmit(kAdmin, "big" + std::to_string(i), 4000);
  ListJobsQuery q;
  q.with_tasks = true;
  auto page = service_->ListJobs(kAdmin, q);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ((*page)["items"].size(), 3u);  // 8,000 tasks, then the third reaches 12,000
  ASSERT_TRUE(page->contains("nextPageToken"));
  q.after_seq = std::stoull((*page)["nextPageToken"].get<std::string>());
  page = service_->ListJobs(kAdmin, q);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ((*page)["items"].size(), 1u);
  EXPECT_FALSE(page->contains("nextPageToken"));
  // Summaries have no such bound.
  EXPECT_EQ(Listed(), 4u);
}

TEST_F(AdmissionTest, FiltersAndTenantViewsPageInSeqOrder) {
  for (int i = 0; i < 5; ++i) {
    MustSubmit(kVision, "v" + std::to_string(i));
    MustSubmit(kNlp, "n" + std::to_string(i));
  }
  for (const Principal& who : {kVision, kAdmin}) {
    ListJobsQuery q;
    q.limit = 2;
    if (who.role == Role::kAdmin) q.tenants = {"vision"};
    std::vector<std::string> names;
    for (int page = 0; page < 10; ++page) {
      auto r = service_->ListJobs(who, q);
      ASSERT_TRUE(r.ok());
      for (const json& j : (*r)["items"]) names.push_back(j["name"]);
      if (!r->contains("nextPageToken")) break;
      q.after_seq = std::stoull((*r)["nextPageToken"].get<std::string>());
    }
    EXPECT_EQ(names, (std::vector<std::string>{"v0", "v1", "v2", "v3", "v4"}));
  }
  ListJobsQuery other;
  other.tenants = {"nlp"};
  EXPECT_TRUE((*service_->ListJobs(kVision, other))["items"].empty()) << "a tenant cannot list another's";
  ListJobsQuery pending;
  pending.states = {"pending"};
  pending.queues = {"default"};
  EXPECT_EQ((*service_->ListJobs(kAdmin, pending))["items"].size(), 10u);
}

}  // namespace
}  // namespace gpupool
