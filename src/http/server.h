// An event-driven HTTP/1.1 server (Boost.Beast over Asio, optionally TLS through OpenSSL) for the
// control plane's API and the agent's endpoint. Connections cost a socket and a small buffer, not a
// thread: a few I/O threads multiplex every connection, and handlers run on bounded worker lanes.
//
// What a client can and cannot do to it (docs/server.md#security-model):
// - every request has one deadline for its head and body together (`request_timeout`), however
//   slowly the bytes arrive; an idle keep-alive connection is closed after `idle_timeout`;
// - heads are bounded (`max_header_bytes`, 431), request targets too (`max_target_bytes`, 414),
//   bodies while they are read, chunked or not (`max_body_bytes`, 413); a request without
//   Content-Length or Transfer-Encoding has an empty body;
// - a route's `pre_body` check (authentication) runs after the head and before any body byte is
//   read: a refused request never has its body read;
// - paths and query parameters are percent-decoded and must be valid UTF-8 without control bytes
//   (400 otherwise), so a handler only ever sees text;
// - connections are capped in total and per client address; requests queued for a lane are capped
//   (503 when full), and each lane has its own threads, so a flood on one lane (listing jobs) cannot
//   take the threads of another (agent heartbeats);
// - an exception escaping a handler becomes a 500 without its text, and the process goes on.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace gpupool::http {

// Header names are kept lower-case; lookups are case-insensitive.
struct Request {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent (percent-encoded, with the query)
  std::string path;    // decoded
  std::multimap<std::string, std::string> params;   // decoded query parameters
  std::multimap<std::string, std::string> headers;  // lower-case names
  std::vector<std::string> matches;                 // [0] the path, [1..] the route's groups
  std::string body;
  std::string remote_addr;

  bool has_header(const std::string& name) const;
  std::string get_header_value(const std::string& name) const;  // first value, or ""
  bool has_param(const std::string& key) const;
  std::string get_param_value(const std::string& key, size_t index = 0) const;
  size_t get_param_value_count(const std::string& key) const;
};

struct Response;

// The answer to a request a handler deferred (Response::Defer). Send may be called from any thread,
// at most once taking effect; the connection holds no thread while it waits.
class Responder {
 public:
  virtual ~Responder() = default;
  // Sends `res` unless an answer went already (the timeout's, or an earlier Send): true when this
  // one is the answer. The connection may have closed meanwhile; then nothing is sent.
  virtual bool Send(Response res) = 0;
  // An answer went (by Send or at the timeout): a holder may drop this Responder.
  virtual bool sent() const = 0;
};

struct Response {
  int status = 200;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  void set_content(std::string content, const std::string& content_type);
  void set_header(const std::string& name, const std::string& value);
  bool has_header(const std::string& name) const;

  // From a handler: answer later. The handler returns at once (its worker is free) and whoever
  // holds the Responder answers with Send; if nobody has by `timeout`, `on_timeout` is sent. What
  // the handler wrote into this Response is ignored. For long polls and watches: thousands of
  // deferred requests cost their connections, not threads. Not available to pre-body checks.
  std::shared_ptr<Responder> Defer(std::chrono::milliseconds timeout, Response on_timeout);
  bool deferred() const { return deferred_; }

  // Set by the server around a handler call.
  std::function<std::shared_ptr<Responder>(std::chrono::milliseconds, Response)> defer_hook;

 private:
  bool deferred_ = false;
};

using Handler = std::function<void(const Request&, Response&)>;
// Runs after the head is read, before the body: return false (with `res` filled) to refuse the
// request without reading its body.
using PreBodyCheck = std::function<bool(const Request&, Response&)>;
// Writes the body of an error the server itself answers (400, 404, 405, 413, 414, 431, 500, 503).
using ErrorWriter = std::function<void(Response&, int status, const std::string& message)>;

// Worker lanes: each has its own threads and its own queue bound.
enum class Lane : uint8_t { kNormal = 0, kPriority = 1 };

struct TlsOptions {
  std::string cert_file;       // PEM certificate chain
  std::string key_file;        // PEM private key
  std::string client_ca_file;  // set: clients must present a certificate signed by this CA
  bool enabled() const { return !cert_file.empty(); }
};

struct ServerOptions {
  size_t max_body_bytes = 1 << 20;
  size_t max_header_bytes = 16 << 10;
  size_t max_target_bytes = 4096;
  std::chrono::milliseconds request_timeout{10'000};  // head + body, from the first byte
  std::chrono::milliseconds idle_timeout{60'000};     // keep-alive, between requests
  std::chrono::milliseconds write_timeout{30'000};
  int max_connections = 20'000;
  int max_connections_per_address = 1'000;
  int io_threads = 1;
  int normal_workers = 8;
  int priority_workers = 4;
  int max_queued_per_lane = 4'096;
  TlsOptions tls;
};

struct ServerStats {
  int64_t open_connections = 0;
  int64_t accepted_total = 0;
  int64_t refused_connections_total = 0;  // over the total or per-address cap
  int64_t requests_total = 0;
  int64_t timeouts_total = 0;   // request deadline or idle timeout reached
  int64_t bad_requests_total = 0;  // malformed, too large, invalid text
  int64_t busy_total = 0;       // 503: a lane's queue was full
  int64_t handler_errors_total = 0;
};

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Routes: `pattern` is an ECMAScript regular expression matched against the whole decoded path;
  // its groups become Request::matches. HEAD is served by the GET routes. Register before Listen.
  void Get(const std::string& pattern, Handler h, Lane lane = Lane::kNormal);
  void Post(const std::string& pattern, Handler h, Lane lane = Lane::kNormal);
  void Put(const std::string& pattern, Handler h, Lane lane = Lane::kNormal);
  void Patch(const std::string& pattern, Handler h, Lane lane = Lane::kNormal);
  void Delete(const std::string& pattern, Handler h, Lane lane = Lane::kNormal);
  // The check every request with a body passes before its body is read (on the route's lane).
  void set_pre_body_check(PreBodyCheck check);
  void set_error_writer(ErrorWriter writer);

  // Binds host:port (0: any free port), starts the threads, returns the port.
  Result<int> Listen(const std::string& host, int port);
  // Stops accepting, closes every connection, lets handlers in flight finish, joins the threads.
  void Stop();

  ServerStats stats() const;
  // The counters as Prometheus text, metric names prefixed by `prefix` (e.g. "gpupool_http").
  std::string MetricsText(const std::string& prefix) const;

  struct Impl;

 private:
  void Add(const std::string& method, const std::string& pattern, Handler h, Lane lane);
  std::unique_ptr<Impl> impl_;
};

// Percent-decoding; '+' becomes a space when `plus_is_space` (query strings). Fails on a bad
// escape. The result is bytes: check it with ValidText.
bool PercentDecode(std::string_view in, bool plus_is_space, std::string* out);
// Valid UTF-8 (no overlongs, no surrogates) without control bytes (< 0x20, 0x7f).
bool ValidText(std::string_view s);
// Splits a request target into the decoded path and query parameters of `req` (at most 64),
// refusing bad escapes and anything that is not text. The server applies it to every request.
Status ParseTarget(std::string_view target, Request* req);
// One request from raw bytes with the server's parser and limits (head, target, body; no
// routing), as a connection would read it: OK with `req` filled, or the status and message the
// server would answer (`*http_status` 400, 413, 414 or 431). For fuzzing and tests.
Status ParseRequestBytes(std::string_view bytes, const ServerOptions& options, Request* req, int* http_status);

}  // namespace gpupool::http
