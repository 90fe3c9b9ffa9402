#include "agent/task_env.h"

#include "agent/cdi.h"
#include "agent/container_preload.h"

#include "api/jobspec.h"
#include "common/image_source.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>

#include "common/quantity.h"

namespace gpupool {

using nlohmann::json;

std::string Assignment::task_id() const {
  return fmt::format("{}.{}", job_id, index);
}

std::string Assignment::run_id() const {
  return restarts > 0 ? fmt::format("{}.{}.r{}", job_id, index, restarts) : task_id();
}

namespace {

Status Bad(const std::string& where, const std::string& what) {
  return Status::InvalidArgument(fmt::format("{}: {}", where, what));
}

Result<std::string> Str(const json& o, const char* key, const std::string& where, bool required) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) {
    if (required) return Bad(where + "." + key, "missing");
    return std::string();
  }
  if (!it->is_string()) return Bad(where + "." + key, "must be a string");
  return it->get<std::string>();
}

Result<int64_t> Int(const json& o, const char* key, const std::string& where, bool required) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) {
    if (required) return Bad(where + "." + key, "missing");
    return int64_t{0};
  }
  if (!it->is_number_integer()) return Bad(where + "." + key, "must be an integer");
  return it->get<int64_t>();
}

Result<int64_t> MemoryBytes(const json& o, const char* key, const std::string& where) {
  ASSIGN_OR_RETURN(std::string text, Str(o, key, where, false));
  if (text.empty()) return int64_t{0};
  auto m = ParseMemory(text);
  if (!m.ok()) return Bad(where + "." + key, m.status().message());
  return m->units() * 1024 * 1024;
}

Result<Assignment> ParseOne(const json& a, const std::string& where) {
  if (!a.is_object()) return Bad(where, "must be an object");
  Assignment out;
  ASSIGN_OR_RETURN(out.job_id, Str(a, "jobId", where, true));
  ASSIGN_OR_RETURN(int64_t index, Int(a, "index", where, true));
  out.index = static_cast<int>(index);
  ASSIGN_OR_RETURN(out.desired, Str(a, "desired", where, true));
  if (out.desired != "run" && out.desired != "stop") return Bad(where + ".desired", "must be run or stop");
  // Job ids are server-made; they name directories here, so refuse anything but [A-Za-z0-9_-].
  if (out.job_id.empty() || out.job_id.size() > 64 ||
      !std::all_of(out.job_id.begin(), out.job_id.end(),
                   [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; }))
    return Bad(where + ".jobId", "must be 1-64 of [A-Za-z0-9_-]");
  if (out.index < 0) return Bad(where + ".index", "must not be negative");
  ASSIGN_OR_RETURN(int64_t grace, Int(a, "gracePeriodSeconds", where, false));
  if (grace < 0 || grace > 86'400) return Bad(where + ".gracePeriodSeconds", "must be 0..86400");
  if (a.contains("gracePeriodSeconds")) out.grace_period_seconds = static_cast<int>(grace);
  // A stop entry is read whole, as a run entry: its restarts and run id name the run to stop, and
  // its image, bundle, rootfs and runtime class the runtime that runs it. (Read without them, a
  // stop named a task's first run: a restarted agent never found the run it was meant to stop.)

  ASSIGN_OR_RETURN(out.name, Str(a, "name", where, false));
  ASSIGN_OR_RETURN(out.tenant, Str(a, "tenant", where, false));
  ASSIGN_OR_RETURN(out.qos, Str(a, "qos", where, false));
  ASSIGN_OR_RETURN(out.isolation, Str(a, "isolation", where, false));
  if (out.isolation.empty()) out.isolation = "exclusive";
  ASSIGN_OR_RETURN(const std::string framework, Str(a, "framework", where, false));
  if (!framework.empty()) {
    Result<Framework> parsed = ParseFramework(framework);
    if (!parsed.ok()) return Bad(where + ".framework", parsed.status().message());
    out.framework = *parsed;
  }
  ASSIGN_OR_RETURN(out.bundle, Str(a, "bundle", where, false));
  ASSIGN_OR_RETURN(out.rootfs, Str(a, "rootfs", where, false));
  ASSIGN_OR_RETURN(out.image, Str(a, "image", where, false));
  if (!out.image.empty()) {
    // Checked as the server checked it: it reaches skopeo's command line.
    if (auto source = ParseImageSource(out.image); !source.ok()) return Bad(where + ".image", source.status().message());
    if (!out.bundle.empty() || !out.rootfs.empty()) return Bad(where + ".image", "goes with neither bundle nor rootfs");
  }
  ASSIGN_OR_RETURN(out.runtime_class, Str(a, "runtimeClass", where, false));
  if (!out.runtime_class.empty() && out.runtime_class != "runc" && out.runtime_class != "crun" &&
      out.runtime_class != "runsc" && out.runtime_class != "kata")
    return Bad(where + ".runtimeClass", "must be runc, crun, runsc or kata");
  ASSIGN_OR_RETURN(out.network, Str(a, "network", where, false));
  if (out.network.empty()) out.network = "none";
  if (out.network != "none" && out.network != "host" && out.network != "pod")
    return Bad(where + ".network", "must be none, pod or host");
  if (out.network != "none" && out.bundle.empty() && out.rootfs.empty() && out.image.empty())
    return Bad(where + ".network", "is for containers (bundle, rootfs or image) only");
  ASSIGN_OR_RETURN(out.working_dir, Str(a, "workingDir", where, false));
  if (!out.working_dir.empty() && (out.working_dir.front() != '/' || out.working_dir.size() > 4096 ||
                                   out.working_dir.find('\0') != std::string::npos))
    return Bad(where + ".workingDir", "must be an absolute path of at most 4096 bytes");
  // Who the task runs as. A server from before the sandbox sends nothing: nobody, never root.
  if (auto r = a.find("runAs"); r != a.end() && !r->is_null()) {
    if (!r->is_object()) return Bad(where + ".runAs", "must be an object");
    if (auto root = r->find("root"); root != r->end() && root->is_boolean() && root->get<bool>()) {
      out.run_as_root = true;
    } else {
      ASSIGN_OR_RETURN(out.uid, Int(*r, "uid", where + ".runAs", true));
      ASSIGN_OR_RETURN(out.gid, Int(*r, "gid", where + ".runAs", true));
      if (out.uid <= 0 || out.uid > 4294967294 || out.gid <= 0 || out.gid > 4294967294)
        return Bad(where + ".runAs", "uid and gid must be in [1, 2^32-2] (root is {\"root\": true})");
    }
  }
  if (auto r = a.find("rendezvous"); r != a.end() && !r->is_null()) {
    const std::string rw = where + ".rendezvous";
    if (!r->is_object()) return Bad(rw, "must be an object");
    Assignment::Rendezvous z;
    ASSIGN_OR_RETURN(z.master_addr, Str(*r, "masterAddr", rw, true));
    // An address lands in other programs' command lines and files: a host name or an IP literal.
    if (z.master_addr.empty() || z.master_addr.size() > 253 ||
        z.master_addr.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-:[]") !=
            std::string::npos)
      return Bad(rw + ".masterAddr", "must be a host name or an IP address");
    int64_t v = 0;
    ASSIGN_OR_RETURN(v, Int(*r, "masterPort", rw, true));
    if (v < 1 || v > 65535) return Bad(rw + ".masterPort", "must be 1..65535");
    z.master_port = static_cast<int>(v);
    const std::pair<const char*, int*> ints[] = {{"worldSize", &z.world_size}, {"rank", &z.rank},
                                                 {"localRank", &z.local_rank}, {"localWorldSize", &z.local_world_size},
                                                 {"nodeRank", &z.node_rank}, {"nodes", &z.nodes}};
    for (const auto& [key, out_int] : ints) {
      ASSIGN_OR_RETURN(v, Int(*r, key, rw, true));
      if (v < 0 || v > 1000000) return Bad(rw + "." + key, "must be 0..1000000");
      *out_int = static_cast<int>(v);
    }
    if (z.world_size < 1 || z.rank >= z.world_size || z.local_rank >= std::max(1, z.local_world_size) ||
        z.node_rank >= std::max(1, z.nodes))
      return Bad(rw, "ranks must lie below their sizes");
    if (auto h = r->find("hosts"); h != r->end() && !h->is_null()) {
      if (!h->is_array() || h->size() > 100000) return Bad(rw + ".hosts", "must be a list of \"addr:tasks\"");
      for (const auto& e : *h) {
        if (!e.is_string() || e.get<std::string>().size() > 300 ||
            e.get<std::string>().find_first_of(",\n\r \t") != std::string::npos)
          return Bad(rw + ".hosts", "must be a list of \"addr:tasks\"");
        z.hosts.push_back(e.get<std::string>());
      }
    }
    out.rendezvous = std::move(z);
  }
  ASSIGN_OR_RETURN(int64_t restarts, Int(a, "restarts", where, false));
  if (restarts < 0 || restarts > 1'000'000'000) return Bad(where + ".restarts", "must be 0..1000000000");
  out.restarts = static_cast<int>(restarts);
  ASSIGN_OR_RETURN(out.placement_run, Str(a, "runId", where, false));
  if (out.placement_run.size() > 64 ||
      out.placement_run.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") != std::string::npos)
    return Bad(where + ".runId", "must be at most 64 of a-z, 0-9 and -");
  if (auto c = a.find("command"); c != a.end() && !c->is_null()) {
    if (!c->is_array()) return Bad(where + ".command", "must be a list of strings");
    for (size_t i = 0; i < c->size(); ++i) {
      if (!(*c)[i].is_string()) return Bad(fmt::format("{}.command[{}]", where, i), "must be a string");
      out.command.push_back((*c)[i].get<std::string>());
    }
  }
  if (auto e = a.find("env"); e != a.end() && !e->is_null()) {
    if (!e->is_object()) return Bad(where + ".env", "must be a map of strings");
    for (auto it = e->begin(); it != e->end(); ++it) {
      if (!it.value().is_string()) return Bad(where + ".env." + it.key(), "must be a string");
      out.env[it.key()] = it.value().get<std::string>();
    }
  }
  if (auto c = a.find("checkpoint"); c != a.end() && c->is_object()) {
    ASSIGN_OR_RETURN(out.checkpoint_dir, Str(*c, "dir", where + ".checkpoint", false));
    ASSIGN_OR_RETURN(int64_t interval, Int(*c, "intervalSeconds", where + ".checkpoint", false));
    out.checkpoint_interval_seconds = static_cast<int>(interval);
  }
  if (auto v = a.find("volumes"); v != a.end() && !v->is_null()) {
    // The job spec's own reading: bounded, normalised paths, containers only, none over the
    // checkpoint directory. Where a host path may come from is the agent's to say (SandboxTask).
    TaskExec exec;
    exec.image = out.image;
    exec.bundle = out.bundle;
    exec.rootfs = out.rootfs;
    exec.checkpoint.dir = out.checkpoint_dir;
    auto volumes = ParseVolumes(*v, where + ".volumes", exec);
    if (!volumes.ok()) return volumes.status();
    out.volumes = std::move(volumes).value();
  }
  ASSIGN_OR_RETURN(std::string cpu, Str(a, "cpu", where, false));
  if (!cpu.empty()) {
    auto c = ParseCpu(cpu);
    if (!c.ok()) return Bad(where + ".cpu", c.status().message());
    out.cpu_milli = c->units();
  }
  ASSIGN_OR_RETURN(out.memory_bytes, MemoryBytes(a, "memory", where));
  if (auto g = a.find("gpus"); g != a.end() && !g->is_null()) {
    if (!g->is_array()) return Bad(where + ".gpus", "must be a list");
    for (size_t i = 0; i < g->size(); ++i) {
      const std::string gw = fmt::format("{}.gpus[{}]", where, i);
      const json& gj = (*g)[i];
      if (!gj.is_object()) return Bad(gw, "must be an object");
      AssignedGpu gpu;
      ASSIGN_OR_RETURN(int64_t gi, Int(gj, "index", gw, true));
      gpu.index = static_cast<int>(gi);
      ASSIGN_OR_RETURN(gpu.uuid, Str(gj, "uuid", gw, false));
      ASSIGN_OR_RETURN(gpu.share_milli, Int(gj, "share", gw, true));
      if (gpu.share_milli < 0 || gpu.share_milli > 1000) return Bad(gw + ".share", "must be 0..1000");
      ASSIGN_OR_RETURN(gpu.memory_bytes, MemoryBytes(gj, "memory", gw));
      if (auto m = gj.find("mig"); m != gj.end() && m->is_object()) {
        ASSIGN_OR_RETURN(gpu.mig_profile, Str(*m, "profile", gw + ".mig", false));
        if (m->contains("profileId")) {
          ASSIGN_OR_RETURN(int64_t profile_id, Int(*m, "profileId", gw + ".mig", false));
          gpu.mig_profile_id = static_cast<int>(profile_id);
        }
        if (m->contains("start")) {
          ASSIGN_OR_RETURN(int64_t start, Int(*m, "start", gw + ".mig", false));
          gpu.mig_start = static_cast<int>(start);
        }
      }
      out.gpus.push_back(std::move(gpu));
    }
  }
  return out;
}

bool Reserved(const std::string& name) {
  return name.rfind("GPUPOOL_", 0) == 0 || name.rfind("CUDA_MPS_", 0) == 0 ||
         name == "CUDA_VISIBLE_DEVICES" || name == "NVIDIA_VISIBLE_DEVICES";
}

std::string Join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

// How an assignment or an instance names its profile in messages and synthetic UUIDs.
std::string ProfileLabel(const std::string& name, int id) {
  if (!name.empty()) return name;
  return id >= 0 ? fmt::format("profile-{}", id) : std::string("?");
}

bool SameProfile(const AssignedGpu& g, const MigInstanceInfo& inst) {
  if (g.mig_profile_id >= 0 && inst.profile_id >= 0) return g.mig_profile_id == inst.profile_id;
  return !g.mig_profile.empty() && g.mig_profile == inst.profile;
}

// Fixed decimals without trailing zeros: "0.25", "0.5", "1".
std::string Decimal(double v) {
  std::string s = fmt::format("{:.4f}", v);
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

// A fractional task's allocator advice for its framework: grow on demand instead of taking the
// whole device, and the fraction it was granted (JAX reads its own; PyTorch code can pass
// GPUPOOL_GPU_MEMORY_FRACTION to torch.cuda.set_per_process_memory_fraction). Advice only: the
// CUDA limiter and MPS hold the memory. kAuto, a task that names no framework: all of it.
void FrameworkAdvice(Framework framework, const std::string& fraction,
                     std::map<std::string, std::string>* env) {
  if (framework == Framework::kNone) return;
  const bool all = framework == Framework::kAuto;
  (*env)["GPUPOOL_GPU_MEMORY_FRACTION"] = fraction;
  if (all || framework == Framework::kPyTorch)
    (*env)["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True,garbage_collection_threshold:0.8";
  if (all || framework == Framework::kTensorFlow) (*env)["TF_FORCE_GPU_ALLOW_GROWTH"] = "true";
  // Stream-ordered cudaMallocAsync instead of TensorFlow's own BFC pool: frees go back to CUDA.
  // Only for a task that says it runs TensorFlow, so auto stays what it was.
  if (framework == Framework::kTensorFlow) (*env)["TF_GPU_ALLOCATOR"] = "cuda_malloc_async";
  if (all || framework == Framework::kJax) {
    (*env)["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false";
    (*env)["XLA_PYTHON_CLIENT_MEM_FRACTION"] = fraction;
  }
}

}  // namespace

Result<std::vector<Assignment>> ParseAssignments(const json& body) {
  if (!body.is_object() || !body.contains("assignments") || !body["assignments"].is_array())
    return Status::InvalidArgument("assignments: the answer must be an object with an 'assignments' list");
  std::vector<Assignment> out;
  const json& list = body["assignments"];
  for (size_t i = 0; i < list.size(); ++i) {
    ASSIGN_OR_RETURN(Assignment a, ParseOne(list[i], fmt::format("assignments[{}]", i)));
    out.push_back(std::move(a));
  }
  return out;
}

std::string MpiHostfile(const Assignment::Rendezvous& z) {
  std::string out;
  for (const std::string& h : z.hosts) {
    // "addr:tasks"; the address may hold ':' itself (IPv6).
    const size_t colon = h.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == h.size() ||
        h.find_first_not_of("0123456789", colon + 1) != std::string::npos)
      continue;
    out += fmt::format("{} slots={}\n", h.substr(0, colon), h.substr(colon + 1));
  }
  return out;
}

Result<MigInstanceInfo> FindMigInstance(const AssignedGpu& g, const Inventory& inv, const std::string& node) {
  if (g.index < 0 || static_cast<size_t>(g.index) >= inv.gpus.size())
    return Status::InvalidArgument(
        fmt::format("gpus: GPU {} is not on this node ({} GPUs)", g.index, inv.gpus.size()));
  const GpuInfo& info = inv.gpus[static_cast<size_t>(g.index)];
  if ((g.mig_profile.empty() && g.mig_profile_id < 0) || g.mig_start < 0) {
    return Status::InvalidArgument(
        fmt::format("gpus: GPU {}: isolation mig needs the instance's MIG profile and start slice", g.index));
  }
  const std::string wanted = ProfileLabel(g.mig_profile, g.mig_profile_id);
  if (inv.simulated) {
    MigInstanceInfo sim;
    sim.uuid = fmt::format("MIG-sim-{}-{}-{}@{}", node, g.index, wanted, g.mig_start);
    sim.profile_id = g.mig_profile_id;
    sim.profile = g.mig_profile;
    sim.start = g.mig_start;
    return sim;
  }
  if (!info.mig_enabled) {
    return Status::FailedPrecondition(
        fmt::format("GPU {} ({}) is not in MIG mode; gpupool does not enable MIG", g.index, info.uuid));
  }
  const MigInstanceInfo* best = nullptr;
  for (const MigInstanceInfo& inst : info.mig_instances) {
    if (inst.start != g.mig_start || !SameProfile(g, inst)) continue;
    if (best == nullptr || inst.compute_instance_id < best->compute_instance_id) best = &inst;
  }
  if (best != nullptr) return *best;
  std::vector<std::string> existing;
  for (const MigInstanceInfo& inst : info.mig_instances) {
    existing.push_back(inst.start >= 0
                           ? fmt::format("{}@{}", ProfileLabel(inst.profile, inst.profile_id), inst.start)
                           : fmt::format("{} (GPU instance not readable)", inst.uuid));
  }
  return Status::FailedPrecondition(fmt::format(
      "GPU {} ({}) has no MIG instance of profile {} at slice {} (existing: {}); the agent creates missing "
      "instances only when a task starts",
      g.index, info.uuid, wanted, g.mig_start,
      existing.empty() ? std::string("none") : Join(existing, ", ")));
}

Result<std::vector<std::string>> MigCapDevices(std::string_view mig_minors, int gpu_minor,
                                               int gpu_instance_id, int compute_instance_id) {
  if (gpu_minor < 0 || gpu_instance_id < 0 || compute_instance_id < 0) {
    return Status::InvalidArgument(
        fmt::format("MIG caps: unknown GPU minor ({}), GPU instance ({}) or compute instance ({})", gpu_minor,
                    gpu_instance_id, compute_instance_id));
  }
  const std::string gi_name = fmt::format("gpu{}/gi{}/access", gpu_minor, gpu_instance_id);
  const std::string ci_name =
      fmt::format("gpu{}/gi{}/ci{}/access", gpu_minor, gpu_instance_id, compute_instance_id);
  std::vector<std::string> out;
  for (const std::string& wanted : {gi_name, ci_name}) {
    ASSIGN_OR_RETURN(const int minor, MigCapMinor(mig_minors, wanted));
    out.push_back(fmt::format("/dev/nvidia-caps/nvidia-cap{}", minor));
  }
  return out;
}

Result<std::vector<std::string>> TaskMigCapDevices(const Assignment& a, const Inventory& inv,
                                                   std::string_view mig_minors) {
  std::vector<std::string> out;
  if (a.isolation != "mig" || inv.simulated) return out;
  for (const AssignedGpu& g : a.gpus) {
    ASSIGN_OR_RETURN(const MigInstanceInfo inst, FindMigInstance(g, inv, ""));
    const GpuInfo& info = inv.gpus[static_cast<size_t>(g.index)];
    ASSIGN_OR_RETURN(
        std::vector<std::string> caps,
        MigCapDevices(mig_minors, info.minor_number, inst.gpu_instance_id, inst.compute_instance_id));
    for (std::string& c : caps) {
      if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(std::move(c));
    }
  }
  return out;
}

std::string NcclP2pLevel(const Inventory& inv, const std::vector<int>& gpus) {
  if (gpus.size() < 2) return "";
  const auto& t = inv.topology;
  int worst = 1000;
  bool all_nvlink = true;
  for (size_t i = 0; i < gpus.size(); ++i) {
    for (size_t j = i + 1; j < gpus.size(); ++j) {
      const size_t a = static_cast<size_t>(gpus[i]), b = static_cast<size_t>(gpus[j]);
      const int score = (a < t.size() && b < t[a].size()) ? t[a][b] : 10;
      if (score < 100) all_nvlink = false;
      worst = std::min(worst, score % 100);
    }
  }
  if (all_nvlink) return "NVL";
  // PCIe level scores of model/topology.h: 60 board, 50 one switch, 40 several switches, 30 host
  // bridge, 20 same NUMA node, 10 across sockets.
  if (worst >= 50) return "PIX";
  if (worst >= 40) return "PXB";
  if (worst >= 30) return "PHB";
  return "SYS";
}

Result<std::map<std::string, std::string>> TaskEnvironment(const Assignment& a, const Inventory& inv,
                                                           const TaskEnvOptions& options) {
  std::map<std::string, std::string> env;
  env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  env["HOME"] = "/tmp";
  env["GPUPOOL_JOB_ID"] = a.job_id;
  env["GPUPOOL_TASK_INDEX"] = std::to_string(a.index);
  env["GPUPOOL_TASK_NAME"] = a.name;
  env["GPUPOOL_TENANT"] = a.tenant;
  env["GPUPOOL_QOS"] = a.qos;
  env["GPUPOOL_NODE"] = options.node;
  env["GPUPOOL_ISOLATION"] = a.isolation;
  env["GPUPOOL_RESTARTS"] = std::to_string(a.restarts);
  env["GPUPOOL_CPU_MILLI"] = std::to_string(a.cpu_milli);
  env["GPUPOOL_MEMORY_BYTES"] = std::to_string(a.memory_bytes);
  if (inv.simulated) env["GPUPOOL_SIMULATED"] = "1";
  if (a.rendezvous) {
    const Assignment::Rendezvous& z = *a.rendezvous;
    env["MASTER_ADDR"] = z.master_addr;
    env["MASTER_PORT"] = std::to_string(z.master_port);
    env["WORLD_SIZE"] = std::to_string(z.world_size);
    env["RANK"] = std::to_string(z.rank);
    env["LOCAL_RANK"] = std::to_string(z.local_rank);
    env["LOCAL_WORLD_SIZE"] = std::to_string(z.local_world_size);
    env["NODE_RANK"] = std::to_string(z.node_rank);
    env["GROUP_RANK"] = std::to_string(z.node_rank);
    const bool v6 = z.master_addr.find(':') != std::string::npos && z.master_addr[0] != '[';
    env["JAX_COORDINATOR_ADDRESS"] =
        fmt::format("{}:{}", v6 ? "[" + z.master_addr + "]" : z.master_addr, z.master_port);
    env["JAX_NUM_PROCESSES"] = std::to_string(z.world_size);
    env["JAX_PROCESS_ID"] = std::to_string(z.rank);
    env["GPUPOOL_NNODES"] = std::to_string(z.nodes);
    env["GPUPOOL_HOSTS"] = fmt::format("{}", fmt::join(z.hosts, ","));
  }
  if (!a.checkpoint_dir.empty()) {
    env["GPUPOOL_CHECKPOINT_DIR"] = a.checkpoint_dir;
    env["GPUPOOL_CHECKPOINT_INTERVAL_SECONDS"] = std::to_string(a.checkpoint_interval_seconds);
  }

  std::vector<std::string> uuids, indices, shares, memories;
  std::vector<int> gpu_indices;
  int64_t min_share = 1000;
  double min_fraction = 1.0;
  for (const AssignedGpu& g : a.gpus) {
    if (g.index < 0 || static_cast<size_t>(g.index) >= inv.gpus.size())
      return Status::InvalidArgument(fmt::format("gpus: GPU {} is not on this node ({} GPUs)", g.index,
                                                 inv.gpus.size()));
    const GpuInfo& info = inv.gpus[static_cast<size_t>(g.index)];
    if (!g.uuid.empty() && g.uuid != info.uuid)
      return Status::InvalidArgument(
          fmt::format("gpus: GPU {} is {} here, the server says {}", g.index, info.uuid, g.uuid));
    uuids.push_back(info.uuid);
    indices.push_back(std::to_string(g.index));
    shares.push_back(std::to_string(g.share_milli));
    memories.push_back(std::to_string(g.memory_bytes));
    gpu_indices.push_back(g.index);
    min_share = std::min(min_share, g.share_milli);
    if (g.memory_bytes > 0 && info.memory_bytes > 0)
      min_fraction = std::min(min_fraction, static_cast<double>(g.memory_bytes) / static_cast<double>(info.memory_bytes));
  }
  if (a.gpus.empty()) {
    // No GPU granted: the task must not see any.
    env["CUDA_VISIBLE_DEVICES"] = "";
    env["NVIDIA_VISIBLE_DEVICES"] = "void";
  } else {
    env["GPUPOOL_GPU_UUIDS"] = Join(uuids, ",");
    env["GPUPOOL_GPU_INDICES"] = Join(indices, ",");
    env["GPUPOOL_GPU_SHARES_MILLI"] = Join(shares, ",");
    env["GPUPOOL_GPU_MEMORY_BYTES"] = Join(memories, ",");
    std::string visible = Join(uuids, ",");
    if (a.isolation == "mig") {
      // CUDA addresses a MIG instance by its own UUID: the task sees exactly its instances.
      std::vector<std::string> mig, instance_uuids;
      for (const AssignedGpu& g : a.gpus) {
        ASSIGN_OR_RETURN(const MigInstanceInfo inst, FindMigInstance(g, inv, options.node));
        mig.push_back(fmt::format("{}:{}@{}:{}", inv.gpus[static_cast<size_t>(g.index)].uuid,
                                  ProfileLabel(g.mig_profile, g.mig_profile_id), g.mig_start, inst.uuid));
        instance_uuids.push_back(inst.uuid);
      }
      env["GPUPOOL_MIG_INSTANCES"] = Join(mig, ",");
      visible = Join(instance_uuids, ",");
    }
    env["CUDA_VISIBLE_DEVICES"] = visible;
    env["NVIDIA_VISIBLE_DEVICES"] = visible;
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID";
    const bool fractional = min_share < 1000 || min_fraction < 1.0;
    if (a.isolation == "mps") {
      // The same figures the agent has the MPS control daemons hold the task's server to.
      const MpsTaskLimits mps = TaskMpsLimits(a);
      env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = std::to_string(mps.active_thread_percentage);
      std::vector<std::string> limits;
      for (size_t i = 0; i < mps.pinned_mem_mib.size(); ++i) {
        if (mps.pinned_mem_mib[i] > 0) limits.push_back(fmt::format("{}={}M", i, mps.pinned_mem_mib[i]));
      }
      if (!limits.empty()) env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = Join(limits, ",");
      if (!options.mps_pipe_root.empty()) {
        const std::string dir = options.mps_pipe_root + "/" + inv.gpus[static_cast<size_t>(a.gpus[0].index)].uuid;
        env["CUDA_MPS_PIPE_DIRECTORY"] = dir + "/pipe";
        env["CUDA_MPS_LOG_DIRECTORY"] = dir + "/log";
      }
    }
    if (fractional) FrameworkAdvice(a.framework, Decimal(min_fraction), &env);
    if (a.gpus.size() > 1) {
      env["NCCL_P2P_LEVEL"] = NcclP2pLevel(inv, gpu_indices);
      env["GPUPOOL_NVLINK"] = env["NCCL_P2P_LEVEL"] == "NVL" ? "1" : "0";
    }
  }
  for (const auto& [k, v] : a.env) {
    if (Reserved(k))
      return Status::InvalidArgument(
          fmt::format("env.{}: set by gpupool to enforce the allocation; a job may not set it", k));
    env[k] = v;
  }
  // A time-sliced share has nothing else holding it to its memory and compute: the CUDA limiter
  // (docs/cuda_limiter.md) goes first in LD_PRELOAD, before whatever the job preloads itself. In a
  // container it is the runtime's bind of the library (and /etc/ld.so.preload names it as well).
  if (TaskGetsCudaLimiter(a, options)) {
    const bool container = !a.bundle.empty() || !a.rootfs.empty() || !a.image.empty();
    const std::string lib = container ? std::string(agent_internal::kContainerCudaLimiterPath) : options.cuda_limiter;
    const auto mine = env.find("LD_PRELOAD");
    env["LD_PRELOAD"] = lib + (mine == env.end() || mine->second.empty() ? "" : ":" + mine->second);
  }
  return env;
}

bool TaskGetsCudaLimiter(const Assignment& a, const TaskEnvOptions& options) {
  const bool container = !a.bundle.empty() || !a.rootfs.empty() || !a.image.empty();
  return !options.cuda_limiter.empty() && (!container || options.cuda_limiter_containers) &&
         a.isolation == "timeslice" && !a.gpus.empty() &&
         std::any_of(a.gpus.begin(), a.gpus.end(), [](const AssignedGpu& g) { return g.share_milli < 1000; });
}

MpsTaskLimits TaskMpsLimits(const Assignment& a) {
  MpsTaskLimits out;
  int64_t min_share = 1000;
  for (const AssignedGpu& g : a.gpus) {
    min_share = std::min(min_share, g.share_milli);
    out.pinned_mem_mib.push_back(std::max<int64_t>(0, g.memory_bytes / (1024 * 1024)));
  }
  out.active_thread_percentage = static_cast<int>(std::clamp<int64_t>((min_share + 5) / 10, 1, 100));
  return out;
}

void ApplyImageConfig(const ImageConfig& image, const std::map<std::string, std::string>& job_env, LaunchSpec* spec) {
  if (spec->argv.empty()) {
    spec->argv = image.entrypoint;
    spec->argv.insert(spec->argv.end(), image.cmd.begin(), image.cmd.end());
  }
  if (spec->workdir.empty()) spec->workdir = image.working_dir;
  for (const std::string& kv : image.env) {
    const size_t eq = kv.find('=');
    if (eq == 0 || eq == std::string::npos) continue;  // the cache took only well-formed ones
    const std::string key = kv.substr(0, eq);
    const bool is_default = (key == "PATH" || key == "HOME") && job_env.count(key) == 0;
    if (is_default || spec->env.count(key) == 0) spec->env[key] = kv.substr(eq + 1);
  }
}

}  // namespace gpupool
