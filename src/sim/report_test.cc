// The HTML report: one SVG per chart, policy names, escaping.
#include "sim/report.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace gpupool {
namespace {

size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++n;
  return n;
}

DiscreteRow Row(const std::string& workload, const std::string& policy, uint64_t seed, double scale) {
  DiscreteRow r;
  r.workload = workload;
  r.sc_policy = policy;
  r.seed = seed;
  r.total_gpus = 10;
  for (int c = 0; c < kDemandBins; ++c) r.values[static_cast<size_t>(c)] = std::min(100.0, c * scale);
  return r;
}

TEST(ReportTest, OneSvgPerChartWithPolicies) {
  DiscreteTable alloc, frag;
  alloc.has_total_gpus = true;
  for (const char* w : {"openb_pod_list_default", "openb_pod_list_cpu050"}) {
    for (const char* p : {"05-BestFit", "06-FGD"}) {
      alloc.rows.push_back(Row(w, p, 42, 0.8));
      alloc.rows.push_back(Row(w, p, 43, 0.7));
      frag.rows.push_back(Row(w, p, 42, 0.1));
    }
  }
  auto html = RenderReportHtml(alloc, frag);
  ASSERT_TRUE(html.ok()) << html.status().ToString();
  EXPECT_EQ(Count(*html, "<svg"), 4u);
  EXPECT_EQ(Count(*html, "</svg>"), 4u);
  EXPECT_EQ(Count(*html, "<polyline"), 8u);
  EXPECT_NE(html->find("05-BestFit"), std::string::npos);
  EXPECT_NE(html->find("06-FGD"), std::string::npos);
  EXPECT_NE(html->find("Trace default"), std::string::npos);
  EXPECT_NE(html->find("Trace cpu050"), std::string::npos);
  EXPECT_NE(html->find("GPU allocation"), std::string::npos);
  EXPECT_NE(html->find("fragmentation"), std::string::npos);
  EXPECT_EQ(html->find("<script"), std::string::npos);
  EXPECT_EQ(html->find("http://www.w3.org/2000/svg"), html->find("http"));  // no external assets
  EXPECT_EQ(html->find("<!DOCTYPE html>"), 0u);

  // Restricting to one trace, by short or full name.
  for (const char* t : {"default", "openb_pod_list_default"}) {
    auto one = RenderReportHtml(alloc, frag, t);
    ASSERT_TRUE(one.ok());
    EXPECT_EQ(Count(*one, "<svg"), 2u);
    EXPECT_EQ(one->find("cpu050"), std::string::npos);
  }
  auto none = RenderReportHtml(alloc, frag, "nosuch");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("nosuch"), std::string::npos);
  EXPECT_FALSE(RenderReportHtml(DiscreteTable{}, DiscreteTable{}).ok());
}

TEST(ReportTest, EscapesText) {
  EXPECT_EQ(HtmlEscape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
  DiscreteTable alloc, frag;
  alloc.rows.push_back(Row("openb_pod_list_x<y&z", "06-<FGD>", 42, 0.5));
  frag.rows.push_back(Row("openb_pod_list_x<y&z", "06-<FGD>", 42, 0.1));
  auto html = RenderReportHtml(alloc, frag);
  ASSERT_TRUE(html.ok());
  EXPECT_EQ(html->find("x<y"), std::string::npos);
  EXPECT_EQ(html->find("<FGD>"), std::string::npos);
  EXPECT_NE(html->find("x&lt;y&amp;z"), std::string::npos);
  EXPECT_NE(html->find("06-&lt;FGD&gt;"), std::string::npos);
}

TEST(ReportTest, WritesFile) {
  DiscreteTable alloc, frag;
  alloc.rows.push_back(Row("openb_pod_list_default", "06-FGD", 42, 0.5));
  const auto path = (std::filesystem::temp_directory_path() / "gpupool_report_test.html").string();
  ASSERT_TRUE(WriteReportHtml(alloc, frag, "", path).ok());
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(Count(text, "<svg"), 2u);
  EXPECT_NE(text.find("no data"), std::string::npos);  // frag chart without rows
  std::filesystem::remove(path);
  EXPECT_FALSE(WriteReportHtml(alloc, frag, "", "/nonexistent/dir/x.html").ok());
}

}  // namespace
}  // namespace gpupool
