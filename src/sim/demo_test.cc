#include "sim/demo.h"

#include <gtest/gtest.h>

#include <sstream>

namespace gpupool {
namespace {

// The README's demo on the bundled cluster: every pod is either placed or explained, and FGD
// strands fewer GPUs than BestFit on the same arrivals (the ordering the FGD paper reports).
TEST(DemoTest, RunsTheBundledClusterAndExplainsFailures) {
  DemoOptions o;
  o.nodes_csv = std::string(GPUPOOL_DATA_DIR) + "/alibaba/openb_node_list_gpu_node.csv";
  o.pods_csv = std::string(GPUPOOL_DATA_DIR) + "/alibaba/openb_pod_list_default.csv";
  o.policies = {"bestfit", "fgd"};
  auto results = RunDemo(o);
  ASSERT_TRUE(results.ok()) << results.status().ToString();
  ASSERT_EQ(results->size(), 2u);
  const auto& bestfit = (*results)[0];
  const auto& fgd = (*results)[1];
  for (const auto& r : *results) {
    EXPECT_EQ(r.placed + r.failed, r.pods);
    EXPECT_GT(r.failed, 0);  // demand is 130% of capacity
    EXPECT_NE(r.first_failure.find("nodes fit:"), std::string::npos) << r.first_failure;
    EXPECT_GT(r.gpu_alloc_percent, 85.0);
    EXPECT_LE(r.gpu_alloc_percent, 100.0);
  }
  EXPECT_GT(fgd.gpu_alloc_percent, bestfit.gpu_alloc_percent);
  EXPECT_LT(fgd.frag_percent, bestfit.frag_percent);

  std::ostringstream out;
  PrintDemo(o, *results, out);
  EXPECT_NE(out.str().find("fgd"), std::string::npos);
  EXPECT_NE(out.str().find("GPU alloc %"), std::string::npos);
}

TEST(DemoTest, BadInputsAreErrors) {
  DemoOptions o;
  o.nodes_csv = "/nonexistent/nodes.csv";
  o.pods_csv = "/nonexistent/pods.csv";
  auto r = RunDemo(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/nonexistent/nodes.csv"), std::string::npos);
}

}  // namespace
}  // namespace gpupool
