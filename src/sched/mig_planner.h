// Where a MIG instance goes on one GPU, and what its agent changes to make it (docs/design.md,
// "Dynamic MIG"). The pool knows two layouts per MIG-enabled GPU: the instances tasks hold (the
// ledger's GpuState::mig, capacity) and the instances that exist there, as the agent reported them
// (Ledger::mig_present). A new instance may go at any start the held ones leave free; an existing
// instance in the way is idle (no task holds it), so the agent destroys it first. The plan prefers,
// in order: an idle instance of the profile that already exists (nothing changes), then the fewest
// destroyed instances, then the start that leaves the GPU able to take the most of every profile
// later. Pure: no I/O, no state.
#pragma once

#include <optional>

#include "model/gpu_catalog.h"
#include "model/mig.h"

namespace gpupool {

struct MigPlan {
  MigInstance instance;  // what the task gets
  bool reuse = false;    // it exists already and is idle: the layout does not change
  int destroyed = 0;     // idle instances the agent destroys to make room
  // What the GPU can still take once `instance` is held: Σ over its profiles (media-extension ones
  // aside) of how many instances of that profile would fit, each counted by its compute slices.
  int future = 0;
  // Layout changes the plan needs: 0 to reuse, else the creation and the destructions.
  int changes() const { return reuse ? 0 : 1 + destroyed; }
};

// The plan for one more `profile` instance on a GPU whose held instances are `held` and whose
// reported ones are `present` (nullptr: none reported, nothing known to exist). nullopt when the
// held instances leave no room for it.
std::optional<MigPlan> PlanMigInstance(const MigGeometry& geometry, const MigLayout& held, const MigLayout* present,
                                       const MigProfile& profile);

// What a layout of held instances can still take (MigPlan::future).
int MigFutureCapacity(const MigGeometry& geometry, const MigLayout& held);

// Whether plan `a` is better than plan `b` on the same GPU (fewer changes, then more future room,
// then the lower start).
bool BetterMigPlan(const MigPlan& a, const MigPlan& b);

}  // namespace gpupool
