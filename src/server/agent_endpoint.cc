#include "server/agent_endpoint.h"

#include <fmt/format.h>

#include <charconv>
#include <string_view>

#include <boost/asio/ip/address.hpp>

#include "client/api_client.h"

namespace gpupool {

Status CheckAgentEndpoint(const std::string& endpoint) {
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument(fmt::format("agent.endpoint: {}, got '{}'", why, endpoint.substr(0, 256)));
  };
  if (endpoint.size() > 256) return bad("at most 256 characters");
  std::string_view rest = endpoint;
  if (rest.starts_with("http://")) {
    rest.remove_prefix(7);
  } else if (rest.starts_with("https://")) {
    rest.remove_prefix(8);
  } else {
    return bad("must be http://host:port or https://host:port");
  }
  const bool bracketed = rest.starts_with("[");
  std::string_view host;
  std::string_view port;
  if (bracketed) {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos || close + 1 >= rest.size() || rest[close + 1] != ':')
      return bad("must be http[s]://host:port");
    host = rest.substr(1, close - 1);
    port = rest.substr(close + 2);
  } else {
    const size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos) return bad("must name a port: http[s]://host:port");
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  if (host.empty() || host.find_first_of(" /?#@[]\\") != std::string_view::npos ||
      (!bracketed && host.find(':') != std::string_view::npos))
    return bad("must be http[s]://host:port");
  int port_number = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), port_number);
  if (ec != std::errc() || end != port.data() + port.size() || port_number < 1 || port_number > 65535)
    return bad("the port must be 1 to 65535");
  boost::system::error_code parse_error;
  const auto address = boost::asio::ip::make_address(std::string(host), parse_error);
  if (bracketed && (parse_error || !address.is_v6())) return bad("[...] must hold an IPv6 address");
  if (parse_error && host.find_first_not_of("0123456789.") == std::string_view::npos)
    return bad("not an IPv4 address");
  if (IsNonPeerAddress(host))
    return bad("not an address an agent serves on (unspecified, link-local, multicast or broadcast)");
  return Status::Ok();
}

Result<AgentInfo> ParseAgentInfo(const nlohmann::json& v) {
  if (!v.is_object()) return Status::InvalidArgument("agent: must be an object {endpoint, logToken}");
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it.key() != "endpoint" && it.key() != "logToken")
      return Status::InvalidArgument(
          fmt::format("agent.{}: unknown field (known: endpoint, logToken)", it.key()));
    if (!it.value().is_string())
      return Status::InvalidArgument(fmt::format("agent.{}: must be a string", it.key()));
  }
  AgentInfo info;
  info.endpoint = v.value("endpoint", "");
  info.log_token = v.value("logToken", "");
  RETURN_IF_ERROR(CheckAgentEndpoint(info.endpoint));
  if (info.log_token.size() < 16 || info.log_token.size() > 256 ||
      info.log_token.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
    return Status::InvalidArgument("agent.logToken: must be 16 to 256 hex digits");
  }
  return info;
}

}  // namespace gpupool
