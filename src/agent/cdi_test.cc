// Tests of agent/cdi.h: parsing and refusing spec files, loading spec directories with CDI's
// priorities, resolving devices, finding driver files in a fake tree and generating a spec.
#include "agent/cdi.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "agent/nvml.h"

namespace gpupool {
namespace {

namespace fs = std::filesystem;

// A spec shaped like what `nvidia-ctk cdi generate` writes for one GPU (written for this test).
constexpr const char* kCtkStyleYaml = R"(---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: GPU-6a1b2c3d-0000-1111-2222-333344445555
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    - path: /dev/nvidia1
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidia-modeset
  - path: /dev/nvidia-uvm
  - path: /dev/nvidiactl
    hostPath: /dev/nvidiactl
    permissions: rw
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-ctk
    args:
    - nvidia-ctk
    - hook
    - update-ldcache
    - --folder
    - /usr/lib/x86_64-linux-gnu
  - hookName: createContainer
    path: /usr/bin/nvidia-ctk
    args: [nvidia-ctk, hook, create-symlinks, --link, "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so", 1]
    env: [NVIDIA_CTK_DEBUG=false]
    timeout: 10
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    options:
    - ro
    - nosuid
    - nodev
    - bind
  - hostPath: /usr/bin/nvidia-smi
    containerPath: /usr/bin/nvidia-smi
    options: [ro, nosuid, nodev, bind]
  additionalGIDs: [44]
  intelRdt:
    closID: x
annotations:
  cdi.k8s.io/example: "yes"
)";

// A minimal valid JSON spec with `devices_json` as its device list.
std::string JsonSpec(const std::string& devices_json, const std::string& extra = "") {
  return R"({"cdiVersion": "0.6.0", "kind": "example.com/fpga", "devices": )" + devices_json + extra + "}";
}

TEST(CdiParse, ReadsNvidiaCtkStyleYaml) {
  Result<CdiSpec> spec = ParseCdiSpec(kCtkStyleYaml, "/etc/cdi/nvidia.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->version, "0.5.0");
  EXPECT_EQ(spec->kind, "nvidia.com/gpu");
  EXPECT_EQ(spec->source, "/etc/cdi/nvidia.yaml");
  ASSERT_EQ(spec->devices.size(), 3u);
  ASSERT_TRUE(spec->devices.contains("0"));
  ASSERT_TRUE(spec->devices.contains("GPU-6a1b2c3d-0000-1111-2222-333344445555"));
  ASSERT_EQ(spec->devices.at("all").device_nodes.size(), 2u);
  EXPECT_EQ(spec->devices.at("all").device_nodes[1].path, "/dev/nvidia1");
  EXPECT_EQ(spec->devices.at("0").device_nodes[0].permissions, "rwm");  // the default
  EXPECT_EQ(spec->devices.at("0").device_nodes[0].host_path, "");

  const CdiEdits& common = spec->common;
  EXPECT_EQ(common.env, std::vector<std::string>{"NVIDIA_VISIBLE_DEVICES=void"});
  ASSERT_EQ(common.device_nodes.size(), 3u);
  EXPECT_EQ(common.device_nodes[2].host_path, "/dev/nvidiactl");
  EXPECT_EQ(common.device_nodes[2].permissions, "rw");
  ASSERT_EQ(common.hooks.size(), 2u);
  EXPECT_EQ(common.hooks[0].hook_name, "createContainer");
  EXPECT_EQ(common.hooks[0].path, "/usr/bin/nvidia-ctk");
  EXPECT_EQ(common.hooks[0].args.size(), 5u);
  EXPECT_EQ(common.hooks[0].timeout, 0);
  // A YAML scalar that looks like a number is still an argument string.
  EXPECT_EQ(common.hooks[1].args.back(), "1");
  EXPECT_EQ(common.hooks[1].env, std::vector<std::string>{"NVIDIA_CTK_DEBUG=false"});
  EXPECT_EQ(common.hooks[1].timeout, 10);
  ASSERT_EQ(common.mounts.size(), 2u);
  EXPECT_EQ(common.mounts[0].host_path, "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15");
  EXPECT_EQ(common.mounts[1].container_path, "/usr/bin/nvidia-smi");
  EXPECT_EQ(common.mounts[1].options, (std::vector<std::string>{"ro", "nosuid", "nodev", "bind"}));
}

TEST(CdiParse, ReadsJson) {
  const std::string text = JsonSpec(
      R"([{"name": "fpga0", "annotations": {"a": "b"},
           "containerEdits": {"deviceNodes": [{"path": "/dev/fpga0", "hostPath": "/dev/xfpga0", "permissions": "r"}],
                              "mounts": [{"hostPath": "/opt/fw", "containerPath": "/fw", "type": "bind"}]}},
          {"name": "fpga1", "containerEdits": {"env": ["FPGA=1", "EMPTY="]}}])",
      R"(, "containerEdits": {"hooks": [{"hookName": "poststop", "path": "/bin/true", "timeout": 5}]})");
  Result<CdiSpec> spec = ParseCdiSpec(text, "/var/run/cdi/fpga.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->kind, "example.com/fpga");
  const CdiDeviceNode& node = spec->devices.at("fpga0").device_nodes.at(0);
  EXPECT_EQ(node.host_path, "/dev/xfpga0");
  EXPECT_EQ(node.permissions, "r");
  EXPECT_EQ(spec->devices.at("fpga0").mounts.at(0).type, "bind");
  EXPECT_EQ(spec->devices.at("fpga1").env, (std::vector<std::string>{"FPGA=1", "EMPTY="}));
  ASSERT_EQ(spec->common.hooks.size(), 1u);
  EXPECT_EQ(spec->common.hooks[0].timeout, 5);
}

TEST(CdiParse, NamingRules) {
  EXPECT_TRUE(IsValidCdiKind("nvidia.com/gpu"));
  EXPECT_TRUE(IsValidCdiKind("vendor_1.example-x/class.sub-2"));
  EXPECT_FALSE(IsValidCdiKind("nvidia.com"));
  EXPECT_FALSE(IsValidCdiKind("nvidia.com/gpu/x"));
  EXPECT_FALSE(IsValidCdiKind("1vendor/gpu"));
  EXPECT_FALSE(IsValidCdiKind("vendor-/gpu"));
  EXPECT_FALSE(IsValidCdiKind("vendor/gpu-"));
  EXPECT_FALSE(IsValidCdiKind("/gpu"));
  EXPECT_TRUE(IsValidCdiDeviceName("0"));
  EXPECT_TRUE(IsValidCdiDeviceName("1:0"));
  EXPECT_TRUE(IsValidCdiDeviceName("MIG-4f5e6a7b-1234-5678-9abc-def012345678"));
  EXPECT_FALSE(IsValidCdiDeviceName("_x"));
  EXPECT_FALSE(IsValidCdiDeviceName("gpu 0"));
  EXPECT_FALSE(IsValidCdiDeviceName("MIG-GPU-8f3c/1/0"));
  EXPECT_FALSE(IsValidCdiDeviceName(""));
}

struct Refusal {
  const char* what;
  std::string text;
  std::string expected;  // a part of the message, after the source
};

std::string Repeat(const std::string& s, size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

std::string ManyDevices(size_t n) {
  std::string list = "[";
  for (size_t i = 0; i < n; ++i)
    list += (i ? "," : "") + std::string(R"({"name":"d)") + std::to_string(i) + "\"}";
  return list + "]";
}

// YAML aliases nine levels deep: 10^9 strings when expanded.
std::string BillionLaughs() {
  std::string text =
      "cdiVersion: 0.5.0\nkind: a.com/b\ndevices: [{name: x}]\nannotations:\n  l0: &l0 [lol, lol, lol, lol, "
      "lol, lol, lol, lol, lol, lol]\n";
  for (int i = 1; i < 9; ++i) {
    text += "  l" + std::to_string(i) + ": &l" + std::to_string(i) + " [";
    for (int k = 0; k < 10; ++k) text += (k ? ", *l" : "*l") + std::to_string(i - 1);
    text += "]\n";
  }
  return text;
}

TEST(CdiParse, RefusesHostileInputNamingTheField) {
  const std::string head = "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n";
  const std::vector<Refusal> cases = {
      {"relative mount host path",
       head + "devices:\n- name: a\n- name: b\n- name: c\n- name: d\n  containerEdits:\n    mounts:\n"
              "    - {hostPath: lib/x, containerPath: /lib/x}\n",
       "devices[3].containerEdits.mounts[0].hostPath: 'lib/x' is not absolute"},
      {"relative device node",
       head + "devices: [{name: a, containerEdits: {deviceNodes: [{path: dev/nvidia0}]}}]\n",
       "devices[0].containerEdits.deviceNodes[0].path: 'dev/nvidia0' is not absolute"},
      {"relative device node host path",
       head + "devices: [{name: a, containerEdits: {deviceNodes: [{path: /dev/x, hostPath: x}]}}]\n",
       "devices[0].containerEdits.deviceNodes[0].hostPath: 'x' is not absolute"},
      {"relative hook path",
       head + "devices: [{name: a}]\ncontainerEdits:\n  hooks: [{hookName: prestart, path: hook}]\n",
       "containerEdits.hooks[0].path: 'hook' is not absolute"},
      {"'..' in a container path",
       head + "devices: [{name: a, containerEdits: {mounts: [{hostPath: /x, containerPath: "
              "/usr/../../etc}]}}]\n",
       "devices[0].containerEdits.mounts[0].containerPath: '/usr/../../etc' has a '..' component"},
      {"kind without class", "cdiVersion: 0.5.0\nkind: nvidia.com\ndevices: [{name: a}]\n",
       "kind: 'nvidia.com' is not vendor/class"},
      {"kind with a bad character", "cdiVersion: 0.5.0\nkind: nvidia.com/g*u\ndevices: [{name: a}]\n",
       "kind: 'nvidia.com/g*u' is not vendor/class"},
      {"bad device name", head + "devices: [{name: ok}, {name: 'gpu 0'}]\n",
       "devices[1].name: 'gpu 0' is not a CDI device name"},
      {"duplicate device", head + "devices: [{name: '0'}, {name: '1'}, {name: '0'}]\n",
       "devices[2].name: '0' is defined twice (also devices[0])"},
      {"no devices", head + "devices: []\n", "devices: a CDI spec must define a device"},
      {"too many devices", JsonSpec(ManyDevices(kCdiMaxDevices + 1)),
       "devices: has 4097 entries, more than the 4096"},
      {"too many env entries",
       head + "devices: [{name: a}]\ncontainerEdits:\n  env:\n" + Repeat("  - A=1\n", 4097),
       "containerEdits.env: has 4097 entries"},
      {"over-long string",
       head + "devices: [{name: a}]\ncontainerEdits:\n  env: [A=" + std::string(5000, 'x') + "]\n",
       "containerEdits.env[0]: is 5002 bytes long, more than the 4096 allowed"},
      {"list that is a string", head + "devices: [{name: a, containerEdits: {env: A=1}}]\n",
       "devices[0].containerEdits.env: must be a list, not string"},
      {"devices that are a mapping", JsonSpec(R"({"name": "a"})"), "devices: must be a list, not object"},
      {"mount that is a string", head + "devices: [{name: a, containerEdits: {mounts: [/x]}}]\n",
       "devices[0].containerEdits.mounts[0]: must be a mapping, not string"},
      {"number for a string", R"({"cdiVersion": "0.5.0", "kind": 5, "devices": [{"name": "a"}]})",
       "kind: must be a string, not number"},
      {"env without '='", head + "devices: [{name: a, containerEdits: {env: [FOO]}}]\n",
       "devices[0].containerEdits.env[0]: 'FOO' is not NAME=VALUE"},
      {"unknown hook",
       head + "devices: [{name: a}]\ncontainerEdits: {hooks: [{hookName: preStart, path: /x}]}\n",
       "containerEdits.hooks[0].hookName: 'preStart' is not one of"},
      {"negative hook timeout",
       head +
           "devices: [{name: a}]\ncontainerEdits: {hooks: [{hookName: poststop, path: /x, timeout: -1}]}\n",
       "containerEdits.hooks[0].timeout: must be a whole number of seconds"},
      {"JSON hook timeout too large",
       JsonSpec(
           R"([{"name": "a", "containerEdits": {"hooks": [{"hookName": "poststop", "path": "/x", "timeout": 1e40}]}}])"),
       "devices[0].containerEdits.hooks[0].timeout: must be a whole number"},
      {"bad permissions",
       head + "devices: [{name: a, containerEdits: {deviceNodes: [{path: /dev/a, permissions: rwx}]}}]\n",
       "devices[0].containerEdits.deviceNodes[0].permissions: 'rwx' is not a combination of r, w and m"},
      {"deeply nested JSON junk",
       JsonSpec(R"([{"name": "a"}])", R"(, "annotations": )" + Repeat("[", 100000) + Repeat("]", 100000)),
       "annotations: nested deeper than 32 levels"},
      {"nested YAML junk",
       head + "devices: [{name: a}]\nannotations: " + Repeat("[", 40) + Repeat("]", 40) + "\n",
       "annotations[0][0]"},
      {"deeply nested YAML junk", head + "devices: [{name: a}]\nannotations: " + Repeat("[", 100000) + "\n",
       "not valid YAML: nested too deeply"},
      {"deeply nested YAML block sequences",
       head + "devices: [{name: a}]\nannotations:\n" + Repeat("- ", 5000) + "x\n",
       "not valid YAML: nested too deeply"},
      {"YAML aliases expanding", BillionLaughs(), "annotations.l"},
      {"missing cdiVersion", "kind: nvidia.com/gpu\ndevices: [{name: a}]\n", "cdiVersion: is required"},
      {"unsupported version", "cdiVersion: 1.0.0\nkind: nvidia.com/gpu\ndevices: [{name: a}]\n",
       "cdiVersion: '1.0.0' is not supported (supported: 0.3.0 to 0.8.0)"},
      {"old version", "cdiVersion: 0.2.0\nkind: nvidia.com/gpu\ndevices: [{name: a}]\n",
       "cdiVersion: '0.2.0' is not supported"},
      {"garbage bytes", std::string("\xff\xfe\x00garbage", 10), "not UTF-8 text: byte 0xff at offset 0"},
      {"garbage after valid text", head + "devices: [{name: \"a\xc3\x28\"}]\n",
       "not UTF-8 text: byte 0xc3 at offset " + std::to_string(head.size() + 19)},
      {"a NUL byte", head + std::string("devices: [{name: a}]\0\n", 22), "not UTF-8 text: byte 0x00"},
      {"empty", "", "empty"},
      {"only blank", " \n\t\n", "empty"},
      {"a list", "- a\n- b\n", "a CDI spec must be a mapping, not array"},
      {"a scalar", "just words", "a CDI spec must be a mapping, not string"},
      {"broken YAML", "cdiVersion: 0.5.0\ndevices: [\n", "not valid YAML"},
      {"broken JSON", R"({"cdiVersion": "0.5.0", )", "not valid JSON"},
      {"too large", std::string(kCdiMaxSpecBytes + 1, ' '), "4194305 bytes, more than the 4194304 allowed"},
  };
  for (const Refusal& c : cases) {
    Result<CdiSpec> spec = ParseCdiSpec(c.text, "/etc/cdi/test.yaml");
    ASSERT_FALSE(spec.ok()) << c.what;
    EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument) << c.what;
    const std::string& message = spec.status().message();
    EXPECT_TRUE(message.starts_with("/etc/cdi/test.yaml: ")) << c.what << ": " << message;
    EXPECT_NE(message.find(c.expected), std::string::npos) << c.what << ": " << message;
  }
}

TEST(CdiParse, AcceptsTheLimits) {
  Result<CdiSpec> spec = ParseCdiSpec(JsonSpec(ManyDevices(kCdiMaxDevices)), "x.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->devices.size(), kCdiMaxDevices);
  const std::string head = "cdiVersion: 0.8.0\nkind: nvidia.com/gpu\ndevices: [{name: a}]\n";
  spec = ParseCdiSpec(head + "containerEdits:\n  env: [A=" + std::string(kCdiMaxStringBytes - 2, 'x') + "]\n",
                      "x.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  spec = ParseCdiSpec("\xEF\xBB\xBF" + head + "annotations: {note: \"caf\xC3\xA9\"}\n", "bom.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
}

// A temporary directory, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("gpupool_cdi_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  // Writes `text` to `relative`, creating the directories above it.
  fs::path Write(const std::string& relative, const std::string& text) const {
    const fs::path p = path_ / relative;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }

 private:
  fs::path path_;
};

std::string YamlSpec(const std::string& kind, const std::vector<std::string>& devices,
                     const std::string& env) {
  std::string text = "cdiVersion: 0.5.0\nkind: " + kind + "\ndevices:\n";
  for (const std::string& d : devices) {
    text += "- name: '" + d + "'\n  containerEdits:\n    env: [DEV=" + env + "-" + d + "]\n";
  }
  return text + "containerEdits:\n  env: [COMMON=" + env + "]\n";
}

bool Contains(const std::vector<std::string>& warnings, const std::string& part) {
  for (const std::string& w : warnings) {
    if (w.find(part) != std::string::npos) return true;
  }
  return false;
}

TEST(CdiLoad, LaterDirectoryWinsAndABrokenFileIsSkipped) {
  TempDir tmp;
  const std::string etc = (tmp.path() / "etc-cdi").string();
  const std::string run = (tmp.path() / "run-cdi").string();
  tmp.Write("etc-cdi/nvidia.yaml", YamlSpec("nvidia.com/gpu", {"0", "1"}, "etc"));
  tmp.Write("etc-cdi/broken.json", R"({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [)");
  tmp.Write("etc-cdi/notes.txt", "not a spec");
  tmp.Write("etc-cdi/zz-other.yml", YamlSpec("example.com/nic", {"eth0"}, "nic"));
  fs::create_directories(tmp.path() / "etc-cdi" / "dir.yaml");
  tmp.Write(
      "run-cdi/override.json",
      R"({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": [{"name": "1", "containerEdits": {"env": ["DEV=run-1"]}}]})");

  std::vector<std::string> warnings;
  Result<std::vector<CdiSpec>> specs = LoadCdiSpecs({etc, (tmp.path() / "missing").string(), run}, &warnings);
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  ASSERT_EQ(specs->size(), 3u);
  EXPECT_EQ((*specs)[0].source, etc + "/nvidia.yaml");
  EXPECT_EQ((*specs)[0].devices.size(), 1u);  // "1" went to the later directory
  EXPECT_TRUE((*specs)[0].devices.contains("0"));
  EXPECT_EQ((*specs)[1].kind, "example.com/nic");
  EXPECT_EQ((*specs)[2].source, run + "/override.json");

  ASSERT_EQ(warnings.size(), 2u) << ::testing::PrintToString(warnings);
  EXPECT_TRUE(Contains(warnings, "skipping " + etc + "/broken.json: not valid JSON")) << warnings[0];
  EXPECT_TRUE(Contains(warnings, etc + "/dir.yaml: not a regular file"))
      << ::testing::PrintToString(warnings);

  Result<CdiEdits> edits = ResolveCdiDevices(*specs, "nvidia.com/gpu", {"1"});
  ASSERT_TRUE(edits.ok()) << edits.status().ToString();
  EXPECT_EQ(edits->env, std::vector<std::string>{"DEV=run-1"});  // not etc's common env: no device from it
  edits = ResolveCdiDevices(*specs, "nvidia.com/gpu", {"0", "1"});
  ASSERT_TRUE(edits.ok()) << edits.status().ToString();
  EXPECT_EQ(edits->env, (std::vector<std::string>{"COMMON=etc", "DEV=etc-0", "DEV=run-1"}));
}

TEST(CdiLoad, SameDirectoryConflictWarnsAndTheLaterFileWins) {
  TempDir tmp;
  tmp.Write("a.yaml", YamlSpec("nvidia.com/gpu", {"0"}, "a"));
  tmp.Write("b.yaml", YamlSpec("nvidia.com/gpu", {"0"}, "b"));
  tmp.Write("big.json", std::string(kCdiMaxSpecBytes + 1, ' '));
  std::vector<std::string> warnings;
  Result<std::vector<CdiSpec>> specs = LoadCdiSpecs({tmp.path().string()}, &warnings);
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  ASSERT_EQ(specs->size(), 1u);  // a.yaml lost its only device
  EXPECT_EQ((*specs)[0].source, (tmp.path() / "b.yaml").string());
  EXPECT_TRUE(Contains(warnings, "nvidia.com/gpu=0 is defined by both"))
      << ::testing::PrintToString(warnings);
  EXPECT_TRUE(Contains(warnings, "big.json: larger than")) << ::testing::PrintToString(warnings);
}

TEST(CdiLoad, RelativeDirectoryIsRefusedAndNullWarningsAllowed) {
  EXPECT_EQ(LoadCdiSpecs({"etc/cdi"}, nullptr).status().code(), StatusCode::kInvalidArgument);
  Result<std::vector<CdiSpec>> none = LoadCdiSpecs({"/nonexistent/gpupool/cdi"}, nullptr);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(CdiResolve, CommonEditsOnceAndDuplicatesDropped) {
  Result<CdiSpec> spec = ParseCdiSpec(kCtkStyleYaml, "/etc/cdi/nvidia.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  Result<CdiEdits> edits =
      ResolveCdiDevices({*spec}, "nvidia.com/gpu", {"0", "GPU-6a1b2c3d-0000-1111-2222-333344445555", "0"});
  ASSERT_TRUE(edits.ok()) << edits.status().ToString();
  EXPECT_EQ(edits->env, std::vector<std::string>{"NVIDIA_VISIBLE_DEVICES=void"});
  std::vector<std::string> nodes;
  for (const CdiDeviceNode& n : edits->device_nodes) nodes.push_back(n.path);
  EXPECT_EQ(nodes, (std::vector<std::string>{"/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidiactl",
                                             "/dev/nvidia0"}));
  EXPECT_EQ(edits->mounts.size(), 2u);
  EXPECT_EQ(edits->hooks.size(), 2u);
}

TEST(CdiResolve, UnknownDeviceIsNotFound) {
  Result<CdiSpec> spec = ParseCdiSpec(kCtkStyleYaml, "/etc/cdi/nvidia.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  Result<CdiEdits> edits = ResolveCdiDevices({*spec}, "nvidia.com/gpu", {"0", "3", "4"});
  ASSERT_FALSE(edits.ok());
  EXPECT_EQ(edits.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(edits.status().message(), "no CDI spec provides nvidia.com/gpu=3");
  edits = ResolveCdiDevices({*spec}, "amd.com/gpu", {"0"});
  ASSERT_FALSE(edits.ok());
  EXPECT_EQ(edits.status().message(), "no CDI spec provides amd.com/gpu=0");
  edits = ResolveCdiDevices({*spec}, "nvidia.com/gpu", {});
  ASSERT_TRUE(edits.ok());
  EXPECT_TRUE(edits->empty());
}

// A fake merged-/usr host: /lib and /bin are links into /usr.
void BuildFakeDriverTree(const TempDir& tmp) {
  const std::string lib = "root/usr/lib/x86_64-linux-gnu/";
  tmp.Write(lib + "libcuda.so.550.54.15", "elf");
  fs::create_symlink("libcuda.so.550.54.15", tmp.path() / lib / "libcuda.so.1");
  tmp.Write(lib + "libnvidia-ml.so.1", "elf");
  tmp.Write(lib + "libfoo.so", "elf");
  tmp.Write(lib + "libcudart.so.12", "elf");     // CUDA runtime: the image's business
  tmp.Write(lib + "libnvidia-mlx.so.1", "elf");  // a prefix of a wanted name is not enough
  fs::create_symlink("libnvidia-ml.so.550.54.15", tmp.path() / lib / "libnvidia-ml.so");  // dangling
  tmp.Write("root/usr/bin/nvidia-smi", "elf");
  tmp.Write("root/usr/bin/ls", "elf");
  tmp.Write("root/usr/sbin/nvidia-persistenced", "elf");
  tmp.Write("root/usr/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin", "fw");
  tmp.Write("root/usr/lib/firmware/nvidia/535.0.0/gsp_ga10x.bin", "fw");  // no driver of that version
  tmp.Write("root/dev/nvidiactl", "");
  tmp.Write("root/dev/nvidia-uvm", "");
  fs::create_symlink("usr/lib", tmp.path() / "root/lib");
  fs::create_symlink("usr/bin", tmp.path() / "root/bin");
}

TEST(CdiDriverFiles, FindsTheDriverInAFakeTree) {
  TempDir tmp;
  BuildFakeDriverTree(tmp);
  const std::string root = (tmp.path() / "root").string();
  const DriverFiles files = FindDriverFiles(root + "/");
  const std::string lib = root + "/usr/lib/x86_64-linux-gnu/";
  EXPECT_EQ(files.libraries, (std::vector<std::string>{lib + "libcuda.so.1", lib + "libcuda.so.550.54.15",
                                                       lib + "libnvidia-ml.so.1"}));
  EXPECT_EQ(files.binaries,
            (std::vector<std::string>{root + "/usr/bin/nvidia-smi", root + "/usr/sbin/nvidia-persistenced"}));
  EXPECT_EQ(files.control_devices,
            (std::vector<std::string>{root + "/dev/nvidia-uvm", root + "/dev/nvidiactl"}));
  EXPECT_EQ(files.firmware, std::vector<std::string>{root + "/lib/firmware/nvidia/550.54.15"});

  const DriverFiles none = FindDriverFiles((tmp.path() / "no-such-root").string());
  EXPECT_TRUE(none.libraries.empty() && none.binaries.empty() && none.control_devices.empty() &&
              none.firmware.empty());
}

Inventory TwoGpusOneWithMig() {
  Inventory inv;
  inv.source = "nvml";
  GpuInfo a;
  a.index = 0;
  a.uuid = "GPU-11111111-2222-3333-4444-555555555555";
  a.minor_number = 0;
  GpuInfo b;
  b.index = 1;
  b.uuid = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";
  b.minor_number = 3;
  b.mig_enabled = true;
  MigInstanceInfo mig;
  mig.uuid = "MIG-0f0f0f0f-1111-2222-3333-444444444444";
  mig.gpu_instance_id = 1;
  mig.compute_instance_id = 0;
  b.mig_instances.push_back(mig);
  MigInstanceInfo unlisted;  // not in mig-minors: no device
  unlisted.uuid = "MIG-99999999-1111-2222-3333-444444444444";
  unlisted.gpu_instance_id = 2;
  unlisted.compute_instance_id = 0;
  b.mig_instances.push_back(unlisted);
  GpuInfo unknown_minor;
  unknown_minor.index = 2;
  unknown_minor.uuid = "GPU-ffffffff-ffff-ffff-ffff-ffffffffffff";
  inv.gpus = {a, b, unknown_minor};
  return inv;
}

constexpr const char* kMigMinors =
    "gpu0/gi1/access 3\ngpu0/gi1/ci0/access 4\ngpu3/gi1/access 30\ngpu3/gi1/ci0/access 31\ngpu3/gi2/access "
    "40\n";

std::vector<std::string> Paths(const std::vector<CdiDeviceNode>& nodes) {
  std::vector<std::string> out;
  for (const CdiDeviceNode& n : nodes) out.push_back(n.path);
  return out;
}

TEST(CdiGenerate, DevicesForGpusAndMigInstances) {
  const std::string root = "/fake/root";
  DriverFiles files;
  files.libraries = {root + "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                     root + "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"};
  files.binaries = {root + "/usr/bin/nvidia-smi"};
  files.control_devices = {root + "/dev/nvidia-uvm", root + "/dev/nvidiactl"};
  const CdiSpec spec = GenerateNvidiaCdiSpec(TwoGpusOneWithMig(), files, root, kMigMinors);
  EXPECT_EQ(spec.kind, "nvidia.com/gpu");
  EXPECT_EQ(spec.version, "0.5.0");
  EXPECT_EQ(spec.source, "generated");

  std::set<std::string> names;
  for (const auto& [name, edits] : spec.devices) names.insert(name);
  EXPECT_EQ(names, (std::set<std::string>{"0", "GPU-11111111-2222-3333-4444-555555555555", "1",
                                          "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", "1:0",
                                          "MIG-0f0f0f0f-1111-2222-3333-444444444444"}));
  const CdiEdits& gpu1 = spec.devices.at("1");
  ASSERT_EQ(gpu1.device_nodes.size(), 1u);
  EXPECT_EQ(gpu1.device_nodes[0], (CdiDeviceNode{"/dev/nvidia3", "/fake/root/dev/nvidia3", "rwm"}));
  EXPECT_EQ(spec.devices.at("GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"), gpu1);
  const CdiEdits& mig = spec.devices.at("1:0");
  EXPECT_EQ(Paths(mig.device_nodes),
            (std::vector<std::string>{"/dev/nvidia3", "/dev/nvidia-caps/nvidia-cap30",
                                      "/dev/nvidia-caps/nvidia-cap31"}));
  EXPECT_EQ(mig.device_nodes[2].host_path, "/fake/root/dev/nvidia-caps/nvidia-cap31");
  EXPECT_EQ(spec.devices.at("MIG-0f0f0f0f-1111-2222-3333-444444444444"), mig);
  EXPECT_EQ(Paths(spec.devices.at("0").device_nodes), std::vector<std::string>{"/dev/nvidia0"});

  EXPECT_TRUE(spec.common.env.empty());
  EXPECT_TRUE(spec.common.hooks.empty());
  EXPECT_EQ(Paths(spec.common.device_nodes), (std::vector<std::string>{"/dev/nvidia-uvm", "/dev/nvidiactl"}));
  EXPECT_EQ(spec.common.device_nodes[1].host_path, "/fake/root/dev/nvidiactl");
  ASSERT_EQ(spec.common.mounts.size(), 3u);
  EXPECT_EQ(spec.common.mounts[0].container_path, "/usr/lib/x86_64-linux-gnu/libcuda.so.1");
  EXPECT_EQ(spec.common.mounts[0].host_path, "/fake/root/usr/lib/x86_64-linux-gnu/libcuda.so.1");
  EXPECT_EQ(spec.common.mounts[2].container_path, "/usr/bin/nvidia-smi");
  EXPECT_EQ(spec.common.mounts[2].options, (std::vector<std::string>{"ro", "nosuid", "nodev", "bind"}));

  Result<CdiEdits> edits = ResolveCdiDevices({spec}, "nvidia.com/gpu", {"1:0", "1"});
  ASSERT_TRUE(edits.ok()) << edits.status().ToString();
  EXPECT_EQ(Paths(edits->device_nodes),
            (std::vector<std::string>{"/dev/nvidia-uvm", "/dev/nvidiactl", "/dev/nvidia3",
                                      "/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31"}));
}

// The toolkit's spec names GPU 1 by index and none of its MIG devices (made since it was
// generated): the agent's entry for the new instance joins that spec, so its driver mounts come too.
TEST(CdiGenerate, AToolkitSpecGetsTheMigDevicesTheAgentMadeSince) {
  const Inventory inv = TwoGpusOneWithMig();
  const std::string mig = "MIG-0f0f0f0f-1111-2222-3333-444444444444";
  CdiSpec toolkit;
  toolkit.version = "0.5.0";
  toolkit.kind = "nvidia.com/gpu";
  toolkit.source = "/etc/cdi/nvidia.yaml";
  toolkit.devices["0"].device_nodes.push_back({"/dev/nvidia0", "", "rwm"});
  toolkit.devices["1"].device_nodes.push_back({"/dev/nvidia3", "", "rwm"});
  CdiMount lib;
  lib.host_path = lib.container_path = "/usr/lib/x86_64-linux-gnu/libcuda.so.1";
  toolkit.common.mounts.push_back(lib);
  CdiSpec other = toolkit;  // another kind's spec is never touched
  other.kind = "example.com/nic";
  std::vector<CdiSpec> specs = {other, toolkit};
  const CdiSpec generated = GenerateNvidiaCdiSpec(inv, DriverFiles{}, "/", kMigMinors);
  // The instance without capability minors has no entry to give: only the other is added.
  EXPECT_EQ(SupplementMigDevices(specs, inv.gpus[1], generated), std::vector<std::string>{mig});
  EXPECT_FALSE(specs[0].devices.contains(mig));
  Result<CdiEdits> edits = ResolveCdiDevices(specs, "nvidia.com/gpu", {mig});
  ASSERT_TRUE(edits.ok()) << edits.status().ToString();
  EXPECT_EQ(Paths(edits->device_nodes), (std::vector<std::string>{"/dev/nvidia3", "/dev/nvidia-caps/nvidia-cap30",
                                                                   "/dev/nvidia-caps/nvidia-cap31"}));
  ASSERT_EQ(edits->mounts.size(), 1u);
  EXPECT_EQ(edits->mounts[0].container_path, "/usr/lib/x86_64-linux-gnu/libcuda.so.1");
  // Named already: left as the toolkit has it. A GPU no spec provides gets nothing.
  specs[1].devices[mig].device_nodes = {{"/dev/nvidia3", "", "rw"}};
  EXPECT_TRUE(SupplementMigDevices(specs, inv.gpus[1], generated).empty());
  EXPECT_EQ(specs[1].devices[mig].device_nodes.size(), 1u);
  std::vector<CdiSpec> none = {other};
  EXPECT_TRUE(SupplementMigDevices(none, inv.gpus[1], generated).empty());
}

TEST(CdiGenerate, HostRootLeavesHostPathsEmpty) {
  const CdiSpec spec = GenerateNvidiaCdiSpec(TwoGpusOneWithMig(),
                                             DriverFiles{{"/usr/lib64/libcuda.so.1"}, {}, {}, {}}, "/", "");
  EXPECT_EQ(spec.devices.at("0").device_nodes[0], (CdiDeviceNode{"/dev/nvidia0", "", "rwm"}));
  EXPECT_FALSE(spec.devices.contains("1:0"));  // no mig-minors: the instance could not be opened
  ASSERT_EQ(spec.common.mounts.size(), 1u);
  EXPECT_EQ(spec.common.mounts[0].container_path, "/usr/lib64/libcuda.so.1");
  EXPECT_EQ(spec.common.mounts[0].host_path, "/usr/lib64/libcuda.so.1");
}

TEST(CdiGenerate, RoundTripsThroughJson) {
  TempDir tmp;
  BuildFakeDriverTree(tmp);
  const std::string root = (tmp.path() / "root").string();
  const CdiSpec spec = GenerateNvidiaCdiSpec(TwoGpusOneWithMig(), FindDriverFiles(root), root, kMigMinors);
  ASSERT_FALSE(spec.common.mounts.empty());
  const nlohmann::json j = CdiSpecToJson(spec);
  EXPECT_FALSE(j.contains("annotations"));
  EXPECT_FALSE(j["containerEdits"].contains("env"));
  EXPECT_FALSE(j["containerEdits"].contains("hooks"));
  Result<CdiSpec> back = ParseCdiSpec(j.dump(2), "generated");
  ASSERT_TRUE(back.ok()) << back.status().ToString() << "\n" << j.dump(2);
  EXPECT_EQ(*back, spec);

  // A spec read from a file round-trips too, hooks and all.
  Result<CdiSpec> ctk = ParseCdiSpec(kCtkStyleYaml, "/etc/cdi/nvidia.yaml");
  ASSERT_TRUE(ctk.ok()) << ctk.status().ToString();
  back = ParseCdiSpec(CdiSpecToJson(*ctk).dump(), "/etc/cdi/nvidia.yaml");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, *ctk);
}

TEST(CdiGenerate, FromFakeNvml) {
  TempDir tmp;
  const fs::path config = tmp.Write("fake_nvml.conf", "gpus=2\nmig=1\nmig_instances.1=9@4,19@0\n");
  struct FakeNvmlEnv {  // points the fake at the file for this test only, however it ends
    explicit FakeNvmlEnv(const fs::path& file) { ::setenv("GPUPOOL_FAKE_NVML", file.c_str(), 1); }
    ~FakeNvmlEnv() { ::unsetenv("GPUPOOL_FAKE_NVML"); }
  } env(config);
  Result<std::unique_ptr<Nvml>> nvml = Nvml::Load(FAKE_NVML_PATH);
  ASSERT_TRUE(nvml.ok()) << nvml.status().ToString();
  Result<Inventory> inv = (*nvml)->Discover();
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  ASSERT_EQ(inv->gpus.size(), 2u);
  ASSERT_EQ(inv->gpus[1].mig_instances.size(), 2u);
  const int minor = inv->gpus[1].minor_number;
  const std::string mig_minors =
      "gpu" + std::to_string(minor) + "/gi1/access 21\ngpu" + std::to_string(minor) + "/gi1/ci0/access 22\n" +
      "gpu" + std::to_string(minor) + "/gi2/access 23\ngpu" + std::to_string(minor) + "/gi2/ci0/access 24\n";
  const CdiSpec spec = GenerateNvidiaCdiSpec(*inv, DriverFiles{}, "/", mig_minors);
  EXPECT_TRUE(spec.devices.contains("0"));
  EXPECT_TRUE(spec.devices.contains(inv->gpus[0].uuid));
  ASSERT_TRUE(spec.devices.contains("1:1"));
  EXPECT_EQ(Paths(spec.devices.at("1:1").device_nodes),
            (std::vector<std::string>{"/dev/nvidia" + std::to_string(minor), "/dev/nvidia-caps/nvidia-cap23",
                                      "/dev/nvidia-caps/nvidia-cap24"}));
  EXPECT_EQ(spec.devices.at(inv->gpus[1].mig_instances[0].uuid), spec.devices.at("1:0"));
  Result<CdiSpec> back = ParseCdiSpec(CdiSpecToJson(spec).dump(), "generated");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, spec);
}

}  // namespace
}  // namespace gpupool
