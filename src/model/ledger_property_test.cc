// Randomised property test of the Ledger: thousands of random commits (valid, oversized and
// malformed), releases, health, cordon and MIG-mode changes on a small mixed cluster, checking after
// every step that
//   - CheckInvariants() is OK and no free amount is negative or above capacity;
//   - the ledger agrees with an independent model (a plain map of what was committed): every free
//     amount is capacity minus the model's sums, every counter is the model's count;
//   - a commit succeeds exactly when the model says the placement fits;
//   - a failed operation leaves the whole ledger state unchanged, generations included;
//   - commit immediately followed by release restores exactly the state before the commit (the
//     generation only grows);
//   - generations never decrease, grow on every change of a node, and only on that node.
// All draws come from SeededRng with fixed seeds, so every run is the same run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "common/rng.h"
#include "model/gpu_catalog.h"
#include "model/ledger.h"
#include "model/ledger_test_util.h"
#include "model/node.h"

namespace gpupool {
namespace {

using testutil::Generations;
using testutil::LedgerSnap;
using testutil::NodeSnap;
using testutil::Snap;
using testutil::SnapNode;
using testutil::SortedInstances;
using testutil::Trimmed;

// ---- The cluster --------------------------------------------------------------------------------

struct NodeDef {
  const char* name;
  const char* model;  // "" for a CPU-only node
  int gpus;
  int64_t cores;
  int64_t gib;
  int max_tasks;
  std::vector<int> mig_gpus;  // MIG mode turned on at the start
};

// Two A100-80GB nodes with some MIG GPUs, two T4 nodes, a CPU-only node and a G2 node (GPU memory
// unknown, so per-GPU memory requests never fit there). Three nodes have a task limit.
const std::vector<NodeDef>& Cluster() {
  static const std::vector<NodeDef> defs = {
      {"a100-a", "A100-80GB", 4, 64, 256, 0, {0, 1}},
      {"a100-b", "A100-80GB", 2, 16, 64, 5, {1}},
      {"t4-a", "T4", 4, 32, 128, 0, {}},
      {"t4-b", "T4", 1, 8, 32, 3, {}},
      {"cpu", "", 0, 16, 64, 0, {}},
      {"g2", "G2", 2, 24, 96, 4, {}},
  };
  return defs;
}

// ---- The independent model ----------------------------------------------------------------------

// What the test itself knows: the specs it created, the flags it set and the placements it
// committed. Everything the ledger reports is checked against sums over this.
class Model {
 public:
  explicit Model(const GpuCatalog& catalog) : catalog_(catalog) {}

  void AddNode(const NodeSpec& spec) {
    specs_.push_back(spec);
    node_healthy_.push_back(spec.healthy);
    cordoned_.push_back(false);
    std::vector<bool> healthy;
    std::vector<bool> mig;
    for (const GpuDevice& g : spec.gpus) {
      healthy.push_back(g.healthy);
      mig.push_back(g.mig_enabled);
    }
    gpu_healthy_.push_back(healthy);
    gpu_mig_.push_back(mig);
  }

  size_t node_count() const { return specs_.size(); }
  const NodeSpec& spec(NodeIndex n) const { return specs_[n]; }
  size_t gpu_count(NodeIndex n) const { return specs_[n].gpus.size(); }
  const std::map<AllocationId, Placement>& live() const { return live_; }

  const MigGeometry* Geometry(NodeIndex n) const {
    if (specs_[n].gpus.empty()) return nullptr;
    const GpuModelSpec* m = catalog_.Find(specs_[n].gpus.front().model);
    return m != nullptr && m->mig ? &*m->mig : nullptr;
  }

  // Sums over the live placements of one node.
  struct Usage {
    int64_t cpu = 0;
    int64_t memory = 0;
    int32_t tasks = 0;
    int32_t share_tasks = 0;
    std::vector<int32_t> by_count;
    std::vector<int64_t> gpu_share;
    std::vector<int64_t> gpu_memory;
    std::vector<int32_t> gpu_tasks;
    std::vector<std::vector<MigInstance>> mig;
  };

  Usage UsageOf(NodeIndex n) const {
    Usage u;
    const size_t g = gpu_count(n);
    u.gpu_share.assign(g, 0);
    u.gpu_memory.assign(g, 0);
    u.gpu_tasks.assign(g, 0);
    u.mig.assign(g, {});
    for (const auto& [id, p] : live_) {
      if (p.node != n) continue;
      u.cpu += p.cpu.units();
      u.memory += p.memory.units();
      ++u.tasks;
      for (const GpuGrant& grant : p.gpus) {
        const auto i = static_cast<size_t>(grant.gpu);
        u.gpu_share[i] += grant.share.units();
        u.gpu_memory[i] += grant.memory.units();
        ++u.gpu_tasks[i];
        if (grant.mig) u.mig[i].push_back(*grant.mig);
      }
      if (p.gpus.empty()) continue;
      if (p.share_task) {
        ++u.share_tasks;
      } else {
        if (u.by_count.size() <= p.gpus.size()) u.by_count.resize(p.gpus.size() + 1, 0);
        ++u.by_count[p.gpus.size()];
      }
    }
    return u;
  }

  // Whether a new MIG instance fits next to `existing`, from the catalog's profile table: a valid
  // start inside the GPU, no shared memory slice, compute slices within the total, the profile's
  // instance limit, and one media-extensions instance at most.
  bool MigFits(const MigGeometry& geo, const std::vector<MigInstance>& existing,
               const MigInstance& want) const {
    const MigProfile* p = ProfileById(geo, want.profile_id);
    if (p == nullptr) return false;
    if (want.start < 0 || want.start >= 8 || (p->valid_starts & (1u << want.start)) == 0) return false;
    if (want.start + p->memory_slices > geo.total_memory_slices) return false;
    int compute = p->compute_slices;
    int same = 0;
    bool media = false;
    for (const MigInstance& e : existing) {
      const MigProfile* q = ProfileById(geo, e.profile_id);
      if (q == nullptr) return false;  // cannot happen: the model only holds committed instances
      const bool disjoint =
          e.start + q->memory_slices <= want.start || want.start + p->memory_slices <= e.start;
      if (!disjoint) return false;
      compute += q->compute_slices;
      same += q->driver_id == p->driver_id ? 1 : 0;
      media = media || q->media_extensions;
    }
    if (compute > geo.total_compute_slices) return false;
    if (same >= p->max_instances) return false;
    return !(p->media_extensions && media);
  }

  // The oracle: does `p` fit now? Written from the ledger's documented contract, not its code.
  bool Fits(const Placement& p) const {
    if (p.node >= specs_.size()) return false;
    const NodeSpec& spec = specs_[p.node];
    if (p.cpu.units() < 0 || p.memory.units() < 0) return false;
    if (!node_healthy_[p.node]) return false;
    const Usage u = UsageOf(p.node);
    if (p.cpu.units() > spec.cpu.units() - u.cpu) return false;
    if (p.memory.units() > spec.memory.units() - u.memory) return false;
    if (spec.max_tasks > 0 && u.tasks >= spec.max_tasks) return false;
    std::vector<bool> seen(spec.gpus.size(), false);
    for (const GpuGrant& g : p.gpus) {
      if (g.gpu < 0 || static_cast<size_t>(g.gpu) >= spec.gpus.size()) return false;
      const auto i = static_cast<size_t>(g.gpu);
      if (seen[i]) return false;
      seen[i] = true;
      if (!gpu_healthy_[p.node][i]) return false;
      if (g.share.units() < 0 || g.memory.units() < 0) return false;
      if (g.mig) {
        if (!gpu_mig_[p.node][i]) return false;
        if (!g.share.is_zero() || !g.memory.is_zero()) return false;
        const MigGeometry* geo = Geometry(p.node);
        if (geo == nullptr || !MigFits(*geo, u.mig[i], *g.mig)) return false;
        continue;
      }
      if (gpu_mig_[p.node][i]) return false;
      if (g.share.units() < 1) return false;
      if (g.share.units() > kWholeGpu.units() - u.gpu_share[i]) return false;
      if (g.memory.units() > spec.gpus[i].memory.units() - u.gpu_memory[i]) return false;
    }
    return true;
  }

  void Commit(AllocationId id, const Placement& p) { live_.emplace(id, p); }
  void Release(AllocationId id) { live_.erase(id); }

  bool node_healthy(NodeIndex n) const { return node_healthy_[n]; }
  bool cordoned(NodeIndex n) const { return cordoned_[n]; }
  bool gpu_healthy(NodeIndex n, size_t i) const { return gpu_healthy_[n][i]; }
  bool gpu_mig(NodeIndex n, size_t i) const { return gpu_mig_[n][i]; }
  void set_node_healthy(NodeIndex n, bool v) { node_healthy_[n] = v; }
  void set_cordoned(NodeIndex n, bool v) { cordoned_[n] = v; }
  void set_gpu_healthy(NodeIndex n, size_t i, bool v) { gpu_healthy_[n][i] = v; }
  void set_gpu_mig(NodeIndex n, size_t i, bool v) { gpu_mig_[n][i] = v; }

 private:
  static const MigProfile* ProfileById(const MigGeometry& geo, int id) {
    for (const MigProfile& p : geo.profiles) {
      if (p.driver_id == id) return &p;
    }
    return nullptr;
  }

  const GpuCatalog& catalog_;
  std::vector<NodeSpec> specs_;
  std::vector<bool> node_healthy_;
  std::vector<bool> cordoned_;
  std::vector<std::vector<bool>> gpu_healthy_;
  std::vector<std::vector<bool>> gpu_mig_;
  std::map<AllocationId, Placement> live_;
};

// ---- Checks against the model -------------------------------------------------------------------

// Every number the ledger keeps, recomputed from the model. Also bounds: nothing negative, nothing
// above capacity.
void ExpectMatchesModel(const Ledger& ledger, const Model& model, const std::string& where) {
  ASSERT_EQ(ledger.node_count(), model.node_count()) << where;
  ASSERT_EQ(ledger.allocation_count(), model.live().size()) << where;
  for (const auto& [id, p] : model.live()) {
    const Placement* found = ledger.Find(id);
    ASSERT_NE(found, nullptr) << where << ": allocation " << id;
    ASSERT_EQ(*found, p) << where << ": allocation " << id;
  }
  int64_t used_share = 0;
  int total_gpus = 0;
  for (NodeIndex n = 0; n < model.node_count(); ++n) {
    const NodeSpec& spec = model.spec(n);
    const NodeState& s = ledger.state(n);
    const Model::Usage u = model.UsageOf(n);
    const std::string at = where + ", node " + spec.name;
    ASSERT_EQ(s.free_cpu, spec.cpu.units() - u.cpu) << at;
    ASSERT_EQ(s.free_memory, spec.memory.units() - u.memory) << at;
    ASSERT_GE(s.free_cpu, 0) << at;
    ASSERT_LE(s.free_cpu, spec.cpu.units()) << at;
    ASSERT_GE(s.free_memory, 0) << at;
    ASSERT_LE(s.free_memory, spec.memory.units()) << at;
    ASSERT_EQ(s.tasks, u.tasks) << at;
    if (spec.max_tasks > 0) {
      ASSERT_LE(s.tasks, spec.max_tasks) << at;
    }
    ASSERT_EQ(s.max_tasks, spec.max_tasks) << at;
    ASSERT_EQ(s.healthy, model.node_healthy(n)) << at;
    ASSERT_EQ(s.cordoned, model.cordoned(n)) << at;
    ASSERT_EQ(s.schedulable(), model.node_healthy(n) && !model.cordoned(n)) << at;
    ASSERT_EQ(s.share_tasks, u.share_tasks) << at;
    ASSERT_EQ(Trimmed(s.tasks_by_gpu_count), Trimmed(u.by_count)) << at;
    ASSERT_EQ(s.gpus.size(), spec.gpus.size()) << at;
    int64_t free_share_sum = 0;
    int32_t fully_free = 0;
    int32_t usable = 0;
    int32_t max_free = 0;
    for (size_t i = 0; i < spec.gpus.size(); ++i) {
      const GpuState& g = s.gpus[i];
      const std::string gat = at + ", GPU " + std::to_string(i);
      ASSERT_EQ(g.free_share, kWholeGpu.units() - u.gpu_share[i]) << gat;
      ASSERT_EQ(g.free_memory, spec.gpus[i].memory.units() - u.gpu_memory[i]) << gat;
      ASSERT_GE(g.free_share, 0) << gat;
      ASSERT_LE(g.free_share, kWholeGpu.units()) << gat;
      ASSERT_GE(g.free_memory, 0) << gat;
      ASSERT_LE(g.free_memory, spec.gpus[i].memory.units()) << gat;
      ASSERT_EQ(g.tasks, u.gpu_tasks[i]) << gat;
      ASSERT_EQ(g.healthy, model.gpu_healthy(n, i)) << gat;
      ASSERT_EQ(g.mig_enabled, model.gpu_mig(n, i)) << gat;
      ASSERT_EQ(ledger.spec(n).gpus[i].mig_enabled, model.gpu_mig(n, i)) << gat;
      ASSERT_EQ(SortedInstances(g.mig.instances()), SortedInstances(u.mig[i])) << gat;
      if (!g.mig.empty()) {
        ASSERT_TRUE(g.mig_enabled) << gat;
      }
      if (const MigGeometry* geo = model.Geometry(n)) {
        ASSERT_LE(g.mig.used_compute_slices(*geo), geo->total_compute_slices) << gat;
      }
      used_share += u.gpu_share[i];
      if (!model.gpu_mig(n, i)) ++total_gpus;
      if (model.gpu_healthy(n, i) && !model.gpu_mig(n, i)) {
        const int64_t free = kWholeGpu.units() - u.gpu_share[i];
        free_share_sum += free;
        fully_free += free == kWholeGpu.units() ? 1 : 0;
        ++usable;
        max_free = std::max(max_free, static_cast<int32_t>(free));
      }
    }
    ASSERT_EQ(s.free_gpu_share, free_share_sum) << at;
    ASSERT_EQ(s.fully_free_gpus, fully_free) << at;
    ASSERT_EQ(s.usable_gpus, usable) << at;
    ASSERT_EQ(s.max_free_share, max_free) << at;
  }
  ASSERT_EQ(ledger.used_gpu_share(), used_share) << where;
  ASSERT_EQ(ledger.total_gpus(), total_gpus) << where;
  ASSERT_EQ(ledger.total_gpu_share(), int64_t{total_gpus} * kWholeGpu.units()) << where;
}

// ---- Random placements --------------------------------------------------------------------------

constexpr int kMigProfileIds[] = {19, 20, 15, 14, 9, 5, 0};

// A random CPU or memory amount: mostly small against the node's capacity (so a node holds many
// tasks), sometimes anything up to what is free, exactly what is free, more than is free, or a
// negative (malformed) amount.
int64_t RandomAmount(Rng& rng, int64_t free, int64_t capacity) {
  const uint64_t r = rng.Uniform(100);
  if (r < 70) return static_cast<int64_t>(rng.Uniform(static_cast<uint64_t>(capacity / 16 + 1)));
  if (r < 82) return static_cast<int64_t>(rng.Uniform(static_cast<uint64_t>(free + 1)));
  if (r < 85) return free;
  if (r < 95) return free + 1 + static_cast<int64_t>(rng.Uniform(static_cast<uint64_t>(capacity / 2 + 1)));
  if (r < 98) return capacity;
  return -1 - static_cast<int64_t>(rng.Uniform(10));
}

int64_t RandomShare(Rng& rng) {
  switch (rng.Uniform(10)) {
    case 0: return 100;
    case 1: return 250;
    case 2: return 500;
    case 3:
    case 4: return 1000;
    case 5: return 1 + static_cast<int64_t>(rng.Uniform(999));
    case 6: return 1 + static_cast<int64_t>(rng.Uniform(300));
    case 7: return rng.Uniform(20) == 0 ? 0 : 700;     // zero share: malformed
    case 8: return rng.Uniform(20) == 0 ? -100 : 300;  // negative: malformed
    default: return rng.Uniform(10) == 0 ? 1001 : 50;  // above a whole GPU: never fits
  }
}

int64_t RandomGpuMemory(Rng& rng, int64_t capacity) {
  switch (rng.Uniform(6)) {
    case 0:
    case 1:
    case 2: return 0;
    case 3: return static_cast<int64_t>(rng.Uniform(static_cast<uint64_t>(capacity / 4 + 1)));
    case 4: return static_cast<int64_t>(rng.Uniform(static_cast<uint64_t>(capacity + 1)));
    default: return rng.Uniform(4) == 0 ? capacity + 1 : 1024;
  }
}

MigInstance RandomMig(Rng& rng, const MigGeometry* geo) {
  MigInstance m;
  if (rng.Uniform(40) == 0) {
    m.profile_id = 99;  // unknown profile
  } else {
    m.profile_id = kMigProfileIds[rng.Uniform(std::size(kMigProfileIds))];
  }
  m.start = static_cast<int>(rng.Uniform(9));  // 0..8: often invalid for the profile
  if (geo != nullptr && rng.Uniform(10) < 6) {
    // Mostly a start the profile allows, so that instances do get placed.
    for (const MigProfile& p : geo->profiles) {
      if (p.driver_id != m.profile_id) continue;
      std::vector<int> starts;
      for (int s = 0; s < 8; ++s) {
        if ((p.valid_starts & (1u << s)) != 0) starts.push_back(s);
      }
      if (!starts.empty()) m.start = starts[rng.Uniform(starts.size())];
    }
  }
  return m;
}

enum Kind { kCpuOnly, kShare, kMulti, kMig, kGarbage, kKindCount };
const char* const kKindNames[] = {"cpu-only", "share", "multi-gpu", "mig", "garbage"};

// GPU indices of node `n` whose MIG mode is `mig`.
std::vector<int> GpusInMode(const Model& model, NodeIndex n, bool mig) {
  std::vector<int> out;
  for (size_t i = 0; i < model.gpu_count(n); ++i) {
    if (model.gpu_mig(n, i) == mig) out.push_back(static_cast<int>(i));
  }
  return out;
}

Placement RandomPlacement(Rng& rng, const Model& model, Kind* kind) {
  Placement p;
  if (rng.Uniform(100) < 2) {  // a node that does not exist
    p.node = static_cast<NodeIndex>(model.node_count() + rng.Uniform(3));
    *kind = kGarbage;
    return p;
  }
  const uint64_t r = rng.Uniform(100);
  *kind = r < 20 ? kCpuOnly : r < 45 ? kShare : r < 65 ? kMulti : r < 85 ? kMig : kGarbage;
  // Mostly a node that can serve the kind at all (a GPU in the right mode), so that enough commits
  // succeed for the successes to be tested too; otherwise any node.
  const bool wants_mig = *kind == kMig;
  p.node = static_cast<NodeIndex>(rng.Uniform(model.node_count()));
  if ((*kind == kShare || *kind == kMulti || *kind == kMig) && rng.Uniform(5) != 0) {
    std::vector<NodeIndex> suited;
    for (NodeIndex n = 0; n < model.node_count(); ++n) {
      if (!GpusInMode(model, n, wants_mig).empty()) suited.push_back(n);
    }
    if (!suited.empty()) p.node = suited[rng.Uniform(suited.size())];
  }
  const NodeSpec& spec = model.spec(p.node);
  const Model::Usage u = model.UsageOf(p.node);
  p.cpu = MilliCpu(RandomAmount(rng, spec.cpu.units() - u.cpu, spec.cpu.units()));
  p.memory = MiB(RandomAmount(rng, spec.memory.units() - u.memory, spec.memory.units()));
  const auto gpus = static_cast<int>(spec.gpus.size());
  const int64_t gpu_mem_cap = spec.gpus.empty() ? 0 : spec.gpus.front().memory.units();
  const std::vector<int> in_mode = GpusInMode(model, p.node, wants_mig);
  // A GPU index: mostly one in the mode the kind needs, else any, now and then one past the end.
  auto pick_gpu = [&]() {
    if (!in_mode.empty() && rng.Uniform(5) != 0) return in_mode[rng.Uniform(in_mode.size())];
    return rng.Uniform(30) == 0 ? gpus : static_cast<int>(rng.Uniform(std::max(gpus, 1)));
  };
  if (*kind == kCpuOnly) {
    // No GPUs.
  } else if (*kind == kShare) {
    GpuGrant g;
    g.gpu = pick_gpu();
    g.share = MilliGpu(RandomShare(rng));
    g.memory = MiB(RandomGpuMemory(rng, gpu_mem_cap));
    p.gpus.push_back(g);
  } else if (*kind == kMulti) {
    // Mostly distinct non-MIG GPUs; sometimes any GPUs, and sometimes one more than the node has.
    std::vector<int> pool = in_mode;
    if (pool.empty() || rng.Uniform(5) == 0) {
      pool.clear();
      for (int i = 0; i < gpus; ++i) pool.push_back(i);
    }
    if (pool.empty() || rng.Uniform(25) == 0) pool.push_back(gpus);
    const std::vector<uint32_t> order = rng.Permutation(static_cast<uint32_t>(pool.size()));
    const auto count = 1 + static_cast<size_t>(rng.Uniform(pool.size()));
    const int64_t share = rng.Uniform(4) == 0 ? RandomShare(rng) : 1000;
    const int64_t memory = RandomGpuMemory(rng, gpu_mem_cap);
    for (size_t i = 0; i < count; ++i) {
      GpuGrant g;
      g.gpu = pool[order[i]];
      g.share = MilliGpu(share);
      g.memory = MiB(memory);
      p.gpus.push_back(g);
    }
  } else if (*kind == kMig) {
    GpuGrant g;
    g.gpu = pick_gpu();
    g.mig = RandomMig(rng, model.Geometry(p.node));
    p.gpus.push_back(g);
  } else {
    switch (rng.Uniform(5)) {
      case 0: {  // the same GPU twice
        const int gpu = pick_gpu();
        p.gpus.push_back({gpu, MilliGpu(100), MiB(0), std::nullopt});
        p.gpus.push_back({gpu, MilliGpu(100), MiB(0), std::nullopt});
        break;
      }
      case 1: {  // a MIG instance that also carries share or memory
        GpuGrant g;
        g.gpu = pick_gpu();
        g.mig = RandomMig(rng, model.Geometry(p.node));
        if (rng.Uniform(2) == 0) {
          g.share = MilliGpu(100);
        } else {
          g.memory = MiB(1024);
        }
        p.gpus.push_back(g);
        break;
      }
      case 2: {  // a MIG instance plus a share grant elsewhere: valid only if both GPUs suit
        GpuGrant a;
        a.gpu = pick_gpu();
        a.mig = RandomMig(rng, model.Geometry(p.node));
        p.gpus.push_back(a);
        p.gpus.push_back({pick_gpu(), MilliGpu(RandomShare(rng)), MiB(0), std::nullopt});
        break;
      }
      case 3:  // negative GPU index
        p.gpus.push_back({-1 - static_cast<int>(rng.Uniform(3)), MilliGpu(100), MiB(0), std::nullopt});
        break;
      default:  // two MIG instances on two GPUs
        for (int i = 0; i < 2; ++i) {
          GpuGrant g;
          g.gpu = pick_gpu();
          g.mig = RandomMig(rng, model.Geometry(p.node));
          p.gpus.push_back(g);
        }
        break;
    }
  }
  // As the scheduler tags it: one GPU, part of it, not MIG.
  p.share_task = p.gpus.size() == 1 && !p.gpus[0].mig && p.gpus[0].share < kWholeGpu;
  return p;
}

// ---- The run ------------------------------------------------------------------------------------

struct Stats {
  int commit_ok[kKindCount] = {};
  int commit_failed[kKindCount] = {};
  int releases = 0;
  int bogus_releases = 0;
  int round_trips = 0;
  int toggles = 0;
  int mig_toggles_ok = 0;
  int mig_toggles_refused = 0;
  size_t max_live = 0;
};

class LedgerPropertyTest : public ::testing::TestWithParam<uint64_t> {
 protected:
  void SetUp() override {
    for (const NodeDef& d : Cluster()) {
      NodeSpec spec =
          MakeNode(d.name, MilliCpu(d.cores * 1000), MiB(d.gib * 1024), d.gpus, d.model, ledger_.catalog());
      spec.max_tasks = d.max_tasks;
      Result<NodeIndex> n = ledger_.AddNode(spec);
      ASSERT_TRUE(n.ok()) << n.status().ToString();
      model_.AddNode(spec);
      for (int gpu : d.mig_gpus) {
        ASSERT_TRUE(ledger_.SetMigEnabled(*n, gpu, true).ok());
        model_.set_gpu_mig(*n, static_cast<size_t>(gpu), true);
      }
    }
    ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(ledger_, model_, "start"));
  }

  // Checks to run after every step: invariants, the model, and generation monotonicity. `changed`
  // is the node the step changed (or -1 for none); only its generation may move, and it must.
  void AfterStep(const std::string& where, const LedgerSnap& before, const std::vector<uint64_t>& gens_before,
                 int64_t changed) {
    const Status inv = ledger_.CheckInvariants();
    ASSERT_TRUE(inv.ok()) << where << ": " << inv.ToString();
    ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(ledger_, model_, where));
    const LedgerSnap after = Snap(ledger_);
    const std::vector<uint64_t> gens = Generations(ledger_);
    for (size_t n = 0; n < gens.size(); ++n) {
      ASSERT_GE(gens[n], gens_before[n]) << where << ": generation of node " << n << " went back";
      if (static_cast<int64_t>(n) == changed) {
        ASSERT_GT(gens[n], gens_before[n]) << where << ": node " << n << " changed, generation did not";
      } else {
        ASSERT_EQ(gens[n], gens_before[n]) << where << ": node " << n << " was not touched";
        ASSERT_EQ(after.nodes[n], before.nodes[n]) << where << ": node " << n << " was not touched";
      }
    }
  }

  void StepCommit(Rng& rng, const std::string& where) {
    Kind kind = kCpuOnly;
    const Placement p = RandomPlacement(rng, model_, &kind);
    const bool expect_fit = model_.Fits(p);
    const LedgerSnap before = Snap(ledger_);
    const std::vector<uint64_t> gens = Generations(ledger_);
    Result<AllocationId> id = ledger_.Commit(p);
    ASSERT_EQ(id.ok(), expect_fit) << where << " (" << kKindNames[kind] << "): model says "
                                   << (expect_fit ? "fits" : "does not fit") << ", ledger says "
                                   << id.status().ToString() << "\n"
                                   << before;
    if (!id.ok()) {
      ++stats_.commit_failed[kind];
      const StatusCode code = id.status().code();
      ASSERT_TRUE(code == StatusCode::kInvalidArgument || code == StatusCode::kResourceExhausted ||
                  code == StatusCode::kFailedPrecondition)
          << where << ": " << id.status().ToString();
      ASSERT_FALSE(id.status().message().empty()) << where;
      // Failed: byte-for-byte the same state, generations included.
      ASSERT_EQ(Snap(ledger_), before)
          << where << ": failed commit changed the ledger: " << id.status().ToString();
      ASSERT_EQ(Generations(ledger_), gens) << where << ": failed commit bumped a generation";
      ASSERT_NO_FATAL_FAILURE(AfterStep(where, before, gens, -1));
      return;
    }
    ++stats_.commit_ok[kind];
    ASSERT_EQ(model_.live().count(*id), 0u) << where << ": id " << *id << " reused";
    model_.Commit(*id, p);
    ASSERT_NO_FATAL_FAILURE(AfterStep(where, before, gens, p.node));
    if (rng.Uniform(5) == 0) {
      // Round trip: releasing at once restores exactly the state before the commit; only the
      // generation moves, and forward.
      const std::vector<uint64_t> gens_after_commit = Generations(ledger_);
      const LedgerSnap after_commit = Snap(ledger_);
      const Status st = ledger_.Release(*id);
      ASSERT_TRUE(st.ok()) << where << ": " << st.ToString();
      model_.Release(*id);
      ++stats_.round_trips;
      ASSERT_EQ(Snap(ledger_), before) << where << ": commit + release is not the identity";
      ASSERT_NO_FATAL_FAILURE(AfterStep(where + " (round trip)", after_commit, gens_after_commit, p.node));
    }
  }

  void StepRelease(Rng& rng, const std::string& where) {
    const LedgerSnap before = Snap(ledger_);
    const std::vector<uint64_t> gens = Generations(ledger_);
    if (model_.live().empty() || rng.Uniform(10) == 0) {
      // An id that is not live: never issued, or already released.
      const AllocationId bogus =
          rng.Uniform(2) == 0 ? AllocationId{0} : AllocationId{1000000 + rng.Uniform(1000)};
      AllocationId id = bogus;
      if (!released_.empty() && rng.Uniform(2) == 0) id = released_[rng.Uniform(released_.size())];
      const Status st = ledger_.Release(id);
      ASSERT_EQ(st.code(), StatusCode::kNotFound) << where << ": release of " << id << ": " << st.ToString();
      ++stats_.bogus_releases;
      ASSERT_EQ(Snap(ledger_), before) << where;
      ASSERT_NO_FATAL_FAILURE(AfterStep(where, before, gens, -1));
      return;
    }
    auto it = model_.live().begin();
    std::advance(it, static_cast<long>(rng.Uniform(model_.live().size())));
    const AllocationId id = it->first;
    const NodeIndex node = it->second.node;
    const Status st = ledger_.Release(id);
    ASSERT_TRUE(st.ok()) << where << ": release of " << id << ": " << st.ToString();
    model_.Release(id);
    released_.push_back(id);
    ++stats_.releases;
    ASSERT_NO_FATAL_FAILURE(AfterStep(where, before, gens, node));
  }

  void StepToggle(Rng& rng, const std::string& where) {
    const LedgerSnap before = Snap(ledger_);
    const std::vector<uint64_t> gens = Generations(ledger_);
    const auto n = static_cast<NodeIndex>(rng.Uniform(model_.node_count()));
    const size_t gpus = model_.gpu_count(n);
    ++stats_.toggles;
    switch (rng.Uniform(4)) {
      case 0: {
        const bool v = rng.Uniform(5) != 0;  // mostly healthy
        ASSERT_TRUE(ledger_.SetNodeHealthy(n, v).ok()) << where;
        model_.set_node_healthy(n, v);
        break;
      }
      case 1: {
        const bool v = rng.Uniform(3) == 0;  // mostly not cordoned
        ASSERT_TRUE(ledger_.SetCordoned(n, v).ok()) << where;
        model_.set_cordoned(n, v);
        break;
      }
      case 2: {
        if (gpus == 0) {
          ASSERT_EQ(ledger_.SetGpuHealthy(n, 0, false).code(), StatusCode::kNotFound) << where;
          ASSERT_NO_FATAL_FAILURE(AfterStep(where, before, gens, -1));
          return;
        }
        const size_t i = rng.Uniform(gpus);
        const bool v = rng.Uniform(5) != 0;  // mostly healthy
        ASSERT_TRUE(ledger_.SetGpuHealthy(n, static_cast<int>(i), v).ok()) << where;
        model_.set_gpu_healthy(n, i, v);
        break;
      }
      default: {
        if (gpus == 0) {
          ASSERT_EQ(ledger_.SetMigEnabled(n, 0, true).code(), StatusCode::kNotFound) << where;
          ASSERT_NO_FATAL_FAILURE(AfterStep(where, before, gens, -1));
          return;
        }
        const size_t i = rng.Uniform(gpus);
        const bool want = rng.Uniform(2) == 0;
        const bool current = model_.gpu_mig(n, i);
        const bool idle = model_.UsageOf(n).gpu_tasks[i] == 0;
        const bool capable = model_.Geometry(n) != nullptr;
        const bool expect_ok = want == current || ((capable || !want) && idle);
        const Status st = ledger_.SetMigEnabled(n, static_cast<int>(i), want);
        ASSERT_EQ(st.ok(), expect_ok)
            << where << ": MIG " << want << " on node " << n << " GPU " << i << ": " << st.ToString();
        if (!st.ok()) {
          ASSERT_EQ(st.code(), StatusCode::kFailedPrecondition) << where;
          ++stats_.mig_toggles_refused;
          ASSERT_NO_FATAL_FAILURE(AfterStep(where, before, gens, -1));
          return;
        }
        if (want == current) {
          // No change: nothing may move (a bump would be harmless, but nothing changed either).
          ASSERT_EQ(Snap(ledger_), before) << where;
          ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(ledger_, model_, where));
          ASSERT_TRUE(ledger_.CheckInvariants().ok()) << where;
          return;
        }
        ++stats_.mig_toggles_ok;
        model_.set_gpu_mig(n, i, want);
        break;
      }
    }
    ASSERT_NO_FATAL_FAILURE(AfterStep(where, before, gens, n));
  }

  Ledger ledger_;
  Model model_{ledger_.catalog()};
  Stats stats_;
  std::vector<AllocationId> released_;
};

TEST_P(LedgerPropertyTest, RandomOperationsKeepTheLedgerExact) {
  SeededRng rng(GetParam());
  constexpr int kSteps = 3000;
  for (int step = 0; step < kSteps; ++step) {
    const std::string where = "seed " + std::to_string(GetParam()) + " step " + std::to_string(step);
    // Alternate filling and draining phases, so the cluster is sometimes nearly full (commits
    // that do not fit) and sometimes nearly empty.
    const bool filling = (step / 400) % 2 == 0;
    const uint64_t r = rng.Uniform(100);
    if (r < (filling ? 82u : 30u)) {
      ASSERT_NO_FATAL_FAILURE(StepCommit(rng, where));
    } else if (r < 92) {
      ASSERT_NO_FATAL_FAILURE(StepRelease(rng, where));
    } else {
      ASSERT_NO_FATAL_FAILURE(StepToggle(rng, where));
    }
    stats_.max_live = std::max(stats_.max_live, model_.live().size());
  }
  // Release everything left: the ledger returns to full capacity.
  while (!model_.live().empty()) {
    const AllocationId id = model_.live().begin()->first;
    ASSERT_TRUE(ledger_.Release(id).ok());
    model_.Release(id);
  }
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(ledger_, model_, "drained"));
  EXPECT_EQ(ledger_.used_gpu_share(), 0);
  for (NodeIndex n = 0; n < ledger_.node_count(); ++n) {
    EXPECT_EQ(ledger_.state(n).free_cpu, ledger_.spec(n).cpu.units());
    EXPECT_EQ(ledger_.state(n).free_memory, ledger_.spec(n).memory.units());
  }

  // The run must have exercised every kind of step, or the checks above proved little.
  std::string summary;
  for (int k = 0; k < kKindCount; ++k) {
    summary += std::string(kKindNames[k]) + " " + std::to_string(stats_.commit_ok[k]) + " ok / " +
               std::to_string(stats_.commit_failed[k]) + " failed; ";
  }
  summary += "releases " + std::to_string(stats_.releases) + ", bogus " +
             std::to_string(stats_.bogus_releases) + ", round trips " + std::to_string(stats_.round_trips) +
             ", toggles " + std::to_string(stats_.toggles) + ", MIG toggles " +
             std::to_string(stats_.mig_toggles_ok) + " ok / " + std::to_string(stats_.mig_toggles_refused) +
             " refused, max live " + std::to_string(stats_.max_live);
  RecordProperty("coverage", summary);
  for (int k = 0; k < kKindCount; ++k) {
    if (k != kGarbage) {
      EXPECT_GE(stats_.commit_ok[k], 40) << kKindNames[k] << "; " << summary;
    }
    EXPECT_GE(stats_.commit_failed[k], 40) << kKindNames[k] << "; " << summary;
  }
  EXPECT_GE(stats_.releases, 200) << summary;
  EXPECT_GE(stats_.round_trips, 50) << summary;
  EXPECT_GE(stats_.mig_toggles_ok, 3) << summary;
  EXPECT_GE(stats_.mig_toggles_refused, 3) << summary;
  EXPECT_GE(stats_.max_live, 15u) << summary;
}

INSTANTIATE_TEST_SUITE_P(Seeds, LedgerPropertyTest, ::testing::Values(1, 7, 42, 2024, 99991));

}  // namespace
}  // namespace gpupool
