#include "model/gpu_catalog.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <utility>

namespace gpupool {

namespace {

// The shape of each MIG GPU-instance profile. It is the same on every MIG-capable model in the
// catalog (7 compute slices, 8 memory slices); only the memory per slice, and so the names,
// differ. Counts: gpu-operator's mig-manager `all-<profile>` configs; placements: `nvidia-smi mig
// -lgipp` in NVIDIA's MIG user guide.
struct MigShape {
  int driver_id;
  int compute_slices;
  int memory_slices;
  int max_instances;
  uint8_t valid_starts;  // bit s: may start at memory slice s
  bool media_extensions;
};

constexpr std::array<MigShape, 7> kMigShapes = {{
    {19, 1, 1, 7, 0b0111'1111, false},  // 1g          starts 0..6
    {20, 1, 1, 1, 0b0111'1111, true},   // 1g+me       starts 0..6
    {15, 1, 2, 4, 0b0101'0101, false},  // 1g, 2 mem   starts 0, 2, 4, 6
    {14, 2, 2, 3, 0b0001'0101, false},  // 2g          starts 0, 2, 4
    {9, 3, 4, 2, 0b0001'0001, false},   // 3g          starts 0, 4
    {5, 4, 4, 1, 0b0000'0001, false},   // 4g          start 0
    {0, 7, 8, 1, 0b0000'0001, false},   // 7g          start 0
}};

// The profiles a short name ("3g") stands for: the plain profile with that many compute slices.
// 20 (+me) and 15 (1g with two memory slices) are variants, never the default.
constexpr std::array<int, 5> kStandardProfileIds = {19, 14, 9, 5, 0};

// NVIDIA's marketing GB figure of a profile with 1, 2, 4 and 8 memory slices on one model; the
// profile names are "<compute>g.<GB>gb" plus "+me" for the media-extensions profile.
struct MigMemoryGb {
  int one_slice;
  int two_slices;
  int four_slices;
  int eight_slices;

  int ForSlices(int slices) const {
    switch (slices) {
      case 1: return one_slice;
      case 2: return two_slices;
      case 4: return four_slices;
      default: return eight_slices;
    }
  }
};

MigGeometry MakeMigGeometry(const MigMemoryGb& gb) {
  MigGeometry geometry;
  geometry.total_compute_slices = 7;
  geometry.total_memory_slices = 8;
  for (const MigShape& shape : kMigShapes) {
    const int profile_gb = gb.ForSlices(shape.memory_slices);
    MigProfile profile;
    profile.driver_id = shape.driver_id;
    profile.name =
        fmt::format("{}g.{}gb{}", shape.compute_slices, profile_gb, shape.media_extensions ? "+me" : "");
    profile.compute_slices = shape.compute_slices;
    profile.memory_slices = shape.memory_slices;
    // GB figure x 1024 MiB. The usable memory the driver reports is a little lower (the names are
    // rounded up), but this is close enough for placement and for memory-fit checks.
    profile.memory = MiB(int64_t{profile_gb} * 1024);
    profile.max_instances = shape.max_instances;
    profile.valid_starts = shape.valid_starts;
    profile.media_extensions = shape.media_extensions;
    geometry.profiles.push_back(std::move(profile));
  }
  return geometry;
}

GpuModelSpec Model(std::string name, std::vector<std::string> aliases, int64_t memory_mib, int sm_count,
                   ComputeCapability cc, int nvlinks) {
  GpuModelSpec spec;
  spec.name = std::move(name);
  spec.aliases = std::move(aliases);
  spec.memory = MiB(memory_mib);
  spec.sm_count = sm_count;
  spec.compute_capability = cc;
  spec.nvlinks = nvlinks;
  return spec;
}

GpuModelSpec MigModel(std::string name, std::vector<std::string> aliases, int64_t memory_mib, int sm_count,
                      ComputeCapability cc, int nvlinks, const MigMemoryGb& gb) {
  GpuModelSpec spec = Model(std::move(name), std::move(aliases), memory_mib, sm_count, cc, nvlinks);
  spec.mig = MakeMigGeometry(gb);
  return spec;
}

// "3g" -> 3; anything else -> 0.
int ShortProfileComputeSlices(std::string_view name) {
  if (name.size() < 2 || name.back() != 'g') return 0;
  const std::string_view digits = name.substr(0, name.size() - 1);
  int slices = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), slices);
  if (ec != std::errc() || end != digits.data() + digits.size() || slices <= 0) return 0;
  return slices;
}

}  // namespace

const MigProfile* MigGeometry::Find(std::string_view name) const {
  for (const MigProfile& profile : profiles) {
    if (profile.name == name) return &profile;
  }
  const int slices = ShortProfileComputeSlices(name);
  if (slices == 0) return nullptr;
  for (const MigProfile& profile : profiles) {
    const bool standard = std::find(kStandardProfileIds.begin(), kStandardProfileIds.end(),
                                    profile.driver_id) != kStandardProfileIds.end();
    if (standard && profile.compute_slices == slices) return &profile;
  }
  return nullptr;
}

GpuCatalog GpuCatalog::Builtin() {
  std::vector<GpuModelSpec> models;
  // MIG-capable models. Memory is the full frame buffer (141 GiB for the H200).
  models.push_back(MigModel(
      "A100-40GB", {"A100-SXM4-40GB", "A100-PCIE-40GB", "NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"},
      40960, 108, {8, 0}, 12, {5, 10, 20, 40}));
  models.push_back(MigModel("A100-80GB",
                            {"A100-SXM4-80GB", "A100-PCIE-80GB", "NVIDIA A100-SXM4-80GB",
                             "NVIDIA A100-PCIE-80GB", "NVIDIA A100 80GB PCIe"},
                            81920, 108, {8, 0}, 12, {10, 20, 40, 80}));
  models.push_back(MigModel("H100-80GB",
                            {"H100-SXM5-80GB", "H100-PCIE-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"},
                            81920, 132, {9, 0}, 18, {10, 20, 40, 80}));
  models.push_back(MigModel("H200-141GB", {"H200", "H200-SXM-141GB", "NVIDIA H200", "NVIDIA H200 NVL"},
                            144384, 132, {9, 0}, 18, {18, 35, 71, 141}));

  // The models of the Alibaba traces, named as the traces write them.
  models.push_back(Model("T4", {"Tesla T4", "NVIDIA T4"}, 15360, 40, {7, 5}, 0));
  models.push_back(Model("P100", {"Tesla P100-PCIE-16GB", "Tesla P100-SXM2-16GB"}, 16384, 56, {6, 0}, 0));
  models.push_back(Model("V100M16", {"V100-16GB", "Tesla V100-SXM2-16GB"}, 16384, 80, {7, 0}, 6));
  models.push_back(Model("V100M32", {"V100-32GB", "Tesla V100-SXM2-32GB"}, 32768, 80, {7, 0}, 6));
  models.push_back(Model("A10", {"NVIDIA A10"}, 23028, 72, {8, 6}, 0));
  // G2 and G3 are anonymised in the trace: memory, SM count and compute capability are unknown (0).
  models.push_back(Model("G2", {}, 0, 0, {0, 0}, 0));
  models.push_back(Model("G3", {}, 0, 0, {0, 0}, 0));

  // Other common PCIe inference cards.
  models.push_back(Model("L4", {"NVIDIA L4"}, 23034, 58, {8, 9}, 0));
  models.push_back(Model("L40S", {"NVIDIA L40S"}, 46068, 142, {8, 9}, 0));
  return GpuCatalog(std::move(models));
}

const GpuModelSpec* GpuCatalog::Find(std::string_view name) const {
  for (const GpuModelSpec& model : models_) {
    if (model.name == name) return &model;
  }
  for (const GpuModelSpec& model : models_) {
    for (const std::string& alias : model.aliases) {
      if (alias == name) return &model;
    }
  }
  return nullptr;
}

}  // namespace gpupool
