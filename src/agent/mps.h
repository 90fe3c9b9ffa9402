// NVIDIA MPS control daemons for the node agent: one `nvidia-cuda-mps-control -d` per GPU that has
// tasks with isolation `mps`, started before the first such task and stopped (`quit` on the control
// program's stdin) once the last one is gone.
//
// Each GPU's daemon lives in its own directories under a root (the agent's `<state_dir>/mps`):
//   <root>/<uuid>/pipe   CUDA_MPS_PIPE_DIRECTORY: the daemon's `control` pipe and pid file
//   <root>/<uuid>/log    CUDA_MPS_LOG_DIRECTORY: control.log and server.log
// which are the directories TaskEnvironment gives the task (src/agent/task_env.cc), and the daemon
// runs with CUDA_VISIBLE_DEVICES=<uuid> so its MPS servers use that GPU only.
//
// Health (Healthy): the `control` pipe exists, the daemon's pid file (nvidia-cuda-mps-control.pid,
// when the driver writes one) does not name a dead process, and `get_server_list` sent through the
// control program exits 0. The control program connects to the daemon through the pipe, so a
// leftover pipe of a crashed daemon fails the check; the pid file catches a control program that
// reports failure with a zero status. A daemon found healthy is used whoever started it (a daemon
// left running by an earlier agent is adopted).
//
// Users: Ensure and Release take the GPU and a user (the agent's task id); the daemon stops when its
// last user is released. Both are idempotent per user. Every method takes a mutex, so the agent may
// call from several threads; the control program runs (with timeouts) under it.
//
// Server limits (mps_limits.cc). MPS runs one server per client uid, and a client's CUDA_MPS_*
// variables can only lower what its server allows: the limits that hold whatever the task does to
// its environment are the server's. Ensure with MpsClientLimits records what the user (a task run as
// `uid`) is granted and holds the uid's server on that GPU to the SUM over the uid's current users
// there (active-thread percentage capped at 100, pinned memory the sum of MiB): a tenant's tasks on
// one GPU share one server and its limits. Release recomputes the sum for the uid's remaining users
// and sets it again (lower); a uid left with no user keeps its last limits until the next Ensure.
// Setting the limits, through the GPU's control daemon:
//   1. `get_server_list`, and each listed PID's owner from /proc/<PID>/status (the "Uid:" line's
//      real uid: the daemon starts a server as its client's uid). The daemon's list is the only
//      source of PIDs; /proc only tells whose they are, so nothing here guesses at process names.
//   2. None of the uid's: `start_server -uid <uid>`, then the list again until it shows one (up to
//      command_timeout).
//   3. For each server of the uid: `set_active_thread_percentage <PID> <pct>` and
//      `set_device_pinned_mem_limit <PID> 0 <N>M` (device 0: the daemon sees its one GPU only, through
//      CUDA_VISIBLE_DEVICES), then `get_active_thread_percentage <PID>` and
//      `get_device_pinned_mem_limit <PID> 0`, whose replies must parse (mps_control.h) and equal what
//      was set. The control program may report a refused command with status 0; only the read-back
//      counts.
// Limits out of bounds are InvalidArgument, before anything runs. A failure is FailedPrecondition
// naming the GPU, the uid, the command and the reply; Ensure then restores the user's earlier entry
// (none: the user is not counted), quits a daemon it leaves without users, and sets the remaining
// users' sum again, best effort. Caveat (NVIDIA's documentation): a server's changed limits apply to
// clients that connect afterwards, not to those already connected; so a task's limits must be set
// before it starts, and a Release that lowers them does not shrink clients already running. Only tested
// against tests/fake_mps (no GPU here): the reply forms come from NVIDIA's documentation and
// published captures, and the form of `get_device_pinned_mem_limit`'s reply is not documented.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace gpupool {

struct MpsOptions {
  // A path (containing '/') or a name looked up in PATH at each start.
  std::string control_binary = "nvidia-cuda-mps-control";
  std::string root;  // per-GPU directories live under it
  // How long the daemonizing `-d` may take, and its pipe to answer after that.
  std::chrono::milliseconds start_timeout{10000};
  // How long one control command (get_server_list, quit) may take, and a quit daemon to exit.
  std::chrono::milliseconds command_timeout{5000};
  // Where a server PID's owner is read (<proc_root>/<PID>/status); tests point it elsewhere.
  std::string proc_root = "/proc";
};

// What one user of a GPU's daemon (a task) is granted on that GPU, as the uid it runs as.
struct MpsClientLimits {
  int64_t uid = -1;                  // 0 .. 2^32-2
  int active_thread_percentage = 0;  // 1 .. 100
  int64_t pinned_mem_mib = 0;        // 1 .. kMaxPinnedMemMib
  bool operator==(const MpsClientLimits&) const = default;
};
// 16 TiB: far above any GPU's memory, far below any overflow of a sum over users.
constexpr int64_t kMaxPinnedMemMib = int64_t{16} << 20;
// InvalidArgument naming the bound a value breaks.
Status ValidateMpsClientLimits(const MpsClientLimits& limits);

class MpsDaemons {
 public:
  explicit MpsDaemons(MpsOptions options);
  MpsDaemons(const MpsDaemons&) = delete;
  MpsDaemons& operator=(const MpsDaemons&) = delete;

  // Makes sure the GPU's daemon runs (starting it when it is absent or unhealthy) and counts `user`
  // among its users. Errors name the GPU and say what failed (binary not found, the daemon's exit
  // status and stderr, no answer on the control pipe).
  Status Ensure(const std::string& gpu_uuid, const std::string& user);
  // Ensure, and holds the server of `limits.uid` on the GPU to the sum over that uid's users (see
  // "Server limits" above), set and verified before it returns OK. On an error `user` keeps its
  // earlier entry, if it had one; else it is not counted.
  Status Ensure(const std::string& gpu_uuid, const std::string& user, const MpsClientLimits& limits);
  // Forgets `user`; when the GPU has no user left, quits its daemon. A daemon that is already gone
  // is fine. Releasing a user that was never counted is a no-op. A user with limits whose uid keeps
  // other users there: the server is set to their sum (an error says what failed; the user is
  // forgotten regardless).
  Status Release(const std::string& gpu_uuid, const std::string& user);
  // Quits every daemon this object knows of and forgets all users (agent shutdown). Returns the
  // first error; tries every GPU regardless.
  Status StopAll();

  // GPUs whose daemon this object manages (ensured, not yet released), sorted.
  std::vector<std::string> Gpus() const;
  // Users of the GPU's daemon, sorted.
  std::vector<std::string> Users(const std::string& gpu_uuid) const;
  // The limits the server of `uid` on the GPU is held to: the sum over the uid's users with limits
  // (nullopt: none).
  std::optional<MpsClientLimits> ServerLimits(const std::string& gpu_uuid, int64_t uid) const;
  // Daemons started by this object so far (restarts included).
  int starts() const;
  // Runs the health check described above (no locking of the user table needed).
  bool Healthy(const std::string& gpu_uuid) const;

  std::string PipeDir(const std::string& gpu_uuid) const;
  std::string LogDir(const std::string& gpu_uuid) const;

 private:
  Result<std::string> ResolveBinary(const std::string& gpu_uuid) const;
  std::vector<std::string> DaemonEnv(const std::string& gpu_uuid) const;
  Status Start(const std::string& gpu_uuid);
  Status Quit(const std::string& gpu_uuid);
  // mps_limits.cc. REQUIRES: mu_ held.
  std::optional<MpsClientLimits> SumLocked(const std::string& gpu_uuid, int64_t uid) const;
  // Sets and verifies the server limits of `limits.uid` (steps 1-3 above).
  Status ApplyServerLimits(const std::string& gpu_uuid, const MpsClientLimits& limits);
  // The PIDs of the uid's servers, as the daemon lists them.
  Result<std::vector<pid_t>> ServersOf(const std::string& exe, const std::string& gpu_uuid, int64_t uid);
  // Runs one control command; its output when it exits 0 within command_timeout, else an error
  // naming the GPU, uid, command and what came back.
  Result<std::string> Control(const std::string& exe, const std::string& gpu_uuid, int64_t uid,
                              const std::string& command) const;

  MpsOptions options_;
  mutable std::mutex mu_;
  // gpu uuid -> user -> what the user was granted (nullopt: counted without limits).
  std::map<std::string, std::map<std::string, std::optional<MpsClientLimits>>> users_;
  int starts_ = 0;
};

}  // namespace gpupool
