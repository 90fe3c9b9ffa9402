#include "server/http_api.h"

#include <fmt/format.h>
#include <httplib.h>
#include <sys/socket.h>

#include <cstdio>
#include <optional>
#include <sstream>

#include "api/jobspec.h"

namespace gpupool {

using nlohmann::json;

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


std::string ErrorCodeName(int http, StatusCode code) {
  switch (http) {
    case 413: return "PayloadTooLarge";
    case 415: return "UnsupportedMediaType";
    case 502: return "BadGateway";
    case 422: return "QuotaExceeded";
    default: break;
  }
  if (code == StatusCode::kIoError) return "Internal";
  return std::string(StatusCodeName(code));
}

void SendError(httplib::Response& res, int http, StatusCode code, const std::string& message,
               const std::string& field = "") {
  json err = {{"code", ErrorCodeName(http, code)}, {"message", message}};
  if (!field.empty()) err["field"] = field;
  res.status = http;
  res.set_content(json{{"error", err}}.dump(), "application/json");
}

void SendStatus(httplib::Response& res, const Status& st) {
  const int http = HttpApi::HttpStatusFor(st.code());
  std::string field;
  if (http == 400 || http == 403 || http == 422) field = ErrorField(st);
  if (http == 403 && field.empty() && st.code() == StatusCode::kPermissionDenied) {
    // Queue access refusals say which field of the job the rule is about ("queue: ...").
    const std::string& m = st.message();
    for (const char* f : {"queue", "priority", "qos"}) {
      if (m.rfind(std::string(f) + ": ", 0) == 0) field = f;
    }
  }
  SendError(res, http, st.code(), st.message(), field);
}

void SendJson(httplib::Response& res, int http, const json& body) {
  res.status = http;
  res.set_content(body.dump(), "application/json");
}

std::string MediaType(const httplib::Request& req) {
  std::string ct = req.get_header_value("Content-Type");
  const auto semi = ct.find(';');
  if (semi != std::string::npos) ct = ct.substr(0, semi);
  while (!ct.empty() && ct.back() == ' ') ct.pop_back();
  for (char& c : ct) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ct;
}

// Parses a JSON body (empty: null), or writes the error (415 for another media type, 400 for
// malformed JSON) and returns nothing.
std::optional<json> ReadJsonBody(const httplib::Request& req, httplib::Response& res) {
  const std::string ct = MediaType(req);
  if (!ct.empty() && ct != "application/json") {
    SendError(res, 415, StatusCode::kInvalidArgument,
              fmt::format("body: content type '{}' is not supported here (use application/json)", ct));
    return std::nullopt;
  }
  if (req.body.empty()) return json(nullptr);
  json j = json::parse(req.body, nullptr, false);
  if (j.is_discarded()) {
    SendStatus(res, Status::InvalidArgument("body: malformed JSON"));
    return std::nullopt;
  }
  return j;
}

std::set<std::string> SplitParams(const httplib::Request& req, const std::string& key) {
  std::set<std::string> out;
  const size_t n = req.get_param_value_count(key);
  for (size_t i = 0; i < n; ++i) {
    std::stringstream ss(req.get_param_value(key, i));
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (!item.empty()) out.insert(item);
    }
  }
  return out;
}

Result<int64_t> IntParam(const httplib::Request& req, const std::string& key, int64_t def, int64_t lo,
                         int64_t hi) {
  if (!req.has_param(key.c_str())) return def;
  const std::string v = req.get_param_value(key.c_str());
  if (v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos)
    return Status::InvalidArgument(fmt::format("{}: must be a whole number, got '{}'", key, v));
  const int64_t x = std::stoll(v);
  if (x < lo || x > hi)
    return Status::InvalidArgument(fmt::format("{}: must be between {} and {}", key, lo, hi));
  return x;
}

}  // namespace

HttpApi::HttpApi(PoolService& service, ServerConfig config)
    : service_(service), config_(std::move(config)), server_(std::make_unique<httplib::Server>()) {
  const int threads = config_.http_threads;
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  server_->set_payload_max_length(config_.max_body_bytes);
  server_->set_keep_alive_max_count(1000);
  // Small JSON answers must not wait for the client's delayed ACK (Nagle): that alone costs ~40 ms.
  server_->set_tcp_nodelay(true);
  // A keep-alive connection holds a worker thread while open; idle ones let go soon.
  server_->set_keep_alive_timeout(2);
  server_->set_read_timeout(30, 0);
  server_->set_write_timeout(30, 0);
  Routes();
}

HttpApi::~HttpApi() {
  Stop();
}

Result<int> HttpApi::Start(const std::string& host, int port) {
  // The HTTP library listens with a backlog of 5; bursts of new connections (many clients, agents
  // reconnecting after a restart) would wait for SYN retries. Keep the listening socket and listen
  // again with a deep backlog, which Linux takes as a new backlog.
  int listen_fd = -1;
  server_->set_socket_options([&listen_fd](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listen_fd = sock;
  });
  int bound = port;
  if (port == 0) {
    bound = server_->bind_to_any_port(host.c_str());
    if (bound < 0) return Status::IoError(fmt::format("cannot listen on {}:any", host));
  } else if (!server_->bind_to_port(host.c_str(), port)) {
    return Status::IoError(
        fmt::format("cannot listen on {}:{} (in use, or not an address of this machine)", host, port));
  }
  if (listen_fd >= 0) ::listen(listen_fd, 1024);
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  for (int i = 0; i < 500 && !server_->is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  return bound;
}

void HttpApi::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

void HttpApi::Routes() {
  httplib::Server& s = *server_;
  const auto tokens = config_.tokens;

  // Authentication: the caller's principal, or an error already written to `res`.
  auto auth = [tokens](const httplib::Request& req, httplib::Response& res) -> std::optional<Principal> {
    const std::string h = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (h.size() <= prefix.size() || h.compare(0, prefix.size(), prefix) != 0) {
      SendError(res, 401, StatusCode::kUnauthenticated,
                "missing bearer token (Authorization: Bearer <token>)");
      return std::nullopt;
    }
    auto it = tokens.find(h.substr(prefix.size()));
    if (it == tokens.end()) {
      SendError(res, 401, StatusCode::kUnauthenticated, "unknown token");
      return std::nullopt;
    }
    return it->second;
  };
  auto require = [](const Principal& p, std::initializer_list<Role> roles, httplib::Response& res) {
    for (Role r : roles) {
      if (p.role == r) return true;
    }
    SendError(res, 403, StatusCode::kPermissionDenied,
              fmt::format("a {} token may not do this", RoleName(p.role)));
    return false;
  };
  auto reply = [](httplib::Response& res, const Result<json>& r, int ok_status = 200) {
    if (r.ok()) {
      SendJson(res, ok_status, *r);
    } else {
      SendStatus(res, r.status());
    }
  };

  s.Get("/healthz",
        [this](const httplib::Request&, httplib::Response& res) { SendJson(res, 200, service_.Health()); });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(service_.MetricsText(), "text/plain; version=0.0.4; charset=utf-8");
  });

  // ---- jobs ----
  s.Post("/api/v1/jobs", [=, this](const httplib::Request& req, httplib::Response& res) {
    auto who = auth(req, res);
    if (!who || !require(*who, {Role::kAdmin, Role::kTenant}, res)) return;
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
  s.Get("/api/v1/jobs", [=, this](const httplib::Request& req, httplib::Response& res) {
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
  s.Get(R"(/api/v1/jobs/([^/]+))", [=, this](const httplib::Request& req, httplib::Response& res) {
    auto who = auth(req, res);
    if (!who) return;
    reply(res, service_.GetJob(*who, req.matches[1]));
  });
  auto cancel = [=, this](const httplib::Request& req, httplib::Response& res) {
    auto who = auth(req, res);
    if (!who || !require(*who, {Role::kAdmin, Role::kTenant}, res)) return;
    reply(res, service_.CancelJob(*who, req.matches[1]));
  };
  s.Post(R"(/api/v1/jobs/([^/]+)/cancel)", cancel);
  s.Delete(R"(/api/v1/jobs/([^/]+))", cancel);
  s.Get(R"(/api/v1/jobs/([^/]+)/events)", [=, this](const httplib::Request& req, httplib::Response& res) {
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
  s.Get(R"(/api/v1/jobs/([^/]+)/tasks/([0-9]{1,6})/logs)", [=, this](const httplib::Request& req,
                                                                     httplib::Response& res) {
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
    httplib::Client agent(src->endpoint);
    agent.set_connection_timeout(3, 0);
    agent.set_read_timeout(10, 0);
    agent.set_bearer_token_auth(src->token);
    const std::string path =
        fmt::format("/tasks/{}/logs/{}?offset={}&limit={}", src->task_id, stream, *offset, *limit);
    auto r = agent.Get(path);
    if (!r) {
      SendError(res, 502, StatusCode::kIoError,
                fmt::format("the agent of node '{}' at {} did not answer: {}", src->node, src->endpoint,
                            httplib::to_string(r.error())));
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
    res.status = 200;
    res.set_header("X-Log-Node", src->node);
    for (const char* h : {"X-Log-Offset", "X-Log-Size"}) {
      if (r->has_header(h)) res.set_header(h, r->get_header_value(h));
    }
    res.set_content(r->body, "text/plain; charset=utf-8");
  });

  // ---- nodes ----
  s.Get("/api/v1/nodes", [=, this](const httplib::Request& req, httplib::Response& res) {
    auto who = auth(req, res);
    if (!who || !require(*who, {Role::kAdmin, Role::kTenant}, res)) return;
    SendJson(res, 200, service_.ListNodes());
  });
  s.Get(R"(/api/v1/nodes/([^/]+))", [=, this](const httplib::Request& req, httplib::Response& res) {
    auto who = auth(req, res);
    if (!who || !require(*who, {Role::kAdmin, Role::kTenant}, res)) return;
    reply(res, service_.GetNode(req.matches[1]));
  });
  s.Post(R"(/api/v1/nodes/([^/]+)/(cordon|uncordon|drain))",
         [=, this](const httplib::Request& req, httplib::Response& res) {
           auto who = auth(req, res);
           if (!who || !require(*who, {Role::kAdmin}, res)) return;
           const std::string action = req.matches[2];
           if (action == "drain") {
             reply(res, service_.DrainNode(req.matches[1]));
           } else {
             reply(res, service_.SetCordon(req.matches[1], action == "cordon"));
           }
         });

  // ---- queues ----
  s.Get("/api/v1/queues", [=, this](const httplib::Request& req, httplib::Response& res) {
    auto who = auth(req, res);
    if (!who || !require(*who, {Role::kAdmin, Role::kTenant}, res)) return;
    SendJson(res, 200, service_.ListQueues());
  });
  s.Get(R"(/api/v1/queues/([^/]+))", [=, this](const httplib::Request& req, httplib::Response& res) {
    auto who = auth(req, res);
    if (!who || !require(*who, {Role::kAdmin, Role::kTenant}, res)) return;
    reply(res, service_.GetQueue(req.matches[1]));
  });
  s.Post("/api/v1/queues", [=, this](const httplib::Request& req, httplib::Response& res) {
    auto who = auth(req, res);
    if (!who || !require(*who, {Role::kAdmin}, res)) return;
    auto body = ReadJsonBody(req, res);
    if (!body) return;
    reply(res, service_.CreateQueue(*body), 201);
  });
  auto update_queue = [=, this](const httplib::Request& req, httplib::Response& res) {
    auto who = auth(req, res);
    if (!who || !require(*who, {Role::kAdmin}, res)) return;
    auto body = ReadJsonBody(req, res);
    if (!body) return;
    reply(res, service_.UpdateQueue(req.matches[1], *body));
  };
  s.Put(R"(/api/v1/queues/([^/]+))", update_queue);
  s.Patch(R"(/api/v1/queues/([^/]+))", update_queue);

  // ---- node side ----
  s.Post("/api/v1/agent/register", [=, this](const httplib::Request& req, httplib::Response& res) {
    auto who = auth(req, res);
    if (!who || !require(*who, {Role::kAdmin, Role::kAgent}, res)) return;
    auto body = ReadJsonBody(req, res);
    if (!body) return;
    reply(res, service_.RegisterNode(*body));
  });
  s.Post(R"(/api/v1/agent/nodes/([^/]+)/heartbeat)",
         [=, this](const httplib::Request& req, httplib::Response& res) {
           auto who = auth(req, res);
           if (!who || !require(*who, {Role::kAdmin, Role::kAgent}, res)) return;
           auto body = ReadJsonBody(req, res);
           if (!body) return;
           reply(res, service_.Heartbeat(req.matches[1], *body));
         });
  s.Get(R"(/api/v1/agent/nodes/([^/]+)/assignments)",
        [=, this](const httplib::Request& req, httplib::Response& res) {
          auto who = auth(req, res);
          if (!who || !require(*who, {Role::kAdmin, Role::kAgent}, res)) return;
          reply(res, service_.Assignments(req.matches[1]));
        });
  s.Post(R"(/api/v1/agent/nodes/([^/]+)/tasks/([^/]+)/([0-9]{1,6})/status)",
         [=, this](const httplib::Request& req, httplib::Response& res) {
           auto who = auth(req, res);
           if (!who || !require(*who, {Role::kAdmin, Role::kAgent}, res)) return;
           auto body = ReadJsonBody(req, res);
           if (!body) return;
           reply(res, service_.ReportTask(req.matches[1], req.matches[2], std::stoi(req.matches[3]), *body));
         });

  // Anything that reached no handler, and httplib's own refusals (413), get the JSON error shape.
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) {
      SendError(res, 413, StatusCode::kInvalidArgument, "body: larger than the server's limit");
    } else if (res.status == 404) {
      SendError(res, 404, StatusCode::kNotFound,
                fmt::format("no such endpoint: {} {}", req.method, req.path));
    } else if (res.status == 405) {
      SendError(res, 405, StatusCode::kInvalidArgument,
                fmt::format("method {} not allowed on {}", req.method, req.path));
    } else {
      SendError(res, res.status, StatusCode::kInvalidArgument, "bad request");
    }
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    std::fprintf(stderr, "gpupool server: internal error: %s\n", what.c_str());
    SendError(res, 500, StatusCode::kInternal, "internal error: " + what);
  });
}

}  // namespace gpupool
