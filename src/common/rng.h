// Randomness is injected: every random choice in the core goes through an Rng that the caller
// owns and seeds, so a run is reproducible from its seed and tests can fix the draws.
#pragma once

#include <cstdint>
#include <vector>

namespace gpupool {

class Rng {
 public:
  virtual ~Rng() = default;
  // 64 uniformly random bits.
  virtual uint64_t Next() = 0;

  // Uniform integer in [0, n). REQUIRES: n > 0. Unbiased (Lemire's multiply-and-reject).
  uint64_t Uniform(uint64_t n);
  // Uniform double in [0, 1).
  double UniformDouble();
  // A uniformly random permutation of 0..n-1 (Fisher-Yates).
  std::vector<uint32_t> Permutation(uint32_t n);
};

// xoshiro256** seeded through SplitMix64: fast, small state, good statistical quality.
// Not thread-safe; give each thread its own.
class SeededRng final : public Rng {
 public:
  explicit SeededRng(uint64_t seed);
  uint64_t Next() override;

 private:
  uint64_t s_[4];
};

}  // namespace gpupool
