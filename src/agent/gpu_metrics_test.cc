#include "agent/gpu_metrics.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

namespace gpupool {
namespace {

constexpr const char* kPromtool = "/usr/bin/promtool";

// Runs `promtool check metrics` on `text`; returns its exit status and fills `output`.
int PromtoolCheck(const std::string& text, std::string* output) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path();
  const std::string stem = "gpupool_metrics_" + std::to_string(::getpid()) + "_" +
                           ::testing::UnitTest::GetInstance()->current_test_info()->name();
  const std::filesystem::path in = dir / (stem + ".prom");
  const std::filesystem::path out = dir / (stem + ".out");
  std::ofstream(in) << text;
  const std::string cmd =
      std::string(kPromtool) + " check metrics < " + in.string() + " > " + out.string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream result(out);
  output->assign(std::istreambuf_iterator<char>(result), std::istreambuf_iterator<char>());
  std::filesystem::remove(in);
  std::filesystem::remove(out);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

Inventory NvmlInventory() {
  Inventory inv;
  inv.source = "nvml";
  inv.driver_version = "550.54.15";
  for (int i = 0; i < 2; ++i) {
    GpuInfo g;
    g.index = i;
    g.uuid = "GPU-" + std::to_string(i) + "\"quoted\\";  // label values must be escaped
    g.name = "NVIDIA H100 80GB HBM3";
    g.model = "H100-80GB";
    g.memory_bytes = 85899345920LL;
    g.healthy = i == 0;
    inv.gpus.push_back(g);
  }
  return inv;
}

GpuSample FullSample(int index) {
  GpuSample s;
  s.index = index;
  double v = 1.5;
  for (std::optional<double>* f : {&s.sm_clock_hz,
                                   &s.memory_clock_hz,
                                   &s.memory_temperature_celsius,
                                   &s.gpu_temperature_celsius,
                                   &s.power_watts,
                                   &s.energy_joules_total,
                                   &s.pcie_replays_total,
                                   &s.gpu_utilization_ratio,
                                   &s.memory_copy_utilization_ratio,
                                   &s.encoder_utilization_ratio,
                                   &s.decoder_utilization_ratio,
                                   &s.last_xid,
                                   &s.framebuffer_free_bytes,
                                   &s.framebuffer_used_bytes,
                                   &s.framebuffer_reserved_bytes,
                                   &s.nvlink_bandwidth_bytes_total,
                                   &s.vgpu_license_status,
                                   &s.remapped_rows_uncorrectable_total,
                                   &s.remapped_rows_correctable_total,
                                   &s.row_remap_failure,
                                   &s.graphics_engine_active_ratio,
                                   &s.tensor_pipe_active_ratio,
                                   &s.dram_active_ratio,
                                   &s.pcie_tx_bytes_per_second,
                                   &s.pcie_rx_bytes_per_second}) {
    *f = v;
    v += 1;
  }
  s.power_watts = 350.123;
  s.gpu_utilization_ratio = 0.75;
  return s;
}

size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++n;
  return n;
}

TEST(GpuMetrics, AllFieldsOnceWithHelpAndType) {
  const std::vector<GpuHolder> holders = {
      {.gpu = 1, .job = "j-2", .task = "b/server-0", .share_milli = 500, .memory_bytes = 10LL << 30},
      {.gpu = 0, .job = "j-1", .task = "a/worker-0", .share_milli = 250, .memory_bytes = 1LL << 30}};
  const std::string text =
      RenderGpuMetrics("node-1", NvmlInventory(), {FullSample(1), FullSample(0)}, holders);
  // 2 inventory gauges + 25 sample fields + 2 allocation series.
  EXPECT_EQ(Count(text, "# HELP "), 29u);
  EXPECT_EQ(Count(text, "# TYPE "), 29u);
  EXPECT_EQ(Count(text, "# TYPE gpupool_gpu_power_watts gauge\n"), 1u);
  EXPECT_EQ(Count(text, "# TYPE gpupool_gpu_energy_joules_total counter\n"), 1u);
  EXPECT_NE(text.find("gpupool_gpu_power_watts{gpu=\"0\",uuid=\"GPU-0\\\"quoted\\\\\",model=\"H100-80GB\","
                      "node=\"node-1\"} "
                      "350.123\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("gpupool_gpu_utilization_ratio{gpu=\"1\""), std::string::npos);
  EXPECT_NE(text.find("gpupool_gpu_memory_total_bytes{gpu=\"0\""), std::string::npos);
  EXPECT_NE(text.find("} 85899345920\n"), std::string::npos) << text;
  EXPECT_NE(text.find("gpupool_gpu_healthy{gpu=\"1\",uuid=\"GPU-1\\\"quoted\\\\\",model=\"H100-80GB\",node="
                      "\"node-1\"} 0\n"),
            std::string::npos);
  EXPECT_NE(text.find("job=\"j-1\",task=\"a/worker-0\"} 0.25\n"), std::string::npos) << text;
  EXPECT_NE(text.find("job=\"j-2\",task=\"b/server-0\"} 10737418240\n"), std::string::npos) << text;
  // GPU 0 before GPU 1 regardless of the order given.
  EXPECT_LT(text.find("gpupool_gpu_sm_clock_hertz{gpu=\"0\""),
            text.find("gpupool_gpu_sm_clock_hertz{gpu=\"1\""));
  EXPECT_EQ(text.find("simulated"), std::string::npos);
  EXPECT_EQ(text.back(), '\n');
}

TEST(GpuMetrics, SimulatedHasOnlyInventoryGauges) {
  Inventory inv;
  inv.simulated = true;
  GpuInfo g;
  g.uuid = "GPU-sim-n-0";
  g.model = "A10";
  g.memory_bytes = 1;
  inv.gpus.push_back(g);
  const std::string text = RenderGpuMetrics("n", inv, {}, {});
  EXPECT_EQ(Count(text, "# TYPE "), 2u) << text;
  EXPECT_NE(text.find("simulated=\"true\"} 1\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("power"), std::string::npos);
}

TEST(GpuMetrics, EmptySampleFieldsAreLeftOut) {
  GpuSample s;
  s.index = 0;
  s.power_watts = 100;
  const std::string text = RenderGpuMetrics("n", NvmlInventory(), {s}, {});
  EXPECT_NE(text.find("gpupool_gpu_power_watts"), std::string::npos);
  EXPECT_EQ(text.find("gpupool_gpu_temperature_celsius"), std::string::npos);
  EXPECT_EQ(Count(text, "gpupool_gpu_power_watts{"), 1u);
}

TEST(GpuMetrics, PromtoolAcceptsNvmlAndSimulatedOutput) {
  if (!std::filesystem::exists(kPromtool)) GTEST_SKIP() << kPromtool << " is not installed";
  const std::vector<GpuHolder> holders = {
      {.gpu = 0, .job = "j-1", .task = "t\"x\n", .share_milli = 1000, .memory_bytes = 5}};
  std::string out;
  const std::string full =
      RenderGpuMetrics("node-1", NvmlInventory(), {FullSample(0), FullSample(1)}, holders);
  EXPECT_EQ(PromtoolCheck(full, &out), 0) << out << "\n" << full;
  Inventory sim = NvmlInventory();
  sim.simulated = true;
  const std::string simulated = RenderGpuMetrics("sim-1", sim, {}, holders);
  EXPECT_EQ(PromtoolCheck(simulated, &out), 0) << out << "\n" << simulated;
  // The check can fail: a counter without _total is a lint problem.
  EXPECT_NE(PromtoolCheck("# HELP x_bytes y\n# TYPE x_bytes counter\nx_bytes 1\n", &out), 0);
}

TEST(GpuMetrics, NvmlFieldValueGpmAndVgpuFieldsRender) {
  GpuSample s;
  s.index = 0;
  s.memory_temperature_celsius = 61;
  s.nvlink_bandwidth_bytes_total = 3074048;
  s.vgpu_license_status = 1;
  s.graphics_engine_active_ratio = 0.5;
  s.tensor_pipe_active_ratio = 0.25;
  s.dram_active_ratio = 0.125;
  const std::string text = RenderGpuMetrics("n", NvmlInventory(), {s}, {});
  EXPECT_EQ(Count(text, "# TYPE gpupool_gpu_memory_temperature_celsius gauge\n"), 1u) << text;
  EXPECT_EQ(Count(text, "# TYPE gpupool_gpu_nvlink_bandwidth_bytes_total counter\n"), 1u) << text;
  EXPECT_EQ(Count(text, "# TYPE gpupool_gpu_vgpu_license_status gauge\n"), 1u) << text;
  EXPECT_EQ(Count(text, "# TYPE gpupool_gpu_graphics_engine_active_ratio gauge\n"), 1u) << text;
  EXPECT_EQ(Count(text, "# TYPE gpupool_gpu_tensor_pipe_active_ratio gauge\n"), 1u) << text;
  EXPECT_EQ(Count(text, "# TYPE gpupool_gpu_dram_active_ratio gauge\n"), 1u) << text;
  const std::string labels = "{gpu=\"0\",uuid=\"GPU-0\\\"quoted\\\\\",model=\"H100-80GB\",node=\"n\"}";
  EXPECT_NE(text.find("gpupool_gpu_memory_temperature_celsius" + labels + " 61\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("gpupool_gpu_nvlink_bandwidth_bytes_total" + labels + " 3074048\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("gpupool_gpu_vgpu_license_status" + labels + " 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("gpupool_gpu_graphics_engine_active_ratio" + labels + " 0.5\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("gpupool_gpu_tensor_pipe_active_ratio" + labels + " 0.25\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("gpupool_gpu_dram_active_ratio" + labels + " 0.125\n"), std::string::npos) << text;
}

// End to end: the fake NVML on a vGPU guest, sampled twice, through the renderer and promtool.
TEST(GpuMetrics, FakeNvmlSecondScrapeHasAllFields) {
  const std::filesystem::path conf = std::filesystem::temp_directory_path() /
                                     ("gpupool_metrics_fake_nvml_" + std::to_string(::getpid()) + ".conf");
  std::ofstream(conf) << "gpus=2\nvirtualization=vgpu\n";
  ::setenv("GPUPOOL_FAKE_NVML", conf.c_str(), 1);
  Result<std::unique_ptr<Nvml>> nvml = Nvml::Load(FAKE_NVML_PATH);
  ASSERT_TRUE(nvml.ok()) << nvml.status().ToString();
  Result<Inventory> inv = (*nvml)->Discover();
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  Result<std::vector<GpuSample>> first = (*nvml)->Sample();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const std::string first_text = RenderGpuMetrics("n", *inv, *first, {});
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  Result<std::vector<GpuSample>> second = (*nvml)->Sample();
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  const std::string text = RenderGpuMetrics("n", *inv, *second, {});
  ::unsetenv("GPUPOOL_FAKE_NVML");
  std::filesystem::remove(conf);
  // The first scrape has no GPM ratios yet; the second has every one of the 25 fields.
  EXPECT_EQ(first_text.find("gpupool_gpu_tensor_pipe_active_ratio"), std::string::npos);
  EXPECT_NE(first_text.find("gpupool_gpu_memory_temperature_celsius{"), std::string::npos);
  EXPECT_EQ(Count(text, "# TYPE "), 2u + 25u) << text;
  const std::string gpu1 =
      "{gpu=\"1\",uuid=\"GPU-fa6e0000-0000-4000-8000-000000000001\",model=\"H100-80GB\",node=\"n\"}";
  EXPECT_NE(text.find("gpupool_gpu_memory_temperature_celsius" + gpu1 + " 61\n"), std::string::npos) << text;
  EXPECT_NE(text.find("gpupool_gpu_nvlink_bandwidth_bytes_total" + gpu1 + " 3074048\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("gpupool_gpu_vgpu_license_status" + gpu1 + " 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("gpupool_gpu_graphics_engine_active_ratio" + gpu1 + " 0.51\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("gpupool_gpu_tensor_pipe_active_ratio" + gpu1 + " 0.21\n"), std::string::npos) << text;
  EXPECT_NE(text.find("gpupool_gpu_dram_active_ratio" + gpu1 + " 0.41\n"), std::string::npos) << text;
  if (!std::filesystem::exists(kPromtool)) GTEST_SKIP() << kPromtool << " is not installed";
  std::string out;
  EXPECT_EQ(PromtoolCheck(text, &out), 0) << out << "\n" << text;
}

}  // namespace
}  // namespace gpupool
