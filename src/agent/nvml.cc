#include "agent/nvml.h"

#include "agent/nvml_internal.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <set>
#include <utility>

#include "model/gpu_catalog.h"
#include "model/topology.h"

namespace gpupool {
namespace {

// ---- gpupool's own minimal declarations of the NVML C ABI (INTERFACES.md section 3) ----------
// Handles are opaque pointers; only the struct layouts gpupool reads are declared, field for field
// in the order and widths the ABI uses.

// The handles, error codes and MIG structs shared with nvml_mig.cc live in nvml_internal.h.
using namespace nvml_internal;  // NOLINT(google-build-using-namespace): this file's own ABI names

using NvmlEventSet = struct NvmlEventSetOpaque*;

constexpr NvmlReturn kErrNotSupported = 3;
constexpr NvmlReturn kErrTimeout = 10;

constexpr unsigned kNvLinkMaxLinks = 36;
constexpr unsigned kMaxGpuInstanceId = 1024;  // GPU instance ids are small; larger ones are garbage
constexpr unsigned long long kEventXidCritical = 0x8;
constexpr unsigned long long kValueNotAvailable = ~0ULL;

constexpr int kClockSm = 1;
constexpr int kClockMem = 2;
constexpr int kTemperatureGpu = 0;
constexpr int kMemoryErrorUncorrected = 1;
constexpr int kEccCounterVolatile = 0;
constexpr int kPcieCounterTx = 0;
constexpr int kPcieCounterRx = 1;
constexpr int kNvLinkDeviceSwitch = 2;  // NVML_NVLINK_DEVICE_TYPE_SWITCH (GPU 0, IBMNPU 1)

// Field values (nvmlDeviceGetFieldValues). Memory temperature is in degrees C; the NVLink data
// counters are KiB moved since the driver loaded (payload only, no protocol overhead), and scope
// UINT_MAX asks for the sum over all links instead of one link.
constexpr unsigned kFieldMemoryTemp = 82;     // NVML_FI_DEV_MEMORY_TEMP
constexpr unsigned kFieldNvLinkDataTx = 138;  // NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
constexpr unsigned kFieldNvLinkDataRx = 139;  // NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
constexpr unsigned kScopeAllLinks = UINT_MAX;
constexpr int kValueTypeDouble = 0;
constexpr int kValueTypeUnsignedInt = 1;
constexpr int kValueTypeUnsignedLong = 2;
constexpr int kValueTypeUnsignedLongLong = 3;
constexpr int kValueTypeSignedLongLong = 4;
constexpr int kValueTypeSignedInt = 5;
constexpr int kValueTypeUnsignedShort = 6;

// GPM (Hopper and later): metrics between two samples, in percent (0-100).
constexpr unsigned kGpmSupportVersion = 1;     // NVML_GPM_SUPPORT_VERSION
constexpr unsigned kGpmMetricsGetVersion = 1;  // NVML_GPM_METRICS_GET_VERSION
constexpr unsigned kGpmGraphicsUtil = 1;       // NVML_GPM_METRIC_GRAPHICS_UTIL
constexpr unsigned kGpmAnyTensorUtil = 5;      // NVML_GPM_METRIC_ANY_TENSOR_UTIL
constexpr unsigned kGpmDramBwUtil = 10;        // NVML_GPM_METRIC_DRAM_BW_UTIL
// The metrics array of nvmlGpmMetricsGet_t has NVML_GPM_METRIC_MAX entries, which grew across
// releases (98, 210, 333) under the same struct version; NVML reads and writes only numMetrics of
// them, and a larger array than the library's own is harmless, so the largest known size is used.
constexpr unsigned kGpmMetricCapacity = 333;
// NVML documents that two GPM samples must be more than 100 ms apart.
constexpr std::chrono::milliseconds kGpmMinInterval(100);

// vGPU software licensing, as a vGPU guest sees it.
constexpr int kVirtualizationVgpu = 2;  // NVML_GPU_VIRTUALIZATION_MODE_VGPU: a vGPU inside a VM
constexpr unsigned kGridLicenseFeatureMaxCount = 3;
constexpr unsigned kGridLicenseBufferSize = 128;

struct PciInfo {  // v3
  char bus_id_legacy[16];
  unsigned domain;
  unsigned bus;
  unsigned device;
  unsigned pci_device_id;
  unsigned pci_subsystem_id;
  char bus_id[32];
};

struct MemoryInfo {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

struct MemoryInfoV2 {
  unsigned version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
};

struct Utilization {
  unsigned gpu;
  unsigned memory;
};

struct ProcessInfo {
  unsigned pid;
  unsigned long long used_gpu_memory;
  unsigned gpu_instance_id;
  unsigned compute_instance_id;
};

struct EventData {
  NvmlDevice device;
  unsigned long long event_type;
  unsigned long long event_data;
  unsigned gpu_instance_id;
  unsigned compute_instance_id;
};

struct TemperatureV1 {
  unsigned version;
  int sensor_type;
  int temperature;
};

union FieldValueUnion {
  double d;
  unsigned ui;
  unsigned long ul;
  unsigned long long ull;
  long long sll;
  int si;
  unsigned short us;
};

struct FieldValue {
  unsigned field_id;
  unsigned scope_id;  // link id for NVLink fields; kScopeAllLinks: all links
  long long timestamp;
  long long latency_usec;
  int value_type;
  NvmlReturn nvml_return;  // per field: value is valid only when kSuccess
  FieldValueUnion value;
};
static_assert(sizeof(FieldValue) == 40, "nvmlFieldValue_t is 40 bytes");

using NvmlGpmSample = struct NvmlGpmSampleOpaque*;

struct GpmSupport {
  unsigned version;
  unsigned is_supported_device;
};

struct GpmMetric {
  unsigned metric_id;
  NvmlReturn nvml_return;  // per metric: value is valid only when kSuccess
  double value;
  struct {
    char* short_name;
    char* long_name;
    char* unit;
  } metric_info;
};
static_assert(sizeof(GpmMetric) == 40, "nvmlGpmMetric_t is 40 bytes");

struct GpmMetricsGet {
  unsigned version;
  unsigned num_metrics;
  NvmlGpmSample sample1;
  NvmlGpmSample sample2;
  GpmMetric metrics[kGpmMetricCapacity];
};

struct GridLicenseExpiry {
  unsigned year;
  unsigned short month;
  unsigned short day;
  unsigned short hour;
  unsigned short min;
  unsigned short sec;
  unsigned char status;
};

struct GridLicensableFeature {  // as of nvmlDeviceGetGridLicensableFeatures_v4
  int feature_code;
  unsigned feature_state;  // non-zero: currently licensed
  char license_info[kGridLicenseBufferSize];
  char product_name[kGridLicenseBufferSize];
  unsigned feature_enabled;
  GridLicenseExpiry license_expiry;
};

struct GridLicensableFeatures {
  int is_grid_license_supported;
  unsigned licensable_features_count;
  GridLicensableFeature features[kGridLicenseFeatureMaxCount];
};
static_assert(sizeof(GridLicensableFeatures) == 860, "nvmlGridLicensableFeatures_t (v4) is 860 bytes");

constexpr unsigned StructVersion(size_t size, unsigned v) {
  return static_cast<unsigned>(size) | (v << 24U);
}

// Function-pointer types, one per entry point used.
using InitFn = NvmlReturn (*)();
using ShutdownFn = NvmlReturn (*)();
using DriverVersionFn = NvmlReturn (*)(char*, unsigned);
using UllFn = NvmlReturn (*)(NvmlDevice, unsigned long long*);
using PciInfoFn = NvmlReturn (*)(NvmlDevice, PciInfo*);
using CudaCcFn = NvmlReturn (*)(NvmlDevice, int*, int*);
using MemoryInfoFn = NvmlReturn (*)(NvmlDevice, MemoryInfo*);
using MemoryInfoV2Fn = NvmlReturn (*)(NvmlDevice, MemoryInfoV2*);
using CommonAncestorFn = NvmlReturn (*)(NvmlDevice, NvmlDevice, int*);
using NvLinkStateFn = NvmlReturn (*)(NvmlDevice, unsigned, int*);
using NvLinkRemotePciFn = NvmlReturn (*)(NvmlDevice, unsigned, PciInfo*);
using NvLinkRemoteTypeFn = NvmlReturn (*)(NvmlDevice, unsigned, int*);
using ProcessesFn = NvmlReturn (*)(NvmlDevice, unsigned*, ProcessInfo*);
using EccFn = NvmlReturn (*)(NvmlDevice, int, int, unsigned long long*);
using EventSetCreateFn = NvmlReturn (*)(NvmlEventSet*);
using EventSetFreeFn = NvmlReturn (*)(NvmlEventSet);
using RegisterEventsFn = NvmlReturn (*)(NvmlDevice, unsigned long long, NvmlEventSet);
using EventSetWaitFn = NvmlReturn (*)(NvmlEventSet, EventData*, unsigned);
using ClockFn = NvmlReturn (*)(NvmlDevice, int, unsigned*);
using TemperatureFn = NvmlReturn (*)(NvmlDevice, int, unsigned*);
using TemperatureVFn = NvmlReturn (*)(NvmlDevice, TemperatureV1*);
using UtilizationFn = NvmlReturn (*)(NvmlDevice, Utilization*);
using CodecUtilFn = NvmlReturn (*)(NvmlDevice, unsigned*, unsigned*);
using RemappedRowsFn = NvmlReturn (*)(NvmlDevice, unsigned*, unsigned*, unsigned*, unsigned*);
using PcieThroughputFn = NvmlReturn (*)(NvmlDevice, int, unsigned*);
using FieldValuesFn = NvmlReturn (*)(NvmlDevice, int, FieldValue*);
using GpmQuerySupportFn = NvmlReturn (*)(NvmlDevice, GpmSupport*);
using GpmSampleAllocFn = NvmlReturn (*)(NvmlGpmSample*);
using GpmSampleFreeFn = NvmlReturn (*)(NvmlGpmSample);
using GpmSampleGetFn = NvmlReturn (*)(NvmlDevice, NvmlGpmSample);
using GpmMetricsGetFn = NvmlReturn (*)(GpmMetricsGet*);
using VirtualizationModeFn = NvmlReturn (*)(NvmlDevice, int*);
using GridLicensableFeaturesFn = NvmlReturn (*)(NvmlDevice, GridLicensableFeatures*);

// The value of a field whose own status is success, as a double; empty for a type unknown here.
std::optional<double> FieldNumber(const FieldValue& f) {
  if (f.nvml_return != kSuccess) return std::nullopt;
  switch (f.value_type) {
    case kValueTypeDouble: return f.value.d;
    case kValueTypeUnsignedInt: return static_cast<double>(f.value.ui);
    case kValueTypeUnsignedLong: return static_cast<double>(f.value.ul);
    case kValueTypeUnsignedLongLong: return static_cast<double>(f.value.ull);
    case kValueTypeSignedLongLong: return static_cast<double>(f.value.sll);
    case kValueTypeSignedInt: return static_cast<double>(f.value.si);
    case kValueTypeUnsignedShort: return static_cast<double>(f.value.us);
    default: return std::nullopt;
  }
}

// XIDs caused by the application rather than the GPU (illegal address, MMU fault from user code,
// preemptive cleanup, ...): reported as the last XID but they do not make the GPU unhealthy.
bool ApplicationXid(unsigned long long xid) {
  constexpr std::array<unsigned long long, 6> kApp = {13, 31, 43, 45, 68, 109};
  return std::find(kApp.begin(), kApp.end(), xid) != kApp.end();
}

PcieLevel LevelFromNvml(int level) {
  if (level <= 0) return PcieLevel::kSameBoard;
  if (level <= 10) return PcieLevel::kSingleSwitch;
  if (level <= 20) return PcieLevel::kMultiSwitch;
  if (level <= 30) return PcieLevel::kHostBridge;
  if (level <= 40) return PcieLevel::kSameNuma;
  return PcieLevel::kCrossCpu;
}

std::string CString(const char* buf, size_t cap) {
  return std::string(buf, strnlen(buf, cap));
}

// Catalog name for a device name: exact name or alias, then without the vendor prefix.
std::string CatalogModel(const GpuCatalog& catalog, const std::string& name) {
  if (const GpuModelSpec* m = catalog.Find(name)) return m->name;
  for (std::string_view prefix : {"NVIDIA ", "Tesla "}) {
    if (name.rfind(prefix, 0) == 0) {
      if (const GpuModelSpec* m = catalog.Find(std::string_view(name).substr(prefix.size()))) return m->name;
    }
  }
  return name;
}

}  // namespace

struct Nvml::Impl {
  std::mutex mu;  // Discover and Sample share the XID event state
  void* lib = nullptr;
  std::string path;
  bool initialized = false;

  InitFn init = nullptr;
  ShutdownFn shutdown = nullptr;
  ErrorStringFn error_string = nullptr;
  DriverVersionFn driver_version = nullptr;
  CountFn device_count = nullptr;
  HandleByIndexFn handle_by_index = nullptr;
  StringFn uuid = nullptr;
  StringFn name = nullptr;
  UintFn minor_number = nullptr;
  PciInfoFn pci_info = nullptr;
  CudaCcFn cuda_cc = nullptr;
  UintFn numa_node = nullptr;
  MemoryInfoFn memory_info = nullptr;
  MemoryInfoV2Fn memory_info_v2 = nullptr;
  MigModeFn mig_mode = nullptr;
  GiProfileInfoFn gi_profile_info = nullptr;
  UintFn max_mig_devices = nullptr;
  MigHandleByIndexFn mig_handle_by_index = nullptr;
  UintFn gpu_instance_id = nullptr;
  UintFn compute_instance_id = nullptr;
  GpuInstanceByIdFn gpu_instance_by_id = nullptr;
  GpuInstanceInfoFn gpu_instance_info = nullptr;
  CommonAncestorFn common_ancestor = nullptr;
  NvLinkStateFn nvlink_state = nullptr;
  NvLinkRemotePciFn nvlink_remote_pci = nullptr;
  NvLinkRemoteTypeFn nvlink_remote_type = nullptr;  // optional (newer drivers)
  ProcessesFn processes = nullptr;
  EccFn total_ecc = nullptr;
  EventSetCreateFn event_set_create = nullptr;
  EventSetFreeFn event_set_free = nullptr;
  RegisterEventsFn register_events = nullptr;
  EventSetWaitFn event_set_wait = nullptr;
  ClockFn clock_info = nullptr;
  TemperatureFn temperature = nullptr;
  TemperatureVFn temperature_v = nullptr;
  UintFn power_usage = nullptr;
  UllFn total_energy = nullptr;
  UtilizationFn utilization = nullptr;
  CodecUtilFn encoder_util = nullptr;
  CodecUtilFn decoder_util = nullptr;
  UintFn pcie_replay = nullptr;
  RemappedRowsFn remapped_rows = nullptr;
  PcieThroughputFn pcie_throughput = nullptr;
  FieldValuesFn field_values = nullptr;
  GpmQuerySupportFn gpm_query_support = nullptr;
  GpmSampleAllocFn gpm_sample_alloc = nullptr;
  GpmSampleFreeFn gpm_sample_free = nullptr;
  GpmSampleGetFn gpm_sample_get = nullptr;
  GpmMetricsGetFn gpm_metrics_get = nullptr;
  VirtualizationModeFn virtualization_mode = nullptr;
  GridLicensableFeaturesFn grid_licensable_features = nullptr;

  // GPM per device index: two sample buffers, the older holding the previous Sample()'s reading.
  struct GpmState {
    NvmlDevice device = nullptr;  // the handle the state belongs to
    bool checked = false;         // support queried
    bool supported = false;
    NvmlGpmSample previous = nullptr;
    NvmlGpmSample next = nullptr;
    bool have_previous = false;
    std::chrono::steady_clock::time_point previous_at;
  };
  std::vector<GpmState> gpm;

  // XID health: one event set for all devices, drained without waiting on every Discover/Sample.
  NvmlEventSet events = nullptr;
  std::vector<NvmlDevice> registered;                       // devices whose XID events are watched
  std::vector<std::optional<unsigned long long>> last_xid;  // per index; empty: not watched
  std::vector<unsigned long long> critical_xid;             // per index; 0: none seen

  std::string Error(NvmlReturn r) const {
    const char* text = error_string != nullptr ? error_string(r) : nullptr;
    return fmt::format("{} (NVML error {})", text != nullptr ? text : "unknown error", r);
  }

  template <typename Fn>
  Fn Sym(const char* symbol) const {
    return reinterpret_cast<Fn>(dlsym(lib, symbol));
  }

  Result<std::vector<NvmlDevice>> Devices() const {
    unsigned count = 0;
    if (NvmlReturn r = device_count(&count); r != kSuccess) {
      return Status::Internal("nvmlDeviceGetCount_v2: " + Error(r));
    }
    std::vector<NvmlDevice> devices(count, nullptr);
    for (unsigned i = 0; i < count; ++i) {
      if (NvmlReturn r = handle_by_index(i, &devices[i]); r != kSuccess) {
        return Status::Internal(fmt::format("nvmlDeviceGetHandleByIndex_v2({}): {}", i, Error(r)));
      }
    }
    return devices;
  }

  // Registers XID events once per device and drains what is pending (timeout 0).
  void PollXids(const std::vector<NvmlDevice>& devices) {
    if (event_set_create == nullptr || register_events == nullptr || event_set_wait == nullptr) return;
    if (events == nullptr && event_set_create(&events) != kSuccess) {
      events = nullptr;
      return;
    }
    last_xid.resize(devices.size());
    critical_xid.resize(devices.size(), 0);
    registered.resize(devices.size(), nullptr);
    for (size_t i = 0; i < devices.size(); ++i) {
      if (registered[i] == devices[i]) continue;
      if (register_events(devices[i], kEventXidCritical, events) == kSuccess) {
        registered[i] = devices[i];
        if (!last_xid[i]) last_xid[i] = 0;
      }
    }
    for (int guard = 0; guard < 4096; ++guard) {
      EventData data{};
      if (event_set_wait(events, &data, 0) != kSuccess) break;  // TIMEOUT: nothing pending
      if ((data.event_type & kEventXidCritical) == 0) continue;
      for (size_t i = 0; i < devices.size(); ++i) {
        if (devices[i] != data.device) continue;
        last_xid[i] = data.event_data;
        if (!ApplicationXid(data.event_data)) critical_xid[i] = data.event_data;
      }
    }
  }

  void FreeGpm(GpmState& g) const {
    for (NvmlGpmSample* sample : {&g.previous, &g.next}) {
      if (*sample != nullptr && gpm_sample_free != nullptr) gpm_sample_free(*sample);
      *sample = nullptr;
    }
    g = GpmState();
  }

  // Memory temperature and NVLink data bytes through nvmlDeviceGetFieldValues; each field carries
  // its own status, and one the device cannot give stays empty.
  void FillFieldValues(NvmlDevice dev, GpuSample& s) const {
    if (field_values == nullptr) return;
    std::array<FieldValue, 3> fields{};
    fields[0].field_id = kFieldMemoryTemp;
    fields[1].field_id = kFieldNvLinkDataTx;
    fields[1].scope_id = kScopeAllLinks;
    fields[2].field_id = kFieldNvLinkDataRx;
    fields[2].scope_id = kScopeAllLinks;
    if (field_values(dev, static_cast<int>(fields.size()), fields.data()) != kSuccess) return;
    s.memory_temperature_celsius = FieldNumber(fields[0]);
    const std::optional<double> tx_kib = FieldNumber(fields[1]);
    const std::optional<double> rx_kib = FieldNumber(fields[2]);
    // A total needs both directions: half of it would not be the total.
    if (tx_kib && rx_kib) s.nvlink_bandwidth_bytes_total = (*tx_kib + *rx_kib) * 1024.0;
  }

  // Graphics engine, tensor pipe (any tensor op) and DRAM bandwidth activity through GPM, between
  // the sample the previous call took and one taken now. The first call only takes its sample.
  void FillGpm(size_t index, NvmlDevice dev, GpuSample& s) {
    if (gpm_query_support == nullptr || gpm_sample_alloc == nullptr || gpm_sample_free == nullptr ||
        gpm_sample_get == nullptr || gpm_metrics_get == nullptr) {
      return;
    }
    if (gpm.size() <= index) gpm.resize(index + 1);
    GpmState& g = gpm[index];
    if (g.device != dev) {  // first sight of this device, or the handle changed
      FreeGpm(g);
      g.device = dev;
    }
    if (!g.checked) {
      GpmSupport support{.version = kGpmSupportVersion, .is_supported_device = 0};
      g.supported = gpm_query_support(dev, &support) == kSuccess && support.is_supported_device != 0;
      g.checked = true;
    }
    if (!g.supported) return;
    const auto now = std::chrono::steady_clock::now();
    // Too soon after the previous sample for NVML: keep it and wait for a later call.
    if (g.have_previous && now - g.previous_at <= kGpmMinInterval) return;
    for (NvmlGpmSample* sample : {&g.previous, &g.next}) {
      if (*sample == nullptr && gpm_sample_alloc(sample) != kSuccess) {
        *sample = nullptr;
        return;
      }
    }
    if (gpm_sample_get(dev, g.next) != kSuccess) {
      // E.g. MIG mode: nothing this time, and no baseline across the gap for the next call either.
      g.have_previous = false;
      return;
    }
    if (g.have_previous) {
      GpmMetricsGet get{};
      get.version = kGpmMetricsGetVersion;
      get.sample1 = g.previous;
      get.sample2 = g.next;
      const std::array<std::pair<unsigned, std::optional<double> GpuSample::*>, 3> wanted = {{
          {kGpmGraphicsUtil, &GpuSample::graphics_engine_active_ratio},
          {kGpmAnyTensorUtil, &GpuSample::tensor_pipe_active_ratio},
          {kGpmDramBwUtil, &GpuSample::dram_active_ratio},
      }};
      get.num_metrics = static_cast<unsigned>(wanted.size());
      for (size_t k = 0; k < wanted.size(); ++k) get.metrics[k].metric_id = wanted[k].first;
      if (gpm_metrics_get(&get) == kSuccess) {
        for (size_t k = 0; k < wanted.size(); ++k) {
          const GpmMetric& metric = get.metrics[k];
          if (metric.nvml_return != kSuccess || metric.metric_id != wanted[k].first ||
              !std::isfinite(metric.value)) {
            continue;
          }
          s.*(wanted[k].second) = metric.value / 100.0;  // percent -> ratio
        }
      }
    }
    std::swap(g.previous, g.next);
    g.previous_at = now;
    g.have_previous = true;
  }

  // vGPU license status, which only a vGPU guest has: 1 when a licensable vGPU software feature is
  // licensed, 0 when none is. Bare metal, passthrough and the hypervisor host leave it empty.
  void FillVgpuLicense(NvmlDevice dev, GpuSample& s) const {
    if (virtualization_mode == nullptr || grid_licensable_features == nullptr) return;
    int mode = 0;
    if (virtualization_mode(dev, &mode) != kSuccess || mode != kVirtualizationVgpu) return;
    GridLicensableFeatures features{};
    if (grid_licensable_features(dev, &features) != kSuccess || features.is_grid_license_supported == 0)
      return;
    const unsigned count = std::min(features.licensable_features_count, kGridLicenseFeatureMaxCount);
    if (count == 0) return;
    bool licensed = false;
    for (unsigned k = 0; k < count; ++k) licensed = licensed || features.features[k].feature_state != 0;
    s.vgpu_license_status = licensed ? 1.0 : 0.0;
  }

  void FillMig(NvmlDevice dev, GpuInfo& gpu) const {
    if (mig_mode == nullptr) return;
    unsigned current = 0;
    unsigned pending = 0;
    if (mig_mode(dev, &current, &pending) != kSuccess) return;  // not MIG-capable
    gpu.mig_enabled = current == 1;
    if (gi_profile_info == nullptr) return;
    for (unsigned p = 0; p < kGpuInstanceProfileCount; ++p) {
      GpuInstanceProfileInfo info{};
      const NvmlReturn r = gi_profile_info(dev, p, &info);
      if (r == kErrInvalidArgument) break;  // past the last profile this driver knows
      if (r != kSuccess || info.slice_count == 0) continue;
      MigProfileInfo m;
      m.profile_id = static_cast<int>(info.id);
      m.slice_count = static_cast<int>(info.slice_count);
      m.instance_count = static_cast<int>(info.instance_count);
      m.memory_mib = static_cast<int64_t>(info.memory_size_mb);
      // Profile names round the usable memory up to whole GB ("3g.40gb" for 40192 MiB).
      m.name = fmt::format("{}g.{}gb", info.slice_count, (info.memory_size_mb + 1023) / 1024);
      if (p == kProfileOneSliceMediaExt || p == kProfileTwoSliceMediaExt) m.name += "+me";
      gpu.mig_profiles.push_back(std::move(m));
    }
  }

  // The MIG devices (compute instances) that exist on a MIG-enabled GPU, each with its GPU
  // instance's profile and placement. Profile names come from `gpu.mig_profiles`, so this runs after
  // those are named. Without the MIG device API the list stays empty; a device whose GPU instance
  // cannot be read (nvmlDeviceGetGpuInstanceById wants a privileged user) is listed with its UUID and
  // ids but no profile or placement, so it matches no assignment.
  void FillMigInstances(NvmlDevice dev, GpuInfo& gpu) const {
    if (!gpu.mig_enabled || max_mig_devices == nullptr || mig_handle_by_index == nullptr) return;
    unsigned count = 0;
    if (max_mig_devices(dev, &count) != kSuccess) return;
    for (unsigned k = 0; k < count; ++k) {
      NvmlDevice mig = nullptr;
      const NvmlReturn r = mig_handle_by_index(dev, k, &mig);
      if (r == kErrNotFound) continue;  // no MIG device at index k
      if (r != kSuccess || mig == nullptr) continue;
      std::array<char, 96> buf{};
      if (uuid(mig, buf.data(), static_cast<unsigned>(buf.size())) != kSuccess) continue;
      MigInstanceInfo inst;
      inst.uuid = CString(buf.data(), buf.size());
      unsigned id = 0;
      if (gpu_instance_id != nullptr && gpu_instance_id(mig, &id) == kSuccess)
        inst.gpu_instance_id = static_cast<int>(id);
      if (compute_instance_id != nullptr && compute_instance_id(mig, &id) == kSuccess)
        inst.compute_instance_id = static_cast<int>(id);
      NvmlGpuInstance gi = nullptr;
      GpuInstanceInfo info{};
      if (inst.gpu_instance_id >= 0 && gpu_instance_by_id != nullptr && gpu_instance_info != nullptr &&
          gpu_instance_by_id(dev, static_cast<unsigned>(inst.gpu_instance_id), &gi) == kSuccess &&
          gpu_instance_info(gi, &info) == kSuccess) {
        inst.profile_id = static_cast<int>(info.profile_id);
        inst.start = static_cast<int>(info.placement.start);
        inst.size = static_cast<int>(info.placement.size);
        for (const MigProfileInfo& p : gpu.mig_profiles) {
          if (p.profile_id == inst.profile_id) inst.profile = p.name;
        }
      }
      gpu.mig_instances.push_back(std::move(inst));
    }
  }

  void FillProcesses(NvmlDevice dev, GpuInfo& gpu) const {
    if (processes == nullptr) return;
    unsigned count = 0;
    NvmlReturn r = processes(dev, &count, nullptr);
    if (r != kErrInsufficientSize) return;  // SUCCESS: none running; else unsupported
    // Room for processes starting between the two calls.
    std::vector<ProcessInfo> infos(count + 8U);
    count = static_cast<unsigned>(infos.size());
    r = processes(dev, &count, infos.data());
    if (r != kSuccess) return;
    for (unsigned i = 0; i < count && i < infos.size(); ++i) {
      const unsigned long long used = infos[i].used_gpu_memory;
      // The GPU instance a process runs in (MIG mode; 0xFFFFFFFF otherwise): -1 when not given or
      // out of range, so a hostile id never names an instance.
      const unsigned gi = infos[i].gpu_instance_id;
      gpu.processes.push_back(
          {.pid = infos[i].pid,
           .used_memory_bytes = used == kValueNotAvailable ? 0 : static_cast<int64_t>(used),
           .gpu_instance_id = gi <= kMaxGpuInstanceId ? static_cast<int>(gi) : -1});
    }
  }

  std::vector<std::vector<int>> TopologyOf(const std::vector<NvmlDevice>& devices,
                                           const std::vector<PciInfo>& pci,
                                           const std::vector<bool>& pci_ok) const {
    const size_t n = devices.size();
    std::vector<std::vector<int>> links(n, std::vector<int>(n, 0));
    // Links that end at an NVSwitch rather than at a GPU (HGX/DGX baseboards): every GPU with such
    // links reaches every other one through the switch fabric.
    std::vector<int> switch_links(n, 0);
    if (nvlink_state != nullptr && nvlink_remote_pci != nullptr) {
      for (size_t a = 0; a < n; ++a) {
        for (unsigned link = 0; link < kNvLinkMaxLinks; ++link) {
          int active = 0;
          const NvmlReturn r = nvlink_state(devices[a], link, &active);
          if (r == kErrInvalidArgument || r == kErrNotSupported) break;  // no (more) links
          if (r != kSuccess || active != 1) continue;
          PciInfo remote{};
          if (nvlink_remote_pci(devices[a], link, &remote) != kSuccess) continue;
          bool to_gpu = false;
          for (size_t b = 0; b < n; ++b) {
            if (b == a || !pci_ok[b]) continue;
            if (remote.domain == pci[b].domain && remote.bus == pci[b].bus &&
                remote.device == pci[b].device) {
              ++links[a][b];
              to_gpu = true;
            }
          }
          if (to_gpu) continue;
          // Not one of our GPUs: a switch when NVML says so, or (older drivers without the call)
          // when it is not a GPU at all.
          int type = kNvLinkDeviceSwitch;
          if (nvlink_remote_type != nullptr && nvlink_remote_type(devices[a], link, &type) != kSuccess) continue;
          if (type == kNvLinkDeviceSwitch) ++switch_links[a];
        }
      }
    }
    std::vector<std::vector<int>> levels(n, std::vector<int>(n, 50));
    bool levels_ok = common_ancestor != nullptr;
    for (size_t a = 0; a < n && levels_ok; ++a) {
      for (size_t b = a + 1; b < n && levels_ok; ++b) {
        int level = 0;
        if (common_ancestor(devices[a], devices[b], &level) != kSuccess) {
          levels_ok = false;
          break;
        }
        levels[a][b] = levels[b][a] = level;
      }
    }
    std::vector<std::vector<int>> scores(n, std::vector<int>(n, 0));
    for (size_t a = 0; a < n; ++a) {
      for (size_t b = 0; b < n; ++b) {
        if (a == b) continue;
        // Without every pair's common ancestor, all pairs count as across sockets (a valid tree).
        const PcieLevel level = levels_ok ? LevelFromNvml(levels[a][b]) : PcieLevel::kCrossCpu;
        int nvlinks = std::max(links[a][b], links[b][a]);
        if (nvlinks == 0 && switch_links[a] > 0 && switch_links[b] > 0)
          nvlinks = std::min(switch_links[a], switch_links[b]);
        scores[a][b] = PcieLevelScore(level) + 100 * nvlinks;
      }
    }
    return scores;
  }
};

namespace nvml_internal {

Core CoreOf(Nvml::Impl& m) {
  Core c;
  c.lib = m.lib;
  c.mu = &m.mu;
  c.error_string = m.error_string;
  c.device_count = m.device_count;
  c.handle_by_index = m.handle_by_index;
  c.uuid = m.uuid;
  c.mig_mode = m.mig_mode;
  c.gi_profile_info = m.gi_profile_info;
  c.max_mig_devices = m.max_mig_devices;
  c.mig_handle_by_index = m.mig_handle_by_index;
  c.gpu_instance_id = m.gpu_instance_id;
  c.compute_instance_id = m.compute_instance_id;
  c.gpu_instance_by_id = m.gpu_instance_by_id;
  c.gpu_instance_info = m.gpu_instance_info;
  return c;
}

std::string ErrorText(const Core& core, NvmlReturn r) {
  const char* text = core.error_string != nullptr ? core.error_string(r) : nullptr;
  return fmt::format("{} (NVML error {})", text != nullptr ? text : "unknown error", r);
}

}  // namespace nvml_internal

Nvml::Nvml(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Nvml::~Nvml() {
  if (!impl_) return;
  for (Impl::GpmState& g : impl_->gpm) impl_->FreeGpm(g);
  if (impl_->events != nullptr && impl_->event_set_free != nullptr) impl_->event_set_free(impl_->events);
  if (impl_->initialized && impl_->shutdown != nullptr) impl_->shutdown();
  if (impl_->lib != nullptr) dlclose(impl_->lib);
}

Result<std::unique_ptr<Nvml>> Nvml::Load(const std::string& library) {
  auto impl = std::make_unique<Impl>();
  std::vector<std::string> candidates;
  if (!library.empty()) {
    candidates.push_back(library);
  } else {
    constexpr const char* kSoname = "libnvidia-ml.so.1";
    candidates.emplace_back(kSoname);
    for (const char* dir : {"/usr/lib/x86_64-linux-gnu/", "/usr/lib64/", "/usr/lib64/nvidia/", "/usr/lib/"}) {
      candidates.push_back(std::string(dir) + kSoname);
    }
  }
  std::string first_error;
  for (const std::string& candidate : candidates) {
    impl->lib = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (impl->lib != nullptr) {
      impl->path = candidate;
      break;
    }
    if (first_error.empty()) {
      const char* err = dlerror();
      first_error = err != nullptr ? err : candidate;
    }
  }
  if (impl->lib == nullptr) {
    return Status::NotFound(
        fmt::format("NVML library not found ({}): is the NVIDIA driver installed?", first_error));
  }
  Impl& m = *impl;
  // The library is held by `holder` from here on, so an early return closes it.
  std::unique_ptr<Nvml> holder(new Nvml(std::move(impl)));

  m.error_string = m.Sym<ErrorStringFn>("nvmlErrorString");
  m.init = m.Sym<InitFn>("nvmlInit_v2");
  m.shutdown = m.Sym<ShutdownFn>("nvmlShutdown");
  m.device_count = m.Sym<CountFn>("nvmlDeviceGetCount_v2");
  m.handle_by_index = m.Sym<HandleByIndexFn>("nvmlDeviceGetHandleByIndex_v2");
  m.uuid = m.Sym<StringFn>("nvmlDeviceGetUUID");
  m.name = m.Sym<StringFn>("nvmlDeviceGetName");
  m.memory_info = m.Sym<MemoryInfoFn>("nvmlDeviceGetMemoryInfo");
  const std::pair<const char*, bool> required[] = {
      {"nvmlInit_v2", m.init != nullptr},
      {"nvmlShutdown", m.shutdown != nullptr},
      {"nvmlDeviceGetCount_v2", m.device_count != nullptr},
      {"nvmlDeviceGetHandleByIndex_v2", m.handle_by_index != nullptr},
      {"nvmlDeviceGetUUID", m.uuid != nullptr},
      {"nvmlDeviceGetName", m.name != nullptr},
      {"nvmlDeviceGetMemoryInfo", m.memory_info != nullptr},
  };
  for (const auto& [symbol, found] : required) {
    if (!found) return Status::Internal(fmt::format("{} lacks the NVML entry point {}", m.path, symbol));
  }
  // Optional entry points: missing ones leave their fields empty.
  m.driver_version = m.Sym<DriverVersionFn>("nvmlSystemGetDriverVersion");
  m.minor_number = m.Sym<UintFn>("nvmlDeviceGetMinorNumber");
  m.pci_info = m.Sym<PciInfoFn>("nvmlDeviceGetPciInfo_v3");
  m.cuda_cc = m.Sym<CudaCcFn>("nvmlDeviceGetCudaComputeCapability");
  m.numa_node = m.Sym<UintFn>("nvmlDeviceGetNumaNodeId");
  m.memory_info_v2 = m.Sym<MemoryInfoV2Fn>("nvmlDeviceGetMemoryInfo_v2");
  m.mig_mode = m.Sym<MigModeFn>("nvmlDeviceGetMigMode");
  m.gi_profile_info = m.Sym<GiProfileInfoFn>("nvmlDeviceGetGpuInstanceProfileInfo");
  m.max_mig_devices = m.Sym<UintFn>("nvmlDeviceGetMaxMigDeviceCount");
  m.mig_handle_by_index = m.Sym<MigHandleByIndexFn>("nvmlDeviceGetMigDeviceHandleByIndex");
  m.gpu_instance_id = m.Sym<UintFn>("nvmlDeviceGetGpuInstanceId");
  m.compute_instance_id = m.Sym<UintFn>("nvmlDeviceGetComputeInstanceId");
  m.gpu_instance_by_id = m.Sym<GpuInstanceByIdFn>("nvmlDeviceGetGpuInstanceById");
  m.gpu_instance_info = m.Sym<GpuInstanceInfoFn>("nvmlGpuInstanceGetInfo");
  m.common_ancestor = m.Sym<CommonAncestorFn>("nvmlDeviceGetTopologyCommonAncestor");
  m.nvlink_state = m.Sym<NvLinkStateFn>("nvmlDeviceGetNvLinkState");
  m.nvlink_remote_pci = m.Sym<NvLinkRemotePciFn>("nvmlDeviceGetNvLinkRemotePciInfo_v2");
  m.nvlink_remote_type = m.Sym<NvLinkRemoteTypeFn>("nvmlDeviceGetNvLinkRemoteDeviceType");
  m.processes = m.Sym<ProcessesFn>("nvmlDeviceGetComputeRunningProcesses_v3");
  m.total_ecc = m.Sym<EccFn>("nvmlDeviceGetTotalEccErrors");
  m.event_set_create = m.Sym<EventSetCreateFn>("nvmlEventSetCreate");
  m.event_set_free = m.Sym<EventSetFreeFn>("nvmlEventSetFree");
  m.register_events = m.Sym<RegisterEventsFn>("nvmlDeviceRegisterEvents");
  m.event_set_wait = m.Sym<EventSetWaitFn>("nvmlEventSetWait_v2");
  m.clock_info = m.Sym<ClockFn>("nvmlDeviceGetClockInfo");
  m.temperature = m.Sym<TemperatureFn>("nvmlDeviceGetTemperature");
  m.temperature_v = m.Sym<TemperatureVFn>("nvmlDeviceGetTemperatureV");
  m.power_usage = m.Sym<UintFn>("nvmlDeviceGetPowerUsage");
  m.total_energy = m.Sym<UllFn>("nvmlDeviceGetTotalEnergyConsumption");
  m.utilization = m.Sym<UtilizationFn>("nvmlDeviceGetUtilizationRates");
  m.encoder_util = m.Sym<CodecUtilFn>("nvmlDeviceGetEncoderUtilization");
  m.decoder_util = m.Sym<CodecUtilFn>("nvmlDeviceGetDecoderUtilization");
  m.pcie_replay = m.Sym<UintFn>("nvmlDeviceGetPcieReplayCounter");
  m.remapped_rows = m.Sym<RemappedRowsFn>("nvmlDeviceGetRemappedRows");
  m.pcie_throughput = m.Sym<PcieThroughputFn>("nvmlDeviceGetPcieThroughput");
  m.field_values = m.Sym<FieldValuesFn>("nvmlDeviceGetFieldValues");
  m.gpm_query_support = m.Sym<GpmQuerySupportFn>("nvmlGpmQueryDeviceSupport");
  m.gpm_sample_alloc = m.Sym<GpmSampleAllocFn>("nvmlGpmSampleAlloc");
  m.gpm_sample_free = m.Sym<GpmSampleFreeFn>("nvmlGpmSampleFree");
  m.gpm_sample_get = m.Sym<GpmSampleGetFn>("nvmlGpmSampleGet");
  m.gpm_metrics_get = m.Sym<GpmMetricsGetFn>("nvmlGpmMetricsGet");
  m.virtualization_mode = m.Sym<VirtualizationModeFn>("nvmlDeviceGetVirtualizationMode");
  m.grid_licensable_features = m.Sym<GridLicensableFeaturesFn>("nvmlDeviceGetGridLicensableFeatures_v4");

  if (NvmlReturn r = m.init(); r != kSuccess) {
    return Status::FailedPrecondition(fmt::format("nvmlInit_v2 failed ({}): {}", m.path, m.Error(r)));
  }
  m.initialized = true;
  return holder;
}

namespace {

// Shared by Discover, Sample and Health: one reading of each, in one place.

// A critical XID seen since start, uncorrectable ECC errors, a failed row remapping.
void HealthOf(Nvml::Impl& m, size_t i, NvmlDevice dev, bool* healthy, std::string* reason) {
  *healthy = true;
  reason->clear();
  if (i < m.critical_xid.size() && m.critical_xid[i] != 0) {
    *healthy = false;
    *reason = fmt::format("XID {}", m.critical_xid[i]);
    return;
  }
  unsigned long long ecc = 0;
  if (m.total_ecc != nullptr && m.total_ecc(dev, kMemoryErrorUncorrected, kEccCounterVolatile, &ecc) == kSuccess &&
      ecc > 0) {
    *healthy = false;
    *reason = fmt::format("uncorrectable ECC errors: {}", ecc);
    return;
  }
  unsigned corr = 0;
  unsigned unc = 0;
  unsigned pending = 0;
  unsigned failed = 0;
  if (m.remapped_rows != nullptr && m.remapped_rows(dev, &corr, &unc, &pending, &failed) == kSuccess &&
      failed != 0) {
    *healthy = false;
    *reason = "row remapping failed";
  }
}

std::optional<double> GpuTemperature(Nvml::Impl& m, NvmlDevice dev) {
  TemperatureV1 t{
      .version = StructVersion(sizeof(TemperatureV1), 1), .sensor_type = kTemperatureGpu, .temperature = 0};
  unsigned u = 0;
  if (m.temperature_v != nullptr && m.temperature_v(dev, &t) == kSuccess) return t.temperature;
  if (m.temperature != nullptr && m.temperature(dev, kTemperatureGpu, &u) == kSuccess) return u;
  return std::nullopt;
}

struct FramebufferBytes {
  double total = 0, free = 0, used = 0;
  std::optional<double> reserved;
};

std::optional<FramebufferBytes> Framebuffer(Nvml::Impl& m, NvmlDevice dev) {
  MemoryInfoV2 mem2{};
  mem2.version = StructVersion(sizeof(MemoryInfoV2), 2);
  MemoryInfo mem{};
  if (m.memory_info_v2 != nullptr && m.memory_info_v2(dev, &mem2) == kSuccess) {
    return FramebufferBytes{static_cast<double>(mem2.total), static_cast<double>(mem2.free),
                            static_cast<double>(mem2.used), static_cast<double>(mem2.reserved)};
  }
  if (m.memory_info(dev, &mem) == kSuccess) {
    return FramebufferBytes{static_cast<double>(mem.total), static_cast<double>(mem.free),
                            static_cast<double>(mem.used), std::nullopt};
  }
  return std::nullopt;
}

}  // namespace

Result<std::vector<GpuHealthSample>> Nvml::Health() {
  Impl& m = *impl_;
  const std::lock_guard<std::mutex> lock(m.mu);
  ASSIGN_OR_RETURN(const std::vector<NvmlDevice> devices, m.Devices());
  m.PollXids(devices);
  std::vector<GpuHealthSample> out;
  for (size_t i = 0; i < devices.size(); ++i) {
    NvmlDevice dev = devices[i];
    GpuHealthSample h;
    h.index = static_cast<int>(i);
    HealthOf(m, i, dev, &h.healthy, &h.reason);
    if (auto t = GpuTemperature(m, dev)) h.temperature_celsius = *t;
    Utilization util{};
    if (m.utilization != nullptr && m.utilization(dev, &util) == kSuccess) h.utilization = util.gpu / 100.0;
    if (const auto fb = Framebuffer(m, dev); fb && fb->total > 0)
      h.memory_used_fraction = std::clamp(fb->used / fb->total, 0.0, 1.0);
    out.push_back(std::move(h));
  }
  return out;
}

Result<Inventory> Nvml::Discover() {
  Impl& m = *impl_;
  const std::lock_guard<std::mutex> lock(m.mu);
  ASSIGN_OR_RETURN(const std::vector<NvmlDevice> devices, m.Devices());
  m.PollXids(devices);
  const GpuCatalog catalog = GpuCatalog::Builtin();
  Inventory inv;
  inv.source = "nvml";
  if (m.driver_version != nullptr) {
    std::array<char, 96> buf{};
    if (m.driver_version(buf.data(), static_cast<unsigned>(buf.size())) == kSuccess) {
      inv.driver_version = CString(buf.data(), buf.size());
    }
  }
  std::vector<PciInfo> pci(devices.size());
  std::vector<bool> pci_ok(devices.size(), false);
  for (size_t i = 0; i < devices.size(); ++i) {
    NvmlDevice dev = devices[i];
    GpuInfo gpu;
    gpu.index = static_cast<int>(i);
    std::array<char, 96> buf{};
    if (NvmlReturn r = m.uuid(dev, buf.data(), static_cast<unsigned>(buf.size())); r != kSuccess) {
      return Status::Internal(fmt::format("nvmlDeviceGetUUID(GPU {}): {}", i, m.Error(r)));
    }
    gpu.uuid = CString(buf.data(), buf.size());
    buf.fill(0);
    if (NvmlReturn r = m.name(dev, buf.data(), static_cast<unsigned>(buf.size())); r != kSuccess) {
      return Status::Internal(fmt::format("nvmlDeviceGetName(GPU {}): {}", i, m.Error(r)));
    }
    gpu.name = CString(buf.data(), buf.size());
    gpu.model = CatalogModel(catalog, gpu.name);
    MemoryInfo mem{};
    if (NvmlReturn r = m.memory_info(dev, &mem); r != kSuccess) {
      return Status::Internal(fmt::format("nvmlDeviceGetMemoryInfo(GPU {}): {}", i, m.Error(r)));
    }
    gpu.memory_bytes = static_cast<int64_t>(mem.total);
    int major = 0;
    int minor = 0;
    if (m.cuda_cc != nullptr && m.cuda_cc(dev, &major, &minor) == kSuccess) {
      gpu.compute_capability = fmt::format("{}.{}", major, minor);
    }
    if (m.pci_info != nullptr && m.pci_info(dev, &pci[i]) == kSuccess) {
      pci_ok[i] = true;
      gpu.pci_bus_id = CString(pci[i].bus_id, sizeof(pci[i].bus_id));
    }
    unsigned value = 0;
    if (m.numa_node != nullptr && m.numa_node(dev, &value) == kSuccess)
      gpu.numa_node = static_cast<int>(value);
    if (m.minor_number != nullptr && m.minor_number(dev, &value) == kSuccess)
      gpu.minor_number = static_cast<int>(value);
    m.FillMig(dev, gpu);
    // Name MIG profiles as the catalog does when it knows the model (the driver's memory figures
    // are a little below the nominal size the names carry).
    if (const GpuModelSpec* spec = catalog.Find(gpu.model); spec != nullptr && spec->mig) {
      for (MigProfileInfo& p : gpu.mig_profiles) {
        for (const MigProfile& known : spec->mig->profiles) {
          if (known.driver_id == p.profile_id) p.name = known.name;
        }
      }
    }
    m.FillMigInstances(dev, gpu);
    m.FillProcesses(dev, gpu);
    HealthOf(m, i, dev, &gpu.healthy, &gpu.health_reason);
    inv.gpus.push_back(std::move(gpu));
  }
  if (!devices.empty()) inv.topology = m.TopologyOf(devices, pci, pci_ok);
  return inv;
}

Result<std::vector<GpuSample>> Nvml::Sample() {
  Impl& m = *impl_;
  const std::lock_guard<std::mutex> lock(m.mu);
  ASSIGN_OR_RETURN(const std::vector<NvmlDevice> devices, m.Devices());
  m.PollXids(devices);
  std::vector<GpuSample> samples;
  for (size_t i = 0; i < devices.size(); ++i) {
    NvmlDevice dev = devices[i];
    GpuSample s;
    s.index = static_cast<int>(i);
    unsigned u = 0;
    if (m.clock_info != nullptr && m.clock_info(dev, kClockSm, &u) == kSuccess) s.sm_clock_hz = u * 1e6;
    if (m.clock_info != nullptr && m.clock_info(dev, kClockMem, &u) == kSuccess) s.memory_clock_hz = u * 1e6;
    s.gpu_temperature_celsius = GpuTemperature(m, dev);
    if (m.power_usage != nullptr && m.power_usage(dev, &u) == kSuccess) s.power_watts = u / 1000.0;
    unsigned long long ull = 0;
    if (m.total_energy != nullptr && m.total_energy(dev, &ull) == kSuccess) {
      s.energy_joules_total = static_cast<double>(ull) / 1000.0;
    }
    if (m.pcie_replay != nullptr && m.pcie_replay(dev, &u) == kSuccess) s.pcie_replays_total = u;
    Utilization util{};
    if (m.utilization != nullptr && m.utilization(dev, &util) == kSuccess) {
      s.gpu_utilization_ratio = util.gpu / 100.0;
      s.memory_copy_utilization_ratio = util.memory / 100.0;
    }
    unsigned period = 0;
    if (m.encoder_util != nullptr && m.encoder_util(dev, &u, &period) == kSuccess)
      s.encoder_utilization_ratio = u / 100.0;
    if (m.decoder_util != nullptr && m.decoder_util(dev, &u, &period) == kSuccess)
      s.decoder_utilization_ratio = u / 100.0;
    if (i < m.last_xid.size() && m.last_xid[i]) s.last_xid = static_cast<double>(*m.last_xid[i]);
    if (const auto fb = Framebuffer(m, dev)) {
      s.framebuffer_free_bytes = fb->free;
      s.framebuffer_used_bytes = fb->used;
      s.framebuffer_reserved_bytes = fb->reserved;
    }
    unsigned corr = 0;
    unsigned unc = 0;
    unsigned pending = 0;
    unsigned failed = 0;
    if (m.remapped_rows != nullptr && m.remapped_rows(dev, &corr, &unc, &pending, &failed) == kSuccess) {
      s.remapped_rows_correctable_total = corr;
      s.remapped_rows_uncorrectable_total = unc;
      s.row_remap_failure = failed != 0 ? 1.0 : 0.0;
    }
    // NVML gives PCIe throughput in KB/s over a short window.
    if (m.pcie_throughput != nullptr && m.pcie_throughput(dev, kPcieCounterTx, &u) == kSuccess) {
      s.pcie_tx_bytes_per_second = u * 1024.0;
    }
    if (m.pcie_throughput != nullptr && m.pcie_throughput(dev, kPcieCounterRx, &u) == kSuccess) {
      s.pcie_rx_bytes_per_second = u * 1024.0;
    }
    m.FillFieldValues(dev, s);
    m.FillGpm(i, dev, s);
    m.FillVgpuLicense(dev, s);
    // Where the fields come from (each optional entry point may be missing from an older driver,
    // and each field stays empty when the device does not give it):
    //   clocks, temperature, power, energy, utilisation, encoder/decoder, PCIe replays and
    //   throughput, framebuffer, remapped rows: their nvmlDeviceGet* calls above;
    //   last XID: the XID event set (empty without the event API);
    //   memory temperature (NVML_FI_DEV_MEMORY_TEMP, degrees C) and NVLink bandwidth (the sum of
    //   NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX and _RX over all links, KiB -> bytes, a counter since
    //   the driver loaded): nvmlDeviceGetFieldValues, each field with its own status; memory
    //   temperature is absent on GDDR boards, NVLink on GPUs without NVLink;
    //   graphics engine / tensor pipe / DRAM active: GPM (nvmlGpmMetricsGet, percent -> 0..1)
    //   between the previous call's sample and this one's, so absent on the first call, on a call
    //   within 100 ms of the previous sample, on GPUs before Hopper, and where GPM sampling fails
    //   (MIG mode) as well as on the call after such a failure;
    //   vGPU license status: only on a vGPU guest (virtualization mode VGPU), from the licensable
    //   vGPU software features (1: a feature is licensed, 0: none); bare metal, passthrough and the
    //   hypervisor host have no such per-GPU license and leave it empty.
    samples.push_back(std::move(s));
  }
  return samples;
}

}  // namespace gpupool
