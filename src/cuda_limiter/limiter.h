// The accounting and pacing of libgpupool-cuda.so (docs/cuda_limiter.md), without any I/O: the
// limits read from the task's environment, the per-device memory ledger, and the compute pacer's
// sliding window. preload*.cc do the interposing; everything here is tested on its own
// (limiter_test.cc), with a clock the caller injects.
#ifndef GPUPOOL_CUDA_LIMITER_LIMITER_H_
#define GPUPOOL_CUDA_LIMITER_LIMITER_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace gpupool::cuda_limiter {

inline constexpr size_t kMaxDevices = 64;
inline constexpr uint64_t kNoMemoryCap = UINT64_MAX;
inline constexpr uint64_t kMaxMemoryBytes = uint64_t{1} << 50;  // 1 PiB: larger is a typo
inline constexpr uint32_t kFullShareMilli = 1000;
inline constexpr size_t kMaxEnvLength = 4096;

inline constexpr const char* kMemoryEnv = "GPUPOOL_GPU_MEMORY_BYTES";
inline constexpr const char* kSharesEnv = "GPUPOOL_GPU_SHARES_MILLI";

// The limits file (docs/cuda_limiter.md "In containers"): when it exists the limits and the
// ledger's path are read from it, and the environment's GPUPOOL_GPU_MEMORY_BYTES,
// GPUPOOL_GPU_SHARES_MILLI and GPUPOOL_CUDA_LEDGER are ignored. The path is fixed at build time;
// only a test build of the library (GPUPOOL_CUDA_LIMITS_FILE_FOR_TESTS) puts it elsewhere.
#ifdef GPUPOOL_CUDA_LIMITS_FILE_FOR_TESTS
inline constexpr const char* kLimitsFile = GPUPOOL_CUDA_LIMITS_FILE_FOR_TESTS;
#else
inline constexpr const char* kLimitsFile = "/run/gpupool/cuda-limits";
#endif
// Two full lists, the ledger's path and the keys fit.
inline constexpr size_t kMaxLimitsFileBytes = 3 * kMaxEnvLength;
inline constexpr const char* kLimitsFileMemoryKey = "memory_bytes";
inline constexpr const char* kLimitsFileSharesKey = "shares_milli";
inline constexpr const char* kLimitsFileLedgerKey = "ledger";

// What the agent allows a task on each visible device ordinal. A list that is absent (or empty)
// sets nothing; a list that is given covers ordinals 0..size-1, and an ordinal past it gets
// nothing (memory cap 0 bytes, share 1), so a task never gains from a short list.
struct Limits {
  std::vector<uint64_t> memory_bytes;  // bytes per ordinal; 0 = no cap on that ordinal
  std::vector<uint32_t> shares_milli;  // 1..1000 per ordinal; 1000 = no pacing

  bool HasMemoryCaps() const { return !memory_bytes.empty(); }
  bool HasPacing() const;
  // The cap in bytes, kNoMemoryCap when the ordinal has none.
  uint64_t MemoryCap(int device) const;
  // 1..1000; 1000 when the ordinal is not paced.
  uint32_t ShareMilli(int device) const;
  // How many ordinals the given lists cover (the longest); 0 when neither is given.
  size_t ListedDevices() const;
};

struct LimitsOrError {
  std::optional<Limits> limits;  // set when the environment is well formed
  std::string error;             // one line saying what is wrong, otherwise
};

// Parses the two variables' values (null: unset). Strict: decimal digits only, comma separated,
// no empty entries, at most kMaxDevices entries, memory at most kMaxMemoryBytes, shares 1..1000,
// both lists (when both are given) of one length, each value at most kMaxEnvLength characters.
LimitsOrError ParseLimits(const char* memory_bytes, const char* shares_milli);

// Parses the limits file's contents: exactly three lines, each "key=value\n", the keys
// memory_bytes, shares_milli and ledger once each in any order; the first two values are what the
// two variables carry (empty: none of that kind), ledger is an absolute path or empty (none).
// Anything else (an unknown or repeated key, a missing one, a NUL, a CR, no final newline, more
// than kMaxLimitsFileBytes) is an error. *ledger is set to the ledger's path on success.
LimitsOrError ParseLimitsFile(std::string_view text, std::string* ledger);

// The key of a recorded allocation: a device pointer (cuMemAlloc and relatives) or a VMM handle
// (cuMemCreate); the two spaces are separate.
struct AllocationKey {
  enum class Kind : uint8_t { kPointer, kHandle };
  Kind kind = Kind::kPointer;
  uint64_t value = 0;
  bool operator==(const AllocationKey&) const = default;
};

struct MemoryReport {
  uint64_t total = 0;
  uint64_t free = 0;
  uint64_t used = 0;
};

class SharedLedger;  // shared_ledger.h

// Why the last refused reservation on a capped device was refused, beyond the cap itself.
enum class LedgerProblem : int { kNone, kNoSlot, kCorrupt };

// Bytes in use per device against its cap. An allocation is reserved before the driver is called
// (so two threads cannot both pass the check for the last bytes) and then recorded under its key,
// or unreserved when the driver refused. Devices outside 0..kMaxDevices-1 are refused.
// With a SharedLedger (the task's file, GPUPOOL_CUDA_LEDGER), a capped device's bytes are also
// charged there, and the cap holds for the task's processes together; the allocations themselves
// stay this process's. Thread-safe: every method takes the ledger's own mutex.
class MemoryLedger {
 public:
  // shared: borrowed, outlives the ledger; null: the caps are this process's alone.
  explicit MemoryLedger(const Limits& limits, SharedLedger* shared = nullptr);

  // Adds bytes to the device's use when that stays within its cap; false (nothing added) otherwise.
  bool Reserve(int device, uint64_t bytes);
  // Takes back a reservation whose allocation did not happen.
  void Unreserve(int device, uint64_t bytes);
  // The driver refused an allocation that was within the device's cap for want of memory: counted
  // in the shared ledger (pressure), when there is one and the device has a cap.
  void NotePressure(int device);
  // Records reserved bytes as an allocation under key, made in context owner (0: none). A key
  // recorded already (a free the ledger missed) is released first.
  void Record(AllocationKey key, int device, uint64_t bytes, uint64_t owner);
  // Releases the allocation under key; false when the ledger never recorded it.
  bool Release(AllocationKey key);
  // Releases every allocation made in context owner (the context was destroyed); returns bytes.
  uint64_t ReleaseOwner(uint64_t owner);

  // The task's use with a shared ledger and a cap on device; this process's otherwise.
  uint64_t Used(int device) const;
  uint64_t Cap(int device) const;
  // Why the shared ledger refused the last reservation that failed (kNone: the cap), then kNone.
  LedgerProblem TakeProblem() { return problem_.exchange(LedgerProblem::kNone); }

  // Around fork (pthread_atfork): the ledger's mutex is held across it, and the child starts with
  // nothing of the parent's (its allocations are the parent's; it takes its own shared slot).
  void BeforeFork();
  void AfterForkInParent();
  void AfterForkInChild();
  // What the device reports to the task: with a cap, total = cap, used = the task's use and free =
  // what is left of the cap, never more than the device really has free; without one, the real
  // figures.
  MemoryReport Report(int device, uint64_t real_free, uint64_t real_total) const;

 private:
  struct Entry {
    int device;
    uint64_t bytes;
    uint64_t owner;
  };
  struct KeyHash {
    size_t operator()(const AllocationKey& key) const noexcept {
      return std::hash<uint64_t>()(key.value) ^ static_cast<size_t>(key.kind);
    }
  };
  static bool Valid(int device) { return device >= 0 && static_cast<size_t>(device) < kMaxDevices; }
  void SubtractLocked(int device, uint64_t bytes);  // REQUIRES: mutex_ held

  std::array<uint64_t, kMaxDevices> cap_{};
  std::array<uint64_t, kMaxDevices> used_{};                   // GUARDED_BY(mutex_)
  std::unordered_map<AllocationKey, Entry, KeyHash> entries_;  // GUARDED_BY(mutex_)
  SharedLedger* shared_;                                        // GUARDED_BY(mutex_) (its calls)
  std::atomic<LedgerProblem> problem_{LedgerProblem::kNone};
  mutable std::mutex mutex_;
};

// Monotonic nanoseconds. Injected so the pacer's arithmetic is tested without real time.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t NowNs() const = 0;
};

// std::chrono::steady_clock.
class SteadyClock final : public Clock {
 public:
  int64_t NowNs() const override;
};

// A window shared by the processes of one task (the ledger file's, shared_ledger.h), so that the
// share is the task's, not each process's: kSharedWindowBuckets words per device, each a bucket's
// absolute index (its low kWindowTagBits bits) above the busy nanoseconds completed in it (at
// most 2^kWindowBusyBits - 1). Updated with compare-and-swap only; a word whose bucket has left the
// window is stale and the next bucket to need the slot takes it over.
inline constexpr int kSharedWindowBuckets = 20;
inline constexpr int kWindowBusyBits = 42;
inline constexpr int kWindowTagBits = 64 - kWindowBusyBits;

struct PacerOptions {
  int64_t window_ns = 1'000'000'000;  // the sliding window
  int buckets = 20;                   // its resolution: 50 ms buckets by default
  // The window starts as if the share had been used evenly over it, so a new process is paced
  // smoothly from its first launch rather than allowed the whole budget at once (after which the
  // budget would come back all at once a window later, and again, in bursts).
  bool start_full = true;
  // The task's shared window for this device (kSharedWindowBuckets words; `buckets` is then
  // kSharedWindowBuckets), or null: the window is this process's alone. Every process of the task
  // must use the same window_ns. Shared, the window starts full only when it is empty (the first
  // process of the task, or one after a whole idle window).
  std::atomic<uint64_t>* shared_window = nullptr;
};

// Compute pacing for one device at a share s (milli-GPU) of its time. The GPU time of the task's
// kernels, measured by the caller and reported when each completes, is summed in buckets over a
// sliding window; a launch may go when the window's busy time, plus an estimate of the launches
// still in flight and of the launch itself, stays within s/1000 x window. Otherwise the caller
// waits the returned delay: the time until enough old buckets leave the window. A launch with
// nothing in the window and nothing in flight always goes, so a single kernel longer than the
// whole budget still runs (it cannot be split; it just pushes the next launches further out).
//
// Completed time goes into the bucket of the moment it is reported, never earlier, so the window
// never forgets busy time sooner than it should. A window that has emptied (the task was idle for
// a whole window) allows the whole budget again at once: the bound is per window, not per bucket.
// With a shared window (PacerOptions::shared_window) the busy time in the window is the task's:
// every process adds what completes to the shared buckets and reads the others' before deciding.
// What is still in flight is estimated from this process's own launches only, so a task's
// processes can overshoot by what the others have in flight.
//
// Not thread-safe: the caller serialises.
class ComputePacer {
 public:
  ComputePacer(uint32_t share_milli, PacerOptions options, const Clock& clock);

  bool paced() const { return share_milli_ < kFullShareMilli; }
  int64_t budget_ns() const { return budget_ns_; }
  int64_t bucket_ns() const { return bucket_ns_; }
  int inflight() const { return inflight_; }
  // Mean GPU time of recent launches (exponentially weighted, 1/8), 0 before the first.
  int64_t EstimatedLaunchNs() const { return estimate_ns_; }

  // A timed launch went out.
  void OnLaunch() { ++inflight_; }
  // A timed launch completed after busy_ns of GPU time (clamped to 0..1 hour).
  void OnComplete(int64_t busy_ns);
  // A timed launch whose time will never be known (its events failed).
  void OnAbandon();

  // Nanoseconds to wait, from now, before the next launch; 0: launch now.
  int64_t DelayBeforeLaunch();
  // Completed busy time inside the window now.
  int64_t BusyInWindow();

 private:
  void Advance(int64_t now_ns);
  // Shared window: the buckets of the window ending at bucket `index`, read into buckets_ and sum_.
  void LoadShared(int64_t index);
  // Shared window: adds busy_ns to bucket `index` (dropped when a newer bucket holds its slot: it
  // has left the window already).
  void AddShared(int64_t index, int64_t busy_ns);

  const Clock& clock_;
  std::atomic<uint64_t>* shared_ = nullptr;
  uint32_t share_milli_;
  int64_t bucket_ns_;
  int64_t budget_ns_;
  std::vector<int64_t> buckets_;  // ring: absolute bucket b lives at b % size
  int64_t current_ = 0;           // absolute index of the newest bucket
  int64_t sum_ = 0;               // total of buckets_
  int inflight_ = 0;
  int64_t estimate_ns_ = 0;
};

}  // namespace gpupool::cuda_limiter

#endif  // GPUPOOL_CUDA_LIMITER_LIMITER_H_
