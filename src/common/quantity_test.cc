#include "common/quantity.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

namespace gpupool {
namespace {

// True when `st` failed with InvalidArgument and its message contains `needle`.
::testing::AssertionResult InvalidNaming(const Status& st, const std::string& needle) {
  if (st.ok()) return ::testing::AssertionFailure() << "unexpectedly OK";
  if (st.code() != StatusCode::kInvalidArgument) return ::testing::AssertionFailure() << st.ToString();
  if (st.message().find(needle) == std::string::npos) {
    return ::testing::AssertionFailure() << "'" << st.message() << "' does not mention '" << needle << "'";
  }
  return ::testing::AssertionSuccess();
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- Quantity arithmetic ----------------------------------------------------------------------

// Integer arithmetic, usable at compile time; the tags keep CPU, memory and GPU apart.
TEST(QuantityTest, ArithmeticAndComparison) {
  static_assert(MilliCpu(1500) + MilliCpu(500) == MilliCpu(2000));
  static_assert(MiB(1024) - MiB(24) == MiB(1000));
  static_assert(MilliGpu(250) * 4 == kWholeGpu);
  static_assert(MilliGpu(999) < kWholeGpu);
  static_assert(MiB().is_zero());
  MilliCpu c(100);
  c += MilliCpu(50);
  EXPECT_EQ(c.units(), 150);
  c -= MilliCpu(150);
  EXPECT_TRUE(c.is_zero());
}

// ---- From floating point: explicit rounding ---------------------------------------------------

TEST(QuantityTest, CpuFromCoresRoundsToNearestMilli) {
  EXPECT_EQ(CpuFromCores(2.5)->units(), 2500);
  EXPECT_EQ(CpuFromCores(0.0)->units(), 0);
  EXPECT_EQ(CpuFromCores(1.0)->units(), 1000);
  // Half a milli-CPU rounds away from zero, less than half rounds down: no silent truncation.
  EXPECT_EQ(CpuFromCores(0.0005)->units(), 1);
  EXPECT_EQ(CpuFromCores(0.0004)->units(), 0);
  EXPECT_EQ(CpuFromCores(0.0015)->units(), 2);
  // 0.1 is not exact in binary; rounding still lands on 100. 1.9999 cores is 1999.9 mCPU, which
  // rounds to 2000 where truncation would give 1999.
  EXPECT_EQ(CpuFromCores(0.1)->units(), 100);
  EXPECT_EQ(CpuFromCores(1.9999)->units(), 2000);
}

TEST(QuantityTest, GpuAndMemoryFromFloatingPoint) {
  EXPECT_EQ(GpuFromFraction(0.25)->units(), 250);
  EXPECT_EQ(GpuFromFraction(1.0)->units(), 1000);
  EXPECT_EQ(GpuFromFraction(0.0005)->units(), 1);
  EXPECT_EQ(MemoryFromGiB(7.5)->units(), 7680);
  EXPECT_EQ(MemoryFromGiB(8)->units(), 8192);
  EXPECT_EQ(MemoryFromGiB(0.0005)->units(), 1);  // 0.512 MiB rounds to 1
}

TEST(QuantityTest, RoundToUnitsRoundsHalfAwayFromZero) {
  EXPECT_EQ(*RoundToUnits(2.5, 1.0, "x"), 3);
  EXPECT_EQ(*RoundToUnits(2.4999, 1.0, "x"), 2);
  EXPECT_EQ(*RoundToUnits(0.5, 1.0, "x"), 1);
  EXPECT_EQ(*RoundToUnits(3.0, 1000.0, "x"), 3000);
}

// NaN, infinities and negatives are rejected, and the message names the quantity so the user can
// tell which field of a request was wrong.
TEST(QuantityTest, RejectsNonFiniteAndNegativeNamingTheQuantity) {
  for (double bad : {kNaN, kInf, -kInf}) {
    EXPECT_TRUE(InvalidNaming(CpuFromCores(bad).status(), "cpu")) << bad;
    EXPECT_TRUE(InvalidNaming(CpuFromCores(bad).status(), "finite")) << bad;
    EXPECT_TRUE(InvalidNaming(GpuFromFraction(bad).status(), "gpu")) << bad;
    EXPECT_TRUE(InvalidNaming(MemoryFromGiB(bad).status(), "memory")) << bad;
  }
  EXPECT_TRUE(InvalidNaming(CpuFromCores(-1).status(), "cpu must not be negative"));
  EXPECT_TRUE(InvalidNaming(CpuFromCores(-0.0001).status(), "negative"));
  EXPECT_TRUE(InvalidNaming(GpuFromFraction(-0.5).status(), "gpu must not be negative"));
  EXPECT_TRUE(InvalidNaming(MemoryFromGiB(-2).status(), "memory must not be negative"));
  EXPECT_TRUE(InvalidNaming(RoundToUnits(kNaN, 1.0, "fgd.weight").status(), "fgd.weight"));
}

// Beyond 2^53 doubles are no longer exact integers, so the conversion refuses rather than guess.
TEST(QuantityTest, RejectsValuesTooLargeToBeExact) {
  EXPECT_TRUE(InvalidNaming(CpuFromCores(1e13).status(), "cpu is too large"));  // 1e16 mCPU
  EXPECT_TRUE(InvalidNaming(MemoryFromGiB(1e300).status(), "memory is too large"));
  EXPECT_TRUE(CpuFromCores(1e12).ok());  // 1e15 mCPU is still exact
}

// ---- ParseMemory ------------------------------------------------------------------------------

TEST(QuantityTest, ParseMemoryBinaryUnits) {
  EXPECT_EQ(ParseMemory("8Gi")->units(), 8192);
  EXPECT_EQ(ParseMemory("512Mi")->units(), 512);
  EXPECT_EQ(ParseMemory("1.5Gi")->units(), 1536);
  EXPECT_EQ(ParseMemory("2Ti")->units(), 2 * 1024 * 1024);
  EXPECT_EQ(ParseMemory("1024Ki")->units(), 1);
  EXPECT_EQ(ParseMemory("0")->units(), 0);
  EXPECT_EQ(ParseMemory("0Gi")->units(), 0);
}

// Decimal units and plain bytes do not divide into MiB; they round *up* so a request is never
// understated.
TEST(QuantityTest, ParseMemoryRoundsUpToWholeMiB) {
  EXPECT_EQ(ParseMemory("1.5G")->units(), 1431);  // 1.5e9 B = 1430.51 MiB
  EXPECT_EQ(ParseMemory("1G")->units(), 954);     // 1e9 B = 953.67 MiB
  EXPECT_EQ(ParseMemory("1M")->units(), 1);       // 0.95 MiB
  EXPECT_EQ(ParseMemory("1")->units(), 1);        // one byte still takes a MiB
  EXPECT_EQ(ParseMemory("1Ki")->units(), 1);
  EXPECT_EQ(ParseMemory("2k")->units(), 1);
  EXPECT_EQ(ParseMemory("1048576")->units(), 1);   // exactly 1 MiB of bytes
  EXPECT_EQ(ParseMemory("1048577")->units(), 2);   // one byte more
  EXPECT_EQ(ParseMemory("1.1Gi")->units(), 1127);  // 1126.4 MiB
  EXPECT_EQ(ParseMemory("1T")->units(), 953675);   // 1e12 B = 953674.3 MiB
}

// A value that is a whole number of MiB except for floating-point noise does not round up by one.
TEST(QuantityTest, ParseMemoryForgivesFloatingPointNoise) {
  EXPECT_EQ(ParseMemory("0.1Gi")->units(), 103);  // 102.4 -> 103, a genuine fraction
  EXPECT_EQ(ParseMemory("0.5Gi")->units(), 512);
  EXPECT_EQ(ParseMemory("100Mi")->units(), 100);
  EXPECT_EQ(ParseMemory("0.3Mi")->units(), 1);
}

TEST(QuantityTest, ParseMemoryRejectsBadInput) {
  const Status unit = ParseMemory("8GB").status();
  EXPECT_TRUE(InvalidNaming(unit, "unknown unit 'GB'"));
  EXPECT_TRUE(InvalidNaming(unit, "memory '8GB'"));
  EXPECT_TRUE(InvalidNaming(ParseMemory("8gi").status(), "unknown unit"));  // units are case-sensitive
  EXPECT_TRUE(InvalidNaming(ParseMemory("8 Gi").status(), "unknown unit"));
  EXPECT_TRUE(InvalidNaming(ParseMemory("").status(), "memory is empty"));
  EXPECT_TRUE(InvalidNaming(ParseMemory("Gi").status(), "not a number"));
  EXPECT_TRUE(InvalidNaming(ParseMemory("-1Gi").status(), "non-negative"));
  EXPECT_TRUE(InvalidNaming(ParseMemory("nan").status(), "memory"));
  EXPECT_TRUE(InvalidNaming(ParseMemory("infGi").status(), "memory"));
  EXPECT_TRUE(InvalidNaming(ParseMemory("1e400").status(), "memory"));  // overflows a double
  EXPECT_TRUE(InvalidNaming(ParseMemory("1e30Ti").status(), "too large"));
}

// ---- ParseCpu ---------------------------------------------------------------------------------

TEST(QuantityTest, ParseCpu) {
  EXPECT_EQ(ParseCpu("500m")->units(), 500);
  EXPECT_EQ(ParseCpu("2")->units(), 2000);
  EXPECT_EQ(ParseCpu("0.25")->units(), 250);
  EXPECT_EQ(ParseCpu("0.5")->units(), 500);
  EXPECT_EQ(ParseCpu("2.125")->units(), 2125);
  EXPECT_EQ(ParseCpu("0")->units(), 0);
  EXPECT_EQ(ParseCpu("0m")->units(), 0);
  // Fractions of a milli-CPU round to the nearest, as with CpuFromCores.
  EXPECT_EQ(ParseCpu("1.5m")->units(), 2);
  EXPECT_EQ(ParseCpu("0.0004")->units(), 0);
}

TEST(QuantityTest, ParseCpuRejectsBadInput) {
  const Status unit = ParseCpu("2c").status();
  EXPECT_TRUE(InvalidNaming(unit, "unknown unit 'c'"));
  EXPECT_TRUE(InvalidNaming(unit, "cpu '2c'"));
  EXPECT_TRUE(InvalidNaming(ParseCpu("2Gi").status(), "unknown unit"));
  EXPECT_TRUE(InvalidNaming(ParseCpu("").status(), "cpu is empty"));
  EXPECT_TRUE(InvalidNaming(ParseCpu("m").status(), "not a number"));
  EXPECT_TRUE(InvalidNaming(ParseCpu("-1").status(), "cpu must not be negative"));
  EXPECT_TRUE(InvalidNaming(ParseCpu("-500m").status(), "cpu must not be negative"));
  EXPECT_TRUE(InvalidNaming(ParseCpu("nan").status(), "cpu must be a finite number"));
  EXPECT_TRUE(InvalidNaming(ParseCpu("inf").status(), "cpu"));
}

// ---- Formatting -------------------------------------------------------------------------------

TEST(QuantityTest, FormatMemoryPicksTheLargestExactUnit) {
  EXPECT_EQ(FormatMemory(MiB(8192)), "8Gi");
  EXPECT_EQ(FormatMemory(MiB(1536)), "1536Mi");  // 1.5Gi is not whole: stays in Mi
  EXPECT_EQ(FormatMemory(MiB(512)), "512Mi");
  EXPECT_EQ(FormatMemory(MiB(1)), "1Mi");
  EXPECT_EQ(FormatMemory(MiB(0)), "0Mi");
  EXPECT_EQ(FormatMemory(MiB(1024 * 1024)), "1Ti");
  EXPECT_EQ(FormatMemory(MiB(1024 * 1024 + 1024)), "1025Gi");
}

TEST(QuantityTest, FormatCpuAndGpuAsDecimalsWithoutTrailingZeros) {
  EXPECT_EQ(FormatCpu(MilliCpu(2000)), "2");
  EXPECT_EQ(FormatCpu(MilliCpu(500)), "0.5");
  EXPECT_EQ(FormatCpu(MilliCpu(2125)), "2.125");
  EXPECT_EQ(FormatCpu(MilliCpu(10)), "0.01");
  EXPECT_EQ(FormatCpu(MilliCpu(1)), "0.001");
  EXPECT_EQ(FormatCpu(MilliCpu(0)), "0");
  EXPECT_EQ(FormatGpu(kWholeGpu), "1");
  EXPECT_EQ(FormatGpu(MilliGpu(250)), "0.25");
  EXPECT_EQ(FormatGpu(MilliGpu(2500)), "2.5");
  EXPECT_EQ(FormatGpu(MilliGpu(0)), "0");
  // Negative amounts (a deficit in a report), down to the smallest one there is.
  EXPECT_EQ(FormatCpu(MilliCpu(-1500)), "-1.5");
  EXPECT_EQ(FormatGpu(MilliGpu(-250)), "-0.25");
  EXPECT_EQ(FormatCpu(MilliCpu(-3000)), "-3");
  EXPECT_EQ(FormatCpu(MilliCpu(std::numeric_limits<int64_t>::min())), "-9223372036854775.808");
}

// Formatting then parsing gives back the same quantity: Format* loses nothing.
TEST(QuantityTest, FormatParseRoundTrips) {
  for (int64_t m = 0; m <= 5000; ++m) {
    const MilliCpu cpu(m);
    const Result<MilliCpu> back = ParseCpu(FormatCpu(cpu));
    ASSERT_TRUE(back.ok()) << FormatCpu(cpu) << ": " << back.status().ToString();
    ASSERT_EQ(*back, cpu) << FormatCpu(cpu);
  }
  for (int64_t m : {int64_t{123456789}, int64_t{1} << 40, int64_t{999999999999}}) {
    ASSERT_EQ(*ParseCpu(FormatCpu(MilliCpu(m))), MilliCpu(m)) << m;
  }
  for (int64_t mib = 0; mib <= 5000; ++mib) {
    const Result<MiB> back = ParseMemory(FormatMemory(MiB(mib)));
    ASSERT_TRUE(back.ok()) << FormatMemory(MiB(mib)) << ": " << back.status().ToString();
    ASSERT_EQ(back->units(), mib) << FormatMemory(MiB(mib));
  }
  for (int64_t mib :
       {int64_t{1024} * 1024, int64_t{3} * 1024 * 1024, int64_t{1024} * 1024 + 1024, int64_t{1} << 33}) {
    ASSERT_EQ(ParseMemory(FormatMemory(MiB(mib)))->units(), mib) << mib;
  }
}

}  // namespace
}  // namespace gpupool

namespace gpupool {
namespace {
TEST(QuantityFormatTest, NegativeAmountsKeepTheirSign) {
  EXPECT_EQ(FormatCpu(MilliCpu(-1500)), "-1.5");
  EXPECT_EQ(FormatGpu(MilliGpu(-250)), "-0.25");
  EXPECT_EQ(FormatCpu(MilliCpu(-2000)), "-2");
}
}  // namespace
}  // namespace gpupool
