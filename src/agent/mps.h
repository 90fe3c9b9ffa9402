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
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <set>
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
};

class MpsDaemons {
 public:
  explicit MpsDaemons(MpsOptions options);
  MpsDaemons(const MpsDaemons&) = delete;
  MpsDaemons& operator=(const MpsDaemons&) = delete;

  // Makes sure the GPU's daemon runs (starting it when it is absent or unhealthy) and counts `user`
  // among its users. Errors name the GPU and say what failed (binary not found, the daemon's exit
  // status and stderr, no answer on the control pipe).
  Status Ensure(const std::string& gpu_uuid, const std::string& user);
  // Forgets `user`; when the GPU has no user left, quits its daemon. A daemon that is already gone
  // is fine. Releasing a user that was never counted is a no-op.
  Status Release(const std::string& gpu_uuid, const std::string& user);
  // Quits every daemon this object knows of and forgets all users (agent shutdown). Returns the
  // first error; tries every GPU regardless.
  Status StopAll();

  // GPUs whose daemon this object manages (ensured, not yet released), sorted.
  std::vector<std::string> Gpus() const;
  // Users of the GPU's daemon, sorted.
  std::vector<std::string> Users(const std::string& gpu_uuid) const;
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

  MpsOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, std::set<std::string>> users_;  // gpu uuid -> users
  int starts_ = 0;
};

}  // namespace gpupool
