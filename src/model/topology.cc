#include "model/topology.h"

#include <fmt/format.h>

#include <array>
#include <utility>

namespace gpupool {

int PcieLevelScore(PcieLevel level) {
  switch (level) {
    case PcieLevel::kSameBoard: return 60;
    case PcieLevel::kSingleSwitch: return 50;
    case PcieLevel::kMultiSwitch: return 40;
    case PcieLevel::kHostBridge: return 30;
    case PcieLevel::kSameNuma: return 20;
    case PcieLevel::kCrossCpu: return 10;
  }
  return 0;
}

std::string_view PcieLevelName(PcieLevel level) {
  switch (level) {
    case PcieLevel::kSameBoard: return "SameBoard";
    case PcieLevel::kSingleSwitch: return "SingleSwitch";
    case PcieLevel::kMultiSwitch: return "MultiSwitch";
    case PcieLevel::kHostBridge: return "HostBridge";
    case PcieLevel::kSameNuma: return "SameNuma";
    case PcieLevel::kCrossCpu: return "CrossCpu";
  }
  return "Unknown";
}

namespace {

// Two GPUs share a component only when both name the same one; -1 ("none") is never shared.
bool Shared(int a, int b) {
  return a >= 0 && a == b;
}

// The closest common PCIe ancestor of two GPUs, checked from the nearest level outwards.
PcieLevel PairLevel(const GpuPlacementSpec& a, const GpuPlacementSpec& b) {
  if (Shared(a.board, b.board)) return PcieLevel::kSameBoard;
  if (Shared(a.leaf_switch, b.leaf_switch)) return PcieLevel::kSingleSwitch;
  if (Shared(a.root_switch, b.root_switch)) return PcieLevel::kMultiSwitch;
  if (Shared(a.host_bridge, b.host_bridge)) return PcieLevel::kHostBridge;
  if (Shared(a.numa_node, b.numa_node)) return PcieLevel::kSameNuma;
  return PcieLevel::kCrossCpu;
}

Status ValidatePlacement(const GpuPlacementSpec& gpu, size_t index) {
  const std::array<std::pair<const char*, int>, 5> ids = {{{"numa_node", gpu.numa_node},
                                                           {"host_bridge", gpu.host_bridge},
                                                           {"root_switch", gpu.root_switch},
                                                           {"leaf_switch", gpu.leaf_switch},
                                                           {"board", gpu.board}}};
  for (const auto& [field, id] : ids) {
    if (id < -1) {
      return Status::InvalidArgument(
          fmt::format("gpu {}: {} must be -1 or an id >= 0, got {}", index, field, id));
    }
  }
  return Status::Ok();
}

}  // namespace

Result<Topology> Topology::FromMachine(const MachineSpec& spec) {
  const int n = static_cast<int>(spec.gpus.size());
  for (size_t i = 0; i < spec.gpus.size(); ++i) {
    RETURN_IF_ERROR(ValidatePlacement(spec.gpus[i], i).WithContext(fmt::format("machine '{}'", spec.name)));
  }
  if (spec.nvswitch_links < 0) {
    return Status::InvalidArgument(fmt::format("machine '{}': nvswitch_links must not be negative, got {}",
                                               spec.name, spec.nvswitch_links));
  }
  for (size_t k = 0; k < spec.nvlinks.size(); ++k) {
    const MachineSpec::NvLink& link = spec.nvlinks[k];
    const std::string where =
        fmt::format("machine '{}': nvlink {} ({}, {}, {} links)", spec.name, k, link.a, link.b, link.links);
    if (link.a < 0 || link.a >= n || link.b < 0 || link.b >= n) {
      return Status::InvalidArgument(fmt::format("{}: GPU index out of range 0..{}", where, n - 1));
    }
    if (link.a == link.b) return Status::InvalidArgument(fmt::format("{}: links a GPU to itself", where));
    if (link.links < 0) return Status::InvalidArgument(fmt::format("{}: negative link count", where));
  }

  Topology topology;
  topology.n_ = n;
  const size_t cells = static_cast<size_t>(n) * static_cast<size_t>(n);
  topology.scores_.assign(cells, 0);
  topology.nvlinks_.assign(cells, 0);
  // The diagonal is a GPU with itself: the nearest level, score 0.
  topology.levels_.assign(cells, PcieLevel::kSameBoard);
  const auto at = [n](int a, int b) { return static_cast<size_t>(a * n + b); };

  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      topology.levels_[at(a, b)] =
          PairLevel(spec.gpus[static_cast<size_t>(a)], spec.gpus[static_cast<size_t>(b)]);
      topology.nvlinks_[at(a, b)] = spec.nvswitch_links;
    }
  }
  for (const MachineSpec::NvLink& link : spec.nvlinks) {
    topology.nvlinks_[at(link.a, link.b)] += link.links;
    topology.nvlinks_[at(link.b, link.a)] += link.links;
  }
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      const int links = topology.nvlinks_[at(a, b)];
      topology.scores_[at(a, b)] = PcieLevelScore(topology.levels_[at(a, b)]) + 100 * links;
      if (links > 0) topology.has_nvlink_ = true;
    }
  }
  return topology;
}

Topology Topology::Flat(int gpu_count) {
  Topology topology;
  const int n = gpu_count > 0 ? gpu_count : 0;
  topology.n_ = n;
  const size_t cells = static_cast<size_t>(n) * static_cast<size_t>(n);
  topology.scores_.assign(cells, PcieLevelScore(PcieLevel::kCrossCpu));
  topology.nvlinks_.assign(cells, 0);
  topology.levels_.assign(cells, PcieLevel::kCrossCpu);
  for (int i = 0; i < n; ++i) {
    const size_t diagonal = static_cast<size_t>(i * n + i);
    topology.scores_[diagonal] = 0;
    topology.levels_[diagonal] = PcieLevel::kSameBoard;
  }
  return topology;
}

int Topology::SetScore(const std::vector<int>& gpus) const {
  int total = 0;
  for (size_t i = 0; i < gpus.size(); ++i) {
    for (size_t j = i + 1; j < gpus.size(); ++j) total += Score(gpus[i], gpus[j]);
  }
  return total;
}

namespace {

// GPUs 0..3 on socket 0 (NUMA node 0, host bridge 0), 4..7 on socket 1; two GPUs per leaf switch and
// the two leaf switches of a socket under one root switch. The PCIe layout of DGX/HGX baseboards.
std::vector<GpuPlacementSpec> EightGpusTwoSockets() {
  std::vector<GpuPlacementSpec> gpus;
  for (int i = 0; i < 8; ++i) {
    const int socket = i / 4;
    gpus.push_back({.numa_node = socket, .host_bridge = socket, .root_switch = socket, .leaf_switch = i / 2});
  }
  return gpus;
}

MachineSpec NvSwitchBaseboard(std::string name, std::string model, int links) {
  MachineSpec spec;
  spec.name = std::move(name);
  spec.gpu_model = std::move(model);
  spec.gpus = EightGpusTwoSockets();
  spec.nvswitch_links = links;
  return spec;
}

MachineSpec DgxA100() {
  return NvSwitchBaseboard("dgx-a100", "A100-80GB", 12);
}
MachineSpec DgxH100() {
  return NvSwitchBaseboard("dgx-h100", "H100-80GB", 18);
}
MachineSpec HgxH200() {
  return NvSwitchBaseboard("hgx-h200", "H200-141GB", 18);
}

MachineSpec Pcie4GpuNvlinkPairs() {
  MachineSpec spec;
  spec.name = "pcie-4gpu-nvlink-pairs";
  spec.gpu_model = "A100-80GB";
  for (int i = 0; i < 4; ++i) {
    const int socket = i / 2;
    spec.gpus.push_back({.numa_node = socket, .host_bridge = socket, .leaf_switch = socket});
  }
  spec.nvlinks = {{.a = 0, .b = 1, .links = 12}, {.a = 2, .b = 3, .links = 12}};
  return spec;
}

MachineSpec Pcie2Gpu() {
  MachineSpec spec;
  spec.name = "pcie-2gpu";
  spec.gpu_model = "A10";
  spec.gpus = {{.numa_node = 0, .host_bridge = 0}, {.numa_node = 0, .host_bridge = 0}};
  return spec;
}

MachineSpec Pcie8Gpu() {
  MachineSpec spec;
  spec.name = "pcie-8gpu";
  spec.gpu_model = "T4";
  spec.gpus = EightGpusTwoSockets();
  return spec;
}

struct Preset {
  const char* name;
  MachineSpec (*make)();
};

constexpr std::array<Preset, 6> kPresets = {{
    {"dgx-a100", &DgxA100},
    {"dgx-h100", &DgxH100},
    {"hgx-h200", &HgxH200},
    {"pcie-4gpu-nvlink-pairs", &Pcie4GpuNvlinkPairs},
    {"pcie-2gpu", &Pcie2Gpu},
    {"pcie-8gpu", &Pcie8Gpu},
}};

}  // namespace

Result<MachineSpec> MachinePreset(const std::string& name) {
  for (const Preset& preset : kPresets) {
    if (name == preset.name) return preset.make();
  }
  std::string known;
  for (const Preset& preset : kPresets) {
    if (!known.empty()) known += ", ";
    known += preset.name;
  }
  return Status::NotFound(fmt::format("unknown machine preset '{}' (known: {})", name, known));
}

std::vector<std::string> MachinePresetNames() {
  std::vector<std::string> names;
  for (const Preset& preset : kPresets) names.emplace_back(preset.name);
  return names;
}

}  // namespace gpupool
