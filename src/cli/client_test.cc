// The client commands against an in-process httplib server that answers as docs/api.md says.
#include "client/api_client.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/client_commands.h"

namespace gpupool {
namespace {

using Json = nlohmann::ordered_json;

// ---- a fake server ----------------------------------------------------------

struct Recorded {
  std::string method;
  std::string path;    // decoded
  std::string target;  // as sent
  std::map<std::string, std::string> params;
  std::string authorization;
  std::string content_type;
  std::string body;
};

using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;

class FakeServer {
 public:
  FakeServer() {
    const Handler dispatch = [this](const httplib::Request& req, httplib::Response& res) {
      Dispatch(req, res);
    };
    server_.Get(".*", dispatch);
    server_.Post(".*", dispatch);
    server_.Put(".*", dispatch);
    server_.Delete(".*", dispatch);
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeServer() {
    server_.stop();
    thread_.join();
  }
  FakeServer(const FakeServer&) = delete;
  FakeServer& operator=(const FakeServer&) = delete;

  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  void On(const std::string& method, const std::string& path, Handler handler) {
    std::lock_guard<std::mutex> lock(mu_);
    routes_[method + " " + path] = std::move(handler);
  }
  // A canned answer.
  void On(const std::string& method, const std::string& path, int status, std::string body) {
    On(method, path, [status, body = std::move(body)](const httplib::Request&, httplib::Response& res) {
      res.status = status;
      res.set_content(body, "application/json");
    });
  }

  std::vector<Recorded> requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  void Dispatch(const httplib::Request& req, httplib::Response& res) {
    Recorded r;
    r.method = req.method;
    r.path = req.path;
    r.target = req.target;
    for (const auto& [k, v] : req.params) r.params[k] = v;
    r.authorization = req.get_header_value("Authorization");
    r.content_type = req.get_header_value("Content-Type");
    r.body = req.body;
    Handler handler;
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.push_back(r);
      const auto it = routes_.find(req.method + " " + req.path);
      if (it != routes_.end()) handler = it->second;
    }
    if (handler) {
      handler(req, res);
    } else {
      res.status = 404;
      res.set_content(R"({"error": {"code": "NotFound", "message": "no route )" + req.path + R"("}})",
                      "application/json");
    }
  }

  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  mutable std::mutex mu_;
  std::map<std::string, Handler> routes_;
  std::vector<Recorded> requests_;
};

// ---- canned objects (docs/api.md shapes) -----------------------------------------

const char* const kJob1 = R"({
  "id": "j-000000000001", "name": "train-a", "tenant": "vision", "queue": "vision",
  "priority": 100, "qos": "guaranteed", "state": "running", "reason": "",
  "createdAt": "2026-12-02T14:00:00.123Z", "updatedAt": "2026-12-02T14:00:01.000Z",
  "spec": {"name": "train-a"},
  "tasks": [
    {"index": 0, "group": "server", "replica": 0, "state": "running", "node": "node-1",
     "cpu": "2", "memory": "8Gi",
     "gpus": [{"index": 0, "uuid": "GPU-node-1-0", "share": 250, "memory": "10Gi"}],
     "exitCode": 0, "restarts": 0},
    {"index": 1, "group": "server", "replica": 1, "state": "assigned", "node": "node-2",
     "cpu": "500m", "memory": "512Mi",
     "gpus": [{"index": 2, "uuid": "GPU-node-2-2", "share": 1000, "memory": "80Gi"},
              {"index": 3, "uuid": "GPU-node-2-3", "share": 1000, "memory": "80Gi"}],
     "exitCode": 0, "restarts": 1}
  ]})";

const char* const kJob2 = R"({
  "id": "j-000000000002", "name": "infer-b", "tenant": "nlp", "queue": "default",
  "priority": 0, "qos": "best-effort", "state": "pending", "reason": "preempted by j-000000000001",
  "createdAt": "2026-12-02T12:00:00.000Z", "updatedAt": "2026-12-02T12:00:00.000Z",
  "tasks": [{"index": 0, "group": "main", "replica": 0, "state": "pending", "node": "",
             "cpu": "1", "memory": "1Gi", "gpus": [], "exitCode": 0, "restarts": 0}]})";

const char* const kJob3 = R"({
  "id": "j-000000000003", "name": "sweep", "tenant": "vision", "queue": "vision",
  "priority": 10, "qos": "burstable", "state": "succeeded", "reason": "",
  "createdAt": "2026-11-30T14:05:00Z", "updatedAt": "2026-11-30T15:05:00Z", "tasks": []})";

const char* const kNodes = R"({"items": [
  {"name": "node-1", "state": "ready", "cordoned": false, "draining": false,
   "labels": {"zone": "a"}, "lastHeartbeat": "2026-12-02T14:04:58.000Z",
   "capacity": {"cpu": "64", "memory": "512Gi", "gpus": 8, "gpuShare": 8000},
   "free": {"cpu": "60", "memory": "500Gi", "gpuShare": 7750},
   "gpus": [{"index": 0, "uuid": "GPU-node-1-0", "model": "A100-80GB", "memory": "80Gi",
             "healthy": true, "migEnabled": false, "freeShare": 750, "freeMemory": "70Gi",
             "tasks": [{"job": "j-000000000001", "index": 0, "share": 250}]},
            {"index": 1, "uuid": "GPU-node-1-1", "model": "A100-80GB", "memory": "80Gi",
             "healthy": false, "migEnabled": true, "freeShare": 1000, "freeMemory": "80Gi",
             "tasks": []}]},
  {"name": "node-2", "state": "notready", "cordoned": true, "draining": true,
   "labels": {}, "lastHeartbeat": "2026-12-02T13:00:00.000Z",
   "capacity": {"cpu": "128", "memory": "1Ti", "gpus": 4, "gpuShare": 4000},
   "free": {"cpu": "127.5", "memory": "1000Gi", "gpuShare": 2000}}
]})";

const char* const kQueues = R"({"items": [
  {"name": "default", "parent": "", "weight": 1, "guaranteed": {}, "limit": {},
   "used": {"cpu": "1", "memory": "1Gi", "gpu": 0}, "pending": 1, "running": 0},
  {"name": "vision", "parent": "default", "weight": 2.5,
   "guaranteed": {"cpu": "64", "memory": "512Gi", "gpu": 8}, "limit": {"gpu": 16},
   "used": {"cpu": "2.5", "memory": "8.5Gi", "gpu": 2.25}, "pending": 0, "running": 1}
]})";

Json Page(std::vector<const char*> items, const std::string& next = "") {
  Json page = Json::object();
  page["items"] = Json::array();
  for (const char* item : items) page["items"].push_back(Json::parse(item));
  if (!next.empty()) page["nextPageToken"] = next;
  return page;
}

std::chrono::system_clock::time_point Now() {
  // 2026-12-02T14:05:00Z
  using namespace std::chrono;
  return time_point_cast<system_clock::duration>(sys_days(year(2026) / December / 2) + hours(14) +
                                                 minutes(5));
}

class ClientCommandTest : public ::testing::Test {
 protected:
  CommandOptions Options(OutputFormat format = OutputFormat::kTable) const {
    CommandOptions o;
    o.client.server = server_.url();
    o.client.token = "s3cret";
    o.output = format;
    o.now = Now();
    return o;
  }

  FakeServer server_;
  std::ostringstream out_;
  std::ostringstream err_;
};

// A scratch directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("gpupool_client_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string Write(const std::string& name, const std::string& content) const {
    const std::filesystem::path p = path_ / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << content;
    return p.string();
  }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// ---- addresses, tokens, exit codes ------------------------------------------------

TEST(ServerUrlTest, AcceptsTheUsualForms) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"http://127.0.0.1:8470", "http://127.0.0.1:8470"},
      {"127.0.0.1:9000", "http://127.0.0.1:9000"},
      {"gpupool.example.com", "http://gpupool.example.com:8470"},
      {"http://gpupool", "http://gpupool:80"},
      {"HTTPS://gpupool", "https://gpupool:443"},
      {"[::1]:8470", "http://[::1]:8470"},
      {"http://h:1/prefix/", "http://h:1/prefix"},
      {"  localhost:8470/  ", "http://localhost:8470"},
  };
  for (const auto& [text, want] : cases) {
    auto url = ParseServerUrl(text);
    ASSERT_TRUE(url.ok()) << text << ": " << url.status().ToString();
    EXPECT_EQ(url->ToString(), want) << text;
  }
}

TEST(ServerUrlTest, RejectsBadAddresses) {
  for (const char* text : {"", "ftp://h:1", "h:0", "h:65536", "h:port", "h:", "://h", "user@h:1", "[::1",
                           "http://h:1/x?y=1", "h o:1"}) {
    auto url = ParseServerUrl(text);
    EXPECT_FALSE(url.ok()) << text;
    if (!url.ok()) {
      EXPECT_EQ(url.status().code(), StatusCode::kInvalidArgument);
    }
  }
}

TEST(ClientConfigTest, FlagsBeatTheEnvironment) {
  TempDir dir;
  const std::string token_file = dir.Write("token", "  from-file\n");
  const EnvLookup env = FakeEnv({{"GPUPOOL_SERVER", "10.0.0.1:1"}, {"GPUPOOL_TOKEN", "from-env"}});

  auto c = ResolveClientConfig({"10.0.0.2:2", "from-flag", token_file}, env);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->server, "http://10.0.0.2:2");
  EXPECT_EQ(c->token, "from-flag");
  EXPECT_EQ(c->connect_timeout_s, 5);
  EXPECT_EQ(c->read_timeout_s, 30);

  c = ResolveClientConfig({"", "", token_file}, env);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->server, "http://10.0.0.1:1");
  EXPECT_EQ(c->token, "from-file");

  c = ResolveClientConfig({}, env);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->token, "from-env");
}

// A token on the command line shows in ps: it still works, with a warning; a token file is read
// with a bound and trimmed of its newline.
TEST(ClientConfigTest, TokenOnTheCommandLineWarnsAndTokenFilesAreBounded) {
  TempDir dir;
  auto c = ResolveClientConfig({"", "from-flag", ""}, FakeEnv({}));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->token, "from-flag");
  EXPECT_NE(c->warning.find("visible"), std::string::npos) << c->warning;
  EXPECT_NE(c->warning.find("--token-file"), std::string::npos) << c->warning;

  c = ResolveClientConfig({"", "", dir.Write("t", "secret\n")}, FakeEnv({}));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->token, "secret");
  EXPECT_EQ(c->warning, "");
  c = ResolveClientConfig({}, FakeEnv({{"GPUPOOL_TOKEN", "env-token\n"}}));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->token, "env-token");
  EXPECT_EQ(c->warning, "");

  c = ResolveClientConfig({"", "", dir.Write("big", std::string(kMaxTokenFileBytes + 1, 'a'))}, FakeEnv({}));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("larger than 4096 bytes"), std::string::npos) << c.status().message();
  // /dev/zero never ends: the bound is what stops the read.
  c = ResolveClientConfig({"", "", "/dev/zero"}, FakeEnv({}));
  EXPECT_FALSE(c.ok());
  EXPECT_TRUE(ReadTokenFile(dir.Write("max", std::string(kMaxTokenFileBytes - 1, 'b') + "\n")).ok());
}

TEST(ClientConfigTest, DefaultsWithoutAnything) {
  auto c = ResolveClientConfig({}, FakeEnv({}));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->server, "http://127.0.0.1:8470");
  EXPECT_EQ(c->token, "");
}

TEST(ClientConfigTest, BadInputsAreInvalidArgument) {
  TempDir dir;
  const std::string empty = dir.Write("empty", " \n");
  for (const ClientFlags& flags :
       {ClientFlags{"ftp://x", "", ""}, ClientFlags{"", "", dir.path() + "/missing"},
        ClientFlags{"", "", empty}, ClientFlags{"", "", dir.path()}}) {
    auto c = ResolveClientConfig(flags, FakeEnv({}));
    EXPECT_FALSE(c.ok()) << flags.server << flags.token_file;
    if (!c.ok()) {
      EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    }
  }
}

TEST(ClientConfigTest, FallsBackToTheDataDirAdminToken) {
  TempDir dir;
  dir.Write("data/admin.token", "tok-data\n");
  dir.Write("xdg/gpupool/admin.token", "tok-xdg");
  dir.Write("home/.local/share/gpupool/admin.token", "tok-home");
  const std::string root = dir.path();

  auto c = ResolveClientConfig({}, FakeEnv({{"GPUPOOL_DATA_DIR", root + "/data"},
                                            {"XDG_DATA_HOME", root + "/xdg"},
                                            {"HOME", root + "/home"}}));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->token, "tok-data");

  c = ResolveClientConfig({}, FakeEnv({{"XDG_DATA_HOME", root + "/xdg"}, {"HOME", root + "/home"}}));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->token, "tok-xdg");

  c = ResolveClientConfig({}, FakeEnv({{"HOME", root + "/home"}}));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->token, "tok-home");

  // $GPUPOOL_DATA_DIR without admin.token: no token, no error.
  c = ResolveClientConfig({}, FakeEnv({{"GPUPOOL_DATA_DIR", root + "/nothing"}, {"HOME", root + "/home"}}));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->token, "");

  // The environment token comes first.
  c = ResolveClientConfig({}, FakeEnv({{"GPUPOOL_TOKEN", "env"}, {"HOME", root + "/home"}}));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->token, "env");
}

TEST(ExitCodeTest, FollowsTheApiContract) {
  const std::vector<std::pair<int, int>> cases = {{200, 0}, {201, 0}, {204, 0}, {400, 2}, {413, 2}, {415, 2},
                                                  {422, 2}, {404, 3}, {401, 4}, {403, 4}, {409, 6}, {500, 5},
                                                  {502, 5}, {503, 5}, {405, 1}, {429, 1}, {302, 1}, {0, 1}};
  for (const auto& [status, code] : cases) EXPECT_EQ(ExitCodeForHttpStatus(status), code) << status;
}

TEST(PercentEncodeTest, KeepsOnlyUnreserved) {
  EXPECT_EQ(PercentEncode("j-0001_a.b~"), "j-0001_a.b~");
  EXPECT_EQ(PercentEncode("a/b c,%"), "a%2Fb%20c%2C%25");
  EXPECT_EQ(WithQuery("/x", {{"state", "running,pending"}, {"limit", "5"}}),
            "/x?state=running%2Cpending&limit=5");
  EXPECT_EQ(WithQuery("/x", {}), "/x");
}

// ---- the HTTP client ------------------------------------------------------------------

TEST_F(ClientCommandTest, SendsTheBearerToken) {
  server_.On("GET", "/api/v1/jobs/j-000000000001", 200, kJob1);
  ASSERT_EQ(GetJob(Options(), "j-000000000001", out_, err_), 0) << err_.str();
  const auto reqs = server_.requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0].authorization, "Bearer s3cret");
  EXPECT_EQ(err_.str(), "");
}

TEST_F(ClientCommandTest, SendsNoAuthorizationWithoutAToken) {
  server_.On("GET", "/api/v1/jobs/j-000000000001", 200, kJob1);
  CommandOptions o = Options();
  o.client.token.clear();
  ASSERT_EQ(GetJob(o, "j-000000000001", out_, err_), 0);
  EXPECT_EQ(server_.requests().at(0).authorization, "");
}

TEST_F(ClientCommandTest, EscapesPathSegments) {
  server_.On("GET", "/api/v1/nodes/rack 1/node", 200, R"({"name": "rack 1/node"})");
  ASSERT_EQ(GetNode(Options(), "rack 1/node", out_, err_), 0) << err_.str();
  EXPECT_EQ(server_.requests().at(0).target, "/api/v1/nodes/rack%201%2Fnode");
}

TEST_F(ClientCommandTest, ClientKeepsTheBasePathAndReportsStatus) {
  server_.On("GET", "/gp/healthz", 200, R"({"status": "ok", "nodes": 3})");
  ClientConfig config;
  config.server = server_.url() + "/gp/";
  auto client = ApiClient::Create(config);
  ASSERT_TRUE(client.ok());
  auto reply = client->Get("/healthz");
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->status, 200);
  ASSERT_TRUE(reply->is_json);
  EXPECT_EQ(reply->json.dump(), R"({"status":"ok","nodes":3})");  // the server's key order
}

// ---- submit ---------------------------------------------------------------------------

const char* const kSpecYaml = "name: train-a\ntasks:\n  - name: server\n    resources: {gpu: 0.25}\n";
const char* const kSpecJson = R"({"name": "train-a", "tasks": [{"name": "server"}]})";

void AnswerSubmit(FakeServer& server) {
  server.On("POST", "/api/v1/jobs", [](const httplib::Request&, httplib::Response& res) {
    res.status = 201;
    Json job = Json::parse(kJob2);
    job["state"] = "pending";
    res.set_content(job.dump(), "application/json");
  });
}

TEST_F(ClientCommandTest, SubmitSendsAYamlFileAsYaml) {
  TempDir dir;
  const std::string file = dir.Write("job.yaml", kSpecYaml);
  AnswerSubmit(server_);
  std::istringstream in;
  ASSERT_EQ(SubmitJob(Options(), file, in, out_, err_), 0) << err_.str();
  const auto reqs = server_.requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0].method, "POST");
  EXPECT_EQ(reqs[0].content_type, "application/yaml");
  EXPECT_EQ(reqs[0].body, kSpecYaml);
  EXPECT_EQ(out_.str(), "job j-000000000002 submitted (state pending)\n");
}

TEST_F(ClientCommandTest, SubmitSendsAJsonFileAsJson) {
  TempDir dir;
  const std::string file = dir.Write("job.JSON", kSpecJson);
  AnswerSubmit(server_);
  std::istringstream in;
  ASSERT_EQ(SubmitJob(Options(OutputFormat::kJson), file, in, out_, err_), 0) << err_.str();
  EXPECT_EQ(server_.requests().at(0).content_type, "application/json");
  EXPECT_EQ(server_.requests().at(0).body, kSpecJson);
  EXPECT_EQ(Json::parse(out_.str()).at("id"), "j-000000000002");
}

TEST_F(ClientCommandTest, SubmitDetectsTheFormatOfStdinAndOtherFiles) {
  AnswerSubmit(server_);
  std::istringstream json_in(std::string("\n  ") + kSpecJson);
  ASSERT_EQ(SubmitJob(Options(), "-", json_in, out_, err_), 0) << err_.str();
  std::istringstream yaml_in(kSpecYaml);
  ASSERT_EQ(SubmitJob(Options(), "-", yaml_in, out_, err_), 0) << err_.str();
  // A flow mapping that is not JSON is YAML.
  std::istringstream flow_in("{name: x, tasks: []}");
  ASSERT_EQ(SubmitJob(Options(), "-", flow_in, out_, err_), 0) << err_.str();
  TempDir dir;
  const std::string file = dir.Write("spec.txt", kSpecJson);
  std::istringstream unused;
  ASSERT_EQ(SubmitJob(Options(), file, unused, out_, err_), 0) << err_.str();

  const auto reqs = server_.requests();
  ASSERT_EQ(reqs.size(), 4u);
  EXPECT_EQ(reqs[0].content_type, "application/json");
  EXPECT_EQ(reqs[0].body, std::string("\n  ") + kSpecJson);
  EXPECT_EQ(reqs[1].content_type, "application/yaml");
  EXPECT_EQ(reqs[2].content_type, "application/yaml");
  EXPECT_EQ(reqs[3].content_type, "application/json");
}

TEST_F(ClientCommandTest, SubmitRefusesMissingAndEmptyInput) {
  TempDir dir;
  std::istringstream in;
  EXPECT_EQ(SubmitJob(Options(), dir.path() + "/nope.yaml", in, out_, err_), 2);
  EXPECT_NE(err_.str().find("gpupool: cannot open "), std::string::npos) << err_.str();
  err_.str("");
  EXPECT_EQ(SubmitJob(Options(), dir.Write("blank.yaml", "\n \n"), in, out_, err_), 2);
  EXPECT_NE(err_.str().find("is empty"), std::string::npos) << err_.str();
  std::istringstream empty_stdin;
  EXPECT_EQ(SubmitJob(Options(), "-", empty_stdin, out_, err_), 2);
  EXPECT_TRUE(server_.requests().empty());
  EXPECT_EQ(out_.str(), "");
}

// ---- list -----------------------------------------------------------------------------

// A job as servers list it: task counts instead of the tasks (kJob2 has one pending task).
Json Summary(const char* job) {
  Json j = Json::parse(job);
  j.erase("tasks");
  j["taskCounts"] = {{"total", 1}, {"pending", 1}, {"running", 0}};
  return j;
}

void AnswerJobPages(FakeServer& server) {
  server.On("GET", "/api/v1/jobs", [](const httplib::Request& req, httplib::Response& res) {
    const std::string token = req.has_param("pageToken") ? req.get_param_value("pageToken") : "";
    Json page;
    if (token.empty()) {
      page = Page({kJob1, kJob2}, "p2");
      page["items"][1] = Summary(kJob2);
    } else if (token == "p2") {
      page = Page({kJob3});
    } else {
      res.status = 400;
      res.set_content(
          R"({"error": {"code": "InvalidArgument", "field": "pageToken", "message": "bad token"}})",
          "application/json");
      return;
    }
    res.set_content(page.dump(), "application/json");
  });
}

const char* const kJobTable =
    "ID               NAME      TENANT   QUEUE     PRIO   QOS           STATE       TASKS   AGE\n"
    "j-000000000001   train-a   vision   vision    100    guaranteed    running     1/2     4m\n"
    "j-000000000002   infer-b   nlp      default   0      best-effort   pending     0/1     2h\n"
    "j-000000000003   sweep     vision   vision    10     burstable     succeeded   0/0     2d\n";

TEST_F(ClientCommandTest, ListFollowsPagesWithAll) {
  AnswerJobPages(server_);
  ListJobsOptions list;
  list.all = true;
  list.states = {"running,pending", "succeeded"};
  list.tenants = {"vision"};
  list.queues = {"vision", "default"};
  list.limit = 2;
  ASSERT_EQ(ListJobs(Options(), list, out_, err_), 0) << err_.str();
  EXPECT_EQ(out_.str(), kJobTable);
  EXPECT_EQ(err_.str(), "");

  const auto reqs = server_.requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].params.count("pageToken"), 0u);
  EXPECT_EQ(reqs[1].params.at("pageToken"), "p2");
  for (const Recorded& r : reqs) {
    EXPECT_EQ(r.params.at("state"), "running,pending,succeeded");
    EXPECT_EQ(r.params.at("tenant"), "vision");
    EXPECT_EQ(r.params.at("queue"), "vision,default");
    EXPECT_EQ(r.params.at("limit"), "2");
  }
}

TEST_F(ClientCommandTest, ListShowsOnePageWithoutAll) {
  AnswerJobPages(server_);
  ASSERT_EQ(ListJobs(Options(), {}, out_, err_), 0) << err_.str();
  EXPECT_EQ(server_.requests().size(), 1u);
  EXPECT_EQ(server_.requests()[0].params.count("limit"), 0u);
  EXPECT_EQ(out_.str(),
            "ID               NAME      TENANT   QUEUE     PRIO   QOS           STATE     TASKS   AGE\n"
            "j-000000000001   train-a   vision   vision    100    guaranteed    running   1/2     4m\n"
            "j-000000000002   infer-b   nlp      default   0      best-effort   pending   0/1     2h\n");
  EXPECT_EQ(err_.str(), "More jobs: add --page-token p2 for the next page, or --all.\n");

  // The json of one page is the server's page, token included.
  out_.str("");
  err_.str("");
  ListJobsOptions next;
  next.page_token = "p2";
  ASSERT_EQ(ListJobs(Options(OutputFormat::kJson), next, out_, err_), 0) << err_.str();
  EXPECT_EQ(out_.str(), Page({kJob3}).dump(2) + "\n");
}

TEST_F(ClientCommandTest, ListAllAsJsonMergesThePages) {
  AnswerJobPages(server_);
  ListJobsOptions list;
  list.all = true;
  ASSERT_EQ(ListJobs(Options(OutputFormat::kJson), list, out_, err_), 0) << err_.str();
  Json want = Page({kJob1, kJob2, kJob3});
  want["items"][1] = Summary(kJob2);
  EXPECT_EQ(out_.str(), want.dump(2) + "\n");
}

TEST_F(ClientCommandTest, ListStopsWhenTheServerRepeatsAToken) {
  server_.On("GET", "/api/v1/jobs", 200, Page({kJob1}, "again").dump());
  ListJobsOptions list;
  list.all = true;
  EXPECT_EQ(ListJobs(Options(), list, out_, err_), 1);
  EXPECT_EQ(err_.str(), "gpupool: the server repeated the page token 'again'\n");
  EXPECT_EQ(server_.requests().size(), 2u);
}

TEST_F(ClientCommandTest, ListAsYaml) {
  server_.On("GET", "/api/v1/jobs", 200, Page({kJob3}).dump());
  ASSERT_EQ(ListJobs(Options(OutputFormat::kYaml), {}, out_, err_), 0) << err_.str();
  EXPECT_EQ(out_.str(),
            "items:\n"
            "  - id: j-000000000003\n"
            "    name: sweep\n"
            "    tenant: vision\n"
            "    queue: vision\n"
            "    priority: 10\n"
            "    qos: burstable\n"
            "    state: succeeded\n"
            "    reason: \"\"\n"
            "    createdAt: \"2026-11-30T14:05:00Z\"\n"
            "    updatedAt: \"2026-11-30T15:05:00Z\"\n"
            "    tasks: []\n");
}

TEST_F(ClientCommandTest, EmptyListSaysSo) {
  server_.On("GET", "/api/v1/jobs", 200, R"({"items": []})");
  ASSERT_EQ(ListJobs(Options(), {}, out_, err_), 0);
  EXPECT_EQ(out_.str(), "");
  EXPECT_EQ(err_.str(), "No jobs found.\n");
}

// ---- errors -----------------------------------------------------------------------------

struct ErrorCase {
  int status;
  const char* code;
  int exit;
};

class ErrorMappingTest : public ClientCommandTest, public ::testing::WithParamInterface<ErrorCase> {};

TEST_P(ErrorMappingTest, PrintsTheMessageAndMapsTheStatus) {
  const ErrorCase c = GetParam();
  server_.On(
      "GET", "/api/v1/jobs/j-1", c.status,
      fmt::format(R"j({{"error": {{"code": "{}", "message": "it went wrong ({})"}}}})j", c.code, c.status));
  EXPECT_EQ(GetJob(Options(), "j-1", out_, err_), c.exit);
  EXPECT_EQ(err_.str(), fmt::format("gpupool: it went wrong ({})\n", c.status));
  EXPECT_EQ(out_.str(), "");
}

INSTANTIATE_TEST_SUITE_P(
    AllStatuses, ErrorMappingTest,
    ::testing::Values(ErrorCase{400, "InvalidArgument", 2}, ErrorCase{401, "Unauthenticated", 4},
                      ErrorCase{403, "PermissionDenied", 4}, ErrorCase{404, "NotFound", 3},
                      ErrorCase{409, "FailedPrecondition", 6}, ErrorCase{413, "PayloadTooLarge", 2},
                      ErrorCase{415, "UnsupportedMediaType", 2}, ErrorCase{422, "QuotaExceeded", 2},
                      ErrorCase{500, "Internal", 5}, ErrorCase{503, "Unavailable", 5}),
    [](const ::testing::TestParamInfo<ErrorCase>& param_info) {
      return "Http" + std::to_string(param_info.param.status);
    });

TEST_F(ClientCommandTest, SubmitErrorNamesTheField) {
  server_.On("POST", "/api/v1/jobs", 400,
             R"({"error": {"code": "InvalidArgument", "field": "tasks[0].resources.gpu",
                 "message": "tasks[0].resources.gpu: must be below 1 or a whole number of GPUs, got 1.5"}})");
  std::istringstream in(kSpecYaml);
  EXPECT_EQ(SubmitJob(Options(), "-", in, out_, err_), 2);
  EXPECT_EQ(err_.str(),
            "gpupool: tasks[0].resources.gpu: must be below 1 or a whole number of GPUs, got 1.5\n");

  err_.str("");
  server_.On(
      "POST", "/api/v1/jobs", 422,
      R"({"error": {"code": "QuotaExceeded", "field": "queue", "message": "the gang needs 32 GPUs, the limit is 16"}})");
  std::istringstream in2(kSpecYaml);
  EXPECT_EQ(SubmitJob(Options(), "-", in2, out_, err_), 2);
  EXPECT_EQ(err_.str(), "gpupool: queue: the gang needs 32 GPUs, the limit is 16\n");
}

TEST_F(ClientCommandTest, ErrorWithoutTheJsonShape) {
  server_.On("GET", "/api/v1/queues/q", [](const httplib::Request&, httplib::Response& res) {
    res.status = 502;
    res.set_content("<html>bad gateway</html>\nmore", "text/html");
  });
  EXPECT_EQ(GetQueue(Options(), "q", out_, err_), 5);
  EXPECT_EQ(err_.str(), "gpupool: server answered HTTP 502: <html>bad gateway</html>\n");
}

TEST_F(ClientCommandTest, SuccessThatIsNotJsonIsAnError) {
  server_.On("GET", "/api/v1/queues/q",
             [](const httplib::Request&, httplib::Response& res) { res.set_content("hello", "text/plain"); });
  EXPECT_EQ(GetQueue(Options(), "q", out_, err_), 1);
  EXPECT_EQ(err_.str(), "gpupool: the server's answer (HTTP 200) is not JSON\n");
}

// A port on 127.0.0.1 that nothing listens on: bound once to learn a free number, then closed.
int ClosedPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// `gpupool logs -f` across a rotation: the agent caps a log file (--log-max-bytes) and starts a
// new one, so the file becomes shorter than what the follower has read (X-Log-Size < offset). The
// follower starts the new file from its beginning instead of waiting past its end forever.
TEST_F(ClientCommandTest, LogsFollowAcrossARotation) {
  std::mutex mu;
  int rotations_seen = 0, job_polls = 0;
  std::string file = "aaaa\n";
  bool rotated = false;
  server_.On("GET", "/api/v1/jobs/j-1/tasks/0/logs", [&](const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu);
    const size_t offset = std::stoul(req.get_param_value("offset"));
    if (!rotated && offset >= file.size()) {
      // Everything of the first file was read; now it is rotated and the new one is shorter.
      rotated = true;
      file = "bb\n";
      ++rotations_seen;
    }
    const size_t from = std::min(offset, file.size());
    res.set_header("X-Log-Size", std::to_string(file.size()));
    res.set_header("X-Log-Offset", std::to_string(from));
    res.set_content(file.substr(from), "text/plain");
  });
  server_.On("GET", "/api/v1/jobs/j-1", [&](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu);
    const bool done = ++job_polls > 5;
    res.set_content(std::string(R"({"id": "j-1", "state": ")") + (done ? "succeeded" : "running") +
                        R"(", "tasks": [{"index": 0, "state": ")" + (done ? "succeeded" : "running") + R"("}]})",
                    "application/json");
  });
  LogsOptions logs;
  logs.job_id = "j-1";
  logs.follow = true;
  logs.poll_ms = 1;
  EXPECT_EQ(TaskLogs(Options(), logs, out_, err_), 0) << err_.str();
  EXPECT_EQ(out_.str(), "aaaa\nbb\n");
  EXPECT_NE(err_.str().find("rotated"), std::string::npos) << err_.str();
  EXPECT_EQ(rotations_seen, 1);
}

TEST(UnreachableTest, ExitsWithFive) {
  const int port = ClosedPort();
  ASSERT_GT(port, 0);
  CommandOptions o;
  o.client.server = "127.0.0.1:" + std::to_string(port);
  std::ostringstream out, err;
  EXPECT_EQ(ListNodes(o, out, err), 5);
  EXPECT_EQ(
      err.str().rfind("gpupool: cannot reach the server at http://127.0.0.1:" + std::to_string(port), 0), 0u)
      << err.str();
  EXPECT_EQ(out.str(), "");
}

TEST(BadServerTest, ExitsWithTwo) {
  CommandOptions o;
  o.client.server = "ftp://x";
  std::ostringstream out, err;
  EXPECT_EQ(ListQueues(o, out, err), 2);
  EXPECT_EQ(err.str(), "gpupool: server address 'ftp://x': the scheme must be http or https\n");
}

// ---- jobs -------------------------------------------------------------------------------

TEST_F(ClientCommandTest, GetJobTable) {
  server_.On("GET", "/api/v1/jobs/j-000000000002", 200, kJob2);
  server_.On("GET", "/api/v1/jobs/j-000000000001", 200, kJob1);
  ASSERT_EQ(GetJob(Options(), "j-000000000001", out_, err_), 0) << err_.str();
  EXPECT_EQ(out_.str(),
            "ID:         j-000000000001\n"
            "Name:       train-a\n"
            "Tenant:     vision\n"
            "Queue:      vision\n"
            "Priority:   100\n"
            "QoS:        guaranteed\n"
            "State:      running\n"
            "Created:    2026-12-02T14:00:00.123Z\n"
            "Updated:    2026-12-02T14:00:01.000Z\n"
            "\n"
            "INDEX   GROUP    REPLICA   STATE      NODE     CPU    MEMORY   GPUS            EXIT   RESTARTS\n"
            "0       server   0         running    node-1   2      8Gi      0:250           0      0\n"
            "1       server   1         assigned   node-2   500m   512Mi    2:1000,3:1000   0      1\n");
  out_.str("");
  ASSERT_EQ(GetJob(Options(), "j-000000000002", out_, err_), 0) << err_.str();
  EXPECT_NE(out_.str().find("Reason:     preempted by j-000000000001\n"), std::string::npos) << out_.str();
}

TEST_F(ClientCommandTest, GetJobShowsFaultRestartsAndTheBackoff) {
  Json job = Json::parse(kJob2);
  job["reason"] = "node node-3 lost (no heartbeat for 6.2 s)";
  job["faults"] = 2;
  job["notBefore"] = "2026-12-02T12:00:04.000Z";
  job["spec"] = {{"retry", {{"maxRestarts", 3}}}};
  server_.On("GET", "/api/v1/jobs/j-000000000002", 200, job.dump());
  ASSERT_EQ(GetJob(Options(), "j-000000000002", out_, err_), 0) << err_.str();
  EXPECT_NE(out_.str().find("Faults:        2 of 3 restarts\n"), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find("Restarts at:   2026-12-02T12:00:04.000Z\n"), std::string::npos) << out_.str();
}

TEST_F(ClientCommandTest, GetJobShowsItsTimeLimitAndDependencies) {
  Json job = Json::parse(kJob2);
  job["reason"] = "waiting for j-000000000001 to succeed (dependsOn)";
  job["spec"] = {{"timeLimit", 5400},
                 {"dependsOn", {{{"job", "j-000000000001"}, {"condition", "succeeded"}},
                                {{"job", "j-000000000003"}, {"condition", "ended"}}}}};
  server_.On("GET", "/api/v1/jobs/j-000000000002", 200, job.dump());
  ASSERT_EQ(GetJob(Options(), "j-000000000002", out_, err_), 0) << err_.str();
  EXPECT_NE(out_.str().find("Time limit:   5400 s\n"), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find("Depends on:   j-000000000001 (succeeded), j-000000000003 (ended)\n"), std::string::npos)
      << out_.str();
}

TEST_F(ClientCommandTest, GetJobShowsTheImageEachTaskRanFromPinnedByDigest) {
  Json job = Json::parse(kJob2);
  const std::string pinned = "oci:/srv/images/pytorch:24.05@sha256:" + std::string(64, 'e');
  job["tasks"][0]["image"] = pinned;
  server_.On("GET", "/api/v1/jobs/j-000000000002", 200, job.dump());
  ASSERT_EQ(GetJob(Options(), "j-000000000002", out_, err_), 0) << err_.str();
  EXPECT_NE(out_.str().find("IMAGE"), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find(pinned + "\n"), std::string::npos) << out_.str();
  // Without images, no images table.
  job["tasks"][0].erase("image");
  server_.On("GET", "/api/v1/jobs/j-000000000002", 200, job.dump());
  out_.str("");
  ASSERT_EQ(GetJob(Options(), "j-000000000002", out_, err_), 0) << err_.str();
  EXPECT_EQ(out_.str().find("IMAGE"), std::string::npos) << out_.str();
}

TEST_F(ClientCommandTest, CancelPostsAndReports) {
  server_.On("POST", "/api/v1/jobs/j-000000000001/cancel",
             [](const httplib::Request&, httplib::Response& res) {
               Json job = Json::parse(kJob1);
               job["state"] = "cancelled";
               res.set_content(job.dump(), "application/json");
             });
  ASSERT_EQ(CancelJob(Options(), "j-000000000001", out_, err_), 0) << err_.str();
  EXPECT_EQ(out_.str(), "job j-000000000001 cancelled\n");
  EXPECT_EQ(server_.requests().at(0).method, "POST");
  EXPECT_EQ(server_.requests().at(0).body, "");
  EXPECT_EQ(server_.requests().at(0).content_type, "");

  out_.str("");
  server_.On("POST", "/api/v1/jobs/j-000000000003/cancel", 409,
             R"({"error": {"code": "FailedPrecondition", "message": "job j-000000000003 has finished"}})");
  EXPECT_EQ(CancelJob(Options(), "j-000000000003", out_, err_), 6);
  EXPECT_EQ(err_.str(), "gpupool: job j-000000000003 has finished\n");
  EXPECT_EQ(out_.str(), "");
}

TEST_F(ClientCommandTest, EventsWithTheWhyPending) {
  server_.On("GET", "/api/v1/jobs/j-000000000002/events", 200, R"({
    "items": [{"id": 6, "time": "2026-12-02T12:00:00.000Z", "type": "Submitted", "message": "submitted"},
              {"id": 7, "time": "2026-12-02T12:00:00.500Z", "type": "Pending",
               "message": "0/12 nodes fit: 8 insufficient GPU share, 4 GPU model not allowed"}],
    "pending": {"task": "server[0]", "totalNodes": 12, "feasibleNodes": 0,
                "reasons": [{"reason": "insufficient GPU share", "nodes": 8},
                            {"reason": "GPU model not allowed", "nodes": 4}],
                "nodes": {"node-1": "insufficient GPU share"}}})");
  EventsOptions events;
  events.job_id = "j-000000000002";
  events.after = 5;
  events.limit = 10;
  ASSERT_EQ(JobEvents(Options(), events, out_, err_), 0) << err_.str();
  EXPECT_EQ(
      out_.str(),
      "ID   TIME                       TYPE        MESSAGE\n"
      "6    2026-12-02T12:00:00.000Z   Submitted   submitted\n"
      "7    2026-12-02T12:00:00.500Z   Pending     0/12 nodes fit: 8 insufficient GPU share, 4 GPU model "
      "not allowed\n"
      "\n"
      "Why pending (task server[0]): 0 of 12 nodes feasible\n"
      "NODES   REASON\n"
      "8       insufficient GPU share\n"
      "4       GPU model not allowed\n");
  const Recorded r = server_.requests().at(0);
  EXPECT_EQ(r.params.at("after"), "5");
  EXPECT_EQ(r.params.at("limit"), "10");

  // Before the first scheduling pass: no task named yet, a message instead; no events.
  server_.On("GET", "/api/v1/jobs/j-000000000009/events", 200, R"({"items": [],
    "pending": {"feasibleNodes": 0, "message": "not tried yet", "nodes": {}, "reasons": [], "task": "",
                "totalNodes": 0}})");
  out_.str("");
  events = {};
  events.job_id = "j-000000000009";
  ASSERT_EQ(JobEvents(Options(), events, out_, err_), 0) << err_.str();
  EXPECT_EQ(out_.str(), "No events.\n\nWhy pending: 0 of 0 nodes feasible (not tried yet)\n");
  EXPECT_EQ(server_.requests().at(1).params.count("after"), 0u);
}

// ---- nodes ------------------------------------------------------------------------------

TEST_F(ClientCommandTest, NodesTable) {
  server_.On("GET", "/api/v1/nodes", 200, kNodes);
  ASSERT_EQ(ListNodes(Options(), out_, err_), 0) << err_.str();
  EXPECT_EQ(out_.str(),
            "NAME     STATE               GPUS   FREE-SHARE   CPU-FREE    MEM-FREE      CORDONED\n"
            "node-1   ready               8      7750/8000    60/64       500Gi/512Gi   no\n"
            "node-2   notready,draining   4      2000/4000    127.5/128   1000Gi/1Ti    yes\n");
}

TEST_F(ClientCommandTest, NodesJsonAndYaml) {
  server_.On("GET", "/api/v1/nodes", 200, kNodes);
  ASSERT_EQ(ListNodes(Options(OutputFormat::kJson), out_, err_), 0) << err_.str();
  EXPECT_EQ(out_.str(), Json::parse(kNodes).dump(2) + "\n");
  out_.str("");
  ASSERT_EQ(ListNodes(Options(OutputFormat::kYaml), out_, err_), 0) << err_.str();
  EXPECT_EQ(out_.str(),
            "items:\n"
            "  - name: node-1\n"
            "    state: ready\n"
            "    cordoned: false\n"
            "    draining: false\n"
            "    labels:\n"
            "      zone: a\n"
            "    lastHeartbeat: \"2026-12-02T14:04:58.000Z\"\n"
            "    capacity:\n"
            "      cpu: \"64\"\n"
            "      memory: \"512Gi\"\n"
            "      gpus: 8\n"
            "      gpuShare: 8000\n"
            "    free:\n"
            "      cpu: \"60\"\n"
            "      memory: \"500Gi\"\n"
            "      gpuShare: 7750\n"
            "    gpus:\n"
            "      - index: 0\n"
            "        uuid: GPU-node-1-0\n"
            "        model: A100-80GB\n"
            "        memory: \"80Gi\"\n"
            "        healthy: true\n"
            "        migEnabled: false\n"
            "        freeShare: 750\n"
            "        freeMemory: \"70Gi\"\n"
            "        tasks:\n"
            "          - job: j-000000000001\n"
            "            index: 0\n"
            "            share: 250\n"
            "      - index: 1\n"
            "        uuid: GPU-node-1-1\n"
            "        model: A100-80GB\n"
            "        memory: \"80Gi\"\n"
            "        healthy: false\n"
            "        migEnabled: true\n"
            "        freeShare: 1000\n"
            "        freeMemory: \"80Gi\"\n"
            "        tasks: []\n"
            "  - name: node-2\n"
            "    state: notready\n"
            "    cordoned: true\n"
            "    draining: true\n"
            "    labels: {}\n"
            "    lastHeartbeat: \"2026-12-02T13:00:00.000Z\"\n"
            "    capacity:\n"
            "      cpu: \"128\"\n"
            "      memory: \"1Ti\"\n"
            "      gpus: 4\n"
            "      gpuShare: 4000\n"
            "    free:\n"
            "      cpu: \"127.5\"\n"
            "      memory: \"1000Gi\"\n"
            "      gpuShare: 2000\n");
}

TEST_F(ClientCommandTest, NodesFollowPages) {
  const Json all = Json::parse(kNodes);
  server_.On("GET", "/api/v1/nodes", [all](const httplib::Request& req, httplib::Response& res) {
    Json page = Json::object();
    page["items"] = Json::array();
    if (req.has_param("pageToken")) {
      page["items"].push_back(all["items"][1]);
    } else {
      page["items"].push_back(all["items"][0]);
      page["nextPageToken"] = "n2";
    }
    res.set_content(page.dump(), "application/json");
  });
  ASSERT_EQ(ListNodes(Options(OutputFormat::kJson), out_, err_), 0) << err_.str();
  EXPECT_EQ(out_.str(), all.dump(2) + "\n");
  EXPECT_EQ(server_.requests().size(), 2u);
}

TEST_F(ClientCommandTest, GetNodeTable) {
  server_.On("GET", "/api/v1/nodes/node-1", 200, Json::parse(kNodes)["items"][0].dump());
  ASSERT_EQ(GetNode(Options(), "node-1", out_, err_), 0) << err_.str();
  EXPECT_EQ(out_.str(),
            "Name:             node-1\n"
            "State:            ready\n"
            "Cordoned:         no\n"
            "Draining:         no\n"
            "Labels:           zone=a\n"
            "Last heartbeat:   2026-12-02T14:04:58.000Z\n"
            "Capacity:         cpu=64,memory=512Gi,gpus=8,gpuShare=8000\n"
            "Free:             cpu=60,memory=500Gi,gpuShare=7750\n"
            "\n"
            "INDEX   MODEL       MEMORY   HEALTHY   MIG   FREE-SHARE   FREE-MEM   TASKS\n"
            "0       A100-80GB   80Gi     yes       no    750          70Gi       j-000000000001[0]:250\n"
            "1       A100-80GB   80Gi     no        yes   1000         80Gi       -\n");
}

TEST_F(ClientCommandTest, NodeActionsPostToTheirPaths) {
  const std::string node = Json::parse(kNodes)["items"][0].dump();
  server_.On("POST", "/api/v1/nodes/node-1/cordon", 200, node);
  server_.On("POST", "/api/v1/nodes/node-1/uncordon", 200, node);
  server_.On("POST", "/api/v1/nodes/node-1/drain", 200, node);
  ASSERT_EQ(ChangeNode(Options(), NodeAction::kCordon, "node-1", out_, err_), 0) << err_.str();
  ASSERT_EQ(ChangeNode(Options(), NodeAction::kUncordon, "node-1", out_, err_), 0) << err_.str();
  ASSERT_EQ(ChangeNode(Options(), NodeAction::kDrain, "node-1", out_, err_), 0) << err_.str();
  EXPECT_EQ(out_.str(), "node node-1 cordoned\nnode node-1 uncordoned\nnode node-1 draining\n");
  const auto reqs = server_.requests();
  ASSERT_EQ(reqs.size(), 3u);
  for (const Recorded& r : reqs) EXPECT_EQ(r.method, "POST");

  server_.On("POST", "/api/v1/nodes/node-1/drain", 403,
             R"({"error": {"code": "PermissionDenied", "message": "role tenant may not drain nodes"}})");
  EXPECT_EQ(ChangeNode(Options(), NodeAction::kDrain, "node-1", out_, err_), 4);
  EXPECT_EQ(err_.str(), "gpupool: role tenant may not drain nodes\n");
}

// ---- queues -----------------------------------------------------------------------------

TEST_F(ClientCommandTest, QueuesTableJsonYaml) {
  server_.On("GET", "/api/v1/queues", 200, kQueues);
  ASSERT_EQ(ListQueues(Options(), out_, err_), 0) << err_.str();
  EXPECT_EQ(
      out_.str(),
      "NAME      PARENT    WEIGHT   GUARANTEED                  LIMIT    USED                            "
      "PENDING   RUNNING\n"
      "default   -         1        -                           -        cpu=1,memory=1Gi,gpu=0          "
      "1         0\n"
      "vision    default   2.5      cpu=64,memory=512Gi,gpu=8   gpu=16   cpu=2.5,memory=8.5Gi,gpu=2.25   "
      "0         1\n");
  out_.str("");
  ASSERT_EQ(ListQueues(Options(OutputFormat::kJson), out_, err_), 0) << err_.str();
  EXPECT_EQ(out_.str(), Json::parse(kQueues).dump(2) + "\n");
  out_.str("");
  ASSERT_EQ(ListQueues(Options(OutputFormat::kYaml), out_, err_), 0) << err_.str();
  EXPECT_EQ(out_.str(),
            "items:\n"
            "  - name: default\n"
            "    parent: \"\"\n"
            "    weight: 1\n"
            "    guaranteed: {}\n"
            "    limit: {}\n"
            "    used:\n"
            "      cpu: \"1\"\n"
            "      memory: \"1Gi\"\n"
            "      gpu: 0\n"
            "    pending: 1\n"
            "    running: 0\n"
            "  - name: vision\n"
            "    parent: default\n"
            "    weight: 2.5\n"
            "    guaranteed:\n"
            "      cpu: \"64\"\n"
            "      memory: \"512Gi\"\n"
            "      gpu: 8\n"
            "    limit:\n"
            "      gpu: 16\n"
            "    used:\n"
            "      cpu: \"2.5\"\n"
            "      memory: \"8.5Gi\"\n"
            "      gpu: 2.25\n"
            "    pending: 0\n"
            "    running: 1\n");
}

TEST_F(ClientCommandTest, GetQueueTable) {
  server_.On("GET", "/api/v1/queues/vision", 200, Json::parse(kQueues)["items"][1].dump());
  ASSERT_EQ(GetQueue(Options(), "vision", out_, err_), 0) << err_.str();
  EXPECT_EQ(out_.str(),
            "Name:         vision\n"
            "Parent:       default\n"
            "Weight:       2.5\n"
            "Guaranteed:   cpu=64,memory=512Gi,gpu=8\n"
            "Limit:        gpu=16\n"
            "Used:         cpu=2.5,memory=8.5Gi,gpu=2.25\n"
            "Pending:      0\n"
            "Running:      1\n");
}

TEST_F(ClientCommandTest, CreateQueueSendsTheFields) {
  server_.On("POST", "/api/v1/queues", [](const httplib::Request& req, httplib::Response& res) {
    res.status = 201;
    res.set_content(req.body, "application/json");
  });
  QueueOptions q;
  q.name = "vision";
  q.parent = "default";
  q.weight = 2;
  q.guaranteed = "cpu=64, memory=512Gi,gpu=8";
  q.limit = "gpu=2.5";
  ASSERT_EQ(CreateQueue(Options(), q, out_, err_), 0) << err_.str();
  EXPECT_EQ(out_.str(), "queue vision created\n");
  const Recorded r = server_.requests().at(0);
  EXPECT_EQ(r.content_type, "application/json");
  EXPECT_EQ(r.body, R"({"name":"vision","parent":"default","weight":2,)"
                    R"("guaranteed":{"cpu":"64","memory":"512Gi","gpu":8},"limit":{"gpu":2.5}})");

  QueueOptions minimal;
  minimal.name = "bare";
  ASSERT_EQ(CreateQueue(Options(), minimal, out_, err_), 0) << err_.str();
  EXPECT_EQ(server_.requests().at(1).body, R"({"name":"bare"})");

  server_.On(
      "POST", "/api/v1/queues", 409,
      R"({"error": {"code": "FailedPrecondition", "field": "name", "message": "queue vision exists"}})");
  EXPECT_EQ(CreateQueue(Options(), q, out_, err_), 6);
  EXPECT_EQ(err_.str(), "gpupool: name: queue vision exists\n");
}

TEST_F(ClientCommandTest, QueueAccessRulesAndPendingCapsAreSent) {
  server_.On("POST", "/api/v1/queues", [](const httplib::Request& req, httplib::Response& res) {
    res.status = 201;
    res.set_content(req.body, "application/json");
  });
  QueueOptions q;
  q.name = "vision";
  q.tenants = "vision, nlp";
  q.max_priority = "-5";
  q.allowed_qos = "burstable,best-effort";
  q.max_pending_jobs = "100";
  q.max_pending_tasks = "";
  ASSERT_EQ(CreateQueue(Options(), q, out_, err_), 0) << err_.str();
  const Json sent = Json::parse(server_.requests().at(0).body);
  EXPECT_EQ(sent["tenants"], Json({"vision", "nlp"}));
  EXPECT_EQ(sent["maxPriority"], -5);
  EXPECT_EQ(sent["allowedQos"], Json({"burstable", "best-effort"}));
  EXPECT_EQ(sent["maxPendingJobs"], 100);
  EXPECT_TRUE(sent["maxPendingTasks"].is_null());

  server_.On("GET", "/api/v1/queues/vision", 200,
             R"({"name": "vision", "weight": 1, "tenants": ["vision"], "maxPriority": 10})");
  server_.On("PUT", "/api/v1/queues/vision", [](const httplib::Request& req, httplib::Response& res) {
    res.set_content(req.body, "application/json");
  });
  QueueOptions open;
  open.name = "vision";
  open.tenants = "";  // lift the rule, keep the others
  ASSERT_EQ(UpdateQueue(Options(), open, out_, err_), 0) << err_.str();
  const Json put = Json::parse(server_.requests().back().body);
  EXPECT_TRUE(put.contains("tenants") && put["tenants"].is_null()) << put.dump();
  EXPECT_EQ(put["maxPriority"], 10);

  QueueOptions bad;
  bad.name = "x";
  bad.max_priority = "high";
  err_.str("");
  EXPECT_EQ(CreateQueue(Options(), bad, out_, err_), 2);
  EXPECT_NE(err_.str().find("--max-priority must be a whole number"), std::string::npos) << err_.str();
}

TEST_F(ClientCommandTest, BadResourceFlagsAreUsageErrors) {
  for (const char* text : {"cpu", "cpu=", "=4", "gpu=two", "gpu=1,gpu=2", "cpu=1,,gpu=2", "gpu=inf"}) {
    QueueOptions q;
    q.name = "x";
    q.guaranteed = text;
    err_.str("");
    EXPECT_EQ(CreateQueue(Options(), q, out_, err_), 2) << text;
    EXPECT_EQ(err_.str().rfind("gpupool: --guaranteed '", 0), 0u) << err_.str();
  }
  EXPECT_TRUE(server_.requests().empty());
}

TEST_F(ClientCommandTest, UpdateQueueKeepsTheFieldsNotGiven) {
  server_.On("GET", "/api/v1/queues/vision", 200, Json::parse(kQueues)["items"][1].dump());
  server_.On("PUT", "/api/v1/queues/vision", [](const httplib::Request& req, httplib::Response& res) {
    res.set_content(req.body, "application/json");
  });
  QueueOptions q;
  q.name = "vision";
  q.weight = 3;
  q.limit = "";
  ASSERT_EQ(UpdateQueue(Options(), q, out_, err_), 0) << err_.str();
  EXPECT_EQ(out_.str(), "queue vision updated\n");
  const auto reqs = server_.requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[1].method, "PUT");
  EXPECT_EQ(reqs[1].body, R"({"weight":3,"guaranteed":{"cpu":"64","memory":"512Gi","gpu":8},"limit":{}})");

  QueueOptions nothing;
  nothing.name = "vision";
  EXPECT_EQ(UpdateQueue(Options(), nothing, out_, err_), 2);
  EXPECT_EQ(server_.requests().size(), 2u);

  QueueOptions missing;
  missing.name = "nope";
  missing.weight = 1;
  EXPECT_EQ(UpdateQueue(Options(), missing, out_, err_), 3);
}

// ---- the CLI11 wiring ---------------------------------------------------------------------

// Runs `gpupool args...` through RegisterClientCommands with std::cout/std::cerr captured.
struct CliRun {
  int exit = -1;
  std::string out;
  std::string err;
};

CliRun RunCli(std::vector<std::string> args) {
  CLI::App app{"gpupool"};
  app.require_subcommand(1);
  CliRun run;
  RegisterClientCommands(app, &run.exit);
  args.insert(args.begin(), "gpupool");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  std::streambuf* old_out = std::cout.rdbuf(out.rdbuf());
  std::streambuf* old_err = std::cerr.rdbuf(err.rdbuf());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    run.exit = 100 + e.get_exit_code();  // marks a parse error
  }
  std::cout.rdbuf(old_out);
  std::cerr.rdbuf(old_err);
  run.out = out.str();
  run.err = err.str();
  return run;
}

TEST_F(ClientCommandTest, CliRunsOneCommand) {
  server_.On("GET", "/api/v1/nodes", 200, kNodes);
  server_.On("GET", "/api/v1/nodes/node-1", 200, Json::parse(kNodes)["items"][0].dump());

  CliRun r = RunCli({"nodes", "--server", server_.url(), "--token", "t", "-o", "json"});
  EXPECT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(r.out, Json::parse(kNodes).dump(2) + "\n");

  // `nodes get` shows the node and does not list as well; options work before and after it.
  r = RunCli({"nodes", "-o", "yaml", "get", "node-1", "--server", server_.url(), "--token", "t"});
  EXPECT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(r.out.rfind("name: node-1\n", 0), 0u) << r.out;
  const auto reqs = server_.requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[1].path, "/api/v1/nodes/node-1");
  EXPECT_EQ(reqs[1].authorization, "Bearer t");
}

TEST_F(ClientCommandTest, CliListAndQueueFlags) {
  AnswerJobPages(server_);
  CliRun r = RunCli({"list", "--server", server_.url(), "--token", "t", "--state", "running", "--state",
                     "pending", "--limit", "2", "--all"});
  EXPECT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(server_.requests().size(), 2u);
  EXPECT_EQ(server_.requests()[0].params.at("state"), "running,pending");

  server_.On("GET", "/api/v1/queues/vision", 200, Json::parse(kQueues)["items"][1].dump());
  server_.On("PUT", "/api/v1/queues/vision", [](const httplib::Request& req, httplib::Response& res) {
    res.set_content(req.body, "application/json");
  });
  r = RunCli({"queues", "update", "vision", "--server", server_.url(), "--guaranteed", ""});
  EXPECT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(server_.requests().back().body, R"({"weight":2.5,"guaranteed":{},"limit":{"gpu":16}})");

  r = RunCli({"queues", "update", "vision", "--server", server_.url()});
  EXPECT_EQ(r.exit, 2);
  EXPECT_EQ(r.err,
            "gpupool: nothing to update: give --weight, --guaranteed, --limit, --tenants, --max-priority, "
            "--allowed-qos, --max-pending-jobs or --max-pending-tasks\n");

  server_.On("POST", "/api/v1/queues", [](const httplib::Request& req, httplib::Response& res) {
    res.status = 201;
    res.set_content(req.body, "application/json");
  });
  r = RunCli({"queues", "create", "q2", "--server", server_.url(), "--weight", "0.5", "--limit", "gpu=4"});
  EXPECT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(server_.requests().back().body, R"({"name":"q2","weight":0.5,"limit":{"gpu":4}})");
}

TEST_F(ClientCommandTest, TokenFlagWarnsOnStderr) {
  server_.On("GET", "/api/v1/nodes", 200, kNodes);
  CliRun r = RunCli({"nodes", "--server", server_.url(), "--token", "tok"});
  EXPECT_EQ(r.exit, 0) << r.err;
  EXPECT_NE(r.err.find("warning: --token on the command line is visible"), std::string::npos) << r.err;
  TempDir dir;
  r = RunCli({"nodes", "--server", server_.url(), "--token-file", dir.Write("t", "tok\n")});
  EXPECT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
}

TEST(CliTest, UsageErrorsAreParseErrors) {
  EXPECT_GE(RunCli({"nodes", "-o", "xml"}).exit, 100);
  EXPECT_GE(RunCli({"get"}).exit, 100);
  EXPECT_GE(RunCli({"list", "--limit", "0"}).exit, 100);
  EXPECT_GE(RunCli({"submit"}).exit, 100);
  EXPECT_GE(RunCli({"queues", "update"}).exit, 100);
}

TEST(CliTest, BadServerFlagIsExitTwo) {
  const CliRun r = RunCli({"queues", "--server", "ftp://nowhere"});
  EXPECT_EQ(r.exit, 2);
  EXPECT_EQ(r.err, "gpupool: server address 'ftp://nowhere': the scheme must be http or https\n");
}

}  // namespace
}  // namespace gpupool
