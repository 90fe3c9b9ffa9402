// The node agent: registers its node and GPUs with the server, heartbeats, runs what the server
// assigns (level-triggered: it compares the assignments with what it runs), reports task status,
// and serves the node's GPU metrics and task logs over HTTP.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/cdi.h"
#include "agent/image_cache.h"
#include "agent/inventory.h"
#include "agent/mps.h"
#include "agent/pod_network.h"
#include "agent/nvml.h"
#include "agent/runtime.h"
#include "agent/task_env.h"
#include "common/status.h"

namespace gpupool::http {
class Server;
struct Request;
struct Response;
}  // namespace gpupool::http

namespace gpupool {

class ApiClient;
class RequestInterrupter;
struct HttpReply;

struct AgentOptions {
  std::string server = "http://127.0.0.1:8470";
  std::string token;
  std::string ca_file;              // https servers: the CA (PEM) their certificate must chain to
  std::string tls_cert_file;        // set (with the key): the log/metrics endpoint serves TLS, and
  std::string tls_key_file;         // the agent presents them to a server that asks (tls.clientCA)
  std::string node;                 // default: the host name
  std::string cpu;                  // default: the machine's online CPUs
  std::string memory;               // default: the machine's physical memory
  std::map<std::string, std::string> labels;
  std::string simulate;             // a SimulatedInventory spec; empty: NVML, or simulate when absent
  std::string default_simulation = "4xA100-80GB";
  std::string nvml_library;         // empty: libnvidia-ml.so.1
  std::string mps_control_binary;   // real GPUs, isolation mps; empty: nvidia-cuda-mps-control in PATH
  std::string state_dir;            // task directories, logs, runtime state
  // Task logs: <log_dir>/<process|runc>/<task>/stdout.log (empty: <state_dir>/<runtime>/<task>/),
  // each stream capped at log_max_bytes per file with log_keep rotated files (RuntimeOptions).
  std::string log_dir;
  int64_t log_max_bytes = int64_t{64} << 20;
  int log_keep = 1;
  std::string metrics_listen;       // "host:port" for /metrics and task logs; empty: none; port 0: any
  std::string advertise_host;       // host in the log endpoint sent to the server; empty: the listen
                                    // host, or the host name when listening on all addresses
  double heartbeat_seconds = 0;     // 0: what the server asks for
  double poll_seconds = 0.2;        // how often task state is checked
  // How often the agent asks for its assignments between heartbeats (every heartbeat brings them
  // too): what a new task waits at most before its agent sees it. 0: only with heartbeats.
  double assignment_poll_seconds = 1.0;
  // Wait on the server for assignments (a long poll, answered as soon as they change) instead of
  // asking every assignment_poll_seconds; a server that does not answer watches is polled as before.
  bool watch_assignments = true;
  int assignment_wait_seconds = 25;  // how long one long poll waits (the server allows up to 60)
  // Wake the loop as soon as a task's supervisor (a child of this process) exits, so a task's end
  // is reported at once rather than at the next poll (child_exits.h).
  bool wake_on_child_exit = true;
  // The task sandbox (docs/agent.md#the-task-sandbox), in force when the agent runs as root.
  //   container_roots   the only directories a container's rootfs or bundle may lie under;
  //   checkpoint_roots  the only directories a sandboxed task's checkpoint directory may lie under
  //                     (the agent creates it there, the task's uid's, mode 0700);
  //   hide              more host paths no task may see (the server's data and config, when the
  //                     agent runs beside it); the agent's state and log directories always are.
  std::vector<std::string> container_roots = {"/var/lib/gpupool/images"};
  std::vector<std::string> checkpoint_roots = {"/var/lib/gpupool/checkpoints"};
  std::vector<std::string> hide;
  // Volumes (docs/jobspec.md#volumes): the host directories a container's hostPath volume may
  // lie under, read-only (volume_roots) or as the job asks (volume_roots_rw), links resolved; none
  // by default. Disk scratch lives in <scratch_root>/agent-<hash>/<run>/<n> for as long as its run.
  std::vector<std::string> volume_roots;
  std::vector<std::string> volume_roots_rw;
  std::string scratch_root = "/var/lib/gpupool/scratch";
  // GPUs in containers (docs/agent.md#gpus-in-containers): the CDI spec directories read at start
  // (later ones win, as the CDI specification orders them) and, where none describes
  // nvidia.com/gpu, the root under which the driver's files are looked for to generate one.
  std::vector<std::string> cdi_spec_dirs = {"/etc/cdi", "/var/run/cdi"};
  std::string driver_root = "/";
  // The pod network (docs/agent.md#pod-network) for containers asking for `network: pod`: an IPv4
  // subnet ("10.88.0.0/24"; empty: none, such tasks fail to start saying so), the bridge it lives
  // on, whether the pods' traffic leaves through NAT, and destinations pods may not reach.
  std::string pod_network;
  std::string pod_bridge = "gpupool0";
  bool pod_nat = true;
  std::vector<std::string> pod_deny;
  // The most processes and threads one task may have at once (its cgroup's pids.max, where the
  // host has the pids controller); 0: no limit. One task's fork bomb then cannot take the host's
  // pid space from the other tenants' tasks and from the agent.
  int64_t task_pids_max = 8192;
  // Container images (image_cache.h): where they are unpacked (empty: /var/lib/gpupool/image-cache/
  // <node>; every directory above it must let others pass, as runc mounts a rootfs as the task's
  // uid), the most bytes unused images may take, and the registries docker:// images may come
  // from (empty: any). Local image files must lie under container_roots.
  // Runtime classes (docs/agent.md#runtime-classes): the binary of each container class, looked up
  // in PATH when not absolute (runc, crun, runsc by default; kata only when given), and the
  // platform runsc runs its sandboxes on.
  std::map<std::string, std::string> runtime_classes;
  std::string runsc_platform = "ptrace";
  std::string image_cache_dir;
  int64_t image_cache_max_bytes = int64_t{50} << 30;
  std::vector<std::string> image_registries;
  std::string image_policy;     // containers-policy.json for every pull (image_cache.h)
  std::string image_auth_file;  // containers-auth.json for docker:// pulls, mode 0600
  // Simulated GPUs only: a JSON file of GPU faults and telemetry overrides, re-read on every
  // heartbeat (docs/agent.md#fault-injection). Empty: none.
  std::string sim_faults;
  // libgpupool-cuda.so (docs/cuda_limiter.md), preloaded into fractional time-sliced tasks that
  // run as processes. Empty: the one beside the agent's executable when there is one; "none": off.
  std::string cuda_limiter;
};

// Lease fencing: when, after a lease of `timeout_s` seconds starts, the agent's tasks get SIGTERM
// and SIGKILL: 2 s and 1 s before the lease ends, clamped for short leases to 1/3 and 2/3 of it
// (timeout 3 s: +1 s and +2 s).
void LeaseFenceOffsets(double timeout_s, int64_t* term_ms, int64_t* kill_ms);

class Agent {
 public:
  // Discovers (or simulates) the GPUs and prepares the runtimes; talks to nobody yet.
  static Result<std::unique_ptr<Agent>> Create(AgentOptions options);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Registers the node (retrying while the server is unreachable, up to `register_timeout`), starts
  // the metrics listener and the loop thread.
  Status Start(std::chrono::seconds register_timeout = std::chrono::seconds(30));
  // Stops the loop and the listener. Tasks keep running (a restarted agent adopts them) unless
  // `stop_tasks`: then they get SIGTERM and their grace period.
  void Stop(bool stop_tasks = false);

  const Inventory& inventory() const { return inventory_; }
  // The CDI specs containers get their GPUs from (a copy): as LoadCdi read or made them, and as MIG
  // layout changes left them since.
  std::vector<CdiSpec> CdiSpecs();
  const std::string& node() const { return options_.node; }
  int metrics_port() const { return metrics_port_; }
  std::string MetricsText();
  // What the agent printed about itself at Create (GPU source, simulated or not).
  const std::string& summary() const { return summary_; }
  // The `gpus` array of the heartbeat: one entry per GPU of the node spec, in index order
  // (docs/agent.md). Re-reads --sim-faults.
  nlohmann::json GpuStatusJson();
  // GPUs (by index) on which a guaranteed task's limiter counted new pressure since the last call
  // (allocations within its grant that the driver refused), each with the job that reported it.
  std::map<int, std::string> TakeMemoryPressure();
  // The last problem with the --sim-faults file; empty when it was fine (or absent).
  std::string sim_faults_error();
  // Where the lease lives (<state dir>/lease) and whether it is still good for starting tasks.
  const std::string& lease_path() const { return lease_path_; }
  bool LeaseValid();
  // Non-empty while the agent refuses to serve the server it talks to, because that server is
  // another cluster than the one this node belongs to (docs/agent.md#cluster-identity): it then
  // starts, adopts and reports nothing.
  std::string cluster_refusal();

 private:
  struct LocalTask {
    Assignment assignment;
    Runtime* runtime = nullptr;
    bool started = false;
    bool stop_requested = false;
    bool exited = false;
    std::string final_state;    // succeeded, failed, stopped: once exited
    std::string final_message;
    int exit_code = 0;
    bool running_reported = false;
    bool final_reported = false;
    bool in_assignments = true;
    // Its image is being pulled: StartTask is tried again on every poll until it is ready.
    bool preparing = false;
    std::string image;  // the image it started from, "<source>@sha256:..." ("" for no image)
    std::vector<std::string> mps_gpus;  // GPUs whose MPS daemon counts this task among its users
    // The CUDA limiter's pressure counters of its ledger last read, per device ordinal (a
    // guaranteed task's: WatchesPressure).
    std::vector<uint64_t> pressure_seen;
  };

  explicit Agent(AgentOptions options);
  Status Register();
  nlohmann::json AgentInfoJson() const;  // {endpoint, logToken} for registration and heartbeats
  void ServeLog(const http::Request& req, http::Response& res);
  // The highest restart count of `task`'s runs whose logs are in `rt`'s state dir; -1: none.
  static int NewestRunOnDisk(Runtime& rt, const std::string& task);
  void Loop();
  void Tick();
  // Applies one list of the server's (`version`: its "version", "" when it has none). A list older
  // than one already applied (the heartbeat's answer overtaken by the watch's) is dropped: false.
  bool Reconcile(const std::vector<Assignment>& assignments, const std::string& version = "");
  void ApplyAssignments(const std::string& body);  // parse, reconcile, poll
  void StartTask(LocalTask& t);
  // The driver's root ("/" unless --driver-root), and its MIG capability minors (at most 1 MiB of
  // /proc/driver/nvidia-caps/mig-minors; "" when unreadable).
  std::string DriverRoot() const;
  std::string MigMinorsText() const;
  // A guaranteed task that runs under the CUDA limiter: its ledger's pressure counters are read.
  bool WatchesPressure(const Assignment& a) const;
  // Takes over the run of `t` if a runtime already knows it (an earlier agent started it); false
  // when none does. REQUIRES: mu_ held.
  bool Adopt(LocalTask& t);
  // Asks t's runtime to stop it (TERM, then KILL after `grace`), saying so in the agent's log, with
  // the runtime's error when it could not. REQUIRES: mu_ held, t.runtime set.
  void StopTask(const std::string& id, LocalTask& t, std::chrono::seconds grace, const std::string& why);
  void PollTasks();
  // Frees what a task the server no longer lists left behind once its end is reported (its MPS
  // use, runtime state, placement record); the caller drops it from tasks_. REQUIRES: mu_ held.
  void Forget(const std::string& id, LocalTask& t);
  void Report(LocalTask& t);
  Result<Runtime*> RuntimeFor(const Assignment& a);
  // Real GPUs, isolation mps: makes sure each of the task's GPUs has its MPS control daemon, with
  // the task among its users, and the MPS server of the task's uid held to the task's limits (summed
  // over that uid's tasks on the GPU; mps.h). An error means the task must not start. REQUIRES: mu_
  // held.
  Status EnsureMps(LocalTask& t);
  // Real GPUs, isolation mig: makes each of the task's MIG instances exist, destroying the idle GPU
  // instances in its way (agent_mig.cc, docs/agent.md#dynamic-mig). An error means the task must not
  // start. REQUIRES: mu_ held (inventory_ changes under it).
  Status EnsureMigInstances(const LocalTask& t);
  // The uid a's processes run as: its runAs (0 for a root queue's root) in the sandbox, the agent's
  // own without it.
  int64_t TaskUid(const Assignment& a) const;
  Status SandboxTask(const Assignment& a, LaunchSpec* spec);
  Status MountVolumes(const Assignment& a, LaunchSpec* spec);
  // agent_cdi.cc: the CDI specs for this node's GPUs, read or generated once at start, and what
  // they give a container task's GPUs.
  void LoadCdi();
  Status ApplyCdi(const Assignment& a, LaunchSpec* spec);
  void RemoveScratch(const Assignment& a);
  // Removes the scratch of every run under --scratch-root not named in `keep` (unmounting
  // size-limited scratch first).
  void PruneScratch(const std::vector<std::string>& keep);
  // <scratch_root>/agent-<hash of the state dir>, and a run's directory in it.
  std::string ScratchScopeDir() const;
  std::string RunScratchDir(const Assignment& a) const;
  // network: pod: the run's namespace on the agent's bridge, and the host's resolv.conf.
  Status AttachPodNetwork(const Assignment& a, LaunchSpec* spec);
  // The task no longer uses its GPUs' MPS daemons (the last user stops one). REQUIRES: mu_ held.
  void ReleaseMps(LocalTask& t);
  // Lease bookkeeping after a register/heartbeat attempt that began at `start_ms` (BootTimeMs).
  void AfterContact(int64_t start_ms, const Result<HttpReply>& r);
  void RenewLease(int64_t start_ms, double timeout_s);
  // True when a TCP connect to the server is refused (nobody listens there).
  bool ServerPortClosed() const;
  void ReloadSimFaults();  // REQUIRES: sim_mu_ held
  bool AdoptableTask(const std::string& id);
  // A process a runtime knows under a's task id was started for another placement than a's.
  bool StrayOfAnotherPlacement(const Assignment& a);
  // Stops such a process (no grace: it is nobody's), or once it has ended removes it and moves its
  // logs aside, so that this placement's run can start under the id. REQUIRES: mu_ held.
  void ClearStray(const std::string& id);  // a runtime still knows it (left by an earlier agent)
  std::string FencedMessage(const std::string& runtime_message);

  // The client for node-side calls: the node credential when the agent has one, else the
  // bootstrap token (a server of before node credentials).
  ApiClient& NodeApi();
  Status UseCredential(const std::string& secret, bool store);
  void DropCredential();
  // Checks the clusterId of a register or heartbeat answer: the first one is kept in the state
  // dir; a different one makes the agent refuse (and returns false).
  bool AcceptCluster(const HttpReply& r);
  void RefuseCluster(const std::string& why);

  AgentOptions options_;
  Inventory inventory_;
  std::unique_ptr<Nvml> nvml_;
  std::string summary_;
  std::vector<CdiSpec> cdi_specs_;  // nvidia.com/gpu specs; empty: containers get device nodes only
  std::string cdi_note_;            // where they came from, said at start
  std::unique_ptr<ApiClient> client_;       // the bootstrap (agent) token: registration
  std::unique_ptr<ApiClient> node_client_;  // the node credential; null: none yet
  std::string cluster_id_;                  // the pool this node belongs to; "": none yet
  std::string cluster_refusal_;             // guarded by mu_
  std::chrono::steady_clock::time_point next_refused_retry_{};
  std::unique_ptr<Runtime> process_runtime_;
  // Container runtimes by class (runc, crun, runsc, kata), and why a class cannot run here.
  std::map<std::string, std::unique_ptr<Runtime>> containers_;
  std::map<std::string, std::string> container_errors_;
  std::vector<Runtime*> AllRuntimes() const;
  // Container images: made by the first task that has one (or at start, when a cache is there).
  // REQUIRES: mu_ held. Null when they cannot be used here (image_error_ says why).
  ImageCache* Images();
  ImageCacheOptions image_options_;
  bool image_tried_ = false;
  std::unique_ptr<ImageCache> images_;
  std::string image_error_;
  bool sandbox_ = false;  // the agent runs as root: tasks get their identities and namespaces
  std::unique_ptr<MpsDaemons> mps_;  // real GPUs only; simulated ones get the variables alone
  std::unique_ptr<PodNetwork> pod_network_;  // null: none on this node
  bool runs_pruned_ = false;  // the pod namespaces and scratch of runs an earlier agent left were removed

  std::mutex mu_;  // guards tasks_ and counters
  std::map<std::string, LocalTask> tasks_;
  // The newest assignment list applied: the server run's token and its counter (watches.h).
  std::string assignments_run_;
  uint64_t assignments_seq_ = 0;
  uint64_t stale_lists_ = 0;  // lists dropped as older than one applied
  // Runs this agent ran, reported and forgot (run id and placement): never started again, whatever
  // a late list says. The newest kMaxForgotten.
  static constexpr size_t kMaxForgotten = 4096;
  // A real GPU's pressure claim goes to the server only when NVML finds it at least this full.
  static constexpr double kPressureConfirmFraction = 0.9;
  std::deque<std::string> forgotten_order_;
  std::unordered_set<std::string> forgotten_;
  static std::string RunKey(const Assignment& a) { return a.run_id() + "|" + a.placement_run; }
  uint64_t starts_ = 0;
  uint64_t start_failures_ = 0;
  uint64_t heartbeats_ = 0;
  uint64_t heartbeat_failures_ = 0;

  std::atomic<bool> stopping_{false};
  std::thread loop_;
  // The assignment watch (agent_watch.cc).
  void WatchLoop();
  bool ApplyAssignmentsOnly(const std::string& body);  // Reconcile without reporting; false: malformed
  ApiClient NodeApiCopy();  // for threads other than the loop's
  void WakeLoop();
  std::thread watch_;
  std::unique_ptr<RequestInterrupter> watch_interrupt_;
  std::atomic<bool> watching_{false};  // the server answers watches: the loop does not poll assignments
  std::atomic<bool> batch_reports_{false};  // the server announced POST .../reports ("features")
  std::mutex wake_mu_;
  std::condition_variable wake_cv_;
  bool wake_now_ = false;
  uint64_t child_exit_subscription_ = 0;
  std::mutex client_mu_;  // guards node_client_ against NodeApiCopy (the loop thread replaces it)
  std::unique_ptr<http::Server> http_;
  int metrics_port_ = 0;
  std::string endpoint_;   // http://host:port of the log server; empty: none
  std::string log_token_;  // random per agent start: what the server presents to read logs
  std::chrono::steady_clock::time_point next_heartbeat_{};
  std::chrono::steady_clock::time_point next_assignments_{};
  double heartbeat_interval_ = 5;

  // Lease fencing (docs/agent.md#lease-fencing).
  std::mutex lease_mu_;
  std::string lease_path_;
  std::string cuda_limiter_;  // libgpupool-cuda.so to preload ("": none; options_.cuda_limiter)
  double lease_timeout_s_ = 0;     // the server's heartbeatTimeoutSeconds; 0: not known yet
  int64_t lease_term_ms_ = 0;      // CLOCK_BOOTTIME deadlines written to the lease file
  int64_t lease_kill_ms_ = 0;
  int64_t last_contact_ms_ = 0;    // the start of the last attempt that renewed the lease
  bool lease_expired_logged_ = false;

  // --sim-faults: the overrides last read well, per GPU index.
  std::mutex sim_mu_;
  std::map<int, nlohmann::json> sim_overrides_;
  std::string sim_faults_error_;
};

}  // namespace gpupool
