// Exact snapshots of a Ledger's state, for tests that compare states before and after.
#pragma once

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <vector>

#include "model/ledger.h"

namespace gpupool::testutil {

// Everything observable about one node except its generation (checked on its own). MIG instances
// are sorted (their order in a layout carries no meaning) and tasks_by_gpu_count loses trailing
// zeros (a release may leave the vector longer; same bookkeeping).
struct GpuSnap {
  int32_t free_share;
  int64_t free_memory;
  int32_t tasks;
  bool healthy;
  bool mig_enabled;
  std::vector<MigInstance> mig;
  bool operator==(const GpuSnap&) const = default;
};

struct NodeSnap {
  int64_t free_cpu;
  int64_t free_memory;
  int32_t tasks;
  int32_t max_tasks;
  ModelId model;
  bool healthy;
  bool cordoned;
  int64_t free_gpu_share;
  int32_t fully_free_gpus;
  int32_t usable_gpus;
  int32_t max_free_share;
  int32_t share_tasks;
  std::vector<int32_t> tasks_by_gpu_count;
  std::vector<GpuSnap> gpus;
  bool operator==(const NodeSnap&) const = default;
};

struct LedgerSnap {
  std::vector<NodeSnap> nodes;
  size_t allocation_count;
  int64_t used_gpu_share;
  int64_t total_gpu_share;
  int total_gpus;
  bool operator==(const LedgerSnap&) const = default;
};

inline std::ostream& operator<<(std::ostream& os, const NodeSnap& n) {
  os << "{cpu " << n.free_cpu << " mem " << n.free_memory << " tasks " << n.tasks << " healthy " << n.healthy
     << " cordoned " << n.cordoned << " free_gpu_share " << n.free_gpu_share << " fully_free "
     << n.fully_free_gpus << " usable " << n.usable_gpus << " max_free " << n.max_free_share
     << " share_tasks " << n.share_tasks << " by_count [";
  for (int32_t c : n.tasks_by_gpu_count) os << c << ' ';
  os << "] gpus [";
  for (const GpuSnap& g : n.gpus) {
    os << "(" << g.free_share << " " << g.free_memory << " t" << g.tasks << (g.healthy ? "" : " sick")
       << (g.mig_enabled ? " mig" : "");
    for (const MigInstance& m : g.mig) os << " " << m.profile_id << "@" << m.start;
    os << ")";
  }
  return os << "]}";
}

inline std::ostream& operator<<(std::ostream& os, const LedgerSnap& s) {
  os << "allocations " << s.allocation_count << " used " << s.used_gpu_share << " total " << s.total_gpu_share
     << " gpus " << s.total_gpus;
  for (size_t i = 0; i < s.nodes.size(); ++i) os << "\n  node " << i << " " << s.nodes[i];
  return os;
}

inline std::vector<MigInstance> SortedInstances(std::vector<MigInstance> v) {
  std::sort(v.begin(), v.end(), [](const MigInstance& a, const MigInstance& b) {
    return a.start != b.start ? a.start < b.start : a.profile_id < b.profile_id;
  });
  return v;
}

inline std::vector<int32_t> Trimmed(std::vector<int32_t> v) {
  while (!v.empty() && v.back() == 0) v.pop_back();
  return v;
}

inline NodeSnap SnapNode(const NodeState& s) {
  NodeSnap n{s.free_cpu,
             s.free_memory,
             s.tasks,
             s.max_tasks,
             s.model,
             s.healthy,
             s.cordoned,
             s.free_gpu_share,
             s.fully_free_gpus,
             s.usable_gpus,
             s.max_free_share,
             s.share_tasks,
             Trimmed(s.tasks_by_gpu_count),
             {}};
  for (const GpuState& g : s.gpus) {
    n.gpus.push_back(
        {g.free_share, g.free_memory, g.tasks, g.healthy, g.mig_enabled, SortedInstances(g.mig.instances())});
  }
  return n;
}

inline LedgerSnap Snap(const Ledger& ledger) {
  LedgerSnap s{
      {}, ledger.allocation_count(), ledger.used_gpu_share(), ledger.total_gpu_share(), ledger.total_gpus()};
  for (const NodeState& n : ledger.states()) s.nodes.push_back(SnapNode(n));
  return s;
}

inline std::vector<uint64_t> Generations(const Ledger& ledger) {
  std::vector<uint64_t> g;
  for (const NodeState& n : ledger.states()) g.push_back(n.generation);
  return g;
}

}  // namespace gpupool::testutil
