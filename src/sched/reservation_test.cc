#include "sched/reservation.h"

#include <gtest/gtest.h>

namespace gpupool {
namespace {

Job GangOf(int tasks, int gpus) {
  Job job;
  job.name = "gang";
  TaskGroup g;
  g.name = "t";
  g.replicas = tasks;
  g.request.gpu_count = gpus;
  g.request.gpu_share = kWholeGpu;
  job.groups.push_back(g);
  return job;
}

class ReservationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const GpuCatalog& c = ledger_.catalog();
    for (const auto& [name, gpus] : {std::pair{"a", 8}, {"b", 8}, {"c", 8}, {"small", 2}})
      ASSERT_TRUE(ledger_.AddNode(MakeNode(name, MilliCpu(64000), MiB(512000), gpus, "V100-16GB", c)).ok());
  }
  // Takes `gpus` whole GPUs of node n.
  void Use(NodeIndex n, int gpus) {
    Placement p;
    p.node = n;
    for (int g = 0; g < gpus; ++g) p.gpus.push_back({g, kWholeGpu, MiB(0), std::nullopt});
    ASSERT_TRUE(ledger_.Commit(p).ok());
  }
  Ledger ledger_;
};

TEST_F(ReservationTest, HoldsTheFreestNodesThatCouldTakeTheLargestTaskUntilTheDemandIsCovered) {
  Use(0, 6);  // a: 2 free
  Use(1, 1);  // b: 7 free
  const Job job = GangOf(2, 8);
  auto held = ChooseReservedNodes(ledger_, job, JobDemand(job), {});
  ASSERT_TRUE(held.has_value());
  // c (8 free) and b (7 free); never the 2-GPU node, which cannot take an 8-GPU task.
  EXPECT_EQ(*held, (std::vector<uint8_t>{0, 1, 1, 0}));
}

TEST_F(ReservationTest, ExcludedCordonedOrTooFewNodesHoldNothing) {
  const Job job = GangOf(2, 8);
  auto held = ChooseReservedNodes(ledger_, job, JobDemand(job), {0, 0, 1});
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(*held, (std::vector<uint8_t>{1, 1, 0, 0}));
  ASSERT_TRUE(ledger_.SetCordoned(1, true).ok());
  held = ChooseReservedNodes(ledger_, job, JobDemand(job), {0, 0, 1});
  EXPECT_FALSE(held.has_value());  // only a is left: 8 GPUs of the 16 asked
  const Job four = GangOf(4, 8);
  EXPECT_FALSE(ChooseReservedNodes(ledger_, four, JobDemand(four), {}).has_value());
  EXPECT_FALSE(ChooseReservedNodes(ledger_, Job{}, Resources{}, {}).has_value());  // no tasks
}

}  // namespace
}  // namespace gpupool
