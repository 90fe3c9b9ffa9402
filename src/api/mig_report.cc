#include "api/mig_report.h"

#include <fmt/format.h>

namespace gpupool {

namespace {

Result<int> IntField(const nlohmann::json& entry, const char* key, int lo, int hi, const std::string& path) {
  const auto it = entry.find(key);
  if (it == entry.end()) return Status::InvalidArgument(fmt::format("{}: needs {}", path, key));
  if (!it->is_number_integer())
    return Status::InvalidArgument(fmt::format("{}.{}: must be an integer", path, key));
  // Signed or unsigned, compared as 64-bit values so a huge one is refused, never wrapped.
  const bool in_range = it->is_number_unsigned() ? it->get<uint64_t>() <= static_cast<uint64_t>(hi)
                                                 : it->get<int64_t>() >= lo && it->get<int64_t>() <= hi;
  if (!in_range) return Status::InvalidArgument(fmt::format("{}.{}: must be {} to {}", path, key, lo, hi));
  return static_cast<int>(it->get<int64_t>());
}

}  // namespace

Result<std::vector<MigInstance>> ParseMigInstances(const nlohmann::json& j, const std::string& path) {
  if (!j.is_array()) return Status::InvalidArgument(fmt::format("{}: must be a list", path));
  if (j.size() > kMaxReportedMigInstances)
    return Status::InvalidArgument(
        fmt::format("{}: {} entries; a GPU has at most {} MIG instances", path, j.size(), kMaxReportedMigInstances));
  std::vector<MigInstance> out;
  out.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string where = fmt::format("{}[{}]", path, i);
    const nlohmann::json& e = j[i];
    if (!e.is_object()) return Status::InvalidArgument(where + ": must be an object {profileId, start}");
    for (auto it = e.begin(); it != e.end(); ++it) {
      if (it.key() != "profileId" && it.key() != "start")
        return Status::InvalidArgument(fmt::format("{}.{}: unknown field (known: profileId, start)", where,
                                                   it.key().substr(0, 64)));
    }
    MigInstance m;
    ASSIGN_OR_RETURN(m.profile_id, IntField(e, "profileId", 0, 1023, where));
    ASSIGN_OR_RETURN(m.start, IntField(e, "start", 0, 7, where));
    out.push_back(m);
  }
  return out;
}

Result<std::vector<std::pair<int, std::vector<MigInstance>>>> TakeMigInstances(nlohmann::json& body) {
  std::vector<std::pair<int, std::vector<MigInstance>>> out;
  if (!body.is_object()) return out;
  const auto gpus = body.find("gpus");
  if (gpus == body.end() || !gpus->is_array()) return out;  // ParseNodeSpec says what is wrong
  std::vector<size_t> with;
  for (size_t i = 0; i < gpus->size(); ++i) {
    const nlohmann::json& g = (*gpus)[i];
    if (!g.is_object() || !g.contains("migInstances")) continue;
    const std::string path = fmt::format("gpus[{}].migInstances", i);
    ASSIGN_OR_RETURN(std::vector<MigInstance> instances, ParseMigInstances(g["migInstances"], path));
    int index = static_cast<int>(i);
    if (const auto at = g.find("index"); at != g.end() && at->is_number_integer() && at->get<int64_t>() >= 0 &&
                                         at->get<int64_t>() < 1024)
      index = static_cast<int>(at->get<int64_t>());
    out.emplace_back(index, std::move(instances));
    with.push_back(i);
  }
  for (size_t i : with) (*gpus)[i].erase("migInstances");
  return out;
}

nlohmann::json MigInstancesToJson(const std::vector<MigInstance>& instances) {
  nlohmann::json out = nlohmann::json::array();
  for (const MigInstance& m : instances) out.push_back({{"profileId", m.profile_id}, {"start", m.start}});
  return out;
}

}  // namespace gpupool
