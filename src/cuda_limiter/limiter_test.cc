#include "cuda_limiter/limiter.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace gpupool::cuda_limiter {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr uint64_t kGiB = uint64_t{1} << 30;

// ---- the environment's limits -------------------------------------------------------------------

TEST(ParseLimitsTest, AbsentOrEmptyMeansNoLimits) {
  for (const char* value : {static_cast<const char*>(nullptr), ""}) {
    const LimitsOrError parsed = ParseLimits(value, value);
    ASSERT_TRUE(parsed.limits.has_value()) << parsed.error;
    EXPECT_FALSE(parsed.limits->HasMemoryCaps());
    EXPECT_FALSE(parsed.limits->HasPacing());
    EXPECT_EQ(parsed.limits->MemoryCap(0), kNoMemoryCap);
    EXPECT_EQ(parsed.limits->ShareMilli(5), kFullShareMilli);
    EXPECT_EQ(parsed.limits->ListedDevices(), 0U);
  }
}

TEST(ParseLimitsFileTest, ReadsTheSameListsAndTheLedger) {
  std::string ledger = "unchanged";
  LimitsOrError parsed =
      ParseLimitsFile("shares_milli=250,1000\nledger=/run/gpupool/cuda-ledger\nmemory_bytes=10737418240,0\n", &ledger);
  ASSERT_TRUE(parsed.limits.has_value()) << parsed.error;
  EXPECT_EQ(parsed.limits->MemoryCap(0), 10 * kGiB);
  EXPECT_EQ(parsed.limits->MemoryCap(1), kNoMemoryCap);
  EXPECT_EQ(parsed.limits->ShareMilli(0), 250U);
  EXPECT_EQ(ledger, "/run/gpupool/cuda-ledger");
  parsed = ParseLimitsFile("memory_bytes=\nshares_milli=\nledger=\n", &ledger);  // empty: none, as unset
  ASSERT_TRUE(parsed.limits.has_value()) << parsed.error;
  EXPECT_FALSE(parsed.limits->HasMemoryCaps());
  EXPECT_FALSE(parsed.limits->HasPacing());
  EXPECT_EQ(ledger, "");
}

TEST(ParseLimitsFileTest, AnythingElseIsAnError) {
  using namespace std::string_literals;
  const std::vector<std::string> texts = {
        "", "\n", "memory_bytes=1\nshares_milli=1000\n", "memory_bytes=1\nshares_milli=1000\nledger=\nledger=\n",
        "memory_bytes=1\nshares_milli=1000\nledger=", "memory_bytes=1\nshares_milli=1000\nledger=\n\n",
        "memory_bytes=1\nshares_milli=1000\nledger=\nother=1\n", "MEMORY_BYTES=1\nshares_milli=1000\nledger=\n",
        "memory_bytes =1\nshares_milli=1000\nledger=\n", "memory_bytes=-1\nshares_milli=1000\nledger=\n",
        "memory_bytes=1 \nshares_milli=1000\nledger=\n", "memory_bytes=1\r\nshares_milli=1000\nledger=\n",
        "memory_bytes=1,2\nshares_milli=1000\nledger=\n", "memory_bytes=1\nshares_milli=1000\nledger=x\n",
        "memory_bytes=1\0\nshares_milli=1000\nledger=\n"s,
        "memory_bytes=1\nshares_milli=1000\nledger=/" + std::string(kMaxLimitsFileBytes, 'a') + "\n"};
  for (const std::string& text : texts) {
    std::string ledger = "unchanged";
    const LimitsOrError parsed = ParseLimitsFile(text, &ledger);
    EXPECT_FALSE(parsed.limits.has_value()) << text;
    EXPECT_FALSE(parsed.error.empty()) << text;
    EXPECT_EQ(ledger, "unchanged");
  }
}

TEST(ParseLimitsTest, ListsCoverTheirOrdinalsAndNothingPast) {
  const LimitsOrError parsed = ParseLimits("10737418240,0", "250,1000");
  ASSERT_TRUE(parsed.limits.has_value()) << parsed.error;
  const Limits& limits = *parsed.limits;
  EXPECT_EQ(limits.MemoryCap(0), 10 * kGiB);
  EXPECT_EQ(limits.MemoryCap(1), kNoMemoryCap);  // 0: no cap on that ordinal
  EXPECT_EQ(limits.MemoryCap(2), 0U);            // past the list: nothing
  EXPECT_EQ(limits.MemoryCap(-1), 0U);
  EXPECT_EQ(limits.ShareMilli(0), 250U);
  EXPECT_EQ(limits.ShareMilli(1), 1000U);
  EXPECT_EQ(limits.ShareMilli(2), 1U);
  EXPECT_TRUE(limits.HasPacing());
  EXPECT_EQ(limits.ListedDevices(), 2U);
  // Leading zeros are digits too; the bounds are inclusive.
  ASSERT_TRUE(ParseLimits("0001125899906842624", "1").limits.has_value());  // 2^50
  EXPECT_FALSE(ParseLimits(nullptr, "1000,1000").limits->HasPacing());
}

TEST(ParseLimitsTest, MalformedValuesAreRefusedWithOneClearLine) {
  const std::string many(64 * 2, ',');
  const std::vector<std::pair<std::string, std::string>> memory_cases = {
      {"10G", "entry 0 (\"10G\") is not a decimal number"},
      {"-1", "is not a decimal number"},
      {"+5", "is not a decimal number"},
      {" 5", "is not a decimal number"},
      {"5 ", "is not a decimal number"},
      {"0x10", "is not a decimal number"},
      {"1,,2", "entry 1 is empty"},
      {"1,", "entry 1 is empty"},
      {",", "entry 0 is empty"},
      {"1125899906842625", "is outside 0..1125899906842624"},
      {"99999999999999999999999", "is outside"},
      {"1\x01\x7f", "(\"1??\")"},
      {std::string(5000, '1'), "longer than 4096 characters"},
  };
  for (const auto& [value, message] : memory_cases) {
    const LimitsOrError parsed = ParseLimits(value.c_str(), nullptr);
    EXPECT_FALSE(parsed.limits.has_value()) << value;
    EXPECT_NE(parsed.error.find("GPUPOOL_GPU_MEMORY_BYTES"), std::string::npos) << parsed.error;
    EXPECT_NE(parsed.error.find(message), std::string::npos) << parsed.error;
    EXPECT_EQ(parsed.error.find('\n'), std::string::npos);
  }
  for (const char* shares : {"0", "1001", "250,abc", "2.5"}) {
    const LimitsOrError parsed = ParseLimits(nullptr, shares);
    EXPECT_FALSE(parsed.limits.has_value()) << shares;
    EXPECT_NE(parsed.error.find("GPUPOOL_GPU_SHARES_MILLI"), std::string::npos) << parsed.error;
  }
  std::string sixty_five = "1";
  for (int i = 0; i < 64; ++i) sixty_five += ",1";
  EXPECT_NE(ParseLimits(sixty_five.c_str(), nullptr).error.find("more than 64 devices"), std::string::npos);
  EXPECT_NE(ParseLimits("1,2", "500").error.find("lists 2 devices but"), std::string::npos);
}

// ---- the memory ledger --------------------------------------------------------------------------

Limits MemoryLimits(std::vector<uint64_t> bytes) {
  Limits limits;
  limits.memory_bytes = std::move(bytes);
  return limits;
}

TEST(MemoryLedgerTest, ReservesWithinTheCapAndRecordsUntilReleased) {
  MemoryLedger ledger(MemoryLimits({10 * kGiB, 0}));
  EXPECT_EQ(ledger.Cap(0), 10 * kGiB);
  EXPECT_EQ(ledger.Cap(1), kNoMemoryCap);
  ASSERT_TRUE(ledger.Reserve(0, 6 * kGiB));
  ledger.Record({AllocationKey::Kind::kPointer, 0x1000}, 0, 6 * kGiB, 7);
  EXPECT_FALSE(ledger.Reserve(0, 5 * kGiB));  // 11 GiB > 10: nothing reserved
  EXPECT_EQ(ledger.Used(0), 6 * kGiB);
  ASSERT_TRUE(ledger.Reserve(0, 4 * kGiB));  // exactly the cap
  ledger.Unreserve(0, 4 * kGiB);             // the driver refused it
  EXPECT_EQ(ledger.Used(0), 6 * kGiB);
  EXPECT_FALSE(ledger.Release({AllocationKey::Kind::kHandle, 0x1000}));  // another key space
  EXPECT_TRUE(ledger.Release({AllocationKey::Kind::kPointer, 0x1000}));
  EXPECT_FALSE(ledger.Release({AllocationKey::Kind::kPointer, 0x1000}));
  EXPECT_EQ(ledger.Used(0), 0U);
  EXPECT_TRUE(ledger.Reserve(1, 1000 * kGiB));  // no cap on device 1
  EXPECT_FALSE(ledger.Reserve(0, UINT64_MAX));
}

TEST(MemoryLedgerTest, DevicesPastTheListOrOutOfRangeAreRefused) {
  MemoryLedger ledger(MemoryLimits({kGiB}));
  EXPECT_FALSE(ledger.Reserve(1, 1));
  EXPECT_FALSE(ledger.Reserve(-1, 1));
  EXPECT_FALSE(ledger.Reserve(static_cast<int>(kMaxDevices), 1));
  EXPECT_EQ(ledger.Used(static_cast<int>(kMaxDevices)), 0U);
}

TEST(MemoryLedgerTest, ContextDestructionReleasesItsAllocationsOnly) {
  MemoryLedger ledger(MemoryLimits({10 * kGiB}));
  for (uint64_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(ledger.Reserve(0, kGiB));
    ledger.Record({AllocationKey::Kind::kPointer, i}, 0, kGiB, i % 2 == 0 ? 100 : 200);
  }
  ASSERT_TRUE(ledger.Reserve(0, kGiB));
  ledger.Record({AllocationKey::Kind::kHandle, 9}, 0, kGiB, 0);  // VMM: no context
  EXPECT_EQ(ledger.ReleaseOwner(100), 2 * kGiB);
  EXPECT_EQ(ledger.ReleaseOwner(0), 0U);
  EXPECT_EQ(ledger.Used(0), 3 * kGiB);
  // A key recorded again (a free the ledger missed) replaces the old record.
  ASSERT_TRUE(ledger.Reserve(0, kGiB));
  ledger.Record({AllocationKey::Kind::kPointer, 1}, 0, kGiB, 200);
  EXPECT_EQ(ledger.Used(0), 3 * kGiB);
}

TEST(MemoryLedgerTest, ReportShowsTheCapNeverMoreThanReallyFree) {
  MemoryLedger ledger(MemoryLimits({10 * kGiB, 0}));
  ASSERT_TRUE(ledger.Reserve(0, 3 * kGiB));
  MemoryReport report = ledger.Report(0, 70 * kGiB, 80 * kGiB);
  EXPECT_EQ(report.total, 10 * kGiB);
  EXPECT_EQ(report.used, 3 * kGiB);
  EXPECT_EQ(report.free, 7 * kGiB);
  report = ledger.Report(0, 2 * kGiB, 80 * kGiB);  // others took the device's memory
  EXPECT_EQ(report.free, 2 * kGiB);
  report = ledger.Report(1, 70 * kGiB, 80 * kGiB);  // no cap: the real figures
  EXPECT_EQ(report.total, 80 * kGiB);
  EXPECT_EQ(report.free, 70 * kGiB);
  EXPECT_EQ(report.used, 10 * kGiB);
}

TEST(MemoryLedgerTest, ConcurrentAllocationsNeverPassTheCap) {
  MemoryLedger ledger(MemoryLimits({100}));
  std::vector<std::thread> threads;
  std::atomic<bool> over{false};
  for (uint64_t t = 0; t < 4; ++t) {
    threads.emplace_back([&ledger, &over, t] {
      for (uint64_t i = 0; i < 2000; ++i) {
        const AllocationKey key{AllocationKey::Kind::kPointer, t * 100000 + i};
        if (!ledger.Reserve(0, 30)) continue;
        ledger.Record(key, 0, 30, t + 1);
        if (ledger.Used(0) > 100) over = true;
        ledger.Release(key);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_FALSE(over);
  EXPECT_EQ(ledger.Used(0), 0U);
}

// ---- the compute pacer ----------------------------------------------------------------------------

class FakeClock final : public Clock {
 public:
  int64_t NowNs() const override { return now_; }
  void Set(int64_t now) { now_ = now; }
  void Advance(int64_t ns) { now_ += ns; }

 private:
  int64_t now_ = 1000 * kMs;  // bucket 10 of 100 ms
};

// 1 s in ten 100 ms buckets, starting empty; a 25 % share is a 250 ms budget.
PacerOptions TenBuckets() {
  return PacerOptions{1000 * kMs, 10, /*start_full=*/false};
}

TEST(ComputePacerTest, FullShareIsNeverPaced) {
  FakeClock clock;
  ComputePacer pacer(1000, TenBuckets(), clock);
  EXPECT_FALSE(pacer.paced());
  pacer.OnLaunch();
  pacer.OnComplete(5000 * kMs);
  EXPECT_EQ(pacer.DelayBeforeLaunch(), 0);
}

TEST(ComputePacerTest, BudgetAndBuckets) {
  FakeClock clock;
  EXPECT_EQ(ComputePacer(250, TenBuckets(), clock).budget_ns(), 250 * kMs);
  const ComputePacer defaults(333, PacerOptions{}, clock);
  EXPECT_EQ(defaults.bucket_ns(), 50 * kMs);
  EXPECT_EQ(defaults.budget_ns(), 333 * kMs);
  EXPECT_EQ(ComputePacer(0, TenBuckets(), clock).budget_ns(), kMs);  // clamped to 1 milli
}

TEST(ComputePacerTest, WaitsUntilOldBucketsLeaveTheWindow) {
  FakeClock clock;
  ComputePacer pacer(250, TenBuckets(), clock);
  EXPECT_EQ(pacer.DelayBeforeLaunch(), 0);  // nothing yet
  pacer.OnLaunch();
  clock.Advance(50 * kMs);
  pacer.OnComplete(100 * kMs);  // bucket 10 (1.0 s .. 1.1 s) holds 100 ms
  EXPECT_EQ(pacer.EstimatedLaunchNs(), 100 * kMs);
  EXPECT_EQ(pacer.DelayBeforeLaunch(), 0);  // 100 + the next 100 <= 250
  pacer.OnLaunch();
  clock.Advance(100 * kMs);     // 1.15 s
  pacer.OnComplete(100 * kMs);  // bucket 11 holds 100 ms
  EXPECT_EQ(pacer.BusyInWindow(), 200 * kMs);
  // 200 + the next 100 > 250: bucket 10 must leave, which it does when bucket 20 begins (2.0 s).
  EXPECT_EQ(pacer.DelayBeforeLaunch(), 850 * kMs);
  clock.Set(1999 * kMs);
  EXPECT_EQ(pacer.DelayBeforeLaunch(), kMs);
  clock.Set(2000 * kMs);
  EXPECT_EQ(pacer.BusyInWindow(), 100 * kMs);
  EXPECT_EQ(pacer.DelayBeforeLaunch(), 0);
  clock.Set(2100 * kMs);
  EXPECT_EQ(pacer.BusyInWindow(), 0);
  clock.Set(1500 * kMs);  // a clock that goes back changes nothing
  EXPECT_EQ(pacer.BusyInWindow(), 0);
}

TEST(ComputePacerTest, LaunchesInFlightCountAtTheEstimate) {
  FakeClock clock;
  ComputePacer pacer(250, TenBuckets(), clock);
  pacer.OnLaunch();
  pacer.OnComplete(60 * kMs);  // estimate 60 ms, 60 ms in bucket 10
  EXPECT_EQ(pacer.DelayBeforeLaunch(), 0);
  pacer.OnLaunch();
  pacer.OnLaunch();
  EXPECT_EQ(pacer.inflight(), 2);
  EXPECT_EQ(pacer.DelayBeforeLaunch(), 0);  // 60 + 3 x 60 = 240
  pacer.OnLaunch();
  // 60 + 4 x 60 = 300 > 250: once bucket 10 leaves (2.0 s), 240 remain.
  EXPECT_EQ(pacer.DelayBeforeLaunch(), 1000 * kMs);
  pacer.OnAbandon();  // one of them will never report
  EXPECT_EQ(pacer.inflight(), 2);
  EXPECT_EQ(pacer.DelayBeforeLaunch(), 0);
}

TEST(ComputePacerTest, InFlightWorkAloneOverTheBudgetWaitsForTheWholeWindow) {
  FakeClock clock;
  ComputePacer pacer(100, TenBuckets(), clock);  // 100 ms budget
  pacer.OnLaunch();
  pacer.OnComplete(80 * kMs);
  clock.Advance(30 * kMs);
  pacer.OnLaunch();
  // 80 in the window + 80 in flight + 80 next: even an empty window is too little, so the answer
  // is the end of the window; the caller asks again sooner, as the launch in flight completes.
  EXPECT_EQ(pacer.DelayBeforeLaunch(), 2000 * kMs - 1030 * kMs);
}

TEST(ComputePacerTest, ALaunchLongerThanTheBudgetRunsAlone) {
  FakeClock clock;
  ComputePacer pacer(250, TenBuckets(), clock);
  pacer.OnLaunch();
  pacer.OnComplete(900 * kMs);
  EXPECT_GT(pacer.DelayBeforeLaunch(), 0);
  clock.Set(2000 * kMs);  // the window is empty again and nothing is in flight
  EXPECT_EQ(pacer.BusyInWindow(), 0);
  EXPECT_EQ(pacer.DelayBeforeLaunch(), 0);
}

TEST(ComputePacerTest, StartsFullSoTheFirstSecondIsPacedEvenly) {
  FakeClock clock;  // at 1.0 s: bucket 10, the newest
  PacerOptions options = TenBuckets();
  options.start_full = true;
  ComputePacer pacer(250, options, clock);
  EXPECT_EQ(pacer.BusyInWindow(), 250 * kMs);  // 25 ms in each bucket
  EXPECT_EQ(pacer.DelayBeforeLaunch(), 0);     // nothing is known of the launch yet
  pacer.OnLaunch();
  pacer.OnComplete(10 * kMs);
  // 260 + the next 10: the oldest bucket (25 ms) must leave first, when bucket 11 begins at 1.1 s.
  EXPECT_EQ(pacer.DelayBeforeLaunch(), 100 * kMs);
  clock.Set(1100 * kMs);
  EXPECT_EQ(pacer.BusyInWindow(), 235 * kMs);
  EXPECT_EQ(pacer.DelayBeforeLaunch(), 0);  // 235 + 10 <= 250: 25 ms freed, 10 ms used
  // Unpaced, or asked not to, it starts empty.
  EXPECT_EQ(ComputePacer(1000, options, clock).BusyInWindow(), 0);
  EXPECT_EQ(ComputePacer(250, TenBuckets(), clock).BusyInWindow(), 0);
}

TEST(ComputePacerTest, EstimateIsAnExponentialMeanAndBusyTimeIsClamped) {
  FakeClock clock;
  ComputePacer pacer(500, TenBuckets(), clock);
  pacer.OnComplete(80 * kMs);
  pacer.OnComplete(0);
  EXPECT_EQ(pacer.EstimatedLaunchNs(), 70 * kMs);  // 80 + (0 - 80) / 8
  pacer.OnComplete(-5 * kMs);
  EXPECT_EQ(pacer.BusyInWindow(), 80 * kMs);
  EXPECT_EQ(pacer.inflight(), 0);  // completions without launches do not go negative
}

// ---- a window shared by a task's processes (the ledger file's) -----------------------------------

// 1 s in the shared window's 20 buckets of 50 ms; at 1.0 s the newest is bucket 20.
PacerOptions Shared(std::atomic<uint64_t>* window, bool start_full = false) {
  PacerOptions options{1000 * kMs, kSharedWindowBuckets, start_full};
  options.shared_window = window;
  return options;
}

TEST(ComputePacerTest, ProcessesSharingAWindowKeepToTheShareTogether) {
  FakeClock clock;
  std::atomic<uint64_t> window[kSharedWindowBuckets] = {};
  ComputePacer a(250, Shared(window), clock);
  ComputePacer b(250, Shared(window), clock);
  a.OnLaunch();
  a.OnComplete(250 * kMs);  // the task's whole budget, used by one process
  EXPECT_EQ(b.BusyInWindow(), 250 * kMs);
  EXPECT_EQ(b.DelayBeforeLaunch(), 0);  // nothing known of b's own launches yet: one goes
  b.OnLaunch();
  clock.Advance(10 * kMs);
  b.OnComplete(50 * kMs);
  EXPECT_EQ(a.BusyInWindow(), 300 * kMs);
  // 300 + the next 50 > 250: both wait for bucket 20 to leave the window (2.0 s).
  EXPECT_EQ(b.DelayBeforeLaunch(), 990 * kMs);
  EXPECT_EQ(a.DelayBeforeLaunch(), 990 * kMs);
  // Alone, b would have gone on: the window is what makes the share the task's.
  ComputePacer alone(250, TenBuckets(), clock);
  alone.OnLaunch();
  alone.OnComplete(50 * kMs);
  EXPECT_EQ(alone.DelayBeforeLaunch(), 0);
  clock.Set(2010 * kMs);
  EXPECT_EQ(a.BusyInWindow(), 0);
  EXPECT_EQ(b.DelayBeforeLaunch(), 0);
}

TEST(ComputePacerTest, ASharedBucketIsNeverTakenBackByALateProcess) {
  FakeClock clock;
  std::atomic<uint64_t> window[kSharedWindowBuckets] = {};
  ComputePacer late(250, Shared(window), clock);  // has seen bucket 20
  clock.Set(2000 * kMs);                          // bucket 40: the same slot as 20
  ComputePacer now(250, Shared(window), clock);
  now.OnComplete(100 * kMs);
  clock.Set(1000 * kMs);   // the late process's clock read came before: its time is for bucket 20
  late.OnComplete(30 * kMs);  // left the window already: dropped, bucket 40 kept
  clock.Set(2000 * kMs);
  EXPECT_EQ(now.BusyInWindow(), 100 * kMs);
  // A word in a slot that is not its bucket's (a damaged file) counts for nothing.
  window[3].store((uint64_t{40} << kWindowBusyBits) | 999);
  EXPECT_EQ(now.BusyInWindow(), 100 * kMs);
}

TEST(ComputePacerTest, ASharedWindowStartsFullOnceForTheTask) {
  FakeClock clock;
  std::atomic<uint64_t> window[kSharedWindowBuckets] = {};
  ComputePacer first(250, Shared(window, true), clock);
  EXPECT_EQ(first.BusyInWindow(), 250 * kMs);
  ComputePacer second(250, Shared(window, true), clock);  // finds it in use: adds nothing
  EXPECT_EQ(second.BusyInWindow(), 250 * kMs);
  EXPECT_EQ(first.BusyInWindow(), 250 * kMs);
}

}  // namespace
}  // namespace gpupool::cuda_limiter
