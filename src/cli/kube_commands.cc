// `gpupool kube-scheduler` (docs/kubernetes.md): flags, configuration, the metrics and health
// endpoint, signals. The scheduler itself is src/kube/kube_scheduler.cc.
#include "cli/kube_commands.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <iterator>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "config/profile_yaml.h"
#include "http/server.h"
#include "kube/kube_config.h"
#include "kube/kube_scheduler.h"
#include "kube/node_publisher.h"
#include "kube/device_plugin.h"
#include "kube/informer.h"
#include "kube/kube_node.h"
#include "agent/cdi.h"
#include "agent/mps.h"
#include "agent/gpu_metrics.h"
#include "cli/server_internal.h"
#include "server/config.h"

namespace gpupool {

namespace {

struct KubeSchedulerFlags {
  std::string kubeconfig;
  std::string context;
  std::string config;
  std::string profile;
  std::string scheduler_name = "gpupool";
  std::string listen = "0.0.0.0:10259";
  bool leader_elect = true;
  std::string lease_namespace;
  std::string lease_name = "gpupool-scheduler";
  std::string identity;
  double lease_duration = 15, renew_deadline = 10, retry_period = 2;
  int bind_workers = 16;
  double report_qps = 50;
  bool events = true;
};

int Fail(const Status& st) {
  std::cerr << "gpupool kube-scheduler: " << st.ToString() << "\n";
  return st.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

std::string DefaultIdentity() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  std::random_device rd;
  return fmt::format("{}_{:08x}", host[0] ? host : "gpupool", rd());
}

std::chrono::milliseconds Ms(double seconds) { return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)); }

// /metrics (the daemon's text and the HTTP layer's counters) and /healthz (200 or 503 with `why`)
// on `listen`; nullptr when `listen` is empty.
Result<std::unique_ptr<http::Server>> ServeEndpoints(const std::string& listen, const char* who,
                                                     std::function<std::string()> metrics,
                                                     std::function<bool(std::string*)> healthy) {
  if (listen.empty()) return std::unique_ptr<http::Server>();
  std::string host;
  int port = 0;
  RETURN_IF_ERROR(ParseListen(listen, &host, &port).WithContext("--listen"));
  http::ServerOptions ho;
  ho.normal_workers = 2;
  ho.priority_workers = 1;
  auto server = std::make_unique<http::Server>(ho);
  http::Server* self = server.get();
  server->Get("/metrics", [metrics, self](const http::Request&, http::Response& res) {
    res.set_content(metrics() + self->MetricsText("gpupool_kube_http"), "text/plain; version=0.0.4");
  });
  server->Get("/healthz", [healthy](const http::Request&, http::Response& res) {
    std::string why;
    res.status = healthy(&why) ? 200 : 503;
    res.set_content(why + "\n", "text/plain");
  }, http::Lane::kPriority);
  auto bound = server->Listen(host, port);
  if (!bound.ok()) return bound.status().WithContext("--listen " + listen);
  std::cerr << fmt::format("{}: /metrics and /healthz on {}:{}\n", who, host, *bound);
  return server;
}

int RunKubeScheduler(const KubeSchedulerFlags& f) {
  sigset_t stop_signals = cli_internal::BlockStopSignals();
  sigaddset(&stop_signals, SIGUSR1);  // sent to ourselves when the lease is lost
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  // Where the API server is: --kubeconfig, $KUBECONFIG, else the pod's service account.
  std::string kubeconfig = f.kubeconfig;
  if (kubeconfig.empty() && std::getenv("KUBECONFIG")) kubeconfig = std::getenv("KUBECONFIG");
  auto endpoint = kubeconfig.empty() ? kube::LoadInCluster() : kube::LoadKubeconfig(kubeconfig, f.context);
  if (!endpoint.ok())
    return Fail(endpoint.status().WithContext(kubeconfig.empty() ? "in-cluster configuration (no --kubeconfig)"
                                                                  : "kubeconfig " + kubeconfig));
  kube::KubeSchedulerOptions options;
  options.cluster.scheduler_name = f.scheduler_name;
  std::string profile = f.profile;
  if (!f.config.empty()) {
    // The server's config format, of which the kube-scheduler honours five keys: any other is
    // refused rather than silently ignored (backfill, say, is not done here).
    std::ifstream in(f.config);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) return Fail(Status::IoError("cannot read config file " + f.config));
    auto tree = ParseYamlValue(text.str(), f.config);
    if (!tree.ok()) return Fail(tree.status());
    if (const Value::Map* top = tree->AsMap()) {
      for (const auto& [key, value] : *top)
        if (key != "profile" && key != "ordering" && key != "tenants" && key != "queues" && key != "preemption")
          return Fail(Status::InvalidArgument(fmt::format(
              "{}: {}: the kube-scheduler reads profile, ordering, tenants, queues and preemption only", f.config, key)));
    }
    auto config = LoadServerConfig(f.config);
    if (!config.ok()) return Fail(config.status());
    options.cluster.ordering = config->ordering;
    options.cluster.preemption = config->preemption;
    options.cluster.namespace_tenants = config->namespace_tenants;
    options.eviction_grace_seconds = config->grace_period_seconds;
    if (profile.empty()) profile = config->profile;
  }
  if (profile.empty()) profile = "balanced";
  const bool file = profile.ends_with(".yaml") || profile.ends_with(".yml");
  auto p = file ? LoadProfileFile(profile) : ProfileForPolicy(profile);
  if (!p.ok()) return Fail(p.status().WithContext("profile"));
  options.cluster.profile = std::move(p).value();
  options.leader_elect = f.leader_elect;
  options.leader.name = f.lease_name;
  options.leader.namespace_name = f.lease_namespace;
  if (options.leader.namespace_name.empty() && std::getenv("POD_NAMESPACE")) options.leader.namespace_name = std::getenv("POD_NAMESPACE");
  if (options.leader.namespace_name.empty()) options.leader.namespace_name = endpoint->namespace_name;
  options.leader.identity = f.identity.empty() ? DefaultIdentity() : f.identity;
  options.leader.lease_duration = Ms(f.lease_duration);
  options.leader.renew_deadline = Ms(f.renew_deadline);
  options.leader.retry_period = Ms(f.retry_period);
  options.bind_workers = f.bind_workers;
  options.report_qps = f.report_qps;
  options.events = f.events;

  auto client = kube::KubeClient::Create(*endpoint);
  if (!client.ok()) return Fail(client.status());
  auto scheduler = kube::KubeScheduler::Create(client->get(), std::move(options));
  if (!scheduler.ok()) return Fail(scheduler.status());
  kube::KubeScheduler& s = **scheduler;
  std::atomic<bool> lost{false};
  const pid_t self = getpid();
  s.OnLostLeadership([&lost, self] {
    lost = true;
    kill(self, SIGUSR1);
  });

  auto http = ServeEndpoints(
      f.listen, "gpupool kube-scheduler", [&s] { return s.MetricsText(); }, [&s](std::string* why) { return s.Healthy(why); });
  if (!http.ok()) return Fail(http.status());
  std::cerr << fmt::format("gpupool kube-scheduler: {} schedules pods with schedulerName {} on {}{}\n",
                           f.identity.empty() ? "this replica" : f.identity, f.scheduler_name, endpoint->server,
                           f.leader_elect ? " once it leads" : "");
  s.Start();
  int sig = 0;
  sigwait(&stop_signals, &sig);
  s.Stop();
  if (*http) (*http)->Stop();
  if (lost.load()) {
    std::cerr << "gpupool kube-scheduler: exiting: the lease was lost (a restarted replica stands by again)\n";
    return 1;
  }
  return 0;
}

struct KubeNodeFlags {
  std::string kubeconfig;
  std::string context;
  std::string node;
  std::string simulate;
  std::string nvml_library;
  double interval = 10;
  std::string listen = "0.0.0.0:9400";
  std::string plugin_dir = "/var/lib/kubelet/device-plugins";
  std::string pod_resources = "/var/lib/kubelet/pod-resources/kubelet.sock";
  std::vector<std::string> resources = {"gpupool.io/gpu"};
  int slots_per_gpu = 0;
  std::string cdi_kind;
  std::string mps_pipe_root;
  std::string mps_control;
  double allocate_wait = 10;
};

// Keeps the node's MPS control daemons to what its pods use (kube::MpsUsers): a daemon nobody uses
// is quit, a pod whose daemon died gets it again. Runs every `interval` until stopped, and only on
// a synced pod list (an empty list before the first one must not quit daemons in use).
class MpsKeeper {
 public:
  MpsKeeper(MpsDaemons* mps, std::function<std::optional<std::vector<nlohmann::json>>()> pods,
            std::function<std::set<std::string>()> admitted, std::function<Inventory()> inventory, std::string node,
            std::chrono::milliseconds interval)
      : mps_(mps), pods_(std::move(pods)), admitted_(std::move(admitted)), inventory_(std::move(inventory)),
        node_(std::move(node)), interval_(interval), thread_([this] { Run(); }) {}
  ~MpsKeeper() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, interval_, [this] { return stop_; })) {
      lock.unlock();
      Reconcile();
      lock.lock();
    }
  }
  void Reconcile() {
    const auto pods = pods_();
    if (!pods) return;
    const auto want = kube::MpsUsers(*pods, node_, inventory_(), admitted_());
    for (const std::string& gpu : mps_->Gpus()) {
      const auto w = want.find(gpu);
      for (const std::string& user : mps_->Users(gpu)) {
        if (w != want.end() && w->second.count(user)) continue;
        if (Status st = mps_->Release(gpu, user); !st.ok())
          std::cerr << fmt::format("gpupool kube-node: {}\n", st.ToString());
      }
    }
    for (const auto& [gpu, users] : want) {
      for (const std::string& user : users) {
        if (Status st = mps_->Ensure(gpu, user); !st.ok())
          std::cerr << fmt::format("gpupool kube-node: pod {}: {}\n", user, st.ToString());
      }
    }
  }

  MpsDaemons* mps_;
  std::function<std::optional<std::vector<nlohmann::json>>()> pods_;
  std::function<std::set<std::string>()> admitted_;
  std::function<Inventory()> inventory_;
  std::string node_;
  std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: started once everything above is set
};

// The node's allocatable pods (kubelet's --max-pods), as the scheduler reads them: pods per GPU can
// never be more. 0 when the Node cannot be read.
int NodePodLimit(kube::KubeClient* client, const std::string& node) {
  auto got = client->Get("/api/v1/nodes/" + node);
  if (!got.ok() || got->code != 200) return 0;
  auto parsed = kube::ParseKubeNode(got->body, GpuCatalog::Builtin());
  return parsed.ok() ? std::min(parsed->spec.max_tasks, 1000) : 0;
}

int RunKubeNode(const KubeNodeFlags& f) {
  sigset_t stop_signals = cli_internal::BlockStopSignals();
  auto fail = [](const Status& st) {
    std::cerr << "gpupool kube-node: " << st.ToString() << "\n";
    return st.code() == StatusCode::kInvalidArgument ? 2 : 1;
  };
  std::string node = f.node;
  if (node.empty() && std::getenv("NODE_NAME")) node = std::getenv("NODE_NAME");
  if (node.empty()) return fail(Status::InvalidArgument("--node-name (or $NODE_NAME): the Node object's name is needed"));
  std::string kubeconfig = f.kubeconfig;
  if (kubeconfig.empty() && std::getenv("KUBECONFIG")) kubeconfig = std::getenv("KUBECONFIG");
  auto endpoint = kubeconfig.empty() ? kube::LoadInCluster() : kube::LoadKubeconfig(kubeconfig, f.context);
  if (!endpoint.ok()) return fail(endpoint.status());
  // The GPUs: NVML's, or a simulated machine when asked (never silently: a GPU node whose driver
  // cannot be loaded must not look like a node without GPUs).
  std::unique_ptr<Nvml> nvml;
  Inventory inv;
  if (f.simulate.empty()) {
    auto loaded = Nvml::Load(f.nvml_library);
    if (!loaded.ok()) return fail(loaded.status().WithContext("loading NVML (--simulate SPEC to simulate GPUs)"));
    auto found = (*loaded)->Discover();
    if (!found.ok()) return fail(found.status().WithContext("discovering GPUs through NVML"));
    inv = std::move(found).value();
    nvml = std::move(loaded).value();
  } else {
    auto sim = SimulatedInventory(f.simulate, node);
    if (!sim.ok()) return fail(sim.status().WithContext("--simulate"));
    inv = std::move(sim).value();
  }
  auto client = kube::KubeClient::Create(*endpoint);
  if (!client.ok()) return fail(client.status());
  kube::NodePublisher::Options po;
  po.node = node;
  po.interval = Ms(f.interval);
  kube::NodePublisher::HealthFn health;
  if (nvml) health = [&nvml]() { return nvml->Health(); };
  kube::NodePublisher publisher(client->get(), inv, po, health);

  // The device plugin: this node's pods (to find the one kubelet admits), one plugin per resource.
  std::unique_ptr<kube::Informer> pods;
  std::vector<std::unique_ptr<kube::DevicePlugin>> plugins;
  // MPS control daemons for mps pods: real GPUs only (simulated ones get the variables alone), and
  // only with a pipe root that the pods' containers can mount.
  std::unique_ptr<MpsDaemons> mps;
  if (!inv.simulated && !f.mps_pipe_root.empty() && !f.plugin_dir.empty()) {
    MpsOptions mo;
    mo.root = f.mps_pipe_root;
    if (!f.mps_control.empty()) mo.control_binary = f.mps_control;
    mps = std::make_unique<MpsDaemons>(std::move(mo));
  }
  if (!f.plugin_dir.empty()) {
    kube::Informer::Options io;
    io.path = "/api/v1/pods";
    io.query = "fieldSelector=spec.nodeName%3D" + node;
    pods = std::make_unique<kube::Informer>(client->get(), io, [](const std::string&, const nlohmann::json&) {});
    int slots = f.slots_per_gpu;
    if (slots == 0) slots = NodePodLimit(client->get(), node);
    if (slots == 0) slots = 110;  // kubelet's default --max-pods
    if (std::set<std::string>(f.resources.begin(), f.resources.end()).size() != f.resources.size())
      return fail(Status::InvalidArgument("--resource: a resource is named twice"));
    for (const std::string& resource : f.resources) {
      kube::DevicePlugin::Options o;
      o.node = node;
      o.resource = resource;
      o.plugin_dir = f.plugin_dir;
      o.pod_resources_socket = f.pod_resources;
      o.slots_per_gpu = slots;
      o.find_wait = Ms(f.allocate_wait);
      o.grant.node = node;
      o.grant.cdi_kind = f.cdi_kind;
      o.grant.mps_pipe_root = f.mps_pipe_root;
      o.mps = mps.get();
      if (!inv.simulated) {
        o.grant.control_devices = FindDriverFiles("/").control_devices;
        std::ifstream in("/proc/driver/nvidia-caps/mig-minors");
        o.grant.mig_minors.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      }
      kube::Informer* informer = pods.get();
      plugins.push_back(std::make_unique<kube::DevicePlugin>(
          o,
          [informer] {
            std::vector<nlohmann::json> out;
            for (auto& [key, pod] : informer->Snapshot()) out.push_back(std::move(pod));
            return out;
          },
          [&publisher] { return publisher.inventory(); }));
    }
  }

  auto http = ServeEndpoints(
      f.listen, "gpupool kube-node",
      [&] {
        std::vector<GpuSample> samples;
        if (nvml) {
          if (auto sampled = nvml->Sample(); sampled.ok()) samples = std::move(sampled).value();
        }
        std::string text = RenderGpuMetrics(node, publisher.inventory(), samples, {});
        text += kube::DevicePluginMetrics(plugins);
        if (mps) {
          text += fmt::format(
              "# HELP gpupool_kube_node_mps_daemons MPS control daemons kube-node keeps for mps pods.\n"
              "# TYPE gpupool_kube_node_mps_daemons gauge\ngpupool_kube_node_mps_daemons {}\n"
              "# HELP gpupool_kube_node_mps_daemon_starts_total MPS control daemons started (restarts included).\n"
              "# TYPE gpupool_kube_node_mps_daemon_starts_total counter\ngpupool_kube_node_mps_daemon_starts_total {}\n",
              mps->Gpus().size(), mps->starts());
        }
        return text;
      },
      [&](std::string* why) {
        bool ok = publisher.published();
        *why = ok ? "ok: the inventory is on the Node" : "not published: " + publisher.last_error();
        for (const auto& p : plugins) {
          if (p->registered()) continue;
          ok = false;
          *why += "; device plugin not registered with kubelet: " + p->last_error();
        }
        return ok;
      });
  if (!http.ok()) return fail(http.status());
  std::cerr << fmt::format("gpupool kube-node: node {}: {} GPU(s) ({}), publishing to {}\n", node, inv.gpus.size(),
                           inv.source, endpoint->server);
  publisher.Start();
  if (pods) pods->Start();
  // The inventory on the Node first: a node whose kubelet advertises slots before the scheduler can
  // read its GPUs would be kept out of placement as unreadable for that while.
  for (int i = 0; i < 100 && !plugins.empty() && !publisher.published(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (auto& p : plugins) {
    if (Status st = p->Start(); !st.ok()) {
      publisher.Stop();
      return fail(st);
    }
    std::cerr << fmt::format("gpupool kube-node: device plugin for {} on {}\n", p->resource(),
                             p->socket_path());
  }
  std::unique_ptr<MpsKeeper> keeper;
  if (mps) {
    kube::Informer* informer = pods.get();
    keeper = std::make_unique<MpsKeeper>(
        mps.get(),
        [informer]() -> std::optional<std::vector<nlohmann::json>> {
          if (!informer->WaitSynced(std::chrono::milliseconds(0))) return std::nullopt;
          std::vector<nlohmann::json> out;
          for (auto& [key, pod] : informer->Snapshot()) out.push_back(std::move(pod));
          return out;
        },
        [&plugins] {
          std::set<std::string> out;
          for (const auto& p : plugins) out.merge(p->AdmittedPods());
          return out;
        },
        [&publisher] { return publisher.inventory(); }, node, Ms(std::min(f.interval, 5.0)));
  }
  int sig = 0;
  sigwait(&stop_signals, &sig);
  keeper.reset();
  for (auto& p : plugins) p->Stop();
  if (pods) pods->Stop();
  publisher.Stop();
  if (*http) (*http)->Stop();
  return 0;
}

}  // namespace

std::function<int()> AddKubeCommands(CLI::App& app) {
  auto flags = std::make_shared<KubeSchedulerFlags>();
  auto* cmd = app.add_subcommand("kube-scheduler", "Schedule Kubernetes pods with schedulerName gpupool (docs/kubernetes.md)");
  cmd->add_option("--kubeconfig", flags->kubeconfig, "kubeconfig file (default: $KUBECONFIG, else in-cluster)");
  cmd->add_option("--context", flags->context, "the kubeconfig's context (default: its current one)");
  cmd->add_option("--config", flags->config, "server config YAML: its profile, ordering, tenants, queues and preemption");
  cmd->add_option("--profile", flags->profile, "placement policy or profile YAML (default: the config's, else balanced)");
  cmd->add_option("--scheduler-name", flags->scheduler_name, "the pods' spec.schedulerName")->capture_default_str();
  cmd->add_option("--listen", flags->listen, "host:port of /metrics and /healthz (empty: none)")->capture_default_str();
  cmd->add_option("--leader-elect", flags->leader_elect, "lead through a Lease (two replicas or more)")->capture_default_str();
  cmd->add_option("--lease-namespace", flags->lease_namespace, "the Lease's namespace (default: $POD_NAMESPACE, else the kubeconfig's)");
  cmd->add_option("--lease-name", flags->lease_name, "the Lease's name")->capture_default_str();
  cmd->add_option("--identity", flags->identity, "this replica's name in the Lease (default: hostname and a random suffix)");
  cmd->add_option("--lease-duration", flags->lease_duration, "seconds a standby waits before taking a silent leader's lease")
      ->capture_default_str()->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--renew-deadline", flags->renew_deadline, "seconds a leader may go without renewing before it stops")
      ->capture_default_str()->check(CLI::Range(0.05, 3600.0));
  cmd->add_option("--retry-period", flags->retry_period, "seconds between lease renewals and tries")
      ->capture_default_str()->check(CLI::Range(0.01, 600.0));
  cmd->add_option("--bind-workers", flags->bind_workers, "bindings in flight at once")->capture_default_str()->check(CLI::Range(1, 256));
  cmd->add_option("--report-qps", flags->report_qps, "pending-pod conditions and Events written per second, at most")
      ->capture_default_str()->check(CLI::Range(0.1, 10000.0));
  cmd->add_option("--events", flags->events, "write Events (FailedScheduling, Scheduled)")->capture_default_str();
  auto nf = std::make_shared<KubeNodeFlags>();
  auto* node_cmd = app.add_subcommand(
      "kube-node", "Publish this Kubernetes node's GPUs and their health for gpupool (docs/kubernetes.md)");
  node_cmd->add_option("--node-name", nf->node, "the Node object's name (default: $NODE_NAME)");
  node_cmd->add_option("--kubeconfig", nf->kubeconfig, "kubeconfig file (default: $KUBECONFIG, else in-cluster)");
  node_cmd->add_option("--context", nf->context, "the kubeconfig's context (default: its current one)");
  node_cmd->add_option("--simulate", nf->simulate, "simulate GPUs instead of NVML's: 4xA100-80GB, dgx-a100, ...");
  node_cmd->add_option("--nvml-library", nf->nvml_library, "libnvidia-ml.so.1 to load (default: the system's)");
  node_cmd->add_option("--interval", nf->interval, "seconds between health checks")->capture_default_str()
      ->check(CLI::Range(0.05, 3600.0));
  node_cmd->add_option("--listen", nf->listen, "host:port of /metrics and /healthz (empty: none)")->capture_default_str();
  node_cmd->add_option("--device-plugin-dir", nf->plugin_dir, "kubelet's device-plugins directory (empty: no device plugin)")
      ->capture_default_str();
  node_cmd->add_option("--pod-resources-socket", nf->pod_resources, "kubelet's pod-resources socket (empty: not read)")
      ->capture_default_str();
  node_cmd->add_option("--resource", nf->resources, "extended resource to serve (repeat: also nvidia.com/gpu)")
      ->capture_default_str();
  node_cmd->add_option("--slots-per-gpu", nf->slots_per_gpu, "pods that may share a GPU as kubelet counts (0: the node's pods)")
      ->capture_default_str()->check(CLI::Range(0, 1000));
  node_cmd->add_option("--cdi-kind", nf->cdi_kind, "name GPUs to the runtime by CDI (nvidia.com/gpu) instead of device nodes");
  node_cmd->add_option("--allocate-wait", nf->allocate_wait, "seconds Allocate waits to see the pod kubelet admits")
      ->capture_default_str()->check(CLI::Range(0.0, 120.0));
  node_cmd->add_option("--mps-pipe-root", nf->mps_pipe_root,
                       "root of the per-GPU MPS pipe and log directories, mounted into mps pods; with real GPUs "
                       "kube-node runs their MPS control daemons there (empty: neither)");
  node_cmd->add_option("--mps-control", nf->mps_control, "path of nvidia-cuda-mps-control (default: found in PATH)");
  return [cmd, flags, node_cmd, nf]() -> int {
    if (*cmd) return RunKubeScheduler(*flags);
    if (*node_cmd) return RunKubeNode(*nf);
    return -1;
  };
}

}  // namespace gpupool
