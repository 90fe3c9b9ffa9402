// A fake libnvidia-ml.so.1 for tests of src/agent/nvml.cc on machines without a GPU. It exports
// the C entry points gpupool uses, with gpupool's own reading of their ABI (no NVIDIA header).
//
// The machine it describes, by default: 4 x "NVIDIA H100 80GB HBM3" (80 GiB, compute capability
// 9.0); GPUs 0,1 on NUMA node 0 under one PCIe switch, GPUs 2,3 on NUMA node 1 under another; 4
// active NVLink links between 0 and 1 and between 2 and 3; two processes on GPU 0; MIG off but
// capable (H100 profiles); plausible clocks, temperature, power, energy, utilisation and counters.
//
// The environment variable GPUPOOL_FAKE_NVML names a key=value file (one per line, '#' comments)
// read at nvmlInit_v2 that changes it:
//   init_error=9          nvmlInit_v2 returns this NVML error code
//   gpus=2                GPU count (0..8)
//   name=NVIDIA A100-SXM4-80GB   device name of every GPU
//   memory_mib=81920      total memory of every GPU
//   cc=8.0                CUDA compute capability
//   mig=0,1               GPUs with MIG mode enabled (comma-separated indices)
//   mig_instances.1=9@4,19@0   MIG instances that exist on GPU 1 (when MIG is enabled there): GPU
//                         instance profile id @ placement start, each a GPU instance with ids 1, 2,
//                         ... in this order holding one compute instance (id 0). The MIG device of
//                         GPU g, GPU instance i, compute instance c has the UUID
//                         "MIG-fa6e00gg-00ii-4000-8000-0000000000cc" (two decimal digits each)
//   mig_busy.1=4          a process runs in the GPU instance placed at slice 4 of GPU 1 (listed by
//                         the running-processes call with its GPU/compute instance ids, pid 5000 +
//                         GPU instance id); destroying it or its compute instances is IN_USE
//   mig_create_fail=1     the next so many GPU-instance creations fail with mig_create_error
//                         (default 23, INSUFFICIENT_RESOURCES); mig_ci_create_fail=1 the same for
//                         compute instances, with mig_ci_create_error (default 999, UNKNOWN)
//   no_mig=1              MIG not supported at all (GetMigMode -> NOT_SUPPORTED)
//   xid.1=79              an XID event pending on GPU 1
//   ecc.2=3               uncorrectable volatile ECC errors on GPU 2
//   unsupported=power,energy,...   fields returning NOT_SUPPORTED: power, energy, clocks,
//                         temperature, utilization, encoder, decoder, pcie_replay, remapped_rows,
//                         memory_v2, pcie_throughput, numa, processes, nvlink (also the NVLink
//                         field values), ancestor, virtualization; and, as the per-field /
//                         per-metric status inside a successful call: memory_temp, nvlink_tx,
//                         nvlink_rx, gpm_graphics, gpm_tensor, gpm_dram; field_values makes the
//                         whole nvmlDeviceGetFieldValues call fail, gpm_sample nvmlGpmSampleGet;
//                         gpu_instance_by_id makes nvmlDeviceGetGpuInstanceById fail with
//                         NO_PERMISSION (as for an unprivileged user)
//   memory_temp=60        memory temperature of GPU 0 in degrees C (GPU i: + i), field 82
//   nvlink_tx_kib=1000    NVLink data KiB sent by GPU 0 over all links (GPU i: + i), field 138;
//   nvlink_rx_kib=2000    received, field 139. Only GPUs with an NVLink partner have them; a
//                         single link (scope 0..3) gives a quarter
//   nvswitch=18           an NVSwitch board: every GPU has this many active links, each to a
//                         switch chip (not to a GPU); default 0: NVLink bridges as above
//   gpm=1                 GPM supported (default: compute capability 9.0 or later)
//   gpm_graphics=50,70    GPM graphics activity in percent for GPU 0 over the interval between its
//                         1st and 2nd sample, 2nd and 3rd, ... (the last repeats; GPU i: + i); a
//                         metric over several intervals is their mean
//   gpm_tensor=20,30      the same for any-tensor activity
//   gpm_dram=40,45        the same for DRAM bandwidth utilisation
//   virtualization=vgpu   none (bare metal, default), passthrough, vgpu (a vGPU guest), host_vgpu
//   vgpu_licensed=0       on a vGPU guest: the vGPU software feature is not licensed (default 1)
//
// MIG instances can be created and destroyed at run time (nvmlDeviceCreateGpuInstanceWithPlacement,
// nvmlGpuInstanceCreateComputeInstance, nvmlComputeInstanceDestroy, nvmlGpuInstanceDestroy), checked
// like the driver checks them on the catalog's MIG models (A100-40GB/80GB, H100, H200: the same
// 7 compute / 8 memory slice geometry): a known profile, one of its valid starts and its size, no
// memory slice overlapping another GPU instance, at most 7 compute slices and the profile's
// instance count; a GPU instance with compute instances or a process is IN_USE. A new GPU instance
// takes the lowest free id from 1, a compute instance the lowest from 0; a compute instance made at
// run time has a UUID of its own ("...-8nnn-..." with n its creation serial). The state lives in
// the process that loaded the library, and nvmlInit_v2 starts it afresh from the configuration.
//
// Built with FAKE_NVML_MINIMAL, the optional entry points (NUMA, memory info v2, power, energy,
// remapped rows, events, temperature, field values, GPM, virtualization, vGPU licensing, the MIG
// device and GPU instance queries) are not exported at all.
//
// fake_nvml_gpm_samples_live() (a test hook, not NVML) counts GPM samples allocated and not freed;
// fake_nvml_mig_changes() the GPU and compute instances created or destroyed since nvmlInit_v2.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr int kSuccess = 0;
constexpr int kUninitialized = 1;
constexpr int kInvalidArgument = 2;
constexpr int kNotSupported = 3;
constexpr int kNoPermission = 4;
constexpr int kNotFound = 6;
constexpr int kInsufficientSize = 7;
constexpr int kTimeout = 10;
constexpr int kInUse = 19;
constexpr int kInsufficientResources = 23;

struct PciInfo {
  char bus_id_legacy[16];
  unsigned domain;
  unsigned bus;
  unsigned device;
  unsigned pci_device_id;
  unsigned pci_subsystem_id;
  char bus_id[32];
};
struct MemoryInfo {
  unsigned long long total, free, used;
};
struct MemoryInfoV2 {
  unsigned version;
  unsigned long long total, reserved, free, used;
};
struct Utilization {
  unsigned gpu, memory;
};
struct ProcessInfo {
  unsigned pid;
  unsigned long long used_gpu_memory;
  unsigned gpu_instance_id, compute_instance_id;
};
struct GiProfileInfo {
  unsigned id, p2p, slice_count, instance_count, sm_count, ce, dec, enc, jpeg, ofa;
  unsigned long long memory_size_mb;
};
struct CiProfileInfo {
  unsigned id, slice_count, instance_count, sm_count, ce, dec, enc, jpeg, ofa;
};
struct FakeGpu;
struct GpuInstancePlacement {
  unsigned start, size;
};
struct GpuInstanceInfo {
  FakeGpu* device;
  unsigned id, profile_id;
  GpuInstancePlacement placement;
};
struct EventData {
  FakeGpu* device;
  unsigned long long event_type;
  unsigned long long event_data;
  unsigned gi, ci;
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
  unsigned field_id, scope_id;
  long long timestamp, latency_usec;
  int value_type, nvml_return;
  FieldValueUnion value;
};
struct GpmSupport {
  unsigned version, is_supported_device;
};
struct GpmMetric {
  unsigned metric_id;
  int nvml_return;
  double value;
  struct {
    char *short_name, *long_name, *unit;
  } metric_info;
};
constexpr unsigned kGpmMetricMax = 98;  // the smallest NVML_GPM_METRIC_MAX: callers send at least this
struct GpmMetricsGet {
  unsigned version, num_metrics;
  void* sample1;
  void* sample2;
  GpmMetric metrics[kGpmMetricMax];
};
struct GridLicenseExpiry {
  unsigned year;
  unsigned short month, day, hour, min, sec;
  unsigned char status;
};
struct GridLicensableFeature {
  int feature_code;
  unsigned feature_state;
  char license_info[128];
  char product_name[128];
  unsigned feature_enabled;
  GridLicenseExpiry license_expiry;
};
struct GridLicensableFeatures {
  int is_grid_license_supported;
  unsigned licensable_features_count;
  GridLicensableFeature features[3];
};

struct FakeGpu;
struct FakeGpuInstance;
// A compute instance, which is also the MIG device NVML enumerates (its handle is both).
struct FakeComputeInstance {
  bool used = false;
  FakeGpuInstance* gi = nullptr;
  unsigned id = 0, profile_id = 0, slices = 0;
  unsigned serial = 0;  // 0: configured; n: the n-th one created at run time (in its UUID)
};
constexpr unsigned kSlots = 8;  // GPU instances per GPU, compute instances per GPU instance
// A GPU instance. Slots, never moved: handles point into them for as long as the instance lives.
struct FakeGpuInstance {
  bool used = false;
  FakeGpu* gpu = nullptr;
  unsigned id = 0, profile_id = 0, start = 0, size = 0, compute_slices = 0;
  bool busy = false;  // a process runs on it (mig_busy)
  FakeComputeInstance cis[kSlots];
};

struct FakeGpu {
  int index = 0;
  bool mig = false;
  FakeGpuInstance gpu_instances[kSlots];
  unsigned long long xid = 0;  // pending
  unsigned long long ecc = 0;
  unsigned gpm_samples_taken = 0;
};

constexpr unsigned kGpmSampleMagic = 0x67706d31;  // "gpm1"
struct FakeGpmSample {
  unsigned magic = kGpmSampleMagic;
  int gpu = -1;      // -1: never filled
  unsigned seq = 0;  // the GPU's n-th sample, from 1
};

struct FakeEventSet {
  std::set<int> registered;
};

struct State {
  bool initialized = false;
  int init_error = 0;
  std::string name = "NVIDIA H100 80GB HBM3";
  unsigned long long memory_mib = 81559;
  int cc_major = 9;
  int cc_minor = 0;
  bool no_mig = false;
  std::set<std::string> unsupported;
  std::vector<FakeGpu> gpus;
  unsigned memory_temp = 60;
  unsigned long long nvlink_tx_kib = 1000;
  unsigned long long nvlink_rx_kib = 2000;
  int gpm = -1;  // -1: by compute capability
  unsigned nvswitch = 0;  // > 0: every GPU has this many NVLink links to an NVSwitch, no bridges
  std::vector<double> gpm_graphics = {50, 70};
  std::vector<double> gpm_tensor = {20, 30};
  std::vector<double> gpm_dram = {40, 45};
  int virtualization = 0;
  bool vgpu_licensed = true;
  int mig_create_fail = 0;      // the next so many GPU-instance creations fail ...
  int mig_create_error = 23;    // ... with this (INSUFFICIENT_RESOURCES)
  int mig_ci_create_fail = 0;   // the next so many compute-instance creations fail ...
  int mig_ci_create_error = 999;  // ... with this (UNKNOWN)
  unsigned serial = 0;          // compute instances created at run time so far
  long mig_changes = 0;         // GPU/compute instances created or destroyed (a test hook)
};

// GPM samples allocated and not yet freed, across nvmlInit/nvmlShutdown (a test hook).
long& GpmSamplesLive() {
  static long live = 0;
  return live;
}

// The fake's own state: a test library, loaded and configured per nvmlInit_v2.
State& S() {
  static State state;
  return state;
}

bool Unsupported(const char* field) {
  return S().unsupported.count(field) != 0;
}

FakeGpu* Gpu(void* handle) {
  auto* gpu = static_cast<FakeGpu*>(handle);
  State& s = S();
  if (!s.initialized || gpu == nullptr || s.gpus.empty() || gpu < s.gpus.data() ||
      gpu >= s.gpus.data() + s.gpus.size()) {
    return nullptr;
  }
  return gpu;
}

// GPU instance profiles of an 80 GB H100: index -> id, slices, instances, MiB, placement size in
// memory slices.
// The geometry is the same on every MIG-capable model gpupool knows (A100-40GB/80GB, H100, H200:
// src/model/gpu_catalog.cc): 7 compute and 8 memory slices, these placements; only the memory
// differs, scaled here from the 80 GB figures by the configured memory_mib.
struct ProfileRow {
  unsigned index, id, slices, instances;
  unsigned long long mib;
  unsigned memory_slices;
  unsigned valid_starts;  // bit s: a placement may start at memory slice s
};
constexpr ProfileRow kProfileRows[] = {
    {0, 19, 1, 7, 9856, 1, 0x7f}, {1, 14, 2, 3, 20096, 2, 0x15}, {2, 9, 3, 2, 40192, 4, 0x11},
    {3, 5, 4, 1, 40192, 4, 0x01}, {4, 0, 7, 1, 80384, 8, 0x01},  {7, 20, 1, 1, 9856, 1, 0x7f},
    {9, 15, 1, 4, 20096, 2, 0x55}};
constexpr unsigned kComputeSlices = 7;
constexpr unsigned long long kBaseMemoryMib = 81559;

const ProfileRow* RowById(unsigned id) {
  for (const ProfileRow& row : kProfileRows) {
    if (row.id == id) return &row;
  }
  return nullptr;
}

// Lowest free id from `first` among the used slots' ids.
template <typename Slot, size_t N>
unsigned FreeId(const Slot (&slots)[N], unsigned first) {
  for (unsigned id = first;; ++id) {
    bool taken = false;
    for (const Slot& slot : slots) taken = taken || (slot.used && slot.id == id);
    if (!taken) return id;
  }
}

void Configure() {
  State& s = S();
  s = State();
  int count = 4;
  std::map<std::string, std::string> kv;
  if (const char* path = std::getenv("GPUPOOL_FAKE_NVML"); path != nullptr && *path != '\0') {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      const size_t eq = line.find('=');
      if (eq == std::string::npos) continue;
      kv[line.substr(0, eq)] = line.substr(eq + 1);
    }
  }
  auto split = [](const std::string& text) {
    std::vector<std::string> parts;
    std::stringstream ss(text);
    std::string part;
    while (std::getline(ss, part, ',')) {
      if (!part.empty()) parts.push_back(part);
    }
    return parts;
  };
  if (kv.count("init_error") != 0) s.init_error = std::atoi(kv["init_error"].c_str());
  if (kv.count("gpus") != 0) count = std::atoi(kv["gpus"].c_str());
  if (count < 0 || count > 8) count = 8;
  if (kv.count("name") != 0) s.name = kv["name"];
  if (kv.count("memory_mib") != 0) s.memory_mib = std::strtoull(kv["memory_mib"].c_str(), nullptr, 10);
  if (kv.count("cc") != 0) std::sscanf(kv["cc"].c_str(), "%d.%d", &s.cc_major, &s.cc_minor);
  s.no_mig = kv.count("no_mig") != 0 && kv["no_mig"] == "1";
  for (const std::string& f : split(kv["unsupported"])) s.unsupported.insert(f);
  if (kv.count("memory_temp") != 0)
    s.memory_temp = static_cast<unsigned>(std::atoi(kv["memory_temp"].c_str()));
  if (kv.count("nvswitch") != 0) s.nvswitch = static_cast<unsigned>(std::atoi(kv["nvswitch"].c_str()));
  if (kv.count("nvlink_tx_kib") != 0)
    s.nvlink_tx_kib = std::strtoull(kv["nvlink_tx_kib"].c_str(), nullptr, 10);
  if (kv.count("nvlink_rx_kib") != 0)
    s.nvlink_rx_kib = std::strtoull(kv["nvlink_rx_kib"].c_str(), nullptr, 10);
  if (kv.count("gpm") != 0) s.gpm = kv["gpm"] == "1" ? 1 : 0;
  auto numbers = [&](const std::string& key, std::vector<double>& out) {
    if (kv.count(key) == 0) return;
    out.clear();
    for (const std::string& v : split(kv[key])) out.push_back(std::strtod(v.c_str(), nullptr));
  };
  numbers("gpm_graphics", s.gpm_graphics);
  numbers("gpm_tensor", s.gpm_tensor);
  numbers("gpm_dram", s.gpm_dram);
  if (kv.count("virtualization") != 0) {
    const std::string& v = kv["virtualization"];
    s.virtualization = v == "passthrough" ? 1 : v == "vgpu" ? 2 : v == "host_vgpu" ? 3 : 0;
  }
  s.vgpu_licensed = kv.count("vgpu_licensed") == 0 || kv["vgpu_licensed"] != "0";
  s.gpus.resize(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) s.gpus[static_cast<size_t>(i)].index = i;
  for (const std::string& m : split(kv["mig"])) {
    const int i = std::atoi(m.c_str());
    if (i >= 0 && i < count) s.gpus[static_cast<size_t>(i)].mig = true;
  }
  if (kv.count("mig_create_fail") != 0) s.mig_create_fail = std::atoi(kv["mig_create_fail"].c_str());
  if (kv.count("mig_create_error") != 0) s.mig_create_error = std::atoi(kv["mig_create_error"].c_str());
  if (kv.count("mig_ci_create_fail") != 0) s.mig_ci_create_fail = std::atoi(kv["mig_ci_create_fail"].c_str());
  if (kv.count("mig_ci_create_error") != 0)
    s.mig_ci_create_error = std::atoi(kv["mig_ci_create_error"].c_str());
  for (int i = 0; i < count; ++i) {
    FakeGpu& gpu = s.gpus[static_cast<size_t>(i)];
    const std::string key = "mig_instances." + std::to_string(i);
    std::set<unsigned> busy;
    for (const std::string& b : split(kv["mig_busy." + std::to_string(i)]))
      busy.insert(static_cast<unsigned>(std::atoi(b.c_str())));
    unsigned slot = 0;
    for (const std::string& entry : split(kv[key])) {
      unsigned profile_id = 0;
      unsigned start = 0;
      if (std::sscanf(entry.c_str(), "%u@%u", &profile_id, &start) != 2 || slot >= kSlots) continue;
      const ProfileRow* row = RowById(profile_id);
      FakeGpuInstance& gi = gpu.gpu_instances[slot++];
      gi.used = true;
      gi.gpu = &gpu;
      gi.id = slot;  // 1, 2, ... in configuration order
      gi.profile_id = profile_id;
      gi.start = start;
      gi.size = row != nullptr ? row->memory_slices : 1;
      gi.compute_slices = row != nullptr ? row->slices : 1;
      gi.busy = busy.count(start) != 0;
      FakeComputeInstance& ci = gi.cis[0];
      ci = FakeComputeInstance{.used = true, .gi = &gi, .id = 0, .profile_id = 0, .slices = gi.compute_slices,
                               .serial = 0};
    }
  }
  for (int i = 0; i < count; ++i) {
    const std::string xid = "xid." + std::to_string(i);
    const std::string ecc = "ecc." + std::to_string(i);
    if (kv.count(xid) != 0) s.gpus[static_cast<size_t>(i)].xid = std::strtoull(kv[xid].c_str(), nullptr, 10);
    if (kv.count(ecc) != 0) s.gpus[static_cast<size_t>(i)].ecc = std::strtoull(kv[ecc].c_str(), nullptr, 10);
  }
}

const unsigned kBus[8] = {0x18, 0x2a, 0x9a, 0xab, 0xc0, 0xc1, 0xd0, 0xd1};

void FillPci(int index, PciInfo* pci) {
  std::memset(pci, 0, sizeof(*pci));
  pci->domain = 0;
  pci->bus = kBus[index];
  pci->device = 0;
  pci->pci_device_id = 0x233010de;
  std::snprintf(pci->bus_id, sizeof(pci->bus_id), "00000000:%02X:00.0", kBus[index]);
  std::snprintf(pci->bus_id_legacy, sizeof(pci->bus_id_legacy), "0000:%02X:00.0", kBus[index]);
}

int CopyString(const std::string& text, char* buf, unsigned len) {
  if (buf == nullptr || len <= text.size()) return kInsufficientSize;
  std::memcpy(buf, text.c_str(), text.size() + 1);
  return kSuccess;
}

// GPU pairs (0,1), (2,3), ... share a switch and 4 NVLink links; the halves of the machine sit on
// different sockets.
int Partner(int index) {
  return index ^ 1;
}
int Numa(int index) {
  return index < static_cast<int>(S().gpus.size()) / 2 ? 0 : 1;
}

// The MIG device (compute instance) a handle points at; nullptr for anything else (a GPU handle, a
// destroyed instance, garbage).
FakeComputeInstance* MigDevice(void* handle) {
  if (!S().initialized || handle == nullptr) return nullptr;
  for (FakeGpu& g : S().gpus) {
    for (FakeGpuInstance& gi : g.gpu_instances) {
      if (!gi.used) continue;
      for (FakeComputeInstance& ci : gi.cis) {
        if (ci.used && &ci == handle) return &ci;
      }
    }
  }
  return nullptr;
}

#ifndef FAKE_NVML_MINIMAL
FakeGpuInstance* GpuInstance(void* handle) {
  if (!S().initialized || handle == nullptr) return nullptr;
  for (FakeGpu& g : S().gpus) {
    for (FakeGpuInstance& gi : g.gpu_instances) {
      if (gi.used && &gi == handle) return &gi;
    }
  }
  return nullptr;
}

bool HasNvLink(int index) {
  return (S().nvswitch > 0 || Partner(index) < static_cast<int>(S().gpus.size())) && !Unsupported("nvlink");
}

bool GpmSupported() {
  const State& s = S();
  return s.gpm == 1 || (s.gpm == -1 && s.cc_major >= 9);
}

// Mean of the per-interval percentages over intervals [from, to) (interval k lies between a GPU's
// k-th and (k+1)-th sample), the last value standing for all later intervals.
double GpmValue(const std::vector<double>& per_interval, unsigned from, unsigned to) {
  if (per_interval.empty()) return std::nan("");
  double sum = 0;
  for (unsigned k = from; k < to; ++k) {
    sum += per_interval[std::min<size_t>(k - 1, per_interval.size() - 1)];
  }
  return sum / (to - from);
}

FakeGpmSample* GpmSampleOf(void* handle) {
  auto* sample = static_cast<FakeGpmSample*>(handle);
  return sample != nullptr && sample->magic == kGpmSampleMagic ? sample : nullptr;
}
#endif  // FAKE_NVML_MINIMAL

}  // namespace

#define FAKE_GPU_OR_RETURN(var, handle) \
  FakeGpu* var = Gpu(handle);           \
  if (var == nullptr) return S().initialized ? kInvalidArgument : kUninitialized

extern "C" {

__attribute__((visibility("default"))) int nvmlInit_v2() {
  Configure();
  if (S().init_error != 0) return S().init_error;
  S().initialized = true;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlShutdown() {
  S().initialized = false;
  return kSuccess;
}

__attribute__((visibility("default"))) const char* nvmlErrorString(int code) {
  switch (code) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 6: return "Not Found";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 19: return "In use by another client";
    case 23: return "Insufficient resources";
    default: return "Unknown Error";
  }
}

__attribute__((visibility("default"))) int nvmlSystemGetDriverVersion(char* buf, unsigned len) {
  return CopyString("550.54.15", buf, len);
}

__attribute__((visibility("default"))) int nvmlDeviceGetCount_v2(unsigned* count) {
  if (!S().initialized) return kUninitialized;
  *count = static_cast<unsigned>(S().gpus.size());
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetHandleByIndex_v2(unsigned index, void** handle) {
  if (!S().initialized) return kUninitialized;
  if (index >= S().gpus.size()) return kInvalidArgument;
  *handle = &S().gpus[index];
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetUUID(void* dev, char* buf, unsigned len) {
  if (const FakeComputeInstance* m = MigDevice(dev); m != nullptr) {
    char uuid[64];
    std::snprintf(uuid, sizeof(uuid), "MIG-fa6e00%02d-00%02u-4000-8%03u-0000000000%02u", m->gi->gpu->index % 100,
                  m->gi->id % 100, m->serial % 1000, m->id % 100);
    return CopyString(uuid, buf, len);
  }
  FAKE_GPU_OR_RETURN(g, dev);
  char uuid[64];
  std::snprintf(uuid, sizeof(uuid), "GPU-fa6e0000-0000-4000-8000-%012d", g->index);
  return CopyString(uuid, buf, len);
}

__attribute__((visibility("default"))) int nvmlDeviceGetName(void* dev, char* buf, unsigned len) {
  FAKE_GPU_OR_RETURN(g, dev);
  (void)g;
  return CopyString(S().name, buf, len);
}

__attribute__((visibility("default"))) int nvmlDeviceGetMinorNumber(void* dev, unsigned* minor) {
  FAKE_GPU_OR_RETURN(g, dev);
  *minor = static_cast<unsigned>(g->index);
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetPciInfo_v3(void* dev, PciInfo* pci) {
  FAKE_GPU_OR_RETURN(g, dev);
  FillPci(g->index, pci);
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetCudaComputeCapability(void* dev, int* major,
                                                                              int* minor) {
  FAKE_GPU_OR_RETURN(g, dev);
  (void)g;
  *major = S().cc_major;
  *minor = S().cc_minor;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetMemoryInfo(void* dev, MemoryInfo* mem) {
  FAKE_GPU_OR_RETURN(g, dev);
  mem->total = S().memory_mib << 20U;
  mem->used = g->index == 0 ? (3ULL << 30U) : (512ULL << 20U);
  mem->free = mem->total - mem->used;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetMigMode(void* dev, unsigned* current,
                                                                unsigned* pending) {
  FAKE_GPU_OR_RETURN(g, dev);
  if (S().no_mig) return kNotSupported;
  *current = g->mig ? 1 : 0;
  *pending = *current;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetGpuInstanceProfileInfo(void* dev, unsigned profile,
                                                                               GiProfileInfo* info) {
  FAKE_GPU_OR_RETURN(g, dev);
  (void)g;
  if (S().no_mig) return kNotSupported;
  if (profile >= 0x12) return kInvalidArgument;
  std::memset(info, 0, sizeof(*info));
  for (const ProfileRow& row : kProfileRows) {
    if (row.index != profile) continue;
    info->id = row.id;
    info->slice_count = row.slices;
    info->instance_count = row.instances;
    info->memory_size_mb = row.mib * S().memory_mib / kBaseMemoryMib;
    return kSuccess;
  }
  return kNotSupported;
}

__attribute__((visibility("default"))) int nvmlDeviceGetTopologyCommonAncestor(void* a, void* b, int* level) {
  FAKE_GPU_OR_RETURN(ga, a);
  FAKE_GPU_OR_RETURN(gb, b);
  if (Unsupported("ancestor")) return kNotSupported;
  if (ga == gb)
    *level = 0;
  else if (Partner(ga->index) == gb->index)
    *level = 10;  // one switch
  else if (Numa(ga->index) == Numa(gb->index))
    *level = 40;  // same NUMA node
  else
    *level = 50;  // across sockets
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetNvLinkState(void* dev, unsigned link, int* active) {
  FAKE_GPU_OR_RETURN(g, dev);
  if (Unsupported("nvlink")) return kNotSupported;
  if (link >= 18) return kInvalidArgument;
  if (S().nvswitch > 0) {
    *active = link < S().nvswitch ? 1 : 0;
    return kSuccess;
  }
  *active = (link < 4 && Partner(g->index) < static_cast<int>(S().gpus.size())) ? 1 : 0;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetNvLinkRemotePciInfo_v2(void* dev, unsigned link,
                                                                               PciInfo* pci) {
  FAKE_GPU_OR_RETURN(g, dev);
  if (S().nvswitch > 0) {
    // The far end is one of four NVSwitch chips, on buses no GPU uses.
    if (link >= S().nvswitch) return kInvalidArgument;
    std::memset(pci, 0, sizeof(*pci));
    pci->bus = 0xE0 + link % 4;
    pci->pci_device_id = 0x22a310de;
    std::snprintf(pci->bus_id, sizeof(pci->bus_id), "00000000:%02X:00.0", pci->bus);
    return kSuccess;
  }
  if (link >= 4 || Partner(g->index) >= static_cast<int>(S().gpus.size())) return kInvalidArgument;
  FillPci(Partner(g->index), pci);
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetComputeRunningProcesses_v3(void* dev, unsigned* count,
                                                                                   ProcessInfo* infos) {
  FAKE_GPU_OR_RETURN(g, dev);
  if (Unsupported("processes")) return kNotSupported;
  // Not in MIG mode: two processes on GPU 0. In MIG mode: one process in each busy GPU instance.
  std::vector<ProcessInfo> procs;
  if (!g->mig && g->index == 0) {
    for (unsigned i = 0; i < 2; ++i) {
      procs.push_back(ProcessInfo{.pid = 1234 + i * 1111,
                                  .used_gpu_memory = (1ULL + i) << 30U,
                                  .gpu_instance_id = 0xFFFFFFFFU,
                                  .compute_instance_id = 0xFFFFFFFFU});
    }
  }
  if (g->mig) {
    for (const FakeGpuInstance& gi : g->gpu_instances) {
      if (!gi.used || !gi.busy) continue;
      procs.push_back(ProcessInfo{
          .pid = 5000 + gi.id, .used_gpu_memory = 1ULL << 30U, .gpu_instance_id = gi.id, .compute_instance_id = 0});
    }
  }
  const auto have = static_cast<unsigned>(procs.size());
  if (*count < have) {
    *count = have;
    return kInsufficientSize;
  }
  *count = have;
  for (unsigned i = 0; i < have; ++i) infos[i] = procs[i];
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetTotalEccErrors(void* dev, int error_type,
                                                                       int counter_type,
                                                                       unsigned long long* count) {
  FAKE_GPU_OR_RETURN(g, dev);
  (void)counter_type;
  *count = error_type == 1 ? g->ecc : 0;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetClockInfo(void* dev, int type, unsigned* mhz) {
  FAKE_GPU_OR_RETURN(g, dev);
  (void)g;
  if (Unsupported("clocks")) return kNotSupported;
  if (type == 1)
    *mhz = 1980;
  else if (type == 2)
    *mhz = 2619;
  else
    *mhz = 1755;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetUtilizationRates(void* dev, Utilization* util) {
  FAKE_GPU_OR_RETURN(g, dev);
  if (Unsupported("utilization")) return kNotSupported;
  util->gpu = 75 + static_cast<unsigned>(g->index);
  util->memory = 30;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetEncoderUtilization(void* dev, unsigned* util,
                                                                           unsigned* period) {
  FAKE_GPU_OR_RETURN(g, dev);
  (void)g;
  if (Unsupported("encoder")) return kNotSupported;
  *util = 10;
  *period = 167000;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetDecoderUtilization(void* dev, unsigned* util,
                                                                           unsigned* period) {
  FAKE_GPU_OR_RETURN(g, dev);
  (void)g;
  if (Unsupported("decoder")) return kNotSupported;
  *util = 5;
  *period = 167000;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetPcieReplayCounter(void* dev, unsigned* value) {
  FAKE_GPU_OR_RETURN(g, dev);
  (void)g;
  if (Unsupported("pcie_replay")) return kNotSupported;
  *value = 2;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetPcieThroughput(void* dev, int counter,
                                                                       unsigned* kbps) {
  FAKE_GPU_OR_RETURN(g, dev);
  (void)g;
  if (Unsupported("pcie_throughput")) return kNotSupported;
  *kbps = counter == 0 ? 1000 : 2000;
  return kSuccess;
}

#ifndef FAKE_NVML_MINIMAL

__attribute__((visibility("default"))) int nvmlDeviceGetNumaNodeId(void* dev, unsigned* node) {
  FAKE_GPU_OR_RETURN(g, dev);
  if (Unsupported("numa")) return kNotSupported;
  *node = static_cast<unsigned>(Numa(g->index));
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetMemoryInfo_v2(void* dev, MemoryInfoV2* mem) {
  FAKE_GPU_OR_RETURN(g, dev);
  if (Unsupported("memory_v2")) return kNotSupported;
  if ((mem->version >> 24U) != 2 || (mem->version & 0xFFFFFFU) != sizeof(MemoryInfoV2))
    return kInvalidArgument;
  mem->total = S().memory_mib << 20U;
  mem->reserved = 512ULL << 20U;
  mem->used = g->index == 0 ? (3ULL << 30U) : (512ULL << 20U);
  mem->free = mem->total - mem->reserved - mem->used;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetTemperatureV(void* dev, TemperatureV1* t) {
  FAKE_GPU_OR_RETURN(g, dev);
  if (Unsupported("temperature")) return kNotSupported;
  if ((t->version >> 24U) != 1 || t->sensor_type != 0) return kInvalidArgument;
  t->temperature = 40 + g->index;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetTemperature(void* dev, int sensor, unsigned* value) {
  FAKE_GPU_OR_RETURN(g, dev);
  if (Unsupported("temperature") || sensor != 0) return kNotSupported;
  *value = 40U + static_cast<unsigned>(g->index);
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetPowerUsage(void* dev, unsigned* mw) {
  FAKE_GPU_OR_RETURN(g, dev);
  if (Unsupported("power")) return kNotSupported;
  *mw = 350123U + static_cast<unsigned>(g->index);
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetTotalEnergyConsumption(void* dev,
                                                                               unsigned long long* mj) {
  FAKE_GPU_OR_RETURN(g, dev);
  (void)g;
  if (Unsupported("energy")) return kNotSupported;
  *mj = 123456789ULL;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetRemappedRows(void* dev, unsigned* corr, unsigned* unc,
                                                                     unsigned* pending, unsigned* failed) {
  FAKE_GPU_OR_RETURN(g, dev);
  (void)g;
  if (Unsupported("remapped_rows")) return kNotSupported;
  *corr = 1;
  *unc = 0;
  *pending = 0;
  *failed = 0;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlEventSetCreate(void** set) {
  if (!S().initialized) return kUninitialized;
  *set = new FakeEventSet();
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlEventSetFree(void* set) {
  delete static_cast<FakeEventSet*>(set);
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceRegisterEvents(void* dev, unsigned long long types,
                                                                    void* set) {
  FAKE_GPU_OR_RETURN(g, dev);
  if ((types & 0x8ULL) == 0 || set == nullptr) return kInvalidArgument;
  static_cast<FakeEventSet*>(set)->registered.insert(g->index);
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlEventSetWait_v2(void* set, EventData* data,
                                                               unsigned timeout_ms) {
  (void)timeout_ms;
  if (!S().initialized || set == nullptr) return kUninitialized;
  for (FakeGpu& g : S().gpus) {
    if (g.xid == 0 || static_cast<FakeEventSet*>(set)->registered.count(g.index) == 0) continue;
    *data =
        EventData{.device = &g, .event_type = 0x8, .event_data = g.xid, .gi = 0xFFFFFFFFU, .ci = 0xFFFFFFFFU};
    g.xid = 0;  // delivered once
    return kSuccess;
  }
  return kTimeout;
}

__attribute__((visibility("default"))) int nvmlDeviceGetFieldValues(void* dev, int count,
                                                                    FieldValue* values) {
  FAKE_GPU_OR_RETURN(g, dev);
  if (count < 0 || (count > 0 && values == nullptr)) return kInvalidArgument;
  if (Unsupported("field_values")) return kNotSupported;
  const State& s = S();
  for (int i = 0; i < count; ++i) {
    FieldValue& f = values[i];
    f.timestamp = 1700000000000000LL;
    f.latency_usec = 0;
    f.value = FieldValueUnion{};
    f.nvml_return = kSuccess;
    const auto index = static_cast<unsigned>(g->index);
    switch (f.field_id) {
      case 82:  // memory temperature
        if (Unsupported("memory_temp")) {
          f.nvml_return = kNotSupported;
        } else {
          f.value_type = 1;  // unsigned int
          f.value.ui = s.memory_temp + index;
        }
        break;
      case 138:  // NVLink data TX, KiB
      case 139:  // NVLink data RX, KiB
        if (!HasNvLink(g->index) || Unsupported(f.field_id == 138 ? "nvlink_tx" : "nvlink_rx")) {
          f.nvml_return = kNotSupported;
        } else if (f.scope_id != UINT_MAX && f.scope_id >= 4) {
          f.nvml_return = kInvalidArgument;  // no such link
        } else {
          const unsigned long long total = (f.field_id == 138 ? s.nvlink_tx_kib : s.nvlink_rx_kib) + index;
          f.value_type = 3;  // unsigned long long
          f.value.ull = f.scope_id == UINT_MAX ? total : total / 4;
        }
        break;
      default: f.nvml_return = kNotSupported;
    }
  }
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlGpmQueryDeviceSupport(void* dev, GpmSupport* support) {
  FAKE_GPU_OR_RETURN(g, dev);
  (void)g;
  if (support == nullptr || support->version != 1) return kInvalidArgument;
  support->is_supported_device = GpmSupported() ? 1 : 0;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlGpmSampleAlloc(void** sample) {
  if (!S().initialized) return kUninitialized;
  if (sample == nullptr) return kInvalidArgument;
  *sample = new FakeGpmSample();
  ++GpmSamplesLive();
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlGpmSampleFree(void* handle) {
  FakeGpmSample* sample = GpmSampleOf(handle);
  if (sample == nullptr) return kInvalidArgument;
  sample->magic = 0;
  delete sample;
  --GpmSamplesLive();
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlGpmSampleGet(void* dev, void* handle) {
  FAKE_GPU_OR_RETURN(g, dev);
  FakeGpmSample* sample = GpmSampleOf(handle);
  if (sample == nullptr) return kInvalidArgument;
  if (!GpmSupported() || Unsupported("gpm_sample")) return kNotSupported;
  sample->gpu = g->index;
  sample->seq = ++g->gpm_samples_taken;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlGpmMetricsGet(GpmMetricsGet* get) {
  if (!S().initialized) return kUninitialized;
  if (get == nullptr || get->version != 1 || get->num_metrics > kGpmMetricMax) return kInvalidArgument;
  const FakeGpmSample* a = GpmSampleOf(get->sample1);
  const FakeGpmSample* b = GpmSampleOf(get->sample2);
  // Both filled, by the same GPU, the first one older.
  if (a == nullptr || b == nullptr || a->gpu < 0 || a->gpu != b->gpu || a->seq >= b->seq)
    return kInvalidArgument;
  const State& s = S();
  for (unsigned i = 0; i < get->num_metrics; ++i) {
    GpmMetric& m = get->metrics[i];
    m.metric_info = {nullptr, nullptr, nullptr};
    const std::vector<double>* values = nullptr;
    if (m.metric_id == 1 && !Unsupported("gpm_graphics")) values = &s.gpm_graphics;
    if (m.metric_id == 5 && !Unsupported("gpm_tensor")) values = &s.gpm_tensor;
    if (m.metric_id == 10 && !Unsupported("gpm_dram")) values = &s.gpm_dram;
    if (values == nullptr) {
      m.nvml_return = kNotSupported;
      m.value = 0;
      continue;
    }
    m.nvml_return = kSuccess;
    m.value = GpmValue(*values, a->seq, b->seq) + a->gpu;
  }
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetVirtualizationMode(void* dev, int* mode) {
  FAKE_GPU_OR_RETURN(g, dev);
  (void)g;
  if (Unsupported("virtualization")) return kNotSupported;
  *mode = S().virtualization;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetGridLicensableFeatures_v4(void* dev,
                                                                                  GridLicensableFeatures* f) {
  FAKE_GPU_OR_RETURN(g, dev);
  (void)g;
  if (f == nullptr) return kInvalidArgument;
  std::memset(f, 0, sizeof(*f));
  if (S().virtualization != 2 && S().virtualization != 1) return kNotSupported;
  f->is_grid_license_supported = 1;
  f->licensable_features_count = 1;
  GridLicensableFeature& feature = f->features[0];
  feature.feature_code = 4;  // compute
  feature.feature_state = S().vgpu_licensed ? 1 : 0;
  feature.feature_enabled = 1;
  std::snprintf(feature.product_name, sizeof(feature.product_name), "NVIDIA Virtual Compute Server");
  feature.license_expiry =
      GridLicenseExpiry{.year = 2030, .month = 1, .day = 1, .hour = 0, .min = 0, .sec = 0, .status = 1};
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetMaxMigDeviceCount(void* dev, unsigned* count) {
  FAKE_GPU_OR_RETURN(g, dev);
  if (S().no_mig) return kNotSupported;
  if (count == nullptr) return kInvalidArgument;
  *count = g->mig ? 7 : 0;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetMigDeviceHandleByIndex(void* dev, unsigned index,
                                                                               void** mig) {
  FAKE_GPU_OR_RETURN(g, dev);
  if (S().no_mig) return kNotSupported;
  if (mig == nullptr || !g->mig || index >= 7) return kInvalidArgument;
  unsigned k = 0;
  for (FakeGpuInstance& gi : g->gpu_instances) {
    if (!gi.used) continue;
    for (FakeComputeInstance& ci : gi.cis) {
      if (!ci.used) continue;
      if (k++ == index) {
        *mig = &ci;
        return kSuccess;
      }
    }
  }
  return kNotFound;
}

__attribute__((visibility("default"))) int nvmlDeviceGetGpuInstanceId(void* dev, unsigned* id) {
  const FakeComputeInstance* m = MigDevice(dev);
  if (m == nullptr || id == nullptr) return S().initialized ? kInvalidArgument : kUninitialized;
  *id = m->gi->id;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetComputeInstanceId(void* dev, unsigned* id) {
  const FakeComputeInstance* m = MigDevice(dev);
  if (m == nullptr || id == nullptr) return S().initialized ? kInvalidArgument : kUninitialized;
  *id = m->id;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetGpuInstanceById(void* dev, unsigned id, void** gi) {
  FAKE_GPU_OR_RETURN(g, dev);
  if (S().no_mig) return kNotSupported;
  if (gi == nullptr || !g->mig) return kInvalidArgument;
  if (Unsupported("gpu_instance_by_id")) return kNoPermission;
  for (FakeGpuInstance& instance : g->gpu_instances) {
    if (!instance.used || instance.id != id) continue;
    *gi = &instance;
    return kSuccess;
  }
  return kNotFound;
}

__attribute__((visibility("default"))) int nvmlGpuInstanceGetInfo(void* gi, GpuInstanceInfo* info) {
  const FakeGpuInstance* instance = GpuInstance(gi);
  if (instance == nullptr || info == nullptr) return S().initialized ? kInvalidArgument : kUninitialized;
  info->device = instance->gpu;
  info->id = instance->id;
  info->profile_id = instance->profile_id;
  info->placement = GpuInstancePlacement{.start = instance->start, .size = instance->size};
  return kSuccess;
}

// NVML_NVLINK_DEVICE_TYPE_GPU 0, _IBMNPU 1, _SWITCH 2.
__attribute__((visibility("default"))) int nvmlDeviceGetNvLinkRemoteDeviceType(void* dev, unsigned link,
                                                                               int* type) {
  FAKE_GPU_OR_RETURN(g, dev);
  if (Unsupported("nvlink")) return kNotSupported;
  if (S().nvswitch > 0) {
    if (link >= S().nvswitch) return kInvalidArgument;
    *type = 2;
    return kSuccess;
  }
  if (link >= 4 || Partner(g->index) >= static_cast<int>(S().gpus.size())) return kInvalidArgument;
  *type = 0;
  return kSuccess;
}

// ---- MIG management: create and destroy GPU and compute instances, validated like the driver ----

__attribute__((visibility("default"))) int nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    void* dev, unsigned profile_id, GpuInstancePlacement* placements, unsigned* count) {
  FAKE_GPU_OR_RETURN(g, dev);
  if (S().no_mig) return kNotSupported;
  if (count == nullptr || !g->mig) return kInvalidArgument;
  const ProfileRow* row = RowById(profile_id);
  if (row == nullptr) return kInvalidArgument;
  unsigned n = 0;
  for (unsigned start = 0; start < 8; ++start) {
    if ((row->valid_starts & (1U << start)) == 0) continue;
    if (placements != nullptr) placements[n] = GpuInstancePlacement{.start = start, .size = row->memory_slices};
    ++n;
  }
  *count = n;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceCreateGpuInstanceWithPlacement(
    void* dev, unsigned profile_id, const GpuInstancePlacement* placement, void** gi_out) {
  FAKE_GPU_OR_RETURN(g, dev);
  State& s = S();
  if (s.no_mig) return kNotSupported;
  if (!g->mig) return kNotSupported;
  if (placement == nullptr || gi_out == nullptr) return kInvalidArgument;
  const ProfileRow* row = RowById(profile_id);
  if (row == nullptr) return kInvalidArgument;
  if (placement->start >= 8 || (row->valid_starts & (1U << placement->start)) == 0 ||
      placement->size != row->memory_slices) {
    return kInvalidArgument;
  }
  if (s.mig_create_fail > 0) {
    --s.mig_create_fail;
    return s.mig_create_error;
  }
  unsigned compute = 0;
  unsigned same_profile = 0;
  FakeGpuInstance* slot = nullptr;
  for (FakeGpuInstance& gi : g->gpu_instances) {
    if (!gi.used) {
      if (slot == nullptr) slot = &gi;
      continue;
    }
    // Memory slices may not overlap an existing GPU instance's.
    if (placement->start < gi.start + gi.size && gi.start < placement->start + placement->size)
      return kInsufficientResources;
    compute += gi.compute_slices;
    if (gi.profile_id == profile_id) ++same_profile;
  }
  if (slot == nullptr || compute + row->slices > kComputeSlices || same_profile >= row->instances)
    return kInsufficientResources;
  const unsigned id = FreeId(g->gpu_instances, 1);
  *slot = FakeGpuInstance();
  slot->used = true;
  slot->gpu = g;
  slot->id = id;
  slot->profile_id = profile_id;
  slot->start = placement->start;
  slot->size = placement->size;
  slot->compute_slices = row->slices;
  ++s.mig_changes;
  *gi_out = slot;
  return kSuccess;
}

// Compute-instance profiles 0..4: 1, 2, 3, 4 and 7 slices (5: 8 slices, 6: 6 slices and 7: 1 slice
// rev1 exist in NVML but not on these GPUs).
__attribute__((visibility("default"))) int nvmlGpuInstanceGetComputeInstanceProfileInfo(
    void* gi_handle, unsigned profile, unsigned eng_profile, CiProfileInfo* info) {
  FakeGpuInstance* gi = GpuInstance(gi_handle);
  if (gi == nullptr || info == nullptr) return S().initialized ? kInvalidArgument : kUninitialized;
  if (profile >= 8 || eng_profile != 0) return kInvalidArgument;
  constexpr unsigned kSlices[] = {1, 2, 3, 4, 7};
  if (profile >= 5 || kSlices[profile] > gi->compute_slices) return kNotSupported;
  std::memset(info, 0, sizeof(*info));
  info->id = profile;
  info->slice_count = kSlices[profile];
  info->instance_count = gi->compute_slices / kSlices[profile];
  info->sm_count = 16 * kSlices[profile];
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlGpuInstanceCreateComputeInstance(void* gi_handle, unsigned profile_id,
                                                                               void** ci_out) {
  FakeGpuInstance* gi = GpuInstance(gi_handle);
  State& s = S();
  if (gi == nullptr || ci_out == nullptr) return s.initialized ? kInvalidArgument : kUninitialized;
  constexpr unsigned kSlices[] = {1, 2, 3, 4, 7};
  if (profile_id >= 5 || kSlices[profile_id] > gi->compute_slices) return kInvalidArgument;
  if (s.mig_ci_create_fail > 0) {
    --s.mig_ci_create_fail;
    return s.mig_ci_create_error;
  }
  unsigned used = 0;
  FakeComputeInstance* slot = nullptr;
  for (FakeComputeInstance& ci : gi->cis) {
    if (ci.used) used += ci.slices;
    else if (slot == nullptr) slot = &ci;
  }
  if (slot == nullptr || used + kSlices[profile_id] > gi->compute_slices) return kInsufficientResources;
  const unsigned id = FreeId(gi->cis, 0);
  *slot = FakeComputeInstance{
      .used = true, .gi = gi, .id = id, .profile_id = profile_id, .slices = kSlices[profile_id], .serial = ++s.serial};
  ++s.mig_changes;
  *ci_out = slot;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlGpuInstanceGetComputeInstances(void* gi_handle, unsigned profile_id,
                                                                              void** cis, unsigned* count) {
  FakeGpuInstance* gi = GpuInstance(gi_handle);
  if (gi == nullptr || count == nullptr) return S().initialized ? kInvalidArgument : kUninitialized;
  if (profile_id >= 8) return kInvalidArgument;
  unsigned n = 0;
  for (FakeComputeInstance& ci : gi->cis) {
    if (!ci.used || ci.profile_id != profile_id) continue;
    if (cis != nullptr) cis[n] = &ci;
    ++n;
  }
  *count = n;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlComputeInstanceDestroy(void* ci_handle) {
  FakeComputeInstance* ci = MigDevice(ci_handle);
  if (ci == nullptr) return S().initialized ? kInvalidArgument : kUninitialized;
  if (ci->gi->busy) return kInUse;  // a process runs on it
  *ci = FakeComputeInstance();
  ++S().mig_changes;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlGpuInstanceDestroy(void* gi_handle) {
  FakeGpuInstance* gi = GpuInstance(gi_handle);
  if (gi == nullptr) return S().initialized ? kInvalidArgument : kUninitialized;
  if (gi->busy) return kInUse;
  for (const FakeComputeInstance& ci : gi->cis) {
    if (ci.used) return kInUse;  // its compute instances go first
  }
  *gi = FakeGpuInstance();
  ++S().mig_changes;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetGpuInstances(void* dev, unsigned profile_id, void** gis,
                                                                     unsigned* count) {
  FAKE_GPU_OR_RETURN(g, dev);
  if (S().no_mig) return kNotSupported;
  if (count == nullptr || !g->mig) return kInvalidArgument;
  unsigned n = 0;
  for (FakeGpuInstance& gi : g->gpu_instances) {
    if (!gi.used || gi.profile_id != profile_id) continue;
    if (gis != nullptr) gis[n] = &gi;
    ++n;
  }
  *count = n;
  return kSuccess;
}

#endif  // FAKE_NVML_MINIMAL

// Test hooks, exported by both builds.
__attribute__((visibility("default"))) long fake_nvml_mig_changes() {
  return S().mig_changes;
}
__attribute__((visibility("default"))) long fake_nvml_gpm_samples_live() {
  return GpmSamplesLive();
}

}  // extern "C"
