#include "sim/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

namespace gpupool {
namespace {

TEST(ParallelForTest, RunsEveryIndexOnce) {
  for (int jobs : {-1, 0, 1, 3, 64}) {
    std::vector<std::atomic<int>> calls(100);
    const Status s = ParallelFor(calls.size(), jobs, [&](size_t i) {
      ++calls[i];
      return Status::Ok();
    });
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (size_t i = 0; i < calls.size(); ++i)
      EXPECT_EQ(calls[i].load(), 1) << "jobs " << jobs << " index " << i;
  }
  EXPECT_TRUE(ParallelFor(0, 4, [](size_t) { return Status::Internal("never called"); }).ok());
}

TEST(ParallelForTest, ReturnsTheLowestFailedIndex) {
  // One worker: indices run in order and stop at the first failure.
  std::atomic<int> calls{0};
  Status s = ParallelFor(10, 1, [&](size_t i) {
    ++calls;
    return i >= 3 ? Status::InvalidArgument(std::to_string(i)) : Status::Ok();
  });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "3");
  EXPECT_EQ(calls.load(), 4);
  // Several workers: whichever fails first, the lowest index that failed is reported.
  s = ParallelFor(
      8, 4, [&](size_t i) { return i % 2 == 1 ? Status::InvalidArgument(std::to_string(i)) : Status::Ok(); });
  EXPECT_EQ(s.message(), "1");
}

TEST(ParallelForTest, ExceptionsBecomeErrors) {
  const Status s = ParallelFor(4, 2, [](size_t i) -> Status {
    if (i == 2) throw std::runtime_error("boom");
    return Status::Ok();
  });
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("boom"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace gpupool
