// Tests for preemption candidates: one table, one row per rule, with the queue usage that decides
// each row worked out in its comment. GPUs are in milli-GPU ("gpu:2000" = 2 GPUs).
#include "sched/preemption.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace gpupool {
namespace {

constexpr QosClass kBE = QosClass::kBestEffort;
constexpr QosClass kBurst = QosClass::kBurstable;
constexpr QosClass kGuar = QosClass::kGuaranteed;
constexpr PreemptReason kPrio = PreemptReason::kPriority;
constexpr PreemptReason kReclaim = PreemptReason::kReclaim;

Resources Gpu(int64_t milli) {
  return Resources{0, 0, milli};
}

QueueSpec Queue(std::string name, std::string parent, int64_t guaranteed_gpu,
                int64_t limit_gpu = kUnlimited) {
  QueueSpec q;
  q.name = std::move(name);
  q.parent = std::move(parent);
  q.guaranteed.gpu = guaranteed_gpu;
  q.limit.gpu = limit_gpu;
  return q;
}

// The queues every row uses:
//   a       guarantees 4 GPUs
//   b       guarantees 2 GPUs
//   c       guarantees nothing
//   p       guarantees 4 GPUs, with children p/1 (guarantees 2) and p/2 (guarantees nothing)
//   capped  may hold at most 4 GPUs
QueueOrder Queues(OrderingPolicy policy) {
  QueueOrderOptions options;
  options.policy = policy;
  options.queues = {Queue("a", "", 4000),        Queue("b", "", 2000),    Queue("c", "", 0),
                    Queue("p", "", 4000),        Queue("p/1", "p", 2000), Queue("p/2", "p", 0),
                    Queue("capped", "", 0, 4000)};
  auto order = QueueOrder::Create(options);
  EXPECT_TRUE(order.ok()) << order.status().ToString();
  return std::move(order).value();
}

RunningEntry Running(uint64_t seq, std::string queue, int priority, QosClass qos, int64_t gpu,
                     int64_t started_ms = 0) {
  return RunningEntry{seq, "t", std::move(queue), priority, qos, Gpu(gpu), started_ms};
}

struct Preemptor {
  std::string queue;
  int priority;
  QosClass qos;
  int64_t demand_gpu;
};
Preemptor By(std::string queue, int priority, QosClass qos, int64_t demand_gpu) {
  return {std::move(queue), priority, qos, demand_gpu};
}

struct Case {
  std::string label;
  Preemptor preemptor;
  std::vector<RunningEntry> running;
  std::vector<std::pair<uint64_t, PreemptReason>> expected;  // victims by seq, in eviction order
};

// The rules read only the queue tree, so every row must hold whatever the ordering policy is.
TEST(PreemptionCandidatesTest, Rules) {
  const std::vector<Case> cases = {
      {"only best-effort jobs are victims",
       By("c", 10, kBurst, 1000),
       {Running(1, "c", 0, kGuar, 1000), Running(2, "c", 0, kBurst, 1000), Running(3, "c", 0, kBE, 1000)},
       {{3, kPrio}}},
      {"by priority: strictly lower only; c guarantees nothing, so no reclaim",
       By("c", 5, kBurst, 1000),
       {Running(1, "b", 5, kBE, 1000), Running(2, "a", 4, kBE, 1000), Running(3, "c", 6, kBE, 1000)},
       {{2, kPrio}}},
      {"reclaim: a holds 1 of its 4, +2 stays within; c (no guarantee) holds 1 -> over; b holds 1 of "
       "its 2 -> not over",
       By("a", 1, kBurst, 2000),
       {Running(1, "a", 0, kBurst, 1000), Running(2, "c", 9, kBE, 1000), Running(3, "b", 9, kBE, 1000)},
       {{2, kReclaim}}},
      {"a guaranteed-QoS preemptor reclaims too",
       By("a", 1, kGuar, 2000),
       {Running(2, "c", 9, kBE, 1000)},
       {{2, kReclaim}}},
      {"a best-effort preemptor preempts only by priority",
       By("a", 1, kBE, 2000),
       {Running(1, "a", 0, kBurst, 1000), Running(2, "c", 9, kBE, 1000), Running(3, "c", 0, kBE, 1000)},
       {{3, kPrio}}},
      {"no reclaim when the demand overshoots the guarantee: a holds 3 of 4, +2 = 5 > 4",
       By("a", 1, kBurst, 2000),
       {Running(1, "a", 0, kBurst, 3000), Running(2, "c", 9, kBE, 1000)},
       {}},
      {"no reclaim for a demand on nothing guaranteed (a guarantees GPUs, the job wants none)",
       By("a", 1, kBurst, 0),
       {Running(2, "c", 9, kBE, 1000)},
       {}},
      {"the same queue: only by priority (a holds 2 of 4 and is owed the job, yet seq 2 stays)",
       By("a", 1, kBurst, 1000),
       {Running(1, "a", 0, kBE, 1000), Running(2, "a", 5, kBE, 1000)},
       {{1, kPrio}}},
      {"a job eligible by both rules is reported as priority",
       By("a", 5, kBurst, 1000),
       {Running(1, "c", 1, kBE, 1000)},
       {{1, kPrio}}},
      {"siblings below a common parent: p/1 (0 of 2) is owed, p/2 (no guarantee, holds 3) is over",
       By("p/1", 0, kBurst, 1000),
       {Running(1, "p/2", 9, kBE, 3000)},
       {{1, kReclaim}}},
      {"the parent's guarantee does not let a child raid its sibling: p (3 of 4) is owed, but it is the "
       "common ancestor; below it, p/2 guarantees nothing",
       By("p/2", 0, kBurst, 1000),
       {Running(1, "p/1", 9, kBE, 3000)},
       {}},
      {"an owed parent reclaims from outside: p holds 0 of 4 (p/2 none), c is over",
       By("p/2", 0, kBurst, 1000),
       {Running(1, "c", 9, kBE, 1000)},
       {{1, kReclaim}}},
      {"a victim on the preemptor's ancestor (jobs on inner queue p): only by priority",
       By("p/1", 1, kBurst, 1000),
       {Running(1, "p", 9, kBE, 5000), Running(2, "p", 0, kBE, 1000)},
       {{2, kPrio}}},
      {"eviction order: lowest priority, then latest start, then highest seq",
       By("c", 10, kBurst, 1000),
       {Running(1, "c", 1, kBE, 1000, 100), Running(2, "c", 0, kBE, 1000, 100),
        Running(3, "c", 0, kBE, 1000, 300), Running(4, "c", 0, kBE, 1000, 300),
        Running(5, "c", 2, kBE, 1000, 500)},
       {{4, kPrio}, {3, kPrio}, {2, kPrio}, {1, kPrio}, {5, kPrio}}},
      {"reclaim stops once the victim's queue is back at its guarantee: b holds 4 of 2; latest first: "
       "seq 3 (b -> 3), seq 2 (b -> 2, at its guarantee), seq 1 not listed",
       By("a", 1, kBurst, 1000),
       {Running(1, "b", 5, kBE, 2000, 100), Running(2, "b", 5, kBE, 1000, 200),
        Running(3, "b", 5, kBE, 1000, 300)},
       {{3, kReclaim}, {2, kReclaim}}},
      {"priority victims listed earlier count too: seq 1 (priority 0, b -> 2) leaves b at its "
       "guarantee, so seq 2 is no reclaim victim",
       By("a", 1, kBurst, 1000),
       {Running(1, "b", 0, kBE, 1000, 100), Running(2, "b", 5, kBE, 2000, 200)},
       {{1, kPrio}}},
      {"over its limit, a job can only gain from victims inside the limited queue: capped holds 4 of "
       "4, +1 > 4, so the later-started victim in c is not listed",
       By("capped", 5, kBurst, 1000),
       {Running(1, "capped", 0, kBE, 2000, 100), Running(2, "capped", 0, kBurst, 2000, 100),
        Running(3, "c", 0, kBE, 1000, 900)},
       {{1, kPrio}}},
      {"an unknown preemptor queue: priority only",
       By("ghost", 5, kBurst, 1000),
       {Running(1, "c", 0, kBE, 1000), Running(2, "c", 9, kBE, 1000)},
       {{1, kPrio}}},
      {"a victim in an unknown queue: priority only",
       By("a", 5, kBurst, 1000),
       {Running(1, "gone", 0, kBE, 1000), Running(2, "gone", 9, kBE, 1000)},
       {{1, kPrio}}},
      {"\"\" is the default queue (no guarantee): over, so a reclaims from it",
       By("a", 0, kBurst, 1000),
       {Running(1, "", 9, kBE, 1000)},
       {{1, kReclaim}}},
  };
  for (OrderingPolicy policy : {OrderingPolicy::kFifo, OrderingPolicy::kPriority, OrderingPolicy::kDrf,
                                OrderingPolicy::kHierarchical}) {
    SCOPED_TRACE(OrderingPolicyName(policy));
    const QueueOrder order = Queues(policy);
    for (const Case& c : cases) {
      SCOPED_TRACE(c.label);
      // Usage is exactly what the running jobs hold.
      std::vector<UsageEntry> usage;
      for (const RunningEntry& r : c.running) usage.push_back({r.tenant, r.queue, r.used});
      const PendingEntry preemptor{100, "t", c.preemptor.queue, c.preemptor.priority,
                                   Gpu(c.preemptor.demand_gpu)};
      std::vector<std::pair<uint64_t, PreemptReason>> got;
      for (const PreemptionCandidate& pc :
           PreemptionCandidates(order, preemptor, c.preemptor.qos, c.running, usage)) {
        got.emplace_back(c.running[pc.index].seq, pc.reason);
      }
      EXPECT_EQ(got, c.expected);
    }
  }
}

TEST(PreemptionCandidatesTest, IndicesPointIntoRunning) {
  const QueueOrder order = Queues(OrderingPolicy::kHierarchical);
  const std::vector<RunningEntry> running = {Running(7, "c", 0, kBurst, 1000), Running(8, "c", 0, kBE, 1000)};
  const PendingEntry preemptor{1, "t", "c", 1, Gpu(1000)};
  EXPECT_EQ(PreemptionCandidates(order, preemptor, kBurst, running, {}),
            (std::vector<PreemptionCandidate>{{1, kPrio}}));
}

TEST(PreemptionCandidatesTest, ReasonNames) {
  EXPECT_EQ(PreemptReasonName(kPrio), "priority");
  EXPECT_EQ(PreemptReasonName(kReclaim), "reclaim");
}

}  // namespace
}  // namespace gpupool
