// Consolidation: a task that fits nowhere gets room by moving a few single-GPU tasks, all of
// them placed again in the same plan or none moved; never more moves than allowed, never a task
// that was not listed as movable, never a node the embedder masks.
#include "sched/consolidation.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "common/rng.h"
#include "sched/test_util.h"

namespace gpupool {
namespace {

using testutil::BuildForShares;
using testutil::kEveryPolicy;
using testutil::Task;
using testutil::TestCluster;

// The placements the ledger holds, as a multiset (ids aside).
std::multiset<std::string> Holdings(const Ledger& ledger) {
  std::multiset<std::string> out;
  for (const auto& [id, p] : ledger.allocations()) {
    std::string s = fmt::format("n{} cpu{} mem{}", p.node, p.cpu.units(), p.memory.units());
    for (const GpuGrant& g : p.gpus) s += fmt::format(" g{}:{}", g.gpu, g.share.units());
    out.insert(s);
  }
  return out;
}

// Two nodes of two T4s. Node a: two half-GPU tasks. Node b: a 0.4 share and a whole-GPU task.
struct Fixture {
  TestCluster c;
  NodeIndex a = 0, b = 0;
  TaskRequest half = Task().Cpu(1000).Gpus(1, 500);
  TaskRequest small = Task().Cpu(1000).Gpus(1, 400);
  TaskRequest whole = Task().Cpu(1000).Gpus(1, 1000);
  AllocationId a0 = 0, a1 = 0, b0 = 0, b1 = 0;
  explicit Fixture(int64_t a_share = 500) {
    a = c.AddNode("a", 16000, 64000, 2);
    b = c.AddNode("b", 16000, 64000, 2);
    half.gpu_share = MilliGpu(a_share);
    a0 = c.Commit(a, 1000, {{0, a_share}});
    a1 = c.Commit(a, 1000, {{1, a_share}});
    b0 = c.Commit(b, 1000, {{0, 400}});
    b1 = c.Commit(b, 1000, {{1, 1000}});
  }
  std::vector<MovableTask> Movable() const { return {{a0, &half}, {a1, &half}, {b0, &small}}; }
};

TEST(Consolidation, MovesTheSmallestShareToFreeAWholeGpu) {
  for (const char* policy : kEveryPolicy) {
    SCOPED_TRACE(policy);
    Fixture f;
    Scheduler& s = BuildForShares(f.c, policy);
    ASSERT_FALSE(s.Decide(f.whole).placed);
    const ConsolidationResult r = Consolidate(s, f.whole, f.Movable(), {});
    ASSERT_TRUE(r.error.ok()) << r.error.ToString();
    ASSERT_TRUE(r.placed);
    // One move on either node; b's moves 0.4 GPU against a's 0.5, so b is tried first, and its
    // 0.4 share has room beside a's halves.
    EXPECT_EQ(r.candidates, 2);
    EXPECT_EQ(r.tried, 1);
    EXPECT_EQ(r.placement.node, f.b);
    ASSERT_EQ(r.placement.gpus.size(), 1u);
    EXPECT_EQ(r.placement.gpus[0].gpu, 0);
    ASSERT_EQ(r.moves.size(), 1u);
    EXPECT_EQ(r.moves[0].from, f.b0);
    EXPECT_EQ(r.moves[0].before.node, f.b);
    EXPECT_EQ(r.moves[0].after.node, f.a);
    EXPECT_EQ(f.c.ledger().Find(f.b0), nullptr);
    ASSERT_NE(f.c.ledger().Find(r.moves[0].to), nullptr);
    ASSERT_NE(f.c.ledger().Find(r.allocation), nullptr);
    EXPECT_TRUE(r.renamed.empty());
    EXPECT_EQ(f.c.ledger().used_gpu_share(), 500 + 500 + 400 + 1000 + 1000);
    EXPECT_TRUE(f.c.ledger().CheckInvariants().ok());
  }
}

TEST(Consolidation, APlanWhoseMoverFindsNoPlaceChangesNothing) {
  for (const char* policy : kEveryPolicy) {
    SCOPED_TRACE(policy);
    // a's tasks hold 0.7 each: b's 0.4 finds no GPU with room, nor does a 0.7 leaving a.
    Fixture f(700);
    Scheduler& s = BuildForShares(f.c, policy);
    const auto before = Holdings(f.c.ledger());
    const ConsolidationResult r = Consolidate(s, f.whole, f.Movable(), {});
    ASSERT_TRUE(r.error.ok()) << r.error.ToString();
    EXPECT_FALSE(r.placed);
    EXPECT_TRUE(r.moves.empty());
    // a's 0.7 shares have room nowhere (no GPU has 0.7 free): the estimate leaves them be. b's
    // 0.4 could go back beside itself, so b is tried: once the whole-GPU task takes that GPU, the
    // 0.4 finds no place and the trial is undone.
    EXPECT_EQ(r.candidates, 1);
    EXPECT_EQ(r.tried, 1);
    EXPECT_EQ(Holdings(f.c.ledger()), before);
    EXPECT_EQ(f.c.ledger().allocation_count(), 4u);
    // The trial released and restored its mover: the old id is gone, the new one holds what the
    // old one held.
    ASSERT_EQ(r.renamed.size(), 1u);
    EXPECT_EQ(r.renamed[0].first, f.b0);
    for (const auto& [from, to] : r.renamed) {
      EXPECT_EQ(f.c.ledger().Find(from), nullptr);
      EXPECT_NE(f.c.ledger().Find(to), nullptr);
    }
    EXPECT_TRUE(f.c.ledger().CheckInvariants().ok());
  }
}

TEST(Consolidation, KeepsToTheMoveBudgetAndTheMovableList) {
  TestCluster c;
  const NodeIndex n = c.AddNode("n", 16000, 64000, 2);
  const TaskRequest q = Task().Cpu(1000).Gpus(1, 250);
  std::vector<MovableTask> movable;
  // GPU 0: three quarters (three moves to empty it); GPU 1: two quarters, one of them not movable.
  std::vector<AllocationId> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(c.Commit(n, 1000, {{0, 250}}));
  ids.push_back(c.Commit(n, 1000, {{1, 250}}));
  const AllocationId pinned = c.Commit(n, 1000, {{1, 250}});
  for (AllocationId id : ids) movable.push_back({id, &q});
  Scheduler& s = BuildForShares(c, "balanced");
  const TaskRequest whole = Task().Cpu(1000).Gpus(1, 1000);
  ConsolidationOptions o;
  o.max_moves = 2;
  const auto before = Holdings(c.ledger());
  ConsolidationResult r = Consolidate(s, whole, movable, o);
  EXPECT_FALSE(r.placed);
  EXPECT_EQ(r.candidates, 0);  // GPU 0 needs three moves, GPU 1 holds a task that may not move
  EXPECT_EQ(Holdings(c.ledger()), before);
  // The same with the pinned task movable: two moves empty GPU 1, but its quarters find room
  // only on GPU 0, one of them: the plan is refused whole.
  movable.push_back({pinned, &q});
  r = Consolidate(s, whole, movable, o);
  EXPECT_FALSE(r.placed);
  EXPECT_EQ(r.candidates, 1);
  EXPECT_EQ(Holdings(c.ledger()), before);
  EXPECT_TRUE(c.ledger().CheckInvariants().ok());
}

TEST(Consolidation, NeverUsesANodeTheEmbedderMasks) {
  Fixture f;
  Scheduler& s = BuildForShares(f.c, "balanced");
  // b is held for someone else: the plan must use a, and a's mover must not go to b.
  NodeMask mask;
  mask.reasons = {"held for a gang"};
  mask.reason = {0, 1};
  ConsolidationOptions o;
  o.mask = &mask;
  const ConsolidationResult r = Consolidate(s, f.whole, f.Movable(), o);
  ASSERT_TRUE(r.error.ok()) << r.error.ToString();
  // b would move less (0.4 GPU), but only a is allowed: one half moves beside the other.
  EXPECT_EQ(r.candidates, 1);
  ASSERT_TRUE(r.placed);
  EXPECT_EQ(r.placement.node, f.a);
  ASSERT_EQ(r.moves.size(), 1u);
  EXPECT_EQ(r.moves[0].after.node, f.a);
  EXPECT_NE(r.moves[0].after.gpus[0].gpu, r.placement.gpus[0].gpu);
  // With b held and a full, a second whole GPU finds no plan: a's halves have nowhere to go.
  const ConsolidationResult second = Consolidate(s, f.whole, f.Movable(), o);
  EXPECT_FALSE(second.placed);
  EXPECT_TRUE(f.c.ledger().CheckInvariants().ok());
}

TEST(Consolidation, RefusesWhatItCannotDo) {
  Fixture f;
  Scheduler& s = BuildForShares(f.c, "balanced");
  ConsolidationOptions o;
  o.max_moves = 0;
  EXPECT_EQ(Consolidate(s, f.whole, f.Movable(), o).error.code(), StatusCode::kInvalidArgument);
  o.max_moves = 65;
  EXPECT_EQ(Consolidate(s, f.whole, f.Movable(), o).error.code(), StatusCode::kInvalidArgument);
  o = {};
  o.max_candidates = 0;
  EXPECT_EQ(Consolidate(s, f.whole, f.Movable(), o).error.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Consolidate(s, Task().Cpu(1000), f.Movable(), {}).error.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Consolidate(s, Task().Cpu(1000).Mig("1g.10gb"), f.Movable(), {}).error.code(),
            StatusCode::kInvalidArgument);
  TaskRequest bad = f.whole;
  bad.gpu_share = MilliGpu(1500);
  EXPECT_EQ(Consolidate(s, bad, f.Movable(), {}).error.code(), StatusCode::kInvalidArgument);
  // Unknown ids, missing requests and a task listed twice are ignored, not released twice.
  std::vector<MovableTask> hostile = {{999999, &f.small}, {f.b0, nullptr}, {f.b0, &f.small}, {f.b0, &f.small}};
  const ConsolidationResult r = Consolidate(s, f.whole, hostile, {});
  ASSERT_TRUE(r.error.ok()) << r.error.ToString();
  EXPECT_TRUE(r.placed);
  EXPECT_EQ(r.moves.size(), 1u);
  EXPECT_TRUE(f.c.ledger().CheckInvariants().ok());
}

// Random clusters, random single- and multi-GPU tasks, a random part of them movable, random
// pending tasks; every policy. A plan is all or nothing and within its budget.
TEST(Consolidation, PropertyEveryEvictedTaskIsPlacedAgainWithinTheBudget) {
  const std::vector<TaskRequest> shapes = {
      Task().Cpu(2000).Mem(4000).Gpus(1, 100), Task().Cpu(2000).Mem(4000).Gpus(1, 250),
      Task().Cpu(2000).Mem(4000).Gpus(1, 470), Task().Cpu(4000).Mem(8000).Gpus(1, 810),
      Task().Cpu(4000).Mem(8000).Gpus(1, 1000), Task().Cpu(8000).Mem(16000).Gpus(2, 1000),
  };
  int plans = 0, refused = 0;
  for (const char* policy : kEveryPolicy) {
    for (uint64_t seed = 1; seed <= 12; ++seed) {
      SCOPED_TRACE(fmt::format("{} seed {}", policy, seed));
      SeededRng rng(seed);
      TestCluster c(seed);
      const int nodes = 2 + static_cast<int>(rng.Uniform(4));
      for (int i = 0; i < nodes; ++i)
        c.AddNode(fmt::format("n{}", i), 32000, 128000, 1 + static_cast<int>(rng.Uniform(4)));
      Scheduler& s = BuildForShares(c, policy);
      std::map<AllocationId, const TaskRequest*> request_of;
      std::set<AllocationId> movable_ids;
      // Fill until a few tasks fail.
      for (int failures = 0, i = 0; failures < 6 && i < 200; ++i) {
        const TaskRequest& t = shapes[rng.Uniform(shapes.size())];
        auto id = s.Place(t);
        if (!id.ok()) {
          ++failures;
          continue;
        }
        request_of[*id] = &t;
        if (rng.Uniform(4) != 0) movable_ids.insert(*id);
      }
      // Departures leave holes here and there: the fragmentation a consolidation works on.
      for (auto it = request_of.begin(); it != request_of.end();) {
        if (rng.Uniform(3) == 0) {
          ASSERT_TRUE(c.ledger().Release(it->first).ok());
          movable_ids.erase(it->first);
          it = request_of.erase(it);
        } else {
          ++it;
        }
      }
      for (int round = 0; round < 6; ++round) {
        const TaskRequest& pending = shapes[3 + rng.Uniform(3)];
        if (s.Decide(pending).placed) {
          request_of[*s.Place(pending)] = &pending;
          continue;
        }
        std::vector<MovableTask> movable;
        for (AllocationId id : movable_ids) movable.push_back({id, request_of.at(id)});
        ConsolidationOptions o;
        o.max_moves = 1 + static_cast<int>(rng.Uniform(4));
        o.max_candidates = 1 + static_cast<int>(rng.Uniform(8));
        const auto before = Holdings(c.ledger());
        const size_t count = c.ledger().allocation_count();
        const ConsolidationResult r = Consolidate(s, pending, movable, o);
        ASSERT_TRUE(r.error.ok()) << r.error.ToString();
        ASSERT_TRUE(c.ledger().CheckInvariants().ok());
        EXPECT_LE(r.tried, o.max_candidates);
        // The embedder's books follow the renames, then the moves.
        for (const auto& [from, to] : r.renamed) {
          ASSERT_TRUE(request_of.count(from));
          ASSERT_TRUE(movable_ids.count(from)) << "a task not listed as movable was released";
          request_of[to] = request_of.at(from);
          request_of.erase(from);
          movable_ids.erase(from);
          movable_ids.insert(to);
        }
        if (!r.placed) {
          ++refused;
          EXPECT_TRUE(r.moves.empty());
          EXPECT_EQ(Holdings(c.ledger()), before);
          EXPECT_EQ(c.ledger().allocation_count(), count);
          continue;
        }
        ++plans;
        EXPECT_GE(r.moves.size(), 1u);
        EXPECT_LE(static_cast<int>(r.moves.size()), o.max_moves);
        EXPECT_EQ(c.ledger().allocation_count(), count + 1);
        EXPECT_EQ(*c.ledger().Find(r.allocation), r.placement);
        for (const TaskMove& m : r.moves) {
          ASSERT_TRUE(movable_ids.count(m.from)) << "a task not listed as movable was moved";
          EXPECT_EQ(c.ledger().Find(m.from), nullptr);
          ASSERT_NE(c.ledger().Find(m.to), nullptr);
          EXPECT_EQ(*c.ledger().Find(m.to), m.after);
          EXPECT_EQ(m.after.gpus.size(), 1u);
          EXPECT_EQ(m.after.gpus[0].share, m.before.gpus[0].share);
          request_of[m.to] = request_of.at(m.from);
          request_of.erase(m.from);
          movable_ids.erase(m.from);
          movable_ids.insert(m.to);
        }
        request_of[r.allocation] = &pending;
        // Every task the books know still holds an allocation, and nothing else does.
        EXPECT_EQ(request_of.size(), c.ledger().allocation_count());
        for (const auto& [id, t] : request_of) EXPECT_NE(c.ledger().Find(id), nullptr);
      }
    }
  }
  // The property means something only if both outcomes happen.
  EXPECT_GT(plans, 20);
  EXPECT_GT(refused, 20);
}

}  // namespace
}  // namespace gpupool
