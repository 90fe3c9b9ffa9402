// The MIG planner (sched/mig_planner.h): where a new instance goes given the instances tasks hold
// and those the agent reported, and the scheduler's choice among GPUs with it.
#include "sched/mig_planner.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "sched/test_util.h"

namespace gpupool {
namespace {

using testutil::Task;
using testutil::TestCluster;

class MigPlannerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const GpuModelSpec* model = catalog_.Find("A100-80GB");
    ASSERT_NE(model, nullptr);
    ASSERT_TRUE(model->mig.has_value());
    geo_ = &*model->mig;
  }
  const MigProfile& P(const char* name) const { return *geo_->Find(name); }
  MigInstance At(const char* name, int start) const { return {P(name).driver_id, start}; }
  MigLayout Layout(const std::vector<MigInstance>& instances) const {
    auto l = MigLayoutOf(*geo_, instances);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    return l.ok() ? *l : MigLayout{};
  }

  const GpuCatalog catalog_ = GpuCatalog::Builtin();
  const MigGeometry* geo_ = nullptr;
};

TEST_F(MigPlannerTest, OnAnEmptyGpuTheStartKeepsTheBigProfilesPlaceable) {
  // 1g at slice 6 leaves 4g@0 and 3g@0 possible; at slice 0 neither 4g nor 7g would fit any more.
  const auto one = PlanMigInstance(*geo_, MigLayout{}, nullptr, P("1g.10gb"));
  ASSERT_TRUE(one);
  EXPECT_EQ(one->instance, At("1g.10gb", 6));
  EXPECT_FALSE(one->reuse);
  EXPECT_EQ(one->changes(), 1);
  // 3g at slice 4 leaves the 4g (start 0 only); at slice 0 the other half takes a 3g at most.
  const auto three = PlanMigInstance(*geo_, MigLayout{}, nullptr, P("3g.40gb"));
  ASSERT_TRUE(three);
  EXPECT_EQ(three->instance, At("3g.40gb", 4));
  // 2g at 4 keeps 4g@0 (and 3g@0); at 0 or 2 it would not.
  EXPECT_EQ(PlanMigInstance(*geo_, MigLayout{}, nullptr, P("2g.20gb"))->instance, At("2g.20gb", 4));
  EXPECT_GT(MigFutureCapacity(*geo_, Layout({At("3g.40gb", 4)})), MigFutureCapacity(*geo_, Layout({At("3g.40gb", 0)})));
}

TEST_F(MigPlannerTest, AnIdleInstanceOfTheProfileIsReusedWhereverItIs) {
  // The reported 1g at slice 0 is worse for the future than a new one at 6, but changes nothing.
  const MigLayout present = Layout({At("1g.10gb", 0)});
  const auto plan = PlanMigInstance(*geo_, MigLayout{}, &present, P("1g.10gb"));
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->instance, At("1g.10gb", 0));
  EXPECT_TRUE(plan->reuse);
  EXPECT_EQ(plan->changes(), 0);
  EXPECT_EQ(plan->destroyed, 0);
}

TEST_F(MigPlannerTest, AHeldInstanceIsNeverReusedNorDestroyed) {
  // Both 3g instances exist; the one at 4 is held. The task gets the one at 0.
  const MigLayout present = Layout({At("3g.40gb", 0), At("3g.40gb", 4)});
  const MigLayout held = Layout({At("3g.40gb", 4)});
  const auto plan = PlanMigInstance(*geo_, held, &present, P("3g.40gb"));
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->instance, At("3g.40gb", 0));
  EXPECT_TRUE(plan->reuse);
  // With both held there is no room, whatever exists.
  const MigLayout full = Layout({At("3g.40gb", 0), At("3g.40gb", 4)});
  EXPECT_FALSE(PlanMigInstance(*geo_, full, &present, P("1g.10gb")));
}

TEST_F(MigPlannerTest, IdleInstancesInTheWayAreDestroyedFewestFirst) {
  // Held: a 1g at 0. Idle: 1g at 4, 5 and 6, and a 2g at 2. A 3g can only go at 4 (0 is held):
  // the three idle 1g there go.
  const MigLayout present = Layout({At("1g.10gb", 0), At("2g.20gb", 2), At("1g.10gb", 4), At("1g.10gb", 5),
                                    At("1g.10gb", 6)});
  const MigLayout held = Layout({At("1g.10gb", 0)});
  const auto three = PlanMigInstance(*geo_, held, &present, P("3g.40gb"));
  ASSERT_TRUE(three);
  EXPECT_EQ(three->instance, At("3g.40gb", 4));
  EXPECT_FALSE(three->reuse);
  EXPECT_EQ(three->destroyed, 3);
  EXPECT_EQ(three->changes(), 4);
  // A 1g.20gb (2 memory slices): at 2 it replaces the idle 2g, at 4 or 6 one or two idle 1g go; the
  // free slices 6-7 hold only the 1g at 6. Fewest destroyed: 1 (at 2, 4 or 6), then the most room.
  const auto wide = PlanMigInstance(*geo_, held, &present, P("1g.20gb"));
  ASSERT_TRUE(wide);
  EXPECT_EQ(wide->destroyed, 1);
  EXPECT_FALSE(wide->reuse);
}

// Over random held and reported layouts: the plan is a valid addition to the held instances, counts
// exactly the idle reported instances it overlaps, reuses only what exists and is idle, and no other
// start is better by the planner's own order.
TEST_F(MigPlannerTest, PlansAreValidAndBestOverRandomLayouts) {
  std::mt19937 rng(7);
  std::vector<const MigProfile*> profiles;
  for (const MigProfile& p : geo_->profiles) profiles.push_back(&p);
  for (int round = 0; round < 2000; ++round) {
    MigLayout present;
    for (int k = 0; k < 6; ++k) {
      const MigProfile& p = *profiles[rng() % profiles.size()];
      if (const auto s = present.FreeStarts(*geo_, p); s != 0) {
        std::vector<int> starts;
        for (int b = 0; b < 8; ++b)
          if (s & (1u << b)) starts.push_back(b);
        (void)present.Add(*geo_, {p.driver_id, starts[rng() % starts.size()]});
      }
    }
    MigLayout held;
    for (const MigInstance& m : present.instances()) {
      if (rng() % 3 == 0) {
        ASSERT_TRUE(held.Add(*geo_, m).ok());
      }
    }
    const MigProfile& want = *profiles[rng() % profiles.size()];
    const auto plan = PlanMigInstance(*geo_, held, &present, want);
    ASSERT_EQ(plan.has_value(), held.FreeStarts(*geo_, want) != 0);
    if (!plan) continue;
    MigLayout after = held;
    ASSERT_TRUE(after.Add(*geo_, plan->instance).ok());
    EXPECT_EQ(plan->reuse, present.Contains(plan->instance));
    int overlapping = 0;
    for (const MigInstance& m : present.instances())
      if (!held.Contains(m) && MigOverlap(*geo_, m, plan->instance)) ++overlapping;
    EXPECT_EQ(plan->destroyed, plan->reuse ? 0 : overlapping);
    for (int s = 0; s < 8; ++s) {
      if ((held.FreeStarts(*geo_, want) & (1u << s)) == 0) continue;
      MigPlan other;
      other.instance = {want.driver_id, s};
      other.reuse = present.Contains(other.instance);
      for (const MigInstance& m : present.instances())
        if (!other.reuse && !held.Contains(m) && MigOverlap(*geo_, m, other.instance)) ++other.destroyed;
      MigLayout with = held;
      ASSERT_TRUE(with.Add(*geo_, other.instance).ok());
      other.future = MigFutureCapacity(*geo_, with);
      EXPECT_FALSE(BetterMigPlan(other, *plan)) << "start " << s << " beats " << plan->instance.start;
    }
  }
}

TEST_F(MigPlannerTest, ReportedLayoutsAreCheckedAndHostileOnesRefused) {
  EXPECT_TRUE(MigLayoutOf(*geo_, {At("4g.40gb", 0), At("3g.40gb", 4)}).ok());
  EXPECT_FALSE(MigLayoutOf(*geo_, {At("4g.40gb", 0), At("3g.40gb", 0)}).ok());  // overlap
  EXPECT_FALSE(MigLayoutOf(*geo_, {At("3g.40gb", 2)}).ok());                    // not a 3g start
  EXPECT_FALSE(MigLayoutOf(*geo_, {MigInstance{4242, 0}}).ok());               // no such profile
  EXPECT_FALSE(MigLayoutOf(*geo_, {MigInstance{19, -1}}).ok());
  EXPECT_FALSE(MigLayoutOf(*geo_, {MigInstance{19, 1 << 30}}).ok());
  std::vector<MigInstance> many(9, At("1g.10gb", 0));
  const auto st = MigLayoutOf(*geo_, many);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("9 MIG instances"), std::string::npos) << st.status().ToString();
}

// The scheduler, through the ledger: an idle instance that exists wins over packing onto the
// fuller GPU; a GPU not in MIG mode takes no reported layout.
TEST(MigScheduling, AReportedIdleInstanceIsPreferredOverCreatingOne) {
  TestCluster c;
  const NodeIndex n = c.AddNode("a100", 8000, 8000, 2, "A100-80GB");
  ASSERT_TRUE(c.ledger().SetMigEnabled(n, 0, true).ok());
  ASSERT_TRUE(c.ledger().SetMigEnabled(n, 1, true).ok());
  Placement one;
  one.node = n;
  one.gpus.push_back(GpuGrant{0, MilliGpu(0), MiB(0), MigInstance{19, 6}});  // GPU 0 holds a 1g
  ASSERT_TRUE(c.ledger().Commit(one).ok());
  Scheduler& s = c.Build("bestfit");
  const TaskRequest three = Task().Cpu(1000).Mig("3g.40gb");
  // Nothing reported: the fuller GPU 0, at start 0 (4 would overlap the held 1g).
  Decision d = s.Decide(three);
  ASSERT_TRUE(d.placed) << d.diagnosis.ToString();
  EXPECT_EQ(d.placement.gpus[0].gpu, 0);
  EXPECT_EQ(d.placement.gpus[0].mig, (MigInstance{9, 0}));
  // GPU 1 reports an idle 3g at 0: it is used as it is.
  ASSERT_TRUE(c.ledger().SetMigPresent(n, 1, std::vector<MigInstance>{{9, 0}}).ok());
  d = s.Decide(three);
  ASSERT_TRUE(d.placed) << d.diagnosis.ToString();
  EXPECT_EQ(d.placement.gpus[0].gpu, 1);
  EXPECT_EQ(d.placement.gpus[0].mig, (MigInstance{9, 0}));
  // Reports that cannot be: refused, the last good one kept.
  EXPECT_FALSE(c.ledger().SetMigPresent(n, 1, std::vector<MigInstance>{{9, 0}, {5, 0}}).ok());
  EXPECT_FALSE(c.ledger().SetMigPresent(n, 7, std::vector<MigInstance>{}).ok());
  ASSERT_NE(c.ledger().mig_present(n, 1), nullptr);
  EXPECT_EQ(c.ledger().mig_present(n, 1)->instances().size(), 1u);
  const NodeIndex plain = c.AddNode("plain", 8000, 8000, 1, "A100-80GB");
  EXPECT_FALSE(c.ledger().SetMigPresent(plain, 0, std::vector<MigInstance>{{9, 0}}).ok());
  EXPECT_TRUE(c.ledger().SetMigPresent(plain, 0, std::vector<MigInstance>{}).ok());
  EXPECT_EQ(c.ledger().mig_present(plain, 0), nullptr);
}

}  // namespace
}  // namespace gpupool
