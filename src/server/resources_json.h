// Resource maps in the API and the config: {"cpu": "64" | 64, "memory": "512Gi", "gpu": 2.5}.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "sched/queueing.h"

namespace gpupool {

// Parses a resource map; absent components take `absent` (0 for a guarantee, kUnlimited for a
// limit). Errors name `field` and the key.
Result<Resources> ParseResourceMap(const nlohmann::json& j, const std::string& field, int64_t absent);
// Components equal to kUnlimited are left out.
nlohmann::json ResourceMapJson(const Resources& r);

// YAML text -> JSON tree (plain scalars that read as numbers or booleans become numbers/booleans).
Result<nlohmann::json> YamlToJson(const std::string& text);

}  // namespace gpupool
