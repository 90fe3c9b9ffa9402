// The memory use of all of a task's processes in one file, and their compute time (docs/cuda_limiter.md, "One ledger for the
// task"): the agent names it in GPUPOOL_CUDA_LEDGER, every process of the task maps it MAP_SHARED,
// and each device's cap is then the task's, not each process's.
//
// The file holds, per device, the task's total (what the cap is checked against) and a fixed number
// of per-process slots, each naming its process (pid and start time) and what it holds per device.
// A reservation is a compare-and-swap on the total against the cap, then an addition to the slot; a
// refund takes from the slot, then from the total. A slot whose process has died is reclaimed by the
// next process that needs a slot or finds the cap reached: its bytes leave the total. Every change
// that could be cut short by a kill leaves the total too high, never too low, so an interrupted
// process can only leak (fail closed), never grant more.
//
// It also counts, per device, the allocations within the task's cap that the driver itself refused
// for want of memory (pressure: the device is full of others' use). The agent reads those counters
// from the host (ReadCudaLedgerPressure in src/agent/process_preload.h) and tells the server, which moves best-effort work off the GPU
// of a guaranteed task under pressure (docs/cuda_limiter.md "Pressure").
#ifndef GPUPOOL_CUDA_LIMITER_SHARED_LEDGER_H_
#define GPUPOOL_CUDA_LIMITER_SHARED_LEDGER_H_

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "cuda_limiter/limiter.h"

namespace gpupool::cuda_limiter {

inline constexpr const char* kLedgerEnv = "GPUPOOL_CUDA_LEDGER";
inline constexpr size_t kLedgerSlots = 64;  // processes of one task that may hold memory at once

static_assert(std::atomic<int64_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "the ledger's counters are shared between processes: they must be lock-free");

// The file's layout. All zero is a valid empty ledger (the first process stamps the magic).
struct LedgerLayout {
  struct Slot {
    std::atomic<uint64_t> owner;  // 0: free; otherwise (start time << 22) | pid
    std::atomic<int64_t> bytes[kMaxDevices];
  };
  std::atomic<uint64_t> magic;
  std::atomic<uint64_t> pressure[kMaxDevices];  // allocations within the cap the driver refused
  std::atomic<int64_t> total[kMaxDevices];
  Slot slots[kLedgerSlots];
  // Each device's compute window, shared by the task's processes (PacerOptions::shared_window).
  std::atomic<uint64_t> window[kMaxDevices][kSharedWindowBuckets];
};
inline constexpr uint64_t kLedgerMagic = 0x32'72'65'67'64'65'6c'67;  // "gldegr2", layout version 2
inline constexpr size_t kLedgerBytes = sizeof(LedgerLayout);
static_assert(std::is_standard_layout_v<LedgerLayout>, "the agent reads the ledger's fields by offset");
inline constexpr size_t kLedgerPressureOffset = offsetof(LedgerLayout, pressure);

// A process as the ledger names it: its pid (< 2^22, the kernel's largest pid_max) and its start
// time in clock ticks since boot (/proc/<pid>/stat field 22), so a reused pid is not taken for it.
uint64_t OwnerTag(pid_t pid, uint64_t start_ticks);
// This process's tag (start time 0 when /proc cannot be read: then only ESRCH proves it dead).
uint64_t SelfOwnerTag();
// Whether the process a tag names is gone: no such pid, a zombie, or a pid now of a process that
// started at another time. When it cannot tell, alive (a slot is leaked rather than stolen).
bool OwnerDead(uint64_t tag);

// One process's view of the task's ledger file. Not thread-safe: the caller serialises (the
// MemoryLedger's mutex); other processes are only ever reached through the file's atomics.
class SharedLedger {
 public:
  enum class Outcome { kReserved, kOverCap, kNoSlot, kCorrupt };

  // Opens (creating it 0600 when absent) and maps path. Refused, with one line in *error: a
  // symlink, not a regular file, another uid's, readable or writable by group or others, a size
  // other than 0 or kLedgerBytes, a header that is not a ledger's. owner_tag: how this process is
  // named (0: SelfOwnerTag(), worked out on first use); tests pass others.
  static std::unique_ptr<SharedLedger> Open(const char* path, std::string* error, uint64_t owner_tag = 0);
  ~SharedLedger();
  SharedLedger(const SharedLedger&) = delete;
  SharedLedger& operator=(const SharedLedger&) = delete;

  // Charges bytes on device against cap (both the task's): kReserved when the total stays within
  // it. Reclaims dead processes' slots before answering kOverCap. kNoSlot: all kLedgerSlots slots
  // belong to live processes; kCorrupt: the file holds a negative total. Nothing is charged unless
  // kReserved.
  Outcome Reserve(int device, uint64_t bytes, uint64_t cap);
  // Gives back bytes this process charged on device (at most what its slot holds).
  void Refund(int device, uint64_t bytes);
  // The task's total on device (0 when negative: a corrupt file).
  uint64_t Used(int device) const;
  // Counts one allocation on device that the driver refused although it was within the cap.
  void NotePressure(int device);
  // The device's shared compute window (kSharedWindowBuckets words), for its ComputePacer; null
  // for a device out of range.
  std::atomic<uint64_t>* Window(int device);
  // The slots of dead processes, reclaimed now; returns how many.
  int ReclaimDead();
  // In a child after fork: the parent's slot is the parent's; the child takes its own when it
  // first allocates.
  void ForgetSlotAfterFork();

  const std::string& path() const { return path_; }

 private:
  SharedLedger(std::string path, int fd, LedgerLayout* layout, uint64_t owner_tag);
  bool AcquireSlot();
  // The slot, now claimed by this process, gives its bytes back to the totals.
  void Drain(LedgerLayout::Slot& slot);

  std::string path_;
  int fd_;
  LedgerLayout* layout_;
  uint64_t fixed_tag_;  // the tag tests gave, 0 otherwise
  uint64_t tag_ = 0;    // this process's tag once it holds a slot
  int slot_ = -1;       // its slot, -1: none yet
};

}  // namespace gpupool::cuda_limiter

#endif  // GPUPOOL_CUDA_LIMITER_SHARED_LEDGER_H_
