// Private pieces shared by the process and runc runtimes: file helpers, /proc start times, cgroup
// detection, the supervisor that runs a task and records how it ended, and the task table both
// runtimes build on (Poll/Stop/Remove/List and adoption of tasks left by an earlier agent).
//
// The supervisor: Start spawns a small program S, `gpupool-supervise` (posix_spawn: the agent's
// address space is never copied; S is its own session), which forks the task T (its own process
// group, pgid = T), waits for T and writes `<task dir>/exit.json` ({"code":N} or {"signal":N})
// before it exits. Exit codes therefore reach any runtime object that reads the task directory,
// whether it started the task or adopted it after an agent restart. S takes its plan on its command
// line (supervisor_protocol.h) and is single-threaded, so its fork of T is safe. With a lease file (SpawnRequest::lease_path) S does not block
// in waitpid: every ~100 ms it reaps T if it is done, reads the lease (two CLOCK_BOOTTIME deadlines
// in ms, parsed by hand) and, past the first, sends SIGTERM to T's group once, past the second
// SIGKILL (after running `fence_kill_argv`, e.g. `runc kill --all <id> KILL`, when given), and
// records {"signal":9,"fenced":true}. A CLOEXEC pipe carries T's pid from S and, when the exec
// fails, the stage and errno from T back to Start.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/runtime.h"
#include "agent/supervisor_protocol.h"
#include "common/status.h"

namespace gpupool::agent_internal {

// Owns a file descriptor: closes it when it goes out of scope or is reset.
class FdCloser {
 public:
  explicit FdCloser(int fd = -1) : fd_(fd) {}
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  ~FdCloser() { reset(); }
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

// The checks every runtime makes on a launch before anything else: a usable task id, a command,
// no negative limits.
Status ValidateLaunchSpec(const LaunchSpec& spec);

// ---- files -------------------------------------------------------------------------------------
Result<std::string> ReadFile(const std::string& path);
// Writes `path.tmp` and renames it over `path`: a reader sees the old file or the new one, whenever
// this process dies. `sync` also fsyncs it first, so it survives the machine losing power; the
// records of tasks skip that (a task does not survive its machine either, and the fsync was a large
// share of a task's start).
Status WriteFileAtomic(const std::string& path, const std::string& content, bool sync = true);
// Writes into an existing file (cgroup control files): no truncation games, one write.
Status WriteControlFile(const std::string& path, const std::string& content);
Status MakeDirs(const std::string& path);
// A directory owned by uid:gid with mode 0700 (created, or an existing directory, never a link,
// given to them).
Status MakeOwnedDir(const std::string& path, int64_t uid, int64_t gid);
// The task's CUDA memory ledger (LaunchSpec::cuda_ledger, cuda_limiter): emptied, or made, uid's
// (uid < 0: left as made), mode 0600; never through a link.
Status MakeCudaLedger(const std::string& path, int64_t uid, int64_t gid);
// A task's directory below one of `roots` (its checkpoint directory): `path` is absolute, without
// "." or ".." parts, strictly below a root. Every missing directory below the root is created
// without following links (root's, 0755), the last one given to uid:gid with mode 0700; a last one
// that exists must be uid's already (never handed over: another tenant's, or a parent of one).
// A root that does not exist yet is created. PermissionDenied / InvalidArgument say what is wrong.
Status EnsureOwnedDirUnder(const std::vector<std::string>& roots, const std::string& path, int64_t uid, int64_t gid);
// Removes a directory tree; a missing path is Ok.
Status RemoveTree(const std::string& path);
bool PathExists(const std::string& path);
std::string ErrnoText(int err);
// "j-1.0": letters, digits, '.', '_', '-'; not starting with '.'; at most 128 characters.
Status ValidateTaskId(const std::string& id);
// Looks `name` up in `path_var` (colon-separated); a name with '/' is returned as is.
Result<std::string> FindExecutable(const std::string& name, const std::string& path_var);
std::string DefaultPath();

// ---- /proc -------------------------------------------------------------------------------------
struct ProcStat {
  char state = '?';         // field 3: R, S, Z, ...
  pid_t pgrp = 0;           // field 5: its process group
  uint64_t start_time = 0;  // field 22: clock ticks after boot
};
// Empty when the process does not exist.
std::optional<ProcStat> ReadProcStat(pid_t pid);
// Some process of group `pgid` exists and is not a zombie (a scan of /proc).
bool GroupHasLiveMember(pid_t pgid);
// The process exists, is not a zombie, and started at `start_time` (not a reused pid).
bool ProcessAlive(pid_t pid, uint64_t start_time);

// ---- cgroups -----------------------------------------------------------------------------------
struct CgroupLayout {
  enum class Kind { kNone, kV1, kV2 } kind = Kind::kNone;
  std::string v2_base;      // <unified>/gpupool/<scope>
  std::string v1_cpu_base;  // <cpu>/gpupool/<scope>
  std::string v1_mem_base;  // <memory>/gpupool/<scope>
  std::string v1_pids_base;  // <pids>/gpupool/<scope>; empty: no writable pids hierarchy
  bool v2_pids = false;      // the v2 pids controller is handed down to the tasks' groups
  std::string note;         // why there are no limits, when kind == kNone
};
// The agent's own cgroup directory under gpupool/: "agent-" and 16 hex digits of a hash of the
// runtime's absolute state directory. Run names (<jobId>.<index>) repeat across pools, so two
// agents on one host (two pools, or a test beside a real agent) must not share a task's group:
// one's cleanup would kill the other's task, and a task would run under the other's limits.
std::string CgroupScope(const std::string& state_dir_abs);
// `root`: "" auto-detects under /sys/fs/cgroup (v2 unified, /sys/fs/cgroup/unified in hybrid mode,
// or v1 cpu+memory); "none" turns limits off; another path is a cgroup mount root probed the same
// way (a v2 hierarchy itself, or a directory holding v1 `cpu` and `memory` hierarchies).
// The groups go under gpupool/<scope>/ (see CgroupScope).
CgroupLayout DetectCgroups(const std::string& root, const std::string& scope);
// Creates the task's groups and writes its limits; returns the created directories.
Result<std::vector<std::string>> CreateTaskCgroups(const CgroupLayout& layout, const std::string& id,
                                                   int64_t cpu_milli, int64_t memory_bytes, int64_t pids_max = 0);
// Kills what is left in the groups and removes them.
Status RemoveCgroupDirs(const std::vector<std::string>& dirs);
// Removes the empty task groups in the layout's scope not named in `keep` (what an agent killed
// between a task's end and its cleanup left behind), and with `and_scope` the scope itself if that
// left it empty (the runtime is going away). A group that still holds a process is left alone:
// the kernel refuses to remove it.
void PruneCgroups(const CgroupLayout& layout, const std::set<std::string>& keep, bool and_scope);
// runc creates a container's group in every hierarchy under gpupool/<scope>/ and removes the
// container's own group when it deletes it, not the scope: removes gpupool/<scope> under
// `cgroup_root` (a v2 mount, or a directory of v1 hierarchies: every one is tried) wherever it is
// empty. A scope that still holds a group (a container the next agent adopts) stays.
void RemoveEmptyCgroupScope(const std::string& cgroup_root, const std::string& scope);

// ---- the supervisor ------------------------------------------------------------------------------
struct SpawnResult;
struct SpawnRequest {
  std::string executable;          // resolved path (or a relative path with '/', against workdir)
  std::vector<std::string> argv;
  std::vector<std::string> envp;   // "KEY=value"
  std::string workdir;
  std::string stdout_path;
  std::string stderr_path;
  // The supervisor drains the task's output through pipes into these files, each at most
  // log_max_bytes (<= 0: unbounded) with log_keep rotated files (see log_pump.h).
  int64_t log_max_bytes = 0;
  int log_keep = 0;
  std::vector<std::string> cgroup_dirs;  // T writes itself into each dir's cgroup.procs
  std::string exit_path;                 // where S writes exit.json
  std::string lease_path;                // empty: no fencing (see LaunchSpec::lease_path)
  // Run by S (fork + execve, no PATH search: argv[0] is a path) at the KILL deadline, before it
  // kills T's group; empty: none.
  std::vector<std::string> fence_kill_argv;
  // The sandbox (SupervisorPlan in supervisor_protocol.h has the meaning of each).
  int64_t uid = -1;
  int64_t gid = -1;
  bool no_new_privs = false;
  std::vector<std::string> hide_paths;
  std::vector<std::string> keep_paths;
  bool private_dev = false;
  std::vector<std::string> devices;
  std::vector<SupervisorPlan::RunFile> run_files;
  std::string preload_list;
  // Called with the pids once the supervisor has forked the task, which execs only after it
  // returns Ok (the runtimes write the task's record here, so an agent killed mid-start never
  // leaves a task running that its successor does not know of). An error stops the task unrun.
  std::function<Status(const SpawnResult&)> before_exec;
};
struct SpawnResult {
  pid_t supervisor = -1;
  pid_t task = -1;
};
// The supervisor program: GPUPOOL_SUPERVISOR when set, else beside the running program, else where
// the build put it. Empty when none is found (SpawnSupervised then fails, naming it).
constexpr char kSupervisorName[] = "gpupool-supervise";
const std::string& SupervisorPath();
// Returns once the task has exec'd, or an error naming the stage that failed ("no such file",
// "cannot change to workdir", "cannot join cgroup"). On error the supervisor has been reaped.
Result<SpawnResult> SpawnSupervised(const SpawnRequest& req);

// Runs a helper command (runc kill/delete, skopeo, umoci) to completion in a process group of its
// own, which is killed (SIGKILL) when `timeout` passes or `cancel` (polled at least every 100 ms;
// may be null) becomes true. Its combined stdout/stderr lands in `output` (the last 64 KiB);
// `extra_env` ("KEY=value") joins the PATH-only environment. Returns the exit status (or an error
// when it could not run).
Result<int> RunCommand(const std::vector<std::string>& argv, std::string* output,
                       std::chrono::milliseconds timeout);
Result<int> RunCommand(const std::vector<std::string>& argv, std::string* output,
                       std::chrono::milliseconds timeout, const std::atomic<bool>* cancel,
                       const std::vector<std::string>& extra_env);

// What the supervisor recorded.
struct ExitRecord {
  int code = 0;
  int signal = 0;
  bool fenced = false;
};
// Reads "<term_ms> <kill_ms>" from a lease file; nullopt when absent or malformed. (S has its own
// allocation-free parser; this one is for the agent and tests.)
struct LeaseDeadlines {
  int64_t term_ms = 0;
  int64_t kill_ms = 0;
};
std::optional<LeaseDeadlines> ReadLeaseFile(const std::string& path);
// CLOCK_BOOTTIME in milliseconds: the clock of lease files.
int64_t BootTimeMs();
std::optional<ExitRecord> ReadExitRecord(const std::string& path);
// runc's own reason for failing in the tail of a container's stderr: the msg of its first
// `level=fatal`/`level=error` line (the cause), and of the last one in parentheses when it
// differs (runc's summary), unescaped, each at most 400 bytes; empty when there is none. runc
// writes its errors to the stderr it shares with the container, so a failed mount or exec reads
// as more than "exit code 1".
std::string RuncErrorIn(std::string_view stderr_tail);
// The last `max_bytes` of a file (never following a link); empty when it cannot be read.
std::string ReadTail(const std::string& path, size_t max_bytes);

// ---- the task table ----------------------------------------------------------------------------
struct TaskRecord {
  std::string id;
  std::vector<std::string> argv;
  pid_t pid = -1;   // the task (T); for runc, the foreground `runc run`
  pid_t pgid = -1;
  uint64_t start_time = 0;
  pid_t supervisor_pid = -1;
  uint64_t supervisor_start_time = 0;
  int64_t started_unix = 0;
  std::vector<std::string> cgroup_dirs;  // process runtime
  std::string bundle_dir;                // runc: the bundle we generated (removed on Remove)
  bool runc = false;

  // In memory only.
  bool our_child = false;          // we forked the supervisor; waitpid reaps it
  bool supervisor_reaped = false;
  bool stop_requested = false;
  std::chrono::steady_clock::time_point kill_deadline{};
  bool kill_sent = false;
  bool exited_before_kill = false;
};

// The record of a task just spawned: its pids and their start times, the start time of day.
TaskRecord RecordFor(const std::string& id, const std::vector<std::string>& argv, const SpawnResult& spawned);

std::string TaskRecordToJson(const TaskRecord& rec);
Result<TaskRecord> TaskRecordFromJson(const std::string& text);

// The shared half of both runtimes. Subclasses start tasks, deliver signals and clean up.
// Every public method takes `mu_`, so an agent may call from several threads.
class SupervisedRuntime : public Runtime {
 public:
  // `options`: only the log fields are read here (log_dir must be absolute or empty).
  SupervisedRuntime(std::string state_dir, const RuntimeOptions& options);

  Result<TaskStatusInfo> Poll(const std::string& id) override;
  Status Stop(const std::string& id, std::chrono::seconds grace) override;
  Status Remove(const std::string& id) override;
  std::vector<std::string> List() override;
  std::string StdoutPath(const std::string& id) const override;
  std::string CudaLedgerPath(const std::string& id) const override { return TaskDir(id) + "/cuda-ledger"; }
  std::string StderrPath(const std::string& id) const override;

 protected:
  std::string TaskDir(const std::string& id) const;
  std::string ExitPath(const std::string& id) const;
  std::string RecordPath(const std::string& id) const;
  // Reads every <state_dir>/<id>/task.json.
  void AdoptExisting();
  // Checks the id is valid and unused; creates the task directory.
  Status PrepareTaskDir(const std::string& id);
  // Writes task.json and registers the record.
  Status Register(TaskRecord rec);
  // Forgets a record Register wrote for a task that then failed to start.
  void Unregister(const std::string& id);
  // Signals the task (process group / runc kill). A task already gone is Ok.
  virtual Status Signal(TaskRecord& rec, int sig) = 0;
  // Whether what the task started may still run after its supervisor is gone: its process group
  // leader (same start time) or another member of its group; a runtime may know more (runc).
  virtual bool TaskMayRun(TaskRecord& rec);
  // Frees runtime-specific leftovers (cgroups, runc state, bundle).
  virtual Status Cleanup(TaskRecord& rec) = 0;
  // True while the supervisor lives; reaps it when it is our child.
  bool SupervisorAlive(TaskRecord& rec);

  // Where the task's logs go, and their cap, for a SpawnRequest.
  void SetLogFiles(const std::string& id, SpawnRequest* req) const;

  std::mutex mu_;
  std::string state_dir_;
  std::string log_dir_;  // empty: the task directory
  int64_t log_max_bytes_ = 0;
  int log_keep_ = 0;
  std::map<std::string, TaskRecord> tasks_;
};

// Creates `path` (absolute, inside the container) under `root` as directories, mode 0755, never
// following a link: an image whose /var is a link to / gets an error, not a directory on the host.
// `file`: the last part is an empty file (the mountpoint of a file's bind mount).
Status MakeDirsBeneath(const std::string& root, const std::string& path, bool file = false);

// Exposed for tests: the OCI config.json the runc runtime writes for a spec around `rootfs`.
// `cgroup_parent`: where runc puts the task's group, "/gpupool/<scope>" (see CgroupScope).
// `last_binds` are mounted after everything else, whatever their depth (the CUDA limiter's: no
// mount of the task's, through a link of its image or not, can cover them).
Result<std::string> BuildOciConfig(const LaunchSpec& spec, const std::string& rootfs_abs,
                                   const std::string& cgroup_parent,
                                   const std::vector<LaunchSpec::Bind>& last_binds = {});

}  // namespace gpupool::agent_internal
