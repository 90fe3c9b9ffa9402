// The pool's state in memory: jobs with their tasks, nodes, the ledger of allocations, and the
// indexes and counts over them — and the primitives that keep those in step. Every change of a
// job's or a task's phase goes through SetJobPhase/SetTaskPhase, a job enters with AddJob and
// leaves with RemoveJob, and CheckInvariants says whether everything still agrees.
//
// No I/O and no lock of its own: PoolService holds one PoolState under its mutex; the state machine
// (state_machine.h) is the only code that changes it, by applying operations, besides recovery
// from the store (docs/design.md).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/ledger.h"
#include "model/workload.h"
#include "sched/scheduler.h"
#include "server/admission.h"
#include "server/job_list.h"
#include "store/store.h"

namespace gpupool {

enum class JobPhase : uint8_t { kPending, kRunning, kSucceeded, kFailed, kCancelled };
enum class TaskPhase : uint8_t {
  kPending,
  kAssigned,
  kRunning,
  kStopping,
  kSucceeded,
  kFailed,
  kCancelled,
  kPreempted
};
inline constexpr size_t kJobPhaseCount = 5;
std::string_view JobPhaseName(JobPhase p);
std::string_view TaskPhaseName(TaskPhase p);

// Lifecycle of a task: pending -> assigned (placed, the agent has not reported) -> running ->
// succeeded | failed; a cancel or a preemption moves assigned/running to stopping, and the agent's
// "stopped" report (or the stop deadline) releases the allocation: cancelled | preempted (the job
// is queued again). The ledger holds an allocation for every assigned, running and stopping task.
struct PoolTask {
  TaskPhase phase = TaskPhase::kPending;
  int group = 0;
  int replica = 0;
  bool placed = false;
  Placement placement;
  AllocationId allocation = 0;
  int exit_code = 0;
  int restarts = 0;
  std::string run_id;  // of the current (or last) placement; see TaskRecord::run_id
  int64_t updated_ms = 0;
  int64_t stop_deadline_ms = 0;
  // The stop passed its deadline on a node that still heartbeats: said once, and held (memory only).
  bool stop_overdue_noted = false;
  std::string last_node;  // where the task last ran (kept after release: its logs are there)
  std::string stop_reason;
  std::string end_message;  // what the agent said when the task ended ("killed by SIGKILL")
  std::string image;        // the image its run started from, "<source>@sha256:..." ("": none said)
  TaskPhase stop_outcome = TaskPhase::kCancelled;  // what "stopped" turns into
};

struct PoolJob {
  JobRecord rec;
  JobPhase phase = JobPhase::kPending;
  Job job;
  Resources demand;
  std::vector<PoolTask> tasks;
  std::vector<int> task_group;  // task index -> group
  std::array<int32_t, kTaskPhaseCount> task_counts{};  // tasks per TaskPhase (SetTaskPhase keeps it)
  int64_t pending_since_ms = 0;
  std::string pending_message;  // last "why pending"
  Diagnosis diagnosis;
  std::string pending_task;           // the task the diagnosis is about
  std::set<std::string> waiting_for;  // victims this job preempted, not yet stopped
  bool dependencies_met = false;      // every job of its dependsOn ended as asked (cached: they stay ended)
  // Set by its preemption: the nodes its placement was planned on, and its victims' queues. The
  // best-effort jobs it could evict in turn (lower priority, or in those queues) are kept off these
  // nodes until it places or gives up, so that what its victims free is not taken by the next
  // victim (which it would only preempt again). Soft state, like waiting_for.
  std::vector<uint8_t> nominated_nodes;  // by NodeIndex; empty: none
  std::set<std::string> nominated_from_queues;
  // The capacity epoch at which the job last failed to fit; while the epoch is unchanged nothing
  // was freed, so trying again cannot succeed (placements only take capacity away).
  uint64_t failed_epoch = ~uint64_t{0};
  uint64_t preempt_epoch = ~uint64_t{0};
  int64_t started_ms = 0;
  double submit_mono = 0;  // steady clock seconds, for the latency histogram
};

struct PoolNode {
  std::string state = "ready";
  int64_t last_heartbeat_ms = 0;  // wall clock, for display and the store
  double heartbeat_mono = 0;      // steady clock seconds: what the lost-node timeout measures
  bool draining = false;
  nlohmann::json spec_json;
  std::set<std::pair<std::string, int>> tasks;  // live tasks (job id, index)
  // Where the node's agent serves task logs, and the token it accepts from the server for them.
  // Soft state: sent at registration and with every heartbeat, never stored.
  std::string agent_endpoint;
  std::string agent_log_token;
  // Per GPU, from the heartbeats (soft state: a restarted server learns it again within one).
  struct GpuCondition {
    std::string fault;  // non-empty: the agent reports the GPU unhealthy, and why
    bool hot = false;
    std::string hot_reason;
    int64_t over_since_ms = 0;   // start of the current run of samples over a threshold (0: none)
    int64_t under_since_ms = 0;  // start of the current run of samples under every threshold
    double temperature_c = -1, utilization = -1, memory_used_fraction = -1;
  };
  std::vector<GpuCondition> gpus;
};

// Per GPU of every node: (used share, used memory) two independent ways: what the ledger's free
// counters say is used, and what the live tasks were granted (summed from their placements).
struct GpuUse {
  std::string node;
  int gpu = 0;
  int64_t ledger_used_share = 0, ledger_used_memory = 0;
  int64_t granted_share = 0, granted_memory = 0;
  int64_t capacity_memory = 0;
};

class PoolState {
 public:
  using JobCounts = std::array<int64_t, kJobPhaseCount>;

  // A job of the given phase, its tasks' phases already counted in its task_counts, joins the
  // indexes (by id, by sequence, by tenant), the per-phase counts, and while pending the pending
  // queue and the tenant's pending count.
  PoolJob& AddJob(std::unique_ptr<PoolJob> job);
  // Takes the job out of every index and count; returns the next job in sequence order.
  std::map<uint64_t, PoolJob*>::iterator RemoveJob(std::map<uint64_t, PoolJob*>::iterator it);
  void SetJobPhase(PoolJob& j, JobPhase phase);
  // Gives up the nodes `j`'s preemption held (what it masked may be used again).
  void ClearNomination(PoolJob& j);
  void SetTaskPhase(PoolJob& j, PoolTask& ts, TaskPhase phase);
  PoolJob* FindJob(const std::string& id);
  const PoolJob* FindJob(const std::string& id) const;

  // The ledger's own invariants, that it holds exactly the allocations of the live tasks, and that
  // every index and count agrees with the jobs.
  Status CheckInvariants() const;
  std::vector<GpuUse> GpuUsage() const;

  Ledger ledger;
  std::unordered_map<std::string, std::unique_ptr<PoolJob>> jobs;
  std::map<uint64_t, PoolJob*> by_seq;
  std::set<uint64_t> pending;  // seqs of pending jobs
  // Pending jobs and their tasks per tenant and queue, submissions in flight included (they reserve
  // their room before the durable write).
  PendingCounts pending_counts;
  JobCounts job_phase_count{};                               // jobs per JobPhase
  std::unordered_map<std::string, JobCounts> queue_phase_count;  // queue -> jobs per JobPhase
  std::unordered_map<std::string, std::set<uint64_t>> by_tenant;  // tenant -> seqs of its jobs
  std::set<uint64_t> partial;           // running jobs with unplaced tasks
  std::set<std::string> stopping_jobs;  // jobs with a task in kStopping (SetTaskPhase keeps it)
  std::vector<PoolNode> nodes;          // by NodeIndex, as the ledger's
  std::map<std::pair<std::string, std::string>, Resources> usage;  // (tenant, queue) -> used
  std::vector<QueueSpec> queues;        // the queue tree, as created and changed
  // Nodes held for one waiting gang (ReserveOp); released when that job leaves the pending state.
  std::string reserved_for;
  std::vector<uint8_t> reserved_nodes;  // by NodeIndex
  std::set<uint64_t> nominators;        // seqs of pending jobs holding nodes by their preemption
  std::set<uint64_t> time_limited;      // seqs of running jobs with a timeLimit (SetJobPhase keeps it)
  uint64_t removed_max_seq = 0;         // the highest seq retention removed (stored as meta)
  // Tenants' uids from the sandbox range (identities.h), given at their first placement (meta).
  std::map<std::string, int64_t> tenant_uids;
  // Bumped whenever capacity may have grown: a release, a node registered or uncordoned, a queue
  // changed, a reservation lifted. See PoolJob::failed_epoch.
  uint64_t capacity_epoch = 0;
};

}  // namespace gpupool
