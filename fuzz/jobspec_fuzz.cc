// libFuzzer target for the job spec codec (src/api/jobspec.h). Each input is parsed as JSON and as
// YAML. Whatever the input, ParseJobSpec must return a value (never throw, crash or trip a
// sanitizer), a refusal must be InvalidArgument with a message the server can put in a JSON
// error, and every accepted spec must survive the round trip
//   ParseJobSpec(JobSpecToJson(job).dump(), kJson) == job
// with the canonical form a fixed point. Any violation aborts, which libFuzzer reports as a crash.
// Run with scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "api/jobspec.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "jobspec_fuzz: %s\n%s\n", what, detail.c_str());
  std::abort();
}

void Check(std::string_view text, gpupool::SpecFormat format) {
  using gpupool::ParseJobSpec;
  gpupool::Result<gpupool::Job> job = ParseJobSpec(text, format);
  if (!job.ok()) {
    if (job.status().code() != gpupool::StatusCode::kInvalidArgument)
      Fail("not InvalidArgument", job.status().ToString());
    try {
      // The server sends the message in a JSON body: it must be valid UTF-8.
      (void)nlohmann::json(job.status().message()).dump();
    } catch (const std::exception& e) {
      Fail("error message is not valid UTF-8", e.what());
    }
    return;
  }
  std::string canonical;
  try {
    canonical = gpupool::JobSpecToJson(*job).dump();
  } catch (const std::exception& e) {
    Fail("JobSpecToJson(job).dump() threw", e.what());
  }
  gpupool::Result<gpupool::Job> again = ParseJobSpec(canonical, gpupool::SpecFormat::kJson);
  if (!again.ok()) Fail("the canonical spec does not parse", again.status().ToString() + "\n" + canonical);
  if (!gpupool::SameJobSpec(*job, *again)) {
    Fail("the round trip changed the job", canonical + "\n" + gpupool::JobSpecToJson(*again).dump());
  }
  if (gpupool::JobSpecToJson(*again).dump() != canonical)
    Fail("the canonical form is not a fixed point", canonical);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Check(text, gpupool::SpecFormat::kJson);
  Check(text, gpupool::SpecFormat::kYaml);
  return 0;
}
