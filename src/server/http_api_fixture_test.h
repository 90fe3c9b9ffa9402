// The fixture of the REST API tests (http_api_test.cc, agent_watch_test.cc): a PoolService behind
// HttpApi on an ephemeral port, over a store in a temporary directory; calls over real HTTP.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>
#include <stdlib.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "server/http_api.h"
#include "server/service.h"
#include "store/sqlite_store.h"

namespace gpupool::testing_api {

using nlohmann::json;

inline constexpr char kAdminToken[] = "admin-token-0123456789";
inline constexpr char kVisionToken[] = "vision-token-0123456789";
inline constexpr char kNlpToken[] = "nlp-token-0123456789abc";
inline constexpr char kAgentToken[] = "agent-token-0123456789";
inline constexpr size_t kMaxBody = 16 * 1024;

struct Reply {
  int status = 0;  // 0: no HTTP answer at all
  std::string raw;
  std::string content_type;
  std::string retry_after;
  json body;
};

// One HTTP call on a fresh connection. `token` "" sends no Authorization header.
inline Reply Call(int port, const std::string& method, const std::string& path, const std::string& token,
           const std::string& body = "", const std::string& content_type = "application/json") {
  httplib::Client cli("127.0.0.1", port);
  cli.set_connection_timeout(5, 0);
  cli.set_read_timeout(30, 0);
  cli.set_tcp_nodelay(true);
  httplib::Headers headers;
  if (!token.empty()) headers.emplace("Authorization", std::string("Bearer ") + token);
  auto send = [&]() -> httplib::Result {
    if (method == "GET") return cli.Get(path, headers);
    if (method == "PUT") return cli.Put(path, headers, body, content_type);
    if (method == "DELETE") return cli.Delete(path, headers);
    if (body.empty() && content_type.empty()) return cli.Post(path, headers);
    return cli.Post(path, headers, body, content_type);
  };
  httplib::Result r = send();
  Reply out;
  if (!r) return out;
  out.status = r->status;
  out.raw = r->body;
  out.content_type = r->get_header_value("Content-Type");
  out.retry_after = r->get_header_value("Retry-After");
  out.body = json::parse(r->body, nullptr, false);
  return out;
}

// A 4xx (or 5xx) answer in the error shape: {"error": {"code", "message", "field"?}}. `field` ""
// checks only that a field, when present, is a non-empty string.
inline ::testing::AssertionResult IsError(const Reply& r, int status, const std::string& code,
                                   const std::string& field = "") {
  if (r.status != status)
    return ::testing::AssertionFailure() << "status " << r.status << ", want " << status << ": " << r.raw;
  if (r.content_type.rfind("application/json", 0) != 0)
    return ::testing::AssertionFailure() << "content type '" << r.content_type << "'";
  if (!r.body.is_object() || r.body.size() != 1 || !r.body.contains("error") || !r.body["error"].is_object())
    return ::testing::AssertionFailure() << "not the error shape: " << r.raw;
  const json& e = r.body["error"];
  if (e.value("code", "") != code)
    return ::testing::AssertionFailure() << "code, want " << code << ": " << r.raw;
  if (!e.contains("message") || !e["message"].is_string() || e["message"].get<std::string>().empty())
    return ::testing::AssertionFailure() << "no message: " << r.raw;
  for (auto it = e.begin(); it != e.end(); ++it) {
    if (it.key() != "code" && it.key() != "message" && it.key() != "field")
      return ::testing::AssertionFailure() << "unexpected member " << it.key() << ": " << r.raw;
  }
  if (e.contains("field") && (!e["field"].is_string() || e["field"].get<std::string>().empty()))
    return ::testing::AssertionFailure() << "empty field: " << r.raw;
  if (!field.empty() && e.value("field", "") != field)
    return ::testing::AssertionFailure() << "field, want " << field << ": " << r.raw;
  return ::testing::AssertionSuccess();
}

inline std::string OneTaskJson(const std::string& name, const std::string& resources,
                        const std::string& extra = "") {
  return R"({"name": ")" + name + "\"" + extra + R"(, "tasks": [{"name": "w", "resources": )" + resources +
         R"(, "command": ["sleep", "1"]}]})";
}

class HttpApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpupool-http-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    config_.data_dir = dir_;
    config_.profile = "bestfit";
    config_.sync_full = false;
    config_.max_body_bytes = kMaxBody;
    config_.reserve_after_seconds = 3600;
    config_.grace_period_seconds = 30;
    config_.http.workers = 4;
    config_.tokens[kAdminToken] = Principal{"", Role::kAdmin};
    config_.tokens[kVisionToken] = Principal{"vision", Role::kTenant};
    config_.tokens[kNlpToken] = Principal{"nlp", Role::kTenant};
    config_.tokens[kAgentToken] = Principal{"", Role::kAgent};
    Open();
  }
  void TearDown() override {
    Close();
    std::filesystem::remove_all(dir_);
  }
  // A new service and API over the store in dir_: what a restarted server would see.
  void Open() {
    Close();
    auto store = OpenSqliteStore({dir_ + "/gpupool.db", false});
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto service = PoolService::Open(config_, std::move(store).value());
    ASSERT_TRUE(service.ok()) << service.status().ToString();
    service_ = std::move(service).value();
    api_ = std::make_unique<HttpApi>(*service_, config_);
    auto port = api_->Start("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status().ToString();
    port_ = *port;
  }
  void Close() {
    if (api_) api_->Stop();
    api_.reset();
    service_.reset();
  }

  Reply Get(const std::string& path, const std::string& token = kAdminToken) {
    return Call(port_, "GET", path, token);
  }
  Reply Post(const std::string& path, const std::string& body, const std::string& token = kAdminToken,
             const std::string& content_type = "application/json") {
    return Call(port_, "POST", path, token, body, content_type);
  }
  Reply Put(const std::string& path, const std::string& body, const std::string& token = kAdminToken) {
    return Call(port_, "PUT", path, token, body);
  }

  // Registers a node as its agent would: with the bootstrap token the first time (the answer
  // brings the node credential), with the node credential on an agent restart (it keeps it).
  void AddNode(const std::string& name, int gpus, const std::string& token = kAgentToken) {
    json body = {{"name", name}, {"cpu", "64"}, {"memory", "512Gi"}, {"labels", {{"zone", "a"}}}};
    json g = json::array();
    for (int i = 0; i < gpus; ++i) g.push_back({{"index", i}, {"model", "A100-80GB"}});
    body["gpus"] = g;
    Reply r = Post("/api/v1/agent/register", body.dump(), token);
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["node"]["name"], name);
    if (token == kAgentToken) {
      ASSERT_TRUE(r.body.contains("credential")) << r.raw;
      creds_[name] = r.body["credential"].get<std::string>();
    } else {
      EXPECT_FALSE(r.body.contains("credential")) << r.raw;
    }
    EXPECT_EQ(r.body["heartbeatIntervalSeconds"], config_.heartbeat_interval_seconds);
  }
  std::string Submit(const std::string& body, const std::string& token = kAdminToken,
                     const std::string& content_type = "application/json") {
    Reply r = Post("/api/v1/jobs", body, token, content_type);
    EXPECT_EQ(r.status, 201) << r.raw;
    return r.status == 201 ? r.body["id"].get<std::string>() : "";
  }
  json Job(const std::string& id) {
    Reply r = Get("/api/v1/jobs/" + id);
    EXPECT_EQ(r.status, 200) << r.raw;
    return r.body;
  }
  std::string State(const std::string& id) { return Job(id).value("state", "?"); }
  // Reports a task's state as its node's agent would.
  void Report(const std::string& id, int index, const std::string& state) {
    const std::string node = Job(id)["tasks"][static_cast<size_t>(index)]["node"];
    Reply r = Post("/api/v1/agent/nodes/" + node + "/tasks/" + id + "/" + std::to_string(index) + "/status",
                   json{{"state", state}, {"exitCode", 0}}.dump(), Cred(node));
    ASSERT_EQ(r.status, 200) << r.raw;
  }
  // Every job (admin view, all pages) reduced to what must not change, and the queues.
  json Stored() {
    json jobs = json::array();
    std::string token;
    for (int page = 0; page < 100; ++page) {
      Reply r = Get("/api/v1/jobs?fields=tasks,spec&limit=100" + (token.empty() ? "" : "&pageToken=" + token));
      EXPECT_EQ(r.status, 200) << r.raw;
      if (r.status != 200) break;
      for (const json& j : r.body["items"]) {
        json tasks = json::array();
        for (const json& t : j["tasks"]) tasks.push_back({t["state"], t["node"], t["restarts"]});
        jobs.push_back({j["id"], j["name"], j["tenant"], j["queue"], j["state"], j["spec"], tasks});
      }
      if (!r.body.contains("nextPageToken")) break;
      token = r.body["nextPageToken"];
    }
    Reply queues = Get("/api/v1/queues");
    EXPECT_EQ(queues.status, 200) << queues.raw;
    Reply nodes = Get("/api/v1/nodes");
    EXPECT_EQ(nodes.status, 200) << nodes.raw;
    json node_view = json::array();
    for (const json& n : nodes.body["items"]) node_view.push_back({n["name"], n["cordoned"], n["free"]});
    return {{"jobs", jobs}, {"queues", queues.body}, {"nodes", node_view}};
  }

  // The node credential AddNode's registration answered.
  std::string Cred(const std::string& node) {
    EXPECT_TRUE(creds_.contains(node)) << node;
    return creds_[node];
  }

  std::map<std::string, std::string> creds_;
  std::string dir_;
  ServerConfig config_;
  std::unique_ptr<PoolService> service_;
  std::unique_ptr<HttpApi> api_;
  int port_ = 0;
};

}  // namespace gpupool::testing_api
