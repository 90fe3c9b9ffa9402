#include "sched/mig_planner.h"

#include <tuple>

namespace gpupool {

int MigFutureCapacity(const MigGeometry& geometry, const MigLayout& held) {
  int total = 0;
  for (const MigProfile& profile : geometry.profiles) {
    if (profile.media_extensions) continue;  // the same slices as its plain twin
    MigLayout trial = held;
    int count = 0;
    // At most one instance per memory slice: the loop is bounded whatever the geometry says.
    for (int i = 0; i < geometry.total_memory_slices; ++i) {
      const auto start = trial.FindPlacement(geometry, profile);
      if (!start || !trial.Add(geometry, MigInstance{profile.driver_id, *start}).ok()) break;
      ++count;
    }
    total += count * profile.compute_slices;
  }
  return total;
}

bool BetterMigPlan(const MigPlan& a, const MigPlan& b) {
  return std::make_tuple(a.changes(), -a.future, a.instance.start) <
         std::make_tuple(b.changes(), -b.future, b.instance.start);
}

std::optional<MigPlan> PlanMigInstance(const MigGeometry& geometry, const MigLayout& held, const MigLayout* present,
                                       const MigProfile& profile) {
  const uint8_t starts = held.FreeStarts(geometry, profile);
  std::optional<MigPlan> best;
  for (int start = 0; start < 8; ++start) {
    if ((starts & (1u << start)) == 0) continue;
    MigPlan plan;
    plan.instance = MigInstance{profile.driver_id, start};
    if (present != nullptr) {
      plan.reuse = present->Contains(plan.instance);
      if (!plan.reuse) {
        for (const MigInstance& existing : present->instances()) {
          // Held ones never overlap a free start; what overlaps is idle and goes.
          if (!held.Contains(existing) && MigOverlap(geometry, existing, plan.instance)) ++plan.destroyed;
        }
      }
    }
    MigLayout after = held;
    if (!after.Add(geometry, plan.instance).ok()) continue;
    plan.future = MigFutureCapacity(geometry, after);
    if (!best || BetterMigPlan(plan, *best)) best = plan;
  }
  return best;
}

}  // namespace gpupool
