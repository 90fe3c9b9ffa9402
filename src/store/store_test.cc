#include "store/store.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "store/sqlite_store.h"

namespace gpupool {
namespace {

// ---- helpers ----------------------------------------------------------------------------------

// A fresh directory under /tmp, removed with everything in it when the test ends.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/gpupool_store_test_XXXXXX";
    if (mkdtemp(tmpl) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  bool ok() const { return !path_.empty(); }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string JobId(int64_t n) {
  return fmt::format("j-{:012d}", n);
}

JobRecord MakeJob(int64_t n) {
  JobRecord j;
  j.id = JobId(n);
  j.seq = static_cast<uint64_t>(n) + 1;
  j.tenant = "tenant-" + std::to_string(n % 3);
  j.queue = "q" + std::to_string(n % 2);
  j.name = "train-" + std::to_string(n);
  j.priority = static_cast<int>(n % 5) - 2;
  j.state = "pending";
  j.reason = "";
  j.spec_json = fmt::format(R"({{"tasks":2,"gpu":"{}"}})", n % 4);
  j.created_ms = 1'700'000'000'000 + n;
  j.updated_ms = j.created_ms + 7;
  return j;
}

TaskRecord MakeTask(const std::string& job_id, int index) {
  TaskRecord t;
  t.job_id = job_id;
  t.index = index;
  t.state = "running";
  t.node = "node-" + std::to_string(index);
  t.placement_json = R"({"gpus":[0,1]})";
  t.exit_code = -index;
  t.restarts = index * 2;
  t.updated_ms = 42 + index;
  t.message = index % 2 ? "killed by SIGKILL" : "";
  t.stop_reason = "preempted by j-" + std::to_string(index);
  t.stop_outcome = index % 2 ? "cancelled" : "preempted";
  t.image = index % 2 ? "oci:/srv/images/x:1@sha256:" + std::string(64, 'a') : "";
  return t;
}

NodeRecord MakeNode(const std::string& name) {
  NodeRecord n;
  n.name = name;
  n.spec_json = R"({"gpus":8,"model":"A100"})";
  n.cordoned = true;
  n.draining = false;
  n.state = "ready";
  n.last_heartbeat_ms = 123456789;
  return n;
}

EventRecord MakeEvent(const std::string& job_id, const std::string& type) {
  EventRecord e;
  e.job_id = job_id;
  e.time_ms = 1000;
  e.type = type;
  e.message = "message of " + type;
  return e;
}

WriteBatch OneJobBatch(int64_t n) {
  JobRecord job = MakeJob(n);
  WriteBatch b;
  b.Add(PutJob{std::move(job)});
  return b;
}

std::unique_ptr<Store> OpenOrDie(const std::string& path, bool synchronous_full = true) {
  Result<std::unique_ptr<Store>> store = OpenSqliteStore({path, synchronous_full});
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  if (!store.ok()) return nullptr;
  return std::move(store).value();
}

// A raw connection, for writing files by hand and for looking under the store.
class RawDb {
 public:
  explicit RawDb(const std::string& path) {
    if (sqlite3_open(path.c_str(), &db_) != SQLITE_OK) ADD_FAILURE() << "open " << path;
  }
  ~RawDb() { sqlite3_close(db_); }
  RawDb(const RawDb&) = delete;
  RawDb& operator=(const RawDb&) = delete;

  void Exec(const std::string& sql) {
    char* err = nullptr;
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
      ADD_FAILURE() << sql << ": " << (err != nullptr ? err : "?");
    }
    sqlite3_free(err);
  }
  // Every row, columns joined by '|'.
  std::vector<std::string> Rows(const std::string& sql) {
    std::vector<std::string> out;
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &s, nullptr) != SQLITE_OK) {
      ADD_FAILURE() << sql << ": " << sqlite3_errmsg(db_);
      return out;
    }
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
      std::string row;
      for (int c = 0; c < sqlite3_column_count(s); ++c) {
        if (c > 0) row += '|';
        const unsigned char* t = sqlite3_column_text(s, c);
        row += t != nullptr ? reinterpret_cast<const char*>(t) : "NULL";
      }
      out.push_back(std::move(row));
    }
    if (rc != SQLITE_DONE) ADD_FAILURE() << sql << ": " << sqlite3_errmsg(db_);
    sqlite3_finalize(s);
    return out;
  }

 private:
  sqlite3* db_ = nullptr;
};

std::vector<std::string> IndexNames(const std::string& path) {
  RawDb db(path);
  return db.Rows(
      "SELECT name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_%' "
      "ORDER BY name");
}

class SqliteStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    path_ = dir_.File("state.db");
    store_ = OpenOrDie(path_);
    ASSERT_NE(store_, nullptr);
  }
  void Reopen() {
    store_.reset();
    store_ = OpenOrDie(path_);
    ASSERT_NE(store_, nullptr);
  }
  StoreSnapshot LoadOrDie() {
    Result<StoreSnapshot> snap = store_->Load();
    EXPECT_TRUE(snap.ok()) << snap.status().ToString();
    return snap.ok() ? std::move(snap).value() : StoreSnapshot{};
  }

  TempDir dir_;
  std::string path_;
  std::unique_ptr<Store> store_;
};

// ---- WriteBatch -------------------------------------------------------------------------------

TEST(WriteBatchTest, AppendKeepsOrderOfBothBatches) {
  WriteBatch a;
  a.Add(PutMeta{"k1", "v1"});
  WriteBatch b;
  b.Add(PutMeta{"k2", "v2"});
  b.Add(DeleteNode{"n"});
  a.Append(std::move(b));
  ASSERT_EQ(a.ops.size(), 3u);
  EXPECT_EQ(std::get<PutMeta>(a.ops[0]).key, "k1");
  EXPECT_EQ(std::get<PutMeta>(a.ops[1]).key, "k2");
  EXPECT_EQ(std::get<DeleteNode>(a.ops[2]).name, "n");

  WriteBatch empty;
  empty.Append(std::move(a));
  EXPECT_EQ(empty.ops.size(), 3u);
}

// ---- records ----------------------------------------------------------------------------------

TEST_F(SqliteStoreTest, RoundTripsEveryRecordTypeAcrossReopen) {
  JobRecord job = MakeJob(7);
  job.reason = "waiting for 2 A100";
  job.spec_json = "{\"name\":\"quote \\\" and unicode \xc3\xa9\"}";
  TaskRecord task = MakeTask(job.id, 0);
  TaskRecord unplaced = MakeTask(job.id, 1);
  unplaced.node = "";
  unplaced.placement_json = "";
  NodeRecord node = MakeNode("node-a");
  node.draining = true;
  node.cordoned = false;
  QueueRecord queue{"research", R"({"weight":2})"};

  WriteBatch b;
  b.Add(PutJob{job});
  b.Add(PutTask{task});
  b.Add(PutTask{unplaced});
  b.Add(PutNode{node});
  b.Add(PutQueue{queue});
  b.Add(AppendEvent{MakeEvent(job.id, "Submitted")});
  b.Add(AppendEvent{MakeEvent("", "NodeJoined")});
  b.Add(PutMeta{"cluster_id", "c-1"});
  ASSERT_TRUE(store_->Apply(b).ok());

  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "same store" : "after reopen");
    StoreSnapshot snap = LoadOrDie();
    EXPECT_EQ(snap.jobs, std::vector<JobRecord>{job});
    EXPECT_EQ(snap.tasks, (std::vector<TaskRecord>{task, unplaced}));
    EXPECT_EQ(snap.nodes, std::vector<NodeRecord>{node});
    EXPECT_EQ(snap.queues, std::vector<QueueRecord>{queue});
    EXPECT_EQ(snap.meta, (std::vector<std::pair<std::string, std::string>>{{"cluster_id", "c-1"}}));

    Result<std::vector<EventRecord>> events = store_->ListEvents(job.id, 0, 10);
    ASSERT_TRUE(events.ok()) << events.status().ToString();
    ASSERT_EQ(events->size(), 1u);
    EventRecord want = MakeEvent(job.id, "Submitted");
    want.id = (*events)[0].id;
    EXPECT_GT(want.id, 0);
    EXPECT_EQ((*events)[0], want);

    Result<std::vector<EventRecord>> cluster = store_->ListEvents("", 0, 10);
    ASSERT_TRUE(cluster.ok());
    ASSERT_EQ(cluster->size(), 1u);
    EXPECT_EQ((*cluster)[0].type, "NodeJoined");
    EXPECT_GT((*cluster)[0].id, want.id);
    Reopen();
  }
}

// The store holds every tenant's specs: its files are the owner's only, whatever the umask, and a
// database left 0644 by an older version is tightened on open.
TEST_F(SqliteStoreTest, DatabaseFilesAreOwnerOnly) {
  auto mode = [](const std::string& p) {
    struct stat st;
    return ::stat(p.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 07777) : -1;
  };
  WriteBatch b;
  b.Add(PutMeta{"k", "v"});
  ASSERT_TRUE(store_->Apply(b).ok());
  EXPECT_EQ(mode(path_), 0600);
  EXPECT_EQ(mode(path_ + "-wal"), 0600);
  EXPECT_EQ(mode(path_ + "-shm"), 0600);

  store_.reset();
  ASSERT_EQ(::chmod(path_.c_str(), 0644), 0);
  const mode_t old_umask = ::umask(0);  // the test is single-threaded here
  Reopen();
  ::umask(old_umask);
  ASSERT_TRUE(store_->Apply(b).ok());
  EXPECT_EQ(mode(path_), 0600);
  EXPECT_EQ(mode(path_ + "-wal"), 0600);
  EXPECT_EQ(mode(path_ + "-shm"), 0600);

  // A fresh database under a permissive umask.
  const std::string fresh = dir_.File("fresh.db");
  const mode_t saved = ::umask(0);
  auto other = OpenOrDie(fresh);
  ::umask(saved);
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(other->Apply(b).ok());
  EXPECT_EQ(mode(fresh), 0600);
  EXPECT_EQ(mode(fresh + "-wal"), 0600);
}

TEST_F(SqliteStoreTest, EmptyBatchSucceedsAndChangesNothing) {
  EXPECT_TRUE(store_->Apply(WriteBatch{}).ok());
  StoreSnapshot snap = LoadOrDie();
  EXPECT_TRUE(snap.jobs.empty());
  EXPECT_TRUE(snap.meta.empty());
}

TEST_F(SqliteStoreTest, PutReplacesByKeyAndJobUpsertKeepsItsTasks) {
  JobRecord job = MakeJob(1);
  WriteBatch first;
  first.Add(PutJob{job});
  first.Add(PutTask{MakeTask(job.id, 0)});
  first.Add(PutNode{MakeNode("n1")});
  first.Add(PutQueue{QueueRecord{"q", "{}"}});
  first.Add(PutMeta{"k", "v1"});
  ASSERT_TRUE(store_->Apply(first).ok());

  job.state = "running";
  job.priority = 9;
  job.updated_ms += 100;
  TaskRecord task = MakeTask(job.id, 0);
  task.state = "succeeded";
  task.exit_code = 0;
  NodeRecord node = MakeNode("n1");
  node.state = "lost";
  WriteBatch second;
  second.Add(PutJob{job});  // an update of a job that has tasks: must not drop them
  second.Add(PutTask{task});
  second.Add(PutNode{node});
  second.Add(PutQueue{QueueRecord{"q", R"({"weight":3})"}});
  second.Add(PutMeta{"k", "v2"});
  ASSERT_TRUE(store_->Apply(second).ok());

  StoreSnapshot snap = LoadOrDie();
  EXPECT_EQ(snap.jobs, std::vector<JobRecord>{job});
  EXPECT_EQ(snap.tasks, std::vector<TaskRecord>{task});
  EXPECT_EQ(snap.nodes, std::vector<NodeRecord>{node});
  EXPECT_EQ(snap.queues, (std::vector<QueueRecord>{{"q", R"({"weight":3})"}}));
  EXPECT_EQ(snap.meta, (std::vector<std::pair<std::string, std::string>>{{"k", "v2"}}));
}

TEST_F(SqliteStoreTest, DeleteNodeAndQueueRemoveByKeyAndSucceedWhenAbsent) {
  WriteBatch b;
  b.Add(PutNode{MakeNode("n1")});
  b.Add(PutNode{MakeNode("n2")});
  b.Add(PutQueue{QueueRecord{"a", "{}"}});
  b.Add(PutQueue{QueueRecord{"b", "{}"}});
  ASSERT_TRUE(store_->Apply(b).ok());

  WriteBatch del;
  del.Add(DeleteNode{"n1"});
  del.Add(DeleteQueue{"b"});
  del.Add(DeleteNode{"never-there"});
  del.Add(DeleteQueue{"never-there"});
  ASSERT_TRUE(store_->Apply(del).ok());

  StoreSnapshot snap = LoadOrDie();
  ASSERT_EQ(snap.nodes.size(), 1u);
  EXPECT_EQ(snap.nodes[0].name, "n2");
  ASSERT_EQ(snap.queues.size(), 1u);
  EXPECT_EQ(snap.queues[0].name, "a");
}

TEST_F(SqliteStoreTest, DeleteJobAndDeleteClusterEventsRemoveOnlyWhatTheyName) {
  const JobRecord gone = MakeJob(1);
  const JobRecord kept = MakeJob(2);
  WriteBatch b;
  b.Add(PutJob{gone});
  b.Add(PutJob{kept});
  for (int i = 0; i < 3; ++i) {
    b.Add(PutTask{MakeTask(gone.id, i)});
    b.Add(PutTask{MakeTask(kept.id, i)});
    b.Add(AppendEvent{MakeEvent(gone.id, "E" + std::to_string(i))});
    b.Add(AppendEvent{MakeEvent(kept.id, "F" + std::to_string(i))});
  }
  b.Add(AppendEvent{MakeEvent("", "Cluster")});
  ASSERT_TRUE(store_->Apply(b).ok());

  WriteBatch del;
  del.Add(DeleteJob{gone.id});
  del.Add(DeleteJob{"j-never-there"});
  ASSERT_TRUE(store_->Apply(del).ok());

  StoreSnapshot snap = LoadOrDie();
  EXPECT_EQ(snap.jobs, std::vector<JobRecord>{kept});
  ASSERT_EQ(snap.tasks.size(), 3u);
  for (const TaskRecord& t : snap.tasks) EXPECT_EQ(t.job_id, kept.id);
  auto gone_events = store_->ListEvents(gone.id, 0, 100);
  ASSERT_TRUE(gone_events.ok());
  EXPECT_TRUE(gone_events->empty());
  auto kept_events = store_->ListEvents(kept.id, 0, 100);
  ASSERT_TRUE(kept_events.ok());
  EXPECT_EQ(kept_events->size(), 3u);
  auto cluster = store_->ListEvents("", 0, 100);
  ASSERT_TRUE(cluster.ok());
  EXPECT_EQ(cluster->size(), 1u);
  // Cluster events go by age, and only they.
  WriteBatch old_cluster;
  EventRecord early = MakeEvent("", "Early");
  early.time_ms = 10;
  old_cluster.Add(AppendEvent{early});
  old_cluster.Add(DeleteClusterEvents{999});  // MakeEvent's time is 1000: kept
  ASSERT_TRUE(store_->Apply(old_cluster).ok());
  cluster = store_->ListEvents("", 0, 100);
  ASSERT_TRUE(cluster.ok());
  ASSERT_EQ(cluster->size(), 1u);
  EXPECT_EQ((*cluster)[0].type, "Cluster");
  WriteBatch all_cluster;
  all_cluster.Add(DeleteClusterEvents{1001});
  ASSERT_TRUE(store_->Apply(all_cluster).ok());
  EXPECT_TRUE(store_->ListEvents("", 0, 100)->empty());
  EXPECT_EQ(store_->ListEvents(kept.id, 0, 100)->size(), 3u);
  // The id can be stored again afterwards (nothing of it is left behind).
  WriteBatch again;
  again.Add(PutJob{gone});
  ASSERT_TRUE(store_->Apply(again).ok());
  EXPECT_EQ(LoadOrDie().jobs.size(), 2u);
}

TEST_F(SqliteStoreTest, LoadOrdersJobsBySeqTasksByJobSeqThenIndexOthersByName) {
  // Ids sort the other way round from seq, and everything is written out of order.
  JobRecord late = MakeJob(1);
  late.id = "j-a";
  late.seq = 20;
  JobRecord early = MakeJob(2);
  early.id = "j-b";
  early.seq = 10;
  WriteBatch b;
  b.Add(PutJob{late});
  b.Add(PutJob{early});
  b.Add(PutTask{MakeTask("j-a", 1)});
  b.Add(PutTask{MakeTask("j-b", 2)});
  b.Add(PutTask{MakeTask("j-a", 0)});
  b.Add(PutTask{MakeTask("j-b", 0)});
  b.Add(PutTask{MakeTask("j-b", 1)});
  b.Add(PutNode{MakeNode("zeta")});
  b.Add(PutNode{MakeNode("alpha")});
  b.Add(PutNode{MakeNode("mu")});
  b.Add(PutQueue{QueueRecord{"y", "{}"}});
  b.Add(PutQueue{QueueRecord{"x", "{}"}});
  b.Add(PutMeta{"zz", "1"});
  b.Add(PutMeta{"aa", "2"});
  ASSERT_TRUE(store_->Apply(b).ok());

  StoreSnapshot snap = LoadOrDie();
  ASSERT_EQ(snap.jobs.size(), 2u);
  EXPECT_EQ(snap.jobs[0].id, "j-b");
  EXPECT_EQ(snap.jobs[1].id, "j-a");
  std::vector<std::string> tasks;
  for (const TaskRecord& t : snap.tasks) tasks.push_back(t.job_id + "/" + std::to_string(t.index));
  EXPECT_EQ(tasks, (std::vector<std::string>{"j-b/0", "j-b/1", "j-b/2", "j-a/0", "j-a/1"}));
  std::vector<std::string> nodes;
  for (const NodeRecord& n : snap.nodes) nodes.push_back(n.name);
  EXPECT_EQ(nodes, (std::vector<std::string>{"alpha", "mu", "zeta"}));
  ASSERT_EQ(snap.queues.size(), 2u);
  EXPECT_EQ(snap.queues[0].name, "x");
  ASSERT_EQ(snap.meta.size(), 2u);
  EXPECT_EQ(snap.meta[0].first, "aa");
}

TEST_F(SqliteStoreTest, ListEventsFiltersByJobPagesByIdAndLimits) {
  WriteBatch b;
  for (int i = 0; i < 5; ++i) {
    b.Add(AppendEvent{MakeEvent("j-1", "E" + std::to_string(i))});
    b.Add(AppendEvent{MakeEvent("j-2", "F" + std::to_string(i))});
  }
  b.Add(AppendEvent{MakeEvent("", "Cluster")});
  ASSERT_TRUE(store_->Apply(b).ok());

  Result<std::vector<EventRecord>> all = store_->ListEvents("j-1", 0, 100);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 5u);
  for (size_t i = 0; i < all->size(); ++i) {
    EXPECT_EQ((*all)[i].type, "E" + std::to_string(i));
    EXPECT_EQ((*all)[i].job_id, "j-1");
    if (i > 0) {
      EXPECT_GT((*all)[i].id, (*all)[i - 1].id);
    }
  }
  Result<std::vector<EventRecord>> page = store_->ListEvents("j-1", (*all)[1].id, 2);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[0].type, "E2");
  EXPECT_EQ((*page)[1].type, "E3");

  Result<std::vector<EventRecord>> none = store_->ListEvents("j-1", (*all)[4].id, 10);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  Result<std::vector<EventRecord>> unknown = store_->ListEvents("j-404", 0, 10);
  ASSERT_TRUE(unknown.ok());
  EXPECT_TRUE(unknown->empty());
  Result<std::vector<EventRecord>> zero = store_->ListEvents("j-1", 0, 0);
  ASSERT_TRUE(zero.ok());
  EXPECT_TRUE(zero->empty());
  EXPECT_EQ(store_->ListEvents("j-1", 0, -1).status().code(), StatusCode::kInvalidArgument);
}

// ---- atomicity --------------------------------------------------------------------------------

TEST_F(SqliteStoreTest, BatchFailingOnItsLastOpStoresNothingAndStoreKeepsWorking) {
  WriteBatch bad;
  bad.Add(PutJob{MakeJob(1)});
  bad.Add(PutTask{MakeTask(JobId(1), 0)});
  bad.Add(PutNode{MakeNode("n1")});
  bad.Add(PutQueue{QueueRecord{"q", "{}"}});
  bad.Add(AppendEvent{MakeEvent(JobId(1), "Submitted")});
  bad.Add(PutMeta{"k", "v"});
  bad.Add(PutTask{MakeTask("j-does-not-exist", 0)});  // foreign key violation
  const Status st = store_->Apply(bad);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("FOREIGN KEY"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("op 7 of 7"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("j-does-not-exist"), std::string::npos) << st.message();

  StoreSnapshot snap = LoadOrDie();
  EXPECT_TRUE(snap.jobs.empty());
  EXPECT_TRUE(snap.tasks.empty());
  EXPECT_TRUE(snap.nodes.empty());
  EXPECT_TRUE(snap.queues.empty());
  EXPECT_TRUE(snap.meta.empty());
  Result<std::vector<EventRecord>> events = store_->ListEvents(JobId(1), 0, 10);
  ASSERT_TRUE(events.ok());
  EXPECT_TRUE(events->empty());

  // A unique seq taken by another job is refused the same way.
  ASSERT_TRUE(store_->Apply(OneJobBatch(1)).ok());
  JobRecord clash = MakeJob(2);
  clash.seq = MakeJob(1).seq;
  WriteBatch dup;
  dup.Add(PutMeta{"k", "v"});
  dup.Add(PutJob{clash});
  const Status dup_st = store_->Apply(dup);
  EXPECT_EQ(dup_st.code(), StatusCode::kInvalidArgument) << dup_st.ToString();

  // The store still works, and the batch can be retried once fixed.
  bad.ops.pop_back();
  ASSERT_TRUE(store_->Apply(bad).ok());
  snap = LoadOrDie();
  EXPECT_EQ(snap.jobs.size(), 1u);
  EXPECT_EQ(snap.tasks.size(), 1u);
  EXPECT_EQ(snap.meta.size(), 1u);
}

// ---- migrations -------------------------------------------------------------------------------

// The v1 schema as released, written by hand the way a gpupool of that version left it.
constexpr const char* kV1Schema = R"sql(
CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, description TEXT NOT NULL,
                                applied_at TEXT NOT NULL);
CREATE TABLE jobs (id TEXT NOT NULL PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, tenant TEXT NOT NULL,
  queue TEXT NOT NULL, name TEXT NOT NULL, priority INTEGER NOT NULL, state TEXT NOT NULL,
  reason TEXT NOT NULL, spec_json TEXT NOT NULL, created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL);
CREATE TABLE tasks (job_id TEXT NOT NULL REFERENCES jobs(id), idx INTEGER NOT NULL, state TEXT NOT NULL,
  node TEXT NOT NULL, placement_json TEXT NOT NULL, exit_code INTEGER NOT NULL, restarts INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL, PRIMARY KEY (job_id, idx));
CREATE TABLE nodes (name TEXT NOT NULL PRIMARY KEY, spec_json TEXT NOT NULL,
  cordoned INTEGER NOT NULL CHECK (cordoned IN (0, 1)), draining INTEGER NOT NULL CHECK (draining IN (0, 1)),
  state TEXT NOT NULL, last_heartbeat_ms INTEGER NOT NULL);
CREATE TABLE queues (name TEXT NOT NULL PRIMARY KEY, config_json TEXT NOT NULL);
CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, time_ms INTEGER NOT NULL,
  type TEXT NOT NULL, message TEXT NOT NULL);
CREATE TABLE meta (key TEXT NOT NULL PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO schema_migrations VALUES (1, 'tables', '2024-01-01T00:00:00.000Z');
)sql";

TEST(SqliteMigrationTest, FreshFileReachesNewestVersionWithEveryMigrationRecorded) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.File("fresh.db");
  ASSERT_GE(SqliteSchemaVersion(), 2);
  {
    std::unique_ptr<Store> store = OpenOrDie(path);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->schema_version(), SqliteSchemaVersion());
  }
  RawDb db(path);
  std::vector<std::string> versions = db.Rows("SELECT version FROM schema_migrations ORDER BY version");
  ASSERT_EQ(versions.size(), static_cast<size_t>(SqliteSchemaVersion()));
  for (size_t i = 0; i < versions.size(); ++i) EXPECT_EQ(versions[i], std::to_string(i + 1));
  EXPECT_EQ(db.Rows("PRAGMA journal_mode"), std::vector<std::string>{"wal"});
  EXPECT_EQ(IndexNames(path),
            (std::vector<std::string>{"events_by_job", "jobs_by_queue", "jobs_by_state", "jobs_by_tenant"}));
}

TEST(SqliteMigrationTest, ReopeningAppliesNothingNew) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.File("again.db");
  ASSERT_NE(OpenOrDie(path), nullptr);
  std::vector<std::string> before = RawDb(path).Rows("SELECT * FROM schema_migrations ORDER BY version");
  {
    std::unique_ptr<Store> store = OpenOrDie(path);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->schema_version(), SqliteSchemaVersion());
  }
  EXPECT_EQ(RawDb(path).Rows("SELECT * FROM schema_migrations ORDER BY version"), before);
}

TEST(SqliteMigrationTest, FileFromNewerBuildIsRefusedAndLeftAlone) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.File("newer.db");
  const int newer = SqliteSchemaVersion() + 1;
  {
    RawDb db(path);
    db.Exec(
        "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, description TEXT NOT NULL, "
        "applied_at TEXT NOT NULL)");
    for (int v = 1; v <= newer; ++v) {
      db.Exec(fmt::format("INSERT INTO schema_migrations VALUES ({}, 'm', '2030-01-01')", v));
    }
  }
  Result<std::unique_ptr<Store>> store = OpenSqliteStore({path, true});
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  const std::string& msg = store.status().message();
  EXPECT_NE(msg.find("schema version " + std::to_string(newer)), std::string::npos) << msg;
  EXPECT_NE(msg.find("version " + std::to_string(SqliteSchemaVersion()) + ","), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  // Nothing was created in it.
  EXPECT_TRUE(RawDb(path).Rows("SELECT name FROM sqlite_master WHERE name = 'jobs'").empty());
}

TEST(SqliteMigrationTest, V1FileIsUpgradedAndKeepsItsData) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.File("v1.db");
  {
    RawDb db(path);
    db.Exec(kV1Schema);
    db.Exec(
        "INSERT INTO jobs VALUES ('j-old', 5, 't', 'q', 'n', 1, 'running', '', '{}', 10, 20);"
        "INSERT INTO tasks VALUES ('j-old', 0, 'running', 'node-1', '{}', 0, 0, 20);"
        "INSERT INTO events (job_id, time_ms, type, message) VALUES ('j-old', 10, 'Submitted', 'hi');");
  }
  ASSERT_TRUE(IndexNames(path).empty());
  std::unique_ptr<Store> store = OpenOrDie(path);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->schema_version(), SqliteSchemaVersion());
  EXPECT_EQ(IndexNames(path),
            (std::vector<std::string>{"events_by_job", "jobs_by_queue", "jobs_by_state", "jobs_by_tenant"}));
  EXPECT_EQ(RawDb(path).Rows("SELECT version FROM schema_migrations ORDER BY version").size(),
            static_cast<size_t>(SqliteSchemaVersion()));

  Result<StoreSnapshot> snap = store->Load();
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  ASSERT_EQ(snap->jobs.size(), 1u);
  EXPECT_EQ(snap->jobs[0].id, "j-old");
  EXPECT_EQ(snap->jobs[0].seq, 5u);
  ASSERT_EQ(snap->tasks.size(), 1u);
  EXPECT_EQ(snap->tasks[0].node, "node-1");
  Result<std::vector<EventRecord>> events = store->ListEvents("j-old", 0, 10);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  // New events continue the old numbering.
  ASSERT_TRUE(store
                  ->Apply([] {
                    WriteBatch b;
                    b.Add(AppendEvent{MakeEvent("j-old", "Scheduled")});
                    return b;
                  }())
                  .ok());
  events = store->ListEvents("j-old", 0, 10);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_GT((*events)[1].id, (*events)[0].id);
}

TEST(SqliteMigrationTest, OpenFailsCleanlyOnAPathThatCannotBeCreated) {
  Result<std::unique_ptr<Store>> store = OpenSqliteStore({"/nonexistent-dir/for/sure/state.db", true});
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kIoError) << store.status().ToString();
  EXPECT_EQ(OpenSqliteStore({"", true}).status().code(), StatusCode::kInvalidArgument);
}

// ---- durability across a crash ----------------------------------------------------------------

// Reads one acknowledged job number; false at end of stream.
bool ReadAck(int fd, int64_t* n) {
  char* p = reinterpret_cast<char*>(n);
  size_t got = 0;
  while (got < sizeof(*n)) {
    const ssize_t r = read(fd, p + got, sizeof(*n) - got);
    if (r == 0) return false;
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    got += static_cast<size_t>(r);
  }
  return true;
}

// The child: commits one job per batch, numbering on from what is stored, and reports each number
// only after Apply returned. Never returns.
[[noreturn]] void CommitUntilKilled(const std::string& path, int ack_fd) {
  Result<std::unique_ptr<Store>> store = OpenSqliteStore({path, true});
  if (!store.ok()) _exit(10);
  Result<StoreSnapshot> snap = (*store)->Load();
  if (!snap.ok()) _exit(11);
  for (int64_t n = static_cast<int64_t>(snap->jobs.size());; ++n) {
    if (!(*store)->Apply(OneJobBatch(n)).ok()) _exit(12);
    if (write(ack_fd, &n, sizeof(n)) != static_cast<ssize_t>(sizeof(n))) _exit(13);
  }
}

TEST(SqliteCrashTest, AcknowledgedCommitsSurviveSigkill) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.File("crash.db");
  int64_t acked_total = 0;
  // Several rounds on the same file: each child also recovers what the previous one left.
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(fmt::format("round {}", round));
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      CommitUntilKilled(path, fds[1]);
    }
    close(fds[1]);

    // Let the child get well into its stream of commits, then kill it in the middle of one.
    std::vector<int64_t> acked;
    const int want = 60 + 40 * round;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    int64_t n = 0;
    while (static_cast<int>(acked.size()) < want && std::chrono::steady_clock::now() < deadline &&
           ReadAck(fds[0], &n)) {
      acked.push_back(n);
    }
    kill(pid, SIGKILL);
    int wstatus = 0;
    ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
    // What the child wrote before it died is still in the pipe: it was acknowledged too.
    while (ReadAck(fds[0], &n)) acked.push_back(n);
    close(fds[0]);
    ASSERT_TRUE(WIFSIGNALED(wstatus)) << "child exited early with status " << WEXITSTATUS(wstatus);
    ASSERT_GE(static_cast<int>(acked.size()), want);

    {
      RawDb raw(path);
      EXPECT_EQ(raw.Rows("PRAGMA integrity_check"), std::vector<std::string>{"ok"});
    }
    std::unique_ptr<Store> store = OpenOrDie(path);
    ASSERT_NE(store, nullptr);
    Result<StoreSnapshot> snap = store->Load();
    ASSERT_TRUE(snap.ok()) << snap.status().ToString();
    std::map<std::string, int> count;
    for (const JobRecord& j : snap->jobs) ++count[j.id];
    for (int64_t a : acked) EXPECT_EQ(count[JobId(a)], 1) << JobId(a) << " was acknowledged but is missing";
    // Commits are sequential: the stored jobs are 0..k-1, where k counts every acknowledged job
    // and at most one more that was committed but not yet acknowledged when the child died.
    acked_total += static_cast<int64_t>(acked.size());
    const int64_t stored = static_cast<int64_t>(snap->jobs.size());
    EXPECT_GE(stored, acked_total);
    EXPECT_LE(stored, acked_total + 1);
    for (int64_t i = 0; i < stored; ++i) EXPECT_EQ(snap->jobs[i].id, JobId(i));
    acked_total = stored;  // the next child numbers on from here
  }
}

// ---- GroupCommitter ---------------------------------------------------------------------------

// Forwards to a real store; while closed, holds the first Apply that arrives until Open(), so a test
// can line up callers behind it. Records the size of every Apply.
class GatedStore : public Store {
 public:
  explicit GatedStore(Store& inner) : inner_(inner) {}
  Status Apply(const WriteBatch& batch) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      sizes_.push_back(batch.ops.size());
      ++entered_;
      cv_.notify_all();
      cv_.wait(lock, [&] { return open_; });
    }
    return inner_.Apply(batch);
  }
  Result<StoreSnapshot> Load() override { return inner_.Load(); }
  Result<std::vector<EventRecord>> ListEvents(const std::string& job_id, int64_t after_id,
                                              int limit) override {
    return inner_.ListEvents(job_id, after_id, limit);
  }
  int schema_version() const override { return inner_.schema_version(); }

  void WaitEntered(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return entered_ >= n; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  std::vector<size_t> sizes() {
    std::lock_guard<std::mutex> lock(mu_);
    return sizes_;
  }

 private:
  Store& inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  int entered_ = 0;
  std::vector<size_t> sizes_;
};

void WaitForCommits(const GroupCommitter& committer, uint64_t n) {
  while (committer.stats().commits < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TEST_F(SqliteStoreTest, GroupCommitterOneCallerAtATimeMakesOneGroupPerCommit) {
  GroupCommitter committer(*store_);
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(committer.Commit(OneJobBatch(i)).ok());
  EXPECT_TRUE(committer.Commit(WriteBatch{}).ok());
  EXPECT_EQ(committer.stats().commits, 21u);
  EXPECT_EQ(committer.stats().groups, 20u);  // the empty batch does not reach the store
  EXPECT_EQ(LoadOrDie().jobs.size(), 20u);
}

// Enqueue fixes the write order, whoever waits first: the later state of a record wins even when
// its ticket is waited on before the earlier one. A ticket dropped unwaited is still written.
TEST_F(SqliteStoreTest, GroupCommitterWritesEnqueuedBatchesInEnqueueOrder) {
  GroupCommitter committer(*store_);
  WriteBatch first = OneJobBatch(1);
  JobRecord later = MakeJob(1);
  later.state = "running";
  WriteBatch second;
  second.Add(PutJob{later});
  GroupCommitter::Ticket a = committer.Enqueue(std::move(first));
  GroupCommitter::Ticket b = committer.Enqueue(std::move(second));
  (void)committer.Enqueue(OneJobBatch(2));  // dropped: written with the next group all the same
  EXPECT_TRUE(committer.Wait(std::move(b)).ok());
  EXPECT_TRUE(committer.Wait(std::move(a)).ok());
  EXPECT_TRUE(committer.Wait(GroupCommitter::Ticket{}).ok());  // an empty ticket
  StoreSnapshot snap = LoadOrDie();
  ASSERT_EQ(snap.jobs.size(), 2u);
  EXPECT_EQ(snap.jobs[0].id, JobId(1));
  EXPECT_EQ(snap.jobs[0].state, "running");
  EXPECT_EQ(snap.jobs[1].id, JobId(2));
  EXPECT_EQ(committer.stats().commits, 3u);
  EXPECT_EQ(committer.stats().groups, 1u);  // the first Wait led one group for all three
}

TEST_F(SqliteStoreTest, GroupCommitterGroupsConcurrentCommitsAndStoresEveryOne) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 300;
  GroupCommitter committer(*store_);
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        WriteBatch b = OneJobBatch(t * kPerThread + i);
        b.Add(AppendEvent{MakeEvent(JobId(t * kPerThread + i), "Submitted")});
        if (!committer.Commit(std::move(b)).ok()) ++failures[t];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;

  const GroupCommitter::Stats stats = committer.stats();
  EXPECT_EQ(stats.commits, static_cast<uint64_t>(kThreads * kPerThread));
  // Eight callers racing for an fsync'd commit: groups form (equality would mean no overlap at all).
  EXPECT_LT(stats.groups, stats.commits);
  EXPECT_GT(stats.groups, 0u);

  StoreSnapshot snap = LoadOrDie();
  ASSERT_EQ(snap.jobs.size(), static_cast<size_t>(kThreads * kPerThread));
  for (int i = 0; i < kThreads * kPerThread; ++i) EXPECT_EQ(snap.jobs[i].id, JobId(i));
  Result<std::vector<EventRecord>> events = store_->ListEvents(JobId(kThreads * kPerThread - 1), 0, 10);
  ASSERT_TRUE(events.ok());
  EXPECT_EQ(events->size(), 1u);
}

// A failure fails the whole group: every caller in it gets the error and none of its ops is stored
// (the callers that were fine may simply retry).
TEST_F(SqliteStoreTest, GroupCommitterFailedGroupFailsAllItsCallersAndStoresNone) {
  GatedStore gated(*store_);
  GroupCommitter committer(gated);

  Status leader_status;
  std::thread leader([&] { leader_status = committer.Commit(OneJobBatch(0)); });
  gated.WaitEntered(1);  // the leader is inside Apply with its own batch only

  WriteBatch bad;
  bad.Add(PutTask{MakeTask("j-missing", 0)});
  std::vector<WriteBatch> followers;
  followers.push_back(OneJobBatch(1));
  followers.push_back(std::move(bad));
  followers.push_back(OneJobBatch(2));
  std::vector<Status> statuses(followers.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < followers.size(); ++i) {
    // One at a time, so the queue order is known.
    threads.emplace_back([&, i] { statuses[i] = committer.Commit(std::move(followers[i])); });
    WaitForCommits(committer, 2 + i);
  }
  gated.Open();
  leader.join();
  for (std::thread& th : threads) th.join();

  EXPECT_TRUE(leader_status.ok()) << leader_status.ToString();
  for (const Status& st : statuses) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_NE(st.message().find("j-missing"), std::string::npos) << st.message();
  }
  EXPECT_EQ(gated.sizes(), (std::vector<size_t>{1, 3}));
  EXPECT_EQ(committer.stats().groups, 2u);
  EXPECT_EQ(committer.stats().commits, 4u);

  StoreSnapshot snap = LoadOrDie();
  ASSERT_EQ(snap.jobs.size(), 1u);
  EXPECT_EQ(snap.jobs[0].id, JobId(0));
  EXPECT_TRUE(snap.tasks.empty());

  // The good callers retry on their own and succeed.
  EXPECT_TRUE(committer.Commit(OneJobBatch(1)).ok());
  EXPECT_TRUE(committer.Commit(OneJobBatch(2)).ok());
  EXPECT_EQ(LoadOrDie().jobs.size(), 3u);
}

// Only the callers of a finished group and the next leader are woken. A batch enqueued while a
// group is written, whose caller comes to Wait only after that write ended (as the scheduling loop
// does: enqueue under its lock, wait after releasing it), is written when its caller comes, and
// callers queued behind a write each get their own status.
TEST_F(SqliteStoreTest, GroupCommitterALateWaiterLeadsAndQueuedWaitersAreHandedOn) {
  GatedStore gated(*store_);
  GroupCommitter committer(gated, /*max_ops_per_group=*/1);
  Status leader_status;
  std::thread leader([&] { leader_status = committer.Commit(OneJobBatch(0)); });
  gated.WaitEntered(1);
  GroupCommitter::Ticket late = committer.Enqueue(OneJobBatch(1));
  gated.Open();
  leader.join();
  ASSERT_TRUE(leader_status.ok()) << leader_status.ToString();
  EXPECT_EQ(committer.stats().groups, 1u);  // nobody waited for the late batch yet
  EXPECT_TRUE(committer.Wait(std::move(late)).ok());
  EXPECT_EQ(committer.stats().groups, 2u);

  // Eight callers behind one write, one op per group: each group's end hands the lead on.
  GatedStore gated2(*store_);
  GroupCommitter one_by_one(gated2, /*max_ops_per_group=*/1);
  std::vector<Status> statuses(9);
  std::vector<std::thread> threads;
  threads.emplace_back([&] { statuses[0] = one_by_one.Commit(OneJobBatch(10)); });
  gated2.WaitEntered(1);
  for (int i = 1; i < 9; ++i) {
    threads.emplace_back([&, i] { statuses[static_cast<size_t>(i)] = one_by_one.Commit(OneJobBatch(10 + i)); });
  }
  WaitForCommits(one_by_one, 9);
  gated2.Open();
  for (std::thread& th : threads) th.join();
  for (const Status& st : statuses) EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(one_by_one.stats().groups, 9u);
  EXPECT_EQ(LoadOrDie().jobs.size(), 11u);
}

TEST_F(SqliteStoreTest, GroupCommitterCapsGroupsByOpsButTakesAtLeastOneWholeBatch) {
  GatedStore gated(*store_);
  GroupCommitter committer(gated, /*max_ops_per_group=*/3);

  std::vector<std::thread> threads;
  std::vector<Status> statuses(5);
  threads.emplace_back([&] { statuses[0] = committer.Commit(OneJobBatch(0)); });
  gated.WaitEntered(1);
  // Queued behind the leader: 2 ops, 1 op, 5 ops (over the cap on its own), 1 op.
  std::vector<WriteBatch> queued(4);
  queued[0].Add(PutJob{MakeJob(1)});
  queued[0].Add(PutMeta{"a", "1"});
  queued[1].Add(PutJob{MakeJob(2)});
  for (int i = 0; i < 5; ++i) queued[2].Add(PutMeta{"big" + std::to_string(i), "x"});
  queued[3].Add(PutJob{MakeJob(3)});
  for (size_t i = 0; i < queued.size(); ++i) {
    threads.emplace_back([&, i] { statuses[i + 1] = committer.Commit(std::move(queued[i])); });
    WaitForCommits(committer, 2 + i);
  }
  gated.Open();
  for (std::thread& th : threads) th.join();

  for (const Status& st : statuses) EXPECT_TRUE(st.ok()) << st.ToString();
  // Arrival order is kept: {0}, {1 (2 ops), 2}, {big}, {3}.
  EXPECT_EQ(gated.sizes(), (std::vector<size_t>{1, 3, 5, 1}));
  StoreSnapshot snap = LoadOrDie();
  EXPECT_EQ(snap.jobs.size(), 4u);
  EXPECT_EQ(snap.meta.size(), 6u);
}

}  // namespace
}  // namespace gpupool
