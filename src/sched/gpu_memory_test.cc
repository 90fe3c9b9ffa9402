// GPU memory is always reserved: a share that names no memory takes its share's part of the GPU's
// memory (rounded down), so the ledger never promises more memory than a GPU has, whatever mix of
// tasks that name their memory and tasks that do not shares it.
#include <gtest/gtest.h>

#include "sched/test_util.h"

namespace gpupool {
namespace {

using testutil::Task;
using testutil::TestCluster;
using testutil::Typical;

Scheduler& Build(TestCluster& c, const std::string& policy) {
  c.SetTypicalPods({Typical(1000, 250, 1, 0.5), Typical(1000, 1000, 1, 0.5)});  // for fgd
  return c.Build(policy);
}

constexpr const char* kPolicies[] = {"bestfit", "fgd", "balanced", "spread", "random", "topology"};

TEST(GpuMemory, AShareThatNamesNoMemoryReservesItsPartOfTheGpus) {
  for (const char* policy : kPolicies) {
    SCOPED_TRACE(policy);
    TestCluster c;
    const NodeIndex n = c.AddNode("t4", 64000, 64000, 1);  // T4: 15,360 MiB
    Scheduler& s = Build(c, policy);
    for (int i = 0; i < 4; ++i) {
      const Decision d = s.Decide(Task().Cpu(1000).Gpus(1, 250));
      ASSERT_TRUE(d.placed) << d.diagnosis.ToString();
      ASSERT_EQ(d.placement.gpus.size(), 1u);
      EXPECT_EQ(d.placement.gpus[0].memory.units(), 3840);  // a quarter of 15,360 MiB
      ASSERT_TRUE(c.ledger().Commit(d.placement).ok());
    }
    EXPECT_EQ(c.ledger().state(n).gpus[0].free_memory, 0);
    EXPECT_EQ(c.ledger().state(n).memory_short_gpus, 0);
    EXPECT_TRUE(c.ledger().CheckInvariants().ok());
  }
}

TEST(GpuMemory, MemoryTakenByATaskThatNamedMoreThanItsShareRefusesAShareThatNamesNone) {
  for (const char* policy : kPolicies) {
    SCOPED_TRACE(policy);
    TestCluster c;
    const NodeIndex n = c.AddNode("t4", 64000, 64000, 1);
    Scheduler& s = Build(c, policy);
    // A tenth of the GPU's compute, 12,000 of its 15,360 MiB.
    const Decision big = s.Decide(Task().Cpu(1000).Gpus(1, 100).GpuMem(12000));
    ASSERT_TRUE(big.placed) << big.diagnosis.ToString();
    ASSERT_TRUE(c.ledger().Commit(big.placement).ok());
    EXPECT_EQ(c.ledger().state(n).memory_short_gpus, 1);
    // Half the GPU would need 7,680 MiB: 3,360 are left. Before, it was placed (no memory asked,
    // none reserved) and the GPU's memory promised twice over.
    const Decision half = s.Decide(Task().Cpu(1000).Gpus(1, 500));
    EXPECT_FALSE(half.placed);
    EXPECT_EQ(half.diagnosis.ToString(), "0/1 nodes fit: 1 insufficient GPU memory");
    // A fifth fits in what is left (3,072 MiB).
    const Decision fifth = s.Decide(Task().Cpu(1000).Gpus(1, 200));
    ASSERT_TRUE(fifth.placed) << fifth.diagnosis.ToString();
    EXPECT_EQ(fifth.placement.gpus[0].memory.units(), 3072);
    ASSERT_TRUE(c.ledger().Commit(fifth.placement).ok());
    EXPECT_TRUE(c.ledger().CheckInvariants().ok());
  }
}

TEST(GpuMemory, WholeGpusReserveAllOfTheirMemory) {
  TestCluster c;
  const NodeIndex n = c.AddNode("t4", 64000, 64000, 2);
  Scheduler& s = c.Build("bestfit");
  const Decision d = s.Decide(Task().Cpu(1000).Gpus(2, 1000));
  ASSERT_TRUE(d.placed) << d.diagnosis.ToString();
  for (const GpuGrant& g : d.placement.gpus) EXPECT_EQ(g.memory.units(), 15360);
  ASSERT_TRUE(c.ledger().Commit(d.placement).ok());
  EXPECT_EQ(c.ledger().state(n).gpus[0].free_memory, 0);
}

// Shares that fit a GPU's compute fit its memory too when none names memory, on GPUs whose memory
// no share divides evenly: rounding down never asks a MiB more than is left (the simulator's
// published runs, which name no GPU memory, place exactly as before).
TEST(GpuMemory, SharesThatNameNoMemoryAreNeverRefusedForMemory) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(seed);
    TestCluster c(seed);
    NodeSpec spec = MakeNode("odd", MilliCpu(1'000'000), MiB(1'000'000), 4, "V100M32", c.ledger().catalog());
    for (size_t i = 0; i < spec.gpus.size(); ++i) spec.gpus[i].memory = MiB(32'503 + 7 * static_cast<int64_t>(i));
    c.AddSpec(spec);
    Scheduler& s = Build(c, seed % 2 ? "fgd" : "bestfit");
    SeededRng rng(seed);
    for (int k = 0; k < 200; ++k) {
      const int64_t share = 1 + static_cast<int64_t>(rng.Uniform(999));
      const Decision d = s.Decide(Task().Cpu(10).Gpus(1, share));
      if (!d.placed) {
        EXPECT_EQ(d.diagnosis.ToString().find("memory"), std::string::npos) << d.diagnosis.ToString();
        continue;
      }
      ASSERT_TRUE(c.ledger().Commit(d.placement).ok());
    }
    EXPECT_TRUE(c.ledger().CheckInvariants().ok());
    for (const GpuState& g : c.ledger().state(0).gpus) {
      EXPECT_GE(g.free_memory, 0);
      EXPECT_GE(g.free_memory, ShareMemory(g.free_share, g.memory));
    }
  }
}

}  // namespace
}  // namespace gpupool
