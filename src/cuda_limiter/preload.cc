// libgpupool-cuda.so, preloaded into a fractional GPU task (docs/cuda_limiter.md): the process-wide
// state, the real driver, the interposed dlsym and cuGetProcAddress, and cuInit. The memory entry
// points are in preload_memory.cc, compute pacing and NVML in preload_launch.cc, the arithmetic in
// limiter.cc.
//
// Every exported function is a C entry point called by code that knows nothing of us: none may
// throw, abort or print more than one line, and each falls back to the driver's own answer where
// the limits have nothing to say.
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "cuda_limiter/preload_internal.h"

namespace gpupool::cuda_limiter::preload {
namespace {

using namespace gpupool::cuda_abi;  // NOLINT: the driver's constants

using DlsymFn = void* (*)(void*, const char*);

// Storage for an object that is built on first use and never destroyed.
template <typename T>
class Forever {
 public:
  template <typename... Args>
  explicit Forever(Args&&... args) {
    new (storage_) T(std::forward<Args>(args)...);
  }
  T& get() { return *std::launder(reinterpret_cast<T*>(storage_)); }

 private:
  alignas(T) unsigned char storage_[sizeof(T)];
};

constexpr const char* kDriverLibrary = "libcuda.so.1";
constexpr const char* kNvmlLibrary = "libnvidia-ml.so.1";

#define GPUPOOL_NAME(name) #name,
constexpr const char* kNames[kFnCount] = {GPUPOOL_WRAPPED_FUNCTIONS(GPUPOOL_NAME)
                                              GPUPOOL_CALLED_FUNCTIONS(GPUPOOL_NAME)};
#undef GPUPOOL_NAME

// Our wrapper of a wrapped entry point.
void* Wrapper(Fn fn) {
  switch (fn) {
#define GPUPOOL_CASE(name) \
  case k_##name: return reinterpret_cast<void*>(&::name);
    GPUPOOL_WRAPPED_FUNCTIONS(GPUPOOL_CASE)
#undef GPUPOOL_CASE
    default: return nullptr;
  }
}

void* NullDlsym(void*, const char*) {
  return nullptr;
}

}  // namespace
}  // namespace gpupool::cuda_limiter::preload

// ---- dlsym ---------------------------------------------------------------------------------------
// The real dlsym finds the object that called it from its return address (RTLD_NEXT searches after
// that object; RTLD_DEFAULT searches its scope). A wrapper that calls it would make every lookup
// look as if it came from this library, and a dlsym(RTLD_NEXT, ...) inside another interposer would
// find that interposer again, forever. So on x86-64 dlsym is a small stub: it asks the hook whether
// the lookup is one of ours and otherwise jumps (not calls) to the real dlsym, which then sees the
// original caller. Elsewhere a plain wrapper is used, with that caveat (docs/cuda_limiter.md).
extern "C" {
__attribute__((visibility("hidden"))) void* gpupool_real_dlsym = nullptr;  // set before any jump
__attribute__((visibility("hidden"), used)) void* gpupool_dlsym_hook(void* handle, const char* name) noexcept;
}

#if defined(__x86_64__)
#if defined(__CET__)
#define GPUPOOL_ENDBR "endbr64\n"
#else
#define GPUPOOL_ENDBR ""
#endif
asm(".text\n"
    ".globl dlsym\n"
    ".type dlsym, @function\n"
    ".p2align 4\n"
    "dlsym:\n"
    ".cfi_startproc\n" GPUPOOL_ENDBR
    "pushq %rdi\n"
    ".cfi_adjust_cfa_offset 8\n"
    "pushq %rsi\n"
    ".cfi_adjust_cfa_offset 8\n"
    "subq $8, %rsp\n"
    ".cfi_adjust_cfa_offset 8\n"
    "call gpupool_dlsym_hook\n"
    "addq $8, %rsp\n"
    ".cfi_adjust_cfa_offset -8\n"
    "popq %rsi\n"
    ".cfi_adjust_cfa_offset -8\n"
    "popq %rdi\n"
    ".cfi_adjust_cfa_offset -8\n"
    "testq %rax, %rax\n"
    "jnz 1f\n"
    "jmpq *gpupool_real_dlsym(%rip)\n"
    "1:\n"
    "ret\n"
    ".cfi_endproc\n"
    ".size dlsym, .-dlsym\n");
#else
GPUPOOL_EXPORT void* dlsym(void* __restrict handle, const char* __restrict name) noexcept {
  if (void* wrapper = gpupool_dlsym_hook(handle, name); wrapper != nullptr) return wrapper;
  return reinterpret_cast<gpupool::cuda_limiter::preload::DlsymFn>(gpupool_real_dlsym)(handle, name);
}
#endif

namespace gpupool::cuda_limiter::preload {
namespace {

DlsymFn RealDlsym() {
  void* real = __atomic_load_n(&gpupool_real_dlsym, __ATOMIC_ACQUIRE);
  if (real == nullptr) {
    real = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (real == nullptr) real = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (real == nullptr) real = reinterpret_cast<void*>(&NullDlsym);
    __atomic_store_n(&gpupool_real_dlsym, real, __ATOMIC_RELEASE);
  }
  return reinterpret_cast<DlsymFn>(real);
}

}  // namespace
}  // namespace gpupool::cuda_limiter::preload

// Our wrapper when `name` is one we wrap and the lookup in `handle` would find the real driver's
// (or NVML's, or libc's dlsym) entry point; null (the real dlsym decides) otherwise. It never
// loads a library: it only looks at those already loaded.
void* gpupool_dlsym_hook(void* handle, const char* name) noexcept {
  using namespace gpupool::cuda_limiter::preload;  // NOLINT
  const DlsymFn real = RealDlsym();
  if (name == nullptr || handle == RTLD_DEFAULT || handle == RTLD_NEXT) return nullptr;
  const bool cuda = name[0] == 'c' && name[1] == 'u';
  const bool nvml = std::strncmp(name, "nvml", 4) == 0;
  if (!cuda && !nvml) {
    if (std::strcmp(name, "dlsym") != 0) return nullptr;
    return real(handle, name) == reinterpret_cast<void*>(real) ? reinterpret_cast<void*>(&::dlsym) : nullptr;
  }
  void* wrapper = nullptr;
  if (nvml) {
    if (std::strcmp(name, "nvmlDeviceGetMemoryInfo") == 0)
      wrapper = reinterpret_cast<void*>(&::nvmlDeviceGetMemoryInfo);
    if (std::strcmp(name, "nvmlDeviceGetMemoryInfo_v2") == 0) {
      wrapper = reinterpret_cast<void*>(&::nvmlDeviceGetMemoryInfo_v2);
    }
  } else {
    for (int fn = 0; fn < kWrappedCount && wrapper == nullptr; ++fn) {
      if (std::strcmp(name, kNames[fn]) == 0) wrapper = Wrapper(static_cast<Fn>(fn));
    }
  }
  if (wrapper == nullptr) return nullptr;
  void* library = dlopen(nvml ? kNvmlLibrary : kDriverLibrary, RTLD_NOW | RTLD_NOLOAD);
  if (library == nullptr) return nullptr;
  void* genuine = real(library, name);
  dlclose(library);
  if (genuine == nullptr || real(handle, name) != genuine) return nullptr;
  return wrapper;
}

namespace gpupool::cuda_limiter::preload {

void* LookUp(void* handle, const char* name) {
  return RealDlsym()(handle, name);
}

const Driver& RealDriver() {
  static const Driver driver = [] {  // trivially destructible: still there during exit
    Driver d;
    const DlsymFn real = RealDlsym();
    d.handle = dlopen(kDriverLibrary, RTLD_NOW | RTLD_LOCAL);
    if (d.handle != nullptr) {
      for (int fn = 0; fn < kFnCount; ++fn) d.fn[static_cast<size_t>(fn)] = real(d.handle, kNames[fn]);
    }
    return d;
  }();
  return driver;
}

namespace {

// The limits, and the ledger's path in *ledger_path: from the limits file when it exists (the
// environment is then not read for either), from the environment when it does not. The file is
// the runtime's, bound read-only into a container, but read as hostile: a regular file, not a
// link, writable by nobody, at most kMaxLimitsFileBytes, strictly formed; anything else is an
// error, which refuses CUDA in the process.
LimitsOrError ReadLimits(std::string* ledger_path) {
  LimitsOrError result;
  const std::string file = kLimitsFile;
  const int fd = ::open(kLimitsFile, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      const char* ledger = std::getenv(kLedgerEnv);
      *ledger_path = ledger == nullptr ? "" : ledger;
      return ParseLimits(std::getenv(kMemoryEnv), std::getenv(kSharesEnv));
    }
    result.error = file + " cannot be opened: " + std::strerror(errno);
    return result;
  }
  struct stat st;
  std::string text;
  if (::fstat(fd, &st) != 0) {
    result.error = file + " cannot be read: " + std::strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    result.error = file + " is not a regular file";
  } else if ((st.st_mode & 0222) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    result.error = file + " is writable (mode " + mode + "); it must be writable by nobody (0444)";
  } else if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) > kMaxLimitsFileBytes) {
    result.error = file + " is longer than " + std::to_string(kMaxLimitsFileBytes) + " bytes";
  } else {
    text.resize(kMaxLimitsFileBytes + 1);  // one more: a file that grew since is still caught
    size_t got = 0;
    while (got < text.size()) {
      const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        result.error = file + " cannot be read: " + std::strerror(errno);
        break;
      }
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
    text.resize(got);
  }
  ::close(fd);
  if (!result.error.empty()) return result;
  return ParseLimitsFile(text, ledger_path);
}

// The task's ledger file when one is named (ledger_path) and there are caps or shares to share; null
// otherwise, with *error set when it names one that cannot be used.
std::unique_ptr<SharedLedger> OpenSharedLedger(const std::string& path, const Limits& limits, std::string* error) {
  if (path.empty() || (!limits.HasMemoryCaps() && !limits.HasPacing())) return nullptr;
  return SharedLedger::Open(path.c_str(), error);
}

void LedgerBeforeFork() {
  State().ledger.BeforeFork();
}
void LedgerAfterForkInParent() {
  State().ledger.AfterForkInParent();
}
void LedgerAfterForkInChild() {
  State().ledger.AfterForkInChild();
}

}  // namespace

Process::Process()
    : parsed(ReadLimits(&ledger_path)),
      limits(parsed.limits.value_or(Limits{})),
      shared(OpenSharedLedger(ledger_path, limits, &ledger_error)),
      ledger(limits, shared.get()) {
  if (!parsed.limits) {
    refused.store(true);
    refusal = parsed.error;
  } else if (!ledger_error.empty()) {
    // Without the task's ledger the cap would be this process's alone: CUDA is refused instead.
    refused.store(true);
    refusal = ledger_error;
  }
  if (shared != nullptr) pthread_atfork(&LedgerBeforeFork, &LedgerAfterForkInParent, &LedgerAfterForkInChild);
  const size_t listed = std::min(limits.ListedDevices(), kMaxDevices);
  for (size_t device = 0; device < listed; ++device) {
    const uint32_t share = limits.ShareMilli(static_cast<int>(device));
    if (share >= kFullShareMilli) continue;
    // With the task's ledger the window is the task's: its processes together keep to the share.
    PacerOptions options;
    options.shared_window = shared != nullptr ? shared->Window(static_cast<int>(device)) : nullptr;
    pacing[device].pacer.emplace(share, options, clock);
  }
}

Process& State() {
  static Forever<Process> process;
  return process.get();
}

bool Reserve(Process& process, int device, uint64_t bytes) noexcept {
  if (process.ledger.Reserve(device, bytes)) return true;
  const LedgerProblem problem = process.ledger.TakeProblem();
  if (problem != LedgerProblem::kNone && !process.ledger_problem_printed.exchange(true)) {
    try {
      PrintError(std::string(kLedgerEnv) + " (" + process.shared->path() + "): " +
                 (problem == LedgerProblem::kNoSlot
                      ? "all " + std::to_string(kLedgerSlots) + " process slots are held by live processes"
                      : std::string("the file is damaged (a negative total)")) +
                 "; CUDA allocations are refused in this process (CUDA_ERROR_OUT_OF_MEMORY)");
    } catch (...) {
    }
  }
  return false;
}

void PrintError(const std::string& line) noexcept {
  try {
    const std::string text = "gpupool-cuda: " + line + "\n";
    const ssize_t written = ::write(STDERR_FILENO, text.data(), text.size());
    (void)written;  // nothing more can be done about a closed stderr
  } catch (...) {
    // Out of memory: the refusal itself still stands.
  }
}

bool Refused() noexcept {
  Process& process = State();
  if (!process.refused.load(std::memory_order_acquire)) return false;
  if (!process.refusal_printed.exchange(true)) {
    std::lock_guard<std::mutex> lock(process.refusal_mutex);
    try {
      PrintError(process.refusal +
                 "; CUDA is refused in this process (cuInit returns CUDA_ERROR_NOT_INITIALIZED)");
    } catch (...) {
    }
  }
  return true;
}

void Refuse(const std::string& reason) noexcept {
  Process& process = State();
  {
    std::lock_guard<std::mutex> lock(process.refusal_mutex);
    try {
      if (!process.refused.load()) process.refusal = reason;
    } catch (...) {
    }
    process.refused.store(true, std::memory_order_release);
  }
  Refused();
}

namespace {

// The state is read when the library is loaded, before the program can change its environment.
__attribute__((constructor)) void ReadLimitsAtLoad() {
  State();
}

// Our wrapper for a real entry point handed out by cuGetProcAddress, or the pointer unchanged.
void* Substitute(void* pointer) {
  if (pointer == nullptr) return nullptr;
  const Driver& driver = RealDriver();
  for (int fn = 0; fn < kWrappedCount; ++fn) {
    if (driver.fn[static_cast<size_t>(fn)] == pointer) return Wrapper(static_cast<Fn>(fn));
  }
  return pointer;
}

}  // namespace
}  // namespace gpupool::cuda_limiter::preload

namespace preload = gpupool::cuda_limiter::preload;
using namespace gpupool::cuda_abi;  // NOLINT: the driver's constants

GPUPOOL_EXPORT CUresult cuInit(unsigned flags) {
  if (preload::Refused()) return kErrorNotInitialized;
  auto init = GPUPOOL_REAL(cuInit);
  auto count = GPUPOOL_REAL(cuDeviceGetCount);
  if (init == nullptr || count == nullptr) return kErrorNotInitialized;
  if (const CUresult result = init(flags); result != kSuccess) return result;
  const size_t listed = preload::State().limits.ListedDevices();
  int devices = 0;
  if (listed > 0 && count(&devices) == kSuccess && static_cast<size_t>(devices) > listed) {
    std::string reason;  // empty if even this cannot be said
    try {
      reason = "the task sees " + std::to_string(devices) + " devices but the limits list " +
               std::to_string(listed);
    } catch (...) {
    }
    preload::Refuse(reason);
    return kErrorNotInitialized;
  }
  return kSuccess;
}

GPUPOOL_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  GPUPOOL_REAL_OR_FAIL(real, cuGetProcAddress);
  const CUresult result = real(symbol, pfn, version, flags);
  if (result == kSuccess && pfn != nullptr) *pfn = preload::Substitute(*pfn);
  return result;
}

GPUPOOL_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                            int* status) {
  GPUPOOL_REAL_OR_FAIL(real, cuGetProcAddress_v2);
  const CUresult result = real(symbol, pfn, version, flags, status);
  if (result == kSuccess && pfn != nullptr) *pfn = preload::Substitute(*pfn);
  return result;
}
