// Durable state of the control plane behind one interface. The server keeps its working state in
// memory and writes every change through a Store before it acknowledges it; on start it rebuilds
// itself from Load(). SQLite (WAL) is the embedded default (store/sqlite_store.h).
//
// Records hold the server's own JSON for specs and placements: the store does not interpret them,
// so the schema changes only when what is indexed or queried changes.
//
// Thread safety: a Store is safe to call from several threads (implementations serialise
// internally). Apply() returns only once the batch is durable (fsync'd), or fails and changes
// nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/status.h"

namespace gpupool {

struct JobRecord {
  std::string id;       // "j-000000000123"
  uint64_t seq = 0;     // submission order, unique, increasing
  std::string tenant;
  std::string queue;
  std::string name;
  int priority = 0;
  std::string state;    // pending, running, succeeded, failed, cancelled
  std::string reason;   // why it is in that state ("" when obvious)
  std::string spec_json;
  int64_t created_ms = 0;
  int64_t updated_ms = 0;
  int faults = 0;             // restarts after faults (node lost, GPU fault, failed task), for retry
  int64_t not_before_ms = 0;  // a requeued job waits for its retry backoff until then (0: no wait)
  int64_t started_ms = 0;     // when its current run started (its time limit counts from it); 0: never
  bool operator==(const JobRecord&) const = default;
};

struct TaskRecord {
  std::string job_id;
  int index = 0;            // position in the job's task order
  std::string state;        // pending, assigned, running, stopping, succeeded, failed, cancelled, preempted
  std::string node;         // "" while not placed
  std::string placement_json;  // "" while not placed
  int exit_code = 0;
  int restarts = 0;
  int64_t updated_ms = 0;
  // The current placement's run: random, unguessable, new with every placement (never reused,
  // not even by a store created anew). "" while never placed.
  std::string run_id;
  // How the task ended, as its agent said ("killed by SIGKILL"); "" until then.
  std::string message;
  // While (or after) it is stopped: why, and what "stopped" turns it into (cancelled, preempted).
  std::string stop_reason;
  std::string stop_outcome;
  // A container task: the image its current or last run started from, pinned by digest
  // ("oci:/srv/images/pytorch:24.05@sha256:..."), as its agent reported; "" otherwise.
  std::string image;
  bool operator==(const TaskRecord&) const = default;
};

struct NodeRecord {
  std::string name;
  std::string spec_json;
  bool cordoned = false;
  bool draining = false;
  std::string state;        // ready, lost
  int64_t last_heartbeat_ms = 0;
  bool operator==(const NodeRecord&) const = default;
};

struct QueueRecord {
  std::string name;
  std::string config_json;  // parent, weight, guaranteed quota, limit
  bool operator==(const QueueRecord&) const = default;
};

struct EventRecord {
  int64_t id = 0;           // assigned by the store on Apply (increasing); ignored on input
  std::string job_id;       // "" for cluster events
  int64_t time_ms = 0;
  std::string type;         // Submitted, Scheduled, Pending, Preempted, Cancelled, TaskStatus, ...
  std::string message;
  bool operator==(const EventRecord&) const = default;
};

// One atomic change. Put* insert or replace by key (job id; job id + task index; node name;
// queue name); Delete* remove by key and succeed when absent.
struct PutJob { JobRecord job; };
struct PutTask { TaskRecord task; };
struct PutNode { NodeRecord node; };
struct DeleteNode { std::string name; };
struct PutQueue { QueueRecord queue; };
struct DeleteQueue { std::string name; };
struct AppendEvent { EventRecord event; };
struct PutMeta { std::string key; std::string value; };
// Removes a job with its tasks and its events (retention of finished jobs); succeeds when absent.
struct DeleteJob { std::string id; };
// Removes the cluster events (job_id "") older than before_ms.
struct DeleteClusterEvents { int64_t before_ms = 0; };
using WriteOp =
    std::variant<PutJob, PutTask, PutNode, DeleteNode, PutQueue, DeleteQueue, AppendEvent, PutMeta, DeleteJob,
                 DeleteClusterEvents>;

struct WriteBatch {
  std::vector<WriteOp> ops;
  bool empty() const { return ops.empty(); }
  void Add(WriteOp op) { ops.push_back(std::move(op)); }
  void Append(WriteBatch other);
};

// Everything a restarting server needs, in key order (jobs by seq, tasks by job seq then index,
// nodes and queues by name). Events are not loaded here (ListEvents reads them on demand).
struct StoreSnapshot {
  std::vector<JobRecord> jobs;
  std::vector<TaskRecord> tasks;
  std::vector<NodeRecord> nodes;
  std::vector<QueueRecord> queues;
  std::vector<std::pair<std::string, std::string>> meta;
};

class Store {
 public:
  virtual ~Store() = default;
  // Applies every op of `batch` in one transaction, durably; on failure nothing changes.
  virtual Status Apply(const WriteBatch& batch) = 0;
  virtual Result<StoreSnapshot> Load() = 0;
  // Events of one job (job_id "" : cluster events) with id > after_id, oldest first, at most limit.
  virtual Result<std::vector<EventRecord>> ListEvents(const std::string& job_id, int64_t after_id,
                                                      int limit) = 0;
  // Schema version the store is at after its migrations ran.
  virtual int schema_version() const = 0;
};

// Batches concurrent Commit() calls into one Store::Apply (group commit): each caller returns when
// its own batch is durable. Callers from many threads; one of them does the write for all waiting
// at that moment (leader/follower), so there is no extra thread. A failed Apply fails every
// caller of that group, and nothing of it is stored.
class GroupCommitter {
 public:
  explicit GroupCommitter(Store& store, size_t max_ops_per_group = 4096);
  ~GroupCommitter();
  // Enqueue + Wait.
  Status Commit(WriteBatch batch);

  // Two halves of Commit, for a caller that must fix its batch's place in the write order while it
  // holds a lock of its own but must not hold that lock through the write: batches are applied in
  // the order they were enqueued. Every Ticket must be waited on (an enqueued batch is written by
  // whichever caller leads the next group; an unwaited ticket would still be written, but nobody
  // would learn its status).
  class Ticket {
   public:
    Ticket() = default;

   private:
    friend class GroupCommitter;
    std::shared_ptr<void> pending_;
  };
  Ticket Enqueue(WriteBatch batch);
  // Returns once the ticket's batch is durable (or failed); an empty ticket returns Ok at once.
  Status Wait(Ticket ticket);
  struct Stats {
    uint64_t commits = 0;   // Commit calls
    uint64_t groups = 0;    // Store::Apply calls
  };
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpupool
