#include "model/gpu_catalog.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace gpupool {
namespace {

TEST(GpuCatalogTest, BuiltinHasTheMigModelsAndTheTraceModels) {
  const GpuCatalog catalog = GpuCatalog::Builtin();
  std::set<std::string> names;
  for (const GpuModelSpec& model : catalog.models()) names.insert(model.name);
  // The canonical names other layers (traces, configs) rely on, spelled exactly.
  for (const char* name : {"A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "T4", "P100", "V100M16",
                           "V100M32", "A10", "G2", "G3"}) {
    EXPECT_TRUE(names.count(name)) << name;
  }
}

struct LookupCase {
  const char* query;
  const char* canonical;
  int64_t memory_mib;
  int sm_count;
  ComputeCapability cc;
  bool mig;
  int nvlinks;
};

TEST(GpuCatalogTest, FindsModelsByCanonicalNameOrAlias) {
  const GpuCatalog catalog = GpuCatalog::Builtin();
  const LookupCase cases[] = {
      // Canonical names.
      {"A100-40GB", "A100-40GB", 40960, 108, {8, 0}, true, 12},
      {"A100-80GB", "A100-80GB", 81920, 108, {8, 0}, true, 12},
      {"H100-80GB", "H100-80GB", 81920, 132, {9, 0}, true, 18},
      {"H200-141GB", "H200-141GB", 141 * 1024, 132, {9, 0}, true, 18},
      {"T4", "T4", 15360, 40, {7, 5}, false, 0},
      {"P100", "P100", 16384, 56, {6, 0}, false, 0},
      {"V100M16", "V100M16", 16384, 80, {7, 0}, false, 6},
      {"V100M32", "V100M32", 32768, 80, {7, 0}, false, 6},
      {"A10", "A10", 23028, 72, {8, 6}, false, 0},
      // Aliases as NVML or vendors report them resolve to the canonical model.
      {"A100-SXM4-40GB", "A100-40GB", 40960, 108, {8, 0}, true, 12},
      {"A100-SXM4-80GB", "A100-80GB", 81920, 108, {8, 0}, true, 12},
      {"A100-PCIE-80GB", "A100-80GB", 81920, 108, {8, 0}, true, 12},
      {"NVIDIA A100-SXM4-80GB", "A100-80GB", 81920, 108, {8, 0}, true, 12},
      {"H100-SXM5-80GB", "H100-80GB", 81920, 132, {9, 0}, true, 18},
      {"NVIDIA H100 80GB HBM3", "H100-80GB", 81920, 132, {9, 0}, true, 18},
      {"H200", "H200-141GB", 141 * 1024, 132, {9, 0}, true, 18},
      {"NVIDIA H200", "H200-141GB", 141 * 1024, 132, {9, 0}, true, 18},
      {"Tesla T4", "T4", 15360, 40, {7, 5}, false, 0},
      // The trace anonymises G2 and G3: everything about them is unknown (0).
      {"G2", "G2", 0, 0, {0, 0}, false, 0},
      {"G3", "G3", 0, 0, {0, 0}, false, 0},
  };
  for (const LookupCase& c : cases) {
    SCOPED_TRACE(c.query);
    const GpuModelSpec* model = catalog.Find(c.query);
    ASSERT_NE(model, nullptr);
    EXPECT_EQ(model->name, c.canonical);
    EXPECT_EQ(model->memory, MiB(c.memory_mib));
    EXPECT_EQ(model->sm_count, c.sm_count);
    EXPECT_EQ(model->compute_capability, c.cc);
    EXPECT_EQ(model->mig.has_value(), c.mig);
    EXPECT_EQ(model->nvlinks, c.nvlinks);
  }
}

TEST(GpuCatalogTest, UnknownNamesAreNotFound) {
  const GpuCatalog catalog = GpuCatalog::Builtin();
  // Lookup is exact and case-sensitive; nothing is guessed from a partial name.
  for (const char* name : {"", "a100-80gb", "A100", "H100", "t4", "A100-80GB ", "B200"}) {
    EXPECT_EQ(catalog.Find(name), nullptr) << "'" << name << "'";
  }
  // An empty catalog knows nothing.
  EXPECT_EQ(GpuCatalog().Find("T4"), nullptr);
}

TEST(GpuCatalogTest, EveryNameAndAliasResolvesToItsOwnModel) {
  const GpuCatalog catalog = GpuCatalog::Builtin();
  // No alias may shadow another model's name or alias.
  for (const GpuModelSpec& model : catalog.models()) {
    EXPECT_EQ(catalog.Find(model.name), &model) << model.name;
    for (const std::string& alias : model.aliases) EXPECT_EQ(catalog.Find(alias), &model) << alias;
  }
}

TEST(GpuCatalogTest, CustomCatalogFindsItsOwnModels) {
  GpuModelSpec spec;
  spec.name = "X1";
  spec.aliases = {"Example X1"};
  const GpuCatalog catalog({spec});
  // A catalog built from a vector answers for exactly those models.
  ASSERT_NE(catalog.Find("Example X1"), nullptr);
  EXPECT_EQ(catalog.Find("Example X1")->name, "X1");
  EXPECT_EQ(catalog.Find("T4"), nullptr);
}

// The profile names of one MIG-capable model, in driver-id order 19, 20, 15, 14, 9, 5, 0.
struct MigNamesCase {
  const char* model;
  std::vector<std::string> names;
  std::vector<int> memory_gb;
};

TEST(MigGeometryTest, ProfileNamesAndMemoryFollowTheModel) {
  const GpuCatalog catalog = GpuCatalog::Builtin();
  const MigNamesCase cases[] = {
      {"A100-40GB",
       {"1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"},
       {5, 5, 10, 10, 20, 20, 40}},
      {"A100-80GB",
       {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
       {10, 10, 20, 20, 40, 40, 80}},
      {"H100-80GB",
       {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
       {10, 10, 20, 20, 40, 40, 80}},
      {"H200-141GB",
       {"1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"},
       {18, 18, 35, 35, 71, 71, 141}},
  };
  const int driver_ids[] = {19, 20, 15, 14, 9, 5, 0};
  for (const MigNamesCase& c : cases) {
    SCOPED_TRACE(c.model);
    const GpuModelSpec* model = catalog.Find(c.model);
    ASSERT_NE(model, nullptr);
    ASSERT_TRUE(model->mig.has_value());
    const MigGeometry& geometry = *model->mig;
    // Every MIG-capable model splits into 7 compute and 8 memory slices.
    EXPECT_EQ(geometry.total_compute_slices, 7);
    EXPECT_EQ(geometry.total_memory_slices, 8);
    ASSERT_EQ(geometry.profiles.size(), 7u);
    for (size_t i = 0; i < geometry.profiles.size(); ++i) {
      const MigProfile& profile = geometry.profiles[i];
      EXPECT_EQ(profile.driver_id, driver_ids[i]);
      EXPECT_EQ(profile.name, c.names[i]);
      // Memory is the GB figure of the name times 1024 MiB.
      EXPECT_EQ(profile.memory, MiB(int64_t{c.memory_gb[i]} * 1024)) << profile.name;
    }
  }
}

struct ShapeCase {
  int driver_id;
  int compute_slices;
  int memory_slices;
  int max_instances;
  uint8_t valid_starts;
  bool media_extensions;
};

TEST(MigGeometryTest, ProfileShapesMatchNvidiaPlacements) {
  const GpuCatalog catalog = GpuCatalog::Builtin();
  // `nvidia-smi mig -lgipp`: {starts}:size per profile, the same on every MIG-capable model.
  const ShapeCase cases[] = {
      {19, 1, 1, 7, 0b0111'1111, false},  // {0..6}:1
      {20, 1, 1, 1, 0b0111'1111, true},   // {0..6}:1, the only +me
      {15, 1, 2, 4, 0b0101'0101, false},  // {0,2,4,6}:2
      {14, 2, 2, 3, 0b0001'0101, false},  // {0,2,4}:2
      {9, 3, 4, 2, 0b0001'0001, false},   // {0,4}:4
      {5, 4, 4, 1, 0b0000'0001, false},   // {0}:4
      {0, 7, 8, 1, 0b0000'0001, false},   // {0}:8
  };
  for (const char* name : {"A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB"}) {
    const MigGeometry& geometry = *catalog.Find(name)->mig;
    for (const ShapeCase& c : cases) {
      SCOPED_TRACE(::testing::Message() << name << " profile " << c.driver_id);
      const MigProfile* profile = nullptr;
      for (const MigProfile& p : geometry.profiles) {
        if (p.driver_id == c.driver_id) profile = &p;
      }
      ASSERT_NE(profile, nullptr);
      EXPECT_EQ(profile->compute_slices, c.compute_slices);
      EXPECT_EQ(profile->memory_slices, c.memory_slices);
      EXPECT_EQ(profile->max_instances, c.max_instances);
      EXPECT_EQ(profile->valid_starts, c.valid_starts);
      EXPECT_EQ(profile->media_extensions, c.media_extensions);
    }
  }
}

struct FindCase {
  const char* model;
  const char* query;
  const char* expected;  // nullptr: no match
};

TEST(MigGeometryTest, FindByExactOrShortName) {
  const GpuCatalog catalog = GpuCatalog::Builtin();
  const FindCase cases[] = {
      // Exact names, including the variants a short name never picks.
      {"A100-80GB", "3g.40gb", "3g.40gb"},
      {"A100-80GB", "1g.10gb+me", "1g.10gb+me"},
      {"A100-80GB", "1g.20gb", "1g.20gb"},
      {"H200-141GB", "7g.141gb", "7g.141gb"},
      // Short names pick the standard profile (ids 19, 14, 9, 5, 0), never +me or 1g.20gb.
      {"A100-80GB", "1g", "1g.10gb"},
      {"A100-80GB", "2g", "2g.20gb"},
      {"A100-80GB", "3g", "3g.40gb"},
      {"A100-80GB", "4g", "4g.40gb"},
      {"A100-80GB", "7g", "7g.80gb"},
      {"H200-141GB", "1g", "1g.18gb"},
      {"H200-141GB", "3g", "3g.71gb"},
      {"A100-40GB", "2g", "2g.10gb"},
      // Names of another model, slice counts no profile has, and malformed names match nothing.
      {"A100-80GB", "3g.20gb", nullptr},
      {"H200-141GB", "1g.10gb", nullptr},
      {"A100-80GB", "5g", nullptr},
      {"A100-80GB", "6g", nullptr},
      {"A100-80GB", "0g", nullptr},
      {"A100-80GB", "g", nullptr},
      {"A100-80GB", "", nullptr},
      {"A100-80GB", "3G", nullptr},
      {"A100-80GB", "-3g", nullptr},
      {"A100-80GB", "3gb", nullptr},
      {"A100-80GB", "x3g", nullptr},
  };
  for (const FindCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.model << " '" << c.query << "'");
    const MigProfile* profile = catalog.Find(c.model)->mig->Find(c.query);
    if (c.expected == nullptr) {
      EXPECT_EQ(profile, nullptr);
    } else {
      ASSERT_NE(profile, nullptr);
      EXPECT_EQ(profile->name, c.expected);
    }
  }
}

}  // namespace
}  // namespace gpupool
