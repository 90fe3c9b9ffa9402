#include "cli/server_commands.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agent/agent.h"
#include "cli/server_internal.h"
#include "client/api_client.h"
#include "server/config.h"
#include "server/http_api.h"
#include "server/service.h"
#include "store/sqlite_store.h"

namespace gpupool {

using namespace cli_internal;  // NOLINT: the helpers this file shares with up_command.cc

std::string DefaultDataDir() {
  if (const char* d = std::getenv("GPUPOOL_DATA_DIR"); d != nullptr && *d != '\0') return d;
  if (const char* x = std::getenv("XDG_DATA_HOME"); x != nullptr && *x != '\0')
    return std::string(x) + "/gpupool";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0')
    return std::string(h) + "/.local/share/gpupool";
  return ".gpupool";
}

namespace {

// The cluster ids that say a pool existed in `data_dir`: the marker the server writes next to its
// store, and those of the local agents of `gpupool up` (<data dir>/agent/<node>/cluster-id).
std::vector<std::pair<std::string, std::string>> PoolEvidence(const std::string& data_dir) {
  std::vector<std::pair<std::string, std::string>> out;  // (file, cluster id)
  auto read = [&out](const std::filesystem::path& file) {
    std::ifstream in(file);
    std::string id;
    if (in && std::getline(in, id) && !id.empty()) out.emplace_back(file.string(), id);
  };
  read(std::filesystem::path(data_dir) / "cluster-id");
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(data_dir) / "agent", ec)) {
    if (entry.is_directory(ec)) read(entry.path() / "cluster-id");
  }
  return out;
}

// Refuses to start on a missing (or replaced) store where the data dir says a pool existed: its
// job ids would be handed out again and its nodes' agents would meet a stranger
// (docs/server.md#cluster-identity). `--init` starts afresh on purpose: the evidence is removed.
Status CheckPoolEvidence(const std::string& data_dir, const std::string& db_path, bool init) {
  std::error_code ec;
  if (std::filesystem::exists(db_path, ec)) return Status::Ok();
  const auto evidence = PoolEvidence(data_dir);
  if (evidence.empty()) return Status::Ok();
  if (init) {
    for (const auto& [file, id] : evidence) {
      std::filesystem::remove(file, ec);
      const auto credential = std::filesystem::path(file).parent_path() / "node-credential";
      std::filesystem::remove(credential, ec);
    }
    std::cout << fmt::format("--init: starting a new pool in {}; cluster {} is forgotten\n", data_dir,
                             evidence.front().second);
    return Status::Ok();
  }
  return Status::FailedPrecondition(fmt::format(
      "REFUSING TO START: the store {} is missing, but {} says cluster {} existed here. Starting empty would "
      "hand out its job ids again to new jobs. Restore the store from a backup, or start a new pool on purpose "
      "with --init",
      db_path, evidence.front().first, evidence.front().second));
}

}  // namespace

namespace cli_internal {

Status MakeDirs(const std::string& path) {
  std::string partial;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || (path[i] == '/' && i > 0)) {
      partial = path.substr(0, i);
      if (::mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST)
        return Status::IoError(fmt::format("cannot create directory {}", partial));
    }
  }
  return Status::Ok();
}

// "64Mi", "512Ki", "1Gi", "1048576" (also K, M, G as powers of 1000) -> bytes.
Result<int64_t> ParseByteSize(const std::string& text, const std::string& what) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  const std::string suffix = text.substr(digits);
  int64_t unit = 0;
  if (suffix.empty()) unit = 1;
  else if (suffix == "Ki") unit = int64_t{1} << 10;
  else if (suffix == "Mi") unit = int64_t{1} << 20;
  else if (suffix == "Gi") unit = int64_t{1} << 30;
  else if (suffix == "K") unit = 1000;
  else if (suffix == "M") unit = 1000 * 1000;
  else if (suffix == "G") unit = 1000 * 1000 * 1000;
  if (digits == 0 || digits > 12 || unit == 0)
    return Status::InvalidArgument(fmt::format("{} '{}': want a size such as 64Mi, 512Ki or 1048576", what, text));
  const int64_t n = std::stoll(text.substr(0, digits));
  if (n > (int64_t{1} << 40) / unit)
    return Status::InvalidArgument(fmt::format("{} '{}': at most 1Ti", what, text));
  return n * unit;
}

// --log-max-bytes and --log-keep: a per-file cap of 0 (unbounded) or at least 4 KiB; 0..9 files kept.
Status ParseLogFlags(const std::string& max, int keep, int64_t* max_bytes, int* keep_out) {
  ASSIGN_OR_RETURN(int64_t bytes, ParseByteSize(max, "--log-max-bytes"));
  if (bytes != 0 && bytes < 4096)
    return Status::InvalidArgument(fmt::format("--log-max-bytes '{}': at least 4Ki (or 0: unbounded)", max));
  if (keep < 0 || keep > 9) return Status::InvalidArgument(fmt::format("--log-keep {}: must be 0..9", keep));
  *max_bytes = bytes;
  *keep_out = keep;
  return Status::Ok();
}

// --image-cache-max: a byte size of at least 64Mi.
Status ParseImageCacheMax(const std::string& text, int64_t* bytes) {
  ASSIGN_OR_RETURN(*bytes, ParseByteSize(text, "--image-cache-max"));
  if (*bytes < (int64_t{64} << 20))
    return Status::InvalidArgument(fmt::format("--image-cache-max '{}': at least 64Mi", text));
  return Status::Ok();
}

int Fail(const Status& st) {
  std::cerr << "gpupool: " << st.ToString() << "\n";
  return st.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

// Blocks SIGINT and SIGTERM in this thread (and so in every thread started after), so that only
// WaitForStopSignal sees them. Call before starting any thread.
sigset_t BlockStopSignals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return stop_signals;
}

Result<std::unique_ptr<RunningServer>> StartServer(const ServerFlags& flags, const char* who) {
  auto running = std::make_unique<RunningServer>();
  ServerConfig& config = running->config;
  if (!flags.config.empty()) {
    ASSIGN_OR_RETURN(config, LoadServerConfig(flags.config));
  }
  if (!flags.listen.empty()) config.listen = flags.listen;
  if (!flags.data_dir.empty()) config.data_dir = flags.data_dir;
  if (config.data_dir.empty()) config.data_dir = DefaultDataDir();
  std::string host;
  int port = 0;
  RETURN_IF_ERROR(ParseListen(config.listen, &host, &port));
  RETURN_IF_ERROR(MakeDirs(config.data_dir));  // created 0700
  if (struct stat st; ::stat(config.data_dir.c_str(), &st) == 0 && (st.st_mode & 077) != 0)
    std::cerr << fmt::format("{}: warning: the data directory {} is open to other users (mode {:o}); "
                             "its files are 0600, but chmod 700 it\n",
                             who, config.data_dir, st.st_mode & 07777);
  if (config.tokens.empty()) {
    ASSIGN_OR_RETURN(std::string token, EnsureAdminToken(config.data_dir));
    config.tokens[token] = Principal{"", Role::kAdmin};
    std::cout << fmt::format("{}: no config: one admin token, in {}/admin.token\n", who, config.data_dir);
  }
  for (const auto& [token, principal] : config.tokens) {
    if (principal.role == Role::kAgent || (principal.role == Role::kAdmin && running->agent_token.empty()))
      running->agent_token = token;
  }
  SqliteStoreOptions store_options;
  store_options.path = config.data_dir + "/gpupool.db";
  store_options.synchronous_full = config.sync_full;
  RETURN_IF_ERROR(CheckPoolEvidence(config.data_dir, store_options.path, flags.init));
  ASSIGN_OR_RETURN(std::unique_ptr<Store> store, OpenSqliteStore(store_options));
  ASSIGN_OR_RETURN(running->service, PoolService::Open(config, std::move(store)));
  {
    // The marker next to the store: what CheckPoolEvidence finds should the store go missing.
    const std::string marker = config.data_dir + "/cluster-id";
    std::ifstream in(marker);
    std::string stored;
    if (in) std::getline(in, stored);
    if (!stored.empty() && stored != running->service->cluster_id() && !flags.init)
      return Status::FailedPrecondition(fmt::format(
          "REFUSING TO START: the store {} is cluster {}, but {} says cluster {} lived here (a store of "
          "another pool?). Put the right store back, or use --init to make this store's pool the one here",
          store_options.path, running->service->cluster_id(), marker, stored));
    if (stored != running->service->cluster_id()) {
      std::ofstream out(marker, std::ios::trunc);
      out << running->service->cluster_id() << "\n";
      if (!out.flush()) return Status::IoError("cannot write " + marker);
    }
  }
  running->service->Start();
  running->api = std::make_unique<HttpApi>(*running->service, config);
  auto bound = running->api->Start(host, port);
  if (!bound.ok()) {
    running->service->Stop();
    return bound.status();
  }
  running->url = fmt::format("{}://{}:{}", config.tls.cert_file.empty() ? "http" : "https", host.find(':') != std::string::npos ? "[" + host + "]" : host, *bound);
  std::cout << fmt::format("{}: listening on {} (data in {})\n", who, running->url, config.data_dir) << std::flush;
  return running;
}

}  // namespace cli_internal

namespace {

int RunServer(const ServerFlags& flags) {
  sigset_t stop_signals = BlockStopSignals();
  auto running = StartServer(flags, "gpupool server");
  if (!running.ok()) return Fail(running.status());
  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::cout << "gpupool server: stopping\n" << std::flush;
  (*running)->Stop();
  return 0;
}

struct AgentFlags {
  AgentOptions options;
  std::vector<std::string> labels;
  std::string token_file;
  std::string log_max = "64Mi";
  int log_keep = 1;
  std::string image_cache_max = "50Gi";
  std::vector<std::string> runtime_classes;
};

// --runtime-class NAME=BINARY (repeatable): runc, crun, runsc or kata.
Status ApplyRuntimeClasses(const std::vector<std::string>& given, std::map<std::string, std::string>* out) {
  for (const std::string& g : given) {
    const size_t eq = g.find('=');
    const std::string name = g.substr(0, eq);
    if (eq == std::string::npos || eq + 1 == g.size() ||
        (name != "runc" && name != "crun" && name != "runsc" && name != "kata"))
      return Status::InvalidArgument(fmt::format(
          "--runtime-class '{}': expected NAME=BINARY, NAME one of runc, crun, runsc, kata", g));
    (*out)[name] = g.substr(eq + 1);
  }
  return Status::Ok();
}

Status ApplyLabels(const std::vector<std::string>& labels, std::map<std::string, std::string>* out) {
  for (const std::string& l : labels) {
    const size_t eq = l.find('=');
    if (eq == std::string::npos || eq == 0)
      return Status::InvalidArgument(fmt::format("--label '{}': want key=value", l));
    (*out)[l.substr(0, eq)] = l.substr(eq + 1);
  }
  return Status::Ok();
}

int RunAgent(AgentFlags flags) {
  sigset_t stop_signals = BlockStopSignals();
  AgentOptions& o = flags.options;
  if (Status st = ApplyLabels(flags.labels, &o.labels); !st.ok()) return Fail(st);
  // The token, first found: --token (warned about: ps shows it), --token-file, $GPUPOOL_TOKEN.
  if (!o.token.empty()) {
    std::cerr << "gpupool agent: " << kTokenOnCommandLineWarning << "\n";
  } else if (!flags.token_file.empty()) {
    auto token = ReadTokenFile(flags.token_file);
    if (!token.ok()) return Fail(token.status().WithContext("--token-file"));
    o.token = *token;
  } else if (const char* t = std::getenv("GPUPOOL_TOKEN"); t != nullptr) {
    o.token = std::string(t);
    while (!o.token.empty() && std::isspace(static_cast<unsigned char>(o.token.back()))) o.token.pop_back();
  }
  if (o.ca_file.empty()) {
    if (const char* t = std::getenv("GPUPOOL_CA_FILE"); t != nullptr) o.ca_file = t;
  }
  if (o.tls_cert_file.empty() != o.tls_key_file.empty())
    return Fail(Status::InvalidArgument("--tls-cert and --tls-key go together"));
  if (Status st = ParseLogFlags(flags.log_max, flags.log_keep, &o.log_max_bytes, &o.log_keep); !st.ok())
    return Fail(st);
  if (Status st = ParseImageCacheMax(flags.image_cache_max, &o.image_cache_max_bytes); !st.ok()) return Fail(st);
  if (Status st = ApplyRuntimeClasses(flags.runtime_classes, &o.runtime_classes); !st.ok()) return Fail(st);
  if (o.state_dir.empty()) o.state_dir = DefaultDataDir() + "/agent";
  if (Status st = MakeDirs(o.state_dir); !st.ok()) return Fail(st);
  auto agent = Agent::Create(o);
  if (!agent.ok()) return Fail(agent.status());
  std::cout << fmt::format("gpupool agent {}: {}\n", (*agent)->node(), (*agent)->summary()) << std::flush;
  if (Status st = (*agent)->Start(); !st.ok()) return Fail(st);
  if ((*agent)->metrics_port() > 0)
    std::cout << fmt::format("gpupool agent {}: metrics on port {}\n", (*agent)->node(), (*agent)->metrics_port())
              << std::flush;
  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::cout << fmt::format("gpupool agent {}: stopping (tasks keep running)\n", (*agent)->node()) << std::flush;
  (*agent)->Stop(false);
  return 0;
}

}  // namespace

std::function<int()> AddServerCommand(CLI::App& app) {
  auto flags = std::make_shared<ServerFlags>();
  auto* cmd = app.add_subcommand("server", "Run the control plane: REST API, job store and scheduling loop");
  cmd->add_option("--data-dir", flags->data_dir,
                  "Where the store and the admin token live (default: " + DefaultDataDir() + ")");
  cmd->add_option("--listen", flags->listen, "host:port to serve on (default 127.0.0.1:8470)");
  cmd->add_option("--config", flags->config, "Server config YAML (tokens, queues, ordering; docs/server.md)");
  cmd->add_flag("--init", flags->init,
                "Start a new pool although the data dir says one existed here and its store is missing");

  auto agent = std::make_shared<AgentFlags>();
  auto* agent_cmd = app.add_subcommand("agent", "Run a node agent: discover GPUs, run the tasks the server assigns");
  agent_cmd->add_option("--server", agent->options.server, "Server address (default http://127.0.0.1:8470)");
  agent_cmd->add_option("--token", agent->options.token,
                        "Bearer token (visible in ps: prefer --token-file or $GPUPOOL_TOKEN)");
  agent_cmd->add_option("--token-file", agent->token_file, "Read the token from this file (default: $GPUPOOL_TOKEN)");
  agent_cmd->add_option("--log-dir", agent->options.log_dir,
                        "Task logs: <dir>/<runtime>/<task>/stdout.log (default: in the task's --state-dir directory)");
  agent_cmd->add_option("--log-max-bytes", agent->log_max,
                        "Cap of each task log file (stdout, stderr), e.g. 64Mi; 0: unbounded (default 64Mi)");
  agent_cmd->add_option("--log-keep", agent->log_keep, "Rotated files kept per stream, 0..9 (default 1: stdout.log.1)");
  agent_cmd->add_option("--node", agent->options.node, "Node name (default: the host name)");
  agent_cmd->add_option("--simulate", agent->options.simulate,
                        "Simulate GPUs: 8xH100-80GB-SXM, 4xA100-80GB-PCIE, dgx-a100, or a YAML machine spec");
  agent_cmd->add_option("--nvml", agent->options.nvml_library, "Path of libnvidia-ml.so.1 (default: the driver's)");
  agent_cmd->add_option("--state-dir", agent->options.state_dir, "Task logs and runtime state (default: <data dir>/agent)");
  agent_cmd->add_option("--metrics-listen", agent->options.metrics_listen, "host:port for /metrics and task logs");
  agent_cmd->add_option("--ca-file", agent->options.ca_file,
                        "https server: CA certificates (PEM) its certificate must chain to (default: $GPUPOOL_CA_FILE, "
                        "else the system's)");
  agent_cmd->add_option("--tls-cert", agent->options.tls_cert_file, "Serve /metrics and task logs over TLS: certificate (PEM)");
  agent_cmd->add_option("--tls-key", agent->options.tls_key_file, "... and its private key (PEM)");
  agent_cmd->add_option("--advertise-host", agent->options.advertise_host,
                        "Host the server uses to reach this agent's logs (default: the --metrics-listen "
                        "host, or the host name when that is 0.0.0.0)");
  agent_cmd->add_option("--mps-control", agent->options.mps_control_binary,
                        "Path of nvidia-cuda-mps-control (default: found in PATH)");
  agent_cmd->add_option("--label", agent->labels, "Node label key=value (repeatable)");
  agent_cmd->add_option("--cpu", agent->options.cpu, "CPU cores to offer (default: all online)");
  agent_cmd->add_option("--memory", agent->options.memory, "Memory to offer, e.g. 64Gi (default: all)");
  agent_cmd->add_option("--heartbeat-interval", agent->options.heartbeat_seconds,
                        "Seconds between heartbeats (default: what the server asks)");
  agent_cmd->add_option("--cuda-limiter", agent->options.cuda_limiter,
                        "libgpupool-cuda.so to preload into fractional time-sliced tasks (default: the one beside "
                        "this binary; none: off)");
  agent_cmd->add_option("--sim-faults", agent->options.sim_faults,
                        "Simulated GPUs: JSON file of injected GPU faults/telemetry, re-read every heartbeat");
  agent_cmd->add_option("--assignment-poll", agent->options.assignment_poll_seconds,
                        "Without the watch: seconds between assignment checks between heartbeats (default 1; 0: only "
                        "with heartbeats)")
      ->check(CLI::Range(0.0, 3600.0));
  agent_cmd->add_flag("--no-watch", [agent](int64_t) { agent->options.watch_assignments = false; },
                      "Poll for assignments instead of waiting on the server's push (a long poll)");
  agent_cmd->add_option("--container-root", agent->options.container_roots,
                        "A directory container rootfs and bundles may lie under (repeatable; default "
                        "/var/lib/gpupool/images)");
  agent_cmd->add_option("--checkpoint-root", agent->options.checkpoint_roots,
                        "A directory tasks' checkpoint directories may lie under (repeatable; default "
                        "/var/lib/gpupool/checkpoints)");
  agent_cmd->add_option("--volume-root", agent->options.volume_roots,
                        "A host directory hostPath volumes may lie under, mounted read-only (repeatable; default "
                        "none)");
  agent_cmd->add_option("--volume-root-rw", agent->options.volume_roots_rw,
                        "A host directory hostPath volumes may lie under, writable when the job asks (repeatable)");
  agent_cmd->add_option("--scratch-root", agent->options.scratch_root,
                        "Where disk scratch volumes live while their task runs (default /var/lib/gpupool/scratch)");
  agent_cmd->add_option("--cdi-spec-dir", agent->options.cdi_spec_dirs,
                        "A directory of CDI specs for the GPUs (repeatable, later ones win; default /etc/cdi "
                        "/var/run/cdi); where none describes nvidia.com/gpu the agent generates one")
      ->take_all();
  agent_cmd->add_option("--pod-network", agent->options.pod_network,
                        "An IPv4 subnet for containers with network: pod (e.g. 10.88.0.0/24; default none: such "
                        "tasks fail to start)");
  agent_cmd->add_option("--pod-bridge", agent->options.pod_bridge, "The pod network's bridge (default gpupool0)");
  agent_cmd->add_flag("--no-pod-nat", [agent](int64_t) { agent->options.pod_nat = false; },
                      "Pods' traffic leaves with their own addresses (the admin routes the subnet) instead of NAT");
  agent_cmd->add_option("--pod-deny", agent->options.pod_deny,
                        "A destination pods may not reach, such as the cluster's own network (repeatable; a CIDR or an address)");
  agent_cmd->add_option("--driver-root", agent->options.driver_root,
                        "Where the NVIDIA driver's libraries, binaries and device nodes are looked for when the agent "
                        "generates its CDI spec (default /)");
  agent_cmd->add_option("--task-pids-max", agent->options.task_pids_max,
                        "The most processes and threads one task may have at once (its cgroup's pids.max; "
                        "0: no limit; default 8192)")
      ->check(CLI::Range(int64_t{0}, int64_t{4194304}));
  agent_cmd->add_option("--runtime-class", agent->runtime_classes,
                        "A container runtime class and its binary, NAME=BINARY (repeatable; runc, crun and runsc are "
                        "found in PATH by default; kata only when given)");
  agent_cmd->add_option("--runsc-platform", agent->options.runsc_platform,
                        "The gVisor platform of runsc sandboxes (default ptrace; kvm needs /dev/kvm)");
  agent_cmd->add_option("--image-cache", agent->options.image_cache_dir,
                        "Where container images are unpacked (default /var/lib/gpupool/image-cache/<node>; every "
                        "directory above it must let others pass)");
  agent_cmd->add_option("--image-cache-max", agent->image_cache_max,
                        "Size above which unused images are evicted, least recently used first (default 50Gi)");
  agent_cmd->add_option("--image-registry", agent->options.image_registries,
                        "A registry docker:// images may come from (repeatable; default: any)");
  agent_cmd->add_option("--image-policy", agent->options.image_policy,
                        "A signature policy (containers-policy.json) every image pull must satisfy, local sources too");
  agent_cmd->add_option("--image-auth-file", agent->options.image_auth_file,
                        "Registry credentials (containers-auth.json, mode 0600) for docker:// images");
  agent_cmd->add_option("--hide", agent->options.hide,
                        "A host path no task may see, besides the agent's state and logs (repeatable: the "
                        "server's data dir and config when they share the host)");

  const std::function<int()> run_up = AddUpCommand(app);

  return [cmd, flags, agent_cmd, agent, run_up]() -> int {
    if (*cmd) return RunServer(*flags);
    if (*agent_cmd) return RunAgent(*agent);
    return run_up();
  };
}

}  // namespace gpupool
