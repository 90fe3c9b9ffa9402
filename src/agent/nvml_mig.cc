// MIG management through NVML: creating and destroying GPU and compute instances on a GPU that is
// already in MIG mode (docs/agent.md#dynamic-mig). The entry points are resolved here, from the
// library nvml.cc loaded; every reply is checked and bounded before it is used.
#include <dlfcn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "agent/nvml.h"
#include "agent/nvml_internal.h"

namespace gpupool {
namespace {

using namespace nvml_internal;  // NOLINT(google-build-using-namespace): the loader's ABI names

// Bounds on what NVML may claim: a GPU has 8 memory slices and 7 compute slices, so no list of
// placements, instances or MIG devices is longer than these.
constexpr unsigned kMaxPlacements = 16;
constexpr unsigned kMaxComputeInstances = 8;
constexpr unsigned kMaxMigDevices = 16;
constexpr unsigned kMemorySlices = 8;

using PossiblePlacementsFn = NvmlReturn (*)(NvmlDevice, unsigned, GpuInstancePlacement*, unsigned*);
using CreateGiWithPlacementFn = NvmlReturn (*)(NvmlDevice, unsigned, const GpuInstancePlacement*,
                                               NvmlGpuInstance*);
using CiProfileInfoFn = NvmlReturn (*)(NvmlGpuInstance, unsigned, unsigned, ComputeInstanceProfileInfo*);
using CreateCiFn = NvmlReturn (*)(NvmlGpuInstance, unsigned, NvmlComputeInstance*);
using GetCisFn = NvmlReturn (*)(NvmlGpuInstance, unsigned, NvmlComputeInstance*, unsigned*);
using CiDestroyFn = NvmlReturn (*)(NvmlComputeInstance);
using GiDestroyFn = NvmlReturn (*)(NvmlGpuInstance);

// The MIG management entry points, resolved per call (they are few and rarely used).
struct MigCalls {
  PossiblePlacementsFn possible_placements = nullptr;
  CreateGiWithPlacementFn create_gi = nullptr;
  CiProfileInfoFn ci_profile_info = nullptr;
  CreateCiFn create_ci = nullptr;
  GetCisFn get_cis = nullptr;
  CiDestroyFn destroy_ci = nullptr;
  GiDestroyFn destroy_gi = nullptr;
};

template <typename Fn>
Fn Sym(void* lib, const char* symbol) {
  return reinterpret_cast<Fn>(dlsym(lib, symbol));
}

Result<MigCalls> Resolve(const Core& c) {
  MigCalls m;
  m.possible_placements = Sym<PossiblePlacementsFn>(c.lib, "nvmlDeviceGetGpuInstancePossiblePlacements_v2");
  m.create_gi = Sym<CreateGiWithPlacementFn>(c.lib, "nvmlDeviceCreateGpuInstanceWithPlacement");
  m.ci_profile_info = Sym<CiProfileInfoFn>(c.lib, "nvmlGpuInstanceGetComputeInstanceProfileInfo");
  m.create_ci = Sym<CreateCiFn>(c.lib, "nvmlGpuInstanceCreateComputeInstance");
  m.get_cis = Sym<GetCisFn>(c.lib, "nvmlGpuInstanceGetComputeInstances");
  m.destroy_ci = Sym<CiDestroyFn>(c.lib, "nvmlComputeInstanceDestroy");
  m.destroy_gi = Sym<GiDestroyFn>(c.lib, "nvmlGpuInstanceDestroy");
  const std::pair<const char*, bool> needed[] = {
      {"nvmlDeviceGetMigMode", c.mig_mode != nullptr},
      {"nvmlDeviceGetGpuInstanceProfileInfo", c.gi_profile_info != nullptr},
      {"nvmlDeviceGetMaxMigDeviceCount", c.max_mig_devices != nullptr},
      {"nvmlDeviceGetMigDeviceHandleByIndex", c.mig_handle_by_index != nullptr},
      {"nvmlDeviceGetGpuInstanceId", c.gpu_instance_id != nullptr},
      {"nvmlDeviceGetComputeInstanceId", c.compute_instance_id != nullptr},
      {"nvmlDeviceGetGpuInstanceById", c.gpu_instance_by_id != nullptr},
      {"nvmlGpuInstanceGetInfo", c.gpu_instance_info != nullptr},
      {"nvmlDeviceGetGpuInstancePossiblePlacements_v2", m.possible_placements != nullptr},
      {"nvmlDeviceCreateGpuInstanceWithPlacement", m.create_gi != nullptr},
      {"nvmlGpuInstanceGetComputeInstanceProfileInfo", m.ci_profile_info != nullptr},
      {"nvmlGpuInstanceCreateComputeInstance", m.create_ci != nullptr},
      {"nvmlGpuInstanceGetComputeInstances", m.get_cis != nullptr},
      {"nvmlComputeInstanceDestroy", m.destroy_ci != nullptr},
      {"nvmlGpuInstanceDestroy", m.destroy_gi != nullptr},
  };
  for (const auto& [symbol, found] : needed) {
    if (!found)
      return Status::FailedPrecondition(
          fmt::format("the NVML library lacks {}: this driver cannot create or destroy MIG instances", symbol));
  }
  return m;
}

// The device handle of GPU `index`, checked against the device count; MIG mode must be on.
Result<NvmlDevice> MigDevice(const Core& c, int index) {
  unsigned count = 0;
  if (NvmlReturn r = c.device_count(&count); r != kSuccess)
    return Status::Internal("nvmlDeviceGetCount_v2: " + ErrorText(c, r));
  if (index < 0 || static_cast<unsigned>(index) >= count)
    return Status::InvalidArgument(fmt::format("GPU {} does not exist ({} GPUs)", index, count));
  NvmlDevice dev = nullptr;
  if (NvmlReturn r = c.handle_by_index(static_cast<unsigned>(index), &dev); r != kSuccess || dev == nullptr)
    return Status::Internal(fmt::format("nvmlDeviceGetHandleByIndex_v2({}): {}", index, ErrorText(c, r)));
  unsigned current = 0;
  unsigned pending = 0;
  if (NvmlReturn r = c.mig_mode(dev, &current, &pending); r != kSuccess)
    return Status::FailedPrecondition(fmt::format("nvmlDeviceGetMigMode(GPU {}): {}", index, ErrorText(c, r)));
  if (current != 1)
    return Status::FailedPrecondition(
        fmt::format("GPU {} is not in MIG mode; gpupool does not change MIG mode", index));
  return dev;
}

// The GPU-instance profile with driver id `profile_id`, as the device describes it.
Result<GpuInstanceProfileInfo> GiProfile(const Core& c, NvmlDevice dev, int gpu, int profile_id) {
  for (unsigned p = 0; p < kGpuInstanceProfileCount; ++p) {
    GpuInstanceProfileInfo info{};
    const NvmlReturn r = c.gi_profile_info(dev, p, &info);
    if (r == kErrInvalidArgument) break;  // past the last profile this driver knows
    if (r != kSuccess || info.slice_count == 0 || info.slice_count > 8) continue;
    if (static_cast<int>(info.id) == profile_id) return info;
  }
  return Status::InvalidArgument(
      fmt::format("GPU {} has no GPU-instance profile with id {} (nvmlDeviceGetGpuInstanceProfileInfo)", gpu,
                  profile_id));
}

std::string ProfileName(const GpuInstanceProfileInfo& info) {
  return fmt::format("{}g.{}gb", info.slice_count, (info.memory_size_mb + 1023) / 1024);
}

// The compute-instance profile that spans a GPU instance of `slices` compute slices.
Result<ComputeInstanceProfileInfo> FullCiProfile(const Core& c, const MigCalls& m, NvmlGpuInstance gi,
                                                 unsigned slices, const std::string& what) {
  for (unsigned p = 0; p < kComputeInstanceProfileCount; ++p) {
    ComputeInstanceProfileInfo info{};
    const NvmlReturn r = m.ci_profile_info(gi, p, kComputeInstanceEngineShared, &info);
    if (r == kErrInvalidArgument) break;
    if (r != kSuccess) continue;  // NOT_SUPPORTED: a profile this GPU instance cannot hold
    if (info.slice_count == slices) return info;
  }
  (void)c;
  return Status::Internal(fmt::format(
      "nvmlGpuInstanceGetComputeInstanceProfileInfo({}): no compute-instance profile of {} slices", what, slices));
}

// Destroys every compute instance of `gi`. Error: the call, the instance and NVML's text.
Status DestroyComputeInstances(const Core& c, const MigCalls& m, NvmlGpuInstance gi, const std::string& what) {
  for (unsigned p = 0; p < kComputeInstanceProfileCount; ++p) {
    ComputeInstanceProfileInfo info{};
    const NvmlReturn r = m.ci_profile_info(gi, p, kComputeInstanceEngineShared, &info);
    if (r == kErrInvalidArgument) break;
    if (r != kSuccess) continue;
    std::array<NvmlComputeInstance, kMaxComputeInstances> cis{};
    unsigned count = 0;
    if (NvmlReturn g = m.get_cis(gi, info.id, cis.data(), &count); g != kSuccess) {
      return Status::Internal(fmt::format("nvmlGpuInstanceGetComputeInstances({}, compute profile {}): {}", what,
                                          info.id, ErrorText(c, g)));
    }
    for (unsigned k = 0; k < count && k < cis.size(); ++k) {
      if (cis[k] == nullptr) continue;
      if (NvmlReturn d = m.destroy_ci(cis[k]); d != kSuccess)
        return Status::FailedPrecondition(
            fmt::format("nvmlComputeInstanceDestroy({}): {}", what, ErrorText(c, d)));
    }
  }
  return Status::Ok();
}

}  // namespace

Result<MigInstanceInfo> Nvml::CreateMigInstance(int gpu_index, int profile_id, int start) {
  const Core c = CoreOf(*impl_);
  const std::lock_guard<std::mutex> lock(*c.mu);
  ASSIGN_OR_RETURN(const MigCalls m, Resolve(c));
  if (profile_id < 0 || start < 0 || start >= static_cast<int>(kMemorySlices))
    return Status::InvalidArgument(
        fmt::format("GPU {}: no MIG instance of profile id {} can start at slice {}", gpu_index, profile_id, start));
  ASSIGN_OR_RETURN(NvmlDevice dev, MigDevice(c, gpu_index));
  ASSIGN_OR_RETURN(const GpuInstanceProfileInfo profile, GiProfile(c, dev, gpu_index, profile_id));
  const std::string label = fmt::format("GPU {}, profile {} (id {}), start {}", gpu_index, ProfileName(profile),
                                        profile_id, start);

  // The placement of that start, with the profile's size: only what the driver offers.
  std::array<GpuInstancePlacement, kMaxPlacements> placements{};
  unsigned count = static_cast<unsigned>(placements.size());
  if (NvmlReturn r = m.possible_placements(dev, static_cast<unsigned>(profile_id), placements.data(), &count);
      r != kSuccess) {
    return Status::Internal(
        fmt::format("nvmlDeviceGetGpuInstancePossiblePlacements_v2({}): {}", label, ErrorText(c, r)));
  }
  const GpuInstancePlacement* placement = nullptr;
  std::vector<unsigned> starts;
  for (unsigned k = 0; k < count && k < placements.size(); ++k) {
    const GpuInstancePlacement& p = placements[k];
    if (p.size == 0 || p.start >= kMemorySlices || p.size > kMemorySlices - p.start) continue;  // garbage
    starts.push_back(p.start);
    if (p.start == static_cast<unsigned>(start)) placement = &p;
  }
  if (placement == nullptr) {
    return Status::InvalidArgument(fmt::format("{}: not a placement the driver offers for this profile (starts: {})",
                                               label, fmt::join(starts, ", ")));
  }

  NvmlGpuInstance gi = nullptr;
  if (NvmlReturn r = m.create_gi(dev, static_cast<unsigned>(profile_id), placement, &gi); r != kSuccess || gi == nullptr) {
    return Status::FailedPrecondition(fmt::format("nvmlDeviceCreateGpuInstanceWithPlacement({}, size {}): {}", label,
                                                  placement->size, ErrorText(c, r)));
  }
  // From here on a failure destroys the GPU instance again, so nothing half-made is left behind.
  auto undo = [&](Status st) -> Status {
    if (Status d = DestroyComputeInstances(c, m, gi, label); !d.ok())
      return Status(st.code(), st.message() + "; and then " + d.message());
    if (NvmlReturn r = m.destroy_gi(gi); r != kSuccess)
      return Status(st.code(), fmt::format("{}; and then nvmlGpuInstanceDestroy({}): {}", st.message(), label,
                                           ErrorText(c, r)));
    return st;
  };
  GpuInstanceInfo gi_info{};
  if (NvmlReturn r = c.gpu_instance_info(gi, &gi_info); r != kSuccess)
    return undo(Status::Internal(fmt::format("nvmlGpuInstanceGetInfo({}): {}", label, ErrorText(c, r))));
  if (gi_info.id > 1024 || gi_info.placement.start != static_cast<unsigned>(start))
    return undo(Status::Internal(fmt::format("nvmlGpuInstanceGetInfo({}): implausible reply (id {}, start {})", label,
                                             gi_info.id, gi_info.placement.start)));
  auto ci_profile = FullCiProfile(c, m, gi, profile.slice_count, label);
  if (!ci_profile.ok()) return undo(ci_profile.status());
  NvmlComputeInstance ci = nullptr;
  if (NvmlReturn r = m.create_ci(gi, ci_profile->id, &ci); r != kSuccess || ci == nullptr) {
    return undo(Status::FailedPrecondition(fmt::format("nvmlGpuInstanceCreateComputeInstance({}, compute profile {}): {}",
                                                       label, ci_profile->id, ErrorText(c, r))));
  }

  // The new MIG device, as discovery will see it: its UUID and ids.
  unsigned devices = 0;
  if (NvmlReturn r = c.max_mig_devices(dev, &devices); r != kSuccess)
    return undo(Status::Internal(fmt::format("nvmlDeviceGetMaxMigDeviceCount({}): {}", label, ErrorText(c, r))));
  for (unsigned k = 0; k < devices && k < kMaxMigDevices; ++k) {
    NvmlDevice mig = nullptr;
    if (c.mig_handle_by_index(dev, k, &mig) != kSuccess || mig == nullptr) continue;
    unsigned gi_id = 0;
    unsigned ci_id = 0;
    if (c.gpu_instance_id(mig, &gi_id) != kSuccess || gi_id != gi_info.id) continue;
    if (c.compute_instance_id(mig, &ci_id) != kSuccess || ci_id > 1024) continue;
    std::array<char, 96> buf{};
    if (NvmlReturn r = c.uuid(mig, buf.data(), static_cast<unsigned>(buf.size())); r != kSuccess)
      return undo(Status::Internal(fmt::format("nvmlDeviceGetUUID(MIG device of {}): {}", label, ErrorText(c, r))));
    MigInstanceInfo out;
    out.uuid = std::string(buf.data(), strnlen(buf.data(), buf.size()));
    if (out.uuid.rfind("MIG-", 0) != 0)
      return undo(Status::Internal(fmt::format("nvmlDeviceGetUUID(MIG device of {}): not a MIG UUID", label)));
    out.profile_id = profile_id;
    out.profile = ProfileName(profile);
    out.start = start;
    out.size = static_cast<int>(placement->size);
    out.gpu_instance_id = static_cast<int>(gi_info.id);
    out.compute_instance_id = static_cast<int>(ci_id);
    return out;
  }
  return undo(Status::Internal(
      fmt::format("{}: the new GPU instance {} has no MIG device (nvmlDeviceGetMigDeviceHandleByIndex)", label,
                  gi_info.id)));
}

Status Nvml::DestroyMigGpuInstance(int gpu_index, int gpu_instance_id) {
  const Core c = CoreOf(*impl_);
  const std::lock_guard<std::mutex> lock(*c.mu);
  ASSIGN_OR_RETURN(const MigCalls m, Resolve(c));
  ASSIGN_OR_RETURN(NvmlDevice dev, MigDevice(c, gpu_index));
  std::string label = fmt::format("GPU {}, GPU instance {}", gpu_index, gpu_instance_id);
  if (gpu_instance_id < 0) return Status::InvalidArgument(label + ": not a GPU instance id");
  NvmlGpuInstance gi = nullptr;
  if (NvmlReturn r = c.gpu_instance_by_id(dev, static_cast<unsigned>(gpu_instance_id), &gi);
      r != kSuccess || gi == nullptr) {
    return Status::FailedPrecondition(fmt::format("nvmlDeviceGetGpuInstanceById({}): {}", label, ErrorText(c, r)));
  }
  if (GpuInstanceInfo info{}; c.gpu_instance_info(gi, &info) == kSuccess && info.placement.start < kMemorySlices)
    label += fmt::format(" (profile id {}, start {})", info.profile_id, info.placement.start);
  RETURN_IF_ERROR(DestroyComputeInstances(c, m, gi, label));
  if (NvmlReturn r = m.destroy_gi(gi); r != kSuccess)
    return Status::FailedPrecondition(fmt::format("nvmlGpuInstanceDestroy({}): {}", label, ErrorText(c, r)));
  return Status::Ok();
}

}  // namespace gpupool
