#include "server/http_api.h"

#include <fmt/format.h>
#include <sys/socket.h>

#include <cstdio>
#include <optional>
#include <sstream>

#include "api/jobspec.h"
#include "client/api_client.h"  // reads task logs from agents
#include "http/server.h"
#include "server/http_replies.h"
#include "server/node_credentials.h"

namespace gpupool {

using nlohmann::json;
using namespace http_replies;

int HttpApi::HttpStatusFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return 200;
    case StatusCode::kInvalidArgument: return 400;
    case StatusCode::kUnauthenticated: return 401;
    case StatusCode::kPermissionDenied: return 403;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kAlreadyExists:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kUnschedulable: return 409;
    case StatusCode::kResourceExhausted: return 422;
    case StatusCode::kLimitExceeded: return 429;
    case StatusCode::kIoError:
    case StatusCode::kInternal: return 500;
  }
  return 500;
}

namespace {

// The most bytes of a task log one request returns.
constexpr int64_t kMaxLogChunk = 4 << 20;

}  // namespace

namespace {
http::ServerOptions HttpOptions(const ServerConfig& c) {
  http::ServerOptions o;
  o.max_body_bytes = c.max_body_bytes;
  o.normal_workers = c.http.workers;
  o.priority_workers = c.http.priority_workers;
  o.io_threads = c.http.io_threads;
  o.request_timeout = std::chrono::seconds(c.http.request_timeout_seconds);
  o.idle_timeout = std::chrono::seconds(c.http.idle_timeout_seconds);
  o.max_connections = c.http.max_connections;
  o.max_connections_per_address = c.http.max_connections_per_address;
  o.max_queued_per_lane = c.http.max_queued_per_lane;
  o.tls.cert_file = c.tls.cert_file;
  o.tls.key_file = c.tls.key_file;
  o.tls.client_ca_file = c.tls.client_ca_file;
  return o;
}
}  // namespace

HttpApi::HttpApi(PoolService& service, ServerConfig config)
    : service_(service), config_(std::move(config)), server_(std::make_unique<http::Server>(HttpOptions(config_))) {
  Routes();
}

HttpApi::~HttpApi() {
  Stop();
}

Result<int> HttpApi::Start(const std::string& host, int port) {
  return server_->Listen(host, port);
}

void HttpApi::Stop() {
  // Agents waiting on their assignments get them now, not a dropped connection.
  service_.ReleaseWatchers();
  if (server_) server_->Stop();
  // And drops any that came in meanwhile: the service must hold nothing of a stopped server's.
  service_.ReleaseWatchers();
}

void HttpApi::Routes() {
  http::Server& s = *server_;
  constexpr http::Lane kNodeLane = http::Lane::kPriority;
  // The config's tokens by their SHA-256: a presented token is hashed and compared with every one
  // in constant time, so the answer's timing says nothing about how close a guess came.
  std::vector<std::pair<std::string, Principal>> token_hashes;
  for (const auto& [token, who] : config_.tokens) token_hashes.emplace_back(Sha256Hex(token), who);

  // Authentication: the caller's principal, or an error already written to `res`. Node
  // credentials (issued at registration) are looked up in the service.
  auto auth = [this, token_hashes](const http::Request& req,
                                   http::Response& res) -> std::optional<Principal> {
    const std::string h = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (h.size() <= prefix.size() || h.compare(0, prefix.size(), prefix) != 0) {
      SendError(res, 401, StatusCode::kUnauthenticated,
                "missing bearer token (Authorization: Bearer <token>)");
      return std::nullopt;
    }
    const std::string presented = h.substr(prefix.size());
    const std::string hash = Sha256Hex(presented);
    std::optional<Principal> found;
    for (const auto& [known, who] : token_hashes) {
      if (ConstantTimeEqual(known, hash) && !found) found = who;
    }
    if (!found) found = service_.AuthenticateNode(presented);
    if (!found) {
      SendError(res, 401, StatusCode::kUnauthenticated, "unknown token");
      return std::nullopt;
    }
    return found;
  };
  // Node-side routes: an admin, or the credential of the node in the path. The bootstrap token
  // only registers.
  auto for_node = [](const Principal& p, const std::string& node, http::Response& res) {
    if (p.role == Role::kAdmin || (p.role == Role::kNode && p.node == node)) return true;
    std::string message;
    if (p.role == Role::kNode) {
      message = fmt::format("the credential of node '{}' may not act for node '{}'", p.node, node);
    } else if (p.role == Role::kAgent) {
      message = fmt::format(
          "the bootstrap agent token may only register a node; node '{}' is served with the node credential "
          "its registration answered",
          node);
    } else {
      message = fmt::format("a {} token may not act for node '{}'", RoleName(p.role), node);
    }
    SendError(res, 403, StatusCode::kPermissionDenied, message);
    return false;
  };
  auto require = [](const Principal& p, std::initializer_list<Role> roles, http::Response& res) {
    for (Role r : roles) {
      if (p.role == r) return true;
    }
    SendError(res, 403, StatusCode::kPermissionDenied,
              fmt::format("a {} token may not do this", RoleName(p.role)));
    return false;
  };
  auto reply = [](http::Response& res, const Result<json>& r, int ok_status = 200) {
    if (r.ok()) {
      SendJson(res, ok_status, *r);
    } else {
      SendStatus(res, r.status());
    }
  };

  // Health and the node side run on their own workers: no load on the rest of the API can make a
  // healthy node look dead.
  // New work while the store's disk is below its reserve: 507, before anything is parsed or stored.
  auto store_full = [this](http::Response& res) {
    const Status st = service_.CheckStoreSpace();
    if (st.ok()) return false;
    SendError(res, 507, st.code(), st.message());
    return true;
  };

  s.Get("/healthz",
        [this](const http::Request&, http::Response& res) { SendJson(res, 200, service_.Health()); }, kNodeLane);
  s.Get("/metrics", [this](const http::Request&, http::Response& res) {
    res.set_content(service_.MetricsText() + server_->MetricsText("gpupool_http"),
                    "text/plain; version=0.0.4; charset=utf-8");
  });

  // ?wait=S&since=VERSION on a GET: a long poll (docs/api.md#long-polls). `watch` answers the view
  // now, or nothing after registering the watcher; the deferred answer is 304 after S seconds.
  using WatchFn = std::function<Result<std::optional<json>>(const std::string& since, std::shared_ptr<Watcher>)>;
  auto long_poll = [](const http::Request& req, http::Response& res, const WatchFn& watch) {
    const std::string wait_text = req.get_param_value("wait");
    int wait_s = -1;
    if (!wait_text.empty() && wait_text.size() <= 3 && wait_text.find_first_not_of("0123456789") == std::string::npos)
      wait_s = std::stoi(wait_text);
    if (wait_s < 0 || wait_s > HttpApi::kMaxWaitSeconds) {
      return SendError(res, 400, StatusCode::kInvalidArgument,
                       fmt::format("wait: must be whole seconds from 0 to {}", HttpApi::kMaxWaitSeconds), "wait");
    }
    const std::string since = req.get_param_value("since");
    if (since.size() > 64) return SendError(res, 400, StatusCode::kInvalidArgument, "since: longer than 64 characters", "since");
    http::Response unchanged;
    unchanged.status = 304;
    auto responder = res.Defer(std::chrono::seconds(wait_s), std::move(unchanged));
    auto now = watch(since, std::make_shared<ResponderWatcher>(responder));
    if (now.ok() && !now->has_value()) return;  // waits
    http::Response answer;
    if (now.ok()) {
      SendJson(answer, 200, **now);
    } else {
      SendStatus(answer, now.status());
    }
    responder->Send(std::move(answer));
  };

  // ---- jobs ----
  s.Post("/api/v1/jobs", [=, this](const http::Request& req, http::Response& res) {
    auto who = auth(req, res);
    if (!who || !require(*who, {Role::kAdmin, Role::kTenant}, res) || store_full(res)) return;
    const std::string ct = MediaType(req);
    SpecFormat format;
    if (ct == "application/json") {
      format = SpecFormat::kJson;
    } else if (ct == "application/yaml" || ct == "text/yaml" || ct == "application/x-yaml" ||
               ct == "text/x-yaml") {
      format = SpecFormat::kYaml;
    } else if (ct.empty()) {
      // No content type: JSON when it looks like JSON, YAML otherwise.
      const auto first = req.body.find_first_not_of(" \t\r\n");
      format = first != std::string::npos && (req.body[first] == '{') ? SpecFormat::kJson : SpecFormat::kYaml;
    } else {
      SendError(
          res, 415, StatusCode::kInvalidArgument,
          fmt::format("content type '{}' is not supported (use application/json or application/yaml)", ct));
      return;
    }
    reply(res, service_.SubmitJob(*who, req.body, format), 201);
  });
  s.Get("/api/v1/jobs", [=, this](const http::Request& req, http::Response& res) {
    auto who = auth(req, res);
    if (!who) return;
    ListJobsQuery q;
    for (const auto& [k, v] : req.params) {
      if (k != "state" && k != "tenant" && k != "queue" && k != "limit" && k != "pageToken" && k != "fields") {
        SendStatus(res, Status::InvalidArgument(
                            k + ": unknown query parameter (known: state, tenant, queue, limit, pageToken, fields)"));
        return;
      }
    }
    // Items are summaries; fields=tasks and fields=spec add each job's tasks and spec.
    for (const auto& f : SplitParams(req, "fields")) {
      if (f == "tasks") {
        q.with_tasks = true;
      } else if (f == "spec") {
        q.with_spec = true;
      } else {
        SendStatus(res, Status::InvalidArgument(fmt::format("fields: unknown field '{}' (tasks, spec)", f.substr(0, 40))));
        return;
      }
    }
    q.states = SplitParams(req, "state");
    for (const auto& st : q.states) {
      if (st != "pending" && st != "running" && st != "succeeded" && st != "failed" && st != "cancelled") {
        SendStatus(res,
                   Status::InvalidArgument(fmt::format(
                       "state: unknown state '{}' (pending, running, succeeded, failed, cancelled)", st)));
        return;
      }
    }
    q.tenants = SplitParams(req, "tenant");
    q.queues = SplitParams(req, "queue");
    auto limit = IntParam(req, "limit", 100, 1,
                          q.with_tasks || q.with_spec ? PoolService::kMaxDetailedPage : PoolService::kMaxListLimit);
    if (!limit.ok()) return SendStatus(res, limit.status());
    auto token = IntParam(req, "pageToken", 0, 0, INT64_MAX);
    if (!token.ok()) return SendStatus(res, token.status());
    q.limit = static_cast<int>(*limit);
    q.after_seq = static_cast<uint64_t>(*token);
    reply(res, service_.ListJobs(*who, q));
  });
  s.Get(R"(/api/v1/jobs/([^/]+))", [=, this](const http::Request& req, http::Response& res) {
    auto who = auth(req, res);
    if (!who) return;
    if (!req.has_param("wait")) return reply(res, service_.GetJob(*who, req.matches[1]));
    const std::string id = req.matches[1];
    long_poll(req, res, [&](const std::string& since, std::shared_ptr<Watcher> w) {
      return service_.WatchJob(*who, id, since, std::move(w));
    });
  });
  auto cancel = [=, this](const http::Request& req, http::Response& res) {
    auto who = auth(req, res);
    if (!who || !require(*who, {Role::kAdmin, Role::kTenant}, res)) return;
    reply(res, service_.CancelJob(*who, req.matches[1]));
  };
  s.Post(R"(/api/v1/jobs/([^/]+)/cancel)", cancel);
  s.Delete(R"(/api/v1/jobs/([^/]+))", cancel);
  s.Get(R"(/api/v1/jobs/([^/]+)/events)", [=, this](const http::Request& req, http::Response& res) {
    auto who = auth(req, res);
    if (!who) return;
    auto after = IntParam(req, "after", 0, 0, INT64_MAX);
    if (!after.ok()) return SendStatus(res, after.status());
    auto limit = IntParam(req, "limit", 100, 1, 1000);
    if (!limit.ok()) return SendStatus(res, limit.status());
    reply(res, service_.JobEvents(*who, req.matches[1], *after, static_cast<int>(*limit)));
  });

  // A task's stdout or stderr, read from the agent of the node it (last) ran on. Byte ranges:
  // `offset` (default 0) and `limit` (default and most 4 MiB); X-Log-Size gives the file's size, so
  // a follower asks again from offset + the bytes it got.
  s.Get(R"(/api/v1/jobs/([^/]+)/tasks/([0-9]{1,6})/logs)", [=, this](const http::Request& req,
                                                                     http::Response& res) {
    auto who = auth(req, res);
    if (!who || !require(*who, {Role::kAdmin, Role::kTenant}, res)) return;
    for (const auto& [k, v] : req.params) {
      if (k != "stream" && k != "offset" && k != "limit") {
        SendStatus(res, Status::InvalidArgument(k + ": unknown query parameter (known: stream, offset, limit)"));
        return;
      }
    }
    const std::string stream = req.has_param("stream") ? req.get_param_value("stream") : "stdout";
    if (stream != "stdout" && stream != "stderr") {
      SendStatus(res, Status::InvalidArgument(fmt::format("stream: must be stdout or stderr, got '{}'", stream)));
      return;
    }
    auto offset = IntParam(req, "offset", 0, 0, INT64_MAX);
    if (!offset.ok()) return SendStatus(res, offset.status());
    auto limit = IntParam(req, "limit", kMaxLogChunk, 1, kMaxLogChunk);
    if (!limit.ok()) return SendStatus(res, limit.status());
    auto src = service_.TaskLogSource(*who, req.matches[1], std::stoi(req.matches[2]));
    if (!src.ok()) return SendStatus(res, src.status());
    // The agent's answer is bounded like anything else from a node: the chunk asked for, in 10 s.
    ClientConfig agent_config;
    agent_config.server = src->endpoint;
    agent_config.token = src->token;
    if (src->endpoint.rfind("https://", 0) == 0) agent_config.ca_file = config_.tls.agent_ca_file;
    agent_config.connect_timeout_s = 3;
    agent_config.read_timeout_s = 10;
    agent_config.max_reply_bytes = static_cast<uint64_t>(*limit) + 4096;  // the bytes asked for, and slack
    agent_config.only_peer_addresses = true;  // whatever the node's host name resolves to
    auto agent = ApiClient::Create(agent_config);
    if (!agent.ok()) {
      SendError(res, 502, StatusCode::kIoError,
                fmt::format("node '{}' gave an agent address that is not one ({})", src->node,
                            agent.status().message()));
      return;
    }
    auto r = agent->Get(fmt::format("/tasks/{}/logs/{}", PercentEncode(src->task_id), stream),
                        {{"offset", std::to_string(*offset)}, {"limit", std::to_string(*limit)}});
    if (!r.ok()) {
      SendError(res, 502, StatusCode::kIoError,
                fmt::format("the agent of node '{}' at {} did not answer: {}", src->node, src->endpoint,
                            r.status().message()));
      return;
    }
    if (r->status == 404) {
      SendError(res, 404, StatusCode::kNotFound,
                fmt::format("node '{}' has no {} log for task {}", src->node, stream, src->task_id));
      return;
    }
    if (r->status != 200) {
      SendError(res, 502, StatusCode::kIoError,
                fmt::format("the agent of node '{}' answered {} for the log of task {}", src->node, r->status,
                            src->task_id));
      return;
    }
    // Only a log answer is passed on: whatever else the endpoint names (a node can name any
    // address its agent could serve on) does not reach the tenant.
    if (r->log_size < 0) {
      SendError(res, 502, StatusCode::kIoError,
                fmt::format("the endpoint of node '{}' at {} did not answer as an agent (no X-Log-Size)", src->node,
                            src->endpoint));
      return;
    }
    res.status = 200;
    res.set_header("X-Log-Node", src->node);
    if (r->log_offset >= 0) res.set_header("X-Log-Offset", std::to_string(r->log_offset));
    res.set_header("X-Log-Size", std::to_string(r->log_size));
    res.set_content(r->body, "text/plain; charset=utf-8");
  });

  // ---- nodes ----
  s.Get("/api/v1/nodes", [=, this](const http::Request& req, http::Response& res) {
    auto who = auth(req, res);
    if (!who || !require(*who, {Role::kAdmin, Role::kTenant}, res)) return;
    SendJson(res, 200, service_.ListNodes());
  });
  s.Get(R"(/api/v1/nodes/([^/]+))", [=, this](const http::Request& req, http::Response& res) {
    auto who = auth(req, res);
    if (!who || !require(*who, {Role::kAdmin, Role::kTenant}, res)) return;
    reply(res, service_.GetNode(req.matches[1]));
  });
  s.Post(R"(/api/v1/nodes/([^/]+)/(cordon|uncordon|drain))",
         [=, this](const http::Request& req, http::Response& res) {
           auto who = auth(req, res);
           if (!who || !require(*who, {Role::kAdmin}, res)) return;
           const std::string action = req.matches[2];
           if (action == "drain") {
             reply(res, service_.DrainNode(req.matches[1]));
           } else {
             reply(res, service_.SetCordon(req.matches[1], action == "cordon"));
           }
         });

  // ---- node credentials (admin) ----
  s.Get("/api/v1/node-credentials", [=, this](const http::Request& req, http::Response& res) {
    auto who = auth(req, res);
    if (!who || !require(*who, {Role::kAdmin}, res)) return;
    SendJson(res, 200, service_.ListNodeCredentials());
  });
  s.Delete(R"(/api/v1/node-credentials/([^/]+))", [=, this](const http::Request& req, http::Response& res) {
    auto who = auth(req, res);
    if (!who || !require(*who, {Role::kAdmin}, res)) return;
    reply(res, service_.RevokeNodeCredential(req.matches[1]));
  });

  // ---- queues ----
  s.Get("/api/v1/queues", [=, this](const http::Request& req, http::Response& res) {
    auto who = auth(req, res);
    if (!who || !require(*who, {Role::kAdmin, Role::kTenant}, res)) return;
    SendJson(res, 200, service_.ListQueues());
  });
  s.Get(R"(/api/v1/queues/([^/]+))", [=, this](const http::Request& req, http::Response& res) {
    auto who = auth(req, res);
    if (!who || !require(*who, {Role::kAdmin, Role::kTenant}, res)) return;
    reply(res, service_.GetQueue(req.matches[1]));
  });
  s.Post("/api/v1/queues", [=, this](const http::Request& req, http::Response& res) {
    auto who = auth(req, res);
    if (!who || !require(*who, {Role::kAdmin}, res) || store_full(res)) return;
    auto body = ReadJsonBody(req, res);
    if (!body) return;
    reply(res, service_.CreateQueue(*body), 201);
  });
  auto update_queue = [=, this](const http::Request& req, http::Response& res) {
    auto who = auth(req, res);
    if (!who || !require(*who, {Role::kAdmin}, res) || store_full(res)) return;
    auto body = ReadJsonBody(req, res);
    if (!body) return;
    reply(res, service_.UpdateQueue(req.matches[1], *body));
  };
  s.Put(R"(/api/v1/queues/([^/]+))", update_queue);
  s.Patch(R"(/api/v1/queues/([^/]+))", update_queue);

  // ---- node side ----
  s.Post("/api/v1/agent/register", [=, this](const http::Request& req, http::Response& res) {
    auto who = auth(req, res);
    if (!who || !require(*who, {Role::kAdmin, Role::kAgent, Role::kNode}, res)) return;
    auto body = ReadJsonBody(req, res);
    if (!body) return;
    reply(res, service_.RegisterNode(*who, *body));
  }, kNodeLane);
  s.Post(R"(/api/v1/agent/nodes/([^/]+)/heartbeat)",
         [=, this](const http::Request& req, http::Response& res) {
           auto who = auth(req, res);
           if (!who || !for_node(*who, req.matches[1], res)) return;
           auto body = ReadJsonBody(req, res);
           if (!body) return;
           reply(res, service_.Heartbeat(req.matches[1], *body));
         }, kNodeLane);
  // ?wait=S&since=VERSION: a long poll. Answered at once when the assignments are not at VERSION,
  // else when they change (pushed by the service once the change is durable), else after S seconds
  // with 304 and no body. The wait holds the connection, not a worker.
  s.Get(R"(/api/v1/agent/nodes/([^/]+)/assignments)",
        [=, this](const http::Request& req, http::Response& res) {
          auto who = auth(req, res);
          if (!who || !for_node(*who, req.matches[1], res)) return;
          if (!req.has_param("wait")) return reply(res, service_.Assignments(req.matches[1]));
          const std::string node = req.matches[1];
          long_poll(req, res, [&](const std::string& since, std::shared_ptr<Watcher> w) {
            return service_.WatchAssignments(node, since, std::move(w));
          });
        }, kNodeLane);
  s.Post(R"(/api/v1/agent/nodes/([^/]+)/reports)",
         [=, this](const http::Request& req, http::Response& res) {
           auto who = auth(req, res);
           if (!who || !for_node(*who, req.matches[1], res)) return;
           auto body = ReadJsonBody(req, res);
           if (!body) return;
           reply(res, service_.ReportTasks(req.matches[1], *body));
         }, kNodeLane);
  s.Post(R"(/api/v1/agent/nodes/([^/]+)/tasks/([^/]+)/([0-9]{1,6})/status)",
         [=, this](const http::Request& req, http::Response& res) {
           auto who = auth(req, res);
           if (!who || !for_node(*who, req.matches[1], res)) return;
           auto body = ReadJsonBody(req, res);
           if (!body) return;
           reply(res, service_.ReportTask(req.matches[1], req.matches[2], std::stoi(req.matches[3]), *body));
         }, kNodeLane);

  // Every request with a body is authenticated from its head alone, before any of the body is read:
  // without a valid token nobody can make the server buffer a byte of a body.
  s.set_pre_body_check([auth](const http::Request& req, http::Response& res) { return auth(req, res).has_value(); });
  // What the HTTP layer refuses itself (404, 405, 413, 414, 431, 400 for bytes that are not text,
  // 503 when busy, 500 when a handler threw) gets the one error shape.
  s.set_error_writer([](http::Response& res, int status, const std::string& message) {
    const StatusCode code = status == 404   ? StatusCode::kNotFound
                            : status >= 500 ? StatusCode::kInternal
                                            : StatusCode::kInvalidArgument;
    std::string field;
    if (status == 400 || status == 413) {
      const auto colon = message.find(": ");
      if (colon != std::string::npos && message.find(' ') >= colon) field = message.substr(0, colon);
    }
    SendError(res, status, code, message, field);
  });
}

}  // namespace gpupool
