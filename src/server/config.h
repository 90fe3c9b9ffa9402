// The server's configuration: where it listens, who may call it, how it orders and places work.
// Read once at start from YAML (docs/server.md); plain data afterwards.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "server/disk_guard.h"
#include "sched/queueing.h"

namespace gpupool {

// kAgent: the bootstrap token of the config, which may only register a node. kNode: a node
// credential the server issued at registration (never in the config): it acts for its node only.
enum class Role { kAdmin, kTenant, kAgent, kNode };
std::string_view RoleName(Role role);

struct Principal {
  std::string tenant;  // admins and agents: "" unless configured
  Role role = Role::kTenant;
  std::string node{};  // kNode: the node the credential belongs to
};

struct ServerConfig {
  std::string data_dir;
  std::string listen = "127.0.0.1:8470";
  // token -> who holds it
  std::map<std::string, Principal> tokens;

  // Queue ordering and the queues the server starts with (created in the store the first time;
  // afterwards the API owns them).
  QueueOrderOptions ordering;
  // Placement: a policy name (fgd, bestfit, ...) or a profile YAML file.
  std::string profile = "balanced";

  bool preemption = true;
  int grace_period_seconds = 30;
  // A gang that has waited this long gets nodes held for it: smaller jobs stop backfilling them.
  int reserve_after_seconds = 60;

  // An agent heartbeats every interval; a node silent for the timeout is lost: its tasks are
  // released and their jobs restart elsewhere from their checkpoints. Agents fence (stop) their
  // own tasks before the timeout when they cannot renew it (docs/agent.md), so a task never runs
  // on a lost node and its replacement at once.
  int heartbeat_interval_seconds = 1;
  int heartbeat_timeout_seconds = 6;

  // Hot spots: a GPU whose telemetry (sent with every heartbeat) stays over a threshold for the
  // whole window takes no new placements, and its best-effort tasks are migrated (stopped with
  // their grace period to checkpoint, requeued). It is usable again once it has been under every
  // threshold for the cooldown. A threshold of 0 is off.
  struct Hotspot {
    double temperature_c = 85;
    double utilization = 0;           // 0..1
    double memory_used_fraction = 0;  // 0..1
    int window_seconds = 30;
    int cooldown_seconds = 120;
    bool migrate = true;
  } hotspot;

  size_t max_body_bytes = 1 << 20;
  int max_jobs_per_cycle = 5000;
  // What one tenant may have waiting (docs/server.md#tenant-limits): pending jobs, and the tasks of
  // those jobs, summed over all queues. Over either, a submission is refused with 429 and nothing
  // is stored; the room comes back as jobs start, end or are cancelled. `tenant_limits` overrides
  // both per tenant (config `tenants.<name>.maxPendingJobs/maxPendingTasks`).
  int64_t max_pending_jobs_per_tenant = 10000;
  int64_t max_pending_tasks_per_tenant = 100000;
  struct TenantLimits {
    int64_t max_pending_jobs = 0;   // 0: the default above
    int64_t max_pending_tasks = 0;  // 0: the default above
  };
  std::map<std::string, TenantLimits> tenant_limits;
  // Kubernetes only (docs/kubernetes.md#tenants-and-queues): namespace -> the tenant its pods belong
  // to (config `tenants.<name>.namespaces`); a namespace not listed is a tenant of its own name.
  std::map<std::string, std::string> namespace_tenants;
  // The task sandbox (docs/agent.md#the-task-sandbox): every task runs as its tenant's own uid and
  // gid, never root. A tenant's identity is `identities[tenant]` when the config gives one
  // (`tenants.<name>.uid/gid`), else the lowest free uid of [uid_base, uid_base + uid_count) the
  // pool gives it the first time one of its tasks is placed (kept in the store, the same on every
  // node, so a checkpoint written on one node is its on the next). gid = uid for those.
  // Tasks of `root_queues` run as root; containers of `host_network_queues` may ask for the host's
  // network. Both lists are the admin's, in the config only.
  struct Identity {
    int64_t uid = -1;
    int64_t gid = -1;
    bool operator==(const Identity&) const = default;
  };
  struct Sandbox {
    int64_t uid_base = 200000;
    int64_t uid_count = 100000;
    std::map<std::string, Identity> identities;
    std::vector<std::string> root_queues;
    std::vector<std::string> host_network_queues;
    // Runtime classes (crun, runsc, kata): a class listed here runs only in its queues ("*": every
    // queue); one not listed, in every queue. runc, the default, is never restricted.
    std::map<std::string, std::vector<std::string>> runtime_class_queues;
    // A queue listed here runs every task in that class: containers that name none get it, those
    // that name another and process tasks are refused (sensitive tenants always under gVisor).
    std::map<std::string, std::string> queue_runtime_class;
  } sandbox;
  // Tasks of one job (replicas over all its groups); a bigger spec is refused with 400.
  int max_tasks_per_job = 10000;
  // Nodes the pool knows (ready or lost); registering one more name is refused with 429, so the
  // bootstrap token cannot grow the node table without bound.
  int max_nodes = 10000;
  int cycle_interval_ms = 200;  // the loop also runs at once after every submission or release
  bool sync_full = true;        // SQLite synchronous=FULL (FALSE: NORMAL, survives process crashes only)
  // A job that ended (succeeded, failed, cancelled) and has not changed for this long is removed,
  // with its tasks and events, from memory and from the store, so a long-running server neither
  // grows without bound nor slows its restarts. 0 keeps every job forever.
  int64_t finished_job_retention_seconds = 7 * 86400;
  // Below this much free space on the data directory's filesystem, the server refuses new work
  // (submissions, queue changes: HTTP 507) while heartbeats, status reports, placements and
  // cancellations go on. 0: no guard. (store.minFreeBytes)
  int64_t store_min_free_bytes = int64_t{256} << 20;
  // Tests: how free space is measured (empty: statvfs of data_dir).
  FreeSpaceProbe free_space_probe;
  // Tests: the server's clocks (empty: the system's). `wall_clock_ms`: milliseconds since the
  // epoch (timestamps, stop deadlines, backoff, retention, hot-spot spells); `mono_clock_s`: steady
  // seconds (heartbeat timeouts, latencies). A test that moves one moves both.
  std::function<int64_t()> wall_clock_ms;
  std::function<double()> mono_clock_s;
  // The HTTP layer (http/server.h): connections cost no thread; handlers run on `workers`, the
  // node side (register, heartbeats, assignments, task reports) and /healthz on their own
  // `priority_workers`, so no load on the rest of the API can starve them.
  struct Http {
    int workers = 64;  // submissions wait for the group commit's fsync here: enough of them keep batches full
    int priority_workers = 4;
    int io_threads = 1;
    int request_timeout_seconds = 10;  // a request's head and body, however slowly they come
    int idle_timeout_seconds = 60;     // a keep-alive connection between requests
    int max_connections = 20000;
    int max_connections_per_address = 1000;
    int max_queued_per_lane = 4096;  // requests waiting for a worker; past it 503
  } http;
  // TLS on the API: cert and key (PEM); with client_ca, clients must present a certificate it signed.
  // agent_ca_file: the CA (PEM) of the agents' endpoints when they serve TLS (for task logs);
  // empty: the system's.
  struct Tls {
    std::string cert_file, key_file, client_ca_file, agent_ca_file;
  } tls;
};

// Reads a config file. Unknown keys are errors naming the key.
Result<ServerConfig> LoadServerConfig(const std::string& path);

// The token file of a config-less server: DIR/admin.token, created (mode 0600) with a fresh random
// token when absent, reused when present. Returns the token.
Result<std::string> EnsureAdminToken(const std::string& data_dir);

// A queue as the config and the API write it: {name, parent, weight, guaranteed, limit, tenants,
// maxPriority, allowedQos, maxPendingJobs, maxPendingTasks}. Names (the queue's, its parent's, the
// tenants') are checked as a job spec checks its queue and tenant fields, unless `check_names` is
// false (queues read back from an older store, which did not check them).
Result<QueueSpec> ParseQueueJson(const nlohmann::json& q, const std::string& where, bool check_names = true);
// The same as JSON; ParseQueueJson(QueueSpecJson(q)) gives q back.
nlohmann::json QueueSpecJson(const QueueSpec& q);

// "host:port" -> parts; port 0 allowed (pick a free one).
Status ParseListen(const std::string& listen, std::string* host, int* port);

}  // namespace gpupool
