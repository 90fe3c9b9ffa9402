#include "common/rng.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <numeric>
#include <vector>

namespace gpupool {
namespace {

// All tests use fixed seeds: the generator is deterministic, so the statistical checks below give
// the same answer on every run and cannot flake. Their bounds are loose (far beyond what a correct
// generator reaches with these seeds) and still catch a biased or broken mapping.

// Pearson's chi-square statistic of `counts` against a uniform expectation.
double ChiSquare(const std::vector<int64_t>& counts) {
  const double total = static_cast<double>(std::accumulate(counts.begin(), counts.end(), int64_t{0}));
  const double expected = total / static_cast<double>(counts.size());
  double chi2 = 0;
  for (int64_t c : counts) {
    const double d = static_cast<double>(c) - expected;
    chi2 += d * d / expected;
  }
  return chi2;
}

// An Rng that returns a scripted sequence, to check the mapping from raw bits to ranges.
class ScriptedRng final : public Rng {
 public:
  explicit ScriptedRng(std::deque<uint64_t> values) : values_(std::move(values)) {}
  uint64_t Next() override {
    ++calls;
    if (values_.empty()) {
      ADD_FAILURE() << "script exhausted";
      return ~uint64_t{0};  // never rejected for small n, so a test cannot hang
    }
    const uint64_t v = values_.front();
    values_.pop_front();
    return v;
  }
  int calls = 0;

 private:
  std::deque<uint64_t> values_;
};

// ---- SeededRng --------------------------------------------------------------------------------

// Reference xoshiro256** seeded through SplitMix64, written from the published algorithms, to
// check SeededRng is the generator rng.h says it is (runs stay comparable across versions).
class ReferenceXoshiro {
 public:
  explicit ReferenceXoshiro(uint64_t seed) {
    for (auto& word : s_) {
      seed += 0x9e3779b97f4a7c15ULL;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      word = z ^ (z >> 31);
    }
  }
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

TEST(RngTest, SeededRngIsXoshiro256StarStar) {
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{42}, ~uint64_t{0}}) {
    SeededRng rng(seed);
    ReferenceXoshiro ref(seed);
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(rng.Next(), ref.Next()) << "seed " << seed << " draw " << i;
  }
}

TEST(RngTest, SameSeedSameSequence) {
  SeededRng a(12345);
  SeededRng b(12345);
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(a.Next(), b.Next()) << i;
    ASSERT_EQ(a.Uniform(97), b.Uniform(97)) << i;
    ASSERT_EQ(a.UniformDouble(), b.UniformDouble()) << i;
  }
  EXPECT_EQ(a.Permutation(50), b.Permutation(50));
}

// Neighbouring seeds give unrelated streams (SplitMix64 spreads them): no position agrees.
TEST(RngTest, DifferentSeedsDiffer) {
  SeededRng a(1);
  SeededRng b(2);
  int equal = 0;
  for (int i = 0; i < 1000; ++i) equal += a.Next() == b.Next() ? 1 : 0;
  EXPECT_EQ(equal, 0);
  EXPECT_NE(SeededRng(7).Permutation(20), SeededRng(8).Permutation(20));
}

// ---- Uniform ----------------------------------------------------------------------------------

TEST(RngTest, UniformStaysInRange) {
  SeededRng rng(99);
  const uint64_t kMax = std::numeric_limits<uint64_t>::max();
  for (uint64_t n : {uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{7}, uint64_t{10}, uint64_t{1000},
                     (uint64_t{1} << 63) + 1, kMax}) {
    for (int i = 0; i < 2000; ++i) ASSERT_LT(rng.Uniform(n), n) << "n = " << n;
  }
  for (int i = 0; i < 100; ++i) EXPECT_EQ(rng.Uniform(1), 0u);
}

// Every bucket of a small range is hit about equally often. With 10 buckets (9 degrees of freedom)
// chi-square above 40 has probability ~1e-5 for a uniform source; a bias of even a few percent
// in one bucket over 100,000 draws pushes it far beyond.
TEST(RngTest, UniformIsRoughlyUniform) {
  for (uint64_t n : {uint64_t{10}, uint64_t{3}, uint64_t{7}}) {
    SeededRng rng(2024 + n);
    std::vector<int64_t> counts(n, 0);
    const int draws = 100000;
    for (int i = 0; i < draws; ++i) ++counts[rng.Uniform(n)];
    // Threshold: roughly the 1e-5 quantile for n - 1 degrees of freedom, rounded up.
    const double limit = n == 10 ? 40.0 : (n == 7 ? 35.0 : 25.0);
    EXPECT_LT(ChiSquare(counts), limit) << "n = " << n;
    for (int64_t c : counts) EXPECT_GT(c, 0);
  }
}

// Lemire's rejection step matters for ranges that do not divide 2^64. For n = 3 * 2^62, plain
// `Next() % n` would put half of all draws below n / 3; an unbiased draw puts a third there.
TEST(RngTest, UniformIsUnbiasedForLargeRanges) {
  const uint64_t n = uint64_t{3} << 62;
  SeededRng rng(77);
  const int draws = 60000;
  int below_third = 0;
  for (int i = 0; i < draws; ++i) below_third += rng.Uniform(n) < n / 3 ? 1 : 0;
  const double fraction = static_cast<double>(below_third) / draws;
  EXPECT_NEAR(fraction, 1.0 / 3.0, 0.015);  // ~8 standard deviations; 1/2 would be biased
}

// The value comes from the high bits of Next() * n: all-ones maps to n - 1, half-range to n / 2.
TEST(RngTest, UniformMapsHighBits) {
  ScriptedRng top({~uint64_t{0}});
  EXPECT_EQ(top.Uniform(10), 9u);
  EXPECT_EQ(top.calls, 1);
  // 2^63 + 1: 2^63 alone would land exactly on a multiple of 2^64 (low bits 0) and be rejected.
  ScriptedRng half({(uint64_t{1} << 63) + 1});
  EXPECT_EQ(half.Uniform(10), 5u);
  EXPECT_EQ(half.calls, 1);
}

// Draws whose low product bits fall in the biased zone are rejected and redrawn. For n = 10 the
// zone is low < 2^64 mod 10 = 6; Next() == 0 gives low == 0, so it must be redrawn.
TEST(RngTest, UniformRejectsDrawsInTheBiasedZone) {
  ScriptedRng rng({0, ~uint64_t{0}});
  EXPECT_EQ(rng.Uniform(10), 9u);
  EXPECT_EQ(rng.calls, 2);
}

TEST(RngTest, UniformDoubleInUnitInterval) {
  ScriptedRng edges({0, ~uint64_t{0}});
  EXPECT_EQ(edges.UniformDouble(), 0.0);
  EXPECT_LT(edges.UniformDouble(), 1.0);  // all ones maps just below 1, never to 1
  SeededRng rng(5);
  double sum = 0;
  const int draws = 100000;
  std::vector<int64_t> deciles(10, 0);
  for (int i = 0; i < draws; ++i) {
    const double u = rng.UniformDouble();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    ++deciles[static_cast<size_t>(u * 10)];
  }
  EXPECT_NEAR(sum / draws, 0.5, 0.005);  // standard error ~0.0009
  EXPECT_LT(ChiSquare(deciles), 40.0);
}

// ---- Permutation ------------------------------------------------------------------------------

TEST(RngTest, PermutationIsAPermutation) {
  SeededRng rng(31);
  for (uint32_t n : {0u, 1u, 2u, 3u, 10u, 1000u}) {
    std::vector<uint32_t> p = rng.Permutation(n);
    ASSERT_EQ(p.size(), n);
    std::sort(p.begin(), p.end());
    std::vector<uint32_t> identity(n);
    std::iota(identity.begin(), identity.end(), 0u);
    EXPECT_EQ(p, identity) << "n = " << n;
  }
  // 1000 elements left in order would mean the shuffle did nothing (probability 1/1000!).
  std::vector<uint32_t> big = rng.Permutation(1000);
  EXPECT_FALSE(std::is_sorted(big.begin(), big.end()));
}

// Fisher-Yates with an unbiased Uniform gives each of the 3! orders equally often.
TEST(RngTest, PermutationIsRoughlyUniform) {
  SeededRng rng(4242);
  std::map<std::vector<uint32_t>, int64_t> seen;
  const int draws = 60000;
  for (int i = 0; i < draws; ++i) ++seen[rng.Permutation(3)];
  ASSERT_EQ(seen.size(), 6u);
  std::vector<int64_t> counts;
  for (const auto& [perm, count] : seen) counts.push_back(count);
  EXPECT_LT(ChiSquare(counts), 30.0);  // 5 degrees of freedom; ~1e-5 quantile is ~28
  // Every element is equally likely at every position of a longer permutation.
  std::vector<int64_t> first(8, 0);
  for (int i = 0; i < 40000; ++i) ++first[rng.Permutation(8)[0]];
  EXPECT_LT(ChiSquare(first), 37.0);  // 7 degrees of freedom
}

}  // namespace
}  // namespace gpupool
