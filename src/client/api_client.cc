#include "client/api_client.h"

#include <fmt/format.h>
#include <httplib.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

namespace gpupool {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

namespace {

bool ValidHostChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

}  // namespace

Result<std::string> ReadTokenFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return Status::InvalidArgument(fmt::format("token file {}: is a directory", path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status::InvalidArgument(fmt::format("token file {}: {}", path, std::strerror(errno)));
  }
  // Bounded: a token file is one short line, not whatever a path happens to name.
  std::string text(kMaxTokenFileBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) return Status::InvalidArgument(fmt::format("token file {}: read failed", path));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxTokenFileBytes)
    return Status::InvalidArgument(
        fmt::format("token file {}: larger than {} bytes, not a token", path, kMaxTokenFileBytes));
  std::string token(Trim(text));
  if (token.empty()) return Status::InvalidArgument(fmt::format("token file {} is empty", path));
  if (token.find_first_of("\r\n") != std::string::npos) {
    return Status::InvalidArgument(fmt::format("token file {} holds more than one line", path));
  }
  return token;
}

namespace {

std::string FirstLine(std::string_view text, size_t max_chars) {
  text = Trim(text);
  const size_t eol = text.find_first_of("\r\n");
  if (eol != std::string_view::npos) text = text.substr(0, eol);
  std::string out(text.substr(0, max_chars));
  if (text.size() > max_chars) out += "...";
  return out;
}

}  // namespace

int ExitCodeForHttpStatus(int status) {
  if (status >= 200 && status < 300) return kExitOk;
  switch (status) {
    case 400:
    case 413:
    case 415:
    case 422: return kExitUsage;
    case 401:
    case 403: return kExitUnauthorized;
    case 404: return kExitNotFound;
    case 409: return kExitConflict;
    default: break;
  }
  if (status >= 500 && status < 600) return kExitUnavailable;
  return kExitError;
}

std::string ServerUrl::Origin() const {
  return fmt::format("{}://{}:{}", scheme, host, port);
}

std::string ServerUrl::ToString() const {
  return Origin() + base_path;
}

Result<ServerUrl> ParseServerUrl(std::string_view text) {
  const std::string_view original = Trim(text);
  std::string_view rest = original;
  const auto bad = [&](std::string_view why) {
    return Status::InvalidArgument(fmt::format("server address '{}': {}", original, why));
  };
  if (rest.empty()) return bad("empty");

  ServerUrl url;
  const size_t scheme_end = rest.find("://");
  bool explicit_scheme = false;
  if (scheme_end != std::string_view::npos) {
    url.scheme = Lower(rest.substr(0, scheme_end));
    if (url.scheme != "http" && url.scheme != "https") return bad("the scheme must be http or https");
    rest.remove_prefix(scheme_end + 3);
    explicit_scheme = true;
  } else {
    url.scheme = "http";
  }

  const size_t path_start = rest.find_first_of("/?#");
  std::string_view authority = rest.substr(0, path_start);
  std::string_view path = path_start == std::string_view::npos ? std::string_view() : rest.substr(path_start);
  if (authority.find('@') != std::string_view::npos)
    return bad("user names in the address are not supported");
  if (path.find_first_of("?#") != std::string_view::npos)
    return bad("queries and fragments are not supported");

  std::string_view port_text;
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return bad("unclosed '[' in an IPv6 address");
    const std::string_view inside = authority.substr(1, close - 1);
    if (inside.empty()) return bad("empty IPv6 address");
    for (char c : inside) {
      if (!std::isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.') {
        return bad("bad IPv6 address");
      }
    }
    url.host = std::string(authority.substr(0, close + 1));
    const std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return bad("expected ':port' after the IPv6 address");
      port_text = after.substr(1);
      if (port_text.empty()) return bad("empty port");
    }
  } else {
    const size_t colon = authority.find(':');
    url.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port_text = authority.substr(colon + 1);
      if (port_text.empty()) return bad("empty port");
    }
    if (url.host.empty()) return bad("no host");
    for (char c : url.host) {
      if (!ValidHostChar(c)) return bad("bad character in the host name");
    }
  }

  if (!port_text.empty()) {
    int port = 0;
    const auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (ec != std::errc() || ptr != port_text.data() + port_text.size() || port < 1 || port > 65535) {
      return bad(fmt::format("port '{}' is not a number 1..65535", port_text));
    }
    url.port = port;
  } else if (explicit_scheme) {
    url.port = url.scheme == "https" ? 443 : 80;
  } else {
    url.port = kDefaultPort;
  }

  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  url.base_path = std::string(path);
  return url;
}

EnvLookup ProcessEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

std::optional<std::string> TokenDataDir(const EnvLookup& env) {
  const auto non_empty = [&](const char* name) -> std::optional<std::string> {
    auto v = env(name);
    if (v && !v->empty()) return v;
    return std::nullopt;
  };
  if (auto dir = non_empty("GPUPOOL_DATA_DIR")) return dir;
  if (auto xdg = non_empty("XDG_DATA_HOME")) return *xdg + "/gpupool";
  if (auto home = non_empty("HOME")) return *home + "/.local/share/gpupool";
  return std::nullopt;
}

Result<ClientConfig> ResolveClientConfig(const ClientFlags& flags, const EnvLookup& env) {
  ClientConfig config;
  std::string server = flags.server;
  if (server.empty()) {
    if (auto v = env("GPUPOOL_SERVER"); v && !Trim(*v).empty()) server = *v;
  }
  if (server.empty()) server = std::string(kDefaultServer);
  ASSIGN_OR_RETURN(const ServerUrl url, ParseServerUrl(server));
  config.server = url.ToString();
  if (auto v = env("GPUPOOL_CA_FILE"); v && !Trim(*v).empty()) config.ca_file = std::string(Trim(*v));
  if (auto v = env("GPUPOOL_CLIENT_CERT"); v && !Trim(*v).empty()) config.client_cert_file = std::string(Trim(*v));
  if (auto v = env("GPUPOOL_CLIENT_KEY"); v && !Trim(*v).empty()) config.client_key_file = std::string(Trim(*v));
  if (config.client_cert_file.empty() != config.client_key_file.empty())
    return Status::InvalidArgument("GPUPOOL_CLIENT_CERT and GPUPOOL_CLIENT_KEY go together");

  if (!flags.token.empty()) {
    config.token = std::string(Trim(flags.token));
    config.warning = std::string(kTokenOnCommandLineWarning);
    return config;
  }
  if (!flags.token_file.empty()) {
    ASSIGN_OR_RETURN(config.token, ReadTokenFile(flags.token_file));
    return config;
  }
  if (auto v = env("GPUPOOL_TOKEN"); v && !Trim(*v).empty()) {
    config.token = std::string(Trim(*v));
    return config;
  }
  if (auto dir = TokenDataDir(env)) {
    const std::string path = *dir + "/admin.token";
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) {
      ASSIGN_OR_RETURN(config.token, ReadTokenFile(path));
    }
  }
  return config;
}

std::string PercentEncode(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += ch;
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 0xF];
    }
  }
  return out;
}

std::string WithQuery(std::string_view path, const QueryParams& query) {
  std::string out(path);
  char sep = '?';
  for (const auto& [key, value] : query) {
    out += sep;
    out += PercentEncode(key);
    out += '=';
    out += PercentEncode(value);
    sep = '&';
  }
  return out;
}

std::string ErrorMessage(const HttpReply& reply) {
  if (reply.is_json && reply.json.is_object()) {
    const auto err = reply.json.find("error");
    if (err != reply.json.end() && err->is_object()) {
      std::string message;
      std::string field;
      if (auto m = err->find("message"); m != err->end() && m->is_string()) message = m->get<std::string>();
      if (auto f = err->find("field"); f != err->end() && f->is_string()) field = f->get<std::string>();
      if (message.empty()) {
        if (auto c = err->find("code"); c != err->end() && c->is_string()) message = c->get<std::string>();
      }
      if (!message.empty()) {
        if (!field.empty() && message.compare(0, field.size(), field) != 0) {
          return fmt::format("{}: {}", field, message);
        }
        return message;
      }
    }
  }
  std::string text = fmt::format("server answered HTTP {}", reply.status);
  if (const std::string line = FirstLine(reply.body, 200); !line.empty()) text += ": " + line;
  return text;
}

Result<ApiClient> ApiClient::Create(ClientConfig config) {
  ASSIGN_OR_RETURN(ServerUrl url, ParseServerUrl(config.server));
  return ApiClient(std::move(config), std::move(url));
}

Result<HttpReply> ApiClient::Get(std::string_view path, const QueryParams& query) const {
  return Send("GET", WithQuery(path, query), {}, {});
}

Result<HttpReply> ApiClient::Post(std::string_view path, std::string_view body,
                                  std::string_view content_type) const {
  return Send("POST", path, body, content_type);
}

Result<HttpReply> ApiClient::Put(std::string_view path, std::string_view body,
                                 std::string_view content_type) const {
  return Send("PUT", path, body, content_type);
}

Result<HttpReply> ApiClient::Delete(std::string_view path) const {
  return Send("DELETE", path, {}, {});
}

void RequestInterrupter::Interrupt() {
  std::lock_guard<std::mutex> lock(mu_);
  interrupted_ = true;
  if (current_ != nullptr) static_cast<httplib::Client*>(current_)->stop();
}

bool RequestInterrupter::interrupted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return interrupted_;
}

Result<HttpReply> ApiClient::GetInterruptible(std::string_view path, RequestInterrupter& interrupt,
                                              int read_timeout_s) const {
  return Send("GET", path, {}, {}, &interrupt, read_timeout_s);
}

Result<HttpReply> ApiClient::Send(std::string_view method, std::string_view path, std::string_view body,
                                  std::string_view content_type, RequestInterrupter* interrupt,
                                  int read_timeout_s) const {
  try {
    httplib::Client http = config_.client_cert_file.empty()
                               ? httplib::Client(url_.Origin())
                               : httplib::Client(url_.Origin(), config_.client_cert_file, config_.client_key_file);
    // Registered for the whole call; `interrupt` stops it from another thread.
    struct Registration {
      RequestInterrupter* r;
      ~Registration() {
        if (r == nullptr) return;
        std::lock_guard<std::mutex> lock(r->mu_);
        r->current_ = nullptr;
      }
    } registration{nullptr};
    if (interrupt != nullptr) {
      std::lock_guard<std::mutex> lock(interrupt->mu_);
      if (interrupt->interrupted_) return Status::IoError(fmt::format("{} {}: interrupted", method, path));
      interrupt->current_ = &http;
      registration.r = interrupt;
    }
    http.set_tcp_nodelay(true);
    http.set_connection_timeout(config_.connect_timeout_s);
    http.set_read_timeout(read_timeout_s > 0 ? read_timeout_s : config_.read_timeout_s);
    http.set_write_timeout(config_.read_timeout_s);
    http.set_url_encode(false);  // paths and queries arrive escaped (PercentEncode)
    http.set_keep_alive(false);
    if (url_.scheme == "https") {
      http.enable_server_certificate_verification(true);
      if (!config_.ca_file.empty()) http.set_ca_cert_path(config_.ca_file.c_str());
    }

    httplib::Request req;
    req.method = std::string(method);
    req.path = url_.base_path + std::string(path);
    req.set_header("Accept", "application/json");
    req.set_header("User-Agent", "gpupool-cli");
    if (!config_.token.empty()) req.set_header("Authorization", "Bearer " + config_.token);
    if (!body.empty()) {  // an empty POST (cancel, cordon, ...) carries no content type
      req.body = std::string(body);
      req.set_header("Content-Type", content_type.empty() ? "application/json" : std::string(content_type));
    }

    httplib::Result res = http.send(req);
    if (!res && interrupt != nullptr && interrupt->interrupted())
      return Status::IoError(fmt::format("{} {}: interrupted", method, path));
    if (!res) {
      return Status::IoError(fmt::format("cannot reach the server at {} ({})", url_.ToString(),
                                         httplib::to_string(res.error())));
    }
    HttpReply reply;
    reply.status = res->status;
    reply.content_type = res->get_header_value("Content-Type");
    reply.body = std::move(res->body);
    if (const std::string size = res->get_header_value("X-Log-Size"); !size.empty()) {
      int64_t v = -1;
      const auto [end, ec] = std::from_chars(size.data(), size.data() + size.size(), v);
      if (ec == std::errc() && end == size.data() + size.size() && v >= 0) reply.log_size = v;
    }
    if (!Trim(reply.body).empty()) {
      reply.json = nlohmann::ordered_json::parse(reply.body, nullptr, /*allow_exceptions=*/false);
      reply.is_json = !reply.json.is_discarded();
      if (!reply.is_json) reply.json = nullptr;
    }
    return reply;
  } catch (const std::exception& ex) {
    return Status::Internal(fmt::format("{} {}: {}", method, path, ex.what()));
  }
}

}  // namespace gpupool
