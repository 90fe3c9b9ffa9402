// Whole agents with mps tasks on real (fake NVML) GPUs, against the fake nvidia-cuda-mps-control of
// tests/fake_mps: each GPU gets its daemon, simulated GPUs do not, and the MPS server of the task's
// uid holds the task to its share whatever the task does to its environment (the fake MPS client
// mps-client-limits reports what the daemon holds it to).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "agent/mps_test_util.h"

namespace gpupool {
namespace {

namespace fs = std::filesystem;
using mps_test::AgentMpsTest;
using mps_test::Alive;
using mps_test::FakeServer;
using mps_test::Lines;
using mps_test::MpsAssignment;
using mps_test::Slurp;
using mps_test::WaitFor;
using nlohmann::json;

TEST_F(AgentMpsTest, MpsTaskOnRealGpusRunsWithItsGpusDaemonWhichStopsAfterIt) {
  // The task records its MPS directories and runs until told to finish.
  const std::string script = fmt::format(
      "echo \"$CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY\" > {0}/task-env.tmp; "
      "mv {0}/task-env.tmp {0}/task-env; "  // appears whole: the test reads it as soon as it exists
      "n=0; while [ ! -e {0}/finish ] && [ $n -lt 400 ]; do sleep 0.05; n=$((n+1)); done",
      out_);
  FakeServer server(MpsAssignment(script));
  Agent* agent = CreateAgent(AgentOpts(server, FAKE_MPS_CONTROL));
  ASSERT_NE(agent, nullptr);
  ASSERT_FALSE(agent->inventory().simulated) << agent->summary();
  const std::string uuid = agent->inventory().gpus.at(1).uuid;
  ASSERT_TRUE(agent->Start(std::chrono::seconds(5)).ok());

  ASSERT_TRUE(WaitFor([&] { return fs::exists(out_ + "/task-env"); }, std::chrono::seconds(10)));
  // One daemon, for GPU 1 only, in the very directories the task was pointed at.
  ASSERT_EQ(Lines(AgentPipe(uuid) + "/starts").size(), 1u);
  const pid_t daemon = static_cast<pid_t>(std::atol(Lines(AgentPipe(uuid) + "/starts")[0].c_str()));
  EXPECT_TRUE(Alive(daemon));
  EXPECT_EQ(Slurp(AgentPipe(uuid) + "/env"),
            fmt::format("CUDA_VISIBLE_DEVICES={0}\nCUDA_MPS_PIPE_DIRECTORY={1}/mps/{0}/pipe\n"
                        "CUDA_MPS_LOG_DIRECTORY={1}/mps/{0}/log\n",
                        uuid, root_));
  EXPECT_EQ(Slurp(out_ + "/task-env"), fmt::format("{0}/mps/{1}/pipe {0}/mps/{1}/log\n", root_, uuid));
  EXPECT_FALSE(fs::exists(AgentPipe(agent->inventory().gpus.at(0).uuid)));
  EXPECT_NE(agent->MetricsText().find("gpupool_agent_mps_daemons{node=\"mps-node\"} 1\n"), std::string::npos);

  std::ofstream(out_ + "/finish") << "\n";
  ASSERT_TRUE(WaitFor([&] { return server.Reported("succeeded"); }, std::chrono::seconds(10)))
      << server.FinalStatus().dump();
  EXPECT_TRUE(WaitFor([&] { return !Alive(daemon); }));
  EXPECT_TRUE(Contains(Lines(AgentPipe(uuid) + "/commands"), "quit"));
  EXPECT_FALSE(fs::exists(AgentPipe(uuid) + "/control"));
  EXPECT_NE(agent->MetricsText().find("gpupool_agent_mps_daemons{node=\"mps-node\"} 0\n"), std::string::npos);
  agent->Stop(true);
}

TEST_F(AgentMpsTest, AgentStopWithTasksStopsTheDaemons) {
  FakeServer server(MpsAssignment("sleep 30"));
  Agent* agent = CreateAgent(AgentOpts(server, FAKE_MPS_CONTROL));
  ASSERT_NE(agent, nullptr);
  const std::string uuid = agent->inventory().gpus.at(1).uuid;
  ASSERT_TRUE(agent->Start(std::chrono::seconds(5)).ok());
  ASSERT_TRUE(WaitFor([&] { return server.Reported("running"); }, std::chrono::seconds(10)));
  const auto starts = Lines(AgentPipe(uuid) + "/starts");
  ASSERT_EQ(starts.size(), 1u);
  const pid_t daemon = static_cast<pid_t>(std::atol(starts[0].c_str()));
  ASSERT_TRUE(Alive(daemon));
  agent->Stop(true);
  EXPECT_TRUE(WaitFor([&] { return !Alive(daemon); }));
  EXPECT_TRUE(Contains(Lines(AgentPipe(uuid) + "/commands"), "quit"));
}

TEST_F(AgentMpsTest, MissingControlProgramFailsTheMpsTaskClearly) {
  FakeServer server(MpsAssignment("echo ran > " + root_ + "/ran"));
  Agent* agent = CreateAgent(AgentOpts(server, root_ + "/not-installed/nvidia-cuda-mps-control"));
  ASSERT_NE(agent, nullptr);
  ASSERT_TRUE(agent->Start(std::chrono::seconds(5)).ok());
  ASSERT_TRUE(WaitFor([&] { return !server.FinalStatus().is_null(); }, std::chrono::seconds(10)));
  const json st = server.FinalStatus();
  EXPECT_EQ(st["state"], "failed");
  const std::string message = st.value("message", "");
  EXPECT_NE(message.find("MPS isolation requested"), std::string::npos) << message;
  EXPECT_NE(message.find("nvidia-cuda-mps-control"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(root_ + "/ran"));
  agent->Stop(true);
}

TEST_F(AgentMpsTest, SimulatedGpusGetTheVariablesButNoDaemon) {
  FakeServer server(MpsAssignment("echo \"$CUDA_MPS_PIPE_DIRECTORY\" > " + out_ + "/task-env"));
  AgentOptions o = AgentOpts(server, FAKE_MPS_CONTROL);
  o.simulate = "4xA100-80GB";
  Agent* agent = CreateAgent(o);
  ASSERT_NE(agent, nullptr);
  ASSERT_TRUE(agent->inventory().simulated);
  const std::string uuid = agent->inventory().gpus.at(1).uuid;
  ASSERT_TRUE(agent->Start(std::chrono::seconds(5)).ok());
  ASSERT_TRUE(WaitFor([&] { return server.Reported("succeeded"); }, std::chrono::seconds(10)))
      << server.FinalStatus().dump();
  EXPECT_EQ(Slurp(out_ + "/task-env"), fmt::format("{}/mps/{}/pipe\n", root_, uuid));
  EXPECT_FALSE(fs::exists(AgentPipe(uuid) + "/starts"));
  agent->Stop(true);
}

// What a quarter-GPU task that unsets its MPS variables is held to: the task's fake MPS client asks
// the fake daemon what the server of its uid allows, and writes it to `out`/limits.
std::string UnsetAndAskScript(const std::string& out) {
  return fmt::format(
      "env -u CUDA_MPS_ACTIVE_THREAD_PERCENTAGE -u CUDA_MPS_PINNED_DEVICE_MEM_LIMIT /bin/sh -c "
      "'echo "
      "\"vars=${{CUDA_MPS_ACTIVE_THREAD_PERCENTAGE-unset}},${{CUDA_MPS_PINNED_DEVICE_MEM_LIMIT-unset}}\"; "
      "exec {1}' > {0}/limits.tmp 2>&1; mv {0}/limits.tmp {0}/limits",
      out, FAKE_MPS_CLIENT);
}

TEST_F(AgentMpsTest, AQuarterGpuTaskThatUnsetsItsMpsVariablesIsStillHeldByItsServer) {
  FakeServer server(MpsAssignment(UnsetAndAskScript(out_), 250, "20Gi"));
  Agent* agent = CreateAgent(AgentOpts(server, FAKE_MPS_CONTROL));
  ASSERT_NE(agent, nullptr);
  const std::string uuid = agent->inventory().gpus.at(1).uuid;
  ASSERT_TRUE(agent->Start(std::chrono::seconds(5)).ok());
  ASSERT_TRUE(WaitFor([&] { return server.Reported("succeeded"); }, std::chrono::seconds(10)))
      << server.FinalStatus().dump();
  // Its variables were gone, and still its server allows it a quarter of the GPU and its 20 GiB.
  EXPECT_EQ(Slurp(out_ + "/limits"), "vars=unset,unset\nthreads=25 pinned=20480M\n");
  // The server of the uid the task ran as (nobody in the sandbox), set through the GPU's daemon.
  const auto commands = Lines(AgentPipe(uuid) + "/commands");
  EXPECT_TRUE(Contains(commands, fmt::format("start_server -uid {}", DefaultTaskUid())));
  auto set = [&](const std::string& command, const std::string& value) {
    return std::any_of(commands.begin(), commands.end(), [&](const std::string& c) {
      return c.rfind(command + " ", 0) == 0 && c.size() > value.size() &&
             c.compare(c.size() - value.size() - 1, std::string::npos, " " + value) == 0;
    });
  };
  EXPECT_TRUE(set("set_active_thread_percentage", "25"));
  EXPECT_TRUE(set("set_device_pinned_mem_limit", "0 20480M"));
  agent->Stop(true);
}

TEST_F(AgentMpsTest, LimitsTheDaemonDoesNotTakeFailTheTaskBeforeItRuns) {
  FakeServer server(MpsAssignment("echo ran > " + out_ + "/ran", 250, "20Gi"));
  Agent* agent = CreateAgent(AgentOpts(server, FAKE_MPS_CONTROL));
  ASSERT_NE(agent, nullptr);
  const std::string uuid = agent->inventory().gpus.at(1).uuid;
  // The daemon will answer every set with success and change nothing.
  fs::create_directories(AgentPipe(uuid));
  std::ofstream(AgentPipe(uuid) + "/fail-set").flush();
  ASSERT_TRUE(agent->Start(std::chrono::seconds(5)).ok());
  ASSERT_TRUE(WaitFor([&] { return !server.FinalStatus().is_null(); }, std::chrono::seconds(10)));
  const json st = server.FinalStatus();
  EXPECT_EQ(st["state"], "failed");
  const std::string message = st.value("message", "");
  EXPECT_NE(message.find(fmt::format("MPS server limits for uid {} on GPU {}", DefaultTaskUid(), uuid)),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(" 25' did not take effect"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(out_ + "/ran"));
  // Its daemon had no other user: it is gone again.
  EXPECT_TRUE(WaitFor([&] { return !fs::exists(AgentPipe(uuid) + "/control"); }));
  agent->Stop(true);
}

}  // namespace
}  // namespace gpupool
