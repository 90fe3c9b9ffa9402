// The task's shared memory ledger (shared_ledger.h) without the driver: several SharedLedger
// objects on one file stand for several processes (each named by the tag it is given).
#include "cuda_limiter/shared_ledger.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace gpupool::cuda_limiter {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kCap = 10 * kGiB;
using Outcome = SharedLedger::Outcome;

class SharedLedgerTest : public ::testing::Test {
 protected:
  SharedLedgerTest() {
    char dir[] = "/tmp/shared_ledger_XXXXXX";
    if (mkdtemp(dir) != nullptr) dir_ = dir;
    path_ = dir_ + "/ledger";
  }
  ~SharedLedgerTest() override {
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }
  std::unique_ptr<SharedLedger> Open(uint64_t tag = 0) {
    std::string error;
    auto ledger = SharedLedger::Open(path_.c_str(), &error, tag);
    EXPECT_NE(ledger, nullptr) << error;
    return ledger;
  }
  std::string OpenError() {
    std::string error;
    EXPECT_EQ(SharedLedger::Open(path_.c_str(), &error), nullptr);
    return error;
  }

  std::string dir_, path_;
};

// The tag of a process that has exited and been reaped.
uint64_t DeadTag() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  return OwnerTag(child, 1);
}

TEST_F(SharedLedgerTest, TwoProcessesChargeOneCap) {
  auto first = Open(), second = Open();
  EXPECT_EQ(first->Reserve(0, 8 * kGiB, kCap), Outcome::kReserved);
  EXPECT_EQ(second->Reserve(0, 8 * kGiB, kCap), Outcome::kOverCap);  // both are alive
  EXPECT_EQ(second->Reserve(0, 2 * kGiB, kCap), Outcome::kReserved);
  EXPECT_EQ(second->Used(0), kCap);
  EXPECT_EQ(first->Reserve(1, 8 * kGiB, kCap), Outcome::kReserved);  // another device, its own cap
  first->Refund(0, 8 * kGiB);
  EXPECT_EQ(second->Used(0), 2 * kGiB);
  // A process gives back no more than it holds: the other's charge stays.
  second->Refund(0, 8 * kGiB);
  EXPECT_EQ(first->Used(0), 0U);
  EXPECT_EQ(first->Reserve(0, kCap, kCap), Outcome::kReserved);
  first->Refund(0, 20 * kGiB);
  EXPECT_EQ(first->Used(0), 0U);
}

TEST_F(SharedLedgerTest, ADeadProcessesChargeIsReclaimed) {
  auto dead = Open(DeadTag()), alive = Open();
  EXPECT_EQ(dead->Reserve(0, 8 * kGiB, kCap), Outcome::kReserved);
  EXPECT_EQ(alive->Reserve(0, 8 * kGiB, kCap), Outcome::kReserved);  // after reclaiming the dead slot
  EXPECT_EQ(alive->Used(0), 8 * kGiB);
}

TEST_F(SharedLedgerTest, AReusedPidIsNotTakenForItsFormerProcess) {
  const uint64_t self = SelfOwnerTag();
  ASSERT_GT(self >> 22, 0U) << "/proc/self/stat gave no start time";
  EXPECT_FALSE(OwnerDead(self));
  EXPECT_TRUE(OwnerDead(self + (uint64_t{1} << 22)));  // this pid, another start time
  EXPECT_TRUE(OwnerDead(DeadTag()));
}

TEST_F(SharedLedgerTest, WhenEverySlotIsALiveProcessesTheNextIsRefused) {
  std::vector<std::unique_ptr<SharedLedger>> live;
  for (size_t i = 0; i < kLedgerSlots; ++i) {
    live.push_back(Open());
    ASSERT_EQ(live.back()->Reserve(0, 1, kCap), Outcome::kReserved);
  }
  auto one_too_many = Open();
  EXPECT_EQ(one_too_many->Reserve(0, 1, kCap), Outcome::kNoSlot);
  EXPECT_EQ(one_too_many->Used(0), kLedgerSlots);
}

TEST_F(SharedLedgerTest, ConcurrentReservationsNeverPassTheCap) {
  constexpr int kThreads = 8;
  constexpr uint64_t kChunk = 256 << 20;
  std::vector<std::unique_ptr<SharedLedger>> ledgers;
  for (int i = 0; i < kThreads; ++i) ledgers.push_back(Open());
  std::atomic<uint64_t> held{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < 200; ++round) {
        if (ledgers[static_cast<size_t>(i)]->Reserve(0, kChunk, kCap) == Outcome::kReserved) {
          held += kChunk;
          if (round % 3 == 0) {
            ledgers[static_cast<size_t>(i)]->Refund(0, kChunk);
            held -= kChunk;
          }
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(ledgers[0]->Used(0), held.load());
  EXPECT_LE(held.load(), kCap);
}

TEST_F(SharedLedgerTest, AFileThatIsNotALedgerIsRefused) {
  std::ofstream(path_) << "not a ledger";
  chmod(path_.c_str(), 0600);
  EXPECT_NE(OpenError().find("bytes, not a ledger's"), std::string::npos);
  std::ofstream(path_, std::ios::trunc) << std::string(kLedgerBytes, '\x01');
  EXPECT_NE(OpenError().find("header is wrong"), std::string::npos);
  chmod(path_.c_str(), 0660);
  EXPECT_NE(OpenError().find("mode 0600"), std::string::npos);
  unlink(path_.c_str());
  std::ofstream(dir_ + "/target") << "";
  chmod((dir_ + "/target").c_str(), 0600);
  ASSERT_EQ(symlink((dir_ + "/target").c_str(), path_.c_str()), 0);
  EXPECT_NE(OpenError().find("a symlink"), std::string::npos);
  unlink((dir_ + "/target").c_str());
}

TEST_F(SharedLedgerTest, AMemoryLedgerChargesTheSharedOneOnCappedDevicesOnly) {
  auto first = Open(), second = Open();
  Limits limits;
  limits.memory_bytes = {kCap, 0};
  MemoryLedger a(limits, first.get()), b(limits, second.get());
  EXPECT_TRUE(a.Reserve(0, 6 * kGiB));
  a.Record({AllocationKey::Kind::kPointer, 1}, 0, 6 * kGiB, 7);
  EXPECT_FALSE(b.Reserve(0, 6 * kGiB));
  EXPECT_EQ(b.TakeProblem(), LedgerProblem::kNone);  // the cap, nothing wrong
  EXPECT_EQ(b.Used(0), 6 * kGiB);                    // the task's use
  EXPECT_EQ(b.Report(0, 80 * kGiB, 80 * kGiB).free, 4 * kGiB);
  EXPECT_TRUE(b.Reserve(1, 60 * kGiB));  // device 1 has no cap: not charged
  EXPECT_EQ(first->Used(1), 0U);
  EXPECT_EQ(a.ReleaseOwner(7), 6 * kGiB);
  EXPECT_TRUE(b.Reserve(0, 6 * kGiB));
  b.Unreserve(0, 6 * kGiB);
  EXPECT_EQ(first->Used(0), 0U);
}

TEST_F(SharedLedgerTest, AForkedChildStartsWithNothingOfItsParents) {
  auto shared = Open();
  Limits limits;
  limits.memory_bytes = {kCap};
  MemoryLedger ledger(limits, shared.get());
  ASSERT_TRUE(ledger.Reserve(0, 4 * kGiB));
  ledger.Record({AllocationKey::Kind::kPointer, 1}, 0, 4 * kGiB, 0);
  ledger.BeforeFork();
  const pid_t child = fork();
  if (child == 0) {
    ledger.AfterForkInChild();
    // The parent's allocation is not the child's to free; the child charges a slot of its own.
    const bool ok = !ledger.Release({AllocationKey::Kind::kPointer, 1}) && ledger.Reserve(0, 6 * kGiB) &&
                    !ledger.Reserve(0, 1) && ledger.Used(0) == kCap;
    _exit(ok ? 0 : 1);
  }
  ledger.AfterForkInParent();
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // The child is gone: its 6 GiB come back when needed.
  EXPECT_TRUE(ledger.Reserve(0, 6 * kGiB));
  EXPECT_EQ(ledger.Used(0), kCap);
}

}  // namespace
}  // namespace gpupool::cuda_limiter
