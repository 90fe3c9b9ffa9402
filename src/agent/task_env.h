// The environment a task starts with, from its assignment and the node's inventory: which GPUs it
// may see, how its share is enforced (MPS thread percentage and pinned-memory limit, MIG instance,
// time slicing), settings that keep PyTorch, TensorFlow and JAX inside the memory cap, NCCL
// settings from the topology of its GPUs, and GPUPOOL_* variables that tell the task its
// allocation and its checkpoint directory. Pure: no I/O.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/image_cache.h"
#include "agent/inventory.h"
#include "agent/runtime.h"
#include "common/status.h"
#include "model/workload.h"

namespace gpupool {

// One GPU of an assignment, as the server sends it.
struct AssignedGpu {
  int index = 0;
  std::string uuid;
  int64_t share_milli = 0;    // of 1000
  int64_t memory_bytes = 0;   // granted GPU memory; 0: none asked
  std::string mig_profile;    // "3g.40gb" when isolation is mig
  int mig_profile_id = -1;    // the driver's GPU-instance profile id (9 for 3g.40gb); -1: not sent
  int mig_start = -1;         // first memory slice of the instance's placement
};

// An assignment of the server's `GET /api/v1/agent/nodes/{name}/assignments`, parsed.
struct Assignment {
  std::string job_id;
  int index = 0;
  std::string desired;  // "run" or "stop"
  std::string name;     // "resnet50-infer/server-0"
  std::string tenant;
  std::string qos;
  std::string isolation;  // exclusive, mps, mig, timeslice
  Framework framework = Framework::kAuto;  // which allocator advice the environment carries
  std::vector<std::string> command;
  std::map<std::string, std::string> env;
  std::string bundle;
  std::string rootfs;
  std::string image;             // a container image source (common/image_source.h); "": none
  std::string runtime_class;     // containers: runc (also ""), crun, runsc or kata
  std::string network = "none";  // containers: none, pod or host
  std::string working_dir;       // "": the runtime's default
  // The task's identity (runAs): a uid and gid, or root in a queue the admin allows it for.
  int64_t uid = 65534;
  int64_t gid = 65534;
  bool run_as_root = false;
  std::string checkpoint_dir;
  int checkpoint_interval_seconds = 0;
  std::vector<Volume> volumes;  // containers only (docs/jobspec.md#volumes)
  int grace_period_seconds = 30;
  int restarts = 0;
  // The server's id of this placement ("runId": random, unguessable; "" from an older server).
  // A process left running on the node is adopted only when it was started for the same one.
  std::string placement_run;
  int64_t cpu_milli = 0;
  int64_t memory_bytes = 0;
  std::vector<AssignedGpu> gpus;
  // A job of several tasks: where rank 0 listens and who is who (the server's `rendezvous`).
  struct Rendezvous {
    std::string master_addr;
    int master_port = 0;
    int world_size = 0, rank = 0, local_rank = 0, local_world_size = 0, node_rank = 0, nodes = 0;
    std::vector<std::string> hosts;  // "addr:tasks" by node rank
  };
  std::optional<Rendezvous> rendezvous;

  std::string task_id() const;  // "<jobId>.<index>": path-safe, unique on the node
  // One run of the task: task_id(), then "<jobId>.<index>.r<restarts>" once it has restarted, so a
  // restart placed on the node where an earlier run ended is a new task there, not the old one.
  std::string run_id() const;
};

// Errors name the field ("assignments[3].gpus[0].share: ...").
Result<std::vector<Assignment>> ParseAssignments(const nlohmann::json& body);

struct TaskEnvOptions {
  std::string node;
  std::string mps_pipe_root;  // per-GPU MPS pipe/log directories live under it ("<root>/<uuid>")
  bool mps_daemons = false;   // real GPUs: MPS control daemons run; simulated: only the variables
  // libgpupool-cuda.so to preload into a fractional time-sliced task ("": none). A container gets
  // it at agent_internal::kContainerCudaLimiterPath (the runc runtime binds it there).
  std::string cuda_limiter;
  // Containers get it too (real GPUs). Simulated GPUs have no CUDA driver for it to hold, so their
  // containers run without it (and images without glibc still start there); process tasks keep it.
  bool cuda_limiter_containers = true;
};

// Whether the task gets the CUDA limiter (a share below a whole GPU in `timeslice`, a limiter
// configured): the one place that decides, for TaskEnvironment's LD_PRELOAD and the launch's
// ledger and container binds.
bool TaskGetsCudaLimiter(const Assignment& a, const TaskEnvOptions& options);

// With a rendezvous, the variables distributed frameworks read: MASTER_ADDR, MASTER_PORT,
// WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, GROUP_RANK (torch.distributed's env://
// and what torchrun sets), JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID, and
// GPUPOOL_NNODES and GPUPOOL_HOSTS ("addr:tasks,..." by node rank: an MPI hostfile's lines). The
// job's own env may set them differently (its choice).
//
// The complete environment: PATH and HOME defaults, then ours, then the job's own `env` (which may
// not override GPUPOOL_*, CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES or CUDA_MPS_*: those are
// what enforce the allocation; an attempt is an error naming the variable).
//
// Isolation mig: each GPU's instance is the one FindMigInstance gives; CUDA_VISIBLE_DEVICES and
// NVIDIA_VISIBLE_DEVICES name the instances' UUIDs ("MIG-..."), GPUPOOL_GPU_UUIDS the parent GPUs,
// and GPUPOOL_MIG_INSTANCES lists "<gpu uuid>:<profile>@<start slice>:<instance uuid>" per GPU,
// comma-separated (the instance UUID is everything after the second ':'). A missing instance on
// real GPUs is an error (FailedPrecondition) naming the instances that do exist.
Result<std::map<std::string, std::string>> TaskEnvironment(const Assignment& a, const Inventory& inv,
                                                           const TaskEnvOptions& options);

// Isolation mps: the compute share as an MPS active-thread percentage (the smallest share of the
// task's GPUs in percent, rounded, 1..100) and, per GPU of the assignment (a.gpus[i]), the granted
// memory in MiB (0: none granted). TaskEnvironment puts them in CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
// and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; the agent has each GPU's MPS control daemon hold the task's
// server to them (mps.h).
struct MpsTaskLimits {
  int active_thread_percentage = 100;
  std::vector<int64_t> pinned_mem_mib;
};
MpsTaskLimits TaskMpsLimits(const Assignment& a);

// The MPI hostfile of a job of several tasks: one "addr slots=N" line per node, in node-rank
// order (Open MPI's form; MPICH's hydra reads "addr:N", and GPUPOOL_HOSTS has that).
std::string MpiHostfile(const Assignment::Rendezvous& z);

// The MIG instance of `g` (isolation mig) on this node. Real GPUs: the existing instance on GPU
// `g.index` whose GPU-instance profile (by id when both sides know it, else by name) and placement
// start match the assignment; of several compute instances in that GPU instance, the lowest compute
// instance id. gpupool does not create instances: none is an error naming the existing ones.
// Simulated inventories: a synthetic instance "MIG-sim-<node>-<gpu index>-<profile>@<start>" (no
// ids, no placement size), since simulated GPUs have no instances.
Result<MigInstanceInfo> FindMigInstance(const AssignedGpu& g, const Inventory& inv, const std::string& node);

// The nvidia-caps device nodes a container needs to use a MIG instance, from the text of
// /proc/driver/nvidia-caps/mig-minors (lines "<name> <minor>", e.g. "gpu0/gi1/access 12" and
// "gpu0/gi1/ci0/access 13"): "/dev/nvidia-caps/nvidia-cap<minor>" for the GPU instance's access
// and then the compute instance's. `gpu_minor` is the GPU's /dev/nvidia<minor> number
// (GpuInfo::minor_number). NotFound names a missing entry; InvalidArgument a bad minor.
Result<std::vector<std::string>> MigCapDevices(std::string_view mig_minors, int gpu_minor,
                                               int gpu_instance_id, int compute_instance_id);

// MigCapDevices for every GPU of a mig task on real GPUs (empty for other isolations and for
// simulated inventories). Agent::StartTask adds them to a container task's device list.
Result<std::vector<std::string>> TaskMigCapDevices(const Assignment& a, const Inventory& inv,
                                                   std::string_view mig_minors);

// NCCL_P2P_LEVEL for a set of GPUs of the node: NVL when every pair has NVLink, else the PCIe
// level that connects the farthest pair (PIX, PXB, PHB, SYS); empty for fewer than two GPUs.
std::string NcclP2pLevel(const Inventory& inv, const std::vector<int>& gpus);

// A container image's configuration under the task's own. The image's entrypoint and cmd run when
// the task has no command (a command replaces both, as a pod's `command` does); its working
// directory when the task names none; its environment only where nothing else set a variable,
// except PATH and HOME, whose defaults give way to the image's unless the job's `env` sets them
// (gpupool's variables and the job's own always win: they enforce the allocation).
void ApplyImageConfig(const ImageConfig& image, const std::map<std::string, std::string>& job_env, LaunchSpec* spec);

}  // namespace gpupool
