// The client subcommands of `gpupool`: submit, get, list, cancel, events, nodes, queues. Each is a
// function that talks to the server (docs/api.md), writes its output to `out` and its errors to
// `err` as `gpupool: <message>`, and returns the process exit code of docs/api.md (see
// client/api_client.h). None of them throws. RegisterClientCommands wires them to CLI11.
#pragma once

#include <CLI/CLI.hpp>

#include "client/api_client.h"
#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace gpupool {

enum class OutputFormat { kTable, kJson, kYaml };

// Settings shared by every client command, already resolved (see ResolveClientConfig).
struct CommandOptions {
  // Where every request goes and how: the server, the token, TLS files and limits. All of it
  // reaches the requests (commands once dropped the CA file and the client certificate).
  ClientConfig client;
  OutputFormat output = OutputFormat::kTable;
  // The clock for AGE columns; unset: the system clock.
  std::optional<std::chrono::system_clock::time_point> now;
};

struct ListJobsOptions {
  std::vector<std::string> states;  // each may itself be a comma list
  std::vector<std::string> tenants;
  std::vector<std::string> queues;
  int limit = 0;           // page size; 0: the server's default
  std::string page_token;  // start from this page
  bool all = false;        // follow nextPageToken to the end
};

struct EventsOptions {
  std::string job_id;
  std::optional<int64_t> after;  // only events with a larger id
  int limit = 0;                 // 0: the server's default
};

struct LogsOptions {
  std::string job_id;
  int task = 0;
  bool stderr_stream = false;
  bool follow = false;      // keep reading until the task has finished
  int poll_ms = 500;        // how often a follower asks for more
};

struct QueueOptions {
  std::string name;
  std::optional<std::string> parent;  // create only
  std::optional<double> weight;
  std::optional<std::string> guaranteed;  // "cpu=64,memory=512Gi,gpu=8"; "" for none
  std::optional<std::string> limit;       // same form
  // Access rules and pending caps (docs/server.md#queue-access); "" lifts the rule.
  std::optional<std::string> tenants;           // "vision,nlp"
  std::optional<std::string> max_priority;      // "100"
  std::optional<std::string> allowed_qos;       // "burstable,best-effort"
  std::optional<std::string> max_pending_jobs;  // "5000"
  std::optional<std::string> max_pending_tasks;
  bool any_update() const {
    return weight || guaranteed || limit || tenants || max_priority || allowed_qos || max_pending_jobs ||
           max_pending_tasks;
  }
};

enum class NodeAction { kCordon, kUncordon, kDrain };

// `file` is a path or "-" for `in`. The body is sent as-is: application/json for *.json or a body
// that starts with '{' or '[', application/yaml otherwise.
int SubmitJob(const CommandOptions& options, const std::string& file, std::istream& in, std::ostream& out,
              std::ostream& err);
int GetJob(const CommandOptions& options, const std::string& job_id, std::ostream& out, std::ostream& err);
int ListJobs(const CommandOptions& options, const ListJobsOptions& list, std::ostream& out,
             std::ostream& err);
int CancelJob(const CommandOptions& options, const std::string& job_id, std::ostream& out, std::ostream& err);
// Prints a task's stdout (or stderr) as its node's agent kept it; with `follow`, keeps printing
// what the task writes until the task has finished.
int TaskLogs(const CommandOptions& options, const LogsOptions& logs, std::ostream& out, std::ostream& err);

int JobEvents(const CommandOptions& options, const EventsOptions& events, std::ostream& out,
              std::ostream& err);

// Node and queue lists follow nextPageToken to the end.
int ListNodes(const CommandOptions& options, std::ostream& out, std::ostream& err);
int GetNode(const CommandOptions& options, const std::string& name, std::ostream& out, std::ostream& err);
// `gpupool nodes credentials` and `gpupool nodes revoke NODE` (admin): node credentials.
int ListNodeCredentials(const CommandOptions& options, std::ostream& out, std::ostream& err);
int RevokeNodeCredential(const CommandOptions& options, const std::string& name, std::ostream& out,
                         std::ostream& err);
int ChangeNode(const CommandOptions& options, NodeAction action, const std::string& name, std::ostream& out,
               std::ostream& err);

int ListQueues(const CommandOptions& options, std::ostream& out, std::ostream& err);
int GetQueue(const CommandOptions& options, const std::string& name, std::ostream& out, std::ostream& err);
int CreateQueue(const CommandOptions& options, const QueueOptions& queue, std::ostream& out,
                std::ostream& err);
// Reads the queue, replaces the fields given, and PUTs weight, guaranteed and limit back, so the
// fields not given keep their values. A flag replaces a whole resource map.
int UpdateQueue(const CommandOptions& options, const QueueOptions& queue, std::ostream& out,
                std::ostream& err);

// Adds submit, get, list, cancel, events, nodes and queues to `app`. Each takes --server, --token,
// --token-file and -o table|json|yaml. The callback of whichever ran stores its exit code in
// *exit_code (which is left alone when none of them ran); output goes to std::cout and std::cerr.
void RegisterClientCommands(CLI::App& app, int* exit_code);

}  // namespace gpupool
