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

#include "http/request_internal.h"

namespace gpupool::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;

// ---- the server -----------------------------------------------------------------------------------

namespace {

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

}  // namespace

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
  template <class Stream>
  void StartSession(Stream&& stream, uint64_t id, const std::string& addr);
  void Release(uint64_t id, const std::string& addr) {
    std::lock_guard<std::mutex> lock(conn_mu);
    closers.erase(id);
    auto it = per_address.find(addr);
    if (it != per_address.end() && --it->second <= 0) per_address.erase(it);
    --open;
  }
};

namespace {

template <class Stream>
beast::tcp_stream& Lowest(Stream& s) {
  return beast::get_lowest_layer(s);
}

// One connection. Lives as long as an operation of it is pending (shared_from_this in every
// completion handler).
template <class Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
 public:
  Session(Server::Impl& server, Stream stream, uint64_t id, std::string addr)
      : s_(server), stream_(std::move(stream)), id_(id), addr_(std::move(addr)) {}
  ~Session() { s_.Release(id_, addr_); }

  void Start() {
    if constexpr (std::is_same_v<Stream, beast::ssl_stream<beast::tcp_stream>>) {
      Lowest(stream_).expires_after(s_.options.request_timeout);
      stream_.async_handshake(net::ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code ec) {
                                if (ec) return self->Close(false);
                                self->WaitForRequest();
                              });
    } else {
      WaitForRequest();
    }
  }

  // Called from any thread (Stop): closes the socket on the connection's own executor.
  void CloseSoon() {
    net::post(stream_.get_executor(), [self = this->shared_from_this()] { self->Close(false); });
  }

 private:
  // Between requests: wait (idle timeout) for the first byte of the next one, then the whole
  // request has `request_timeout`.
  void WaitForRequest() {
    if (s_.stopping) return Close(false);
    if (buffer_.size() > 0) return ReadHeader();
    Lowest(stream_).expires_after(s_.options.idle_timeout);
    stream_.async_read_some(buffer_.prepare(4096),
                            [self = this->shared_from_this()](beast::error_code ec, size_t n) {
                              if (ec) {
                                if (ec == beast::error::timeout) ++self->s_.timeouts;
                                return self->Close(false);
                              }
                              self->buffer_.commit(n);
                              self->ReadHeader();
                            });
  }

  void ReadHeader() {
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(s_.options.max_header_bytes));
    parser_->body_limit(s_.options.max_body_bytes);
    deadline_ = std::chrono::steady_clock::now() + s_.options.request_timeout;
    Lowest(stream_).expires_after(s_.options.request_timeout);
    bhttp::async_read_header(stream_, buffer_, *parser_,
                             [self = this->shared_from_this()](beast::error_code ec, size_t) {
                               self->OnHeader(ec);
                             });
  }

  void OnHeader(beast::error_code ec) {
    if (ec) return OnReadError(ec);
    ++s_.requests;
    const auto& h = parser_->get();
    req_ = Request{};
    res_ = Response{};
    req_.method = std::string(h.method_string());
    req_.target = std::string(h.target());
    req_.remote_addr = addr_;
    keep_alive_ = h.keep_alive();
    for (const auto& f : h) req_.headers.emplace(Lower(std::string(f.name_string())), std::string(f.value()));
    body_pending_ = !parser_->is_done();

    if (req_.target.size() > s_.options.max_target_bytes)
      return Refuse(414, fmt::format("request target: longer than {} bytes", s_.options.max_target_bytes));
    if (Status st = ParseTarget(); !st.ok()) return Refuse(400, st.message());
    if (const auto len = parser_->content_length(); len && *len > s_.options.max_body_bytes)
      return Refuse(413, "body: larger than the server's limit");
    int status = 0;
    route_ = s_.Match(req_, &status);
    if (route_ == nullptr) {
      return Refuse(status, status == 404 ? fmt::format("no such endpoint: {} {}", req_.method, req_.path)
                                          : fmt::format("method {} not allowed on {}", req_.method, req_.path));
    }
    if (!body_pending_) return Dispatch();
    // The head passed; the body is read only once the route's check allows it. A small body that
    // came in with the head is already read: the handler checks it at once, in one hop.
    if (!s_.pre_body) return ReadBody();
    if (const auto len = parser_->content_length();
        len && buffer_.size() >= *len && req_.get_header_value("expect").empty())
      return ReadBody();
    RunOnLane(route_->lane, [self = this->shared_from_this()] {
      bool ok = false;
      try {
        ok = self->s_.pre_body(self->req_, self->res_);
      } catch (...) {
        ++self->s_.handler_errors;
        self->s_.WriteError(self->res_, 500, "internal error");
      }
      net::post(self->stream_.get_executor(), [self, ok] {
        if (!ok) {
          self->keep_alive_ = false;  // the body stays unread
          return self->Write();
        }
        self->ReadBody();
      });
    });
  }

  void ReadBody() {
    const std::string expect = Lower(req_.get_header_value("expect"));
    if (expect == "100-continue") {
      auto cont = std::make_shared<bhttp::response<bhttp::empty_body>>(bhttp::status::continue_, 11);
      Lowest(stream_).expires_after(s_.options.write_timeout);
      bhttp::async_write(stream_, *cont, [self = this->shared_from_this(), cont](beast::error_code ec, size_t) {
        if (ec) return self->Close(false);
        self->ReadBodyBytes();
      });
      return;
    }
    ReadBodyBytes();
  }

  void ReadBodyBytes() {
    // The request's deadline is still the one set before its head.
    Lowest(stream_).expires_after(RemainingDeadline());
    bhttp::async_read(stream_, buffer_, *parser_, [self = this->shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->OnReadError(ec);
      self->req_.body = std::move(self->parser_->get().body());
      self->body_pending_ = false;
      self->Dispatch();
    });
  }

  std::chrono::steady_clock::duration RemainingDeadline() {
    // The tcp_stream's timer was set for the head; keep one deadline for head and body.
    const auto now = std::chrono::steady_clock::now();
    return deadline_ > now ? deadline_ - now : std::chrono::milliseconds(1);
  }

  void OnReadError(beast::error_code ec) {
    if (ec == bhttp::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
        ec == net::error::operation_aborted || ec == net::ssl::error::stream_truncated)
      return Close(false);
    if (ec == beast::error::timeout) {
      ++s_.timeouts;
      return Close(false);  // the client took too long: it is not waiting for an answer worth sending
    }
    if (ec == bhttp::error::body_limit) return Refuse(413, "body: larger than the server's limit");
    if (ec == bhttp::error::header_limit) return Refuse(431, "request head: larger than the server's limit");
    return Refuse(400, fmt::format("malformed HTTP request: {}", ec.message()));
  }

  Status ParseTarget() { return http::ParseTarget(req_.target, &req_); }

  // Answers an error the server found itself. A body still unread means the connection cannot be
  // reused.
  void Refuse(int status, const std::string& message) {
    ++s_.bad;
    if (body_pending_ || status == 400 || status == 413 || status == 414 || status == 431) keep_alive_ = false;
    s_.WriteError(res_, status, message);
    Write();
  }

  template <class F>
  void RunOnLane(Lane lane, F&& f) {
    LanePool& pool = *s_.lanes[static_cast<int>(lane)];
    if (pool.pending.fetch_add(1) >= s_.options.max_queued_per_lane) {
      --pool.pending;
      ++s_.busy;
      keep_alive_ = false;
      s_.WriteError(res_, 503, "server busy: too many requests queued, try again");
      res_.set_header("Retry-After", "1");
      return Write();
    }
    net::post(pool.pool, [&pool, f = std::forward<F>(f)]() mutable {
      f();
      --pool.pending;
    });
  }

  void Dispatch() {
    RunOnLane(route_->lane, [self = this->shared_from_this()] {
      // Only while the handler runs (the lane's closure holds the session): a raw pointer.
      // Whether the handler deferred is known here, on this thread: the session's state may
      // already have moved on (a Send from the handler itself is answered on the I/O thread,
      // possibly before the handler returns), and res_ then belongs to the Responder.
      Session* raw = self.get();
      bool deferred = false;
      self->res_.defer_hook = [raw, &deferred](std::chrono::milliseconds timeout, Response on_timeout) {
        deferred = true;
        return raw->DeferAnswer(timeout, std::move(on_timeout));
      };
      bool threw = false;
      try {
        self->route_->handler(self->req_, self->res_);
      } catch (const std::exception& e) {
        threw = true;
        std::fprintf(stderr, "gpupool http: handler for %s %s threw: %s\n", self->req_.method.c_str(),
                     self->req_.path.c_str(), e.what());
      } catch (...) {
        threw = true;
      }
      if (threw) ++self->s_.handler_errors;
      // A deferred answer belongs to its Responder now (which may already be writing res_).
      if (deferred) return;
      self->res_.defer_hook = nullptr;
      if (threw) {
        self->res_ = Response{};
        self->s_.WriteError(self->res_, 500, "internal error");
      }
      const size_t answer_bytes = self->res_.body.size();
      if (!self->TryWriteNow()) net::post(self->stream_.get_executor(), [self] { self->Write(); });
      // A large answer (a page of jobs, every node) leaves megabytes free in this worker's malloc
      // arena, which glibc keeps; give them back, or every worker holds its largest answer forever.
      if (answer_bytes >= kTrimAfterBytes) malloc_trim(0);
    });
  }

  // The answer of a deferred request: whichever of Send and the timeout comes first. It does not
  // keep the connection alive (the armed timeout does, inside the server), so a Responder held
  // after the server stopped answers nothing and holds nothing of it.
  class DeferredResponder : public Responder {
   public:
    explicit DeferredResponder(std::weak_ptr<Session> s) : session_(std::move(s)) {}
    bool Send(Response res) override {
      if (sent_.exchange(true)) return false;
      if (auto s = session_.lock()) {
        net::post(s->stream_.get_executor(), [s, res = std::move(res)]() mutable { s->AnswerDeferred(std::move(res)); });
      }
      return true;
    }
    bool sent() const override { return sent_; }

   private:
    std::atomic<bool> sent_{false};
    std::weak_ptr<Session> session_;
  };

  // From the handler's thread, while the handler runs.
  std::shared_ptr<Responder> DeferAnswer(std::chrono::milliseconds timeout, Response on_timeout) {
    auto r = std::make_shared<DeferredResponder>(this->weak_from_this());
    // The timer is armed on the connection's executor; a Send from the handler itself is posted
    // after this and finds the timer armed (or, having set `sent`, keeps it from being armed).
    net::post(stream_.get_executor(), [self = this->shared_from_this(), r, timeout,
                                       on_timeout = std::move(on_timeout)]() mutable {
      if (r->sent()) return;
      self->defer_timer_.emplace(self->stream_.get_executor());
      self->defer_timer_->expires_after(timeout);
      self->defer_timer_->async_wait([self, r, on_timeout = std::move(on_timeout)](beast::error_code ec) mutable {
        if (!ec) r->Send(std::move(on_timeout));
      });
    });
    return r;
  }

  // On the connection's executor.
  void AnswerDeferred(Response res) {
    if (defer_timer_) defer_timer_->cancel();
    res_ = std::move(res);
    if (socket_closed_ || closed_) return;
    Write();
  }

  static constexpr size_t kTrimAfterBytes = 1 << 20;
  static constexpr bool kTls = std::is_same_v<Stream, beast::ssl_stream<beast::tcp_stream>>;

  // From the worker that ran the handler, on plain TCP: the answer goes out at once with one
  // non-blocking write (no hop back to the I/O thread before the client has it). Whatever the
  // socket does not take at once is written asynchronously with the write timeout, so a client
  // that does not read never holds the worker. The connection has no other operation pending here.
  bool TryWriteNow() {
    if constexpr (kTls) {
      return false;
    } else {
      if (s_.stopping || req_.method == "HEAD") return false;
      bhttp::response<bhttp::string_body> msg = Message();
      std::ostringstream os;
      os << msg;
      auto wire = std::make_shared<std::string>(os.str());
      beast::error_code ec;
      auto& sock = Lowest(stream_).socket();
      writing_ = true;
      size_t n = 0;
      if (!closed_) {
        sock.non_blocking(true, ec);
        if (!ec) n = sock.write_some(net::buffer(*wire), ec);
      }
      writing_ = false;
      auto self = this->shared_from_this();
      if (ec == net::error::would_block || ec == net::error::try_again) ec = {};
      if (ec) {
        net::post(stream_.get_executor(), [self] { self->Close(false); });
      } else if (n == wire->size()) {
        net::post(stream_.get_executor(), [self] { self->AfterWrite({}); });
      } else {
        net::post(stream_.get_executor(), [self, wire, n] {
          Lowest(self->stream_).expires_after(self->s_.options.write_timeout);
          net::async_write(Lowest(self->stream_), net::buffer(wire->data() + n, wire->size() - n),
                           [self, wire](beast::error_code e, size_t) { self->AfterWrite(e); });
        });
      }
      return true;
    }
  }

  bhttp::response<bhttp::string_body> Message() {
    if (s_.stopping) keep_alive_ = false;
    bhttp::response<bhttp::string_body> msg;
    msg.version(11);
    msg.result(static_cast<unsigned>(res_.status > 0 ? res_.status : 200));
    for (const auto& [k, v] : res_.headers) msg.set(k, v);
    if (req_.method == "HEAD") {
      msg.content_length(res_.body.size());
    } else {
      msg.body() = std::move(res_.body);
      msg.prepare_payload();
    }
    msg.keep_alive(keep_alive_);
    return msg;
  }

  void AfterWrite(beast::error_code ec) {
    if (ec || !keep_alive_) return Close(!ec);
    parser_.reset();
    if (buffer_.size() == 0) buffer_.shrink_to_fit();
    WaitForRequest();
  }

  void Write() {
    auto msg = std::make_shared<bhttp::response<bhttp::string_body>>(Message());
    Lowest(stream_).expires_after(s_.options.write_timeout);
    auto done = [self = this->shared_from_this(), msg](beast::error_code ec, size_t) { self->AfterWrite(ec); };
    if (req_.method == "HEAD") {
      // The head of what GET would answer, without its body.
      auto head = std::make_shared<bhttp::response<bhttp::empty_body>>(msg->result(), 11);
      for (const auto& f : *msg) head->set(f.name_string(), f.value());
      head->keep_alive(keep_alive_);
      bhttp::async_write(stream_, *head, [head, done](beast::error_code ec, size_t n) mutable { done(ec, n); });
    } else {
      bhttp::async_write(stream_, *msg, std::move(done));
    }
  }

  void Close(bool graceful) {
    if (socket_closed_) return;
    // closed_ first, then writing_: a worker either sees closed_ and does not write, or is seen
    // writing, and the socket is closed right after its one non-blocking write.
    closed_ = true;
    if (writing_) {
      net::post(stream_.get_executor(), [self = this->shared_from_this(), graceful] { self->Close(graceful); });
      return;
    }
    socket_closed_ = true;
    beast::error_code ec;
    if constexpr (std::is_same_v<Stream, beast::ssl_stream<beast::tcp_stream>>) {
      if (graceful) {
        Lowest(stream_).expires_after(std::chrono::seconds(2));
        stream_.async_shutdown([self = this->shared_from_this()](beast::error_code) {
          beast::error_code e;
          Lowest(self->stream_).socket().close(e);
        });
        return;
      }
    }
    Lowest(stream_).socket().shutdown(tcp::socket::shutdown_send, ec);
    Lowest(stream_).socket().close(ec);
  }

  Server::Impl& s_;
  Stream stream_;
  uint64_t id_;
  std::string addr_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  Request req_;
  Response res_;
  const Route* route_ = nullptr;
  bool keep_alive_ = true;
  bool body_pending_ = false;
  std::atomic<bool> closed_{false};
  std::atomic<bool> writing_{false};
  bool socket_closed_ = false;
  std::chrono::steady_clock::time_point deadline_{};
  std::optional<net::steady_timer> defer_timer_;  // a deferred answer's timeout
};

}  // namespace

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

template <class Stream>
void Server::Impl::StartSession(Stream&& stream, uint64_t id, const std::string& addr) {
  auto session = std::make_shared<Session<std::decay_t<Stream>>>(*this, std::move(stream), id, addr);
  {
    std::lock_guard<std::mutex> lock(conn_mu);
    std::weak_ptr<Session<std::decay_t<Stream>>> weak = session;
    closers[id] = [weak] {
      if (auto s = weak.lock()) s->CloseSoon();
    };
  }
  session->Start();
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
