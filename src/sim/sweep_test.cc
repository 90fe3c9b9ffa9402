// The sweep: seed parsing, the published CSV layout, and a small real sweep against published rows.
#include "sim/sweep.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

namespace gpupool {
namespace {

const std::string kShared = std::string(GPUPOOL_SHARED_DIR);
const std::string kPublished = kShared + "/traces/fgd-published-results/";

std::string TempDir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("gpupool_sweep_test_" + name + "_" +
                    std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return line;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

DiscreteRow MakeRow(const std::string& trace, const std::string& policy, uint64_t seed, double base) {
  DiscreteRow r;
  r.workload = "openb_pod_list_" + trace;
  r.sc_policy = policy;
  r.tune = 1.3;
  r.seed = seed;
  r.total_gpus = 6212;
  for (int c = 0; c < kDemandBins; ++c) r.values[static_cast<size_t>(c)] = base + c * 0.01 + 0.1 / 3;
  return r;
}

TEST(ParseSeedsTest, RangesAndLists) {
  auto r = ParseSeeds("42-51");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, (std::vector<uint64_t>{42, 43, 44, 45, 46, 47, 48, 49, 50, 51}));
  EXPECT_EQ(*ParseSeeds("42,43"), (std::vector<uint64_t>{42, 43}));
  EXPECT_EQ(*ParseSeeds("7"), (std::vector<uint64_t>{7}));
  EXPECT_EQ(*ParseSeeds(" 42-44, 50 "), (std::vector<uint64_t>{42, 43, 44, 50}));
  EXPECT_EQ(*ParseSeeds("5-5"), (std::vector<uint64_t>{5}));
}

TEST(ParseSeedsTest, ClearErrors) {
  for (const char* bad : {"", "abc", "42-", "-5", "51-42", "42,,43", "42,42", "4x", "1.5", "42-43-44"}) {
    auto r = ParseSeeds(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("seeds"), std::string::npos) << r.status().message();
  }
  EXPECT_NE(ParseSeeds("51-42").status().message().find("ends before it starts"), std::string::npos);
  EXPECT_NE(ParseSeeds("42,42").status().message().find("twice"), std::string::npos);
}

TEST(PublishedNamesTest, PoliciesAndTraces) {
  EXPECT_EQ(PublishedPolicies().size(), 6u);
  EXPECT_EQ(PublishedTraces().size(), 17u);
  // The allocation bound is a pseudo-policy of the sweep, published under its own name.
  const auto known = SweepPolicyNames();
  EXPECT_NE(std::find(known.begin(), known.end(), "bound"), known.end());
  EXPECT_EQ(PublishedPolicyName("bound"), "bound");
}

// The bound's empty columns are NaN: written as Python writes them, and read back.
TEST(DiscreteCsvTest, NanCellsRoundTrip) {
  const std::string dir = TempDir("nan");
  DiscreteTable t;
  t.has_total_gpus = false;
  t.rows = {MakeRow("default", "bound", 42, 1)};
  t.rows[0].values.fill(std::nan(""));
  t.rows[0].values[130] = 99.5;
  const std::string path = dir + "/nan.csv";
  ASSERT_TRUE(WriteDiscreteCsv(t, path).ok());
  const std::string text = ReadAll(path);
  EXPECT_NE(text.find("openb_pod_list_default,bound,1.3,42,nan,nan,"), std::string::npos) << text;
  EXPECT_NE(text.find(",nan,99.5\n"), std::string::npos) << text;
  auto back = ReadDiscreteCsv(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->rows.size(), 1u);
  for (int c = 0; c < 130; ++c) EXPECT_TRUE(std::isnan(back->rows[0].values[static_cast<size_t>(c)])) << c;
  EXPECT_EQ(back->rows[0].values[130], 99.5);
  EXPECT_EQ(FormatDiscreteCsv(*back), text);
  std::filesystem::remove_all(dir);
}

TEST(DiscreteCsvTest, RoundTripIsExact) {
  const std::string dir = TempDir("roundtrip");
  for (bool with_total : {true, false}) {
    DiscreteTable t;
    t.has_total_gpus = with_total;
    t.rows = {MakeRow("default", "06-FGD", 43, 1), MakeRow("cpu050", "05-BestFit", 42, 2),
              MakeRow("default", "06-FGD", 42, 3)};
    t.rows[0].values[5] = 13.937500000000002;
    t.rows[1].values[130] = 2.0;
    SortDiscreteRows(t.rows);
    const std::string path = dir + (with_total ? "/a.csv" : "/b.csv");
    ASSERT_TRUE(WriteDiscreteCsv(t, path).ok());
    auto back = ReadDiscreteCsv(path);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->has_total_gpus, with_total);
    ASSERT_EQ(back->rows.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(back->rows[i].workload, t.rows[i].workload);
      EXPECT_EQ(back->rows[i].sc_policy, t.rows[i].sc_policy);
      EXPECT_EQ(back->rows[i].seed, t.rows[i].seed);
      EXPECT_EQ(back->rows[i].tune, 1.3);
      if (with_total) {
        EXPECT_EQ(back->rows[i].total_gpus, 6212);
      }
      EXPECT_EQ(back->rows[i].values, t.rows[i].values);
    }
    EXPECT_EQ(back->rows[0].workload, "openb_pod_list_cpu050");  // sorted by workload
    EXPECT_EQ(back->rows[1].seed, 42u);                          // then by seed
    // Writing what was read gives the same bytes.
    EXPECT_EQ(FormatDiscreteCsv(*back), ReadAll(path));
    const std::string text = ReadAll(path);
    EXPECT_NE(text.find("openb_pod_list_cpu050,05-BestFit,1.3,42,"), std::string::npos);
    EXPECT_NE(text.find(",13.937500000000002,"), std::string::npos);
    EXPECT_NE(text.find(",2.0\n"), std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

TEST(DiscreteCsvTest, ErrorsNameFileAndLine) {
  const std::string dir = TempDir("errors");
  DiscreteTable t;
  t.has_total_gpus = true;
  t.rows = {MakeRow("default", "06-FGD", 42, 1), MakeRow("default", "06-FGD", 43, 1)};
  std::string text = FormatDiscreteCsv(t);
  const std::string good = dir + "/good.csv";
  WriteFile(good, text);
  ASSERT_TRUE(ReadDiscreteCsv(good).ok());

  // A bad number on line 3.
  std::string bad_cell = text;
  const auto pos = bad_cell.rfind(",1.");
  bad_cell.replace(pos, 3, ",x.");
  WriteFile(dir + "/cell.csv", bad_cell);
  auto r = ReadDiscreteCsv(dir + "/cell.csv");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cell.csv:3:"), std::string::npos) << r.status().message();

  // A short row on line 2.
  WriteFile(dir + "/short.csv",
            text.substr(0, text.find('\n') + 1) + "openb_pod_list_default,06-FGD,1.3,42,6212,1.0\n");
  r = ReadDiscreteCsv(dir + "/short.csv");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("short.csv:2:"), std::string::npos) << r.status().message();

  // A duplicate row on line 3.
  const std::string header = text.substr(0, text.find('\n') + 1);
  const std::string line2 = text.substr(header.size(), text.find('\n', header.size()) - header.size() + 1);
  WriteFile(dir + "/dup.csv", header + line2 + line2);
  r = ReadDiscreteCsv(dir + "/dup.csv");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("dup.csv:3: duplicate"), std::string::npos) << r.status().message();

  // A wrong header.
  WriteFile(dir + "/header.csv", "workload,policy,seed\n");
  r = ReadDiscreteCsv(dir + "/header.csv");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("header.csv:1:"), std::string::npos) << r.status().message();

  r = ReadDiscreteCsv(dir + "/missing.csv");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);
  std::filesystem::remove_all(dir);
}

TEST(DiscreteCsvTest, HeadersEqualThePublishedFiles) {
  if (!std::filesystem::exists(kPublished + "analysis_allo_discrete.csv")) {
    GTEST_SKIP() << "published results not found at " << kPublished;
  }
  for (const auto& [file, with_total] :
       std::vector<std::pair<std::string, bool>>{{"analysis_allo_discrete.csv", true},
                                                 {"analysis_frag_discrete.csv", false},
                                                 {"analysis_frag_ratio_discrete.csv", false}}) {
    DiscreteTable t;
    t.has_total_gpus = with_total;
    const std::string ours = FormatDiscreteCsv(t);
    EXPECT_EQ(ours.substr(0, ours.size() - 1), FirstLine(kPublished + file)) << file;
    // The published file reads, and writing it back gives the same bytes (layout, order, number format).
    auto table = ReadDiscreteCsv(kPublished + file);
    ASSERT_TRUE(table.ok()) << table.status().ToString();
    EXPECT_EQ(table->has_total_gpus, with_total);
    EXPECT_EQ(table->rows.size(), 1020u);
    auto sorted = table->rows;
    SortDiscreteRows(sorted);
    for (size_t i = 0; i < sorted.size(); ++i) {
      ASSERT_EQ(sorted[i].workload, table->rows[i].workload) << i;
      ASSERT_EQ(sorted[i].sc_policy, table->rows[i].sc_policy) << i;
      ASSERT_EQ(sorted[i].seed, table->rows[i].seed) << i;
    }
    EXPECT_EQ(FormatDiscreteCsv(*table), ReadAll(kPublished + file)) << file;
  }
}

TEST(SweepTest, RejectsBadOptions) {
  SweepOptions o;
  o.traces_dir = "/nonexistent";
  o.policies = {"nosuch"};
  auto r = RunSweep(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("unknown policy 'nosuch'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("balanced"), std::string::npos) << r.status().message();
  o.policies = {"fgd", "fgd"};
  r = RunSweep(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("fgd"), std::string::npos) << r.status().message();
  o.policies = {"fgd"};
  o.seeds = {};
  EXPECT_FALSE(RunSweep(o).ok());
  o.seeds = {42};
  o.traces = {"default"};
  r = RunSweep(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("default"), std::string::npos) << r.status().message();
}

TEST(SweepTest, FailingExperimentFailsTheSweep) {
  const std::string traces = kShared + "/traces/alibaba-gpu-v2023";
  if (!std::filesystem::exists(traces + "/openb_pod_list_default.csv")) GTEST_SKIP() << "no shared traces";
  SweepOptions o;
  o.traces_dir = traces;
  o.traces = {"default"};
  o.policies = {"fgd"};
  o.seeds = {42, 999};  // no published arrival order for seed 999
  o.arrival_order_dir = kShared + "/traces/fgd-arrival-orders";
  o.jobs = 2;
  auto r = RunSweep(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("seed=999"), std::string::npos) << r.status().message();
}

TEST(SweepTest, SmallSweepMatchesPublishedRows) {
  const std::string traces = kShared + "/traces/alibaba-gpu-v2023";
  if (!std::filesystem::exists(traces + "/openb_pod_list_default.csv") ||
      !std::filesystem::exists(kPublished + "analysis_allo_discrete.csv")) {
    GTEST_SKIP() << "no shared traces";
  }
  const std::string out = TempDir("small");
  SweepOptions o;
  o.traces_dir = traces;
  o.traces = {"default"};
  o.policies = {"fgd", "bestfit"};
  o.seeds = {42};
  o.arrival_order_dir = kShared + "/traces/fgd-arrival-orders";
  o.out_dir = out;
  o.jobs = 2;
  int calls = 0;
  int last_done = 0;
  auto r = RunSweep(o, [&](const SweepProgress& p) {
    ++calls;
    EXPECT_EQ(p.total, 2);
    EXPECT_EQ(p.done, last_done + 1);
    last_done = p.done;
    ASSERT_NE(p.last, nullptr);
  });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(calls, 2);
  ASSERT_EQ(r->results.size(), 2u);
  EXPECT_EQ(r->results[0].policy, "bestfit");  // sorted

  auto ours = ReadDiscreteCsv(out + "/analysis_allo_discrete.csv");
  ASSERT_TRUE(ours.ok()) << ours.status().ToString();
  ASSERT_EQ(ours->rows.size(), 2u);
  EXPECT_EQ(ours->rows[0].sc_policy, "05-BestFit");
  EXPECT_EQ(ours->rows[1].sc_policy, "06-FGD");
  auto published = ReadDiscreteCsv(kPublished + "analysis_allo_discrete.csv");
  ASSERT_TRUE(published.ok());
  int matched = 0;
  for (const DiscreteRow& mine : ours->rows) {
    for (const DiscreteRow& theirs : published->rows) {
      if (theirs.workload != mine.workload || theirs.sc_policy != mine.sc_policy || theirs.seed != mine.seed)
        continue;
      ++matched;
      EXPECT_EQ(mine.total_gpus, theirs.total_gpus);
      EXPECT_EQ(mine.tune, theirs.tune);
      for (size_t c = 0; c < kDemandBins; ++c) {
        EXPECT_EQ(mine.values[c], theirs.values[c]) << mine.sc_policy << " column " << c;
      }
    }
  }
  EXPECT_EQ(matched, 2);
  EXPECT_EQ(FirstLine(out + "/analysis_allo_discrete.csv"),
            FirstLine(kPublished + "analysis_allo_discrete.csv"));
  EXPECT_EQ(FirstLine(out + "/analysis_frag_discrete.csv"),
            FirstLine(kPublished + "analysis_frag_discrete.csv"));
  EXPECT_EQ(FirstLine(out + "/analysis_frag_ratio_discrete.csv"),
            FirstLine(kPublished + "analysis_frag_ratio_discrete.csv"));
  auto frag = ReadDiscreteCsv(out + "/analysis_frag_ratio_discrete.csv");
  ASSERT_TRUE(frag.ok()) << frag.status().ToString();
  EXPECT_EQ(frag->rows.size(), 2u);
  // One worker writes the same bytes.
  const std::string out1 = TempDir("small_jobs1");
  o.out_dir = out1;
  o.jobs = 1;
  ASSERT_TRUE(RunSweep(o).ok());
  for (const char* f :
       {"/analysis_allo_discrete.csv", "/analysis_frag_discrete.csv", "/analysis_frag_ratio_discrete.csv"}) {
    EXPECT_EQ(ReadAll(out1 + f), ReadAll(out + f)) << f;
  }
  std::filesystem::remove_all(out);
  std::filesystem::remove_all(out1);
}

}  // namespace
}  // namespace gpupool
