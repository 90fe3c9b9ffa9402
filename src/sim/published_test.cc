// The published policies against the FGD paper's published runs. With the published arrival
// order and node tie-break ranks (../shared/traces/fgd-arrival-orders), each deterministic policy
// must end at exactly the published GPU allocation (column 130 of analysis_allo_discrete.csv:
// the mean, rounded half-to-even to 2 decimals, of the per-pod allocation ratios logged once
// arrived demand rounds to 130 % of capacity).
//
// Reads the shared traces folder beside the repository; skipped where it is absent.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "sched/scheduler.h"
#include "sched/typical_pods.h"
#include "sim/trace.h"

namespace gpupool {
namespace {

const std::string kTraces = std::string(GPUPOOL_SHARED_DIR) + "/traces/";

struct Published {
  std::map<std::string, double> col130;  // "<trace>,<policy>,<seed>" -> value
};

Published ReadPublished() {
  Published p;
  std::ifstream in(kTraces + "fgd-published-results/analysis_allo_discrete.csv");
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) f.push_back(cell);
    p.col130[f[0] + "," + f[1] + "," + f[3]] = std::stod(f.back());
  }
  return p;
}

double RunPublished(const std::string& trace, int seed, const std::string& policy) {
  const GpuCatalog catalog = GpuCatalog::Builtin();
  auto nodes = ReadOpenbNodes(kTraces + "alibaba-gpu-v2023/openb_node_list_gpu_node.csv", catalog);
  auto pods = ReadOpenbPods(kTraces + "alibaba-gpu-v2023/openb_pod_list_" + trace + ".csv");
  EXPECT_TRUE(nodes.ok() && pods.ok());
  std::map<std::string, TaskRequest> by_name;
  std::vector<TaskRequest> originals;
  for (const auto& p : *pods) {
    by_name[p.name] = p.request;
    originals.push_back(p.request);
  }
  const auto typical = ComputeTypicalPods(originals);
  const std::string prefix = kTraces + "fgd-arrival-orders/" + trace + "_" + std::to_string(seed);
  std::vector<const TaskRequest*> arrivals;
  std::ifstream pods_in(prefix + "_pods.txt");
  for (std::string name; std::getline(pods_in, name);) {
    const auto tuned = name.find("-tuned-");
    arrivals.push_back(&by_name.at(tuned == std::string::npos ? name : name.substr(0, tuned)));
  }
  std::map<std::string, uint32_t> rank;
  std::ifstream nodes_in(prefix + "_nodes.txt");
  std::string node;
  uint32_t r = 0;
  while (nodes_in >> node >> r) rank[node] = r;

  Ledger ledger(catalog);
  std::vector<uint32_t> ranks;
  for (const auto& n : *nodes) {
    ranks.push_back(rank.at(n.name));
    EXPECT_TRUE(ledger.AddNode(n).ok());
  }
  SeededRng rng(1);
  PluginInit init;
  init.typical_pods = &typical;
  auto s = Scheduler::Create(ProfileForPolicy(policy).value(), DefaultRegistry(), ledger, rng, init);
  EXPECT_TRUE(s.ok());
  EXPECT_TRUE((*s)->SetTieBreakRanks(ranks).ok());
  const double gpus = static_cast<double>(ledger.total_gpus());
  int64_t arrived = 0;
  double sum = 0;
  int rows = 0;
  for (const TaskRequest* t : arrivals) {
    arrived += t->total_gpu_share().units();
    (void)(*s)->Place(*t);
    if (std::nearbyint(static_cast<double>(arrived) / gpus / 10.0) == 130.0) {
      sum += std::nearbyint(static_cast<double>(ledger.used_gpu_share()) / gpus / 10.0 * 100.0) / 100.0;
      ++rows;
    }
  }
  EXPECT_GT(rows, 0);
  return std::nearbyint(sum / rows * 100.0) / 100.0;
}

TEST(PublishedRunsTest, DeterministicPoliciesEndAtThePublishedAllocation) {
  if (!std::filesystem::exists(kTraces + "fgd-arrival-orders/default_42_pods.txt")) {
    GTEST_SKIP() << "shared traces not found at " << kTraces;
  }
  const Published published = ReadPublished();
  const std::pair<const char*, const char*> policies[] = {{"dotprod", "02-DotProd"},
                                                          {"gpuclustering", "03-GpuClustering"},
                                                          {"gpupacking", "04-GpuPacking"},
                                                          {"bestfit", "05-BestFit"},
                                                          {"fgd", "06-FGD"}};
  const std::pair<const char*, int> runs[] = {{"default", 42}, {"cpu250", 43}};
  for (const auto& [trace, seed] : runs) {
    for (const auto& [ours, theirs] : policies) {
      const std::string key =
          std::string("openb_pod_list_") + trace + "," + theirs + "," + std::to_string(seed);
      ASSERT_TRUE(published.col130.count(key)) << key;
      EXPECT_DOUBLE_EQ(RunPublished(trace, seed, ours), published.col130.at(key))
          << trace << "/" << seed << "/" << ours;
    }
  }
}

}  // namespace
}  // namespace gpupool
