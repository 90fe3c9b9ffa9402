// Spec text to a JSON tree: JSON with duplicate names and nesting refused, YAML read by the YAML
// 1.2 core schema with its size, depth, alias and document limits (internal to gpupool_api; the
// job spec reads both, the API's bodies are JSON).
#pragma once

#include <string_view>

#include "api/fields.h"
#include "api/jobspec.h"

namespace gpupool::api_internal {

// Errors are InvalidArgument "<field path>: <reason>" like every other spec error (fields.h).
Result<Json> ParseJsonText(std::string_view text, const JobSpecLimits& limits);
Result<Json> ParseYamlText(std::string_view text, const JobSpecLimits& limits);

}  // namespace gpupool::api_internal
