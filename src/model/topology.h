// GPU-to-GPU topology of one node as a matrix of link scores. The scoring follows the convention
// of NVIDIA's device plugin allocator: a pair's score is its PCIe level score plus 100 per
// NVLink link between them.
//
//   PCIe level           score   meaning
//   kSameBoard             60    on one board (multi-GPU card)
//   kSingleSwitch          50    under one PCIe switch
//   kMultiSwitch           40    under several switches below one root port
//   kHostBridge            30    under one host bridge
//   kSameNuma              20    same NUMA node / CPU socket, different host bridges
//   kCrossCpu              10    across CPU sockets (SMP interconnect)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace gpupool {

enum class PcieLevel : uint8_t {
  kSameBoard,
  kSingleSwitch,
  kMultiSwitch,
  kHostBridge,
  kSameNuma,
  kCrossCpu,
};

int PcieLevelScore(PcieLevel level);
std::string_view PcieLevelName(PcieLevel level);

// Where one GPU sits. Ids are only compared for equality within one machine; -1 means "none".
struct GpuPlacementSpec {
  int numa_node = 0;
  int host_bridge = 0;
  int root_switch = -1;  // upstream PCIe switch shared by several leaf switches
  int leaf_switch = -1;  // PCIe switch the GPU hangs from
  int board = -1;        // multi-GPU card id
};

// A machine as a spec: per-GPU PCIe placement plus NVLink links between pairs.
struct MachineSpec {
  std::string name;
  std::string gpu_model;
  std::vector<GpuPlacementSpec> gpus;
  // NVLink links between pairs; (a, b, links). With an NVSwitch fabric set nvswitch_links instead.
  struct NvLink {
    int a = 0;
    int b = 0;
    int links = 0;
  };
  std::vector<NvLink> nvlinks;
  int nvswitch_links = 0;  // > 0: every pair is connected through NVSwitch with this many links
};

class Topology {
 public:
  Topology() = default;
  // Builds the matrix. Fails on out-of-range or self links, or negative link counts.
  static Result<Topology> FromMachine(const MachineSpec& spec);
  // A node whose topology is unknown: every pair scores as kCrossCpu, no NVLink.
  static Topology Flat(int gpu_count);

  int gpu_count() const { return n_; }
  // Pair score; 0 on the diagonal.
  int Score(int a, int b) const { return scores_[static_cast<size_t>(a * n_ + b)]; }
  int NvLinks(int a, int b) const { return nvlinks_[static_cast<size_t>(a * n_ + b)]; }
  PcieLevel Level(int a, int b) const { return levels_[static_cast<size_t>(a * n_ + b)]; }
  // Sum of pair scores over all pairs in `gpus`.
  int SetScore(const std::vector<int>& gpus) const;
  bool has_nvlink() const { return has_nvlink_; }

 private:
  int n_ = 0;
  bool has_nvlink_ = false;
  std::vector<int> scores_;
  std::vector<int> nvlinks_;
  std::vector<PcieLevel> levels_;
};

// Presets for common machines. Names:
//   "dgx-a100"        8x A100-80GB SXM4, NVSwitch (12 links per pair), 2 sockets, 4 GPUs each
//   "dgx-h100"        8x H100-80GB SXM5, NVSwitch (18 links per pair), 2 sockets
//   "hgx-h200"        8x H200-141GB SXM, NVSwitch (18 links per pair), 2 sockets
//   "pcie-4gpu-nvlink-pairs"  4x A100-80GB PCIe, bridges on (0,1) and (2,3) with 12 links,
//                     pairs under one switch each, the two switches on different sockets
//   "pcie-2gpu"       2x A10 PCIe on one host bridge, no NVLink
//   "pcie-8gpu"       8x T4 PCIe: two switches per socket, two GPUs per switch
Result<MachineSpec> MachinePreset(const std::string& name);
std::vector<std::string> MachinePresetNames();

}  // namespace gpupool
