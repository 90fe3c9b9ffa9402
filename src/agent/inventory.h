// What a node agent knows about its machine's GPUs: discovered through NVML (agent/nvml.h) or
// simulated from a spec when the machine has none. The inventory turns into the node spec the
// agent registers with the server (docs/jobspec.md#node-spec).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace gpupool {

// A GPU-instance profile the device reports (MIG), as NVML's profile info gives it.
struct MigProfileInfo {
  int profile_id = 0;  // the driver's profile id (19, 14, 9, 5, 0, ...)
  std::string name;    // "1g.10gb", derived from slices and memory
  int slice_count = 0;
  int instance_count = 0;  // how many fit on the GPU
  int64_t memory_mib = 0;
};

// A MIG device that exists on a MIG-enabled GPU: one compute instance inside one GPU instance, as
// NVML enumerates it (the agent creates missing ones for mig tasks: agent_mig.cc). CUDA addresses it
// by `uuid`.
struct MigInstanceInfo {
  std::string uuid;     // "MIG-4f5e..." (CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES take it)
  int profile_id = -1;  // the GPU instance's profile id (19, 14, 9, ...); -1 when unreadable
  std::string profile;  // "3g.40gb", named as in `mig_profiles`; empty when unknown
  int start = -1;       // placement: first memory slice; -1 when unreadable
  int size = 0;         // placement: memory slices
  int gpu_instance_id = -1;
  int compute_instance_id = -1;
};

struct GpuProcessInfo {
  uint32_t pid = 0;
  int64_t used_memory_bytes = 0;
  int gpu_instance_id = -1;  // MIG: the GPU instance it runs in; -1 when not in MIG mode or unknown
};

struct GpuInfo {
  int index = 0;
  std::string uuid;              // "GPU-8f3c...", or "GPU-sim-<node>-<index>" when simulated
  std::string name;              // as the device names itself ("NVIDIA H100 80GB HBM3")
  std::string model;             // gpupool catalog name when known ("H100-80GB"), else `name`
  int64_t memory_bytes = 0;      // total framebuffer
  std::string compute_capability;  // "9.0"; empty when unknown
  std::string pci_bus_id;        // "00000000:18:00.0"; empty when simulated
  int numa_node = 0;
  int minor_number = -1;         // /dev/nvidia<minor>; -1 when unknown or simulated
  bool mig_enabled = false;
  std::vector<MigProfileInfo> mig_profiles;
  // MIG enabled: the instances that exist now (NVML only; a simulated GPU has none, its tasks get
  // synthetic instance UUIDs, see agent/task_env.h). Empty where the driver lacks the MIG device API.
  std::vector<MigInstanceInfo> mig_instances;
  bool healthy = true;
  std::string health_reason;     // why not healthy ("XID 79", "uncorrectable ECC errors: 3")
  std::vector<GpuProcessInfo> processes;
};

struct Inventory {
  bool simulated = false;
  std::string source;          // "nvml" or "simulated: <spec>"
  std::string driver_version;  // empty when simulated
  std::vector<GpuInfo> gpus;
  // Pair scores as in model/topology.h and the node spec's `topology` (0 on the diagonal);
  // empty: unknown (the server then treats every pair as across sockets).
  std::vector<std::vector<int>> topology;
};

// A simulated inventory for `node`, from either
//   - "<count>x<model>[-SXM|-PCIE]" with a catalog model ("8xH100-80GB-SXM", "4xA100-80GB",
//     "2xA10"): SXM (the default for A100/H100/H200) gives an NVSwitch topology like the
//     machine presets, PCIE gives pairs under switches; or
//   - a machine preset name of model/topology.h ("dgx-h100"); or
//   - a YAML machine spec: {gpuModel: H100-80GB, gpus: 8, nvswitchLinks: 18} or with an explicit
//     `topology` matrix and per-GPU `numaNode`; `migGpus: [0, 2]` puts those GPUs (of a
//     MIG-capable model) in MIG mode, with the model's catalog profiles.
// UUIDs are "GPU-sim-<node>-<index>". Errors name what is wrong with the spec.
Result<Inventory> SimulatedInventory(std::string_view spec, const std::string& node);

// A MIG-enabled GPU's layout as the server reads it from registration and heartbeats:
// [{"profileId": 9, "start": 4}, ...], one entry per GPU instance whose profile id and placement
// are known, sorted by start, at most 8. Callers add it for MIG-enabled GPUs of real inventories.
nlohmann::json MigLayoutJson(const GpuInfo& gpu);

// The body of POST /api/v1/agent/register for this inventory. A simulated node carries the label
// gpupool.io/simulated=true; every node carries gpupool.io/gpu-source=nvml|simulated.
nlohmann::json NodeRegistration(const Inventory& inv, const std::string& node, const std::string& cpu,
                                const std::string& memory, const std::map<std::string, std::string>& labels);

}  // namespace gpupool
