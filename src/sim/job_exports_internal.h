// Helpers the two job export readers share (sim/job_exports.cc, sim/job_exports_kubectl.cc). Not
// an API: include sim/job_exports.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "sim/job_exports.h"

namespace gpupool::exports_internal {

// The first 64 characters, for quoting untrusted text in a message.
std::string Clip(const std::string& s);
// Whether s[at, at + len) is there and all decimal digits; their value.
bool AllDigits(const std::string& s, size_t at, size_t len);
int64_t Digits(const std::string& s, size_t at, size_t len);
// A whole count of at most 9 digits ("2"); -1 otherwise.
int64_t WholeCount(const std::string& s);
// InvalidArgument when the file is larger than limits.max_file_bytes (checked before reading).
Status CheckFileSize(const std::string& path, const ExportLimits& limits);

// A job with its absolute arrival, in units of which `per_second` make a second.
using ExportRow = std::pair<int64_t, TimedJob>;
// The rows sorted by arrival (ties keep file order), arrivals made relative to the first, in
// seconds (rounded down). InvalidArgument when there are none, naming what was skipped.
Result<ExportRead> Finish(std::vector<ExportRow> rows, std::map<std::string, int64_t> skipped,
                          const std::string& path, int64_t per_second);

}  // namespace gpupool::exports_internal
