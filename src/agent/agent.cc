#include "agent/agent.h"
#include "agent/child_exits.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <httplib.h>

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

// The server's heartbeatTimeoutSeconds from a register or heartbeat answer; 30 when absent.
double LeaseTimeoutOf(const HttpReply& r) {
  if (r.is_json && r.json.is_object()) {
    auto it = r.json.find("heartbeatTimeoutSeconds");
    if (it != r.json.end() && it->is_number() && it->get<double>() > 0) return it->get<double>();
  }
  return 30;
}

// Writes `path` through a rename, so the supervisors never read half a file. No fsync: the lease
// only matters while the machine is up.
bool WriteLeaseFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return ok && ::rename(tmp.c_str(), path.c_str()) == 0;
}

// Validates one GPU's --sim-faults entry.
Status CheckFaultEntry(const std::string& key, const json& v) {
  if (!v.is_object()) return Status::InvalidArgument(fmt::format("gpus.{}: must be an object", key));
  for (const auto& [k, x] : v.items()) {
    if (k == "xid") {
      if (!x.is_number_integer() || x.get<int64_t>() < 0)
        return Status::InvalidArgument(fmt::format("gpus.{}.xid: must be a non-negative integer", key));
    } else if (k == "healthy") {
      if (!x.is_boolean()) return Status::InvalidArgument(fmt::format("gpus.{}.healthy: must be true or false", key));
    } else if (k == "reason") {
      if (!x.is_string()) return Status::InvalidArgument(fmt::format("gpus.{}.reason: must be a string", key));
    } else if (k == "temperatureC") {
      if (!x.is_number()) return Status::InvalidArgument(fmt::format("gpus.{}.temperatureC: must be a number", key));
    } else if (k == "utilization" || k == "memoryUsedFraction") {
      if (!x.is_number() || x.get<double>() < 0 || x.get<double>() > 1)
        return Status::InvalidArgument(fmt::format("gpus.{}.{}: must be a number from 0 to 1", key, k));
    } else {
      return Status::InvalidArgument(fmt::format(
          "gpus.{}.{}: unknown key (known: xid, healthy, reason, temperatureC, utilization, memoryUsedFraction)",
          key, k));
    }
  }
  return Status::Ok();
}

// Adds the entries of a `gpus` object to `out` (a later entry for the same GPU adds to it).
Status ParseFaultGpus(const json& gpus, const std::string& where, size_t gpu_count, std::map<int, json>* out) {
  if (!gpus.is_object()) return Status::InvalidArgument(fmt::format("{}: must be an object keyed by GPU index", where));
  for (const auto& [key, v] : gpus.items()) {
    int index = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), index);
    if (ec != std::errc() || end != key.data() + key.size() || index < 0 || static_cast<size_t>(index) >= gpu_count)
      return Status::InvalidArgument(
          fmt::format("{}: '{}' is not a GPU index of this node (0..{})", where, key, gpu_count - 1));
    RETURN_IF_ERROR(CheckFaultEntry(key, v));
    json& slot = (*out)[index];
    if (!slot.is_object()) slot = json::object();
    slot.update(v);
  }
  return Status::Ok();
}

}  // namespace

void LeaseFenceOffsets(double timeout_s, int64_t* term_ms, int64_t* kill_ms) {
  const auto t = static_cast<int64_t>(timeout_s * 1000);
  *term_ms = std::max(t - 2000, t / 3);
  *kill_ms = std::max(t - 1000, 2 * t / 3);
}

Agent::Agent(AgentOptions options) : options_(std::move(options)) {}

Agent::~Agent() {
  Stop(false);
}

Result<std::unique_ptr<Agent>> Agent::Create(AgentOptions options) {
  if (options.node.empty()) options.node = HostName();
  if (options.cpu.empty()) options.cpu = MachineCpu();
  if (options.memory.empty()) options.memory = MachineMemory();
  if (options.state_dir.empty()) return Status::InvalidArgument("agent: a state directory is needed");
  std::unique_ptr<Agent> agent(new Agent(std::move(options)));
  AgentOptions& o = agent->options_;
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
  if (!o.sim_faults.empty() && !agent->inventory_.simulated)
    return Status::InvalidArgument("--sim-faults: only simulated GPUs take injected faults (add --simulate)");
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
  auto process = MakeProcessRuntime(ro);
  if (!process.ok()) return process.status().WithContext("the process runtime");
  agent->process_runtime_ = std::move(process).value();
  RuntimeOptions rc = ro;
  rc.state_dir = o.state_dir + "/runc";
  if (!o.log_dir.empty()) rc.log_dir = o.log_dir + "/runc";
  auto runc = MakeRuncRuntime(rc);
  if (runc.ok()) {
    agent->runc_runtime_ = std::move(runc).value();
  } else {
    agent->runc_error_ = runc.status().message();
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
  json body = NodeRegistration(inventory_, options_.node, options_.cpu, options_.memory, options_.labels);
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
    for (Runtime* r : {process_runtime_.get(), runc_runtime_.get()}) {
      if (r == nullptr) continue;
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

void Agent::ApplyAssignments(const std::string& body) {
  if (ApplyAssignmentsOnly(body)) PollTasks();
}

bool Agent::ApplyAssignmentsOnly(const std::string& body) {
  auto assignments = ParseAssignments(json::parse(body));
  if (!assignments.ok()) {
    std::cerr << fmt::format("gpupool agent {}: the server's assignments: {}\n", options_.node,
                             assignments.status().ToString());
    return false;
  }
  Reconcile(*assignments);
  return true;
}

Result<Runtime*> Agent::RuntimeFor(const Assignment& a) {
  if (a.bundle.empty() && a.rootfs.empty()) return process_runtime_.get();
  if (!runc_runtime_)
    return Status::FailedPrecondition(fmt::format("the task needs a container, but runc cannot run here: {}",
                                                  runc_error_));
  return runc_runtime_.get();
}

void Agent::Reconcile(const std::vector<Assignment>& assignments) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, t] : tasks_) t.in_assignments = false;
  for (const Assignment& a : assignments) {
    const std::string id = a.run_id();
    auto it = tasks_.find(id);
    if (it == tasks_.end()) {
      LocalTask t;
      t.assignment = a;
      if (a.desired == "stop") {
        // Asked to stop something this agent does not know: a task an earlier agent started (adopt
        // it and stop it), or one that never ran here (it is stopped).
        auto inserted = tasks_.emplace(id, std::move(t)).first;
        LocalTask& lt = inserted->second;
        if (Adopt(lt)) {
          lt.stop_requested = true;
          (void)lt.runtime->Stop(id, std::chrono::seconds(a.grace_period_seconds));
        } else {
          if (AdoptableTask(id)) ClearStray(id);
          lt.exited = true;
          lt.final_state = "stopped";
          lt.final_message = "not running on this node";
        }
        continue;
      }
      // An expired lease: the server may have given up on this node; start nothing new (the task
      // is still listed on the next good answer, which renews the lease).
      // A process under this id that was started for another placement is nobody's now: it is
      // stopped and removed first; this placement's run starts on a later pass.
      if (AdoptableTask(id) && StrayOfAnotherPlacement(a)) {
        ClearStray(id);
        continue;
      }
      if (!LeaseValid() && !AdoptableTask(id)) continue;
      auto inserted = tasks_.emplace(id, std::move(t));
      StartTask(inserted.first->second);
      continue;
    }
    LocalTask& t = it->second;
    t.in_assignments = true;
    if (a.desired == "stop" && !t.stop_requested && !t.exited) {
      t.stop_requested = true;
      t.assignment.grace_period_seconds = a.grace_period_seconds;
      if (t.runtime != nullptr) (void)t.runtime->Stop(id, std::chrono::seconds(a.grace_period_seconds));
    }
  }
  // Tasks the server no longer lists: stop what still runs, forget what has been reported.
  for (auto it = tasks_.begin(); it != tasks_.end();) {
    LocalTask& t = it->second;
    if (t.in_assignments) {
      ++it;
      continue;
    }
    if (t.started && !t.exited) {
      if (!t.stop_requested && t.runtime != nullptr) {
        t.stop_requested = true;
        (void)t.runtime->Stop(it->first, std::chrono::seconds(10));
      }
      ++it;
      continue;
    }
    if (t.exited && t.final_reported) {
      ReleaseMps(t);
      if (t.runtime != nullptr) (void)t.runtime->Remove(it->first);
      it = tasks_.erase(it);
      continue;
    }
    ++it;
  }
}

// REQUIRES: mu_ held.
Status Agent::EnsureMps(LocalTask& t) {
  const Assignment& a = t.assignment;
  if (a.isolation != "mps" || !mps_) return Status::Ok();
  for (const AssignedGpu& g : a.gpus) {
    // An index outside the inventory is TaskEnvironment's to refuse.
    if (g.index < 0 || static_cast<size_t>(g.index) >= inventory_.gpus.size()) continue;
    // The inventory's UUID: the one TaskEnvironment names the pipe directory after.
    const std::string& uuid = inventory_.gpus[static_cast<size_t>(g.index)].uuid;
    if (std::find(t.mps_gpus.begin(), t.mps_gpus.end(), uuid) != t.mps_gpus.end()) continue;
    RETURN_IF_ERROR(mps_->Ensure(uuid, a.run_id()));
    t.mps_gpus.push_back(uuid);
  }
  return Status::Ok();
}

// REQUIRES: mu_ held.
void Agent::ReleaseMps(LocalTask& t) {
  if (!mps_) return;
  for (const std::string& uuid : t.mps_gpus) {
    if (Status st = mps_->Release(uuid, t.assignment.run_id()); !st.ok())
      std::cerr << fmt::format("gpupool agent {}: {}\n", options_.node, st.ToString());
  }
  t.mps_gpus.clear();
}

// REQUIRES: mu_ held.
void Agent::StartTask(LocalTask& t) {
  const Assignment& a = t.assignment;
  const std::string id = a.run_id();
  auto fail = [&](const Status& st) {
    ReleaseMps(t);
    ++start_failures_;
    t.exited = true;
    t.final_state = "failed";
    t.final_message = "could not start: " + st.message();
  };
  auto rt = RuntimeFor(a);
  if (!rt.ok()) return fail(rt.status());
  if (Adopt(t)) return;
  t.runtime = *rt;
  TaskEnvOptions eo;
  eo.node = options_.node;
  eo.mps_pipe_root = options_.state_dir + "/mps";
  if (a.isolation == "mps" && mps_) {
    if (Status st = EnsureMps(t); !st.ok()) return fail(st);
    eo.mps_daemons = true;
  }
  auto env = TaskEnvironment(a, inventory_, eo);
  if (!env.ok()) return fail(env.status());
  if (a.command.empty() && a.bundle.empty()) return fail(Status::InvalidArgument("the task has no command"));
  LaunchSpec spec;
  spec.id = id;
  spec.argv = a.command;
  spec.env = std::move(env).value();
  spec.cpu_milli = a.cpu_milli;
  spec.memory_bytes = a.memory_bytes;
  spec.bundle = a.bundle;
  spec.rootfs = a.rootfs;
  spec.lease_path = lease_path_;
  if (!inventory_.simulated) {
    spec.devices = {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"};
    for (const AssignedGpu& g : a.gpus) {
      const GpuInfo& info = inventory_.gpus[static_cast<size_t>(g.index)];
      if (info.minor_number >= 0) spec.devices.push_back(fmt::format("/dev/nvidia{}", info.minor_number));
    }
    if (a.isolation == "mig" && (!a.rootfs.empty() || !a.bundle.empty())) {
      // In a container, a MIG instance also needs the nvidia-caps nodes of its GPU and compute instance.
      std::ifstream minors("/proc/driver/nvidia-caps/mig-minors");
      std::stringstream text;
      text << minors.rdbuf();
      auto caps = TaskMigCapDevices(a, inventory_, text.str());
      if (!caps.ok()) return fail(caps.status());
      spec.devices.insert(spec.devices.end(), caps->begin(), caps->end());
    }
  }
  // Recorded before the start: whatever runs under this id afterwards is this placement's.
  if (!a.placement_run.empty()) {
    if (Status st = WritePlacementRun(options_.state_dir, id, a.placement_run); !st.ok()) return fail(st);
  }
  if (Status st = t.runtime->Start(spec); !st.ok()) return fail(st);
  if (options_.wake_on_child_exit) ChildExits::Get().ChildStarted();
  ++starts_;
  t.started = true;
}

// REQUIRES: mu_ held.
bool Agent::Adopt(LocalTask& t) {
  const std::string id = t.assignment.run_id();
  auto rt = RuntimeFor(t.assignment);
  if (!rt.ok()) return false;
  const auto known = (*rt)->List();
  if (std::find(known.begin(), known.end(), id) == known.end()) return false;
  if (StrayOfAnotherPlacement(t.assignment)) return false;  // not this placement's: never adopted
  // This very run was started by an earlier agent (run ids differ between restarts of a task):
  // running, it is adopted; ended while no agent watched, its outcome is reported, never rerun.
  t.runtime = *rt;
  t.started = true;
  auto st = t.runtime->Poll(id);
  if (st.ok() && st->state == RunState::kRunning) {
    // Count it among its daemon's users again (restarting a daemon that died meanwhile).
    if (Status ms = EnsureMps(t); !ms.ok())
      std::cerr << fmt::format("gpupool agent {}: adopted task {}: {}\n", options_.node, id, ms.ToString());
  }
  return true;
}

bool Agent::StrayOfAnotherPlacement(const Assignment& a) {
  if (a.placement_run.empty()) return false;  // a server of before run ids: by task id, as before
  return ReadPlacementRun(options_.state_dir, a.run_id()) != a.placement_run;
}

void Agent::ClearStray(const std::string& id) {
  for (Runtime* rt : {process_runtime_.get(), runc_runtime_.get()}) {
    if (rt == nullptr) continue;
    const auto known = rt->List();
    if (std::find(known.begin(), known.end(), id) == known.end()) continue;
    auto st = rt->Poll(id);
    if (st.ok() && st->state == RunState::kRunning) {
      std::cerr << fmt::format("gpupool agent {}: task {} runs here for another placement (an earlier one, or "
                               "another pool's): stopping it, not adopting it\n",
                               options_.node, id);
      (void)rt->Stop(id, std::chrono::seconds(0));
      continue;
    }
    // Ended: free the id for this placement's run (the old logs are moved aside, not served).
    (void)rt->Remove(id);
    std::error_code ec;
    for (const std::string& path : {rt->StdoutPath(id), rt->StderrPath(id)}) {
      if (std::filesystem::exists(path, ec)) std::filesystem::rename(path, path + ".stray", ec);
    }
  }
}

// Polls every started task and sends the reports that are due. Takes mu_.
void Agent::PollTasks() {
  std::vector<std::string> due;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, t] : tasks_) {
      if (t.started && !t.exited && t.runtime != nullptr) {
        auto st = t.runtime->Poll(id);
        if (st.ok() && st->state == RunState::kExited) {
          t.exited = true;
          t.exit_code = st->exit_code;
          if (t.stop_requested || st->fenced) {
            t.final_state = "stopped";
          } else if (st->term_signal == 0 && st->exit_code == 0) {
            t.final_state = "succeeded";
          } else {
            t.final_state = "failed";
          }
          t.final_message = st->message;
          if (st->fenced) t.final_message = FencedMessage(st->message);
          ReleaseMps(t);
        }
      }
      if ((t.exited && !t.final_reported) || (t.started && !t.exited && !t.running_reported)) due.push_back(id);
    }
  }
  if (due.empty() || !cluster_refusal().empty()) return;  // nothing of the old pool goes to another one
  // The reports, in one call (one durable write on the server) where the server takes them.
  std::vector<std::pair<std::string, json>> bodies;  // task id -> report
  for (const std::string& id : due) {
    LocalTask copy;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = tasks_.find(id);
      if (it == tasks_.end()) continue;
      copy = it->second;
    }
    const bool final = copy.exited;
    // The run it is about: the server ignores a late report of an earlier run of the task.
    json body = {{"state", final ? copy.final_state : "running"}, {"restarts", copy.assignment.restarts}};
    if (!copy.assignment.placement_run.empty()) body["runId"] = copy.assignment.placement_run;
    if (final) {
      body["exitCode"] = copy.exit_code;
      if (!copy.final_message.empty()) body["message"] = copy.final_message;
    }
    body["jobId"] = copy.assignment.job_id;
    body["index"] = copy.assignment.index;
    bodies.emplace_back(id, std::move(body));
  }
  auto mark = [this](const std::string& id, const json& report) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tasks_.find(id);
    if (it == tasks_.end()) return;
    if (report["state"] != "running") {
      it->second.final_reported = true;
    } else {
      it->second.running_reported = true;
    }
  };
  size_t sent = 0;
  while (batch_reports_ && sent < bodies.size()) {
    json reports = json::array();
    const size_t end = std::min(bodies.size(), sent + 256);
    for (size_t i = sent; i < end; ++i) reports.push_back(bodies[i].second);
    auto r = NodeApi().Post(fmt::format("/api/v1/agent/nodes/{}/reports", PercentEncode(options_.node)),
                            json{{"reports", reports}}.dump());
    if (!Ok2xx(r) || !r->is_json || !r->json.contains("results") || !r->json["results"].is_array() ||
        r->json["results"].size() != end - sent)
      return;  // unreachable, refused or garbled: every report is tried again on the next tick
    const auto& results = r->json["results"];
    for (size_t i = sent; i < end; ++i) {
      const auto& res = results[i - sent];
      // Done unless the server failed on its side: a refusal (409: the task moved on, 404: the job
      // is gone) is as final as an acceptance.
      const std::string code = res.is_object() ? res.value("code", "") : "Internal";
      const bool ok = res.is_object() && res.value("ok", false);
      if (ok || (code != "Internal" && code != "IoError")) mark(bodies[i].first, bodies[i].second);
    }
    sent = end;
  }
  for (size_t i = sent; i < bodies.size(); ++i) {
    json body = bodies[i].second;
    const std::string job_id = body["jobId"];
    const int index = body["index"];
    body.erase("jobId");
    body.erase("index");
    auto r = NodeApi().Post(fmt::format("/api/v1/agent/nodes/{}/tasks/{}/{}/status", PercentEncode(options_.node),
                                       PercentEncode(job_id), index),
                           body.dump());
    // A 4xx means the server has moved on (the task was released or the job is gone): nothing to
    // retry. Unreachable, 5xx, or 401/403 (the credential is being replaced: the heartbeat
    // registers again): try again on the next tick.
    const bool done = r.ok() && r->status >= 200 && r->status < 500 && r->status != 401 && r->status != 403;
    if (done) mark(bodies[i].first, bodies[i].second);
  }
}

// ---- lease fencing -------------------------------------------------------------------------------

void Agent::AfterContact(int64_t start_ms, const Result<HttpReply>& r) {
  if (Ok2xx(r)) {
    RenewLease(start_ms, LeaseTimeoutOf(*r));
    return;
  }
  if (r.ok()) return;  // an answer, but not a good one: no renewal
  // No answer. A refused connection proves that no server listens, so nobody can be declaring
  // this node lost (a restarted server gives every node a fresh timeout); anything else (a
  // timeout, a reset) proves nothing.
  double timeout = 0;
  {
    std::lock_guard<std::mutex> lock(lease_mu_);
    timeout = lease_timeout_s_;
  }
  if (timeout <= 0) return;  // the server's timeout is not known yet: nothing to renew with
  const int64_t probe_ms = agent_internal::BootTimeMs();
  if (ServerPortClosed()) RenewLease(probe_ms, timeout);
}

void Agent::RenewLease(int64_t start_ms, double timeout_s) {
  int64_t term_off = 0, kill_off = 0;
  LeaseFenceOffsets(timeout_s, &term_off, &kill_off);
  std::lock_guard<std::mutex> lock(lease_mu_);
  lease_timeout_s_ = timeout_s;
  last_contact_ms_ = std::max(last_contact_ms_, start_ms);
  const int64_t term = start_ms + term_off;
  const int64_t kill = start_ms + kill_off;
  // Never shorten a lease already promised (a slow answer to an earlier attempt).
  if (term <= lease_term_ms_ && kill <= lease_kill_ms_) return;
  lease_term_ms_ = std::max(term, lease_term_ms_);
  lease_kill_ms_ = std::max(kill, lease_kill_ms_);
  lease_expired_logged_ = false;
  const std::string text = fmt::format("{} {} {}\n", lease_term_ms_, lease_kill_ms_,
                                       static_cast<int64_t>(timeout_s * 1000));
  if (!WriteLeaseFile(lease_path_, text))
    std::cerr << fmt::format("gpupool agent {}: cannot write the lease file {}: {}\n", options_.node, lease_path_,
                             std::strerror(errno));
}

bool Agent::LeaseValid() {
  std::lock_guard<std::mutex> lock(lease_mu_);
  const bool valid = agent_internal::BootTimeMs() < lease_term_ms_;
  if (!valid && !lease_expired_logged_) {
    lease_expired_logged_ = true;
    std::cerr << fmt::format("gpupool agent {}: lease expired (no contact with the server); starting no new tasks\n",
                             options_.node);
  }
  return valid;
}

bool Agent::ServerPortClosed() const {
  std::string host = client_->url().host;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(client_->url().port).c_str(), &hints, &res) != 0) return false;
  bool refused = res != nullptr;
  for (addrinfo* ai = res; ai != nullptr && refused; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      refused = false;
      break;
    }
    int err = 0;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd pfd{fd, POLLOUT, 0};
        if (::poll(&pfd, 1, 1000) == 1) {
          socklen_t len = sizeof(err);
          if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        } else {
          err = ETIMEDOUT;
        }
      }
    }
    ::close(fd);
    // Every address must refuse: one that accepts or does not answer may be the server.
    if (err != ECONNREFUSED) refused = false;
  }
  ::freeaddrinfo(res);
  return refused;
}

int Agent::NewestRunOnDisk(Runtime& rt, const std::string& task) {
  namespace fs = std::filesystem;
  int newest = -1;
  std::error_code ec;
  const fs::path dir = fs::path(rt.StdoutPath(task)).parent_path().parent_path();
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int n = -1;
    if (name == task) {
      n = 0;
    } else if (name.size() > task.size() + 2 && name.compare(0, task.size() + 2, task + ".r") == 0) {
      const char* first = name.data() + task.size() + 2;
      const char* last = name.data() + name.size();
      int v = 0;
      auto [p, err] = std::from_chars(first, last, v);
      if (err == std::errc() && p == last && v > 0) n = v;
    }
    if (n > newest && ::access((it->path() / "stdout.log").c_str(), R_OK) == 0) newest = n;
  }
  return newest;
}

bool Agent::AdoptableTask(const std::string& id) {
  for (Runtime* rt : {process_runtime_.get(), runc_runtime_.get()}) {
    if (rt == nullptr) continue;
    for (const std::string& known : rt->List())
      if (known == id) return true;
  }
  return false;
}

std::string Agent::FencedMessage(const std::string& runtime_message) {
  int64_t since = 0;
  double timeout = 0;
  {
    std::lock_guard<std::mutex> lock(lease_mu_);
    since = last_contact_ms_;
    timeout = lease_timeout_s_;
  }
  const double seconds = since > 0 ? static_cast<double>(agent_internal::BootTimeMs() - since) / 1000 : timeout;
  std::string how = runtime_message;
  constexpr std::string_view kPrefix = "fenced (lease expired): ";
  if (how.rfind(kPrefix, 0) == 0) how = how.substr(kPrefix.size());
  return fmt::format("fenced: no contact with the server for {:.0f} s ({})", seconds, how);
}

// ---- GPU health and telemetry --------------------------------------------------------------------

void Agent::ReloadSimFaults() {
  auto fail = [&](const std::string& what) {
    const std::string message = fmt::format("--sim-faults {}: {} (ignored; the previous overrides stay)",
                                            options_.sim_faults, what);
    if (message != sim_faults_error_)
      std::cerr << fmt::format("gpupool agent {}: {}\n", options_.node, message);
    sim_faults_error_ = message;
  };
  if (::access(options_.sim_faults.c_str(), F_OK) != 0 && errno == ENOENT) {  // no file: no overrides
    sim_overrides_.clear();
    sim_faults_error_.clear();
    return;
  }
  auto text = agent_internal::ReadFile(options_.sim_faults);
  if (!text.ok()) return fail(text.status().message());
  json j = json::parse(*text, nullptr, false);
  if (j.is_discarded()) return fail("not valid JSON");
  if (!j.is_object()) return fail("must be a JSON object with a \"gpus\" key");
  std::map<int, json> overrides;
  for (const auto& [k, v] : j.items()) {
    if (k == "gpus") {
      if (Status st = ParseFaultGpus(v, "gpus", inventory_.gpus.size(), &overrides); !st.ok()) return fail(st.message());
    } else if (k == "nodes") {
      if (!v.is_object()) return fail("nodes: must be an object keyed by node name");
    } else {
      return fail(fmt::format("{}: unknown key (known: gpus, nodes)", k));
    }
  }
  // Per-node entries (one file for all the agents of `gpupool up`) come on top.
  if (auto nodes = j.find("nodes"); nodes != j.end()) {
    if (auto mine = nodes->find(options_.node); mine != nodes->end()) {
      if (!mine->is_object() || !mine->contains("gpus"))
        return fail(fmt::format("nodes.{}: must be an object with a \"gpus\" key", options_.node));
      if (Status st = ParseFaultGpus((*mine)["gpus"], fmt::format("nodes.{}.gpus", options_.node),
                                     inventory_.gpus.size(), &overrides);
          !st.ok())
        return fail(st.message());
    }
  }
  sim_overrides_ = std::move(overrides);
  sim_faults_error_.clear();
}

std::string Agent::sim_faults_error() {
  std::lock_guard<std::mutex> lock(sim_mu_);
  return sim_faults_error_;
}

json Agent::GpuStatusJson() {
  json out = json::array();
  const size_t n = inventory_.gpus.size();
  if (!inventory_.simulated) {
    std::vector<GpuHealthSample> health;
    if (nvml_) {
      auto h = nvml_->Health();
      if (h.ok()) health = std::move(h).value();
    }
    for (size_t i = 0; i < n; ++i) {
      const GpuInfo& g = inventory_.gpus[i];
      json e = {{"index", g.index}, {"healthy", g.healthy}, {"reason", g.healthy ? "" : g.health_reason}};
      if (i < health.size()) {
        const GpuHealthSample& h = health[i];
        e["healthy"] = h.healthy;
        e["reason"] = h.healthy ? "" : h.reason;
        if (h.temperature_celsius) e["temperatureC"] = *h.temperature_celsius;
        if (h.utilization) e["utilization"] = *h.utilization;
        if (h.memory_used_fraction) e["memoryUsedFraction"] = *h.memory_used_fraction;
      }
      out.push_back(std::move(e));
    }
    return out;
  }
  // Simulated: the load of the tasks this agent runs.
  std::vector<double> share(n, 0), memory(n, 0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, t] : tasks_) {
      if (!t.started || t.exited) continue;
      for (const AssignedGpu& g : t.assignment.gpus) {
        if (g.index < 0 || static_cast<size_t>(g.index) >= n) continue;
        share[static_cast<size_t>(g.index)] += static_cast<double>(g.share_milli) / 1000;
        memory[static_cast<size_t>(g.index)] += static_cast<double>(g.memory_bytes);
      }
    }
  }
  std::map<int, json> overrides;
  if (!options_.sim_faults.empty()) {
    std::lock_guard<std::mutex> lock(sim_mu_);
    ReloadSimFaults();
    overrides = sim_overrides_;
  }
  for (size_t i = 0; i < n; ++i) {
    const GpuInfo& g = inventory_.gpus[i];
    const double util = std::clamp(share[i], 0.0, 1.0);
    const double mem = g.memory_bytes > 0 ? std::clamp(memory[i] / static_cast<double>(g.memory_bytes), 0.0, 1.0) : 0;
    json e = {{"index", g.index},          {"healthy", true},     {"reason", ""},
              {"temperatureC", 35 + 45 * util}, {"utilization", util}, {"memoryUsedFraction", mem}};
    if (auto it = overrides.find(g.index); it != overrides.end()) {
      const json& o = it->second;
      if (o.contains("xid")) {
        e["healthy"] = false;
        e["reason"] = fmt::format("XID {}", o["xid"].get<int64_t>());
      }
      if (o.contains("healthy")) {
        e["healthy"] = o["healthy"];
        if (o["healthy"].get<bool>()) e["reason"] = "";
        else if (!o.contains("xid")) e["reason"] = "simulated fault";
      }
      if (o.contains("reason")) e["reason"] = o["reason"];
      for (const char* k : {"temperatureC", "utilization", "memoryUsedFraction"})
        if (o.contains(k)) e[k] = o[k];
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::string Agent::MetricsText() {
  std::vector<GpuSample> samples;
  if (nvml_) {
    auto s = nvml_->Sample();
    if (s.ok()) samples = std::move(s).value();
  }
  std::vector<GpuHolder> holders;
  uint64_t running = 0, starts = 0, failures = 0, heartbeats = 0, heartbeat_failures = 0;
  const size_t mps_daemons = mps_ ? mps_->Gpus().size() : 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, t] : tasks_) {
      if (!t.started || t.exited) continue;
      ++running;
      for (const AssignedGpu& g : t.assignment.gpus)
        holders.push_back({g.index, t.assignment.job_id, t.assignment.name, g.share_milli, g.memory_bytes});
    }
    starts = starts_;
    failures = start_failures_;
    heartbeats = heartbeats_;
    heartbeat_failures = heartbeat_failures_;
  }
  std::string out = RenderGpuMetrics(options_.node, inventory_, samples, holders);
  const std::string label = fmt::format("node=\"{}\"", options_.node);
  out += "# HELP gpupool_agent_tasks_running Tasks this agent runs now.\n# TYPE gpupool_agent_tasks_running gauge\n";
  out += fmt::format("gpupool_agent_tasks_running{{{}}} {}\n", label, running);
  out += "# HELP gpupool_agent_task_starts_total Tasks started.\n# TYPE gpupool_agent_task_starts_total counter\n";
  out += fmt::format("gpupool_agent_task_starts_total{{{}}} {}\n", label, starts);
  out += "# HELP gpupool_agent_task_start_failures_total Tasks that could not be started.\n"
         "# TYPE gpupool_agent_task_start_failures_total counter\n";
  out += fmt::format("gpupool_agent_task_start_failures_total{{{}}} {}\n", label, failures);
  out += "# HELP gpupool_agent_heartbeats_total Heartbeats sent to the server.\n"
         "# TYPE gpupool_agent_heartbeats_total counter\n";
  out += fmt::format("gpupool_agent_heartbeats_total{{{}}} {}\n", label, heartbeats);
  out += "# HELP gpupool_agent_heartbeat_failures_total Heartbeats that got no good answer.\n"
         "# TYPE gpupool_agent_heartbeat_failures_total counter\n";
  out += fmt::format("gpupool_agent_heartbeat_failures_total{{{}}} {}\n", label, heartbeat_failures);
  out += "# HELP gpupool_agent_cluster_mismatch 1 while the agent refuses its server: another cluster than "
         "the node's.\n# TYPE gpupool_agent_cluster_mismatch gauge\n";
  out += fmt::format("gpupool_agent_cluster_mismatch{{{}}} {}\n", label, cluster_refusal().empty() ? 0 : 1);
  out += "# HELP gpupool_agent_mps_daemons MPS control daemons the agent keeps (one per GPU with mps tasks).\n"
         "# TYPE gpupool_agent_mps_daemons gauge\n";
  out += fmt::format("gpupool_agent_mps_daemons{{{}}} {}\n", label, mps_daemons);
  return out;
}

}  // namespace gpupool
