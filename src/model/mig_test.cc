#include "model/mig.h"

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

namespace gpupool {
namespace {

// The profile names of one model, so the same facts are checked against each model's own names.
struct MigModelNames {
  const char* model;
  const char* one;       // 1g, id 19
  const char* one_me;    // 1g+me, id 20
  const char* one_wide;  // 1g with 2 memory slices, id 15
  const char* two;       // 2g, id 14
  const char* three;     // 3g, id 9
  const char* four;      // 4g, id 5
  const char* seven;     // 7g, id 0
};

void PrintTo(const MigModelNames& names, std::ostream* os) {
  *os << names.model;
}

class MigLayoutTest : public ::testing::TestWithParam<MigModelNames> {
 protected:
  void SetUp() override {
    const GpuModelSpec* model = catalog_.Find(GetParam().model);
    ASSERT_NE(model, nullptr);
    ASSERT_TRUE(model->mig.has_value());
    geometry_ = &*model->mig;
  }

  const MigProfile& P(const char* name) const {
    const MigProfile* profile = geometry_->Find(name);
    EXPECT_NE(profile, nullptr) << name;
    return profile != nullptr ? *profile : geometry_->profiles.front();
  }
  MigInstance At(const char* name, int start) const { return {P(name).driver_id, start}; }

  const GpuCatalog catalog_ = GpuCatalog::Builtin();
  const MigGeometry* geometry_ = nullptr;
  MigLayout layout_;
};

TEST_P(MigLayoutTest, FourGAtZeroAndThreeGAtFourFitTogether) {
  const MigModelNames& n = GetParam();
  // 4g takes memory slices 0-3 and 3g@4 takes 4-7: no overlap, 7 compute slices in all.
  EXPECT_TRUE(layout_.Add(*geometry_, At(n.four, 0)).ok());
  EXPECT_EQ(layout_.FindPlacement(*geometry_, P(n.three)), 4);
  EXPECT_TRUE(layout_.Add(*geometry_, At(n.three, 4)).ok());
  EXPECT_EQ(layout_.used_compute_slices(*geometry_), 7);
  EXPECT_EQ(layout_.used_memory_slices_mask(*geometry_), 0xFF);
  // The GPU is full: not even a 1g fits any more.
  EXPECT_EQ(layout_.FindPlacement(*geometry_, P(n.one)), std::nullopt);
}

TEST_P(MigLayoutTest, TwoFourGDoNotFit) {
  const MigModelNames& n = GetParam();
  ASSERT_TRUE(layout_.Add(*geometry_, At(n.four, 0)).ok());
  // 4g may only start at 0, which is taken (and 4g allows one instance per GPU).
  EXPECT_EQ(layout_.FindPlacement(*geometry_, P(n.four)), std::nullopt);
  EXPECT_EQ(layout_.Add(*geometry_, At(n.four, 0)).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(layout_.instances().size(), 1u);
}

TEST_P(MigLayoutTest, ThreeGAtZeroBlocksFourG) {
  const MigModelNames& n = GetParam();
  ASSERT_TRUE(layout_.Add(*geometry_, At(n.three, 0)).ok());
  // 4g needs slices 0-3, which 3g@0 holds; 4 compute slices would still be free, memory is not.
  EXPECT_EQ(layout_.FindPlacement(*geometry_, P(n.four)), std::nullopt);
  const Status st = layout_.Add(*geometry_, At(n.four, 0));
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find(n.four), std::string::npos) << st.ToString();
  // A second 3g still fits in the upper half.
  EXPECT_EQ(layout_.FindPlacement(*geometry_, P(n.three)), 4);
}

TEST_P(MigLayoutTest, SevenOneGFitAndAnEighthDoesNot) {
  const MigModelNames& n = GetParam();
  for (int i = 0; i < 7; ++i) {
    // Each 1g goes to the lowest free slice.
    const std::optional<int> start = layout_.FindPlacement(*geometry_, P(n.one));
    ASSERT_EQ(start, i);
    ASSERT_TRUE(layout_.Add(*geometry_, At(n.one, *start)).ok());
  }
  EXPECT_EQ(layout_.used_compute_slices(*geometry_), 7);
  // Slice 7 is free in memory, but 1g may not start there and all compute slices are used.
  EXPECT_EQ(layout_.used_memory_slices_mask(*geometry_), 0x7F);
  EXPECT_EQ(layout_.FindPlacement(*geometry_, P(n.one)), std::nullopt);
  EXPECT_EQ(layout_.Add(*geometry_, At(n.one, 7)).code(), StatusCode::kInvalidArgument);
}

TEST_P(MigLayoutTest, ThreeTwoGAndOneOneGFit) {
  const MigModelNames& n = GetParam();
  for (int expected_start : {0, 2, 4}) {
    // 2g may start at 0, 2 or 4; each goes to the lowest free one.
    ASSERT_EQ(layout_.FindPlacement(*geometry_, P(n.two)), expected_start);
    ASSERT_TRUE(layout_.Add(*geometry_, At(n.two, expected_start)).ok());
  }
  // A fourth 2g does not fit: three is the maximum, and 2g may not start at slice 6.
  EXPECT_EQ(layout_.FindPlacement(*geometry_, P(n.two)), std::nullopt);
  // 6 compute slices used; a 1g takes the seventh at slice 6.
  EXPECT_EQ(layout_.FindPlacement(*geometry_, P(n.one)), 6);
  ASSERT_TRUE(layout_.Add(*geometry_, At(n.one, 6)).ok());
  EXPECT_EQ(layout_.used_compute_slices(*geometry_), 7);
}

TEST_P(MigLayoutTest, MediaExtensionsOnlyOnce) {
  const MigModelNames& n = GetParam();
  ASSERT_EQ(layout_.FindPlacement(*geometry_, P(n.one_me)), 0);
  ASSERT_TRUE(layout_.Add(*geometry_, At(n.one_me, 0)).ok());
  // The GPU has one set of media engines: a second +me instance never fits.
  EXPECT_EQ(layout_.FindPlacement(*geometry_, P(n.one_me)), std::nullopt);
  EXPECT_EQ(layout_.Add(*geometry_, At(n.one_me, 1)).code(), StatusCode::kResourceExhausted);
  // A plain 1g still does.
  EXPECT_EQ(layout_.FindPlacement(*geometry_, P(n.one)), 1);
}

TEST_P(MigLayoutTest, SevenGTakesTheWholeGpu) {
  const MigModelNames& n = GetParam();
  ASSERT_TRUE(layout_.Add(*geometry_, At(n.seven, 0)).ok());
  EXPECT_EQ(layout_.used_memory_slices_mask(*geometry_), 0xFF);
  // Nothing else fits next to a 7g.
  for (const char* other : {n.one, n.one_me, n.one_wide, n.two, n.three, n.four, n.seven}) {
    EXPECT_EQ(layout_.FindPlacement(*geometry_, P(other)), std::nullopt) << other;
  }
}

TEST_P(MigLayoutTest, WideOneGUsesTwoMemorySlices) {
  const MigModelNames& n = GetParam();
  for (int expected_start : {0, 2, 4, 6}) {
    // The 2-memory-slice 1g starts at even slices only.
    ASSERT_EQ(layout_.FindPlacement(*geometry_, P(n.one_wide)), expected_start);
    ASSERT_TRUE(layout_.Add(*geometry_, At(n.one_wide, expected_start)).ok());
  }
  // Four of them fill all memory with only 4 compute slices used; then no 1g fits.
  EXPECT_EQ(layout_.used_compute_slices(*geometry_), 4);
  EXPECT_EQ(layout_.used_memory_slices_mask(*geometry_), 0xFF);
  EXPECT_EQ(layout_.FindPlacement(*geometry_, P(n.one)), std::nullopt);
}

TEST_P(MigLayoutTest, PlacementSkipsTakenSlices) {
  const MigModelNames& n = GetParam();
  ASSERT_TRUE(layout_.Add(*geometry_, At(n.one, 0)).ok());
  // Slice 0 is taken: 2g moves to 2, 3g to 4, 4g (start 0 only) has nowhere to go.
  EXPECT_EQ(layout_.FindPlacement(*geometry_, P(n.two)), 2);
  EXPECT_EQ(layout_.FindPlacement(*geometry_, P(n.three)), 4);
  EXPECT_EQ(layout_.FindPlacement(*geometry_, P(n.four)), std::nullopt);
  // Adding 1g elsewhere is explicit about its start.
  EXPECT_TRUE(layout_.Add(*geometry_, At(n.one, 5)).ok());
  EXPECT_EQ(layout_.used_memory_slices_mask(*geometry_), 0b0010'0001);
}

TEST_P(MigLayoutTest, InvalidStartsAreRejectedAndNamed) {
  const MigModelNames& n = GetParam();
  struct Case {
    const char* profile;
    int start;
  };
  // Starts the profile does not allow, or placements that would run past slice 7.
  const Case cases[] = {{n.three, 2}, {n.three, 1}, {n.four, 4}, {n.two, 6},     {n.seven, 1},
                        {n.one, 7},   {n.one, -1},  {n.one, 8},  {n.one_wide, 1}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.profile << "@" << c.start);
    const Status st = layout_.Add(*geometry_, At(c.profile, c.start));
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find(c.profile), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find(std::to_string(c.start)), std::string::npos) << st.ToString();
  }
  // No failed Add left anything behind.
  EXPECT_TRUE(layout_.empty());
}

TEST_P(MigLayoutTest, UnknownProfileIdIsInvalid) {
  // 99 is no NVML profile id of this geometry.
  const Status st = layout_.Add(*geometry_, MigInstance{99, 0});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("99"), std::string::npos) << st.ToString();
  EXPECT_TRUE(layout_.empty());
}

TEST_P(MigLayoutTest, FailedAddChangesNothing) {
  const MigModelNames& n = GetParam();
  ASSERT_TRUE(layout_.Add(*geometry_, At(n.three, 0)).ok());
  const std::vector<MigInstance> before = layout_.instances();
  // Overlapping 2g@2 (slices 2-3 lie inside 3g@0's 0-3) is refused ...
  EXPECT_EQ(layout_.Add(*geometry_, At(n.two, 2)).code(), StatusCode::kResourceExhausted);
  // ... and the layout is exactly as before.
  EXPECT_EQ(layout_.instances(), before);
  EXPECT_EQ(layout_.used_compute_slices(*geometry_), 3);
}

TEST_P(MigLayoutTest, RemoveFreesTheSlices) {
  const MigModelNames& n = GetParam();
  ASSERT_TRUE(layout_.Add(*geometry_, At(n.four, 0)).ok());
  ASSERT_TRUE(layout_.Add(*geometry_, At(n.three, 4)).ok());
  // Removing needs the exact instance: same profile, same start.
  EXPECT_EQ(layout_.Remove(At(n.three, 0)).code(), StatusCode::kNotFound);
  EXPECT_EQ(layout_.Remove(At(n.two, 4)).code(), StatusCode::kNotFound);
  EXPECT_TRUE(layout_.Remove(At(n.four, 0)).ok());
  // Removing twice: the second time it is gone.
  EXPECT_EQ(layout_.Remove(At(n.four, 0)).code(), StatusCode::kNotFound);
  // Slices 0-3 are free again for another 3g.
  EXPECT_EQ(layout_.FindPlacement(*geometry_, P(n.three)), 0);
  EXPECT_EQ(layout_.used_compute_slices(*geometry_), 3);
  EXPECT_EQ(layout_.used_memory_slices_mask(*geometry_), 0xF0);
}

TEST_P(MigLayoutTest, EmptyLayoutUsesNothing) {
  const MigModelNames& n = GetParam();
  EXPECT_TRUE(layout_.empty());
  EXPECT_EQ(layout_.used_compute_slices(*geometry_), 0);
  EXPECT_EQ(layout_.used_memory_slices_mask(*geometry_), 0);
  // On an empty GPU every profile goes to slice 0.
  for (const char* profile : {n.one, n.one_me, n.one_wide, n.two, n.three, n.four, n.seven}) {
    EXPECT_EQ(layout_.FindPlacement(*geometry_, P(profile)), 0) << profile;
  }
}

// A made-up geometry with two "+me" profiles: the one-per-GPU media rule holds across profiles, not
// only through each profile's max_instances.
TEST(MigLayoutRulesTest, OneMediaExtensionsInstanceAcrossProfiles) {
  MigGeometry geometry;
  geometry.profiles = {
      MigProfile{.driver_id = 20,
                 .name = "1g.x+me",
                 .compute_slices = 1,
                 .memory_slices = 1,
                 .memory = MiB(1024),
                 .max_instances = 1,
                 .valid_starts = 0x7F,
                 .media_extensions = true},
      MigProfile{.driver_id = 21,
                 .name = "1g.x+me.all",
                 .compute_slices = 1,
                 .memory_slices = 1,
                 .memory = MiB(1024),
                 .max_instances = 1,
                 .valid_starts = 0x7F,
                 .media_extensions = true},
  };
  MigLayout layout;
  ASSERT_TRUE(layout.Add(geometry, {20, 0}).ok());
  // The other +me profile has no instance yet, but the media engines are taken.
  EXPECT_EQ(layout.FindPlacement(geometry, geometry.profiles[1]), std::nullopt);
  const Status st = layout.Add(geometry, {21, 1});
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("+me"), std::string::npos) << st.ToString();
  // Once the first is gone, the second fits.
  ASSERT_TRUE(layout.Remove({20, 0}).ok());
  EXPECT_EQ(layout.FindPlacement(geometry, geometry.profiles[1]), 0);
}

// Compute slices run out before memory slices: the compute limit is checked on its own.
TEST(MigLayoutRulesTest, ComputeSlicesAreLimitedIndependently) {
  MigGeometry geometry;
  geometry.total_compute_slices = 2;
  geometry.profiles = {MigProfile{.driver_id = 19,
                                  .name = "1g",
                                  .compute_slices = 1,
                                  .memory_slices = 1,
                                  .memory = MiB(1024),
                                  .max_instances = 7,
                                  .valid_starts = 0x7F}};
  MigLayout layout;
  ASSERT_TRUE(layout.Add(geometry, {19, 0}).ok());
  ASSERT_TRUE(layout.Add(geometry, {19, 1}).ok());
  // Memory slices 2-6 are free, but both compute slices are used.
  EXPECT_EQ(layout.FindPlacement(geometry, geometry.profiles[0]), std::nullopt);
  EXPECT_EQ(layout.Add(geometry, {19, 2}).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(layout.used_compute_slices(geometry), 2);
}

INSTANTIATE_TEST_SUITE_P(Models, MigLayoutTest,
                         ::testing::Values(MigModelNames{"A100-80GB", "1g.10gb", "1g.10gb+me", "1g.20gb",
                                                         "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
                                           MigModelNames{"H200-141GB", "1g.18gb", "1g.18gb+me", "1g.35gb",
                                                         "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"},
                                           MigModelNames{"A100-40GB", "1g.5gb", "1g.5gb+me", "1g.10gb",
                                                         "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"},
                                           MigModelNames{"H100-80GB", "1g.10gb", "1g.10gb+me", "1g.20gb",
                                                         "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}),
                         [](const ::testing::TestParamInfo<MigModelNames>& param_info) {
                           std::string name = param_info.param.model;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace gpupool
