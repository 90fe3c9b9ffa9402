// Generating an NVIDIA CDI spec from the inventory and the driver files found on the host, for
// machines where NVIDIA's container toolkit has not written one.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <optional>
#include <set>
#include <string_view>

#include "agent/cdi.h"

namespace gpupool {

namespace {

namespace fs = std::filesystem;

// The user-space driver libraries a CUDA (and NVML, OpenCL) program loads, by name before ".so".
constexpr std::string_view kLibraryNames[] = {
    "libcuda",           "libcudadebugger",  "libnvidia-ml",  "libnvidia-ptxjitcompiler",
    "libnvidia-nvvm",    "libnvidia-opencl", "libnvidia-cfg", "libnvidia-allocator",
    "libnvidia-gpucomp",
};
// Debian/Ubuntu multiarch first, then the RHEL-family and generic directories.
constexpr std::string_view kLibraryDirs[] = {
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
    "/lib64",
};
constexpr std::string_view kBinaryNames[] = {
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
};
constexpr std::string_view kBinaryDirs[] = {"/usr/bin", "/usr/sbin", "/bin"};
constexpr std::string_view kControlDevices[] = {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                                                "/dev/nvidia-modeset"};

// `root` without trailing slashes: "" for "/".
std::string RootPrefix(const std::string& root) {
  std::string r = root;
  while (!r.empty() && r.back() == '/') r.pop_back();
  return r;
}

std::string HostPath(const std::string& root, std::string_view path) {
  return RootPrefix(root) + std::string(path);
}

std::string ContainerPath(const std::string& root, const std::string& host_path) {
  const std::string prefix = RootPrefix(root);
  if (!prefix.empty() && host_path.starts_with(prefix + "/")) return host_path.substr(prefix.size());
  return host_path;
}

bool IsDriverLibrary(std::string_view file) {
  return std::any_of(std::begin(kLibraryNames), std::end(kLibraryNames), [file](std::string_view base) {
    if (!file.starts_with(base) || !file.substr(base.size()).starts_with(".so")) return false;
    const std::string_view rest = file.substr(base.size() + 3);
    return rest.empty() || rest.front() == '.';
  });
}

bool IsDriverBinary(std::string_view file) {
  return std::find(std::begin(kBinaryNames), std::end(kBinaryNames), file) != std::end(kBinaryNames);
}

// A regular file, or a symlink that leads to one: a dangling link could not be bind-mounted, and
// the container must not be told about a file that is not there.
bool IsFileOrLinkToFile(const fs::directory_entry& entry) {
  std::error_code ec;
  const fs::file_status st = entry.symlink_status(ec);
  if (ec) return false;
  if (fs::is_regular_file(st)) return true;
  if (!fs::is_symlink(st)) return false;
  const fs::file_status target = fs::status(entry.path(), ec);
  return !ec && fs::is_regular_file(target);
}

// Adds the files of `dir` (a host path) that `wanted` picks to `out`, unless `dir` resolves to a
// directory already scanned. Looks at no more than kCdiMaxListEntries entries.
template <typename Wanted>
void Scan(const std::string& dir, Wanted wanted, std::set<std::string>& scanned,
          std::vector<std::string>& out) {
  std::error_code ec;
  const fs::path real = fs::canonical(dir, ec);
  if (ec || !scanned.insert(real.string()).second) return;
  fs::directory_iterator it(dir, ec);
  size_t looked_at = 0;
  for (; !ec && it != fs::directory_iterator() && looked_at < kCdiMaxListEntries;
       it.increment(ec), ++looked_at) {
    if (wanted(it->path().filename().string()) && IsFileOrLinkToFile(*it)) out.push_back(it->path().string());
  }
}

void SortUnique(std::vector<std::string>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

// "550.54.15" from "/.../libcuda.so.550.54.15"; empty for libcuda.so, libcuda.so.1 and the rest.
std::string DriverVersionOf(const std::string& library) {
  const std::string file = fs::path(library).filename().string();
  constexpr std::string_view kPrefix = "libcuda.so.";
  if (!file.starts_with(kPrefix)) return "";
  const std::string version = file.substr(kPrefix.size());
  if (version.find('.') == std::string::npos) return "";
  const bool plain =
      std::all_of(version.begin(), version.end(), [](char c) { return (c >= '0' && c <= '9') || c == '.'; });
  return plain ? version : "";
}


CdiDeviceNode Node(const std::string& root, const std::string& container_path) {
  CdiDeviceNode n;
  n.path = container_path;
  const std::string host = HostPath(root, container_path);
  if (host != container_path) n.host_path = host;
  n.permissions = "rwm";
  return n;
}

CdiMount ReadOnlyBind(const std::string& root, const std::string& host_path) {
  CdiMount m;
  m.host_path = host_path;
  m.container_path = ContainerPath(root, host_path);
  m.options = {"ro", "nosuid", "nodev", "bind"};
  return m;
}

// Both names of a device get the same edits; a name CDI would refuse is left out.
void AddDevice(CdiSpec& spec, const std::vector<std::string>& names, const CdiEdits& edits) {
  for (const std::string& name : names) {
    if (IsValidCdiDeviceName(name)) spec.devices[name] = edits;
  }
}

}  // namespace

DriverFiles FindDriverFiles(const std::string& root) {
  DriverFiles files;
  std::set<std::string> scanned;
  for (std::string_view dir : kLibraryDirs)
    Scan(HostPath(root, dir), IsDriverLibrary, scanned, files.libraries);
  for (std::string_view dir : kBinaryDirs) Scan(HostPath(root, dir), IsDriverBinary, scanned, files.binaries);
  for (std::string_view dev : kControlDevices) {
    std::error_code ec;
    const std::string path = HostPath(root, dev);
    if (fs::exists(path, ec) && !ec) files.control_devices.push_back(path);
  }
  for (const std::string& lib : files.libraries) {
    const std::string version = DriverVersionOf(lib);
    if (version.empty()) continue;
    std::error_code ec;
    const std::string dir = HostPath(root, "/lib/firmware/nvidia/" + version);
    if (fs::is_directory(dir, ec) && !ec) files.firmware.push_back(dir);
  }
  SortUnique(files.libraries);
  SortUnique(files.binaries);
  SortUnique(files.control_devices);
  SortUnique(files.firmware);
  return files;
}

Result<int> MigCapMinor(std::string_view text, std::string_view name) {
  while (!text.empty()) {
    const size_t end = std::min(text.find('\n'), text.size());
    const std::string_view line = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    const size_t space = line.find_first_of(" \t");
    if (space == std::string_view::npos || line.substr(0, space) != name) continue;
    std::string_view minor = line.substr(space);
    const size_t first = minor.find_first_not_of(" \t");
    const size_t last = minor.find_last_not_of(" \t\r");
    minor = first == std::string_view::npos ? std::string_view() : minor.substr(first, last - first + 1);
    int value = -1;
    const auto [ptr, ec] = std::from_chars(minor.data(), minor.data() + minor.size(), value);
    if (minor.empty() || ec != std::errc() || ptr != minor.data() + minor.size() || value < 0)
      return Status::InvalidArgument(
          fmt::format("mig-minors: '{}' has no valid minor number: '{}'", name, line.substr(0, 200)));
    return value;
  }
  return Status::NotFound(fmt::format("mig-minors has no entry for {}", name));
}

CdiSpec GenerateNvidiaCdiSpec(const Inventory& inv, const DriverFiles& files, const std::string& root,
                              const std::string& mig_minors_text) {
  CdiSpec spec;
  spec.version = "0.5.0";
  spec.kind = "nvidia.com/gpu";
  spec.source = "generated";
  for (const GpuInfo& gpu : inv.gpus) {
    if (gpu.minor_number < 0) continue;  // simulated, or NVML could not tell: no node to give
    CdiEdits whole;
    whole.device_nodes.push_back(Node(root, fmt::format("/dev/nvidia{}", gpu.minor_number)));
    AddDevice(spec, {std::to_string(gpu.index), gpu.uuid}, whole);
    for (size_t i = 0; i < gpu.mig_instances.size(); ++i) {
      const MigInstanceInfo& mig = gpu.mig_instances[i];
      if (mig.gpu_instance_id < 0 || mig.compute_instance_id < 0) continue;
      const std::string gi = fmt::format("gpu{}/gi{}/access", gpu.minor_number, mig.gpu_instance_id);
      const std::string ci = fmt::format("gpu{}/gi{}/ci{}/access", gpu.minor_number, mig.gpu_instance_id,
                                         mig.compute_instance_id);
      const Result<int> gi_minor = MigCapMinor(mig_minors_text, gi);
      const Result<int> ci_minor = MigCapMinor(mig_minors_text, ci);
      if (!gi_minor.ok() || !ci_minor.ok()) continue;
      CdiEdits edits = whole;
      edits.device_nodes.push_back(Node(root, fmt::format("/dev/nvidia-caps/nvidia-cap{}", *gi_minor)));
      edits.device_nodes.push_back(Node(root, fmt::format("/dev/nvidia-caps/nvidia-cap{}", *ci_minor)));
      std::vector<std::string> names = {fmt::format("{}:{}", gpu.index, i)};
      if (!mig.uuid.empty()) names.push_back(mig.uuid);
      AddDevice(spec, names, edits);
    }
  }
  for (const std::string& dev : files.control_devices)
    spec.common.device_nodes.push_back(Node(root, ContainerPath(root, dev)));
  for (const auto* list : {&files.libraries, &files.binaries, &files.firmware}) {
    for (const std::string& path : *list) spec.common.mounts.push_back(ReadOnlyBind(root, path));
  }
  return spec;
}

std::vector<std::string> SupplementMigDevices(std::vector<CdiSpec>& specs, const GpuInfo& gpu,
                                              const CdiSpec& generated) {
  std::vector<std::string> added;
  CdiSpec* host = nullptr;  // the last spec providing the GPU, as ResolveCdiDevices would take it
  for (CdiSpec& s : specs) {
    if (s.kind == generated.kind && (s.devices.contains(gpu.uuid) || s.devices.contains(std::to_string(gpu.index))))
      host = &s;
  }
  if (host == nullptr) return added;
  for (const MigInstanceInfo& m : gpu.mig_instances) {
    if (m.uuid.empty() || !IsValidCdiDeviceName(m.uuid)) continue;
    const bool named = std::any_of(specs.begin(), specs.end(), [&](const CdiSpec& s) {
      return s.kind == generated.kind && s.devices.contains(m.uuid);
    });
    const auto entry = generated.devices.find(m.uuid);
    if (named || entry == generated.devices.end()) continue;
    host->devices[m.uuid] = entry->second;
    added.push_back(m.uuid);
  }
  return added;
}

}  // namespace gpupool
