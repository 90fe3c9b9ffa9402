#include "common/quantity.h"

#include <fmt/format.h>

#include <cerrno>
#include <iterator>
#include <cmath>
#include <cstdlib>

namespace gpupool {

Result<int64_t> RoundToUnits(double value, double scale, const char* what) {
  if (std::isnan(value) || std::isinf(value)) {
    return Status::InvalidArgument(fmt::format("{} must be a finite number", what));
  }
  if (value < 0) return Status::InvalidArgument(fmt::format("{} must not be negative, got {}", what, value));
  const double scaled = value * scale;
  constexpr double kMaxExact = 9007199254740992.0;  // 2^53
  if (scaled >= kMaxExact) return Status::InvalidArgument(fmt::format("{} is too large: {}", what, value));
  return static_cast<int64_t>(std::llround(scaled));
}

Result<MilliCpu> CpuFromCores(double cores) {
  ASSIGN_OR_RETURN(int64_t units, RoundToUnits(cores, 1000.0, "cpu"));
  return MilliCpu(units);
}

Result<MilliGpu> GpuFromFraction(double fraction) {
  ASSIGN_OR_RETURN(int64_t units, RoundToUnits(fraction, 1000.0, "gpu"));
  return MilliGpu(units);
}

Result<MiB> MemoryFromGiB(double gib) {
  ASSIGN_OR_RETURN(int64_t units, RoundToUnits(gib, 1024.0, "memory"));
  return MiB(units);
}

namespace {

// Splits "1.5Gi" into 1.5 and "Gi". Fails on an empty or non-numeric prefix.
Status SplitNumber(const std::string& text, const char* what, double* number, std::string* suffix) {
  if (text.empty()) return Status::InvalidArgument(fmt::format("{} is empty", what));
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(begin, &end);
  if (end == begin || errno == ERANGE) {
    return Status::InvalidArgument(fmt::format("{} '{}' is not a number with an optional unit", what, text));
  }
  *number = v;
  *suffix = std::string(end);
  return Status::Ok();
}

}  // namespace

Result<MiB> ParseMemory(const std::string& text) {
  double v = 0;
  std::string suffix;
  RETURN_IF_ERROR(SplitNumber(text, "memory", &v, &suffix));
  double bytes_per_unit = 0;
  if (suffix.empty())
    bytes_per_unit = 1;
  else if (suffix == "Ki")
    bytes_per_unit = 1024.0;
  else if (suffix == "Mi")
    bytes_per_unit = 1024.0 * 1024;
  else if (suffix == "Gi")
    bytes_per_unit = 1024.0 * 1024 * 1024;
  else if (suffix == "Ti")
    bytes_per_unit = 1024.0 * 1024 * 1024 * 1024;
  else if (suffix == "k" || suffix == "K")
    bytes_per_unit = 1e3;
  else if (suffix == "M")
    bytes_per_unit = 1e6;
  else if (suffix == "G")
    bytes_per_unit = 1e9;
  else if (suffix == "T")
    bytes_per_unit = 1e12;
  else {
    return Status::InvalidArgument(fmt::format(
        "memory '{}' has unknown unit '{}' (use Ki, Mi, Gi, Ti, k, M, G, T or bytes)", text, suffix));
  }
  if (std::isnan(v) || std::isinf(v) || v < 0) {
    return Status::InvalidArgument(fmt::format("memory '{}' must be a finite, non-negative amount", text));
  }
  const double mib = v * bytes_per_unit / (1024.0 * 1024.0);
  if (mib >= 9007199254740992.0)
    return Status::InvalidArgument(fmt::format("memory '{}' is too large", text));
  // Round up, but forgive the last bits of floating-point noise ("1.1Gi").
  const double rounded = std::ceil(mib - 1e-9);
  return MiB(static_cast<int64_t>(rounded < 0 ? 0 : rounded));
}

Result<MilliCpu> ParseCpu(const std::string& text) {
  double v = 0;
  std::string suffix;
  RETURN_IF_ERROR(SplitNumber(text, "cpu", &v, &suffix));
  if (suffix == "m") {
    ASSIGN_OR_RETURN(int64_t units, RoundToUnits(v, 1.0, "cpu"));
    return MilliCpu(units);
  }
  if (!suffix.empty()) {
    return Status::InvalidArgument(
        fmt::format("cpu '{}' has unknown unit '{}' (use cores or 'm')", text, suffix));
  }
  return CpuFromCores(v);
}

namespace {
std::string FormatMilli(int64_t milli) {
  // Work on the magnitude as unsigned, so INT64_MIN has one too.
  const bool negative = milli < 0;
  const uint64_t mag = negative ? 0 - static_cast<uint64_t>(milli) : static_cast<uint64_t>(milli);
  std::string s = fmt::format("{}{}", negative ? "-" : "", mag / 1000);
  if (mag % 1000 == 0) return s;
  fmt::format_to(std::back_inserter(s), ".{:03d}", mag % 1000);
  while (s.back() == '0') s.pop_back();
  return s;
}
}  // namespace

std::string FormatCpu(MilliCpu cpu) {
  return FormatMilli(cpu.units());
}
std::string FormatGpu(MilliGpu gpu) {
  return FormatMilli(gpu.units());
}

std::string FormatMemory(MiB mib) {
  const int64_t v = mib.units();
  if (v != 0 && v % (1024 * 1024) == 0) return fmt::format("{}Ti", v / (1024 * 1024));
  if (v != 0 && v % 1024 == 0) return fmt::format("{}Gi", v / 1024);
  return fmt::format("{}Mi", v);
}

}  // namespace gpupool
