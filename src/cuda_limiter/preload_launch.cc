// libgpupool-cuda.so: compute pacing of the launch entry points, and NVML's memory reports
// (docs/cuda_limiter.md).
//
// Pacing, on a device whose share is below 1000: every launch on a stream that is not being
// captured is bracketed by two timing events recorded on its stream; the pair waits in the
// device's queue until the second has completed, and its elapsed time goes to the device's
// ComputePacer (limiter.h). Before a launch the queue's completed pairs are collected and the pacer
// says how long to wait. At most kMaxInflight pairs are in flight per device: a launch past that
// waits for the oldest to complete, so no launch goes out unmeasured.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "cuda_limiter/preload_internal.h"

namespace gpupool::cuda_limiter::preload {
namespace {

using namespace gpupool::cuda_abi;  // NOLINT: the driver's constants

constexpr size_t kMaxInflight = 256;
constexpr int64_t kFirstPollNs = 100'000;        // a full queue is polled from every 0.1 ms ...
constexpr int64_t kLastPollNs = 10'000'000;      // ... backing off to every 10 ms
constexpr int64_t kLongestSleepNs = 10'000'000;  // the pacer is asked again at least this often

void SleepNs(int64_t ns) {
  std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
}

// Event queries are "potentially unsafe" calls, which a stream capture in global mode on another
// thread forbids (and is invalidated by). This thread is switched to relaxed mode around them.
class RelaxedCapture {
 public:
  RelaxedCapture() : exchange_(GPUPOOL_REAL(cuThreadExchangeStreamCaptureMode)) {
    if (exchange_ != nullptr && exchange_(&mode_) != kSuccess) exchange_ = nullptr;
  }
  ~RelaxedCapture() {
    if (exchange_ != nullptr) exchange_(&mode_);
  }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  decltype(&::cuThreadExchangeStreamCaptureMode) exchange_;
  int mode_ = kStreamCaptureModeRelaxed;
};

void Destroy(const LaunchTiming& timing) {
  auto destroy = GPUPOOL_REAL(cuEventDestroy_v2);
  if (destroy == nullptr) return;
  if (timing.start != nullptr) destroy(timing.start);
  if (timing.stop != nullptr) destroy(timing.stop);
}

// Moves the completed pairs at the front of the queue into the pacer, in launch order (a pair
// that is not done yet keeps the ones behind it waiting: they count as in flight meanwhile).
// A pair whose time cannot be read counts as a launch of the estimated length; one whose events
// fail (its context is gone) counts nothing. REQUIRES: pacing.mutex held
void Collect(DevicePacing& pacing) {
  auto query = GPUPOOL_REAL(cuEventQuery);
  auto elapsed = GPUPOOL_REAL(cuEventElapsedTime);
  ComputePacer& pacer = *pacing.pacer;
  while (!pacing.inflight.empty()) {
    const LaunchTiming timing = pacing.inflight.front();
    const CUresult state = query(timing.stop);
    if (state == kErrorNotReady) break;
    float milliseconds = 0;
    if (state != kSuccess) {
      pacer.OnAbandon();
    } else if (elapsed(&milliseconds, timing.start, timing.stop) == kSuccess && std::isfinite(milliseconds) &&
               milliseconds >= 0) {
      pacer.OnComplete(static_cast<int64_t>(static_cast<double>(milliseconds) * 1e6));
    } else {
      pacer.OnComplete(pacer.EstimatedLaunchNs());
    }
    Destroy(timing);
    pacing.inflight.pop_front();
  }
}

// Waits until the pacer lets a launch go, and counts it as in flight.
void WaitForTurn(DevicePacing& pacing) {
  const RelaxedCapture relaxed;
  int64_t poll_ns = kFirstPollNs;
  while (true) {
    bool queue_full = false;
    int64_t delay_ns = 0;
    {
      std::lock_guard<std::mutex> lock(pacing.mutex);
      Collect(pacing);
      queue_full = pacing.inflight.size() >= kMaxInflight;
      if (!queue_full) delay_ns = pacing.pacer->DelayBeforeLaunch();
      if (!queue_full && delay_ns == 0) {
        pacing.pacer->OnLaunch();
        return;
      }
    }
    if (queue_full) {  // wait for the oldest launch to complete
      SleepNs(poll_ns);
      poll_ns = std::min(poll_ns * 2, kLastPollNs);
    } else {
      SleepNs(std::min(delay_ns, kLongestSleepNs));
    }
  }
}

// Runs launch() on stream, paced and measured when the current device is paced.
template <typename Launch>
CUresult PacedLaunch(CUstream stream, Launch&& launch) {
  if (Refused()) return kErrorNotInitialized;
  Process& process = State();
  if (!process.limits.HasPacing()) return launch();
  auto get_device = GPUPOOL_REAL(cuCtxGetDevice);
  auto capturing = GPUPOOL_REAL(cuStreamIsCapturing);
  auto create = GPUPOOL_REAL(cuEventCreate);
  auto record = GPUPOOL_REAL(cuEventRecord);
  if (get_device == nullptr || capturing == nullptr || create == nullptr || record == nullptr ||
      GPUPOOL_REAL(cuEventQuery) == nullptr || GPUPOOL_REAL(cuEventElapsedTime) == nullptr) {
    return launch();
  }
  CUdevice device = 0;
  if (get_device(&device) != kSuccess || device < 0 || static_cast<size_t>(device) >= kMaxDevices)
    return launch();
  DevicePacing& pacing = process.pacing[static_cast<size_t>(device)];
  if (!pacing.pacer) return launch();  // set when the state was made, never after: no lock needed
  // A captured launch does not run now; the graph it goes into is paced when it is launched.
  int capture = kStreamCaptureStatusNone;
  if (capturing(stream, &capture) == kSuccess && capture != kStreamCaptureStatusNone) return launch();

  WaitForTurn(pacing);
  LaunchTiming timing;
  bool timed = create(&timing.start, 0) == kSuccess && create(&timing.stop, 0) == kSuccess &&
               record(timing.start, stream) == kSuccess;
  const CUresult result = launch();
  timed = timed && result == kSuccess && record(timing.stop, stream) == kSuccess;
  std::lock_guard<std::mutex> lock(pacing.mutex);
  if (result != kSuccess) {
    pacing.pacer->OnAbandon();
  } else if (timed) {
    try {
      pacing.inflight.push_back(timing);
      return result;
    } catch (...) {
      pacing.pacer->OnComplete(pacing.pacer->EstimatedLaunchNs());
    }
  } else {
    pacing.pacer->OnComplete(pacing.pacer->EstimatedLaunchNs());  // it ran, unmeasured
  }
  Destroy(timing);
  return result;
}

// NVML's entry point `name` when the program has loaded NVML (we never load it).
void* NvmlEntry(const char* name) {
  void* library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (library == nullptr) return nullptr;
  void* entry = LookUp(library, name);
  dlclose(library);  // the program's own reference keeps it loaded
  return entry;
}

// The CUDA ordinal of an NVML device, matched by PCI location; -1 when the task does not see it.
// NVML alone does not initialise CUDA, so this may be the process's first cuInit.
int CudaOrdinal(nvmlDevice_t device) {
  auto pci_info =
      reinterpret_cast<decltype(&::nvmlDeviceGetPciInfo_v3)>(NvmlEntry("nvmlDeviceGetPciInfo_v3"));
  auto init = GPUPOOL_REAL(cuInit);
  auto count = GPUPOOL_REAL(cuDeviceGetCount);
  auto get = GPUPOOL_REAL(cuDeviceGet);
  auto attribute = GPUPOOL_REAL(cuDeviceGetAttribute);
  nvmlPciInfo_t pci{};
  if (pci_info == nullptr || init == nullptr || count == nullptr || get == nullptr || attribute == nullptr ||
      pci_info(device, &pci) != kNvmlSuccess) {
    return -1;
  }
  int devices = 0;
  CUresult result = count(&devices);
  if (result == kErrorNotInitialized && init(0) == kSuccess) result = count(&devices);
  if (result != kSuccess) return -1;
  for (int ordinal = 0; ordinal < std::min(devices, static_cast<int>(kMaxDevices)); ++ordinal) {
    CUdevice cuda_device = 0;
    int domain = -1, bus = -1, slot = -1;
    if (get(&cuda_device, ordinal) == kSuccess &&
        attribute(&domain, kAttributePciDomainId, cuda_device) == kSuccess &&
        attribute(&bus, kAttributePciBusId, cuda_device) == kSuccess &&
        attribute(&slot, kAttributePciDeviceId, cuda_device) == kSuccess &&
        static_cast<unsigned>(domain) == pci.domain && static_cast<unsigned>(bus) == pci.bus &&
        static_cast<unsigned>(slot) == pci.device) {
      return ordinal;
    }
  }
  return -1;
}

// The task's view of an NVML device's memory; false when the device has no cap (or is not the
// task's), and NVML's own figures stand.
bool TaskView(nvmlDevice_t device, unsigned long long free_bytes, unsigned long long total_bytes,  // NOLINT
              MemoryReport* report) {
  Process& process = State();
  if (!process.limits.HasMemoryCaps()) return false;
  const int ordinal = CudaOrdinal(device);
  if (ordinal < 0 || process.ledger.Cap(ordinal) == kNoMemoryCap) return false;
  *report = process.ledger.Report(ordinal, free_bytes, total_bytes);
  return true;
}

}  // namespace
}  // namespace gpupool::cuda_limiter::preload

namespace preload = gpupool::cuda_limiter::preload;
using namespace gpupool::cuda_abi;  // NOLINT: the driver's constants

GPUPOOL_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                       unsigned by, unsigned bz, unsigned shared, CUstream stream,
                                       void** params, void** extra) {
  GPUPOOL_REAL_OR_FAIL(real, cuLaunchKernel);
  return preload::PacedLaunch(stream,
                              [&] { return real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra); });
}

GPUPOOL_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                            unsigned by, unsigned bz, unsigned shared, CUstream stream,
                                            void** params, void** extra) {
  GPUPOOL_REAL_OR_FAIL(real, cuLaunchKernel_ptsz);
  return preload::PacedLaunch(stream,
                              [&] { return real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra); });
}

GPUPOOL_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params,
                                         void** extra) {
  GPUPOOL_REAL_OR_FAIL(real, cuLaunchKernelEx);
  return preload::PacedLaunch(config != nullptr ? config->hStream : nullptr,
                              [&] { return real(config, f, params, extra); });
}

GPUPOOL_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** params,
                                              void** extra) {
  GPUPOOL_REAL_OR_FAIL(real, cuLaunchKernelEx_ptsz);
  return preload::PacedLaunch(config != nullptr ? config->hStream : nullptr,
                              [&] { return real(config, f, params, extra); });
}

GPUPOOL_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                                  unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                                  CUstream stream, void** params) {
  GPUPOOL_REAL_OR_FAIL(real, cuLaunchCooperativeKernel);
  return preload::PacedLaunch(stream,
                              [&] { return real(f, gx, gy, gz, bx, by, bz, shared, stream, params); });
}

GPUPOOL_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                                       unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                                       CUstream stream, void** params) {
  GPUPOOL_REAL_OR_FAIL(real, cuLaunchCooperativeKernel_ptsz);
  return preload::PacedLaunch(stream,
                              [&] { return real(f, gx, gy, gz, bx, by, bz, shared, stream, params); });
}

GPUPOOL_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  GPUPOOL_REAL_OR_FAIL(real, cuGraphLaunch);
  return preload::PacedLaunch(stream, [&] { return real(exec, stream); });
}

GPUPOOL_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
  GPUPOOL_REAL_OR_FAIL(real, cuGraphLaunch_ptsz);
  return preload::PacedLaunch(stream, [&] { return real(exec, stream); });
}

// NVML inside the task: a capped device shows total = the cap, used = the task's allocations,
// free = what is left of the cap (never more than NVML reports free); nothing reserved.
GPUPOOL_EXPORT int nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  auto real =
      reinterpret_cast<decltype(&::nvmlDeviceGetMemoryInfo)>(preload::NvmlEntry("nvmlDeviceGetMemoryInfo"));
  if (real == nullptr) return kNvmlErrorUninitialized;
  const int result = real(device, memory);
  gpupool::cuda_limiter::MemoryReport report;
  if (result == kNvmlSuccess && memory != nullptr &&
      preload::TaskView(device, memory->free, memory->total, &report)) {
    *memory = nvmlMemory_t{report.total, report.free, report.used};
  }
  return result;
}

GPUPOOL_EXPORT int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory) {
  auto real = reinterpret_cast<decltype(&::nvmlDeviceGetMemoryInfo_v2)>(
      preload::NvmlEntry("nvmlDeviceGetMemoryInfo_v2"));
  if (real == nullptr) return kNvmlErrorUninitialized;
  const int result = real(device, memory);
  gpupool::cuda_limiter::MemoryReport report;
  if (result == kNvmlSuccess && memory != nullptr &&
      preload::TaskView(device, memory->free, memory->total, &report)) {
    memory->total = report.total;
    memory->reserved = 0;
    memory->free = report.free;
    memory->used = report.used;
  }
  return result;
}
