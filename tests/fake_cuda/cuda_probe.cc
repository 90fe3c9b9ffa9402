// Drives the CUDA driver API the way programs do, for the tests of libgpupool-cuda.so
// (src/cuda_limiter/limiter_test.cc). Prints one key=value line per figure.
//
//   cuda_probe alloc [KIND] [DEVICE]      allocate 1 GiB chunks until the driver refuses, free every
//                                         other one, allocate again, destroy the context with the
//                                         rest, allocate again in a new one; cuMemGetInfo after each
//                                         KIND: plain (cuMemAlloc_v2, default), pitch, managed,
//                                         async, pool, vmm (cuMemCreate)
//   cuda_probe runtime-style [KIND]       the same, every entry point reached as the CUDA runtime
//                                         reaches them: dlopen("libcuda.so.1"), dlsym of
//                                         cuGetProcAddress_v2, then base names through it (with the
//                                         per-thread default stream flag)
//   cuda_probe dlsym-style [KIND]         the same through dlsym(dlopen("libcuda.so.1"), name)
//   cuda_probe alloc-threads THREADS      THREADS threads in one context allocate 256 MiB chunks
//                                         until refused
//   cuda_probe launch SECONDS KERNEL_US [runtime]   launch kernels of KERNEL_US on one stream for
//                                         SECONDS, synchronising every 8; the busy fraction is
//                                         kernel time / wall time
//   cuda_probe nvml                       3 GiB allocated on device 0, then NVML's memory reports
//   cuda_probe legacy                     the 32-bit cuMemAlloc, found with dlsym(RTLD_DEFAULT)
//   cuda_probe info                       cuInit, the device count, and whether dlsym(RTLD_NEXT,
//                                         "cuInit") from here finds what RTLD_DEFAULT finds
//
// Exit status 0 when the probe ran (whatever the limits did), 3 when cuInit failed, 2 on misuse.
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda_limiter/cuda_abi.h"

namespace {

using namespace gpupool::cuda_abi;  // NOLINT: the driver's constants

constexpr uint64_t kChunk = uint64_t{1} << 30;
constexpr int kMaxChunks = 1024;

// clang-format off
#define PROBE_FUNCTIONS(X)                                                                                \
  X(cuInit) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetDefaultMemPool) X(cuCtxCreate_v2)             \
  X(cuCtxDestroy_v2) X(cuCtxSetCurrent) X(cuMemAlloc_v2) X(cuMemAllocPitch_v2) X(cuMemAllocManaged) X(cuMemAllocAsync)       \
  X(cuMemAllocFromPoolAsync) X(cuMemFree_v2) X(cuMemFreeAsync) X(cuMemCreate) X(cuMemRelease)             \
  X(cuMemGetInfo_v2) X(cuStreamCreate) X(cuStreamSynchronize) X(cuLaunchKernel)
// clang-format on

struct Api {
#define PROBE_MEMBER(name) decltype(&::name) name = nullptr;
  PROBE_FUNCTIONS(PROBE_MEMBER)
#undef PROBE_MEMBER
};

// The base name the runtime asks cuGetProcAddress for ("cuMemAlloc_v2" -> "cuMemAlloc").
std::string BaseName(const char* name) {
  std::string base(name);
  if (base.size() > 3 && base.compare(base.size() - 3, 3, "_v2") == 0) base.resize(base.size() - 3);
  return base;
}

Api Direct() {
  Api api;
#define PROBE_DIRECT(name) api.name = &::name;
  PROBE_FUNCTIONS(PROBE_DIRECT)
#undef PROBE_DIRECT
  return api;
}

// Every entry point through dlopen + dlsym, or through cuGetProcAddress_v2 as the runtime does.
bool Loaded(bool through_get_proc_address, Api* api) {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) {
    std::printf("error=dlopen %s\n", dlerror());
    return false;
  }
  auto get_proc = reinterpret_cast<decltype(&::cuGetProcAddress_v2)>(dlsym(driver, "cuGetProcAddress_v2"));
  if (through_get_proc_address && get_proc == nullptr) return false;
  bool complete = true;
  auto resolve = [&](const char* name) -> void* {
    void* pointer = nullptr;
    if (!through_get_proc_address) {
      pointer = dlsym(driver, name);
    } else if (get_proc(BaseName(name).c_str(), &pointer, 12040, kProcAddressPerThreadStream, nullptr) !=
               kSuccess) {
      pointer = nullptr;
    }
    if (pointer == nullptr) complete = false;
    return pointer;
  };
#define PROBE_RESOLVE(name) api->name = reinterpret_cast<decltype(&::name)>(resolve(#name));
  PROBE_FUNCTIONS(PROBE_RESOLVE)
#undef PROBE_RESOLVE
  return complete;
}

int Init(const Api& api, int ordinal, CUcontext* context) {
  const CUresult init = api.cuInit(0);
  std::printf("init=%d\n", init);
  if (init != kSuccess) return 3;
  CUdevice device = 0;
  if (api.cuDeviceGet(&device, ordinal) != kSuccess || api.cuCtxCreate_v2(context, 0, device) != kSuccess) {
    std::printf("error=no context on device %d\n", ordinal);
    return 3;
  }
  return 0;
}

struct Chunk {
  uint64_t key = 0;
  uint64_t bytes = 0;
};

// One chunk of the kind; its key (pointer or handle) and size on success.
CUresult AllocateChunk(const Api& api, const std::string& kind, int device, CUstream stream, Chunk* chunk) {
  CUdeviceptr pointer = 0;
  CUresult result = kErrorInvalidValue;
  chunk->bytes = kChunk;
  if (kind == "plain") {
    result = api.cuMemAlloc_v2(&pointer, kChunk);
  } else if (kind == "pitch") {
    size_t pitch = 0;
    const size_t width = (size_t{1} << 20) + 100, height = 1024;  // the fake pads rows to 512 bytes
    result = api.cuMemAllocPitch_v2(&pointer, &pitch, width, height, 4);
    chunk->bytes = uint64_t{pitch} * height;
  } else if (kind == "managed") {
    result = api.cuMemAllocManaged(&pointer, kChunk, 1);
  } else if (kind == "async") {
    result = api.cuMemAllocAsync(&pointer, kChunk, stream);
  } else if (kind == "pool") {
    CUmemoryPool pool = nullptr;
    api.cuDeviceGetDefaultMemPool(&pool, device);
    result = api.cuMemAllocFromPoolAsync(&pointer, kChunk, pool, stream);
  } else if (kind == "vmm") {
    CUmemAllocationProp prop{};
    prop.type = 1;
    prop.location = CUmemLocation{kMemLocationDevice, device};
    CUmemGenericAllocationHandle handle = 0;
    result = api.cuMemCreate(&handle, kChunk, &prop, 0);
    pointer = handle;
  }
  chunk->key = pointer;
  return result;
}

CUresult FreeChunk(const Api& api, const std::string& kind, CUstream stream, const Chunk& chunk) {
  if (kind == "vmm") return api.cuMemRelease(chunk.key);
  if (kind == "async" || kind == "pool") return api.cuMemFreeAsync(chunk.key, stream);
  return api.cuMemFree_v2(chunk.key);
}

// Allocates until refused; prints <label>=bytes and <label>_error=the refusal.
uint64_t Fill(const Api& api, const std::string& kind, int device, CUstream stream, const char* label,
              std::vector<Chunk>* chunks) {
  uint64_t obtained = 0;
  CUresult result = kSuccess;
  for (int i = 0; i < kMaxChunks; ++i) {
    Chunk chunk;
    result = AllocateChunk(api, kind, device, stream, &chunk);
    if (result != kSuccess) break;
    chunks->push_back(chunk);
    obtained += chunk.bytes;
  }
  std::printf("%s=%llu\n%s_error=%d\n", label, static_cast<unsigned long long>(obtained), label, result);
  return obtained;
}

void PrintInfo(const Api& api, const char* label) {
  size_t free_bytes = 0, total_bytes = 0;
  const CUresult result = api.cuMemGetInfo_v2(&free_bytes, &total_bytes);
  std::printf("%s_result=%d\n%s_free=%zu\n%s_total=%zu\n", label, result, label, free_bytes, label,
              total_bytes);
}

int Alloc(const Api& api, const std::string& kind, int device) {
  CUcontext context = nullptr;
  if (const int status = Init(api, device, &context); status != 0) return status;
  CUstream stream = nullptr;
  std::vector<Chunk> chunks;
  Fill(api, kind, device, stream, "obtained", &chunks);
  PrintInfo(api, "info");
  uint64_t freed = 0;
  std::vector<Chunk> kept;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (i % 2 == 0 && FreeChunk(api, kind, stream, chunks[i]) == kSuccess) {
      freed += chunks[i].bytes;
    } else {
      kept.push_back(chunks[i]);
    }
  }
  std::printf("freed=%llu\n", static_cast<unsigned long long>(freed));
  Fill(api, kind, device, stream, "reobtained", &kept);
  PrintInfo(api, "final");
  // The context goes with what is left in it (VMM handles are not a context's: they stay).
  std::printf("destroy=%d\n", api.cuCtxDestroy_v2(context));
  CUdevice cu_device = 0;
  api.cuDeviceGet(&cu_device, device);
  if (api.cuCtxCreate_v2(&context, 0, cu_device) != kSuccess) return 3;
  std::vector<Chunk> after;
  Fill(api, kind, device, stream, "after_destroy", &after);
  return 0;
}

// Allocates 1 GiB chunks on device 0 until BYTES are held or the driver refuses; prints held= and
// the refusal. With `wait`, then prints ready=1 and holds them until killed (no free, no exit).
int Hold(const Api& api, uint64_t bytes, bool wait) {
  CUcontext context = nullptr;
  if (const int status = Init(api, 0, &context); status != 0) return status;
  uint64_t held = 0;
  CUresult result = kSuccess;
  while (held + kChunk <= bytes) {
    CUdeviceptr pointer = 0;
    result = api.cuMemAlloc_v2(&pointer, kChunk);
    if (result != kSuccess) break;
    held += kChunk;
  }
  std::printf("held=%llu\nheld_error=%d\n", static_cast<unsigned long long>(held), result);
  PrintInfo(api, "info");
  if (!wait) return 0;
  std::printf("ready=1\n");
  std::fflush(stdout);
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// THREADS threads share one context and allocate 256 MiB chunks until refused.
int AllocThreads(const Api& api, int threads) {
  CUcontext context = nullptr;
  if (const int status = Init(api, 0, &context); status != 0) return status;
  std::atomic<uint64_t> obtained{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      api.cuCtxSetCurrent(context);
      for (int i = 0; i < kMaxChunks; ++i) {
        CUdeviceptr pointer = 0;
        if (api.cuMemAlloc_v2(&pointer, kChunk / 4) != kSuccess) break;
        obtained += kChunk / 4;
      }
    });
  }
  for (std::thread& worker : workers) worker.join();
  std::printf("threads_obtained=%llu\n", static_cast<unsigned long long>(obtained.load()));
  PrintInfo(api, "info");
  return 0;
}

double Seconds(std::chrono::steady_clock::duration duration) {
  return std::chrono::duration<double>(duration).count();
}

int Launch(const Api& api, double seconds, uint32_t kernel_us) {
  CUcontext context = nullptr;
  if (const int status = Init(api, 0, &context); status != 0) return status;
  CUstream stream = nullptr;
  if (api.cuStreamCreate(&stream, 0) != kSuccess) return 3;
  uint32_t parameter = kernel_us;
  void* params[] = {&parameter};
  auto function = reinterpret_cast<CUfunction>(uintptr_t{0x1000});
  const auto start = std::chrono::steady_clock::now();
  uint64_t launches = 0;
  CUresult result = kSuccess;
  while (Seconds(std::chrono::steady_clock::now() - start) < seconds) {
    result = api.cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, stream, params, nullptr);
    if (result != kSuccess) break;
    if (++launches % 8 == 0) api.cuStreamSynchronize(stream);
  }
  api.cuStreamSynchronize(stream);
  const double wall = Seconds(std::chrono::steady_clock::now() - start);
  const double kernel = static_cast<double>(launches) * kernel_us / 1e6;
  std::printf("launch_result=%d\nlaunches=%llu\nkernel_s=%.6f\nwall_s=%.6f\nbusy_fraction=%.4f\n", result,
              static_cast<unsigned long long>(launches), kernel, wall, wall > 0 ? kernel / wall : 0.0);
  return 0;
}

int Nvml() {
  void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (nvml == nullptr) {
    std::printf("error=dlopen %s\n", dlerror());
    return 2;
  }
  using Init = int (*)();
  using HandleByIndex = int (*)(unsigned, nvmlDevice_t*);
  auto init = reinterpret_cast<Init>(dlsym(nvml, "nvmlInit_v2"));
  auto by_index = reinterpret_cast<HandleByIndex>(dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2"));
  auto info = reinterpret_cast<decltype(&::nvmlDeviceGetMemoryInfo)>(dlsym(nvml, "nvmlDeviceGetMemoryInfo"));
  auto info_v2 =
      reinterpret_cast<decltype(&::nvmlDeviceGetMemoryInfo_v2)>(dlsym(nvml, "nvmlDeviceGetMemoryInfo_v2"));
  nvmlDevice_t device = nullptr;
  if (init == nullptr || by_index == nullptr || info == nullptr || info_v2 == nullptr || init() != 0 ||
      by_index(0, &device) != 0) {
    std::printf("error=nvml\n");
    return 2;
  }
  const Api api = Direct();
  CUcontext context = nullptr;
  if (const int status = ::Init(api, 0, &context); status != 0) return status;
  for (int i = 0; i < 3; ++i) {
    CUdeviceptr pointer = 0;
    if (api.cuMemAlloc_v2(&pointer, kChunk) != kSuccess) return 3;
  }
  nvmlMemory_t memory{};
  std::printf("nvml_result=%d\n", info(device, &memory));
  std::printf("nvml_total=%llu\nnvml_used=%llu\nnvml_free=%llu\n", memory.total, memory.used, memory.free);
  nvmlMemory_v2_t memory_v2{};
  memory_v2.version = (2U << 24U) | static_cast<unsigned>(sizeof(memory_v2));
  std::printf("nvml_v2_result=%d\n", info_v2(device, &memory_v2));
  std::printf("nvml_v2_total=%llu\nnvml_v2_used=%llu\nnvml_v2_free=%llu\n", memory_v2.total, memory_v2.used,
              memory_v2.free);
  return 0;
}

int Legacy() {
  const Api api = Direct();
  CUcontext context = nullptr;
  if (const int status = Init(api, 0, &context); status != 0) return status;
  auto legacy = reinterpret_cast<decltype(&::cuMemAlloc)>(dlsym(RTLD_DEFAULT, "cuMemAlloc"));
  if (legacy == nullptr) {
    std::printf("legacy=absent\n");
    return 0;
  }
  unsigned pointer = 0;
  std::printf("legacy=%d\n", legacy(&pointer, 1U << 20));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const std::string kind = argc > 2 ? argv[2] : "plain";
  if (mode == "alloc") return Alloc(Direct(), kind, argc > 3 ? std::atoi(argv[3]) : 0);
  if (mode == "runtime-style" || mode == "dlsym-style") {
    Api api;
    if (!Loaded(mode == "runtime-style", &api)) {
      std::printf("error=an entry point was not found\n");
      return 2;
    }
    return Alloc(api, kind, 0);
  }
  if (mode == "launch" && argc >= 4) {
    Api api = Direct();
    if (argc > 4 && std::strcmp(argv[4], "runtime") == 0 && !Loaded(true, &api)) return 2;
    return Launch(api, std::atof(argv[2]), static_cast<uint32_t>(std::strtoul(argv[3], nullptr, 10)));
  }
  if (mode == "hold" && argc >= 3)
    return Hold(Direct(), std::strtoull(argv[2], nullptr, 10), argc > 3 && std::strcmp(argv[3], "wait") == 0);
  if (mode == "alloc-threads")
    return AllocThreads(Direct(), std::max(1, std::min(64, std::atoi(kind.c_str()))));
  if (mode == "nvml") return Nvml();
  if (mode == "legacy") return Legacy();
  if (mode == "info") {
    const Api api = Direct();
    const CUresult init = api.cuInit(0);
    int count = 0;
    api.cuDeviceGetCount(&count);
    // dlsym(RTLD_NEXT) searches after its caller (this program): an interposed dlsym must keep that.
    const bool same = dlsym(RTLD_NEXT, "cuInit") == dlsym(RTLD_DEFAULT, "cuInit");
    std::printf("init=%d\ndevices=%d\nrtld_next_same=%d\n", init, count, same ? 1 : 0);
    return init == kSuccess ? 0 : 3;
  }
  std::fprintf(stderr,
               "usage: cuda_probe alloc|runtime-style|dlsym-style [KIND] | launch SECONDS KERNEL_US | nvml | "
               "legacy | info\n");
  return 2;
}
