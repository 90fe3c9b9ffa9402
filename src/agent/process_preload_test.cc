// The agent's reading of a task's CUDA ledger (ReadCudaLedgerPressure): the file is the task's, so
// every shape a hostile task could give it is tried.
#include "agent/process_preload.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "agent/runtime_internal.h"
#include "cuda_limiter/shared_ledger.h"

namespace gpupool {
namespace {

using agent_internal::ReadCudaLedgerPressure;
using cuda_limiter::kLedgerBytes;
using cuda_limiter::kLedgerMagic;
using cuda_limiter::kLedgerPressureOffset;

class LedgerPressureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpupool-pressure-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { (void)agent_internal::RemoveTree(dir_); }
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  // A ledger as the limiter leaves it: the magic, and `pressure` on devices 0 and 3.
  static std::string Ledger(uint64_t magic, uint64_t pressure) {
    std::string bytes(kLedgerBytes, '\0');
    std::memcpy(bytes.data(), &magic, sizeof(magic));
    std::memcpy(bytes.data() + kLedgerPressureOffset, &pressure, sizeof(pressure));
    std::memcpy(bytes.data() + kLedgerPressureOffset + 3 * sizeof(pressure), &pressure, sizeof(pressure));
    return bytes;
  }
  std::string dir_;
};

TEST_F(LedgerPressureTest, ReadsTheCountersOfALedgerAndZerosOfAnEmptyOne) {
  auto counters = ReadCudaLedgerPressure(Write("ledger", Ledger(kLedgerMagic, 7)));
  ASSERT_TRUE(counters.ok()) << counters.status().ToString();
  ASSERT_EQ(counters->size(), cuda_limiter::kMaxDevices);
  EXPECT_EQ((*counters)[0], 7u);
  EXPECT_EQ((*counters)[1], 0u);
  EXPECT_EQ((*counters)[3], 7u);
  // Made by the agent, not yet used by any process of the task; sized, not yet stamped.
  for (const std::string& bytes : {std::string(), std::string(kLedgerBytes, '\0')}) {
    auto empty = ReadCudaLedgerPressure(Write("empty", bytes));
    ASSERT_TRUE(empty.ok()) << empty.status().ToString();
    EXPECT_EQ((*empty)[0], 0u);
  }
}

TEST_F(LedgerPressureTest, WhatATaskCouldPutThereIsAnErrorNeverAHangOrAnOverread) {
  EXPECT_FALSE(ReadCudaLedgerPressure(Write("short", Ledger(kLedgerMagic, 1).substr(0, 100))).ok());
  EXPECT_FALSE(ReadCudaLedgerPressure(Write("long", Ledger(kLedgerMagic, 1) + "x")).ok());
  EXPECT_FALSE(ReadCudaLedgerPressure(Write("magic", Ledger(0x1234, 1))).ok());
  const std::string target = Write("target", Ledger(kLedgerMagic, 1));
  ASSERT_EQ(::symlink(target.c_str(), (dir_ + "/link").c_str()), 0);
  EXPECT_FALSE(ReadCudaLedgerPressure(dir_ + "/link").ok());  // not followed
  ASSERT_EQ(::mkfifo((dir_ + "/fifo").c_str(), 0600), 0);
  auto fifo = ReadCudaLedgerPressure(dir_ + "/fifo");  // returns at once: no writer is waited for
  ASSERT_FALSE(fifo.ok());
  EXPECT_NE(fifo.status().message().find("not a regular file"), std::string::npos) << fifo.status().ToString();
  ASSERT_EQ(::mkdir((dir_ + "/dir").c_str(), 0700), 0);
  EXPECT_FALSE(ReadCudaLedgerPressure(dir_ + "/dir").ok());
  EXPECT_FALSE(ReadCudaLedgerPressure(dir_ + "/missing").ok());
}

}  // namespace
}  // namespace gpupool
