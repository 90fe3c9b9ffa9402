// End-to-end acceptance checks over real HTTP: no GPU is ever overcommitted while many clients
// submit and a fake agent runs the work; acknowledged jobs survive kill -9 of the server process;
// weighted DRF and hierarchical queues share the pool as prescribed; preemption and gang
// placement as an agent sees them.
//
// Agents are played by the test: it registers nodes, reads assignments and reports task states
// over the node-side API. Outcomes do not depend on timing: the test that runs the scheduling loop
// (Start()) waits for its end state (a deadline far above its few seconds only stops a hang); the
// kill -9 test checks what holds wherever the kill lands; the others drive cycles with RunCycle().
// The one pause (the lock test) can only let a broken service pass, never fail a correct one.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "server/http_api.h"
#include "server/service.h"
#include "store/sqlite_store.h"
#include "store/store.h"

#ifndef GPUPOOL_BINARY
#define GPUPOOL_BINARY ""
#endif

extern char** environ;

namespace gpupool {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

constexpr char kAdminToken[] = "admin-token-0123456789";
constexpr char kAgentToken[] = "agent-token-0123456789";

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/gpupool-e2e-XXXXXX";
    const char* p = ::mkdtemp(tmpl);
    path_ = p == nullptr ? "" : p;
  }
  ~TempDir() {
    if (!path_.empty()) std::filesystem::remove_all(path_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct Reply {
  int status = 0;  // 0: no HTTP answer (connection refused or reset, timeout)
  std::string raw;
  json body;
};

// A client of one principal, on a kept-alive connection (as an agent keeps one). Not thread-safe:
// one per thread.
class Http {
 public:
  Http(int port, const std::string& token, int connect_timeout_s = 5) : cli_("127.0.0.1", port) {
    headers_.emplace("Authorization", "Bearer " + token);
    cli_.set_keep_alive(true);
    cli_.set_tcp_nodelay(true);
    cli_.set_connection_timeout(connect_timeout_s, 0);
    cli_.set_read_timeout(60, 0);
    cli_.set_write_timeout(30, 0);
  }
  Reply Get(const std::string& path) { return From(cli_.Get(path, headers_)); }
  Reply Post(const std::string& path, const std::string& body) {
    return From(cli_.Post(path, headers_, body, "application/json"));
  }

 private:
  static Reply From(const httplib::Result& r) {
    Reply out;
    if (!r) return out;
    out.status = r->status;
    out.raw = r->body;
    out.body = json::parse(r->body, nullptr, false);
    return out;
  }
  httplib::Client cli_;
  httplib::Headers headers_;
};

// Every job the query lists, following nextPageToken.
std::vector<json> ListAll(Http& http, const std::string& query = "") {
  std::vector<json> out;
  std::string token;
  for (int page = 0; page < 1000; ++page) {
    // Items are summaries; with fields=tasks pages are smaller.
    const std::string limit = query.find("fields=") == std::string::npos ? "1000" : "100";
    Reply r = http.Get("/api/v1/jobs?limit=" + limit + query + (token.empty() ? "" : "&pageToken=" + token));
    EXPECT_EQ(r.status, 200) << r.raw;
    if (r.status != 200) break;
    for (const json& j : r.body["items"]) out.push_back(j);
    if (!r.body.contains("nextPageToken")) break;
    token = r.body["nextPageToken"];
  }
  return out;
}

json NodeBody(const std::string& name, int gpus) {
  json g = json::array();
  for (int i = 0; i < gpus; ++i) g.push_back({{"index", i}, {"model", "A100-80GB"}});
  return {{"name", name}, {"cpu", "64"}, {"memory", "512Gi"}, {"gpus", g}};
}

std::string ReportPath(const std::string& node, const std::string& job, int index) {
  return "/api/v1/agent/nodes/" + node + "/tasks/" + job + "/" + std::to_string(index) + "/status";
}

// Failures seen by helper threads, asserted on by the test thread.
class Violations {
 public:
  void Add(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    if (messages_.size() < 20) messages_.push_back(what);
    ++count_;
  }
  int count() {
    std::lock_guard<std::mutex> lock(mu_);
    return count_;
  }
  std::string Summary() {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out;
    for (const auto& m : messages_) out += m + "\n";
    return out;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> messages_;
  int count_ = 0;
};

// No GPU over its share or memory, and the two views of use (the ledger's free counters, the live
// tasks' grants) agree: into `overcommit`. The service's own invariants: into `invariants`.
void CheckNoOvercommit(PoolService& service, const std::string& when, Violations& overcommit,
                       Violations& invariants) {
  for (const PoolService::GpuUse& g : service.GpuUsage()) {
    const std::string gpu = g.node + "/" + std::to_string(g.gpu) + " " + when + ": ";
    if (g.granted_share > 1000)
      overcommit.Add(gpu + "granted share " + std::to_string(g.granted_share) + " > 1000");
    if (g.granted_memory > g.capacity_memory)
      overcommit.Add(gpu + "granted memory " + std::to_string(g.granted_memory) + " > " +
                     std::to_string(g.capacity_memory));
    if (g.granted_share != g.ledger_used_share || g.granted_memory != g.ledger_used_memory)
      overcommit.Add(gpu + "granted (" + std::to_string(g.granted_share) + ", " +
                     std::to_string(g.granted_memory) + ") != ledger (" +
                     std::to_string(g.ledger_used_share) + ", " + std::to_string(g.ledger_used_memory) + ")");
  }
  Status st = service.CheckInvariants();
  if (!st.ok()) invariants.Add(when + ": " + st.ToString());
}

// The same, from the test thread while nothing else runs.
void ExpectConsistent(PoolService& service, const std::string& when) {
  Violations overcommit, invariants;
  CheckNoOvercommit(service, when, overcommit, invariants);
  EXPECT_EQ(overcommit.count(), 0) << overcommit.Summary();
  EXPECT_EQ(invariants.count(), 0) << invariants.Summary();
}

// A PoolService behind HttpApi on an ephemeral port, over a SQLite store in a temp dir.
class E2eTest : public ::testing::Test {
 protected:
  static ServerConfig BaseConfig() {
    ServerConfig c;
    c.profile = "bestfit";
    c.sync_full = false;
    c.grace_period_seconds = 30;
    c.reserve_after_seconds = 3600;
    c.tokens[kAdminToken] = Principal{"", Role::kAdmin};
    c.tokens[kAgentToken] = Principal{"", Role::kAgent};
    return c;
  }
  void StartPool(ServerConfig config) {
    ASSERT_FALSE(dir_.path().empty());
    config.data_dir = dir_.path();
    config_ = config;
    auto store = OpenSqliteStore({dir_.path() + "/gpupool.db", false});
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto service = PoolService::Open(config, std::move(store).value());
    ASSERT_TRUE(service.ok()) << service.status().ToString();
    service_ = std::move(service).value();
    api_ = std::make_unique<HttpApi>(*service_, config);
    auto port = api_->Start("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status().ToString();
    port_ = *port;
  }
  void TearDown() override {
    if (api_) api_->Stop();
    if (service_) service_->Stop();
    api_.reset();
    service_.reset();
  }
  void AddNode(Http& agent, const std::string& name, int gpus) {
    Reply r = agent.Post("/api/v1/agent/register", NodeBody(name, gpus).dump());
    ASSERT_EQ(r.status, 200) << r.raw;
  }
  // Plays the agent of every node once: assigned tasks are reported running. Returns how many.
  int StartAssigned(Http& agent, const std::vector<std::string>& nodes) {
    int started = 0;
    for (const std::string& node : nodes) {
      // A heartbeat, as a real agent sends it: it answers the assignments and keeps the node from
      // being declared lost however slow the build (sanitizers) makes the test.
      Reply a = agent.Post("/api/v1/agent/nodes/" + node + "/heartbeat", "{}");
      EXPECT_EQ(a.status, 200) << a.raw;
      for (const json& t : a.body["assignments"]) {
        if (t["desired"] != "run" || t["state"] != "assigned") continue;
        Reply r = agent.Post(ReportPath(node, t["jobId"], t["index"]), R"({"state": "running"})");
        EXPECT_EQ(r.status, 200) << r.raw;
        ++started;
      }
    }
    return started;
  }
  // Cycles until one places nothing.
  void CycleUntilStable() {
    for (int i = 0; i < 100 && service_->RunCycle() > 0; ++i) {
    }
  }
  json Job(Http& http, const std::string& id) {
    Reply r = http.Get("/api/v1/jobs/" + id);
    EXPECT_EQ(r.status, 200) << r.raw;
    return r.body;
  }
  std::string Metrics() {
    httplib::Client cli("127.0.0.1", port_);
    auto r = cli.Get("/metrics");
    return r ? r->body : "";
  }

  TempDir dir_;
  ServerConfig config_;
  std::unique_ptr<PoolService> service_;
  std::unique_ptr<HttpApi> api_;
  int port_ = 0;
};

// ---- no overcommit under concurrency ------------------------------------------------------------

TEST_F(E2eTest, NoGpuIsOvercommittedWhileClientsSubmitAndAnAgentRunsTheWork) {
  constexpr int kJobs = 1000;
  constexpr int kClients = 8;
  const double deadline_s = kSanitized ? 150 : 100;
  ServerConfig config = BaseConfig();
  config.profile = "fgd";
  config.cycle_interval_ms = 20;
  config.http.workers = 16;
  ASSERT_NO_FATAL_FAILURE(StartPool(config));
  Http agent(port_, kAdminToken);  // one fake agent for every node: an admin may act for any
  const std::vector<std::string> nodes = {"n1", "n2"};
  for (const auto& n : nodes) ASSERT_NO_FATAL_FAILURE(AddNode(agent, n, 2));

  // Fractional jobs: 0.1..0.9 of a GPU, 1..40 Gi of its memory; fixed seed.
  std::vector<std::string> specs;
  std::mt19937 rng(20240611);
  std::uniform_int_distribution<int> tenths(1, 9), gib(1, 40);
  for (int i = 0; i < kJobs; ++i) {
    json spec = {{"name", "frac-" + std::to_string(i)},
                 {"tasks",
                  {{{"name", "w"},
                    {"resources",
                     {{"cpu", "1"},
                      {"memory", "1Gi"},
                      {"gpu", tenths(rng) / 10.0},
                      {"gpuMemory", std::to_string(gib(rng)) + "Gi"}}},
                    {"command", {"sleep", "1"}}}}}};
    specs.push_back(spec.dump());
  }

  Violations violations, overcommit, invariants;
  std::atomic<int> acked{0}, refused{0}, submitters_done{0}, finished{0}, checks{0}, reports{0};
  std::atomic<bool> stop{false};
  service_->Start();
  const auto t0 = Clock::now();

  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      Http http(port_, kAdminToken);
      for (int i = c; i < kJobs; i += kClients) {
        Reply r = http.Post("/api/v1/jobs", specs[static_cast<size_t>(i)]);
        if (r.status >= 200 && r.status < 300) {
          ++acked;
        } else {
          ++refused;
          violations.Add("submission " + std::to_string(i) + ": " + std::to_string(r.status) + " " + r.raw);
        }
      }
      ++submitters_done;
    });
  }
  std::thread checker([&] {
    Http http(port_, kAdminToken);
    for (int round = 0; !stop; ++round) {
      CheckNoOvercommit(*service_, "checker", overcommit, invariants);
      ++checks;
      if (round % 25 == 0) {  // and the API's view of the same GPUs
        Reply r = http.Get("/api/v1/nodes");
        for (const json& n : r.body["items"]) {
          for (const json& g : n["gpus"]) {
            const int free = g["freeShare"];
            if (free < 0 || free > 1000) violations.Add("API shows freeShare " + std::to_string(free));
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  // The fake agent: assigned tasks are reported running; on a later pass, succeeded.
  std::thread fake_agent([&] {
    Http http(port_, kAdminToken);  // plays the agent of every node (admin)
    while (!stop) {
      int seen = 0;
      for (const std::string& node : nodes) {
        Reply a = http.Post("/api/v1/agent/nodes/" + node + "/heartbeat", "{}");
        if (a.status != 200) {
          violations.Add("heartbeat: " + std::to_string(a.status) + " " + a.raw);
          continue;
        }
        for (const json& t : a.body["assignments"]) {
          ++seen;
          const std::string id = t["jobId"];
          const int index = t["index"];
          std::string report;
          if (t["desired"] != "run") {
            violations.Add("unexpected stop of " + id + ": " + t.dump());
            report = "stopped";
          } else if (t["state"] == "assigned") {
            report = "running";
          } else if (t["state"] == "running") {
            report = "succeeded";
          } else {
            continue;
          }
          Reply r = http.Post(ReportPath(node, id, index), json{{"state", report}, {"exitCode", 0}}.dump());
          if (r.status != 200)
            violations.Add("report " + report + " for " + id + ": " + std::to_string(r.status) + " " + r.raw);
          ++reports;
          if (report == "succeeded" && r.status == 200) ++finished;
          CheckNoOvercommit(*service_, "after reporting " + id + " " + report, overcommit, invariants);
          ++checks;
        }
      }
      if (submitters_done == kClients && finished == acked) break;
      if (SecondsSince(t0) > deadline_s) {
        violations.Add("deadline: " + std::to_string(finished.load()) + " of " +
                       std::to_string(acked.load()) + " jobs finished");
        break;
      }
      if (seen == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  for (auto& t : clients) t.join();
  fake_agent.join();
  stop = true;
  checker.join();
  const double elapsed = SecondsSince(t0);
  service_->Stop();

  EXPECT_EQ(overcommit.count(), 0) << "GPU use, as GpuUsage() reads it:\n" << overcommit.Summary();
  EXPECT_EQ(invariants.count(), 0) << "CheckInvariants() while the loop, clients and agent run:\n"
                                   << invariants.Summary();
  EXPECT_EQ(violations.count(), 0) << violations.Summary();
  EXPECT_EQ(acked.load(), kJobs);
  EXPECT_EQ(refused.load(), 0);
  Http admin(port_, kAdminToken);
  const std::vector<json> jobs = ListAll(admin);
  EXPECT_EQ(static_cast<int>(jobs.size()), acked.load())
      << "every 2xx submission is listed, and nothing else";
  std::set<std::string> ids;
  int succeeded = 0;
  for (const json& j : jobs) {
    ids.insert(j["id"].get<std::string>());
    succeeded += j["state"] == "succeeded";
  }
  EXPECT_EQ(ids.size(), jobs.size());
  EXPECT_EQ(succeeded, kJobs);
  ExpectConsistent(*service_, "at the end");
  for (const auto& g : service_->GpuUsage()) EXPECT_EQ(g.ledger_used_share, 0) << g.node << "/" << g.gpu;
  std::printf(
      "[ no overcommit ] %d jobs from %d clients in %.1f s; %d agent reports; %d checks; %d "
      "overcommits; %d invariant failures\n",
      kJobs, kClients, elapsed, reports.load(), checks.load(), overcommit.count(), invariants.count());
}

// ---- kill -9 durability -------------------------------------------------------------------------

// An unused local port: bind port 0, read what the kernel chose, close. Another process may take it
// before the server binds; ServerProcess::Start retries with a new one then.
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

// `gpupool server` as a child process.
class ServerProcess {
 public:
  ~ServerProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  // Spawns the server and waits until /healthz answers. "" on success, else what went wrong.
  std::string Start(const std::string& binary, const std::string& data_dir, const std::string& log) {
    std::string why;
    for (int attempt = 0; attempt < 5; ++attempt) {
      port_ = FreePort();
      if (port_ == 0) return "no free port";
      const std::string listen = "127.0.0.1:" + std::to_string(port_);
      std::vector<std::string> args = {binary, "server", "--data-dir", data_dir, "--listen", listen};
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      posix_spawn_file_actions_t actions;
      posix_spawn_file_actions_init(&actions);
      posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      posix_spawn_file_actions_adddup2(&actions, 1, 2);
      const int rc = posix_spawn(&pid_, binary.c_str(), &actions, nullptr, argv.data(), environ);
      posix_spawn_file_actions_destroy(&actions);
      if (rc != 0) {
        pid_ = -1;
        return "posix_spawn failed: " + std::to_string(rc);
      }
      const auto t0 = Clock::now();
      while (SecondsSince(t0) < 60) {
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) == pid_) {
          pid_ = -1;
          why = "the server exited at start (status " + std::to_string(status) + ")";
          break;
        }
        httplib::Client cli("127.0.0.1", port_);
        cli.set_connection_timeout(1, 0);
        auto r = cli.Get("/healthz");
        if (r && r->status == 200) return "";
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (pid_ > 0) return "the server did not answer /healthz within 60 s";
    }
    return why;
  }
  void Signal(int sig) const {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  // Waits for the process to end; its wait status.
  int Wait() {
    int status = 0;
    if (pid_ > 0) ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(E2eProcessTest, KillNineLosesNoAcknowledgedJob) {
  const std::string binary = GPUPOOL_BINARY;
  if (binary.empty() || !std::filesystem::exists(binary))
    GTEST_SKIP() << "no gpupool binary at '" << binary << "'";
  constexpr int kBurst = 1000;
  constexpr int kKillAfter = 400;
  constexpr int kClients = 8;
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string data = dir.path() + "/data";
  const std::string log = dir.path() + "/server.log";
  ServerProcess first;
  std::string err = first.Start(binary, data, log);
  ASSERT_EQ(err, "") << ReadFile(log);
  std::string token = ReadFile(data + "/admin.token");
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  ASSERT_FALSE(token.empty());

  std::atomic<int> next{0}, attempted{0}, acks{0}, after_kill{0};
  std::atomic<bool> killed{false};
  std::mutex mu;
  std::map<std::string, std::string> acked;  // id -> name
  Violations violations;
  const auto t0 = Clock::now();
  double kill_at = 0;
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&] {
      Http http(first.port(), token, 2);
      for (int i = next++; i < kBurst; i = next++) {
        const std::string name = "burst-" + std::to_string(i);
        const json spec = {{"name", name},
                           {"tasks", {{{"name", "w"}, {"resources", {{"cpu", "1"}, {"memory", "1Gi"}}}}}}};
        ++attempted;
        Reply r = http.Post("/api/v1/jobs", spec.dump());
        if (r.status == 201) {
          {
            std::lock_guard<std::mutex> lock(mu);
            if (!acked.emplace(r.body["id"].get<std::string>(), name).second)
              violations.Add("id acknowledged twice: " + r.raw);
          }
          if (++acks == kKillAfter) {
            killed = true;  // before the signal: a client that sees the server gone must know why
            kill_at = SecondsSince(t0);
            first.Signal(SIGKILL);
          }
        } else if (r.status == 0 && killed) {
          ++after_kill;
          break;  // the server is gone: this client stops
        } else {
          violations.Add(name + ": " + std::to_string(r.status) + " " + r.raw);
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  const int status = first.Wait();
  ASSERT_TRUE(killed);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "wait status " << status << "\n"
                                                                  << ReadFile(log);
  EXPECT_EQ(violations.count(), 0) << violations.Summary();
  EXPECT_GE(acks.load(), kKillAfter);
  EXPECT_LT(acks.load(), kBurst) << "the kill came after the burst";

  ServerProcess second;
  err = second.Start(binary, data, log);
  ASSERT_EQ(err, "") << ReadFile(log);
  auto admin = std::make_unique<Http>(second.port(), token);
  const std::vector<json> jobs = ListAll(*admin);
  std::map<std::string, int> seen_ids, seen_names;
  for (const json& j : jobs) {
    ++seen_ids[j["id"].get<std::string>()];
    ++seen_names[j["name"].get<std::string>()];
    EXPECT_EQ(j["state"], "pending") << j.dump();
  }
  for (const auto& [id, n] : seen_ids) EXPECT_EQ(n, 1) << "job " << id << " listed " << n << " times";
  for (const auto& [name, n] : seen_names) {
    EXPECT_EQ(n, 1) << "name " << name << " stored " << n << " times";
    EXPECT_EQ(name.rfind("burst-", 0), 0u) << name;
  }
  int lost = 0;
  for (const auto& [id, name] : acked) {
    auto it = std::find_if(jobs.begin(), jobs.end(), [&](const json& j) { return j["id"] == id; });
    if (it == jobs.end()) {
      ++lost;
      ADD_FAILURE() << "acknowledged job " << id << " (" << name << ") is gone after kill -9";
    } else {
      EXPECT_EQ((*it)["name"], name) << id;
    }
  }
  EXPECT_EQ(lost, 0);
  EXPECT_GE(jobs.size(), acked.size());
  EXPECT_LE(static_cast<int>(jobs.size()), attempted.load());
  Reply health = admin->Get("/healthz");
  EXPECT_EQ(health.body["jobs"]["pending"], jobs.size());

  // The restarted server goes on: a new job gets an id after every stored one.
  Reply more = admin->Post("/api/v1/jobs", R"({"name": "after-restart", "tasks": [{"name": "w"}]})");
  ASSERT_EQ(more.status, 201) << more.raw;
  const std::string new_id = more.body["id"];
  for (const auto& [id, n] : seen_ids) EXPECT_LT(id, new_id);
  admin.reset();  // no idle kept-alive connection for the graceful stop to wait out
  second.Signal(SIGTERM);
  const int stopped = second.Wait();
  EXPECT_TRUE(WIFEXITED(stopped) && WEXITSTATUS(stopped) == 0) << "wait status " << stopped;
  std::printf(
      "[ kill -9 ] %d clients; SIGKILL after %d acks at %.2f s; %d attempted, %zu acknowledged, %zu stored "
      "after restart\n",
      kClients, kKillAfter, kill_at, attempted.load(), acked.size(), jobs.size());
}

// ---- CheckInvariants and the service lock ------------------------------------------------------

// A Store whose writes can be held at a gate: a service call that writes under the service's lock
// keeps that lock until the gate opens.
class GatedStore : public Store {
 public:
  explicit GatedStore(std::unique_ptr<Store> inner) : inner_(std::move(inner)) {}
  Status Apply(const WriteBatch& batch) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      entered_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return open_; });
    }
    return inner_->Apply(batch);
  }
  Result<StoreSnapshot> Load() override { return inner_->Load(); }
  Result<std::vector<EventRecord>> ListEvents(const std::string& job_id, int64_t after_id,
                                              int limit) override {
    return inner_->ListEvents(job_id, after_id, limit);
  }
  int schema_version() const override { return inner_->schema_version(); }

  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = false;
    entered_ = false;
  }
  void WaitUntilEntered() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return entered_; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::unique_ptr<Store> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  bool entered_ = false;
};

// PoolService promises that every public method may be called from any thread, and the test above
// calls CheckInvariants() while the loop, HTTP workers and the agent change the state. So
// CheckInvariants() must wait while another call holds the service: here a cordon, whose store
// write is held at a gate while it holds the service's lock. A CheckInvariants() that takes the
// lock cannot return before the gate opens, however the threads are scheduled; one that does not
// take it returns at once, and the test sees that after its pause.
TEST(E2eLockTest, CheckInvariantsWaitsWhileAnotherCallHoldsTheService) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  auto inner = OpenSqliteStore({dir.path() + "/gpupool.db", false});
  ASSERT_TRUE(inner.ok()) << inner.status().ToString();
  auto gated = std::make_unique<GatedStore>(std::move(inner).value());
  GatedStore* gate = gated.get();
  ServerConfig config;
  config.data_dir = dir.path();
  config.profile = "bestfit";
  config.sync_full = false;
  auto service = PoolService::Open(config, std::move(gated));
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  PoolService& svc = **service;
  ASSERT_TRUE(svc.RegisterNode(NodeBody("n1", 2)).ok());

  gate->Close();
  std::thread writer([&] { EXPECT_TRUE(svc.SetCordon("n1", true).ok()); });
  gate->WaitUntilEntered();  // the writer holds the service's lock now, until the gate opens
  std::atomic<bool> returned{false};
  std::thread checker([&] {
    EXPECT_TRUE(svc.CheckInvariants().ok());
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const bool returned_under_the_lock = returned.load();
  gate->Open();
  writer.join();
  checker.join();
  EXPECT_FALSE(returned_under_the_lock)
      << "CheckInvariants() ran while SetCordon() held the service's lock: it reads the ledger and the "
         "jobs unlocked, racing the loop and the HTTP workers";
  EXPECT_TRUE(returned.load());
}

// ---- fairness -----------------------------------------------------------------------------------

// Each tenant's share of the pool's GPUs, from the running jobs the API lists.
std::map<std::string, double> GpuShares(Http& admin, int pool_gpus) {
  std::map<std::string, double> out;
  for (const json& j : ListAll(admin, "&state=running&fields=tasks")) {
    for (const json& t : j["tasks"]) {
      for (const json& g : t["gpus"]) out[j["tenant"]] += g["share"].get<double>() / (1000.0 * pool_gpus);
    }
  }
  return out;
}

struct FairnessCase {
  std::string name;
  OrderingPolicy policy;
  double gpu;           // per job
  int jobs_per_tenant;  // more than the pool holds
};

class FairnessTest : public E2eTest, public ::testing::WithParamInterface<FairnessCase> {};

// Tenants t1, t2, t3 weighted 1:1:2 (tenant weights under DRF; three queues of those weights, one
// per tenant, under hierarchical ordering) flood a 4 x 8 GPU pool with small jobs. Once it is full,
// and again after each wave of finished jobs is refilled, the GPU shares are 25 / 25 / 50 % within
// 5 % of the pool.
TEST_P(FairnessTest, WeightedSharesHoldAfterFillAndAfterEachWave) {
  const FairnessCase& fc = GetParam();
  constexpr int kNodes = 4, kGpusPerNode = 8, kPoolGpus = kNodes * kGpusPerNode;
  const std::vector<std::string> tenants = {"t1", "t2", "t3"};
  const std::map<std::string, double> target = {{"t1", 0.25}, {"t2", 0.25}, {"t3", 0.5}};
  ServerConfig config = BaseConfig();
  config.ordering.policy = fc.policy;
  for (const auto& t : tenants) {
    config.tokens[t + "-token-0123456789"] = Principal{t, Role::kTenant};
    const int64_t w = t == "t3" ? 2000 : 1000;
    if (fc.policy == OrderingPolicy::kDrf) {
      config.ordering.tenant_weight_milli[t] = w;
    } else {
      QueueSpec q;
      q.name = "q-" + t;
      q.weight_milli = w;
      config.ordering.queues.push_back(q);
    }
  }
  ASSERT_NO_FATAL_FAILURE(StartPool(config));
  Http agent(port_, kAdminToken);  // one fake agent for every node: an admin may act for any
  Http admin(port_, kAdminToken);
  std::vector<std::string> nodes;
  for (int n = 0; n < kNodes; ++n) {
    nodes.push_back("node-" + std::to_string(n));
    ASSERT_NO_FATAL_FAILURE(AddNode(agent, nodes.back(), kGpusPerNode));
  }
  // One tenant after the other: an order by submission alone would give the first all the pool.
  for (const auto& t : tenants) {
    Http http(port_, t + "-token-0123456789");
    for (int i = 0; i < fc.jobs_per_tenant; ++i) {
      json spec = {
          {"name", t + "-" + std::to_string(i)},
          {"tasks", {{{"name", "w"}, {"resources", {{"cpu", "1"}, {"memory", "4Gi"}, {"gpu", fc.gpu}}}}}}};
      if (fc.policy == OrderingPolicy::kHierarchical) spec["queue"] = "q-" + t;
      Reply r = http.Post("/api/v1/jobs", spec.dump());
      ASSERT_EQ(r.status, 201) << r.raw;
    }
  }
  auto check = [&](const std::string& when) {
    SCOPED_TRACE(when);
    const std::map<std::string, double> shares = GpuShares(admin, kPoolGpus);
    double total = 0;
    std::string line;
    for (const auto& t : tenants) {
      const double s = shares.count(t) ? shares.at(t) : 0.0;
      total += s;
      EXPECT_NEAR(s, target.at(t), 0.05) << t;
      line += " " + t + "=" + std::to_string(s);
    }
    EXPECT_NEAR(total, 1.0, 1e-9) << "the pool is full";
    ExpectConsistent(*service_, when);
    std::printf("[ %s ] %s:%s\n", fc.name.c_str(), when.c_str(), line.c_str());
  };
  CycleUntilStable();
  StartAssigned(agent, nodes);
  check("after the pool filled");

  std::mt19937 rng(7);
  for (int wave = 1; wave <= 3; ++wave) {
    // A random subset of the running jobs finishes.
    std::vector<json> running = ListAll(admin, "&state=running&fields=tasks");
    std::shuffle(running.begin(), running.end(), rng);
    const size_t n = std::uniform_int_distribution<size_t>(running.size() / 5, running.size() / 2)(rng);
    for (size_t i = 0; i < n; ++i) {
      const json& t = running[i]["tasks"][0];
      Reply r = agent.Post(ReportPath(t["node"], running[i]["id"], 0), R"({"state": "succeeded"})");
      ASSERT_EQ(r.status, 200) << r.raw;
    }
    CycleUntilStable();
    StartAssigned(agent, nodes);
    check("after wave " + std::to_string(wave) + " (" + std::to_string(n) + " finished)");
  }
}

INSTANTIATE_TEST_SUITE_P(
    E2e, FairnessTest,
    ::testing::Values(FairnessCase{"DrfWholeGpus", OrderingPolicy::kDrf, 1.0, 48},
                      FairnessCase{"DrfHalfGpus", OrderingPolicy::kDrf, 0.5, 96},
                      FairnessCase{"HierarchicalWholeGpus", OrderingPolicy::kHierarchical, 1.0, 48},
                      FairnessCase{"HierarchicalHalfGpus", OrderingPolicy::kHierarchical, 0.5, 96}),
    [](const ::testing::TestParamInfo<FairnessCase>& param_info) { return param_info.param.name; });

// ---- preemption, gang and backfill as the agent sees them --------------------------------------

TEST_F(E2eTest, PreemptionStopsTheVictimRequeuesItAndRunsThePreemptor) {
  ASSERT_NO_FATAL_FAILURE(StartPool(BaseConfig()));
  Http agent(port_, kAdminToken);  // one fake agent for every node: an admin may act for any
  Http admin(port_, kAdminToken);
  ASSERT_NO_FATAL_FAILURE(AddNode(agent, "n1", 2));
  Reply v = admin.Post("/api/v1/jobs", R"({"name": "train", "qos": "best-effort", "priority": 0,
      "tasks": [{"name": "w", "replicas": 2, "resources": {"cpu": "1", "memory": "1Gi", "gpu": 1},
                 "checkpoint": {"dir": "/ckpt/train", "intervalSeconds": 600}}]})");
  ASSERT_EQ(v.status, 201) << v.raw;
  const std::string victim = v.body["id"];
  CycleUntilStable();
  EXPECT_EQ(StartAssigned(agent, {"n1"}), 2);
  ASSERT_EQ(Job(admin, victim)["state"], "running");

  Reply p = admin.Post("/api/v1/jobs", R"({"name": "urgent", "qos": "guaranteed", "priority": 100,
      "tasks": [{"name": "w", "resources": {"cpu": "1", "memory": "1Gi", "gpu": 1}}]})");
  ASSERT_EQ(p.status, 201) << p.raw;
  const std::string preemptor = p.body["id"];
  service_->RunCycle();
  EXPECT_EQ(Job(admin, preemptor)["state"], "pending");
  Reply ev = admin.Get("/api/v1/jobs/" + preemptor + "/events");
  ASSERT_EQ(ev.status, 200);
  ASSERT_TRUE(ev.body.contains("pending")) << ev.raw;
  EXPECT_EQ(ev.body["pending"]["waitingFor"], json::array({victim})) << ev.raw;

  // The agent is told to stop both victim tasks, with the grace period, and why.
  Reply a = agent.Get("/api/v1/agent/nodes/n1/assignments");
  ASSERT_EQ(a.status, 200);
  ASSERT_EQ(a.body["assignments"].size(), 2u) << a.raw;
  for (const json& t : a.body["assignments"]) {
    EXPECT_EQ(t["jobId"], victim);
    EXPECT_EQ(t["desired"], "stop");
    EXPECT_EQ(t["state"], "stopping");
    EXPECT_EQ(t["gracePeriodSeconds"], 30);
    EXPECT_NE(t["reason"].get<std::string>().find("preempted by " + preemptor), std::string::npos)
        << t.dump();
  }
  service_->RunCycle();  // nothing moves while the victim checkpoints
  EXPECT_EQ(Job(admin, preemptor)["state"], "pending");
  for (const json& t : a.body["assignments"]) {
    Reply r = agent.Post(ReportPath("n1", victim, t["index"]), R"({"state": "stopped", "exitCode": 143})");
    ASSERT_EQ(r.status, 200) << r.raw;
  }
  json requeued = Job(admin, victim);
  EXPECT_EQ(requeued["state"], "pending");
  EXPECT_EQ(requeued["reason"].get<std::string>().rfind("preempted by " + preemptor, 0), 0u)
      << "docs/api.md: a preempted job goes back to pending with reason 'preempted by j-...': "
      << requeued["reason"];
  for (const json& t : requeued["tasks"]) {
    EXPECT_EQ(t["state"], "pending");
    EXPECT_EQ(t["restarts"], 1);
  }

  service_->RunCycle();
  EXPECT_EQ(Job(admin, preemptor)["state"], "running");
  EXPECT_EQ(Job(admin, victim)["state"], "pending") << "two GPUs needed, one free";
  Reply after = agent.Get("/api/v1/agent/nodes/n1/assignments");
  ASSERT_EQ(after.body["assignments"].size(), 1u) << after.raw;
  EXPECT_EQ(after.body["assignments"][0]["jobId"], preemptor);
  EXPECT_EQ(after.body["assignments"][0]["desired"], "run");
  const std::string metrics = Metrics();
  EXPECT_NE(metrics.find("\ngpupool_preemptions_total 1\n"), std::string::npos) << metrics;
  std::vector<std::string> types;
  const Reply victim_events = admin.Get("/api/v1/jobs/" + victim + "/events");
  for (const json& e : victim_events.body["items"]) types.push_back(e["type"]);
  std::string all_types;
  for (const auto& t : types) all_types += t + " ";
  EXPECT_NE(std::find(types.begin(), types.end(), "Preempted"), types.end()) << all_types;

  // The preemptor finishes; the victim restarts from its checkpoint, and the agent sees the restart.
  EXPECT_EQ(StartAssigned(agent, {"n1"}), 1);
  ASSERT_EQ(agent.Post(ReportPath("n1", preemptor, 0), R"({"state": "succeeded"})").status, 200);
  service_->RunCycle();
  EXPECT_EQ(Job(admin, victim)["state"], "running");
  Reply back = agent.Get("/api/v1/agent/nodes/n1/assignments");
  ASSERT_EQ(back.body["assignments"].size(), 2u) << back.raw;
  for (const json& t : back.body["assignments"]) {
    EXPECT_EQ(t["desired"], "run");
    EXPECT_EQ(t["restarts"], 1);
    EXPECT_EQ(t["checkpoint"]["dir"], "/ckpt/train");
  }
  ExpectConsistent(*service_, "after preemption");
}

TEST_F(E2eTest, AGangThatDoesNotFitHoldsNothingWhileASmallJobRuns) {
  ASSERT_NO_FATAL_FAILURE(StartPool(BaseConfig()));
  Http agent(port_, kAdminToken);  // one fake agent for every node: an admin may act for any
  Http admin(port_, kAdminToken);
  ASSERT_NO_FATAL_FAILURE(AddNode(agent, "n1", 2));
  ASSERT_NO_FATAL_FAILURE(AddNode(agent, "n2", 2));
  auto submit = [&](const std::string& body) {
    Reply r = admin.Post("/api/v1/jobs", body);
    EXPECT_EQ(r.status, 201) << r.raw;
    return r.status == 201 ? r.body["id"].get<std::string>() : "";
  };
  const std::string hog = submit(
      R"({"name": "hog", "tasks": [{"name": "w", "replicas": 3, "resources": {"cpu": "1", "memory": "1Gi", "gpu": 1}}]})");
  CycleUntilStable();
  EXPECT_EQ(StartAssigned(agent, {"n1", "n2"}), 3);
  const std::string gang = submit(
      R"({"name": "gang", "tasks": [{"name": "w", "replicas": 2, "resources": {"cpu": "1", "memory": "1Gi", "gpu": 1}}]})");
  const std::string small = submit(
      R"({"name": "small", "tasks": [{"name": "w", "resources": {"cpu": "1", "memory": "1Gi", "gpu": 0.5}}]})");
  CycleUntilStable();
  EXPECT_EQ(Job(admin, small)["state"], "running");
  const json g = Job(admin, gang);
  EXPECT_EQ(g["state"], "pending");
  for (const json& t : g["tasks"]) {
    EXPECT_EQ(t["node"], "");
    EXPECT_TRUE(t["gpus"].empty());
  }
  int64_t used = 0;
  for (const auto& u : service_->GpuUsage()) used += u.ledger_used_share;
  EXPECT_EQ(used, 3500) << "the hog and the small job, nothing of the gang";
  for (const std::string node : {"n1", "n2"}) {
    const Reply a = agent.Get("/api/v1/agent/nodes/" + node + "/assignments");
    ASSERT_EQ(a.status, 200) << a.raw;
    for (const json& t : a.body["assignments"]) EXPECT_NE(t["jobId"], gang);
  }
  Reply ev = admin.Get("/api/v1/jobs/" + gang + "/events");
  ASSERT_TRUE(ev.body.contains("pending")) << ev.raw;
  EXPECT_FALSE(ev.body["pending"]["message"].get<std::string>().empty());

  // The hog finishes: the whole gang is placed at once.
  for (int i = 0; i < 3; ++i) {
    const json t = Job(admin, hog)["tasks"][static_cast<size_t>(i)];
    ASSERT_EQ(agent.Post(ReportPath(t["node"], hog, i), R"({"state": "succeeded"})").status, 200);
  }
  CycleUntilStable();
  const json placed = Job(admin, gang);
  EXPECT_EQ(placed["state"], "running");
  for (const json& t : placed["tasks"]) EXPECT_EQ(t["state"], "assigned");
  EXPECT_EQ(StartAssigned(agent, {"n1", "n2"}), 3);  // the gang's two and the small job's one
  ExpectConsistent(*service_, "gang");
}

// `gpupool` (the lean client) runs the client commands itself and execs gpupool-core beside it for
// the rest: both list the same commands, and a command of the core answers the same through either.
std::string Output(const std::string& command) {
  std::string out;
  FILE* f = ::popen(command.c_str(), "r");
  if (f == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  ::pclose(f);
  return out;
}

// The "Subcommands:" section of a --help: one line per command, its name and what it does.
std::vector<std::string> Subcommands(const std::string& help) {
  std::vector<std::string> lines;
  std::istringstream in(help.substr(std::min(help.size(), help.find("Subcommands:"))));
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line))
    if (line.size() > 2 && line[0] == ' ' && line[2] != ' ') lines.push_back(line);
  return lines;
}

TEST(E2eProcessTest, TheLeanClientAndTheCoreKnowTheSameCommands) {
  const std::string binary = GPUPOOL_BINARY;
  if (binary.empty() || !std::filesystem::exists(binary))
    GTEST_SKIP() << "no gpupool binary at '" << binary << "'";
  const std::string core = std::filesystem::path(binary).parent_path() / "gpupool-core";
  ASSERT_TRUE(std::filesystem::exists(core)) << core;
  const auto lean_commands = Subcommands(Output(binary + " --help"));
  const auto core_commands = Subcommands(Output(core + " --help"));
  EXPECT_GE(core_commands.size(), 15u);
  EXPECT_EQ(lean_commands, core_commands);
  // Core commands through the lean client: the same output, and their errors and exit codes.
  EXPECT_EQ(Output(binary + " policies"), Output(core + " policies"));
  EXPECT_NE(Output(binary + " policies").find("balanced"), std::string::npos);
  EXPECT_EQ(Output(binary + " version"), Output(core + " version"));
  EXPECT_EQ(WEXITSTATUS(std::system((binary + " profile check /nonexistent.yaml >/dev/null 2>&1").c_str())), 1);
  EXPECT_EQ(WEXITSTATUS(std::system((binary + " sim run --bogus >/dev/null 2>&1").c_str())), 2);
  // A core command still runs when the lean client is started under another name or path.
  EXPECT_EQ(Output("cd / && " + std::filesystem::absolute(binary).string() + " version"), Output(core + " version"));
}

}  // namespace
}  // namespace gpupool
