// QoS when tasks share a GPU: a guaranteed share goes only beside shares something holds to their
// size (the CUDA limiter, MPS limits set through the control daemon), and a share nothing holds never
// joins a GPU with a guaranteed one — whatever the policy, the arrival order or the departures.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "common/rng.h"
#include "sched/test_util.h"

namespace gpupool {
namespace {

using testutil::Task;
using testutil::TestCluster;
using testutil::BuildForShares;
using testutil::DecideAndCommit;
using testutil::kEveryPolicy;

// A node of `gpus` T4s whose agent offers `enforces` (kEnforce* bits) through its labels.
NodeIndex AddNode(TestCluster& c, const std::string& name, int gpus, uint8_t enforces) {
  NodeSpec spec = MakeNode(name, MilliCpu(64000), MiB(256000), gpus, "T4", c.ledger().catalog());
  for (uint8_t bit : kEnforceBits)
    if (enforces & bit) spec.labels[EnforceLabel(bit)] = "true";
  return c.AddSpec(std::move(spec));
}

TEST(QosIsolation, NodeLabelsSayWhatHoldsSharesThere) {
  TestCluster c;
  const NodeIndex a = AddNode(c, "a", 1, kEnforceLimiter | kEnforceMps);
  const NodeIndex b = AddNode(c, "b", 1, 0);
  EXPECT_EQ(c.ledger().state(a).enforces, kEnforceLimiter | kEnforceMps);
  EXPECT_EQ(c.ledger().state(b).enforces, 0);
  EXPECT_EQ(EnforceLabel(kEnforceLimiterContainer), "gpupool.io/enforce-limiter-container");
  EXPECT_EQ(ShareEnforcementOf({{"gpupool.io/enforce-mps", "false"}, {"gpupool.io/enforce-limiter", "true"}}),
            kEnforceLimiter);
}

TEST(QosIsolation, AGuaranteedShareIsNeverPlacedBesideAShareNothingHolds) {
  for (const char* policy : kEveryPolicy) {
    SCOPED_TRACE(policy);
    TestCluster c;
    const NodeIndex n = AddNode(c, "t4", 1, kEnforceLimiter);
    Scheduler& s = BuildForShares(c, policy);
    // A timeslice container share: the limiter is not in containers on this node.
    const Decision loose = DecideAndCommit(c, s, Task().Cpu(1000).Gpus(1, 250).EnforcedBy(kEnforceLimiterContainer));
    ASSERT_TRUE(loose.placed);
    EXPECT_FALSE(loose.placement.enforced);
    EXPECT_EQ(c.ledger().state(n).gpus[0].unlimited_shares, 1);
    const Decision g = s.Decide(Task().Cpu(1000).Gpus(1, 250).Guaranteed().EnforcedBy(kEnforceMps));
    EXPECT_FALSE(g.placed);
    EXPECT_EQ(g.diagnosis.ToString(),
              "0/1 nodes fit: 1 GPUs with room hold shares not held to their size (a guaranteed share shares "
              "only with enforced ones)");
  }
}

TEST(QosIsolation, AShareNothingHoldsNeverJoinsAGuaranteedOneButAnEnforcedShareDoes) {
  for (const char* policy : kEveryPolicy) {
    SCOPED_TRACE(policy);
    TestCluster c;
    const NodeIndex n = AddNode(c, "t4", 1, kEnforceLimiter);
    Scheduler& s = BuildForShares(c, policy);
    // Nothing holds an MPS share on this node (its agent sets no MPS limits), but QoS lets a
    // guaranteed share sit alone.
    const Decision g = DecideAndCommit(c, s, Task().Cpu(1000).Gpus(1, 500).Guaranteed().EnforcedBy(kEnforceMps));
    ASSERT_TRUE(g.placed) << g.diagnosis.ToString();
    EXPECT_TRUE(g.placement.guaranteed);
    EXPECT_FALSE(g.placement.enforced);
    EXPECT_EQ(c.ledger().state(n).guaranteed_gpus, 1);
    const Decision loose = s.Decide(Task().Cpu(1000).Gpus(1, 250));
    EXPECT_FALSE(loose.placed);
    EXPECT_EQ(loose.diagnosis.ToString(),
              "0/1 nodes fit: 1 GPUs with room hold a guaranteed share, and nothing on this node would hold "
              "the task to its share");
    // A timeslice process share: the limiter holds it here.
    const Decision held = DecideAndCommit(c, s, Task().Cpu(1000).Gpus(1, 250).EnforcedBy(kEnforceLimiter));
    ASSERT_TRUE(held.placed) << held.diagnosis.ToString();
    EXPECT_TRUE(held.placement.enforced);
    // A second guaranteed share may not join: the first is held by nothing.
    EXPECT_FALSE(s.Decide(Task().Cpu(1000).Gpus(1, 250).Guaranteed().EnforcedBy(kEnforceLimiter)).placed);
    EXPECT_TRUE(c.ledger().CheckInvariants().ok());
  }
}

TEST(QosIsolation, TheSchedulerPicksAnotherGpuOfTheNodeRatherThanRefuse) {
  for (const char* policy : kEveryPolicy) {
    SCOPED_TRACE(policy);
    TestCluster c;
    const NodeIndex n = AddNode(c, "t4x2", 2, kEnforceLimiter);
    Scheduler& s = BuildForShares(c, policy);
    const Decision g = DecideAndCommit(c, s, Task().Cpu(1000).Gpus(1, 500).Guaranteed().EnforcedBy(kEnforceLimiter));
    ASSERT_TRUE(g.placed);
    const Decision loose = DecideAndCommit(c, s, Task().Cpu(1000).Gpus(1, 250));
    ASSERT_TRUE(loose.placed) << loose.diagnosis.ToString();
    EXPECT_NE(loose.placement.gpus[0].gpu, g.placement.gpus[0].gpu);
    EXPECT_EQ(c.ledger().state(n).gpus[static_cast<size_t>(g.placement.gpus[0].gpu)].tasks, 1);
  }
}

TEST(QosIsolation, AWholeGpuIsNotAShare) {
  TestCluster c;
  const NodeIndex n = AddNode(c, "t4x2", 2, 0);
  Scheduler& s = BuildForShares(c, "bestfit");
  ASSERT_TRUE(DecideAndCommit(c, s, Task().Cpu(1000).Gpus(1, 500).Guaranteed()).placed);
  // A whole GPU of an unlimited task shares nothing: it goes on the free GPU.
  const Decision whole = DecideAndCommit(c, s, Task().Cpu(1000).Gpus(1, 1000));
  ASSERT_TRUE(whole.placed) << whole.diagnosis.ToString();
  EXPECT_EQ(c.ledger().state(n).gpus[static_cast<size_t>(whole.placement.gpus[0].gpu)].unlimited_shares, 0);
}

TEST(QosIsolation, TheLedgerRefusesAPlacementThatBreaksTheRule) {
  TestCluster c;
  const NodeIndex n = AddNode(c, "t4", 1, 0);
  Placement g;
  g.node = n;
  g.gpus.push_back(GpuGrant{0, MilliGpu(500), MiB(0), std::nullopt});
  g.share_task = true;
  g.guaranteed = true;
  g.enforced = true;
  ASSERT_TRUE(c.ledger().Commit(g).ok());
  Placement loose = g;
  loose.guaranteed = false;
  loose.enforced = false;
  loose.gpus[0].share = MilliGpu(250);
  auto refused = c.ledger().Commit(loose);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().ToString(),
            "FailedPrecondition: node 't4': GPU 0 holds a guaranteed share, and a share nothing holds to its size "
            "may not share a GPU with it");
  EXPECT_EQ(c.ledger().state(n).gpus[0].tasks, 1);
  EXPECT_TRUE(c.ledger().CheckInvariants().ok());
}

// Random arrivals and departures of shares of every kind on nodes that hold different things: after
// every step no GPU has a guaranteed share beside another task's share that nothing holds, each
// placement says truly whether its node holds it, and the ledger's invariants hold.
TEST(QosIsolation, PropertyNoGuaranteedShareEverSharesAGpuWithAnUnlimitedOne) {
  for (const char* policy : kEveryPolicy) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      SCOPED_TRACE(::testing::Message() << policy << " seed " << seed);
      SeededRng rng(seed * 7919);
      TestCluster c(seed);
      std::vector<uint8_t> node_bits;
      for (int i = 0; i < 4; ++i) {
        const auto bits = static_cast<uint8_t>(rng.Uniform(8));
        node_bits.push_back(bits);
        AddNode(c, "n" + std::to_string(i), 1 + static_cast<int>(rng.Uniform(4)), bits);
      }
      Scheduler& s = BuildForShares(c, policy);
      std::map<AllocationId, TaskRequest> live;
      int placed_guaranteed = 0, beside_guaranteed = 0;
      for (int step = 0; step < 300; ++step) {
        if (!live.empty() && rng.Uniform(3) == 0) {
          auto it = live.begin();
          std::advance(it, static_cast<std::ptrdiff_t>(rng.Uniform(live.size())));
          ASSERT_TRUE(c.ledger().Release(it->first).ok());
          live.erase(it);
        }
        static constexpr int64_t kShares[] = {100, 250, 300, 500, 750, 1000};
        static constexpr uint8_t kBits[] = {0, kEnforceLimiter, kEnforceLimiterContainer, kEnforceMps};
        Task t;
        t.Cpu(500).Gpus(1, kShares[rng.Uniform(6)]).EnforcedBy(kBits[rng.Uniform(4)]);
        if (rng.Uniform(3) == 0) t.Guaranteed();
        const TaskRequest r = t.Build();
        const Decision d = s.Decide(r);
        if (!d.placed) continue;
        auto id = c.ledger().Commit(d.placement);
        ASSERT_TRUE(id.ok()) << id.status().ToString();
        live.emplace(*id, r);
        const bool held = r.enforced_by != 0 && (node_bits[d.placement.node] & r.enforced_by) != 0;
        ASSERT_EQ(d.placement.enforced, held);
        ASSERT_EQ(d.placement.guaranteed, r.guaranteed);
        placed_guaranteed += r.guaranteed ? 1 : 0;
        // Independently of the ledger's counters: every pair of tasks on one GPU.
        std::map<std::pair<NodeIndex, int>, std::vector<const Placement*>> by_gpu;
        for (const auto& [aid, p] : c.ledger().allocations())
          for (const GpuGrant& g : p.gpus)
            if (g.share < kWholeGpu) by_gpu[{p.node, g.gpu}].push_back(&p);
        for (const auto& [where, ps] : by_gpu) {
          for (const Placement* a : ps) {
            for (const Placement* b : ps) {
              if (a == b) continue;
              ASSERT_FALSE(a->guaranteed && !b->enforced)
                  << "node " << where.first << " GPU " << where.second << " at step " << step;
              if (a->guaranteed && !b->guaranteed) ++beside_guaranteed;
            }
          }
        }
        ASSERT_TRUE(c.ledger().CheckInvariants().ok()) << c.ledger().CheckInvariants().ToString();
      }
      // The rule is not met by placing nothing: guaranteed shares were placed, and shared GPUs.
      EXPECT_GT(placed_guaranteed, 10);
      EXPECT_GT(beside_guaranteed, 0);
    }
  }
}

}  // namespace
}  // namespace gpupool
