// `gpupool run`'s pure parts: the spec a command line makes, and the exit code a finished job gives.
#include "cli/run_command.h"

#include <gtest/gtest.h>

namespace gpupool {
namespace {

using Json = nlohmann::ordered_json;

Json Spec(const RunOptions& o) {
  auto s = RunSpecJson(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? Json::parse(*s) : Json();
}

TEST(RunSpec, ACommandLineBecomesAOneTaskJob) {
  RunOptions o;
  o.command = {"/usr/bin/python3", "train.py", "--epochs", "3"};
  o.gpu = "0.25";
  o.env = {"A=1", "B=x=y"};
  o.queue = "vision";
  o.priority = 5;
  const Json j = Spec(o);
  EXPECT_EQ(j["name"], "python3");
  EXPECT_EQ(j["queue"], "vision");
  EXPECT_EQ(j["priority"], 5);
  const Json& t = j["tasks"][0];
  EXPECT_EQ(t["command"], Json({"/usr/bin/python3", "train.py", "--epochs", "3"}));
  EXPECT_EQ(t["resources"]["gpu"], 0.25);
  EXPECT_EQ(t["resources"]["cpu"], "1");
  EXPECT_EQ(t["env"]["B"], "x=y");
  o.gpu = "2";
  EXPECT_TRUE(Spec(o)["tasks"][0]["resources"]["gpu"].is_number_integer());
}

TEST(RunSpec, NamesAreMadeValidAndBadFlagsAreNamed) {
  RunOptions o;
  o.command = {"./My_Script.SH"};
  EXPECT_EQ(Spec(o)["name"], "my-script-sh");
  o.command = {"/opt/7zip"};
  EXPECT_EQ(Spec(o)["name"], "run-7zip");
  o.command = {"___"};
  EXPECT_EQ(Spec(o)["name"], "run");
  o.command = {std::string(300, 'a')};
  EXPECT_LE(Spec(o)["name"].get<std::string>().size(), 63u);
  for (const char* gpu : {"lots", "-1", "0", "1e9", "0.5x", ""}) {
    RunOptions bad;
    bad.command = {"true"};
    bad.gpu = gpu;
    if (bad.gpu.empty()) continue;
    auto s = RunSpecJson(bad);
    ASSERT_FALSE(s.ok()) << gpu;
    EXPECT_NE(s.status().message().find("--gpu"), std::string::npos);
  }
  RunOptions env;
  env.command = {"true"};
  env.env = {"=x"};
  EXPECT_NE(RunSpecJson(env).status().message().find("--env"), std::string::npos);
  EXPECT_FALSE(RunSpecJson(RunOptions{}).ok());  // no command
}

TEST(RunExit, TheTasksCodeOrItsSignal) {
  EXPECT_EQ(RunExitCode(Json::parse(R"({"state": "succeeded", "tasks": [{"state": "succeeded"}]})")), 0);
  EXPECT_EQ(RunExitCode(Json::parse(R"({"state": "failed", "tasks": [{"state": "failed", "exitCode": 3}]})")), 3);
  EXPECT_EQ(RunExitCode(Json::parse(
                R"({"state": "failed", "tasks": [{"state": "failed", "exitCode": 0, "message": "killed by SIGKILL after the grace period"}]})")),
            137);
  EXPECT_EQ(RunExitCode(Json::parse(R"({"state": "failed", "tasks": [{"state": "failed", "exitCode": 0}]})")), 1);
  EXPECT_EQ(RunExitCode(Json::parse(R"({"state": "failed", "tasks": [{"state": "preempted"}]})")), 1);
  EXPECT_EQ(RunExitCode(Json::parse(R"({"state": "cancelled", "tasks": []})")), 1);
  EXPECT_EQ(RunExitCode(Json::parse(R"({"state": "failed", "tasks": [{"state": "failed", "exitCode": 9999}]})")), 255);
  EXPECT_EQ(RunExitCode(Json::parse(R"({"state": "failed", "tasks": "garbage"})")), 1);
}

}  // namespace
}  // namespace gpupool
