#include "agent/inventory.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <exception>
#include <fstream>
#include <set>
#include <sstream>

#include "api/node_codec.h"
#include "model/gpu_catalog.h"
#include "model/topology.h"

namespace gpupool {
namespace {

constexpr int kMaxGpus = 64;  // the node spec's limit (docs/jobspec.md "Node spec")

std::string CatalogNames(const GpuCatalog& catalog) {
  std::string names;
  for (const GpuModelSpec& m : catalog.models()) {
    if (!names.empty()) names += ", ";
    names += m.name;
  }
  return names;
}

// GPUs spread over one socket (fewer than 4) or two (first half on socket 0); two GPUs per leaf PCIe
// switch; each socket's switches under one root switch. The layout of the 8-GPU presets, for any count.
std::vector<GpuPlacementSpec> DefaultPlacements(int count) {
  const int sockets = count >= 4 ? 2 : 1;
  std::vector<GpuPlacementSpec> gpus;
  for (int i = 0; i < count; ++i) {
    const int socket = i * sockets / count;
    gpus.push_back({.numa_node = socket, .host_bridge = socket, .root_switch = socket, .leaf_switch = i / 2});
  }
  return gpus;
}

Result<Inventory> FromMachine(const MachineSpec& machine, const std::string& node,
                              const std::string& source) {
  const GpuCatalog catalog = GpuCatalog::Builtin();
  const GpuModelSpec* model = catalog.Find(machine.gpu_model);
  if (model == nullptr) {
    return Status::InvalidArgument(
        fmt::format("unknown GPU model '{}' (known: {})", machine.gpu_model, CatalogNames(catalog)));
  }
  if (machine.gpus.empty() || static_cast<int>(machine.gpus.size()) > kMaxGpus) {
    return Status::InvalidArgument(
        fmt::format("GPU count must be 1..{}, not {}", kMaxGpus, machine.gpus.size()));
  }
  Result<Topology> topology = Topology::FromMachine(machine);
  if (!topology.ok()) return topology.status().WithContext("topology");
  Inventory inv;
  inv.simulated = true;
  inv.source = source;
  const int n = static_cast<int>(machine.gpus.size());
  for (int i = 0; i < n; ++i) {
    GpuInfo gpu;
    gpu.index = i;
    gpu.uuid = fmt::format("GPU-sim-{}-{}", node, i);
    gpu.name = model->name;
    gpu.model = model->name;
    gpu.memory_bytes = model->memory.units() * 1024 * 1024;
    if (model->compute_capability.major > 0) {
      gpu.compute_capability =
          fmt::format("{}.{}", model->compute_capability.major, model->compute_capability.minor);
    }
    gpu.numa_node = machine.gpus[static_cast<size_t>(i)].numa_node;
    inv.gpus.push_back(std::move(gpu));
  }
  inv.topology.assign(static_cast<size_t>(n), std::vector<int>(static_cast<size_t>(n), 0));
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b)
      inv.topology[static_cast<size_t>(a)][static_cast<size_t>(b)] = topology->Score(a, b);
  }
  return inv;
}

// "<count>x<model>[-SXM|-PCIE]"; nullopt-like empty result status NotFound when `spec` is not of this form.
Result<Inventory> FromCountSpec(std::string_view spec, const std::string& node, bool* matched) {
  *matched = false;
  size_t digits = 0;
  while (digits < spec.size() && std::isdigit(static_cast<unsigned char>(spec[digits])) != 0) ++digits;
  if (digits == 0 || digits >= spec.size() || spec[digits] != 'x')
    return Status::NotFound("not a count spec");
  *matched = true;
  int count = 0;
  const auto [ptr, ec] = std::from_chars(spec.data(), spec.data() + digits, count);
  if (ec != std::errc() || ptr != spec.data() + digits || count < 1 || count > kMaxGpus) {
    return Status::InvalidArgument(
        fmt::format("GPU count '{}' in '{}' must be 1..{}", spec.substr(0, digits), spec, kMaxGpus));
  }
  std::string model_name(spec.substr(digits + 1));
  enum class Form { kDefault, kSxm, kPcie } form = Form::kDefault;
  auto ends_with = [&](std::string_view suffix) {
    return model_name.size() > suffix.size() &&
           model_name.compare(model_name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends_with("-SXM")) {
    form = Form::kSxm;
    model_name.resize(model_name.size() - 4);
  } else if (ends_with("-PCIE")) {
    form = Form::kPcie;
    model_name.resize(model_name.size() - 5);
  }
  const GpuCatalog catalog = GpuCatalog::Builtin();
  const GpuModelSpec* model = catalog.Find(model_name);
  if (model == nullptr) {
    return Status::InvalidArgument(
        fmt::format("unknown GPU model '{}' in '{}' (known: {})", model_name, spec, CatalogNames(catalog)));
  }
  if (form == Form::kSxm && model->nvlinks == 0) {
    return Status::InvalidArgument(fmt::format("'{}': {} has no NVLink (SXM) form; use {}x{} or {}x{}-PCIE",
                                               spec, model->name, count, model->name, count, model->name));
  }
  MachineSpec machine;
  machine.name = std::string(spec);
  machine.gpu_model = model->name;
  machine.gpus = DefaultPlacements(count);
  // SXM boards (the default for models that ship with NVLink) are NVSwitch baseboards.
  if (form != Form::kPcie && model->nvlinks > 0 && count > 1) machine.nvswitch_links = model->nvlinks;
  return FromMachine(machine, node, "simulated: " + std::string(spec));
}

Result<int> YamlInt(const YAML::Node& n, const std::string& path) {
  if (!n.IsScalar()) return Status::InvalidArgument(fmt::format("{}: must be an integer", path));
  const std::string& text = n.Scalar();
  int value = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size()) {
    return Status::InvalidArgument(fmt::format("{}: must be an integer, not '{}'", path, text));
  }
  return value;
}

// `migGpus: [0, 2]`: those GPUs in MIG mode, with their model's catalog profiles. A simulated GPU
// has no MIG instances; its tasks get synthetic instance UUIDs (agent/task_env.h).
Status EnableSimulatedMig(const YAML::Node& list, Inventory& inv) {
  if (!list.IsSequence()) return Status::InvalidArgument("migGpus: must be a list of GPU indices");
  const GpuCatalog catalog = GpuCatalog::Builtin();
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string path = fmt::format("migGpus[{}]", i);
    ASSIGN_OR_RETURN(const int index, YamlInt(list[i], path));
    if (index < 0 || static_cast<size_t>(index) >= inv.gpus.size()) {
      return Status::InvalidArgument(
          fmt::format("{}: GPU {} is not in the machine (GPUs 0..{})", path, index, inv.gpus.size() - 1));
    }
    GpuInfo& gpu = inv.gpus[static_cast<size_t>(index)];
    const GpuModelSpec* model = catalog.Find(gpu.model);
    if (model == nullptr || !model->mig) {
      return Status::InvalidArgument(fmt::format("{}: {} is not MIG-capable", path, gpu.model));
    }
    if (gpu.mig_enabled) continue;
    gpu.mig_enabled = true;
    for (const MigProfile& p : model->mig->profiles) {
      gpu.mig_profiles.push_back({.profile_id = p.driver_id,
                                  .name = p.name,
                                  .slice_count = p.compute_slices,
                                  .instance_count = p.max_instances,
                                  .memory_mib = p.memory.units()});
    }
  }
  return Status::Ok();
}

Result<Inventory> FromYaml(const YAML::Node& root, const std::string& node, const std::string& source) {
  if (!root.IsMap()) return Status::InvalidArgument("machine spec: must be a YAML mapping");
  static const std::set<std::string> kKeys = {"gpuModel", "gpus",     "nvswitchLinks",
                                              "nvlinks",  "topology", "migGpus"};
  for (const auto& kv : root) {
    const std::string key = kv.first.Scalar();
    if (kKeys.count(key) == 0) {
      return Status::InvalidArgument(
          fmt::format("machine spec: unknown field '{}' (fields: gpuModel, gpus, nvswitchLinks, nvlinks, "
                      "topology, migGpus)",
                      key));
    }
  }
  MachineSpec machine;
  machine.name = "yaml";
  if (!root["gpuModel"] || !root["gpuModel"].IsScalar()) {
    return Status::InvalidArgument("gpuModel: required, a catalog model name");
  }
  machine.gpu_model = root["gpuModel"].Scalar();
  const YAML::Node gpus = root["gpus"];
  if (!gpus) return Status::InvalidArgument("gpus: required, a count or a list of {numaNode: n}");
  if (gpus.IsSequence()) {
    if (gpus.size() == 0 || gpus.size() > static_cast<size_t>(kMaxGpus)) {
      return Status::InvalidArgument(
          fmt::format("gpus: must list 1..{} GPUs, not {}", kMaxGpus, gpus.size()));
    }
    // With explicit NUMA nodes the PCIe tree below each socket is unknown: one host bridge per socket.
    machine.gpus.assign(gpus.size(), GpuPlacementSpec{.numa_node = 0, .host_bridge = 0});
    for (size_t i = 0; i < gpus.size(); ++i) {
      const std::string path = fmt::format("gpus[{}]", i);
      if (!gpus[i].IsMap()) return Status::InvalidArgument(path + ": must be a mapping like {numaNode: 0}");
      for (const auto& kv : gpus[i]) {
        if (kv.first.Scalar() != "numaNode") {
          return Status::InvalidArgument(
              fmt::format("{}: unknown field '{}' (fields: numaNode)", path, kv.first.Scalar()));
        }
      }
      if (gpus[i]["numaNode"]) {
        ASSIGN_OR_RETURN(const int numa, YamlInt(gpus[i]["numaNode"], path + ".numaNode"));
        if (numa < 0) return Status::InvalidArgument(path + ".numaNode: must not be negative");
        machine.gpus[i].numa_node = numa;
        machine.gpus[i].host_bridge = numa;
      }
    }
  } else {
    ASSIGN_OR_RETURN(const int count, YamlInt(gpus, "gpus"));
    if (count < 1 || count > kMaxGpus) {
      return Status::InvalidArgument(fmt::format("gpus: must be 1..{}, not {}", kMaxGpus, count));
    }
    machine.gpus = DefaultPlacements(count);
  }
  if (root["nvswitchLinks"]) {
    ASSIGN_OR_RETURN(machine.nvswitch_links, YamlInt(root["nvswitchLinks"], "nvswitchLinks"));
    if (machine.nvswitch_links < 0) return Status::InvalidArgument("nvswitchLinks: must not be negative");
  }
  if (const YAML::Node links = root["nvlinks"]) {
    if (!links.IsSequence()) return Status::InvalidArgument("nvlinks: must be a list of [a, b, links]");
    for (size_t i = 0; i < links.size(); ++i) {
      const std::string path = fmt::format("nvlinks[{}]", i);
      if (!links[i].IsSequence() || links[i].size() != 3) {
        return Status::InvalidArgument(path + ": must be [a, b, links]");
      }
      MachineSpec::NvLink link;
      ASSIGN_OR_RETURN(link.a, YamlInt(links[i][0], path + "[0]"));
      ASSIGN_OR_RETURN(link.b, YamlInt(links[i][1], path + "[1]"));
      ASSIGN_OR_RETURN(link.links, YamlInt(links[i][2], path + "[2]"));
      machine.nvlinks.push_back(link);
    }
  }
  ASSIGN_OR_RETURN(Inventory inv, FromMachine(machine, node, source));
  if (const YAML::Node matrix = root["topology"]) {
    if (root["nvswitchLinks"] || root["nvlinks"]) {
      return Status::InvalidArgument("topology: excludes nvswitchLinks and nvlinks");
    }
    const int n = static_cast<int>(inv.gpus.size());
    if (!matrix.IsSequence() || matrix.size() != static_cast<size_t>(n)) {
      return Status::InvalidArgument(fmt::format("topology: must be a {}x{} matrix of integers", n, n));
    }
    nlohmann::json j = nlohmann::json::array();
    std::vector<std::vector<int>> scores;
    for (int a = 0; a < n; ++a) {
      const YAML::Node row = matrix[static_cast<size_t>(a)];
      if (!row.IsSequence() || row.size() != static_cast<size_t>(n)) {
        return Status::InvalidArgument(fmt::format("topology[{}]: must be a row of {} integers", a, n));
      }
      std::vector<int> r;
      for (int b = 0; b < n; ++b) {
        ASSIGN_OR_RETURN(const int score,
                         YamlInt(row[static_cast<size_t>(b)], fmt::format("topology[{}][{}]", a, b)));
        r.push_back(score);
      }
      j.push_back(r);
      scores.push_back(std::move(r));
    }
    Result<Topology> checked = TopologyFromJson(j, n, "topology");
    if (!checked.ok()) return checked.status();
    inv.topology = std::move(scores);
  }
  if (const YAML::Node mig = root["migGpus"]) {
    RETURN_IF_ERROR(EnableSimulatedMig(mig, inv));
  }
  return inv;
}

bool LooksLikeYaml(std::string_view spec) {
  return spec.find(':') != std::string_view::npos || spec.find('\n') != std::string_view::npos ||
         spec.find('{') != std::string_view::npos;
}

bool LooksLikeYamlFile(std::string_view spec) {
  auto ends = [&](std::string_view s) {
    return spec.size() > s.size() && spec.substr(spec.size() - s.size()) == s;
  };
  return ends(".yaml") || ends(".yml");
}

}  // namespace

Result<Inventory> SimulatedInventory(std::string_view spec, const std::string& node) {
  if (spec.empty()) {
    return Status::InvalidArgument(
        "empty GPU spec: give <count>x<model> (8xH100-80GB), a machine preset (dgx-h100) or a YAML machine "
        "spec");
  }
  std::string yaml_text;
  std::string source = "simulated: " + std::string(spec);
  if (LooksLikeYamlFile(spec) && !LooksLikeYaml(spec)) {
    std::ifstream in{std::string(spec)};
    if (!in) return Status::NotFound(fmt::format("cannot read machine spec file '{}'", spec));
    std::stringstream buf;
    buf << in.rdbuf();
    yaml_text = buf.str();
  } else if (LooksLikeYaml(spec)) {
    yaml_text = std::string(spec);
    source = "simulated: yaml";
  }
  if (!yaml_text.empty()) {
    try {
      const YAML::Node root = YAML::Load(yaml_text);
      Result<Inventory> inv = FromYaml(root, node, source);
      if (!inv.ok()) return inv.status().WithContext("machine spec");
      return inv;
    } catch (const std::exception& e) {
      return Status::InvalidArgument(fmt::format("machine spec: not valid YAML: {}", e.what()));
    }
  }
  bool matched = false;
  Result<Inventory> counted = FromCountSpec(spec, node, &matched);
  if (matched) return counted;
  Result<MachineSpec> preset = MachinePreset(std::string(spec));
  if (!preset.ok()) {
    return Status::InvalidArgument(fmt::format(
        "GPU spec '{}' is neither <count>x<model>[-SXM|-PCIE] (8xH100-80GB) nor a YAML machine spec: {}",
        spec, preset.status().message()));
  }
  return FromMachine(*preset, node, source);
}

nlohmann::json MigLayoutJson(const GpuInfo& gpu) {
  // One entry per GPU instance (a GPU instance with several compute instances is listed once).
  std::map<int, std::pair<int, int>> by_start;  // start -> (profile id, GPU instance id)
  std::set<int> seen;
  for (const MigInstanceInfo& m : gpu.mig_instances) {
    if (m.profile_id < 0 || m.start < 0 || m.start >= 8) continue;
    if (m.gpu_instance_id >= 0 && !seen.insert(m.gpu_instance_id).second) continue;
    by_start.emplace(m.start, std::make_pair(m.profile_id, m.gpu_instance_id));
  }
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [start, v] : by_start) {
    if (out.size() >= 8) break;
    out.push_back({{"profileId", v.first}, {"start", start}});
  }
  return out;
}

nlohmann::json NodeRegistration(const Inventory& inv, const std::string& node, const std::string& cpu,
                                const std::string& memory, const std::map<std::string, std::string>& labels) {
  nlohmann::json j;
  j["name"] = node;
  j["cpu"] = cpu;
  j["memory"] = memory;
  nlohmann::json l = nlohmann::json::object();
  for (const auto& [k, v] : labels) l[k] = v;
  if (inv.simulated) l["gpupool.io/simulated"] = "true";
  l["gpupool.io/gpu-source"] = inv.simulated ? "simulated" : "nvml";
  j["labels"] = std::move(l);
  if (inv.gpus.empty()) return j;
  nlohmann::json gpus = nlohmann::json::array();
  for (const GpuInfo& g : inv.gpus) {
    nlohmann::json gj;
    gj["index"] = g.index;
    if (!g.uuid.empty()) gj["uuid"] = g.uuid;
    gj["model"] = g.model.empty() ? g.name : g.model;
    // Whole MiB, rounded down: the node never claims memory the GPU lacks.
    if (g.memory_bytes > 0) gj["memory"] = QuantityMemoryJson(MiB(g.memory_bytes / (1024 * 1024)));
    if (!g.compute_capability.empty()) gj["computeCapability"] = g.compute_capability;
    gj["numaNode"] = g.numa_node;
    gj["healthy"] = g.healthy;
    if (g.mig_enabled) gj["migEnabled"] = true;
    if (g.mig_enabled && !inv.simulated) gj["migInstances"] = MigLayoutJson(g);
    gpus.push_back(std::move(gj));
  }
  j["gpus"] = std::move(gpus);
  if (inv.topology.size() == inv.gpus.size()) j["topology"] = inv.topology;
  return j;
}

}  // namespace gpupool
