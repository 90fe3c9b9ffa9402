// Tests for queue ordering. Expectations are computed by hand in the comments: the shares of every
// group at each step, in the style of Mesos' sorter tests. Resources are written as terse strings
// in raw units ("cpu:2000;mem:1024;gpu:500" = 2 cores, 1 GiB, half a GPU).
#include "sched/queueing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <ctime>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/quantity.h"
#include "model/workload.h"

namespace gpupool {
namespace {

Resources R(const std::string& text) {
  Resources r;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(';', at);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(at, end - at);
    const size_t colon = item.find(':');
    const std::string key = item.substr(0, colon);
    const int64_t value = std::stoll(item.substr(colon + 1));
    if (key == "cpu") r.cpu = value;
    if (key == "mem") r.memory = value;
    if (key == "gpu") r.gpu = value;
    at = end + 1;
  }
  return r;
}

PendingEntry Pending(uint64_t seq, std::string tenant, std::string queue, int priority,
                     const std::string& demand) {
  return PendingEntry{seq, std::move(tenant), std::move(queue), priority, R(demand)};
}

QueueSpec Queue(std::string name, std::string parent = "", int64_t weight_milli = 1000,
                const std::string& guaranteed = "", const std::string& limit = "") {
  QueueSpec q;
  q.name = std::move(name);
  q.parent = std::move(parent);
  q.weight_milli = weight_milli;
  q.guaranteed = R(guaranteed);
  if (!limit.empty()) {
    q.limit = R(limit);
    // Components the limit string leaves out do not limit.
    if (limit.find("cpu") == std::string::npos) q.limit.cpu = kUnlimited;
    if (limit.find("mem") == std::string::npos) q.limit.memory = kUnlimited;
    if (limit.find("gpu") == std::string::npos) q.limit.gpu = kUnlimited;
  }
  return q;
}

QueueOrder MakeOrder(OrderingPolicy policy, std::vector<QueueSpec> queues,
                     std::map<std::string, int64_t> tenant_weights = {}) {
  QueueOrderOptions options;
  options.policy = policy;
  options.queues = std::move(queues);
  options.tenant_weight_milli = std::move(tenant_weights);
  auto order = QueueOrder::Create(std::move(options));
  EXPECT_TRUE(order.ok()) << order.status().ToString();
  return std::move(order).value();
}

// Places every job it is offered; returns the seqs in the order offered.
std::vector<uint64_t> DrainAll(const QueueOrder& order, const std::vector<PendingEntry>& pending,
                               const std::vector<UsageEntry>& usage, const Resources& total) {
  std::vector<uint64_t> offered;
  auto pass = order.Begin(pending, usage, total);
  while (auto i = pass.Next()) {
    offered.push_back(pending[*i].seq);
    pass.Placed(*i);
  }
  return offered;
}

// Simulates one pool of capacity `total`: a job is placed when its demand fits what is free and
// skipped otherwise. Returns the seqs placed, in order.
std::vector<uint64_t> DrainFit(const QueueOrder& order, const std::vector<PendingEntry>& pending,
                               const std::vector<UsageEntry>& usage, const Resources& total) {
  Resources free = total;
  for (const UsageEntry& u : usage) free -= u.used;
  std::vector<uint64_t> placed;
  auto pass = order.Begin(pending, usage, total);
  while (auto i = pass.Next()) {
    if (pending[*i].demand.AllLE(free)) {
      free -= pending[*i].demand;
      placed.push_back(pending[*i].seq);
      pass.Placed(*i);
    } else {
      pass.Skipped(*i);
    }
  }
  return placed;
}

// ---- resources, demand, names ----------------------------------------------------------------

TEST(ResourcesTest, Arithmetic) {
  Resources a{1000, 2048, 500};
  const Resources b{500, 1024, 500};
  EXPECT_EQ(a + b, (Resources{1500, 3072, 1000}));
  EXPECT_EQ(a - b, (Resources{500, 1024, 0}));
  a += b;
  EXPECT_EQ(a, (Resources{1500, 3072, 1000}));
  a -= b;
  EXPECT_EQ(a, (Resources{1000, 2048, 500}));
  EXPECT_TRUE(b.AllLE(a));
  EXPECT_FALSE(a.AllLE(b));
  EXPECT_TRUE((Resources{1000, 0, 0}).AllLE(Resources{1000, 0, 0}));
  EXPECT_FALSE((Resources{0, 0, 1}).AllLE(Resources{5000, 5000, 0}));
  EXPECT_TRUE(Resources{}.IsZero());
  EXPECT_FALSE((Resources{0, 0, 1}).IsZero());
}

TEST(JobDemandTest, SumsEveryTaskOfEveryGroup) {
  Job job;
  TaskGroup workers;
  workers.replicas = 2;
  workers.request.cpu = MilliCpu(4000);
  workers.request.memory = MiB(8192);
  workers.request.gpu_count = 2;
  workers.request.gpu_share = MilliGpu(500);
  TaskGroup mig;
  mig.replicas = 1;
  mig.request.cpu = MilliCpu(1000);
  mig.request.memory = MiB(1024);
  mig.request.gpu_count = 1;
  mig.request.mig_profile = "1g.10gb";
  TaskGroup cpu_only;
  cpu_only.replicas = 3;
  cpu_only.request.cpu = MilliCpu(250);
  job.groups = {workers, mig, cpu_only};
  // cpu: 2*4000 + 1000 + 3*250 = 9750; memory: 2*8192 + 1024 = 17408;
  // gpu: 2 tasks * 2 GPUs * 500 + one MIG instance counted as a whole GPU (1000) = 3000.
  EXPECT_EQ(JobDemand(job), (Resources{9750, 17408, 3000}));
  EXPECT_EQ(JobDemand(Job{}), Resources{});
}

TEST(FormatResourcesTest, HumanUnits) {
  EXPECT_EQ(FormatResources(Resources{2000, 8192, 250}), "cpu=2 mem=8Gi gpu=0.25");
  EXPECT_EQ(FormatResources(Resources{}), "cpu=0 mem=0Mi gpu=0");
  EXPECT_EQ(FormatResources(Resources{kUnlimited, kUnlimited, 4000}), "cpu=unlimited mem=unlimited gpu=4");
}

TEST(OrderingPolicyTest, NamesRoundTrip) {
  for (OrderingPolicy p : {OrderingPolicy::kFifo, OrderingPolicy::kPriority, OrderingPolicy::kDrf,
                           OrderingPolicy::kHierarchical}) {
    auto parsed = ParseOrderingPolicy(OrderingPolicyName(p));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, p);
  }
  EXPECT_EQ(OrderingPolicyName(OrderingPolicy::kDrf), "drf");
  auto bad = ParseOrderingPolicy("lottery");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("lottery"), std::string::npos);
}

// ---- Create: validation -----------------------------------------------------------------------

struct CreateCase {
  std::string label;
  std::vector<QueueSpec> queues;
  std::map<std::string, int64_t> tenant_weights;
  std::vector<std::string> error_contains;  // empty: OK
};

TEST(QueueOrderCreateTest, ValidatesEveryField) {
  QueueSpec negative_guarantee = Queue("a");
  negative_guarantee.guaranteed.cpu = -1;
  QueueSpec negative_limit = Queue("a");
  negative_limit.limit.memory = -5;
  const std::vector<CreateCase> cases = {
      {"empty list is fine (default is added)", {}, {}, {}},
      {"a tree", {Queue("a"), Queue("a/x", "a"), Queue("a/y", "a")}, {}, {}},
      {"child limit above parent's is allowed",
       {Queue("a", "", 1000, "", "gpu:1000"), Queue("a/x", "a", 1000, "", "gpu:8000")},
       {},
       {}},
      {"empty name", {Queue("")}, {}, {"queue #0", "name must not be empty"}},
      {"duplicate", {Queue("a"), Queue("a")}, {}, {"queue 'a'", "more than one"}},
      {"missing parent", {Queue("a", "zzz")}, {}, {"queue 'a'", "parent 'zzz' does not exist"}},
      {"own parent", {Queue("a", "a")}, {}, {"queue 'a'", "parent is itself"}},
      {"cycle", {Queue("a", "b"), Queue("b", "a")}, {}, {"queue 'a'", "cycle"}},
      {"zero weight", {Queue("a", "", 0)}, {}, {"queue 'a'", "weight_milli", "got 0"}},
      {"guarantee above limit",
       {Queue("a", "", 1000, "gpu:2000", "gpu:1000")},
       {},
       {"queue 'a'", "guaranteed.gpu (2)", "limit.gpu (1)"}},
      {"negative guarantee", {negative_guarantee}, {}, {"queue 'a'", "guaranteed.cpu", "negative"}},
      {"negative limit", {negative_limit}, {}, {"queue 'a'", "limit.memory", "negative"}},
      {"zero tenant weight", {}, {{"acme", 0}}, {"tenant 'acme'", "weight_milli"}},
  };
  for (const CreateCase& c : cases) {
    SCOPED_TRACE(c.label);
    QueueOrderOptions options;
    options.queues = c.queues;
    options.tenant_weight_milli = c.tenant_weights;
    auto order = QueueOrder::Create(options);
    if (c.error_contains.empty()) {
      EXPECT_TRUE(order.ok()) << order.status().ToString();
      continue;
    }
    ASSERT_FALSE(order.ok());
    EXPECT_EQ(order.status().code(), StatusCode::kInvalidArgument);
    for (const std::string& part : c.error_contains) {
      EXPECT_NE(order.status().message().find(part), std::string::npos)
          << "'" << part << "' not in: " << order.status().message();
    }
  }
}

TEST(QueueOrderCreateTest, AddsDefaultQueueOnlyWhenMissing) {
  QueueOrder added = MakeOrder(OrderingPolicy::kHierarchical, {Queue("a")});
  ASSERT_EQ(added.options().queues.size(), 2u);
  const QueueSpec* def = added.FindQueue("default");
  ASSERT_NE(def, nullptr);
  EXPECT_EQ(def->parent, "");
  EXPECT_EQ(def->weight_milli, 1000);
  EXPECT_TRUE(def->guaranteed.IsZero());
  EXPECT_EQ(def->limit, (Resources{kUnlimited, kUnlimited, kUnlimited}));
  EXPECT_TRUE(added.HasQueue(""));  // "" reads as "default"

  QueueOrder kept = MakeOrder(OrderingPolicy::kHierarchical, {Queue("default", "", 3000)});
  ASSERT_EQ(kept.options().queues.size(), 1u);
  EXPECT_EQ(kept.FindQueue("default")->weight_milli, 3000);
}

TEST(QueueOrderCreateTest, AncestryListsTheQueueThenItsParents) {
  QueueOrder order =
      MakeOrder(OrderingPolicy::kHierarchical, {Queue("a"), Queue("a/x", "a"), Queue("a/x/1", "a/x")});
  EXPECT_EQ(order.Ancestry("a/x/1"), (std::vector<std::string>{"a/x/1", "a/x", "a"}));
  EXPECT_EQ(order.Ancestry("a"), (std::vector<std::string>{"a"}));
  EXPECT_TRUE(order.Ancestry("nope").empty());
  EXPECT_FALSE(order.HasQueue("nope"));
  EXPECT_EQ(order.FindQueue("nope"), nullptr);
}

// ---- Admit ------------------------------------------------------------------------------------

TEST(QueueOrderAdmitTest, RejectsJobsThatCouldNeverRun) {
  QueueOrder order = MakeOrder(OrderingPolicy::kHierarchical,
                               {Queue("team", "", 1000, "", "gpu:4000"),
                                Queue("team/sub", "team", 1000, "", "cpu:16000;gpu:8000"), Queue("open")});
  struct Case {
    std::string queue;
    std::string demand;
    StatusCode code;
    std::vector<std::string> message_contains;
  };
  const std::vector<Case> cases = {
      {"open", "cpu:1000000;gpu:100000", StatusCode::kOk, {}},
      {"", "gpu:100000", StatusCode::kOk, {}},  // default: unlimited
      {"team/sub", "cpu:16000;gpu:4000", StatusCode::kOk, {}},
      // The child's own limit (8 GPUs) is fine, the parent's (4) is not.
      {"team/sub",
       "gpu:6000",
       StatusCode::kResourceExhausted,
       {"queue 'team/sub'", "gpu=6", "ancestor queue 'team'", "gpu=4", "never run"}},
      {"team/sub",
       "cpu:20000",
       StatusCode::kResourceExhausted,
       {"queue 'team/sub'", "cpu=20", "the queue's limit is cpu=16"}},
      {"team", "gpu:4001", StatusCode::kResourceExhausted, {"queue 'team'", "gpu=4.001"}},
      {"ghost", "gpu:1", StatusCode::kNotFound, {"ghost"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.queue + " " + c.demand);
    Status st = order.Admit(c.queue, R(c.demand));
    EXPECT_EQ(st.code(), c.code) << st.ToString();
    for (const std::string& part : c.message_contains) {
      EXPECT_NE(st.message().find(part), std::string::npos) << "'" << part << "' not in: " << st.message();
    }
  }
}

// ---- rules shared by every policy ---------------------------------------------------------------

class EveryPolicyTest : public ::testing::TestWithParam<OrderingPolicy> {
 protected:
  // "capped" may hold 2 GPUs and holds 1; "team" may hold 3 and its child "team/sub" (whose own
  // limit of 10 is looser than its parent's) holds 1.
  QueueOrder order_ = MakeOrder(
      GetParam(), {Queue("capped", "", 1000, "", "gpu:2000"), Queue("team", "", 1000, "", "gpu:3000"),
                   Queue("team/sub", "team", 1000, "", "gpu:10000")});
  std::vector<UsageEntry> usage_ = {{"x", "capped", R("gpu:1000")}, {"y", "team/sub", R("gpu:1000")}};
  std::vector<PendingEntry> pending_ = {
      Pending(1, "x", "capped", 0, "gpu:2000"),    // 1000 + 2000 > 2000: never
      Pending(2, "x", "capped", 0, "gpu:1000"),    // 1000 + 1000 <= 2000: offered
      Pending(3, "x", "capped", 0, "gpu:1000"),    // after 2 is placed: 2000 + 1000 > 2000
      Pending(4, "y", "team/sub", 0, "gpu:2000"),  // team: 1000 + 2000 <= 3000: offered
      Pending(5, "y", "team/sub", 0, "gpu:1000"),  // after 4: team 3000 + 1000 > 3000 (parent's limit)
      Pending(6, "y", "ghost", 0, "gpu:1"),        // unknown queue: never
      Pending(7, "z", "", 0, "gpu:500"),           // "" is the default queue: offered
  };
  Resources total_ = R("gpu:100000");
};

TEST_P(EveryPolicyTest, NeverOffersAJobOverItsQueueOrAncestorLimit) {
  std::vector<uint64_t> offered = DrainAll(order_, pending_, usage_, total_);
  std::sort(offered.begin(), offered.end());
  EXPECT_EQ(offered, (std::vector<uint64_t>{2, 4, 7}));
}

TEST_P(EveryPolicyTest, SkippedJobsAreNotOfferedAgainAndDoNotUseQuota) {
  // Nothing is placed, so usage stays as it began: 3 and 5 now fit their limits too.
  std::multiset<uint64_t> offered;
  auto pass = order_.Begin(pending_, usage_, total_);
  while (auto i = pass.Next()) {
    offered.insert(pending_[*i].seq);
    pass.Skipped(*i);
  }
  EXPECT_EQ(offered, (std::multiset<uint64_t>{2, 3, 4, 5, 7}));
}

TEST_P(EveryPolicyTest, NextRepeatsUntilTheJobIsSettled) {
  auto pass = order_.Begin(pending_, usage_, total_);
  auto first = pass.Next();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(pass.Next(), first);
  pass.Placed(*first);
  pass.Placed(*first);           // repeats are ignored
  pass.Placed(pending_.size());  // so are indices out of range
  pass.Skipped(pending_.size());
  EXPECT_NE(pass.Next(), first);
}

TEST_P(EveryPolicyTest, EmptyPass) {
  auto pass = order_.Begin({}, usage_, total_);
  EXPECT_FALSE(pass.Next().has_value());
}

TEST_P(EveryPolicyTest, PassOutlivesItsInputsAndTheOrder) {
  std::optional<QueueOrder::Pass> pass;
  {
    QueueOrder order = MakeOrder(GetParam(), {Queue("a")});
    std::vector<PendingEntry> pending = {Pending(1, "t", "a", 0, "gpu:1000"),
                                         Pending(2, "t", "a", 0, "gpu:1000")};
    pass.emplace(order.Begin(pending, {}, total_));
  }
  int n = 0;
  while (auto i = pass->Next()) {
    pass->Placed(*i);
    ++n;
  }
  EXPECT_EQ(n, 2);
}

INSTANTIATE_TEST_SUITE_P(Policies, EveryPolicyTest,
                         ::testing::Values(OrderingPolicy::kFifo, OrderingPolicy::kPriority,
                                           OrderingPolicy::kDrf, OrderingPolicy::kHierarchical),
                         [](const ::testing::TestParamInfo<OrderingPolicy>& param_info) {
                           return std::string(OrderingPolicyName(param_info.param));
                         });

// ---- FIFO and priority ----------------------------------------------------------------------------

TEST(FifoTest, BySeqWhateverThePriorityOrInputOrder) {
  QueueOrder order = MakeOrder(OrderingPolicy::kFifo, {});
  const std::vector<PendingEntry> pending = {Pending(5, "a", "", 9, "gpu:1"), Pending(1, "b", "", 0, "gpu:1"),
                                             Pending(3, "a", "", -4, "gpu:1")};
  EXPECT_EQ(DrainAll(order, pending, {}, R("gpu:1000")), (std::vector<uint64_t>{1, 3, 5}));
}

TEST(PriorityTest, PriorityDescendingThenSeq) {
  QueueOrder order = MakeOrder(OrderingPolicy::kPriority, {});
  const std::vector<PendingEntry> pending = {
      Pending(1, "a", "", 0, "gpu:1"), Pending(4, "b", "", 10, "gpu:1"), Pending(2, "a", "", 10, "gpu:1"),
      Pending(3, "c", "", -1, "gpu:1")};
  EXPECT_EQ(DrainAll(order, pending, {}, R("gpu:1000")), (std::vector<uint64_t>{2, 4, 1, 3}));
}

TEST(PriorityTest, AJobThatDoesNotFitDoesNotBlockTheOnesBehind) {
  QueueOrder order = MakeOrder(OrderingPolicy::kPriority, {});
  // 1 GPU free. The 2-GPU job goes first and is skipped; both 1-GPU jobs follow, the second skipped.
  const std::vector<PendingEntry> pending = {Pending(1, "a", "", 5, "gpu:2000"),
                                             Pending(2, "a", "", 1, "gpu:1000"),
                                             Pending(3, "a", "", 0, "gpu:1000")};
  EXPECT_EQ(DrainFit(order, pending, {}, R("gpu:1000")), (std::vector<uint64_t>{2}));
}

// ---- DRF --------------------------------------------------------------------------------------

// The example of the DRF paper (Ghodsi et al., NSDI 2011): 9 CPUs, 18 GiB; tenant a runs tasks of
// <1 CPU, 4 GiB>, tenant b tasks of <3 CPU, 1 GiB>.
TEST(DrfTest, InterleavesTenantsByDominantShare) {
  QueueOrder order = MakeOrder(OrderingPolicy::kDrf, {});
  std::vector<PendingEntry> pending;
  for (uint64_t i = 0; i < 5; ++i) pending.push_back(Pending(10 + i, "a", "", 0, "cpu:1000;mem:4096"));
  for (uint64_t i = 0; i < 5; ++i) pending.push_back(Pending(20 + i, "b", "", 0, "cpu:3000;mem:1024"));
  // step  a: cpu, mem -> dominant     b: cpu, mem -> dominant     next
  //  1    0                          0                           a (tie: name)
  //  2    1/9, 4/18 -> 2/9           0                           b
  //  3    2/9                        3/9, 1/18 -> 1/3            a (2/9 < 1/3)
  //  4    2/9, 8/18 -> 4/9           1/3                         b (1/3 < 4/9)
  //  5    4/9                        6/9, 2/18 -> 2/3            a (4/9 < 2/3)
  //  6    3/9, 12/18 -> 2/3          2/3                         a (exact tie 12/18 = 6/9: name)
  // Free from step 6 on: 0 CPUs, 4 GiB, so every further job is skipped: a runs 3 tasks and b 2,
  // as in the paper.
  EXPECT_EQ(DrainFit(order, pending, {}, R("cpu:9000;mem:18432")),
            (std::vector<uint64_t>{10, 20, 11, 21, 12}));
}

TEST(DrfTest, WeightedTenantsConvergeToTheirWeights) {
  // Tenants weighted 1:1:2, each with more unit jobs (1 GPU) than the 100-GPU cluster holds. Every
  // round places a, b, c, c: after round k, a = b = k GPUs (share k/100, weighted k/100) and
  // c = 2k GPUs (share 2k/100, weighted 2k/100 / 2 = k/100) — all tied, ties go by name. 25 rounds
  // fill the cluster: dominant shares 25 %, 25 %, 50 %.
  QueueOrder order = MakeOrder(OrderingPolicy::kDrf, {}, {{"c", 2000}});
  std::vector<PendingEntry> pending;
  uint64_t seq = 0;
  for (const std::string tenant : {"c", "b", "a"}) {
    for (int i = 0; i < 150; ++i) pending.push_back(Pending(++seq, tenant, "", 0, "gpu:1000"));
  }
  const Resources total = R("gpu:100000");
  std::vector<uint64_t> placed = DrainFit(order, pending, {}, total);
  ASSERT_EQ(placed.size(), 100u);
  std::map<std::string, int64_t> gpus;
  std::vector<UsageEntry> usage;
  for (uint64_t s : placed) {
    const PendingEntry& p = pending[s - 1];
    gpus[p.tenant] += p.demand.gpu;
    usage.push_back({p.tenant, "", p.demand});
  }
  EXPECT_NEAR(gpus["a"], 25000, 1000);
  EXPECT_NEAR(gpus["b"], 25000, 1000);
  EXPECT_NEAR(gpus["c"], 50000, 1000);
  // Weighted shares are all 25 %.
  for (const std::string tenant : {"a", "b", "c"}) {
    EXPECT_NEAR(order.TenantSharePpm(tenant, usage, total), 250000, 10000) << tenant;
  }
}

TEST(DrfTest, RunningUsageCountsAndPriorityOrdersWithinATenant) {
  QueueOrder order = MakeOrder(OrderingPolicy::kDrf, {});
  // a already holds half the GPUs (share 1/2); b holds nothing (0), so b goes first. Then b has
  // nothing left, and a's jobs go by priority: seq 2 (priority 5) before seq 1 (priority 0).
  const std::vector<UsageEntry> usage = {{"a", "", R("gpu:5000")}};
  const std::vector<PendingEntry> pending = {Pending(1, "a", "", 0, "gpu:1000"),
                                             Pending(2, "a", "", 5, "gpu:1000"),
                                             Pending(3, "b", "", 0, "gpu:1000")};
  EXPECT_EQ(DrainAll(order, pending, usage, R("gpu:10000")), (std::vector<uint64_t>{3, 2, 1}));
}

TEST(DrfTest, ComponentsWithoutATotalAreSkipped) {
  QueueOrder order = MakeOrder(OrderingPolicy::kDrf, {});
  // The cluster reports no memory total: a's 100 GiB count for nothing; its share is cpu 1/10,
  // b's is gpu 2/10, so a goes first.
  const std::vector<UsageEntry> usage = {{"a", "", R("cpu:1000;mem:102400")}, {"b", "", R("gpu:2000")}};
  const std::vector<PendingEntry> pending = {Pending(1, "b", "", 0, "gpu:1"),
                                             Pending(2, "a", "", 0, "gpu:1")};
  EXPECT_EQ(DrainAll(order, pending, usage, R("cpu:10000;gpu:10000")), (std::vector<uint64_t>{2, 1}));
}

TEST(DrfTest, SharesAreComparedExactlyEvenBeyondDoublePrecision) {
  QueueOrder order = MakeOrder(OrderingPolicy::kDrf, {});
  // a's share is (2^61 + 2) / (2^62 + 2), a hair above 1/2; b's is exactly 1/2. As doubles both are
  // 0.5 and the tie would go to a by name; exactly, b is lower and goes first. (The weighted
  // denominators exceed 2^64, which exercises the wide comparison.)
  const int64_t two61 = int64_t{1} << 61;
  const int64_t two62 = int64_t{1} << 62;
  const Resources total{two62 + 2, two62, 0};
  const std::vector<UsageEntry> usage = {{"a", "", Resources{two61 + 2, 0, 0}},
                                         {"b", "", Resources{0, two61, 0}}};
  const std::vector<PendingEntry> pending = {Pending(1, "a", "", 0, "cpu:1"),
                                             Pending(2, "b", "", 0, "cpu:1")};
  EXPECT_EQ(DrainAll(order, pending, usage, total), (std::vector<uint64_t>{2, 1}));
}

// ---- hierarchical -------------------------------------------------------------------------------

TEST(HierarchicalTest, GuaranteesFirstThenWeightedShare) {
  // 10 GPUs. prod guarantees 4 and holds 3 (ratio 3/4); dev guarantees 2 and holds 1 (ratio 1/2);
  // batch guarantees nothing, weight 2. Every job asks for 1 GPU; all are placed.
  QueueOrder order = MakeOrder(
      OrderingPolicy::kHierarchical,
      {Queue("prod", "", 1000, "gpu:4000"), Queue("dev", "", 1000, "gpu:2000"), Queue("batch", "", 2000)});
  const std::vector<UsageEntry> usage = {{"t", "prod", R("gpu:3000")}, {"t", "dev", R("gpu:1000")}};
  std::vector<PendingEntry> pending;
  for (uint64_t s = 1; s <= 3; ++s) pending.push_back(Pending(s, "t", "prod", 0, "gpu:1000"));
  for (uint64_t s = 4; s <= 6; ++s) pending.push_back(Pending(s, "t", "dev", 0, "gpu:1000"));
  for (uint64_t s = 7; s <= 9; ++s) pending.push_back(Pending(s, "t", "batch", 0, "gpu:1000"));
  // step  under guarantee (ratio)     the rest (weighted share)              next
  //  1    prod 3/4, dev 1/2           batch 0                                dev (lowest ratio)
  //  2    prod 3/4                    dev 2/10, batch 0   (dev at 2/2: out)  prod
  //  3    -                           prod 4/10, dev 2/10, batch 0           batch
  //  4    -                           prod 4/10, dev 2/10, batch 1/10/2      batch
  //  5    -                           prod 4/10, dev 2/10, batch 2/10/2      batch (its last)
  //  6    -                           prod 4/10, dev 2/10                    dev
  //  7    -                           prod 4/10, dev 3/10                    dev (its last)
  //  8,9  -                           prod                                   prod, prod
  EXPECT_EQ(DrainAll(order, pending, usage, R("gpu:10000")),
            (std::vector<uint64_t>{4, 1, 7, 8, 9, 5, 6, 2, 3}));
}

TEST(HierarchicalTest, RecursesIntoChildrenAndJobsOnInnerQueuesFormAnImplicitLeaf) {
  // 8 GPUs. Tree: eng (weight 1) with children eng/train (weight 3) and eng/infer (weight 1) and
  // jobs of its own (e); ops (weight 1). All jobs ask for 1 GPU and all are placed.
  QueueOrder order = MakeOrder(OrderingPolicy::kHierarchical, {Queue("eng"), Queue("eng/train", "eng", 3000),
                                                               Queue("eng/infer", "eng"), Queue("ops")});
  std::vector<PendingEntry> pending = {
      Pending(1, "t", "eng/train", 0, "gpu:1000"), Pending(2, "t", "eng/train", 0, "gpu:1000"),
      Pending(3, "t", "eng/train", 0, "gpu:1000"), Pending(4, "t", "eng/train", 0, "gpu:1000"),
      Pending(5, "t", "eng/infer", 0, "gpu:1000"), Pending(6, "t", "eng/infer", 0, "gpu:1000"),
      Pending(7, "t", "ops", 0, "gpu:1000"),       Pending(8, "t", "ops", 0, "gpu:1000"),
      Pending(9, "t", "eng", 0, "gpu:1000"),
  };
  // step  root: eng, ops           inside eng: "" (own jobs), infer, train (weighted)      next
  //  1    0, 0 -> eng (name)       0, 0, 0 -> "" (the implicit leaf wins ties)             9
  //  2    1/8, 0 -> ops                                                                    7
  //  3    1/8, 1/8 -> eng          "" done; infer 0, train 0 -> infer (name)               5
  //  4    2/8, 1/8 -> ops (its last)                                                       8
  //  5    eng                      infer 1/8, train 0                                      1
  //  6    eng                      infer 1/8, train 1/8/3 = 1/24                           2
  //  7    eng                      infer 3/24, train 2/24                                  3
  //  8    eng                      infer 1/8, train 3/24: tie -> infer (name; its last)    6
  //  9    eng                      train                                                   4
  EXPECT_EQ(DrainAll(order, pending, {}, R("gpu:8000")), (std::vector<uint64_t>{9, 7, 5, 8, 1, 2, 3, 6, 4}));
}

TEST(HierarchicalTest, ComponentsWithoutAGuaranteeDoNotCountAgainstIt) {
  // g guarantees 4 GPUs and nothing else. It holds 50 cores (half the cluster) and 1 GPU: still
  // under its guarantee (GPU ratio 1/4; CPU has no guarantee), so it goes before h, whose share is 0.
  QueueOrder order = MakeOrder(OrderingPolicy::kHierarchical, {Queue("g", "", 1000, "gpu:4000"), Queue("h")});
  const std::vector<UsageEntry> usage = {{"t", "g", R("cpu:50000;gpu:1000")}};
  const std::vector<PendingEntry> pending = {Pending(1, "t", "h", 0, "gpu:1000"),
                                             Pending(2, "t", "g", 0, "gpu:1000")};
  EXPECT_EQ(DrainAll(order, pending, usage, R("cpu:100000;gpu:10000")), (std::vector<uint64_t>{2, 1}));
}

TEST(HierarchicalTest, PriorityThenSeqWithinALeaf) {
  QueueOrder order = MakeOrder(OrderingPolicy::kHierarchical, {Queue("a")});
  const std::vector<PendingEntry> pending = {
      Pending(1, "t", "a", 0, "gpu:1"), Pending(2, "u", "a", 3, "gpu:1"), Pending(3, "t", "a", 3, "gpu:1")};
  EXPECT_EQ(DrainAll(order, pending, {}, R("gpu:1000")), (std::vector<uint64_t>{2, 3, 1}));
}

TEST(HierarchicalTest, AQueueWhoseJobsNoLongerFitItsLimitStepsAside) {
  // a (limit 2 GPUs) and b share the cluster; a would go first every time (weight 10), but once a
  // holds 2 GPUs its remaining jobs are over its limit and b's jobs go.
  QueueOrder order =
      MakeOrder(OrderingPolicy::kHierarchical, {Queue("a", "", 10000, "", "gpu:2000"), Queue("b")});
  std::vector<PendingEntry> pending;
  for (uint64_t s = 1; s <= 4; ++s) pending.push_back(Pending(s, "t", "a", 0, "gpu:1000"));
  for (uint64_t s = 5; s <= 6; ++s) pending.push_back(Pending(s, "t", "b", 0, "gpu:1000"));
  // step 1: a 0, b 0 -> a (name). 2: a 1/10/10, b 0 -> b. 3: a 1/100, b 1/10 -> a (now at its limit).
  // 4: a's jobs 3 and 4 are over the limit: dropped; b.
  EXPECT_EQ(DrainAll(order, pending, {}, R("gpu:10000")), (std::vector<uint64_t>{1, 5, 2, 6}));
}

// ---- metrics ----------------------------------------------------------------------------------

TEST(QueueOrderMetricsTest, SharesAndUsageInPpm) {
  QueueOrder order = MakeOrder(OrderingPolicy::kHierarchical,
                               {Queue("a", "", 2000, "cpu:4000;gpu:2000"), Queue("a/x", "a")}, {{"u", 500}});
  const std::vector<UsageEntry> usage = {{"t", "a/x", R("cpu:2000;gpu:1000")},
                                         {"u", "a", R("gpu:1000")},
                                         {"t", "gone", R("gpu:7000")}};  // a deleted queue: tenant only
  const Resources total = R("cpu:10000;gpu:4000");                       // no memory total
  auto used = order.QueueUsage(usage);
  EXPECT_EQ(used["a"], R("cpu:2000;gpu:2000"));  // its subtree
  EXPECT_EQ(used["a/x"], R("cpu:2000;gpu:1000"));
  EXPECT_EQ(used["default"], Resources{});
  EXPECT_EQ(used.count("gone"), 0u);
  // a: max(cpu 2/10, gpu 2/4) = 1/2, weight 2 -> 1/4. a/x: max(2/10, 1/4) = 1/4, weight 1.
  EXPECT_EQ(order.QueueSharePpm("a", usage, total), 250000);
  EXPECT_EQ(order.QueueSharePpm("a/x", usage, total), 250000);
  EXPECT_EQ(order.QueueSharePpm("default", usage, total), 0);
  EXPECT_EQ(order.QueueSharePpm("nope", usage, total), 0);
  // t: max(2/10, 8/4) = 2 (the cluster is over-reported: fine, it is just a number).
  EXPECT_EQ(order.TenantSharePpm("t", usage, total), 2000000);
  // u: 1/4 at weight 0.5 -> 1/2.
  EXPECT_EQ(order.TenantSharePpm("u", usage, total), 500000);
  // a's guarantee ratio: max(cpu 2000/4000, gpu 2000/2000) = 1.
  EXPECT_EQ(order.GuaranteeRatioPpm("a", usage), 1000000);
  EXPECT_EQ(order.GuaranteeRatioPpm("a/x", usage), 0);  // guarantees nothing
}

// ---- performance ------------------------------------------------------------------------------

// 10,000 pending jobs in 20 queues (4 parents with 4 leaves each, plus default and 3 flat ones), 50
// tenants, through a full pass with a fit check (about 45 % of the jobs are placed, the rest are
// offered and skipped), for every policy. No timing assertion; the CPU time shows in the test log.
// Measured on the shared 2-core dev box (RelWithDebInfo, load ~10): 1.5-2.5 ms per pass for fifo
// and priority, 3-5 ms for drf and hierarchical, against a budget of 10 ms. Run:
//   build-queue/queueing_test --gtest_filter='*TenThousand*' --gtest_repeat=5
TEST(QueueOrderPerformanceTest, TenThousandJobsInTwentyQueues) {
  std::vector<QueueSpec> queues;
  std::vector<std::string> leaves;
  for (int p = 0; p < 4; ++p) {
    const std::string parent = "p" + std::to_string(p);
    queues.push_back(Queue(parent, "", 1000 + 500 * p, "gpu:" + std::to_string(5000 * p)));
    for (int c = 0; c < 4; ++c) {
      leaves.push_back(parent + "/c" + std::to_string(c));
      queues.push_back(Queue(leaves.back(), parent, 1000 * (c + 1), "", c == 3 ? "gpu:20000" : ""));
    }
  }
  for (int f = 0; f < 3; ++f) {
    leaves.push_back("flat" + std::to_string(f));
    queues.push_back(Queue(leaves.back()));
  }
  leaves.push_back("default");
  std::vector<PendingEntry> pending;
  for (uint64_t i = 0; i < 10000; ++i) {
    pending.push_back(Pending(
        i, "tenant" + std::to_string(i * 7 % 50), leaves[i * 13 % leaves.size()], static_cast<int>(i % 5),
        "cpu:" + std::to_string(1000 + i % 4 * 1000) + ";mem:4096;gpu:" + std::to_string(250 * (1 + i % 8))));
  }
  const Resources total = R("cpu:10000000;mem:40960000;gpu:5000000");  // about half the jobs fit
  for (OrderingPolicy policy : {OrderingPolicy::kFifo, OrderingPolicy::kPriority, OrderingPolicy::kDrf,
                                OrderingPolicy::kHierarchical}) {
    QueueOrder order = MakeOrder(policy, queues);
    // CPU time, not wall time: the dev box is shared and wall time mostly measures the neighbours.
    const std::clock_t start = std::clock();
    std::vector<uint64_t> placed = DrainFit(order, pending, {}, total);
    const std::clock_t elapsed = std::clock() - start;
    std::cout << OrderingPolicyName(policy) << ": " << placed.size() << " placed, "
              << elapsed * 1000000 / CLOCKS_PER_SEC << " us CPU\n";
    EXPECT_GT(placed.size(), 1000u);
    EXPECT_LT(placed.size(), 10000u);
    EXPECT_EQ(std::set<uint64_t>(placed.begin(), placed.end()).size(), placed.size());
  }
}

}  // namespace
}  // namespace gpupool
