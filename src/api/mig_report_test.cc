// The MIG layout agents report (api/mig_report.h): shape checks, hostile bodies refused with the
// field named, and a registration body's layouts taken out of its GPU entries.
#include "api/mig_report.h"

#include <gtest/gtest.h>

#include <string>

namespace gpupool {
namespace {

using nlohmann::json;

std::string ErrorOf(const json& j) {
  auto r = ParseMigInstances(j, "gpus[0].migInstances");
  return r.ok() ? "" : r.status().message();
}

TEST(MigReport, ParsesAndWritesBack) {
  const json j = json::parse(R"([{"profileId": 9, "start": 4}, {"start": 0, "profileId": 19}])");
  auto r = ParseMigInstances(j, "x");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, (std::vector<MigInstance>{{9, 4}, {19, 0}}));
  EXPECT_EQ(MigInstancesToJson(*r), json::parse(R"([{"profileId": 9, "start": 4}, {"profileId": 19, "start": 0}])"));
  EXPECT_TRUE(ParseMigInstances(json::array(), "x").ok());
}

TEST(MigReport, HostileListsAreRefusedNamingTheField) {
  EXPECT_EQ(ErrorOf(json::object()), "gpus[0].migInstances: must be a list");
  EXPECT_EQ(ErrorOf(json::parse("[1]")), "gpus[0].migInstances[0]: must be an object {profileId, start}");
  EXPECT_EQ(ErrorOf(json::parse(R"([{"profileId": 9}])")), "gpus[0].migInstances[0]: needs start");
  EXPECT_EQ(ErrorOf(json::parse(R"([{"profileId": "9", "start": 0}])")),
            "gpus[0].migInstances[0].profileId: must be an integer");
  EXPECT_EQ(ErrorOf(json::parse(R"([{"profileId": 9, "start": 8}])")),
            "gpus[0].migInstances[0].start: must be 0 to 7");
  EXPECT_EQ(ErrorOf(json::parse(R"([{"profileId": -1, "start": 0}])")),
            "gpus[0].migInstances[0].profileId: must be 0 to 1023");
  EXPECT_EQ(ErrorOf(json::parse(R"([{"profileId": 18446744073709551615, "start": 0}])")),
            "gpus[0].migInstances[0].profileId: must be 0 to 1023");
  EXPECT_EQ(ErrorOf(json::parse(R"([{"profileId": 9, "start": 1.5}])")),
            "gpus[0].migInstances[0].start: must be an integer");
  EXPECT_EQ(ErrorOf(json::parse(R"([{"profileId": 9, "start": 0, "uuid": "x"}])")),
            "gpus[0].migInstances[0].uuid: unknown field (known: profileId, start)");
  json many = json::array();
  for (int i = 0; i < 100000; ++i) many.push_back({{"profileId", 19}, {"start", 0}});
  EXPECT_EQ(ErrorOf(many), "gpus[0].migInstances: 100000 entries; a GPU has at most 8 MIG instances");
}

TEST(MigReport, RegistrationBodiesGiveUpTheirLayouts) {
  json body = json::parse(R"({"name": "n", "gpus": [
      {"model": "A100-80GB", "migEnabled": true, "migInstances": [{"profileId": 9, "start": 4}]},
      {"index": 1, "model": "A100-80GB"},
      {"index": 2, "model": "A100-80GB", "migEnabled": true, "migInstances": []}]})");
  auto r = TakeMigInstances(body);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].first, 0);
  EXPECT_EQ((*r)[0].second, (std::vector<MigInstance>{{9, 4}}));
  EXPECT_EQ((*r)[1].first, 2);
  EXPECT_TRUE((*r)[1].second.empty());
  for (const json& g : body["gpus"]) EXPECT_FALSE(g.contains("migInstances"));

  // A bad list: refused, and the body keeps every list (nothing half taken).
  json bad = json::parse(R"({"gpus": [{"migInstances": [{"profileId": 9, "start": 4}]},
                                       {"migInstances": [{"profileId": 9}]}]})");
  const json before = bad;
  auto e = TakeMigInstances(bad);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().message(), "gpus[1].migInstances[0]: needs start");
  EXPECT_EQ(bad, before);
  // Bodies without GPU lists have nothing to give.
  json odd = json::parse(R"({"gpus": 3})");
  EXPECT_TRUE(TakeMigInstances(odd).ok());
  json arr = json::array();
  EXPECT_TRUE(TakeMigInstances(arr).ok());
}

}  // namespace
}  // namespace gpupool
