// What an agent says of itself at registration and with its heartbeats: where it serves task
// logs and the token it accepts from the server for them. Checked here, before anything is stored.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace gpupool {

struct AgentInfo {
  std::string endpoint;   // http[s]://host:port
  std::string log_token;  // hex
};

// An agent's log endpoint, "http[s]://host:port": the server connects there to read task logs
// for tenants, so a node must not be able to point it at what is no agent. Refused: anything but
// a bare scheme, host and port; ports outside 1..65535; and the addresses no peer serves on
// (IsNonPeerAddress, the rule the server's log reads also apply to whatever a name resolves to).
Status CheckAgentEndpoint(const std::string& endpoint);

// The "agent" member of a registration or heartbeat: {endpoint, logToken}.
Result<AgentInfo> ParseAgentInfo(const nlohmann::json& v);

}  // namespace gpupool
