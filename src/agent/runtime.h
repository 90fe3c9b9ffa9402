// How an agent runs a task: the `process` runtime (fork/exec in its own process group, cgroup
// limits where the machine allows) and the `runc` runtime (an OCI bundle per task). Both keep
// stdout/stderr in log files, stop with SIGTERM, a grace period, then SIGKILL, and can adopt the
// tasks they left running when the agent restarts (state lives under the runtime's state dir).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace gpupool {

struct LaunchSpec {
  std::string id;                           // unique on the node, path-safe: "j-000000000042.0"
  std::vector<std::string> argv;            // argv[0] is looked up in PATH (process) / rootfs
  std::map<std::string, std::string> env;   // the whole environment of the task
  std::string workdir;                      // empty: the task's own directory under the state dir
  int64_t cpu_milli = 0;                    // 0: no CPU limit
  int64_t memory_bytes = 0;                 // 0: no memory limit
  // The most processes and threads the task may have at once (cgroup pids.max; 0: no limit). A
  // fork bomb stays inside its own group instead of taking the host's pid space.
  int64_t pids_max = 0;
  // runc only: an existing OCI bundle directory, or a root filesystem to build a bundle around.
  std::string bundle;
  std::string rootfs;
  // runc only: a root filesystem the agent unpacked from an image into its cache (trusted: not
  // checked against container_roots). The runtime creates the directories the container's mounts
  // need in it (the container's root cannot: the files are the host root's), never through a link.
  std::string image_rootfs;
  // Device nodes to expose (/dev/nvidia0, /dev/nvidiactl, ...) and host paths to bind read-only
  // (driver libraries), when present on the host.
  std::vector<std::string> devices;
  std::vector<std::string> readonly_binds;
  // Lease fencing (opt-in): a file the agent keeps renewed, "<term_ms> <kill_ms>[ ...]\n" with two
  // CLOCK_BOOTTIME deadlines in milliseconds. The task's supervisor reads it every ~100 ms and,
  // once a deadline has passed, sends the task SIGTERM, then SIGKILL, even when the agent is dead.
  // Empty, or a file that does not exist: no fencing.
  std::string lease_path;

  // The sandbox (docs/agent.md#the-task-sandbox). The agent fills these in for every task; a spec
  // that leaves them alone (tests of other things) runs as the agent does.
  //   uid/gid       >= 0: the task's identity (no supplementary groups, no capabilities). Its own
  //                 working directory (`work/` in the task directory, mode 0700) is its uid's.
  //   no_new_privs  setuid binaries and file capabilities grant nothing.
  //   hide_paths    process runtime: covered in the task's mount namespace (the runtime adds its
  //                 own state and log directories whenever a uid is set); keep_paths are brought
  //                 back (the working directory always).
  //   private_dev   process runtime: /dev holds the standard nodes and `devices` only.
  //   network       runc: "none" (a network namespace of its own: loopback only), "host", or
  //                 "pod": the namespace at netns_path (agent/pod_network.h), made by the agent.
  //   binds         runc: host directories (or files) mounted into the container (checkpoints,
  //                 volumes).
  int64_t uid = -1;
  int64_t gid = -1;
  bool no_new_privs = false;
  // process runtime: the task has libgpupool-cuda.so preloaded. Its processes share one memory
  // ledger (docs/cuda_limiter.md): an empty file, the task's uid's and mode 0600, made afresh at each
  // start at CudaLedgerPath. As root the runtime also binds the library, the ledger and a read-only
  // limits file into the task's mount namespace (agent/process_preload.h) with cuda_limiter; without
  // root GPUPOOL_CUDA_LEDGER names the host path.
  bool cuda_ledger = false;
  // runc: libgpupool-cuda.so (its host path) to preload into every dynamically linked process of
  // the container, whatever their environment: the runtime binds it read-only at
  // /usr/lib/gpupool/libgpupool-cuda.so, binds a read-only /etc/ld.so.preload naming it, and binds
  // a ledger made afresh at each start (the task's uid's, mode 0600) at /run/gpupool/cuda-ledger,
  // named in GPUPOOL_CUDA_LEDGER (agent/container_preload.h). A start whose image cannot load it
  // (no glibc, an older glibc than the library needs) fails. "": none.
  std::string cuda_limiter;
  std::vector<std::string> hide_paths;
  std::vector<std::string> keep_paths;
  bool private_dev = false;
  std::string network = "none";
  std::string netns_path;
  struct Bind {
    std::string source;       // absolute host path, an existing directory or file
    std::string destination;  // absolute path in the container
    bool readonly = true;
  };
  std::vector<Bind> binds;
  // runc: memory-backed scratch (a tmpfs of at most size_bytes, the task's uid's, charged to its
  // memory limit).
  struct Tmpfs {
    std::string destination;
    int64_t size_bytes = 0;
  };
  std::vector<Tmpfs> tmpfs;
  // runc: what a CDI spec gives the task's GPUs (agent/cdi.h): device nodes (looked up at
  // host_path, made at path in the container), mounts as the spec writes them (a bind of a file or
  // a directory when type is empty or "bind"), and OCI hooks by stage (createContainer, ...).
  struct Device {
    std::string host_path;
    std::string path;
  };
  std::vector<Device> container_devices;
  struct Mount {
    std::string source;
    std::string destination;
    std::string type;  // empty: bind
    std::vector<std::string> options;
  };
  std::vector<Mount> mounts;
  struct Hook {
    std::string stage;
    std::string path;
    std::vector<std::string> args;
    std::vector<std::string> env;
    int timeout_seconds = 0;
  };
  std::vector<Hook> hooks;
};

enum class RunState { kRunning, kExited, kUnknown };

struct TaskStatusInfo {
  RunState state = RunState::kUnknown;
  int exit_code = 0;     // when exited normally
  int term_signal = 0;   // when killed by a signal
  std::string message;   // "exit code 3", "killed by SIGKILL after the grace period", ...
  bool fenced = false;   // the supervisor stopped it because its lease ran out
};

class Runtime {
 public:
  virtual ~Runtime() = default;
  virtual std::string name() const = 0;  // "process" or "runc"
  // Starts the task and returns once it runs (or failed to start: the error says why).
  virtual Status Start(const LaunchSpec& spec) = 0;
  // Non-blocking.
  virtual Result<TaskStatusInfo> Poll(const std::string& id) = 0;
  // Sends SIGTERM now and SIGKILL once `grace` has passed (checked by later Poll/Stop calls, so it
  // never blocks); a task already gone is Ok.
  virtual Status Stop(const std::string& id, std::chrono::seconds grace) = 0;
  // Frees what the task left behind (cgroup, bundle state) once it has exited. Logs stay.
  virtual Status Remove(const std::string& id) = 0;
  // Ids of the tasks this runtime knows, including those adopted from its state dir at start.
  virtual std::vector<std::string> List() = 0;
  // Paths of the task's log files.
  virtual std::string StdoutPath(const std::string& id) const = 0;
  virtual std::string StderrPath(const std::string& id) const = 0;
  // The host path of the task's CUDA memory ledger (LaunchSpec::cuda_ledger), whether or not it has
  // one: the agent reads the limiter's pressure counters there.
  virtual std::string CudaLedgerPath(const std::string& id) const = 0;
  // Empty when CPU/memory limits are enforced; otherwise why they are not (said once, here,
  // rather than on every Start): "no writable cgroup: ...". Added with the runtimes.
  virtual std::string limits_note() const { return {}; }
};

struct RuntimeOptions {
  std::string state_dir;   // per-task directories, logs, pid files / bundles
  std::string cgroup_root; // empty: auto-detect a writable cgroup (v2 unified or v1 cpu+memory); none: no limits
  std::string runc_binary = "runc";
  // OCI runtimes with runc's command line (crun, runsc): the class name the runtime answers to,
  // flags put before every subcommand (runsc: --platform=ptrace --oci-seccomp), and whether the
  // network goes on the command line (runsc: --network=none|host, per container).
  std::string runtime_class = "runc";
  std::vector<std::string> global_flags;
  bool network_flag = false;
  // Task logs: <log_dir>/<task id>/stdout.log and stderr.log (empty: in the task's directory under
  // state_dir). The task writes into pipes its supervisor drains; each file holds at most
  // log_max_bytes (<= 0: unbounded), rotated into log_keep previous files (stdout.log.1, ...;
  // 0..9), so one stream takes at most log_max_bytes * (log_keep + 1) bytes.
  std::string log_dir;
  int64_t log_max_bytes = int64_t{64} << 20;
  int log_keep = 1;
  // runc: the only directories a task's rootfs (and a bundle's root) may lie under, after
  // symbolic links are resolved. Empty: no container may run.
  std::vector<std::string> container_roots;
};

// Fails with a clear message when the runtime cannot work here (runc not installed, ...). The runc
// runtime also drives crun and runsc (RuntimeOptions::runtime_class).
Result<std::unique_ptr<Runtime>> MakeProcessRuntime(const RuntimeOptions& options);
Result<std::unique_ptr<Runtime>> MakeRuncRuntime(const RuntimeOptions& options);

}  // namespace gpupool
