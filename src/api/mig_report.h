// The MIG layout an agent reports for a GPU (docs/api.md, "MIG layout"), in its registration body
// (gpus[i].migInstances) and in heartbeats (gpus[i].migInstances):
//   "migInstances": [{"profileId": 9, "start": 4}, {"profileId": 19, "start": 0}]
// one entry per GPU instance that exists, whether or not a task uses it. Checked for shape here
// (at most 8 entries, each an object with exactly an integer profileId 0..1023 and start 0..7);
// against the GPU's geometry by the ledger (Ledger::CheckMigPresent). It is not part of the node's
// inventory: a node whose layout changed registers again as the same node.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/mig.h"

namespace gpupool {

inline constexpr size_t kMaxReportedMigInstances = 8;

Result<std::vector<MigInstance>> ParseMigInstances(const nlohmann::json& j, const std::string& path);

// Takes "migInstances" out of every entry of a registration body's "gpus" and parses it: (GPU
// index, instances) pairs, the index being the entry's integer "index" or else its position. A body
// without gpus gives none; a malformed list fails naming it, and the body is then left as it was.
Result<std::vector<std::pair<int, std::vector<MigInstance>>>> TakeMigInstances(nlohmann::json& body);

nlohmann::json MigInstancesToJson(const std::vector<MigInstance>& instances);

}  // namespace gpupool
