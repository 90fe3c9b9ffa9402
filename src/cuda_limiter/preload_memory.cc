// libgpupool-cuda.so: the memory entry points (docs/cuda_limiter.md). An allocation that would
// take its device past the task's cap fails with CUDA_ERROR_OUT_OF_MEMORY before the driver is
// asked; one that succeeds is recorded by pointer (or VMM handle) until it is freed, or its context
// destroyed. Without memory caps every call goes straight to the driver.
#include <algorithm>
#include <cstdint>

#include "cuda_limiter/preload_internal.h"

namespace gpupool::cuda_limiter::preload {
namespace {

using namespace gpupool::cuda_abi;  // NOLINT: the driver's constants

// Where an allocation lands: the current context's device, and the context (freed with it).
struct Place {
  int device = 0;
  uint64_t owner = 0;
};

CUresult CurrentPlace(Place* place) {
  auto get_device = GPUPOOL_REAL(cuCtxGetDevice);
  auto get_current = GPUPOOL_REAL(cuCtxGetCurrent);
  if (get_device == nullptr || get_current == nullptr) return kErrorNotInitialized;
  CUdevice device = 0;
  if (const CUresult result = get_device(&device); result != kSuccess) return result;
  CUcontext context = nullptr;
  if (get_current(&context) != kSuccess) context = nullptr;
  place->device = device;
  place->owner = reinterpret_cast<uintptr_t>(context);
  return kSuccess;
}

// Reserves *bytes on place's device, makes the allocation with allocate(&key) and records it, or
// undoes it with undo(key) when it cannot be recorded. allocate may raise *bytes when it succeeds,
// having reserved the difference itself.
template <typename Allocate, typename Undo>
CUresult Accounted(AllocationKey::Kind kind, Place place, uint64_t* bytes, Allocate&& allocate, Undo&& undo) {
  Process& process = State();
  if (!Reserve(process, place.device, *bytes)) return kErrorOutOfMemory;
  uint64_t key = 0;
  const CUresult result = allocate(&key);
  if (result != kSuccess) {
    process.ledger.Unreserve(place.device, *bytes);
    // Within the task's cap, yet the device had no room: others' use fills it (pressure).
    if (result == kErrorOutOfMemory) process.ledger.NotePressure(place.device);
    return result;
  }
  try {
    process.ledger.Record(AllocationKey{kind, key}, place.device, *bytes, place.owner);
  } catch (...) {
    undo(key);
    process.ledger.Unreserve(place.device, *bytes);
    return kErrorOutOfMemory;
  }
  return kSuccess;
}

// The allocations cuMemAlloc_v2, cuMemAllocManaged, cuMemAllocAsync and cuMemAllocFromPoolAsync
// share: bytes on the current device, keyed by the pointer, undone by free(pointer).
template <typename Allocate, typename Free>
CUresult PointerAllocation(CUdeviceptr* dptr, size_t size, Allocate&& allocate, Free&& release) {
  if (Refused()) return kErrorNotInitialized;
  if (!State().limits.HasMemoryCaps() || dptr == nullptr || size == 0) return allocate();
  try {
    Place place;
    if (const CUresult result = CurrentPlace(&place); result != kSuccess) return result;
    uint64_t bytes = size;
    return Accounted(
        AllocationKey::Kind::kPointer, place, &bytes,
        [&](uint64_t* key) {
          const CUresult result = allocate();
          *key = *dptr;
          return result;
        },
        [&](uint64_t key) { release(key); });
  } catch (...) {
    return kErrorUnknown;
  }
}

CUresult ReleasePointer(CUresult result, CUdeviceptr dptr) {
  if (result == kSuccess && State().limits.HasMemoryCaps())
    State().ledger.Release({AllocationKey::Kind::kPointer, dptr});
  return result;
}

}  // namespace
}  // namespace gpupool::cuda_limiter::preload

namespace preload = gpupool::cuda_limiter::preload;
using namespace gpupool::cuda_abi;  // NOLINT: the driver's constants

GPUPOOL_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  GPUPOOL_REAL_OR_FAIL(real, cuMemAlloc_v2);
  auto release = GPUPOOL_REAL(cuMemFree_v2);
  return preload::PointerAllocation(
      dptr, bytes, [&] { return real(dptr, bytes); },
      [&](CUdeviceptr p) {
        if (release != nullptr) release(p);
      });
}

GPUPOOL_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytes, unsigned flags) {
  GPUPOOL_REAL_OR_FAIL(real, cuMemAllocManaged);
  auto release = GPUPOOL_REAL(cuMemFree_v2);
  return preload::PointerAllocation(
      dptr, bytes, [&] { return real(dptr, bytes, flags); },
      [&](CUdeviceptr p) {
        if (release != nullptr) release(p);
      });
}

GPUPOOL_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  GPUPOOL_REAL_OR_FAIL(real, cuMemAllocAsync);
  auto release = GPUPOOL_REAL(cuMemFreeAsync);
  return preload::PointerAllocation(
      dptr, bytes, [&] { return real(dptr, bytes, stream); },
      [&](CUdeviceptr p) {
        if (release != nullptr) release(p, stream);
      });
}

GPUPOOL_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  GPUPOOL_REAL_OR_FAIL(real, cuMemAllocAsync_ptsz);
  auto release = GPUPOOL_REAL(cuMemFreeAsync_ptsz);
  return preload::PointerAllocation(
      dptr, bytes, [&] { return real(dptr, bytes, stream); },
      [&](CUdeviceptr p) {
        if (release != nullptr) release(p, stream);
      });
}

GPUPOOL_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool,
                                                CUstream stream) {
  GPUPOOL_REAL_OR_FAIL(real, cuMemAllocFromPoolAsync);
  auto release = GPUPOOL_REAL(cuMemFreeAsync);
  return preload::PointerAllocation(
      dptr, bytes, [&] { return real(dptr, bytes, pool, stream); },
      [&](CUdeviceptr p) {
        if (release != nullptr) release(p, stream);
      });
}

GPUPOOL_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool,
                                                     CUstream stream) {
  GPUPOOL_REAL_OR_FAIL(real, cuMemAllocFromPoolAsync_ptsz);
  auto release = GPUPOOL_REAL(cuMemFreeAsync_ptsz);
  return preload::PointerAllocation(
      dptr, bytes, [&] { return real(dptr, bytes, pool, stream); },
      [&](CUdeviceptr p) {
        if (release != nullptr) release(p, stream);
      });
}

// The pitch is the driver's choice, so the bytes are known only afterwards: width x height is
// reserved first and the rest of pitch x height after, or the allocation is given back.
GPUPOOL_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                           unsigned element) {
  GPUPOOL_REAL_OR_FAIL(real, cuMemAllocPitch_v2);
  auto release = GPUPOOL_REAL(cuMemFree_v2);
  if (preload::Refused()) return kErrorNotInitialized;
  preload::Process& process = preload::State();
  if (!process.limits.HasMemoryCaps() || dptr == nullptr || pitch == nullptr || width == 0 || height == 0) {
    return real(dptr, pitch, width, height, element);
  }
  if (height > SIZE_MAX / width) return kErrorOutOfMemory;
  try {
    preload::Place place;
    if (const CUresult result = preload::CurrentPlace(&place); result != kSuccess) return result;
    const uint64_t least = uint64_t{width} * height;
    uint64_t bytes = least;
    return preload::Accounted(
        gpupool::cuda_limiter::AllocationKey::Kind::kPointer, place, &bytes,
        [&](uint64_t* key) {
          const CUresult result = real(dptr, pitch, width, height, element);
          if (result != kSuccess) return result;
          *key = *dptr;
          const uint64_t taken = *pitch > SIZE_MAX / height ? UINT64_MAX : uint64_t{*pitch} * height;
          if (taken > least && !preload::Reserve(process, place.device, taken - least)) {
            if (release != nullptr) release(*dptr);
            return kErrorOutOfMemory;
          }
          bytes = std::max(taken, least);
          return kSuccess;
        },
        [&](uint64_t key) {
          if (release != nullptr) release(key);
        });
  } catch (...) {
    return kErrorUnknown;
  }
}

// Accounted in the ledger under its handle, on the device the properties name (memory placed on
// the host is not the device's).
GPUPOOL_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                    const CUmemAllocationProp* prop, unsigned long long flags) {
  GPUPOOL_REAL_OR_FAIL(real, cuMemCreate);
  auto release = GPUPOOL_REAL(cuMemRelease);
  if (preload::Refused()) return kErrorNotInitialized;
  if (!preload::State().limits.HasMemoryCaps() || handle == nullptr || prop == nullptr || size == 0 ||
      prop->location.type != kMemLocationDevice) {
    return real(handle, size, prop, flags);
  }
  try {
    uint64_t bytes = size;
    return preload::Accounted(
        gpupool::cuda_limiter::AllocationKey::Kind::kHandle, preload::Place{prop->location.id, 0}, &bytes,
        [&](uint64_t* key) {
          const CUresult result = real(handle, size, prop, flags);
          *key = *handle;
          return result;
        },
        [&](uint64_t key) {
          if (release != nullptr) release(key);
        });
  } catch (...) {
    return kErrorUnknown;
  }
}

GPUPOOL_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  GPUPOOL_REAL_OR_FAIL(real, cuMemRelease);
  const CUresult result = real(handle);
  if (result == kSuccess && preload::State().limits.HasMemoryCaps()) {
    preload::State().ledger.Release({gpupool::cuda_limiter::AllocationKey::Kind::kHandle, handle});
  }
  return result;
}

GPUPOOL_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  GPUPOOL_REAL_OR_FAIL(real, cuMemFree_v2);
  return preload::ReleasePointer(real(dptr), dptr);
}

GPUPOOL_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  GPUPOOL_REAL_OR_FAIL(real, cuMemFreeAsync);
  return preload::ReleasePointer(real(dptr, stream), dptr);
}

GPUPOOL_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  GPUPOOL_REAL_OR_FAIL(real, cuMemFreeAsync_ptsz);
  return preload::ReleasePointer(real(dptr, stream), dptr);
}

// A destroyed context frees what was allocated in it.
GPUPOOL_EXPORT CUresult cuCtxDestroy_v2(CUcontext context) {
  GPUPOOL_REAL_OR_FAIL(real, cuCtxDestroy_v2);
  const CUresult result = real(context);
  if (result == kSuccess && preload::State().limits.HasMemoryCaps()) {
    preload::State().ledger.ReleaseOwner(reinterpret_cast<uintptr_t>(context));
  }
  return result;
}

GPUPOOL_EXPORT CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  GPUPOOL_REAL_OR_FAIL(real, cuMemGetInfo_v2);
  if (preload::Refused()) return kErrorNotInitialized;
  const CUresult result = real(free_bytes, total_bytes);
  if (result != kSuccess || free_bytes == nullptr || total_bytes == nullptr ||
      !preload::State().limits.HasMemoryCaps()) {
    return result;
  }
  preload::Place place;
  if (preload::CurrentPlace(&place) != kSuccess) return result;
  const gpupool::cuda_limiter::MemoryReport report =
      preload::State().ledger.Report(place.device, *free_bytes, *total_bytes);
  *free_bytes = report.free;
  *total_bytes = report.total;
  return kSuccess;
}

// The 32-bit entry points of CUDA before 3.2 cannot be accounted like the others; with a cap they
// are refused rather than left as a way around it.
GPUPOOL_EXPORT CUresult cuMemAlloc(unsigned* dptr, unsigned bytes) {
  if (preload::Refused()) return kErrorNotInitialized;
  if (preload::State().limits.HasMemoryCaps()) return kErrorNotSupported;
  GPUPOOL_REAL_OR_FAIL(real, cuMemAlloc);
  return real(dptr, bytes);
}

GPUPOOL_EXPORT CUresult cuMemAllocPitch(unsigned* dptr, unsigned* pitch, unsigned width, unsigned height,
                                        unsigned element) {
  if (preload::Refused()) return kErrorNotInitialized;
  if (preload::State().limits.HasMemoryCaps()) return kErrorNotSupported;
  GPUPOOL_REAL_OR_FAIL(real, cuMemAllocPitch);
  return real(dptr, pitch, width, height, element);
}
