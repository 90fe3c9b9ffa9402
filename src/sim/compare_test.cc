// Comparing published-layout CSVs: seed-means, differences, cell counts, baseline reduction.
#include "sim/compare.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

namespace gpupool {
namespace {

DiscreteRow Row(const std::string& trace, const std::string& policy, uint64_t seed, double value) {
  DiscreteRow r;
  r.workload = "openb_pod_list_" + trace;
  r.sc_policy = policy;
  r.seed = seed;
  r.total_gpus = 100;
  r.values.fill(value);
  return r;
}

const CompareRow* Find(const CompareResult& r, const std::string& policy) {
  for (const auto& row : r.rows) {
    if (row.sc_policy == policy) return &row;
  }
  return nullptr;
}

class CompareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    expected_.has_total_gpus = true;
    actual_.has_total_gpus = true;
    // BestFit: expected 90 and 92 (mean 91); actual the same.
    expected_.rows = {Row("default", "05-BestFit", 42, 90), Row("default", "05-BestFit", 43, 92),
                      Row("default", "06-FGD", 42, 94), Row("default", "06-FGD", 43, 96),
                      Row("default", "02-DotProd", 42, 80)};
    actual_.rows = {Row("default", "05-BestFit", 42, 90), Row("default", "05-BestFit", 43, 92),
                    Row("default", "06-FGD", 42, 94), Row("default", "06-FGD", 43, 96),
                    Row("default", "01-Random", 42, 70)};
  }
  DiscreteTable expected_;
  DiscreteTable actual_;
};

TEST_F(CompareTest, IdenticalRowsMatch) {
  auto r = CompareTables(expected_, actual_, CompareOptions{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->exceeds_tolerance);
  EXPECT_EQ(r->common_runs, 4);
  EXPECT_EQ(r->differing_cells, 0);
  EXPECT_EQ(r->max_abs_diff, 0);
  ASSERT_EQ(r->rows.size(), 2u);
  EXPECT_EQ(r->rows[0].sc_policy, "05-BestFit");  // sorted
  const CompareRow* fgd = Find(*r, "06-FGD");
  ASSERT_NE(fgd, nullptr);
  EXPECT_EQ(fgd->seeds, 2);
  EXPECT_EQ(fgd->cells, 2 * kDemandBins);
  ASSERT_EQ(fgd->columns.size(), 2u);
  EXPECT_EQ(fgd->columns[0].column, 100);
  EXPECT_EQ(fgd->columns[1].column, 130);
  EXPECT_DOUBLE_EQ(fgd->columns[0].expected_mean, 95);
  EXPECT_DOUBLE_EQ(fgd->columns[0].actual_mean, 95);
  // Unallocated: BestFit 9, FGD 5: (9 - 5) / 9 = 44.4 %.
  ASSERT_TRUE(fgd->columns[1].reduction_vs_baseline.has_value());
  EXPECT_NEAR(*fgd->columns[1].reduction_vs_baseline, 400.0 / 9, 1e-9);
  EXPECT_NEAR(*Find(*r, "05-BestFit")->columns[0].reduction_vs_baseline, 0, 1e-12);
  // Rows on one side only are reported.
  ASSERT_EQ(r->missing_in_actual.size(), 1u);
  EXPECT_EQ(r->missing_in_actual[0].sc_policy, "02-DotProd");
  ASSERT_EQ(r->missing_in_expected.size(), 1u);
  EXPECT_EQ(r->missing_in_expected[0].sc_policy, "01-Random");
  const std::string text = FormatCompare(*r);
  EXPECT_NE(text.find("MATCH"), std::string::npos) << text;
  EXPECT_NE(text.find("02-DotProd seed 42"), std::string::npos) << text;
  EXPECT_NE(text.find("01-Random seed 42"), std::string::npos) << text;
  EXPECT_NE(text.find("44.4%"), std::string::npos) << text;
}

TEST_F(CompareTest, DifferencesMeansCellsAndTolerance) {
  // FGD seed 43: column 130 off by 0.02, columns 10..12 off by 0.5.
  actual_.rows[3].values[130] += 0.02;
  for (size_t c = 10; c <= 12; ++c) actual_.rows[3].values[c] -= 0.5;
  CompareOptions o;
  auto r = CompareTables(expected_, actual_, o);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->exceeds_tolerance);
  EXPECT_EQ(r->differing_cells, 4);
  EXPECT_NEAR(r->max_abs_diff, 0.5, 1e-12);
  const CompareRow* fgd = Find(*r, "06-FGD");
  EXPECT_EQ(fgd->differing_cells, 4);
  EXPECT_DOUBLE_EQ(fgd->columns[0].diff, 0);
  EXPECT_NEAR(fgd->columns[1].expected_mean, 95, 1e-12);
  EXPECT_NEAR(fgd->columns[1].actual_mean, 95.01, 1e-12);
  EXPECT_NEAR(fgd->columns[1].diff, 0.01, 1e-12);
  EXPECT_EQ(Find(*r, "05-BestFit")->differing_cells, 0);
  EXPECT_NE(FormatCompare(*r).find("MISMATCH"), std::string::npos);

  o.tolerance = 0.1;  // only the three 0.5 cells count
  r = CompareTables(expected_, actual_, o);
  EXPECT_TRUE(r->exceeds_tolerance);
  EXPECT_EQ(r->differing_cells, 3);
  o.tolerance = 0.5;
  r = CompareTables(expected_, actual_, o);
  EXPECT_FALSE(r->exceeds_tolerance);
  EXPECT_EQ(r->differing_cells, 0);
}

TEST_F(CompareTest, ColumnsBaselineAndErrors) {
  CompareOptions o;
  o.columns = {0, 50};
  o.baseline = "06-FGD";
  auto r = CompareTables(expected_, actual_, o);
  ASSERT_TRUE(r.ok());
  const CompareRow* bf = Find(*r, "05-BestFit");
  ASSERT_EQ(bf->columns.size(), 2u);
  EXPECT_EQ(bf->columns[1].column, 50);
  // Unallocated: FGD 5, BestFit 9: (5 - 9) / 5 = -80 %.
  EXPECT_NEAR(*bf->columns[0].reduction_vs_baseline, -80, 1e-9);

  o.baseline = "09-None";  // absent: no reductions, no red@ column
  r = CompareTables(expected_, actual_, o);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->rows[0].columns[0].reduction_vs_baseline.has_value());
  EXPECT_EQ(FormatCompare(*r).find("red@"), std::string::npos);

  o.columns = {131};
  EXPECT_EQ(CompareTables(expected_, actual_, o).status().code(), StatusCode::kInvalidArgument);
  o.columns = {100};
  o.tolerance = -1;
  EXPECT_EQ(CompareTables(expected_, actual_, o).status().code(), StatusCode::kInvalidArgument);
}

// NaN cells (the bound's frag columns, empty columns): equal to NaN, different from any number, and
// left out of the seed-means.
TEST_F(CompareTest, NanCells) {
  expected_.rows[2].values[130] = std::nan("");  // FGD seed 42
  actual_.rows[2].values[130] = std::nan("");
  auto r = CompareTables(expected_, actual_, CompareOptions{});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->differing_cells, 0);
  EXPECT_FALSE(r->exceeds_tolerance);
  const CompareRow* fgd = Find(*r, "06-FGD");
  EXPECT_DOUBLE_EQ(fgd->columns[1].expected_mean, 96);  // seed 43 only
  EXPECT_DOUBLE_EQ(fgd->columns[1].actual_mean, 96);
  ASSERT_TRUE(fgd->columns[1].reduction_vs_baseline.has_value());

  actual_.rows[3].values[130] = std::nan("");  // both FGD seeds NaN on the actual side
  expected_.rows[3].values[130] = 96;
  r = CompareTables(expected_, actual_, CompareOptions{});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->differing_cells, 1);
  EXPECT_TRUE(r->exceeds_tolerance);
  fgd = Find(*r, "06-FGD");
  EXPECT_TRUE(std::isnan(fgd->columns[1].actual_mean));
  EXPECT_FALSE(fgd->columns[1].reduction_vs_baseline.has_value());
  EXPECT_NE(FormatCompare(*r).find("nan"), std::string::npos);
}

TEST_F(CompareTest, FilesRoundTrip) {
  const auto dir = std::filesystem::temp_directory_path() / "gpupool_compare_test";
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(WriteDiscreteCsv(expected_, (dir / "e.csv").string()).ok());
  actual_.rows[0].values[100] = 90.25;
  ASSERT_TRUE(WriteDiscreteCsv(actual_, (dir / "a.csv").string()).ok());
  CompareOptions o;
  o.expected_csv = (dir / "e.csv").string();
  o.actual_csv = (dir / "a.csv").string();
  auto r = CompareFiles(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->exceeds_tolerance);
  EXPECT_EQ(r->differing_cells, 1);
  EXPECT_NEAR(Find(*r, "05-BestFit")->columns[0].diff, 0.125, 1e-12);
  o.actual_csv = (dir / "none.csv").string();
  EXPECT_FALSE(CompareFiles(o).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gpupool

namespace gpupool {
namespace {

// The policy table: every policy of the actual file per trace, the reference's published mean,
// and the new policies' margins; NaN cells (the bound's empty columns) are left out of means.
TEST(PolicyTableTest, PoliciesSideBySideWithTheirMarginOverTheReference) {
  DiscreteTable expected, actual;
  expected.rows = {Row("default", "06-FGD", 42, 95), Row("default", "06-FGD", 43, 96),
                   Row("cpu250", "06-FGD", 42, 93), Row("default", "05-BestFit", 42, 90),
                   Row("cpu250", "06-FGD", 44, 50)};  // a seed the actual file lacks: left out
  actual.rows = {Row("default", "06-FGD", 42, 95),   Row("default", "06-FGD", 43, 96),
                 Row("default", "balanced", 42, 96), Row("default", "balanced", 43, 97),
                 Row("cpu250", "balanced", 42, 92),  Row("cpu250", "06-FGD", 42, 93),
                 Row("default", "bound", 42, 100),   Row("default", "bound", 43, std::nan(""))};
  auto t = MakePolicyTable(expected, actual, 130, "06-FGD");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->traces, (std::vector<std::string>{"openb_pod_list_cpu250", "openb_pod_list_default"}));
  EXPECT_EQ(t->policies, (std::vector<std::string>{"06-FGD", "balanced", "bound"}));
  EXPECT_EQ(t->challengers, (std::vector<std::string>{"balanced", "bound"}));
  ASSERT_EQ(t->means.size(), 2u);
  EXPECT_DOUBLE_EQ(t->means[1][0], 95.5);   // default FGD
  EXPECT_DOUBLE_EQ(t->means[1][1], 96.5);   // default balanced
  EXPECT_DOUBLE_EQ(t->means[1][2], 100);    // the NaN seed is left out
  EXPECT_TRUE(std::isnan(t->means[0][2]));  // no bound run on cpu250
  EXPECT_DOUBLE_EQ(t->reference_means[0], 93);
  const std::string text = FormatPolicyTable(*t);
  EXPECT_NE(
      text.find("balanced is above 06-FGD of the expected file on 1 of 2 traces (by more than 0.05 on 1)"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("+1.00"), std::string::npos) << text;
  EXPECT_NE(text.find("-1.00"), std::string::npos) << text;

  EXPECT_FALSE(MakePolicyTable(expected, actual, 131, "06-FGD").ok());
  EXPECT_FALSE(MakePolicyTable(expected, DiscreteTable{}, 130, "06-FGD").ok());

  // Tuned on default, so cpu250 is held out: two groups, each with its own mean and count.
  auto g = MakePolicyTable(expected, actual, 130, "06-FGD", {"default"});
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->tuned, (std::vector<bool>{false, true}));
  const std::string grouped = FormatPolicyTable(*g);
  EXPECT_NE(grouped.find("-- tuned on (1 traces)\ndefault"), std::string::npos) << grouped;
  EXPECT_NE(grouped.find("-- held out (1 traces)\ncpu250"), std::string::npos) << grouped;
  EXPECT_NE(grouped.find("mean tuned"), std::string::npos) << grouped;
  EXPECT_NE(grouped.find("mean held"), std::string::npos) << grouped;
  EXPECT_NE(grouped.find("mean all"), std::string::npos) << grouped;
  EXPECT_NE(grouped.find("balanced is above 06-FGD of the expected file on 1 of 1 tuned-on traces"),
            std::string::npos)
      << grouped;
  EXPECT_NE(grouped.find("balanced is above 06-FGD of the expected file on 0 of 1 held-out traces"),
            std::string::npos)
      << grouped;
  // The full workload name works too; a trace the actual file lacks is an error naming it.
  EXPECT_TRUE(MakePolicyTable(expected, actual, 130, "06-FGD", {"openb_pod_list_default"}).ok());
  auto missing = MakePolicyTable(expected, actual, 130, "06-FGD", {"default", "gpushare80"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().ToString().find("'gpushare80'"), std::string::npos)
      << missing.status().ToString();
}

}  // namespace
}  // namespace gpupool
