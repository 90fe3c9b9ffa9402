// The pool's state machine: the only code that changes a PoolState, by applying the typed
// operations of server/operations.h. Apply checks an operation against the state first (a report
// about a task that moved on, a node re-registering with another inventory, a queue change that
// breaks the tree) and changes nothing when it is refused; otherwise it changes the state and
// says what it changed in `Effects`: the store writes that make it durable (rows and events), the
// nodes whose assignments changed, the jobs whose views changed, whether capacity may have grown.
//
// No I/O, no lock, no clock of its own (the operation carries its time), no randomness (run ids
// come with the operation): applying the same operations to the same starting state gives the
// same state. The facade (PoolService) holds the lock, commits the writes, answers watchers and
// wakes the loop; a replay applies the operations alone (service_replay_test.cc).
//
// Outside the machine, by design: recovery from the store (service_recover.cc builds the state
// from rows; the replay test checks both give the same state), the scheduler's what-ifs on the
// ledger (placements tried and released, victims released and put back) and the scheduling
// controller's memo of when a job last failed to fit (PoolJob::failed_epoch/preempt_epoch).
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "server/config.h"
#include "server/metrics.h"
#include "server/operations.h"
#include "server/state.h"

namespace gpupool {

struct Effects {
  explicit Effects(ServerMetrics& m) : metrics(m) {}
  WriteBatch batch;
  std::set<NodeIndex> nodes_changed;      // their assignments changed
  std::set<std::string> jobs_changed;     // their views changed
  std::vector<std::string> jobs_removed;  // gone (retention)
  bool wake = false;                      // the scheduling loop has work (room freed, a job came)
  std::optional<QueueOrder> order;        // the queue tree after a queue change
  ServerMetrics& metrics;
};

class StateMachine {
 public:
  StateMachine(PoolState& state, const ServerConfig& config) : st_(state), config_(config) {}

  // Checks `op` against the state; refused: its error, nothing changed. Otherwise applies it
  // (taking what it carries, a submitted job's spec, rather than copying it).
  Status Apply(Operation op, Effects& fx);

  // The rows and the event that make a submission durable (the facade writes them before the job
  // enters the state; Apply of a SubmitJobOp adds the same to its effects).
  static WriteBatch SubmissionWrites(const SubmitJobOp& op);

 private:
  // One handler per operation (state_machine_jobs.cc, state_machine_nodes.cc).
  Status On(SubmitJobOp& op);
  Status On(const CancelJobOp& op);
  Status On(const ReportTaskOp& op);
  Status On(const CycleStartOp& op);
  Status On(const PlaceTasksOp& op);
  Status On(const JobWaitsOp& op);
  Status On(const PreemptOp& op);
  Status On(const ReserveOp& op);
  Status On(const StopsOverdueOp& op);
  Status On(const FailJobOp& op);
  Status On(const RemoveJobsOp& op);
  Status On(const RegisterNodeOp& op);
  Status On(const HeartbeatOp& op);
  Status On(const NodeLostOp& op);
  Status On(const CordonNodeOp& op);
  Status On(const DrainNodeOp& op);
  Status On(const PutQueueOp& op);

  // The job and task lifecycle the handlers share (state_machine.cc). `now_`, `mono_` and `fx_`
  // are those of the operation being applied.
  // The job's tenant gets its uid from the sandbox range now if it has none (identities.h).
  void GiveTenantIdentity(const PoolJob& j);
  void WriteJob(PoolJob& j);
  void WriteTask(const PoolJob& j, int index);
  void WriteNode(NodeIndex n);
  void Event(const std::string& job_id, const std::string& type, const std::string& message);
  void ReleaseTask(PoolJob& j, int index, bool agent_ended_it = false);
  void StopTask(PoolJob& j, int index, TaskPhase outcome, const std::string& reason);
  void AfterTaskEnded(PoolJob& j);
  void FailJob(PoolJob& j, const std::string& reason);
  void FaultJob(PoolJob& j, const std::string& cause, const std::string& reason);
  void ApplyGpuReports(NodeIndex n, const std::vector<GpuReport>& reports);
  void MigrateOffHotGpu(NodeIndex n, int gpu, const std::string& reason);
  void ApplyMemoryPressure(NodeIndex n, int gpu, const std::string& job_id, const std::string& where);
  std::vector<PoolJob*> JobsOnGpu(NodeIndex n, int gpu);
  void UpdateGpuUsable(NodeIndex n, int gpu);
  void CapacityGrew();
  // The job of that id while it is pending; FailedPrecondition otherwise.
  Result<PoolJob*> PendingJob(const std::string& id);

  PoolState& st_;
  const ServerConfig& config_;
  int64_t now_ = 0;
  double mono_ = 0;
  Effects* fx_ = nullptr;
};

}  // namespace gpupool
