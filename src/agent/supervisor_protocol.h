// What the agent and a task's supervisor (`gpupool-supervise`, src/agent/supervisor_main.cc) share:
// the supervisor's command line, the messages it sends back on its status pipe, and the small
// async-signal-safe helpers both sides use around fork and exec.
//
// The supervisor is its own small executable, started with posix_spawn (vfork semantics): starting
// a task never copies the agent's address space (in `gpupool up` that is the whole server), which
// is what a fork of the agent cost per task. Its descriptors when it starts:
//   0 /dev/null, 1 and 2 the task's stdout and stderr log files, 3 the status pipe (write end),
//   4 the go socket (read end); nothing else.
// Its environment is not the task's (a tenant's LD_PRELOAD or GLIBC_TUNABLES never reach it): the
// task's environment travels as `--env=` arguments.
//
// This file does no I/O of its own beyond the safe helpers, and uses nothing but libc and the
// standard library, so that the supervisor links only what it needs.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gpupool::agent_internal {

// ---- the command line ------------------------------------------------------------------------------

// Everything a supervisor needs to start, watch and record one task.
struct SupervisorPlan {
  std::string executable;                 // the task's program (a path)
  std::vector<std::string> argv;          // the task's argv (argv[0] included)
  std::vector<std::string> envp;          // the task's environment, "KEY=value"
  std::string workdir;
  std::vector<std::string> cgroup_procs;  // cgroup.procs files the task writes itself into
  std::string exit_path;                  // where the supervisor records how the task ended
  std::string lease_path;                 // empty: no fencing
  std::vector<std::string> fence_argv;    // run at the KILL deadline (argv[0] is a path); empty: none
  std::string stdout_path, stderr_path;   // the log files (open on 1 and 2), for rotation
  int64_t log_max_bytes = 0;              // <= 0: unbounded
  int log_keep = 0;
  // The sandbox (docs/agent.md#the-task-sandbox). uid/gid >= 0: the task drops to them (no
  // supplementary groups, every capability gone from its sets and bounding set) before it execs;
  // no_new_privs: setuid binaries and file capabilities grant nothing.
  int64_t uid = -1;
  int64_t gid = -1;
  bool no_new_privs = false;
  // A private mount namespace for the task, set up (as root) before it drops to uid/gid:
  //   hide_paths  an empty read-only tmpfs over each (the agent's state, the server's data);
  //   keep_paths  bound back at their own path when a hidden path covers them (its work and
  //               checkpoint directories);
  //   private_dev /dev is a fresh tmpfs with the usual character devices (null, zero, full,
  //               random, urandom, tty), fresh /dev/pts and /dev/shm, and only `devices` besides.
  //   run_files   files bound into kTaskRunDir, a fresh tmpfs made read-only once they are in
  //               (the CUDA limiter's library, limits and ledger: docs/cuda_limiter.md);
  //   preload_list a file bound read-only over /etc/ld.so.preload (which must exist on the host).
  std::vector<std::string> hide_paths;
  std::vector<std::string> keep_paths;
  bool private_dev = false;
  std::vector<std::string> devices;
  struct RunFile {
    std::string name;    // its name in kTaskRunDir: [A-Za-z0-9._-], 1..64 characters, not "." or ".."
    std::string source;  // an absolute path, opened before anything is hidden
    bool writable = false;
  };
  std::vector<RunFile> run_files;
  std::string preload_list;
  bool mount_namespace() const {
    return private_dev || !hide_paths.empty() || !run_files.empty() || !preload_list.empty();
  }
};
// Where a task's run_files appear, and the loader's preload list preload_list covers.
inline constexpr const char* kTaskRunDir = "/run/gpupool";
inline constexpr const char* kLoaderPreloadList = "/etc/ld.so.preload";
// A RunFile name as above.
bool ValidRunFileName(std::string_view name);

// `--name=value` arguments, then `--`, then the task's argv. Values may hold any byte but NUL.
// They travel in a sealed memory file on the supervisor's fd 5, never on its command line, which
// every local user can read in /proc (the task's environment holds its secrets).
std::vector<std::string> EncodeSupervisorArgs(const SupervisorPlan& plan);
// The plan file: each argument followed by a NUL. ReadPlanArgs reads it back (at most
// kMaxPlanBytes) and splits it; false on a read error, a file too large or a missing final NUL.
std::string JoinPlanArgs(const std::vector<std::string>& args);
constexpr size_t kMaxPlanBytes = size_t{64} << 20;
constexpr int kPlanFd = 5;
bool ReadPlanArgs(int fd, std::vector<std::string>* args, std::string* why);
// The reverse; false (and `*why` names the argument) on anything malformed.
bool DecodeSupervisorArgs(int argc, const char* const* argv, SupervisorPlan* plan, std::string* why);

// ---- the status pipe ---------------------------------------------------------------------------

// Message kinds on the status pipe (fd 3 of the supervisor and, until it execs, of the task). Each
// message is two int32 (kind, value), written atomically.
enum : int32_t {
  kMsgTaskPid = 1,  // value: the task's pid
  kMsgExec = 2,     // value: errno of the task's execve
  kMsgChdir = 3,
  kMsgCgroup = 4,
  kMsgStdio = 5,
  kMsgFork = 6,
  kMsgSetsid = 7,
  kMsgPlan = 8,  // the supervisor could not read its command line
  kMsgNamespace = 9,  // the task's mount namespace could not be set up
  kMsgIdentity = 10,  // the task could not drop to its uid/gid or set no_new_privs
};
// "cannot execute", "cannot change to the working directory", ...
const char* StageText(int32_t kind);

// ---- async-signal-safe helpers -----------------------------------------------------------------

void SafeSend(int fd, int32_t kind, int32_t value);
// Appends the decimal form of `v` / the string `s` to buf at *len (never past cap).
void SafeAppendInt(char* buf, size_t cap, size_t* len, long v);
void SafeAppendStr(char* buf, size_t cap, size_t* len, const char* s);
// Every signal back to its default disposition, and an empty signal mask.
void ResetSignals();
// Closes every descriptor from `first` up.
void CloseFrom(int first);
// The lease file's two deadlines ("<term_ms> <kill_ms>", CLOCK_BOOTTIME ms), parsed without
// allocating. False when missing or malformed.
bool SafeReadLease(const char* path, int64_t* term_ms, int64_t* kill_ms);
// CLOCK_BOOTTIME (else CLOCK_MONOTONIC) in milliseconds.
int64_t SafeBootMs();

}  // namespace gpupool::agent_internal
