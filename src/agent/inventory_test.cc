#include "agent/inventory.h"

#include <gtest/gtest.h>

#include "api/mig_report.h"
#include "api/node_codec.h"
#include "model/gpu_catalog.h"

namespace gpupool {
namespace {

NodeSpec Register(const Inventory& inv, const std::string& node) {
  nlohmann::json body = NodeRegistration(inv, node, "64", "512Gi", {{"zone", "a"}});
  // The MIG layout rides beside the inventory, as the server reads it (api/mig_report.h).
  EXPECT_TRUE(TakeMigInstances(body).ok());
  Result<NodeSpec> spec = ParseNodeSpec(body, GpuCatalog::Builtin());
  EXPECT_TRUE(spec.ok()) << spec.status().ToString() << "\n" << body.dump();
  return spec.ok() ? *spec : NodeSpec{};
}

TEST(SimulatedInventory, CountTimesModelDefaultsToNvSwitchForSxmModels) {
  Result<Inventory> inv = SimulatedInventory("8xH100-80GB", "node-1");
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  EXPECT_TRUE(inv->simulated);
  ASSERT_EQ(inv->gpus.size(), 8u);
  EXPECT_EQ(inv->gpus[3].uuid, "GPU-sim-node-1-3");
  EXPECT_EQ(inv->gpus[0].model, "H100-80GB");
  EXPECT_EQ(inv->gpus[0].memory_bytes, 81920LL * 1024 * 1024);
  EXPECT_EQ(inv->gpus[0].compute_capability, "9.0");
  EXPECT_EQ(inv->gpus[0].numa_node, 0);
  EXPECT_EQ(inv->gpus[7].numa_node, 1);
  ASSERT_EQ(inv->topology.size(), 8u);
  // NVSwitch: 18 links between every pair; PCIe level differs (same switch 50, across sockets 10).
  EXPECT_EQ(inv->topology[0][1], 1800 + 50);
  EXPECT_EQ(inv->topology[0][7], 1800 + 10);
  EXPECT_EQ(inv->topology[2][2], 0);
}

TEST(SimulatedInventory, PcieFormHasNoNvLink) {
  Result<Inventory> inv = SimulatedInventory("4xA100-80GB-PCIE", "n");
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  ASSERT_EQ(inv->gpus.size(), 4u);
  EXPECT_EQ(inv->topology[0][1], 50);  // one switch
  EXPECT_EQ(inv->topology[0][2], 10);  // across sockets
  Result<Inventory> sxm = SimulatedInventory("4xA100-80GB-SXM", "n");
  ASSERT_TRUE(sxm.ok()) << sxm.status().ToString();
  EXPECT_EQ(sxm->topology[0][1], 1200 + 50);
}

TEST(SimulatedInventory, AliasAndPcieOnlyModel) {
  Result<Inventory> inv = SimulatedInventory("2xA10", "n");
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  EXPECT_EQ(inv->gpus[1].model, "A10");
  EXPECT_LT(inv->topology[0][1], 100);
  Result<Inventory> bad = SimulatedInventory("2xA10-SXM", "n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("no NVLink"), std::string::npos) << bad.status().message();
}

TEST(SimulatedInventory, MachinePreset) {
  Result<Inventory> inv = SimulatedInventory("pcie-4gpu-nvlink-pairs", "n");
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  ASSERT_EQ(inv->gpus.size(), 4u);
  EXPECT_EQ(inv->gpus[0].model, "A100-80GB");
  EXPECT_GE(inv->topology[0][1], 1200);
  EXPECT_LT(inv->topology[1][2], 100);
}

TEST(SimulatedInventory, YamlMachineSpec) {
  Result<Inventory> inv = SimulatedInventory("{gpuModel: H100-80GB, gpus: 2, nvswitchLinks: 18}", "n");
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  ASSERT_EQ(inv->gpus.size(), 2u);
  EXPECT_EQ(inv->topology[0][1], 1800 + 50);

  Result<Inventory> explicit_topo = SimulatedInventory(
      "gpuModel: A10\ngpus: [{numaNode: 0}, {numaNode: 1}]\ntopology: [[0, 10], [10, 0]]\n", "n");
  ASSERT_TRUE(explicit_topo.ok()) << explicit_topo.status().ToString();
  EXPECT_EQ(explicit_topo->gpus[1].numa_node, 1);
  EXPECT_EQ(explicit_topo->topology[0][1], 10);
}

TEST(SimulatedInventory, YamlMigGpusAreMigEnabledWithoutInstances) {
  Result<Inventory> inv = SimulatedInventory("{gpuModel: A100-80GB, gpus: 4, migGpus: [1, 3]}", "sim-1");
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  EXPECT_FALSE(inv->gpus[0].mig_enabled);
  EXPECT_TRUE(inv->gpus[1].mig_enabled);
  EXPECT_TRUE(inv->gpus[3].mig_enabled);
  EXPECT_TRUE(inv->gpus[0].mig_profiles.empty());
  ASSERT_FALSE(inv->gpus[1].mig_profiles.empty());
  bool has_3g = false;
  for (const MigProfileInfo& p : inv->gpus[1].mig_profiles)
    has_3g = has_3g || (p.name == "3g.40gb" && p.profile_id == 9);
  EXPECT_TRUE(has_3g);
  // Simulated GPUs have no real MIG instances (tasks get synthetic ones, agent/task_env.h).
  EXPECT_TRUE(inv->gpus[1].mig_instances.empty());
  const NodeSpec node = Register(*inv, "sim-1");
  EXPECT_FALSE(node.gpus[0].mig_enabled);
  EXPECT_TRUE(node.gpus[1].mig_enabled);

  Result<Inventory> not_capable = SimulatedInventory("{gpuModel: A10, gpus: 2, migGpus: [0]}", "n");
  ASSERT_FALSE(not_capable.ok());
  EXPECT_NE(not_capable.status().message().find("migGpus[0]: A10 is not MIG-capable"), std::string::npos)
      << not_capable.status().message();
  Result<Inventory> out_of_range = SimulatedInventory("{gpuModel: H100-80GB, gpus: 2, migGpus: [0, 2]}", "n");
  ASSERT_FALSE(out_of_range.ok());
  EXPECT_NE(out_of_range.status().message().find("migGpus[1]: GPU 2 is not in the machine"),
            std::string::npos)
      << out_of_range.status().message();
}

TEST(SimulatedInventory, ErrorsNameWhatIsWrong) {
  Result<Inventory> zero = SimulatedInventory("0xH100", "n");
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(zero.status().message().find("count"), std::string::npos) << zero.status().message();

  Result<Inventory> unknown = SimulatedInventory("8xNoSuchGPU", "n");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("NoSuchGPU"), std::string::npos) << unknown.status().message();
  EXPECT_NE(unknown.status().message().find("H100-80GB"), std::string::npos);  // lists the known ones

  Result<Inventory> bad_yaml = SimulatedInventory("gpuModel: [H100\ngpus: 2", "n");
  ASSERT_FALSE(bad_yaml.ok());
  EXPECT_NE(bad_yaml.status().message().find("YAML"), std::string::npos) << bad_yaml.status().message();

  Result<Inventory> unknown_field = SimulatedInventory("{gpuModel: H100-80GB, gpus: 2, gpuz: 3}", "n");
  ASSERT_FALSE(unknown_field.ok());
  EXPECT_NE(unknown_field.status().message().find("gpuz"), std::string::npos);

  Result<Inventory> no_model = SimulatedInventory("{gpus: 2}", "n");
  ASSERT_FALSE(no_model.ok());
  EXPECT_NE(no_model.status().message().find("gpuModel"), std::string::npos);

  Result<Inventory> not_tree =
      SimulatedInventory("{gpuModel: A10, gpus: 3, topology: [[0, 50, 10], [50, 0, 50], [10, 50, 0]]}", "n");
  ASSERT_FALSE(not_tree.ok());
  EXPECT_NE(not_tree.status().message().find("topology"), std::string::npos) << not_tree.status().message();

  Result<Inventory> nothing = SimulatedInventory("some-machine", "n");
  ASSERT_FALSE(nothing.ok());
  EXPECT_NE(nothing.status().message().find("some-machine"), std::string::npos);
  EXPECT_NE(nothing.status().message().find("dgx-h100"), std::string::npos);  // lists presets
}

TEST(NodeRegistration, ParseNodeSpecAcceptsWhatItProduces) {
  for (const char* spec : {"8xH100-80GB", "4xA100-80GB-PCIE", "2xA10", "dgx-a100", "hgx-h200", "pcie-8gpu",
                           "{gpuModel: L4, gpus: 3}", "1xT4"}) {
    SCOPED_TRACE(spec);
    Result<Inventory> inv = SimulatedInventory(spec, "sim-1");
    ASSERT_TRUE(inv.ok()) << inv.status().ToString();
    const NodeSpec node = Register(*inv, "sim-1");
    EXPECT_EQ(node.name, "sim-1");
    ASSERT_EQ(node.gpus.size(), inv->gpus.size());
    EXPECT_EQ(node.labels.at("gpupool.io/simulated"), "true");
    EXPECT_EQ(node.labels.at("gpupool.io/gpu-source"), "simulated");
    EXPECT_EQ(node.labels.at("zone"), "a");
    EXPECT_EQ(node.gpus[0].uuid, inv->gpus[0].uuid);
    EXPECT_EQ(node.gpus[0].model, inv->gpus[0].model);
    for (size_t a = 0; a < inv->gpus.size(); ++a) {
      for (size_t b = 0; b < inv->gpus.size(); ++b) {
        EXPECT_EQ(node.topology.Score(static_cast<int>(a), static_cast<int>(b)), inv->topology[a][b]);
      }
    }
  }
}

TEST(NodeRegistration, DiscoveredInventoryWithDeviceNamesAndHealth) {
  Inventory inv;
  inv.source = "nvml";
  for (int i = 0; i < 2; ++i) {
    GpuInfo g;
    g.index = i;
    g.uuid = "GPU-abc-" + std::to_string(i);
    g.name = "NVIDIA A100-SXM4-80GB";
    g.model = "A100-80GB";
    g.memory_bytes = 85899345920LL + 12345;  // not whole MiB: rounded down
    g.compute_capability = "8.0";
    g.numa_node = i;
    g.mig_enabled = i == 1;
    g.healthy = i == 0;
    inv.gpus.push_back(g);
  }
  inv.topology = {{0, 1210}, {1210, 0}};
  const nlohmann::json body = NodeRegistration(inv, "gpu-7", "32", "256Gi", {});
  EXPECT_FALSE(body["labels"].contains("gpupool.io/simulated"));
  EXPECT_EQ(body["labels"]["gpupool.io/gpu-source"], "nvml");
  const NodeSpec node = Register(inv, "gpu-7");
  ASSERT_EQ(node.gpus.size(), 2u);
  EXPECT_EQ(node.gpus[0].memory, MiB(81920));
  EXPECT_TRUE(node.gpus[0].healthy);
  EXPECT_FALSE(node.gpus[1].healthy);
  EXPECT_TRUE(node.gpus[1].mig_enabled);
  EXPECT_EQ(node.gpus[1].numa_node, 1);
  EXPECT_EQ(node.topology.Score(0, 1), 1210);
  EXPECT_EQ(node.topology.NvLinks(0, 1), 12);
}

TEST(NodeRegistration, CpuOnlyNode) {
  Inventory inv;
  const nlohmann::json body = NodeRegistration(inv, "cpu-1", "8", "16Gi", {});
  EXPECT_FALSE(body.contains("gpus"));
  Result<NodeSpec> spec = ParseNodeSpec(body, GpuCatalog::Builtin());
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_TRUE(spec->gpus.empty());
}

}  // namespace
}  // namespace gpupool
