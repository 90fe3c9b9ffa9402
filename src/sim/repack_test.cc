// RepackSharePods (sim/repack.h): the fewest GPUs a run's GPU-sharing pods could be packed on.
#include "sim/repack.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/gpu_catalog.h"
#include "model/ledger.h"
#include "model/node.h"

namespace gpupool {
namespace {

// A ledger of `nodes` nodes with 4 GPUs each and plenty of CPU and memory.
class RepackTest : public ::testing::Test {
 protected:
  void AddNodes(int nodes) {
    for (int i = 0; i < nodes; ++i) {
      ASSERT_TRUE(ledger_
                      .AddNode(MakeNode("n" + std::to_string(i), MilliCpu(64000), MiB(256000), 4, "V100M32",
                                        GpuCatalog::Builtin()))
                      .ok());
    }
  }
  // One task on `node`: a GPU-sharing pod of `share` on `gpu`, or a whole-GPU pod (share 1000).
  void Put(NodeIndex node, int gpu, int64_t share) {
    Placement p;
    p.node = node;
    p.cpu = MilliCpu(1000);
    p.memory = MiB(1024);
    p.gpus.push_back(GpuGrant{gpu, MilliGpu(share), MiB(0), std::nullopt});
    p.share_task = share < 1000;
    auto id = ledger_.Commit(p);
    ASSERT_TRUE(id.ok()) << id.status().ToString();
  }
  Ledger ledger_;
};

// Four GPUs, each with one pod: 470, 470, 650, 320 -> two GPUs suffice (470 + 470, 650 + 320).
// A whole-GPU pod and CPU are not part of it.
TEST_F(RepackTest, PairsThatFitShareAGpu) {
  AddNodes(2);
  Put(0, 0, 470);
  Put(0, 1, 470);
  Put(0, 2, 650);
  Put(1, 0, 320);
  Put(1, 1, 1000);
  auto r = RepackSharePods(ledger_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->share_pods, 4);
  EXPECT_EQ(r->share_gpus, 4);
  EXPECT_EQ(r->share_milli, 1910);
  EXPECT_EQ(r->min_gpus, 2);
  EXPECT_TRUE(r->optimal);
}

// Already packed: 810 + 160 on one GPU and 810 alone; nothing fits beside the second 810, so two.
// Three pods of 600 need three GPUs although they sum to 1.8 (the LP alone would say 2).
TEST_F(RepackTest, WhatCannotShareStaysApart) {
  AddNodes(2);
  Put(0, 0, 810);
  Put(0, 0, 160);
  Put(0, 1, 810);
  auto r = RepackSharePods(ledger_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->share_gpus, 2);
  EXPECT_EQ(r->min_gpus, 2);
  Put(1, 0, 600);
  Put(1, 1, 600);
  Put(1, 2, 600);
  r = RepackSharePods(ledger_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->share_gpus, 5);
  EXPECT_EQ(r->min_gpus, 5);
}

// Spread thin: ten pods of 100 on ten GPUs fit one GPU; 250 x 4 + 500 x 2 fit two.
TEST_F(RepackTest, SpreadPodsPackTight) {
  AddNodes(5);
  for (int i = 0; i < 10; ++i) Put(static_cast<NodeIndex>(i / 4), i % 4, 100);
  auto r = RepackSharePods(ledger_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->share_gpus, 10);
  EXPECT_EQ(r->min_gpus, 1);
  Put(2, 2, 250);
  Put(2, 3, 250);
  Put(3, 0, 250);
  Put(3, 1, 250);
  Put(3, 2, 500);
  Put(3, 3, 500);
  r = RepackSharePods(ledger_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->min_gpus, 3);
  EXPECT_EQ(r->share_gpus, 16);
}

TEST_F(RepackTest, NoSharePodsNoGpus) {
  AddNodes(1);
  Put(0, 0, 1000);
  auto r = RepackSharePods(ledger_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->share_pods, 0);
  EXPECT_EQ(r->share_gpus, 0);
  EXPECT_EQ(r->min_gpus, 0);
}

}  // namespace
}  // namespace gpupool
