#include "http/server_impl.h"

#include "http/request_internal.h"

namespace gpupool::http {

// ---- accepting ------------------------------------------------------------------------------------

void Server::Impl::Accept() {
  acceptor->async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket sock) {
    if (stopping) return;
    if (ec) {
      // Out of descriptors (or another transient failure): back off instead of spinning.
      auto timer = std::make_shared<net::steady_timer>(ioc, std::chrono::milliseconds(50));
      timer->async_wait([this, timer](beast::error_code) {
        if (!stopping) Accept();
      });
      return;
    }
    ++accepted;
    beast::error_code aec;
    const auto ep = sock.remote_endpoint(aec);
    const std::string addr = aec ? std::string("?") : ep.address().to_string();
    uint64_t id = 0;
    bool refuse = false;
    {
      std::lock_guard<std::mutex> lock(conn_mu);
      int& n = per_address[addr];
      if (open.load() >= options.max_connections || n >= options.max_connections_per_address) {
        refuse = true;
        if (n == 0) per_address.erase(addr);
      } else {
        ++n;
        ++open;
        id = next_conn_id++;
      }
    }
    if (refuse) {
      ++refused;
      if (!ssl) {
        // Best effort, never blocking: the client learns why before the close.
        static const std::string kBusy = [] {
          const std::string body =
              R"J({"error":{"code":"Unavailable","message":"too many connections (from this address, or in total)"}})J";
          return fmt::format("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                             "Connection: close\r\nRetry-After: 1\r\nContent-Length: {}\r\n\r\n{}",
                             body.size(), body);
        }();
        sock.non_blocking(true, aec);
        sock.write_some(net::buffer(kBusy), aec);
      }
      sock.close(aec);
      return Accept();
    }
    sock.set_option(tcp::no_delay(true), aec);
    beast::tcp_stream stream(std::move(sock));
    if (ssl) {
      StartSession(beast::ssl_stream<beast::tcp_stream>(std::move(stream), *ssl), id, addr);
    } else {
      StartSession(std::move(stream), id, addr);
    }
    Accept();
  });
}

// ---- Server ---------------------------------------------------------------------------------------

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Server::~Server() { Stop(); }

void Server::Add(const std::string& method, const std::string& pattern, Handler h, Lane lane) {
  impl_->routes.push_back(Route{method, std::regex(pattern, std::regex::ECMAScript), std::move(h), lane});
}
void Server::Get(const std::string& p, Handler h, Lane lane) { Add("GET", p, std::move(h), lane); }
void Server::Post(const std::string& p, Handler h, Lane lane) { Add("POST", p, std::move(h), lane); }
void Server::Put(const std::string& p, Handler h, Lane lane) { Add("PUT", p, std::move(h), lane); }
void Server::Patch(const std::string& p, Handler h, Lane lane) { Add("PATCH", p, std::move(h), lane); }
void Server::Delete(const std::string& p, Handler h, Lane lane) { Add("DELETE", p, std::move(h), lane); }
void Server::set_pre_body_check(PreBodyCheck check) { impl_->pre_body = std::move(check); }
void Server::set_error_writer(ErrorWriter writer) { impl_->error_writer = std::move(writer); }

Result<int> Server::Listen(const std::string& host, int port) {
  Impl& s = *impl_;
  if (s.running) return Status::FailedPrecondition("http server: already listening");
  // Every connection is a descriptor: raise the soft limit towards what the caps allow.
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    const rlim_t want = static_cast<rlim_t>(s.options.max_connections) + 1024;
    if (rl.rlim_cur < want) {
      rl.rlim_cur = std::min(want, rl.rlim_max);
      (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
  }
  if (s.options.tls.enabled()) {
    try {
      s.ssl.emplace(net::ssl::context::tls_server);
      s.ssl->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                         net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 |
                         net::ssl::context::no_tlsv1_1 | net::ssl::context::single_dh_use);
      s.ssl->use_certificate_chain_file(s.options.tls.cert_file);
      s.ssl->use_private_key_file(s.options.tls.key_file, net::ssl::context::pem);
      if (!s.options.tls.client_ca_file.empty()) {
        s.ssl->load_verify_file(s.options.tls.client_ca_file);
        s.ssl->set_verify_mode(net::ssl::verify_peer | net::ssl::verify_fail_if_no_peer_cert);
      }
    } catch (const std::exception& e) {
      s.ssl.reset();
      return Status::InvalidArgument(fmt::format("tls: cannot load the certificate '{}' / key '{}'{}: {}",
                                                 s.options.tls.cert_file, s.options.tls.key_file,
                                                 s.options.tls.client_ca_file.empty()
                                                     ? ""
                                                     : " / client CA '" + s.options.tls.client_ca_file + "'",
                                                 e.what()));
    }
  }
  beast::error_code ec;
  auto addr = net::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) return Status::InvalidArgument(fmt::format("cannot listen on '{}': not an IP address", host));
  tcp::endpoint ep(addr, static_cast<uint16_t>(port));
  s.acceptor.emplace(s.ioc);
  s.acceptor->open(ep.protocol(), ec);
  if (!ec) s.acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor->bind(ep, ec);
  if (!ec) s.acceptor->listen(4096, ec);
  if (ec) {
    s.acceptor.reset();
    return Status::IoError(fmt::format("cannot listen on {}:{}: {}", host, port, ec.message()));
  }
  const int bound = s.acceptor->local_endpoint().port();
  s.lanes[0] = std::make_unique<LanePool>(s.options.normal_workers);
  s.lanes[1] = std::make_unique<LanePool>(s.options.priority_workers);
  s.stopping = false;
  s.Accept();
  for (int i = 0; i < std::max(1, s.options.io_threads); ++i) s.io_threads.emplace_back([&s] { s.ioc.run(); });
  s.running = true;
  return bound;
}

void Server::Stop() {
  Impl& s = *impl_;
  if (!s.running) return;
  s.running = false;
  s.stopping = true;
  net::post(s.ioc, [&s] {
    beast::error_code ec;
    if (s.acceptor) s.acceptor->close(ec);
  });
  // Closing may drop the last reference to a session, whose destructor takes conn_mu: call the
  // closers outside the lock.
  std::vector<std::function<void()>> closers;
  {
    std::lock_guard<std::mutex> lock(s.conn_mu);
    for (auto& [id, close] : s.closers) closers.push_back(close);
  }
  for (auto& close : closers) close();
  closers.clear();
  // Handlers in flight finish; what they post back finds closed connections.
  for (auto& lane : s.lanes) {
    if (lane) lane->pool.join();
  }
  s.ioc.stop();
  for (auto& t : s.io_threads) t.join();
  s.io_threads.clear();
}

ServerStats Server::stats() const {
  const Impl& s = *impl_;
  ServerStats st;
  st.open_connections = s.open.load();
  st.accepted_total = s.accepted.load();
  st.refused_connections_total = s.refused.load();
  st.requests_total = s.requests.load();
  st.timeouts_total = s.timeouts.load();
  st.bad_requests_total = s.bad.load();
  st.busy_total = s.busy.load();
  st.handler_errors_total = s.handler_errors.load();
  return st;
}

std::string Server::MetricsText(const std::string& p) const {
  const ServerStats st = stats();
  std::string out;
  auto add = [&](const char* name, const char* type, const char* help, int64_t v) {
    out += fmt::format("# HELP {0}_{1} {2}\n# TYPE {0}_{1} {3}\n{0}_{1} {4}\n", p, name, help, type, v);
  };
  add("connections_open", "gauge", "HTTP connections open now.", st.open_connections);
  add("connections_accepted_total", "counter", "HTTP connections accepted.", st.accepted_total);
  add("connections_refused_total", "counter", "HTTP connections closed at once: over the total or per-address cap.",
      st.refused_connections_total);
  add("requests_total", "counter", "HTTP requests whose head was read.", st.requests_total);
  add("timeouts_total", "counter", "HTTP connections closed at the request deadline or idle timeout.",
      st.timeouts_total);
  add("bad_requests_total", "counter", "HTTP requests refused by the server itself (malformed, too large, not text, no route).",
      st.bad_requests_total);
  add("busy_total", "counter", "HTTP requests answered 503 because their lane's queue was full.", st.busy_total);
  add("handler_errors_total", "counter", "HTTP handlers that threw (answered 500).", st.handler_errors_total);
  return out;
}

}  // namespace gpupool::http
