#include "store/sqlite_store.h"

#include <fmt/format.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <cstdint>
#include <iterator>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace gpupool {
namespace {

// ---- schema -----------------------------------------------------------------------------------
//
// The version a file is at is the largest `version` in its schema_migrations table (0 when the
// table is empty or absent). Open() applies every migration above it, in order, each in its own
// transaction together with its schema_migrations row, so a crash mid-upgrade leaves the file at
// the last whole version.
//
// The list is append-only: a released migration is never edited or removed (files out there
// already ran it); a change to the schema is a new entry with the next version.

struct Migration {
  int version;
  const char* description;
  const char* sql;  // one or more statements
};

constexpr Migration kMigrations[] = {
    {1, "tables: jobs, tasks, nodes, queues, events, meta",
     R"sql(
CREATE TABLE jobs (
  id TEXT NOT NULL PRIMARY KEY,
  seq INTEGER NOT NULL UNIQUE,
  tenant TEXT NOT NULL,
  queue TEXT NOT NULL,
  name TEXT NOT NULL,
  priority INTEGER NOT NULL,
  state TEXT NOT NULL,
  reason TEXT NOT NULL,
  spec_json TEXT NOT NULL,
  created_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL
);
CREATE TABLE tasks (
  job_id TEXT NOT NULL REFERENCES jobs(id),
  idx INTEGER NOT NULL,
  state TEXT NOT NULL,
  node TEXT NOT NULL,
  placement_json TEXT NOT NULL,
  exit_code INTEGER NOT NULL,
  restarts INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL,
  PRIMARY KEY (job_id, idx)
);
CREATE TABLE nodes (
  name TEXT NOT NULL PRIMARY KEY,
  spec_json TEXT NOT NULL,
  cordoned INTEGER NOT NULL CHECK (cordoned IN (0, 1)),
  draining INTEGER NOT NULL CHECK (draining IN (0, 1)),
  state TEXT NOT NULL,
  last_heartbeat_ms INTEGER NOT NULL
);
CREATE TABLE queues (
  name TEXT NOT NULL PRIMARY KEY,
  config_json TEXT NOT NULL
);
CREATE TABLE events (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id TEXT NOT NULL,
  time_ms INTEGER NOT NULL,
  type TEXT NOT NULL,
  message TEXT NOT NULL
);
CREATE TABLE meta (
  key TEXT NOT NULL PRIMARY KEY,
  value TEXT NOT NULL
);
)sql"},
    {2, "indexes: jobs by state, tenant and queue; events by job",
     R"sql(
CREATE INDEX jobs_by_state ON jobs (state, seq);
CREATE INDEX jobs_by_tenant ON jobs (tenant, seq);
CREATE INDEX jobs_by_queue ON jobs (queue, seq);
CREATE INDEX events_by_job ON events (job_id, id);
)sql"},
    {3, "jobs: fault restarts and the time a requeued job may start again",
     R"sql(
ALTER TABLE jobs ADD COLUMN faults INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN not_before_ms INTEGER NOT NULL DEFAULT 0;
)sql"},
    {4, "tasks: the run id of the task's current placement (agents adopt a run only by it)",
     R"sql(
ALTER TABLE tasks ADD COLUMN run_id TEXT NOT NULL DEFAULT '';
)sql"},
    {5, "tasks: how a task ended, and why and to what end it is stopped (a restart kept neither)",
     R"sql(
ALTER TABLE tasks ADD COLUMN message TEXT NOT NULL DEFAULT '';
ALTER TABLE tasks ADD COLUMN stop_reason TEXT NOT NULL DEFAULT '';
ALTER TABLE tasks ADD COLUMN stop_outcome TEXT NOT NULL DEFAULT '';
)sql"},
    {6, "jobs: when the current run started (time limits count from it across server restarts)",
     R"sql(
ALTER TABLE jobs ADD COLUMN started_ms INTEGER NOT NULL DEFAULT 0;
)sql"},
    {7, "tasks: the container image a task's run started from, pinned by digest",
     R"sql(
ALTER TABLE tasks ADD COLUMN image TEXT NOT NULL DEFAULT '';
)sql"},
};

constexpr int kLatestVersion = static_cast<int>(std::size(kMigrations));

constexpr bool MigrationsNumberedInOrder() {
  for (int i = 0; i < kLatestVersion; ++i) {
    if (kMigrations[i].version != i + 1) return false;
  }
  return true;
}
static_assert(MigrationsNumberedInOrder(), "migrations must be numbered 1, 2, 3, ... in list order");

constexpr const char* kCreateMigrationsTable =
    "CREATE TABLE IF NOT EXISTS schema_migrations ("
    "version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at TEXT NOT NULL)";

// Foreign keys are checked per statement (not deferred): within a batch a job must be put before its
// tasks, and a bad op is reported as itself rather than as a failed COMMIT.
// Upserts rather than INSERT OR REPLACE: REPLACE deletes the old row first, which would trip (or,
// with a cascading key, silently delete) the tasks of a job.
constexpr const char* kPutJob =
    "INSERT INTO jobs (id, seq, tenant, queue, name, priority, state, reason, spec_json, created_ms, "
    "updated_ms, faults, not_before_ms, started_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14) "
    "ON CONFLICT (id) DO UPDATE SET seq = excluded.seq, tenant = excluded.tenant, "
    "queue = excluded.queue, name = excluded.name, priority = excluded.priority, "
    "state = excluded.state, reason = excluded.reason, spec_json = excluded.spec_json, "
    "created_ms = excluded.created_ms, updated_ms = excluded.updated_ms, faults = excluded.faults, "
    "not_before_ms = excluded.not_before_ms, started_ms = excluded.started_ms";
constexpr const char* kPutTask =
    "INSERT INTO tasks (job_id, idx, state, node, placement_json, exit_code, restarts, updated_ms, run_id, "
    "message, stop_reason, stop_outcome, image) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13) "
    "ON CONFLICT (job_id, idx) DO UPDATE SET state = excluded.state, node = excluded.node, "
    "placement_json = excluded.placement_json, exit_code = excluded.exit_code, "
    "restarts = excluded.restarts, updated_ms = excluded.updated_ms, run_id = excluded.run_id, "
    "message = excluded.message, stop_reason = excluded.stop_reason, stop_outcome = excluded.stop_outcome, "
    "image = excluded.image";
constexpr const char* kPutNode =
    "INSERT INTO nodes (name, spec_json, cordoned, draining, state, last_heartbeat_ms) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6) "
    "ON CONFLICT (name) DO UPDATE SET spec_json = excluded.spec_json, cordoned = excluded.cordoned, "
    "draining = excluded.draining, state = excluded.state, "
    "last_heartbeat_ms = excluded.last_heartbeat_ms";
constexpr const char* kDeleteNode = "DELETE FROM nodes WHERE name = ?1";
constexpr const char* kPutQueue =
    "INSERT INTO queues (name, config_json) VALUES (?1, ?2) "
    "ON CONFLICT (name) DO UPDATE SET config_json = excluded.config_json";
constexpr const char* kDeleteQueue = "DELETE FROM queues WHERE name = ?1";
constexpr const char* kAppendEvent =
    "INSERT INTO events (job_id, time_ms, type, message) VALUES (?1, ?2, ?3, ?4)";
constexpr const char* kDeleteJobTasks = "DELETE FROM tasks WHERE job_id = ?1";
constexpr const char* kDeleteJobEvents = "DELETE FROM events WHERE job_id = ?1";
constexpr const char* kDeleteJob = "DELETE FROM jobs WHERE id = ?1";
constexpr const char* kDeleteClusterEvents = "DELETE FROM events WHERE job_id = '' AND time_ms < ?1";
constexpr const char* kPutMeta =
    "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET value = excluded.value";

constexpr const char* kLoadJobs =
    "SELECT id, seq, tenant, queue, name, priority, state, reason, spec_json, created_ms, updated_ms, "
    "faults, not_before_ms, started_ms FROM jobs ORDER BY seq";
constexpr const char* kLoadTasks =
    "SELECT t.job_id, t.idx, t.state, t.node, t.placement_json, t.exit_code, t.restarts, t.updated_ms, t.run_id, "
    "t.message, t.stop_reason, t.stop_outcome, t.image FROM tasks AS t JOIN jobs AS j ON j.id = t.job_id ORDER BY j.seq, t.idx";
constexpr const char* kLoadNodes =
    "SELECT name, spec_json, cordoned, draining, state, last_heartbeat_ms FROM nodes ORDER BY name";
constexpr const char* kLoadQueues = "SELECT name, config_json FROM queues ORDER BY name";
constexpr const char* kLoadMeta = "SELECT key, value FROM meta ORDER BY key";
constexpr const char* kListEvents =
    "SELECT id, job_id, time_ms, type, message FROM events WHERE job_id = ?1 AND id > ?2 "
    "ORDER BY id LIMIT ?3";

// ---- sqlite helpers ---------------------------------------------------------------------------

// A failed sqlite call as a Status: constraint violations are the caller's fault (InvalidArgument),
// everything else is I/O. `doing` says what was attempted. Read sqlite3_errmsg before any further
// call on the connection, which would replace it.
Status SqliteError(sqlite3* db, int rc, std::string_view doing) {
  const char* msg = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  std::string text = fmt::format("{}: {} (sqlite error {})", doing, msg, rc);
  if ((rc & 0xff) == SQLITE_CONSTRAINT) return Status::InvalidArgument(std::move(text));
  return Status::IoError(std::move(text));
}

struct StmtDeleter {
  void operator()(sqlite3_stmt* s) const { sqlite3_finalize(s); }
};
using StmtPtr = std::unique_ptr<sqlite3_stmt, StmtDeleter>;

// Returns a cached statement to its initial state on scope exit: releases the read snapshot of a
// SELECT and drops the bound text, which points into the caller's records.
class ScopedReset {
 public:
  explicit ScopedReset(sqlite3_stmt* s) : s_(s) {}
  ~ScopedReset() {
    sqlite3_reset(s_);  // repeats the step's error code, already reported
    sqlite3_clear_bindings(s_);
  }
  ScopedReset(const ScopedReset&) = delete;
  ScopedReset& operator=(const ScopedReset&) = delete;

 private:
  sqlite3_stmt* s_;
};

// Binds parameters 1, 2, 3, ... in call order and keeps the first failure. Text is bound without a
// copy (SQLITE_STATIC): it must outlive the step, which the callers' records do.
class Binder {
 public:
  explicit Binder(sqlite3_stmt* s) : s_(s) {}
  Binder& Text(std::string_view v) {
    // data() of an empty view may be null, which sqlite would store as NULL, not "".
    const char* p = v.data() != nullptr ? v.data() : "";
    return Check(sqlite3_bind_text64(s_, next_++, p, v.size(), SQLITE_STATIC, SQLITE_UTF8));
  }
  Binder& Int(int64_t v) { return Check(sqlite3_bind_int64(s_, next_++, v)); }
  int rc() const { return rc_; }

 private:
  Binder& Check(int rc) {
    if (rc_ == SQLITE_OK) rc_ = rc;
    return *this;
  }
  sqlite3_stmt* s_;
  int next_ = 1;
  int rc_ = SQLITE_OK;
};

std::string ColumnText(sqlite3_stmt* s, int col) {
  const unsigned char* p = sqlite3_column_text(s, col);
  if (p == nullptr) return {};
  return std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(sqlite3_column_bytes(s, col)));
}
int ColumnInt(sqlite3_stmt* s, int col) {
  return sqlite3_column_int(s, col);
}
int64_t ColumnInt64(sqlite3_stmt* s, int col) {
  return sqlite3_column_int64(s, col);
}

// Overload set for std::visit.
template <typename... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <typename... F>
Overloaded(F...) -> Overloaded<F...>;

// ---- the store --------------------------------------------------------------------------------

class SqliteStore final : public Store {
 public:
  explicit SqliteStore(std::string path) : path_(std::move(path)) {}
  ~SqliteStore() override;
  SqliteStore(const SqliteStore&) = delete;
  SqliteStore& operator=(const SqliteStore&) = delete;

  // Opens (creating) the file, configures the connection, migrates and prepares the statements.
  Status Open(bool synchronous_full);

  Status Apply(const WriteBatch& batch) override;
  Result<StoreSnapshot> Load() override;
  Result<std::vector<EventRecord>> ListEvents(const std::string& job_id, int64_t after_id,
                                              int limit) override;
  int schema_version() const override { return version_; }

 private:
  // Statements prepared once per store and reused (parsing them per call would dominate small
  // batches).
  struct Statements {
    StmtPtr begin_write, begin_read, commit, rollback;
    StmtPtr put_job, put_task, put_node, delete_node, put_queue, delete_queue, append_event, put_meta;
    StmtPtr delete_job_tasks, delete_job_events, delete_job, delete_cluster_events;
    StmtPtr load_jobs, load_tasks, load_nodes, load_queues, load_meta, list_events;
  };

  Status Exec(const char* sql, std::string_view doing);
  Result<StmtPtr> Prepare(const char* sql);
  // Runs a cached statement that returns no rows.
  Status Run(sqlite3_stmt* s, std::string_view doing);
  // One row, first column as text ("" when there is no row).
  Result<std::string> QueryText(const char* sql, std::string_view doing);
  // One row, first column as an integer (0 when there is no row).
  Result<int64_t> QueryInt(const char* sql, std::string_view doing);
  Result<int> RecordedVersion();

  Status Configure(bool synchronous_full);
  Status Migrate();
  Status ApplyMigration(const Migration& m);
  Status PrepareStatements();

  Status ApplyOp(const WriteOp& op);
  // Ends the open transaction, if sqlite has not already, and returns `cause`.
  Status Rollback(Status cause);
  // Steps `s` to the end, calling `row` for each row.
  template <typename RowFn>
  Status ReadAll(sqlite3_stmt* s, std::string_view doing, RowFn row);

  const std::string path_;
  sqlite3* db_ = nullptr;
  int version_ = 0;  // set by Open, constant afterwards
  std::mutex mu_;    // one connection: Apply, Load and ListEvents take turns
  Statements st_;    // guarded by mu_
};

SqliteStore::~SqliteStore() {
  st_ = Statements{};  // statements are finalized before their connection closes
  // A failure here cannot be reported (and a WAL left behind is recovered on the next open).
  if (db_ != nullptr) sqlite3_close_v2(db_);
}

Status SqliteStore::Exec(const char* sql, std::string_view doing) {
  const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return SqliteError(db_, rc, doing);
  return Status::Ok();
}

Result<StmtPtr> SqliteStore::Prepare(const char* sql) {
  sqlite3_stmt* raw = nullptr;
  const int rc = sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, &raw, nullptr);
  StmtPtr stmt(raw);
  if (rc != SQLITE_OK) return SqliteError(db_, rc, fmt::format("prepare `{}`", sql));
  return stmt;
}

Status SqliteStore::Run(sqlite3_stmt* s, std::string_view doing) {
  ScopedReset reset(s);
  const int rc = sqlite3_step(s);
  if (rc != SQLITE_DONE && rc != SQLITE_ROW) return SqliteError(db_, rc, doing);
  return Status::Ok();
}

Result<std::string> SqliteStore::QueryText(const char* sql, std::string_view doing) {
  ASSIGN_OR_RETURN(StmtPtr stmt, Prepare(sql));
  const int rc = sqlite3_step(stmt.get());
  if (rc == SQLITE_ROW) return ColumnText(stmt.get(), 0);
  if (rc == SQLITE_DONE) return std::string();
  return SqliteError(db_, rc, doing);
}

Result<int64_t> SqliteStore::QueryInt(const char* sql, std::string_view doing) {
  ASSIGN_OR_RETURN(StmtPtr stmt, Prepare(sql));
  const int rc = sqlite3_step(stmt.get());
  if (rc == SQLITE_ROW) return ColumnInt64(stmt.get(), 0);
  if (rc == SQLITE_DONE) return int64_t{0};
  return SqliteError(db_, rc, doing);
}

template <typename RowFn>
Status SqliteStore::ReadAll(sqlite3_stmt* s, std::string_view doing, RowFn row) {
  ScopedReset reset(s);
  for (;;) {
    const int rc = sqlite3_step(s);
    if (rc == SQLITE_DONE) return Status::Ok();
    if (rc != SQLITE_ROW) return SqliteError(db_, rc, doing);
    row(s);
  }
}

// The store holds every tenant's job specs (commands, environments): owner-only. The file is
// created 0600 (and an older 0644 one tightened) before sqlite opens it; sqlite gives its -wal and
// -shm files the mode of the database file. No umask games: the server is multi-threaded.
static Status RestrictStoreFiles(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return Status::IoError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  const int rc = ::fchmod(fd, 0600);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return Status::IoError(fmt::format("cannot chmod 0600 {}: {}", path, std::strerror(err)));
  for (const char* suffix : {"-wal", "-shm", "-journal"}) {
    const std::string side = path + suffix;
    if (::chmod(side.c_str(), 0600) != 0 && errno != ENOENT)
      return Status::IoError(fmt::format("cannot chmod 0600 {}: {}", side, std::strerror(errno)));
  }
  return Status::Ok();
}

Status SqliteStore::Open(bool synchronous_full) {
  RETURN_IF_ERROR(RestrictStoreFiles(path_));
  const int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
  const int rc = sqlite3_open_v2(path_.c_str(), &db_, flags, nullptr);
  if (rc != SQLITE_OK) {
    // sqlite hands back a handle even when it fails (null only when out of memory).
    Status st = SqliteError(db_, rc, "open");
    sqlite3_close_v2(db_);
    db_ = nullptr;
    return st;
  }
  RETURN_IF_ERROR(Configure(synchronous_full));
  RETURN_IF_ERROR(Migrate());
  return PrepareStatements();
}

Status SqliteStore::Configure(bool synchronous_full) {
  int rc = sqlite3_extended_result_codes(db_, 1);
  if (rc != SQLITE_OK) return SqliteError(db_, rc, "enable extended result codes");
  // Another process (an operator's sqlite3 shell, a second server by mistake) may hold the write
  // lock for a moment: wait for it rather than fail.
  rc = sqlite3_busy_timeout(db_, 5000);
  if (rc != SQLITE_OK) return SqliteError(db_, rc, "set busy timeout");

  ASSIGN_OR_RETURN(std::string mode, QueryText("PRAGMA journal_mode=WAL", "set journal_mode=WAL"));
  if (mode != "wal") {
    return Status::FailedPrecondition(
        fmt::format("journal_mode=WAL is not available (sqlite kept \"{}\"); the store needs a file on "
                    "a local file system",
                    mode));
  }
  // In WAL mode FULL syncs the log on every commit (durable against power loss); NORMAL syncs it
  // only at checkpoints (durable against a crash of the process).
  RETURN_IF_ERROR(
      Exec(synchronous_full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL", "set synchronous"));
  RETURN_IF_ERROR(Exec("PRAGMA foreign_keys=ON", "enable foreign keys"));
  // A pragma sqlite does not know is silently ignored: read back what the contract relies on.
  ASSIGN_OR_RETURN(int64_t sync, QueryInt("PRAGMA synchronous", "read synchronous"));
  if (sync != (synchronous_full ? 2 : 1)) {
    return Status::FailedPrecondition(fmt::format("sqlite did not take synchronous (it reads {})", sync));
  }
  ASSIGN_OR_RETURN(int64_t fk, QueryInt("PRAGMA foreign_keys", "read foreign_keys"));
  if (fk != 1) return Status::FailedPrecondition("this sqlite build does not enforce foreign keys");
  return Status::Ok();
}

Result<int> SqliteStore::RecordedVersion() {
  ASSIGN_OR_RETURN(
      int64_t v, QueryInt("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", "read schema version"));
  if (v < 0 || v > std::numeric_limits<int>::max()) {
    return Status::FailedPrecondition(fmt::format("schema_migrations holds version {}, not a version", v));
  }
  return static_cast<int>(v);
}

Status SqliteStore::Migrate() {
  RETURN_IF_ERROR(Exec(kCreateMigrationsTable, "create schema_migrations"));
  ASSIGN_OR_RETURN(int current, RecordedVersion());
  if (current > kLatestVersion) {
    return Status::FailedPrecondition(
        fmt::format("the database is at schema version {}, newer than version {}, the newest this "
                    "build of gpupool knows; open it with a newer gpupool",
                    current, kLatestVersion));
  }
  for (const Migration& m : kMigrations) {
    if (m.version <= current) continue;
    RETURN_IF_ERROR(ApplyMigration(m));
  }
  ASSIGN_OR_RETURN(version_, RecordedVersion());
  return Status::Ok();
}

Status SqliteStore::ApplyMigration(const Migration& m) {
  const std::string what = fmt::format("migration to schema version {} ({})", m.version, m.description);
  RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE", "begin " + what));
  // Another process may have migrated the file since we looked: decide under the write lock.
  Result<int> current = RecordedVersion();
  if (!current.ok()) return Rollback(current.status().WithContext(what));
  if (*current > kLatestVersion) {
    return Rollback(Status::FailedPrecondition(
        fmt::format("the database went to schema version {}, newer than version {}, the newest this "
                    "build of gpupool knows",
                    *current, kLatestVersion)));
  }
  if (*current >= m.version) return Exec("COMMIT", "end " + what);

  Status st = Exec(m.sql, what);
  if (st.ok()) {
    Result<StmtPtr> record = Prepare(
        "INSERT INTO schema_migrations (version, description, applied_at) "
        "VALUES (?1, ?2, strftime('%Y-%m-%dT%H:%M:%fZ'))");
    if (!record.ok()) {
      st = record.status().WithContext("record " + what);
    } else {
      Binder b(record->get());
      b.Int(m.version).Text(m.description);
      st = b.rc() != SQLITE_OK ? SqliteError(db_, b.rc(), "record " + what)
                               : Run(record->get(), "record " + what);
    }
  }
  if (st.ok()) st = Exec("COMMIT", "commit " + what);
  if (!st.ok()) return Rollback(st);
  return Status::Ok();
}

Status SqliteStore::PrepareStatements() {
  const struct {
    StmtPtr* slot;
    const char* sql;
  } all[] = {
      {&st_.begin_write, "BEGIN IMMEDIATE"},
      {&st_.begin_read, "BEGIN DEFERRED"},
      {&st_.commit, "COMMIT"},
      {&st_.rollback, "ROLLBACK"},
      {&st_.put_job, kPutJob},
      {&st_.put_task, kPutTask},
      {&st_.put_node, kPutNode},
      {&st_.delete_node, kDeleteNode},
      {&st_.put_queue, kPutQueue},
      {&st_.delete_queue, kDeleteQueue},
      {&st_.append_event, kAppendEvent},
      {&st_.put_meta, kPutMeta},
      {&st_.delete_job_tasks, kDeleteJobTasks},
      {&st_.delete_job_events, kDeleteJobEvents},
      {&st_.delete_job, kDeleteJob},
      {&st_.delete_cluster_events, kDeleteClusterEvents},
      {&st_.load_jobs, kLoadJobs},
      {&st_.load_tasks, kLoadTasks},
      {&st_.load_nodes, kLoadNodes},
      {&st_.load_queues, kLoadQueues},
      {&st_.load_meta, kLoadMeta},
      {&st_.list_events, kListEvents},
  };
  for (const auto& s : all) {
    ASSIGN_OR_RETURN(*s.slot, Prepare(s.sql));
  }
  return Status::Ok();
}

Status SqliteStore::Rollback(Status cause) {
  // Some errors (I/O, out of memory, disk full) make sqlite roll back by itself; rolling back again
  // would fail with "no transaction is active".
  if (sqlite3_get_autocommit(db_) != 0) return cause;
  sqlite3_stmt* s = st_.rollback ? st_.rollback.get() : nullptr;
  const Status st = s != nullptr ? Run(s, "roll back") : Exec("ROLLBACK", "roll back");
  if (st.ok()) return cause;
  // The connection is stuck in a transaction: say so, keeping the original code.
  return Status(cause.code(), fmt::format("{}; then {}", cause.message(), st.message()));
}

Status SqliteStore::ApplyOp(const WriteOp& op) {
  // Binds, steps, and on failure names the op by its key.
  auto run = [this](sqlite3_stmt* s, const Binder& b, auto describe) -> Status {
    Status st;
    if (b.rc() != SQLITE_OK) {
      st = SqliteError(db_, b.rc(), "bind");
      sqlite3_clear_bindings(s);
    } else {
      st = Run(s, "write");
    }
    if (!st.ok()) return st.WithContext(describe());
    return st;
  };
  return std::visit(
      Overloaded{
          [&](const PutJob& o) -> Status {
            const JobRecord& j = o.job;
            if (j.seq > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
              return Status::InvalidArgument(fmt::format("put job {}: seq {} is out of range", j.id, j.seq));
            }
            sqlite3_stmt* s = st_.put_job.get();
            Binder b(s);
            b.Text(j.id)
                .Int(static_cast<int64_t>(j.seq))
                .Text(j.tenant)
                .Text(j.queue)
                .Text(j.name)
                .Int(j.priority)
                .Text(j.state)
                .Text(j.reason)
                .Text(j.spec_json)
                .Int(j.created_ms)
                .Int(j.updated_ms)
                .Int(j.faults)
                .Int(j.not_before_ms)
                .Int(j.started_ms);
            return run(s, b, [&] { return fmt::format("put job {}", j.id); });
          },
          [&](const PutTask& o) -> Status {
            const TaskRecord& t = o.task;
            sqlite3_stmt* s = st_.put_task.get();
            Binder b(s);
            b.Text(t.job_id)
                .Int(t.index)
                .Text(t.state)
                .Text(t.node)
                .Text(t.placement_json)
                .Int(t.exit_code)
                .Int(t.restarts)
                .Int(t.updated_ms)
                .Text(t.run_id)
                .Text(t.message)
                .Text(t.stop_reason)
                .Text(t.stop_outcome)
                .Text(t.image);
            return run(s, b, [&] { return fmt::format("put task {}[{}]", t.job_id, t.index); });
          },
          [&](const PutNode& o) -> Status {
            const NodeRecord& n = o.node;
            sqlite3_stmt* s = st_.put_node.get();
            Binder b(s);
            b.Text(n.name)
                .Text(n.spec_json)
                .Int(n.cordoned ? 1 : 0)
                .Int(n.draining ? 1 : 0)
                .Text(n.state)
                .Int(n.last_heartbeat_ms);
            return run(s, b, [&] { return fmt::format("put node {}", n.name); });
          },
          [&](const DeleteNode& o) -> Status {
            sqlite3_stmt* s = st_.delete_node.get();
            Binder b(s);
            b.Text(o.name);
            return run(s, b, [&] { return fmt::format("delete node {}", o.name); });
          },
          [&](const PutQueue& o) -> Status {
            sqlite3_stmt* s = st_.put_queue.get();
            Binder b(s);
            b.Text(o.queue.name).Text(o.queue.config_json);
            return run(s, b, [&] { return fmt::format("put queue {}", o.queue.name); });
          },
          [&](const DeleteQueue& o) -> Status {
            sqlite3_stmt* s = st_.delete_queue.get();
            Binder b(s);
            b.Text(o.name);
            return run(s, b, [&] { return fmt::format("delete queue {}", o.name); });
          },
          [&](const AppendEvent& o) -> Status {
            const EventRecord& e = o.event;
            sqlite3_stmt* s = st_.append_event.get();
            Binder b(s);
            b.Text(e.job_id).Int(e.time_ms).Text(e.type).Text(e.message);
            return run(s, b, [&] { return fmt::format("append event {} of job \"{}\"", e.type, e.job_id); });
          },
          [&](const PutMeta& o) -> Status {
            sqlite3_stmt* s = st_.put_meta.get();
            Binder b(s);
            b.Text(o.key).Text(o.value);
            return run(s, b, [&] { return fmt::format("put meta {}", o.key); });
          },
          [&](const DeleteJob& o) -> Status {
            // Tasks and events first: tasks reference the job.
            for (sqlite3_stmt* s :
                 {st_.delete_job_tasks.get(), st_.delete_job_events.get(), st_.delete_job.get()}) {
              Binder b(s);
              b.Text(o.id);
              RETURN_IF_ERROR(run(s, b, [&] { return fmt::format("delete job {}", o.id); }));
            }
            return Status::Ok();
          },
          [&](const DeleteClusterEvents& o) -> Status {
            sqlite3_stmt* s = st_.delete_cluster_events.get();
            Binder b(s);
            b.Int(o.before_ms);
            return run(s, b, [&] { return fmt::format("delete cluster events before {}", o.before_ms); });
          },
      },
      op);
}

Status SqliteStore::Apply(const WriteBatch& batch) {
  if (batch.empty()) return Status::Ok();
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(Run(st_.begin_write.get(), "apply: begin transaction"));
  for (size_t i = 0; i < batch.ops.size(); ++i) {
    Status st = ApplyOp(batch.ops[i]);
    if (!st.ok()) {
      return Rollback(st.WithContext(fmt::format("apply: op {} of {}", i + 1, batch.ops.size())));
    }
  }
  // With synchronous=FULL the commit returns once the log is fsync'd: that is the durability point.
  Status st = Run(st_.commit.get(), "apply: commit");
  if (!st.ok()) return Rollback(st);
  return Status::Ok();
}

Result<StoreSnapshot> SqliteStore::Load() {
  std::lock_guard<std::mutex> lock(mu_);
  // One read transaction, so the tables come from the same committed state.
  RETURN_IF_ERROR(Run(st_.begin_read.get(), "load: begin transaction"));
  StoreSnapshot snap;
  Status st = ReadAll(st_.load_jobs.get(), "load jobs", [&](sqlite3_stmt* s) {
    JobRecord j;
    j.id = ColumnText(s, 0);
    j.seq = static_cast<uint64_t>(ColumnInt64(s, 1));
    j.tenant = ColumnText(s, 2);
    j.queue = ColumnText(s, 3);
    j.name = ColumnText(s, 4);
    j.priority = ColumnInt(s, 5);
    j.state = ColumnText(s, 6);
    j.reason = ColumnText(s, 7);
    j.spec_json = ColumnText(s, 8);
    j.created_ms = ColumnInt64(s, 9);
    j.updated_ms = ColumnInt64(s, 10);
    j.faults = ColumnInt(s, 11);
    j.not_before_ms = ColumnInt64(s, 12);
    j.started_ms = ColumnInt64(s, 13);
    snap.jobs.push_back(std::move(j));
  });
  if (st.ok()) {
    st = ReadAll(st_.load_tasks.get(), "load tasks", [&](sqlite3_stmt* s) {
      TaskRecord t;
      t.job_id = ColumnText(s, 0);
      t.index = ColumnInt(s, 1);
      t.state = ColumnText(s, 2);
      t.node = ColumnText(s, 3);
      t.placement_json = ColumnText(s, 4);
      t.exit_code = ColumnInt(s, 5);
      t.restarts = ColumnInt(s, 6);
      t.updated_ms = ColumnInt64(s, 7);
      t.run_id = ColumnText(s, 8);
      t.message = ColumnText(s, 9);
      t.stop_reason = ColumnText(s, 10);
      t.stop_outcome = ColumnText(s, 11);
      t.image = ColumnText(s, 12);
      snap.tasks.push_back(std::move(t));
    });
  }
  if (st.ok()) {
    st = ReadAll(st_.load_nodes.get(), "load nodes", [&](sqlite3_stmt* s) {
      NodeRecord n;
      n.name = ColumnText(s, 0);
      n.spec_json = ColumnText(s, 1);
      n.cordoned = ColumnInt(s, 2) != 0;
      n.draining = ColumnInt(s, 3) != 0;
      n.state = ColumnText(s, 4);
      n.last_heartbeat_ms = ColumnInt64(s, 5);
      snap.nodes.push_back(std::move(n));
    });
  }
  if (st.ok()) {
    st = ReadAll(st_.load_queues.get(), "load queues", [&](sqlite3_stmt* s) {
      snap.queues.push_back(QueueRecord{ColumnText(s, 0), ColumnText(s, 1)});
    });
  }
  if (st.ok()) {
    st = ReadAll(st_.load_meta.get(), "load meta",
                 [&](sqlite3_stmt* s) { snap.meta.emplace_back(ColumnText(s, 0), ColumnText(s, 1)); });
  }
  if (st.ok()) st = Run(st_.commit.get(), "load: end transaction");
  if (!st.ok()) return Rollback(st);
  return snap;
}

Result<std::vector<EventRecord>> SqliteStore::ListEvents(const std::string& job_id, int64_t after_id,
                                                         int limit) {
  if (limit < 0) return Status::InvalidArgument(fmt::format("list events: limit {} is negative", limit));
  std::vector<EventRecord> out;
  if (limit == 0) return out;
  std::lock_guard<std::mutex> lock(mu_);
  sqlite3_stmt* s = st_.list_events.get();
  Binder b(s);
  b.Text(job_id).Int(after_id).Int(limit);
  if (b.rc() != SQLITE_OK) {
    Status st = SqliteError(db_, b.rc(), "list events: bind");
    sqlite3_clear_bindings(s);
    return st;
  }
  RETURN_IF_ERROR(ReadAll(s, "list events", [&](sqlite3_stmt* row) {
    EventRecord e;
    e.id = ColumnInt64(row, 0);
    e.job_id = ColumnText(row, 1);
    e.time_ms = ColumnInt64(row, 2);
    e.type = ColumnText(row, 3);
    e.message = ColumnText(row, 4);
    out.push_back(std::move(e));
  }));
  return out;
}

}  // namespace

Result<std::unique_ptr<Store>> OpenSqliteStore(const SqliteStoreOptions& options) {
  if (options.path.empty()) return Status::InvalidArgument("open sqlite store: the path is empty");
  auto store = std::make_unique<SqliteStore>(options.path);
  RETURN_IF_ERROR(store->Open(options.synchronous_full).WithContext("open sqlite store " + options.path));
  return std::unique_ptr<Store>(std::move(store));
}

int SqliteSchemaVersion() {
  return kLatestVersion;
}

}  // namespace gpupool
