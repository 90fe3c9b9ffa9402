// MIG layouts: which GPU instances exist on one MIG-enabled GPU, and where a new one may go.
// A placement is a start memory slice plus the profile's memory-slice count. Two instances may
// not overlap in memory slices; compute slices may not exceed the GPU's total; a profile may not
// exceed its max_instances; at most one "+me" instance exists per GPU.
#pragma once

#include <optional>
#include <vector>

#include "common/status.h"
#include "model/gpu_catalog.h"

namespace gpupool {

struct MigInstance {
  int profile_id = 0;  // MigProfile::driver_id
  int start = 0;       // first memory slice
  bool operator==(const MigInstance&) const = default;
};

class MigLayout {
 public:
  const std::vector<MigInstance>& instances() const { return instances_; }
  bool empty() const { return instances_.empty(); }

  // The lowest valid start at which `profile` can be created now, or nullopt.
  std::optional<int> FindPlacement(const MigGeometry& geometry, const MigProfile& profile) const;
  // Adds an instance. Fails (and changes nothing) when the placement is invalid or overlaps.
  Status Add(const MigGeometry& geometry, const MigInstance& instance);
  // Removes exactly this instance. NotFound when absent.
  Status Remove(const MigInstance& instance);

  // Every start at which `profile` could be created now (bit s: start s), 0 when none: what
  // FindPlacement picks the lowest of.
  uint8_t FreeStarts(const MigGeometry& geometry, const MigProfile& profile) const;
  bool Contains(const MigInstance& instance) const;

  int used_compute_slices(const MigGeometry& geometry) const;
  uint8_t used_memory_slices_mask(const MigGeometry& geometry) const;

 private:
  std::vector<MigInstance> instances_;
};

// The profile of `geometry` whose NVML id is `driver_id`, or nullptr.
const MigProfile* MigProfileById(const MigGeometry& geometry, int driver_id);

// Whether two instances of `geometry` share a memory slice (false when either profile is unknown).
bool MigOverlap(const MigGeometry& geometry, const MigInstance& a, const MigInstance& b);

// The layout of `instances` as one GPU reports it (an agent, at registration and in heartbeats):
// every instance a profile of the geometry at a start it allows, none overlapping, within the GPU's
// compute slices and each profile's maximum. The error names the first instance that breaks it.
Result<MigLayout> MigLayoutOf(const MigGeometry& geometry, const std::vector<MigInstance>& instances);

}  // namespace gpupool
