#include "cuda_limiter/shared_ledger.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>

namespace gpupool::cuda_limiter {
namespace {

constexpr int kPidBits = 22;
constexpr uint64_t kPidMask = (uint64_t{1} << kPidBits) - 1;

static_assert(std::is_standard_layout_v<LedgerLayout>);

// Reads /proc/<pid>/stat (pid 0: self) into buf; false when it cannot. No allocation.
bool ReadStat(pid_t pid, char* buf, size_t size, size_t* length) {
  char path[64];
  if (pid == 0) {
    std::snprintf(path, sizeof path, "/proc/self/stat");
  } else {
    std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  }
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const ssize_t n = ::read(fd, buf, size - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  *length = static_cast<size_t>(n);
  return true;
}

// The state (field 3) and start time (field 22) from a stat line; false when malformed. The command
// (field 2) may hold spaces and parentheses: the fields are counted from its last ')'.
bool ParseStat(const char* buf, size_t length, char* state, uint64_t* start_ticks) {
  const char* close = nullptr;
  for (size_t i = 0; i < length; ++i)
    if (buf[i] == ')') close = buf + i;
  if (close == nullptr || close + 2 >= buf + length) return false;
  const char* p = close + 2;  // field 3
  *state = *p;
  for (int field = 3; field < 22; ++field) {
    p = std::strchr(p, ' ');
    if (p == nullptr) return false;
    ++p;
  }
  uint64_t value = 0;
  int digits = 0;
  for (; *p >= '0' && *p <= '9' && digits < 20; ++p, ++digits)
    value = value * 10 + static_cast<uint64_t>(*p - '0');
  if (digits == 0) return false;
  *start_ticks = value;
  return true;
}

// Subtracts bytes from counter, never below 0.
void SubtractClamped(std::atomic<int64_t>& counter, int64_t bytes) {
  int64_t current = counter.load(std::memory_order_relaxed);
  while (true) {
    const int64_t next = current - std::min(std::max<int64_t>(current, 0), bytes);
    if (next == current || counter.compare_exchange_weak(current, next, std::memory_order_acq_rel)) return;
  }
}

bool ValidDevice(int device) {
  return device >= 0 && static_cast<size_t>(device) < kMaxDevices;
}

}  // namespace

uint64_t OwnerTag(pid_t pid, uint64_t start_ticks) {
  return (start_ticks << kPidBits) | (static_cast<uint64_t>(pid) & kPidMask);
}

uint64_t SelfOwnerTag() {
  char buf[1024];
  size_t length = 0;
  char state = 0;
  uint64_t start = 0;
  if (!ReadStat(0, buf, sizeof buf, &length) || !ParseStat(buf, length, &state, &start)) start = 0;
  return OwnerTag(::getpid(), start);
}

bool OwnerDead(uint64_t tag) {
  const pid_t pid = static_cast<pid_t>(tag & kPidMask);
  const uint64_t start = tag >> kPidBits;
  if (pid <= 0) return true;  // no process has pid 0: a tag no process wrote
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  char buf[1024];
  size_t length = 0;
  if (!ReadStat(pid, buf, sizeof buf, &length)) return errno == ENOENT || errno == ESRCH;  // gone since
  char state = 0;
  uint64_t now_start = 0;
  if (!ParseStat(buf, length, &state, &now_start)) return false;
  if (state == 'Z' || state == 'X') return true;
  return start != 0 && now_start != start;
}

std::unique_ptr<SharedLedger> SharedLedger::Open(const char* path, std::string* error, uint64_t owner_tag) {
  const std::string where = std::string(kLedgerEnv) + " (" + path + ")";
  const int fd = ::open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY, 0600);
  if (fd < 0) {
    *error = where + ": cannot open: " + (errno == ELOOP ? "a symlink" : std::strerror(errno));
    return nullptr;
  }
  auto refuse = [&](const std::string& why) {
    ::close(fd);
    *error = where + ": " + why;
    return nullptr;
  };
  struct stat st {};
  if (::fstat(fd, &st) != 0) return refuse(std::string("fstat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return refuse("not a regular file");
  if (st.st_uid != ::geteuid())
    return refuse("owned by uid " + std::to_string(st.st_uid) + ", not this process's " +
                  std::to_string(::geteuid()));
  if ((st.st_mode & 077) != 0) return refuse("open to group or others (it must be mode 0600)");
  if (st.st_size == 0) {
    // New: every process that finds it empty sizes it the same way (zeroes: an empty ledger).
    if (::ftruncate(fd, static_cast<off_t>(kLedgerBytes)) != 0)
      return refuse(std::string("cannot size it: ") + std::strerror(errno));
  } else if (static_cast<uint64_t>(st.st_size) != kLedgerBytes) {
    return refuse(std::to_string(st.st_size) + " bytes, not a ledger's " + std::to_string(kLedgerBytes));
  }
  void* mapped = ::mmap(nullptr, kLedgerBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mapped == MAP_FAILED) return refuse(std::string("mmap: ") + std::strerror(errno));
  auto* layout = std::launder(reinterpret_cast<LedgerLayout*>(mapped));
  uint64_t magic = 0;
  if (!layout->magic.compare_exchange_strong(magic, kLedgerMagic) && magic != kLedgerMagic) {
    ::munmap(mapped, kLedgerBytes);
    return refuse("not a gpupool ledger (its header is wrong)");
  }
  for (size_t device = 0; device < kMaxDevices; ++device) {
    if (layout->total[device].load() < 0) {
      ::munmap(mapped, kLedgerBytes);
      return refuse("not a gpupool ledger (a negative total)");
    }
  }
  return std::unique_ptr<SharedLedger>(new SharedLedger(path, fd, layout, owner_tag));
}

SharedLedger::SharedLedger(std::string path, int fd, LedgerLayout* layout, uint64_t owner_tag)
    : path_(std::move(path)), fd_(fd), layout_(layout), fixed_tag_(owner_tag) {}

SharedLedger::~SharedLedger() {
  ::munmap(layout_, kLedgerBytes);
  ::close(fd_);
}

void SharedLedger::Drain(LedgerLayout::Slot& slot) {
  for (size_t device = 0; device < kMaxDevices; ++device) {
    const int64_t bytes = slot.bytes[device].exchange(0, std::memory_order_acq_rel);
    if (bytes > 0) SubtractClamped(layout_->total[device], bytes);
  }
}

bool SharedLedger::AcquireSlot() {
  if (tag_ == 0) tag_ = fixed_tag_ != 0 ? fixed_tag_ : SelfOwnerTag();
  // A free slot first. Its bytes should be 0; any left there (a damaged file) are dropped, not
  // taken from the totals, so they can only make the total too high.
  for (size_t i = 0; i < kLedgerSlots; ++i) {
    LedgerLayout::Slot& slot = layout_->slots[i];
    uint64_t expected = 0;
    if (slot.owner.load(std::memory_order_relaxed) == 0 &&
        slot.owner.compare_exchange_strong(expected, tag_, std::memory_order_acq_rel)) {
      for (auto& bytes : slot.bytes) bytes.store(0, std::memory_order_relaxed);
      slot_ = static_cast<int>(i);
      return true;
    }
  }
  // Then a dead process's, its bytes given back first.
  for (size_t i = 0; i < kLedgerSlots; ++i) {
    LedgerLayout::Slot& slot = layout_->slots[i];
    uint64_t owner = slot.owner.load(std::memory_order_acquire);
    if (owner == 0 || owner == tag_ || !OwnerDead(owner)) continue;
    if (!slot.owner.compare_exchange_strong(owner, tag_, std::memory_order_acq_rel)) continue;
    Drain(slot);
    slot_ = static_cast<int>(i);
    return true;
  }
  return false;
}

int SharedLedger::ReclaimDead() {
  if (tag_ == 0) tag_ = fixed_tag_ != 0 ? fixed_tag_ : SelfOwnerTag();
  int reclaimed = 0;
  for (size_t i = 0; i < kLedgerSlots; ++i) {
    if (static_cast<int>(i) == slot_) continue;
    LedgerLayout::Slot& slot = layout_->slots[i];
    uint64_t owner = slot.owner.load(std::memory_order_acquire);
    if (owner == 0 || owner == tag_ || !OwnerDead(owner)) continue;
    // Claimed under this process's tag while it drains: if this process dies meanwhile, the next
    // one finds the slot dead again and finishes.
    if (!slot.owner.compare_exchange_strong(owner, tag_, std::memory_order_acq_rel)) continue;
    Drain(slot);
    slot.owner.store(0, std::memory_order_release);
    ++reclaimed;
  }
  return reclaimed;
}

SharedLedger::Outcome SharedLedger::Reserve(int device, uint64_t bytes, uint64_t cap) {
  if (!ValidDevice(device) || cap > kMaxMemoryBytes) return Outcome::kOverCap;
  if (bytes > cap) return Outcome::kOverCap;
  if (slot_ < 0 && !AcquireSlot()) {
    // Every slot is a live process's, or was a moment ago: look once more after reclaiming.
    if (ReclaimDead() == 0 || !AcquireSlot()) return Outcome::kNoSlot;
  }
  const auto want = static_cast<int64_t>(bytes);
  const auto limit = static_cast<int64_t>(cap);
  std::atomic<int64_t>& total = layout_->total[static_cast<size_t>(device)];
  for (int attempt = 0; attempt < 2; ++attempt) {
    int64_t current = total.load(std::memory_order_acquire);
    while (current >= 0 && current <= limit - want) {
      if (total.compare_exchange_weak(current, current + want, std::memory_order_acq_rel)) {
        layout_->slots[static_cast<size_t>(slot_)].bytes[static_cast<size_t>(device)].fetch_add(
            want, std::memory_order_acq_rel);
        return Outcome::kReserved;
      }
    }
    if (current < 0) return Outcome::kCorrupt;
    if (attempt == 0 && ReclaimDead() == 0) break;  // nothing to take back: the cap stands
  }
  return Outcome::kOverCap;
}

void SharedLedger::Refund(int device, uint64_t bytes) {
  if (!ValidDevice(device) || slot_ < 0 || bytes == 0) return;
  std::atomic<int64_t>& mine = layout_->slots[static_cast<size_t>(slot_)].bytes[static_cast<size_t>(device)];
  const int64_t held = std::max<int64_t>(mine.load(std::memory_order_acquire), 0);
  const int64_t refund = static_cast<int64_t>(std::min<uint64_t>(bytes, static_cast<uint64_t>(held)));
  if (refund == 0) return;
  mine.fetch_sub(refund, std::memory_order_acq_rel);  // the slot first: a kill between leaves the total high
  SubtractClamped(layout_->total[static_cast<size_t>(device)], refund);
}

void SharedLedger::NotePressure(int device) {
  if (!ValidDevice(device)) return;
  layout_->pressure[static_cast<size_t>(device)].fetch_add(1, std::memory_order_relaxed);
}

std::atomic<uint64_t>* SharedLedger::Window(int device) {
  return ValidDevice(device) ? layout_->window[static_cast<size_t>(device)] : nullptr;
}

uint64_t SharedLedger::Used(int device) const {
  if (!ValidDevice(device)) return 0;
  return static_cast<uint64_t>(std::max<int64_t>(layout_->total[static_cast<size_t>(device)].load(), 0));
}

void SharedLedger::ForgetSlotAfterFork() {
  slot_ = -1;
  tag_ = 0;
}

}  // namespace gpupool::cuda_limiter
