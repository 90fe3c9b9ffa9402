// What the three parts of libgpupool-cuda.so share: preload.cc (the process state, the real driver,
// dlsym, cuGetProcAddress, cuInit), preload_memory.cc (the memory entry points) and
// preload_launch.cc (compute pacing, NVML). Nothing here is exported.
#ifndef GPUPOOL_CUDA_LIMITER_PRELOAD_INTERNAL_H_
#define GPUPOOL_CUDA_LIMITER_PRELOAD_INTERNAL_H_

#include <array>
#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "cuda_limiter/cuda_abi.h"
#include "cuda_limiter/limiter.h"
#include "cuda_limiter/shared_ledger.h"

#define GPUPOOL_EXPORT extern "C" __attribute__((visibility("default")))

namespace gpupool::cuda_limiter::preload {

// Every driver entry point the library calls: first those it wraps (exports under the same name
// and hands out from dlsym and cuGetProcAddress), then those it only calls.
// clang-format off
#define GPUPOOL_WRAPPED_FUNCTIONS(X)                                                                      \
  X(cuInit) X(cuGetProcAddress) X(cuGetProcAddress_v2)                                                    \
  X(cuMemAlloc_v2) X(cuMemAllocPitch_v2) X(cuMemAllocManaged) X(cuMemAllocAsync) X(cuMemAllocAsync_ptsz)  \
  X(cuMemAllocFromPoolAsync) X(cuMemAllocFromPoolAsync_ptsz) X(cuMemFree_v2) X(cuMemFreeAsync)            \
  X(cuMemFreeAsync_ptsz) X(cuMemCreate) X(cuMemRelease) X(cuMemGetInfo_v2) X(cuCtxDestroy_v2)             \
  X(cuMemAlloc) X(cuMemAllocPitch)                                                                        \
  X(cuLaunchKernel) X(cuLaunchKernel_ptsz) X(cuLaunchKernelEx) X(cuLaunchKernelEx_ptsz)                   \
  X(cuLaunchCooperativeKernel) X(cuLaunchCooperativeKernel_ptsz) X(cuGraphLaunch) X(cuGraphLaunch_ptsz)
#define GPUPOOL_CALLED_FUNCTIONS(X)                                                                       \
  X(cuCtxGetDevice) X(cuCtxGetCurrent) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetAttribute)         \
  X(cuEventCreate) X(cuEventRecord) X(cuEventQuery) X(cuEventElapsedTime) X(cuEventDestroy_v2)            \
  X(cuStreamIsCapturing) X(cuThreadExchangeStreamCaptureMode)
// clang-format on

#define GPUPOOL_ENUM(name) k_##name,
enum Fn : int { GPUPOOL_WRAPPED_FUNCTIONS(GPUPOOL_ENUM) GPUPOOL_CALLED_FUNCTIONS(GPUPOOL_ENUM) kFnCount };
#undef GPUPOOL_ENUM
#define GPUPOOL_ONE(name) +1
inline constexpr int kWrappedCount = 0 GPUPOOL_WRAPPED_FUNCTIONS(GPUPOOL_ONE);
#undef GPUPOOL_ONE

// The real driver: libcuda.so.1 opened RTLD_LOCAL, its entry points found with the real dlsym.
// Null pointers for entry points this driver does not have.
struct Driver {
  void* handle = nullptr;
  std::array<void*, kFnCount> fn{};
};
const Driver& RealDriver();

template <typename F>
F Real(Fn fn) {
  return reinterpret_cast<F>(RealDriver().fn[static_cast<size_t>(fn)]);
}
// The real entry point `name`, typed as its declaration in cuda_abi.h (null when absent).
#define GPUPOOL_REAL(name) \
  ::gpupool::cuda_limiter::preload::Real<decltype(&::name)>(::gpupool::cuda_limiter::preload::k_##name)

// Declares var as the real entry point `name`; a driver without it answers CUDA_ERROR_NOT_FOUND,
// as cuGetProcAddress would have.
#define GPUPOOL_REAL_OR_FAIL(var, name) \
  auto var = GPUPOOL_REAL(name);        \
  if (var == nullptr) return ::gpupool::cuda_abi::kErrorNotFound

// Compute pacing of one device: its pacer and the launches in flight, oldest first.
struct LaunchTiming {
  CUevent start = nullptr;
  CUevent stop = nullptr;
};
struct DevicePacing {
  std::mutex mutex;
  std::optional<ComputePacer> pacer;  // set for paced devices only; GUARDED_BY(mutex)
  std::deque<LaunchTiming> inflight;  // GUARDED_BY(mutex)
};

// The process-wide state, created on first use (or when the library is loaded) from the
// environment of that moment and never destroyed (the driver may call in during exit).
struct Process {
  Process();

  std::string ledger_path;  // the ledger file's path, from the limits file or GPUPOOL_CUDA_LEDGER ("": none)
  LimitsOrError parsed;      // from the limits file when it exists, otherwise from the environment
  Limits limits;
  std::string ledger_error;              // why GPUPOOL_CUDA_LEDGER could not be used ("": it could)
  std::unique_ptr<SharedLedger> shared;  // the task's ledger file, when GPUPOOL_CUDA_LEDGER names one
  MemoryLedger ledger;
  SteadyClock clock;
  std::array<DevicePacing, kMaxDevices> pacing;

  std::atomic<bool> refused{false};
  std::atomic<bool> refusal_printed{false};
  std::atomic<bool> ledger_problem_printed{false};
  std::mutex refusal_mutex;
  std::string refusal;  // GUARDED_BY(refusal_mutex)
};
Process& State();

// The real dlsym's answer (never our wrappers' substitution).
void* LookUp(void* handle, const char* name);

// True (after printing the reason to stderr once) when CUDA is refused in this process.
bool Refused() noexcept;
// Refuses CUDA from now on, printing why (once).
void Refuse(const std::string& reason) noexcept;
// ledger.Reserve, and when the task's shared ledger refused for a reason other than the cap (no
// free slot, a damaged file), one line on stderr the first time.
bool Reserve(Process& process, int device, uint64_t bytes) noexcept;
// Writes "gpupool-cuda: <line>\n" to stderr, in one write.
void PrintError(const std::string& line) noexcept;

}  // namespace gpupool::cuda_limiter::preload

#endif  // GPUPOOL_CUDA_LIMITER_PRELOAD_INTERNAL_H_
