#include "model/node.h"

#include <fmt/format.h>

#include <utility>

namespace gpupool {

namespace {

// The catalog's canonical name for `model`, or `model` itself when the catalog does not know it.
std::string CanonicalModel(const std::string& model, const GpuCatalog& catalog) {
  const GpuModelSpec* spec = catalog.Find(model);
  return spec != nullptr ? spec->name : model;
}

// GPU `index` of `node`, filled in from the catalog. Unknown models keep their name and have
// memory 0 (unknown), so per-GPU memory requests do not fit on them.
GpuDevice MakeGpu(const std::string& node, int index, const std::string& model, int numa_node,
                  const GpuCatalog& catalog) {
  GpuDevice gpu;
  gpu.index = index;
  gpu.uuid = fmt::format("GPU-{}-{}", node, index);
  gpu.model = model;
  gpu.numa_node = numa_node;
  if (const GpuModelSpec* spec = catalog.Find(model)) {
    gpu.model = spec->name;
    gpu.memory = spec->memory;
    gpu.sm_count = spec->sm_count;
    gpu.compute_capability = spec->compute_capability;
  }
  return gpu;
}

Status CheckNodeSpec(const NodeSpec& spec, const GpuCatalog& catalog) {
  if (spec.name.empty()) return Status::InvalidArgument("name must not be empty");
  if (spec.cpu.units() < 0) {
    return Status::InvalidArgument(fmt::format("cpu must not be negative, got {}m", spec.cpu.units()));
  }
  if (spec.memory.units() < 0) {
    return Status::InvalidArgument(fmt::format("memory must not be negative, got {}Mi", spec.memory.units()));
  }
  if (spec.max_tasks < 0) {
    return Status::InvalidArgument(fmt::format("max_tasks must not be negative, got {}", spec.max_tasks));
  }
  const std::string model =
      spec.gpus.empty() ? std::string() : CanonicalModel(spec.gpus.front().model, catalog);
  for (size_t i = 0; i < spec.gpus.size(); ++i) {
    const GpuDevice& gpu = spec.gpus[i];
    if (gpu.index != static_cast<int>(i)) {
      return Status::InvalidArgument(
          fmt::format("GPU at position {} has index {}; indices must be 0..{} in order", i, gpu.index,
                      spec.gpus.size() - 1));
    }
    if (gpu.memory.units() < 0) {
      return Status::InvalidArgument(
          fmt::format("GPU {}: memory must not be negative, got {}Mi", i, gpu.memory.units()));
    }
    if (CanonicalModel(gpu.model, catalog) != model) {
      return Status::InvalidArgument(
          fmt::format("GPU {} is a '{}' but GPU 0 is a '{}'; a node has one GPU model", i, gpu.model,
                      spec.gpus.front().model));
    }
    if (gpu.mig_enabled) {
      const GpuModelSpec* model_spec = catalog.Find(gpu.model);
      if (model_spec == nullptr || !model_spec->mig.has_value()) {
        return Status::InvalidArgument(
            fmt::format("GPU {}: MIG mode is on but model '{}' is not MIG-capable", i, gpu.model));
      }
    }
  }
  if (spec.topology.gpu_count() != static_cast<int>(spec.gpus.size())) {
    return Status::InvalidArgument(fmt::format("topology covers {} GPUs but the node has {}",
                                               spec.topology.gpu_count(), spec.gpus.size()));
  }
  return Status::Ok();
}

}  // namespace

Status ValidateNodeSpec(const NodeSpec& spec, const GpuCatalog& catalog) {
  return CheckNodeSpec(spec, catalog).WithContext(fmt::format("node '{}'", spec.name));
}

std::string EnforceLabel(uint8_t bit) {
  const char* what = bit == kEnforceLimiter             ? "limiter"
                     : bit == kEnforceLimiterContainer ? "limiter-container"
                     : bit == kEnforceMps              ? "mps"
                                                       : nullptr;
  return what == nullptr ? std::string() : std::string(kEnforceLabelPrefix) + what;
}

uint8_t ShareEnforcementOf(const std::map<std::string, std::string>& labels) {
  uint8_t bits = 0;
  for (uint8_t bit : kEnforceBits) {
    auto it = labels.find(EnforceLabel(bit));
    if (it != labels.end() && it->second == "true") bits |= bit;
  }
  return bits;
}

NodeSpec MakeNode(const std::string& name, MilliCpu cpu, MiB memory, int gpu_count, const std::string& model,
                  const GpuCatalog& catalog) {
  NodeSpec node;
  node.name = name;
  node.cpu = cpu;
  node.memory = memory;
  for (int i = 0; i < gpu_count; ++i) node.gpus.push_back(MakeGpu(name, i, model, /*numa_node=*/0, catalog));
  node.topology = Topology::Flat(gpu_count);
  return node;
}

Result<NodeSpec> MakeNodeFromMachine(const std::string& name, MilliCpu cpu, MiB memory,
                                     const MachineSpec& machine, const GpuCatalog& catalog) {
  Result<Topology> topology = Topology::FromMachine(machine);
  if (!topology.ok()) return topology.status().WithContext(fmt::format("node '{}'", name));
  NodeSpec node;
  node.name = name;
  node.cpu = cpu;
  node.memory = memory;
  for (size_t i = 0; i < machine.gpus.size(); ++i) {
    node.gpus.push_back(
        MakeGpu(name, static_cast<int>(i), machine.gpu_model, machine.gpus[i].numa_node, catalog));
  }
  node.topology = std::move(topology).value();
  RETURN_IF_ERROR(ValidateNodeSpec(node, catalog));
  return node;
}

}  // namespace gpupool
