// The control plane's heart: jobs, tasks, nodes and queues in memory, written through to the Store
// before any change is acknowledged, and the scheduling loop that orders pending jobs
// (sched/queueing.h) and places them with the core pipeline (sched/scheduler.h).
//
// Thread safety: every public method may be called from any thread (HTTP workers, the loop). One
// mutex guards all state; the loop holds it for one scheduling cycle. A submission is written to
// the store without the mutex (group commit batches concurrent submitters), and enters the
// in-memory queue only once it is durable, so memory never holds what the disk does not.
//
// Faults (docs/server.md#faults): a node silent for the heartbeat timeout is lost, a GPU its agent
// reports unhealthy is faulty, and a failed task of a job with retry.onFailure is a fault too. Each
// fault releases or stops the job's tasks (the whole gang), counts against the job's retry budget
// and requeues it after its backoff; over budget the job fails naming the fault. A GPU whose
// telemetry stays over the hot-spot thresholds takes no new placements and its best-effort tasks are
// migrated; that is a move, not a fault.
//
// Lifecycle of a task: pending -> assigned (placed, the agent has not reported) -> running ->
// succeeded | failed; a cancel or a preemption moves assigned/running to stopping, and the agent's
// "stopped" report (or the stop deadline) releases the allocation: cancelled | preempted (the job
// is queued again). The ledger holds an allocation for every assigned, running and stopping task.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "api/jobspec.h"
#include "common/rng.h"
#include "model/ledger.h"
#include "model/workload.h"
#include "sched/preemption.h"
#include "sched/queueing.h"
#include "sched/scheduler.h"
#include "server/admission.h"
#include "server/config.h"
#include "server/job_list.h"
#include "server/metrics.h"
#include "server/node_credentials.h"
#include "server/state.h"
#include "server/preemption_plan.h"
#include "server/state_machine.h"
#include "server/views.h"
#include "server/watches.h"
#include "store/store.h"

namespace gpupool {


struct ListJobsQuery {
  std::set<std::string> states, tenants, queues;  // empty: any
  int limit = 100;
  uint64_t after_seq = 0;  // page token
  // fields=tasks / fields=spec: items carry their tasks / spec (pages of at most kMaxDetailedPage
  // jobs, ended early once they hold kMaxListedTasks tasks).
  bool with_tasks = false;
  bool with_spec = false;
};

class PoolService {
 public:
  // Opens the store's state: queues, nodes, jobs, tasks and their allocations, exactly as last
  // acknowledged. Fails when the stored state does not fit together (a placement that would
  // overcommit, an unknown node) rather than guess.
  static Result<std::unique_ptr<PoolService>> Open(ServerConfig config, std::unique_ptr<Store> store);
  ~PoolService();
  PoolService(const PoolService&) = delete;
  PoolService& operator=(const PoolService&) = delete;

  // The scheduling loop thread. Without Start(), tests drive cycles with RunCycle().
  void Start();
  void Stop();
  // One scheduling cycle now; returns how many jobs it placed.
  int RunCycle();

  // ---- jobs -----------------------------------------------------------------------------------
  Result<nlohmann::json> SubmitJob(const Principal& who, std::string_view body, SpecFormat format);
  Result<nlohmann::json> GetJob(const Principal& who, const std::string& id);
  // Where to read a task's logs: its (last) node's agent. NotFound for an unknown or invisible job
  // or task, FailedPrecondition when the task has not run anywhere yet or its agent serves no logs.
  struct LogSource {
    std::string node;
    std::string endpoint;  // http://host:port of the agent
    std::string token;     // bearer token the agent accepts from the server
    std::string task_id;   // "<job id>.<index>", the agent's name for the task
  };
  Result<LogSource> TaskLogSource(const Principal& who, const std::string& job_id, int index);
  // A page of job summaries (docs/api.md#list-jobs). A page may hold fewer than `limit` items and
  // still have a nextPageToken: each call examines at most kMaxListScan jobs, so that a filter
  // that matches little never holds the lock for a walk over every job.
  Result<nlohmann::json> ListJobs(const Principal& who, const ListJobsQuery& query);
  static constexpr int kMaxListLimit = 1000;
  static constexpr int kMaxDetailedPage = 100;
  static constexpr int kMaxListedTasks = 10000;
  static constexpr int kMaxListScan = 20000;
  Result<nlohmann::json> CancelJob(const Principal& who, const std::string& id);
  Result<nlohmann::json> JobEvents(const Principal& who, const std::string& id, int64_t after_id, int limit);

  // ---- nodes and queues -----------------------------------------------------------------------
  nlohmann::json ListNodes();
  Result<nlohmann::json> GetNode(const std::string& name);
  Result<nlohmann::json> SetCordon(const std::string& name, bool cordoned);
  Result<nlohmann::json> DrainNode(const std::string& name);
  nlohmann::json ListQueues();
  Result<nlohmann::json> GetQueue(const std::string& name);
  Result<nlohmann::json> CreateQueue(const nlohmann::json& body);
  Result<nlohmann::json> UpdateQueue(const std::string& name, const nlohmann::json& body);

  // ---- the node side (agents) -----------------------------------------------------------------
  // Registers (or re-registers) a node. `who` decides what it may do (docs/server.md#node-credentials):
  // an admin or the bootstrap agent token gets a fresh node credential in the answer
  // ("credential"), the bootstrap token only while the node is not ready with a live credential;
  // a node credential re-registers its own node only and keeps its credential.
  Result<nlohmann::json> RegisterNode(const Principal& who, const nlohmann::json& body);
  Result<nlohmann::json> RegisterNode(const nlohmann::json& body) {
    return RegisterNode(Principal{"", Role::kAdmin, ""}, body);
  }
  // The principal of a node credential; nothing for an unknown or revoked one.
  std::optional<Principal> AuthenticateNode(std::string_view secret);
  nlohmann::json ListNodeCredentials();
  Result<nlohmann::json> RevokeNodeCredential(const std::string& node);
  // The identity of the pool: created with its store, never changed (docs/server.md#cluster-identity).
  const std::string& cluster_id() const { return cluster_id_; }
  Result<nlohmann::json> Heartbeat(const std::string& node, const nlohmann::json& body);
  Result<nlohmann::json> Assignments(const std::string& node);
  // Long poll for a node's assignments (docs/api.md#node-side-for-agents). `since` is the `version`
  // of the assignments the agent holds ("" none). Changed since then (or a version of another
  // server run): the assignments now. Otherwise nothing, and `watcher` gets them once they change
  // and are durable (or the caller's timeout answers it first). A node keeps at most
  // kMaxWatchesPerKey waiting watchers: one more answers the oldest at once.
  Result<std::optional<nlohmann::json>> WatchAssignments(const std::string& node, const std::string& since,
                                                         std::shared_ptr<Watcher> watcher);
  // The same for a job (GET /api/v1/jobs/{id}?wait=S&since=VERSION): its JSON (as GetJob) once it
  // changes; a job that retention removes meanwhile is answered with {"error": NotFound}.
  Result<std::optional<nlohmann::json>> WatchJob(const Principal& who, const std::string& id,
                                                 const std::string& since, std::shared_ptr<Watcher> watcher);
  static constexpr size_t kMaxWatchesPerKey = 4;
  // Answers every waiting watcher with its view as it is now (the HTTP layer is stopping).
  void ReleaseWatchers();
  // Nodes with an assignments watcher waiting (tests wait on it rather than on the clock).
  size_t NodesWatched() const;
  Result<nlohmann::json> ReportTask(const std::string& node, const std::string& job_id, int index,
                                    const nlohmann::json& body);
  // Many reports in one call and one durable write: {"reports": [{"jobId", "index", "state", ...}]}
  // answers {"results": [{"ok": true} | {"ok": false, "code": "FailedPrecondition", "message"}]},
  // one per report in order. A malformed entry is InvalidArgument naming it, nothing applied.
  Result<nlohmann::json> ReportTasks(const std::string& node, const nlohmann::json& body);
  static constexpr size_t kMaxReportsPerCall = 1024;
  // The protocol features registration and heartbeat answers announce ("features").
  static nlohmann::json AgentFeatures();

  nlohmann::json Health();
  // Ok while the store's filesystem has more free space than store.minFreeBytes; otherwise
  // ResourceExhausted naming the path, the free bytes and the reserve (see disk_guard.h). New work
  // checks it first; heartbeats and status reports do not.
  Status CheckStoreSpace();
  std::string MetricsText();

  // Ledger invariants, and that the ledger holds exactly the allocations of the live tasks.
  Status CheckInvariants();
  // Per GPU of every node: what the ledger has used and what the live tasks were granted, for tests.
  using GpuUse = gpupool::GpuUse;
  std::vector<GpuUse> GpuUsage();

  const ServerConfig& config() const { return config_; }

  // Hears every operation the state machine applied, in order, under the service's lock (the
  // replay test records them; a replicated log will). Set it before the first request.
  void SetOperationObserver(std::function<void(const Operation&)> observer);
  // Calls `fn` with the state under the service's lock (tests compare states with it).
  void InspectState(const std::function<void(const PoolState&)>& fn) const;

 private:
  using TaskState = PoolTask;
  using JobState = PoolJob;
  using NodeInfo = PoolNode;

  PoolService(ServerConfig config, std::unique_ptr<Store> store);
  Status Recover();
  Status RebuildScheduler(std::vector<TypicalPod> typical);  // REQUIRES: mu_; typical: TypicalOfGpuTasks(recent_tasks_)
  Status CheckInvariantsLocked() const { return state_.CheckInvariants(); }  // REQUIRES: mu_
  Status RebuildQueueOrder();            // REQUIRES: mu_
  void Loop();
  int CycleLocked(WriteBatch& batch);  // REQUIRES: mu_

  // REQUIRES: mu_ for all below.
  Result<JobState*> VisibleJob(const Principal& who, const std::string& id);
  nlohmann::json JobJson(const JobState& j) const;
  // A job's JSON from its snapshot (views.h), built without the lock.
  nlohmann::json JobAnswer(const JobSnapshot& snap, const std::string& version) const;
  nlohmann::json TaskJson(const JobState& j, int index) const;
  nlohmann::json NodeJson(NodeIndex n) const;
  nlohmann::json QueueJson(const QueueSpec& q) const;
  Result<nlohmann::json> GetQueueLocked(const std::string& name);
  // Applies `op` (stamped with the clocks now unless it carries a time) and takes in what it
  // changed: its store writes join `batch`; watchers, the queue order and the loop hear of it.
  // Refused: its error, nothing changed.
  Status ApplyLocked(Operation op, WriteBatch& batch);
  Status CommitLocked(WriteBatch& batch);
  void TakeEffectsLocked(Effects& fx);
  static Result<TaskReport> ParseTaskReport(const std::string& job_id, int index, const nlohmann::json& body,
                                            bool with_ids);
  nlohmann::json AssignmentsJsonLocked(NodeIndex n) const;
  // Every change enqueued so far is durable: bumps the versions of the changed nodes and jobs, and
  // takes what their watchers are to hear (answers_), delivered once the lock is let go.
  void NotifyWatchersLocked();
  // Builds and sends the answers NotifyWatchersLocked took. REQUIRES: not mu_.
  void DeliverAnswers();
  // The service's lock: letting go of it (unlock or the end of its scope) delivers the watchers'
  // answers taken meanwhile, so their JSON is built and sent without the lock.
  class ServiceLock {
   public:
    explicit ServiceLock(PoolService& svc) : svc_(svc), lock_(svc.mu_) {}
    ~ServiceLock();
    ServiceLock(const ServiceLock&) = delete;
    ServiceLock& operator=(const ServiceLock&) = delete;
    void unlock();
    void lock() { lock_.lock(); }
    std::unique_lock<std::mutex>& get() { return lock_; }

   private:
    PoolService& svc_;
    std::unique_lock<std::mutex> lock_;
  };
  struct Answer {
    std::vector<std::shared_ptr<Watcher>> watchers;
    std::shared_ptr<nlohmann::json> view;  // built under the lock (assignments, a gone job)
    std::shared_ptr<JobSnapshot> job;      // or a job's snapshot, built into JSON after it
    std::string version;
  };
  bool ComputeMask(const JobState& j, NodeMask& mask) const;
  // The preemption and reservation controllers (preemption_plan.h, reservations.h), their
  // decisions applied.
  bool TryPreempt(JobState& j, const PendingEntry& entry, RunningView& running, WriteBatch& batch);
  void MaybeReserve(JobState& j, WriteBatch& batch);
  // The loop's controllers: each reads the state and applies what it decides as operations.
  void ExpireStops(WriteBatch& batch);
  void EndJobsPastTimeLimits(int64_t now_ms, WriteBatch& batch);
  void GateDependencies(WriteBatch& batch);
  void RemoveExpiredJobs(WriteBatch& batch);
  void CheckNodes(WriteBatch& batch);
  void LearnTypicalPods();
  int64_t NowMs() const;     // the wall clock (config_.wall_clock_ms in tests)
  double MonoNow() const;    // the steady clock, in seconds (config_.mono_clock_s in tests)

  ServerConfig config_;
  std::unique_ptr<DiskGuard> disk_guard_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<GroupCommitter> committer_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool wake_pending_ = false;
  // Loop cycles whose batch is enqueued / durable; Assignments waits until they are equal to what
  // it saw on entry (see Loop).
  uint64_t enqueued_gen_ = 0;
  uint64_t durable_gen_ = 0;
  std::condition_variable durable_;
  std::atomic<bool> stopping_{false};
  std::thread loop_;

  // Jobs, tasks, nodes, queues, the ledger and their indexes (server/state.h), and the only code
  // that changes them (server/state_machine.h).
  PoolState state_;
  StateMachine machine_{state_, config_};
  SeededRng rng_{42};
  std::unique_ptr<Scheduler> scheduler_;
  Profile profile_;
  std::vector<TypicalPod> typical_pods_;
  std::vector<TaskRequest> recent_tasks_;  // ring of submitted tasks for the typical workload
  size_t recent_next_ = 0;
  uint64_t tasks_since_learn_ = 0;

  std::optional<QueueOrder> order_;  // built from state_.queues

  // Pending counts reserved by submissions between their admission and their job (or failure).
  PendingCounts in_flight_;
  std::atomic<uint64_t> next_seq_{1};
  int64_t next_removal_ms_ = 0;   // the next retention pass (wall clock)

  // Distinguishes this server run's watch versions from an earlier run's.
  std::string run_token_;
  std::optional<WatchSet<NodeIndex>> node_watches_;   // nodes' assignments
  std::optional<WatchSet<std::string>> job_watches_;  // jobs, by id

  ServerMetrics metrics_;
  std::function<void(const Operation&)> operation_observer_;
  std::vector<Answer> answers_;           // guarded by mu_
  std::atomic<bool> has_answers_{false};

  NodeCredentials credentials_;
  std::string cluster_id_;
};

}  // namespace gpupool
