#include "model/mig.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

namespace gpupool {

const MigProfile* MigProfileById(const MigGeometry& geometry, int driver_id) {
  for (const MigProfile& profile : geometry.profiles) {
    if (profile.driver_id == driver_id) return &profile;
  }
  return nullptr;
}

namespace {

const MigProfile* ProfileById(const MigGeometry& geometry, int driver_id) {
  return MigProfileById(geometry, driver_id);
}

// Bits [start, start + slices) of a memory-slice mask; slices outside 0..7 are dropped. Masks are
// 8 bits (mig.h), so geometries of more than 8 memory slices are not supported.
uint8_t SliceMask(int start, int slices) {
  unsigned mask = 0;
  for (int s = start; s < start + slices; ++s) {
    if (s >= 0 && s < 8) mask |= 1u << s;
  }
  return static_cast<uint8_t>(mask);
}

// "0, 2, 4" for a valid_starts mask.
std::string StartsToString(uint8_t valid_starts) {
  std::string out;
  for (int s = 0; s < 8; ++s) {
    if ((valid_starts & (1u << s)) == 0) continue;
    if (!out.empty()) out += ", ";
    out += std::to_string(s);
  }
  return out.empty() ? "none" : out;
}

// What the existing instances take, as far as placing `profile` is concerned.
struct Usage {
  uint8_t memory_mask = 0;
  int compute_slices = 0;
  int same_profile = 0;      // instances of `profile`
  int media_extensions = 0;  // "+me" instances
};

Usage UsageFor(const std::vector<MigInstance>& instances, const MigGeometry& geometry,
               const MigProfile& profile) {
  Usage usage;
  for (const MigInstance& instance : instances) {
    const MigProfile* existing = ProfileById(geometry, instance.profile_id);
    if (existing == nullptr) continue;  // not of this geometry; Add never lets one in
    usage.memory_mask |= SliceMask(instance.start, existing->memory_slices);
    usage.compute_slices += existing->compute_slices;
    if (existing->driver_id == profile.driver_id) ++usage.same_profile;
    if (existing->media_extensions) ++usage.media_extensions;
  }
  return usage;
}

// The start is one the profile allows and lies inside the GPU's memory slices.
bool StartIsValid(const MigGeometry& geometry, const MigProfile& profile, int start) {
  if (start < 0 || start >= 8 || profile.memory_slices <= 0) return false;
  if ((profile.valid_starts & (1u << start)) == 0) return false;
  return start + profile.memory_slices <= geometry.total_memory_slices;
}

// Why `profile` does not fit at all right now, whatever the start; empty when it could.
std::string CapacityProblem(const MigGeometry& geometry, const MigProfile& profile, const Usage& usage) {
  if (usage.compute_slices + profile.compute_slices > geometry.total_compute_slices) {
    return fmt::format("{} compute slices in use, {} needs {} of {}", usage.compute_slices, profile.name,
                       profile.compute_slices, geometry.total_compute_slices);
  }
  if (usage.same_profile >= profile.max_instances) {
    return fmt::format("{} already has its maximum of {} instances", profile.name, profile.max_instances);
  }
  if (profile.media_extensions && usage.media_extensions > 0) {
    return "the GPU's media engines are already taken by a +me instance";
  }
  return {};
}

}  // namespace

std::optional<int> MigLayout::FindPlacement(const MigGeometry& geometry, const MigProfile& profile) const {
  const Usage usage = UsageFor(instances_, geometry, profile);
  if (!CapacityProblem(geometry, profile, usage).empty()) return std::nullopt;
  for (int start = 0; start < geometry.total_memory_slices && start < 8; ++start) {
    if (!StartIsValid(geometry, profile, start)) continue;
    if ((usage.memory_mask & SliceMask(start, profile.memory_slices)) == 0) return start;
  }
  return std::nullopt;
}

uint8_t MigLayout::FreeStarts(const MigGeometry& geometry, const MigProfile& profile) const {
  const Usage usage = UsageFor(instances_, geometry, profile);
  if (!CapacityProblem(geometry, profile, usage).empty()) return 0;
  unsigned starts = 0;
  for (int start = 0; start < geometry.total_memory_slices && start < 8; ++start) {
    if (!StartIsValid(geometry, profile, start)) continue;
    if ((usage.memory_mask & SliceMask(start, profile.memory_slices)) == 0) starts |= 1u << start;
  }
  return static_cast<uint8_t>(starts);
}

bool MigLayout::Contains(const MigInstance& instance) const {
  return std::find(instances_.begin(), instances_.end(), instance) != instances_.end();
}

Status MigLayout::Add(const MigGeometry& geometry, const MigInstance& instance) {
  const MigProfile* profile = ProfileById(geometry, instance.profile_id);
  if (profile == nullptr) {
    return Status::InvalidArgument(fmt::format("unknown MIG profile id {}", instance.profile_id));
  }
  if (!StartIsValid(geometry, *profile, instance.start)) {
    return Status::InvalidArgument(fmt::format("MIG profile {} cannot start at memory slice {} (valid: {})",
                                               profile->name, instance.start,
                                               StartsToString(profile->valid_starts)));
  }
  const Usage usage = UsageFor(instances_, geometry, *profile);
  const uint8_t wanted = SliceMask(instance.start, profile->memory_slices);
  if ((usage.memory_mask & wanted) != 0) {
    return Status::ResourceExhausted(fmt::format(
        "MIG profile {} at memory slice {} overlaps an existing instance", profile->name, instance.start));
  }
  if (std::string problem = CapacityProblem(geometry, *profile, usage); !problem.empty()) {
    return Status::ResourceExhausted(fmt::format("MIG profile {} at memory slice {} does not fit: {}",
                                                 profile->name, instance.start, problem));
  }
  instances_.push_back(instance);
  return Status::Ok();
}

Status MigLayout::Remove(const MigInstance& instance) {
  const auto it = std::find(instances_.begin(), instances_.end(), instance);
  if (it == instances_.end()) {
    return Status::NotFound(fmt::format("no MIG instance of profile id {} at memory slice {}",
                                        instance.profile_id, instance.start));
  }
  instances_.erase(it);
  return Status::Ok();
}

int MigLayout::used_compute_slices(const MigGeometry& geometry) const {
  int used = 0;
  for (const MigInstance& instance : instances_) {
    if (const MigProfile* profile = ProfileById(geometry, instance.profile_id)) {
      used += profile->compute_slices;
    }
  }
  return used;
}

uint8_t MigLayout::used_memory_slices_mask(const MigGeometry& geometry) const {
  uint8_t mask = 0;
  for (const MigInstance& instance : instances_) {
    if (const MigProfile* profile = ProfileById(geometry, instance.profile_id)) {
      mask |= SliceMask(instance.start, profile->memory_slices);
    }
  }
  return mask;
}

bool MigOverlap(const MigGeometry& geometry, const MigInstance& a, const MigInstance& b) {
  const MigProfile* pa = ProfileById(geometry, a.profile_id);
  const MigProfile* pb = ProfileById(geometry, b.profile_id);
  if (pa == nullptr || pb == nullptr) return false;
  return (SliceMask(a.start, pa->memory_slices) & SliceMask(b.start, pb->memory_slices)) != 0;
}

Result<MigLayout> MigLayoutOf(const MigGeometry& geometry, const std::vector<MigInstance>& instances) {
  // No GPU has more instances than memory slices; a longer list is wrong whatever it holds.
  if (instances.size() > static_cast<size_t>(geometry.total_memory_slices)) {
    return Status::InvalidArgument(fmt::format("{} MIG instances on one GPU; it has {} memory slices",
                                               instances.size(), geometry.total_memory_slices));
  }
  MigLayout layout;
  for (size_t i = 0; i < instances.size(); ++i) {
    RETURN_IF_ERROR(layout.Add(geometry, instances[i]).WithContext(fmt::format("MIG instance {}", i)));
  }
  return layout;
}

}  // namespace gpupool
