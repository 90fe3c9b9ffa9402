// ApiClient's transport: TLS (verification of the server, host names, client certificates)
// against the project's own HTTP server, and what it does with a server that misbehaves (an answer
// too big, an answer that never comes, a request another thread ends).
#include "client/api_client.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>
#include <iostream>
#include <sstream>
#include <vector>

#include "cli/client_commands.h"
#include "http/server.h"

namespace gpupool {
namespace {

// Certificates made by the openssl command line, as docs/server.md tells operators to: a CA, a
// server certificate for 127.0.0.1 and localhost, one for another name, a client certificate, and
// a self-signed certificate no one trusts.
class ApiClientTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/gpupool-client-tls-" + std::to_string(::getpid());
    const std::string d = dir_;
    const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string script =
        "set -e; rm -rf " + d + "; mkdir -p " + d + "; cd " + d + ";" +
        "openssl req -x509 " + ec + " -keyout ca.key -out ca.pem -days 2 -subj /CN=test-ca 2>/dev/null;" +
        "openssl req " + ec + " -keyout server.key -out server.csr -subj /CN=127.0.0.1 2>/dev/null;" +
        "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext;" +
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2"
        " -extfile san.ext 2>/dev/null;" +
        "openssl req " + ec + " -keyout elsewhere.key -out elsewhere.csr -subj /CN=elsewhere 2>/dev/null;" +
        "printf 'subjectAltName=DNS:elsewhere.example\\n' > else.ext;" +
        "openssl x509 -req -in elsewhere.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out elsewhere.pem -days 2"
        " -extfile else.ext 2>/dev/null;" +
        "openssl req " + ec + " -keyout client.key -out client.csr -subj /CN=node-1 2>/dev/null;" +
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2"
        " 2>/dev/null;" +
        "openssl req -x509 " + ec + " -keyout other.key -out other.pem -days 2 -subj /CN=127.0.0.1 2>/dev/null";
    ASSERT_EQ(std::system(("bash -c \"" + script + "\"").c_str()), 0) << "openssl failed";
  }
  void TearDown() override {
    if (server_) server_->Stop();
    std::system(("rm -rf " + dir_).c_str());
  }
  void Start(const std::string& cert, bool client_ca) {
    http::ServerOptions o;
    o.tls.cert_file = dir_ + "/" + cert + ".pem";
    o.tls.key_file = dir_ + "/" + cert + ".key";
    if (client_ca) o.tls.client_ca_file = dir_ + "/ca.pem";
    server_ = std::make_unique<http::Server>(o);
    server_->Get("/hello", [](const http::Request& req, http::Response& res) {
      res.set_content(R"({"hello":")" + req.get_header_value("authorization") + R"("})", "application/json");
    });
    server_->Get("/api/v1/queues", [](const http::Request&, http::Response& res) {
      res.set_content(R"({"items": [{"name": "default", "weight": 1}]})", "application/json");
    });
    auto port = server_->Listen("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status().ToString();
    port_ = *port;
  }
  ClientConfig Config(const std::string& host, const std::string& ca) const {
    ClientConfig c;
    c.server = "https://" + host + ":" + std::to_string(port_);
    c.token = "t0k3n";
    if (!ca.empty()) c.ca_file = dir_ + "/" + ca + ".pem";
    c.connect_timeout_s = 5;
    c.read_timeout_s = 10;
    return c;
  }
  static Result<HttpReply> Hello(const ClientConfig& c) {
    auto client = ApiClient::Create(c);
    if (!client.ok()) return client.status();
    return client->Get("/hello");
  }
  std::string dir_;
  std::unique_ptr<http::Server> server_;
  int port_ = 0;
};

TEST_F(ApiClientTlsTest, VerifiesTheServerAgainstTheGivenCa) {
  Start("server", false);
  for (const std::string host : {"127.0.0.1", "localhost"}) {
    auto r = Hello(Config(host, "ca"));
    ASSERT_TRUE(r.ok()) << host << ": " << r.status().ToString();
    EXPECT_EQ(r->status, 200);
    ASSERT_TRUE(r->is_json);
    EXPECT_EQ(r->json["hello"], "Bearer t0k3n");  // the token went over the encrypted connection
  }
  // A CA that did not sign the server's certificate, or the system's CAs: refused, saying why.
  for (const std::string ca : {"other", ""}) {
    auto r = Hello(Config("127.0.0.1", ca));
    ASSERT_FALSE(r.ok()) << ca;
    EXPECT_EQ(r.status().code(), StatusCode::kIoError);
    EXPECT_NE(r.status().message().find("TLS handshake"), std::string::npos) << r.status().ToString();
    EXPECT_NE(r.status().message().find("certificate"), std::string::npos) << r.status().ToString();
  }
}

TEST_F(ApiClientTlsTest, ACertificateForAnotherNameIsRefused) {
  Start("elsewhere", false);  // signed by the trusted CA, but for elsewhere.example
  for (const std::string host : {"127.0.0.1", "localhost"}) {
    auto r = Hello(Config(host, "ca"));
    ASSERT_FALSE(r.ok()) << host;
    EXPECT_NE(r.status().message().find("certificate"), std::string::npos) << r.status().ToString();
  }
}

TEST_F(ApiClientTlsTest, PresentsItsClientCertificateWhenTheServerAsksForOne) {
  Start("server", true);
  ClientConfig anonymous = Config("127.0.0.1", "ca");
  EXPECT_FALSE(Hello(anonymous).ok());
  ClientConfig c = anonymous;
  c.client_cert_file = dir_ + "/client.pem";
  c.client_key_file = dir_ + "/client.key";
  auto r = Hello(c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 200);
  // A certificate file that is not there, or a key that does not match it: said before connecting.
  ClientConfig missing = c;
  missing.client_cert_file = dir_ + "/nope.pem";
  auto m = Hello(missing);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("nope.pem"), std::string::npos) << m.status().ToString();
  ClientConfig mismatched = c;
  mismatched.client_key_file = dir_ + "/other.key";
  auto k = Hello(mismatched);
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(k.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(k.status().message().find("other.key"), std::string::npos) << k.status().ToString();
  ClientConfig bad_ca = c;
  bad_ca.ca_file = dir_ + "/absent-ca.pem";
  auto b = Hello(bad_ca);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("absent-ca.pem"), std::string::npos) << b.status().ToString();
  // A CA file that holds no certificate is no check at all: refused, not taken as "trust nothing"
  // or "trust anything".
  ASSERT_EQ(std::system(("echo not-a-certificate > " + dir_ + "/garbage.pem").c_str()), 0);
  ClientConfig garbage = c;
  garbage.ca_file = dir_ + "/garbage.pem";
  auto g = Hello(garbage);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("garbage.pem"), std::string::npos) << g.status().ToString();
}

// A client command (`gpupool queues`) with its exit code, as the binary runs it.
int RunQueues(const std::string& server) {
  CLI::App app{"gpupool"};
  app.require_subcommand(1);
  int exit = -1;
  RegisterClientCommands(app, &exit);
  const std::vector<std::string> args = {"gpupool", "queues", "--server", server, "-o", "json"};
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  std::streambuf* old_out = std::cout.rdbuf(out.rdbuf());
  std::streambuf* old_err = std::cerr.rdbuf(err.rdbuf());
  app.parse(static_cast<int>(argv.size()), argv.data());
  std::cout.rdbuf(old_out);
  std::cerr.rdbuf(old_err);
  return exit;
}

// The CLI's commands take the CA file and the client certificate from the environment, as
// docs/cli.md says (they used to drop both: only `gpupool run` used them).
TEST_F(ApiClientTlsTest, TheCommandsUseTheCaFileAndClientCertificateFromTheEnvironment) {
  Start("server", true);
  const std::string url = "https://127.0.0.1:" + std::to_string(port_);
  ::unsetenv("GPUPOOL_CA_FILE");
  ::unsetenv("GPUPOOL_CLIENT_CERT");
  ::unsetenv("GPUPOOL_CLIENT_KEY");
  EXPECT_EQ(RunQueues(url), kExitUnavailable);  // the system's CAs do not know the test CA
  ::setenv("GPUPOOL_CA_FILE", (dir_ + "/ca.pem").c_str(), 1);
  EXPECT_EQ(RunQueues(url), kExitUnavailable);  // the server asks for a client certificate
  ::setenv("GPUPOOL_CLIENT_CERT", (dir_ + "/client.pem").c_str(), 1);
  ::setenv("GPUPOOL_CLIENT_KEY", (dir_ + "/client.key").c_str(), 1);
  EXPECT_EQ(RunQueues(url), kExitOk);
  ::setenv("GPUPOOL_CA_FILE", (dir_ + "/absent.pem").c_str(), 1);
  EXPECT_EQ(RunQueues(url), kExitUsage);  // a CA file that is not there: said, never "no check"
  ::unsetenv("GPUPOOL_CA_FILE");
  ::unsetenv("GPUPOOL_CLIENT_CERT");
  ::unsetenv("GPUPOOL_CLIENT_KEY");
}

// A TCP server that answers each connection with `answer` (after reading the request head) and
// then keeps it open until the test ends.
class RawServer {
 public:
  explicit RawServer(std::string answer) : answer_(std::move(answer)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd_, 8), 0);
    socklen_t len = sizeof(a);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      char buf[4096];
      std::string head;
      while (head.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::read(c, buf, sizeof(buf));
        if (n <= 0) break;
        head.append(buf, static_cast<size_t>(n));
      }
      if (!answer_.empty()) (void)!::write(c, answer_.data(), answer_.size());
      while (!done_) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      ::close(c);
    });
  }
  ~RawServer() {
    done_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  std::string answer_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

TEST(ApiClientTransportTest, AnAnswerOverTheLimitIsRefusedNotAllocated) {
  RawServer server("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                   std::to_string(kMaxReplyBytes + 1) + "\r\n\r\n{\"a\":");
  ClientConfig c;
  c.server = server.url();
  c.read_timeout_s = 20;
  auto client = ApiClient::Create(c);
  ASSERT_TRUE(client.ok());
  auto r = client->Get("/big");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("the answer is over 67108864 bytes"), std::string::npos)
      << r.status().ToString();

  // Without a length to refuse up front: chunks, or bytes until the connection closes, are
  // counted as they come.
  std::string chunks, plain;
  for (int i = 0; i < 10; ++i) chunks += "40\r\n" + std::string(64, 'x') + "\r\n";
  for (const std::string& answer :
       {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks,
        "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + std::string(640, 'x')}) {
    RawServer small(answer);
    ClientConfig sc;
    sc.server = small.url();
    sc.read_timeout_s = 20;
    sc.max_reply_bytes = 100;
    auto sclient = ApiClient::Create(sc);
    ASSERT_TRUE(sclient.ok());
    auto sr = sclient->Get("/big");
    ASSERT_FALSE(sr.ok()) << answer.substr(0, 40);
    EXPECT_NE(sr.status().message().find("the answer is over 100 bytes"), std::string::npos)
        << sr.status().ToString();
  }
}

// For addresses a peer names: an unspecified, link-local, multicast or broadcast address is never
// connected to, given as an address or reached through a name ("0" resolves to 0.0.0.0, the
// local host); a peer's real address is.
TEST(ApiClientTransportTest, OnlyPeerAddressesRefusesWhatNoPeerServesOn) {
  for (const char* url : {"http://169.254.169.254:80", "http://[fe80::1]:80", "http://224.0.0.1:80",
                          "http://255.255.255.255:80", "http://[::ffff:169.254.169.254]:80", "http://0:80",
                          "http://[::]:80"}) {
    ClientConfig c;
    c.server = url;
    c.connect_timeout_s = 2;
    c.only_peer_addresses = true;
    auto client = ApiClient::Create(c);
    ASSERT_TRUE(client.ok()) << url;
    auto r = client->Get("/latest/meta-data/");
    ASSERT_FALSE(r.ok()) << url;
    EXPECT_NE(r.status().message().find("not an address a peer serves on"), std::string::npos)
        << url << ": " << r.status().ToString();
  }
  RawServer server("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
  ClientConfig c;
  c.server = server.url();
  c.only_peer_addresses = true;
  auto client = ApiClient::Create(c);
  ASSERT_TRUE(client.ok());
  auto r = client->Get("/fine");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->body, "ok");
}

TEST(ApiClientTransportTest, AnAnswerThatNeverComesTimesOut) {
  RawServer server("");  // reads the request, says nothing
  ClientConfig c;
  c.server = server.url();
  c.read_timeout_s = 1;
  auto client = ApiClient::Create(c);
  ASSERT_TRUE(client.ok());
  auto r = client->Get("/slow");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);
  EXPECT_NE(r.status().message().find("answer: timed out"), std::string::npos) << r.status().ToString();
}

TEST(ApiClientTransportTest, AnotherThreadEndsARequestInFlight) {
  RawServer server("");
  ClientConfig c;
  c.server = server.url();
  auto client = ApiClient::Create(c);
  ASSERT_TRUE(client.ok());
  RequestInterrupter interrupt;
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    interrupt.Interrupt();
  });
  auto r = client->GetInterruptible("/watch", interrupt, 60);
  stopper.join();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("interrupted"), std::string::npos) << r.status().ToString();
  // Once interrupted, every request with it ends at once.
  auto again = client->GetInterruptible("/watch", interrupt, 60);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("interrupted"), std::string::npos);
}

TEST(ApiClientTransportTest, AHeadWithoutABodyAndAMalformedAnswer) {
  {
    RawServer server("HTTP/1.1 204 No Content\r\nX-Log-Size: 12\r\n\r\n");
    ClientConfig c;
    c.server = server.url();
    auto client = ApiClient::Create(c);
    ASSERT_TRUE(client.ok());
    auto r = client->Delete("/x");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->status, 204);
    EXPECT_EQ(r->log_size, 12);
    EXPECT_FALSE(r->is_json);
  }
  {
    RawServer server("SMTP ready\r\n\r\n");
    ClientConfig c;
    c.server = server.url();
    auto client = ApiClient::Create(c);
    ASSERT_TRUE(client.ok());
    auto r = client->Get("/x");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kIoError);
  }
}

}  // namespace
}  // namespace gpupool
