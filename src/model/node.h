// Nodes and their GPUs as the pool sees them: static inventory only. What is free on a node
// lives in the Ledger (model/ledger.h), the only place that changes capacity.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/quantity.h"
#include "common/status.h"
#include "model/gpu_catalog.h"
#include "model/topology.h"
#include "model/workload.h"

namespace gpupool {

struct GpuDevice {
  int index = 0;      // position on the node, 0-based
  std::string uuid;   // "GPU-…" from NVML; synthesised for simulated GPUs
  std::string model;  // canonical catalog name when known ("A100-80GB"), else as reported
  MiB memory{0};      // 0: unknown (trace nodes); per-GPU memory requests then do not fit
  int sm_count = 0;
  ComputeCapability compute_capability;
  int numa_node = 0;
  bool healthy = true;
  bool mig_enabled = false;  // MIG mode on: the GPU serves MIG requests only
};

// What a node's agent offers its containers, advertised as labels (value "true") at registration
// (docs/agent.md#runtime-classes): each container runtime class it can run, and a pod network.
inline constexpr const char* kRuntimeClassLabelPrefix = "gpupool.io/runtime-";
inline constexpr const char* kPodNetworkLabel = "gpupool.io/network-pod";
// What holds GPU shares to their size on the node (model/workload.h kEnforce*), advertised the same
// way: "gpupool.io/enforce-limiter", "-limiter-container", "-mps".
inline constexpr const char* kEnforceLabelPrefix = "gpupool.io/enforce-";
// The kEnforce* bits of a node's labels (each "true" label of the three).
uint8_t ShareEnforcementOf(const std::map<std::string, std::string>& labels);
// The label that advertises `bit` ("" for an unknown bit).
std::string EnforceLabel(uint8_t bit);

struct NodeSpec {
  std::string name;
  MilliCpu cpu{0};
  MiB memory{0};
  std::vector<GpuDevice> gpus;  // all of one model
  Topology topology;            // gpu_count() == gpus.size(); Flat() when unknown
  std::map<std::string, std::string> labels;
  bool healthy = true;
  int max_tasks = 0;  // 0: no limit
};

// Checks a spec: a name, non-negative capacity, GPU indices 0..n-1, one GPU model per node, a
// topology of the right size, MIG mode only on MIG-capable models. The error names the node.
Status ValidateNodeSpec(const NodeSpec& spec, const GpuCatalog& catalog);

// A node with `gpu_count` GPUs of `model`, filled in from the catalog (memory, SMs, compute
// capability; canonical model name), flat topology, UUIDs "GPU-<node>-<i>".
NodeSpec MakeNode(const std::string& name, MilliCpu cpu, MiB memory, int gpu_count, const std::string& model,
                  const GpuCatalog& catalog);

// A node built from a machine spec (model, GPU count and topology from the machine).
Result<NodeSpec> MakeNodeFromMachine(const std::string& name, MilliCpu cpu, MiB memory,
                                     const MachineSpec& machine, const GpuCatalog& catalog);

}  // namespace gpupool
