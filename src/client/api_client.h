// A small HTTP client for the gpupool REST API (docs/api.md): where the server is, which token to
// send, one request per call, answers parsed as JSON, and the client exit codes of the contract.
// Boost.Beast (and OpenSSL for https) stay inside api_client.cc; nothing here throws.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace gpupool {

inline constexpr std::string_view kDefaultServer = "http://127.0.0.1:8470";
inline constexpr int kDefaultPort = 8470;

// Exit codes of `gpupool submit|get|list|cancel|events|nodes|queues` (docs/api.md).
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;         // anything else
inline constexpr int kExitUsage = 2;         // bad usage or input refused (400, 413, 415, 422)
inline constexpr int kExitNotFound = 3;      // 404
inline constexpr int kExitUnauthorized = 4;  // 401, 403
inline constexpr int kExitUnavailable = 5;   // server unreachable or 5xx
inline constexpr int kExitConflict = 6;      // 409

// The exit code for an HTTP status: 2xx is 0, unlisted statuses are 1.
int ExitCodeForHttpStatus(int status);

// A parsed server address: scheme://host:port followed by an optional base path.
struct ServerUrl {
  std::string scheme;  // "http" or "https"
  std::string host;    // an IPv6 literal keeps its brackets
  int port = 0;
  std::string base_path;  // "" or "/prefix" (no trailing slash)

  std::string Origin() const;    // "http://127.0.0.1:8470"
  std::string ToString() const;  // Origin() + base_path
};

// Accepts "http://host:port", "https://host", "host:port", "host", "[::1]:8470", with an
// optional path. Without a scheme the address is http; without a port it is 8470, or the scheme's
// own port (80, 443) when a scheme is given.
Result<ServerUrl> ParseServerUrl(std::string_view text);

// An answer may be at most this big (a page of jobs with their tasks is a few MiB); a bigger one
// is an error, not an allocation a server chooses for the client.
inline constexpr uint64_t kMaxReplyBytes = 64ull << 20;
inline constexpr uint32_t kMaxReplyHeadBytes = 64u << 10;

// Where to connect and what to authenticate with.
struct ClientConfig {
  std::string server = std::string(kDefaultServer);
  std::string token;  // empty: no Authorization header
  // https only: the CA certificates (PEM) the server's certificate must chain to; empty: the
  // system's. The server's certificate is always verified.
  std::string ca_file;
  // https to a server with tls.clientCA: the certificate (PEM) and key this client presents.
  std::string client_cert_file, client_key_file;
  int connect_timeout_s = 5;
  int read_timeout_s = 30;  // for sending the request and reading the whole answer
  uint64_t max_reply_bytes = kMaxReplyBytes;  // a bigger answer is an error
  // For addresses a peer names (an agent's log endpoint): never connect to an unspecified,
  // link-local (cloud metadata), multicast or broadcast address, also when a host name resolves
  // to one; such a request fails at "connect" naming the address.
  bool only_peer_addresses = false;
  // Something the user should hear about how the config was found (printed to stderr), e.g.
  // kTokenOnCommandLineWarning.
  std::string warning;
};

// The rule only_peer_addresses applies, for an address written out ("10.0.0.7", "fe80::1",
// "::ffff:169.254.169.254"): true when it is unspecified, link-local (169.254/16 holds cloud
// metadata services), multicast or broadcast, also as IPv4-mapped IPv6. False for every other
// address and for what is not an address (a host name is judged once it resolves).
bool IsNonPeerAddress(std::string_view literal);

// What --token on a command line earns: it shows in `ps` and in the shell's history.
inline constexpr std::string_view kTokenOnCommandLineWarning =
    "warning: --token on the command line is visible to every user of this machine (ps, "
    "/proc/<pid>/cmdline); use --token-file PATH or $GPUPOOL_TOKEN";

// The most bytes a token file may hold.
inline constexpr size_t kMaxTokenFileBytes = 4096;
// Reads a token file: at most kMaxTokenFileBytes, the token is its content without surrounding
// whitespace (a trailing newline); empty, a directory or more than one line is InvalidArgument.
Result<std::string> ReadTokenFile(const std::string& path);

// What the command line said; empty means not given.
struct ClientFlags {
  std::string server;
  std::string token;
  std::string token_file;
};

// Reads an environment variable; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
// The process environment.
EnvLookup ProcessEnv();

// The data directory whose admin.token the client falls back to: $GPUPOOL_DATA_DIR when set,
// otherwise $XDG_DATA_HOME/gpupool, otherwise $HOME/.local/share/gpupool; nullopt without HOME.
std::optional<std::string> TokenDataDir(const EnvLookup& env);

// Server: --server, then $GPUPOOL_SERVER, then http://127.0.0.1:8470; normalised by ParseServerUrl.
// Token, first found: --token, --token-file, $GPUPOOL_TOKEN, <data dir>/admin.token (see
// TokenDataDir). The CA file of an https server: $GPUPOOL_CA_FILE; a client certificate and key:
// $GPUPOOL_CLIENT_CERT and $GPUPOOL_CLIENT_KEY. Token files are read whole
// and trimmed. A bad address, an unreadable or empty
// --token-file, or an unreadable admin.token that exists is InvalidArgument.
Result<ClientConfig> ResolveClientConfig(const ClientFlags& flags, const EnvLookup& env);

// One answer from the server.
struct HttpReply {
  int status = 0;
  std::string content_type;
  std::string body;             // as received
  bool is_json = false;         // body parsed as JSON
  nlohmann::ordered_json json;  // the parsed body (keys in the server's order); null otherwise
  // The size of the log file a task-log answer read from (its X-Log-Size header); -1 when absent.
  int64_t log_size = -1;
  int64_t log_offset = -1;  // X-Log-Offset: where that answer's bytes start in the file
};

using QueryParams = std::vector<std::pair<std::string, std::string>>;

// Percent-encodes everything but RFC 3986 unreserved characters (for path segments and queries).
std::string PercentEncode(std::string_view text);
// Without leading and trailing white space; ASCII lower case. (Shared with the client commands.)
std::string_view Trim(std::string_view s);
std::string Lower(std::string_view s);

// "path?k=v&k2=v2", with keys and values percent-encoded; no '?' when `query` is empty.
std::string WithQuery(std::string_view path, const QueryParams& query);

// The text to print for a failed reply: the server's error.message, led by error.field when the
// message does not start with it; for bodies without that shape, the status and the first line of
// the body.
std::string ErrorMessage(const HttpReply& reply);

// Lets another thread end a request in flight at once (an agent stopping while it waits on a
// long poll). Once interrupted, every request made with it fails at once with IoError.
class RequestInterrupter {
 public:
  void Interrupt();
  bool interrupted() const;

 private:
  friend class ApiClient;
  mutable std::mutex mu_;
  bool interrupted_ = false;
  void* current_ = nullptr;  // the I/O context of the request in flight
};

class ApiClient {
 public:
  // InvalidArgument when config.server is not an address ParseServerUrl accepts.
  static Result<ApiClient> Create(ClientConfig config);

  // `path` starts with "/" and is already escaped (see PercentEncode); it is appended to the base
  // path. Any HTTP status is a reply; IoError means no reply came (unreachable, timed out, reset).
  Result<HttpReply> Get(std::string_view path, const QueryParams& query = {}) const;
  // A GET that another thread may end through `interrupt`, waiting up to `read_timeout_s` for the
  // answer (a long poll waits longer than ordinary calls).
  Result<HttpReply> GetInterruptible(std::string_view path, RequestInterrupter& interrupt, int read_timeout_s) const;
  Result<HttpReply> Post(std::string_view path, std::string_view body = {},
                         std::string_view content_type = "application/json") const;
  Result<HttpReply> Put(std::string_view path, std::string_view body,
                        std::string_view content_type = "application/json") const;
  Result<HttpReply> Delete(std::string_view path) const;

  const ClientConfig& config() const { return config_; }
  const ServerUrl& url() const { return url_; }

 private:
  ApiClient(ClientConfig config, ServerUrl url) : config_(std::move(config)), url_(std::move(url)) {}
  Result<HttpReply> Send(std::string_view method, std::string_view path, std::string_view body,
                         std::string_view content_type, RequestInterrupter* interrupt = nullptr,
                         int read_timeout_s = 0) const;

  ClientConfig config_;
  ServerUrl url_;
};

}  // namespace gpupool
