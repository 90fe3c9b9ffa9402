// One connection of the HTTP server: reading a request under its deadline, routing it to a lane,
// writing the answer (now, or later for a deferred one), keep-alive and closing. See server.h.
#include "http/server_impl.h"

#include "http/request_internal.h"

namespace gpupool::http {

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


template <class Stream>
void StartSessionOf(Server::Impl& impl, Stream&& stream, uint64_t id, const std::string& addr) {
  auto session = std::make_shared<Session<std::decay_t<Stream>>>(impl, std::move(stream), id, addr);
  {
    std::lock_guard<std::mutex> lock(impl.conn_mu);
    std::weak_ptr<Session<std::decay_t<Stream>>> weak = session;
    impl.closers[id] = [weak] {
      if (auto s = weak.lock()) s->CloseSoon();
    };
  }
  session->Start();
}

}  // namespace

void Server::Impl::StartSession(beast::tcp_stream&& stream, uint64_t id, const std::string& addr) {
  StartSessionOf(*this, std::move(stream), id, addr);
}

void Server::Impl::StartSession(beast::ssl_stream<beast::tcp_stream>&& stream, uint64_t id,
                                const std::string& addr) {
  StartSessionOf(*this, std::move(stream), id, addr);
}

}  // namespace gpupool::http
