#include "model/ledger.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "model/gpu_catalog.h"
#include "model/ledger_test_util.h"
#include "model/node.h"

namespace gpupool {
namespace {

using testutil::Generations;
using testutil::LedgerSnap;
using testutil::NodeSnap;
using testutil::Snap;
using testutil::SnapNode;

// ---- Helpers ----------------------------------------------------------------------------------

// MIG profile ids of the builtin catalog (driver ids; the same on every MIG-capable model).
constexpr int k1g = 19;    // 1 compute, 1 memory slice, starts 0..6, up to 7
constexpr int k1gMe = 20;  // 1g with the media engines, at most one per GPU
constexpr int k2g = 14;    // 2 compute, 2 memory slices, starts 0, 2, 4
constexpr int k3g = 9;     // 3 compute, 4 memory slices, starts 0, 4
constexpr int k4g = 5;     // 4 compute, 4 memory slices, start 0
constexpr int k7g = 0;     // the whole GPU, start 0

constexpr int64_t kA100Memory = 81920;  // MiB
constexpr int64_t kT4Memory = 15360;

// A node of `gpus` GPUs of `model` with `cores` CPU cores and `gib` GiB of memory.
NodeSpec Node(const std::string& name, int gpus, const std::string& model, int64_t cores = 32,
              int64_t gib = 256) {
  static const GpuCatalog catalog = GpuCatalog::Builtin();
  return MakeNode(name, MilliCpu(cores * 1000), MiB(gib * 1024), gpus, model, catalog);
}

GpuGrant Share(int gpu, int64_t milli, int64_t memory_mib = 0) {
  GpuGrant g;
  g.gpu = gpu;
  g.share = MilliGpu(milli);
  g.memory = MiB(memory_mib);
  return g;
}

GpuGrant Mig(int gpu, int profile_id, int start) {
  GpuGrant g;
  g.gpu = gpu;
  g.mig = MigInstance{profile_id, start};
  return g;
}

Placement Place(NodeIndex node, int64_t cpu_milli, int64_t memory_mib, std::vector<GpuGrant> gpus = {}) {
  Placement p;
  p.node = node;
  p.cpu = MilliCpu(cpu_milli);
  p.memory = MiB(memory_mib);
  p.gpus = std::move(gpus);
  return p;
}

// A share task: one GPU, part of it (the scheduler sets share_task for these).
Placement SharePlace(NodeIndex node, int64_t cpu_milli, int gpu, int64_t milli, int64_t gpu_memory = 0) {
  Placement p = Place(node, cpu_milli, 1024, {Share(gpu, milli, gpu_memory)});
  p.share_task = true;
  return p;
}

// True when `st` failed with `code` and its message contains `needle`.
::testing::AssertionResult Fails(const Status& st, StatusCode code, const std::string& needle) {
  if (st.ok()) return ::testing::AssertionFailure() << "unexpectedly OK";
  if (st.code() != code) {
    return ::testing::AssertionFailure() << "expected " << StatusCodeName(code) << ", got " << st.ToString();
  }
  if (st.message().find(needle) == std::string::npos) {
    return ::testing::AssertionFailure() << "'" << st.message() << "' does not mention '" << needle << "'";
  }
  return ::testing::AssertionSuccess();
}

class LedgerTest : public ::testing::Test {
 protected:
  NodeIndex Add(NodeSpec spec) {
    Result<NodeIndex> n = ledger_.AddNode(std::move(spec));
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    return n.ok() ? *n : NodeIndex{0};
  }

  AllocationId CommitOk(const Placement& p) {
    Result<AllocationId> id = ledger_.Commit(p);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    ExpectInvariants();
    return id.ok() ? *id : AllocationId{0};
  }

  void ReleaseOk(AllocationId id) {
    const Status st = ledger_.Release(id);
    EXPECT_TRUE(st.ok()) << st.ToString();
    ExpectInvariants();
  }

  // Commits `p` expecting a failure with `code` naming `needle`, and checks nothing changed at all,
  // not even a generation.
  void CommitFails(const Placement& p, StatusCode code, const std::string& needle) {
    const LedgerSnap before = Snap(ledger_);
    const std::vector<uint64_t> generations = Generations(ledger_);
    Result<AllocationId> id = ledger_.Commit(p);
    EXPECT_TRUE(Fails(id.status(), code, needle));
    EXPECT_EQ(Snap(ledger_), before);
    EXPECT_EQ(Generations(ledger_), generations);
    ExpectInvariants();
  }

  void ExpectInvariants() {
    const Status st = ledger_.CheckInvariants();
    EXPECT_TRUE(st.ok()) << st.ToString();
  }

  const NodeState& S(NodeIndex n) const { return ledger_.state(n); }
  const GpuState& G(NodeIndex n, int gpu) const { return ledger_.state(n).gpus[static_cast<size_t>(gpu)]; }
  int32_t ByCount(NodeIndex n, size_t k) const {
    const auto& v = ledger_.state(n).tasks_by_gpu_count;
    return k < v.size() ? v[k] : 0;
  }

  Ledger ledger_;
};

// ---- Nodes ------------------------------------------------------------------------------------

// A new node is entirely free, and its GPUs count in the cluster totals.
TEST_F(LedgerTest, AddNodeStartsFullyFree) {
  const NodeIndex n = Add(Node("a100", 4, "A100-80GB"));
  const NodeIndex c = Add(Node("cpu", 0, "", 16, 64));
  EXPECT_EQ(ledger_.node_count(), 2u);
  EXPECT_EQ(S(n).free_cpu, 32000);
  EXPECT_EQ(S(n).free_memory, 256 * 1024);
  EXPECT_EQ(S(n).tasks, 0);
  EXPECT_TRUE(S(n).schedulable());
  ASSERT_EQ(S(n).gpus.size(), 4u);
  for (const GpuState& g : S(n).gpus) {
    EXPECT_EQ(g.free_share, 1000);
    EXPECT_EQ(g.free_memory, kA100Memory);
    EXPECT_EQ(g.tasks, 0);
    EXPECT_TRUE(g.mig.empty());
  }
  EXPECT_EQ(S(n).free_gpu_share, 4000);
  EXPECT_EQ(S(n).fully_free_gpus, 4);
  EXPECT_EQ(S(n).share_tasks, 0);
  EXPECT_EQ(ledger_.model_name(S(n).model), "A100-80GB");
  EXPECT_EQ(ledger_.FindModel("A100-80GB"), S(n).model);
  // A node without GPUs has model 0, the empty name, which FindModel never returns.
  EXPECT_EQ(S(c).model, 0);
  EXPECT_EQ(ledger_.model_name(0), "");
  EXPECT_FALSE(ledger_.FindModel("").has_value());
  EXPECT_EQ(S(c).free_gpu_share, 0);
  EXPECT_EQ(ledger_.FindNode("cpu"), c);
  EXPECT_FALSE(ledger_.FindNode("nope").has_value());
  EXPECT_EQ(ledger_.total_gpus(), 4);
  EXPECT_EQ(ledger_.total_gpu_share(), 4000);
  EXPECT_EQ(ledger_.used_gpu_share(), 0);
  ExpectInvariants();
}

TEST_F(LedgerTest, AddNodeRejectsDuplicatesAndInvalidSpecs) {
  Add(Node("n1", 2, "T4"));
  const LedgerSnap before = Snap(ledger_);
  EXPECT_TRUE(Fails(ledger_.AddNode(Node("n1", 1, "T4")).status(), StatusCode::kAlreadyExists, "'n1'"));
  NodeSpec bad = Node("bad", 1, "T4");
  bad.cpu = MilliCpu(-1);
  EXPECT_TRUE(Fails(ledger_.AddNode(bad).status(), StatusCode::kInvalidArgument, "node 'bad'"));
  NodeSpec bad_mig = Node("bad-mig", 1, "T4");
  bad_mig.gpus[0].mig_enabled = true;  // T4 is not MIG-capable
  EXPECT_FALSE(ledger_.AddNode(bad_mig).ok());
  EXPECT_EQ(ledger_.node_count(), 1u);
  EXPECT_EQ(Snap(ledger_), before);  // a rejected node adds no GPUs to the totals
}

// A spec may spell the model by a catalog alias; the ledger still interns the canonical name, so
// model filters written with "A100-80GB" match it, and it shares the id of canonically named nodes.
TEST_F(LedgerTest, AliasSpelledModelInternsTheCanonicalName) {
  NodeSpec aliased = Node("aliased", 2, "A100-80GB");
  for (GpuDevice& g : aliased.gpus) g.model = "A100-SXM4-80GB";
  const NodeIndex a = Add(aliased);
  const NodeIndex b = Add(Node("canonical", 2, "A100-80GB"));
  EXPECT_EQ(ledger_.model_name(S(a).model), "A100-80GB");
  EXPECT_EQ(S(a).model, S(b).model);
  EXPECT_EQ(ledger_.FindModel("A100-80GB"), S(a).model);
  // The alias also resolves to the MIG geometry.
  ASSERT_TRUE(ledger_.SetMigEnabled(a, 0, true).ok());
  CommitOk(Place(a, 1000, 1024, {Mig(0, k3g, 0)}));
}

// ---- CPU-only, share and multi-GPU placements ---------------------------------------------------

TEST_F(LedgerTest, CpuOnlyCommitAndRelease) {
  const NodeIndex n = Add(Node("n", 2, "T4", 8, 32));
  const LedgerSnap before = Snap(ledger_);
  const AllocationId id = CommitOk(Place(n, 2500, 4096));
  EXPECT_NE(id, 0u);
  EXPECT_EQ(S(n).free_cpu, 5500);
  EXPECT_EQ(S(n).free_memory, 32 * 1024 - 4096);
  EXPECT_EQ(S(n).tasks, 1);
  // A CPU-only task touches no GPU and no GPU counter.
  EXPECT_EQ(S(n).free_gpu_share, 2000);
  EXPECT_EQ(S(n).fully_free_gpus, 2);
  EXPECT_EQ(S(n).share_tasks, 0);
  EXPECT_EQ(ByCount(n, 0) + ByCount(n, 1) + ByCount(n, 2), 0);
  EXPECT_EQ(G(n, 0).tasks, 0);
  EXPECT_EQ(ledger_.allocation_count(), 1u);
  ASSERT_NE(ledger_.Find(id), nullptr);
  EXPECT_EQ(*ledger_.Find(id), Place(n, 2500, 4096));
  ReleaseOk(id);
  EXPECT_EQ(Snap(ledger_), before);
  EXPECT_EQ(ledger_.Find(id), nullptr);
}

// The change log names every node whose generation grew, in order; a failed commit adds nothing;
// past its bound the oldest half goes and positions keep counting.
TEST_F(LedgerTest, TheChangeLogNamesEveryChangedNodeInOrder) {
  const NodeIndex a = Add(Node("a", 2, "T4", 8, 32));
  const NodeIndex b = Add(Node("b", 2, "T4", 8, 32));
  EXPECT_EQ(ledger_.change_log_end(), 0u);
  const AllocationId id = CommitOk(Place(b, 1000, 1024));
  ASSERT_TRUE(ledger_.SetCordoned(a, true).ok());
  ASSERT_FALSE(ledger_.Commit(Place(a, 999000, 1024)).ok());  // does not fit: no change
  ReleaseOk(id);
  ASSERT_EQ(ledger_.change_log_end(), 3u);
  EXPECT_EQ(ledger_.changed_node(0), b);
  EXPECT_EQ(ledger_.changed_node(1), a);
  EXPECT_EQ(ledger_.changed_node(2), b);
  for (int i = 0; i < 10000; ++i) ASSERT_TRUE(ledger_.SetCordoned(a, i % 2 == 0).ok());
  EXPECT_EQ(ledger_.change_log_end(), 10003u);
  EXPECT_GT(ledger_.change_log_begin(), 0u);
  EXPECT_LE(ledger_.change_log_end() - ledger_.change_log_begin(), 8192u);
  EXPECT_EQ(ledger_.changed_node(ledger_.change_log_end() - 1), a);
}

// Two share tasks fill one GPU; a third, however small, does not fit there. The share and the GPU
// memory are both accounted per GPU.
TEST_F(LedgerTest, ShareTasksFillOneGpu) {
  const NodeIndex n = Add(Node("n", 4, "A100-80GB"));
  const AllocationId a = CommitOk(SharePlace(n, 1000, 0, 500, 8192));
  EXPECT_EQ(G(n, 0).free_share, 500);
  EXPECT_EQ(G(n, 0).free_memory, kA100Memory - 8192);
  EXPECT_EQ(G(n, 0).tasks, 1);
  EXPECT_EQ(S(n).share_tasks, 1);
  EXPECT_EQ(ByCount(n, 1), 0);  // a share task is not a one-GPU task
  EXPECT_EQ(S(n).free_gpu_share, 3500);
  EXPECT_EQ(S(n).fully_free_gpus, 3);
  EXPECT_EQ(ledger_.used_gpu_share(), 500);

  const AllocationId b = CommitOk(SharePlace(n, 1000, 0, 500, 8192));
  EXPECT_EQ(G(n, 0).free_share, 0);
  EXPECT_EQ(G(n, 0).tasks, 2);
  EXPECT_EQ(S(n).share_tasks, 2);
  EXPECT_EQ(S(n).free_gpu_share, 3000);
  EXPECT_EQ(ledger_.used_gpu_share(), 1000);

  CommitFails(SharePlace(n, 1000, 0, 1), StatusCode::kResourceExhausted, "insufficient GPU share on GPU 0");
  // GPU memory runs out independently of share: 80 GiB + 1 MiB does not fit on an 80 GiB GPU.
  CommitFails(SharePlace(n, 1000, 1, 100, kA100Memory + 1), StatusCode::kResourceExhausted,
              "insufficient GPU memory on GPU 1");

  ReleaseOk(a);
  EXPECT_EQ(G(n, 0).free_share, 500);
  EXPECT_EQ(G(n, 0).free_memory, kA100Memory - 8192);
  EXPECT_EQ(S(n).share_tasks, 1);
  ReleaseOk(b);
  EXPECT_EQ(S(n).fully_free_gpus, 4);
  EXPECT_EQ(ledger_.used_gpu_share(), 0);
}

// A two-GPU task is tagged by its GPU count; whole GPUs leave fully_free_gpus.
TEST_F(LedgerTest, MultiGpuTask) {
  const NodeIndex n = Add(Node("n", 4, "A100-80GB"));
  const AllocationId two = CommitOk(Place(n, 8000, 65536, {Share(0, 1000), Share(3, 1000)}));
  EXPECT_EQ(ByCount(n, 2), 1);
  EXPECT_EQ(S(n).share_tasks, 0);
  EXPECT_EQ(S(n).fully_free_gpus, 2);
  EXPECT_EQ(S(n).free_gpu_share, 2000);
  EXPECT_EQ(G(n, 0).tasks, 1);
  EXPECT_EQ(G(n, 1).tasks, 0);
  EXPECT_EQ(G(n, 3).free_share, 0);
  EXPECT_EQ(S(n).tasks, 1);  // one task, however many GPUs
  EXPECT_EQ(ledger_.used_gpu_share(), 2000);
  // A whole single GPU without the share flag is a one-GPU task.
  const AllocationId one = CommitOk(Place(n, 1000, 1024, {Share(1, 1000)}));
  EXPECT_EQ(ByCount(n, 1), 1);
  EXPECT_EQ(S(n).fully_free_gpus, 1);
  // Three GPUs do not fit on the one left.
  CommitFails(Place(n, 1000, 1024, {Share(2, 1000), Share(0, 1000), Share(1, 1000)}),
              StatusCode::kResourceExhausted, "GPU 0");
  ReleaseOk(two);
  EXPECT_EQ(ByCount(n, 2), 0);
  EXPECT_EQ(S(n).fully_free_gpus, 3);
  ReleaseOk(one);
  EXPECT_EQ(ledger_.used_gpu_share(), 0);
}

// ---- All or nothing -----------------------------------------------------------------------------

// The first GPU of the placement fits, the second does not: nothing is taken, not even the CPU or
// the first GPU's share, and no generation moves.
TEST_F(LedgerTest, PlacementWhoseSecondGpuDoesNotFitChangesNothing) {
  const NodeIndex n = Add(Node("n", 4, "A100-80GB"));
  CommitOk(Place(n, 1000, 1024, {Share(1, 1000)}));
  CommitFails(Place(n, 4000, 4096, {Share(0, 500), Share(1, 500)}), StatusCode::kResourceExhausted,
              "insufficient GPU share on GPU 1");
  CommitFails(Place(n, 4000, 4096, {Share(0, 500, 1024), Share(2, 500, kA100Memory + 1)}),
              StatusCode::kResourceExhausted, "insufficient GPU memory on GPU 2");
  // Same with MIG: the second instance overlaps one already there.
  ASSERT_TRUE(ledger_.SetMigEnabled(n, 2, true).ok());
  ASSERT_TRUE(ledger_.SetMigEnabled(n, 3, true).ok());
  CommitOk(Place(n, 1000, 1024, {Mig(3, k3g, 0)}));
  CommitFails(Place(n, 1000, 1024, {Mig(2, k3g, 0), Mig(3, k3g, 0)}), StatusCode::kResourceExhausted,
              "overlaps");
  EXPECT_TRUE(G(n, 2).mig.empty());
}

// Malformed placements are InvalidArgument, name the problem, and change nothing.
TEST_F(LedgerTest, MalformedPlacementsAreRejected) {
  const NodeIndex n = Add(Node("n", 4, "A100-80GB"));
  const NodeIndex c = Add(Node("cpu", 0, ""));
  CommitFails(Place(7, 1000, 1024), StatusCode::kInvalidArgument, "unknown node #7");
  CommitFails(Place(n, 1000, 1024, {Share(4, 500)}), StatusCode::kInvalidArgument, "no GPU 4");
  CommitFails(Place(n, 1000, 1024, {Share(-1, 500)}), StatusCode::kInvalidArgument, "no GPU -1");
  CommitFails(Place(c, 1000, 1024, {Share(0, 500)}), StatusCode::kInvalidArgument, "no GPU 0");
  // The same GPU twice would take its share twice while looking like a two-GPU task.
  CommitFails(Place(n, 1000, 1024, {Share(1, 300), Share(1, 300)}), StatusCode::kInvalidArgument,
              "GPU 1 appears twice");
  CommitFails(Place(n, -1, 1024), StatusCode::kInvalidArgument, "negative CPU or memory");
  CommitFails(Place(n, 1000, -1), StatusCode::kInvalidArgument, "negative CPU or memory");
  CommitFails(Place(n, 1000, 1024, {Share(0, -500)}), StatusCode::kInvalidArgument,
              "negative amount on GPU 0");
  CommitFails(Place(n, 1000, 1024, {Share(0, 500, -1)}), StatusCode::kInvalidArgument, "negative amount");
  // A grant of zero share would hold a GPU without taking any of it.
  CommitFails(Place(n, 1000, 1024, {Share(2, 0)}), StatusCode::kInvalidArgument, "zero GPU share on GPU 2");
  EXPECT_EQ(ledger_.allocation_count(), 0u);
}

TEST_F(LedgerTest, CpuAndMemoryExhaustionNameTheResource) {
  const NodeIndex n = Add(Node("n", 1, "T4", 4, 16));
  CommitFails(Place(n, 4001, 1024), StatusCode::kResourceExhausted,
              "insufficient CPU: asks 4001m, 4000m free");
  CommitFails(Place(n, 1000, 16 * 1024 + 1), StatusCode::kResourceExhausted,
              "insufficient memory: asks 16385 MiB, 16384 MiB free");
  // Exactly all of it fits.
  const AllocationId all = CommitOk(Place(n, 4000, 16 * 1024, {Share(0, 1000, kT4Memory)}));
  EXPECT_EQ(S(n).free_cpu, 0);
  EXPECT_EQ(S(n).free_memory, 0);
  EXPECT_EQ(G(n, 0).free_memory, 0);
  CommitFails(Place(n, 1, 0), StatusCode::kResourceExhausted, "insufficient CPU");
  ReleaseOk(all);
}

// Releasing everything, in an order unrelated to the commits, gives back exactly the empty state.
TEST_F(LedgerTest, ReleaseRestoresExactly) {
  const NodeIndex a = Add(Node("a", 4, "A100-80GB"));
  const NodeIndex t = Add(Node("t", 2, "T4", 16, 64));
  const NodeIndex c = Add(Node("c", 0, "", 8, 32));
  ASSERT_TRUE(ledger_.SetMigEnabled(a, 3, true).ok());
  const LedgerSnap empty = Snap(ledger_);
  std::vector<AllocationId> ids;
  ids.push_back(CommitOk(Place(c, 3000, 5000)));
  ids.push_back(CommitOk(SharePlace(t, 500, 0, 250, 2048)));
  ids.push_back(CommitOk(Place(a, 8000, 100000, {Share(0, 1000, 40960), Share(2, 1000)})));
  ids.push_back(CommitOk(Place(a, 1000, 1024, {Mig(3, k4g, 0)})));
  ids.push_back(CommitOk(SharePlace(t, 500, 0, 750, 1024)));
  ids.push_back(CommitOk(Place(a, 1000, 1024, {Mig(3, k2g, 4)})));
  ids.push_back(CommitOk(Place(t, 2000, 2048, {Share(1, 1000)})));
  ids.push_back(CommitOk(SharePlace(a, 100, 1, 1, 1)));

  // Release one in the middle and commit it again: the ledger is back where it was, with a new id.
  const LedgerSnap full = Snap(ledger_);
  const Placement mig4g = *ledger_.Find(ids[3]);
  ReleaseOk(ids[3]);
  EXPECT_NE(Snap(ledger_), full);
  ids[3] = CommitOk(mig4g);
  EXPECT_EQ(Snap(ledger_), full);

  for (size_t i : {5u, 0u, 7u, 2u, 4u, 1u, 6u, 3u}) ReleaseOk(ids[i]);
  EXPECT_EQ(Snap(ledger_), empty);
  EXPECT_EQ(ledger_.allocation_count(), 0u);
}

TEST_F(LedgerTest, UnknownAllocationIsNotFound) {
  const NodeIndex n = Add(Node("n", 1, "T4"));
  EXPECT_TRUE(Fails(ledger_.Release(12345), StatusCode::kNotFound, "no allocation 12345"));
  EXPECT_TRUE(Fails(ledger_.Release(0), StatusCode::kNotFound, "no allocation 0"));
  EXPECT_EQ(ledger_.Find(12345), nullptr);
  const AllocationId id = CommitOk(Place(n, 1000, 1024));
  ReleaseOk(id);
  // A second release of the same id would give its capacity back twice.
  const LedgerSnap before = Snap(ledger_);
  const std::vector<uint64_t> generations = Generations(ledger_);
  EXPECT_TRUE(Fails(ledger_.Release(id), StatusCode::kNotFound, "no allocation"));
  EXPECT_EQ(Snap(ledger_), before);
  EXPECT_EQ(Generations(ledger_), generations);
}

// Allocation ids are never reused, so a stale id cannot release someone else's task.
TEST_F(LedgerTest, AllocationIdsAreNotReused) {
  const NodeIndex n = Add(Node("n", 0, ""));
  const AllocationId first = CommitOk(Place(n, 1, 1));
  ReleaseOk(first);
  const AllocationId second = CommitOk(Place(n, 1, 1));
  EXPECT_NE(first, second);
  EXPECT_TRUE(Fails(ledger_.Release(first), StatusCode::kNotFound, "no allocation"));
  EXPECT_NE(ledger_.Find(second), nullptr);
}

// G2 GPUs have unknown memory (0): a per-GPU memory request cannot fit, a share alone can.
TEST_F(LedgerTest, UnknownGpuMemoryTakesNoMemoryRequests) {
  const NodeIndex n = Add(Node("g2", 2, "G2"));
  EXPECT_EQ(G(n, 0).free_memory, 0);
  CommitFails(SharePlace(n, 1000, 0, 500, 1), StatusCode::kResourceExhausted, "insufficient GPU memory");
  CommitOk(SharePlace(n, 1000, 0, 500, 0));
}

// ---- max_tasks ----------------------------------------------------------------------------------

TEST_F(LedgerTest, MaxTasksLimitsTasksOfAnyKind) {
  NodeSpec spec = Node("n", 2, "T4");
  spec.max_tasks = 2;
  const NodeIndex n = Add(spec);
  EXPECT_EQ(S(n).max_tasks, 2);
  const AllocationId a = CommitOk(Place(n, 100, 100));
  CommitOk(SharePlace(n, 100, 0, 100));
  // Plenty of CPU, memory and GPU left; the task count is what is exhausted.
  CommitFails(Place(n, 100, 100), StatusCode::kResourceExhausted, "maximum of 2 tasks");
  CommitFails(SharePlace(n, 100, 1, 100), StatusCode::kResourceExhausted, "maximum of 2 tasks");
  ReleaseOk(a);
  CommitOk(Place(n, 100, 100, {Share(1, 1000)}));
  EXPECT_EQ(S(n).tasks, 2);
}

// ---- MIG ----------------------------------------------------------------------------------------

// Enabling MIG takes the GPU out of the share pool and the cluster totals: it now serves MIG
// instances only.
TEST_F(LedgerTest, SetMigEnabledMovesTheGpuOutOfTheSharePool) {
  const NodeIndex n = Add(Node("n", 4, "A100-80GB"));
  const uint64_t gen = S(n).generation;
  ASSERT_TRUE(ledger_.SetMigEnabled(n, 0, true).ok());
  ExpectInvariants();
  EXPECT_GT(S(n).generation, gen);
  EXPECT_TRUE(G(n, 0).mig_enabled);
  EXPECT_TRUE(ledger_.spec(n).gpus[0].mig_enabled);  // the spec follows, so CheckInvariants agrees
  EXPECT_EQ(S(n).free_gpu_share, 3000);
  EXPECT_EQ(S(n).fully_free_gpus, 3);
  EXPECT_EQ(S(n).usable_gpus, 3);
  EXPECT_EQ(ledger_.total_gpus(), 3);
  EXPECT_EQ(ledger_.total_gpu_share(), 3000);
  // Asking for the mode it is already in is a no-op.
  EXPECT_TRUE(ledger_.SetMigEnabled(n, 0, true).ok());
  EXPECT_EQ(ledger_.total_gpus(), 3);
  ASSERT_TRUE(ledger_.SetMigEnabled(n, 0, false).ok());
  ExpectInvariants();
  EXPECT_EQ(S(n).free_gpu_share, 4000);
  EXPECT_EQ(ledger_.total_gpus(), 4);
  EXPECT_EQ(ledger_.total_gpu_share(), 4000);
}

// 4g@0 + 3g@4 use all 7 compute and 8 memory slices; nothing else fits until one goes.
TEST_F(LedgerTest, MigInstancesFillAGpu) {
  const NodeIndex n = Add(Node("n", 2, "A100-80GB"));
  ASSERT_TRUE(ledger_.SetMigEnabled(n, 1, true).ok());
  const LedgerSnap empty = Snap(ledger_);
  const AllocationId four = CommitOk(Place(n, 2000, 8192, {Mig(1, k4g, 0)}));
  const AllocationId three = CommitOk(Place(n, 2000, 8192, {Mig(1, k3g, 4)}));
  EXPECT_EQ(G(n, 1).tasks, 2);
  EXPECT_EQ(G(n, 1).mig.instances().size(), 2u);
  // MIG instances take no share and no GPU memory from the share accounting.
  EXPECT_EQ(G(n, 1).free_share, 1000);
  EXPECT_EQ(G(n, 1).free_memory, kA100Memory);
  EXPECT_EQ(ledger_.used_gpu_share(), 0);
  EXPECT_EQ(S(n).free_gpu_share, 1000);  // only GPU 0 counts
  EXPECT_EQ(S(n).share_tasks, 0);
  CommitFails(Place(n, 1000, 1024, {Mig(1, k1g, 0)}), StatusCode::kResourceExhausted, "GPU 1");
  CommitFails(Place(n, 1000, 1024, {Mig(1, k1g, 5)}), StatusCode::kResourceExhausted, "overlaps");

  // With the 4g gone, two 2g instances take slices 0-3.
  ReleaseOk(four);
  const AllocationId two_a = CommitOk(Place(n, 1000, 1024, {Mig(1, k2g, 0)}));
  const AllocationId two_b = CommitOk(Place(n, 1000, 1024, {Mig(1, k2g, 2)}));
  CommitFails(Place(n, 1000, 1024, {Mig(1, k1g, 1)}), StatusCode::kResourceExhausted, "overlaps");
  for (AllocationId id : {two_a, three, two_b}) ReleaseOk(id);
  EXPECT_EQ(Snap(ledger_), empty);

  // The whole GPU as one 7g instance, then nothing else.
  const AllocationId seven = CommitOk(Place(n, 1000, 1024, {Mig(1, k7g, 0)}));
  CommitFails(Place(n, 1000, 1024, {Mig(1, k1g, 6)}), StatusCode::kResourceExhausted, "GPU 1");
  ReleaseOk(seven);
}

// Seven 1g instances at starts 0..6 is the most there can be; the +me variant is one per GPU.
TEST_F(LedgerTest, MigInstanceCountsAndMediaEngines) {
  const NodeIndex n = Add(Node("n", 2, "A100-80GB"));
  ASSERT_TRUE(ledger_.SetMigEnabled(n, 0, true).ok());
  ASSERT_TRUE(ledger_.SetMigEnabled(n, 1, true).ok());
  for (int start = 0; start < 7; ++start) CommitOk(Place(n, 100, 100, {Mig(0, k1g, start)}));
  EXPECT_EQ(G(n, 0).tasks, 7);
  // Slice 7 is free, but no 1g instance may start there.
  CommitFails(Place(n, 100, 100, {Mig(0, k1g, 7)}), StatusCode::kInvalidArgument,
              "cannot start at memory slice 7");
  CommitOk(Place(n, 100, 100, {Mig(1, k1gMe, 0)}));
  CommitFails(Place(n, 100, 100, {Mig(1, k1gMe, 1)}), StatusCode::kResourceExhausted,
              "maximum of 1 instances");
}

TEST_F(LedgerTest, MigGrantsMustMatchTheGpuMode) {
  const NodeIndex n = Add(Node("n", 2, "A100-80GB"));
  ASSERT_TRUE(ledger_.SetMigEnabled(n, 1, true).ok());
  CommitFails(Place(n, 100, 100, {Mig(0, k3g, 0)}), StatusCode::kInvalidArgument, "GPU 0 is not in MIG mode");
  CommitFails(Place(n, 100, 100, {Share(1, 500)}), StatusCode::kInvalidArgument, "takes MIG requests only");
  GpuGrant with_share = Mig(1, k3g, 0);
  with_share.share = MilliGpu(500);
  CommitFails(Place(n, 100, 100, {with_share}), StatusCode::kInvalidArgument, "carries share or memory");
  GpuGrant with_memory = Mig(1, k3g, 0);
  with_memory.memory = MiB(1024);
  CommitFails(Place(n, 100, 100, {with_memory}), StatusCode::kInvalidArgument, "carries share or memory");
  // 3g may start at slices 0 and 4 only.
  CommitFails(Place(n, 100, 100, {Mig(1, k3g, 2)}), StatusCode::kInvalidArgument,
              "cannot start at memory slice 2");
  CommitFails(Place(n, 100, 100, {Mig(1, 99, 0)}), StatusCode::kInvalidArgument, "unknown MIG profile id 99");
  // Two instances on one GPU in one placement are still the same GPU twice.
  CommitFails(Place(n, 100, 100, {Mig(1, k1g, 0), Mig(1, k1g, 1)}), StatusCode::kInvalidArgument,
              "appears twice");
}

// MIG mode changes need an idle GPU and a MIG-capable model.
TEST_F(LedgerTest, SetMigEnabledRefusals) {
  const NodeIndex a = Add(Node("a", 2, "A100-80GB"));
  const NodeIndex t = Add(Node("t", 1, "T4"));
  const LedgerSnap start = Snap(ledger_);
  EXPECT_TRUE(
      Fails(ledger_.SetMigEnabled(t, 0, true), StatusCode::kFailedPrecondition, "does not support MIG"));
  EXPECT_EQ(Snap(ledger_), start);
  EXPECT_TRUE(ledger_.SetMigEnabled(t, 0, false).ok());  // already off

  // A share task on GPU 1 keeps it out of MIG mode; a CPU-only task on the node does not matter.
  CommitOk(Place(a, 1000, 1024));
  const AllocationId share = CommitOk(SharePlace(a, 1000, 1, 100));
  const LedgerSnap busy = Snap(ledger_);
  EXPECT_TRUE(Fails(ledger_.SetMigEnabled(a, 1, true), StatusCode::kFailedPrecondition, "GPU 1 is in use"));
  EXPECT_EQ(Snap(ledger_), busy);
  EXPECT_TRUE(ledger_.SetMigEnabled(a, 0, true).ok());
  ExpectInvariants();

  // Leaving MIG mode with an instance alive is refused too.
  const AllocationId inst = CommitOk(Place(a, 100, 100, {Mig(0, k1g, 3)}));
  EXPECT_TRUE(Fails(ledger_.SetMigEnabled(a, 0, false), StatusCode::kFailedPrecondition, "GPU 0 is in use"));
  ReleaseOk(inst);
  ReleaseOk(share);
  EXPECT_TRUE(ledger_.SetMigEnabled(a, 0, false).ok());
  EXPECT_TRUE(ledger_.SetMigEnabled(a, 1, true).ok());
  ExpectInvariants();

  EXPECT_TRUE(Fails(ledger_.SetMigEnabled(9, 0, true), StatusCode::kNotFound, "no node #9"));
  EXPECT_TRUE(Fails(ledger_.SetMigEnabled(a, 2, true), StatusCode::kNotFound, "no GPU 2"));
  EXPECT_TRUE(Fails(ledger_.SetMigEnabled(a, -1, true), StatusCode::kNotFound, "no GPU -1"));
}

// ---- Health and cordon --------------------------------------------------------------------------

// An unhealthy GPU keeps its allocation (which can still be released) but takes no new one, and
// leaves the node's free-share summary.
TEST_F(LedgerTest, UnhealthyGpuRefusesNewCommits) {
  const NodeIndex n = Add(Node("n", 4, "A100-80GB"));
  const AllocationId held = CommitOk(SharePlace(n, 1000, 1, 400));
  const uint64_t gen = S(n).generation;
  ASSERT_TRUE(ledger_.SetGpuHealthy(n, 1, false).ok());
  ExpectInvariants();
  EXPECT_GT(S(n).generation, gen);
  EXPECT_FALSE(G(n, 1).healthy);
  EXPECT_EQ(S(n).free_gpu_share, 3000);  // GPU 1's 600 free no longer counts
  EXPECT_EQ(S(n).fully_free_gpus, 3);
  EXPECT_EQ(S(n).usable_gpus, 3);
  EXPECT_EQ(ledger_.total_gpus(), 4);  // still in the inventory
  EXPECT_EQ(ledger_.used_gpu_share(), 400);
  CommitFails(SharePlace(n, 1000, 1, 100), StatusCode::kFailedPrecondition, "GPU 1 is unhealthy");
  CommitFails(Place(n, 1000, 1024, {Share(0, 1000), Share(1, 1000)}), StatusCode::kFailedPrecondition,
              "GPU 1 is unhealthy");
  CommitOk(SharePlace(n, 1000, 2, 100));  // the other GPUs are fine
  ReleaseOk(held);
  EXPECT_EQ(G(n, 1).free_share, 1000);
  EXPECT_EQ(S(n).free_gpu_share, 2900);  // healthy GPUs 0, 2, 3 only
  ASSERT_TRUE(ledger_.SetGpuHealthy(n, 1, true).ok());
  ExpectInvariants();
  EXPECT_EQ(S(n).free_gpu_share, 3900);
  CommitOk(SharePlace(n, 1000, 1, 100));
  EXPECT_TRUE(Fails(ledger_.SetGpuHealthy(n, 4, false), StatusCode::kNotFound, "no GPU 4"));
  EXPECT_TRUE(Fails(ledger_.SetGpuHealthy(5, 0, false), StatusCode::kNotFound, "no node #5"));
}

// The compact list of usable GPUs (free share and GPU index, in GPU order) follows every change:
// commits, releases, a GPU's health and MIG mode. FGD's scores read it instead of the GPUs.
TEST_F(LedgerTest, TheCompactUsableGpuListFollowsTheGpus) {
  const NodeIndex n = Add(Node("n", 4, "A100-80GB"));
  auto usable = [&] {
    std::vector<std::pair<int, int>> out;  // (GPU index, free share)
    for (int32_t i = 0; i < S(n).usable_gpus; ++i)
      out.emplace_back(S(n).usable_index[static_cast<size_t>(i)], S(n).usable_free[static_cast<size_t>(i)]);
    return out;
  };
  using V = std::vector<std::pair<int, int>>;
  ASSERT_TRUE(S(n).compact());
  EXPECT_EQ(usable(), (V{{0, 1000}, {1, 1000}, {2, 1000}, {3, 1000}}));
  const AllocationId a = CommitOk(SharePlace(n, 1000, 2, 300));
  EXPECT_EQ(usable(), (V{{0, 1000}, {1, 1000}, {2, 700}, {3, 1000}}));
  ASSERT_TRUE(ledger_.SetGpuHealthy(n, 1, false).ok());
  ExpectInvariants();
  EXPECT_EQ(usable(), (V{{0, 1000}, {2, 700}, {3, 1000}}));
  ASSERT_TRUE(ledger_.SetMigEnabled(n, 0, true).ok());
  ExpectInvariants();
  EXPECT_EQ(usable(), (V{{2, 700}, {3, 1000}}));
  // Entries past the usable count are cleared, so equal states compare equal.
  EXPECT_EQ(S(n).usable_free[2], 0);
  EXPECT_EQ(S(n).usable_index[2], 0);
  ReleaseOk(a);
  ASSERT_TRUE(ledger_.SetGpuHealthy(n, 1, true).ok());
  EXPECT_EQ(usable(), (V{{1, 1000}, {2, 1000}, {3, 1000}}));
  // A node of more GPUs than the list holds is not compact: readers walk its GPUs.
  const NodeIndex big = Add(Node("big", static_cast<int>(NodeState::kCompactGpus) + 1, "A100-80GB", 64, 512));
  EXPECT_FALSE(S(big).compact());
  EXPECT_EQ(S(big).usable_gpus, static_cast<int32_t>(NodeState::kCompactGpus) + 1);
  ExpectInvariants();
}

TEST_F(LedgerTest, UnhealthyNodeRefusesNewCommits) {
  const NodeIndex n = Add(Node("n", 2, "T4"));
  const AllocationId held = CommitOk(SharePlace(n, 1000, 0, 500));
  ASSERT_TRUE(ledger_.SetNodeHealthy(n, false).ok());
  ExpectInvariants();
  EXPECT_FALSE(S(n).schedulable());
  CommitFails(Place(n, 1000, 1024), StatusCode::kFailedPrecondition, "node is unhealthy");
  CommitFails(SharePlace(n, 1000, 1, 500), StatusCode::kFailedPrecondition, "node is unhealthy");
  ReleaseOk(held);  // leaving is always allowed
  ASSERT_TRUE(ledger_.SetNodeHealthy(n, true).ok());
  EXPECT_TRUE(S(n).schedulable());
  CommitOk(Place(n, 1000, 1024));
  EXPECT_TRUE(Fails(ledger_.SetNodeHealthy(3, true), StatusCode::kNotFound, "no node #3"));
}

// A node or GPU marked unhealthy in its spec starts that way.
TEST_F(LedgerTest, UnhealthyFromTheSpec) {
  NodeSpec sick = Node("sick", 2, "T4");
  sick.healthy = false;
  sick.gpus[1].healthy = false;
  const NodeIndex n = Add(sick);
  EXPECT_FALSE(S(n).healthy);
  EXPECT_FALSE(G(n, 1).healthy);
  EXPECT_EQ(S(n).free_gpu_share, 1000);
  CommitFails(Place(n, 1, 1), StatusCode::kFailedPrecondition, "node is unhealthy");
  ExpectInvariants();
}

// Cordon marks the node unschedulable for the scheduler (its node filter enforces it); it changes no
// capacity and keeps what is there.
TEST_F(LedgerTest, CordonChangesSchedulabilityOnly) {
  const NodeIndex n = Add(Node("n", 2, "T4"));
  const AllocationId held = CommitOk(SharePlace(n, 1000, 0, 500));
  const uint64_t gen = S(n).generation;
  LedgerSnap expect = Snap(ledger_);
  ASSERT_TRUE(ledger_.SetCordoned(n, true).ok());
  ExpectInvariants();
  EXPECT_TRUE(S(n).cordoned);
  EXPECT_FALSE(S(n).schedulable());
  EXPECT_GT(S(n).generation, gen);
  expect.nodes[n].cordoned = true;
  EXPECT_EQ(Snap(ledger_), expect);  // nothing but the flag
  ReleaseOk(held);
  ASSERT_TRUE(ledger_.SetCordoned(n, false).ok());
  EXPECT_TRUE(S(n).schedulable());
  EXPECT_TRUE(Fails(ledger_.SetCordoned(2, true), StatusCode::kNotFound, "no node #2"));
}

// ---- Generations and totals ---------------------------------------------------------------------

// Every change to a node bumps its generation, and only its own: caches keyed by another node's
// generation stay valid. Failed operations bump nothing.
TEST_F(LedgerTest, GenerationBumpsOnEveryChangeOfThatNodeOnly) {
  const NodeIndex a = Add(Node("a", 2, "A100-80GB"));
  const NodeIndex b = Add(Node("b", 2, "T4"));
  std::vector<uint64_t> g = Generations(ledger_);
  auto expect_bumped = [&](NodeIndex changed, const char* what) {
    const std::vector<uint64_t> now = Generations(ledger_);
    for (NodeIndex i = 0; i < now.size(); ++i) {
      if (i == changed) {
        EXPECT_GT(now[i], g[i]) << what;
      } else {
        EXPECT_EQ(now[i], g[i]) << what << " touched node " << i;
      }
    }
    g = now;
  };
  const AllocationId id = CommitOk(SharePlace(a, 100, 0, 100));
  expect_bumped(a, "commit");
  const AllocationId cpu = CommitOk(Place(b, 100, 100));
  expect_bumped(b, "cpu commit");
  ReleaseOk(id);
  expect_bumped(a, "release");
  ReleaseOk(cpu);
  expect_bumped(b, "cpu release");
  ASSERT_TRUE(ledger_.SetCordoned(b, true).ok());
  expect_bumped(b, "cordon");
  ASSERT_TRUE(ledger_.SetNodeHealthy(a, false).ok());
  expect_bumped(a, "node health");
  ASSERT_TRUE(ledger_.SetNodeHealthy(a, true).ok());
  expect_bumped(a, "node health back");
  ASSERT_TRUE(ledger_.SetGpuHealthy(b, 1, false).ok());
  expect_bumped(b, "GPU health");
  ASSERT_TRUE(ledger_.SetMigEnabled(a, 1, true).ok());
  expect_bumped(a, "MIG mode");
  // Failures: nothing moves.
  EXPECT_FALSE(ledger_.Commit(Place(a, 1000000, 1)).ok());
  EXPECT_FALSE(ledger_.SetMigEnabled(b, 0, true).ok());
  EXPECT_FALSE(ledger_.Release(999).ok());
  EXPECT_EQ(Generations(ledger_), g);
}

// The cluster totals count the non-MIG GPUs of every node, healthy or not.
TEST_F(LedgerTest, ClusterTotals) {
  const NodeIndex a = Add(Node("a", 4, "A100-80GB"));
  const NodeIndex t = Add(Node("t", 2, "T4"));
  Add(Node("c", 0, ""));
  EXPECT_EQ(ledger_.total_gpus(), 6);
  EXPECT_EQ(ledger_.total_gpu_share(), 6000);
  const AllocationId x = CommitOk(SharePlace(a, 100, 0, 300));
  CommitOk(Place(t, 100, 100, {Share(0, 1000), Share(1, 1000)}));
  EXPECT_EQ(ledger_.used_gpu_share(), 2300);
  ASSERT_TRUE(ledger_.SetMigEnabled(a, 3, true).ok());
  CommitOk(Place(a, 100, 100, {Mig(3, k7g, 0)}));
  EXPECT_EQ(ledger_.total_gpus(), 5);
  EXPECT_EQ(ledger_.total_gpu_share(), 5000);
  EXPECT_EQ(ledger_.used_gpu_share(), 2300);  // MIG instances are not share
  ASSERT_TRUE(ledger_.SetGpuHealthy(a, 1, false).ok());
  EXPECT_EQ(ledger_.total_gpus(), 5);
  ReleaseOk(x);
  EXPECT_EQ(ledger_.used_gpu_share(), 2000);
}

// The ledger is movable; node model pointers must survive the move (ASan would catch a dangling one).
TEST_F(LedgerTest, MovedLedgerKeepsWorking) {
  const NodeIndex n = Add(Node("n", 2, "A100-80GB"));
  ASSERT_TRUE(ledger_.SetMigEnabled(n, 0, true).ok());
  const AllocationId id = CommitOk(Place(n, 100, 100, {Mig(0, k3g, 0)}));
  Ledger moved = std::move(ledger_);
  Result<AllocationId> next = moved.Commit(Place(n, 100, 100, {Mig(0, k3g, 4)}));
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_TRUE(moved.Release(id).ok());
  EXPECT_TRUE(moved.CheckInvariants().ok());
  ledger_ = std::move(moved);  // leave the fixture with a valid ledger
  ExpectInvariants();
}

}  // namespace
}  // namespace gpupool
