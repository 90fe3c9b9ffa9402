// The typed operations that change the pool's state (server/state_machine.h applies them). Each
// carries every input its application needs — the wall and steady clocks at the time, run ids,
// the placements the scheduler chose — so that applying the same operations, in the same order, to
// the same starting state gives the same state: what a replay from an empty pool, and later a
// replica applying a log, rely on.
//
// Who makes them: the API facade (PoolService's request methods) from requests of tenants, admins
// and agents, after checking their shape; the controllers of the scheduling loop (the cycle,
// preemption, reservations, timeouts, retention) from what they read in the state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/ledger.h"
#include "model/workload.h"
#include "sched/queueing.h"
#include "sched/scheduler.h"
#include "server/agent_endpoint.h"
#include "store/store.h"

namespace gpupool {

// The clocks at the time of an operation: the wall clock (stored, shown) and the steady clock in
// seconds (what timeouts and latencies measure).
struct OpTime {
  int64_t now_ms = 0;
  double mono = 0;
};

// ---- jobs -------------------------------------------------------------------------------------

// A job accepted (already checked, admitted and given its id and sequence number).
struct SubmitJobOp : OpTime {
  JobRecord rec;
  Job job;
  Resources demand;
  // Its rows are on disk already (the facade writes StateMachine::SubmissionWrites before applying
  // it, without the lock): applying it adds no writes. The state it makes is the same.
  bool written = false;
};

// A job cancelled by a tenant or an admin (`by` says who, for its reason).
struct CancelJobOp : OpTime {
  std::string job_id;
  std::string by;
};

// An agent's report of one task (the report's shape already checked).
struct TaskReport {
  std::string job_id;
  int index = 0;
  std::string state;  // running, succeeded, failed, stopped
  int exit_code = 0;
  std::string message;
  int run = -1;                       // the run (restart count) the report is about; -1: not said
  std::optional<std::string> run_id;  // the placement's run id the report is about
  std::string image;                  // running: the image it started from, "<source>@sha256:<hex>"
};
struct ReportTaskOp : OpTime {
  std::string node;
  TaskReport report;
};

// ---- the scheduling cycle and its controllers ---------------------------------------------------

// A cycle begins: preemptors whose victims have all stopped stop waiting, and jobs in their retry
// backoff say until when.
struct CycleStartOp : OpTime {};

// The scheduler placed tasks of a job: all of a pending job's gang (the job starts), or more
// tasks of a running job whose gang minimum was met.
struct TaskPlacement {
  int task = 0;
  Placement placement;
  std::string run_id;
};
struct PlaceTasksOp : OpTime {
  std::string job_id;
  std::vector<TaskPlacement> tasks;
};

// A pending job was tried and does not fit: why (shown, and stored when it changed).
struct JobWaitsOp : OpTime {
  std::string job_id;
  std::string message;
  std::string pending_task;  // "" keeps the last one
  Diagnosis diagnosis;
};

// A pending job preempts running jobs: each victim stops (tasks get their grace period) and the
// preemptor waits for them.
struct PreemptOp : OpTime {
  std::string job_id;
  struct Victim {
    std::string job_id;
    std::string reason;
  };
  std::vector<Victim> victims;
  int grace_period_seconds = 0;  // for the event text
  // The nodes the preemptor's placement was planned on (by NodeIndex): held from the best-effort
  // jobs it could evict in turn while its victims stop. Empty: none held.
  std::vector<uint8_t> nodes;
};

// A job that can no longer run as asked fails with `reason`: its time limit passed, or a job it
// depends on ended otherwise than it needed (or is gone). Its live tasks get their stop.
struct FailJobOp : OpTime {
  std::string job_id;
  std::string reason;
};

// A job that waited long enough gets nodes held for it; smaller jobs stop backfilling them.
struct ReserveOp : OpTime {
  std::string job_id;
  std::vector<uint8_t> nodes;  // by NodeIndex: 1 = held
};

// Stops past their deadline: the tasks are released as if their agent had confirmed.
struct StopsOverdueOp : OpTime {
  std::string job_id;
  std::vector<int> tasks;
};

// Retention: ended jobs removed, and cluster events older than `events_before_ms`.
struct RemoveJobsOp : OpTime {
  std::vector<uint64_t> seqs;
  int64_t events_before_ms = 0;
};

// ---- nodes ------------------------------------------------------------------------------------

struct RegisterNodeOp : OpTime {
  NodeSpec spec;
  nlohmann::json spec_json;  // canonical
  std::optional<AgentInfo> agent;
  int max_nodes = 0;
  // The MIG layouts the agent reported (api/mig_report.h): (GPU index, instances that exist).
  std::vector<std::pair<int, std::vector<MigInstance>>> mig_present;
};

// An agent's GPU report in a heartbeat (checked for shape).
struct GpuReport {
  int index = 0;
  bool healthy = true;
  std::string reason;
  double temperature_c = -1, utilization = -1, memory_used_fraction = -1;  // -1: not reported
  std::optional<std::vector<MigInstance>> mig_instances;  // the MIG layout, when reported
  // A guaranteed job whose CUDA limiter found this GPU full of others' use ("": none).
  std::string memory_pressure_job;
};
struct HeartbeatOp : OpTime {
  std::string node;
  std::optional<AgentInfo> agent;
  std::vector<GpuReport> gpus;
};

// A node silent past the heartbeat timeout.
struct NodeLostOp : OpTime {
  NodeIndex node = 0;
  double silent_s = 0;
};

struct CordonNodeOp : OpTime {
  std::string node;
  bool cordoned = true;
};

struct DrainNodeOp : OpTime {
  std::string node;
};

// ---- queues -----------------------------------------------------------------------------------

struct PutQueueOp : OpTime {
  QueueSpec spec;
  bool create = false;  // create a new queue; otherwise replace the one of that name
};

using Operation =
    std::variant<SubmitJobOp, CancelJobOp, ReportTaskOp, CycleStartOp, PlaceTasksOp, JobWaitsOp, PreemptOp,
                 ReserveOp, StopsOverdueOp, RemoveJobsOp, RegisterNodeOp, HeartbeatOp, NodeLostOp, CordonNodeOp,
                 DrainNodeOp, PutQueueOp, FailJobOp>;

// "SubmitJob", "PlaceTasks", ...: for logs and test messages.
const char* OperationName(const Operation& op);

}  // namespace gpupool
