// Agent: the lease that fences tasks when the server is out of reach, and the GPUs' health and
// telemetry (simulated faults, heartbeat GPU status, the /metrics text). See agent.h.
#include "agent/agent.h"
#include "agent/child_exits.h"
#include "agent/process_preload.h"

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
#include <optional>
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

bool Ok2xx(const Result<HttpReply>& r) {
  return r.ok() && r->status >= 200 && r->status < 300;
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

void LeaseFenceOffsets(double timeout_s, int64_t* term_ms, int64_t* kill_ms) {
  const auto t = static_cast<int64_t>(timeout_s * 1000);
  *term_ms = std::max(t - 2000, t / 3);
  *kill_ms = std::max(t - 1000, 2 * t / 3);
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

bool Agent::WatchesPressure(const Assignment& a) const {
  TaskEnvOptions eo;
  eo.cuda_limiter = cuda_limiter_;
  eo.cuda_limiter_containers = !inventory_.simulated;
  return a.qos == "guaranteed" && TaskGetsCudaLimiter(a, eo);
}

std::map<int, std::string> Agent::TakeMemoryPressure() {
  std::map<int, std::string> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, t] : tasks_) {
    if (!t.started || t.exited || t.runtime == nullptr || !WatchesPressure(t.assignment)) continue;
    // The task's own file: whatever it holds is only ever a claim (agent.md "Memory pressure").
    auto counters = agent_internal::ReadCudaLedgerPressure(t.runtime->CudaLedgerPath(t.assignment.run_id()));
    if (!counters.ok()) continue;
    t.pressure_seen.resize(counters->size(), 0);
    for (size_t i = 0; i < counters->size(); ++i) {
      const uint64_t now = (*counters)[i];
      if (now > t.pressure_seen[i] && i < t.assignment.gpus.size()) out.emplace(t.assignment.gpus[i].index, t.assignment.job_id);
      t.pressure_seen[i] = now;
    }
  }
  return out;
}

json Agent::GpuStatusJson() {
  json out = json::array();
  const size_t n = inventory_.gpus.size();
  const std::map<int, std::string> pressure = TakeMemoryPressure();
  if (!inventory_.simulated) {
    std::vector<GpuHealthSample> health;
    if (nvml_) {
      auto h = nvml_->Health();
      if (h.ok()) health = std::move(h).value();
    }
    // The MIG layout as the agent last saw it (a mig task's start may change it, under mu_).
    std::map<size_t, json> mig;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < n; ++i) {
        if (inventory_.gpus[i].mig_enabled) mig[i] = MigLayoutJson(inventory_.gpus[i]);
      }
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
      // A claim of pressure counts only when the device is nearly full by NVML's own figures too.
      if (auto p = pressure.find(g.index); p != pressure.end()) {
        const bool full = i >= health.size() || !health[i].memory_used_fraction ||
                          *health[i].memory_used_fraction >= kPressureConfirmFraction;
        if (full) e["memoryPressureJob"] = p->second;
      }
      if (auto m = mig.find(i); m != mig.end()) e["migInstances"] = m->second;
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
    // No device to confirm it on: the limiter's count is taken as it is (a fake driver's refusals).
    if (auto p = pressure.find(g.index); p != pressure.end()) e["memoryPressureJob"] = p->second;
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
  uint64_t running = 0, starts = 0, failures = 0, heartbeats = 0, heartbeat_failures = 0, stale_lists = 0;
  const size_t mps_daemons = mps_ ? mps_->Gpus().size() : 0;
  std::optional<ImageCacheStats> image_stats;
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
    stale_lists = stale_lists_;
    if (images_) image_stats = images_->stats();
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
  out += "# HELP gpupool_agent_stale_assignment_lists_total Assignment lists dropped as older than one already "
         "applied.\n# TYPE gpupool_agent_stale_assignment_lists_total counter\n";
  out += fmt::format("gpupool_agent_stale_assignment_lists_total{{{}}} {}\n", label, stale_lists);
  out += "# HELP gpupool_agent_cluster_mismatch 1 while the agent refuses its server: another cluster than "
         "the node's.\n# TYPE gpupool_agent_cluster_mismatch gauge\n";
  out += fmt::format("gpupool_agent_cluster_mismatch{{{}}} {}\n", label, cluster_refusal().empty() ? 0 : 1);
  out += "# HELP gpupool_agent_mps_daemons MPS control daemons the agent keeps (one per GPU with mps tasks).\n"
         "# TYPE gpupool_agent_mps_daemons gauge\n";
  out += fmt::format("gpupool_agent_mps_daemons{{{}}} {}\n", label, mps_daemons);
  if (image_stats) {
    const ImageCacheStats& is = *image_stats;
    auto metric = [&](const char* name, const char* type, const char* help, auto value) {
      out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{{{}}} {}\n", name, help, name, type, name, label, value);
    };
    metric("gpupool_agent_image_pulls_total", "counter", "Container images copied and unpacked into the cache.",
           is.pulls);
    metric("gpupool_agent_image_pull_failures_total", "counter",
           "Image pulls that failed (the tasks waiting on them failed to start).", is.pull_failures);
    metric("gpupool_agent_image_cache_hits_total", "counter", "Task starts whose image was in the cache already.",
           is.hits);
    metric("gpupool_agent_image_evictions_total", "counter",
           "Unused images removed to keep the cache within its size.", is.evictions);
    metric("gpupool_agent_image_cache_bytes", "gauge", "Bytes the unpacked images take on disk.", is.bytes);
    metric("gpupool_agent_image_pulls_in_flight", "gauge", "Image pulls running now.", is.pulling);
  }
  return out;
}

}  // namespace gpupool
