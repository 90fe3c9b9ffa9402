// The JSON views of the pool's state (docs/api.md): a task, a job, a node. Each is built in two
// steps: a snapshot copied out of a PoolState (records, phases, placements resolved to names —
// plain copies, no JSON), which the service takes under its lock, and the JSON built from that
// snapshot alone, after the lock is let go. No lock, no I/O, no clock of their own. PoolService
// adds what only it knows (a job's watch version).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/state.h"

namespace gpupool {

struct PlacementSnapshot {
  std::string node;
  MilliCpu cpu;
  MiB memory;
  bool share_task = false;
  struct Gpu {
    int index = 0;
    std::string uuid;
    int64_t share = 0;
    MiB memory;
    std::optional<MigInstance> mig;
    std::string mig_profile;  // the profile's name, "" when unknown
  };
  std::vector<Gpu> gpus;
};

struct TaskSnapshot {
  int index = 0;
  std::string group;
  int replica = 0;
  TaskPhase phase = TaskPhase::kPending;
  int exit_code = 0;
  int restarts = 0;
  std::optional<PlacementSnapshot> placement;  // live tasks
  std::string stop_reason;
  std::string end_message;
  std::string image;  // "<source>@sha256:..." of a container task's run; "" otherwise
};

struct JobSnapshot {
  JobRecord rec;  // spec_json is the job's spec as JSON text
  JobPhase phase = JobPhase::kPending;
  QosClass qos = QosClass::kGuaranteed;
  std::array<int32_t, kTaskPhaseCount> task_counts{};
  std::vector<TaskSnapshot> tasks;
};

struct NodeSnapshot {
  NodeSpec spec;
  NodeState ledger_state;
  PoolNode info;
  std::vector<std::vector<nlohmann::json>> gpu_tasks;  // per GPU: {job, index, share}
  // Per MIG-enabled GPU, its instances: {profile, profileId, start, exists, held} (the reported
  // layout and the held one, merged); empty for the others.
  std::vector<nlohmann::json> mig_instances;
};

PlacementSnapshot SnapshotPlacement(const PoolState& st, const Placement& p);
TaskSnapshot SnapshotTask(const PoolState& st, const PoolJob& j, int index);
JobSnapshot SnapshotJob(const PoolState& st, const PoolJob& j);
NodeSnapshot SnapshotNode(const PoolState& st, NodeIndex n);

nlohmann::json PlacementView(const PlacementSnapshot& p);
nlohmann::json TaskView(const TaskSnapshot& t);
// `now_ms`: a pending job shows `notBefore` while its backoff lasts.
nlohmann::json JobView(const JobSnapshot& j, int64_t now_ms);
nlohmann::json NodeView(const NodeSnapshot& n);

// Both steps at once, for callers that hold the state anyway.
inline nlohmann::json TaskView(const PoolState& st, const PoolJob& j, int index) {
  return TaskView(SnapshotTask(st, j, index));
}
inline nlohmann::json JobView(const PoolState& st, const PoolJob& j, int64_t now_ms) {
  return JobView(SnapshotJob(st, j), now_ms);
}
inline nlohmann::json NodeView(const PoolState& st, NodeIndex n) { return NodeView(SnapshotNode(st, n)); }

}  // namespace gpupool
