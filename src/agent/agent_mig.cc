// Dynamic MIG (docs/agent.md#dynamic-mig): before a task with isolation mig starts on real GPUs,
// the MIG instance its assignment names (GPU-instance profile and start slice) is made to exist.
// Idle GPU instances in its way are destroyed and the instance is created through NVML; busy ones
// make the start fail. MIG mode itself is never changed (that needs a GPU reset).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "agent/agent.h"
#include "agent/task_env.h"
#include "model/gpu_catalog.h"
#include "model/mig.h"

namespace gpupool {
namespace {

constexpr int kMemorySlices = 8;

// The instance an assignment asks for, checked against the model's MIG geometry.
struct WantedMig {
  int profile_id = -1;
  std::string name;
  int start = -1;
  int size = 0;  // memory slices
};

// A memory-slice range some running task's MIG instance occupies.
struct BusyRange {
  std::string task;
  int start = 0;
  int size = 0;
};

// A GPU instance that stands in the way of the wanted one.
struct InTheWay {
  int gpu_instance_id = -1;
  int profile_id = -1;
  std::string label;  // "1g.10gb@4 (GPU instance 2, MIG-...)"
  int start = 0;
  int size = 0;
};

// Placements as NVML reports them (start and size of each MIG device), not as the catalog's
// profiles: MigOverlap (model/mig.h) sizes instances by their profile in the model's geometry and
// sees no overlap for a profile it does not know, where a device still takes its memory slices.
bool Overlaps(int a, int a_size, int b, int b_size) {
  return a < b + b_size && b < a + a_size;
}

const GpuCatalog& Catalog() {
  static const GpuCatalog catalog = GpuCatalog::Builtin();
  return catalog;
}

// The profile and placement `g` asks for on `info`, refused before any NVML call when the model's
// geometry (model/gpu_catalog.h) has no such profile or the start is not one of its placements.
Result<WantedMig> Wanted(const AssignedGpu& g, const GpuInfo& info) {
  const GpuModelSpec* spec = Catalog().Find(info.model);
  if (spec == nullptr || !spec->mig) {
    return Status::FailedPrecondition(fmt::format(
        "GPU {} ({}): gpupool knows no MIG geometry for model '{}', so it creates no MIG instances there",
        g.index, info.uuid, info.model));
  }
  const MigProfile* p = nullptr;
  if (g.mig_profile_id >= 0) {
    p = MigProfileById(*spec->mig, g.mig_profile_id);
  } else if (!g.mig_profile.empty()) {
    p = spec->mig->Find(g.mig_profile);
  }
  std::vector<std::string> known;
  for (const MigProfile& q : spec->mig->profiles) known.push_back(fmt::format("{} (id {})", q.name, q.driver_id));
  if (p == nullptr) {
    return Status::InvalidArgument(fmt::format(
        "GPU {}: MIG profile {} is not a profile of {} (known: {})", g.index,
        g.mig_profile_id >= 0 ? fmt::format("id {}", g.mig_profile_id) : "'" + g.mig_profile + "'", spec->name,
        fmt::join(known, ", ")));
  }
  if (g.mig_profile_id >= 0 && !g.mig_profile.empty() && spec->mig->Find(g.mig_profile) != p) {
    return Status::InvalidArgument(fmt::format("GPU {}: MIG profile '{}' is not profile id {} ({}) on {}", g.index,
                                               g.mig_profile, g.mig_profile_id, p->name, spec->name));
  }
  if (!info.mig_profiles.empty()) {
    bool offered = false;
    for (const MigProfileInfo& d : info.mig_profiles) offered = offered || d.profile_id == p->driver_id;
    if (!offered)
      return Status::FailedPrecondition(
          fmt::format("GPU {} ({}): the device does not offer MIG profile {} (id {})", g.index, info.uuid, p->name,
                      p->driver_id));
  }
  std::vector<int> starts;
  for (int s = 0; s < kMemorySlices; ++s) {
    if ((p->valid_starts & (1U << static_cast<unsigned>(s))) != 0) starts.push_back(s);
  }
  if (g.mig_start < 0 || g.mig_start >= kMemorySlices ||
      (p->valid_starts & (1U << static_cast<unsigned>(g.mig_start))) == 0) {
    return Status::InvalidArgument(fmt::format("GPU {}: slice {} is not a valid start of MIG profile {} (valid: {})",
                                               g.index, g.mig_start, p->name, fmt::join(starts, ", ")));
  }
  return WantedMig{.profile_id = p->driver_id, .name = p->name, .start = g.mig_start, .size = p->memory_slices};
}

std::string Label(const MigInstanceInfo& m) {
  const std::string profile = !m.profile.empty() ? m.profile : fmt::format("profile-{}", m.profile_id);
  return fmt::format("{}@{} (GPU instance {}, {})", profile, m.start, m.gpu_instance_id, m.uuid);
}

// GPU `known.index` as NVML sees it now; an error when the GPU is no longer the one the agent
// knows. A Discover reads every GPU (processes, topology): `seen` keeps the last one, which holds
// until the agent changes a layout and empties it.
Result<GpuInfo> FreshGpu(Nvml& nvml, std::optional<Inventory>& seen, const GpuInfo& known) {
  if (!seen) {
    ASSIGN_OR_RETURN(Inventory inv, nvml.Discover());
    seen = std::move(inv);
  }
  const auto i = static_cast<size_t>(known.index);
  if (i >= seen->gpus.size() || seen->gpus[i].uuid != known.uuid)
    return Status::FailedPrecondition(fmt::format("GPU {} ({}) is no longer where it was", known.index, known.uuid));
  return seen->gpus[i];
}

// Creates the destroyed GPU instances again (new UUIDs, one compute instance each): what the note
// in the start's error says.
std::string Restore(Nvml& nvml, int gpu, const std::vector<InTheWay>& destroyed) {
  if (destroyed.empty()) return "";
  std::vector<std::string> back;
  std::vector<std::string> lost;
  for (const InTheWay& d : destroyed) {
    auto r = nvml.CreateMigInstance(gpu, d.profile_id, d.start);
    if (r.ok()) back.push_back(fmt::format("{}@{}", r->profile, d.start));
    else lost.push_back(fmt::format("{}: {}", d.label, r.status().message()));
  }
  std::string note;
  if (!back.empty()) note += fmt::format("; the instances destroyed to make room were created again: {}", fmt::join(back, ", "));
  if (!lost.empty()) note += fmt::format("; could not create again: {}", fmt::join(lost, "; "));
  return note;
}

// Destroys the GPU instances `in_the_way` of GPU `gpu` (each one noted in `destroyed`), then
// creates `want`. When a call fails, the destroyed ones are created again and the error says so.
Result<MigInstanceInfo> Replace(Nvml& nvml, int gpu, const std::string& wanted, const WantedMig& want,
                                const std::vector<InTheWay>& in_the_way, std::vector<InTheWay>& destroyed) {
  for (const InTheWay& w : in_the_way) {
    if (Status st = nvml.DestroyMigGpuInstance(gpu, w.gpu_instance_id); !st.ok()) {
      const std::string note = Restore(nvml, gpu, destroyed);
      return Status::FailedPrecondition(
          fmt::format("GPU {}: cannot create MIG instance {}: destroying {}: {}{}", gpu, wanted, w.label,
                      st.message(), note));
    }
    destroyed.push_back(w);
  }
  auto created = nvml.CreateMigInstance(gpu, want.profile_id, want.start);
  if (!created.ok()) {
    const std::string note = Restore(nvml, gpu, destroyed);
    return Status::FailedPrecondition(fmt::format("GPU {}: cannot create MIG instance {}: {}{}", gpu, wanted,
                                                  created.status().message(), note));
  }
  return created;
}

// Makes the instance `want` exist on GPU `info` (whose mig_instances are kept current), destroying
// the idle GPU instances that overlap it. `seen` as FreshGpu's.
Status EnsureOne(Nvml& nvml, std::optional<Inventory>& seen, GpuInfo& info, const WantedMig& want,
                 const std::vector<BusyRange>& busy, const std::string& node) {
  const std::string wanted = fmt::format("{}@{}", want.name, want.start);
  ASSIGN_OR_RETURN(GpuInfo fresh, FreshGpu(nvml, seen, info));
  info.mig_instances = fresh.mig_instances;
  if (!fresh.mig_enabled)
    return Status::FailedPrecondition(
        fmt::format("GPU {} ({}) is not in MIG mode; gpupool does not change MIG mode", info.index, info.uuid));
  for (const MigInstanceInfo& m : fresh.mig_instances) {
    if (m.profile_id == want.profile_id && m.start == want.start) return Status::Ok();  // made meanwhile
  }
  std::vector<InTheWay> in_the_way;
  for (const MigInstanceInfo& m : fresh.mig_instances) {
    if (m.gpu_instance_id < 0 || m.profile_id < 0 || m.start < 0 || m.start >= kMemorySlices || m.size <= 0 ||
        m.size > kMemorySlices) {
      return Status::FailedPrecondition(fmt::format(
          "GPU {}: cannot create MIG instance {}: the placement of MIG device {} cannot be read, and gpupool does "
          "not change a layout it cannot read",
          info.index, wanted, m.uuid));
    }
    if (!Overlaps(m.start, m.size, want.start, want.size)) continue;
    bool listed = false;
    for (const InTheWay& w : in_the_way) listed = listed || w.gpu_instance_id == m.gpu_instance_id;
    if (listed) continue;  // a GPU instance with several compute instances
    in_the_way.push_back({.gpu_instance_id = m.gpu_instance_id, .profile_id = m.profile_id, .label = Label(m),
                          .start = m.start, .size = m.size});
  }
  for (const InTheWay& w : in_the_way) {
    for (const BusyRange& b : busy) {
      if (Overlaps(b.start, b.size, w.start, w.size))
        return Status::FailedPrecondition(fmt::format(
            "GPU {}: cannot create MIG instance {}: it overlaps MIG instance {}, in use by task {}", info.index,
            wanted, w.label, b.task));
    }
    for (const GpuProcessInfo& p : fresh.processes) {
      if (p.gpu_instance_id == w.gpu_instance_id)
        return Status::FailedPrecondition(fmt::format(
            "GPU {}: cannot create MIG instance {}: it overlaps MIG instance {}, where process {} runs", info.index,
            wanted, w.label, p.pid));
      if (p.gpu_instance_id < 0)
        return Status::FailedPrecondition(fmt::format(
            "GPU {}: cannot create MIG instance {}: process {} runs on the GPU and NVML does not say in which "
            "MIG instance, so {} may be in use",
            info.index, wanted, p.pid, w.label));
    }
  }
  std::vector<InTheWay> destroyed;
  const Result<MigInstanceInfo> created = Replace(nvml, info.index, wanted, want, in_the_way, destroyed);
  // The layout as NVML has it after the calls, whether they succeeded or not (new UUIDs and MIG
  // device indices, instances created again), read once.
  seen.reset();
  const Result<GpuInfo> after = FreshGpu(nvml, seen, info);
  if (after.ok()) info.mig_instances = after->mig_instances;
  if (!created.ok()) return created.status();
  if (!after.ok()) {  // the layout as the calls left it
    std::erase_if(info.mig_instances, [&](const MigInstanceInfo& m) {
      for (const InTheWay& d : destroyed) {
        if (d.gpu_instance_id == m.gpu_instance_id) return true;
      }
      return false;
    });
    info.mig_instances.push_back(*created);
  }
  std::vector<std::string> gone;
  for (const InTheWay& d : destroyed) gone.push_back(d.label);
  std::cerr << fmt::format("gpupool agent {}: GPU {}: created MIG instance {} ({}){}\n", node, info.index, wanted,
                           created->uuid,
                           gone.empty() ? std::string() : fmt::format(", destroying {}", fmt::join(gone, ", ")));
  return Status::Ok();
}

}  // namespace

// REQUIRES: mu_ held.
Status Agent::EnsureMigInstances(const LocalTask& t) {
  const Assignment& a = t.assignment;
  if (a.isolation != "mig" || inventory_.simulated) return Status::Ok();
  std::optional<Inventory> seen;  // NVML's view, shared by the task's GPUs (FreshGpu)
  for (const AssignedGpu& g : a.gpus) {
    if (g.index < 0 || static_cast<size_t>(g.index) >= inventory_.gpus.size())
      return Status::InvalidArgument(
          fmt::format("gpus: GPU {} is not on this node ({} GPUs)", g.index, inventory_.gpus.size()));
    GpuInfo& info = inventory_.gpus[static_cast<size_t>(g.index)];
    if (!info.mig_enabled)
      return Status::FailedPrecondition(
          fmt::format("GPU {} ({}) is not in MIG mode; gpupool does not change MIG mode", g.index, info.uuid));
    if (FindMigInstance(g, inventory_, options_.node).ok()) continue;  // it exists
    ASSIGN_OR_RETURN(const WantedMig want, Wanted(g, info));
    if (!nvml_)
      return Status::FailedPrecondition(fmt::format("GPU {}: MIG instance {}@{} does not exist and NVML is not loaded",
                                                    g.index, want.name, want.start));
    // The memory slices of the MIG instances this agent's running tasks use on that GPU.
    std::vector<BusyRange> busy;
    for (const auto& [id, other] : tasks_) {
      if (&other == &t || !other.started || other.exited || other.assignment.isolation != "mig") continue;
      for (const AssignedGpu& og : other.assignment.gpus) {
        if (og.index != g.index) continue;
        int size = 0;
        if (auto w = Wanted(og, info); w.ok()) size = w->size;
        for (const MigInstanceInfo& m : info.mig_instances) {
          if (m.start == og.mig_start && size == 0) size = m.size;
        }
        busy.push_back({.task = id, .start = og.mig_start, .size = size > 0 ? size : 1});
      }
    }
    std::vector<std::string> before;
    for (const MigInstanceInfo& m : info.mig_instances) before.push_back(m.uuid);
    const Status st = EnsureOne(*nvml_, seen, info, want, busy, options_.node);
    std::vector<std::string> after;
    for (const MigInstanceInfo& m : info.mig_instances) after.push_back(m.uuid);
    if (after != before) {
      const bool generated =
          std::any_of(cdi_specs_.begin(), cdi_specs_.end(), [](const CdiSpec& c) { return c.source == "generated"; });
      if (generated) {
        // The agent's own spec: made again from the inventory as it is now, so containers find
        // the new instance's device nodes.
        cdi_specs_.clear();
        LoadCdi();
      } else {
        // The toolkit's specs, read at start, name this GPU's MIG devices by their index too
        // ("1:0"), and the indices now mean other instances: those names go, so that no container
        // gets another instance's device nodes (names by UUID stay right: UUIDs are never reused).
        // A new instance is in none of them until the operator regenerates them.
        const std::string prefix = fmt::format("{}:", g.index);
        for (CdiSpec& spec : cdi_specs_) {
          std::erase_if(spec.devices, [&](const auto& d) { return d.first.rfind(prefix, 0) == 0; });
        }
        // The GPU's instances no spec names by UUID (the new one, and those only named by index):
        // their device nodes as the agent's own generator makes them, in the toolkit's spec of the
        // GPU, whose common edits (driver libraries, hooks) then come with them.
        Inventory one;
        one.gpus = {info};
        const CdiSpec own = GenerateNvidiaCdiSpec(one, DriverFiles{}, DriverRoot(), MigMinorsText());
        const std::vector<std::string> added = SupplementMigDevices(cdi_specs_, info, own);
        if (!added.empty())
          std::cerr << fmt::format("gpupool agent {}: CDI: GPU {}: MIG devices {} added to the toolkit's spec\n",
                                   options_.node, g.index, fmt::join(added, ", "));
      }
    }
    RETURN_IF_ERROR(st);
  }
  return Status::Ok();
}

}  // namespace gpupool
