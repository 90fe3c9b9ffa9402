// MPS control daemons and the limits of their servers, against the fake nvidia-cuda-mps-control of
// tests/fake_mps: real processes, real FIFOs; every check looks at what the fake daemon recorded or
// at the process table. The parsers of the daemon's replies are tested on their own at the end.
#include "agent/mps.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "agent/mps_control.h"
#include "agent/mps_test_util.h"

namespace gpupool {
namespace {

namespace fs = std::filesystem;
using mps_test::Alive;
using mps_test::IsFifo;
using mps_test::Lines;
using mps_test::MpsTest;
using mps_test::ServerState;
using mps_test::Slurp;
using mps_test::WaitFor;

TEST_F(MpsTest, EnsureStartsOneDaemonPerGpuWithItsOwnEnvironment) {
  MpsDaemons mps(Options());
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-1.0").ok());
  ASSERT_TRUE(mps.Ensure("GPU-bbbb", "j-2.0").ok());

  for (const std::string uuid : {"GPU-aaaa", "GPU-bbbb"}) {
    SCOPED_TRACE(uuid);
    ASSERT_EQ(Starts(uuid).size(), 1u);
    const pid_t pid = LastStartedPid(uuid);
    EXPECT_TRUE(Alive(pid));
    EXPECT_EQ(DaemonPid(uuid), pid);
    EXPECT_TRUE(IsFifo(Pipe(uuid) + "/control"));
    EXPECT_TRUE(fs::is_directory(fmt::format("{}/{}/log", root_, uuid)));
    EXPECT_EQ(Slurp(Pipe(uuid) + "/env"),
              fmt::format("CUDA_VISIBLE_DEVICES={0}\nCUDA_MPS_PIPE_DIRECTORY={1}/{0}/pipe\n"
                          "CUDA_MPS_LOG_DIRECTORY={1}/{0}/log\n",
                          uuid, root_));
    EXPECT_EQ(mps.PipeDir(uuid), Pipe(uuid));
    EXPECT_TRUE(mps.Healthy(uuid));
  }
  EXPECT_NE(LastStartedPid("GPU-aaaa"), LastStartedPid("GPU-bbbb"));
  EXPECT_EQ(mps.Gpus(), (std::vector<std::string>{"GPU-aaaa", "GPU-bbbb"}));
  EXPECT_EQ(mps.starts(), 2);
  EXPECT_FALSE(mps.Healthy("GPU-cccc"));
  EXPECT_TRUE(mps.StopAll().ok());
}

TEST_F(MpsTest, EnsureAgainUsesTheRunningDaemon) {
  MpsDaemons mps(Options());
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-1.0").ok());
  const pid_t pid = LastStartedPid("GPU-aaaa");
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-2.0").ok());
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-1.0").ok());
  EXPECT_EQ(Starts("GPU-aaaa").size(), 1u);
  EXPECT_EQ(mps.starts(), 1);
  EXPECT_TRUE(Alive(pid));
  EXPECT_EQ(mps.Users("GPU-aaaa"), (std::vector<std::string>{"j-1.0", "j-2.0"}));
  // The health check went through the control program each time.
  EXPECT_GE(Commands("GPU-aaaa").size(), 2u);
  EXPECT_TRUE(mps.StopAll().ok());
}

TEST_F(MpsTest, ReleaseStopsTheDaemonOnlyWithItsLastUser) {
  MpsDaemons mps(Options());
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-1.0").ok());
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-2.0").ok());
  const pid_t pid = LastStartedPid("GPU-aaaa");

  ASSERT_TRUE(mps.Release("GPU-aaaa", "j-1.0").ok());
  // Releasing the same user twice, or one never counted, changes nothing.
  ASSERT_TRUE(mps.Release("GPU-aaaa", "j-1.0").ok());
  ASSERT_TRUE(mps.Release("GPU-aaaa", "j-9.0").ok());
  EXPECT_TRUE(Alive(pid));
  EXPECT_TRUE(IsFifo(Pipe("GPU-aaaa") + "/control"));
  EXPECT_FALSE(Contains(Commands("GPU-aaaa"), "quit"));
  EXPECT_EQ(mps.Gpus(), std::vector<std::string>{"GPU-aaaa"});

  ASSERT_TRUE(mps.Release("GPU-aaaa", "j-2.0").ok());
  EXPECT_TRUE(Contains(Commands("GPU-aaaa"), "quit"));
  EXPECT_TRUE(WaitFor([&] { return !Alive(pid); }));
  EXPECT_FALSE(fs::exists(Pipe("GPU-aaaa") + "/control"));
  EXPECT_TRUE(mps.Gpus().empty());
  EXPECT_FALSE(mps.Healthy("GPU-aaaa"));
  // A release for a GPU without a daemon is fine too.
  EXPECT_TRUE(mps.Release("GPU-aaaa", "j-2.0").ok());
  EXPECT_TRUE(mps.Release("GPU-zzzz", "j-2.0").ok());
}

TEST_F(MpsTest, DeadDaemonIsRestartedByTheNextEnsure) {
  MpsDaemons mps(Options());
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-1.0").ok());
  const pid_t first = LastStartedPid("GPU-aaaa");
  ASSERT_EQ(::kill(first, SIGKILL), 0);
  ASSERT_TRUE(WaitFor([&] { return !Alive(first); }));
  // Its control pipe is left behind, but nothing answers on it.
  EXPECT_TRUE(IsFifo(Pipe("GPU-aaaa") + "/control"));
  EXPECT_FALSE(mps.Healthy("GPU-aaaa"));

  Status st = mps.Ensure("GPU-aaaa", "j-2.0");
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(Starts("GPU-aaaa").size(), 2u);
  const pid_t second = LastStartedPid("GPU-aaaa");
  EXPECT_NE(second, first);
  EXPECT_TRUE(Alive(second));
  EXPECT_TRUE(mps.Healthy("GPU-aaaa"));
  EXPECT_EQ(mps.starts(), 2);
  EXPECT_TRUE(mps.StopAll().ok());
  EXPECT_TRUE(WaitFor([&] { return !Alive(second); }));
}

TEST_F(MpsTest, ReleaseToleratesADaemonThatAlreadyDied) {
  MpsDaemons mps(Options());
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-1.0").ok());
  const pid_t pid = LastStartedPid("GPU-aaaa");
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  ASSERT_TRUE(WaitFor([&] { return !Alive(pid); }));
  Status st = mps.Release("GPU-aaaa", "j-1.0");
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(mps.Gpus().empty());
}

TEST_F(MpsTest, MissingBinaryIsAClearError) {
  {
    MpsDaemons mps(Options(fmt::format("{}/nowhere/nvidia-cuda-mps-control", root_)));
    Status st = mps.Ensure("GPU-aaaa", "j-1.0");
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(st.message().find("MPS isolation requested for GPU GPU-aaaa"), std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find(fmt::format("{}/nowhere/nvidia-cuda-mps-control", root_)), std::string::npos)
        << st.message();
    EXPECT_TRUE(mps.Gpus().empty());
    EXPECT_EQ(mps.starts(), 0);
  }
  {
    // A bare name is looked up in PATH.
    MpsDaemons mps(Options("gpupool-no-such-mps-control"));
    Status st = mps.Ensure("GPU-aaaa", "j-1.0");
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("gpupool-no-such-mps-control was not found"), std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find("PATH="), std::string::npos) << st.message();
  }
}

TEST_F(MpsTest, FailedStartReportsTheExitStatusAndStderr) {
  fs::create_directories(Pipe("GPU-aaaa"));
  std::ofstream(Pipe("GPU-aaaa") + "/fail-start") << "no CUDA-capable device is detected\n";
  MpsDaemons mps(Options());
  Status st = mps.Ensure("GPU-aaaa", "j-1.0");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("GPU GPU-aaaa"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("exit status 3"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("no CUDA-capable device is detected"), std::string::npos) << st.message();
  EXPECT_TRUE(mps.Gpus().empty());
  EXPECT_TRUE(Starts("GPU-aaaa").empty());
}

TEST_F(MpsTest, DaemonThatNeverAnswersIsAnError) {
  // A control program whose -d succeeds but starts nothing.
  const std::string fake = fmt::format("{}/silent-mps-control", root_);
  std::ofstream(fake) << "#!/bin/sh\nexit 0\n";
  ASSERT_EQ(::chmod(fake.c_str(), 0755), 0);
  MpsOptions o = Options(fake);
  o.start_timeout = std::chrono::milliseconds(300);
  MpsDaemons mps(o);
  Status st = mps.Ensure("GPU-aaaa", "j-1.0");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("GPU GPU-aaaa"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("no daemon answers"), std::string::npos) << st.message();
  EXPECT_TRUE(mps.Gpus().empty());
}

TEST_F(MpsTest, StopAllStopsEveryDaemon) {
  MpsDaemons mps(Options());
  std::vector<pid_t> pids;
  for (const std::string uuid : {"GPU-aaaa", "GPU-bbbb", "GPU-cccc"}) {
    ASSERT_TRUE(mps.Ensure(uuid, "j-1.0").ok());
    ASSERT_TRUE(mps.Ensure(uuid, "j-2.0").ok());
    pids.push_back(LastStartedPid(uuid));
  }
  ASSERT_TRUE(mps.StopAll().ok());
  for (pid_t pid : pids) EXPECT_TRUE(WaitFor([&] { return !Alive(pid); })) << pid;
  for (const std::string uuid : {"GPU-aaaa", "GPU-bbbb", "GPU-cccc"}) {
    EXPECT_TRUE(Contains(Commands(uuid), "quit")) << uuid;
    EXPECT_FALSE(fs::exists(Pipe(uuid) + "/control")) << uuid;
  }
  EXPECT_TRUE(mps.Gpus().empty());
}

TEST_F(MpsTest, AHealthyDaemonLeftByAnEarlierAgentIsAdopted) {
  MpsDaemons before(Options());
  ASSERT_TRUE(before.Ensure("GPU-aaaa", "j-1.0").ok());
  const pid_t pid = LastStartedPid("GPU-aaaa");

  MpsDaemons after(Options());  // the restarted agent
  ASSERT_TRUE(after.Ensure("GPU-aaaa", "j-1.0").ok());
  EXPECT_EQ(after.starts(), 0);
  EXPECT_EQ(Starts("GPU-aaaa").size(), 1u);
  ASSERT_TRUE(after.Release("GPU-aaaa", "j-1.0").ok());
  EXPECT_TRUE(WaitFor([&] { return !Alive(pid); }));
}

TEST_F(MpsTest, UnusableUuidsAreRefused) {
  MpsDaemons mps(Options());
  for (const std::string uuid : {"", "../etc", "GPU/0", ".hidden", "GPU 0"}) {
    Status st = mps.Ensure(uuid, "j-1.0");
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << uuid;
  }
  EXPECT_TRUE(fs::is_empty(root_));
}

// ---- server limits ------------------------------------------------------------------------------

// The tests' MPS servers run as this process's own uid: any user may start a server for itself.
int64_t Me() {
  return ::geteuid();
}

MpsClientLimits Grant(int percentage, int64_t mib, int64_t uid = Me()) {
  return {uid, percentage, mib};
}

size_t Count(const std::vector<std::string>& v, const std::string& prefix) {
  return static_cast<size_t>(
      std::count_if(v.begin(), v.end(), [&](const std::string& s) { return s.rfind(prefix, 0) == 0; }));
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_F(MpsTest, LimitsAreSetOnTheServerOfTheTasksUidAndReadBack) {
  MpsDaemons mps(Options());
  Status st = mps.Ensure("GPU-aaaa", "j-1.0", Grant(25, 20480));
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto server = ServerState(Pipe("GPU-aaaa"), Me());
  EXPECT_EQ(server["threads"], "25");
  EXPECT_EQ(server["pinned"], "20480M");
  const pid_t pid = static_cast<pid_t>(std::atol(server["pid"].c_str()));
  ASSERT_TRUE(Alive(pid));
  auto owner = mps_internal::ProcUid(pid);
  ASSERT_TRUE(owner.ok()) << owner.status().ToString();
  EXPECT_EQ(*owner, Me());
  // Started, set, and read back, by the PID the daemon listed.
  const auto commands = Commands("GPU-aaaa");
  EXPECT_TRUE(Contains(commands, fmt::format("start_server -uid {}", Me())));
  for (const std::string c : {"set_active_thread_percentage {} 25", "set_device_pinned_mem_limit {} 0 20480M",
                              "get_active_thread_percentage {}", "get_device_pinned_mem_limit {} 0"})
    EXPECT_TRUE(Contains(commands, fmt::format(fmt::runtime(c), pid))) << c;
  EXPECT_EQ(mps.ServerLimits("GPU-aaaa", Me()), Grant(25, 20480));
  EXPECT_EQ(mps.Users("GPU-aaaa"), std::vector<std::string>{"j-1.0"});
  // The daemon's defaults are untouched: only this uid's server is limited.
  EXPECT_EQ(Lines(Pipe("GPU-aaaa") + "/defaults"), (std::vector<std::string>{"threads=100", "pinned=none"}));

  EXPECT_TRUE(mps.StopAll().ok());
  EXPECT_TRUE(WaitFor([&] { return !Alive(pid); }));
}

TEST_F(MpsTest, UsersOfOneUidShareOneServerHeldToTheSumOfTheirLimits) {
  MpsDaemons mps(Options());
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-1.0", Grant(25, 20480)).ok());
  const std::string pid = ServerState(Pipe("GPU-aaaa"), Me())["pid"];
  Status st = mps.Ensure("GPU-aaaa", "j-2.0", Grant(50, 10240));
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto server = ServerState(Pipe("GPU-aaaa"), Me());
  EXPECT_EQ(server["pid"], pid);  // the same server
  EXPECT_EQ(server["threads"], "75");
  EXPECT_EQ(server["pinned"], "30720M");
  EXPECT_EQ(Count(Commands("GPU-aaaa"), "start_server"), 1u);
  // Percentages stop at 100; memory adds up.
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-3.0", Grant(50, 1024)).ok());
  server = ServerState(Pipe("GPU-aaaa"), Me());
  EXPECT_EQ(server["threads"], "100");
  EXPECT_EQ(server["pinned"], "31744M");
  EXPECT_EQ(mps.ServerLimits("GPU-aaaa", Me()), Grant(100, 31744));
  // Ensuring a user again changes nothing.
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-3.0", Grant(50, 1024)).ok());
  EXPECT_EQ(ServerState(Pipe("GPU-aaaa"), Me())["pinned"], "31744M");
  EXPECT_TRUE(mps.StopAll().ok());
}

TEST_F(MpsTest, ReleaseLowersTheServerLimitsToTheRemainingUsers) {
  MpsDaemons mps(Options());
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-1.0", Grant(25, 20480)).ok());
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-2.0", Grant(50, 10240)).ok());
  const pid_t pid = static_cast<pid_t>(std::atol(ServerState(Pipe("GPU-aaaa"), Me())["pid"].c_str()));

  Status st = mps.Release("GPU-aaaa", "j-2.0");
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto server = ServerState(Pipe("GPU-aaaa"), Me());
  EXPECT_EQ(server["threads"], "25");
  EXPECT_EQ(server["pinned"], "20480M");
  EXPECT_EQ(mps.ServerLimits("GPU-aaaa", Me()), Grant(25, 20480));
  EXPECT_EQ(Count(Commands("GPU-aaaa"), "set_active_thread_percentage"), 3u);
  // Released twice: nothing more is set.
  ASSERT_TRUE(mps.Release("GPU-aaaa", "j-2.0").ok());
  EXPECT_EQ(Count(Commands("GPU-aaaa"), "set_active_thread_percentage"), 3u);

  // The last user: the daemon quits, and its server goes with it.
  ASSERT_TRUE(mps.Release("GPU-aaaa", "j-1.0").ok());
  EXPECT_TRUE(Contains(Commands("GPU-aaaa"), "quit"));
  EXPECT_TRUE(WaitFor([&] { return !Alive(pid); }));
  EXPECT_EQ(mps.ServerLimits("GPU-aaaa", Me()), std::nullopt);
}

TEST_F(MpsTest, EachUidHasItsOwnServerAndLimits) {
  if (::geteuid() != 0) GTEST_SKIP() << "a server for another uid needs root";
  MpsDaemons mps(Options());
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-1.0", Grant(25, 20480)).ok());
  Status st = mps.Ensure("GPU-aaaa", "j-2.0", Grant(50, 10240, 65534));
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto mine = ServerState(Pipe("GPU-aaaa"), Me());
  auto nobody = ServerState(Pipe("GPU-aaaa"), 65534);
  EXPECT_NE(mine["pid"], nobody["pid"]);
  EXPECT_EQ(*mps_internal::ProcUid(static_cast<pid_t>(std::atol(nobody["pid"].c_str()))), 65534);
  EXPECT_EQ(mine["threads"], "25");
  EXPECT_EQ(nobody["threads"], "50");
  EXPECT_EQ(nobody["pinned"], "10240M");
  // Releasing one uid's user leaves the other uid's server as it was.
  ASSERT_TRUE(mps.Release("GPU-aaaa", "j-2.0").ok());
  mine = ServerState(Pipe("GPU-aaaa"), Me());
  EXPECT_EQ(mine["threads"], "25");
  EXPECT_EQ(mine["pinned"], "20480M");
  EXPECT_EQ(mps.ServerLimits("GPU-aaaa", 65534), std::nullopt);
  EXPECT_TRUE(mps.StopAll().ok());
}

TEST_F(MpsTest, ASetTheDaemonIgnoresIsAnErrorNamingTheCommandAndTheAnswer) {
  // Every set answered with success and ignored: the percentage is the first to be found out.
  fs::create_directories(Pipe("GPU-aaaa"));
  std::ofstream(Pipe("GPU-aaaa") + "/fail-set").flush();
  MpsDaemons mps(Options());
  Status st = mps.Ensure("GPU-aaaa", "j-1.0", Grant(25, 20480));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(st.message(), fmt::format("MPS server limits for uid {} on GPU GPU-aaaa: ", Me())))
      << st.message();
  EXPECT_TRUE(Has(st.message(), "'set_active_thread_percentage ")) << st.message();
  EXPECT_TRUE(Has(st.message(), " 25' did not take effect: 'get_active_thread_percentage ")) << st.message();
  EXPECT_TRUE(Has(st.message(), "' answered '100.0', not 25")) << st.message();
  // Not counted: the daemon it started for the user is gone again.
  EXPECT_TRUE(mps.Gpus().empty());
  EXPECT_TRUE(Contains(Commands("GPU-aaaa"), "quit"));

  // Only the memory limit ignored, on a server that has none: its reply ("none") is no limit.
  std::ofstream(Pipe("GPU-aaaa") + "/fail-set") << "set_device_pinned_mem_limit\n";
  st = mps.Ensure("GPU-aaaa", "j-1.0", Grant(25, 20480));
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(
      Has(st.message(), " 0 20480M' not verified: unexpected reply to get_device_pinned_mem_limit: 'none'"))
      << st.message();
  EXPECT_TRUE(mps.Gpus().empty());

  // ... and on a server that has one: the old limit is still there.
  fs::remove(Pipe("GPU-aaaa") + "/fail-set");
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-1.0", Grant(25, 20480)).ok());
  std::ofstream(Pipe("GPU-aaaa") + "/fail-set") << "set_device_pinned_mem_limit\n";
  st = mps.Ensure("GPU-aaaa", "j-2.0", Grant(25, 10240));
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(Has(st.message(), " 0 30720M' did not take effect: 'get_device_pinned_mem_limit "))
      << st.message();
  EXPECT_TRUE(Has(st.message(), " 0' answered '20480M', not 30720M")) << st.message();
  EXPECT_EQ(mps.Users("GPU-aaaa"), std::vector<std::string>{"j-1.0"});
  EXPECT_TRUE(mps.StopAll().ok());
}

TEST_F(MpsTest, AFailedEnsureLeavesTheOtherUsersAndTheirLimits) {
  MpsDaemons mps(Options());
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-1.0", Grant(25, 20480)).ok());
  const pid_t daemon = LastStartedPid("GPU-aaaa");
  std::ofstream(Pipe("GPU-aaaa") + "/fail-set").flush();
  Status st = mps.Ensure("GPU-aaaa", "j-2.0", Grant(50, 10240));
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(Has(st.message(), "did not take effect")) << st.message();
  EXPECT_EQ(mps.Users("GPU-aaaa"), std::vector<std::string>{"j-1.0"});
  EXPECT_EQ(mps.ServerLimits("GPU-aaaa", Me()), Grant(25, 20480));
  EXPECT_TRUE(Alive(daemon));
  EXPECT_EQ(ServerState(Pipe("GPU-aaaa"), Me())["threads"], "25");

  fs::remove(Pipe("GPU-aaaa") + "/fail-set");
  ASSERT_TRUE(mps.Ensure("GPU-aaaa", "j-2.0", Grant(50, 10240)).ok());
  EXPECT_EQ(ServerState(Pipe("GPU-aaaa"), Me())["threads"], "75");
  EXPECT_TRUE(mps.StopAll().ok());
}

TEST_F(MpsTest, HostileRepliesAreErrorsThatQuoteThemSafely) {
  struct Case {
    std::string command;  // whose reply the fake daemon replaces
    std::string reply;
    std::string expected;  // in the error message
  };
  std::string many_lines;
  for (int i = 0; i < 2000; ++i) many_lines += "7\n";
  const std::vector<Case> cases = {
      {"get_server_list", "12abc\n", "unexpected reply to get_server_list: '12abc'"},
      {"get_server_list", "\x01\xff garbage\n", "'\\x01\\xff garbage'"},
      {"get_server_list", "99999999\n", "unexpected reply to get_server_list"},
      {"get_server_list", "-5\n", "unexpected reply to get_server_list"},
      {"get_server_list", many_lines, "(expected at most 1024 lines)"},
      {"get_server_list", std::string(100000, '7'), "printed more than 65536 bytes"},
      {"get_active_thread_percentage", "25.5\n", "unexpected reply to get_active_thread_percentage: '25.5'"},
      {"get_active_thread_percentage", "", "unexpected reply to get_active_thread_percentage: ''"},
      {"get_active_thread_percentage", "25.0\n25.0\n", "'25.0\\n25.0'"},
      {"get_active_thread_percentage", "Error: operation not permitted\n",
       "'Error: operation not permitted'"},
      {"get_active_thread_percentage", "1e2\n", "get_active_thread_percentage: '1e2'"},
      {"get_device_pinned_mem_limit", "20480\n", "unexpected reply to get_device_pinned_mem_limit: '20480'"},
      {"get_device_pinned_mem_limit", "1.5G\n", "get_device_pinned_mem_limit: '1.5G'"},
      {"get_device_pinned_mem_limit", "99999999999999999999M\n", "get_device_pinned_mem_limit: '9999"},
      {"get_device_pinned_mem_limit", "20480M; reboot\n", "'20480M; reboot'"},
      {"get_device_pinned_mem_limit", std::string(5000, 'M'), "'MMMM"},
  };
  MpsOptions o = Options();
  o.command_timeout = std::chrono::seconds(2);
  MpsDaemons mps(o);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const std::string uuid = fmt::format("GPU-hostile-{}", i);
    SCOPED_TRACE(fmt::format("{}: {}", c.command, c.expected));
    fs::create_directories(Pipe(uuid));
    std::ofstream(Pipe(uuid) + "/reply." + c.command) << c.reply;
    Status st = mps.Ensure(uuid, "j-1.0", Grant(25, 20480));
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE(Has(st.message(), c.expected)) << st.message();
    EXPECT_TRUE(Has(st.message(), fmt::format("uid {} on GPU {}", Me(), uuid))) << st.message();
    EXPECT_LT(st.message().size(), 1000u) << st.message();  // an excerpt, never the whole reply
    EXPECT_TRUE(mps.Gpus().empty());
  }
}

TEST_F(MpsTest, AServerThatNeverAppearsIsAnError) {
  fs::create_directories(Pipe("GPU-aaaa"));
  std::ofstream(Pipe("GPU-aaaa") + "/reply.get_server_list").flush();  // the daemon lists none, ever
  MpsOptions o = Options();
  o.command_timeout = std::chrono::milliseconds(300);
  MpsDaemons mps(o);
  Status st = mps.Ensure("GPU-aaaa", "j-1.0", Grant(25, 20480));
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(
      Has(st.message(), fmt::format("'start_server -uid {0}' exited 0, but get_server_list shows no server "
                                    "of uid {0} after 300 ms",
                                    Me())))
      << st.message();
  EXPECT_TRUE(mps.Gpus().empty());
}

TEST_F(MpsTest, LimitsOutOfBoundsAreRefusedBeforeAnythingRuns) {
  MpsDaemons mps(Options());
  const std::vector<MpsClientLimits> bad = {
      Grant(0, 1024),      Grant(101, 1024),
      Grant(-1, 1024),     Grant(25, 0),
      Grant(25, -512),     Grant(25, kMaxPinnedMemMib + 1),
      Grant(25, 1024, -1), Grant(25, 1024, int64_t{1} << 32),
  };
  for (const MpsClientLimits& limits : bad) {
    Status st = mps.Ensure("GPU-aaaa", "j-1.0", limits);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument)
        << limits.uid << " " << limits.active_thread_percentage << " " << limits.pinned_mem_mib;
    EXPECT_TRUE(Has(st.message(), "MPS limits of j-1.0 on GPU GPU-aaaa")) << st.message();
  }
  EXPECT_TRUE(fs::is_empty(root_));
  EXPECT_TRUE(mps.Gpus().empty());
  // The largest values that are allowed.
  EXPECT_TRUE(ValidateMpsClientLimits(Grant(100, kMaxPinnedMemMib, 4294967294)).ok());
  EXPECT_TRUE(ValidateMpsClientLimits(Grant(1, 1, 0)).ok());
}

// ---- the parsers of the daemon's replies ---------------------------------------------------------

TEST(MpsReplies, ServerListIsPidsOneALine) {
  using mps_internal::ParseServerList;
  EXPECT_EQ(*ParseServerList(""), std::vector<pid_t>{});
  EXPECT_EQ(*ParseServerList("\n"), std::vector<pid_t>{});
  EXPECT_EQ(*ParseServerList("123\n4194304\n"), (std::vector<pid_t>{123, 4194304}));
  EXPECT_EQ(*ParseServerList(" 77 \r\n77\n"), std::vector<pid_t>{77});  // blanks around, repeats once
  for (const std::string& bad :
       std::vector<std::string>{"0\n", "4194305\n", "12 13\n", "+12\n", "-1\n", "abc\n", "1\nServer 2\n",
                                "12345678901234567890\n", std::string("1\0", 2)}) {
    auto r = ParseServerList(bad);
    EXPECT_FALSE(r.ok()) << bad;
  }
}

TEST(MpsReplies, PercentageIsAWholeNumber) {
  using mps_internal::ParsePercentage;
  EXPECT_EQ(*ParsePercentage("25.0\n"), 25);
  EXPECT_EQ(*ParsePercentage("100"), 100);
  EXPECT_EQ(*ParsePercentage("1.000\n"), 1);
  EXPECT_EQ(*ParsePercentage("0.0\n"), 0);
  for (const std::string bad :
       {"", "\n", "25.5", "101.0", "25.", ".0", "-1", "1e2", "25 %", "25.0\n3", "0x19", "25.0000000", "1000"})
    EXPECT_FALSE(ParsePercentage(bad).ok()) << bad;
}

TEST(MpsReplies, PinnedMemoryIsAWholeNumberOfMibOrGib) {
  using mps_internal::ParsePinnedMib;
  EXPECT_EQ(*ParsePinnedMib("20480M\n"), 20480);
  EXPECT_EQ(*ParsePinnedMib("20G"), 20480);
  EXPECT_EQ(*ParsePinnedMib("20480 MiB"), 20480);
  EXPECT_EQ(*ParsePinnedMib("20480.0M"), 20480);
  EXPECT_EQ(*ParsePinnedMib("1 GB"), 1024);
  for (const std::string bad : {"", "20480", "M", "1.5G", "20480K", "20480  M", "20480m", "20480M\n1M",
                                "99999999999999M", "2000000000G", "none", "-1M", "20 480M"})
    EXPECT_FALSE(ParsePinnedMib(bad).ok()) << bad;
}

TEST(MpsReplies, ExcerptsAreShortAndPrintable) {
  using mps_internal::Excerpt;
  EXPECT_EQ(Excerpt("plain text\n"), "'plain text'");
  EXPECT_EQ(Excerpt("a\nb\x1b[31m'\\"), "'a\\nb\\x1b[31m\\x27\\x5c'");
  EXPECT_EQ(Excerpt(std::string(500, 'x')), "'" + std::string(200, 'x') + "'...");
}

TEST(MpsReplies, ProcUidIsTheRealUidOfTheProcess) {
  auto self = mps_internal::ProcUid(::getpid());
  ASSERT_TRUE(self.ok()) << self.status().ToString();
  EXPECT_EQ(*self, static_cast<int64_t>(::getuid()));

  char tmpl[] = "/tmp/gpupool-proc-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;
  fs::create_directories(root + "/42");
  std::ofstream(root + "/42/status") << "Name:\tnvidia-cuda-mps-server\nUid:\t1000\t1000\t1000\t1000\n";
  fs::create_directories(root + "/43");
  std::ofstream(root + "/43/status") << "Name:\tx\nUid:\tbogus\n";
  fs::create_directories(root + "/44");
  std::ofstream(root + "/44/status") << "Name:\tx\n";
  EXPECT_EQ(*mps_internal::ProcUid(42, root), 1000);
  EXPECT_EQ(mps_internal::ProcUid(43, root).status().code(), StatusCode::kInternal);
  EXPECT_EQ(mps_internal::ProcUid(44, root).status().code(), StatusCode::kInternal);
  EXPECT_EQ(mps_internal::ProcUid(45, root).status().code(), StatusCode::kNotFound);
  fs::remove_all(root);
}

}  // namespace
}  // namespace gpupool
