#include "api/node_codec.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "api/jobspec.h"

namespace gpupool {
namespace {

using Json = nlohmann::json;

const GpuCatalog& Catalog() {
  static const GpuCatalog catalog = GpuCatalog::Builtin();
  return catalog;
}

NodeSpec MustParse(const Json& j) {
  Result<NodeSpec> spec = ParseNodeSpec(j, Catalog());
  EXPECT_TRUE(spec.ok()) << spec.status().ToString() << "\n" << j.dump();
  return spec.ok() ? *spec : NodeSpec{};
}

::testing::AssertionResult Refused(const Status& st, const std::string& field, const std::string& needle) {
  if (st.ok()) return ::testing::AssertionFailure() << "accepted";
  if (st.code() != StatusCode::kInvalidArgument) return ::testing::AssertionFailure() << st.ToString();
  if (ErrorField(st) != field) {
    return ::testing::AssertionFailure()
           << "field '" << ErrorField(st) << "', want '" << field << "': " << st.message();
  }
  if (st.message().find(needle) == std::string::npos) {
    return ::testing::AssertionFailure() << "'" << st.message() << "' does not mention '" << needle << "'";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult RoundTrips(const NodeSpec& spec) {
  const Json j = NodeSpecToJson(spec);
  Result<NodeSpec> again = ParseNodeSpec(j, Catalog());
  if (!again.ok()) return ::testing::AssertionFailure() << again.status().ToString() << "\n" << j.dump();
  if (!SameNodeSpec(spec, *again)) {
    return ::testing::AssertionFailure()
           << "differs:\n  " << j.dump() << "\n  " << NodeSpecToJson(*again).dump();
  }
  if (NodeSpecToJson(*again) != j) return ::testing::AssertionFailure() << "canonical form moved";
  return ::testing::AssertionSuccess();
}

// ---- node specs -------------------------------------------------------------------------------

TEST(NodeCodec, CpuOnlyNode) {
  const NodeSpec spec =
      MustParse({{"name", "cpu-1"}, {"cpu", 64}, {"memory", "256Gi"}, {"labels", {{"zone", "a"}}}});
  EXPECT_EQ(spec.name, "cpu-1");
  EXPECT_EQ(spec.cpu, MilliCpu(64000));
  EXPECT_EQ(spec.memory, MiB(256 * 1024));
  EXPECT_TRUE(spec.gpus.empty());
  EXPECT_EQ(spec.topology.gpu_count(), 0);
  EXPECT_EQ(spec.labels.at("zone"), "a");
  EXPECT_TRUE(spec.healthy);
  EXPECT_EQ(spec.max_tasks, 0);
  EXPECT_TRUE(RoundTrips(spec));
}

TEST(NodeCodec, MachinePresetFillsGpusAndTopology) {
  const NodeSpec spec = MustParse(
      {{"name", "dgx-1"}, {"cpu", "256"}, {"memory", "2Ti"}, {"machine", "dgx-a100"}, {"maxTasks", 32}});
  ASSERT_EQ(spec.gpus.size(), 8u);
  EXPECT_EQ(spec.gpus[0].model, "A100-80GB");
  EXPECT_EQ(spec.gpus[0].memory, MiB(81920));
  EXPECT_EQ(spec.gpus[7].uuid, "GPU-dgx-1-7");
  EXPECT_EQ(spec.gpus[5].numa_node, 1);
  EXPECT_TRUE(spec.topology.has_nvlink());
  EXPECT_EQ(spec.topology.NvLinks(0, 7), 12);
  EXPECT_EQ(spec.max_tasks, 32);
  EXPECT_TRUE(RoundTrips(spec));
}

TEST(NodeCodec, EveryPresetRoundTrips) {
  for (const std::string& name : MachinePresetNames()) {
    SCOPED_TRACE(name);
    const NodeSpec spec = MustParse({{"name", "n"}, {"cpu", 8}, {"memory", "64Gi"}, {"machine", name}});
    EXPECT_FALSE(spec.gpus.empty());
    EXPECT_TRUE(RoundTrips(spec));
    // The matrix alone rebuilds the preset's topology exactly.
    Result<Topology> again = TopologyFromJson(TopologyToJson(spec.topology), spec.topology.gpu_count());
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    for (int a = 0; a < spec.topology.gpu_count(); ++a) {
      for (int b = 0; b < spec.topology.gpu_count(); ++b) {
        EXPECT_EQ(again->Level(a, b), spec.topology.Level(a, b)) << a << "," << b;
        EXPECT_EQ(again->NvLinks(a, b), spec.topology.NvLinks(a, b)) << a << "," << b;
      }
    }
  }
}

TEST(NodeCodec, GpuListUsesCatalogNamesAndDefaults) {
  const NodeSpec spec = MustParse(Json::parse(R"({
    "name": "node-1", "cpu": "32", "memory": "256Gi",
    "gpus": [{"model": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-aaaa", "migEnabled": true},
             {"index": 1, "model": "A100-80GB", "memory": "40Gi", "smCount": 100, "computeCapability": "8.6",
              "numaNode": 1, "healthy": false}]
  })"));
  ASSERT_EQ(spec.gpus.size(), 2u);
  EXPECT_EQ(spec.gpus[0].model, "A100-80GB");
  EXPECT_EQ(spec.gpus[0].uuid, "GPU-aaaa");
  EXPECT_EQ(spec.gpus[0].memory, MiB(81920));
  EXPECT_EQ(spec.gpus[0].sm_count, 108);
  EXPECT_EQ(spec.gpus[0].compute_capability, (ComputeCapability{8, 0}));
  EXPECT_TRUE(spec.gpus[0].mig_enabled);
  EXPECT_EQ(spec.gpus[1].uuid, "GPU-node-1-1");
  EXPECT_EQ(spec.gpus[1].memory, MiB(40960));
  EXPECT_EQ(spec.gpus[1].sm_count, 100);
  EXPECT_EQ(spec.gpus[1].compute_capability, (ComputeCapability{8, 6}));
  EXPECT_EQ(spec.gpus[1].numa_node, 1);
  EXPECT_FALSE(spec.gpus[1].healthy);
  EXPECT_EQ(spec.topology.gpu_count(), 2);
  EXPECT_EQ(spec.topology.Level(0, 1), PcieLevel::kCrossCpu);  // flat when not given
  EXPECT_TRUE(RoundTrips(spec));
}

TEST(NodeCodec, UnknownModelKeepsItsName) {
  const NodeSpec spec =
      MustParse({{"name", "x"}, {"cpu", 4}, {"memory", "8Gi"}, {"gpus", {{{"model", "Radeon 9000"}}}}});
  ASSERT_EQ(spec.gpus.size(), 1u);
  EXPECT_EQ(spec.gpus[0].model, "Radeon 9000");
  EXPECT_EQ(spec.gpus[0].memory, MiB(0));
  EXPECT_TRUE(RoundTrips(spec));
}

TEST(NodeCodec, TopologyMatrix) {
  // GPUs 0,1 under one switch with 4 NVLinks; 2 under the same host bridge; 3 on the other socket.
  const Json matrix =
      Json::parse(R"([[0, 450, 30, 10], [450, 0, 30, 10], [30, 30, 0, 10], [10, 10, 10, 0]])");
  Json body = {{"name", "t"}, {"cpu", 4}, {"memory", "8Gi"}, {"topology", matrix}};
  body["gpus"] = Json::array();
  for (int i = 0; i < 4; ++i) body["gpus"].push_back({{"model", "T4"}, {"numaNode", i == 3 ? 1 : 0}});
  const NodeSpec spec = MustParse(body);
  EXPECT_EQ(spec.topology.Score(0, 1), 450);
  EXPECT_EQ(spec.topology.NvLinks(0, 1), 4);
  EXPECT_EQ(spec.topology.Level(0, 1), PcieLevel::kSingleSwitch);
  EXPECT_EQ(spec.topology.Level(1, 2), PcieLevel::kHostBridge);
  EXPECT_EQ(spec.topology.Level(2, 3), PcieLevel::kCrossCpu);
  EXPECT_TRUE(spec.topology.has_nvlink());
  EXPECT_EQ(TopologyToJson(spec.topology), matrix);
  EXPECT_TRUE(RoundTrips(spec));
}

TEST(NodeCodec, BadTopologies) {
  struct Case {
    std::string matrix;
    std::string field;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"[[0, 10], [10, 0]]", "topology", "has 2 rows but the node has 3 GPUs"},
      {"[[0, 10, 10], [10, 0, 10], [10, 10]]", "topology[2]", "has 2 entries, not 3"},
      {"[[5, 10, 10], [10, 0, 10], [10, 10, 0]]", "topology[0][0]", "must be 0"},
      {"[[0, 20, 10], [10, 0, 10], [10, 10, 0]]", "topology[0][1]", "symmetric"},
      {"[[0, 15, 10], [15, 0, 10], [10, 10, 0]]", "topology[0][1]", "not a PCIe level score"},
      {"[[0, 70, 10], [70, 0, 10], [10, 10, 0]]", "topology[0][1]", "not a PCIe level score"},
      {"[[0, -10, 10], [-10, 0, 10], [10, 10, 0]]", "topology[0][1]", "between 0 and"},
      {"[[0, \"10\", 10], [10, 0, 10], [10, 10, 0]]", "topology[0][1]", "expected an integer"},
      // 0-1 and 1-2 on one switch, but 0-2 across sockets: not a tree.
      {"[[0, 50, 10], [50, 0, 50], [10, 50, 0]]", "topology", "do not describe a PCIe tree"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.matrix);
    Json body = {{"name", "t"}, {"cpu", 4}, {"memory", "8Gi"}, {"topology", Json::parse(c.matrix)}};
    body["gpus"] = {{{"model", "T4"}}, {{"model", "T4"}}, {{"model", "T4"}}};
    EXPECT_TRUE(Refused(ParseNodeSpec(body, Catalog()).status(), c.field, c.needle));
  }
}

TEST(NodeCodec, BadNodeSpecsNameTheirField) {
  struct Case {
    std::string what;
    std::function<void(Json&)> breaks;
    std::string field;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"not an object", [](Json& j) { j = 5; }, "", "expected an object"},
      {"unknown field", [](Json& j) { j["gpuCount"] = 2; }, "gpuCount", "unknown field (known: name, cpu"},
      {"name missing", [](Json& j) { j.erase("name"); }, "name", "is required"},
      {"name bad", [](Json& j) { j["name"] = "Node_1!"; }, "name", "lowercase letters"},
      {"cpu missing", [](Json& j) { j.erase("cpu"); }, "cpu", "is required"},
      {"cpu negative", [](Json& j) { j["cpu"] = -4; }, "cpu", "must not be negative"},
      {"memory bare", [](Json& j) { j["memory"] = 1024; }, "memory", "needs a unit"},
      {"maxTasks negative", [](Json& j) { j["maxTasks"] = -1; }, "maxTasks", "between 0 and"},
      {"healthy string", [](Json& j) { j["healthy"] = "yes"; }, "healthy", "expected a boolean"},
      {"labels bad",
       [](Json& j) {
         j["labels"] = {{"a", "b c"}};
       },
       "labels", "has value 'b c'"},
      {"machine and gpus", [](Json& j) { j["machine"] = "dgx-a100"; }, "machine", "one or the other"},
      {"machine unknown",
       [](Json& j) {
         j.erase("gpus");
         j["machine"] = "cray-1";
       },
       "machine", "unknown machine preset 'cray-1'"},
      {"gpus object", [](Json& j) { j["gpus"] = Json::object(); }, "gpus", "expected an array"},
      {"gpu unknown field", [](Json& j) { j["gpus"][0]["vendor"] = "nv"; }, "gpus[0].vendor",
       "unknown field"},
      {"gpu model missing", [](Json& j) { j["gpus"][1].erase("model"); }, "gpus[1].model", "is required"},
      {"mixed models", [](Json& j) { j["gpus"][1]["model"] = "T4"; }, "gpus[1].model",
       "a node has one GPU model"},
      {"index order", [](Json& j) { j["gpus"][1]["index"] = 0; }, "gpus[1].index", "must be 1"},
      {"duplicate uuid", [](Json& j) { j["gpus"][1]["uuid"] = "GPU-0"; }, "gpus[1].uuid",
       "used by another GPU"},
      {"mig on T4",
       [](Json& j) {
         j["gpus"] = {{{"model", "T4"}, {"migEnabled", true}}};
       },
       "gpus[0].migEnabled", "not MIG-capable"},
      {"compute capability", [](Json& j) { j["gpus"][0]["computeCapability"] = "eight"; },
       "gpus[0].computeCapability", "\"<major>.<minor>\""},
      {"gpu memory bare", [](Json& j) { j["gpus"][0]["memory"] = 80; }, "gpus[0].memory", "needs a unit"},
      {"too many gpus",
       [](Json& j) {
         j["gpus"] = std::vector<Json>(65, {{"model", "T4"}});
       },
       "gpus", "over the limit of 64"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Json body = {{"name", "n"}, {"cpu", 4}, {"memory", "8Gi"}};
    body["gpus"] = {{{"model", "A100-80GB"}, {"uuid", "GPU-0"}}, {{"model", "A100-80GB"}, {"uuid", "GPU-1"}}};
    c.breaks(body);
    EXPECT_TRUE(Refused(ParseNodeSpec(body, Catalog()).status(), c.field, c.needle));
  }
}

TEST(NodeCodec, RandomNodesRoundTrip) {
  std::mt19937 rng(7);
  const auto pick = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const std::vector<std::string> models = {"A100-80GB", "H100-80GB", "T4", "A10", "G2", "Unknown-X"};
  for (int i = 0; i < 200; ++i) {
    NodeSpec spec;
    spec.name = "node-" + std::to_string(i);
    spec.cpu = MilliCpu(pick(0, 512000));
    spec.memory = MiB(pick(0, 1 << 22));
    spec.max_tasks = pick(0, 100);
    spec.healthy = pick(0, 1) == 1;
    if (pick(0, 1)) spec.labels["zone"] = fmt::format("z{}", pick(0, 9));
    const int n = pick(0, 8);
    const std::string model = models[static_cast<size_t>(pick(0, static_cast<int>(models.size()) - 1))];
    const GpuModelSpec* known = Catalog().Find(model);
    for (int g = 0; g < n; ++g) {
      GpuDevice gpu;
      gpu.index = g;
      gpu.uuid = "GPU-" + std::to_string(i) + "-" + std::to_string(g);
      gpu.model = model;
      gpu.memory = MiB(pick(0, 200000));
      gpu.sm_count = pick(0, 200);
      gpu.compute_capability = {pick(0, 12), pick(0, 9)};
      gpu.numa_node = pick(0, 3);
      gpu.healthy = pick(0, 3) > 0;
      gpu.mig_enabled = known != nullptr && known->mig.has_value() && pick(0, 1) == 1;
      spec.gpus.push_back(gpu);
    }
    // A random PCIe tree: GPUs grouped by socket, bridge, switch; NVLinks on some pairs.
    MachineSpec machine;
    for (int g = 0; g < n; ++g) {
      machine.gpus.push_back({.numa_node = pick(0, 1),
                              .host_bridge = pick(0, 1),
                              .root_switch = pick(-1, 1),
                              .leaf_switch = pick(-1, 3),
                              .board = pick(-1, 1)});
    }
    // Give lower levels ids that only nest inside their parents, so the result is a tree.
    for (auto& p : machine.gpus) {
      p.host_bridge += 10 * p.numa_node;
      if (p.root_switch >= 0) p.root_switch += 100 * p.host_bridge;
      if (p.leaf_switch >= 0) p.leaf_switch += 1000 * (p.root_switch + 1) + 100000 * p.host_bridge;
      if (p.board >= 0) p.board = p.leaf_switch >= 0 ? p.board + 10 * p.leaf_switch : -1;
    }
    for (int a = 0; a < n; ++a) {
      for (int b = a + 1; b < n; ++b) {
        if (pick(0, 3) == 0) machine.nvlinks.push_back({.a = a, .b = b, .links = pick(1, 18)});
      }
    }
    Result<Topology> topology = Topology::FromMachine(machine);
    ASSERT_TRUE(topology.ok()) << topology.status().ToString();
    spec.topology = *topology;
    ASSERT_TRUE(ValidateNodeSpec(spec, Catalog()).ok()) << ValidateNodeSpec(spec, Catalog()).ToString();
    ASSERT_TRUE(RoundTrips(spec)) << "node " << i;
  }
}

// ---- placements -------------------------------------------------------------------------------

class PlacementCodec : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const auto& [name, machine] :
         {std::pair<std::string, std::string>{"a100", "dgx-a100"}, {"t4", "pcie-8gpu"}}) {
      Result<NodeSpec> spec =
          ParseNodeSpec({{"name", name}, {"cpu", 64}, {"memory", "512Gi"}, {"machine", machine}}, Catalog());
      ASSERT_TRUE(spec.ok()) << spec.status().ToString();
      ASSERT_TRUE(ledger_.AddNode(*spec).ok());
    }
    ASSERT_TRUE(ledger_.SetMigEnabled(0, 3, true).ok());
  }

  ::testing::AssertionResult RoundTrips(const Placement& p) {
    const Json j = PlacementToJson(p, ledger_);
    Result<Placement> again = PlacementFromJson(j, ledger_);
    if (!again.ok()) return ::testing::AssertionFailure() << again.status().ToString() << "\n" << j.dump();
    if (!(*again == p)) return ::testing::AssertionFailure() << "differs: " << j.dump();
    return ::testing::AssertionSuccess();
  }

  Ledger ledger_;
};

TEST_F(PlacementCodec, ShareTask) {
  Placement p;
  p.node = 1;
  p.cpu = MilliCpu(2000);
  p.memory = MiB(8192);
  p.gpus = {{.gpu = 2, .share = MilliGpu(250), .memory = MiB(10240), .mig = std::nullopt}};
  p.share_task = true;
  const Json j = PlacementToJson(p, ledger_);
  EXPECT_EQ(j, Json::parse(R"({"node": "t4", "cpu": "2", "memory": "8Gi", "shareTask": true,
      "gpus": [{"index": 2, "uuid": "GPU-t4-2", "share": 250, "memory": "10Gi"}]})"));
  EXPECT_TRUE(RoundTrips(p));
}

TEST_F(PlacementCodec, AnMpsShareKeepsItsOwner) {
  Placement p;
  p.node = 1;
  p.cpu = MilliCpu(1000);
  p.gpus = {{.gpu = 0, .share = MilliGpu(250), .memory = MiB(0), .mig = std::nullopt}};
  p.share_task = true;
  p.enforced = true;
  p.mps_owner = "vision";
  EXPECT_EQ(PlacementToJson(p, ledger_)["mpsOwner"], "vision");
  EXPECT_TRUE(RoundTrips(p));
  // Absent: no owner (not an MPS share, or stored before owners were kept).
  Json j = PlacementToJson(p, ledger_);
  j.erase("mpsOwner");
  Result<Placement> old = PlacementFromJson(j, ledger_);
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_FALSE(old->mps_owner.has_value());
  // Hostile: not a string, or past the bound.
  j["mpsOwner"] = 7;
  EXPECT_FALSE(PlacementFromJson(j, ledger_).ok());
  j["mpsOwner"] = std::string(513, 'x');
  Result<Placement> long_owner = PlacementFromJson(j, ledger_);
  ASSERT_FALSE(long_owner.ok());
  EXPECT_NE(long_owner.status().message().find("mpsOwner"), std::string::npos) << long_owner.status().ToString();
}

TEST_F(PlacementCodec, WholeGpusAndCpuOnly) {
  Placement whole;
  whole.node = 0;
  whole.cpu = MilliCpu(500);
  whole.gpus = {{.gpu = 0, .share = kWholeGpu, .memory = MiB(0), .mig = std::nullopt},
                {.gpu = 1, .share = kWholeGpu, .memory = MiB(0), .mig = std::nullopt}};
  EXPECT_TRUE(RoundTrips(whole));
  Placement cpu;
  cpu.node = 1;
  cpu.cpu = MilliCpu(1);
  cpu.memory = MiB(1);
  EXPECT_TRUE(RoundTrips(cpu));
  EXPECT_EQ(PlacementToJson(cpu, ledger_)["gpus"], Json::array());
}

TEST_F(PlacementCodec, MigGrant) {
  Placement p;
  p.node = 0;
  p.cpu = MilliCpu(1000);
  p.memory = MiB(4096);
  p.gpus = {{.gpu = 3, .share = MilliGpu(0), .memory = MiB(0), .mig = MigInstance{9, 4}}};
  const Json j = PlacementToJson(p, ledger_);
  EXPECT_EQ(j["gpus"][0]["mig"], Json::parse(R"({"profile": "3g.40gb", "profileId": 9, "start": 4})"));
  EXPECT_FALSE(j["shareTask"].get<bool>());
  EXPECT_TRUE(RoundTrips(p));
  // By name alone.
  Json by_name = j;
  by_name["gpus"][0]["mig"].erase("profileId");
  Result<Placement> again = PlacementFromJson(by_name, ledger_);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, p);
  // The placement also commits.
  EXPECT_TRUE(ledger_.Commit(*again).ok());
}

TEST_F(PlacementCodec, ShareTaskDefaultsFromTheGpus) {
  Result<Placement> p = PlacementFromJson(
      Json::parse(R"({"node": "t4", "cpu": "1", "memory": "1Gi", "gpus": [{"index": 0, "share": 500}]})"),
      ledger_);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_TRUE(p->share_task);
}

TEST_F(PlacementCodec, BadPlacementsNameTheirField) {
  struct Case {
    std::string json;
    std::string field;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {R"({"node": "nope"})", "node", "unknown node 'nope'"},
      {R"({"cpu": "1"})", "node", "is required"},
      {R"({"node": "t4", "gpus": [{"index": 8}]})", "gpus[0].index", "between 0 and 7"},
      {R"({"node": "t4", "gpus": [{"share": 8}]})", "gpus[0].index", "is required"},
      {R"({"node": "t4", "gpus": [{"index": 1}, {"index": 1}]})", "gpus[1].index", "listed twice"},
      {R"({"node": "t4", "gpus": [{"index": 1, "uuid": "GPU-x"}]})", "gpus[0].uuid",
       "is not GPU 1 of node 't4'"},
      {R"({"node": "t4", "gpus": [{"index": 1, "share": 1001}]})", "gpus[0].share", "between 0 and 1000"},
      {R"({"node": "t4", "gpus": [{"index": 1, "mig": {"profileId": 9, "start": 0}}]})", "gpus[0].mig",
       "not MIG-capable"},
      {R"({"node": "a100", "gpus": [{"index": 3, "mig": {"profileId": 77, "start": 0}}]})",
       "gpus[0].mig.profileId", "77 is not a profile"},
      {R"({"node": "a100", "gpus": [{"index": 3, )"
       R"("mig": {"profileId": 9, "profile": "1g.10gb", "start": 0}}]})",
       "gpus[0].mig.profile", "is not profile 9"},
      {R"({"node": "a100", "gpus": [{"index": 3, "mig": {"profileId": 9}}]})", "gpus[0].mig.start",
       "is required"},
      {R"({"node": "a100", "gpus": [{"index": 3, "mig": {"start": 0}}]})", "gpus[0].mig.profileId",
       "is required"},
      {R"({"node": "a100", "extra": 1})", "extra", "unknown field"},
      {R"({"node": "a100", "memory": 5})", "memory", "needs a unit"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.json);
    EXPECT_TRUE(Refused(PlacementFromJson(Json::parse(c.json), ledger_).status(), c.field, c.needle));
  }
}

TEST(NodeCodec, Quantities) {
  EXPECT_EQ(QuantityCpuJson(MilliCpu(2000)), "2");
  EXPECT_EQ(QuantityCpuJson(MilliCpu(500)), "0.5");
  EXPECT_EQ(QuantityMemoryJson(MiB(8192)), "8Gi");
  EXPECT_EQ(QuantityMemoryJson(MiB(1536)), "1536Mi");
}

}  // namespace
}  // namespace gpupool
