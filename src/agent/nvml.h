// NVML loaded at run time: dlopen("libnvidia-ml.so.1"), so neither the build nor a machine without
// NVIDIA's driver needs any NVIDIA package. The declarations are gpupool's own minimal ones (opaque
// handles, the few structs used, function-pointer types); no NVIDIA header is included.
//
// Tests load a fake libnvidia-ml.so.1 (tests/fake_nvml) through the very same path.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/inventory.h"
#include "common/status.h"

namespace gpupool {

// One sample of a GPU's counters, in base units. A field the device does not give stays empty and
// is left out of /metrics, never invented.
struct GpuSample {
  int index = 0;
  std::optional<double> sm_clock_hz;
  std::optional<double> memory_clock_hz;
  std::optional<double> memory_temperature_celsius;
  std::optional<double> gpu_temperature_celsius;
  std::optional<double> power_watts;
  std::optional<double> energy_joules_total;        // since driver load
  std::optional<double> pcie_replays_total;
  std::optional<double> gpu_utilization_ratio;      // 0..1
  std::optional<double> memory_copy_utilization_ratio;
  std::optional<double> encoder_utilization_ratio;
  std::optional<double> decoder_utilization_ratio;
  std::optional<double> last_xid;                   // value of the last XID error (0: none)
  std::optional<double> framebuffer_free_bytes;
  std::optional<double> framebuffer_used_bytes;
  std::optional<double> framebuffer_reserved_bytes;
  std::optional<double> nvlink_bandwidth_bytes_total;  // data TX + RX over all links, since load
  std::optional<double> vgpu_license_status;           // vGPU guests only: 1 licensed, 0 not
  std::optional<double> remapped_rows_uncorrectable_total;
  std::optional<double> remapped_rows_correctable_total;
  std::optional<double> row_remap_failure;          // 0 or 1
  std::optional<double> graphics_engine_active_ratio;  // GPM (Hopper+), between two Sample() calls
  std::optional<double> tensor_pipe_active_ratio;      // any tensor pipe
  std::optional<double> dram_active_ratio;             // DRAM bandwidth used / peak
  std::optional<double> pcie_tx_bytes_per_second;
  std::optional<double> pcie_rx_bytes_per_second;
};

// What the agent sends with every heartbeat about one GPU: health as Discover judges it (a critical
// XID seen since start, uncorrectable ECC errors, a failed row remapping) and a little telemetry.
struct GpuHealthSample {
  int index = 0;
  bool healthy = true;
  std::string reason;                                // "XID 79"; empty when healthy
  std::optional<double> temperature_celsius;
  std::optional<double> utilization;                 // 0..1
  std::optional<double> memory_used_fraction;        // framebuffer used / total, 0..1
};

class Nvml {
 public:
  // Opens `library` (default "libnvidia-ml.so.1"; then the usual driver directories), resolves the
  // entry points and calls nvmlInit. NotFound when the library is absent (the agent then says so
  // and simulates); Unavailable/Internal with NVML's own error string otherwise.
  static Result<std::unique_ptr<Nvml>> Load(const std::string& library = "");
  ~Nvml();  // nvmlShutdown, dlclose
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // Every GPU with identity, memory, PCI/NUMA placement, MIG mode, profiles and existing MIG
  // instances (UUID, GPU-instance profile and placement, instance ids), health (pending
  // XID events, uncorrectable ECC, remapping failure), processes, and the pair topology derived
  // from NVLink link counts and common PCIe ancestors.
  Result<Inventory> Discover();
  // Counters of every GPU now. Per-field failures (NOT_SUPPORTED, ...) leave the field empty.
  // The GPM ratios (graphics engine, tensor pipe, DRAM active) are averages since the previous
  // call's GPM sample: empty on the first call and on a call within 100 ms of the last sample.
  Result<std::vector<GpuSample>> Sample();
  // Health and temperature/utilisation/memory of every GPU now (no GPM sampling, so it does not
  // disturb the GPM averages of /metrics).
  Result<std::vector<GpuHealthSample>> Health();

  // MIG management (nvml_mig.cc; a privileged user, a GPU already in MIG mode: MIG mode itself is
  // never changed). Every NVML error comes back naming the call, the GPU, the profile and placement
  // and NVML's own text.
  //
  // Creates a GPU instance of GPU-instance profile `profile_id` (19, 14, 9, ...) placed at memory
  // slice `start` (the size is the profile's, as nvmlDeviceGetGpuInstancePossiblePlacements_v2
  // gives it), then one compute instance spanning all of it, and returns the new MIG device (UUID,
  // ids, placement). A failed compute instance destroys the GPU instance again.
  Result<MigInstanceInfo> CreateMigInstance(int gpu_index, int profile_id, int start);
  // Destroys every compute instance of GPU instance `gpu_instance_id` on GPU `gpu_index`, then the
  // GPU instance. NVML refuses (IN_USE) while a process runs on it.
  Status DestroyMigGpuInstance(int gpu_index, int gpu_instance_id);

  struct Impl;

 private:
  explicit Nvml(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpupool
