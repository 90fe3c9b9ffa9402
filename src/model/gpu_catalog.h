// What the pool knows about GPU models: memory, SM count, compute capability and the MIG
// geometry. MIG capability comes from these data tables, never from model names in the logic.
// Figures for the MIG tables: NVIDIA's MIG user guide and the gpu-operator's mig-manager
// configurations (see docs/design.md, "GPU catalog").
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/quantity.h"

namespace gpupool {

struct ComputeCapability {
  int major = 0;
  int minor = 0;
  auto operator<=>(const ComputeCapability&) const = default;
};

// One GPU-instance profile of a MIG-capable GPU, e.g. "3g.40gb" on an A100-80GB.
struct MigProfile {
  int driver_id = 0;              // NVML profile id (19, 20, 15, 14, 9, 5, 0)
  std::string name;               // "1g.10gb", "1g.10gb+me", "3g.40gb"
  int compute_slices = 0;         // of 7
  int memory_slices = 0;          // of 8; also the size of a placement
  MiB memory{0};                  // usable memory of the instance
  int max_instances = 0;          // how many fit on one GPU at most
  uint8_t valid_starts = 0;       // bit s set: a placement may start at memory slice s
  bool media_extensions = false;  // "+me": takes the GPU's only media engine set
};

// The MIG geometry of one GPU model.
struct MigGeometry {
  int total_compute_slices = 7;
  int total_memory_slices = 8;
  std::vector<MigProfile> profiles;

  // The profile named exactly `name` ("3g.40gb"), or the standard profile with that many compute
  // slices for a short name ("3g": profile ids 19, 14, 9, 5, 0). nullptr when none matches.
  const MigProfile* Find(std::string_view name) const;
};

struct GpuModelSpec {
  std::string name;                  // canonical, e.g. "A100-80GB"
  std::vector<std::string> aliases;  // other names that mean this model ("A100-SXM4-80GB")
  MiB memory{0};                     // 0 when the catalog does not know it
  int sm_count = 0;                  // 0 when unknown
  ComputeCapability compute_capability;
  std::optional<MigGeometry> mig;  // empty: not MIG-capable
  int nvlinks = 0;                 // NVLink links per GPU on its usual board (0: PCIe only)
};

// A read-only table of GPU models. Cheap to copy around by reference; build once.
class GpuCatalog {
 public:
  GpuCatalog() = default;
  explicit GpuCatalog(std::vector<GpuModelSpec> models) : models_(std::move(models)) {}

  // The models gpupool ships with: A100-40GB, A100-80GB, H100-80GB, H200-141GB (MIG-capable),
  // and the models of the Alibaba traces (T4, P100, V100M16, V100M32, A10, G2, G3).
  static GpuCatalog Builtin();

  // Lookup by canonical name or alias, case-sensitive. nullptr when unknown.
  const GpuModelSpec* Find(std::string_view name) const;
  std::span<const GpuModelSpec> models() const { return models_; }

 private:
  std::vector<GpuModelSpec> models_;
};

}  // namespace gpupool
