// The client commands: each one request (or a few) to the server, its answer shown the way the
// options ask (client_render.h), and an exit code. The CLI11 wiring is in client_cli.cc.
#include "cli/client_commands.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <tuple>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include "cli/client_render.h"
#include "client/api_client.h"

namespace gpupool {

using namespace cli_internal;

namespace {

// ---- requests ---------------------------------------------------------------

enum class Method { kGet, kPost, kPut, kDelete };

// The JSON body of a successful answer, or the exit code after the error went to `err`.
struct Answer {
  int exit = kExitOk;
  Json body;
};

int ExitForStatus(const Status& st) {
  switch (st.code()) {
    case StatusCode::kIoError: return kExitUnavailable;
    case StatusCode::kInvalidArgument: return kExitUsage;
    default: return kExitError;
  }
}

Answer Fail(std::ostream& err, int code, std::string_view message) {
  PrintError(err, message);
  return {code, nullptr};
}


Answer Call(const CommandOptions& options, std::ostream& err, Method method, const std::string& path,
            const QueryParams& query = {}, const std::string& body = {},
            std::string_view content_type = kJsonType) {
  Result<ApiClient> client = ApiClient::Create(options.client);
  if (!client.ok()) return Fail(err, ExitForStatus(client.status()), client.status().message());

  const std::string target = WithQuery(path, query);
  Result<HttpReply> reply = Status::Internal("no request");
  switch (method) {
    case Method::kGet: reply = client->Get(target); break;
    case Method::kPost: reply = client->Post(target, body, content_type); break;
    case Method::kPut: reply = client->Put(target, body, content_type); break;
    case Method::kDelete: reply = client->Delete(target); break;
  }
  if (!reply.ok()) return Fail(err, ExitForStatus(reply.status()), reply.status().message());

  const int code = ExitCodeForHttpStatus(reply->status);
  if (code != kExitOk) return Fail(err, code, ErrorMessage(*reply));
  if (!reply->is_json) {
    if (Trim(reply->body).empty()) return {kExitOk, Json::object()};
    return Fail(err, kExitError, fmt::format("the server's answer (HTTP {}) is not JSON", reply->status));
  }
  return {kExitOk, std::move(reply->json)};
}

// Lists: the page as it came, or with `all` every page merged into the first, without
// nextPageToken.
Answer FetchList(const CommandOptions& options, std::ostream& err, const std::string& path,
                 const QueryParams& query, std::string page_token, bool all) {
  Answer merged;
  Json items = Json::array();
  std::set<std::string> seen;
  bool first = true;
  for (;;) {
    QueryParams q = query;
    if (!page_token.empty()) q.emplace_back("pageToken", page_token);
    Answer page = Call(options, err, Method::kGet, path, q);
    if (page.exit != kExitOk) return page;
    const Json* page_items = Member(page.body, "items");
    if (page_items == nullptr || !page_items->is_array()) {
      return Fail(err, kExitError, fmt::format("the server's answer to GET {} has no items list", path));
    }
    if (!all) return page;
    for (const Json& item : *page_items) items.push_back(item);
    const std::string next = String(page.body, "nextPageToken");
    if (first) {
      merged = std::move(page);
      first = false;
    }
    if (next.empty()) break;
    if (!seen.insert(next).second) {
      return Fail(err, kExitError, fmt::format("the server repeated the page token '{}'", next));
    }
    page_token = next;
  }
  merged.body["items"] = std::move(items);
  merged.body.erase("nextPageToken");
  return merged;
}

std::string JobPath(const std::string& id) {
  return "/api/v1/jobs/" + PercentEncode(id);
}
std::string NodePath(const std::string& name) {
  return "/api/v1/nodes/" + PercentEncode(name);
}
std::string QueuePath(const std::string& name) {
  return "/api/v1/queues/" + PercentEncode(name);
}



// ---- input ------------------------------------------------------------------

// "cpu=64,memory=512Gi,gpu=8" -> {"cpu": "64", "memory": "512Gi", "gpu": 8}; "" -> {}.
// gpu is a number (fractions allowed), the others are quantities sent as strings.
Result<Json> ParseResources(std::string_view flag, std::string_view text) {
  Json map = Json::object();
  if (Trim(text).empty()) return map;
  const auto bad = [&](std::string_view why) {
    return Status::InvalidArgument(
        fmt::format("{} '{}': {} (expected e.g. cpu=64,memory=512Gi,gpu=8)", flag, text, why));
  };
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = Trim(text.substr(start, comma - start));
    start = comma + 1;
    if (item.empty()) return bad("empty item");
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) return bad(fmt::format("'{}' is not resource=quantity", item));
    const std::string key(Trim(item.substr(0, eq)));
    const std::string_view value = Trim(item.substr(eq + 1));
    if (key.empty() || value.empty()) return bad(fmt::format("'{}' is not resource=quantity", item));
    if (map.contains(key)) return bad(fmt::format("'{}' given twice", key));
    if (key == "gpu") {
      double gpus = 0;
      const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), gpus);
      if (ec != std::errc() || ptr != value.data() + value.size() || !std::isfinite(gpus)) {
        return bad(fmt::format("gpu '{}' is not a number of GPUs", value));
      }
      if (gpus == std::floor(gpus) && std::fabs(gpus) < 1e15) {
        map[key] = static_cast<int64_t>(gpus);
      } else {
        map[key] = gpus;
      }
    } else {
      map[key] = std::string(value);
    }
  }
  return map;
}

Json WeightJson(double weight) {
  if (weight == std::floor(weight) && std::fabs(weight) < 1e15) return static_cast<int64_t>(weight);
  return weight;
}

Result<std::string> ReadInput(const std::string& file, std::istream& in) {
  std::ostringstream text;
  if (file == "-") {
    text << in.rdbuf();
    if (in.bad()) return Status::InvalidArgument("cannot read the job spec from stdin");
    return text.str();
  }
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) return Status::InvalidArgument(file + ": is a directory");
  std::ifstream f(file, std::ios::binary);
  if (!f) return Status::InvalidArgument(fmt::format("cannot open {}: {}", file, std::strerror(errno)));
  text << f.rdbuf();
  if (f.bad()) return Status::InvalidArgument(fmt::format("cannot read {}", file));
  return text.str();
}

std::string_view SpecContentType(const std::string& file, std::string_view body) {
  if (file != "-") {
    const std::string ext = Lower(std::filesystem::path(file).extension().string());
    if (ext == ".json") return kJsonType;
    if (ext == ".yaml" || ext == ".yml") return kYamlType;
  }
  std::string_view rest = body;
  if (rest.substr(0, 3) == "\xEF\xBB\xBF") rest.remove_prefix(3);
  rest = Trim(rest);
  if (!rest.empty() && (rest.front() == '{' || rest.front() == '[') && Json::accept(rest)) return kJsonType;
  return kYamlType;
}

}  // namespace

// ---- commands -----------------------------------------------------------------

int SubmitJob(const CommandOptions& options, const std::string& file, std::istream& in, std::ostream& out,
              std::ostream& err) {
  return Guard(err, [&] {
    Result<std::string> body = ReadInput(file, in);
    if (!body.ok()) return Fail(err, kExitUsage, body.status().message()).exit;
    if (Trim(*body).empty()) {
      return Fail(err, kExitUsage, fmt::format("{} is empty", file == "-" ? "stdin" : file)).exit;
    }
    const std::string_view type = SpecContentType(file, *body);
    Answer a = Call(options, err, Method::kPost, "/api/v1/jobs", {}, *body, type);
    if (a.exit != kExitOk) return a.exit;
    return PrintObject(options, a.body, out, err, [](const Json& job, std::ostream& o) {
      o << fmt::format("job {} submitted (state {})\n", Text(job, "id"), Text(job, "state"));
    });
  });
}

int GetJob(const CommandOptions& options, const std::string& job_id, std::ostream& out, std::ostream& err) {
  return Guard(err, [&] {
    Answer a = Call(options, err, Method::kGet, JobPath(job_id));
    if (a.exit != kExitOk) return a.exit;
    return PrintObject(options, a.body, out, err, PrintJob);
  });
}

int ListJobs(const CommandOptions& options, const ListJobsOptions& list, std::ostream& out,
             std::ostream& err) {
  return Guard(err, [&] {
    QueryParams query;
    const auto filter = [&](const char* name, const std::vector<std::string>& values) {
      if (!values.empty()) query.emplace_back(name, Join(values, ","));
    };
    filter("state", list.states);
    filter("tenant", list.tenants);
    filter("queue", list.queues);
    if (list.limit > 0) query.emplace_back("limit", std::to_string(list.limit));
    Answer a = FetchList(options, err, "/api/v1/jobs", query, list.page_token, list.all);
    if (a.exit != kExitOk) return a.exit;
    if (auto rc = PrintStructured(options, a.body, out, err)) return *rc;
    const Json& items = Array(a.body, "items");
    if (items.empty()) {
      err << "No jobs found.\n";
    } else {
      PrintJobTable(options, items, out);
    }
    PrintMoreHint(a.body, "jobs", err);
    return kExitOk;
  });
}

int CancelJob(const CommandOptions& options, const std::string& job_id, std::ostream& out,
              std::ostream& err) {
  return Guard(err, [&] {
    Answer a = Call(options, err, Method::kPost, JobPath(job_id) + "/cancel");
    if (a.exit != kExitOk) return a.exit;
    return PrintObject(options, a.body, out, err, [&](const Json& job, std::ostream& o) {
      const std::string state = Text(job, "state");
      if (state == "cancelled") {
        o << fmt::format("job {} cancelled\n", job_id);
      } else {
        o << fmt::format("job {}: cancel requested (state {})\n", job_id, state);
      }
    });
  });
}

int JobEvents(const CommandOptions& options, const EventsOptions& events, std::ostream& out,
              std::ostream& err) {
  return Guard(err, [&] {
    QueryParams query;
    if (events.after) query.emplace_back("after", std::to_string(*events.after));
    if (events.limit > 0) query.emplace_back("limit", std::to_string(events.limit));
    Answer a = Call(options, err, Method::kGet, JobPath(events.job_id) + "/events", query);
    if (a.exit != kExitOk) return a.exit;
    return PrintObject(options, a.body, out, err, [](const Json& body, std::ostream& o) {
      const Json& items = Array(body, "items");
      if (items.empty()) {
        o << "No events.\n";
      } else {
        Table t({"ID", "TIME", "TYPE", "MESSAGE"});
        for (const Json& ev : items) {
          t.Add({Text(ev, "id"), Text(ev, "time"), Text(ev, "type"), Text(ev, "message")});
        }
        t.Print(o);
      }
      const Json* pending = Member(body, "pending");
      if (pending == nullptr || !pending->is_object()) return;
      const std::string task = String(*pending, "task");
      const std::string message = String(*pending, "message");
      o << fmt::format("\nWhy pending{}: {} of {} nodes feasible{}\n",
                       task.empty() ? "" : fmt::format(" (task {})", task), Text(*pending, "feasibleNodes"),
                       Text(*pending, "totalNodes"),
                       message.empty() ? "" : fmt::format(" ({})", OneLine(message)));
      const Json& reasons = Array(*pending, "reasons");
      if (reasons.empty()) return;
      Table t({"NODES", "REASON"});
      for (const Json& r : reasons) t.Add({Text(r, "nodes"), Text(r, "reason")});
      t.Print(o);
    });
  });
}

int TaskLogs(const CommandOptions& options, const LogsOptions& logs, std::ostream& out, std::ostream& err) {
  return Guard(err, [&] {
    Result<ApiClient> client = ApiClient::Create(options.client);
    if (!client.ok()) return Fail(err, ExitForStatus(client.status()), client.status().message()).exit;
    const std::string path = fmt::format("{}/tasks/{}/logs", JobPath(logs.job_id), logs.task);
    const std::string stream = logs.stderr_stream ? "stderr" : "stdout";
    int64_t offset = 0;
    for (;;) {
      const QueryParams query = {{"stream", stream}, {"offset", std::to_string(offset)}};
      Result<HttpReply> reply = client->Get(WithQuery(path, query));
      if (!reply.ok()) return Fail(err, ExitForStatus(reply.status()), reply.status().message()).exit;
      // A follower waits for a task that has not run yet (409), or whose agent has not started it
      // yet (404 from its node), instead of giving up; the job check below ends the wait.
      const bool not_yet = (reply->status == 409 || reply->status == 404) && logs.follow;
      if (reply->status != 200 && !not_yet) {
        return Fail(err, ExitCodeForHttpStatus(reply->status), ErrorMessage(*reply)).exit;
      }
      if (reply->status == 200 && !reply->body.empty()) {
        out << reply->body << std::flush;
        offset += static_cast<int64_t>(reply->body.size());
        continue;  // there may be more already
      }
      if (reply->status == 200 && reply->log_size >= 0 && reply->log_size < offset) {
        // The file is shorter than what was read: the agent rotated it (--log-max-bytes) and
        // started a new one. Follow the new file from its start.
        err << fmt::format("gpupool logs: the {} log was rotated; following the new file\n", stream) << std::flush;
        offset = 0;
        continue;
      }
      if (!logs.follow) return kExitOk;
      // Nothing new: done once the task has finished (and everything it wrote was read).
      Answer job = Call(options, err, Method::kGet, JobPath(logs.job_id));
      if (job.exit != kExitOk) return job.exit;
      const Json& tasks = Array(job.body, "tasks");
      if (logs.task < 0 || static_cast<size_t>(logs.task) >= tasks.size()) {
        return Fail(err, kExitNotFound, fmt::format("job {} has no task {}", logs.job_id, logs.task)).exit;
      }
      const std::string state = String(tasks[static_cast<size_t>(logs.task)], "state");
      if (state == "succeeded" || state == "failed" || state == "cancelled" || state == "preempted") {
        if (!not_yet) return kExitOk;
        // Finished without ever running anywhere: nothing to print.
        return Fail(err, kExitConflict, ErrorMessage(*reply)).exit;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(logs.poll_ms));
    }
  });
}

int ListNodes(const CommandOptions& options, std::ostream& out, std::ostream& err) {
  return Guard(err, [&] {
    Answer a = FetchList(options, err, "/api/v1/nodes", {}, "", /*all=*/true);
    if (a.exit != kExitOk) return a.exit;
    if (auto rc = PrintStructured(options, a.body, out, err)) return *rc;
    const Json& items = Array(a.body, "items");
    if (items.empty()) {
      err << "No nodes found.\n";
    } else {
      PrintNodeTable(items, out);
    }
    return kExitOk;
  });
}

int GetNode(const CommandOptions& options, const std::string& name, std::ostream& out, std::ostream& err) {
  return Guard(err, [&] {
    Answer a = Call(options, err, Method::kGet, NodePath(name));
    if (a.exit != kExitOk) return a.exit;
    return PrintObject(options, a.body, out, err, PrintNode);
  });
}

int ChangeNode(const CommandOptions& options, NodeAction action, const std::string& name, std::ostream& out,
               std::ostream& err) {
  return Guard(err, [&] {
    std::string_view verb = "cordon";
    std::string_view done = "cordoned";
    if (action == NodeAction::kUncordon) {
      verb = "uncordon";
      done = "uncordoned";
    } else if (action == NodeAction::kDrain) {
      verb = "drain";
      done = "draining";
    }
    Answer a = Call(options, err, Method::kPost, fmt::format("{}/{}", NodePath(name), verb));
    if (a.exit != kExitOk) return a.exit;
    return PrintObject(options, a.body, out, err,
                       [&](const Json&, std::ostream& o) { o << fmt::format("node {} {}\n", name, done); });
  });
}

int ListNodeCredentials(const CommandOptions& options, std::ostream& out, std::ostream& err) {
  return Guard(err, [&] {
    Answer a = Call(options, err, Method::kGet, "/api/v1/node-credentials");
    if (a.exit != kExitOk) return a.exit;
    if (auto rc = PrintStructured(options, a.body, out, err)) return *rc;
    const Json& items = Array(a.body, "items");
    if (items.empty()) {
      err << "No node credentials found.\n";
      return kExitOk;
    }
    Table t({"NODE", "STATE", "CREATED", "LAST USED", "REVOKED"});
    for (const Json& c : items)
      t.Add({Text(c, "node"), Text(c, "state"), Text(c, "created"), Text(c, "lastUsed"), Text(c, "revoked")});
    t.Print(out);
    return kExitOk;
  });
}

int RevokeNodeCredential(const CommandOptions& options, const std::string& name, std::ostream& out,
                         std::ostream& err) {
  return Guard(err, [&] {
    Answer a = Call(options, err, Method::kDelete, "/api/v1/node-credentials/" + PercentEncode(name));
    if (a.exit != kExitOk) return a.exit;
    return PrintObject(options, a.body, out, err, [&](const Json&, std::ostream& o) {
      o << fmt::format("node {}: credential revoked (its agent registers again with the bootstrap token)\n", name);
    });
  });
}

int ListQueues(const CommandOptions& options, std::ostream& out, std::ostream& err) {
  return Guard(err, [&] {
    Answer a = FetchList(options, err, "/api/v1/queues", {}, "", /*all=*/true);
    if (a.exit != kExitOk) return a.exit;
    if (auto rc = PrintStructured(options, a.body, out, err)) return *rc;
    const Json& items = Array(a.body, "items");
    if (items.empty()) {
      err << "No queues found.\n";
    } else {
      PrintQueueTable(items, out);
    }
    return kExitOk;
  });
}

int GetQueue(const CommandOptions& options, const std::string& name, std::ostream& out, std::ostream& err) {
  return Guard(err, [&] {
    Answer a = Call(options, err, Method::kGet, QueuePath(name));
    if (a.exit != kExitOk) return a.exit;
    return PrintObject(options, a.body, out, err, PrintQueue);
  });
}

namespace {

// Adds weight, guaranteed and limit from the flags to `body`; false after printing a usage error.
bool AddQueueFields(const QueueOptions& queue, Json* body, std::ostream& err) {
  if (queue.weight) {
    if (!std::isfinite(*queue.weight)) {
      PrintError(err, "--weight must be a finite number");
      return false;
    }
    (*body)["weight"] = WeightJson(*queue.weight);
  }
  if (queue.guaranteed) {
    Result<Json> map = ParseResources("--guaranteed", *queue.guaranteed);
    if (!map.ok()) {
      PrintError(err, map.status().message());
      return false;
    }
    (*body)["guaranteed"] = std::move(*map);
  }
  if (queue.limit) {
    Result<Json> map = ParseResources("--limit", *queue.limit);
    if (!map.ok()) {
      PrintError(err, map.status().message());
      return false;
    }
    (*body)["limit"] = std::move(*map);
  }
  // Lists and whole numbers; "" sends null, which lifts the rule. The server checks the values.
  for (const auto& [flag, key, value] :
       {std::tuple<const char*, const char*, const std::optional<std::string>*>{"--tenants", "tenants", &queue.tenants},
        {"--allowed-qos", "allowedQos", &queue.allowed_qos}}) {
    if (!*value) continue;
    if ((*value)->empty()) {
      (*body)[key] = nullptr;
      continue;
    }
    Json list = Json::array();
    std::string_view rest = **value;
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      const std::string_view item = Trim(rest.substr(0, comma));
      if (!item.empty()) list.push_back(std::string(item));
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    }
    (*body)[key] = std::move(list);
  }
  for (const auto& [flag, key, value] : {std::tuple<const char*, const char*, const std::optional<std::string>*>{
                                             "--max-priority", "maxPriority", &queue.max_priority},
                                         {"--max-pending-jobs", "maxPendingJobs", &queue.max_pending_jobs},
                                         {"--max-pending-tasks", "maxPendingTasks", &queue.max_pending_tasks}}) {
    if (!*value) continue;
    if ((*value)->empty()) {
      (*body)[key] = nullptr;
      continue;
    }
    const std::string& text = **value;
    int64_t n = 0;
    const char* first = text.data() + (text[0] == '-' ? 1 : 0);
    const auto [end, ec] = std::from_chars(first, text.data() + text.size(), n);
    if (ec != std::errc() || end != text.data() + text.size() || text.size() > 12) {
      PrintError(err, fmt::format("{} must be a whole number ('' to lift it), got '{}'", flag, text));
      return false;
    }
    (*body)[key] = text[0] == '-' ? -n : n;
  }
  return true;
}

}  // namespace

int CreateQueue(const CommandOptions& options, const QueueOptions& queue, std::ostream& out,
                std::ostream& err) {
  return Guard(err, [&] {
    Json body = Json::object();
    body["name"] = queue.name;
    if (queue.parent && !queue.parent->empty()) body["parent"] = *queue.parent;
    if (!AddQueueFields(queue, &body, err)) return kExitUsage;
    Answer a = Call(options, err, Method::kPost, "/api/v1/queues", {}, body.dump());
    if (a.exit != kExitOk) return a.exit;
    return PrintObject(options, a.body, out, err, [&](const Json&, std::ostream& o) {
      o << fmt::format("queue {} created\n", queue.name);
    });
  });
}

int UpdateQueue(const CommandOptions& options, const QueueOptions& queue, std::ostream& out,
                std::ostream& err) {
  return Guard(err, [&] {
    if (queue.parent) return Fail(err, kExitUsage, "the parent of a queue cannot change").exit;
    if (!queue.any_update()) {
      return Fail(err, kExitUsage,
                  "nothing to update: give --weight, --guaranteed, --limit, --tenants, --max-priority, "
                  "--allowed-qos, --max-pending-jobs or --max-pending-tasks")
          .exit;
    }
    Json body = Json::object();
    if (!AddQueueFields(queue, &body, err)) return kExitUsage;
    Answer current = Call(options, err, Method::kGet, QueuePath(queue.name));
    if (current.exit != kExitOk) return current.exit;
    Json merged = Json::object();
    for (const char* key : {"weight", "guaranteed", "limit", "tenants", "maxPriority", "allowedQos",
                            "maxPendingJobs", "maxPendingTasks"}) {
      if (body.contains(key)) {
        merged[key] = body[key];  // null included: it lifts the rule
      } else if (const Json* old = Member(current.body, key); old != nullptr && !old->is_null()) {
        merged[key] = *old;
      }
    }
    Answer a = Call(options, err, Method::kPut, QueuePath(queue.name), {}, merged.dump());
    if (a.exit != kExitOk) return a.exit;
    return PrintObject(options, a.body, out, err, [&](const Json&, std::ostream& o) {
      o << fmt::format("queue {} updated\n", queue.name);
    });
  });
}


}  // namespace gpupool
