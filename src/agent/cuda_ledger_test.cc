// The process runtime gives a task that has the CUDA limiter preloaded its memory ledger file
// (LaunchSpec::cuda_ledger, docs/cuda_limiter.md "One ledger for the task"): empty at each start,
// mode 0600, named in GPUPOOL_CUDA_LEDGER. The limiter's use of it is tested in cuda_limiter_test.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "agent/runtime.h"
#include "agent/runtime_internal.h"

namespace gpupool {
namespace {

using namespace std::chrono_literals;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int RunToEnd(Runtime& rt, const LaunchSpec& spec) {
  EXPECT_TRUE(rt.Start(spec).ok());
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    auto info = rt.Poll(spec.id);
    if (!info.ok()) return -1;
    if (info->state != RunState::kRunning) return info->exit_code;
    std::this_thread::sleep_for(20ms);
  }
  return -1;
}

TEST(CudaLedgerTest, APreloadedTaskGetsAnEmptyPrivateLedgerFileAtEachStart) {
  char dir[] = "/tmp/gpupool-ledger-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  RuntimeOptions options;
  options.state_dir = dir;
  options.cgroup_root = "none";
  auto rt = MakeProcessRuntime(options);
  ASSERT_TRUE(rt.ok()) << rt.status().ToString();
  LaunchSpec spec;
  spec.id = "ledger-" + std::to_string(::getpid());
  // The first run leaves something in it; the second must find it empty again.
  spec.argv = {"/bin/sh", "-c",
               "stat -c '%a %s %u' \"$GPUPOOL_CUDA_LEDGER\"; echo x >> \"$GPUPOOL_CUDA_LEDGER\""};
  spec.env = {{"PATH", "/usr/bin:/bin"}};
  spec.cuda_ledger = true;
  for (int run = 0; run < 2; ++run) {
    ASSERT_EQ(RunToEnd(**rt, spec), 0) << Slurp((*rt)->StderrPath(spec.id));
    EXPECT_EQ(Slurp((*rt)->StdoutPath(spec.id)), "600 0 " + std::to_string(::geteuid()) + "\n");
    ASSERT_TRUE((*rt)->Remove(spec.id).ok());
  }
  // Without it, no variable.
  spec.cuda_ledger = false;
  spec.argv = {"/bin/sh", "-c", "echo \"[${GPUPOOL_CUDA_LEDGER-unset}]\""};
  ASSERT_EQ(RunToEnd(**rt, spec), 0);
  EXPECT_EQ(Slurp((*rt)->StdoutPath(spec.id)), "[unset]\n");
  ASSERT_TRUE((*rt)->Remove(spec.id).ok());
  (void)agent_internal::RemoveTree(dir);
}

}  // namespace
}  // namespace gpupool
