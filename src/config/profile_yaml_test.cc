#include "config/profile_yaml.h"

#include <gtest/gtest.h>

#include "model/ledger.h"
#include "sched/registry.h"
#include "sched/scheduler.h"

namespace gpupool {
namespace {

TEST(ProfileYamlTest, ParsesEveryField) {
  auto p = ParseProfileYaml(R"(
name: fgd-topology
filters: [node-unschedulable, node-resources, gpu-model, gpu-fit]
scores:
  - {name: fgd, weight: 2}
  - topology
  - name: binpack
    args: {cpu: 1, memory: 0, gpu: 3}
gpuSelector: fgd
permits: [gang]
skipScoringSingleNode: false
cacheScores: false
)");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->name, "fgd-topology");
  ASSERT_EQ(p->filters.size(), 4u);
  EXPECT_EQ(p->filters[3].name, "gpu-fit");
  ASSERT_EQ(p->scores.size(), 3u);
  EXPECT_EQ(p->scores[0].name, "fgd");
  EXPECT_EQ(p->scores[0].weight, 2);
  EXPECT_EQ(p->scores[1].name, "topology");
  EXPECT_EQ(p->scores[1].weight, 1);
  ASSERT_NE(p->scores[2].args.Find("gpu"), nullptr);
  EXPECT_EQ(*p->scores[2].args.Find("gpu")->AsInt("gpu"), 3);
  EXPECT_EQ(p->gpu_selector.name, "fgd");
  ASSERT_EQ(p->permits.size(), 1u);
  EXPECT_FALSE(p->skip_scoring_single_node);
  EXPECT_FALSE(p->cache_scores);
}

TEST(ProfileYamlTest, ErrorsNameTheProblem) {
  struct Case {
    const char* yaml;
    const char* expect;
  };
  const Case cases[] = {
      {"name: x\nscorse: []\n", "unknown key 'scorse'"},
      {"scores:\n  - {name: fgd, weight: 0}\n", "scores[0].weight must be at least 1"},
      {"scores:\n  - {weight: 2}\n", "scores[0] has no 'name'"},
      {"scores: fgd\n", "scores must be a list"},
      {"scores:\n  - {name: fgd, wieght: 2}\n", "unknown key 'wieght'"},
      {"- a\n- b\n", "a profile must be a YAML map"},
      {"name: [unclosed\n", "line"},
      {"skipScoringSingleNode: maybe\n", "must be true or false"},
  };
  for (const auto& c : cases) {
    auto p = ParseProfileYaml(c.yaml, "test.yaml");
    ASSERT_FALSE(p.ok()) << c.yaml;
    EXPECT_NE(p.status().message().find(c.expect), std::string::npos) << p.status().message();
    EXPECT_NE(p.status().message().find("test.yaml"), std::string::npos) << p.status().message();
  }
}

// A parsed profile builds a working scheduler; plugin argument errors surface when building.
TEST(ProfileYamlTest, BuildsAScheduler) {
  Ledger ledger;
  ASSERT_TRUE(ledger.AddNode(MakeNode("a", MilliCpu(8000), MiB(8192), 2, "T4", ledger.catalog())).ok());
  SeededRng rng(1);
  auto good = ParseProfileYaml("scores:\n  - {name: binpack, args: {gpu: 3, memory: 0}}\n");
  ASSERT_TRUE(good.ok());
  auto s = Scheduler::Create(*good, DefaultRegistry(), ledger, rng);
  ASSERT_TRUE(s.ok()) << s.status().ToString();

  auto bad = ParseProfileYaml("scores:\n  - {name: binpack, args: {gpus: 3}}\n");
  ASSERT_TRUE(bad.ok());
  auto t = Scheduler::Create(*bad, DefaultRegistry(), ledger, rng);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("unknown resource 'gpus'"), std::string::npos) << t.status().message();

  auto fgd = ParseProfileYaml(R"(
scores: [fgd]
gpuSelector: fgd
)");
  ASSERT_TRUE(fgd.ok());
  fgd->scores[0].args.Set(
      "typicalPods",
      Value(Value::List{Value(Value::Map{
          {"cpu", Value(1000)}, {"gpuShare", Value(500)}, {"gpuCount", Value(1)}, {"weight", Value(1.0)}})}));
  auto u = Scheduler::Create(*fgd, DefaultRegistry(), ledger, rng);
  ASSERT_TRUE(u.ok()) << u.status().ToString();
}

TEST(ProfileYamlTest, MissingFileIsAnIoError) {
  auto p = LoadProfileFile("/nonexistent/profile.yaml");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kIoError);
}

}  // namespace
}  // namespace gpupool
