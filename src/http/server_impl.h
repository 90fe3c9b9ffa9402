// The server's insides, shared by server.cc (accepting, the public Server) and session.cc (one
// connection: reading, deadlines, the lanes, writing). Not part of the http layer's interface.
#pragma once

#include "http/server.h"

#include <fmt/format.h>
#include <malloc.h>
#include <sys/resource.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cstdio>
#include <mutex>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>
#include <unordered_map>

namespace gpupool::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;


struct Route {
  std::string method;
  std::regex pattern;
  Handler handler;
  Lane lane;
};

// A lane: a pool of threads and the number of tasks queued or running on it.
struct LanePool {
  explicit LanePool(int threads) : pool(static_cast<size_t>(std::max(1, threads))) {}
  net::thread_pool pool;
  std::atomic<int> pending{0};
};


struct Server::Impl {
  explicit Impl(ServerOptions o) : options(std::move(o)) {}

  // Declaration order matters: sessions still queued in the lanes or the io_context when they are
  // destroyed release themselves into the connection table and use the TLS context, so those are
  // declared (and live) before them.
  ServerOptions options;
  std::vector<Route> routes;
  PreBodyCheck pre_body;
  ErrorWriter error_writer;

  // Open connections, for the caps and for Stop.
  std::mutex conn_mu;
  std::unordered_map<std::string, int> per_address;
  std::unordered_map<uint64_t, std::function<void()>> closers;  // id -> close the connection
  uint64_t next_conn_id = 1;
  std::atomic<int64_t> open{0}, accepted{0}, refused{0}, requests{0}, timeouts{0}, bad{0}, busy{0},
      handler_errors{0};
  std::atomic<bool> stopping{false};
  bool running = false;

  std::optional<net::ssl::context> ssl;
  net::io_context ioc{std::max(1, options.io_threads)};
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> io_threads;
  std::unique_ptr<LanePool> lanes[2];

  void WriteError(Response& res, int status, const std::string& message) {
    res.status = status;
    res.body.clear();
    if (error_writer) {
      error_writer(res, status, message);
    } else {
      res.set_content(message + "\n", "text/plain; charset=utf-8");
    }
  }

  // Finds the route for `req` (filling matches); nullptr and `*status` 404 or 405 when none.
  const Route* Match(Request& req, int* status) {
    const std::string method = req.method == "HEAD" ? "GET" : req.method;
    // The method's routes first (the common case matches one regex per route of that method);
    // only when none matches, the others, to tell 405 from 404.
    for (const Route& r : routes) {
      if (r.method != method) continue;
      std::smatch m;
      if (!std::regex_match(req.path, m, r.pattern)) continue;
      req.matches.clear();
      for (const auto& g : m) req.matches.push_back(g.str());
      return &r;
    }
    for (const Route& r : routes) {
      if (r.method != method && std::regex_match(req.path, r.pattern)) {
        *status = 405;
        return nullptr;
      }
    }
    *status = 404;
    return nullptr;
  }

  void Accept();
  // A session for an accepted connection (session.cc).
  void StartSession(beast::tcp_stream&& stream, uint64_t id, const std::string& addr);
  void StartSession(beast::ssl_stream<beast::tcp_stream>&& stream, uint64_t id, const std::string& addr);
  void Release(uint64_t id, const std::string& addr) {
    std::lock_guard<std::mutex> lock(conn_mu);
    closers.erase(id);
    auto it = per_address.find(addr);
    if (it != per_address.end() && --it->second <= 0) per_address.erase(it);
    --open;
  }
};

}  // namespace gpupool::http
