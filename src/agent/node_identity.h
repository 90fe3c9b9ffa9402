// What an agent keeps in its state directory about who it is to the server
// (docs/agent.md#node-credentials, docs/agent.md#cluster-identity):
//   <state dir>/node-credential  {"node", "credential"}, mode 0600: the secret the registration
//                                answered; it authenticates the node's heartbeats, assignment
//                                polls and status reports.
//   <state dir>/cluster-id       the id of the pool this node belongs to, written on first contact.
#pragma once

#include <optional>
#include <string>

#include "common/status.h"

namespace gpupool {

std::string NodeCredentialPath(const std::string& state_dir);
std::string ClusterIdPath(const std::string& state_dir);

// The stored credential of `node`; nothing when absent, unreadable, or for another node name.
std::optional<std::string> ReadNodeCredential(const std::string& state_dir, const std::string& node);
// Writes it atomically with mode 0600 (created so: never readable by others, not even briefly).
Status WriteNodeCredential(const std::string& state_dir, const std::string& node, const std::string& credential);
void RemoveNodeCredential(const std::string& state_dir);

// The stored cluster id; "" when none.
std::string ReadClusterId(const std::string& state_dir);
Status WriteClusterId(const std::string& state_dir, const std::string& id);

// The server's placement run id a task of this node was started for (<state dir>/runs/<task>):
// written before the task starts; "" when none was recorded.
Status WritePlacementRun(const std::string& state_dir, const std::string& task, const std::string& run);
std::string ReadPlacementRun(const std::string& state_dir, const std::string& task);
// Once the run's task is removed from its runtime, its placement's record goes too.
void RemovePlacementRun(const std::string& state_dir, const std::string& task);

// A credential as the server issues them: 64 lowercase hex digits.
bool LooksLikeNodeCredential(const std::string& s);

}  // namespace gpupool
