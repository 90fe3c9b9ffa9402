// MPS shares of different owners never share a GPU: a GPU's MPS control daemon runs one server at
// a time, for one uid, and makes a client of another uid wait until that server exits, so two
// tenants' MPS shares on one GPU would take turns rather than run. Whatever the policy, the arrival
// order or the departures; shares of one owner still pack together.
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

NodeIndex AddNode(TestCluster& c, const std::string& name, int gpus) {
  NodeSpec spec = MakeNode(name, MilliCpu(64000), MiB(256000), gpus, "T4", c.ledger().catalog());
  spec.labels[EnforceLabel(kEnforceMps)] = "true";
  spec.labels[EnforceLabel(kEnforceLimiter)] = "true";
  return c.AddSpec(std::move(spec));
}

TEST(MpsOwner, AnotherTenantsMpsShareWaitsForAGpuOfItsOwn) {
  for (const char* policy : kEveryPolicy) {
    SCOPED_TRACE(policy);
    TestCluster c;
    const NodeIndex n = AddNode(c, "t4", 1);
    Scheduler& s = BuildForShares(c, policy);
    const Decision a = DecideAndCommit(c, s, Task().Cpu(1000).Gpus(1, 250).Mps("alice"));
    ASSERT_TRUE(a.placed);
    ASSERT_EQ(a.placement.mps_owner, "alice");
    EXPECT_EQ(c.ledger().state(n).gpus[0].mps_shares, 1);
    EXPECT_EQ(c.ledger().mps_gpus(), 1);
    // Room for three more quarters, but the GPU's MPS server is alice's.
    const Decision b = s.Decide(Task().Cpu(1000).Gpus(1, 250).Mps("bob"));
    EXPECT_FALSE(b.placed);
    EXPECT_EQ(b.diagnosis.ToString(),
              "0/1 nodes fit: 1 GPUs with room hold MPS shares of another tenant (a GPU's MPS server runs for one "
              "tenant at a time)");
    // alice's next share, and shares that are not MPS, join it.
    EXPECT_TRUE(DecideAndCommit(c, s, Task().Cpu(1000).Gpus(1, 250).Mps("alice")).placed);
    const Decision limited = DecideAndCommit(c, s, Task().Cpu(1000).Gpus(1, 250).EnforcedBy(kEnforceLimiter));
    ASSERT_TRUE(limited.placed);
    EXPECT_FALSE(limited.placement.mps_owner.has_value());
    EXPECT_EQ(c.ledger().state(n).gpus[0].mps_shares, 2);
    EXPECT_TRUE(c.ledger().CheckInvariants().ok()) << c.ledger().CheckInvariants().ToString();
  }
}

TEST(MpsOwner, TheGpuIsAnyOwnersOnceItsLastMpsShareLeaves) {
  TestCluster c;
  const NodeIndex n = AddNode(c, "t4", 1);
  Scheduler& s = BuildForShares(c, "bestfit");
  auto a = s.Place(Task().Cpu(1000).Gpus(1, 250).Mps("alice"));
  ASSERT_TRUE(a.ok());
  auto a2 = s.Place(Task().Cpu(1000).Gpus(1, 250).Mps("alice"));
  ASSERT_TRUE(a2.ok());
  ASSERT_TRUE(c.ledger().Release(*a).ok());
  EXPECT_FALSE(s.Decide(Task().Cpu(1000).Gpus(1, 250).Mps("bob")).placed);
  ASSERT_TRUE(c.ledger().Release(*a2).ok());
  EXPECT_EQ(c.ledger().state(n).gpus[0].mps_shares, 0);
  EXPECT_EQ(c.ledger().mps_gpus(), 0);
  const Decision b = s.Decide(Task().Cpu(1000).Gpus(1, 250).Mps("bob"));
  ASSERT_TRUE(b.placed) << b.diagnosis.ToString();
  ASSERT_TRUE(c.ledger().Commit(b.placement).ok());
  EXPECT_EQ(c.ledger().mps_owner_name(c.ledger().state(n).gpus[0].mps_owner), "bob");
  EXPECT_TRUE(c.ledger().CheckInvariants().ok()) << c.ledger().CheckInvariants().ToString();
}

TEST(MpsOwner, TheSchedulerPicksAnotherGpuOfTheNodeRatherThanRefuse) {
  for (const char* policy : kEveryPolicy) {
    SCOPED_TRACE(policy);
    TestCluster c;
    AddNode(c, "t4x2", 2);
    Scheduler& s = BuildForShares(c, policy);
    const Decision a = DecideAndCommit(c, s, Task().Cpu(1000).Gpus(1, 250).Mps("alice"));
    ASSERT_TRUE(a.placed);
    const Decision b = DecideAndCommit(c, s, Task().Cpu(1000).Gpus(1, 250).Mps("bob"));
    ASSERT_TRUE(b.placed) << b.diagnosis.ToString();
    EXPECT_NE(a.placement.gpus[0].gpu, b.placement.gpus[0].gpu);
    // A third owner finds no GPU of its own.
    EXPECT_FALSE(s.Decide(Task().Cpu(1000).Gpus(1, 250).Mps("carol")).placed);
  }
}

TEST(MpsOwner, TheLedgerRefusesAPlacementThatBreaksTheRule) {
  TestCluster c;
  const NodeIndex n = AddNode(c, "t4", 1);
  Placement a;
  a.node = n;
  a.gpus.push_back(GpuGrant{0, MilliGpu(250), MiB(0), std::nullopt});
  a.share_task = true;
  a.enforced = true;
  a.mps_owner = "alice";
  ASSERT_TRUE(c.ledger().Commit(a).ok());
  Placement b = a;
  b.mps_owner = "bob";
  auto refused = c.ledger().Commit(b);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().ToString(),
            "FailedPrecondition: node 't4': GPU 0 holds MPS shares of 'alice', and its MPS server runs for one "
            "owner at a time (this share is 'bob''s)");
  EXPECT_EQ(c.ledger().state(n).gpus[0].tasks, 1);
  // A share that is not MPS joins it.
  Placement plain = a;
  plain.mps_owner.reset();
  ASSERT_TRUE(c.ledger().Commit(plain).ok());
  EXPECT_EQ(c.ledger().state(n).gpus[0].mps_shares, 1);
  EXPECT_TRUE(c.ledger().CheckInvariants().ok()) << c.ledger().CheckInvariants().ToString();
}

// Random arrivals and departures of MPS shares of three tenants beside shares of other kinds, on
// nodes of one to four GPUs, with and without the best-node index: after every step no GPU holds
// MPS shares of two owners (checked over the allocations, not the ledger's counters), every MPS
// placement names its owner, and the ledger's invariants hold. Not by placing nothing: one owner's
// shares share GPUs, and a share is refused only where another owner is in the way.
TEST(MpsOwner, PropertyNoGpuEverHoldsMpsSharesOfTwoOwners) {
  for (const char* policy : kEveryPolicy) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      SCOPED_TRACE(::testing::Message() << policy << " seed " << seed);
      SeededRng rng(seed * 104729);
      TestCluster c(seed);
      for (int i = 0; i < 4; ++i) AddNode(c, "n" + std::to_string(i), 1 + static_cast<int>(rng.Uniform(4)));
      Scheduler& s = BuildForShares(c, policy);
      s.SetBestNodeIndex(seed % 2 == 0);
      std::map<AllocationId, TaskRequest> live;
      int packed = 0, placed_mps = 0;
      static const std::string kOwners[] = {"alice", "bob", "carol"};
      for (int step = 0; step < 300; ++step) {
        if (!live.empty() && rng.Uniform(3) == 0) {
          auto it = live.begin();
          std::advance(it, static_cast<std::ptrdiff_t>(rng.Uniform(live.size())));
          ASSERT_TRUE(c.ledger().Release(it->first).ok());
          live.erase(it);
        }
        static constexpr int64_t kShares[] = {100, 250, 300, 500, 750, 1000};
        Task t;
        t.Cpu(500).Gpus(1, kShares[rng.Uniform(6)]);
        if (rng.Uniform(4) != 0) {
          t.Mps(kOwners[rng.Uniform(3)]);
        } else {
          t.EnforcedBy(kEnforceLimiter);
        }
        if (rng.Uniform(3) == 0) t.Guaranteed();
        const TaskRequest r = t.Build();
        const Decision d = s.Decide(r);
        if (!d.placed) continue;
        auto id = c.ledger().Commit(d.placement);
        ASSERT_TRUE(id.ok()) << id.status().ToString();
        live.emplace(*id, r);
        const bool mps_share = r.enforced_by == kEnforceMps && r.gpu_share < kWholeGpu;
        ASSERT_EQ(d.placement.mps_owner.has_value(), mps_share);
        if (mps_share) {
          ASSERT_EQ(*d.placement.mps_owner, r.mps_owner);
          ++placed_mps;
        }
        std::map<std::pair<NodeIndex, int>, std::multiset<std::string>> owners;
        for (const auto& [aid, p] : c.ledger().allocations())
          for (const GpuGrant& g : p.gpus)
            if (g.share < kWholeGpu && p.mps_owner) owners[{p.node, g.gpu}].insert(*p.mps_owner);
        for (const auto& [where, names] : owners) {
          ASSERT_EQ(std::set<std::string>(names.begin(), names.end()).size(), 1u)
              << "node " << where.first << " GPU " << where.second << " at step " << step;
          if (names.size() > 1) ++packed;
        }
        ASSERT_TRUE(c.ledger().CheckInvariants().ok()) << c.ledger().CheckInvariants().ToString();
      }
      EXPECT_GT(placed_mps, 30);
      EXPECT_GT(packed, 0);
    }
  }
}

}  // namespace
}  // namespace gpupool
