// The event-driven HTTP server over real sockets: what a hostile client can send (bytes that are
// not text, slow heads, chunked floods, bodies to refused routes, no body at all, too many
// connections) gets a bounded, named answer, and the server goes on serving.
#include "http/server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace gpupool::http {
namespace {

using namespace std::chrono_literals;

// A raw connection, for what no well-behaved client library sends.
class Raw {
 public:
  explicit Raw(int port, const char* from = "127.0.0.1") {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in src{};
    src.sin_family = AF_INET;
    ::inet_pton(AF_INET, from, &src.sin_addr);
    (void)::bind(fd_, reinterpret_cast<sockaddr*>(&src), sizeof src);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~Raw() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool connected() const { return connected_; }
  bool Send(const std::string& s) { return ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size()); }
  // Reads until the peer closes or `timeout` passes.
  std::string ReadAll(std::chrono::milliseconds timeout = 5s) {
    std::string out;
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        closed_ = true;
        break;
      }
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }
  // Reads one whole answer (its head and Content-Length bytes of body), or what came by `timeout`.
  std::string ReadResponse(std::chrono::milliseconds timeout = 5s) {
    std::string out;
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const size_t head_end = out.find("\r\n\r\n");
      if (head_end != std::string::npos) {
        const size_t cl = out.find("Content-Length: ");
        const size_t want = cl == std::string::npos || cl > head_end ? 0 : std::stoul(out.substr(cl + 16));
        if (out.size() >= head_end + 4 + want) break;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        closed_ = true;
        break;
      }
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }
  bool closed() const { return closed_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool closed_ = false;
};

class HttpServerTest : public ::testing::Test {
 protected:
  void StartWith(ServerOptions o) {
    server_ = std::make_unique<Server>(o);
    server_->Get("/hello", [](const Request& req, Response& res) {
      res.set_content("hello " + req.get_param_value("name"), "text/plain");
    });
    server_->Get(R"(/items/([^/]+))", [](const Request& req, Response& res) {
      res.set_content("item " + req.matches[1], "text/plain");
    });
    server_->Post("/echo", [this](const Request& req, Response& res) {
      ++bodies_seen_;
      res.set_content(std::to_string(req.body.size()) + ":" + req.body.substr(0, 16), "text/plain");
    });
    server_->Get("/throw", [](const Request&, Response&) -> void { throw std::runtime_error("secret detail"); });
    server_->Get("/slow", [](const Request&, Response& res) {
      std::this_thread::sleep_for(300ms);
      res.set_content("slow", "text/plain");
    });
    server_->Get("/block", [this](const Request&, Response& res) {
      std::unique_lock<std::mutex> lock(block_mu_);
      block_cv_.wait_for(lock, 10s, [this] { return released_; });
      res.set_content("released", "text/plain");
    });
    server_->Get("/fast", [](const Request&, Response& res) { res.set_content("fast", "text/plain"); }, Lane::kPriority);
    // Deferred answers: parked until Broadcast (or their timeout); "now" answers from the handler
    // itself, before it returns.
    server_->Get("/wait", [this](const Request& req, Response& res) {
      Response late;
      late.status = 204;
      const int ms = req.has_param("ms") ? std::atoi(req.get_param_value("ms").c_str()) : 10000;
      auto r = res.Defer(std::chrono::milliseconds(ms), std::move(late));
      ASSERT_NE(r, nullptr);
      EXPECT_EQ(res.Defer(1s, Response{}), nullptr);  // once only
      if (req.has_param("now")) {
        Response now;
        now.set_content("at once", "text/plain");
        EXPECT_TRUE(r->Send(std::move(now)));
        EXPECT_FALSE(r->Send(Response{}));
        // The handler goes on a while after its Send, which the I/O thread answers meanwhile.
        if (req.has_param("linger_ms"))
          std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(req.get_param_value("linger_ms").c_str())));
        return;
      }
      std::lock_guard<std::mutex> lock(park_mu_);
      parked_.push_back(std::move(r));
    });
    server_->set_pre_body_check([this](const Request& req, Response& res) {
      ++checks_;
      if (req.get_header_value("Authorization") == "Bearer ok") return true;
      res.status = 401;
      res.set_content("no", "text/plain");
      return false;
    });
    auto port = server_->Listen("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status().ToString();
    port_ = *port;
  }
  // Answers every parked request; returns how many answers went.
  int Broadcast(const std::string& text) {
    std::vector<std::shared_ptr<Responder>> parked;
    {
      std::lock_guard<std::mutex> lock(park_mu_);
      parked.swap(parked_);
    }
    int sent = 0;
    for (auto& r : parked) {
      Response res;
      res.set_content(text, "text/plain");
      sent += r->Send(std::move(res)) ? 1 : 0;
    }
    return sent;
  }
  size_t Parked() {
    std::lock_guard<std::mutex> lock(park_mu_);
    return parked_.size();
  }
  void SetUp() override {}
  void TearDown() override {
    if (server_) server_->Stop();
  }
  int Status(const std::string& raw) {
    if (raw.rfind("HTTP/1.1 ", 0) != 0) return 0;
    return std::stoi(raw.substr(9, 3));
  }
  bool Alive() {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(5, 0);
    auto r = c.Get("/hello?name=x");
    return r && r->status == 200 && r->body == "hello x";
  }

  std::unique_ptr<Server> server_;
  int port_ = 0;
  std::atomic<int> bodies_seen_{0}, checks_{0};
  std::mutex park_mu_;
  std::vector<std::shared_ptr<Responder>> parked_;
  std::mutex block_mu_;
  std::condition_variable block_cv_;
  bool released_ = false;
  void Release() {
    std::lock_guard<std::mutex> lock(block_mu_);
    released_ = true;
    block_cv_.notify_all();
  }
};

TEST_F(HttpServerTest, ServesRoutesParamsAndMatches) {
  StartWith({});
  httplib::Client c("127.0.0.1", port_);
  {
    Raw raw(port_);
    ASSERT_TRUE(raw.Send("GET /hello?name=a%20b+c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    const std::string out = raw.ReadAll();
    EXPECT_EQ(Status(out), 200) << out;
    EXPECT_NE(out.find("hello a b c"), std::string::npos) << out;
  }
  auto r = c.Get("/items/j-1%20x");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "item j-1 x");
  r = c.Post("/echo", httplib::Headers{{"Authorization", "Bearer ok"}}, "abc", "text/plain");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "3:abc");
  r = c.Get("/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  r = c.Delete("/hello");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  r = c.Head("/hello?name=q");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(r->body.empty());
}

TEST_F(HttpServerTest, BytesThatAreNotTextGet400AndTheServerLives) {
  StartWith({});
  for (const std::string target :
       {"/%FF", "/items/%FF%FE", "/items/%C0%AF", "/items/%ED%A0%80", "/hello?name=%FF", "/hello?%FF=1",
        "/items/%00", "/items/%0A", "/items/%", "/items/%G1", "/hello?name=%E2%82"}) {
    Raw raw(port_);
    ASSERT_TRUE(raw.Send("GET " + target + " HTTP/1.1\r\nHost: x\r\n\r\n"));
    const std::string out = raw.ReadAll();
    EXPECT_EQ(Status(out), 400) << target << ": " << out;
  }
  // Raw bytes in the request line itself.
  Raw raw(port_);
  ASSERT_TRUE(raw.Send(std::string("GET /items/\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n")));
  const int st = Status(raw.ReadAll());
  EXPECT_TRUE(st == 400 || st == 0) << st;
  EXPECT_TRUE(Alive());
}

TEST_F(HttpServerTest, HandlerExceptionsAre500WithoutTheirText) {
  StartWith({});
  httplib::Client c("127.0.0.1", port_);
  auto r = c.Get("/throw");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500);
  EXPECT_EQ(r->body.find("secret"), std::string::npos) << r->body;
  EXPECT_EQ(server_->stats().handler_errors_total, 1);
  EXPECT_TRUE(Alive());
}

TEST_F(HttpServerTest, ASlowHeadIsCutAtTheRequestDeadlineNotPerByte) {
  ServerOptions o;
  o.request_timeout = 600ms;
  StartWith(o);
  Raw raw(port_);
  const auto start = std::chrono::steady_clock::now();
  const std::string head = "GET /hello HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaa\r\n";
  bool cut = false;
  for (char ch : head) {
    if (!raw.Send(std::string(1, ch))) {
      cut = true;
      break;
    }
    std::this_thread::sleep_for(100ms);  // each byte well within any per-byte timeout
    if (std::chrono::steady_clock::now() - start > 4s) break;
  }
  raw.ReadAll(2s);
  EXPECT_TRUE(cut || raw.closed());
  EXPECT_GE(server_->stats().timeouts_total, 1);
  EXPECT_TRUE(Alive());
}

TEST_F(HttpServerTest, ChunkedBodiesStopAtTheLimitWhileReading) {
  ServerOptions o;
  o.max_body_bytes = 64 << 10;
  StartWith(o);
  Raw raw(port_);
  ASSERT_TRUE(raw.Send("POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ok\r\nTransfer-Encoding: chunked\r\n\r\n"));
  const std::string chunk = "4000\r\n" + std::string(0x4000, 'a') + "\r\n";
  int sent = 0;
  for (; sent < 64; ++sent) {  // up to 1 MiB, 16x the limit
    if (!raw.Send(chunk)) break;
  }
  const std::string out = raw.ReadAll();
  EXPECT_EQ(Status(out), 413) << out.substr(0, 200);
  EXPECT_EQ(bodies_seen_.load(), 0);
  EXPECT_TRUE(Alive());
}

TEST_F(HttpServerTest, ARefusedRequestNeverHasItsBodyRead) {
  StartWith({});
  Raw raw(port_);
  // Announces 512 KiB but sends only the head: the refusal comes without waiting for the body.
  ASSERT_TRUE(raw.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 524288\r\n\r\n"));
  // The request deadline (10 s) is far past this read: an answer here did not wait for the body.
  const std::string out = raw.ReadAll(3s);
  EXPECT_EQ(Status(out), 401) << out;
  EXPECT_EQ(bodies_seen_.load(), 0);
  EXPECT_EQ(checks_.load(), 1);
}

TEST_F(HttpServerTest, APostWithoutABodyIsAnsweredAtOnce) {
  StartWith({});
  Raw raw(port_);
  // No Content-Length, no Transfer-Encoding: an empty body, answered without waiting for bytes
  // that never come (the request deadline is far longer than the read below).
  ASSERT_TRUE(raw.Send("POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ok\r\nConnection: close\r\n\r\n"));
  const std::string out = raw.ReadAll(5s);
  EXPECT_EQ(Status(out), 200) << out;
  EXPECT_NE(out.find("0:"), std::string::npos) << out;
}

TEST_F(HttpServerTest, ExpectContinueIsHonouredAfterTheCheck) {
  StartWith({});
  Raw raw(port_);
  ASSERT_TRUE(raw.Send("POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ok\r\nContent-Length: 5\r\n"
                       "Expect: 100-continue\r\n\r\n"));
  const std::string cont = raw.ReadAll(500ms);
  EXPECT_EQ(Status(cont), 100) << cont;
  ASSERT_TRUE(raw.Send("hello"));
  const std::string out = raw.ReadAll(1s);
  EXPECT_EQ(Status(out), 200) << out;
}

TEST_F(HttpServerTest, OversizedHeadsTargetsAndDeclaredBodies) {
  ServerOptions o;
  o.max_body_bytes = 1000;
  StartWith(o);
  {
    Raw raw(port_);
    ASSERT_TRUE(raw.Send("GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(32 << 10, 'a') + "\r\n\r\n"));
    EXPECT_EQ(Status(raw.ReadAll()), 431);
  }
  {
    Raw raw(port_);
    ASSERT_TRUE(raw.Send("GET /items/" + std::string(5000, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n"));
    EXPECT_EQ(Status(raw.ReadAll()), 414);
  }
  {
    Raw raw(port_);
    ASSERT_TRUE(raw.Send("POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ok\r\nContent-Length: 1001\r\n\r\n"));
    EXPECT_EQ(Status(raw.ReadAll()), 413);
  }
  {
    Raw raw(port_);
    ASSERT_TRUE(raw.Send("GARBAGE\r\n\r\n"));
    EXPECT_EQ(Status(raw.ReadAll()), 400);
  }
  EXPECT_TRUE(Alive());
}

TEST_F(HttpServerTest, ConnectionsAreCappedPerAddressAndOthersStillGetIn) {
  ServerOptions o;
  o.max_connections_per_address = 8;
  StartWith(o);
  std::vector<std::unique_ptr<Raw>> held;
  for (int i = 0; i < 8; ++i) {
    held.push_back(std::make_unique<Raw>(port_, "127.0.0.2"));
    ASSERT_TRUE(held.back()->connected());
  }
  // Let the server accept all eight before the ninth.
  for (int i = 0; i < 100 && server_->stats().open_connections < 8; ++i) std::this_thread::sleep_for(10ms);
  Raw ninth(port_, "127.0.0.2");
  const std::string out = ninth.ReadAll(2s);
  EXPECT_EQ(Status(out), 503) << out;
  EXPECT_NE(out.find("Retry-After: 1\r\n"), std::string::npos) << out;
  EXPECT_TRUE(ninth.closed());
  EXPECT_EQ(server_->stats().refused_connections_total, 1);
  EXPECT_TRUE(Alive());  // from 127.0.0.1
}

TEST_F(HttpServerTest, APriorityLaneIsNotStuckBehindAFullNormalLane) {
  ServerOptions o;
  o.normal_workers = 1;
  o.priority_workers = 1;
  StartWith(o);
  // Every normal worker is held until the priority request has been answered.
  std::vector<std::thread> blocked;
  for (int i = 0; i < 3; ++i) {
    blocked.emplace_back([this] {
      httplib::Client c("127.0.0.1", port_);
      c.set_read_timeout(20, 0);
      (void)c.Get("/block");
    });
  }
  std::this_thread::sleep_for(100ms);
  httplib::Client c("127.0.0.1", port_);
  c.set_read_timeout(5, 0);
  auto r = c.Get("/fast");
  Release();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "fast");
  for (auto& t : blocked) t.join();
}

TEST_F(HttpServerTest, AFullLaneAnswers503) {
  ServerOptions o;
  o.normal_workers = 1;
  o.max_queued_per_lane = 2;
  StartWith(o);
  std::atomic<int> busy{0}, ok{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < 8; ++i) {
    ts.emplace_back([&] {
      httplib::Client c("127.0.0.1", port_);
      c.set_read_timeout(10, 0);
      auto r = c.Get("/slow");
      if (r && r->status == 503 && r->get_header_value("Retry-After") == "1") ++busy;
      if (r && r->status == 200) ++ok;
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_GE(busy.load(), 1);
  EXPECT_GE(ok.load(), 1);
  EXPECT_EQ(busy.load() + ok.load(), 8);
}

TEST_F(HttpServerTest, KeepAliveServesManyRequestsOnOneConnection) {
  StartWith({});
  httplib::Client c("127.0.0.1", port_);
  c.set_keep_alive(true);
  for (int i = 0; i < 50; ++i) {
    auto r = c.Get("/hello?name=" + std::to_string(i));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "hello " + std::to_string(i));
  }
  EXPECT_EQ(server_->stats().accepted_total, 1);
}

// TLS with certificates made by the openssl command line, as docs/server.md tells operators to:
// a CA, a server certificate for 127.0.0.1 signed by it, a client certificate signed by it.
class HttpTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/gpupool-tls-" + std::to_string(::getpid());
    const std::string d = dir_;
    const std::string script =
        "set -e; rm -rf " + d + "; mkdir -p " + d + "; cd " + d + ";"
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out ca.pem"
        " -days 2 -subj /CN=gpupool-test-ca 2>/dev/null;"
        "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout server.key -out server.csr"
        " -subj /CN=127.0.0.1 2>/dev/null;"
        "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext;"
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2"
        " -extfile san.ext 2>/dev/null;"
        "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout client.key -out client.csr"
        " -subj /CN=node-1 2>/dev/null;"
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2 2>/dev/null;"
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout other.key -out other.pem"
        " -days 2 -subj /CN=127.0.0.1 2>/dev/null";
    ASSERT_EQ(std::system(("bash -c \"" + script + "\"").c_str()), 0) << "openssl failed";
  }
  void TearDown() override {
    if (server_) server_->Stop();
    std::system(("rm -rf " + dir_).c_str());
  }
  void Start(bool client_ca) {
    ServerOptions o;
    o.tls.cert_file = dir_ + "/server.pem";
    o.tls.key_file = dir_ + "/server.key";
    if (client_ca) o.tls.client_ca_file = dir_ + "/ca.pem";
    server_ = std::make_unique<Server>(o);
    server_->Get("/hello", [](const Request&, Response& res) { res.set_content("hello over tls", "text/plain"); });
    auto port = server_->Listen("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status().ToString();
    port_ = *port;
  }
  std::string dir_;
  std::unique_ptr<Server> server_;
  int port_ = 0;
};

TEST_F(HttpTlsTest, ServesTlsToAClientThatVerifiesTheServer) {
  Start(false);
  httplib::SSLClient c("127.0.0.1", port_);
  c.set_ca_cert_path((dir_ + "/ca.pem").c_str());
  c.enable_server_certificate_verification(true);
  auto r = c.Get("/hello");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->body, "hello over tls");
  // A client that trusts another CA refuses the server; a plain HTTP client gets nothing.
  httplib::SSLClient wrong("127.0.0.1", port_);
  wrong.set_ca_cert_path((dir_ + "/other.pem").c_str());
  wrong.enable_server_certificate_verification(true);
  EXPECT_FALSE(wrong.Get("/hello"));
  httplib::Client plain("127.0.0.1", port_);
  plain.set_read_timeout(3, 0);
  auto p = plain.Get("/hello");
  EXPECT_TRUE(!p || p->status != 200);
  // The server goes on serving after both.
  auto again = c.Get("/hello");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 200);
}

TEST_F(HttpTlsTest, AClientCaRequiresAClientCertificate) {
  Start(true);
  httplib::SSLClient anonymous("127.0.0.1", port_);
  anonymous.set_ca_cert_path((dir_ + "/ca.pem").c_str());
  anonymous.enable_server_certificate_verification(true);
  EXPECT_FALSE(anonymous.Get("/hello"));
  httplib::SSLClient c("127.0.0.1", port_, dir_ + "/client.pem", dir_ + "/client.key");
  c.set_ca_cert_path((dir_ + "/ca.pem").c_str());
  c.enable_server_certificate_verification(true);
  auto r = c.Get("/hello");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->body, "hello over tls");
}

TEST_F(HttpTlsTest, BadCertificateFilesAreNamed) {
  ServerOptions o;
  o.tls.cert_file = dir_ + "/missing.pem";
  o.tls.key_file = dir_ + "/server.key";
  Server s(o);
  auto port = s.Listen("127.0.0.1", 0);
  ASSERT_FALSE(port.ok());
  EXPECT_NE(port.status().message().find("missing.pem"), std::string::npos) << port.status().ToString();
}

TEST(HttpTextTest, PercentDecodingAndUtf8) {
  std::string out;
  EXPECT_TRUE(PercentDecode("a%20b+c", true, &out));
  EXPECT_EQ(out, "a b c");
  EXPECT_TRUE(PercentDecode("a+b", false, &out));
  EXPECT_EQ(out, "a+b");
  EXPECT_FALSE(PercentDecode("%", false, &out));
  EXPECT_FALSE(PercentDecode("%4", false, &out));
  EXPECT_FALSE(PercentDecode("%4g", false, &out));
  EXPECT_TRUE(ValidText("héllo ✓ 𝄞"));
  EXPECT_FALSE(ValidText("\xff"));
  EXPECT_FALSE(ValidText("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(ValidText("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(ValidText("\xf4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(ValidText("\xe2\x82"));          // truncated
  EXPECT_FALSE(ValidText(std::string("a\0b", 3)));
  EXPECT_FALSE(ValidText("a\nb"));
  EXPECT_FALSE(ValidText("\xc2\x85"));  // C1 control
}

}  // namespace
}  // namespace gpupool::http

namespace gpupool::http {
namespace {

// Deferred answers (long polls): 300 requests parked at once on a server with one worker per
// lane, so none of them holds a thread; /fast and /hello are answered meanwhile; one broadcast
// answers them all, each on its own kept-alive connection, which then serves another request.
TEST_F(HttpServerTest, DeferredAnswersHoldNoThreadAndComeFromAnyThread) {
  ServerOptions o;
  o.normal_workers = 1;
  o.priority_workers = 1;
  StartWith(o);
  constexpr int kParked = 300;
  std::vector<std::unique_ptr<Raw>> conns;
  for (int i = 0; i < kParked; ++i) {
    conns.push_back(std::make_unique<Raw>(port_));
    ASSERT_TRUE(conns.back()->Send("GET /wait HTTP/1.1\r\nHost: x\r\n\r\n"));
  }
  for (int i = 0; i < 500 && Parked() < static_cast<size_t>(kParked); ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(Parked(), static_cast<size_t>(kParked));
  httplib::Client c("127.0.0.1", port_);
  auto hello = c.Get("/hello?name=x");
  ASSERT_TRUE(hello);
  EXPECT_EQ(hello->body, "hello x");
  int sent = 0;
  std::thread from_elsewhere([&] { sent = Broadcast("done"); });
  from_elsewhere.join();
  EXPECT_EQ(sent, kParked);
  for (auto& conn : conns) {
    const std::string out = conn->ReadResponse();
    EXPECT_EQ(Status(out), 200) << out;
    EXPECT_NE(out.find("\r\n\r\ndone"), std::string::npos) << out;
    EXPECT_FALSE(conn->closed());
  }
  // Kept alive: the same connection serves the next request.
  ASSERT_TRUE(conns[0]->Send("GET /hello?name=again HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_NE(conns[0]->ReadResponse().find("hello again"), std::string::npos);
}

TEST_F(HttpServerTest, ADeferredRequestNobodyAnswersGetsItsTimeoutAnswer) {
  StartWith({});
  httplib::Client c("127.0.0.1", port_);
  c.set_read_timeout(5, 0);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = c.Get("/wait?ms=200");
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 204);
  EXPECT_GE(took, 150ms);
  EXPECT_EQ(Broadcast("late"), 0);  // answered already: a late Send is refused
  // The handler answering before it returns.
  auto now = c.Get("/wait?now=1");
  ASSERT_TRUE(now);
  EXPECT_EQ(now->status, 200);
  EXPECT_EQ(now->body, "at once");
}

// A handler that answers through its Responder and returns only after the answer went out: the
// connection carries that one answer and then the next request's (the worker once took the
// answer as its own and wrote a second, empty 200 after it, which the client read as the answer
// to its next request).
TEST_F(HttpServerTest, AnAnswerSentBeforeTheHandlerReturnsGoesOutOnce) {
  StartWith({});
  Raw conn(port_);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(conn.Send("GET /wait?now=1&linger_ms=100 HTTP/1.1\r\nHost: x\r\n\r\n"));
    const std::string first = conn.ReadResponse();
    EXPECT_EQ(Status(first), 200) << first;
    EXPECT_NE(first.find("\r\n\r\nat once"), std::string::npos) << first;
    std::this_thread::sleep_for(150ms);  // the handler has returned
    ASSERT_TRUE(conn.Send("GET /hello?name=next HTTP/1.1\r\nHost: x\r\n\r\n"));
    const std::string second = conn.ReadResponse();
    EXPECT_NE(second.find("\r\n\r\nhello next"), std::string::npos) << second;
  }
}

// A client that leaves while parked: the answer finds a closed connection and nothing breaks;
// stopping the server with requests parked returns.
TEST_F(HttpServerTest, DeferredAnswersToClosedConnectionsAndAStopWithRequestsParked) {
  StartWith({});
  {
    Raw gone(port_);
    ASSERT_TRUE(gone.Send("GET /wait HTTP/1.1\r\nHost: x\r\n\r\n"));
    for (int i = 0; i < 200 && Parked() < 1; ++i) std::this_thread::sleep_for(10ms);
  }
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(Broadcast("nobody"), 1);
  EXPECT_TRUE(Alive());
  Raw parked(port_);
  ASSERT_TRUE(parked.Send("GET /wait HTTP/1.1\r\nHost: x\r\n\r\n"));
  for (int i = 0; i < 200 && Parked() < 1; ++i) std::this_thread::sleep_for(10ms);
  const auto t0 = std::chrono::steady_clock::now();
  server_->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_EQ(Broadcast("after stop"), 1);  // the Responder outlives the server's connections
}

}  // namespace
}  // namespace gpupool::http
