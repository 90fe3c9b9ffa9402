// The REST API over real HTTP: a PoolService behind HttpApi on an ephemeral port. Bad input gets a
// 4xx with the one error shape of docs/api.md and changes nothing (in memory, nor in the store);
// the happy paths answer what docs/api.md says. Cycles are driven by RunCycle(), so every step is
// deterministic; agents are played by the test over HTTP.
#include "server/http_api.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "server/http_api_fixture_test.h"
#include "server/node_credentials.h"
#include "store/sqlite_store.h"

namespace gpupool {
namespace {

using nlohmann::json;
using namespace testing_api;

TEST_F(HttpApiTest, HealthNeedsNoTokenButJobsDo) {
  Reply health = Get("/healthz", "");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body["status"], "ok");
  EXPECT_TRUE(IsError(Get("/api/v1/jobs", ""), 401, "Unauthenticated"));
}

// Every kind of bad request answers its 4xx in the error shape, and neither memory nor the store
// changes: the job list, queues and nodes read the same afterwards, also from a reopened store,
// and the next job id follows the last one acknowledged before the bad requests.
TEST_F(HttpApiTest, BadInputIsRefusedInTheErrorShapeAndChangesNothing) {
  AddNode("n1", 2);
  ASSERT_EQ(Post("/api/v1/queues", R"({"name": "small", "limit": {"gpu": 1}})").status, 201);
  const std::string vision =
      Submit(OneTaskJson("v", R"({"cpu": "1", "memory": "1Gi", "gpu": 0.5})"), kVisionToken);
  const std::string nlp = Submit(OneTaskJson("n", R"({"cpu": "1", "memory": "1Gi", "gpu": 0.5})"), kNlpToken);
  const std::string done = Submit(OneTaskJson("d", R"({"cpu": "1"})"));
  ASSERT_EQ(Post("/api/v1/jobs/" + done + "/cancel", "", kAdminToken, "").status, 200);
  const json before = Stored();
  ASSERT_EQ(before["jobs"].size(), 3u);

  const std::string cpu1 = R"({"cpu": "1", "memory": "1Gi"})";
  struct Case {
    std::string what, method, path, token, body, content_type;
    int status;
    std::string code, field;
  };
  const std::vector<Case> cases = {
      {"malformed JSON", "POST", "/api/v1/jobs", kAdminToken, R"({"name": "x", "tasks": [)",
       "application/json", 400, "InvalidArgument", ""},
      {"malformed YAML", "POST", "/api/v1/jobs", kAdminToken,
       "name: x\ntasks: [{name: a, resources: {cpu: 1}\n", "application/yaml", 400, "InvalidArgument", ""},
      {"unknown top-level field", "POST", "/api/v1/jobs", kAdminToken,
       OneTaskJson("x", cpu1, R"(, "colour": "red")"), "application/json", 400, "InvalidArgument", "colour"},
      {"unknown nested field", "POST", "/api/v1/jobs", kAdminToken,
       OneTaskJson("x", R"({"cpu": "1", "vram": "8Gi"})"), "application/json", 400, "InvalidArgument",
       "tasks[0].resources.vram"},
      {"unknown field in YAML", "POST", "/api/v1/jobs", kAdminToken,
       "name: x\ntasks: [{name: a, resources: {cpu: 1}, replica: 2}]\n", "text/yaml", 400, "InvalidArgument",
       "tasks[0].replica"},
      {"negative cpu", "POST", "/api/v1/jobs", kAdminToken, OneTaskJson("x", R"({"cpu": "-1"})"),
       "application/json", 400, "InvalidArgument", "tasks[0].resources.cpu"},
      {"negative cpu number", "POST", "/api/v1/jobs", kAdminToken, OneTaskJson("x", R"({"cpu": -2})"),
       "application/json", 400, "InvalidArgument", "tasks[0].resources.cpu"},
      {"gpu 1.5", "POST", "/api/v1/jobs", kAdminToken, OneTaskJson("x", R"({"cpu": "1", "gpu": 1.5})"),
       "application/json", 400, "InvalidArgument", "tasks[0].resources.gpu"},
      {"absurd replicas", "POST", "/api/v1/jobs", kAdminToken,
       R"({"name": "x", "tasks": [{"name": "w", "replicas": 100000000, "resources": {"cpu": "1"}}]})",
       "application/json", 400, "InvalidArgument", "tasks[0].replicas"},
      {"no tasks", "POST", "/api/v1/jobs", kAdminToken, R"({"name": "x", "tasks": []})", "application/json",
       400, "InvalidArgument", "tasks"},
      {"unknown queue", "POST", "/api/v1/jobs", kAdminToken, OneTaskJson("x", cpu1, R"(, "queue": "nope")"),
       "application/json", 400, "InvalidArgument", "queue"},
      {"body over the limit", "POST", "/api/v1/jobs", kAdminToken,
       OneTaskJson("x", cpu1, R"(, "labels": {"pad": ")" + std::string(kMaxBody + 100, 'a') + "\"}"),
       "application/json", 413, "PayloadTooLarge", ""},
      {"body over the limit, queue", "POST", "/api/v1/queues", kAdminToken,
       R"({"name": ")" + std::string(kMaxBody + 100, 'q') + "\"}", "application/json", 413, "PayloadTooLarge",
       ""},
      {"text/plain job", "POST", "/api/v1/jobs", kAdminToken, OneTaskJson("x", cpu1), "text/plain", 415,
       "UnsupportedMediaType", ""},
      {"form-encoded queue", "POST", "/api/v1/queues", kAdminToken, "name=q",
       "application/x-www-form-urlencoded", 415, "UnsupportedMediaType", ""},
      {"unknown job", "GET", "/api/v1/jobs/j-999999999999", kAdminToken, "", "", 404, "NotFound", ""},
      {"cancel unknown job", "POST", "/api/v1/jobs/j-999999999999/cancel", kAdminToken, "", "", 404,
       "NotFound", ""},
      {"events of unknown job", "GET", "/api/v1/jobs/nope/events", kAdminToken, "", "", 404, "NotFound", ""},
      {"unknown node", "GET", "/api/v1/nodes/n9", kAdminToken, "", "", 404, "NotFound", ""},
      {"cordon unknown node", "POST", "/api/v1/nodes/n9/cordon", kAdminToken, "", "", 404, "NotFound", ""},
      {"unknown queue read", "GET", "/api/v1/queues/nope", kAdminToken, "", "", 404, "NotFound", ""},
      {"update unknown queue", "PUT", "/api/v1/queues/nope", kAdminToken, R"({"weight": 2})",
       "application/json", 404, "NotFound", ""},
      {"missing token", "GET", "/api/v1/jobs", "", "", "", 401, "Unauthenticated", ""},
      {"missing token, submit", "POST", "/api/v1/jobs", "", OneTaskJson("x", cpu1), "application/json", 401,
       "Unauthenticated", ""},
      {"wrong token", "GET", "/api/v1/jobs/" + vision, "not-a-token-0123456789", "", "", 401,
       "Unauthenticated", ""},
      {"wrong token, cancel", "POST", "/api/v1/jobs/" + vision + "/cancel", "admin-token-012345678", "", "",
       401, "Unauthenticated", ""},
      {"tenant reads another's job", "GET", "/api/v1/jobs/" + nlp, kVisionToken, "", "", 404, "NotFound", ""},
      {"tenant reads another's events", "GET", "/api/v1/jobs/" + nlp + "/events", kVisionToken, "", "", 404,
       "NotFound", ""},
      {"tenant cancels another's job", "POST", "/api/v1/jobs/" + nlp + "/cancel", kVisionToken, "", "", 404,
       "NotFound", ""},
      {"tenant deletes another's job", "DELETE", "/api/v1/jobs/" + nlp, kVisionToken, "", "", 404, "NotFound",
       ""},
      {"tenant submits as another tenant", "POST", "/api/v1/jobs", kVisionToken,
       OneTaskJson("x", cpu1, R"(, "tenant": "nlp")"), "application/json", 403, "PermissionDenied", ""},
      {"tenant creates a queue", "POST", "/api/v1/queues", kVisionToken, R"({"name": "mine"})",
       "application/json", 403, "PermissionDenied", ""},
      {"tenant updates a queue", "PUT", "/api/v1/queues/small", kVisionToken, R"({"weight": 5})",
       "application/json", 403, "PermissionDenied", ""},
      {"tenant cordons a node", "POST", "/api/v1/nodes/n1/cordon", kVisionToken, "", "", 403,
       "PermissionDenied", ""},
      {"tenant registers a node", "POST", "/api/v1/agent/register", kVisionToken,
       R"({"name": "n2", "cpu": "8", "memory": "8Gi"})", "application/json", 403, "PermissionDenied", ""},
      {"agent lists jobs", "GET", "/api/v1/jobs", kAgentToken, "", "", 403, "PermissionDenied", ""},
      {"agent reads a job", "GET", "/api/v1/jobs/" + vision, kAgentToken, "", "", 403, "PermissionDenied",
       ""},
      {"agent submits", "POST", "/api/v1/jobs", kAgentToken, OneTaskJson("x", cpu1), "application/json", 403,
       "PermissionDenied", ""},
      {"agent lists nodes", "GET", "/api/v1/nodes", kAgentToken, "", "", 403, "PermissionDenied", ""},
      {"limit 0", "GET", "/api/v1/jobs?limit=0", kAdminToken, "", "", 400, "InvalidArgument", "limit"},
      {"limit 1001", "GET", "/api/v1/jobs?limit=1001", kAdminToken, "", "", 400, "InvalidArgument", "limit"},
      {"limit not a number", "GET", "/api/v1/jobs?limit=ten", kAdminToken, "", "", 400, "InvalidArgument",
       "limit"},
      {"negative page token", "GET", "/api/v1/jobs?pageToken=-5", kAdminToken, "", "", 400, "InvalidArgument",
       "pageToken"},
      {"unknown state filter", "GET", "/api/v1/jobs?state=pending,sleeping", kAdminToken, "", "", 400,
       "InvalidArgument", "state"},
      {"unknown query parameter", "GET", "/api/v1/jobs?colour=red", kAdminToken, "", "", 400,
       "InvalidArgument", "colour"},
      {"events limit 0", "GET", "/api/v1/jobs/" + vision + "/events?limit=0", kAdminToken, "", "", 400,
       "InvalidArgument", "limit"},
      {"events after -1", "GET", "/api/v1/jobs/" + vision + "/events?after=-1", kAdminToken, "", "", 400,
       "InvalidArgument", "after"},
      {"cancel a cancelled job", "POST", "/api/v1/jobs/" + done + "/cancel", kAdminToken, "", "", 409,
       "FailedPrecondition", ""},
      {"delete a cancelled job", "DELETE", "/api/v1/jobs/" + done, kAdminToken, "", "", 409,
       "FailedPrecondition", ""},
      {"create an existing queue", "POST", "/api/v1/queues", kAdminToken, R"({"name": "small"})",
       "application/json", 409, "FailedPrecondition", ""},
      {"queue weight negative", "POST", "/api/v1/queues", kAdminToken, R"({"name": "q2", "weight": -1})",
       "application/json", 400, "InvalidArgument", "queue.weight"},
      {"queue unknown key", "POST", "/api/v1/queues", kAdminToken, R"({"name": "q2", "colour": "red"})",
       "application/json", 400, "InvalidArgument", "queue.colour"},
      {"queue name with a slash", "POST", "/api/v1/queues", kAdminToken, R"({"name": "a/b"})",
       "application/json", 400, "InvalidArgument", "queue.name"},
      {"queue name climbing up", "POST", "/api/v1/queues", kAdminToken, R"({"name": "../etc"})",
       "application/json", 400, "InvalidArgument", "queue.name"},
      {"queue tenant not a name", "POST", "/api/v1/queues", kAdminToken, R"({"name": "q2", "tenants": ["A B"]})",
       "application/json", 400, "InvalidArgument", "queue.tenants[0]"},
      {"list with an unknown field", "GET", "/api/v1/jobs?fields=secrets", kAdminToken, "", "", 400,
       "InvalidArgument", "fields"},
      {"list with tasks, too many", "GET", "/api/v1/jobs?fields=tasks&limit=101", kAdminToken, "", "", 400,
       "InvalidArgument", "limit"},
      {"queue malformed JSON", "POST", "/api/v1/queues", kAdminToken, R"({"name": )", "application/json", 400,
       "InvalidArgument", ""},
      {"queue parent change", "PUT", "/api/v1/queues/small", kAdminToken, R"({"parent": "default"})",
       "application/json", 400, "InvalidArgument", "queue.parent"},
      {"node with negative cpu", "POST", "/api/v1/agent/register", kAgentToken,
       R"({"name": "n2", "cpu": "-4", "memory": "8Gi"})", "application/json", 400, "InvalidArgument", "cpu"},
      {"node re-registered with another inventory", "POST", "/api/v1/agent/register", kAdminToken,
       R"({"name": "n1", "cpu": "64", "memory": "512Gi", "gpus": [{"index": 0, "model": "A100-80GB"}]})",
       "application/json", 409, "FailedPrecondition", ""},
      {"report with unknown state", "POST", "/api/v1/agent/nodes/n1/tasks/" + vision + "/0/status",
       Cred("n1"), R"({"state": "exploded"})", "application/json", 400, "InvalidArgument", "state"},
      {"report for an unplaced task", "POST", "/api/v1/agent/nodes/n1/tasks/" + vision + "/0/status",
       Cred("n1"), R"({"state": "running"})", "application/json", 409, "FailedPrecondition", ""},
      {"assignments of unknown node", "GET", "/api/v1/agent/nodes/n9/assignments", kAdminToken, "", "", 404,
       "NotFound", ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Reply r = Call(port_, c.method, c.path, c.token, c.body, c.content_type);
    EXPECT_TRUE(IsError(r, c.status, c.code, c.field));
  }

  // The queue's limit at admission: 422, naming the queue; nothing stored.
  Reply quota =
      Post("/api/v1/jobs", R"({"name": "big", "queue": "small", "tasks": [{"name": "w", "replicas": 2,
      "resources": {"cpu": "1", "memory": "1Gi", "gpu": 1}}]})",
           kVisionToken);
  EXPECT_TRUE(IsError(quota, 422, "QuotaExceeded"));
  const std::string where =
      quota.body["error"].value("field", "") + " " + quota.body["error"].value("message", "");
  EXPECT_NE(where.find("small"), std::string::npos) << quota.raw;

  EXPECT_EQ(Stored(), before);
  Open();  // a restarted server reads exactly the same from the store
  EXPECT_EQ(Stored(), before);
  const std::string next = Submit(OneTaskJson("after", cpu1));
  EXPECT_EQ(next, "j-000000000004") << "a refused submission must not take an id or a row";
}

TEST_F(HttpApiTest, SubmitsJsonAndYamlAndReadsThemBack) {
  const std::string as_json = R"({"name": "infer", "priority": 5, "tasks": [{"name": "server", "replicas": 2,
      "resources": {"cpu": "2", "memory": "8Gi", "gpu": 0.25, "gpuMemory": "10Gi"}, "command": ["python3", "serve.py"]}]})";
  const std::string as_yaml = R"(
name: infer
priority: 5
tasks:
  - name: server
    replicas: 2
    resources: {cpu: 2, memory: 8Gi, gpu: 0.25, gpuMemory: 10Gi}
    command: [python3, serve.py]
)";
  Reply j = Post("/api/v1/jobs", as_json, kVisionToken);
  ASSERT_EQ(j.status, 201) << j.raw;
  EXPECT_EQ(j.content_type.rfind("application/json", 0), 0u);
  EXPECT_EQ(j.body["id"], "j-000000000001");
  EXPECT_EQ(j.body["state"], "pending");
  EXPECT_EQ(j.body["tenant"], "vision");
  EXPECT_EQ(j.body["queue"], "default");
  EXPECT_EQ(j.body["priority"], 5);
  ASSERT_EQ(j.body["tasks"].size(), 2u);
  EXPECT_EQ(j.body["tasks"][1]["state"], "pending");
  EXPECT_FALSE(j.body["createdAt"].get<std::string>().empty());

  for (const char* type : {"application/yaml", "text/yaml", "application/yaml; charset=utf-8"}) {
    SCOPED_TRACE(type);
    Reply y = Post("/api/v1/jobs", as_yaml, kVisionToken, type);
    ASSERT_EQ(y.status, 201) << y.raw;
    EXPECT_EQ(y.body["state"], "pending");
    EXPECT_TRUE(y.body["id"].is_string());
    EXPECT_EQ(y.body["spec"], j.body["spec"]) << "the same job in YAML and JSON has one canonical spec";
  }
  // An admin may submit for a tenant.
  Reply a = Post("/api/v1/jobs", R"({"name": "x", "tenant": "nlp", "tasks": [{"name": "w"}]})");
  ASSERT_EQ(a.status, 201) << a.raw;
  EXPECT_EQ(a.body["tenant"], "nlp");

  json got = Job("j-000000000001");
  EXPECT_EQ(got["id"], "j-000000000001");
  EXPECT_EQ(got["name"], "infer");
  EXPECT_EQ(got["spec"], j.body["spec"]);
  EXPECT_EQ(got["tasks"], j.body["tasks"]);
  // The owner reads it too, the other tenant does not.
  EXPECT_EQ(Get("/api/v1/jobs/j-000000000001", kVisionToken).status, 200);
  EXPECT_TRUE(IsError(Get("/api/v1/jobs/j-000000000001", kNlpToken), 404, "NotFound"));
}

TEST_F(HttpApiTest, ListsWithFiltersAndPages) {
  ASSERT_EQ(Post("/api/v1/queues", R"({"name": "research"})").status, 201);
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    ids.push_back(Submit(
        OneTaskJson("v" + std::to_string(i), R"({"cpu": "1"})", i < 2 ? R"(, "queue": "research")" : ""),
        kVisionToken));
  }
  for (int i = 0; i < 3; ++i)
    ids.push_back(Submit(OneTaskJson("n" + std::to_string(i), R"({"cpu": "1"})"), kNlpToken));
  ASSERT_EQ(Post("/api/v1/jobs/" + ids[3] + "/cancel", "", kVisionToken, "").status, 200);

  // Pages of 3: 3 + 3 + 1, oldest first, nextPageToken absent on the last page.
  std::vector<std::string> paged;
  std::string token;
  int pages = 0;
  do {
    Reply r = Get("/api/v1/jobs?limit=3" + (token.empty() ? "" : "&pageToken=" + token));
    ASSERT_EQ(r.status, 200) << r.raw;
    ++pages;
    EXPECT_LE(r.body["items"].size(), 3u);
    for (const json& j : r.body["items"]) paged.push_back(j["id"]);
    token = r.body.contains("nextPageToken") ? r.body["nextPageToken"].get<std::string>() : "";
    ASSERT_LE(pages, 10);
  } while (!token.empty());
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(paged, ids);

  auto count = [&](const std::string& query, const std::string& who = kAdminToken) -> int {
    Reply r = Get("/api/v1/jobs?" + query, who);
    EXPECT_EQ(r.status, 200) << query << ": " << r.raw;
    return r.status == 200 ? static_cast<int>(r.body["items"].size()) : -1;
  };
  EXPECT_EQ(count("tenant=vision"), 4);
  EXPECT_EQ(count("tenant=vision,nlp"), 7);
  EXPECT_EQ(count("tenant=vision&tenant=nlp"), 7);
  EXPECT_EQ(count("tenant=nobody"), 0);
  EXPECT_EQ(count("state=cancelled"), 1);
  EXPECT_EQ(count("state=pending"), 6);
  EXPECT_EQ(count("state=pending,cancelled"), 7);
  EXPECT_EQ(count("state=running"), 0);
  EXPECT_EQ(count("queue=research"), 2);
  EXPECT_EQ(count("queue=default&tenant=vision"), 2);
  EXPECT_EQ(count("tenant=vision&state=pending"), 3);
  // A tenant sees its own jobs only, whatever it filters by.
  EXPECT_EQ(count("", kVisionToken), 4);
  EXPECT_EQ(count("tenant=nlp", kVisionToken), 0);
  EXPECT_EQ(count("limit=1000", kNlpToken), 3);
  // Filters and pages together.
  Reply first = Get("/api/v1/jobs?tenant=nlp&limit=2");
  ASSERT_EQ(first.status, 200);
  ASSERT_EQ(first.body["items"].size(), 2u);
  ASSERT_TRUE(first.body.contains("nextPageToken"));
  Reply second =
      Get("/api/v1/jobs?tenant=nlp&limit=2&pageToken=" + first.body["nextPageToken"].get<std::string>());
  ASSERT_EQ(second.status, 200);
  ASSERT_EQ(second.body["items"].size(), 1u);
  EXPECT_EQ(second.body["items"][0]["id"], ids[6]);
  EXPECT_FALSE(second.body.contains("nextPageToken"));
}

TEST_F(HttpApiTest, CancelPendingAndRunningJobs) {
  AddNode("n1", 1);
  const std::string pending = Submit(OneTaskJson("p", R"({"cpu": "1", "gpu": 4})"), kVisionToken);
  const std::string running =
      Submit(OneTaskJson("r", R"({"cpu": "1", "memory": "1Gi", "gpu": 0.5})"), kVisionToken);
  service_->RunCycle();
  ASSERT_EQ(State(running), "running");
  Report(running, 0, "running");

  Reply c = Post("/api/v1/jobs/" + pending + "/cancel", "", kVisionToken, "");
  ASSERT_EQ(c.status, 200) << c.raw;
  EXPECT_EQ(c.body["state"], "cancelled");
  EXPECT_EQ(c.body["tasks"][0]["state"], "cancelled");

  Reply d = Call(port_, "DELETE", "/api/v1/jobs/" + running, kVisionToken);
  ASSERT_EQ(d.status, 200) << d.raw;
  EXPECT_EQ(d.body["state"], "cancelled");
  EXPECT_EQ(d.body["tasks"][0]["state"], "stopping");
  Reply a = Get("/api/v1/agent/nodes/n1/assignments", Cred("n1"));
  ASSERT_EQ(a.status, 200) << a.raw;
  ASSERT_EQ(a.body["assignments"].size(), 1u);
  EXPECT_EQ(a.body["assignments"][0]["desired"], "stop");
  EXPECT_EQ(a.body["assignments"][0]["gracePeriodSeconds"], 30);
  Report(running, 0, "stopped");
  EXPECT_EQ(Job(running)["tasks"][0]["state"], "cancelled");
  EXPECT_EQ(Get("/api/v1/agent/nodes/n1/assignments", Cred("n1")).body["assignments"].size(), 0u);
  EXPECT_EQ(Get("/api/v1/nodes/n1").body["free"]["gpuShare"], 1000);
  EXPECT_TRUE(service_->CheckInvariants().ok());
}

TEST_F(HttpApiTest, EventsExplainWhyAJobIsPending) {
  AddNode("n1", 2);
  const std::string big = Submit(OneTaskJson("big", R"({"cpu": "1", "memory": "1Gi", "gpu": 4})"));
  const std::string fits = Submit(OneTaskJson("fits", R"({"cpu": "1", "memory": "1Gi", "gpu": 1})"));
  Reply before = Get("/api/v1/jobs/" + big + "/events");
  ASSERT_EQ(before.status, 200) << before.raw;
  ASSERT_TRUE(before.body.contains("pending"));
  EXPECT_EQ(before.body["pending"]["message"], "not tried yet");
  service_->RunCycle();

  Reply r = Get("/api/v1/jobs/" + big + "/events");
  ASSERT_EQ(r.status, 200) << r.raw;
  std::vector<std::string> types;
  for (const json& e : r.body["items"]) {
    types.push_back(e["type"]);
    EXPECT_TRUE(e["id"].is_number_integer());
    EXPECT_TRUE(e["time"].is_string());
  }
  EXPECT_EQ(types, (std::vector<std::string>{"Submitted", "Pending"}));
  ASSERT_TRUE(r.body.contains("pending")) << r.raw;
  const json& p = r.body["pending"];
  EXPECT_EQ(p["totalNodes"], 1);
  EXPECT_EQ(p["feasibleNodes"], 0);
  EXPECT_EQ(p["task"], json("w[0]")) << p.dump();
  ASSERT_FALSE(p["reasons"].empty()) << p.dump();
  EXPECT_EQ(p["reasons"][0]["nodes"], 1);
  ASSERT_TRUE(p["nodes"].contains("n1")) << p.dump();
  EXPECT_NE(p["nodes"]["n1"], "fits");
  EXPECT_FALSE(p["message"].get<std::string>().empty());
  EXPECT_EQ(p["message"], r.body["items"][1]["message"]);

  // A placed job has no `pending`; `after` and `limit` page the events.
  Reply placed = Get("/api/v1/jobs/" + fits + "/events", kAdminToken);
  ASSERT_EQ(placed.status, 200);
  EXPECT_FALSE(placed.body.contains("pending")) << placed.raw;
  ASSERT_EQ(placed.body["items"].size(), 2u);
  EXPECT_EQ(placed.body["items"][1]["type"], "Scheduled");
  const int64_t first_id = placed.body["items"][0]["id"];
  Reply after = Get("/api/v1/jobs/" + fits + "/events?after=" + std::to_string(first_id));
  ASSERT_EQ(after.status, 200);
  ASSERT_EQ(after.body["items"].size(), 1u);
  EXPECT_EQ(after.body["items"][0]["type"], "Scheduled");
  Reply one = Get("/api/v1/jobs/" + fits + "/events?limit=1");
  ASSERT_EQ(one.status, 200);
  ASSERT_EQ(one.body["items"].size(), 1u);
  EXPECT_EQ(one.body["items"][0]["type"], "Submitted");
}

TEST_F(HttpApiTest, NodesListGetCordonUncordonDrain) {
  AddNode("n1", 2);
  AddNode("n2", 2);
  AddNode("n1", 2, Cred("n1"));  // an agent restart: the same inventory again
  Reply list = Get("/api/v1/nodes", kVisionToken);
  ASSERT_EQ(list.status, 200) << list.raw;
  ASSERT_EQ(list.body["items"].size(), 2u);
  for (const json& n : list.body["items"]) {
    EXPECT_EQ(n["state"], "ready");
    EXPECT_EQ(n["cordoned"], false);
    EXPECT_EQ(n["capacity"]["gpus"], 2);
    EXPECT_EQ(n["capacity"]["gpuShare"], 2000);
    EXPECT_EQ(n["capacity"]["cpu"], "64");
    EXPECT_EQ(n["capacity"]["memory"], "512Gi");
    EXPECT_EQ(n["free"]["gpuShare"], 2000);
  }
  const std::string id =
      Submit(OneTaskJson("half", R"({"cpu": "2", "memory": "8Gi", "gpu": 0.5, "gpuMemory": "10Gi"})"));
  service_->RunCycle();
  const json job = Job(id);
  ASSERT_EQ(job["state"], "running");
  const std::string on = job["tasks"][0]["node"];
  const std::string other = on == "n1" ? "n2" : "n1";
  Reply node = Get("/api/v1/nodes/" + on, kNlpToken);
  ASSERT_EQ(node.status, 200) << node.raw;
  EXPECT_EQ(node.body["free"]["gpuShare"], 1500);
  EXPECT_EQ(node.body["free"]["cpu"], "62");
  ASSERT_EQ(node.body["gpus"].size(), 2u);
  const int gpu = job["tasks"][0]["gpus"][0]["index"];
  const json& g = node.body["gpus"][static_cast<size_t>(gpu)];
  EXPECT_EQ(g["model"], "A100-80GB");
  EXPECT_EQ(g["memory"], "80Gi");
  EXPECT_EQ(g["freeShare"], 500);
  EXPECT_EQ(g["freeMemory"], "70Gi");
  ASSERT_EQ(g["tasks"].size(), 1u);
  EXPECT_EQ(g["tasks"][0]["job"], id);
  EXPECT_EQ(g["tasks"][0]["share"], 500);

  // Cordon: no new placements there; uncordon: placements again.
  Reply c = Post("/api/v1/nodes/" + other + "/cordon", "", kAdminToken, "");
  ASSERT_EQ(c.status, 200) << c.raw;
  EXPECT_EQ(c.body["cordoned"], true);
  ASSERT_EQ(Post("/api/v1/nodes/" + on + "/cordon", "", kAdminToken, "").status, 200);
  const std::string blocked = Submit(OneTaskJson("blocked", R"({"cpu": "1", "memory": "1Gi", "gpu": 1})"));
  service_->RunCycle();
  EXPECT_EQ(State(blocked), "pending");
  Reply u = Post("/api/v1/nodes/" + other + "/uncordon", "", kAdminToken, "");
  ASSERT_EQ(u.status, 200) << u.raw;
  EXPECT_EQ(u.body["cordoned"], false);
  EXPECT_EQ(Get("/api/v1/nodes/" + other).body["cordoned"], false);
  service_->RunCycle();
  EXPECT_EQ(Job(blocked)["tasks"][0]["node"], other);
  ASSERT_EQ(Post("/api/v1/nodes/" + on + "/uncordon", "", kAdminToken, "").status, 200);

  // Drain: cordoned, draining, its tasks stop and their job is queued again.
  Report(id, 0, "running");
  Reply d = Post("/api/v1/nodes/" + on + "/drain", "", kAdminToken, "");
  ASSERT_EQ(d.status, 200) << d.raw;
  EXPECT_EQ(d.body["cordoned"], true);
  EXPECT_EQ(d.body["draining"], true);
  Reply a = Get("/api/v1/agent/nodes/" + on + "/assignments", Cred(on));
  ASSERT_EQ(a.status, 200);
  ASSERT_EQ(a.body["assignments"].size(), 1u);
  EXPECT_EQ(a.body["assignments"][0]["desired"], "stop");
  Report(id, 0, "stopped");
  EXPECT_EQ(State(id), "pending");
  service_->RunCycle();
  const json moved = Job(id);
  EXPECT_EQ(moved["state"], "running");
  EXPECT_EQ(moved["tasks"][0]["node"], other);
  EXPECT_EQ(moved["tasks"][0]["restarts"], 1);
  EXPECT_EQ(Get("/api/v1/nodes/" + on).body["free"]["gpuShare"], 2000);
  EXPECT_TRUE(service_->CheckInvariants().ok());
}

TEST_F(HttpApiTest, QueuesListCreateUpdate) {
  Reply list = Get("/api/v1/queues", kVisionToken);
  ASSERT_EQ(list.status, 200) << list.raw;
  ASSERT_EQ(list.body["items"].size(), 1u);
  EXPECT_EQ(list.body["items"][0]["name"], "default");

  Reply c = Post("/api/v1/queues", R"({"name": "research", "weight": 2, "guaranteed": {"gpu": 1},
                                      "limit": {"gpu": 4, "cpu": "32"}})");
  ASSERT_EQ(c.status, 201) << c.raw;
  EXPECT_EQ(c.body["name"], "research");
  EXPECT_EQ(c.body["weight"], 2.0);
  EXPECT_EQ(c.body["guaranteed"]["gpu"], 1.0);
  EXPECT_EQ(c.body["limit"]["gpu"], 4.0);
  EXPECT_EQ(c.body["pending"], 0);
  EXPECT_EQ(c.body["running"], 0);
  Reply child = Post("/api/v1/queues", R"({"name": "research-a", "parent": "research", "weight": 0.5})");
  ASSERT_EQ(child.status, 201) << child.raw;
  EXPECT_EQ(child.body["parent"], "research");

  Reply u = Put("/api/v1/queues/research", R"({"weight": 3})");
  ASSERT_EQ(u.status, 200) << u.raw;
  EXPECT_EQ(u.body["weight"], 3.0);
  EXPECT_EQ(u.body["limit"]["gpu"], 4.0) << "an update keeps what it does not name";
  Reply g = Get("/api/v1/queues/research", kNlpToken);
  ASSERT_EQ(g.status, 200) << g.raw;
  EXPECT_EQ(g.body["weight"], 3.0);

  Submit(OneTaskJson("q", R"({"cpu": "1"})", R"(, "queue": "research-a")"), kVisionToken);
  Reply all = Get("/api/v1/queues");
  ASSERT_EQ(all.status, 200);
  std::vector<std::string> names;
  for (const json& q : all.body["items"]) names.push_back(q["name"]);
  EXPECT_EQ(names, (std::vector<std::string>{"default", "research", "research-a"}));
  EXPECT_EQ(all.body["items"][2]["pending"], 1);
}

TEST_F(HttpApiTest, MetricsAndHealth) {
  AddNode("n1", 2);
  Submit(OneTaskJson("a", R"({"cpu": "1", "memory": "1Gi", "gpu": 1})"));
  Submit(OneTaskJson("b", R"({"cpu": "1", "memory": "1Gi", "gpu": 4})"));
  service_->RunCycle();
  Reply m = Get("/metrics", "");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(m.content_type.rfind("text/plain", 0), 0u) << m.content_type;
  EXPECT_NE(m.content_type.find("version=0.0.4"), std::string::npos) << m.content_type;
  for (const char* want :
       {"# TYPE gpupool_jobs gauge", "gpupool_jobs{state=\"pending\"} 1", "gpupool_jobs{state=\"running\"} 1",
        "# TYPE gpupool_placements_total counter", "gpupool_placements_total 1",
        "gpupool_preemptions_total 0", "gpupool_pool_gpus 2", "gpupool_jobs_submitted_total 2",
        "gpupool_scheduling_latency_seconds_count 1", "gpupool_queue_pending_jobs{queue=\"default\"} 1"}) {
    EXPECT_NE(m.raw.find(want), std::string::npos) << want << "\n" << m.raw;
  }
  Reply h = Get("/healthz", "");
  ASSERT_EQ(h.status, 200);
  ASSERT_TRUE(h.body.contains("store")) << h.raw;
  EXPECT_EQ(h.body["store"]["disk"]["path"], dir_);
  EXPECT_EQ(h.body["store"]["disk"]["ok"], true);
  h.body.erase("store");  // free space is the machine's
  EXPECT_EQ(h.body, (json{{"status", "ok"}, {"nodes", 1}, {"jobs", {{"pending", 1}, {"running", 1}}}}));
  // Tokens are not needed, and a bad one does not hurt.
  EXPECT_EQ(Get("/healthz", "not-a-token-0123456789").status, 200);
  EXPECT_TRUE(IsError(Get("/api/v1/no-such-thing"), 404, "NotFound"));
}

// httplib writes an answer's headers and its body in separate writes. Without TCP_NODELAY, Nagle
// holds the body back until the client acknowledges the headers, and on a kept-alive connection
// Linux delays that ACK by ~40 ms: every answer after the first few on a connection arrives
// ~40 ms late (an agent or a client that keeps its connection gets 25 answers a second). The
// server's end of the connection lives in this process; its socket option is read directly.
TEST_F(HttpApiTest, KeptAliveAnswersAreNotHeldBackByNagle) {
  httplib::Client cli("127.0.0.1", port_);
  cli.set_keep_alive(true);
  auto r = cli.Get("/healthz");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::atoi(entry.path().filename().c_str());
    sockaddr_in local{}, peer{};
    socklen_t len = sizeof local;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0 || local.sin_family != AF_INET)
      continue;
    len = sizeof peer;
    if (ntohs(local.sin_port) != port_ || ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0)
      continue;
    int on = 0;
    socklen_t on_len = sizeof on;
    ASSERT_EQ(::getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, &on_len), 0);
    EXPECT_NE(on, 0) << "the server's connection socket has Nagle on (TCP_NODELAY unset)";
    ++checked;
  }
  EXPECT_EQ(checked, 1) << "the server's end of the one connection";
}

}  // namespace
}  // namespace gpupool

namespace gpupool {
namespace {

// Plays a node agent's log endpoint (the real one is src/agent/agent.cc, exercised end to end by
// tests/e2e/up_e2e.py): serves `text` as task `task_id`'s stdout, honouring offset and limit, to
// callers that present `token`.
class LogAgent {
 public:
  // `honour_limit` false: a broken or hostile agent that sends the whole file whatever it is asked.
  LogAgent(std::string task_id, std::string text, std::string token, bool honour_limit = true)
      : task_id_(std::move(task_id)), text_(std::move(text)), token_(std::move(token)) {
    server_.Get(R"(/tasks/([^/]+)/logs/(stdout|stderr))", [this, honour_limit](const httplib::Request& req,
                                                                             httplib::Response& res) {
      if (req.get_header_value("Authorization") != "Bearer " + token_) {
        res.status = 401;
        return;
      }
      if (req.matches[1] != task_id_ || req.matches[2] != "stdout") {
        res.status = 404;
        return;
      }
      const size_t offset = std::min(text_.size(), static_cast<size_t>(std::stoull(req.get_param_value("offset"))));
      const size_t limit =
          honour_limit ? static_cast<size_t>(std::stoull(req.get_param_value("limit"))) : text_.size();
      res.set_header("X-Log-Size", std::to_string(text_.size()));
      res.set_content(text_.substr(offset, limit), "text/plain");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~LogAgent() { Stop(); }
  void Stop() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  std::string task_id_, text_, token_;
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
};

TEST_F(HttpApiTest, TaskLogsAreReadFromTheAgentOfTheNodeTheTaskRanOn) {
  constexpr char kLogToken[] = "00112233445566778899aabbccddeeff";
  json node = {{"name", "n1"}, {"cpu", "64"}, {"memory", "512Gi"}, {"gpus", {{{"index", 0}, {"model", "A100-80GB"}}}}};
  // Bad agent descriptions are refused with the field named, and register nothing.
  json bad = node;
  bad["agent"] = {{"endpoint", "ftp://127.0.0.1:1"}, {"logToken", kLogToken}};
  EXPECT_TRUE(IsError(Post("/api/v1/agent/register", bad.dump(), kAgentToken), 400, "InvalidArgument"));
  bad["agent"] = {{"endpoint", "http://127.0.0.1:1"}, {"logToken", "short"}};
  Reply r = Post("/api/v1/agent/register", bad.dump(), kAgentToken);
  EXPECT_TRUE(IsError(r, 400, "InvalidArgument"));
  EXPECT_NE(r.raw.find("agent.logToken"), std::string::npos) << r.raw;
  EXPECT_EQ(Get("/api/v1/nodes").body["items"].size(), 0u);

  const std::string pending = Submit(OneTaskJson("p", R"({"cpu": "1", "gpu": 4})"), kVisionToken);
  const std::string job = Submit(OneTaskJson("r", R"({"cpu": "1", "memory": "1Gi", "gpu": 0.5})"), kVisionToken);
  LogAgent agent(job + ".0", "hello\nworld\n", kLogToken);
  json good = node;
  good["agent"] = {{"endpoint", agent.endpoint()}, {"logToken", kLogToken}};
  Reply reg = Post("/api/v1/agent/register", good.dump(), kAgentToken);
  ASSERT_EQ(reg.status, 200) << reg.raw;
  creds_["n1"] = reg.body["credential"];
  service_->RunCycle();
  ASSERT_EQ(State(job), "running");
  Report(job, 0, "running");
  Report(job, 0, "succeeded");
  ASSERT_EQ(State(job), "succeeded");

  const std::string logs = "/api/v1/jobs/" + job + "/tasks/0/logs";
  r = Get(logs, kVisionToken);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.raw, "hello\nworld\n");
  EXPECT_EQ(Get(logs + "?offset=6", kVisionToken).raw, "world\n");
  EXPECT_EQ(Get(logs + "?offset=6&limit=3", kVisionToken).raw, "wor");
  EXPECT_EQ(Get(logs + "?offset=100", kVisionToken).raw, "");
  // Who may ask, and bad requests.
  EXPECT_TRUE(IsError(Get(logs, kNlpToken), 404, "NotFound"));  // another tenant's job
  EXPECT_TRUE(IsError(Get(logs, kAgentToken), 403, "PermissionDenied"));
  EXPECT_TRUE(IsError(Get(logs + "?stream=both"), 400, "InvalidArgument"));
  EXPECT_TRUE(IsError(Get(logs + "?offset=-1"), 400, "InvalidArgument"));
  EXPECT_TRUE(IsError(Get(logs + "?limit=0"), 400, "InvalidArgument"));
  EXPECT_TRUE(IsError(Get(logs + "?tail=5"), 400, "InvalidArgument"));
  EXPECT_TRUE(IsError(Get("/api/v1/jobs/" + job + "/tasks/1/logs"), 404, "NotFound"));
  EXPECT_TRUE(IsError(Get(logs + "?stream=stderr"), 404, "NotFound"));  // the agent has none
  EXPECT_TRUE(IsError(Get("/api/v1/jobs/" + pending + "/tasks/0/logs"), 409, "FailedPrecondition"));

  // A restarted server still knows where the finished task ran, and learns the agent's endpoint
  // again from its next heartbeat.
  Open();
  EXPECT_TRUE(IsError(Get(logs), 409, "FailedPrecondition"));
  Reply hb = Post("/api/v1/agent/nodes/n1/heartbeat", json{{"agent", good["agent"]}}.dump(), Cred("n1"));
  ASSERT_EQ(hb.status, 200) << hb.raw;
  EXPECT_EQ(Get(logs).raw, "hello\nworld\n");
  EXPECT_TRUE(IsError(Post("/api/v1/agent/nodes/n1/heartbeat", R"({"agent": {"endpoint": 5}})", Cred("n1")), 400,
                      "InvalidArgument"));

  // An agent that does not answer is the agent's problem, said so: 502.
  agent.Stop();
  r = Get(logs);
  EXPECT_TRUE(IsError(r, 502, "BadGateway"));
  EXPECT_NE(r.raw.find("n1"), std::string::npos) << r.raw;
}

// What a node may name as its log endpoint: its agent, over http or (with --tls-cert) https. Not an
// address the server would reach for no agent: the link-local range (cloud metadata services), the
// unspecified and multicast addresses; and an answer without the log protocol's X-Log-Size header
// is not relayed to the tenant, whatever service the endpoint names.
TEST_F(HttpApiTest, ALogEndpointMustBeAnAgentsAndOnlyALogAnswerIsRelayed) {
  constexpr char kLogToken[] = "00112233445566778899aabbccddeeff";
  json node = {{"name", "n1"}, {"cpu", "64"}, {"memory", "512Gi"}, {"gpus", {{{"index", 0}, {"model", "A100-80GB"}}}}};
  for (const char* bad : {"http://169.254.169.254:80", "http://169.254.0.1:9400", "http://0.0.0.0:9400",
                          "http://[fe80::1]:9400", "http://224.0.0.1:9400", "http://[::]:9400",
                          "https://169.254.169.254:443", "http://n1:0", "http://n1:99999", "http://n1",
                          "http://:9400"}) {
    json b = node;
    b["agent"] = {{"endpoint", bad}, {"logToken", kLogToken}};
    Reply r = Post("/api/v1/agent/register", b.dump(), kAgentToken);
    EXPECT_TRUE(IsError(r, 400, "InvalidArgument")) << bad << ": " << r.raw;
    EXPECT_NE(r.raw.find("agent.endpoint"), std::string::npos) << r.raw;
  }
  EXPECT_EQ(Get("/api/v1/nodes").body["items"].size(), 0u);
  int k = 0;
  for (const char* good : {"https://n1.example.com:9400", "http://10.0.0.7:9400", "http://[2001:db8::7]:9400",
                           "http://gpu-node-7:9400"}) {
    json g = node;
    g["name"] = "g" + std::to_string(k++);
    g["agent"] = {{"endpoint", good}, {"logToken", kLogToken}};
    Reply r = Post("/api/v1/agent/register", g.dump(), kAgentToken);
    EXPECT_EQ(r.status, 200) << good << ": " << r.raw;
    ASSERT_TRUE(service_->SetCordon(g["name"], true).ok());
  }

  // An endpoint that is some other HTTP service: its answer is not a log, and is not passed on.
  const std::string job = Submit(OneTaskJson("r", R"({"cpu": "1", "memory": "1Gi", "gpu": 0.5})"), kVisionToken);
  httplib::Server other;
  other.Get(R"(/.*)", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"secret": "instance credentials"})", "application/json");
  });
  const int port = other.bind_to_any_port("127.0.0.1");
  std::thread serve([&] { other.listen_after_bind(); });
  json n2 = node;
  n2["name"] = "n2";
  n2["agent"] = {{"endpoint", "http://127.0.0.1:" + std::to_string(port)}, {"logToken", kLogToken}};
  Reply reg = Post("/api/v1/agent/register", n2.dump(), kAgentToken);
  ASSERT_EQ(reg.status, 200) << reg.raw;
  creds_["n2"] = reg.body["credential"];
  service_->RunCycle();
  ASSERT_EQ(State(job), "running");
  Report(job, 0, "running");
  Reply r = Get("/api/v1/jobs/" + job + "/tasks/0/logs", kVisionToken);
  EXPECT_TRUE(IsError(r, 502, "BadGateway")) << r.raw;
  EXPECT_EQ(r.raw.find("instance credentials"), std::string::npos) << r.raw;
  other.stop();
  serve.join();
}

// A node's agent answers a log read with more than the chunk the server asked for (here the
// whole 6 MiB file): the server refuses the answer once it passes the chunk, and says so (502),
// rather than reading whatever a node sends into memory.
TEST_F(HttpApiTest, AnAgentThatAnswersMoreThanTheChunkAskedForIsRefused) {
  constexpr char kLogToken[] = "00112233445566778899aabbccddeeff";
  const std::string job = Submit(OneTaskJson("r", R"({"cpu": "1", "memory": "1Gi", "gpu": 0.5})"), kVisionToken);
  LogAgent agent(job + ".0", std::string(6 << 20, 'x'), kLogToken, /*honour_limit=*/false);
  json node = {{"name", "n1"}, {"cpu", "64"}, {"memory", "512Gi"}, {"gpus", {{{"index", 0}, {"model", "A100-80GB"}}}}};
  node["agent"] = {{"endpoint", agent.endpoint()}, {"logToken", kLogToken}};
  Reply reg = Post("/api/v1/agent/register", node.dump(), kAgentToken);
  ASSERT_EQ(reg.status, 200) << reg.raw;
  creds_["n1"] = reg.body["credential"];
  service_->RunCycle();
  ASSERT_EQ(State(job), "running");
  Report(job, 0, "running");
  const std::string logs = "/api/v1/jobs/" + job + "/tasks/0/logs";
  Reply r = Get(logs + "?limit=1024", kVisionToken);
  EXPECT_TRUE(IsError(r, 502, "BadGateway")) << r.raw.substr(0, 300);
  EXPECT_NE(r.raw.find("the answer is over"), std::string::npos) << r.raw.substr(0, 300);
  // The server goes on serving.
  EXPECT_EQ(Get("/api/v1/jobs/" + job, kVisionToken).status, 200);
}

// The store's disk guard: below store.minFreeBytes new work gets 507 with the path, the free bytes
// and the reserve, and nothing is stored; heartbeats, status reports and cancellations go on, and
// /healthz says why.
TEST_F(HttpApiTest, ALowDiskRefusesNewWorkWith507AndKeepsAgentsWorking) {
  auto free_bytes = std::make_shared<std::atomic<uint64_t>>(uint64_t{10} << 30);
  config_.store_min_free_bytes = int64_t{256} << 20;
  config_.free_space_probe = [free_bytes](const std::string&) -> Result<DiskSpace> {
    return DiskSpace{free_bytes->load(), uint64_t{100} << 30};
  };
  Open();
  AddNode("n1", 4);
  const std::string running = Submit(OneTaskJson("r", R"({"gpu": 1})"));
  service_->RunCycle();
  ASSERT_EQ(State(running), "running");
  Reply h = Get("/healthz", "");
  EXPECT_EQ(h.body["status"], "ok") << h.raw;
  EXPECT_EQ(h.body["store"]["disk"]["ok"], true) << h.raw;

  free_bytes->store(uint64_t{100} << 20);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // past the guard's 1 s cache
  const json before = Stored();
  Reply r = Post("/api/v1/jobs", OneTaskJson("x", R"({"gpu": 1})"));
  ASSERT_TRUE(IsError(r, 507, "InsufficientStorage")) << r.raw;
  const std::string msg = r.body["error"]["message"];
  EXPECT_NE(msg.find(dir_), std::string::npos) << msg;
  EXPECT_NE(msg.find("104857600 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("268435456 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("store.minFreeBytes"), std::string::npos) << msg;
  EXPECT_TRUE(IsError(Post("/api/v1/queues", R"({"name": "q2", "weight": 1})"), 507, "InsufficientStorage"));
  EXPECT_TRUE(IsError(Put("/api/v1/queues/default", R"({"name": "default", "weight": 2})"), 507, "InsufficientStorage"));
  EXPECT_EQ(Stored(), before);
  h = Get("/healthz", "");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.body["status"], "degraded") << h.raw;
  EXPECT_EQ(h.body["store"]["disk"]["ok"], false) << h.raw;
  EXPECT_EQ(h.body["store"]["disk"]["freeBytes"], uint64_t{100} << 20) << h.raw;
  EXPECT_EQ(h.body["store"]["disk"]["reserveBytes"], int64_t{256} << 20) << h.raw;
  EXPECT_NE(h.body.value("reason", "").find("store.minFreeBytes"), std::string::npos) << h.raw;

  // The running job still ends cleanly.
  ASSERT_EQ(Post("/api/v1/agent/nodes/n1/heartbeat", "{}", Cred("n1")).status, 200);
  Report(running, 0, "succeeded");
  EXPECT_EQ(State(running), "succeeded");

  // Space again: work is accepted again (after the cache).
  free_bytes->store(uint64_t{10} << 30);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_FALSE(Submit(OneTaskJson("y", R"({"gpu": 1})")).empty());
  EXPECT_EQ(Get("/healthz", "").body["status"], "ok");
}

// ---- node credentials, cluster identity, agent numbers (issue 19) ----

TEST_F(HttpApiTest, NodeCredentialsActForTheirOwnNodeOnly) {
  AddNode("n1", 2);
  AddNode("n2", 2);
  ASSERT_NE(Cred("n1"), Cred("n2"));
  EXPECT_EQ(Cred("n1").size(), 64u);
  const std::string job = Submit(OneTaskJson("a", R"({"cpu": "1", "gpu": 2})"), kVisionToken);
  service_->RunCycle();
  const std::string on = Job(job)["tasks"][0]["node"];
  const std::string other = on == "n1" ? "n2" : "n1";
  const std::string base = "/api/v1/agent/nodes/" + on;
  const std::string status = base + "/tasks/" + job + "/0/status";

  // Another node's credential: 403 naming the node, nothing changes.
  Reply r = Get(base + "/assignments", Cred(other));
  EXPECT_TRUE(IsError(r, 403, "PermissionDenied"));
  EXPECT_NE(r.raw.find("'" + on + "'"), std::string::npos) << r.raw;
  EXPECT_TRUE(IsError(Post(base + "/heartbeat", "{}", Cred(other)), 403, "PermissionDenied"));
  EXPECT_TRUE(IsError(Post(status, R"({"state": "succeeded", "exitCode": 0})", Cred(other)), 403,
                      "PermissionDenied"));
  // The bootstrap token only registers.
  EXPECT_TRUE(IsError(Get(base + "/assignments", kAgentToken), 403, "PermissionDenied"));
  EXPECT_TRUE(IsError(Post(base + "/heartbeat", "{}", kAgentToken), 403, "PermissionDenied"));
  EXPECT_TRUE(IsError(Post(status, R"({"state": "succeeded", "exitCode": 0})", kAgentToken), 403,
                      "PermissionDenied"));
  EXPECT_EQ(State(job), "running");
  EXPECT_EQ(Job(job)["tasks"][0]["state"], "assigned");
  // A node credential is no tenant or admin either.
  EXPECT_TRUE(IsError(Get("/api/v1/jobs", Cred(on)), 403, "PermissionDenied"));
  EXPECT_TRUE(IsError(Get("/api/v1/jobs/" + job, Cred(on)), 403, "PermissionDenied"));
  EXPECT_TRUE(IsError(Get("/api/v1/node-credentials", Cred(on)), 403, "PermissionDenied"));
  // Its own node: fine.
  r = Get(base + "/assignments", Cred(on));
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["assignments"].size(), 1u);
  EXPECT_TRUE(IsError(Get("/api/v1/agent/nodes/" + other + "/assignments", Cred(on)), 403, "PermissionDenied"));

  // Registration: a credential registers its own node only; the bootstrap token cannot take over
  // a ready node whose credential is live.
  json body = {{"name", other}, {"cpu", "64"}, {"memory", "512Gi"}, {"labels", {{"zone", "a"}}}};
  body["gpus"] = json::array({{{"index", 0}, {"model", "A100-80GB"}}, {{"index", 1}, {"model", "A100-80GB"}}});
  EXPECT_TRUE(IsError(Post("/api/v1/agent/register", body.dump(), Cred(on)), 403, "PermissionDenied"));
  r = Post("/api/v1/agent/register", body.dump(), kAgentToken);
  EXPECT_TRUE(IsError(r, 409, "FailedPrecondition"));
  EXPECT_NE(r.raw.find("revoke"), std::string::npos) << r.raw;
  r = Post("/api/v1/agent/register", body.dump(), Cred(other));
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_FALSE(r.body.contains("credential"));
  // Admins keep working on node routes.
  EXPECT_EQ(Get(base + "/assignments", kAdminToken).status, 200);
  Report(job, 0, "running");
  EXPECT_EQ(Job(job)["tasks"][0]["state"], "running");
}

TEST_F(HttpApiTest, AdminListsAndRevokesNodeCredentialsStoredOnlyAsHashes) {
  AddNode("n1", 1);
  AddNode("n2", 1);
  const std::string secret = Cred("n1");
  Reply list = Get("/api/v1/node-credentials");
  ASSERT_EQ(list.status, 200) << list.raw;
  ASSERT_EQ(list.body["items"].size(), 2u);
  EXPECT_EQ(list.body["items"][0]["node"], "n1");
  EXPECT_EQ(list.body["items"][0]["state"], "live");
  EXPECT_TRUE(list.body["items"][0]["created"].is_string());
  EXPECT_EQ(list.raw.find(secret), std::string::npos) << list.raw;
  EXPECT_EQ(list.raw.find(Sha256Hex(secret)), std::string::npos) << list.raw;
  EXPECT_TRUE(IsError(Get("/api/v1/node-credentials", kVisionToken), 403, "PermissionDenied"));
  EXPECT_TRUE(IsError(Get("/api/v1/node-credentials", kAgentToken), 403, "PermissionDenied"));
  ASSERT_EQ(Post("/api/v1/agent/nodes/n1/heartbeat", "{}", secret).status, 200);
  EXPECT_TRUE(Get("/api/v1/node-credentials").body["items"][0]["lastUsed"].is_string());

  // The store holds the hash, never the secret.
  Close();
  {
    auto store = OpenSqliteStore({dir_ + "/gpupool.db", false});
    ASSERT_TRUE(store.ok());
    auto snap = (*store)->Load();
    ASSERT_TRUE(snap.ok());
    bool hashed = false;
    for (const auto& [k, v] : snap->meta) {
      EXPECT_EQ(v.find(secret), std::string::npos) << k;
      hashed |= k == "node-credential/n1" && v.find(Sha256Hex(secret)) != std::string::npos;
    }
    EXPECT_TRUE(hashed);
  }
  Open();
  // The credential survives a restart.
  ASSERT_EQ(Post("/api/v1/agent/nodes/n1/heartbeat", "{}", secret).status, 200);

  EXPECT_TRUE(IsError(Call(port_, "DELETE", "/api/v1/node-credentials/n1", kVisionToken), 403, "PermissionDenied"));
  Reply d = Call(port_, "DELETE", "/api/v1/node-credentials/n1", kAdminToken);
  ASSERT_EQ(d.status, 200) << d.raw;
  EXPECT_EQ(d.body["state"], "revoked");
  EXPECT_TRUE(IsError(Call(port_, "DELETE", "/api/v1/node-credentials/n1", kAdminToken), 409, "FailedPrecondition"));
  EXPECT_TRUE(IsError(Call(port_, "DELETE", "/api/v1/node-credentials/n9", kAdminToken), 404, "NotFound"));
  EXPECT_TRUE(IsError(Post("/api/v1/agent/nodes/n1/heartbeat", "{}", secret), 401, "Unauthenticated"));
  EXPECT_EQ(Get("/api/v1/node-credentials").body["items"][0]["state"], "revoked");
  Open();  // revoked for good
  EXPECT_TRUE(IsError(Post("/api/v1/agent/nodes/n1/heartbeat", "{}", secret), 401, "Unauthenticated"));
  // The agent registers again with the bootstrap token and gets a new credential.
  AddNode("n1", 1);
  EXPECT_NE(Cred("n1"), secret);
  EXPECT_EQ(Post("/api/v1/agent/nodes/n1/heartbeat", "{}", Cred("n1")).status, 200);
  EXPECT_EQ(Get("/api/v1/node-credentials").body["items"][0]["state"], "live");
}

TEST_F(HttpApiTest, ClusterIdComesWithRegistrationAndHeartbeatAndStaysWithTheStore) {
  json body = {{"name", "n1"}, {"cpu", "8"}, {"memory", "16Gi"}};
  Reply r = Post("/api/v1/agent/register", body.dump(), kAgentToken);
  ASSERT_EQ(r.status, 200) << r.raw;
  const std::string id = r.body.value("clusterId", "");
  ASSERT_FALSE(id.empty()) << r.raw;
  const std::string cred = r.body["credential"];
  EXPECT_EQ(Post("/api/v1/agent/nodes/n1/heartbeat", "{}", cred).body.value("clusterId", ""), id);
  Open();
  EXPECT_EQ(Post("/api/v1/agent/nodes/n1/heartbeat", "{}", cred).body.value("clusterId", ""), id);
  // An agent of another cluster is refused and registers nothing.
  json other = {{"name", "n2"}, {"cpu", "8"}, {"memory", "16Gi"}, {"clusterId", "c-someotherpool"}};
  r = Post("/api/v1/agent/register", other.dump(), kAgentToken);
  EXPECT_TRUE(IsError(r, 409, "FailedPrecondition"));
  EXPECT_NE(r.raw.find(id), std::string::npos) << r.raw;
  EXPECT_EQ(Get("/api/v1/nodes").body["items"].size(), 1u);
  other["clusterId"] = id;
  EXPECT_EQ(Post("/api/v1/agent/register", other.dump(), kAgentToken).status, 200);
  // A new store is a new cluster.
  Close();
  std::filesystem::remove(dir_ + "/gpupool.db");
  Open();
  r = Post("/api/v1/agent/register", body.dump(), kAgentToken);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_NE(r.body.value("clusterId", ""), id);
  EXPECT_TRUE(IsError(Post("/api/v1/agent/nodes/n1/heartbeat", "{}", cred), 401, "Unauthenticated"));
}

TEST_F(HttpApiTest, AgentNumbersOutOfRangeAre400NamingTheField) {
  AddNode("n1", 2);
  const std::string job = Submit(OneTaskJson("a", R"({"cpu": "1", "gpu": 1})"), kVisionToken);
  service_->RunCycle();
  Report(job, 0, "running");
  const std::string hb = "/api/v1/agent/nodes/n1/heartbeat";
  const std::string status = "/api/v1/agent/nodes/n1/tasks/" + job + "/0/status";
  const json before = Stored();
  struct Case {
    std::string path, body, field;
  };
  const std::vector<Case> cases = {
      {status, R"({"state": "failed", "exitCode": 1099511627776})", "exitCode"},
      {status, R"({"state": "failed", "exitCode": -1099511627776})", "exitCode"},
      {status, R"({"state": "failed", "exitCode": 256})", "exitCode"},
      {status, R"({"state": "failed", "exitCode": 18446744073709551615})", "exitCode"},
      {status, R"({"state": "failed", "restarts": 1099511627776})", "restarts"},
      {hb, R"({"gpus": [{"index": 1099511627776, "healthy": false}]})", "gpus[0].index"},
      {hb, R"({"gpus": [{"index": -1, "healthy": false}]})", "gpus[0].index"},
      {hb, R"({"gpus": [{"index": 0}, {"index": 2, "healthy": false}]})", "gpus[1].index"},
      {hb, R"({"tasks": [{"jobId": ")" + job + R"(", "index": 0, "state": "failed", "exitCode": 1099511627776}]})",
       "tasks[0].exitCode"},
      {hb, R"({"tasks": [{"jobId": ")" + job + R"(", "index": 4294967296, "state": "failed"}]})", "tasks[0].index"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    EXPECT_TRUE(IsError(Post(c.path, c.body, Cred("n1")), 400, "InvalidArgument", c.field));
  }
  EXPECT_EQ(Stored(), before);
  EXPECT_EQ(Job(job)["tasks"][0]["state"], "running");
  // In range: fine.
  Reply r = Post(status, R"({"state": "failed", "exitCode": 255})", Cred("n1"));
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(Job(job)["tasks"][0]["exitCode"], 255);
}

TEST_F(HttpApiTest, ReportsOfAnotherRunIdAreRefusedAndRunIdsSurviveARestart) {
  AddNode("n1", 1);
  const std::string job = Submit(OneTaskJson("a", R"({"cpu": "1", "gpu": 1})"), kVisionToken);
  service_->RunCycle();
  Reply a = Get("/api/v1/agent/nodes/n1/assignments", Cred("n1"));
  ASSERT_EQ(a.status, 200) << a.raw;
  const std::string run = a.body["assignments"][0].value("runId", "");
  ASSERT_EQ(run.size(), 34u) << a.raw;  // "r-" + 128 random bits
  // Not shown to the tenant: it is the agent's business.
  EXPECT_EQ(Get("/api/v1/jobs/" + job, kVisionToken).raw.find(run), std::string::npos);
  const std::string status = "/api/v1/agent/nodes/n1/tasks/" + job + "/0/status";
  Reply r = Post(status, R"({"state": "succeeded", "exitCode": 0, "runId": "r-00000000000000000000000000000000"})",
                 Cred("n1"));
  EXPECT_TRUE(IsError(r, 409, "FailedPrecondition"));
  EXPECT_NE(r.raw.find("runId"), std::string::npos) << r.raw;
  EXPECT_TRUE(IsError(Post(status, R"({"state": "running", "runId": 5})", Cred("n1")), 400, "InvalidArgument", "runId"));
  EXPECT_EQ(Job(job)["tasks"][0]["state"], "assigned");
  Open();
  a = Get("/api/v1/agent/nodes/n1/assignments", Cred("n1"));
  ASSERT_EQ(a.status, 200) << a.raw;
  EXPECT_EQ(a.body["assignments"][0].value("runId", ""), run);
  r = Post(status, json{{"state", "running"}, {"runId", run}}.dump(), Cred("n1"));
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(Job(job)["tasks"][0]["state"], "running");
}

TEST_F(HttpApiTest, AContainerImageIsAssignedAndItsPinnedDigestIsShownStoredAndChecked) {
  AddNode("n1", 1);
  const std::string job = Submit(R"({"name": "img", "tasks": [{"name": "w", "resources": {"cpu": "1", "gpu": 1},
      "container": {"image": "oci:/srv/images/trainer:v2"}}]})",
                                 kVisionToken);
  service_->RunCycle();
  Reply a = Get("/api/v1/agent/nodes/n1/assignments", Cred("n1"));
  ASSERT_EQ(a.status, 200) << a.raw;
  EXPECT_EQ(a.body["assignments"][0].value("image", ""), "oci:/srv/images/trainer:v2") << a.raw;
  const std::string run = a.body["assignments"][0].value("runId", "");
  const std::string status = "/api/v1/agent/nodes/n1/tasks/" + job + "/0/status";
  const std::string digest = "sha256:" + std::string(64, 'c');
  // What an agent may not make the job's owner see or the store keep.
  const json before = Stored();
  for (const json& bad : {json("oci:/srv/images/trainer:v2"), json("oci:/srv/images/trainer:v2@sha256:abc"),
                          json("oci:../x@" + digest), json("oci:/srv/x\n@" + digest),
                          json("oci:/srv/images/trainer:v2@" + digest + std::string(2000, 'x')), json(7)}) {
    Reply r = Post(status, json{{"state", "running"}, {"runId", run}, {"image", bad}}.dump(), Cred("n1"));
    EXPECT_TRUE(IsError(r, 400, "InvalidArgument", "image")) << bad.dump() << " " << r.raw;
  }
  EXPECT_EQ(Stored(), before);
  EXPECT_EQ(Job(job)["tasks"][0]["state"], "assigned");
  const std::string pinned = "oci:/srv/images/trainer:v2@" + digest;
  Reply r = Post(status, json{{"state", "running"}, {"runId", run}, {"image", pinned}}.dump(), Cred("n1"));
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(Job(job)["tasks"][0].value("image", ""), pinned);
  Reply ev = Get("/api/v1/jobs/" + job + "/events", kVisionToken);
  ASSERT_EQ(ev.status, 200) << ev.raw;
  EXPECT_NE(ev.raw.find("from image " + pinned), std::string::npos) << ev.raw;
  Open();  // a restarted server still says which image runs
  EXPECT_EQ(Job(job)["tasks"][0].value("image", ""), pinned);
}

TEST_F(HttpApiTest, LimitsAnswer429AndQueueRulesAnswer403NamingTheRule) {
  config_.max_pending_jobs_per_tenant = 1;
  Open();
  const std::string cpu1 = R"({"cpu": "1", "memory": "1Gi"})";
  Submit(OneTaskJson("first", cpu1), kVisionToken);
  Reply over = Post("/api/v1/jobs", OneTaskJson("second", cpu1), kVisionToken);
  EXPECT_TRUE(IsError(over, 429, "LimitExceeded"));
  EXPECT_EQ(over.retry_after, "5");  // a client told to come back, not at once
  EXPECT_NE(over.body["error"].value("message", "").find("limits.maxPendingJobsPerTenant"), std::string::npos)
      << over.raw;

  Reply q = Post("/api/v1/queues", R"({"name": "vision-only", "tenants": ["vision"], "maxPriority": 100,
      "allowedQos": ["best-effort"]})");
  ASSERT_EQ(q.status, 201) << q.raw;
  EXPECT_EQ(q.body["tenants"], json({"vision"}));
  Reply denied = Post("/api/v1/jobs", OneTaskJson("intruder", cpu1, R"(, "queue": "vision-only")"), kNlpToken);
  EXPECT_TRUE(IsError(denied, 403, "PermissionDenied", "queue"));
  EXPECT_NE(denied.body["error"].value("message", "").find("queue.tenants"), std::string::npos) << denied.raw;
  Reply prio = Post("/api/v1/jobs",
                    OneTaskJson("greedy", cpu1, R"(, "queue": "vision-only", "priority": 1000000, "qos": "guaranteed")"),
                    kAdminToken);
  EXPECT_EQ(prio.status, 201) << "admins may submit anywhere: " << prio.raw;

  // List items are summaries: no tasks, no spec, task counts instead.
  Reply list = Get("/api/v1/jobs");
  ASSERT_EQ(list.status, 200) << list.raw;
  ASSERT_FALSE(list.body["items"].empty());
  for (const json& j : list.body["items"]) {
    EXPECT_FALSE(j.contains("tasks")) << j.dump();
    EXPECT_FALSE(j.contains("spec")) << j.dump();
    EXPECT_EQ(j["taskCounts"]["total"], 1) << j.dump();
  }
  Reply detailed = Get("/api/v1/jobs?fields=tasks,spec");
  ASSERT_EQ(detailed.status, 200) << detailed.raw;
  EXPECT_EQ(detailed.body["items"][0]["tasks"].size(), 1u);
  EXPECT_EQ(detailed.body["items"][0]["spec"]["name"], "first");
}

}  // namespace
}  // namespace gpupool
