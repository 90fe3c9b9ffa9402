// Tests of the NVML loader against the fake libnvidia-ml.so.1 of tests/fake_nvml.
#include "agent/nvml.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "api/mig_report.h"
#include "api/node_codec.h"
#include "model/gpu_catalog.h"

namespace gpupool {
namespace {

// Writes a fake-NVML configuration and points GPUPOOL_FAKE_NVML at it for the test's lifetime.
class FakeNvmlConfig {
 public:
  explicit FakeNvmlConfig(const std::string& text) {
    path_ = std::filesystem::temp_directory_path() /
            ("gpupool_fake_nvml_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".conf");
    std::ofstream(path_) << text;
    ::setenv("GPUPOOL_FAKE_NVML", path_.c_str(), 1);
  }
  ~FakeNvmlConfig() {
    ::unsetenv("GPUPOOL_FAKE_NVML");
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }

 private:
  std::filesystem::path path_;
};

std::unique_ptr<Nvml> LoadFake(const char* path = FAKE_NVML_PATH) {
  Result<std::unique_ptr<Nvml>> nvml = Nvml::Load(path);
  EXPECT_TRUE(nvml.ok()) << nvml.status().ToString();
  return nvml.ok() ? std::move(nvml).value() : nullptr;
}

// NVML wants GPM samples more than 100 ms apart; Sample() skips GPM within that.
void WaitForNextGpmSample() {
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
}

TEST(Nvml, LoadOfMissingLibraryIsNotFound) {
  Result<std::unique_ptr<Nvml>> nvml = Nvml::Load("/nonexistent/dir/libnvidia-ml.so.1");
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), StatusCode::kNotFound);
  EXPECT_NE(nvml.status().message().find("/nonexistent/dir/libnvidia-ml.so.1"), std::string::npos)
      << nvml.status().message();
}

TEST(Nvml, InitFailureIsAClearError) {
  FakeNvmlConfig config("init_error=9\n");
  Result<std::unique_ptr<Nvml>> nvml = Nvml::Load(FAKE_NVML_PATH);
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(nvml.status().message().find("nvmlInit_v2"), std::string::npos) << nvml.status().message();
  EXPECT_NE(nvml.status().message().find("Driver Not Loaded"), std::string::npos) << nvml.status().message();
}

TEST(Nvml, DiscoversTheDefaultMachine) {
  FakeNvmlConfig config("");
  auto nvml = LoadFake();
  ASSERT_NE(nvml, nullptr);
  Result<Inventory> inv = nvml->Discover();
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  EXPECT_FALSE(inv->simulated);
  EXPECT_EQ(inv->source, "nvml");
  EXPECT_EQ(inv->driver_version, "550.54.15");
  ASSERT_EQ(inv->gpus.size(), 4u);
  const GpuInfo& g0 = inv->gpus[0];
  EXPECT_EQ(g0.uuid, "GPU-fa6e0000-0000-4000-8000-000000000000");
  EXPECT_EQ(g0.name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(g0.model, "H100-80GB");
  EXPECT_EQ(g0.memory_bytes, 81559LL << 20);
  EXPECT_EQ(g0.compute_capability, "9.0");
  EXPECT_EQ(g0.pci_bus_id, "00000000:18:00.0");
  EXPECT_EQ(inv->gpus[2].pci_bus_id, "00000000:9A:00.0");
  EXPECT_EQ(g0.numa_node, 0);
  EXPECT_EQ(inv->gpus[3].numa_node, 1);
  EXPECT_EQ(inv->gpus[3].minor_number, 3);
  EXPECT_TRUE(g0.healthy);
  // Processes on GPU 0 only.
  ASSERT_EQ(g0.processes.size(), 2u);
  EXPECT_EQ(g0.processes[0].pid, 1234u);
  EXPECT_EQ(g0.processes[1].used_memory_bytes, 2LL << 30);
  EXPECT_TRUE(inv->gpus[1].processes.empty());
  // MIG capable but off: the profiles are still listed.
  EXPECT_FALSE(g0.mig_enabled);
  ASSERT_EQ(g0.mig_profiles.size(), 7u);
  EXPECT_EQ(g0.mig_profiles[0].profile_id, 19);
  EXPECT_EQ(g0.mig_profiles[0].name, "1g.10gb");
  EXPECT_EQ(g0.mig_profiles[0].instance_count, 7);
  EXPECT_EQ(g0.mig_profiles[2].name, "3g.40gb");
  EXPECT_EQ(g0.mig_profiles[2].profile_id, 9);
  EXPECT_EQ(g0.mig_profiles[4].name, "7g.80gb");  // the catalog's name, not 79 from 80384 MiB
  EXPECT_EQ(g0.mig_profiles[5].name, "1g.10gb+me");
  EXPECT_EQ(g0.mig_profiles[6].name, "1g.20gb");
  EXPECT_EQ(g0.mig_profiles[6].profile_id, 15);
  // Topology: (0,1) and (2,3) one switch + 4 NVLink links; same NUMA 20 is not used here;
  // across the halves: cross CPU.
  ASSERT_EQ(inv->topology.size(), 4u);
  EXPECT_EQ(inv->topology[0][1], 50 + 400);
  EXPECT_EQ(inv->topology[1][0], 50 + 400);
  EXPECT_EQ(inv->topology[2][3], 50 + 400);
  EXPECT_EQ(inv->topology[0][2], 10);
  EXPECT_EQ(inv->topology[1][3], 10);
  EXPECT_EQ(inv->topology[0][0], 0);
}

TEST(Nvml, DiscoveredInventoryRegisters) {
  FakeNvmlConfig config("gpus=8\nmig=2\n");
  auto nvml = LoadFake();
  ASSERT_NE(nvml, nullptr);
  Result<Inventory> inv = nvml->Discover();
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  nlohmann::json body = NodeRegistration(*inv, "gpu-node", "64", "512Gi", {});
  // The MIG layout rides beside the inventory, as the server reads it (api/mig_report.h).
  auto layouts = TakeMigInstances(body);
  ASSERT_TRUE(layouts.ok()) << layouts.status().ToString();
  ASSERT_EQ(layouts->size(), 1u);
  EXPECT_EQ((*layouts)[0].first, 2);
  Result<NodeSpec> spec = ParseNodeSpec(body, GpuCatalog::Builtin());
  ASSERT_TRUE(spec.ok()) << spec.status().ToString() << "\n" << body.dump();
  ASSERT_EQ(spec->gpus.size(), 8u);
  EXPECT_EQ(spec->gpus[0].model, "H100-80GB");
  EXPECT_EQ(spec->gpus[0].memory, MiB(81559));
  EXPECT_TRUE(spec->gpus[2].mig_enabled);
  EXPECT_EQ(spec->topology.NvLinks(4, 5), 4);
  EXPECT_EQ(spec->topology.Score(0, 7), 10);
  EXPECT_EQ(spec->labels.at("gpupool.io/gpu-source"), "nvml");
}

TEST(Nvml, NvSwitchLinksJoinEveryPair) {
  // An HGX board: each GPU's 18 links end at NVSwitch chips, none at another GPU. Every pair is
  // joined through the fabric, so an NVLink requirement can be met on any set of its GPUs.
  FakeNvmlConfig config("gpus=8\nnvswitch=18\n");
  auto nvml = LoadFake();
  ASSERT_NE(nvml, nullptr);
  Result<Inventory> inv = nvml->Discover();
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  EXPECT_EQ(inv->topology[0][7], 10 + 1800);  // across sockets, 18 links through the switches
  EXPECT_EQ(inv->topology[0][1], 50 + 1800);
  Result<NodeSpec> spec = ParseNodeSpec(NodeRegistration(*inv, "hgx", "64", "512Gi", {}), GpuCatalog::Builtin());
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->topology.NvLinks(3, 6), 18);
}

TEST(Nvml, NvSwitchLinksAreInferredWithoutTheRemoteTypeCall) {
  // The minimal library lacks nvmlDeviceGetNvLinkRemoteDeviceType: a link whose far end is none of
  // the GPUs counts as a switch link.
  FakeNvmlConfig config("gpus=4\nnvswitch=12\n");
  auto nvml = LoadFake(FAKE_NVML_MINIMAL_PATH);
  ASSERT_NE(nvml, nullptr);
  Result<Inventory> inv = nvml->Discover();
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  EXPECT_EQ(inv->topology[0][3], 10 + 1200);
}

TEST(Nvml, SameNumaLevelAndNoNvLinkOnEightGpus) {
  FakeNvmlConfig config("gpus=8\nunsupported=nvlink\n");
  auto nvml = LoadFake();
  ASSERT_NE(nvml, nullptr);
  Result<Inventory> inv = nvml->Discover();
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  ASSERT_EQ(inv->gpus.size(), 8u);
  EXPECT_EQ(inv->topology[0][1], 50);  // one switch, NVLink not reported
  EXPECT_EQ(inv->topology[0][2], 20);  // same NUMA node
  EXPECT_EQ(inv->topology[0][4], 10);  // across sockets
}

TEST(Nvml, ConfiguredModelMigAndHealth) {
  FakeNvmlConfig config(
      "gpus=3\nname=NVIDIA A100-SXM4-80GB\nmemory_mib=81920\ncc=8.0\nmig=1\nxid.1=79\necc.2=3\nxid.0=13\n");
  auto nvml = LoadFake();
  ASSERT_NE(nvml, nullptr);
  Result<Inventory> inv = nvml->Discover();
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  ASSERT_EQ(inv->gpus.size(), 3u);
  EXPECT_EQ(inv->gpus[0].model, "A100-80GB");
  EXPECT_EQ(inv->gpus[0].compute_capability, "8.0");
  EXPECT_FALSE(inv->gpus[0].mig_enabled);
  EXPECT_TRUE(inv->gpus[1].mig_enabled);
  // XID 13 is an application error: reported, not unhealthy.
  EXPECT_TRUE(inv->gpus[0].healthy) << inv->gpus[0].health_reason;
  EXPECT_FALSE(inv->gpus[1].healthy);
  EXPECT_EQ(inv->gpus[1].health_reason, "XID 79");
  EXPECT_FALSE(inv->gpus[2].healthy);
  EXPECT_EQ(inv->gpus[2].health_reason, "uncorrectable ECC errors: 3");
  // The XID is delivered once by the driver; health stays bad on the next discovery.
  Result<Inventory> again = nvml->Discover();
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->gpus[1].healthy);
  Result<std::vector<GpuSample>> samples = nvml->Sample();
  ASSERT_TRUE(samples.ok());
  ASSERT_TRUE((*samples)[1].last_xid.has_value());
  EXPECT_EQ(*(*samples)[1].last_xid, 79);
  EXPECT_EQ(*(*samples)[0].last_xid, 13);
  EXPECT_EQ(*(*samples)[2].last_xid, 0);
}

TEST(Nvml, DiscoversExistingMigInstances) {
  FakeNvmlConfig config("gpus=3\nmig=1,2\nmig_instances.1=9@4,19@0,14@2\nmig_instances.0=19@0\n");
  auto nvml = LoadFake();
  ASSERT_NE(nvml, nullptr);
  Result<Inventory> inv = nvml->Discover();
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  // GPU 0 is not in MIG mode: its configured instance does not count; GPU 2 has none.
  EXPECT_TRUE(inv->gpus[0].mig_instances.empty());
  EXPECT_TRUE(inv->gpus[2].mig_enabled);
  EXPECT_TRUE(inv->gpus[2].mig_instances.empty());
  const std::vector<MigInstanceInfo>& mig = inv->gpus[1].mig_instances;
  ASSERT_EQ(mig.size(), 3u);
  EXPECT_EQ(mig[0].uuid, "MIG-fa6e0001-0001-4000-8000-000000000000");
  EXPECT_EQ(mig[0].profile_id, 9);
  EXPECT_EQ(mig[0].profile, "3g.40gb");
  EXPECT_EQ(mig[0].start, 4);
  EXPECT_EQ(mig[0].size, 4);
  EXPECT_EQ(mig[0].gpu_instance_id, 1);
  EXPECT_EQ(mig[0].compute_instance_id, 0);
  EXPECT_EQ(mig[1].uuid, "MIG-fa6e0001-0002-4000-8000-000000000000");
  EXPECT_EQ(mig[1].profile, "1g.10gb");
  EXPECT_EQ(mig[1].start, 0);
  EXPECT_EQ(mig[1].size, 1);
  EXPECT_EQ(mig[1].gpu_instance_id, 2);
  EXPECT_EQ(mig[2].profile, "2g.20gb");
  EXPECT_EQ(mig[2].start, 2);
  EXPECT_EQ(mig[2].size, 2);
}

TEST(Nvml, MigInstanceWithoutReadableGpuInstanceHasNoProfile) {
  FakeNvmlConfig config("gpus=1\nmig=0\nmig_instances.0=9@0\nunsupported=gpu_instance_by_id\n");
  auto nvml = LoadFake();
  ASSERT_NE(nvml, nullptr);
  Result<Inventory> inv = nvml->Discover();
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  ASSERT_EQ(inv->gpus[0].mig_instances.size(), 1u);
  const MigInstanceInfo& m = inv->gpus[0].mig_instances[0];
  EXPECT_EQ(m.uuid, "MIG-fa6e0000-0001-4000-8000-000000000000");
  EXPECT_EQ(m.gpu_instance_id, 1);
  EXPECT_EQ(m.profile_id, -1);
  EXPECT_EQ(m.profile, "");
  EXPECT_EQ(m.start, -1);
}

TEST(Nvml, UnknownDeviceNameKeepsItsName) {
  FakeNvmlConfig config("gpus=1\nname=NVIDIA Future GPU\nno_mig=1\n");
  auto nvml = LoadFake();
  ASSERT_NE(nvml, nullptr);
  Result<Inventory> inv = nvml->Discover();
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  EXPECT_EQ(inv->gpus[0].model, "NVIDIA Future GPU");
  EXPECT_TRUE(inv->gpus[0].mig_profiles.empty());
  EXPECT_FALSE(inv->gpus[0].mig_enabled);
  ASSERT_EQ(inv->topology.size(), 1u);
}

TEST(Nvml, SampleConvertsUnits) {
  FakeNvmlConfig config("");
  auto nvml = LoadFake();
  ASSERT_NE(nvml, nullptr);
  Result<std::vector<GpuSample>> samples = nvml->Sample();
  ASSERT_TRUE(samples.ok()) << samples.status().ToString();
  ASSERT_EQ(samples->size(), 4u);
  const GpuSample& s = (*samples)[1];
  EXPECT_EQ(s.index, 1);
  EXPECT_DOUBLE_EQ(*s.sm_clock_hz, 1980e6);
  EXPECT_DOUBLE_EQ(*s.memory_clock_hz, 2619e6);
  EXPECT_DOUBLE_EQ(*s.gpu_temperature_celsius, 41);
  EXPECT_DOUBLE_EQ(*s.power_watts, 350.124);             // 350124 mW
  EXPECT_DOUBLE_EQ(*s.energy_joules_total, 123456.789);  // 123456789 mJ
  EXPECT_DOUBLE_EQ(*s.gpu_utilization_ratio, 0.76);      // 76 %
  EXPECT_DOUBLE_EQ(*s.memory_copy_utilization_ratio, 0.30);
  EXPECT_DOUBLE_EQ(*s.encoder_utilization_ratio, 0.10);
  EXPECT_DOUBLE_EQ(*s.decoder_utilization_ratio, 0.05);
  EXPECT_DOUBLE_EQ(*s.pcie_replays_total, 2);
  EXPECT_DOUBLE_EQ(*s.remapped_rows_correctable_total, 1);
  EXPECT_DOUBLE_EQ(*s.remapped_rows_uncorrectable_total, 0);
  EXPECT_DOUBLE_EQ(*s.row_remap_failure, 0);
  EXPECT_DOUBLE_EQ(*s.framebuffer_reserved_bytes, 512.0 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(*s.framebuffer_used_bytes, 512.0 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(*s.framebuffer_free_bytes, (81559.0 - 1024) * 1024 * 1024);
  EXPECT_DOUBLE_EQ(*s.pcie_tx_bytes_per_second, 1000.0 * 1024);
  EXPECT_DOUBLE_EQ(*s.pcie_rx_bytes_per_second, 2000.0 * 1024);
  EXPECT_DOUBLE_EQ(*s.last_xid, 0);
  // Field values: memory temperature in degrees C; NVLink data TX + RX over all links, KiB -> bytes.
  ASSERT_TRUE(s.memory_temperature_celsius.has_value());
  EXPECT_DOUBLE_EQ(*s.memory_temperature_celsius, 61);
  ASSERT_TRUE(s.nvlink_bandwidth_bytes_total.has_value());
  EXPECT_DOUBLE_EQ(*s.nvlink_bandwidth_bytes_total, (1001.0 + 2001.0) * 1024);
  // GPM ratios need a second sample; bare metal has no vGPU license.
  EXPECT_FALSE(s.graphics_engine_active_ratio.has_value());
  EXPECT_FALSE(s.tensor_pipe_active_ratio.has_value());
  EXPECT_FALSE(s.dram_active_ratio.has_value());
  EXPECT_FALSE(s.vgpu_license_status.has_value());
}

TEST(Nvml, FieldValuesWithTheirOwnStatus) {
  // GPU 2 of 3 has no NVLink partner; memory temperature 80 C configured.
  FakeNvmlConfig config("gpus=3\nmemory_temp=80\nnvlink_tx_kib=5\nnvlink_rx_kib=7\n");
  auto nvml = LoadFake();
  ASSERT_NE(nvml, nullptr);
  Result<std::vector<GpuSample>> samples = nvml->Sample();
  ASSERT_TRUE(samples.ok()) << samples.status().ToString();
  ASSERT_EQ(samples->size(), 3u);
  EXPECT_DOUBLE_EQ(*(*samples)[0].memory_temperature_celsius, 80);
  EXPECT_DOUBLE_EQ(*(*samples)[0].nvlink_bandwidth_bytes_total, 12.0 * 1024);
  EXPECT_DOUBLE_EQ(*(*samples)[2].memory_temperature_celsius, 82);
  EXPECT_FALSE((*samples)[2].nvlink_bandwidth_bytes_total.has_value());  // NOT_SUPPORTED in its field
}

TEST(Nvml, UnsupportedFieldValuesAreLeftOut) {
  {
    // One direction missing: no total rather than half of one.
    FakeNvmlConfig config("unsupported=memory_temp,nvlink_rx\n");
    auto nvml = LoadFake();
    ASSERT_NE(nvml, nullptr);
    Result<std::vector<GpuSample>> samples = nvml->Sample();
    ASSERT_TRUE(samples.ok()) << samples.status().ToString();
    const GpuSample& s = (*samples)[0];
    EXPECT_FALSE(s.memory_temperature_celsius.has_value());
    EXPECT_FALSE(s.nvlink_bandwidth_bytes_total.has_value());
    EXPECT_TRUE(s.power_watts.has_value());
  }
  {
    FakeNvmlConfig config("unsupported=field_values\n");  // the whole call fails
    auto nvml = LoadFake();
    ASSERT_NE(nvml, nullptr);
    Result<std::vector<GpuSample>> samples = nvml->Sample();
    ASSERT_TRUE(samples.ok()) << samples.status().ToString();
    EXPECT_FALSE((*samples)[0].memory_temperature_celsius.has_value());
    EXPECT_FALSE((*samples)[0].nvlink_bandwidth_bytes_total.has_value());
  }
}

TEST(Nvml, GpmRatiosFromTheSecondSampleOn) {
  // Percent per interval between a GPU's consecutive samples (GPU i adds i).
  FakeNvmlConfig config("gpus=2\ngpm_graphics=50,70\ngpm_tensor=20,30\ngpm_dram=40,46\n");
  auto nvml = LoadFake();
  ASSERT_NE(nvml, nullptr);
  Result<std::vector<GpuSample>> first = nvml->Sample();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  for (const GpuSample& s : *first) {
    EXPECT_FALSE(s.graphics_engine_active_ratio.has_value()) << s.index;
    EXPECT_FALSE(s.tensor_pipe_active_ratio.has_value()) << s.index;
    EXPECT_FALSE(s.dram_active_ratio.has_value()) << s.index;
  }
  WaitForNextGpmSample();
  Result<std::vector<GpuSample>> second = nvml->Sample();
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  // Between samples 1 and 2, in percent -> ratio.
  ASSERT_TRUE((*second)[0].graphics_engine_active_ratio.has_value());
  EXPECT_DOUBLE_EQ(*(*second)[0].graphics_engine_active_ratio, 0.50);
  EXPECT_DOUBLE_EQ(*(*second)[0].tensor_pipe_active_ratio, 0.20);
  EXPECT_DOUBLE_EQ(*(*second)[0].dram_active_ratio, 0.40);
  EXPECT_DOUBLE_EQ(*(*second)[1].graphics_engine_active_ratio, 0.51);
  EXPECT_DOUBLE_EQ(*(*second)[1].tensor_pipe_active_ratio, 0.21);
  EXPECT_DOUBLE_EQ(*(*second)[1].dram_active_ratio, 0.41);
  WaitForNextGpmSample();
  Result<std::vector<GpuSample>> third = nvml->Sample();
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  // Between samples 2 and 3 only, not since the first sample (that would be the mean, 0.60).
  EXPECT_DOUBLE_EQ(*(*third)[0].graphics_engine_active_ratio, 0.70);
  EXPECT_DOUBLE_EQ(*(*third)[0].tensor_pipe_active_ratio, 0.30);
  EXPECT_DOUBLE_EQ(*(*third)[0].dram_active_ratio, 0.46);
  EXPECT_DOUBLE_EQ(*(*third)[1].graphics_engine_active_ratio, 0.71);
}

TEST(Nvml, GpmMetricWithAnErrorIsLeftOut) {
  FakeNvmlConfig config("gpus=1\nunsupported=gpm_tensor\n");
  auto nvml = LoadFake();
  ASSERT_NE(nvml, nullptr);
  ASSERT_TRUE(nvml->Sample().ok());
  WaitForNextGpmSample();
  Result<std::vector<GpuSample>> samples = nvml->Sample();
  ASSERT_TRUE(samples.ok()) << samples.status().ToString();
  const GpuSample& s = (*samples)[0];
  EXPECT_FALSE(s.tensor_pipe_active_ratio.has_value());
  ASSERT_TRUE(s.graphics_engine_active_ratio.has_value());
  EXPECT_DOUBLE_EQ(*s.graphics_engine_active_ratio, 0.50);
  EXPECT_DOUBLE_EQ(*s.dram_active_ratio, 0.40);
}

TEST(Nvml, NoGpmBeforeHopperOrWhenSamplingFails) {
  for (const char* text :
       {"gpus=1\nname=NVIDIA A100-SXM4-80GB\ncc=8.0\n", "gpus=1\nunsupported=gpm_sample\n"}) {
    FakeNvmlConfig config(text);
    auto nvml = LoadFake();
    ASSERT_NE(nvml, nullptr);
    for (int call = 0; call < 2; ++call) {
      if (call > 0) WaitForNextGpmSample();
      Result<std::vector<GpuSample>> samples = nvml->Sample();
      ASSERT_TRUE(samples.ok()) << samples.status().ToString();
      EXPECT_FALSE((*samples)[0].graphics_engine_active_ratio.has_value()) << text;
      EXPECT_FALSE((*samples)[0].tensor_pipe_active_ratio.has_value()) << text;
      EXPECT_FALSE((*samples)[0].dram_active_ratio.has_value()) << text;
      EXPECT_TRUE((*samples)[0].sm_clock_hz.has_value());
    }
  }
}

TEST(Nvml, GpmSamplesAreFreed) {
  // The fake counts live GPM samples; holding the library open keeps the count readable after
  // Nvml has closed it.
  void* fake = dlopen(FAKE_NVML_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(fake, nullptr) << dlerror();
  using LiveFn = long (*)();
  auto live = reinterpret_cast<LiveFn>(dlsym(fake, "fake_nvml_gpm_samples_live"));
  ASSERT_NE(live, nullptr);
  const long before = live();
  {
    FakeNvmlConfig config("gpus=2\n");
    auto nvml = LoadFake();
    ASSERT_NE(nvml, nullptr);
    ASSERT_TRUE(nvml->Sample().ok());
    WaitForNextGpmSample();
    ASSERT_TRUE(nvml->Sample().ok());
    EXPECT_EQ(live() - before, 4);  // two buffers per GPU, reused from call to call
    WaitForNextGpmSample();
    ASSERT_TRUE(nvml->Sample().ok());
    EXPECT_EQ(live() - before, 4);
  }
  EXPECT_EQ(live(), before);
  dlclose(fake);
}

TEST(Nvml, VgpuLicenseOnlyOnAVgpuGuest) {
  struct Case {
    const char* config;
    std::optional<double> want;
  };
  const Case cases[] = {
      {"gpus=1\n", std::nullopt},                               // bare metal
      {"gpus=1\nvirtualization=passthrough\n", std::nullopt},   // no vGPU software license
      {"gpus=1\nvirtualization=host_vgpu\n", std::nullopt},     // the hypervisor's view
      {"gpus=1\nvirtualization=vgpu\n", 1.0},                   // licensed guest
      {"gpus=1\nvirtualization=vgpu\nvgpu_licensed=0\n", 0.0},  // unlicensed guest
      {"gpus=1\nvirtualization=vgpu\nunsupported=virtualization\n", std::nullopt},
  };
  for (const Case& c : cases) {
    FakeNvmlConfig config(c.config);
    auto nvml = LoadFake();
    ASSERT_NE(nvml, nullptr);
    Result<std::vector<GpuSample>> samples = nvml->Sample();
    ASSERT_TRUE(samples.ok()) << samples.status().ToString();
    EXPECT_EQ((*samples)[0].vgpu_license_status, c.want) << c.config;
  }
}

TEST(Nvml, UnsupportedFieldsStayEmpty) {
  FakeNvmlConfig config("unsupported=power,energy,utilization,numa,processes,ancestor\n");
  auto nvml = LoadFake();
  ASSERT_NE(nvml, nullptr);
  Result<std::vector<GpuSample>> samples = nvml->Sample();
  ASSERT_TRUE(samples.ok()) << samples.status().ToString();
  const GpuSample& s = (*samples)[0];
  EXPECT_FALSE(s.power_watts.has_value());
  EXPECT_FALSE(s.energy_joules_total.has_value());
  EXPECT_FALSE(s.gpu_utilization_ratio.has_value());
  EXPECT_FALSE(s.memory_copy_utilization_ratio.has_value());
  EXPECT_TRUE(s.sm_clock_hz.has_value());  // others still there
  Result<Inventory> inv = nvml->Discover();
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  EXPECT_EQ(inv->gpus[3].numa_node, 0);  // unknown: default
  EXPECT_TRUE(inv->gpus[0].processes.empty());
  // Without common ancestors every pair is across sockets; NVLink still counts.
  EXPECT_EQ(inv->topology[0][1], 10 + 400);
  EXPECT_EQ(inv->topology[0][2], 10);
}

TEST(Nvml, MissingOptionalSymbolsDoNotFailLoad) {
  FakeNvmlConfig config("mig=1\nmig_instances.1=9@4\n");
  auto nvml = LoadFake(FAKE_NVML_MINIMAL_PATH);
  ASSERT_NE(nvml, nullptr);
  Result<Inventory> inv = nvml->Discover();
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  ASSERT_EQ(inv->gpus.size(), 4u);
  // MIG mode is known, but without the MIG device API no instance is listed.
  EXPECT_TRUE(inv->gpus[1].mig_enabled);
  EXPECT_TRUE(inv->gpus[1].mig_instances.empty());
  EXPECT_EQ(inv->gpus[3].numa_node, 0);
  EXPECT_TRUE(inv->gpus[0].healthy);
  Result<std::vector<GpuSample>> samples = nvml->Sample();
  ASSERT_TRUE(samples.ok()) << samples.status().ToString();
  const GpuSample& s = (*samples)[0];
  EXPECT_FALSE(s.power_watts.has_value());
  EXPECT_FALSE(s.energy_joules_total.has_value());
  EXPECT_FALSE(s.gpu_temperature_celsius.has_value());
  EXPECT_FALSE(s.framebuffer_reserved_bytes.has_value());
  EXPECT_FALSE(s.last_xid.has_value());               // no event API: unknown, not "none"
  ASSERT_TRUE(s.framebuffer_used_bytes.has_value());  // from nvmlDeviceGetMemoryInfo
  EXPECT_DOUBLE_EQ(*s.framebuffer_used_bytes, 3.0 * 1024 * 1024 * 1024);
  // No field values, GPM or vGPU entry points: those fields stay empty, on later calls too.
  WaitForNextGpmSample();
  Result<std::vector<GpuSample>> again = nvml->Sample();
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  for (const GpuSample& g : *again) {
    EXPECT_FALSE(g.memory_temperature_celsius.has_value());
    EXPECT_FALSE(g.nvlink_bandwidth_bytes_total.has_value());
    EXPECT_FALSE(g.graphics_engine_active_ratio.has_value());
    EXPECT_FALSE(g.tensor_pipe_active_ratio.has_value());
    EXPECT_FALSE(g.dram_active_ratio.has_value());
    EXPECT_FALSE(g.vgpu_license_status.has_value());
    EXPECT_TRUE(g.sm_clock_hz.has_value());
  }
}

}  // namespace
}  // namespace gpupool
