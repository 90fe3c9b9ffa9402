#include "api/node_codec.h"

#include <fmt/format.h>

#include <array>
#include <exception>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "api/fields.h"

namespace gpupool {

namespace {

using api_internal::FieldError;
using api_internal::FieldPath;
using api_internal::IndexPath;
using api_internal::Json;
using api_internal::ObjectFields;
using api_internal::Quote;
using api_internal::ReadArray;
using api_internal::ReadBool;
using api_internal::ReadCpu;
using api_internal::ReadInt;
using api_internal::ReadLabels;
using api_internal::ReadMemory;
using api_internal::ReadName;
using api_internal::ReadString;

// Bounds far above any real machine, so a broken or hostile body is refused early.
constexpr size_t kMaxNodeNameBytes = 253;
constexpr int64_t kMaxNodeCpuMilli = int64_t{1} << 30;   // about a million cores
constexpr int64_t kMaxNodeMemoryMiB = int64_t{1} << 34;  // 16 Pi
constexpr int64_t kMaxGpuMemoryMiB = int64_t{1} << 24;   // 16 Ti per GPU
constexpr size_t kMaxGpusPerNode = 64;
constexpr size_t kMaxNodeLabels = 64;
constexpr size_t kMaxUuidBytes = 128;
constexpr size_t kMaxModelBytes = 128;
// An MPS share's owner: a tenant's name (at most JobSpecLimits::max_name_bytes) and the server's
// mark for a root queue.
constexpr size_t kMaxMpsOwnerBytes = 512;
constexpr int64_t kMaxNvLinks = 1000;
constexpr int64_t kMaxMaxTasks = 1000000;

// ---- topology -------------------------------------------------------------------------------

// PCIe levels from nearest to farthest, in the order of the PcieLevel enum.
constexpr std::array<PcieLevel, 6> kLevels = {PcieLevel::kSameBoard,   PcieLevel::kSingleSwitch,
                                              PcieLevel::kMultiSwitch, PcieLevel::kHostBridge,
                                              PcieLevel::kSameNuma,    PcieLevel::kCrossCpu};

// The PcieLevel index whose score is `score`, or -1.
int LevelOfScore(int64_t score) {
  for (size_t k = 0; k < kLevels.size(); ++k) {
    if (PcieLevelScore(kLevels[k]) == score) return static_cast<int>(k);
  }
  return -1;
}

// ---- node spec ------------------------------------------------------------------------------

// "8.0" -> {8, 0}.
Result<ComputeCapability> ReadComputeCapability(const Json& v, const std::string& path) {
  ASSIGN_OR_RETURN(std::string s, ReadString(v, path, 16));
  const size_t dot = s.find('.');
  const auto number = [](std::string_view part, int* out) {
    if (part.empty() || part.size() > 2) return false;
    int value = 0;
    for (char c : part) {
      if (c < '0' || c > '9') return false;
      value = value * 10 + (c - '0');
    }
    *out = value;
    return true;
  };
  ComputeCapability cc;
  if (dot == std::string::npos || !number(std::string_view(s).substr(0, dot), &cc.major) ||
      !number(std::string_view(s).substr(dot + 1), &cc.minor)) {
    return FieldError(path, fmt::format("must be \"<major>.<minor>\" such as \"8.0\", got {}", Quote(s)));
  }
  return cc;
}

Result<GpuDevice> ReadGpu(const Json& v, const std::string& path, size_t position, const std::string& node,
                          const GpuCatalog& catalog) {
  ASSIGN_OR_RETURN(ObjectFields f,
                   ObjectFields::Read(v, path,
                                      {"index", "uuid", "model", "memory", "smCount", "computeCapability",
                                       "numaNode", "healthy", "migEnabled"}));
  GpuDevice gpu;
  gpu.index = static_cast<int>(position);
  if (const Json* index = f.Get("index")) {
    ASSIGN_OR_RETURN(int64_t i,
                     ReadInt(*index, f.Path("index"), 0, static_cast<int64_t>(kMaxGpusPerNode) - 1));
    if (i != static_cast<int64_t>(position)) {
      return FieldError(
          f.Path("index"),
          fmt::format("must be {}: GPUs are listed in index order from 0, got {}", position, i));
    }
  }
  gpu.uuid = fmt::format("GPU-{}-{}", node, position);
  if (const Json* uuid = f.Get("uuid")) {
    ASSIGN_OR_RETURN(gpu.uuid, ReadString(*uuid, f.Path("uuid"), kMaxUuidBytes));
    if (gpu.uuid.empty()) return FieldError(f.Path("uuid"), "must not be empty");
  }
  const Json* model = f.Get("model");
  if (model == nullptr) return FieldError(f.Path("model"), "is required");
  ASSIGN_OR_RETURN(gpu.model, ReadString(*model, f.Path("model"), kMaxModelBytes));
  if (gpu.model.empty()) return FieldError(f.Path("model"), "must not be empty");
  const GpuModelSpec* spec = catalog.Find(gpu.model);
  if (spec != nullptr) {
    gpu.model = spec->name;
    gpu.memory = spec->memory;
    gpu.sm_count = spec->sm_count;
    gpu.compute_capability = spec->compute_capability;
  }
  if (const Json* memory = f.Get("memory")) {
    ASSIGN_OR_RETURN(gpu.memory, ReadMemory(*memory, f.Path("memory"), MiB(kMaxGpuMemoryMiB)));
  }
  if (const Json* sm = f.Get("smCount")) {
    ASSIGN_OR_RETURN(int64_t n, ReadInt(*sm, f.Path("smCount"), 0, 100000));
    gpu.sm_count = static_cast<int>(n);
  }
  if (const Json* cc = f.Get("computeCapability")) {
    ASSIGN_OR_RETURN(gpu.compute_capability, ReadComputeCapability(*cc, f.Path("computeCapability")));
  }
  if (const Json* numa = f.Get("numaNode")) {
    ASSIGN_OR_RETURN(int64_t n, ReadInt(*numa, f.Path("numaNode"), 0, 1023));
    gpu.numa_node = static_cast<int>(n);
  }
  if (const Json* healthy = f.Get("healthy")) {
    ASSIGN_OR_RETURN(gpu.healthy, ReadBool(*healthy, f.Path("healthy")));
  }
  if (const Json* mig = f.Get("migEnabled")) {
    ASSIGN_OR_RETURN(gpu.mig_enabled, ReadBool(*mig, f.Path("migEnabled")));
    if (gpu.mig_enabled && (spec == nullptr || !spec->mig.has_value())) {
      return FieldError(f.Path("migEnabled"), fmt::format("model {} is not MIG-capable", Quote(gpu.model)));
    }
  }
  return gpu;
}

// ValidateNodeSpec backs up the checks above. Should it find something anyway, keep its words
// and point at the GPU or part it names where that is plain.
Status FromValidateNodeSpec(const Status& st, const NodeSpec& spec) {
  std::string message = st.message();
  const std::string prefix = fmt::format("node '{}': ", spec.name);
  if (message.rfind(prefix, 0) == 0) message = message.substr(prefix.size());
  if (message.rfind("topology", 0) == 0) return FieldError("topology", message);
  if (message.rfind("cpu", 0) == 0) return FieldError("cpu", message);
  if (message.rfind("memory", 0) == 0) return FieldError("memory", message);
  if (message.rfind("max_tasks", 0) == 0) return FieldError("maxTasks", message);
  return FieldError("", message);
}

Result<NodeSpec> ReadNodeSpec(const Json& j, const GpuCatalog& catalog) {
  ASSIGN_OR_RETURN(ObjectFields f, ObjectFields::Read(j, "",
                                                      {"name", "cpu", "memory", "labels", "maxTasks",
                                                       "healthy", "machine", "gpus", "topology"}));
  NodeSpec spec;
  const Json* name = f.Get("name");
  if (name == nullptr) return FieldError("name", "is required");
  ASSIGN_OR_RETURN(spec.name, ReadName(*name, "name", kMaxNodeNameBytes));
  const Json* cpu = f.Get("cpu");
  if (cpu == nullptr) return FieldError("cpu", "is required");
  ASSIGN_OR_RETURN(spec.cpu, ReadCpu(*cpu, "cpu", MilliCpu(kMaxNodeCpuMilli)));
  const Json* memory = f.Get("memory");
  if (memory == nullptr) return FieldError("memory", "is required");
  ASSIGN_OR_RETURN(spec.memory, ReadMemory(*memory, "memory", MiB(kMaxNodeMemoryMiB)));

  if (const Json* machine = f.Get("machine")) {
    if (f.Has("gpus") || f.Has("topology")) {
      return FieldError("machine", "takes the place of gpus and topology; send one or the other");
    }
    ASSIGN_OR_RETURN(std::string preset_name, ReadString(*machine, "machine", 64));
    Result<MachineSpec> preset = MachinePreset(preset_name);
    if (!preset.ok()) return FieldError("machine", preset.status().message());
    Result<NodeSpec> made = MakeNodeFromMachine(spec.name, spec.cpu, spec.memory, *preset, catalog);
    if (!made.ok()) return FieldError("machine", made.status().message());
    spec = std::move(made).value();
  } else {
    if (const Json* gpus = f.Get("gpus")) {
      ASSIGN_OR_RETURN(const Json::array_t* list, ReadArray(*gpus, "gpus", kMaxGpusPerNode));
      std::set<std::string> uuids;
      for (size_t i = 0; i < list->size(); ++i) {
        const std::string path = IndexPath("gpus", i);
        ASSIGN_OR_RETURN(GpuDevice gpu, ReadGpu((*list)[i], path, i, spec.name, catalog));
        if (i > 0 && gpu.model != spec.gpus.front().model) {
          return FieldError(FieldPath(path, "model"),
                            fmt::format("is {} but gpus[0] is {}; a node has one GPU model", Quote(gpu.model),
                                        Quote(spec.gpus.front().model)));
        }
        if (!uuids.insert(gpu.uuid).second) {
          return FieldError(FieldPath(path, "uuid"),
                            fmt::format("{} is used by another GPU", Quote(gpu.uuid)));
        }
        spec.gpus.push_back(std::move(gpu));
      }
    }
    const int n = static_cast<int>(spec.gpus.size());
    if (const Json* topology = f.Get("topology")) {
      ASSIGN_OR_RETURN(spec.topology, TopologyFromJson(*topology, n, "topology"));
    } else {
      spec.topology = Topology::Flat(n);
    }
  }

  if (const Json* labels = f.Get("labels")) {
    ASSIGN_OR_RETURN(spec.labels, ReadLabels(*labels, "labels", kMaxNodeLabels));
  }
  if (const Json* max_tasks = f.Get("maxTasks")) {
    ASSIGN_OR_RETURN(int64_t n, ReadInt(*max_tasks, "maxTasks", 0, kMaxMaxTasks));
    spec.max_tasks = static_cast<int>(n);
  }
  if (const Json* healthy = f.Get("healthy")) {
    ASSIGN_OR_RETURN(spec.healthy, ReadBool(*healthy, "healthy"));
  }
  const Status valid = ValidateNodeSpec(spec, catalog);
  if (!valid.ok()) return FromValidateNodeSpec(valid, spec);
  return spec;
}

Json GpuJson(const GpuDevice& gpu) {
  return {
      {"index", gpu.index},
      {"uuid", gpu.uuid},
      {"model", gpu.model},
      {"memory", FormatMemory(gpu.memory)},
      {"smCount", gpu.sm_count},
      {"computeCapability", fmt::format("{}.{}", gpu.compute_capability.major, gpu.compute_capability.minor)},
      {"numaNode", gpu.numa_node},
      {"healthy", gpu.healthy},
      {"migEnabled", gpu.mig_enabled}};
}

// ---- placements -----------------------------------------------------------------------------

Result<std::optional<MigInstance>> ReadMig(const Json& v, const std::string& path,
                                           const MigGeometry* geometry) {
  ASSIGN_OR_RETURN(ObjectFields f, ObjectFields::Read(v, path, {"profile", "profileId", "start"}));
  if (geometry == nullptr) return FieldError(path, "the GPU is not MIG-capable");
  const MigProfile* by_id = nullptr;
  if (const Json* id = f.Get("profileId")) {
    ASSIGN_OR_RETURN(int64_t n, ReadInt(*id, f.Path("profileId"), 0, 1000));
    by_id = ProfileById(*geometry, static_cast<int>(n));
    if (by_id == nullptr)
      return FieldError(f.Path("profileId"), fmt::format("{} is not a profile of this GPU", n));
  }
  const MigProfile* by_name = nullptr;
  if (const Json* name = f.Get("profile")) {
    ASSIGN_OR_RETURN(std::string s, ReadString(*name, f.Path("profile"), 64));
    by_name = geometry->Find(s);
    if (by_name == nullptr)
      return FieldError(f.Path("profile"), fmt::format("{} is not a profile of this GPU", Quote(s)));
  }
  if (by_id == nullptr && by_name == nullptr)
    return FieldError(f.Path("profileId"), "is required (or profile)");
  if (by_id != nullptr && by_name != nullptr && by_id != by_name) {
    return FieldError(f.Path("profile"),
                      fmt::format("{} is not profile {}", Quote(by_name->name), by_id->driver_id));
  }
  const Json* start = f.Get("start");
  if (start == nullptr) return FieldError(f.Path("start"), "is required");
  ASSIGN_OR_RETURN(int64_t s, ReadInt(*start, f.Path("start"), 0, geometry->total_memory_slices - 1));
  MigInstance instance;
  instance.profile_id = (by_id != nullptr ? by_id : by_name)->driver_id;
  instance.start = static_cast<int>(s);
  return std::optional<MigInstance>(instance);
}

Result<Placement> ReadPlacement(const Json& j, const Ledger& ledger) {
  ASSIGN_OR_RETURN(ObjectFields f, ObjectFields::Read(j, "", {"node", "cpu", "memory", "gpus", "shareTask", "guaranteed", "enforced",
                                                                  "mpsOwner"}));
  Placement p;
  const Json* node = f.Get("node");
  if (node == nullptr) return FieldError("node", "is required");
  ASSIGN_OR_RETURN(std::string node_name, ReadString(*node, "node", kMaxNodeNameBytes));
  std::optional<NodeIndex> index = ledger.FindNode(node_name);
  if (!index) return FieldError("node", fmt::format("unknown node {}", Quote(node_name)));
  p.node = *index;
  const NodeSpec& spec = ledger.spec(p.node);
  if (const Json* cpu = f.Get("cpu")) {
    ASSIGN_OR_RETURN(p.cpu, ReadCpu(*cpu, "cpu", MilliCpu(kMaxNodeCpuMilli)));
  }
  if (const Json* memory = f.Get("memory")) {
    ASSIGN_OR_RETURN(p.memory, ReadMemory(*memory, "memory", MiB(kMaxNodeMemoryMiB)));
  }
  if (const Json* gpus = f.Get("gpus")) {
    ASSIGN_OR_RETURN(const Json::array_t* list, ReadArray(*gpus, "gpus", kMaxGpusPerNode));
    std::set<int> seen;
    for (size_t i = 0; i < list->size(); ++i) {
      const std::string path = IndexPath("gpus", i);
      ASSIGN_OR_RETURN(ObjectFields g,
                       ObjectFields::Read((*list)[i], path, {"index", "uuid", "share", "memory", "mig"}));
      GpuGrant grant;
      const Json* gpu_index = g.Get("index");
      if (gpu_index == nullptr) return FieldError(g.Path("index"), "is required");
      if (spec.gpus.empty())
        return FieldError(g.Path("index"), fmt::format("node {} has no GPUs", Quote(spec.name)));
      ASSIGN_OR_RETURN(int64_t gi,
                       ReadInt(*gpu_index, g.Path("index"), 0, static_cast<int64_t>(spec.gpus.size()) - 1));
      grant.gpu = static_cast<int>(gi);
      if (!seen.insert(grant.gpu).second)
        return FieldError(g.Path("index"), fmt::format("GPU {} is listed twice", gi));
      if (const Json* uuid = g.Get("uuid")) {
        ASSIGN_OR_RETURN(std::string u, ReadString(*uuid, g.Path("uuid"), kMaxUuidBytes));
        const std::string& expected = spec.gpus[static_cast<size_t>(gi)].uuid;
        if (u != expected) {
          return FieldError(g.Path("uuid"), fmt::format("{} is not GPU {} of node {} (that is {})", Quote(u),
                                                        gi, Quote(spec.name), Quote(expected)));
        }
      }
      if (const Json* share = g.Get("share")) {
        ASSIGN_OR_RETURN(int64_t s, ReadInt(*share, g.Path("share"), 0, kWholeGpu.units()));
        grant.share = MilliGpu(s);
      }
      if (const Json* memory = g.Get("memory")) {
        ASSIGN_OR_RETURN(grant.memory, ReadMemory(*memory, g.Path("memory"), MiB(kMaxGpuMemoryMiB)));
      }
      if (const Json* mig = g.Get("mig")) {
        ASSIGN_OR_RETURN(grant.mig, ReadMig(*mig, g.Path("mig"), GeometryOf(ledger, p.node, grant.gpu)));
      }
      p.gpus.push_back(std::move(grant));
    }
  }
  p.share_task = p.gpus.size() == 1 && p.gpus.front().share < kWholeGpu && !p.gpus.front().mig.has_value();
  if (const Json* share_task = f.Get("shareTask")) {
    ASSIGN_OR_RETURN(p.share_task, ReadBool(*share_task, "shareTask"));
  }
  // Absent (a placement stored before QoS sharing): not guaranteed, and held by nothing.
  if (const Json* guaranteed = f.Get("guaranteed")) {
    ASSIGN_OR_RETURN(p.guaranteed, ReadBool(*guaranteed, "guaranteed"));
  }
  if (const Json* enforced = f.Get("enforced")) {
    ASSIGN_OR_RETURN(p.enforced, ReadBool(*enforced, "enforced"));
  }
  // Absent (not an MPS share, or one stored before MPS owners were kept apart): no owner.
  if (const Json* owner = f.Get("mpsOwner")) {
    ASSIGN_OR_RETURN(p.mps_owner, ReadString(*owner, "mpsOwner", kMaxMpsOwnerBytes));
  }
  return p;
}

}  // namespace

Json TopologyToJson(const Topology& topology) {
  Json rows = Json::array();
  for (int a = 0; a < topology.gpu_count(); ++a) {
    Json row = Json::array();
    for (int b = 0; b < topology.gpu_count(); ++b) row.push_back(topology.Score(a, b));
    rows.push_back(std::move(row));
  }
  return rows;
}

Result<Topology> TopologyFromJson(const Json& j, int gpu_count, const std::string& path) {
  const auto n = static_cast<size_t>(gpu_count < 0 ? 0 : gpu_count);
  ASSIGN_OR_RETURN(const Json::array_t* rows, ReadArray(j, path, kMaxGpusPerNode));
  if (rows->size() != n) {
    return FieldError(path, fmt::format("has {} rows but the node has {} GPUs", rows->size(), n));
  }
  std::vector<std::vector<int64_t>> score(n, std::vector<int64_t>(n, 0));
  for (size_t a = 0; a < n; ++a) {
    const std::string rpath = IndexPath(path, a);
    ASSIGN_OR_RETURN(const Json::array_t* row, ReadArray((*rows)[a], rpath, kMaxGpusPerNode));
    if (row->size() != n) return FieldError(rpath, fmt::format("has {} entries, not {}", row->size(), n));
    for (size_t b = 0; b < n; ++b) {
      ASSIGN_OR_RETURN(score[a][b], ReadInt((*row)[b], IndexPath(rpath, b), 0, 100 * kMaxNvLinks + 60));
    }
  }
  // Decode each pair into a level (index into kLevels) and an NVLink count.
  std::vector<std::vector<int>> level(n, std::vector<int>(n, -1));
  MachineSpec machine;
  machine.name = "registered";
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = 0; b < n; ++b) {
      const std::string cell = IndexPath(IndexPath(path, a), b);
      if (a == b) {
        if (score[a][b] != 0) return FieldError(cell, "must be 0 (a GPU with itself)");
        continue;
      }
      if (score[a][b] != score[b][a]) {
        return FieldError(cell, fmt::format("is {} but [{}][{}] is {}; the matrix must be symmetric",
                                            score[a][b], b, a, score[b][a]));
      }
      level[a][b] = LevelOfScore(score[a][b] % 100);
      if (level[a][b] < 0) {
        return FieldError(
            cell, fmt::format("{} is not a PCIe level score (10, 20, ..., 60) plus 100 per NVLink link",
                              score[a][b]));
      }
      const auto links = static_cast<int>(score[a][b] / 100);
      if (a < b && links > 0) {
        machine.nvlinks.push_back({.a = static_cast<int>(a), .b = static_cast<int>(b), .links = links});
      }
    }
  }
  // The levels must nest like a PCIe tree: for every k, "closer than or at level k" is an
  // equivalence. Then every GPU's component at level k is named by its lowest-indexed member.
  const auto at_most = [&level](size_t a, size_t b, int k) { return a == b || level[a][b] <= k; };
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = 0; b < n; ++b) {
      for (size_t c = 0; c < n; ++c) {
        if (a == b || b == c || a == c) continue;
        if (level[a][c] > std::max(level[a][b], level[b][c])) {
          return FieldError(path,
                            fmt::format("GPUs {} and {} are each closer to GPU {} than to each other; the "
                                        "levels do not describe a PCIe tree",
                                        a, c, b));
        }
      }
    }
  }
  for (size_t a = 0; a < n; ++a) {
    std::array<int, 5> id{};
    for (int k = 0; k < 5; ++k) {
      size_t first = a;
      for (size_t b = 0; b < a; ++b) {
        if (at_most(a, b, k)) {
          first = b;
          break;
        }
      }
      id[static_cast<size_t>(k)] = static_cast<int>(first);
    }
    machine.gpus.push_back({.numa_node = id[4],
                            .host_bridge = id[3],
                            .root_switch = id[2],
                            .leaf_switch = id[1],
                            .board = id[0]});
  }
  Result<Topology> topology = Topology::FromMachine(machine);
  if (!topology.ok()) return FieldError(path, topology.status().message());
  return topology;
}

Result<NodeSpec> ParseNodeSpec(const Json& j, const GpuCatalog& catalog) {
  try {
    return ReadNodeSpec(j, catalog);
  } catch (const std::exception& e) {
    // The readers check types before every access, so this is a bug; still no exception escapes.
    return Status::Internal(fmt::format("spec: reading the node failed: {}", e.what()));
  }
}

Json NodeSpecToJson(const NodeSpec& spec) {
  Json labels = Json::object();
  for (const auto& [k, v] : spec.labels) labels[k] = v;
  Json gpus = Json::array();
  for (const GpuDevice& gpu : spec.gpus) gpus.push_back(GpuJson(gpu));
  return {{"name", spec.name},
          {"cpu", FormatCpu(spec.cpu)},
          {"memory", FormatMemory(spec.memory)},
          {"labels", std::move(labels)},
          {"maxTasks", spec.max_tasks},
          {"healthy", spec.healthy},
          {"gpus", std::move(gpus)},
          {"topology", TopologyToJson(spec.topology)}};
}

bool SameNodeSpec(const NodeSpec& a, const NodeSpec& b) {
  if (a.name != b.name || a.cpu != b.cpu || a.memory != b.memory || a.labels != b.labels ||
      a.healthy != b.healthy || a.max_tasks != b.max_tasks || a.gpus.size() != b.gpus.size()) {
    return false;
  }
  for (size_t i = 0; i < a.gpus.size(); ++i) {
    const GpuDevice& x = a.gpus[i];
    const GpuDevice& y = b.gpus[i];
    if (x.index != y.index || x.uuid != y.uuid || x.model != y.model || x.memory != y.memory ||
        x.sm_count != y.sm_count || x.compute_capability != y.compute_capability ||
        x.numa_node != y.numa_node || x.healthy != y.healthy || x.mig_enabled != y.mig_enabled) {
      return false;
    }
  }
  const Topology& s = a.topology;
  const Topology& t = b.topology;
  if (s.gpu_count() != t.gpu_count() || s.has_nvlink() != t.has_nvlink()) return false;
  for (int x = 0; x < s.gpu_count(); ++x) {
    for (int y = 0; y < s.gpu_count(); ++y) {
      if (s.Score(x, y) != t.Score(x, y) || s.NvLinks(x, y) != t.NvLinks(x, y) ||
          s.Level(x, y) != t.Level(x, y)) {
        return false;
      }
    }
  }
  return true;
}

Json PlacementToJson(const Placement& p, const Ledger& ledger) {
  const NodeSpec* spec = p.node < ledger.node_count() ? &ledger.spec(p.node) : nullptr;
  Json gpus = Json::array();
  for (const GpuGrant& grant : p.gpus) {
    const bool known =
        spec != nullptr && grant.gpu >= 0 && static_cast<size_t>(grant.gpu) < spec->gpus.size();
    Json g = {{"index", grant.gpu},
              {"uuid", known ? spec->gpus[static_cast<size_t>(grant.gpu)].uuid : std::string()},
              {"share", grant.share.units()},
              {"memory", FormatMemory(grant.memory)}};
    if (grant.mig.has_value()) {
      const MigGeometry* geometry = GeometryOf(ledger, p.node, grant.gpu);
      const MigProfile* profile =
          geometry != nullptr ? ProfileById(*geometry, grant.mig->profile_id) : nullptr;
      Json mig = {{"profileId", grant.mig->profile_id}, {"start", grant.mig->start}};
      if (profile != nullptr) mig["profile"] = profile->name;
      g["mig"] = std::move(mig);
    }
    gpus.push_back(std::move(g));
  }
  Json out = {{"node", spec != nullptr ? spec->name : std::string()},
              {"cpu", FormatCpu(p.cpu)},
              {"memory", FormatMemory(p.memory)},
              {"gpus", std::move(gpus)},
              {"shareTask", p.share_task}};
  if (p.guaranteed) out["guaranteed"] = true;
  if (p.enforced) out["enforced"] = true;
  if (p.mps_owner) out["mpsOwner"] = *p.mps_owner;
  return out;
}

Result<Placement> PlacementFromJson(const Json& j, const Ledger& ledger) {
  try {
    return ReadPlacement(j, ledger);
  } catch (const std::exception& e) {
    return Status::Internal(fmt::format("spec: reading the placement failed: {}", e.what()));
  }
}

Json QuantityCpuJson(MilliCpu cpu) {
  return FormatCpu(cpu);
}

Json QuantityMemoryJson(MiB memory) {
  return FormatMemory(memory);
}

const MigGeometry* GeometryOf(const Ledger& ledger, NodeIndex node, int gpu) {
  if (node >= ledger.node_count()) return nullptr;
  const NodeSpec& spec = ledger.spec(node);
  if (gpu < 0 || static_cast<size_t>(gpu) >= spec.gpus.size()) return nullptr;
  const GpuModelSpec* model = ledger.catalog().Find(spec.gpus[static_cast<size_t>(gpu)].model);
  if (model == nullptr || !model->mig.has_value()) return nullptr;
  return &*model->mig;
}

const MigProfile* ProfileById(const MigGeometry& geometry, int id) {
  for (const MigProfile& p : geometry.profiles) {
    if (p.driver_id == id) return &p;
  }
  return nullptr;
}

}  // namespace gpupool
