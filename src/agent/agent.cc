// Agent: creation, the node credential and cluster identity, registration, the log endpoint, and
// the loop (heartbeats, assignments). Tasks are in agent_tasks.cc, the lease and GPU health in
// agent_health.cc, the assignment watch in agent_watch.cc.
#include "agent/agent.h"
#include "agent/child_exits.h"
#include "agent/container_preload.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>

#include <openssl/crypto.h>

#include "http/server.h"
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>

#include "agent/gpu_metrics.h"
#include "agent/node_identity.h"
#include "agent/runtime_internal.h"
#include "model/node.h"
#include "client/api_client.h"
#include "common/quantity.h"

namespace gpupool {

using nlohmann::json;

namespace {

// The most bytes of a task log one request returns (the server asks for no more).
constexpr uint64_t kMaxLogChunk = 4 << 20;

std::string HostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "node";
  return buf;
}

std::string MachineCpu() {
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return std::to_string(n > 0 ? n : 1);
}

std::string MachineMemory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  const int64_t mib = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page / (1024 * 1024) : 1024;
  return FormatMemory(MiB(mib));
}

Status ReplyError(const Result<HttpReply>& r, const std::string& what) {
  if (!r.ok()) return r.status().WithContext(what);
  // The server answered 5xx: as good as unreachable (it may be starting); a 4xx is a refusal.
  if (r->status >= 500) return Status::IoError(fmt::format("{}: {}", what, ErrorMessage(*r)));
  return Status::FailedPrecondition(fmt::format("{}: {}", what, ErrorMessage(*r)));
}

bool Ok2xx(const Result<HttpReply>& r) {
  return r.ok() && r->status >= 200 && r->status < 300;
}

Result<std::pair<std::string, int>> SplitListen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0)
    return Status::InvalidArgument(fmt::format("metrics listen address '{}': want host:port", listen));
  const std::string host = listen.substr(0, colon);
  int port = 0;
  try {
    size_t used = 0;
    port = std::stoi(listen.substr(colon + 1), &used);
    if (used != listen.size() - colon - 1) throw std::invalid_argument("trailing");
  } catch (const std::exception&) {
    return Status::InvalidArgument(fmt::format("metrics listen address '{}': bad port", listen));
  }
  if (port < 0 || port > 65535)
    return Status::InvalidArgument(fmt::format("metrics listen address '{}': port out of range", listen));
  return std::make_pair(host, port);
}

}  // namespace


Agent::Agent(AgentOptions options) : options_(std::move(options)) {}

Agent::~Agent() {
  Stop(false);
  images_.reset();  // joins the pull workers, which wake the loop through members declared later
}

Result<std::unique_ptr<Agent>> Agent::Create(AgentOptions options) {
  if (options.node.empty()) options.node = HostName();
  if (options.cpu.empty()) options.cpu = MachineCpu();
  if (options.memory.empty()) options.memory = MachineMemory();
  if (options.state_dir.empty()) return Status::InvalidArgument("agent: a state directory is needed");
  std::unique_ptr<Agent> agent(new Agent(std::move(options)));
  AgentOptions& o = agent->options_;
  // The sandbox's paths are absolute in the task's mount namespace, whatever the agent's cwd.
  for (auto* list : {&agent->options_.container_roots, &agent->options_.checkpoint_roots, &agent->options_.hide,
                     &agent->options_.volume_roots, &agent->options_.volume_roots_rw}) {
    for (auto& p : *list) {
      std::error_code ec;
      auto abs = std::filesystem::weakly_canonical(std::filesystem::absolute(p, ec), ec);
      if (!ec) p = abs.string();
    }
  }
  for (auto* dir : {&agent->options_.state_dir, &agent->options_.log_dir, &agent->options_.scratch_root}) {
    std::error_code ec;
    if (dir->empty()) continue;
    auto abs = std::filesystem::weakly_canonical(std::filesystem::absolute(*dir, ec), ec);
    if (!ec) *dir = abs.string();
  }
  {
    std::random_device rd;
    for (int i = 0; i < 4; ++i) agent->log_token_ += fmt::format("{:08x}", rd());
  }
  if (o.simulate.empty()) {
    auto nvml = Nvml::Load(o.nvml_library);
    if (nvml.ok()) {
      auto inv = (*nvml)->Discover();
      if (!inv.ok()) return inv.status().WithContext("discovering GPUs through NVML");
      agent->inventory_ = std::move(inv).value();
      agent->nvml_ = std::move(nvml).value();
      agent->summary_ = fmt::format("{} GPU(s) found through NVML (driver {})", agent->inventory_.gpus.size(),
                                    agent->inventory_.driver_version);
    } else {
      agent->summary_ = fmt::format("no NVIDIA GPUs here ({}); simulating {}", nvml.status().message(),
                                    o.default_simulation);
      o.simulate = o.default_simulation;
    }
  } else {
    agent->summary_ = fmt::format("simulating {} as asked", o.simulate);
  }
  if (agent->inventory_.gpus.empty() && !o.simulate.empty()) {
    auto inv = SimulatedInventory(o.simulate, o.node);
    if (!inv.ok()) return inv.status().WithContext("--simulate");
    agent->inventory_ = std::move(inv).value();
  }
  agent->LoadCdi();
  if (!agent->cdi_note_.empty()) agent->summary_ += "; " + agent->cdi_note_;
  if (!o.sim_faults.empty() && !agent->inventory_.simulated)
    return Status::InvalidArgument("--sim-faults: only simulated GPUs take injected faults (add --simulate)");
  if (o.cuda_limiter == "none") {
    agent->cuda_limiter_.clear();
  } else if (!o.cuda_limiter.empty()) {
    if (o.cuda_limiter.front() != '/' || ::access(o.cuda_limiter.c_str(), R_OK) != 0)
      return Status::InvalidArgument(
          fmt::format("--cuda-limiter {}: not a readable file by an absolute path", o.cuda_limiter));
    agent->cuda_limiter_ = o.cuda_limiter;
  } else {
    std::error_code ec;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
    const std::filesystem::path beside = self.parent_path() / "libgpupool-cuda.so";
    if (!ec && ::access(beside.c_str(), R_OK) == 0) agent->cuda_limiter_ = beside.string();
  }
  agent->lease_path_ = o.state_dir + "/lease";
  // A restarted agent keeps its tasks' lease: it knows the server's timeout from the file.
  if (auto text = agent_internal::ReadFile(agent->lease_path_); text.ok()) {
    if (auto d = agent_internal::ReadLeaseFile(agent->lease_path_)) {
      agent->lease_term_ms_ = d->term_ms;
      agent->lease_kill_ms_ = d->kill_ms;
    }
    std::istringstream in(*text);
    int64_t a = 0, b = 0, timeout_ms = 0;
    if (in >> a >> b >> timeout_ms && timeout_ms > 0) agent->lease_timeout_s_ = static_cast<double>(timeout_ms) / 1000;
  }
  if (!agent->inventory_.simulated) {
    // Started per GPU when its first mps task starts; a missing binary fails those tasks only.
    MpsOptions mo;
    mo.root = o.state_dir + "/mps";
    if (!o.mps_control_binary.empty()) mo.control_binary = o.mps_control_binary;
    agent->mps_ = std::make_unique<MpsDaemons>(std::move(mo));
  }
  RuntimeOptions ro;
  ro.state_dir = o.state_dir + "/process";
  ro.log_max_bytes = o.log_max_bytes;
  ro.log_keep = o.log_keep;
  if (!o.log_dir.empty()) ro.log_dir = o.log_dir + "/process";
  agent->sandbox_ = ::geteuid() == 0;
  if (!agent->sandbox_)
    std::cerr << fmt::format("gpupool agent {}: not running as root: tasks run as this agent's uid, without the task "
                             "sandbox (docs/agent.md#the-task-sandbox)\n", o.node);
  if (!o.pod_network.empty()) {
    PodNetworkOptions po;
    po.cidr = o.pod_network;
    po.bridge = o.pod_bridge;
    po.nat = o.pod_nat;
    po.deny = o.pod_deny;
    po.work_dir = o.state_dir + "/pod-network";
    auto pods = PodNetwork::Create(std::move(po));
    if (!pods.ok()) return pods.status();
    agent->pod_network_ = std::move(pods).value();
    agent->summary_ += "; " + agent->pod_network_->Describe();
  }
  auto process = MakeProcessRuntime(ro);
  if (!process.ok()) return process.status().WithContext("the process runtime");
  agent->process_runtime_ = std::move(process).value();
  // Every container class the agent knows: runc, crun and runsc by their names in PATH, kata (and
  // any other binary) only where the admin names it. Each keeps its own state and logs.
  std::map<std::string, std::string> classes = {{"runc", "runc"}, {"crun", "crun"}, {"runsc", "runsc"}};
  for (const auto& [cls, binary] : o.runtime_classes) classes[cls] = binary;
  for (const auto& [cls, binary] : classes) {
    RuntimeOptions rc = ro;
    rc.container_roots = o.container_roots;
    rc.runtime_class = cls;
    rc.runc_binary = binary;
    rc.state_dir = o.state_dir + "/" + cls;
    if (!o.log_dir.empty()) rc.log_dir = o.log_dir + "/" + cls;
    if (cls == "runsc") {
      // gVisor: the sandbox's platform, the spec's seccomp applied inside it too, and the network
      // per container (runsc takes it on its command line, not from the spec).
      rc.global_flags = {"--platform=" + o.runsc_platform, "--oci-seccomp"};
      rc.network_flag = true;
    }
    auto made = MakeRuncRuntime(rc);
    if (made.ok()) {
      agent->containers_[cls] = std::move(made).value();
    } else {
      agent->container_errors_[cls] = made.status().message();
    }
  }
  // What this node offers containers, for the scheduler to place on (model/node.h): the classes
  // that could be made, the pod network. An admin's own label of that name is overridden.
  for (const auto& [cls, rt] : agent->containers_) o.labels[kRuntimeClassLabelPrefix + cls] = "true";
  for (const auto& [cls, why] : agent->container_errors_) o.labels.erase(kRuntimeClassLabelPrefix + cls);
  if (agent->pod_network_) {
    o.labels[kPodNetworkLabel] = "true";
  } else {
    o.labels.erase(kPodNetworkLabel);
  }
  // What holds GPU shares to their size here, for the scheduler's QoS (a guaranteed share shares a
  // GPU only with shares held): the CUDA limiter in fractional timeslice process tasks, and in
  // container tasks where runc runs (the runtime preloads it through /etc/ld.so.preload and refuses
  // an image that could not load it), and MPS limits set and read back through the control daemon
  // before an mps task starts (a task whose limits cannot be set does not start). On simulated
  // GPUs containers run without the limiter (no driver for it to hold), so they are not said to be
  // held. An admin's label is overridden.
  for (uint8_t bit : kEnforceBits) o.labels.erase(EnforceLabel(bit));
  if (!agent->cuda_limiter_.empty()) o.labels[EnforceLabel(kEnforceLimiter)] = "true";
  if (!agent->cuda_limiter_.empty() && !agent->inventory_.simulated && agent->containers_.count("runc") != 0 &&
      agent_internal::ReadElfVersionsAt(agent->cuda_limiter_).ok())  // every start checks it again
    o.labels[EnforceLabel(kEnforceLimiterContainer)] = "true";
  if (agent->mps_) o.labels[EnforceLabel(kEnforceMps)] = "true";
  ImageCacheOptions io;
  io.dir = o.image_cache_dir.empty() ? "/var/lib/gpupool/image-cache/" + o.node : o.image_cache_dir;
  io.max_bytes = o.image_cache_max_bytes;
  io.local_roots = o.container_roots;
  io.registries = o.image_registries;
  io.policy = o.image_policy;
  io.auth_file = o.image_auth_file;
  // Wrong credentials or policy stop the agent now, not its first task with an image.
  RETURN_IF_ERROR(CheckImagePolicyAndCredentials(io));
  Agent* self = agent.get();
  io.on_done = [self] { self->WakeLoop(); };
  agent->image_options_ = std::move(io);
  // A cache left by an earlier agent is opened at once (its users are checked); otherwise the
  // first task with an image makes it.
  std::error_code ec;
  if (std::filesystem::exists(agent->image_options_.dir + "/images", ec)) {
    std::lock_guard<std::mutex> lock(agent->mu_);
    (void)agent->Images();
  }
  ClientConfig cc;
  cc.server = o.server;
  cc.token = o.token;
  cc.ca_file = o.ca_file;
  cc.client_cert_file = o.tls_cert_file;
  cc.client_key_file = o.tls_key_file;
  cc.connect_timeout_s = 2;
  cc.read_timeout_s = 10;
  auto client = ApiClient::Create(cc);
  if (!client.ok()) return client.status().WithContext("--server");
  agent->client_ = std::make_unique<ApiClient>(std::move(client).value());
  agent->cluster_id_ = ReadClusterId(o.state_dir);
  if (auto cred = ReadNodeCredential(o.state_dir, o.node)) {
    if (Status st = agent->UseCredential(*cred, false); !st.ok()) return st;
  }
  return agent;
}

ApiClient& Agent::NodeApi() { return node_client_ ? *node_client_ : *client_; }

Status Agent::UseCredential(const std::string& secret, bool store) {
  if (store) RETURN_IF_ERROR(WriteNodeCredential(options_.state_dir, options_.node, secret));
  ClientConfig cc = client_->config();
  cc.token = secret;
  auto client = ApiClient::Create(cc);
  if (!client.ok()) return client.status();
  std::lock_guard<std::mutex> lock(client_mu_);
  node_client_ = std::make_unique<ApiClient>(std::move(client).value());
  return Status::Ok();
}

void Agent::DropCredential() {
  if (!node_client_) return;
  std::cerr << fmt::format("gpupool agent {}: the server does not know this node's credential (revoked, or a "
                           "new store); registering again with the bootstrap token\n",
                           options_.node);
  {
    std::lock_guard<std::mutex> lock(client_mu_);
    node_client_.reset();
  }
  RemoveNodeCredential(options_.state_dir);
}

bool Agent::AcceptCluster(const HttpReply& r) {
  // Batched reports only to a server that announces them (a server of before them says nothing).
  if (r.is_json && r.json.is_object()) {
    bool reports = false;
    if (r.json.contains("features") && r.json["features"].is_array()) {
      for (const auto& f : r.json["features"]) reports |= f.is_string() && f.get<std::string>() == "reports";
    }
    batch_reports_ = reports;
  }
  if (!r.is_json || !r.json.is_object() || !r.json.contains("clusterId") || !r.json["clusterId"].is_string())
    return true;  // a server that has no cluster id: nothing to check
  const std::string theirs = r.json["clusterId"].get<std::string>();
  if (theirs.empty() || theirs.size() > 64) return true;
  if (cluster_id_.empty()) {
    if (Status st = WriteClusterId(options_.state_dir, theirs); !st.ok())
      std::cerr << fmt::format("gpupool agent {}: {}\n", options_.node, st.ToString());
    cluster_id_ = theirs;
    return true;
  }
  if (theirs == cluster_id_) return true;
  RefuseCluster(fmt::format("the server at {} is cluster {}, but this node belongs to cluster {} (the server's "
                            "store was created anew?)",
                            options_.server, theirs, cluster_id_));
  return false;
}

void Agent::RefuseCluster(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cluster_refusal_ == why) return;
    cluster_refusal_ = why;
  }
  std::cerr << fmt::format(
      "gpupool agent {}: ************************************************************\n"
      "gpupool agent {}: REFUSING TO SERVE THIS SERVER: {}.\n"
      "gpupool agent {}: This agent starts, adopts and reports nothing for it; its tasks of the old pool are\n"
      "gpupool agent {}: fenced when their lease ends. If the new pool is meant, remove {} and restart the agent.\n"
      "gpupool agent {}: ************************************************************\n",
      options_.node, options_.node, why, options_.node, options_.node, ClusterIdPath(options_.state_dir),
      options_.node);
}

std::string Agent::cluster_refusal() {
  std::lock_guard<std::mutex> lock(mu_);
  return cluster_refusal_;
}

Status Agent::Register() {
  json body;
  {
    std::lock_guard<std::mutex> lock(mu_);  // a mig task's start may change the MIG layout (agent_mig.cc)
    body = NodeRegistration(inventory_, options_.node, options_.cpu, options_.memory, options_.labels);
  }
  if (!endpoint_.empty()) body["agent"] = AgentInfoJson();
  if (!cluster_id_.empty()) body["clusterId"] = cluster_id_;
  const int64_t start_ms = agent_internal::BootTimeMs();
  // With the node credential when there is one; the bootstrap token when there is none, or the
  // server no longer knows it.
  const bool with_credential = node_client_ != nullptr;
  auto r = NodeApi().Post("/api/v1/agent/register", body.dump());
  if (with_credential && r.ok() && r->status == 401) {
    DropCredential();
    r = client_->Post("/api/v1/agent/register", body.dump());
  }
  const std::string what = fmt::format("registering node '{}'", options_.node);
  if (r.ok() && r->status == 409 && r->is_json && r->json.contains("error") && r->json["error"].is_object() &&
      r->json["error"].value("message", "").starts_with("clusterId:")) {
    RefuseCluster(r->json["error"].value("message", ""));
    return ReplyError(r, what);
  }
  if (Ok2xx(r) && !AcceptCluster(*r))
    return Status::FailedPrecondition(fmt::format("{}: {}", what, cluster_refusal()));
  AfterContact(start_ms, r);
  if (!Ok2xx(r)) return ReplyError(r, what);
  {
    std::lock_guard<std::mutex> lock(mu_);
    cluster_refusal_.clear();
  }
  if (r->is_json && r->json.contains("credential")) {
    const json& c = r->json["credential"];
    if (!c.is_string() || !LooksLikeNodeCredential(c.get<std::string>()))
      return Status::FailedPrecondition(what + ": the server answered a malformed node credential");
    RETURN_IF_ERROR(UseCredential(c.get<std::string>(), true).WithContext(what));
  }
  double interval = 5;
  if (r->is_json && r->json.contains("heartbeatIntervalSeconds") && r->json["heartbeatIntervalSeconds"].is_number())
    interval = r->json["heartbeatIntervalSeconds"].get<double>();
  heartbeat_interval_ = options_.heartbeat_seconds > 0 ? options_.heartbeat_seconds : interval;
  return Status::Ok();
}

json Agent::AgentInfoJson() const { return json{{"endpoint", endpoint_}, {"logToken", log_token_}}; }

void Agent::ServeLog(const http::Request& req, http::Response& res) {
  auto refuse = [&res](int status, std::string_view code, const std::string& message) {
    res.status = status;
    res.set_content(json{{"error", {{"code", code}, {"message", message}}}}.dump(), "application/json");
  };
  // Only the server reads logs here, with the token the agent gave it at registration (compared in
  // constant time). The bootstrap token is shared by every node, so it opens nothing here.
  const std::string auth = req.get_header_value("Authorization");
  const std::string want = fmt::format("Bearer {}", log_token_);
  const bool allowed = !log_token_.empty() && auth.size() == want.size() &&
                       CRYPTO_memcmp(auth.data(), want.data(), want.size()) == 0;
  if (!allowed) return refuse(401, "Unauthenticated", "a bearer token is needed");
  uint64_t offset = 0;
  uint64_t limit = kMaxLogChunk;
  for (const auto& [key, value] : req.params) {
    uint64_t* target = key == "offset" ? &offset : key == "limit" ? &limit : nullptr;
    if (target == nullptr) return refuse(400, "InvalidArgument", fmt::format("{}: unknown query parameter (known: offset, limit)", key));
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), *target);
    if (ec != std::errc() || end != value.data() + value.size())
      return refuse(400, "InvalidArgument", fmt::format("{}: must be a non-negative integer", key));
  }
  limit = std::min<uint64_t>(limit, kMaxLogChunk);
  // The server names the task ("<job>.<index>"); its newest run on this node has the logs.
  const std::string task = req.matches[1];
  std::string id;
  Runtime* rt = nullptr;
  int newest = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [run, t] : tasks_) {
      if (t.assignment.task_id() == task && t.assignment.restarts > newest && t.runtime != nullptr) {
        newest = t.assignment.restarts;
        id = run;
        rt = t.runtime;
      }
    }
  }
  // A finished task is forgotten once reported, but its logs stay on disk.
  if (rt == nullptr) {
    for (Runtime* r : AllRuntimes()) {
      const int n = NewestRunOnDisk(*r, task);
      if (n > newest) {
        newest = n;
        id = n > 0 ? fmt::format("{}.r{}", task, n) : task;
        rt = r;
      }
    }
  }
  if (rt == nullptr) return refuse(404, "NotFound", "no such task on this node");
  const std::string path = req.matches[2] == "stdout" ? rt->StdoutPath(id) : rt->StderrPath(id);
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return refuse(404, "NotFound", fmt::format("task {} has no {} log", id, std::string(req.matches[2])));
  const auto size = static_cast<uint64_t>(std::max<std::streamoff>(0, in.tellg()));
  const uint64_t from = std::min(offset, size);
  std::string chunk(static_cast<size_t>(std::min(limit, size - from)), '\0');
  in.seekg(static_cast<std::streamoff>(from));
  in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
  chunk.resize(static_cast<size_t>(std::max<std::streamsize>(0, in.gcount())));
  res.set_header("X-Log-Size", std::to_string(size));
  res.set_header("X-Log-Offset", std::to_string(from));
  res.set_content(chunk, "text/plain; charset=utf-8");
}

Status Agent::Start(std::chrono::seconds register_timeout) {
  // Listen first, so that the registration can tell the server where the logs are.
  if (!options_.metrics_listen.empty()) {
    ASSIGN_OR_RETURN(auto hp, SplitListen(options_.metrics_listen));
    http::ServerOptions ho;
    ho.normal_workers = 4;
    ho.priority_workers = 1;
    ho.max_body_bytes = 0;  // nothing here takes a body
    ho.max_connections = 4096;
    ho.tls.cert_file = options_.tls_cert_file;
    ho.tls.key_file = options_.tls_key_file;
    http_ = std::make_unique<http::Server>(ho);
    http_->Get("/metrics", [this](const http::Request&, http::Response& res) {
      res.set_content(MetricsText(), "text/plain; version=0.0.4; charset=utf-8");
    });
    http_->Get(R"(/tasks/([A-Za-z0-9_.-]+)/logs/(stdout|stderr))",
               [this](const http::Request& req, http::Response& res) { ServeLog(req, res); });
    http_->set_error_writer([](http::Response& res, int status, const std::string& message) {
      res.status = status;
      const char* code = status == 404 ? "NotFound" : status == 503 ? "Unavailable" : status >= 500 ? "Internal" : "InvalidArgument";
      res.set_content(json{{"error", {{"code", code}, {"message", message}}}}
                          .dump(-1, ' ', false, json::error_handler_t::replace),
                      "application/json");
    });
    auto port = http_->Listen(hp.first.empty() ? "0.0.0.0" : hp.first, hp.second);
    if (!port.ok()) {
      http_.reset();
      return Status::IoError(fmt::format("cannot listen on {}: {}", options_.metrics_listen, port.status().message()));
    }
    metrics_port_ = *port;
    std::string host = options_.advertise_host;
    if (host.empty()) host = hp.first == "0.0.0.0" || hp.first == "::" || hp.first.empty() ? HostName() : hp.first;
    if (host.find(':') != std::string::npos && !host.starts_with("[")) host = "[" + host + "]";  // IPv6
    endpoint_ = fmt::format("{}://{}:{}", options_.tls_cert_file.empty() ? "http" : "https", host, *port);
  }
  const auto deadline = std::chrono::steady_clock::now() + register_timeout;
  for (;;) {
    Status st = Register();
    if (st.ok()) break;
    // Unreachable (the server may still be starting): retry until the deadline. Refused: say why.
    if (st.code() != StatusCode::kIoError || std::chrono::steady_clock::now() >= deadline) {
      if (http_) {
        http_->Stop();
        http_.reset();
      }
      return st;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  stopping_ = false;
  next_heartbeat_ = std::chrono::steady_clock::now();
  if (options_.wake_on_child_exit)
    child_exit_subscription_ = ChildExits::Get().Subscribe([this] { WakeLoop(); });
  loop_ = std::thread([this] { Loop(); });
  if (options_.watch_assignments) {
    watch_interrupt_ = std::make_unique<RequestInterrupter>();
    watch_ = std::thread([this] { WatchLoop(); });
  }
  return Status::Ok();
}

void Agent::Stop(bool stop_tasks) {
  stopping_ = true;
  if (watch_interrupt_) watch_interrupt_->Interrupt();
  WakeLoop();
  if (watch_.joinable()) watch_.join();
  if (loop_.joinable()) loop_.join();
  if (child_exit_subscription_ != 0) {
    ChildExits::Get().Unsubscribe(child_exit_subscription_);
    child_exit_subscription_ = 0;
  }
  if (http_) {
    http_->Stop();
    http_.reset();
  }
  if (stop_tasks) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, t] : tasks_) {
      if (t.started && !t.exited && t.runtime != nullptr)
        (void)t.runtime->Stop(id, std::chrono::seconds(t.assignment.grace_period_seconds));
      t.mps_gpus.clear();
    }
    // `quit` lets the daemons finish with the clients that are still exiting.
    if (mps_) {
      if (Status st = mps_->StopAll(); !st.ok())
        std::cerr << fmt::format("gpupool agent {}: {}\n", options_.node, st.ToString());
    }
  }
  (void)::rmdir(ScratchScopeDir().c_str());  // only once no run's scratch is left in it
}

void Agent::Loop() {
  while (!stopping_) {
    Tick();
    // Until the next poll, or sooner: a task's supervisor exited, or the watch brought assignments.
    std::unique_lock<std::mutex> lock(wake_mu_);
    wake_cv_.wait_for(lock, std::chrono::milliseconds(static_cast<int>(options_.poll_seconds * 1000)),
                      [this] { return wake_now_ || stopping_.load(); });
    wake_now_ = false;
  }
}

void Agent::Tick() {
  const auto now = std::chrono::steady_clock::now();
  if (!cluster_refusal().empty()) {
    // Another cluster: act on nothing, report nothing. Try again now and then, in case the
    // operator removed the cluster-id file (joining the new pool on purpose).
    if (now < next_refused_retry_) return;
    next_refused_retry_ = now + std::chrono::seconds(10);
    cluster_id_ = ReadClusterId(options_.state_dir);
    if (Status st = Register(); !st.ok()) return;
    next_heartbeat_ = now;
  }
  PollTasks();
  if (now < next_heartbeat_) {
    if (watching_ || options_.assignment_poll_seconds <= 0 || now < next_assignments_) return;
    next_assignments_ = now + std::chrono::milliseconds(static_cast<int64_t>(options_.assignment_poll_seconds * 1000));
    auto r = NodeApi().Get(fmt::format("/api/v1/agent/nodes/{}/assignments", PercentEncode(options_.node)));
    // Anything but a good answer waits for the heartbeat, which also handles a lost registration.
    if (Ok2xx(r) && r->is_json) ApplyAssignments(r->json.dump());
    return;
  }
  next_heartbeat_ = now + std::chrono::milliseconds(static_cast<int64_t>(heartbeat_interval_ * 1000));
  next_assignments_ = now + std::chrono::milliseconds(static_cast<int64_t>(options_.assignment_poll_seconds * 1000));
  // The endpoint rides along with every heartbeat: a restarted server learns it again this way.
  json beat = endpoint_.empty() ? json::object() : json{{"agent", AgentInfoJson()}};
  beat["gpus"] = GpuStatusJson();
  const int64_t start_ms = agent_internal::BootTimeMs();
  auto r = NodeApi().Post(fmt::format("/api/v1/agent/nodes/{}/heartbeat", PercentEncode(options_.node)), beat.dump());
  if (Ok2xx(r) && !AcceptCluster(*r)) return;  // no lease renewal either: the old pool is gone
  AfterContact(start_ms, r);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++heartbeats_;
    if (!Ok2xx(r)) ++heartbeat_failures_;
  }
  if (r.ok() && r->status == 401 && node_client_) DropCredential();
  if (r.ok() && (r->status == 404 || r->status == 401)) {
    // The server does not know the node or its credential (a new store, a revoked credential):
    // register again, then carry on.
    if (Status st = Register(); !st.ok())
      std::cerr << fmt::format("gpupool agent {}: {}\n", options_.node, st.ToString());
    return;
  }
  if (!Ok2xx(r) || !r->is_json) return;
  ApplyAssignments(r->json.dump());
}

}  // namespace gpupool
