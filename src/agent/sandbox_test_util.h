// What the sandbox tests share: a runtime's task run to its end, and real containers (runc and a
// busybox root filesystem built for the test). Needs root; as another user the tests skip.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "agent/runtime.h"
#include "agent/runtime_internal.h"

namespace gpupool::sandbox_test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string UniqueId(const std::string& name) { return name + "-" + std::to_string(::getpid()); }

// Polls until the task leaves kRunning or `timeout` passes; its last known status.
inline TaskStatusInfo WaitEnd(Runtime& rt, const std::string& id, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  TaskStatusInfo info;
  while (Clock::now() < deadline) {
    auto r = rt.Poll(id);
    if (!r.ok()) return info;
    info = *r;
    if (info.state != RunState::kRunning) break;
    std::this_thread::sleep_for(20ms);
  }
  return info;
}

// What a test left running is stopped and removed.
inline void StopAndRemoveAll(Runtime& rt) {
  for (const auto& id : rt.List()) {
    (void)rt.Stop(id, 0s);
    WaitEnd(rt, id, 10s);
    (void)rt.Remove(id);
  }
}

// Runs a task to its end; returns its stdout (and stderr after a "--stderr--" line).
inline std::string RunToEnd(Runtime& rt, const LaunchSpec& spec, std::chrono::milliseconds timeout) {
  Status st = rt.Start(spec);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (!st.ok()) return "";
  TaskStatusInfo info = WaitEnd(rt, spec.id, timeout);
  EXPECT_EQ(info.state, RunState::kExited) << info.message;
  return ReadText(rt.StdoutPath(spec.id)) + "--stderr--\n" + ReadText(rt.StderrPath(spec.id));
}

// Real containers: runc and a busybox root filesystem built here.
// A root filesystem of the host's /bin/busybox and links to the applets the tests use, with the
// mount points a container needs. False (with a test failure) when something could not be made.
inline bool MakeBusyboxRootfs(const std::string& rootfs) {
  for (const char* d : {"", "/bin", "/proc", "/dev", "/sys", "/tmp", "/etc", "/srv"}) {
    if (!agent_internal::MakeDirs(rootfs + d).ok()) {
      ADD_FAILURE() << "cannot create " << rootfs << d;
      return false;
    }
  }
  {
    std::ifstream src("/bin/busybox", std::ios::binary);
    std::ofstream dst(rootfs + "/bin/busybox", std::ios::binary);
    dst << src.rdbuf();
  }
  if (::chmod((rootfs + "/bin/busybox").c_str(), 0755) != 0) {
    ADD_FAILURE() << "chmod " << rootfs << "/bin/busybox";
    return false;
  }
  for (const char* tool : {"sh", "cat", "id", "ls", "grep", "nc", "tr", "echo", "touch", "stat", "mount", "unshare"}) {
    if (::symlink("busybox", (rootfs + "/bin/" + tool).c_str()) != 0) {
      ADD_FAILURE() << "symlink " << tool;
      return false;
    }
  }
  return true;
}

class RuncSandboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "the sandbox needs root";
    if (::access("/bin/busybox", X_OK) != 0) GTEST_SKIP() << "/bin/busybox is not installed";
    char tmpl[] = "/tmp/gpupool-rsb-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);
    roots_ = dir_ + "/images";
    rootfs_ = roots_ + "/busybox";
    ASSERT_TRUE(MakeBusyboxRootfs(rootfs_));
    RuntimeOptions opts;
    opts.state_dir = dir_ + "/state";
    opts.container_roots = {roots_};
    Configure(opts);
    auto rt = MakeRuncRuntime(opts);
    if (!rt.ok()) GTEST_SKIP() << rt.status().ToString();
    rt_ = std::move(rt).value();
  }
  // Another runtime class with runc's command line (crun, runsc).
  virtual void Configure(RuntimeOptions&) {}
  void TearDown() override {
    if (rt_) StopAndRemoveAll(*rt_);
    rt_.reset();
    if (!dir_.empty()) (void)agent_internal::RemoveTree(dir_);
  }
  LaunchSpec Spec(const std::string& id, const std::string& script) {
    LaunchSpec s;
    s.id = UniqueId(id);
    s.argv = {"sh", "-c", script};
    s.env = {{"PATH", "/bin"}};
    s.rootfs = rootfs_;
    s.uid = 20101;
    s.gid = 20101;
    s.no_new_privs = true;
    return s;
  }
  TaskStatusInfo Wait(const std::string& id) { return WaitEnd(*rt_, id, 15s); }
  std::string Run(const LaunchSpec& spec) { return RunToEnd(*rt_, spec, 15s); }

  std::string dir_, roots_, rootfs_;
  std::unique_ptr<Runtime> rt_;
};

// gVisor (Debian's runsc) on the ptrace platform, as the agent runs it.
inline void ConfigureRunsc(RuntimeOptions& opts) {
  opts.runtime_class = "runsc";
  opts.runc_binary = "runsc";
  opts.global_flags = {"--platform=ptrace", "--oci-seccomp"};
  opts.network_flag = true;
}

}  // namespace gpupool::sandbox_test
