// The Container Device Interface (CDI): the JSON/YAML files, usually under /etc/cdi and
// /var/run/cdi, in which a vendor's tooling (NVIDIA's `nvidia-ctk cdi generate`) describes what a
// container needs to use a device: device nodes, bind mounts, environment and hooks. The agent reads
// them to give a container task its GPUs the way any CDI-aware runtime would, and generates an
// equivalent spec itself where the toolkit left none.
//
// Only the parts of a spec (CDI versions 0.3.0 to 0.8.0) that an OCI runtime applies are kept;
// annotations, intelRdt, additionalGIDs and the device-node fields major/minor/type/fileMode/uid/gid
// are read past. Spec files are trusted as far as their author (an administrator) is, which is not
// far: they are size-limited and validated before anything else looks at them.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "agent/inventory.h"
#include "common/status.h"

namespace gpupool {

// Limits on one spec file. Real specs are far below them (nvidia-ctk writes ~20 KiB for 8 GPUs);
// they only keep a broken or hostile file from costing memory and time.
inline constexpr size_t kCdiMaxSpecBytes = 4 * 1024 * 1024;
inline constexpr size_t kCdiMaxDevices = 4096;
inline constexpr size_t kCdiMaxListEntries = 4096;  // env, deviceNodes, mounts, hooks, args, options
inline constexpr size_t kCdiMaxStringBytes = 4096;

struct CdiDeviceNode {
  std::string path;         // in the container
  std::string host_path;    // empty: same as `path`
  std::string permissions;  // cgroup device access, a subset of "rwm"; "rwm" when the spec says none
  bool operator==(const CdiDeviceNode&) const = default;
};

struct CdiMount {
  std::string host_path;
  std::string container_path;
  std::vector<std::string> options;  // mount(8) options: "ro", "nosuid", "nodev", "bind"
  std::string type;                  // CDI 0.4.0 `type`; empty: a bind mount
  bool operator==(const CdiMount&) const = default;
};

struct CdiHook {
  std::string hook_name;  // prestart, createRuntime, createContainer, startContainer, poststart, poststop
  std::string path;
  std::vector<std::string> args;  // argv, args[0] included, as in the OCI runtime spec
  std::vector<std::string> env;   // "K=V"
  int timeout = 0;                // seconds; 0: none
  bool operator==(const CdiHook&) const = default;
};

// What to change in a container's OCI spec for a device (or for every device of a spec).
struct CdiEdits {
  std::vector<std::string> env;  // "K=V"
  std::vector<CdiDeviceNode> device_nodes;
  std::vector<CdiMount> mounts;
  std::vector<CdiHook> hooks;

  bool empty() const { return env.empty() && device_nodes.empty() && mounts.empty() && hooks.empty(); }
  // Appends every entry of `other` after this one's (no de-duplication; ResolveCdiDevices does that).
  void Append(const CdiEdits& other);
  bool operator==(const CdiEdits&) const = default;
};

struct CdiSpec {
  std::string version;                      // cdiVersion, "0.5.0"
  std::string kind;                         // "vendor/class", e.g. "nvidia.com/gpu"
  std::string source;                       // the file it came from, or "generated"
  std::map<std::string, CdiEdits> devices;  // by device name ("0", "GPU-8f3c...", "0:1")
  CdiEdits common;                          // the spec's top-level containerEdits
  bool operator==(const CdiSpec&) const = default;
};

// CDI's naming rules. A kind is "vendor/class"; vendor and class start with a letter, end with a
// letter or digit and have letters, digits, '.', '-' and '_' between. A device name starts with a
// letter or digit and goes on with letters, digits, '_', '.', ':' and '-'.
bool IsValidCdiKind(std::string_view kind);
bool IsValidCdiDeviceName(std::string_view name);

// Parses one spec, JSON (text starting with '{' or '[') or YAML. Everything is checked before the
// spec is returned: the limits above, valid UTF-8, cdiVersion 0.3.0..0.8.0, kind "vendor/class" and
// device names by CDI's naming rules, unique device names, absolute paths, "K=V" env entries, known
// hook names, permissions within "rwm". Unknown keys are ignored, as the CDI spec asks of readers of
// older versions. Errors are InvalidArgument "<source>: <field>: <what is wrong>", the field as a
// path ("devices[3].containerEdits.mounts[0].hostPath"); no exception escapes.
Result<CdiSpec> ParseCdiSpec(std::string_view text, const std::string& source);

// Every *.json, *.yaml and *.yml regular file in each of `dirs` (absolute; the CDI order is
// {"/etc/cdi", "/var/run/cdi"}), each directory's files in name order. A missing directory is
// normal (nothing installed there). A file that is too large, unreadable or invalid is skipped
// with a warning that names it and says why, so one bad file does not hide the rest; no more than
// kCdiMaxListEntries entries of a directory are looked at. When two files define the same kind and
// device name, the later one wins (CDI gives later directories priority) and the earlier spec
// loses that device; a spec left without devices is dropped. Two files of one directory doing so
// is a mistake CDI leaves undefined: the later file wins here too, with a warning. `warnings` may
// be null. InvalidArgument for a relative directory (a caller's mistake, not the host's).
Result<std::vector<CdiSpec>> LoadCdiSpecs(const std::vector<std::string>& dirs,
                                          std::vector<std::string>* warnings);

// The edits that give a container the devices `names` of `kind` ("nvidia.com/gpu", {"0", "1"}):
// for every spec that provides at least one of them, its common edits (once) and then the edits of
// each of those devices, specs in the given order. A device several specs define is taken from the
// last of them (LoadCdiSpecs already leaves only one). Device nodes and mounts with the same
// container path as an earlier one, and repeated env entries, are left out (the first wins).
// NotFound "no CDI spec provides <kind>=<name>" for the first name none provides.
Result<CdiEdits> ResolveCdiDevices(const std::vector<CdiSpec>& specs, const std::string& kind,
                                   const std::vector<std::string>& names);

// The CDI JSON form of `spec`, leaving out empty fields (but every device has containerEdits, which
// the spec requires): ParseCdiSpec(CdiSpecToJson(s).dump(), s.source) gives `s` back, permissions
// given.
nlohmann::json CdiSpecToJson(const CdiSpec& spec);

// ---- Generating a spec where NVIDIA's container toolkit left none ----

// The host's NVIDIA user-space driver files a CUDA container needs. Host paths, under the `root`
// given to FindDriverFiles, each list sorted and without duplicates.
struct DriverFiles {
  std::vector<std::string> libraries;        // libcuda.so.1, libcuda.so.550.54.15, libnvidia-ml.so.1, ...
  std::vector<std::string> binaries;         // nvidia-smi, nvidia-cuda-mps-control, ...
  std::vector<std::string> control_devices;  // /dev/nvidiactl, /dev/nvidia-uvm, ... that exist
  std::vector<std::string> firmware;         // /lib/firmware/nvidia/<driver version> directories
};

// Looks for the driver files under `root` ("/" on a host; a fake tree in tests): the CUDA driver,
// NVML, PTX JIT, NVVM, OpenCL, cfg, allocator and gpucomp libraries (regular files, and symlinks to
// regular files such as libcuda.so.1 -> libcuda.so.550.54.15, both kept so that the container sees
// the same names) in the usual library directories, a directory that resolves to one already
// scanned (/lib -> usr/lib on merged-/usr systems) being skipped; the NVIDIA tools in /usr/bin,
// /usr/sbin and /bin; the control device nodes; the GSP firmware directory of each driver version
// whose libcuda.so.<version> was found. At most kCdiMaxListEntries entries are looked at per
// directory. Absolute symlink targets resolve against the real "/", not `root` (it matters only
// for fake trees). Reads directories only; what is missing is simply not listed.
DriverFiles FindDriverFiles(const std::string& root);

// The minor number of the nvidia-caps device `name` ("gpu0/gi1/access", "gpu0/gi1/ci0/access") in
// the text of /proc/driver/nvidia-caps/mig-minors (lines "<name> <minor>"): NotFound when the name
// is not listed, InvalidArgument when its minor is not a number.
Result<int> MigCapMinor(std::string_view mig_minors, std::string_view name);

// A CDI spec (kind nvidia.com/gpu, cdiVersion 0.5.0, source "generated") for the GPUs of `inv`:
//   - per GPU with a known minor number, a device named by its index ("0") and one named by its
//     UUID, each with the node /dev/nvidia<minor>;
//   - per MIG instance of such a GPU, a device "<gpu index>:<ordinal in mig_instances>" and one named
//     by its MIG UUID, with /dev/nvidia<minor> and the nvidia-caps nodes of its GPU instance and
//     compute instance from `mig_minors_text` (the text of /proc/driver/nvidia-caps/mig-minors, as
//     in MigCapDevices of agent/task_env.h). An instance whose caps are not listed there, or whose
//     ids are unknown, gets no device: it could not be opened in the container anyway. A name that
//     is not a valid CDI device name (old "MIG-GPU-<uuid>/1/0" UUIDs) is left out;
//   - common edits: the control device nodes and a read-only bind mount ("ro", "nosuid", "nodev",
//     "bind") of every library, binary and firmware directory of `files`, no env and no hooks.
// Container paths are the host paths with `root` taken off; host paths keep it (a device node's
// host path is left empty where it equals the container path, i.e. under root "/").
//
// No ldconfig hook (nvidia-ctk adds `update-ldcache`): the libraries are mounted at the host's own
// paths, and running the image's ldconfig from a hook would mean running a binary of the image,
// with the runtime's privileges, before the sandbox is in place. An image whose loader already
// searches that directory (the Debian/Ubuntu multiarch directory for most CUDA images) finds them
// as they are; for any other image (a RHEL-family image on a Debian host, musl) the libraries are
// present but not found by the loader, so the agent sets LD_LIBRARY_PATH to the directories of
// `files.libraries` for the task itself instead of relying on the image's ld.so.cache.
CdiSpec GenerateNvidiaCdiSpec(const Inventory& inv, const DriverFiles& files, const std::string& root,
                              const std::string& mig_minors_text);

// After the agent changed GPU `gpu`'s MIG layout on a node whose specs are the toolkit's (which name
// only the instances of when they were generated): every instance of `gpu` that no spec of `specs`
// names by its UUID gets `generated`'s entry for it (the agent's own spec for this GPU: the GPU's
// node and the instance's two capability nodes) under its UUID, in the spec that provides the GPU
// itself (by UUID or index), so that spec's common edits (driver libraries, hooks) come with it.
// Returns the UUIDs added. Nothing is added for a GPU no spec provides (its containers would get
// no driver from it either) or an instance `generated` has no entry for (no capability minors).
std::vector<std::string> SupplementMigDevices(std::vector<CdiSpec>& specs, const GpuInfo& gpu,
                                              const CdiSpec& generated);

}  // namespace gpupool
