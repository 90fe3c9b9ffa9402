// Internal to the NVML loader (nvml.cc) and its MIG management (nvml_mig.cc): gpupool's own
// declarations of the parts of the NVML C ABI both use (INTERFACES.md section 3), and what
// nvml_mig.cc gets of a loaded library. Not for use outside src/agent/nvml*.cc.
#pragma once

#include <mutex>
#include <string>

#include "agent/nvml.h"

namespace gpupool::nvml_internal {

using NvmlReturn = int;
using NvmlDevice = struct NvmlDeviceOpaque*;
using NvmlGpuInstance = struct NvmlGpuInstanceOpaque*;
using NvmlComputeInstance = struct NvmlComputeInstanceOpaque*;

constexpr NvmlReturn kSuccess = 0;
constexpr NvmlReturn kErrInvalidArgument = 2;
constexpr NvmlReturn kErrNotFound = 6;
constexpr NvmlReturn kErrInsufficientSize = 7;

constexpr unsigned kGpuInstanceProfileCount = 0x12;  // NVML_GPU_INSTANCE_PROFILE_COUNT
constexpr unsigned kProfileOneSliceMediaExt = 7;     // 1_SLICE_REV1: "1g...+me"
constexpr unsigned kProfileTwoSliceMediaExt = 8;     // 2_SLICE_REV1: "2g...+me"
constexpr unsigned kComputeInstanceProfileCount = 8;  // NVML_COMPUTE_INSTANCE_PROFILE_COUNT
constexpr unsigned kComputeInstanceEngineShared = 0;  // NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED

struct GpuInstanceProfileInfo {
  unsigned id;
  unsigned is_p2p_supported;
  unsigned slice_count;
  unsigned instance_count;
  unsigned multiprocessor_count;
  unsigned copy_engine_count;
  unsigned decoder_count;
  unsigned encoder_count;
  unsigned jpeg_count;
  unsigned ofa_count;
  unsigned long long memory_size_mb;
};

// A GPU instance's placement, in memory slices.
struct GpuInstancePlacement {
  unsigned start;
  unsigned size;
};

struct GpuInstanceInfo {
  NvmlDevice device;    // the parent GPU
  unsigned id;          // GPU instance id, unique within the GPU
  unsigned profile_id;  // as GpuInstanceProfileInfo::id (19, 14, 9, ...)
  GpuInstancePlacement placement;
};
static_assert(sizeof(GpuInstanceInfo) == 24, "nvmlGpuInstanceInfo_t is 24 bytes");

struct ComputeInstanceProfileInfo {  // nvmlComputeInstanceProfileInfo_t (v1)
  unsigned id;
  unsigned slice_count;
  unsigned instance_count;
  unsigned multiprocessor_count;
  unsigned shared_copy_engine_count;
  unsigned shared_decoder_count;
  unsigned shared_encoder_count;
  unsigned shared_jpeg_count;
  unsigned shared_ofa_count;
};
static_assert(sizeof(ComputeInstanceProfileInfo) == 36, "nvmlComputeInstanceProfileInfo_t is 36 bytes");

using ErrorStringFn = const char* (*)(NvmlReturn);
using CountFn = NvmlReturn (*)(unsigned*);
using HandleByIndexFn = NvmlReturn (*)(unsigned, NvmlDevice*);
using StringFn = NvmlReturn (*)(NvmlDevice, char*, unsigned);
using UintFn = NvmlReturn (*)(NvmlDevice, unsigned*);
using MigModeFn = NvmlReturn (*)(NvmlDevice, unsigned*, unsigned*);
using GiProfileInfoFn = NvmlReturn (*)(NvmlDevice, unsigned, GpuInstanceProfileInfo*);
using MigHandleByIndexFn = NvmlReturn (*)(NvmlDevice, unsigned, NvmlDevice*);
using GpuInstanceByIdFn = NvmlReturn (*)(NvmlDevice, unsigned, NvmlGpuInstance*);
using GpuInstanceInfoFn = NvmlReturn (*)(NvmlGpuInstance, GpuInstanceInfo*);

// What nvml_mig.cc uses of a loaded library: its handle (for the MIG management entry points,
// resolved there), the loader's lock and the entry points discovery resolved already (any of the
// optional ones may be null).
struct Core {
  void* lib = nullptr;
  std::mutex* mu = nullptr;
  ErrorStringFn error_string = nullptr;
  CountFn device_count = nullptr;
  HandleByIndexFn handle_by_index = nullptr;
  StringFn uuid = nullptr;
  MigModeFn mig_mode = nullptr;
  GiProfileInfoFn gi_profile_info = nullptr;
  UintFn max_mig_devices = nullptr;
  MigHandleByIndexFn mig_handle_by_index = nullptr;
  UintFn gpu_instance_id = nullptr;
  UintFn compute_instance_id = nullptr;
  GpuInstanceByIdFn gpu_instance_by_id = nullptr;
  GpuInstanceInfoFn gpu_instance_info = nullptr;
};
Core CoreOf(Nvml::Impl& impl);  // nvml.cc

// "<NVML's text> (NVML error <code>)", as every loader message words an NVML error.
std::string ErrorText(const Core& core, NvmlReturn r);

}  // namespace gpupool::nvml_internal
