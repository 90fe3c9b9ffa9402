// Fixed-point resource quantities. All arithmetic on resources is integer arithmetic on these,
// so equal stays equal and nothing drifts. Conversions from floating point are explicit, rounded
// to the nearest unit, and reject NaN, infinities, negatives and overflow.
//
//   MilliCpu   1000 = one CPU core
//   MiB        memory and GPU memory in mebibytes
//   MilliGpu   1000 = one whole GPU (the unit of the Alibaba traces)
#pragma once

#include <compare>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace gpupool {

template <typename Tag>
class Quantity {
 public:
  constexpr Quantity() = default;
  constexpr explicit Quantity(int64_t units) : units_(units) {}

  constexpr int64_t units() const { return units_; }
  constexpr bool is_zero() const { return units_ == 0; }

  constexpr auto operator<=>(const Quantity&) const = default;
  constexpr Quantity operator+(Quantity o) const { return Quantity(units_ + o.units_); }
  constexpr Quantity operator-(Quantity o) const { return Quantity(units_ - o.units_); }
  constexpr Quantity& operator+=(Quantity o) {
    units_ += o.units_;
    return *this;
  }
  constexpr Quantity& operator-=(Quantity o) {
    units_ -= o.units_;
    return *this;
  }
  constexpr Quantity operator*(int64_t k) const { return Quantity(units_ * k); }

 private:
  int64_t units_ = 0;
};

struct MilliCpuTag {};
struct MiBTag {};
struct MilliGpuTag {};
using MilliCpu = Quantity<MilliCpuTag>;
using MiB = Quantity<MiBTag>;
using MilliGpu = Quantity<MilliGpuTag>;

inline constexpr MilliGpu kWholeGpu{1000};

// Rounds `value * scale` to the nearest integer (half away from zero). Fails, naming `what`, on
// NaN, infinity, a negative value or a result beyond 2^53 (where doubles stop being exact).
Result<int64_t> RoundToUnits(double value, double scale, const char* what);

// Cores (2.5) -> 2500 mCPU.
Result<MilliCpu> CpuFromCores(double cores);
// Fraction of one GPU (0.25) -> 250 mGPU.
Result<MilliGpu> GpuFromFraction(double fraction);
// GiB (7.5) -> 7680 MiB.
Result<MiB> MemoryFromGiB(double gib);

// Parses a Kubernetes-style quantity: "8Gi", "512Mi", "1.5G", "1024" (bytes), "2Ti".
// Bytes are rounded up to whole MiB so that a request is never understated.
Result<MiB> ParseMemory(const std::string& text);
// Parses CPU: "2", "0.5", "500m".
Result<MilliCpu> ParseCpu(const std::string& text);

std::string FormatMemory(MiB mib);    // "8Gi", "1536Mi"
std::string FormatCpu(MilliCpu cpu);  // "2", "0.5", "2.125"
std::string FormatGpu(MilliGpu gpu);  // "1", "0.25"

}  // namespace gpupool
