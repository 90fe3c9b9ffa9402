#include "cuda_limiter/limiter.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string_view>

#include "cuda_limiter/shared_ledger.h"

namespace gpupool::cuda_limiter {
namespace {

constexpr int64_t kMaxBusyNs = int64_t{3600} * 1'000'000'000;
constexpr size_t kMaxDigits = 16;  // kMaxMemoryBytes has 16 decimal digits

// The entry as it may be shown in a message: at most 24 characters, anything unprintable as '?'.
std::string Printable(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, 24)) out.push_back(c >= 0x20 && c < 0x7f ? c : '?');
  if (text.size() > 24) out += "...";
  return out;
}

// Splits value into decimal entries no larger than max_value (and no smaller than min_value).
// On failure returns false with the reason in error.
bool ParseList(const char* name, const char* value, uint64_t min_value, uint64_t max_value,
               std::vector<uint64_t>* out, std::string* error) {
  const size_t length = strnlen(value, kMaxEnvLength + 1);
  if (length > kMaxEnvLength) {
    *error = std::string(name) + " is longer than " + std::to_string(kMaxEnvLength) + " characters";
    return false;
  }
  const std::string_view text(value, length);
  size_t start = 0;
  while (true) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view entry = text.substr(start, comma - start);
    const std::string where = std::string(name) + " entry " + std::to_string(out->size());
    if (out->size() == kMaxDevices) {
      *error = std::string(name) + " lists more than " + std::to_string(kMaxDevices) + " devices";
      return false;
    }
    if (entry.empty()) {
      *error = where + " is empty";
      return false;
    }
    if (!std::all_of(entry.begin(), entry.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      *error = where + " (\"" + Printable(entry) + "\") is not a decimal number";
      return false;
    }
    const std::string_view digits = entry.substr(std::min(entry.find_first_not_of('0'), entry.size() - 1));
    uint64_t number = 0;
    if (digits.size() <= kMaxDigits) {
      for (char c : digits) number = number * 10 + static_cast<uint64_t>(c - '0');
    }
    if (digits.size() > kMaxDigits || number > max_value || number < min_value) {
      *error = where + " (\"" + Printable(entry) + "\") is outside " + std::to_string(min_value) + ".." +
               std::to_string(max_value);
      return false;
    }
    out->push_back(number);
    if (comma == text.size()) return true;
    start = comma + 1;
  }
}

bool Given(const char* value) {
  return value != nullptr && *value != '\0';
}

}  // namespace

bool Limits::HasPacing() const {
  return std::any_of(shares_milli.begin(), shares_milli.end(),
                     [](uint32_t share) { return share < kFullShareMilli; });
}

uint64_t Limits::MemoryCap(int device) const {
  if (memory_bytes.empty()) return kNoMemoryCap;
  if (device < 0 || static_cast<size_t>(device) >= memory_bytes.size()) return 0;
  const uint64_t bytes = memory_bytes[static_cast<size_t>(device)];
  return bytes == 0 ? kNoMemoryCap : bytes;
}

uint32_t Limits::ShareMilli(int device) const {
  if (shares_milli.empty()) return kFullShareMilli;
  if (device < 0 || static_cast<size_t>(device) >= shares_milli.size()) return 1;
  return shares_milli[static_cast<size_t>(device)];
}

size_t Limits::ListedDevices() const {
  return std::max(memory_bytes.size(), shares_milli.size());
}

namespace {

LimitsOrError ParseNamedLimits(const char* memory_name, const char* memory_bytes, const char* shares_name,
                               const char* shares_milli) {
  LimitsOrError result;
  Limits limits;
  if (Given(memory_bytes) &&
      !ParseList(memory_name, memory_bytes, 0, kMaxMemoryBytes, &limits.memory_bytes, &result.error)) {
    return result;
  }
  std::vector<uint64_t> shares;
  if (Given(shares_milli) &&
      !ParseList(shares_name, shares_milli, 1, kFullShareMilli, &shares, &result.error)) {
    return result;
  }
  for (uint64_t share : shares) limits.shares_milli.push_back(static_cast<uint32_t>(share));
  if (!limits.memory_bytes.empty() && !limits.shares_milli.empty() &&
      limits.memory_bytes.size() != limits.shares_milli.size()) {
    result.error = std::string(memory_name) + " lists " + std::to_string(limits.memory_bytes.size()) +
                   " devices but " + shares_name + " lists " + std::to_string(limits.shares_milli.size());
    return result;
  }
  result.limits = std::move(limits);
  return result;
}

}  // namespace

LimitsOrError ParseLimits(const char* memory_bytes, const char* shares_milli) {
  return ParseNamedLimits(kMemoryEnv, memory_bytes, kSharesEnv, shares_milli);
}

LimitsOrError ParseLimitsFile(std::string_view text, std::string* ledger) {
  LimitsOrError result;
  const std::string file = kLimitsFile;
  if (text.size() > kMaxLimitsFileBytes) {
    result.error = file + " is longer than " + std::to_string(kMaxLimitsFileBytes) + " bytes";
    return result;
  }
  if (text.find('\0') != std::string_view::npos || text.find('\r') != std::string_view::npos) {
    result.error = file + " holds a NUL or CR character";
    return result;
  }
  if (text.empty() || text.back() != '\n') {
    result.error = file + " does not end with a newline";
    return result;
  }
  const char* keys[3] = {kLimitsFileMemoryKey, kLimitsFileSharesKey, kLimitsFileLedgerKey};
  std::optional<std::string> values[3];
  size_t start = 0;
  for (int line = 1; start < text.size(); ++line) {
    const size_t end = text.find('\n', start);  // there is one: the text ends with a newline
    const std::string_view entry = text.substr(start, end - start);
    start = end + 1;
    const size_t equals = entry.find('=');
    const std::string_view key = entry.substr(0, std::min(equals, entry.size()));
    int which = -1;
    for (int k = 0; k < 3; ++k) {
      if (key == keys[k]) which = k;
    }
    if (equals == std::string_view::npos || which < 0) {
      result.error = file + " line " + std::to_string(line) + " (\"" + Printable(entry) +
                     "\") is not memory_bytes=, shares_milli= or ledger=";
      return result;
    }
    if (values[which].has_value()) {
      result.error = file + " gives " + keys[which] + " twice";
      return result;
    }
    values[which] = std::string(entry.substr(equals + 1));
  }
  for (int k = 0; k < 3; ++k) {
    if (!values[k].has_value()) {
      result.error = file + " does not give " + keys[k];
      return result;
    }
  }
  const std::string& path = *values[2];
  if (!path.empty() && (path[0] != '/' || path.size() > kMaxEnvLength)) {
    result.error = file + " ledger (\"" + Printable(path) + "\") is not an absolute path";
    return result;
  }
  const std::string memory_name = file + " " + kLimitsFileMemoryKey;
  const std::string shares_name = file + " " + kLimitsFileSharesKey;
  result = ParseNamedLimits(memory_name.c_str(), values[0]->c_str(), shares_name.c_str(), values[1]->c_str());
  if (result.limits) *ledger = path;
  return result;
}

// ---- MemoryLedger ------------------------------------------------------------------------------

MemoryLedger::MemoryLedger(const Limits& limits, SharedLedger* shared) : shared_(shared) {
  for (size_t device = 0; device < kMaxDevices; ++device)
    cap_[device] = limits.MemoryCap(static_cast<int>(device));
}

bool MemoryLedger::Reserve(int device, uint64_t bytes) {
  if (!Valid(device)) return false;
  const size_t d = static_cast<size_t>(device);
  std::lock_guard<std::mutex> lock(mutex_);
  if (bytes > cap_[d] || used_[d] > cap_[d] - bytes) return false;
  if (shared_ != nullptr && cap_[d] != kNoMemoryCap) {
    switch (shared_->Reserve(device, bytes, cap_[d])) {
      case SharedLedger::Outcome::kReserved: break;
      case SharedLedger::Outcome::kOverCap: return false;
      case SharedLedger::Outcome::kNoSlot: problem_.store(LedgerProblem::kNoSlot); return false;
      case SharedLedger::Outcome::kCorrupt: problem_.store(LedgerProblem::kCorrupt); return false;
    }
  }
  used_[d] += bytes;
  return true;
}

void MemoryLedger::Unreserve(int device, uint64_t bytes) {
  if (!Valid(device)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  SubtractLocked(device, bytes);
}

void MemoryLedger::NotePressure(int device) {
  if (!Valid(device)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (shared_ != nullptr && cap_[static_cast<size_t>(device)] != kNoMemoryCap) shared_->NotePressure(device);
}

void MemoryLedger::SubtractLocked(int device, uint64_t bytes) {
  uint64_t& used = used_[static_cast<size_t>(device)];
  const uint64_t taken = std::min(used, bytes);
  used -= taken;
  if (shared_ != nullptr && cap_[static_cast<size_t>(device)] != kNoMemoryCap) shared_->Refund(device, taken);
}

void MemoryLedger::Record(AllocationKey key, int device, uint64_t bytes, uint64_t owner) {
  if (!Valid(device)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, inserted] = entries_.try_emplace(key, Entry{device, bytes, owner});
  if (!inserted) {
    SubtractLocked(it->second.device, it->second.bytes);
    it->second = Entry{device, bytes, owner};
  }
}

bool MemoryLedger::Release(AllocationKey key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  SubtractLocked(it->second.device, it->second.bytes);
  entries_.erase(it);
  return true;
}

uint64_t MemoryLedger::ReleaseOwner(uint64_t owner) {
  if (owner == 0) return 0;
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t released = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.owner == owner) {
      SubtractLocked(it->second.device, it->second.bytes);
      released += it->second.bytes;
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  return released;
}

uint64_t MemoryLedger::Used(int device) const {
  if (!Valid(device)) return 0;
  std::lock_guard<std::mutex> lock(mutex_);
  if (shared_ != nullptr && cap_[static_cast<size_t>(device)] != kNoMemoryCap) return shared_->Used(device);
  return used_[static_cast<size_t>(device)];
}

void MemoryLedger::BeforeFork() {
  mutex_.lock();
}

void MemoryLedger::AfterForkInParent() {
  mutex_.unlock();
}

void MemoryLedger::AfterForkInChild() {
  entries_.clear();
  used_.fill(0);
  if (shared_ != nullptr) shared_->ForgetSlotAfterFork();
  mutex_.unlock();
}

uint64_t MemoryLedger::Cap(int device) const {
  return Valid(device) ? cap_[static_cast<size_t>(device)] : 0;
}

MemoryReport MemoryLedger::Report(int device, uint64_t real_free, uint64_t real_total) const {
  const uint64_t cap = Cap(device);
  if (cap == kNoMemoryCap)
    return MemoryReport{real_total, real_free, real_total - std::min(real_total, real_free)};
  const uint64_t used = std::min(Used(device), cap);
  return MemoryReport{cap, std::min(real_free, cap - used), used};
}

// ---- ComputePacer ------------------------------------------------------------------------------

int64_t SteadyClock::NowNs() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {

constexpr uint64_t kBusyMask = (uint64_t{1} << kWindowBusyBits) - 1;
constexpr uint64_t kTagMask = (uint64_t{1} << kWindowTagBits) - 1;

uint64_t WindowWord(int64_t index, uint64_t busy) {
  return ((static_cast<uint64_t>(index) & kTagMask) << kWindowBusyBits) | std::min(busy, kBusyMask);
}
// How many buckets before `index` the word's bucket is (0: the same); -1 when it is a later one
// (a process whose clock read came before another's). Tags wrap after 2^kWindowTagBits buckets
// (58 hours of 50 ms buckets): a slot left alone exactly that long would be read as current, for
// at most one window.
int64_t WordAge(uint64_t word, int64_t index) {
  const uint64_t age = (static_cast<uint64_t>(index) - (word >> kWindowBusyBits)) & kTagMask;
  return age > (kTagMask >> 1) ? -1 : static_cast<int64_t>(age);
}

}  // namespace

ComputePacer::ComputePacer(uint32_t share_milli, PacerOptions options, const Clock& clock)
    : clock_(clock), shared_(options.shared_window), share_milli_(std::clamp<uint32_t>(share_milli, 1, kFullShareMilli)) {
  if (shared_ != nullptr) options.buckets = kSharedWindowBuckets;
  const int buckets = std::clamp(options.buckets, 1, 1000);
  bucket_ns_ = std::max<int64_t>(options.window_ns / buckets, 1);
  buckets_.assign(static_cast<size_t>(buckets), 0);
  const int64_t window_ns = bucket_ns_ * buckets;
  budget_ns_ = window_ns / kFullShareMilli * share_milli_ +
               window_ns % kFullShareMilli * share_milli_ / kFullShareMilli;
  current_ = std::max<int64_t>(clock_.NowNs(), 0) / bucket_ns_;
  if (shared_ != nullptr) {
    LoadShared(current_);
    if (!options.start_full || !paced() || sum_ != 0) return;
    // The first process fills the window as if the share had been used evenly; each slot only
    // when it is still stale, so two first processes fill it once.
    for (int64_t k = 0; k < buckets && current_ - k >= 0; ++k) {
      const int64_t index = current_ - k;
      const uint64_t fill = static_cast<uint64_t>(budget_ns_ / buckets + (k == 0 ? budget_ns_ % buckets : 0));
      std::atomic<uint64_t>& slot = shared_[index % buckets];
      uint64_t word = slot.load();
      if (WordAge(word, current_) >= buckets) (void)slot.compare_exchange_strong(word, WindowWord(index, fill));
    }
    LoadShared(current_);
    return;
  }
  if (options.start_full && paced()) {
    for (int64_t& bucket : buckets_) bucket = budget_ns_ / buckets;
    buckets_[static_cast<size_t>(current_ % buckets)] += budget_ns_ % buckets;  // the newest leaves last
    sum_ = budget_ns_;
  }
}

void ComputePacer::LoadShared(int64_t index) {
  const int64_t size = static_cast<int64_t>(buckets_.size());
  sum_ = 0;
  for (int64_t slot = 0; slot < size; ++slot) {
    const uint64_t word = shared_[slot].load(std::memory_order_acquire);
    const int64_t age = WordAge(word, index);
    // In the window, and in its own slot (a damaged word elsewhere counts for nothing).
    const bool counts = age >= 0 && age < size && (index - age) % size == slot;
    const int64_t busy = counts ? static_cast<int64_t>(word & kBusyMask) : 0;
    buckets_[static_cast<size_t>(slot)] = busy;
    sum_ += busy;
  }
  current_ = index;
}

void ComputePacer::AddShared(int64_t index, int64_t busy_ns) {
  const int64_t size = static_cast<int64_t>(buckets_.size());
  std::atomic<uint64_t>& slot = shared_[index % size];
  uint64_t word = slot.load(std::memory_order_acquire);
  for (;;) {
    const int64_t age = WordAge(word, index);
    uint64_t next;
    if (age == 0) next = WindowWord(index, (word & kBusyMask) + static_cast<uint64_t>(busy_ns));
    else if (age > 0) next = WindowWord(index, static_cast<uint64_t>(busy_ns));  // stale: the slot is this bucket's now
    else return;                                                                // a newer bucket's
    if (slot.compare_exchange_weak(word, next, std::memory_order_acq_rel)) return;
  }
}

void ComputePacer::Advance(int64_t now_ns) {
  const int64_t index = std::max<int64_t>(now_ns, 0) / bucket_ns_;
  if (shared_ != nullptr) {  // the other processes' time too, read again each time
    LoadShared(std::max(index, current_));
    return;
  }
  if (index <= current_) return;  // the same bucket, or a clock that went back
  const int64_t size = static_cast<int64_t>(buckets_.size());
  const int64_t steps = std::min(index - current_, size);
  for (int64_t step = 1; step <= steps; ++step) {
    int64_t& bucket = buckets_[static_cast<size_t>((current_ + step) % size)];
    sum_ -= bucket;
    bucket = 0;
  }
  current_ = index;
}

void ComputePacer::OnComplete(int64_t busy_ns) {
  busy_ns = std::clamp<int64_t>(busy_ns, 0, kMaxBusyNs);
  if (inflight_ > 0) --inflight_;
  Advance(clock_.NowNs());
  if (shared_ != nullptr) AddShared(current_, busy_ns);
  buckets_[static_cast<size_t>(current_ % static_cast<int64_t>(buckets_.size()))] += busy_ns;
  sum_ += busy_ns;
  estimate_ns_ = estimate_ns_ == 0 ? busy_ns : estimate_ns_ + (busy_ns - estimate_ns_) / 8;
}

void ComputePacer::OnAbandon() {
  if (inflight_ > 0) --inflight_;
}

int64_t ComputePacer::BusyInWindow() {
  Advance(clock_.NowNs());
  return sum_;
}

int64_t ComputePacer::DelayBeforeLaunch() {
  if (!paced()) return 0;
  const int64_t now = clock_.NowNs();
  Advance(now);
  const int64_t pending = estimate_ns_ * (static_cast<int64_t>(inflight_) + 1);
  if (sum_ + pending <= budget_ns_) return 0;
  if (sum_ == 0 && inflight_ == 0) return 0;  // alone, however long: progress is guaranteed
  // The bucket k places after the oldest leaves the window when bucket current_ + 1 + k begins.
  const int64_t size = static_cast<int64_t>(buckets_.size());
  int64_t remaining = sum_;
  for (int64_t k = 0; k < size; ++k) {
    remaining -= buckets_[static_cast<size_t>((current_ + 1 + k) % size)];
    if (remaining + pending <= budget_ns_ || k == size - 1) {
      return std::max<int64_t>((current_ + 1 + k) * bucket_ns_ - now, 1);
    }
  }
  return bucket_ns_;  // not reached
}

}  // namespace gpupool::cuda_limiter
