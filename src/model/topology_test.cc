#include "model/topology.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "model/gpu_catalog.h"
#include "model/node.h"

namespace gpupool {
namespace {

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(PcieLevelTest, ScoresAndNamesFollowGpuAllocator) {
  struct Case {
    PcieLevel level;
    int score;
    const char* name;
  };
  // go-gpuallocator's PCIe scores: the closer the common ancestor, the higher.
  const Case cases[] = {
      {PcieLevel::kSameBoard, 60, "SameBoard"},     {PcieLevel::kSingleSwitch, 50, "SingleSwitch"},
      {PcieLevel::kMultiSwitch, 40, "MultiSwitch"}, {PcieLevel::kHostBridge, 30, "HostBridge"},
      {PcieLevel::kSameNuma, 20, "SameNuma"},       {PcieLevel::kCrossCpu, 10, "CrossCpu"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(PcieLevelScore(c.level), c.score) << c.name;
    EXPECT_EQ(PcieLevelName(c.level), c.name);
  }
}

TEST(TopologyTest, FlatScoresEveryPairAsCrossCpu) {
  const Topology flat = Topology::Flat(3);
  EXPECT_EQ(flat.gpu_count(), 3);
  EXPECT_FALSE(flat.has_nvlink());
  for (int a = 0; a < 3; ++a) {
    for (int b = 0; b < 3; ++b) {
      // Off the diagonal: cross-CPU, 10, no NVLink; a GPU with itself scores 0.
      EXPECT_EQ(flat.Score(a, b), a == b ? 0 : 10) << a << "," << b;
      EXPECT_EQ(flat.NvLinks(a, b), 0);
      if (a != b) {
        EXPECT_EQ(flat.Level(a, b), PcieLevel::kCrossCpu);
      }
    }
  }
  // Three pairs of 10.
  EXPECT_EQ(flat.SetScore({0, 1, 2}), 30);
  // No GPUs (or a negative count) is an empty topology.
  EXPECT_EQ(Topology::Flat(0).gpu_count(), 0);
  EXPECT_EQ(Topology::Flat(-2).gpu_count(), 0);
  EXPECT_EQ(Topology().gpu_count(), 0);
}

TEST(TopologyTest, PairLevelIsTheClosestSharedComponent) {
  struct Case {
    const char* what;
    GpuPlacementSpec a;
    GpuPlacementSpec b;
    PcieLevel expected;
  };
  const Case cases[] = {
      // A shared board wins over everything further out.
      {"same board", {0, 0, 0, 0, 3}, {0, 0, 0, 0, 3}, PcieLevel::kSameBoard},
      {"same leaf switch", {0, 0, 0, 1, -1}, {0, 0, 0, 1, -1}, PcieLevel::kSingleSwitch},
      {"leaf switches under one root", {0, 0, 0, 1, -1}, {0, 0, 0, 2, -1}, PcieLevel::kMultiSwitch},
      {"same host bridge, no switch", {0, 0, -1, -1, -1}, {0, 0, -1, -1, -1}, PcieLevel::kHostBridge},
      {"same socket, two host bridges", {0, 0, -1, -1, -1}, {0, 1, -1, -1, -1}, PcieLevel::kSameNuma},
      {"two sockets", {0, 0, -1, -1, -1}, {1, 1, -1, -1, -1}, PcieLevel::kCrossCpu},
      // -1 means "none" and is never a shared component.
      {"both without a switch", {0, 0, -1, -1, -1}, {0, 0, -1, -1, -1}, PcieLevel::kHostBridge},
      {"both without host bridge or NUMA", {-1, -1, -1, -1, -1}, {-1, -1, -1, -1, -1}, PcieLevel::kCrossCpu},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    MachineSpec spec;
    spec.gpus = {c.a, c.b};
    const Result<Topology> topology = Topology::FromMachine(spec);
    ASSERT_TRUE(topology.ok()) << topology.status().ToString();
    EXPECT_EQ(topology->Level(0, 1), c.expected);
    EXPECT_EQ(topology->Level(1, 0), c.expected);
    // Without NVLink the score is the level's score alone.
    EXPECT_EQ(topology->Score(0, 1), PcieLevelScore(c.expected));
    EXPECT_EQ(topology->Score(0, 0), 0);
  }
}

TEST(TopologyTest, NvLinksAddHundredPerLinkSymmetrically) {
  MachineSpec spec;
  spec.gpus = {{0, 0, -1, 0, -1}, {0, 0, -1, 0, -1}, {1, 1, -1, 1, -1}};
  spec.nvlinks = {{0, 1, 4}, {2, 1, 2}};
  const Result<Topology> topology = Topology::FromMachine(spec);
  ASSERT_TRUE(topology.ok()) << topology.status().ToString();
  EXPECT_TRUE(topology->has_nvlink());
  // (0,1): one switch (50) + 4 links; listed once, counted both ways.
  EXPECT_EQ(topology->Score(0, 1), 450);
  EXPECT_EQ(topology->Score(1, 0), 450);
  EXPECT_EQ(topology->NvLinks(1, 0), 4);
  // (1,2): across sockets (10) + 2 links, listed as (2,1).
  EXPECT_EQ(topology->Score(1, 2), 210);
  // (0,2): no link, across sockets.
  EXPECT_EQ(topology->Score(0, 2), 10);
  EXPECT_EQ(topology->NvLinks(0, 2), 0);
}

TEST(TopologyTest, NvSwitchConnectsEveryPairAndExplicitLinksAddToIt) {
  MachineSpec spec;
  spec.gpus = {{0, 0, -1, -1, -1}, {0, 0, -1, -1, -1}, {0, 0, -1, -1, -1}};
  spec.nvswitch_links = 6;
  spec.nvlinks = {{0, 2, 2}};
  const Result<Topology> topology = Topology::FromMachine(spec);
  ASSERT_TRUE(topology.ok()) << topology.status().ToString();
  // Host bridge (30) + 6 NVSwitch links for a pair without an explicit link.
  EXPECT_EQ(topology->Score(0, 1), 630);
  // 6 NVSwitch links + 2 direct ones.
  EXPECT_EQ(topology->NvLinks(2, 0), 8);
  EXPECT_EQ(topology->Score(0, 2), 830);
  // The diagonal never gets links.
  EXPECT_EQ(topology->NvLinks(1, 1), 0);
  EXPECT_EQ(topology->Score(1, 1), 0);
}

TEST(TopologyTest, MachineWithoutGpusIsEmpty) {
  // A CPU-only machine is valid and has an empty matrix.
  const Result<Topology> topology = Topology::FromMachine(MachineSpec{});
  ASSERT_TRUE(topology.ok());
  EXPECT_EQ(topology->gpu_count(), 0);
  EXPECT_FALSE(topology->has_nvlink());
}

TEST(TopologyTest, InvalidMachinesAreRejectedNamingTheEntry) {
  struct Case {
    const char* what;
    std::function<void(MachineSpec&)> mutate;
    const char* message_part;
  };
  const Case cases[] = {
      {"link to a GPU past the end",
       [](MachineSpec& m) {
         m.nvlinks = {{0, 2, 1}};
       },
       "nvlink 0 (0, 2, 1 links)"},
      {"link from a negative index",
       [](MachineSpec& m) {
         m.nvlinks = {{-1, 1, 1}};
       },
       "nvlink 0"},
      {"second link is bad",
       [](MachineSpec& m) {
         m.nvlinks = {{0, 1, 1}, {1, 1, 2}};
       },
       "nvlink 1"},
      {"negative link count",
       [](MachineSpec& m) {
         m.nvlinks = {{0, 1, -3}};
       },
       "negative link count"},
      {"negative NVSwitch links", [](MachineSpec& m) { m.nvswitch_links = -1; }, "nvswitch_links"},
      {"id below -1", [](MachineSpec& m) { m.gpus[1].leaf_switch = -2; }, "gpu 1: leaf_switch"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    MachineSpec spec;
    spec.name = "m1";
    spec.gpus = {{}, {}};
    c.mutate(spec);
    const Result<Topology> topology = Topology::FromMachine(spec);
    ASSERT_FALSE(topology.ok());
    EXPECT_EQ(topology.status().code(), StatusCode::kInvalidArgument);
    // The message names the machine and the bad entry.
    EXPECT_TRUE(Contains(topology.status().message(), "machine 'm1'")) << topology.status().ToString();
    EXPECT_TRUE(Contains(topology.status().message(), c.message_part)) << topology.status().ToString();
  }
  // A self link says so.
  MachineSpec self;
  self.gpus = {{}, {}};
  self.nvlinks = {{1, 1, 2}};
  EXPECT_TRUE(Contains(Topology::FromMachine(self).status().message(), "itself"));
}

TEST(MachinePresetTest, NamesAreTheDocumentedOnes) {
  // The names the header documents, in its order.
  EXPECT_EQ(MachinePresetNames(),
            (std::vector<std::string>{"dgx-a100", "dgx-h100", "hgx-h200", "pcie-4gpu-nvlink-pairs",
                                      "pcie-2gpu", "pcie-8gpu"}));
}

TEST(MachinePresetTest, EveryPresetBuildsWithAKnownModel) {
  const GpuCatalog catalog = GpuCatalog::Builtin();
  for (const std::string& name : MachinePresetNames()) {
    SCOPED_TRACE(name);
    const Result<MachineSpec> machine = MachinePreset(name);
    ASSERT_TRUE(machine.ok()) << machine.status().ToString();
    EXPECT_EQ(machine->name, name);
    // Presets use canonical catalog names.
    const GpuModelSpec* model = catalog.Find(machine->gpu_model);
    ASSERT_NE(model, nullptr) << machine->gpu_model;
    EXPECT_EQ(model->name, machine->gpu_model);
    const Result<Topology> topology = Topology::FromMachine(*machine);
    ASSERT_TRUE(topology.ok()) << topology.status().ToString();
    EXPECT_EQ(topology->gpu_count(), static_cast<int>(machine->gpus.size()));
    // Scores are symmetric.
    for (int a = 0; a < topology->gpu_count(); ++a) {
      for (int b = 0; b < topology->gpu_count(); ++b) EXPECT_EQ(topology->Score(a, b), topology->Score(b, a));
    }
  }
}

TEST(MachinePresetTest, PresetShapes) {
  struct Case {
    const char* preset;
    const char* model;
    size_t gpus;
    bool nvlink;
  };
  const Case cases[] = {
      {"dgx-a100", "A100-80GB", 8, true},  {"dgx-h100", "H100-80GB", 8, true},
      {"hgx-h200", "H200-141GB", 8, true}, {"pcie-4gpu-nvlink-pairs", "A100-80GB", 4, true},
      {"pcie-2gpu", "A10", 2, false},      {"pcie-8gpu", "T4", 8, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.preset);
    const Result<MachineSpec> machine = MachinePreset(c.preset);
    ASSERT_TRUE(machine.ok());
    EXPECT_EQ(machine->gpu_model, c.model);
    EXPECT_EQ(machine->gpus.size(), c.gpus);
    EXPECT_EQ(Topology::FromMachine(*machine)->has_nvlink(), c.nvlink);
  }
}

TEST(MachinePresetTest, PairScores) {
  struct Case {
    const char* preset;
    int a;
    int b;
    PcieLevel level;
    int score;
  };
  const Case cases[] = {
      // DGX A100: NVSwitch gives every pair 12 links on top of the PCIe level.
      {"dgx-a100", 0, 1, PcieLevel::kSingleSwitch, 50 + 1200},  // one leaf switch
      {"dgx-a100", 0, 2, PcieLevel::kMultiSwitch, 40 + 1200},   // two leaf switches, one root
      {"dgx-a100", 3, 4, PcieLevel::kCrossCpu, 10 + 1200},      // across sockets
      // DGX H100: 18 links per pair.
      {"dgx-h100", 0, 5, PcieLevel::kCrossCpu, 10 + 1800},
      {"dgx-h100", 6, 7, PcieLevel::kSingleSwitch, 50 + 1800},
      {"dgx-h100", 4, 7, PcieLevel::kMultiSwitch, 40 + 1800},
      {"hgx-h200", 1, 6, PcieLevel::kCrossCpu, 10 + 1800},
      // PCIe pairs with NVLink bridges: bridged pairs share a switch, the two pairs sit on two sockets.
      {"pcie-4gpu-nvlink-pairs", 0, 1, PcieLevel::kSingleSwitch, 50 + 1200},
      {"pcie-4gpu-nvlink-pairs", 2, 3, PcieLevel::kSingleSwitch, 50 + 1200},
      {"pcie-4gpu-nvlink-pairs", 0, 2, PcieLevel::kCrossCpu, 10},
      {"pcie-4gpu-nvlink-pairs", 1, 3, PcieLevel::kCrossCpu, 10},
      // Two A10s on one host bridge.
      {"pcie-2gpu", 0, 1, PcieLevel::kHostBridge, 30},
      // Eight T4s: two per switch, two switches per socket.
      {"pcie-8gpu", 0, 1, PcieLevel::kSingleSwitch, 50},
      {"pcie-8gpu", 1, 2, PcieLevel::kMultiSwitch, 40},
      {"pcie-8gpu", 3, 4, PcieLevel::kCrossCpu, 10},
      {"pcie-8gpu", 5, 4, PcieLevel::kSingleSwitch, 50},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.preset << " (" << c.a << "," << c.b << ")");
    const Result<MachineSpec> machine = MachinePreset(c.preset);
    ASSERT_TRUE(machine.ok());
    const Result<Topology> topology = Topology::FromMachine(*machine);
    ASSERT_TRUE(topology.ok());
    EXPECT_EQ(topology->Level(c.a, c.b), c.level);
    EXPECT_EQ(topology->Score(c.a, c.b), c.score);
  }
}

TEST(MachinePresetTest, SetScoreSumsPairs) {
  const Result<Topology> topology = Topology::FromMachine(*MachinePreset("pcie-4gpu-nvlink-pairs"));
  ASSERT_TRUE(topology.ok());
  // (0,1) 1250 + (0,2) 10 + (1,2) 10.
  EXPECT_EQ(topology->SetScore({0, 1, 2}), 1270);
  // The bridged pair beats any other pair.
  EXPECT_GT(topology->SetScore({2, 3}), topology->SetScore({1, 2}));
  // Fewer than two GPUs have no pairs.
  EXPECT_EQ(topology->SetScore({3}), 0);
  EXPECT_EQ(topology->SetScore({}), 0);
}

TEST(MachinePresetTest, UnknownPresetListsTheKnownOnes) {
  const Result<MachineSpec> machine = MachinePreset("dgx-b200");
  ASSERT_FALSE(machine.ok());
  EXPECT_EQ(machine.status().code(), StatusCode::kNotFound);
  // The error names the bad preset and every known one.
  EXPECT_TRUE(Contains(machine.status().message(), "dgx-b200"));
  for (const std::string& name : MachinePresetNames()) {
    EXPECT_TRUE(Contains(machine.status().message(), name)) << name;
  }
}

// ---- Nodes (model/node.h) -------------------------------------------------------------------------

TEST(NodeSpecTest, MakeNodeFillsGpusFromTheCatalog) {
  const GpuCatalog catalog = GpuCatalog::Builtin();
  const NodeSpec node = MakeNode("n1", MilliCpu(64000), MiB(512 * 1024), 4, "A100-SXM4-80GB", catalog);
  EXPECT_EQ(node.name, "n1");
  EXPECT_EQ(node.cpu, MilliCpu(64000));
  ASSERT_EQ(node.gpus.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const GpuDevice& gpu = node.gpus[static_cast<size_t>(i)];
    EXPECT_EQ(gpu.index, i);
    // The alias is replaced by the canonical name; figures come from the catalog.
    EXPECT_EQ(gpu.model, "A100-80GB");
    EXPECT_EQ(gpu.memory, MiB(81920));
    EXPECT_EQ(gpu.sm_count, 108);
    EXPECT_EQ(gpu.compute_capability, (ComputeCapability{8, 0}));
    EXPECT_EQ(gpu.uuid, "GPU-n1-" + std::to_string(i));
    EXPECT_EQ(gpu.numa_node, 0);
    EXPECT_TRUE(gpu.healthy);
    EXPECT_FALSE(gpu.mig_enabled);
  }
  // Topology unknown: flat.
  EXPECT_EQ(node.topology.gpu_count(), 4);
  EXPECT_EQ(node.topology.Score(0, 3), 10);
  EXPECT_TRUE(ValidateNodeSpec(node, catalog).ok());
}

TEST(NodeSpecTest, MakeNodeKeepsUnknownModelsWithUnknownMemory) {
  const GpuCatalog catalog = GpuCatalog::Builtin();
  const NodeSpec node = MakeNode("n2", MilliCpu(8000), MiB(32768), 2, "Mystery-9000", catalog);
  ASSERT_EQ(node.gpus.size(), 2u);
  // Not in the catalog: the name stays as given and the memory is 0 (unknown).
  EXPECT_EQ(node.gpus[1].model, "Mystery-9000");
  EXPECT_EQ(node.gpus[1].memory, MiB(0));
  // An unknown model is still a valid node.
  EXPECT_TRUE(ValidateNodeSpec(node, catalog).ok());
  // A CPU-only node has no GPUs and an empty topology.
  const NodeSpec cpu_only = MakeNode("c1", MilliCpu(8000), MiB(32768), 0, "", catalog);
  EXPECT_TRUE(cpu_only.gpus.empty());
  EXPECT_TRUE(ValidateNodeSpec(cpu_only, catalog).ok());
}

TEST(NodeSpecTest, MakeNodeFromMachineUsesTheMachineTopology) {
  const GpuCatalog catalog = GpuCatalog::Builtin();
  const Result<NodeSpec> node =
      MakeNodeFromMachine("dgx1", MilliCpu(224000), MiB(2048 * 1024), *MachinePreset("dgx-h100"), catalog);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  ASSERT_EQ(node->gpus.size(), 8u);
  EXPECT_EQ(node->gpus[0].model, "H100-80GB");
  // GPUs 4-7 are on the second socket.
  EXPECT_EQ(node->gpus[3].numa_node, 0);
  EXPECT_EQ(node->gpus[5].numa_node, 1);
  EXPECT_EQ(node->gpus[5].uuid, "GPU-dgx1-5");
  // Cross-CPU (10) + 18 NVLinks.
  EXPECT_EQ(node->topology.Score(0, 5), 1810);
}

TEST(NodeSpecTest, MakeNodeFromABadMachineNamesTheNode) {
  const GpuCatalog catalog = GpuCatalog::Builtin();
  MachineSpec machine = *MachinePreset("pcie-2gpu");
  machine.nvlinks = {{0, 5, 1}};
  const Result<NodeSpec> node = MakeNodeFromMachine("bad", MilliCpu(1000), MiB(1024), machine, catalog);
  ASSERT_FALSE(node.ok());
  // The topology error, prefixed with the node.
  EXPECT_EQ(node.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(node.status().message().rfind("node 'bad': ", 0), 0u) << node.status().ToString();
  // A machine is validated as a node too: an empty node name is refused.
  EXPECT_FALSE(MakeNodeFromMachine("", MilliCpu(1000), MiB(1024), *MachinePreset("pcie-2gpu"), catalog).ok());
}

TEST(NodeSpecTest, ValidationFailuresNameTheNode) {
  const GpuCatalog catalog = GpuCatalog::Builtin();
  struct Case {
    const char* what;
    std::function<void(NodeSpec&)> mutate;
    const char* message_part;
  };
  const Case cases[] = {
      {"no name", [](NodeSpec& n) { n.name.clear(); }, "name"},
      {"negative cpu", [](NodeSpec& n) { n.cpu = MilliCpu(-1); }, "cpu"},
      {"negative memory", [](NodeSpec& n) { n.memory = MiB(-1); }, "memory"},
      {"negative max_tasks", [](NodeSpec& n) { n.max_tasks = -1; }, "max_tasks"},
      {"negative GPU memory", [](NodeSpec& n) { n.gpus[1].memory = MiB(-5); }, "GPU 1"},
      {"indices out of order", [](NodeSpec& n) { std::swap(n.gpus[0].index, n.gpus[1].index); }, "index"},
      {"index past the end", [](NodeSpec& n) { n.gpus[1].index = 7; }, "index 7"},
      // A node carries one GPU model.
      {"mixed GPU models", [](NodeSpec& n) { n.gpus[1].model = "T4"; }, "one GPU model"},
      {"topology of the wrong size", [](NodeSpec& n) { n.topology = Topology::Flat(3); }, "topology"},
      {"default topology", [](NodeSpec& n) { n.topology = Topology(); }, "topology"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    NodeSpec node = MakeNode("base", MilliCpu(8000), MiB(65536), 2, "A100-80GB", catalog);
    c.mutate(node);
    const Status st = ValidateNodeSpec(node, catalog);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    // Errors start with the node's name (empty when that is the problem).
    EXPECT_EQ(st.message().rfind("node '" + node.name + "': ", 0), 0u) << st.ToString();
    EXPECT_TRUE(Contains(st.message(), c.message_part)) << st.ToString();
  }
}

TEST(NodeSpecTest, MigModeNeedsAMigCapableModel) {
  const GpuCatalog catalog = GpuCatalog::Builtin();
  struct Case {
    const char* model;
    bool ok;
  };
  const Case cases[] = {
      {"A100-80GB", true},      // MIG-capable
      {"H200-141GB", true},     // MIG-capable
      {"T4", false},            // known, but no MIG
      {"G2", false},            // anonymised trace model: nothing known, so no MIG
      {"Mystery-9000", false},  // not in the catalog
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.model);
    NodeSpec node = MakeNode("m", MilliCpu(8000), MiB(65536), 2, c.model, catalog);
    node.gpus[1].mig_enabled = true;
    const Status st = ValidateNodeSpec(node, catalog);
    EXPECT_EQ(st.ok(), c.ok) << st.ToString();
    if (!c.ok) {
      EXPECT_TRUE(Contains(st.message(), "MIG")) << st.ToString();
    }
  }
}

TEST(NodeSpecTest, AliasAndCanonicalNameAreOneModel) {
  const GpuCatalog catalog = GpuCatalog::Builtin();
  NodeSpec node = MakeNode("n", MilliCpu(8000), MiB(65536), 2, "H100-80GB", catalog);
  // An alias of the same model does not make the node mixed.
  node.gpus[1].model = "NVIDIA H100 80GB HBM3";
  EXPECT_TRUE(ValidateNodeSpec(node, catalog).ok());
}

}  // namespace
}  // namespace gpupool
