#include "client/api_client.h"

#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <vector>

namespace gpupool {

namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
using tcp = boost::asio::ip::tcp;

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
  // io_context::stop is safe from any thread: the request's run() returns at once.
  if (current_ != nullptr) static_cast<net::io_context*>(current_)->stop();
}

bool RequestInterrupter::interrupted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return interrupted_;
}

Result<HttpReply> ApiClient::GetInterruptible(std::string_view path, RequestInterrupter& interrupt,
                                              int read_timeout_s) const {
  return Send("GET", path, {}, {}, &interrupt, read_timeout_s);
}

namespace {

bool NonPeer(const net::ip::address& a) {
  if (a.is_v6() && a.to_v6().is_v4_mapped()) return NonPeer(net::ip::make_address_v4(net::ip::v4_mapped, a.to_v6()));
  if (a.is_v4()) {
    const uint32_t v = a.to_v4().to_uint();
    return (v >> 24) == 0 || (v >> 16) == 0xa9fe || a.is_multicast() || v == 0xffffffffu;
  }
  const auto v6 = a.to_v6();
  return v6.is_unspecified() || v6.is_link_local() || v6.is_multicast();
}

}  // namespace

bool IsNonPeerAddress(std::string_view literal) {
  boost::system::error_code ec;
  const auto a = net::ip::make_address(std::string(literal), ec);
  return !ec && NonPeer(a);
}

namespace {

// The host as a resolver and a certificate check want it: an IPv6 literal without its brackets.
std::string BareHost(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') return host.substr(1, host.size() - 2);
  return host;
}

// What went wrong, in words a user can act on.
std::string Describe(const boost::system::error_code& ec, uint64_t max_reply_bytes) {
  if (ec == beast::error::timeout) return "timed out";
  if (ec == http::error::body_limit) return fmt::format("the answer is over {} bytes", max_reply_bytes);
  if (ec == http::error::header_limit) return fmt::format("the answer's head is over {} bytes", kMaxReplyHeadBytes);
  if (ec.category() == net::error::get_ssl_category()) {
    std::string what = ec.message();
    const long verify = static_cast<long>(ERR_GET_REASON(static_cast<unsigned long>(ec.value())));
    if (verify == SSL_R_CERTIFICATE_VERIFY_FAILED) what = "the server's certificate could not be verified";
    return "TLS: " + what;
  }
  return ec.message();
}

// One request and its answer over a fresh connection (the server closes it after answering).
template <class Stream>
net::awaitable<void> Exchange(Stream& stream, beast::tcp_stream& lowest, tcp::resolver& resolver,
                              const std::string& host, const std::string& port, bool tls,
                              std::chrono::seconds connect_timeout, std::chrono::seconds read_timeout,
                              http::request<http::string_body>& req, http::response_parser<http::string_body>& parser,
                              uint64_t max_reply_bytes, bool only_peers, const char*& phase) {
  boost::system::error_code ec;
  const auto ip = net::ip::make_address(host, ec);
  lowest.expires_after(connect_timeout);
  phase = "connect";
  if (!ec) {
    if (only_peers && NonPeer(ip))
      throw std::runtime_error(fmt::format("{} is not an address a peer serves on", ip.to_string()));
    co_await lowest.async_connect(tcp::endpoint(ip, static_cast<uint16_t>(std::stoi(port))), net::use_awaitable);
  } else {
    phase = "resolve";
    const auto resolved = co_await resolver.async_resolve(host, port, net::use_awaitable);
    phase = "connect";
    std::vector<tcp::endpoint> endpoints;
    std::string refused;
    for (const auto& entry : resolved) {
      if (only_peers && NonPeer(entry.endpoint().address())) {
        refused = entry.endpoint().address().to_string();
        continue;
      }
      endpoints.push_back(entry.endpoint());
    }
    if (endpoints.empty())
      throw std::runtime_error(fmt::format("{} resolves to {}, not an address a peer serves on", host, refused));
    co_await lowest.async_connect(endpoints, net::use_awaitable);  // under the stream's deadline
  }
  lowest.socket().set_option(tcp::no_delay(true));
  if (tls) {
    phase = "TLS handshake";
    if constexpr (!std::is_same_v<Stream, beast::tcp_stream>) co_await stream.async_handshake(ssl::stream_base::client, net::use_awaitable);
  }
  lowest.expires_after(read_timeout);
  phase = "send";
  co_await http::async_write(stream, req, net::use_awaitable);
  phase = "answer";
  beast::flat_buffer buffer;
  co_await http::async_read_header(stream, buffer, parser, net::use_awaitable);
  // The parser's own body limit is checked here too, before a byte of the body is read: a
  // Content-Length over it is refused at once, not after the whole deadline.
  if (const auto length = parser.content_length(); length && *length > max_reply_bytes)
    throw boost::system::system_error(http::error::body_limit);
  if (!parser.is_done()) co_await http::async_read(stream, buffer, parser, net::use_awaitable);
}

}  // namespace

Result<HttpReply> ApiClient::Send(std::string_view method, std::string_view path, std::string_view body,
                                  std::string_view content_type, RequestInterrupter* interrupt,
                                  int read_timeout_s) const {
  try {
    net::io_context ioc(1);
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
      interrupt->current_ = &ioc;
      registration.r = interrupt;
    }
    const bool tls = url_.scheme == "https";
    const std::string host = BareHost(url_.host);
    const std::string port = std::to_string(url_.port);

    http::request<http::string_body> req;
    const http::verb verb = http::string_to_verb(beast::string_view(method.data(), method.size()));
    if (verb == http::verb::unknown) return Status::InvalidArgument(fmt::format("unknown method '{}'", method));
    req.method(verb);
    req.target(url_.base_path + std::string(path));
    req.version(11);
    const bool default_port = url_.port == (tls ? 443 : 80);
    req.set(http::field::host, default_port ? url_.host : url_.host + ":" + port);
    req.set(http::field::accept, "application/json");
    req.set(http::field::user_agent, "gpupool-cli");
    req.set(http::field::connection, "close");
    if (!config_.token.empty()) req.set(http::field::authorization, "Bearer " + config_.token);
    if (!body.empty()) {  // an empty POST (cancel, cordon, ...) carries no content type
      req.set(http::field::content_type, content_type.empty() ? "application/json" : std::string(content_type));
      req.body() = std::string(body);
    }
    req.prepare_payload();

    http::response_parser<http::string_body> parser;
    parser.body_limit(config_.max_reply_bytes);
    parser.header_limit(kMaxReplyHeadBytes);

    const auto connect_timeout = std::chrono::seconds(std::max(1, config_.connect_timeout_s));
    const auto read_timeout = std::chrono::seconds(read_timeout_s > 0 ? read_timeout_s : std::max(1, config_.read_timeout_s));
    tcp::resolver resolver(ioc);
    const char* phase = "connect";
    std::exception_ptr failure;
    bool done = false;
    auto finish = [&](std::exception_ptr e) {
      failure = e;
      done = true;
    };
    // Declared before the streams that use it, so that it outlives them.
    std::optional<ssl::context> ctx;
    std::optional<beast::tcp_stream> plain;
    std::optional<beast::ssl_stream<beast::tcp_stream>> secure;
    if (tls) {
      ctx.emplace(ssl::context::tls_client);
      ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                       ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
      // OpenSSL's own calls, not asio's wrappers: those report success when OpenSSL failed without
      // queueing an error, and a CA file that is not there must never mean "no check".
      SSL_CTX* native = ctx->native_handle();
      auto openssl_error = [] {
        const unsigned long e = ERR_get_error();
        ERR_clear_error();
        char text[256] = "no detail from OpenSSL";
        if (e != 0) ERR_error_string_n(e, text, sizeof(text));
        return std::string(text);
      };
      if (config_.ca_file.empty()) {
        if (SSL_CTX_set_default_verify_paths(native) != 1)
          return Status::InvalidArgument(fmt::format("the system's CA certificates: {}", openssl_error()));
      } else {
        if (!std::ifstream(config_.ca_file).good())
          return Status::InvalidArgument(fmt::format("CA certificates '{}': cannot be read", config_.ca_file));
        if (SSL_CTX_load_verify_locations(native, config_.ca_file.c_str(), nullptr) != 1)
          return Status::InvalidArgument(fmt::format("CA certificates '{}': {}", config_.ca_file, openssl_error()));
      }
      if (!config_.client_cert_file.empty()) {
        if (!std::ifstream(config_.client_cert_file).good())
          return Status::InvalidArgument(
              fmt::format("client certificate '{}': cannot be read", config_.client_cert_file));
        if (SSL_CTX_use_certificate_chain_file(native, config_.client_cert_file.c_str()) != 1)
          return Status::InvalidArgument(
              fmt::format("client certificate '{}': {}", config_.client_cert_file, openssl_error()));
        if (!std::ifstream(config_.client_key_file).good())
          return Status::InvalidArgument(fmt::format("client key '{}': cannot be read", config_.client_key_file));
        if (SSL_CTX_use_PrivateKey_file(native, config_.client_key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
            SSL_CTX_check_private_key(native) != 1)
          return Status::InvalidArgument(fmt::format("client key '{}': {}", config_.client_key_file, openssl_error()));
      }
      secure.emplace(ioc, *ctx);
      secure->set_verify_mode(ssl::verify_peer);
      secure->set_verify_callback(ssl::host_name_verification(host));
      boost::system::error_code ip_ec;
      (void)net::ip::make_address(host, ip_ec);
      // SNI names a host, never an address (RFC 6066).
      if (ip_ec && SSL_set_tlsext_host_name(secure->native_handle(), host.c_str()) != 1)
        return Status::InvalidArgument(fmt::format("server name '{}' cannot be sent over TLS", host));
      net::co_spawn(ioc,
                    Exchange(*secure, beast::get_lowest_layer(*secure), resolver, host, port, true, connect_timeout,
                             read_timeout, req, parser, config_.max_reply_bytes, config_.only_peer_addresses, phase),
                    finish);
    } else {
      plain.emplace(ioc);
      net::co_spawn(ioc, Exchange(*plain, *plain, resolver, host, port, false, connect_timeout, read_timeout, req, parser,
                                         config_.max_reply_bytes, config_.only_peer_addresses, phase),
                    finish);
    }
    // The streams' own deadlines end every step; this bounds the name lookup too.
    ioc.run_for(connect_timeout + read_timeout + std::chrono::seconds(1));
    if (interrupt != nullptr && interrupt->interrupted())
      return Status::IoError(fmt::format("{} {}: interrupted", method, path));
    if (!done) {
      return Status::IoError(fmt::format("cannot reach the server at {} ({}: timed out)", url_.ToString(), phase));
    }
    if (failure) {
      std::string what;
      try {
        std::rethrow_exception(failure);
      } catch (const boost::system::system_error& e) {
        what = Describe(e.code(), config_.max_reply_bytes);
        // Why the certificate was refused: an unknown issuer, another host's name, expired...
        if (secure) {
          const long verify = SSL_get_verify_result(secure->native_handle());
          if (verify != X509_V_OK) what += fmt::format(" ({})", X509_verify_cert_error_string(verify));
        }
      } catch (const std::exception& e) {
        what = e.what();
      }
      return Status::IoError(fmt::format("cannot reach the server at {} ({}: {})", url_.ToString(), phase, what));
    }
    auto& res = parser.get();
    HttpReply reply;
    reply.status = static_cast<int>(res.result_int());
    reply.content_type = std::string(res[http::field::content_type]);
    reply.body = std::move(res.body());
    // A byte count header: a non-negative integer, else absent (-1).
    auto byte_count = [&res](const char* name) -> int64_t {
      auto it = res.find(name);
      if (it == res.end()) return -1;
      const std::string_view text(it->value().data(), it->value().size());
      int64_t v = -1;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      return ec == std::errc() && end == text.data() + text.size() && v >= 0 ? v : -1;
    };
    reply.log_size = byte_count("X-Log-Size");
    reply.log_offset = byte_count("X-Log-Offset");
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
