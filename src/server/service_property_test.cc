// Random operation sequences against PoolService, the way agents, tenants and operators drive it
// (including reports about the wrong node, the wrong task or a task that already ended), with time
// as one more input (node losses, stop deadlines, backoffs, hot spots, retention): after every
// operation the invariants hold and no GPU is overcommitted, and a server opened over the same store
// at any point (a restart: recovery from SQLite) shows the same jobs, tasks, nodes, queues and GPU
// allocations as the one that wrote it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "server/service.h"
#include "server/state_machine.h"
#include "server/views.h"
#include "server/service_test_util.h"
#include "store/sqlite_store.h"

namespace gpupool {
namespace {

using nlohmann::json;

const Principal kAdmin{"", Role::kAdmin};
const Principal kVision{"vision", Role::kTenant};

// A state as JSON, for comparing two: every job, task, node and queue as the views show them, the
// ledger's use of every GPU, and with `full` what only memory holds (the indexes, heartbeat times,
// GPU conditions, why jobs wait, whom they wait for, stop deadlines, held nodes). Soft state that
// a restart resets is left out without `full`, as Durable() leaves it out of the API's views.
json DigestOf(const PoolState& st, bool full) {
  json out;
  for (const auto& [seq, j] : st.by_seq) {
    json v = JobView(st, *j, 0);
    if (full) {
      v["pendingMessage"] = j->pending_message;
      v["diagnosis"] = j->diagnosis.ToString();
      v["pendingTask"] = j->pending_task;
      v["waitingFor"] = j->waiting_for;
      v["pendingSince"] = j->pending_since_ms;
      json deadlines = json::array();
      for (const PoolTask& ts : j->tasks) deadlines.push_back({ts.stop_deadline_ms, ts.run_id, ts.last_node});
      v["taskInternals"] = deadlines;
    }
    out["jobs"][j->rec.id] = v;
  }
  json nodes = json::array();
  for (NodeIndex n = 0; n < st.ledger.node_count(); ++n) {
    json v = NodeView(st, n);
    if (full) {
      v["heartbeatMono"] = st.nodes[n].heartbeat_mono;
      v["agent"] = {st.nodes[n].agent_endpoint, st.nodes[n].agent_log_token};
    } else {
      v.erase("lastHeartbeat");
      v["free"].erase("gpuShare");
      for (auto& g : v["gpus"]) {
        for (const char* soft : {"healthy", "fault", "hot", "hotReason", "temperatureC", "utilization",
                                 "memoryUsedFraction"})
          g.erase(soft);
      }
    }
    nodes.push_back(v);
  }
  // The recovered ledger lists nodes in the store's order: compare by name.
  std::sort(nodes.begin(), nodes.end(), [](const json& a, const json& b) { return a["name"] < b["name"]; });
  out["nodes"] = nodes;
  std::vector<QueueSpec> queues = st.queues;
  std::sort(queues.begin(), queues.end(), [](const QueueSpec& a, const QueueSpec& b) { return a.name < b.name; });
  for (const QueueSpec& q : queues) out["queues"].push_back(QueueSpecJson(q));
  for (const auto& [key, r] : st.usage) {
    if (r.gpu != 0 || r.cpu != 0 || r.memory != 0)
      out["usage"][key.first + "/" + key.second] = {r.gpu, r.cpu, r.memory};
  }
  json gpus = json::array();
  for (const auto& g : st.GpuUsage())
    gpus.push_back({g.node, g.gpu, g.ledger_used_share, g.ledger_used_memory, g.granted_share, g.granted_memory});
  std::sort(gpus.begin(), gpus.end());
  out["gpus"] = gpus;
  out["pending"] = st.pending;
  out["partial"] = st.partial;
  out["stopping"] = st.stopping_jobs;
  out["jobCounts"] = st.job_phase_count;
  for (const auto& [tenant, c] : st.pending_counts.tenants()) out["pendingCounts"][tenant] = {c.jobs, c.tasks};
  out["removedMaxSeq"] = st.removed_max_seq;
  out["tenantUids"] = st.tenant_uids;
  if (full) {
    out["reservedFor"] = st.reserved_for;
    out["reservedNodes"] = st.reserved_nodes;
  }
  return out;
}

class PropertyRun {
 public:
  explicit PropertyRun(uint64_t seed) : rng_(seed) {
    char tmpl[] = "/tmp/gpupool-property-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    config_.data_dir = dir_;
    config_.profile = "bestfit";
    config_.grace_period_seconds = 30;
    config_.reserve_after_seconds = 0;
    config_.sync_full = false;
    config_.tokens["unused-token-0123456789"] = Principal{"", Role::kAdmin};
    // Time is one more input: it only moves when the sequence says so, and it drives node
    // losses, stop deadlines, backoffs, hot-spot spells and retention.
    config_.heartbeat_timeout_seconds = 20;
    config_.finished_job_retention_seconds = 300;
    config_.hotspot.window_seconds = 10;
    config_.hotspot.cooldown_seconds = 30;
    config_.wall_clock_ms = [this] { return wall_ms_; };
    config_.mono_clock_s = [this] { return mono_s_; };
  }
  ~PropertyRun() {
    service_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Open() {
    service_.reset();
    auto s = testing_util::OpenServiceIn(dir_, config_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    service_ = std::move(s).value();
  }

  // Every operation the service applies from now on is kept, in order.
  void RecordOperations() {
    service_->SetOperationObserver([this](const Operation& op) { ops_.push_back(op); });
  }
  // The recorded operations applied to an empty pool of the same config.
  void Replay(PoolState& out) {
    out.queues = config_.ordering.queues;  // what an empty store is seeded with
    StateMachine machine(out, config_);
    ServerMetrics metrics;
    for (size_t i = 0; i < ops_.size(); ++i) {
      Effects fx(metrics);
      const Status st = machine.Apply(ops_[i], fx);
      ASSERT_TRUE(st.ok()) << "operation " << i << " (" << OperationName(ops_[i]) << "): " << st.ToString();
    }
  }
  json LiveDigest(bool full) {
    json d;
    service_->InspectState([&](const PoolState& st) { d = DigestOf(st, full); });
    return d;
  }
  size_t operations() const { return ops_.size(); }

  // One random operation; `log` says what it was, for a failure's message.
  void Step(std::string& log) {
    const int op = Pick(113);
    if (op >= 110) return KeepAlive(log);
    if (op >= 100) return Advance(log);
    if (op < 8 || nodes_.empty()) return RegisterNode(log);
    if (op < 30) return SubmitJob(log);
    if (op < 45) {
      log = "cycle";
      service_->RunCycle();
      return;
    }
    if (op < 70) return ReportTask(log);
    if (op < 75) return CancelJob(log);
    if (op < 83) return Heartbeat(log);
    if (op < 88) return CordonOrDrain(log);
    if (op < 92) return ChangeQueue(log);
    return ReportBatch(log);
  }

  void ExpectConsistent(const std::string& after) {
    Status st = service_->CheckInvariants();
    ASSERT_TRUE(st.ok()) << after << ": " << st.ToString();
    for (const auto& g : service_->GpuUsage()) {
      ASSERT_LE(g.granted_share, 1000) << after << ": " << g.node << "/" << g.gpu;
      ASSERT_LE(g.granted_memory, g.capacity_memory) << after << ": " << g.node << "/" << g.gpu;
      ASSERT_EQ(g.granted_share, g.ledger_used_share) << after << ": " << g.node << "/" << g.gpu;
      ASSERT_EQ(g.granted_memory, g.ledger_used_memory) << after << ": " << g.node << "/" << g.gpu;
    }
  }

  // What must survive a restart: every job as the API shows it (less the per-run watch version),
  // the nodes (less what heartbeats bring again: last contact, GPU health and telemetry), the
  // queues, and the ledger's use of every GPU.
  json Durable() {
    json out;
    for (const std::string& id : job_ids_) {
      auto r = service_->GetJob(kAdmin, id);
      if (!r.ok()) {
        out["jobs"][id] = r.status().ToString();
        continue;
      }
      json j = *r;
      j.erase("version");
      j.erase("notBefore");  // shown only while in the future: the clock moved between the views
      out["jobs"][id] = j;
    }
    json nodes = service_->ListNodes();
    for (auto& n : nodes["items"]) {
      n.erase("lastHeartbeat");
      // Counts only usable GPUs, and a GPU's health is soft (each GPU's own freeShare is compared).
      n["free"].erase("gpuShare");
      for (auto& g : n["gpus"]) {
        for (const char* soft : {"healthy", "fault", "hot", "hotReason", "temperatureC", "utilization",
                                 "memoryUsedFraction"})
          g.erase(soft);
      }
    }
    out["nodes"] = nodes;
    out["queues"] = service_->ListQueues();
    json usage = json::array();
    for (const auto& g : service_->GpuUsage())
      usage.push_back({g.node, g.gpu, g.ledger_used_share, g.ledger_used_memory, g.granted_share, g.granted_memory});
    out["usage"] = usage;
    return out;
  }

  // GPU faults and hot spots are soft state: a heartbeat brings them back after a restart (a hot
  // GPU's spell starts again). The views are compared once every GPU is reported healthy and cool
  // on both sides.
  void ClearSoftState() {
    for (const auto& [name, gpus] : nodes_) {
      json beat = {{"gpus", json::array()}};
      for (int i = 0; i < gpus; ++i)
        beat["gpus"].push_back({{"index", i}, {"healthy", true}, {"temperatureC", 40}, {"utilization", 0.1}});
      (void)service_->Heartbeat(name, beat);
    }
  }

 private:
  int Pick(int n) { return static_cast<int>(rng_() % static_cast<uint64_t>(n)); }
  template <typename T>
  const T& PickOf(const std::vector<T>& v) {
    return v[static_cast<size_t>(Pick(static_cast<int>(v.size())))];
  }

  void Advance(std::string& log) {
    const int kind = Pick(20);
    const int64_t ms = kind < 14 ? Pick(2000) : kind < 19 ? 3000 + Pick(37000) : 100000 + Pick(900000);
    wall_ms_ += ms;
    mono_s_ += static_cast<double>(ms) / 1000;
    log = fmt::format("advance {} ms", ms);
  }

  // A minute passes while every agent stays in touch: stops nobody confirms run past their
  // deadline and are held (their nodes still heartbeat) instead of their nodes being lost.
  void KeepAlive(std::string& log) {
    log = "a minute of heartbeats and cycles";
    for (int i = 0; i < 6; ++i) {
      wall_ms_ += 10'000;
      mono_s_ += 10;
      for (const auto& [name, gpus] : nodes_) (void)service_->Heartbeat(name, json::object());
      service_->RunCycle();
    }
  }

  void RegisterNode(std::string& log) {
    std::string name;
    int gpus = 0;
    std::string model;
    if (!nodes_.empty() && Pick(3) == 0) {  // again, with the inventory it registered
      const auto& n = PickOf(nodes_);
      name = n.first;
      gpus = n.second;
      model = models_.at(name);
    } else if (nodes_.size() < 5) {
      name = fmt::format("n{}", nodes_.size());
      gpus = 1 + Pick(4);
      model = Pick(2) == 0 ? "A100-80GB" : "H100-80GB";
    } else {
      // A re-registration with another inventory: refused, and nothing changes.
      const auto& n = PickOf(nodes_);
      name = n.first;
      gpus = n.second + 1;
      model = models_.at(name);
    }
    // The rack follows from the name too: a re-registration with other labels is another inventory.
    json body = {{"name", name}, {"cpu", "32"}, {"memory", "256Gi"}, {"labels", {{"rack", name.back() % 3 ? "a" : "b"}}}};
    json g = json::array();
    // The last GPU of every other node is split into MIG instances (decided by the name, so a
    // re-registration repeats it).
    const bool mig = name.back() % 2 == 1;
    for (int i = 0; i < gpus; ++i) {
      g.push_back({{"index", i}, {"model", model}});
      if (mig && i == gpus - 1 && gpus > 1) g.back()["migEnabled"] = true;
    }
    body["gpus"] = g;
    log = "register " + body.dump();
    auto r = service_->RegisterNode(body);
    if (r.ok() && models_.count(name) == 0) {
      nodes_.emplace_back(name, gpus);
      models_[name] = model;
    }
  }

  void SubmitJob(std::string& log) {
    static const std::vector<std::string> kGpu = {"0", "0.25", "0.5", "1", "2", "0.3"};
    const int replicas = 1 + Pick(4);
    const std::string gpu = PickOf(kGpu);
    std::string spec = fmt::format("name: p{}\n", job_ids_.size());
    if (Pick(3) == 0) spec += "qos: best-effort\n";
    spec += fmt::format("priority: {}\n", Pick(3) * 50);
    if (Pick(4) == 0) spec += Pick(2) ? "queue: vision\n" : "queue: vision-dev\n";
    if (replicas > 1 && Pick(3) == 0) spec += fmt::format("gang: {{minAvailable: {}}}\n", 1 + Pick(replicas));
    if (Pick(3) == 0) spec += "retry: {maxRestarts: 2, backoffSeconds: 0, onFailure: true}\n";
    if (Pick(3) == 0) spec += fmt::format("labels: {{app: a{}}}\n", Pick(3));
    if (Pick(4) == 0) {
      spec += "affinity:\n";
      if (Pick(2) == 0) spec += fmt::format("  nodeSelector: {{rack: {}}}\n", Pick(2) ? "a" : "b");
      if (Pick(2) == 0) spec += fmt::format("  apartFrom: [{{app: a{}}}]\n", Pick(3));
      if (Pick(3) == 0) spec += fmt::format("  togetherWith: [{{app: a{}}}]\n", Pick(3));
    }
    const bool mig = Pick(6) == 0;
    spec += fmt::format("tasks:\n  - name: w\n    replicas: {}\n", replicas);
    if (mig) {
      spec += fmt::format("    isolation: mig\n    resources: {{cpu: {}, memory: {}Gi, migProfile: \"{}\"",
                          1 + Pick(8), 1 + Pick(64), Pick(2) ? "1g.10gb" : "3g.40gb");
    } else {
      spec += fmt::format("    resources: {{cpu: {}, memory: {}Gi, gpu: {}", 1 + Pick(8), 1 + Pick(64), gpu);
      if (gpu != "0" && Pick(3) == 0) spec += fmt::format(", gpuMemory: {}Gi", 5 + Pick(40));
    }
    if ((mig || gpu != "0") && Pick(5) == 0) spec += ", gpuModels: [H100-80GB]";
    spec += "}\n    command: [\"true\"]\n";
    log = "submit " + spec;
    auto r = service_->SubmitJob(Pick(2) ? kAdmin : kVision, spec, SpecFormat::kYaml);
    if (r.ok()) job_ids_.push_back((*r)["id"].get<std::string>());
  }

  // A report about a random task of a random job, usually from the node the task is on and about a
  // state that follows from its own, sometimes from anywhere about anything.
  json RandomReport(std::string& job_id, int& index, std::string& node) {
    static const std::vector<std::string> kStates = {"running", "succeeded", "failed", "stopped"};
    job_id = PickOf(job_ids_);
    auto job = service_->GetJob(kAdmin, job_id);
    index = 0;
    node = PickOf(nodes_).first;
    std::string state = PickOf(kStates);
    if (job.ok() && !(*job)["tasks"].empty()) {
      const json& tasks = (*job)["tasks"];
      index = Pick(static_cast<int>(tasks.size()));
      const json& t = tasks[static_cast<size_t>(index)];
      if (Pick(8) != 0 && !t["node"].get<std::string>().empty()) node = t["node"];
      const std::string now = t["state"];
      if (Pick(6) != 0) {
        if (now == "assigned") state = Pick(3) ? "running" : "failed";
        if (now == "running") state = Pick(3) ? "succeeded" : "failed";
        if (now == "stopping") state = "stopped";
      }
    }
    if (Pick(20) == 0) index = Pick(2) ? -1 : 1000;
    json body = {{"state", state}, {"exitCode", state == "failed" ? 1 + Pick(3) : 0}};
    if (Pick(10) == 0) body["restarts"] = Pick(3);
    if (state != "running" && Pick(3) == 0) body["message"] = state == "failed" ? "exit code 3" : "killed by SIGTERM";
    return body;
  }

  void ReportTask(std::string& log) {
    if (job_ids_.empty()) return SubmitJob(log);
    std::string job_id, node;
    int index = 0;
    json body = RandomReport(job_id, index, node);
    log = fmt::format("report {} {}[{}] {}", node, job_id, index, body.dump());
    (void)service_->ReportTask(node, job_id, index, body);
  }

  void ReportBatch(std::string& log) {
    if (job_ids_.empty()) return SubmitJob(log);
    std::string node;
    json reports = json::array();
    const int n = 1 + Pick(4);
    for (int i = 0; i < n; ++i) {
      std::string job_id;
      int index = 0;
      json body = RandomReport(job_id, index, node);
      body["jobId"] = job_id;
      body["index"] = index;
      reports.push_back(body);
    }
    log = fmt::format("reports {} {}", node, reports.dump());
    (void)service_->ReportTasks(node, {{"reports", reports}});
  }

  void CancelJob(std::string& log) {
    if (job_ids_.empty()) return SubmitJob(log);
    const std::string id = PickOf(job_ids_);
    log = "cancel " + id;
    (void)service_->CancelJob(Pick(2) ? kAdmin : kVision, id);
  }

  void Heartbeat(std::string& log) {
    const auto& [name, gpus] = PickOf(nodes_);
    json beat = {{"gpus", json::array()}};
    for (int i = 0; i < gpus + (Pick(10) == 0 ? 1 : 0); ++i) {
      json g = {{"index", i}, {"healthy", Pick(6) != 0}};
      if (!g["healthy"].get<bool>()) g["reason"] = "XID 79";
      if (Pick(3) == 0) g["temperatureC"] = Pick(2) ? 95 : 40;
      if (Pick(3) == 0) g["utilization"] = Pick(2) ? 1.0 : 0.2;
      beat["gpus"].push_back(g);
    }
    log = fmt::format("heartbeat {} {}", name, beat.dump());
    (void)service_->Heartbeat(name, beat);
  }

  void CordonOrDrain(std::string& log) {
    const std::string name = PickOf(nodes_).first;
    const int what = Pick(5);
    log = fmt::format("{} {}", what < 2 ? "cordon" : what < 4 ? "uncordon" : "drain", name);
    if (what == 4)
      (void)service_->DrainNode(name);
    else
      (void)service_->SetCordon(name, what < 2);
  }

  // "vision" is a top-level queue, "vision-dev" its child; limits and guarantees come and go (also
  // below what the queue already uses).
  void ChangeQueue(std::string& log) {
    const bool child = queue_made_ && Pick(2) == 0;
    const std::string name = child ? "vision-dev" : "vision";
    json body = {{"name", name}, {"weight", 1 + Pick(4)}};
    if (child) body["parent"] = "vision";
    if (Pick(2) == 0) body["limit"] = {{"gpu", Pick(6)}};
    if (Pick(3) == 0) body["guaranteed"] = {{"gpu", Pick(3)}};
    log = "queue " + body.dump();
    bool& made = child ? child_made_ : queue_made_;
    if (!made) {
      made = service_->CreateQueue(body).ok();
    } else {
      body.erase("name");
      body.erase("parent");
      (void)service_->UpdateQueue(name, body);
    }
  }

  std::mt19937_64 rng_;
  int64_t wall_ms_ = 1'780'000'000'000;  // 2026-05-28
  double mono_s_ = 1000;
  std::string dir_;
  ServerConfig config_;
  std::vector<std::pair<std::string, int>> nodes_;  // name, GPUs
  std::map<std::string, std::string> models_;
  std::vector<std::string> job_ids_;
  bool queue_made_ = false;
  bool child_made_ = false;
  std::vector<Operation> ops_;

 public:
  std::unique_ptr<PoolService> service_;
};

TEST(ServiceProperty, RandomOperationsKeepTheInvariantsAndARestartRecoversTheSameState) {
  constexpr int kSeeds = 20;
  constexpr int kSteps = 400;
  constexpr int kRestartEvery = 50;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    SCOPED_TRACE(fmt::format("seed {}", seed));
    PropertyRun run(seed);
    ASSERT_NO_FATAL_FAILURE(run.Open());
    std::vector<std::string> recent;
    for (int step = 1; step <= kSteps; ++step) {
      std::string log;
      run.Step(log);
      recent.push_back(fmt::format("{}: {}", step, log));
      if (recent.size() > 8) recent.erase(recent.begin());
      std::string trail;
      for (const auto& l : recent) trail += "\n  " + l;
      ASSERT_NO_FATAL_FAILURE(run.ExpectConsistent(trail));
      if (step % kRestartEvery == 0) {
        run.ClearSoftState();
        const json before = run.Durable();
        ASSERT_NO_FATAL_FAILURE(run.Open());
        run.ClearSoftState();
        const json after = run.Durable();
        ASSERT_TRUE(after == before) << "the recovered state differs, after" << trail << "\ndiff: "
                                     << json::diff(before, after).dump();
        ASSERT_NO_FATAL_FAILURE(run.ExpectConsistent("after the restart" + trail));
      }
    }
  }
}

}  // namespace
}  // namespace gpupool

namespace gpupool {
namespace {

// The state machine is the whole story: the operations the service applied, replayed alone into an
// empty pool, rebuild exactly the state the service holds (soft state too), and the durable part of
// it is what recovery from the SQLite store rebuilds.
TEST(ServiceProperty, ReplayingTheOperationsFromAnEmptyPoolRebuildsTheStateRecoveryRebuilds) {
  constexpr int kSeeds = 10;
  constexpr int kSteps = 300;
  constexpr int kCheckEvery = 100;
  size_t applied = 0;
  for (uint64_t seed = 101; seed < 101 + kSeeds; ++seed) {
    SCOPED_TRACE(fmt::format("seed {}", seed));
    PropertyRun run(seed);
    ASSERT_NO_FATAL_FAILURE(run.Open());
    run.RecordOperations();
    for (int step = 1; step <= kSteps; ++step) {
      std::string log;
      run.Step(log);
      if (step % kCheckEvery != 0) continue;
      PoolState replayed;
      ASSERT_NO_FATAL_FAILURE(run.Replay(replayed));
      const json live = run.LiveDigest(/*full=*/true);
      const json again = DigestOf(replayed, /*full=*/true);
      ASSERT_TRUE(again == live) << "step " << step << " (" << log << "): the replay differs: "
                                 << json::diff(live, again).dump();
      ASSERT_TRUE(replayed.CheckInvariants().ok()) << replayed.CheckInvariants().ToString();
    }
    // Recovery: the server reopened over its store. Heartbeats bring GPU conditions back on both
    // sides (as in the restart test), so what differs is only what a restart resets.
    run.ClearSoftState();
    PoolState replayed;
    ASSERT_NO_FATAL_FAILURE(run.Replay(replayed));
    applied += run.operations();
    ASSERT_NO_FATAL_FAILURE(run.Open());
    run.ClearSoftState();
    const json recovered = run.LiveDigest(/*full=*/false);
    const json again = DigestOf(replayed, /*full=*/false);
    ASSERT_TRUE(again == recovered) << "recovery and replay differ: " << json::diff(recovered, again).dump();
  }
  // The sequences did something: thousands of operations, not a handful.
  EXPECT_GT(applied, 200u * kSeeds);
}

}  // namespace
}  // namespace gpupool
