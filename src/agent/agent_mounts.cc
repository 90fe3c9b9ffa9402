// The task's sandbox (SandboxTask: identity, hidden paths, devices, checkpoint directory, network)
// and what it gets mounted besides its root: its volumes (docs/jobspec.md#volumes), the MPI
// hostfile of a job of several tasks, and, in a container, its GPUs through the Container Device
// Interface (docs/agent.md#gpus-in-containers): the agent reads the nvidia.com/gpu CDI specs NVIDIA's container toolkit left on the node, or
// generates one from NVML's inventory and the driver's files, and gives a container task what the
// spec says its GPUs need: their device nodes, the driver's libraries and binaries, hooks, env.
#include <fcntl.h>
#include <sys/stat.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <set>

#include "agent/agent.h"
#include "agent/runtime_internal.h"
#include "agent/scratch_disk.h"

namespace gpupool {

namespace {

constexpr const char* kGpuKind = "nvidia.com/gpu";

// Writes `name` afresh in `dir` (a directory the task's uid owns: a link or file it left there is
// removed, never followed), mode 0444.
Status WriteNewFileIn(const std::string& dir, const std::string& name, const std::string& content) {
  const int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (d < 0) return Status::IoError(fmt::format("cannot open {}: {}", dir, agent_internal::ErrnoText(errno)));
  (void)::unlinkat(d, name.c_str(), 0);
  const int f = ::openat(d, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444);
  const int err = errno;
  ::close(d);
  if (f < 0) return Status::IoError(fmt::format("cannot create {}/{}: {}", dir, name, agent_internal::ErrnoText(err)));
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(f, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int werr = errno;
      ::close(f);
      return Status::IoError(fmt::format("cannot write {}/{}: {}", dir, name, agent_internal::ErrnoText(werr)));
    }
    done += static_cast<size_t>(n);
  }
  ::close(f);
  return Status::Ok();
}

}  // namespace

std::vector<CdiSpec> Agent::CdiSpecs() {
  std::lock_guard<std::mutex> lock(mu_);
  return cdi_specs_;
}

std::string Agent::DriverRoot() const { return options_.driver_root.empty() ? "/" : options_.driver_root; }

std::string Agent::MigMinorsText() const {
  const std::string root = DriverRoot();
  auto text = agent_internal::ReadFile((root == "/" ? "" : root) + "/proc/driver/nvidia-caps/mig-minors");
  return text.ok() && text->size() <= (1 << 20) ? *text : std::string();
}

void Agent::LoadCdi() {
  if (inventory_.simulated) return;  // no device nodes, no driver: nothing to give
  std::vector<std::string> warnings;
  auto specs = LoadCdiSpecs(options_.cdi_spec_dirs, &warnings);
  for (const auto& w : warnings) std::cerr << fmt::format("gpupool agent {}: CDI: {}\n", options_.node, w);
  if (!specs.ok()) {
    std::cerr << fmt::format("gpupool agent {}: CDI: {}\n", options_.node, specs.status().ToString());
  } else {
    std::vector<std::string> sources;
    for (CdiSpec& s : *specs) {
      if (s.kind != kGpuKind) continue;
      sources.push_back(s.source);
      cdi_specs_.push_back(std::move(s));
    }
    if (!cdi_specs_.empty()) {
      cdi_note_ = fmt::format("GPUs in containers as the CDI spec(s) {} say", fmt::join(sources, ", "));
      return;
    }
  }
  // None from the toolkit: one generated from what NVML found and the driver's files on disk.
  const std::string root = DriverRoot();
  const DriverFiles files = FindDriverFiles(root);
  CdiSpec spec = GenerateNvidiaCdiSpec(inventory_, files, root, MigMinorsText());
  const std::string path = options_.state_dir + "/cdi/nvidia.com-gpu.json";
  if (Status st = agent_internal::MakeDirs(options_.state_dir + "/cdi"); st.ok()) {
    (void)agent_internal::WriteFileAtomic(path, CdiSpecToJson(spec).dump(2) + "\n", /*sync=*/false);
  }
  if (spec.devices.empty()) {
    cdi_note_ = "no GPU device nodes known to NVML: containers get no GPUs";
    return;
  }
  cdi_note_ = fmt::format("GPUs in containers by a CDI spec generated from NVML and the driver under {} ({} "
                          "libraries, {} binaries{}; {})",
                          root, files.libraries.size(), files.binaries.size(),
                          files.libraries.empty() ? ": no driver libraries found, images must carry them" : "", path);
  cdi_specs_.push_back(std::move(spec));
}

// REQUIRES: mu_ held; a container task of a node with GPUs from NVML.
Status Agent::ApplyCdi(const Assignment& a, LaunchSpec* spec) {
  if (cdi_specs_.empty() || a.gpus.empty()) return Status::Ok();
  // A device by its UUID where a spec names it so, else by its index: `nvidia-ctk cdi generate`
  // names devices by index ("0", and "0:1" for a GPU's second MIG device) unless told otherwise.
  auto provided = [this](const std::string& name) {
    return std::any_of(cdi_specs_.begin(), cdi_specs_.end(),
                       [&name](const CdiSpec& s) { return s.devices.count(name) > 0; });
  };
  std::vector<std::string> names;
  for (const AssignedGpu& g : a.gpus) {
    if (g.index < 0 || static_cast<size_t>(g.index) >= inventory_.gpus.size())
      return Status::InvalidArgument(fmt::format("gpus: no GPU {} on node {}", g.index, options_.node));
    const GpuInfo& info = inventory_.gpus[static_cast<size_t>(g.index)];
    std::string uuid = info.uuid, by_index = std::to_string(g.index);
    if (a.isolation == "mig") {
      ASSIGN_OR_RETURN(const MigInstanceInfo inst, FindMigInstance(g, inventory_, options_.node));
      uuid = inst.uuid;
      const auto at = std::find_if(info.mig_instances.begin(), info.mig_instances.end(),
                                   [&inst](const MigInstanceInfo& m) { return m.uuid == inst.uuid; });
      by_index += fmt::format(":{}", at - info.mig_instances.begin());
    }
    names.push_back(!provided(uuid) && provided(by_index) ? by_index : uuid);
  }
  auto edits = ResolveCdiDevices(cdi_specs_, kGpuKind, names);
  if (!edits.ok()) return edits.status().WithContext("CDI");
  // The spec's device nodes replace the agent's own list (they hold the control nodes too).
  spec->devices.clear();
  for (const CdiDeviceNode& d : edits->device_nodes)
    spec->container_devices.push_back({d.host_path.empty() ? d.path : d.host_path, d.path});
  bool generated = false;
  for (const CdiSpec& s : cdi_specs_) generated = generated || s.source == "generated";
  std::set<std::string> library_dirs, binary_dirs;
  for (const CdiMount& m : edits->mounts) {
    spec->mounts.push_back({m.host_path, m.container_path, m.type, m.options});
    const size_t slash = m.container_path.rfind('/');
    const std::string dir = m.container_path.substr(0, std::max<size_t>(slash, 1));
    if (!generated) continue;
    if (m.container_path.compare(slash + 1, 3, "lib") == 0) {
      library_dirs.insert(dir);
    } else if (m.container_path.compare(slash + 1, 6, "nvidia") == 0) {
      binary_dirs.insert(dir);
    }
  }
  for (const CdiHook& h : edits->hooks)
    spec->hooks.push_back({h.hook_name, h.path, h.args, h.env, h.timeout});
  // The spec's environment under the task's: CUDA_VISIBLE_DEVICES and the rest stay gpupool's.
  for (const std::string& kv : edits->env) {
    const size_t eq = kv.find('=');
    spec->env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  if (!library_dirs.empty()) {
    // Mounted at the host's paths: an image whose loader searches elsewhere finds them here.
    std::string& path = spec->env["LD_LIBRARY_PATH"];
    for (const std::string& dir : library_dirs) path += (path.empty() ? "" : ":") + dir;
  }
  if (!binary_dirs.empty()) {
    // nvidia-smi and the rest where the image's PATH does not look.
    auto [it, added] = spec->env.emplace("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    std::string& path = it->second;
    for (const std::string& dir : binary_dirs) {
      if ((":" + path + ":").find(":" + dir + ":") == std::string::npos) path += (path.empty() ? "" : ":") + dir;
    }
  }
  return Status::Ok();
}

int64_t Agent::TaskUid(const Assignment& a) const {
  if (!sandbox_) return ::geteuid();
  return a.run_as_root ? 0 : a.uid;
}

// The task's volumes (docs/jobspec.md#volumes): a host directory only from under the admin's
// roots, its links resolved first (a link in an allowed tree pointing out of it is refused), and
// read-only unless both the job and the root say otherwise; scratch made for this run alone.
// REQUIRES: mu_ held.
Status Agent::MountVolumes(const Assignment& a, LaunchSpec* spec) {
  // Whose the run's own directories are: the task's, or the agent's own without the sandbox.
  const int64_t uid = TaskUid(a);
  const int64_t gid = !sandbox_ ? ::getegid() : a.run_as_root ? 0 : a.gid;
  const bool container = !a.bundle.empty() || !a.rootfs.empty() || !a.image.empty();
  if (a.rendezvous && !a.rendezvous->hosts.empty()) {
    // The MPI hostfile of a job of several tasks ("addr slots=N" per node, in node-rank order),
    // read-only in a container.
    const std::string dir = fmt::format("{}/rendezvous", RunScratchDir(a));
    RETURN_IF_ERROR(agent_internal::EnsureOwnedDirUnder({options_.scratch_root}, dir, uid, gid)
                        .WithContext("the MPI hostfile (the agent's --scratch-root)"));
    RETURN_IF_ERROR(WriteNewFileIn(dir, "hostfile", MpiHostfile(*a.rendezvous)).WithContext("the MPI hostfile"));
    if (container) {
      spec->binds.push_back({dir, "/etc/gpupool", true});
      spec->env["GPUPOOL_HOSTFILE"] = "/etc/gpupool/hostfile";
    } else {
      spec->keep_paths.push_back(dir);
      spec->env["GPUPOOL_HOSTFILE"] = dir + "/hostfile";
    }
  }
  for (size_t i = 0; i < a.volumes.size(); ++i) {
    const Volume& v = a.volumes[i];
    if (v.host_path.empty() && v.memory) {
      spec->tmpfs.push_back({v.mount_path, v.size_bytes});
      continue;
    }
    if (v.host_path.empty()) {
      // Owned by the task's uid, 0700, never through a link; removed with the run (Forget).
      const std::string dir = fmt::format("{}/{}", RunScratchDir(a), i);
      RETURN_IF_ERROR(agent_internal::EnsureOwnedDirUnder({options_.scratch_root}, dir, uid, gid)
                          .WithContext(fmt::format("volume {} (scratch; the agent's --scratch-root)", v.mount_path)));
      if (v.size_bytes > 0) {
        // Its own file system of exactly its size: the task can fill it, never the node's disk.
        if (!sandbox_)
          return Status::FailedPrecondition(fmt::format(
              "volume {}: disk scratch with a sizeLimit needs an agent that runs as root (node {})", v.mount_path,
              options_.node));
        ASSIGN_OR_RETURN(const auto tools, agent_internal::FindScratchDiskTools());
        RETURN_IF_ERROR(agent_internal::MountScratchDisk(tools, fmt::format("{}/{}.img", RunScratchDir(a), i),
                                                         dir, v.size_bytes, uid, gid)
                            .WithContext(fmt::format("volume {} (scratch of {} bytes)", v.mount_path, v.size_bytes)));
      }
      spec->binds.push_back({dir, v.mount_path, false});
      continue;
    }
    std::error_code ec;
    const std::string real = std::filesystem::canonical(v.host_path, ec).string();
    if (ec || !std::filesystem::is_directory(real, ec))
      return Status::InvalidArgument(fmt::format("volume {}: host path {} is not a directory on node {}{}", v.mount_path,
                                                 v.host_path, options_.node, ec ? ": " + ec.message() : ""));
    auto under = [&real](const std::vector<std::string>& roots) {
      return std::any_of(roots.begin(), roots.end(), [&real](const std::string& root) {
        std::error_code rec;
        const std::string r = std::filesystem::canonical(root, rec).string();
        return !rec && (r == "/" || real == r || (real.starts_with(r) && real[r.size()] == '/'));
      });
    };
    const bool writable = under(options_.volume_roots_rw);
    if (!writable && !under(options_.volume_roots))
      return Status::PermissionDenied(fmt::format(
          "volume {}: host path {}{} is not under an allowed volume root of node {} (the agent's --volume-root, "
          "--volume-root-rw)",
          v.mount_path, v.host_path, real == v.host_path ? "" : " (" + real + ")", options_.node));
    if (!v.read_only && !writable)
      return Status::PermissionDenied(fmt::format(
          "volume {}: host path {} may only be mounted read-only on node {} (writable ones lie under the agent's "
          "--volume-root-rw)",
          v.mount_path, v.host_path, options_.node));
    spec->binds.push_back({real, v.mount_path, v.read_only});
  }
  return Status::Ok();
}

// This agent's part of --scratch-root: agents that share one (several on a host, two pools) never
// touch each other's runs, even when run ids coincide.
std::string Agent::ScratchScopeDir() const {
  return options_.scratch_root + "/" + agent_internal::CgroupScope(options_.state_dir);
}
std::string Agent::RunScratchDir(const Assignment& a) const { return ScratchScopeDir() + "/" + a.run_id(); }

// REQUIRES: mu_ held.
void Agent::PruneScratch(const std::vector<std::string>& keep) {
  const std::set<std::string> kept(keep.begin(), keep.end());
  std::error_code ec;
  for (const auto& run : std::filesystem::directory_iterator(ScratchScopeDir(), ec)) {
    std::error_code type_ec;
    const std::string name = run.path().filename().string();
    if (kept.count(name) != 0 || !run.is_directory(type_ec) || run.is_symlink(type_ec)) continue;
    std::error_code sub_ec;
    for (const auto& entry : std::filesystem::directory_iterator(run.path(), sub_ec))
      agent_internal::UnmountScratch(entry.path().string());
    if (Status st = agent_internal::RemoveTree(run.path().string()); !st.ok())
      std::cerr << fmt::format("gpupool agent {}: scratch of an earlier run {}: {}\n", options_.node, name, st.ToString());
  }
}

// REQUIRES: mu_ held.
void Agent::RemoveScratch(const Assignment& a) {
  bool disk = a.rendezvous && !a.rendezvous->hosts.empty();
  for (const Volume& v : a.volumes) disk = disk || (v.host_path.empty() && !v.memory);
  if (!disk) return;
  const std::string dir = RunScratchDir(a);
  for (size_t i = 0; i < a.volumes.size(); ++i) agent_internal::UnmountScratch(fmt::format("{}/{}", dir, i));
  if (Status st = agent_internal::RemoveTree(dir); !st.ok())
    std::cerr << fmt::format("gpupool agent {}: scratch of task {}: {}\n", options_.node, a.run_id(), st.ToString());
}

// The sandbox of one task (docs/agent.md#the-task-sandbox): its identity, what it may not see, its
// devices, its checkpoint directory and network. An agent that is not root cannot switch
// identities: its tasks run as the agent does (said once at start).
// REQUIRES: mu_ held.
Status Agent::SandboxTask(const Assignment& a, LaunchSpec* spec) {
  spec->network = a.network;
  if (a.network == "pod") RETURN_IF_ERROR(AttachPodNetwork(a, spec));
  const bool container = !a.bundle.empty() || !a.rootfs.empty() || !a.image.empty();
  if (!sandbox_) {
    if (container && !a.checkpoint_dir.empty()) {
      // A bind needs its source: made as the agent's own user, which is also the task's.
      RETURN_IF_ERROR(agent_internal::MakeDirs(a.checkpoint_dir).WithContext("the checkpoint directory"));
      spec->binds.push_back({a.checkpoint_dir, a.checkpoint_dir, false});
    }
    return MountVolumes(a, spec);
  }
  spec->no_new_privs = true;
  if (!a.run_as_root) {
    spec->uid = a.uid;
    spec->gid = a.gid;
  }
  spec->hide_paths = {options_.state_dir};
  if (!options_.log_dir.empty()) spec->hide_paths.push_back(options_.log_dir);
  spec->hide_paths.insert(spec->hide_paths.end(), options_.hide.begin(), options_.hide.end());
  spec->private_dev = true;
  if (a.isolation == "mps") {
    for (const AssignedGpu& g : a.gpus) {
      if (g.index >= 0 && static_cast<size_t>(g.index) < inventory_.gpus.size())
        spec->keep_paths.push_back(options_.state_dir + "/mps/" + inventory_.gpus[static_cast<size_t>(g.index)].uuid);
    }
  }
  if (!a.checkpoint_dir.empty()) {
    // Created for the task, its uid's, where the admin allows (never at a path of the tenant's
    // choosing elsewhere on the host); at the same path inside a container. A root process task
    // of a root queue writes where it likes anyway; a root container gets only what is bound in,
    // so its directory too is made (root's) and only under the allowed roots.
    if (!a.run_as_root || container)
      RETURN_IF_ERROR(agent_internal::EnsureOwnedDirUnder(options_.checkpoint_roots, a.checkpoint_dir,
                                                          a.run_as_root ? 0 : a.uid, a.run_as_root ? 0 : a.gid)
                          .WithContext("the checkpoint directory"));
    spec->keep_paths.push_back(a.checkpoint_dir);
    if (container) spec->binds.push_back({a.checkpoint_dir, a.checkpoint_dir, false});
  }
  return MountVolumes(a, spec);
}

// REQUIRES: mu_ held.
Status Agent::AttachPodNetwork(const Assignment& a, LaunchSpec* spec) {
  if (!pod_network_)
    return Status::FailedPrecondition(fmt::format(
        "network: pod: node {} has no pod network (its agent runs without --pod-network; docs/agent.md#pod-network)",
        options_.node));
  ASSIGN_OR_RETURN(const PodNetwork::Attachment at, pod_network_->Attach(a.run_id()));
  spec->netns_path = at.netns_path;
  spec->env["GPUPOOL_POD_IP"] = at.address;
  // Names resolve as on the host, where its resolver is reachable from a pod (not a loopback one).
  struct stat st;
  if (::stat("/etc/resolv.conf", &st) == 0 && S_ISREG(st.st_mode))
    spec->mounts.push_back({"/etc/resolv.conf", "/etc/resolv.conf", "bind", {"ro", "nosuid", "nodev", "noexec"}});
  return Status::Ok();
}

}  // namespace gpupool
