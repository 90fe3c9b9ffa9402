// The config loader's parts (config.cc, config_people.cc): reading typed fields with errors that
// name the key, and the sections parsed in their own file.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "common/status.h"
#include "server/config.h"

namespace gpupool::config_internal {

inline Status CheckKeys(const nlohmann::json& j, const std::string& where,
                        const std::set<std::string>& known) {
  if (!j.is_object()) return Status::InvalidArgument(where + ": must be a map");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!known.count(it.key())) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      return Status::InvalidArgument(
          fmt::format("{}{}{}: unknown key (known: {})", where, where.empty() ? "" : ".", it.key(), list));
    }
  }
  return Status::Ok();
}

inline Result<int64_t> GetInt(const nlohmann::json& j, const std::string& where, int64_t lo, int64_t hi) {
  if (!j.is_number_integer()) return Status::InvalidArgument(where + ": must be an integer");
  const int64_t v = j.get<int64_t>();
  if (v < lo || v > hi) return Status::InvalidArgument(fmt::format("{}: must be in [{}, {}]", where, lo, hi));
  return v;
}

inline Result<std::string> GetString(const nlohmann::json& j, const std::string& where) {
  if (!j.is_string()) return Status::InvalidArgument(where + ": must be a string");
  return j.get<std::string>();
}

inline Result<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::IoError("cannot read token file " + path);
  std::string token;
  std::getline(in, token);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  if (token.empty()) return Status::InvalidArgument("token file " + path + " is empty");
  return token;
}

// tokens: [{token | tokenFile, role, tenant}] into c.tokens.
Status ParseTokens(const nlohmann::json& list, ServerConfig& c);
// tenants: {name: {weight, maxPendingJobs, maxPendingTasks, uid, gid, namespaces}} into the
// tenants' weights, limits, sandbox identities (every uid one tenant's) and namespaces.
Status ParseTenants(const nlohmann::json& t, ServerConfig& c);

}  // namespace gpupool::config_internal
