// A fake libcuda.so.1 for the tests and the benchmark of libgpupool-cuda.so on machines without a
// GPU. It implements the driver entry points the limiter and tests/fake_cuda/cuda_probe.cc use,
// with gpupool's own reading of their ABI (src/cuda_limiter/cuda_abi.h; no NVIDIA header).
//
// The machine it describes: FAKE_CUDA_DEVICES devices (1..8, default 2) of FAKE_CUDA_MEMORY_MIB
// MiB each (default 81920), at the PCI locations tests/fake_nvml gives its GPUs. Allocations are
// real bookkeeping: unique, never reused addresses that must not be dereferenced. A kernel is a
// duration on its stream's timeline: FAKE_CUDA_KERNEL_US when set, otherwise the uint32 its first
// parameter points to (microseconds, at most 10 s), otherwise 0. It starts when the stream's last
// work ends (or at launch, if later); an event recorded on a stream completes when the stream's
// work before it does, and synchronising sleeps until then. Streams do not overlap in time.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "cuda_limiter/cuda_abi.h"

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using namespace gpupool::cuda_abi;  // NOLINT: the driver's constants

constexpr unsigned kBus[8] = {0x18, 0x2a, 0x9a, 0xab, 0xc0, 0xc1, 0xd0, 0xd1};  // as tests/fake_nvml
constexpr uint64_t kGranularity = uint64_t{2} << 20;                            // VMM: 2 MiB
constexpr int64_t kMaxKernelNs = int64_t{10} * 1'000'000'000;

struct Context;
struct Stream {
  Context* context = nullptr;
  int64_t tail_ns = 0;  // when its last work ends
};
struct Context {
  int device = 0;
  Stream default_stream;
};
struct Event {
  int64_t at_ns = -1;  // when it completes; -1: never recorded
};
struct Allocation {
  int device = 0;
  uint64_t bytes = 0;
  Context* context = nullptr;  // null for VMM handles
};

// An environment number within [low, high], or fallback when unset or malformed.
uint64_t EnvNumber(const char* name, uint64_t low, uint64_t high, uint64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0' || std::strlen(text) > 12) return fallback;
  uint64_t value = 0;
  for (const char* c = text; *c != '\0'; ++c) {
    if (*c < '0' || *c > '9') return fallback;
    value = value * 10 + static_cast<uint64_t>(*c - '0');
  }
  return value < low || value > high ? fallback : value;
}

struct Fake {
  std::mutex mutex;
  bool initialized = false;
  int devices = static_cast<int>(EnvNumber("FAKE_CUDA_DEVICES", 1, 8, 2));
  uint64_t memory = EnvNumber("FAKE_CUDA_MEMORY_MIB", 1, uint64_t{1} << 24, 81920) << 20;
  int64_t kernel_ns = std::getenv("FAKE_CUDA_KERNEL_US") == nullptr
                          ? -1
                          : static_cast<int64_t>(EnvNumber("FAKE_CUDA_KERNEL_US", 0, 10'000'000, 0)) * 1000;
  uint64_t used[8] = {};
  std::map<uint64_t, Allocation> pointers, handles;
  uint64_t next_address = 0x7f0000000000ULL;
  uint64_t next_handle = 1;
  std::set<Context*> contexts;
  std::set<Stream*> streams;
  std::set<Event*> events;
};

Fake& F() {
  static Fake* fake = new Fake();  // never destroyed: threads may call in during exit
  return *fake;
}

thread_local Context* current = nullptr;
thread_local int capture_mode = 0;

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void SleepUntil(int64_t at_ns) {
  const int64_t now = Now();
  if (at_ns > now) std::this_thread::sleep_for(std::chrono::nanoseconds(at_ns - now));
}

// The stream behind a handle in the current context (null, 0x1 and 0x2 are its default stream).
// REQUIRES: F().mutex held
Stream* StreamOf(CUstream handle) {
  if (current == nullptr) return nullptr;
  if (reinterpret_cast<uintptr_t>(handle) <= 2) return &current->default_stream;
  Stream* stream = reinterpret_cast<Stream*>(handle);
  return F().streams.count(stream) != 0 ? stream : nullptr;
}

CUresult Allocate(CUdeviceptr* dptr, uint64_t bytes, int device, Context* context,
                  std::map<uint64_t, Allocation>* into, uint64_t key) {
  Fake& fake = F();
  if (dptr == nullptr || bytes == 0) return kErrorInvalidValue;
  if (bytes > fake.memory - fake.used[device]) return kErrorOutOfMemory;
  fake.used[device] += bytes;
  if (key == 0) {
    key = fake.next_address;
    fake.next_address += (bytes + 511) / 512 * 512;
  }
  (*into)[key] = Allocation{device, bytes, context};
  *dptr = key;
  return kSuccess;
}

CUresult AllocateCurrent(CUdeviceptr* dptr, size_t bytes) {
  std::lock_guard<std::mutex> lock(F().mutex);
  if (current == nullptr) return kErrorInvalidContext;
  return Allocate(dptr, bytes, current->device, current, &F().pointers, 0);
}

CUresult Free(std::map<uint64_t, Allocation>* from, uint64_t key) {
  std::lock_guard<std::mutex> lock(F().mutex);
  auto it = from->find(key);
  if (it == from->end()) return kErrorInvalidValue;
  F().used[it->second.device] -= it->second.bytes;
  from->erase(it);
  return kSuccess;
}

CUresult Launch(CUstream handle, void** params) {
  int64_t duration = F().kernel_ns;
  if (duration < 0) {
    duration = 0;
    if (params != nullptr && params[0] != nullptr) {
      uint32_t microseconds = 0;
      std::memcpy(&microseconds, params[0], sizeof(microseconds));
      duration = std::min<int64_t>(int64_t{microseconds} * 1000, kMaxKernelNs);
    }
  }
  std::lock_guard<std::mutex> lock(F().mutex);
  Stream* stream = StreamOf(handle);
  if (stream == nullptr) return current == nullptr ? kErrorInvalidContext : kErrorInvalidHandle;
  stream->tail_ns = std::max(stream->tail_ns, Now()) + duration;
  return kSuccess;
}

}  // namespace

FAKE_EXPORT CUresult cuInit(unsigned flags) {
  if (flags != 0) return kErrorInvalidValue;
  std::lock_guard<std::mutex> lock(F().mutex);
  F().initialized = true;
  return kSuccess;
}

FAKE_EXPORT CUresult cuDeviceGetCount(int* count) {
  if (count == nullptr) return kErrorInvalidValue;
  if (!F().initialized) return kErrorNotInitialized;
  *count = F().devices;
  return kSuccess;
}

FAKE_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (!F().initialized) return kErrorNotInitialized;
  if (device == nullptr) return kErrorInvalidValue;
  if (ordinal < 0 || ordinal >= F().devices) return kErrorInvalidDevice;
  *device = ordinal;
  return kSuccess;
}

FAKE_EXPORT CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice device) {
  if (!F().initialized) return kErrorNotInitialized;
  if (value == nullptr) return kErrorInvalidValue;
  if (device < 0 || device >= F().devices) return kErrorInvalidDevice;
  switch (attribute) {
    case kAttributePciBusId: *value = static_cast<int>(kBus[device]); return kSuccess;
    case kAttributePciDeviceId: *value = 0; return kSuccess;
    case kAttributePciDomainId: *value = 0; return kSuccess;
    default: return kErrorInvalidValue;
  }
}

FAKE_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice device) {
  if (pool == nullptr || device < 0 || device >= F().devices) return kErrorInvalidValue;
  *pool = reinterpret_cast<CUmemoryPool>(static_cast<uintptr_t>(0x1000 + device));
  return kSuccess;
}

FAKE_EXPORT CUresult cuCtxCreate_v2(CUcontext* context, unsigned, CUdevice device) {
  if (!F().initialized) return kErrorNotInitialized;
  if (context == nullptr) return kErrorInvalidValue;
  if (device < 0 || device >= F().devices) return kErrorInvalidDevice;
  std::lock_guard<std::mutex> lock(F().mutex);
  Context* created = new Context();
  created->device = device;
  created->default_stream.context = created;
  F().contexts.insert(created);
  current = created;
  *context = reinterpret_cast<CUcontext>(created);
  return kSuccess;
}

// Frees the context's allocations and streams, as the driver does.
FAKE_EXPORT CUresult cuCtxDestroy_v2(CUcontext handle) {
  std::lock_guard<std::mutex> lock(F().mutex);
  Fake& fake = F();
  Context* context = reinterpret_cast<Context*>(handle);
  if (fake.contexts.erase(context) == 0) return kErrorInvalidContext;
  std::erase_if(fake.pointers, [&](const auto& entry) {
    if (entry.second.context == context) fake.used[entry.second.device] -= entry.second.bytes;
    return entry.second.context == context;
  });
  std::erase_if(fake.streams, [&](Stream* stream) {
    if (stream->context != context) return false;
    delete stream;
    return true;
  });
  if (current == context) current = nullptr;
  delete context;
  return kSuccess;
}

FAKE_EXPORT CUresult cuCtxGetCurrent(CUcontext* context) {
  if (context == nullptr) return kErrorInvalidValue;
  *context = reinterpret_cast<CUcontext>(current);
  return kSuccess;
}

FAKE_EXPORT CUresult cuCtxSetCurrent(CUcontext handle) {
  std::lock_guard<std::mutex> lock(F().mutex);
  Context* context = reinterpret_cast<Context*>(handle);
  if (context != nullptr && F().contexts.count(context) == 0) return kErrorInvalidContext;
  current = context;
  return kSuccess;
}

FAKE_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
  if (device == nullptr) return kErrorInvalidValue;
  if (current == nullptr) return kErrorInvalidContext;
  *device = current->device;
  return kSuccess;
}

FAKE_EXPORT CUresult cuCtxSynchronize(void) {
  int64_t until = 0;
  {
    std::lock_guard<std::mutex> lock(F().mutex);
    if (current == nullptr) return kErrorInvalidContext;
    until = current->default_stream.tail_ns;
    for (Stream* stream : F().streams) {
      if (stream->context == current) until = std::max(until, stream->tail_ns);
    }
  }
  SleepUntil(until);
  return kSuccess;
}

FAKE_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  return AllocateCurrent(dptr, bytes);
}

FAKE_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytes, unsigned) {
  return AllocateCurrent(dptr, bytes);
}

FAKE_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytes, CUstream) {
  return AllocateCurrent(dptr, bytes);
}

FAKE_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytes, CUstream) {
  return AllocateCurrent(dptr, bytes);
}

FAKE_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, CUstream) {
  if (pool == nullptr) return kErrorInvalidValue;
  return AllocateCurrent(dptr, bytes);
}

FAKE_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                        unsigned) {
  if (pitch == nullptr || width == 0 || height == 0 || width > (uint64_t{1} << 32)) return kErrorInvalidValue;
  const size_t rounded = (width + 511) / 512 * 512;
  if (height > (uint64_t{1} << 40) / rounded) return kErrorOutOfMemory;
  const CUresult result = AllocateCurrent(dptr, rounded * height);
  if (result == kSuccess) *pitch = rounded;
  return result;
}

FAKE_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  return Free(&F().pointers, dptr);
}
FAKE_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream) {
  return Free(&F().pointers, dptr);
}
FAKE_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream) {
  return Free(&F().pointers, dptr);
}

FAKE_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                 const CUmemAllocationProp* prop,
                                 unsigned long long) {  // NOLINT: the ABI's type
  if (handle == nullptr || prop == nullptr || size % kGranularity != 0) return kErrorInvalidValue;
  if (prop->location.type != kMemLocationDevice || prop->location.id < 0 ||
      prop->location.id >= F().devices) {
    return kErrorInvalidDevice;
  }
  std::lock_guard<std::mutex> lock(F().mutex);
  CUdeviceptr key = 0;
  const CUresult result = Allocate(&key, size, prop->location.id, nullptr, &F().handles, F().next_handle);
  if (result == kSuccess) {
    ++F().next_handle;
    *handle = key;
  }
  return result;
}

FAKE_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  return Free(&F().handles, handle);
}

FAKE_EXPORT CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return kErrorInvalidValue;
  std::lock_guard<std::mutex> lock(F().mutex);
  if (current == nullptr) return kErrorInvalidContext;
  *total_bytes = F().memory;
  *free_bytes = F().memory - F().used[current->device];
  return kSuccess;
}

FAKE_EXPORT CUresult cuStreamCreate(CUstream* handle, unsigned) {
  if (handle == nullptr) return kErrorInvalidValue;
  std::lock_guard<std::mutex> lock(F().mutex);
  if (current == nullptr) return kErrorInvalidContext;
  Stream* stream = new Stream();
  stream->context = current;
  F().streams.insert(stream);
  *handle = reinterpret_cast<CUstream>(stream);
  return kSuccess;
}

FAKE_EXPORT CUresult cuStreamDestroy_v2(CUstream handle) {
  std::lock_guard<std::mutex> lock(F().mutex);
  Stream* stream = reinterpret_cast<Stream*>(handle);
  if (F().streams.erase(stream) == 0) return kErrorInvalidHandle;
  delete stream;
  return kSuccess;
}

FAKE_EXPORT CUresult cuStreamSynchronize(CUstream handle) {
  int64_t until = 0;
  {
    std::lock_guard<std::mutex> lock(F().mutex);
    Stream* stream = StreamOf(handle);
    if (stream == nullptr) return kErrorInvalidHandle;
    until = stream->tail_ns;
  }
  SleepUntil(until);
  return kSuccess;
}

FAKE_EXPORT CUresult cuStreamIsCapturing(CUstream, int* status) {
  if (status == nullptr) return kErrorInvalidValue;
  *status = kStreamCaptureStatusNone;
  return kSuccess;
}

FAKE_EXPORT CUresult cuThreadExchangeStreamCaptureMode(int* mode) {
  if (mode == nullptr) return kErrorInvalidValue;
  std::swap(*mode, capture_mode);
  return kSuccess;
}

FAKE_EXPORT CUresult cuEventCreate(CUevent* handle, unsigned) {
  if (handle == nullptr) return kErrorInvalidValue;
  std::lock_guard<std::mutex> lock(F().mutex);
  Event* event = new Event();
  F().events.insert(event);
  *handle = reinterpret_cast<CUevent>(event);
  return kSuccess;
}

FAKE_EXPORT CUresult cuEventRecord(CUevent handle, CUstream stream_handle) {
  std::lock_guard<std::mutex> lock(F().mutex);
  Event* event = reinterpret_cast<Event*>(handle);
  Stream* stream = StreamOf(stream_handle);
  if (F().events.count(event) == 0 || stream == nullptr) return kErrorInvalidHandle;
  event->at_ns = std::max(stream->tail_ns, Now());
  return kSuccess;
}

// When the event completes (-1: never recorded), or -2 for a bad handle.
int64_t EventTime(CUevent handle) {
  std::lock_guard<std::mutex> lock(F().mutex);
  Event* event = reinterpret_cast<Event*>(handle);
  return F().events.count(event) == 0 ? -2 : event->at_ns;
}

FAKE_EXPORT CUresult cuEventQuery(CUevent handle) {
  const int64_t at = EventTime(handle);
  if (at == -2) return kErrorInvalidHandle;
  return at <= Now() ? kSuccess : kErrorNotReady;
}

FAKE_EXPORT CUresult cuEventSynchronize(CUevent handle) {
  const int64_t at = EventTime(handle);
  if (at == -2) return kErrorInvalidHandle;
  SleepUntil(at);
  return kSuccess;
}

FAKE_EXPORT CUresult cuEventElapsedTime(float* milliseconds, CUevent start, CUevent end) {
  const int64_t from = EventTime(start), to = EventTime(end);
  if (milliseconds == nullptr) return kErrorInvalidValue;
  if (from == -2 || to == -2 || from == -1 || to == -1) return kErrorInvalidHandle;
  if (std::max(from, to) > Now()) return kErrorNotReady;
  *milliseconds = static_cast<float>(static_cast<double>(to - from) / 1e6);
  return kSuccess;
}

FAKE_EXPORT CUresult cuEventDestroy_v2(CUevent handle) {
  std::lock_guard<std::mutex> lock(F().mutex);
  Event* event = reinterpret_cast<Event*>(handle);
  if (F().events.erase(event) == 0) return kErrorInvalidHandle;
  delete event;
  return kSuccess;
}

FAKE_EXPORT CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    unsigned, CUstream stream, void** params, void**) {
  return Launch(stream, params);
}

FAKE_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                         unsigned, unsigned, CUstream stream, void** params, void**) {
  return Launch(stream, params);
}

FAKE_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction, void** params, void**) {
  if (config == nullptr) return kErrorInvalidValue;
  return Launch(config->hStream, params);
}

FAKE_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                               unsigned, unsigned, CUstream stream, void** params) {
  return Launch(stream, params);
}

namespace {

// Every entry point by its exported name, for cuGetProcAddress (the fake's own, never a lookup
// through dlsym, which the limiter interposes).
// clang-format off
#define FAKE_ENTRIES(X)                                                                                   \
  X(cuInit) X(cuGetProcAddress) X(cuGetProcAddress_v2) X(cuDeviceGetCount) X(cuDeviceGet)                 \
  X(cuDeviceGetAttribute) X(cuDeviceGetDefaultMemPool) X(cuCtxCreate_v2) X(cuCtxDestroy_v2)               \
  X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxGetDevice) X(cuCtxSynchronize) X(cuMemAlloc_v2)            \
  X(cuMemAllocManaged) X(cuMemAllocAsync) X(cuMemAllocAsync_ptsz) X(cuMemAllocFromPoolAsync)              \
  X(cuMemAllocPitch_v2) X(cuMemFree_v2) X(cuMemFreeAsync) X(cuMemFreeAsync_ptsz) X(cuMemCreate)           \
  X(cuMemRelease) X(cuMemGetInfo_v2) X(cuStreamCreate) X(cuStreamDestroy_v2) X(cuStreamSynchronize)       \
  X(cuStreamIsCapturing) X(cuThreadExchangeStreamCaptureMode) X(cuEventCreate) X(cuEventRecord)           \
  X(cuEventQuery) X(cuEventSynchronize) X(cuEventElapsedTime) X(cuEventDestroy_v2) X(cuLaunchKernel)      \
  X(cuLaunchKernel_ptsz) X(cuLaunchKernelEx) X(cuLaunchCooperativeKernel)
#define FAKE_ENTRY(name) {#name, reinterpret_cast<void*>(&name)},
// clang-format on
const std::map<std::string, void*>& Entries() {
  static const auto* entries = new std::map<std::string, void*>{FAKE_ENTRIES(FAKE_ENTRY)};
  return *entries;
}
#undef FAKE_ENTRY

// The driver's naming: a base name ("cuMemAlloc") means its newest version ("_v2"), and the
// per-thread default stream flavour ("_ptsz") when the flags ask for it.
void* Find(const char* symbol, int version, cuuint64_t flags) {
  if (symbol == nullptr || std::strlen(symbol) > 128) return nullptr;
  const std::string base(symbol);
  if (base == "cuGetProcAddress" && version < 12000) return Entries().at(base);
  for (const char* suffix : {"_ptsz", "_v2", ""}) {
    if (std::strcmp(suffix, "_ptsz") == 0 && (flags & kProcAddressPerThreadStream) == 0) continue;
    auto it = Entries().find(base + suffix);
    if (it != Entries().end()) return it->second;
  }
  return nullptr;
}

}  // namespace

FAKE_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                         int* status) {
  if (pfn == nullptr) return kErrorInvalidValue;
  *pfn = Find(symbol, version, flags);
  if (status != nullptr) *status = *pfn != nullptr ? kProcAddressSuccess : kProcAddressSymbolNotFound;
  return *pfn != nullptr ? kSuccess : kErrorNotFound;
}

FAKE_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, nullptr);
}
