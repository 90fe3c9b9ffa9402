#include "server/config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace gpupool {
namespace {

std::string WriteTemp(const std::string& text) {
  char tmpl[] = "/tmp/gpupool-config-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  ::close(fd);
  std::ofstream(tmpl) << text;
  return tmpl;
}

TEST(ServerConfigTest, ReadsEverySection) {
  const std::string path = WriteTemp(R"(
listen: 0.0.0.0:9000
tokens:
  - {token: admin-token-0123456789, role: admin}
  - {token: vision-token-0123456789, role: tenant, tenant: vision}
  - {token: agent-token-0123456789, role: agent}
ordering: drf
tenants: {vision: {weight: 2, maxPendingJobs: 50, maxPendingTasks: 500}}
queues:
  - {name: research, weight: 1, tenants: [vision, nlp], maxPriority: 100, allowedQos: [burstable, best-effort], maxPendingJobs: 7, maxPendingTasks: 70}
  - {name: vision, parent: research, weight: 2.5, guaranteed: {gpu: 4, cpu: 32}, limit: {gpu: 8, memory: 1Ti}}
profile: bestfit
preemption: {enabled: false, gracePeriodSeconds: 10}
backfill: {reserveAfterSeconds: 120}
heartbeat: {intervalSeconds: 2, timeoutSeconds: 10}
hotspot: {temperatureC: 80, utilization: 0.99, memoryUsedFraction: 0.95, windowSeconds: 20, cooldownSeconds: 300, migrate: false}
limits: {maxBodyBytes: 65536, maxJobsPerCycle: 100, maxPendingJobsPerTenant: 20, maxPendingTasksPerTenant: 200, maxTasksPerJob: 64, maxNodes: 7}
store: {synchronous: normal, finishedJobRetentionSeconds: 3600}
)");
  auto c = LoadServerConfig(path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->listen, "0.0.0.0:9000");
  ASSERT_EQ(c->tokens.size(), 3u);
  EXPECT_EQ(c->tokens.at("vision-token-0123456789").tenant, "vision");
  EXPECT_EQ(c->tokens.at("agent-token-0123456789").role, Role::kAgent);
  EXPECT_EQ(c->ordering.policy, OrderingPolicy::kDrf);
  EXPECT_EQ(c->ordering.tenant_weight_milli.at("vision"), 2000);
  ASSERT_EQ(c->ordering.queues.size(), 2u);
  EXPECT_EQ(c->max_pending_jobs_per_tenant, 20);
  EXPECT_EQ(c->max_pending_tasks_per_tenant, 200);
  EXPECT_EQ(c->max_tasks_per_job, 64);
  EXPECT_EQ(c->max_nodes, 7);
  EXPECT_EQ(c->tenant_limits.at("vision").max_pending_jobs, 50);
  EXPECT_EQ(c->tenant_limits.at("vision").max_pending_tasks, 500);
  const QueueSpec& r = c->ordering.queues[0];
  EXPECT_EQ(r.tenants, (std::vector<std::string>{"vision", "nlp"}));
  EXPECT_EQ(r.max_priority, 100);
  EXPECT_EQ(r.allowed_qos, (std::vector<QosClass>{QosClass::kBurstable, QosClass::kBestEffort}));
  EXPECT_EQ(r.max_pending_jobs, 7);
  EXPECT_EQ(r.max_pending_tasks, 70);
  // What the store keeps reads back the same.
  auto again = ParseQueueJson(QueueSpecJson(r), "stored");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->tenants, r.tenants);
  EXPECT_EQ(again->max_priority, r.max_priority);
  EXPECT_EQ(again->allowed_qos, r.allowed_qos);
  EXPECT_EQ(again->max_pending_jobs, r.max_pending_jobs);
  EXPECT_EQ(again->max_pending_tasks, r.max_pending_tasks);
  const QueueSpec& v = c->ordering.queues[1];
  EXPECT_EQ(v.parent, "research");
  EXPECT_EQ(v.weight_milli, 2500);
  EXPECT_EQ(v.guaranteed.gpu, 4000);
  EXPECT_EQ(v.guaranteed.cpu, 32000);
  EXPECT_EQ(v.limit.gpu, 8000);
  EXPECT_EQ(v.limit.memory, 1024 * 1024);
  EXPECT_EQ(v.limit.cpu, kUnlimited);
  EXPECT_FALSE(c->preemption);
  EXPECT_EQ(c->grace_period_seconds, 10);
  EXPECT_EQ(c->reserve_after_seconds, 120);
  EXPECT_EQ(c->heartbeat_interval_seconds, 2);
  EXPECT_EQ(c->heartbeat_timeout_seconds, 10);
  EXPECT_EQ(c->hotspot.temperature_c, 80);
  EXPECT_EQ(c->hotspot.utilization, 0.99);
  EXPECT_EQ(c->hotspot.memory_used_fraction, 0.95);
  EXPECT_EQ(c->hotspot.window_seconds, 20);
  EXPECT_EQ(c->hotspot.cooldown_seconds, 300);
  EXPECT_FALSE(c->hotspot.migrate);
  EXPECT_EQ(c->max_body_bytes, 65536u);
  EXPECT_FALSE(c->sync_full);
  EXPECT_EQ(c->finished_job_retention_seconds, 3600);
  std::filesystem::remove(path);
}

TEST(ServerConfigTest, ErrorsNameTheKey) {
  struct Case {
    const char* yaml;
    const char* expect;
  } cases[] = {
      {"listne: x\n", "listne: unknown key"},
      {"tokens: [{token: short, role: admin}]\n", "tokens[0].token: must be at least 16"},
      {"tokens: [{token: 0123456789abcdef0, role: tenant}]\n", "tokens[0].tenant: a tenant token needs"},
      {"tokens: [{token: 0123456789abcdef0, role: root}]\n", "tokens[0].role: must be admin"},
      {"ordering: random\n", "ordering"},
      {"queues: [{name: a, weight: 0}]\n", "queues[0].weight"},
      {"queues: [{name: a, limit: {gpus: 2}}]\n", "queues[0].limit.gpus: unknown resource"},
      {"queues: [{name: a, parent: nope}]\n", "nope"},
      {"preemption: {gracePeriodSeconds: -1}\n", "preemption.gracePeriodSeconds"},
      {"listen: nohost\n", "host:port"},
      {"store: {synchronous: sometimes}\n", "store.synchronous"},
      {"store: {finishedJobRetentionSeconds: -1}\n", "store.finishedJobRetentionSeconds: must be in [0, "},
      {"store: {finishedJobRetentionSeconds: 1d}\n", "store.finishedJobRetentionSeconds: must be an integer"},
      {"store: {retention: 5}\n", "store.retention: unknown key"},
      {"heartbeat: {intervalSeconds: 5, timeoutSeconds: 11}\n", "heartbeat.timeoutSeconds: must be at least"},
      {"heartbeat: {timeoutSeconds: 3}\n", "twice intervalSeconds plus two (4), got 3"},
      {"hotspot: {temperature: 80}\n", "hotspot.temperature: unknown key"},
      {"hotspot: {utilization: 1.5}\n", "hotspot.utilization: must be in [0, 1]"},
      {"hotspot: {windowSeconds: -1}\n", "hotspot.windowSeconds"},
      {"tokens: [{token: 0123456789abcdef0, role: tenant, tenant: Team A}]\n", "tokens[0].tenant: 'Team A' must be"},
      {"limits: {maxPendingJobsPerTenant: 0}\n", "limits.maxPendingJobsPerTenant: must be in [1, "},
      {"limits: {maxPendingTasksPerTenant: many}\n", "limits.maxPendingTasksPerTenant: must be an integer"},
      {"limits: {maxTasksPerJob: 1000000}\n", "limits.maxTasksPerJob: must be in [1, 100000]"},
      {"limits: {maxNodes: 0}\n", "limits.maxNodes: must be in [1, 1000000]"},
      {"limits: {maxPendingJobs: 5}\n", "limits.maxPendingJobs: unknown key"},
      {"tenants: {vision: {maxPendingJobs: -1}}\n", "tenants.vision.maxPendingJobs: must be in [1, "},
      {"tenants: {vision: {maxJobs: 1}}\n", "tenants.vision.maxJobs: unknown key"},
      {"tenants: {Vision/x: {weight: 1}}\n", "tenants.Vision/x: "},
      {"queues: [{name: a/b}]\n", "queues[0].name: "},
      {"queues: [{name: '../etc'}]\n", "queues[0].name: "},
      {"queues: [{name: a, tenants: vision}]\n", "queues[0].tenants: must be a list"},
      {"queues: [{name: a, tenants: [vision, vision]}]\n", "queues[0].tenants[1]: tenant 'vision' is listed twice"},
      {"queues: [{name: a, allowedQos: [gold]}]\n", "queues[0].allowedQos[0]: must be guaranteed"},
      {"queues: [{name: a, maxPriority: 1.5}]\n", "queues[0].maxPriority: must be an integer"},
      {"queues: [{name: a, maxPendingTasks: 0}]\n", "queues[0].maxPendingTasks: must be in [1, "},
  };
  for (const auto& c : cases) {
    const std::string path = WriteTemp(c.yaml);
    auto r = LoadServerConfig(path);
    EXPECT_FALSE(r.ok()) << c.yaml;
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos)
        << c.yaml << " -> " << r.status().message();
    std::filesystem::remove(path);
  }
}

TEST(ServerConfigTest, AdminTokenIsCreatedPrivateAndReused) {
  char tmpl[] = "/tmp/gpupool-token-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  auto first = EnsureAdminToken(dir);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_GE(first->size(), 32u);
  struct stat st {};
  ASSERT_EQ(::stat((dir + "/admin.token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto second = EnsureAdminToken(dir);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*first, *second);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gpupool
