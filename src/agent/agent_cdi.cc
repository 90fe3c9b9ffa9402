// GPUs in containers through the Container Device Interface (docs/agent.md#gpus-in-containers):
// the agent reads the nvidia.com/gpu CDI specs NVIDIA's container toolkit left on the node, or
// generates one from NVML's inventory and the driver's files, and gives a container task what the
// spec says its GPUs need: their device nodes, the driver's libraries and binaries, hooks, env.
#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <set>

#include "agent/agent.h"
#include "agent/runtime_internal.h"

namespace gpupool {

namespace {
constexpr const char* kGpuKind = "nvidia.com/gpu";
}  // namespace

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
  const std::string root = options_.driver_root.empty() ? "/" : options_.driver_root;
  const DriverFiles files = FindDriverFiles(root);
  std::string mig_minors;
  if (auto text = agent_internal::ReadFile((root == "/" ? "" : root) + "/proc/driver/nvidia-caps/mig-minors");
      text.ok() && text->size() <= (1 << 20))
    mig_minors = *text;
  CdiSpec spec = GenerateNvidiaCdiSpec(inventory_, files, root, mig_minors);
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
  std::vector<std::string> names;
  for (const AssignedGpu& g : a.gpus) {
    if (g.index < 0 || static_cast<size_t>(g.index) >= inventory_.gpus.size())
      return Status::InvalidArgument(fmt::format("gpus: no GPU {} on node {}", g.index, options_.node));
    if (a.isolation == "mig") {
      ASSIGN_OR_RETURN(const MigInstanceInfo inst, FindMigInstance(g, inventory_, options_.node));
      names.push_back(inst.uuid);
    } else {
      names.push_back(inventory_.gpus[static_cast<size_t>(g.index)].uuid);
    }
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

}  // namespace gpupool
