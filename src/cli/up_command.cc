// `gpupool up`: the server and local agents in one process, the pool on this machine.
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
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
#include "agent/pod_network.h"
#include "cli/server_commands.h"
#include "cli/server_internal.h"

namespace gpupool::cli_internal {

namespace {

struct UpFlags {
  ServerFlags server;
  std::string simulate;
  int nodes = 1;
  std::string metrics_listen = "127.0.0.1:9400";
  double heartbeat_seconds = 0;
  double assignment_poll_seconds = 0.25;
  bool no_watch = false;
  std::string sim_faults;
  std::string log_dir;
  std::string log_max = "64Mi";
  int log_keep = 1;
  std::vector<std::string> container_roots;
  std::vector<std::string> checkpoint_roots;
  std::vector<std::string> volume_roots;
  std::vector<std::string> volume_roots_rw;
  std::string scratch_root = "/var/lib/gpupool/scratch";
  std::string image_cache;
  std::string image_cache_max = "50Gi";
  std::vector<std::string> image_registries;
  std::string image_policy;
  std::string image_auth_file;
  std::string pod_network;
  std::string pod_bridge = "gpupod";
  std::vector<std::string> pod_deny;
};

int RunUp(UpFlags flags) {
  if (flags.nodes < 1 || flags.nodes > 64) return Fail(Status::InvalidArgument("--nodes: must be 1..64"));
  int64_t log_max_bytes = 0;
  int log_keep = 0;
  if (Status st = ParseLogFlags(flags.log_max, flags.log_keep, &log_max_bytes, &log_keep); !st.ok()) return Fail(st);
  int64_t image_cache_max = 0;
  if (Status st = ParseImageCacheMax(flags.image_cache_max, &image_cache_max); !st.ok()) return Fail(st);
  sigset_t stop_signals = BlockStopSignals();
  auto running = StartServer(flags.server, "gpupool up");
  if (!running.ok()) return Fail(running.status());
  RunningServer& server = **running;
  std::string metrics_host = "127.0.0.1";
  int metrics_port = 9400;
  if (Status st = ParseListen(flags.metrics_listen, &metrics_host, &metrics_port); !st.ok()) {
    server.Stop();
    return Fail(st.WithContext("--metrics-listen"));
  }
  std::vector<std::unique_ptr<Agent>> agents;
  const std::string host = [] {
    char buf[128] = {};
    return ::gethostname(buf, sizeof(buf) - 1) == 0 && buf[0] != '\0' ? std::string(buf) : std::string("local");
  }();
  for (int i = 0; i < flags.nodes; ++i) {
    AgentOptions o;
    o.server = server.url;
    o.token = server.agent_token;
    o.node = flags.nodes == 1 ? host : fmt::format("{}-{}", host, i);
    o.simulate = flags.simulate;
    o.state_dir = server.config.data_dir + "/agent/" + o.node;
    // Task logs apart from the store and the agent's state: <data dir>/logs/<node> unless --log-dir.
    o.log_dir = (flags.log_dir.empty() ? server.config.data_dir + "/logs" : flags.log_dir) + "/" + o.node;
    o.log_max_bytes = log_max_bytes;
    o.log_keep = log_keep;
    o.metrics_listen = fmt::format("{}:{}", metrics_host, metrics_port == 0 ? 0 : metrics_port + i);
    o.heartbeat_seconds = flags.heartbeat_seconds;
    o.assignment_poll_seconds = flags.assignment_poll_seconds;
    o.watch_assignments = !flags.no_watch;
    o.sim_faults = flags.sim_faults;
    // The sandbox: images and checkpoints under the data dir (and where the flags add), and
    // nothing else of the data dir (the store, the admin token) or the config visible to a task.
    o.container_roots = {server.config.data_dir + "/images"};
    o.container_roots.insert(o.container_roots.end(), flags.container_roots.begin(), flags.container_roots.end());
    o.checkpoint_roots = {server.config.data_dir + "/checkpoints"};
    o.checkpoint_roots.insert(o.checkpoint_roots.end(), flags.checkpoint_roots.begin(), flags.checkpoint_roots.end());
    o.volume_roots = flags.volume_roots;
    o.volume_roots_rw = flags.volume_roots_rw;
    // Not under the data dir: that is 0700 (the admin token), and a container mounts its scratch
    // as the task's uid, which must pass every directory above it.
    o.scratch_root = flags.scratch_root + "/" + o.node;
    // Each node its own image cache (two caches never share a directory).
    if (!flags.image_cache.empty()) o.image_cache_dir = flags.image_cache + "/" + o.node;
    o.image_cache_max_bytes = image_cache_max;
    o.image_registries = flags.image_registries;
    o.image_policy = flags.image_policy;
    o.image_auth_file = flags.image_auth_file;
    // The pod network: each node its own share of the subnet, on a bridge of its own.
    if (!flags.pod_network.empty()) {
      auto subnet = PodSubnet(flags.pod_network, i, flags.nodes);
      if (!subnet.ok()) {
        server.Stop();
        return Fail(subnet.status().WithContext("--pod-network"));
      }
      o.pod_network = *subnet;
      o.pod_bridge = fmt::format("{}{}", flags.pod_bridge, i);
      o.pod_deny = flags.pod_deny;
    }
    o.hide = {server.config.data_dir};
    if (!flags.server.config.empty()) o.hide.push_back(flags.server.config);
    if (Status st = MakeDirs(o.state_dir); !st.ok()) {
      server.Stop();
      return Fail(st);
    }
    auto agent = Agent::Create(o);
    if (!agent.ok()) {
      server.Stop();
      return Fail(agent.status().WithContext("node " + o.node));
    }
    if (i == 0 || !flags.simulate.empty())
      std::cout << fmt::format("gpupool up: node {}: {}\n", (*agent)->node(), (*agent)->summary());
    if (Status st = (*agent)->Start(std::chrono::seconds(10)); !st.ok()) {
      server.Stop();
      return Fail(st.WithContext("node " + o.node));
    }
    std::cout << fmt::format("gpupool up: node {}: {} GPU(s){}, metrics at http://{}:{}/metrics\n", (*agent)->node(),
                             (*agent)->inventory().gpus.size(), (*agent)->inventory().simulated ? " (simulated)" : "",
                             metrics_host, (*agent)->metrics_port());
    agents.push_back(std::move(agent).value());
  }
  // The client's path (the `gpupool` beside this gpupool-core), so that the hint can be pasted as is.
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec && std::filesystem::exists(self.parent_path() / "gpupool", ec)) self = self.parent_path() / "gpupool";
  if (ec || self.empty()) self = "gpupool";
  std::cout << fmt::format(
                   "gpupool up: ready. Try, in another shell:\n  export GPUPOOL_SERVER={} GPUPOOL_DATA_DIR={}\n"
                   "  {} submit -f examples/jobs/hello-gpu.yaml && sleep 2 && {} list\n",
                   server.url, server.config.data_dir, self.string(), self.string())
            << std::flush;
  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::cout << "gpupool up: stopping\n" << std::flush;
  for (auto& a : agents) a->Stop(true);
  server.Stop();
  return 0;
}

}  // namespace

std::function<int()> AddUpCommand(CLI::App& app) {
  auto up = std::make_shared<UpFlags>();
  auto* up_cmd = app.add_subcommand("up", "Server and local agent(s) in one process: the pool on this machine");
  up_cmd->add_option("--data-dir", up->server.data_dir, "Store, token and task logs (default: " + DefaultDataDir() + ")");
  up_cmd->add_option("--listen", up->server.listen, "host:port of the API (default 127.0.0.1:8470)");
  up_cmd->add_option("--config", up->server.config, "Server config YAML (docs/server.md)");
  up_cmd->add_flag("--init", up->server.init,
                   "Start a new pool although the data dir (or its agents) says one existed and the store is missing");
  up_cmd->add_option("--simulate", up->simulate,
                     "Simulate GPUs (8xH100-80GB-SXM, ...); default: real GPUs through NVML, else 4xA100-80GB");
  up_cmd->add_option("--nodes", up->nodes, "Local agents, each a node (default 1)");
  up_cmd->add_option("--metrics-listen", up->metrics_listen,
                     "host:port of the first agent's /metrics; node i uses port+i (default 127.0.0.1:9400; port 0: any)");
  up_cmd->add_option("--heartbeat-interval", up->heartbeat_seconds, "Seconds between agent heartbeats");
  up_cmd->add_option("--log-dir", up->log_dir, "Task logs, per node (default: <data dir>/logs)");
  up_cmd->add_option("--log-max-bytes", up->log_max, "Cap of each task log file, e.g. 64Mi; 0: unbounded (default 64Mi)");
  up_cmd->add_option("--log-keep", up->log_keep, "Rotated files kept per task stream, 0..9 (default 1)");
  up_cmd->add_option("--sim-faults", up->sim_faults,
                     "Simulated GPUs: JSON file of injected GPU faults/telemetry for every agent (per node: "
                     "\"nodes\": {NAME: {\"gpus\": ...}})");
  up_cmd->add_option("--assignment-poll", up->assignment_poll_seconds,
                     "With --no-watch: seconds between the agents' assignment checks (default 0.25; 0: only with "
                     "heartbeats)")
      ->check(CLI::Range(0.0, 3600.0));
  up_cmd->add_option("--container-root", up->container_roots,
                     "Another directory container rootfs and bundles may lie under (repeatable; <data dir>/images "
                     "always)");
  up_cmd->add_option("--checkpoint-root", up->checkpoint_roots,
                     "Another directory checkpoint directories may lie under (repeatable; <data dir>/checkpoints "
                     "always)");
  up_cmd->add_option("--volume-root", up->volume_roots,
                     "A host directory hostPath volumes may lie under, mounted read-only (repeatable; default none)");
  up_cmd->add_option("--volume-root-rw", up->volume_roots_rw,
                     "A host directory hostPath volumes may lie under, writable when the job asks (repeatable)");
  up_cmd->add_option("--scratch-root", up->scratch_root,
                     "Disk scratch and MPI hostfiles of running tasks, <dir>/<node> per node (default "
                     "/var/lib/gpupool/scratch; every directory above it must let others pass)");
  up_cmd->add_option("--image-cache", up->image_cache,
                     "Where container images are unpacked, <dir>/<node> per node (default "
                     "/var/lib/gpupool/image-cache/<node>; every directory above it must let others pass)");
  up_cmd->add_option("--image-cache-max", up->image_cache_max,
                     "Per node: size above which unused images are evicted (default 50Gi)");
  up_cmd->add_option("--image-registry", up->image_registries,
                     "A registry docker:// images may come from (repeatable; default: any)");
  up_cmd->add_option("--image-policy", up->image_policy,
                     "A signature policy (containers-policy.json) every node's image pulls must satisfy");
  up_cmd->add_option("--image-auth-file", up->image_auth_file,
                     "Registry credentials (containers-auth.json, mode 0600) for docker:// images");
  up_cmd->add_option("--pod-network", up->pod_network,
                     "An IPv4 subnet for containers with network: pod, split evenly between the nodes (default none)");
  up_cmd->add_option("--pod-bridge", up->pod_bridge, "The nodes' pod bridges are named <this><node index> (default gpupod)");
  up_cmd->add_option("--pod-deny", up->pod_deny, "A destination pods may not reach (repeatable; CIDR or address)");
  up_cmd->add_flag("--no-watch", up->no_watch,
                   "Agents poll for assignments instead of waiting on the server's push (a long poll)");
  return [up_cmd, up]() -> int { return *up_cmd ? RunUp(*up) : -1; };
}

}  // namespace gpupool::cli_internal
