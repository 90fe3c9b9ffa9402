// What users ask for: tasks, task groups and jobs (gangs).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/quantity.h"
#include "common/status.h"

namespace gpupool {

// What can hold a GPU share to its size (its memory and its compute) on a node, one bit each; a
// node's agent says which it offers (model/node.h kEnforceLabelPrefix), a task which one it would need
// (TaskRequest::enforced_by).
inline constexpr uint8_t kEnforceLimiter = 1 << 0;           // the CUDA limiter, process tasks
inline constexpr uint8_t kEnforceLimiterContainer = 1 << 1;  // the CUDA limiter, container tasks
inline constexpr uint8_t kEnforceMps = 1 << 2;               // limits set through the MPS control daemon
// Every bit above, for walking them.
inline constexpr uint8_t kEnforceBits[] = {kEnforceLimiter, kEnforceLimiterContainer, kEnforceMps};

// One task's request.
//   gpu_count == 0                 CPU-only; every GPU field must be empty
//   gpu_count >= 1, gpu_share      per-GPU share in milli-GPU, 1..1000 (1000 = whole GPU), and
//                  gpu_memory      optionally per-GPU memory (0: the share's part of each GPU's
//                                  memory is reserved, model/ledger.h ShareMemory)
//   mig_profile                    one MIG instance ("3g.40gb", or "3g" for any 3-slice profile);
//                                  then gpu_count == 1 and no share or GPU memory
struct TaskRequest {
  MilliCpu cpu{0};
  MiB memory{0};
  int gpu_count = 0;
  MilliGpu gpu_share{0};
  MiB gpu_memory{0};
  std::vector<std::string> gpu_models;  // acceptable models; empty: any
  std::string mig_profile;
  // Every pair of the task's GPUs must be joined by NVLink (directly or through NVSwitch): for
  // multi-GPU tasks whose collectives would crawl over PCIe. Needs gpu_count >= 2, no MIG.
  bool nvlink = false;
  // Sharing a GPU with others (docs/jobspec.md#qos). `guaranteed`: the task's job is QoS guaranteed,
  // so it shares a GPU only with shares held to their size. `enforced_by`: the one kEnforce* bit
  // (model/node.h) of what holds this task to its share on a node whose agent offers it; 0: nothing
  // does. Derived from the job's QoS and the task's isolation (DeriveSharing), never asked for.
  bool guaranteed = false;
  uint8_t enforced_by = 0;
  // An MPS share (enforced_by kEnforceMps): whose MPS server its GPU runs. A GPU's MPS control
  // daemon serves one user (uid) at a time and makes the others wait, so a GPU holds MPS shares of
  // one owner only (model/ledger.h MpsAllows). The job's tenant (DeriveSharing); the server marks
  // a root queue's tasks, which run as root, apart (server/identities.h SetMpsOwners). "" for any
  // other task.
  std::string mps_owner;

  bool wants_gpu() const { return gpu_count > 0; }
  bool wants_mig() const { return !mig_profile.empty(); }
  // A share of one GPU (1 GPU, less than all of it) — "share" in GpuClustering's tags.
  bool is_share() const { return gpu_count == 1 && gpu_share < kWholeGpu && !wants_mig(); }
  // GPU share summed over all GPUs of the task.
  MilliGpu total_gpu_share() const { return gpu_share * gpu_count; }
  bool operator==(const TaskRequest&) const = default;
};

Status ValidateTaskRequest(const TaskRequest& request);

// Short human form: "cpu=4 mem=16Gi gpu=2x1 models=[A100-80GB]".
std::string DescribeTaskRequest(const TaskRequest& request);

enum class QosClass : uint8_t {
  kGuaranteed,  // latency-sensitive inference: a static partition, never preempted
  kBurstable,
  kBestEffort,  // training: time-sliced and preemptible
};
std::string_view QosClassName(QosClass qos);
Result<QosClass> ParseQosClass(std::string_view name);

// How a task shares its GPUs with others on the node (the agent enforces it).
enum class IsolationMode : uint8_t {
  kExclusive,  // whole GPUs, nobody else on them
  kMps,        // CUDA MPS: compute share and memory limits per client (docs/jobspec.md#isolation)
  kMig,        // a MIG instance
  kTimeslice,  // time-sliced sharing; the CUDA limiter holds a share in process tasks
};
std::string_view IsolationModeName(IsolationMode mode);
Result<IsolationMode> ParseIsolationMode(std::string_view name);

// The isolation a task gets when its spec names none: a MIG instance runs as MIG; whole GPUs
// exclusively; a share of one GPU under MPS when the job is guaranteed (hard compute and memory
// limits), else time-sliced; a CPU-only task exclusive, which means nothing for it.
IsolationMode DefaultIsolation(const TaskRequest& request, QosClass qos);
// Whether `mode` fits the request (a MIG instance only as 'mig', 'exclusive' only with whole
// GPUs, 'mps'/'timeslice' only with a GPU); InvalidArgument saying why not.
Status CheckIsolation(const TaskRequest& request, IsolationMode mode);

// The ML framework a task says it runs: which allocator advice the agent puts in a fractional
// task's environment (docs/jobspec.md#isolation). kAuto, a spec that names none: the advice for
// all of them. Advice only: the CUDA limiter and MPS hold the memory whatever the framework.
enum class Framework : uint8_t { kAuto, kPyTorch, kTensorFlow, kJax, kNone };
std::string_view FrameworkName(Framework framework);
// pytorch, tensorflow, jax or none; "auto" is the absence of a name, never written.
Result<Framework> ParseFramework(std::string_view name);

// A requirement on a node's labels, after Kubernetes' node affinity operators.
struct LabelRequirement {
  enum class Op : uint8_t { kIn, kNotIn, kExists, kDoesNotExist };
  std::string key;
  Op op = Op::kIn;
  std::vector<std::string> values;  // kIn/kNotIn: at least one; kExists/kDoesNotExist: none
  bool Matches(const std::map<std::string, std::string>& labels) const;
  bool operator==(const LabelRequirement&) const = default;
};
std::string_view LabelOpName(LabelRequirement::Op op);
Result<LabelRequirement::Op> ParseLabelOp(std::string_view name);

// Where a job's tasks may go. Every node requirement must hold. A together-with term is a label
// set: each task goes on a node that runs a task of some job carrying all those labels. An
// apart-from term: never on a node that runs a task of such a job (a job whose own labels match
// its apart-from term spreads its replicas one per node).
struct Affinity {
  std::vector<LabelRequirement> node;
  std::vector<std::map<std::string, std::string>> together_with;
  std::vector<std::map<std::string, std::string>> apart_from;
  bool empty() const { return node.empty() && together_with.empty() && apart_from.empty(); }
  bool operator==(const Affinity&) const = default;
};

struct CheckpointPolicy {
  std::string dir;           // empty: the task does not checkpoint
  int interval_seconds = 0;  // 0: only when asked to stop
  bool operator==(const CheckpointPolicy&) const = default;
};

// A directory mounted into a container task (docs/jobspec.md#volumes): a host directory the node's
// admin allows (the agent's --volume-root, read-only, or --volume-root-rw), or a scratch directory
// of the task's own that lives as long as its run (on disk under the agent's --scratch-root, or
// in memory: a tmpfs of size_bytes charged to the task's memory limit).
struct Volume {
  std::string mount_path;  // absolute, in the container
  std::string host_path;   // a host directory; empty: scratch
  bool read_only = true;   // host directories only
  bool memory = false;     // scratch: a tmpfs instead of a directory on disk
  int64_t size_bytes = 0;  // memory scratch: its size (required); disk scratch: its limit (0: none)
  bool operator==(const Volume&) const = default;
};

// How a task runs. The scheduler ignores all of it; the agent needs it.
struct TaskExec {
  IsolationMode isolation = IsolationMode::kExclusive;
  Framework framework = Framework::kAuto;
  std::vector<std::string> command;
  std::map<std::string, std::string> env;
  std::string bundle;  // an OCI bundle directory: run with runc
  std::string rootfs;  // a root filesystem: runc with a generated config
  // A container image ("oci:/srv/images/pytorch:24.05", "docker://..."; common/image_source.h),
  // unpacked by the agent into its image cache: runc with a generated config.
  std::string image;
  // Containers: the OCI runtime that runs them: "" (runc, the default), "crun", "runsc" (gVisor:
  // the guest's system calls served by a user-space kernel) or "kata"; the agent maps each to a
  // binary, the admin may keep a class to some queues (docs/server.md#the-task-sandbox).
  std::string runtime_class;
  // Containers: "" (a network namespace of its own, loopback only), "pod" (loopback and an interface
  // on the agent's pod network: outbound only) or "host" (the host's network;
  // only in a queue the admin allows it for).
  std::string network;
  // Where the command starts (an absolute path; inside the container for a container task). Empty:
  // the task's own private directory (process), the bundle's cwd or / (container).
  std::string working_dir;
  CheckpointPolicy checkpoint;
  std::vector<Volume> volumes;  // containers only
  bool operator==(const TaskExec&) const = default;
};

struct TaskGroup {
  std::string name;
  int replicas = 1;
  TaskRequest request;
  TaskExec exec;
};

// What happens after a fault: the job's tasks stopped because their node was lost, a GPU of theirs
// failed, or (with on_failure) a task exited non-zero. The job goes back to its queue and restarts
// from its checkpoint: the first restart at once (a node loss should cost seconds, not a backoff),
// the n-th after backoff_seconds * 2^(n-2) (at most max_backoff_seconds), which keeps a job that
// fails over and over from hammering the pool; after max_restarts the job fails, naming the fault. Moves the
// pool makes on purpose (preemption, drain, hot-spot migration) are not faults and do not count.
struct RetryPolicy {
  int max_restarts = 3;
  int backoff_seconds = 1;
  int max_backoff_seconds = 300;
  bool on_failure = false;
  bool operator==(const RetryPolicy&) const = default;
  // The wait before the n-th fault restart (n >= 1).
  int64_t BackoffSeconds(int n) const;
};

// A job that must end before this one starts (dependsOn): `succeeded` waits for it to succeed and
// fails this job when it ends otherwise; `ended` waits for it to end, however it ends.
struct Dependency {
  enum class Condition { kSucceeded, kEnded };
  std::string job;
  Condition condition = Condition::kSucceeded;
  bool operator==(const Dependency&) const = default;
};
std::string_view DependencyConditionName(Dependency::Condition c);  // "succeeded", "ended"

// A job is a gang of task groups: either at least `min_available` tasks are placed together, or
// none is. min_available == 0 means all tasks.
struct Job {
  std::string id;
  std::string name;
  std::string tenant;
  std::string queue;
  int priority = 0;
  QosClass qos = QosClass::kBurstable;
  int min_available = 0;
  std::vector<TaskGroup> groups;
  std::map<std::string, std::string> labels;
  Affinity affinity;
  RetryPolicy retry;
  // Walltime of each run, seconds (0: none): past it the job fails with reason `time limit`, its
  // tasks stopped with the grace period. A restart (a fault, a preemption) starts a new run.
  int64_t time_limit_seconds = 0;
  std::vector<Dependency> depends_on;

  int task_count() const;
  int gang_size() const { return min_available > 0 ? min_available : task_count(); }
};

Status ValidateJob(const Job& job);

// Sets every group's request.guaranteed and request.enforced_by from the job's QoS and the group's
// isolation: a timeslice share of a process task is held by the CUDA limiter, of a container by the
// limiter in containers, an MPS share by the limits its agent sets through the MPS control daemon;
// whole GPUs, MIG instances and CPU-only tasks share no GPU, so nothing needs holding. An MPS
// share's mps_owner is the job's tenant.
void DeriveSharing(Job& job);

}  // namespace gpupool
