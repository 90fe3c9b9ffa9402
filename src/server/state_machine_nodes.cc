// StateMachine, the operations on nodes and queues: registration, heartbeats (liveness, GPU faults
// and hot spots), loss, cordon and drain; queue creation and changes.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "server/hotspots.h"
#include "server/service_internal.h"
#include "server/state_machine.h"

namespace gpupool {

using namespace service_internal;

namespace {

// Checks reported MIG layouts against the spec's GPUs before anything of a registration applies:
// a GPU the node has, in MIG mode, with a layout its geometry allows (MigLayoutOf).
Status CheckMigReports(const NodeSpec& spec, const GpuCatalog& catalog,
                       const std::vector<std::pair<int, std::vector<MigInstance>>>& reports) {
  for (const auto& [gpu, instances] : reports) {
    const std::string where = fmt::format("gpus[{}].migInstances", gpu);
    if (gpu < 0 || static_cast<size_t>(gpu) >= spec.gpus.size())
      return Status::InvalidArgument(fmt::format("{}: node '{}' has {} GPU(s)", where, spec.name, spec.gpus.size()));
    const GpuDevice& d = spec.gpus[static_cast<size_t>(gpu)];
    if (instances.empty()) continue;
    if (!d.mig_enabled) return Status::InvalidArgument(where + ": the GPU is not in MIG mode");
    const GpuModelSpec* model = catalog.Find(d.model);
    if (model == nullptr || !model->mig)
      return Status::InvalidArgument(fmt::format("{}: GPU model '{}' has no MIG geometry", where, d.model));
    if (auto layout = MigLayoutOf(*model->mig, instances); !layout.ok())
      return Status::InvalidArgument(fmt::format("{}: {}", where, layout.status().message()));
  }
  return Status::Ok();
}

}  // namespace

Status StateMachine::On(const RegisterNodeOp& op) {
  const std::string& name = op.spec.name;
  RETURN_IF_ERROR(CheckMigReports(op.spec, st_.ledger.catalog(), op.mig_present));
  auto existing = st_.ledger.FindNode(name);
  NodeIndex n;
  if (existing) {
    n = *existing;
    if (st_.nodes[n].spec_json != op.spec_json)
      return Status::FailedPrecondition(fmt::format(
          "node '{}' is registered with a different inventory; a changed machine needs a new name", name));
  } else {
    if (st_.nodes.size() >= static_cast<size_t>(op.max_nodes))
      return Status::LimitExceeded(fmt::format(
          "the pool knows {} node(s), the limit is {} (limits.maxNodes); node '{}' is not registered",
          st_.nodes.size(), op.max_nodes, name));
    auto added = st_.ledger.AddNode(op.spec);
    if (!added.ok()) return Status::InvalidArgument(added.status().message());
    n = *added;
    PoolNode info;
    info.spec_json = op.spec_json;
    st_.nodes.push_back(std::move(info));
    if (!st_.reserved_nodes.empty()) st_.reserved_nodes.resize(st_.nodes.size(), 0);
  }
  for (const auto& [gpu, instances] : op.mig_present) {
    // Checked above; a GPU not in MIG mode reported an empty list, which says nothing.
    if (st_.ledger.state(n).gpus[static_cast<size_t>(gpu)].mig_enabled) (void)st_.ledger.SetMigPresent(n, gpu, instances);
  }
  PoolNode& info = st_.nodes[n];
  const bool was_lost = info.state != "ready";
  info.state = "ready";
  info.last_heartbeat_ms = now_;
  info.heartbeat_mono = mono_;
  info.agent_endpoint = op.agent ? op.agent->endpoint : "";
  info.agent_log_token = op.agent ? op.agent->log_token : "";
  CapacityGrew();
  WriteNode(n);
  Event("", existing ? (was_lost ? "NodeReady" : "NodeReregistered") : "NodeRegistered", name);
  return Status::Ok();
}

Status StateMachine::On(const HeartbeatOp& op) {
  auto n = st_.ledger.FindNode(op.node);
  if (!n) return Status::NotFound(fmt::format("node '{}' is not registered", op.node));
  const size_t count = st_.ledger.spec(*n).gpus.size();
  for (size_t i = 0; i < op.gpus.size(); ++i) {
    if (op.gpus[i].index < 0 || static_cast<size_t>(op.gpus[i].index) >= count)
      return Status::InvalidArgument(fmt::format("gpus[{}].index: node '{}' has {} GPU(s), there is no GPU {}", i,
                                                 op.node, count, op.gpus[i].index));
    if (op.gpus[i].mig_instances) {
      if (Status st = st_.ledger.CheckMigPresent(*n, op.gpus[i].index, *op.gpus[i].mig_instances); !st.ok())
        return Status::InvalidArgument(fmt::format("gpus[{}].migInstances: {}", i, st.message()));
    }
  }
  PoolNode& info = st_.nodes[*n];
  info.last_heartbeat_ms = now_;
  info.heartbeat_mono = mono_;
  if (info.state != "ready") {
    // Back from lost: its tasks were released when it was lost (the agent fenced them), so it
    // comes back empty and its agent stops whatever is not in its assignments.
    info.state = "ready";
    WriteNode(*n);
    Event("", "NodeReady", op.node + " heartbeats again");
    CapacityGrew();
  }
  // After a server restart the agent's endpoint comes back with its first heartbeat.
  if (op.agent) {
    info.agent_endpoint = op.agent->endpoint;
    info.agent_log_token = op.agent->log_token;
  }
  ApplyGpuReports(*n, op.gpus);
  return Status::Ok();
}

Status StateMachine::On(const NodeLostOp& op) {
  if (op.node >= st_.nodes.size() || st_.nodes[op.node].state != "ready")
    return Status::FailedPrecondition(fmt::format("node #{} is not a ready node", op.node));
  const NodeIndex n = op.node;
  const int64_t now = now_;
  PoolNode& info = st_.nodes[n];
  const std::string& name = st_.ledger.spec(n).name;
  info.state = "lost";
  ++fx_->metrics.nodes_lost;
  const std::string reason = fmt::format("node {} lost (no heartbeat for {:.1f} s)", name, op.silent_s);
  WriteNode(n);
  Event("", "NodeLost", reason);
  // The node's agent fenced its tasks before this timeout (it could not renew its lease), so they
  // are released at once and their jobs restart elsewhere.
  std::set<std::string> job_ids;
  for (const auto& [job_id, index] : info.tasks) job_ids.insert(job_id);
  for (const std::string& job_id : job_ids) {
    PoolJob* j = st_.FindJob(job_id);
    if (j == nullptr) continue;
    std::vector<int> released;
    for (size_t i = 0; i < j->tasks.size(); ++i) {
      PoolTask& ts = j->tasks[i];
      if (!IsLive(ts.phase) || !ts.placed || ts.placement.node != n) continue;
      const TaskPhase outcome = ts.phase == TaskPhase::kStopping ? ts.stop_outcome : TaskPhase::kPreempted;
      ReleaseTask(*j, static_cast<int>(i));
      st_.SetTaskPhase(*j, ts, outcome);
      // A running job restarts because of this loss: it is the reason its requeue shows.
      if (outcome == TaskPhase::kPreempted && (ts.stop_reason.empty() || j->phase == JobPhase::kRunning))
        ts.stop_reason = reason;
      ts.updated_ms = now;
      WriteTask(*j, static_cast<int>(i));
      released.push_back(static_cast<int>(i));
    }
    Event(job_id, "NodeLost", fmt::format("{}; task(s) {} released", reason, fmt::join(released, ", ")));
    if (j->phase == JobPhase::kRunning) FaultJob(*j, "node_lost", reason);
    AfterTaskEnded(*j);
  }
  return Status::Ok();
}

Status StateMachine::On(const CordonNodeOp& op) {
  auto n = st_.ledger.FindNode(op.node);
  if (!n) return Status::NotFound(fmt::format("node '{}' not found", op.node));
  PoolNode& info = st_.nodes[*n];
  RETURN_IF_ERROR(st_.ledger.SetCordoned(*n, op.cordoned));
  if (!op.cordoned) info.draining = false;
  CapacityGrew();
  WriteNode(*n);
  Event("", op.cordoned ? "NodeCordoned" : "NodeUncordoned", op.node);
  return Status::Ok();
}

Status StateMachine::On(const DrainNodeOp& op) {
  auto n = st_.ledger.FindNode(op.node);
  if (!n) return Status::NotFound(fmt::format("node '{}' not found", op.node));
  PoolNode& info = st_.nodes[*n];
  RETURN_IF_ERROR(st_.ledger.SetCordoned(*n, true));
  info.draining = true;
  const auto tasks = info.tasks;
  for (const auto& [job_id, index] : tasks) {
    PoolJob* j = st_.FindJob(job_id);
    if (j == nullptr) continue;
    // Every job on the node goes back to its queue and restarts elsewhere from its checkpoint.
    for (size_t i = 0; i < j->tasks.size(); ++i)
      StopTask(*j, static_cast<int>(i), TaskPhase::kPreempted, "node " + op.node + " drained");
    Event(job_id, "Draining", fmt::format("node {} is drained: the job stops and is queued again", op.node));
  }
  WriteNode(*n);
  Event("", "NodeDrained", op.node);
  return Status::Ok();
}

Status StateMachine::On(const PutQueueOp& op) {
  std::vector<QueueSpec> next;
  bool found = false;
  for (const QueueSpec& s : st_.queues) {
    if (s.name == op.spec.name) {
      next.push_back(op.spec);
      found = true;
    } else {
      next.push_back(s);
    }
  }
  if (found && op.create) return Status::FailedPrecondition(fmt::format("queue '{}' already exists", op.spec.name));
  if (!found && !op.create) return Status::NotFound(fmt::format("queue '{}' not found", op.spec.name));
  if (!found) next.push_back(op.spec);
  QueueOrderOptions options = config_.ordering;
  options.queues = next;
  auto order = QueueOrder::Create(options);
  if (!order.ok()) return Status::InvalidArgument(order.status().message());
  st_.queues = std::move(next);
  fx_->order.emplace(std::move(order).value());
  fx_->batch.Add(PutQueue{{op.spec.name, QueueSpecJson(op.spec).dump()}});
  Event("", op.create ? "QueueCreated" : "QueueUpdated", op.spec.name);
  CapacityGrew();
  return Status::Ok();
}

std::vector<PoolJob*> StateMachine::JobsOnGpu(NodeIndex n, int gpu) {
  std::vector<PoolJob*> out;
  for (const auto& [job_id, index] : st_.nodes[n].tasks) {
    PoolJob* j = st_.FindJob(job_id);
    if (j == nullptr) continue;
    const PoolTask& ts = j->tasks[static_cast<size_t>(index)];
    if (!IsLive(ts.phase)) continue;
    for (const GpuGrant& g : ts.placement.gpus) {
      if (g.gpu == gpu && std::find(out.begin(), out.end(), j) == out.end()) out.push_back(j);
    }
  }
  return out;
}

void StateMachine::UpdateGpuUsable(NodeIndex n, int gpu) {
  const PoolNode::GpuCondition& c = st_.nodes[n].gpus[static_cast<size_t>(gpu)];
  const bool usable = c.fault.empty() && !c.hot;
  if (st_.ledger.state(n).gpus[static_cast<size_t>(gpu)].healthy == usable) return;
  (void)st_.ledger.SetGpuHealthy(n, gpu, usable);
  if (usable) CapacityGrew();
}

void StateMachine::ApplyGpuReports(NodeIndex n, const std::vector<GpuReport>& reports) {
  PoolNode& info = st_.nodes[n];
  const NodeSpec& spec = st_.ledger.spec(n);
  info.gpus.resize(spec.gpus.size());
  const int64_t now = now_;
  const auto& hs = config_.hotspot;
  for (const GpuReport& r : reports) {
    if (r.index < 0 || static_cast<size_t>(r.index) >= info.gpus.size()) continue;
    PoolNode::GpuCondition& c = info.gpus[static_cast<size_t>(r.index)];
    const std::string where = fmt::format("GPU {} on {}", r.index, spec.name);
    // The MIG instances that exist now (checked in On(HeartbeatOp)): what placement prefers.
    if (r.mig_instances) (void)st_.ledger.SetMigPresent(n, r.index, *r.mig_instances);
    // Faults: an unhealthy GPU takes no placements; its jobs stop and restart elsewhere.
    if (!r.healthy && c.fault.empty()) {
      c.fault = r.reason.empty() ? "unhealthy" : r.reason;
      UpdateGpuUsable(n, r.index);
      const std::string reason = fmt::format("{} failed: {}", where, c.fault);
      Event("", "GpuFault", reason);
      for (PoolJob* j : JobsOnGpu(n, r.index)) FaultJob(*j, "gpu_fault", reason);
    } else if (r.healthy && !c.fault.empty()) {
      Event("", "GpuRecovered", fmt::format("{} is healthy again (was: {})", where, c.fault));
      c.fault.clear();
      UpdateGpuUsable(n, r.index);
    }
    if (!r.memory_pressure_job.empty()) ApplyMemoryPressure(n, r.index, r.memory_pressure_job, where);
    // Hot spots (hotspots.h): a GPU that turned hot takes no placements and its best-effort jobs
    // move; one that cooled takes placements again.
    const GpuSample sample{r.temperature_c, r.utilization, r.memory_used_fraction};
    switch (ObserveGpuSample(hs, sample, now, c)) {
      case HotSpotChange::kNone:
        break;
      case HotSpotChange::kTurnedHot:
        UpdateGpuUsable(n, r.index);
        Event("", "GpuHot", fmt::format("{} is hot: {}; no new placements", where, c.hot_reason));
        if (hs.migrate) MigrateOffHotGpu(n, r.index, fmt::format("migrated off hot {} ({})", where, c.hot_reason));
        break;
      case HotSpotChange::kCooled:
        Event("", "GpuCooled",
              fmt::format("{} has been under the hot-spot thresholds for {} s; placements again", where,
                          (now - c.under_since_ms) / 1000));
        UpdateGpuUsable(n, r.index);
        break;
    }
  }
}

// A guaranteed job's CUDA limiter saw the driver refuse allocations within the job's grant: others'
// use fills the GPU. It is treated as a hot spot: no new placements until it has been quiet for the
// cooldown (each new report starts the cooldown again), and its best-effort jobs move. A report
// that names a job not guaranteed, or not on that GPU, changes nothing.
void StateMachine::ApplyMemoryPressure(NodeIndex n, int gpu, const std::string& job_id, const std::string& where) {
  PoolJob* j = st_.FindJob(job_id);
  if (j == nullptr || j->job.qos != QosClass::kGuaranteed) return;
  const std::vector<PoolJob*> on = JobsOnGpu(n, gpu);
  if (std::find(on.begin(), on.end(), j) == on.end()) return;
  PoolNode::GpuCondition& c = st_.nodes[n].gpus[static_cast<size_t>(gpu)];
  c.under_since_ms = now_;
  if (c.hot) return;
  c.hot = true;
  c.hot_reason = fmt::format("memory pressure: the driver refused allocations of guaranteed job {} within its grant", job_id);
  UpdateGpuUsable(n, gpu);
  Event(job_id, "GpuPressure", fmt::format("{} is under memory pressure (reported by guaranteed job {}); no new placements", where, job_id));
  if (config_.hotspot.migrate)
    MigrateOffHotGpu(n, gpu, fmt::format("migrated off {} under the memory pressure of guaranteed job {}", where, job_id));
}

void StateMachine::MigrateOffHotGpu(NodeIndex n, int gpu, const std::string& reason) {
  for (PoolJob* j : JobsOnGpu(n, gpu)) {
    if (j->job.qos != QosClass::kBestEffort || j->phase != JobPhase::kRunning) continue;
    bool stopping = false;
    for (const PoolTask& ts : j->tasks) stopping |= ts.phase == TaskPhase::kStopping;
    if (stopping) continue;
    ++fx_->metrics.hotspot_migrations;
    for (size_t i = 0; i < j->tasks.size(); ++i) StopTask(*j, static_cast<int>(i), TaskPhase::kPreempted, reason);
    Event(j->rec.id, "Migrating", reason + ": the job stops, checkpoints and restarts elsewhere");
  }
}

}  // namespace gpupool
