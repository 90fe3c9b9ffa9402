// The client commands on the command line: CLI11 options and subcommands, wired to the commands of
// client_commands.cc.
#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>
#include <string>

#include "cli/client_commands.h"
#include "cli/client_render.h"
#include "client/api_client.h"

namespace gpupool {

using namespace cli_internal;

// ---- CLI11 wiring -----------------------------------------------------------------

namespace {

// What `queues create|update` read, and the options that tell whether a flag was given.
struct QueueFlags {
  std::string parent;
  double weight = 1;
  std::string guaranteed;
  std::string limit;
  CLI::Option* parent_opt = nullptr;
  CLI::Option* weight_opt = nullptr;
  CLI::Option* guaranteed_opt = nullptr;
  CLI::Option* limit_opt = nullptr;
  // --tenants, --max-priority, --allowed-qos, --max-pending-jobs, --max-pending-tasks
  std::string rules[5];
  CLI::Option* rule_opts[5] = {};
};

// Where CLI11 stores what it parsed; one command runs per process, so they share the storage.
struct CliState {
  ClientFlags flags;
  std::string output = "table";
  std::string file;
  std::string id;
  std::string name;
  ListJobsOptions list;
  EventsOptions events;
  LogsOptions logs;
  int64_t after = 0;
  CLI::Option* after_opt = nullptr;
  QueueFlags create;
  QueueFlags update;
};

void AddConnectionOptions(CLI::App* cmd, CliState* s) {
  cmd->add_option("--server", s->flags.server,
                  "Server address (default: $GPUPOOL_SERVER, else http://127.0.0.1:8470)");
  cmd->add_option("--token", s->flags.token,
                  "Bearer token (default: $GPUPOOL_TOKEN, else <data dir>/admin.token)");
  cmd->add_option("--token-file", s->flags.token_file, "Read the bearer token from this file");
  cmd->add_option("-o,--output", s->output, "Output format: table, json or yaml")
      ->check(CLI::IsMember({"table", "json", "yaml"}))
      ->capture_default_str();
}

OutputFormat ParseOutput(const std::string& text) {
  if (text == "json") return OutputFormat::kJson;
  if (text == "yaml") return OutputFormat::kYaml;
  return OutputFormat::kTable;
}

// Sets the callback of `cmd`: resolve server and token, then run `body` on std::cout/std::cerr. A
// parent's callback runs after its child's; it does nothing then (`nodes get` does not list).
void OnRun(CLI::App* cmd, const std::shared_ptr<CliState>& s, int* exit_code,
           std::function<int(const CommandOptions&)> body) {
  cmd->callback([cmd, s, exit_code, body = std::move(body)] {
    if (!cmd->get_subcommands().empty()) return;
    *exit_code = Guard(std::cerr, [&] {
      Result<ClientConfig> config = ResolveClientConfig(s->flags, ProcessEnv());
      if (!config.ok()) {
        PrintError(std::cerr, config.status().message());
        return kExitUsage;
      }
      if (!config->warning.empty()) std::cerr << "gpupool: " << config->warning << "\n";
      CommandOptions options;
      options.client = *config;
      options.output = ParseOutput(s->output);
      return body(options);
    });
  });
}

QueueOptions QueueFrom(const std::string& name, const QueueFlags& f) {
  QueueOptions q;
  q.name = name;
  if (f.parent_opt != nullptr && f.parent_opt->count() > 0) q.parent = f.parent;
  if (f.weight_opt->count() > 0) q.weight = f.weight;
  if (f.guaranteed_opt->count() > 0) q.guaranteed = f.guaranteed;
  if (f.limit_opt->count() > 0) q.limit = f.limit;
  std::optional<std::string>* rules[5] = {&q.tenants, &q.max_priority, &q.allowed_qos, &q.max_pending_jobs,
                                          &q.max_pending_tasks};
  for (int i = 0; i < 5; ++i) {
    if (f.rule_opts[i]->count() > 0) *rules[i] = f.rules[i];
  }
  return q;
}

void AddQueueResourceOptions(CLI::App* cmd, QueueFlags* f) {
  f->weight_opt = cmd->add_option("--weight", f->weight, "Share of the parent's spare capacity (positive)");
  f->guaranteed_opt = cmd->add_option("--guaranteed", f->guaranteed,
                                      "Guaranteed resources, e.g. cpu=64,memory=512Gi,gpu=8 ('' for none)");
  f->limit_opt =
      cmd->add_option("--limit", f->limit, "Most resources the queue may use, same form ('' for no limit)");
  const char* names[5] = {"--tenants", "--max-priority", "--allowed-qos", "--max-pending-jobs", "--max-pending-tasks"};
  const char* help[5] = {"Tenants that may submit, e.g. vision,nlp ('' for any)",
                         "Highest priority a job may ask for ('' for no cap)",
                         "QoS classes a job may have, e.g. burstable,best-effort ('' for any)",
                         "Most pending jobs in the queue ('' for no cap)",
                         "Most tasks of pending jobs in the queue ('' for no cap)"};
  for (int i = 0; i < 5; ++i) f->rule_opts[i] = cmd->add_option(names[i], f->rules[i], help[i]);
}

}  // namespace

void RegisterClientCommands(CLI::App& app, int* exit_code) {
  auto s = std::make_shared<CliState>();
  CliState* st = s.get();

  auto* submit = app.add_subcommand("submit", "Submit a job spec (YAML or JSON) to the server");
  submit->add_option("-f,--file", st->file, "Job spec file, or - for stdin")->required();
  AddConnectionOptions(submit, st);
  OnRun(submit, s, exit_code,
        [st](const CommandOptions& o) { return SubmitJob(o, st->file, std::cin, std::cout, std::cerr); });

  auto* get = app.add_subcommand("get", "Show a job and its tasks");
  get->add_option("id", st->id, "Job id")->required();
  AddConnectionOptions(get, st);
  OnRun(get, s, exit_code, [st](const CommandOptions& o) { return GetJob(o, st->id, std::cout, std::cerr); });

  auto* list = app.add_subcommand("list", "List jobs, oldest first");
  list->add_option("--state", st->list.states, "Only jobs in these states (comma list or repeated)")
      ->allow_extra_args(false);
  list->add_option("--tenant", st->list.tenants, "Only jobs of these tenants (comma list or repeated)")
      ->allow_extra_args(false);
  list->add_option("--queue", st->list.queues, "Only jobs in these queues (comma list or repeated)")
      ->allow_extra_args(false);
  list->add_option("--limit", st->list.limit, "Jobs per page (1..1000; default: the server's, 100)")
      ->check(CLI::Range(1, 1000));
  list->add_option("--page-token", st->list.page_token, "Start at this page (nextPageToken of the last one)");
  list->add_flag("--all", st->list.all, "Follow nextPageToken and list every job");
  AddConnectionOptions(list, st);
  OnRun(list, s, exit_code,
        [st](const CommandOptions& o) { return ListJobs(o, st->list, std::cout, std::cerr); });

  auto* cancel = app.add_subcommand("cancel", "Cancel a job");
  cancel->add_option("id", st->id, "Job id")->required();
  AddConnectionOptions(cancel, st);
  OnRun(cancel, s, exit_code,
        [st](const CommandOptions& o) { return CancelJob(o, st->id, std::cout, std::cerr); });

  auto* events = app.add_subcommand("events", "Show a job's events and why it is pending");
  events->add_option("id", st->events.job_id, "Job id")->required();
  st->after_opt = events->add_option("--after", st->after, "Only events after this event id");
  events->add_option("--limit", st->events.limit, "At most this many events (1..1000)")
      ->check(CLI::Range(1, 1000));
  AddConnectionOptions(events, st);
  OnRun(events, s, exit_code, [st](const CommandOptions& o) {
    EventsOptions e = st->events;
    if (st->after_opt->count() > 0) e.after = st->after;
    return JobEvents(o, e, std::cout, std::cerr);
  });

  auto* logs = app.add_subcommand("logs", "Print a task's output, as its node's agent kept it");
  logs->add_option("id", st->logs.job_id, "Job id")->required();
  logs->add_option("--task", st->logs.task, "Task index within the job (default 0)")->check(CLI::Range(0, 999999));
  logs->add_flag("--stderr", st->logs.stderr_stream, "Print stderr instead of stdout");
  logs->add_flag("-f,--follow", st->logs.follow, "Keep printing until the task has finished");
  AddConnectionOptions(logs, st);
  OnRun(logs, s, exit_code, [st](const CommandOptions& o) { return TaskLogs(o, st->logs, std::cout, std::cerr); });

  // nodes and queues list without a subcommand.
  auto* nodes = app.add_subcommand("nodes", "List nodes, or show or act on one");
  nodes->require_subcommand(0, 1);
  AddConnectionOptions(nodes, st);
  OnRun(nodes, s, exit_code, [](const CommandOptions& o) { return ListNodes(o, std::cout, std::cerr); });

  auto* node_get = nodes->add_subcommand("get", "Show a node with its GPUs and their tasks");
  node_get->add_option("name", st->name, "Node name")->required();
  AddConnectionOptions(node_get, st);
  OnRun(node_get, s, exit_code,
        [st](const CommandOptions& o) { return GetNode(o, st->name, std::cout, std::cerr); });
  const std::pair<const char*, NodeAction> actions[] = {
      {"cordon", NodeAction::kCordon}, {"uncordon", NodeAction::kUncordon}, {"drain", NodeAction::kDrain}};
  const char* const action_help[] = {"Stop new placements on a node", "Allow placements on a node again",
                                     "Cordon a node and stop every task on it (they are requeued)"};
  for (size_t i = 0; i < std::size(actions); ++i) {
    auto* cmd = nodes->add_subcommand(actions[i].first, action_help[i]);
    cmd->add_option("name", st->name, "Node name")->required();
    AddConnectionOptions(cmd, st);
    const NodeAction action = actions[i].second;
    OnRun(cmd, s, exit_code, [st, action](const CommandOptions& o) {
      return ChangeNode(o, action, st->name, std::cout, std::cerr);
    });
  }

  auto* creds = nodes->add_subcommand("credentials", "List the node credentials the server issued (admin)");
  AddConnectionOptions(creds, st);
  OnRun(creds, s, exit_code, [](const CommandOptions& o) { return ListNodeCredentials(o, std::cout, std::cerr); });
  auto* revoke = nodes->add_subcommand("revoke", "Revoke a node's credential (admin)");
  revoke->add_option("name", st->name, "Node name")->required();
  AddConnectionOptions(revoke, st);
  OnRun(revoke, s, exit_code,
        [st](const CommandOptions& o) { return RevokeNodeCredential(o, st->name, std::cout, std::cerr); });

  auto* queues = app.add_subcommand("queues", "List queues, or show, create or update one");
  queues->require_subcommand(0, 1);
  AddConnectionOptions(queues, st);
  OnRun(queues, s, exit_code, [](const CommandOptions& o) { return ListQueues(o, std::cout, std::cerr); });

  auto* queue_get = queues->add_subcommand("get", "Show a queue");
  queue_get->add_option("name", st->name, "Queue name")->required();
  AddConnectionOptions(queue_get, st);
  OnRun(queue_get, s, exit_code,
        [st](const CommandOptions& o) { return GetQueue(o, st->name, std::cout, std::cerr); });

  auto* queue_create = queues->add_subcommand("create", "Create a queue (admin)");
  queue_create->add_option("name", st->name, "Queue name")->required();
  st->create.parent_opt = queue_create->add_option("--parent", st->create.parent,
                                                   "Parent queue (default: none, a top-level queue)");
  AddQueueResourceOptions(queue_create, &st->create);
  AddConnectionOptions(queue_create, st);
  OnRun(queue_create, s, exit_code, [st](const CommandOptions& o) {
    return CreateQueue(o, QueueFrom(st->name, st->create), std::cout, std::cerr);
  });

  auto* queue_update =
      queues->add_subcommand("update", "Change a queue's weight, guarantee or limit (admin)");
  queue_update->add_option("name", st->name, "Queue name")->required();
  AddQueueResourceOptions(queue_update, &st->update);
  AddConnectionOptions(queue_update, st);
  OnRun(queue_update, s, exit_code, [st](const CommandOptions& o) {
    return UpdateQueue(o, QueueFrom(st->name, st->update), std::cout, std::cerr);
  });
}

}  // namespace gpupool

