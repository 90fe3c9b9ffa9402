// The REST API of docs/api.md over HTTP (the event-driven server of http/server.h, plain or TLS):
// authentication, routing, content types, size limits and the one error shape. All state lives in PoolService; this layer only
// translates.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "server/config.h"
#include "server/service.h"

namespace gpupool::http {
class Server;
}

namespace gpupool {

class HttpApi {
 public:
  // `service` must outlive the API. Tokens come from config.tokens.
  HttpApi(PoolService& service, ServerConfig config);
  ~HttpApi();
  HttpApi(const HttpApi&) = delete;
  HttpApi& operator=(const HttpApi&) = delete;

  // Binds host:port (port 0: any free port) and serves on background threads. Returns the port.
  Result<int> Start(const std::string& host, int port);
  // Stops accepting, finishes requests in flight, joins the thread.
  void Stop();

  // HTTP status for a Status code (400, 401, 403, 404, 409, 422, 429, 500).
  static int HttpStatusFor(StatusCode code);
  // The longest long poll (GET .../assignments?wait=S, GET /api/v1/jobs/{id}?wait=S).
  static constexpr int kMaxWaitSeconds = 60;

 private:
  void Routes();
  PoolService& service_;
  ServerConfig config_;
  std::unique_ptr<http::Server> server_;
};

}  // namespace gpupool
