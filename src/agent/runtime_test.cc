// Tests of the task runtimes. They start real processes; the runc tests also start containers
// around a busybox root filesystem built here, and skip only when runc or /bin/busybox is absent.
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "agent/runtime.h"
#include "agent/runtime_internal.h"

namespace gpupool {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Parallel test processes share the cgroup tree: ids carry the pid.
std::string UniqueId(const std::string& name) { return name + "-" + std::to_string(::getpid()); }

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/gpupool-rt-XXXXXX";
    char* p = ::mkdtemp(tmpl);
    path_ = p != nullptr ? p : "";
  }
  ~TempDir() {
    if (!path_.empty()) (void)agent_internal::RemoveTree(path_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Polls until the task leaves kRunning or the timeout passes.
TaskStatusInfo WaitDone(Runtime& rt, const std::string& id, std::chrono::milliseconds timeout = 10s) {
  auto deadline = Clock::now() + timeout;
  TaskStatusInfo info;
  while (true) {
    auto r = rt.Poll(id);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return info;
    info = *r;
    if (info.state != RunState::kRunning || Clock::now() >= deadline) return info;
    std::this_thread::sleep_for(20ms);
  }
}

// Waits until `path` holds at least `lines` lines.
std::string WaitLines(const std::string& path, int lines, std::chrono::milliseconds timeout = 30s) {
  auto deadline = Clock::now() + timeout;
  while (true) {
    std::string text = ReadText(path);
    int n = 0;
    for (char c : text) n += c == '\n';
    if (n >= lines || Clock::now() >= deadline) return text;
    std::this_thread::sleep_for(20ms);
  }
}

std::unique_ptr<Runtime> MakeProcess(const std::string& dir, const std::string& cgroup_root = "none") {
  RuntimeOptions opts;
  opts.state_dir = dir;
  opts.cgroup_root = cgroup_root;
  auto rt = MakeProcessRuntime(opts);
  EXPECT_TRUE(rt.ok()) << rt.status().ToString();
  return rt.ok() ? std::move(rt).value() : nullptr;
}

LaunchSpec Spec(const std::string& id, std::vector<std::string> argv) {
  LaunchSpec s;
  s.id = id;
  s.argv = std::move(argv);
  s.env = {{"PATH", "/usr/bin:/bin"}};
  return s;
}

// ---- process runtime ------------------------------------------------------------------------------

TEST(ProcessRuntime, ExitCodeAndLogs) {
  TempDir dir;
  auto rt = MakeProcess(dir.path());
  ASSERT_NE(rt, nullptr);
  EXPECT_EQ(rt->name(), "process");
  std::string id = UniqueId("exit");
  ASSERT_TRUE(rt->Start(Spec(id, {"sh", "-c", "echo out; echo err >&2; pwd; exit 3"})).ok());
  TaskStatusInfo info = WaitDone(*rt, id);
  EXPECT_EQ(info.state, RunState::kExited);
  EXPECT_EQ(info.exit_code, 3);
  EXPECT_EQ(info.term_signal, 0);
  EXPECT_EQ(info.message, "exit code 3");
  EXPECT_EQ(rt->StdoutPath(id), dir.path() + "/" + id + "/stdout.log");
  // The default working directory is the task's own directory.
  EXPECT_EQ(ReadText(rt->StdoutPath(id)), "out\n" + dir.path() + "/" + id + "\n");
  EXPECT_EQ(ReadText(rt->StderrPath(id)), "err\n");
  EXPECT_EQ(rt->List(), std::vector<std::string>{id});
  ASSERT_TRUE(rt->Remove(id).ok());
  EXPECT_TRUE(rt->List().empty());
  // Logs stay after Remove; the state does not.
  EXPECT_EQ(ReadText(rt->StderrPath(id)), "err\n");
  EXPECT_FALSE(agent_internal::PathExists(dir.path() + "/" + id + "/task.json"));
  EXPECT_EQ(rt->Poll(id).status().code(), StatusCode::kNotFound);
}

TEST(ProcessRuntime, EnvironmentIsExactlyTheGivenOne) {
  TempDir dir;
  auto rt = MakeProcess(dir.path());
  ASSERT_NE(rt, nullptr);
  std::string id = UniqueId("env");
  LaunchSpec spec;
  spec.id = id;
  spec.argv = {"/usr/bin/env"};
  spec.env = {{"A", "1"}, {"B", "two words"}, {"EMPTY", ""}};
  ::setenv("GPUPOOL_RUNTIME_TEST_LEAK", "leaked", 1);
  ASSERT_TRUE(rt->Start(spec).ok());
  EXPECT_EQ(WaitDone(*rt, id).exit_code, 0);
  EXPECT_EQ(ReadText(rt->StdoutPath(id)), "A=1\nB=two words\nEMPTY=\n");
  ASSERT_TRUE(rt->Remove(id).ok());
}

TEST(ProcessRuntime, ExplicitWorkdirAndArgvAreKeptVerbatim) {
  TempDir dir;
  auto rt = MakeProcess(dir.path());
  ASSERT_NE(rt, nullptr);
  std::string id = UniqueId("argv");
  LaunchSpec spec = Spec(id, {"sh", "-c", "pwd; printf '%s|' \"$@\"", "sh", "a b", "$HOME", ";exit 9"});
  spec.workdir = "/";
  ASSERT_TRUE(rt->Start(spec).ok());
  EXPECT_EQ(WaitDone(*rt, id).exit_code, 0);
  EXPECT_EQ(ReadText(rt->StdoutPath(id)), "/\na b|$HOME|;exit 9|");
  ASSERT_TRUE(rt->Remove(id).ok());
}

TEST(ProcessRuntime, StartFailuresSayWhy) {
  TempDir dir;
  auto rt = MakeProcess(dir.path());
  ASSERT_NE(rt, nullptr);
  std::string id = UniqueId("fail");
  Status st = rt->Start(Spec(id, {"gpupool-no-such-command", "x"}));
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no such command 'gpupool-no-such-command'"), std::string::npos) << st.message();

  st = rt->Start(Spec(id, {"/nonexistent/bin/tool"}));
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.ToString();
  EXPECT_NE(st.message().find("no such command '/nonexistent/bin/tool'"), std::string::npos) << st.message();

  // Not executable: the exec errno comes back through the pipe.
  std::string script = dir.path() + "/not-executable";
  std::ofstream(script) << "#!/bin/sh\nexit 0\n";
  st = rt->Start(Spec(id, {script}));
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("cannot execute"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("Permission denied"), std::string::npos) << st.message();

  LaunchSpec bad_dir = Spec(id, {"true"});
  bad_dir.workdir = "/nonexistent/dir";
  st = rt->Start(bad_dir);
  EXPECT_NE(st.message().find("working directory '/nonexistent/dir'"), std::string::npos) << st.message();

  EXPECT_EQ(rt->Start(Spec("../escape", {"true"})).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rt->Start(Spec("", {"true"})).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rt->Start(Spec(id, {})).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(rt->List().empty());

  // After all that, the id is still free.
  ASSERT_TRUE(rt->Start(Spec(id, {"true"})).ok());
  EXPECT_EQ(rt->Start(Spec(id, {"true"})).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(WaitDone(*rt, id).exit_code, 0);
  ASSERT_TRUE(rt->Remove(id).ok());
}

TEST(ProcessRuntime, StopKillsATermIgnoringTaskAfterTheGracePeriod) {
  TempDir dir;
  auto rt = MakeProcess(dir.path());
  ASSERT_NE(rt, nullptr);
  std::string id = UniqueId("trap");
  ASSERT_TRUE(rt->Start(Spec(id, {"sh", "-c", "trap '' TERM; echo ready; sleep 60"})).ok());
  ASSERT_EQ(WaitLines(rt->StdoutPath(id), 1), "ready\n");
  EXPECT_EQ(rt->Remove(id).code(), StatusCode::kFailedPrecondition);

  auto start = Clock::now();
  ASSERT_TRUE(rt->Stop(id, 1s).ok());
  EXPECT_LT(Clock::now() - start, 500ms) << "Stop must not block";
  std::this_thread::sleep_for(300ms);
  auto r = rt->Poll(id);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state, RunState::kRunning) << "SIGTERM is ignored, so it runs until the grace period ends";

  TaskStatusInfo info = WaitDone(*rt, id, 5s);
  auto elapsed = Clock::now() - start;
  EXPECT_EQ(info.state, RunState::kExited);
  EXPECT_EQ(info.term_signal, SIGKILL);
  EXPECT_EQ(info.message, "killed by SIGKILL after the grace period");
  EXPECT_GE(elapsed, 1s);
  EXPECT_LT(elapsed, 4s);
  EXPECT_TRUE(rt->Stop(id, 1s).ok()) << "stopping a finished task is fine";
  ASSERT_TRUE(rt->Remove(id).ok());
}

// ---- lease fencing -------------------------------------------------------------------------------

void WriteLease(const std::string& path, int64_t term_ms, int64_t kill_ms) {
  ASSERT_TRUE(agent_internal::WriteFileAtomic(path, std::to_string(term_ms) + " " + std::to_string(kill_ms) + "\n").ok());
}

TEST(Fencing, ExpiredLeaseGetsTermThenKillAndTheExitRecordSaysFenced) {
  TempDir dir;
  auto rt = MakeProcess(dir.path() + "/state");
  ASSERT_NE(rt, nullptr);
  const std::string lease = dir.path() + "/lease";
  const int64_t now = agent_internal::BootTimeMs();
  WriteLease(lease, now + 600, now + 1200);
  std::string id = UniqueId("fenced");
  LaunchSpec spec = Spec(id, {"sh", "-c", "trap 'echo term' TERM; echo ready; while true; do sleep 0.1; done"});
  spec.lease_path = lease;
  auto start = Clock::now();
  ASSERT_TRUE(rt->Start(spec).ok());
  ASSERT_EQ(WaitLines(rt->StdoutPath(id), 1), "ready\n");
  TaskStatusInfo info = WaitDone(*rt, id, 5s);
  auto elapsed = Clock::now() - start;
  EXPECT_EQ(info.state, RunState::kExited);
  EXPECT_EQ(info.term_signal, SIGKILL) << info.message;
  EXPECT_TRUE(info.fenced);
  EXPECT_NE(info.message.find("fenced"), std::string::npos) << info.message;
  EXPECT_EQ(ReadText(rt->StdoutPath(id)), "ready\nterm\n") << "SIGTERM came first";
  EXPECT_GE(elapsed, 1000ms);
  EXPECT_LT(elapsed, 3s);
  const std::string exit_json = ReadText(dir.path() + "/state/" + id + "/exit.json");
  EXPECT_EQ(exit_json, "{\"signal\":9,\"fenced\":true}\n");
  auto rec = agent_internal::ReadExitRecord(dir.path() + "/state/" + id + "/exit.json");
  ASSERT_TRUE(rec.has_value());
  EXPECT_TRUE(rec->fenced);
  ASSERT_TRUE(rt->Remove(id).ok());
}

TEST(Fencing, ATaskThatExitsOnTermIsFencedWithoutKill) {
  TempDir dir;
  auto rt = MakeProcess(dir.path() + "/state");
  ASSERT_NE(rt, nullptr);
  const std::string lease = dir.path() + "/lease";
  const int64_t now = agent_internal::BootTimeMs();
  WriteLease(lease, now - 1000, now + 5000);  // already expired at start
  std::string id = UniqueId("fenced-term");
  LaunchSpec spec = Spec(id, {"sleep", "30"});
  spec.lease_path = lease;
  ASSERT_TRUE(rt->Start(spec).ok());
  TaskStatusInfo info = WaitDone(*rt, id, 3s);
  EXPECT_EQ(info.state, RunState::kExited);
  EXPECT_EQ(info.term_signal, SIGTERM) << info.message;
  EXPECT_TRUE(info.fenced);
  ASSERT_TRUE(rt->Remove(id).ok());
}

TEST(Fencing, ARenewedLeaseKeepsTheTaskRunning) {
  TempDir dir;
  auto rt = MakeProcess(dir.path() + "/state");
  ASSERT_NE(rt, nullptr);
  const std::string lease = dir.path() + "/lease";
  // Renewed every 0.1 s for 3 s, three times the lease; the 1 s margin absorbs a slow fsync of
  // the lease file on a loaded machine.
  WriteLease(lease, agent_internal::BootTimeMs() + 1000, agent_internal::BootTimeMs() + 1500);
  std::string id = UniqueId("renewed");
  LaunchSpec spec = Spec(id, {"sleep", "30"});
  spec.lease_path = lease;
  ASSERT_TRUE(rt->Start(spec).ok());
  for (int i = 0; i < 30; ++i) {
    const int64_t now = agent_internal::BootTimeMs();
    WriteLease(lease, now + 1000, now + 1500);
    std::this_thread::sleep_for(100ms);
  }
  auto r = rt->Poll(id);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state, RunState::kRunning) << r->message;
  ASSERT_TRUE(rt->Stop(id, 0s).ok());
  TaskStatusInfo info = WaitDone(*rt, id, 3s);
  EXPECT_FALSE(info.fenced);
  ASSERT_TRUE(rt->Remove(id).ok());
}

TEST(Fencing, NoLeaseFileMeansNoFencing) {
  TempDir dir;
  auto rt = MakeProcess(dir.path() + "/state");
  ASSERT_NE(rt, nullptr);
  std::string id = UniqueId("nolease");
  LaunchSpec spec = Spec(id, {"sh", "-c", "sleep 1.5; exit 4"});
  spec.lease_path = dir.path() + "/no-such-lease";
  ASSERT_TRUE(rt->Start(spec).ok());
  TaskStatusInfo info = WaitDone(*rt, id, 5s);
  EXPECT_EQ(info.state, RunState::kExited);
  EXPECT_EQ(info.exit_code, 4) << info.message;
  EXPECT_FALSE(info.fenced);
  EXPECT_EQ(ReadText(dir.path() + "/state/" + id + "/exit.json"), "{\"code\":4}\n");
  ASSERT_TRUE(rt->Remove(id).ok());
}

TEST(Fencing, LeaseFileParsing) {
  TempDir dir;
  const std::string lease = dir.path() + "/lease";
  EXPECT_FALSE(agent_internal::ReadLeaseFile(lease).has_value());
  WriteLease(lease, 12, 34);
  auto d = agent_internal::ReadLeaseFile(lease);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->term_ms, 12);
  EXPECT_EQ(d->kill_ms, 34);
  ASSERT_TRUE(agent_internal::WriteFileAtomic(lease, "12 x\n").ok());
  EXPECT_FALSE(agent_internal::ReadLeaseFile(lease).has_value());
  ASSERT_TRUE(agent_internal::WriteFileAtomic(lease, "5 6 6000\n").ok());
  EXPECT_TRUE(agent_internal::ReadLeaseFile(lease).has_value()) << "extra fields are allowed";
}

TEST(ProcessRuntime, StopOfATaskThatExitsOnTerm) {
  TempDir dir;
  auto rt = MakeProcess(dir.path());
  ASSERT_NE(rt, nullptr);
  std::string id = UniqueId("term");
  ASSERT_TRUE(rt->Start(Spec(id, {"sleep", "60"})).ok());
  auto start = Clock::now();
  ASSERT_TRUE(rt->Stop(id, 10s).ok());
  TaskStatusInfo info = WaitDone(*rt, id, 5s);
  EXPECT_LT(Clock::now() - start, 3s);
  EXPECT_EQ(info.state, RunState::kExited);
  EXPECT_EQ(info.term_signal, SIGTERM);
  EXPECT_EQ(info.message, "killed by SIGTERM");
  ASSERT_TRUE(rt->Remove(id).ok());
  EXPECT_EQ(rt->Stop(id, 1s).code(), StatusCode::kNotFound);
}

TEST(ProcessRuntime, StopReachesTheWholeProcessGroup) {
  TempDir dir;
  auto rt = MakeProcess(dir.path());
  ASSERT_NE(rt, nullptr);
  std::string id = UniqueId("group");
  // Two grandchildren that ignore TERM, and a shell that waits for them.
  ASSERT_TRUE(rt->Start(Spec(id, {"sh", "-c",
                                  "(trap '' TERM; sleep 60) & echo $!; (trap '' TERM; sleep 60) & echo $!; wait"}))
                  .ok());
  std::string pids = WaitLines(rt->StdoutPath(id), 2);
  std::istringstream in(pids);
  pid_t a = 0, b = 0;
  in >> a >> b;
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  EXPECT_TRUE(agent_internal::ProcessAlive(a, 0));
  ASSERT_TRUE(rt->Stop(id, 1s).ok());
  TaskStatusInfo info = WaitDone(*rt, id, 5s);
  EXPECT_EQ(info.state, RunState::kExited);
  // The shell died of SIGTERM; the grandchildren get SIGKILL once the grace period is over.
  auto deadline = Clock::now() + 5s;
  while ((agent_internal::ProcessAlive(a, 0) || agent_internal::ProcessAlive(b, 0)) && Clock::now() < deadline) {
    (void)rt->Poll(id);
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_FALSE(agent_internal::ProcessAlive(a, 0));
  EXPECT_FALSE(agent_internal::ProcessAlive(b, 0));
  ASSERT_TRUE(rt->Remove(id).ok());
}

// The supervisor dies (killed, or with the agent's process group) while its task runs on: a stop
// still reaches the task. It used to be taken as done ("no supervisor, nothing runs"), and the task
// ran to its end on a GPU the pool had given to another.
TEST(ProcessRuntime, AStopReachesATaskWhoseSupervisorDied) {
  TempDir dir;
  auto rt = MakeProcess(dir.path());
  ASSERT_NE(rt, nullptr);
  std::string id = UniqueId("orphan");
  ASSERT_TRUE(rt->Start(Spec(id, {"sh", "-c", "echo up; exec sleep 60"})).ok());
  ASSERT_EQ(WaitLines(rt->StdoutPath(id), 1), "up\n");
  auto task_json = nlohmann::json::parse(ReadText(dir.path() + "/" + id + "/task.json"));
  const pid_t task = task_json["pid"].get<pid_t>();
  const pid_t supervisor = task_json["supervisor_pid"].get<pid_t>();
  ASSERT_GT(task, 0);
  ASSERT_GT(supervisor, 0);
  ASSERT_EQ(::kill(supervisor, SIGKILL), 0);
  auto deadline = Clock::now() + 5s;
  while (agent_internal::ProcessAlive(supervisor, 0) && Clock::now() < deadline) {
    (void)rt->Poll(id);  // reaps it
    std::this_thread::sleep_for(20ms);
  }
  if (!agent_internal::ProcessAlive(task, 0)) GTEST_SKIP() << "the task ended with its supervisor here";
  ASSERT_TRUE(rt->Stop(id, 1s).ok());
  deadline = Clock::now() + 5s;
  while (agent_internal::ProcessAlive(task, 0) && Clock::now() < deadline) {
    (void)rt->Poll(id);
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_FALSE(agent_internal::ProcessAlive(task, 0)) << "the stop did not reach the task";
  ::kill(-task, SIGKILL);
  // And it is seen to have ended (a stop the agent can confirm), not "unknown" for ever.
  TaskStatusInfo info = WaitDone(*rt, id, 5s);
  EXPECT_EQ(info.state, RunState::kExited) << info.message;
  EXPECT_NE(info.exit_code, 0);
  ASSERT_TRUE(rt->Remove(id).ok());
}

TEST(ProcessRuntime, ANewRuntimeAdoptsRunningTasks) {
  TempDir dir;
  std::string waiting = UniqueId("adopt-wait");
  std::string sleeper = UniqueId("adopt-sleep");
  {
    auto rt1 = MakeProcess(dir.path());
    ASSERT_NE(rt1, nullptr);
    ASSERT_TRUE(rt1->Start(Spec(waiting, {"sh", "-c", "while [ ! -e go ]; do sleep 0.05; done; echo went; exit 7"}))
                    .ok());
    ASSERT_TRUE(rt1->Start(Spec(sleeper, {"sleep", "60"})).ok());
  }  // the first runtime goes away (an agent restart); its tasks keep running

  auto task_json = nlohmann::json::parse(ReadText(dir.path() + "/" + waiting + "/task.json"));
  EXPECT_GT(task_json["pid"].get<int>(), 0);
  EXPECT_EQ(task_json["pid"], task_json["pgid"]);
  EXPECT_GT(task_json["start_time"].get<uint64_t>(), 0u);
  EXPECT_EQ(task_json["argv"][0], "sh");

  auto rt2 = MakeProcess(dir.path());
  ASSERT_NE(rt2, nullptr);
  std::vector<std::string> want = {waiting, sleeper};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(rt2->List(), want);
  auto r = rt2->Poll(waiting);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state, RunState::kRunning);

  std::ofstream(dir.path() + "/" + waiting + "/go") << "";
  TaskStatusInfo info = WaitDone(*rt2, waiting);
  EXPECT_EQ(info.state, RunState::kExited);
  EXPECT_EQ(info.exit_code, 7);
  EXPECT_EQ(ReadText(rt2->StdoutPath(waiting)), "went\n");

  ASSERT_TRUE(rt2->Stop(sleeper, 5s).ok());
  info = WaitDone(*rt2, sleeper);
  EXPECT_EQ(info.state, RunState::kExited);
  EXPECT_EQ(info.term_signal, SIGTERM);
  ASSERT_TRUE(rt2->Remove(waiting).ok());
  ASSERT_TRUE(rt2->Remove(sleeper).ok());

  auto rt3 = MakeProcess(dir.path());
  ASSERT_NE(rt3, nullptr);
  EXPECT_TRUE(rt3->List().empty()) << "removed tasks are not adopted again";
}

TEST(ProcessRuntime, NoCgroupsMeansNoLimitsAndANote) {
  TempDir dir;
  auto rt = MakeProcess(dir.path(), "none");
  ASSERT_NE(rt, nullptr);
  EXPECT_NE(rt->limits_note().find("without CPU/memory limits"), std::string::npos) << rt->limits_note();
  std::string id = UniqueId("nolimits");
  LaunchSpec spec = Spec(id, {"true"});
  spec.cpu_milli = 500;
  spec.memory_bytes = 64 << 20;
  ASSERT_TRUE(rt->Start(spec).ok());
  EXPECT_EQ(WaitDone(*rt, id).exit_code, 0);
  ASSERT_TRUE(rt->Remove(id).ok());
}

// The path of `controller`'s group in /proc/<pid>/cgroup text ("4:memory:/gpupool/x"); for v2
// ("0::/gpupool/x") pass an empty controller.
std::string CgroupPathOf(const std::string& proc_cgroup, const std::string& controller) {
  std::istringstream in(proc_cgroup);
  std::string line;
  while (std::getline(in, line)) {
    size_t a = line.find(':');
    size_t b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string names = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    if (controller.empty()) {
      if (names.empty()) return path;
      continue;
    }
    std::istringstream ns(names);
    std::string n;
    while (std::getline(ns, n, ','))
      if (n == controller) return path;
  }
  return "";
}

TEST(ProcessRuntime, CpuAndMemoryLimitsLandInTheTasksCgroup) {
  TempDir dir;
  auto rt = MakeProcess(dir.path(), "");
  ASSERT_NE(rt, nullptr);
  if (!rt->limits_note().empty()) GTEST_SKIP() << rt->limits_note();
  std::string id = UniqueId("limits");
  LaunchSpec spec = Spec(id, {"cat", "/proc/self/cgroup"});
  spec.cpu_milli = 500;
  spec.memory_bytes = 64 << 20;
  ASSERT_TRUE(rt->Start(spec).ok());
  EXPECT_EQ(WaitDone(*rt, id).exit_code, 0);
  std::string cg = ReadText(rt->StdoutPath(id));
  std::string v2 = CgroupPathOf(cg, "");
  std::string mem = CgroupPathOf(cg, "memory");
  std::string cpu = CgroupPathOf(cg, "cpu");
  std::vector<std::string> dirs_to_check;
  char real[PATH_MAX];
  ASSERT_NE(::realpath(dir.path().c_str(), real), nullptr);
  const std::string group = "/gpupool/" + agent_internal::CgroupScope(real) + "/" + id;
  if (!mem.empty() && !cpu.empty() && mem != "/" && cpu != "/") {  // v1
    EXPECT_EQ(mem, group) << cg;
    EXPECT_EQ(cpu, group) << cg;
    std::string mem_dir = "/sys/fs/cgroup/memory" + mem;
    std::string cpu_dir = "/sys/fs/cgroup/cpu" + cpu;
    EXPECT_EQ(ReadText(mem_dir + "/memory.limit_in_bytes"), std::to_string(64 << 20) + "\n");
    EXPECT_EQ(ReadText(cpu_dir + "/cpu.cfs_quota_us"), "50000\n");
    EXPECT_EQ(ReadText(cpu_dir + "/cpu.cfs_period_us"), "100000\n");
    dirs_to_check = {mem_dir, cpu_dir};
  } else {  // v2, at /sys/fs/cgroup or /sys/fs/cgroup/unified
    EXPECT_EQ(v2, group) << cg;
    std::string base = agent_internal::PathExists("/sys/fs/cgroup" + v2 + "/memory.max") ? "/sys/fs/cgroup"
                                                                                         : "/sys/fs/cgroup/unified";
    EXPECT_EQ(ReadText(base + v2 + "/memory.max"), std::to_string(64 << 20) + "\n");
    EXPECT_EQ(ReadText(base + v2 + "/cpu.max"), "50000 100000\n");
    dirs_to_check = {base + v2};
  }
  ASSERT_TRUE(rt->Remove(id).ok());
  for (const auto& d : dirs_to_check) EXPECT_FALSE(agent_internal::PathExists(d)) << d;
}

// A fork bomb stays in its own group: the task's pids.max holds its processes and threads, and a
// task that asks for no CPU or memory limit still gets one.
TEST(ProcessRuntime, ATasksProcessCountIsCappedByItsPidsLimit) {
  TempDir dir;
  auto rt = MakeProcess(dir.path(), "");
  ASSERT_NE(rt, nullptr);
  if (!rt->limits_note().empty()) GTEST_SKIP() << rt->limits_note();
  if (!agent_internal::PathExists("/sys/fs/cgroup/pids/cgroup.procs") &&
      ReadText("/sys/fs/cgroup/cgroup.controllers").find("pids") == std::string::npos)
    GTEST_SKIP() << "no pids controller on this host";
  std::string id = UniqueId("pids");
  // 40 background sleeps under a limit of 16: the shell's forks fail with EAGAIN past it.
  LaunchSpec spec = Spec(id, {"/bin/sh", "-c",
                              "cat /proc/self/cgroup; n=0; for i in $(seq 40); do sleep 5 & n=$((n+1)); done 2>/dev/null; "
                              "echo started; ls /proc | grep -c '^[0-9]' >/dev/null; kill $(jobs -p) 2>/dev/null; wait; "
                              "echo done"});
  spec.pids_max = 16;
  ASSERT_TRUE(rt->Start(spec).ok());
  WaitDone(*rt, id);
  const std::string out = ReadText(rt->StdoutPath(id));
  const std::string err = ReadText(rt->StderrPath(id));
  char real[PATH_MAX];
  ASSERT_NE(::realpath(dir.path().c_str(), real), nullptr);
  const std::string group = "/gpupool/" + agent_internal::CgroupScope(real) + "/" + id;
  std::string pids_dir = CgroupPathOf(out, "pids");
  std::string base = "/sys/fs/cgroup/pids";
  if (pids_dir.empty()) {  // v2
    pids_dir = CgroupPathOf(out, "");
    base = agent_internal::PathExists("/sys/fs/cgroup" + pids_dir + "/pids.max") ? "/sys/fs/cgroup" : "/sys/fs/cgroup/unified";
  }
  EXPECT_EQ(pids_dir, group) << out;
  EXPECT_EQ(ReadText(base + pids_dir + "/pids.max"), "16\n");
  // The group saw the limit bite (v1 and v2 count refused forks in pids.events).
  EXPECT_NE(ReadText(base + pids_dir + "/pids.events"), "max 0\n") << out << err;
  ASSERT_TRUE(rt->Remove(id).ok());
  EXPECT_FALSE(agent_internal::PathExists(base + pids_dir));
}

// Run names repeat across pools (every pool's first job is j-000000000001): two agents on one host
// (two pools, or a test run beside a real agent) start a task of the same name. Each agent's
// groups live under its own directory, so one agent's cleanup does not kill the other's task.
TEST(ProcessRuntime, TwoAgentsOnOneHostKeepTasksOfTheSameNameApart) {
  TempDir a_dir;
  TempDir b_dir;
  auto a = MakeProcess(a_dir.path(), "");
  auto b = MakeProcess(b_dir.path(), "");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  if (!a->limits_note().empty()) GTEST_SKIP() << a->limits_note();
  const std::string id = UniqueId("same-name");
  LaunchSpec sleeper = Spec(id, {"sleep", "30"});
  sleeper.memory_bytes = 64 << 20;
  ASSERT_TRUE(a->Start(sleeper).ok());
  LaunchSpec quick = Spec(id, {"true"});
  quick.memory_bytes = 32 << 20;
  ASSERT_TRUE(b->Start(quick).ok());
  EXPECT_EQ(WaitDone(*b, id).exit_code, 0);
  ASSERT_TRUE(b->Remove(id).ok());
  // B's cleanup left A's task alone.
  std::this_thread::sleep_for(200ms);
  auto st = a->Poll(id);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->state, RunState::kRunning) << "exit " << st->exit_code << " signal " << st->term_signal << ": "
                                           << st->message;
  ASSERT_TRUE(a->Stop(id, 0s).ok());
  WaitDone(*a, id);
  ASSERT_TRUE(a->Remove(id).ok());
}

// An agent killed between a task's end and its cleanup leaves an empty group behind: its successor
// removes it, and a runtime that goes away takes its own (empty) directory with it.
TEST(ProcessRuntime, LeftoverGroupsAndTheAgentsDirectoryAreRemoved) {
  TempDir dir;
  auto rt = MakeProcess(dir.path(), "");
  ASSERT_NE(rt, nullptr);
  if (!rt->limits_note().empty()) GTEST_SKIP() << rt->limits_note();
  const std::string id = UniqueId("prune");
  LaunchSpec spec = Spec(id, {"cat", "/proc/self/cgroup"});
  spec.memory_bytes = 64 << 20;
  ASSERT_TRUE(rt->Start(spec).ok());
  EXPECT_EQ(WaitDone(*rt, id).exit_code, 0);
  const std::string cg = ReadText(rt->StdoutPath(id));
  std::string group = CgroupPathOf(cg, "memory");
  std::string mount = "/sys/fs/cgroup/memory";
  if (group.empty() || group == "/") {
    group = CgroupPathOf(cg, "");
    mount = agent_internal::PathExists("/sys/fs/cgroup" + group) ? "/sys/fs/cgroup" : "/sys/fs/cgroup/unified";
  }
  const std::string scope = mount + group.substr(0, group.rfind('/'));
  ASSERT_TRUE(agent_internal::PathExists(scope)) << scope;
  ASSERT_TRUE(rt->Remove(id).ok());
  const std::string stray = scope + "/" + UniqueId("stray");
  ASSERT_EQ(::mkdir(stray.c_str(), 0755), 0) << stray;
  auto next = MakeProcess(dir.path(), "");
  ASSERT_NE(next, nullptr);
  EXPECT_FALSE(agent_internal::PathExists(stray)) << "the successor left " << stray;
  EXPECT_TRUE(agent_internal::PathExists(scope));
  rt.reset();
  next.reset();
  EXPECT_FALSE(agent_internal::PathExists(scope)) << scope;
}

// ---- runc runtime ---------------------------------------------------------------------------------

TEST(RuncRuntime, MissingBinaryIsAClearError) {
  TempDir dir;
  RuntimeOptions opts;
  opts.state_dir = dir.path();
  opts.runc_binary = "/nonexistent/runc";
  auto rt = MakeRuncRuntime(opts);
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(rt.status().message().find("runc runtime: the binary '/nonexistent/runc' is not available"),
            std::string::npos)
      << rt.status().message();
  opts.runc_binary = "gpupool-no-such-runc";
  EXPECT_FALSE(MakeRuncRuntime(opts).ok());
  // Another class says its own name (the agent reports it when a task needs the class).
  opts.runtime_class = "runsc";
  opts.runc_binary = "/nonexistent/runsc";
  rt = MakeRuncRuntime(opts);
  ASSERT_FALSE(rt.ok());
  EXPECT_NE(rt.status().message().find("runsc runtime: the binary '/nonexistent/runsc'"), std::string::npos)
      << rt.status().message();
}

TEST(RuncRuntime, ConfigJsonCarriesLimitsDevicesAndBinds) {
  LaunchSpec spec;
  spec.id = "cfg";
  spec.argv = {"sh", "-c", "echo hi"};
  spec.env = {{"PATH", "/bin"}, {"X", "y"}};
  spec.cpu_milli = 1500;
  spec.memory_bytes = 1 << 30;
  spec.devices = {"/dev/null", "/dev/gpupool-no-such-gpu"};
  spec.readonly_binds = {"/usr/lib", "/nonexistent/lib"};
  auto text = agent_internal::BuildOciConfig(spec, "/srv/rootfs", "/gpupool/agent-0123456789abcdef");
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  auto j = nlohmann::json::parse(*text);
  EXPECT_EQ(j["ociVersion"], "1.0.2");
  EXPECT_EQ(j["root"]["path"], "/srv/rootfs");
  EXPECT_EQ(j["root"]["readonly"], true);
  EXPECT_EQ(j["process"]["args"], nlohmann::json(spec.argv));
  EXPECT_EQ(j["process"]["env"], nlohmann::json({"PATH=/bin", "X=y"}));
  EXPECT_EQ(j["process"]["cwd"], "/");
  EXPECT_EQ(j["process"]["terminal"], false);
  EXPECT_EQ(j["process"]["user"]["uid"], 0);
  EXPECT_EQ(j["linux"]["cgroupsPath"], "/gpupool/agent-0123456789abcdef/cfg");
  EXPECT_EQ(j["linux"]["resources"]["cpu"]["quota"], 150000);
  EXPECT_EQ(j["linux"]["resources"]["cpu"]["period"], 100000);
  EXPECT_EQ(j["linux"]["resources"]["memory"]["limit"], int64_t{1} << 30);
  std::vector<std::string> ns;
  for (const auto& n : j["linux"]["namespaces"]) ns.push_back(n["type"]);
  // A network namespace of its own unless the host's is asked for; no user namespace without a uid.
  EXPECT_EQ(ns, (std::vector<std::string>{"pid", "ipc", "uts", "mount", "cgroup", "network"}));
  EXPECT_FALSE(j["linux"].contains("uidMappings"));
  EXPECT_EQ(j["linux"]["seccomp"]["defaultAction"], "SCMP_ACT_ALLOW");
  ASSERT_EQ(j["linux"]["devices"].size(), 1u);
  EXPECT_EQ(j["linux"]["devices"][0]["path"], "/dev/null");
  EXPECT_EQ(j["linux"]["devices"][0]["major"], 1);
  EXPECT_EQ(j["linux"]["devices"][0]["minor"], 3);
  const auto& rules = j["linux"]["resources"]["devices"];
  ASSERT_EQ(rules.size(), 2u);
  EXPECT_EQ(rules[0]["allow"], false);
  EXPECT_EQ(rules[1]["allow"], true);
  EXPECT_EQ(rules[1]["major"], 1);
  std::vector<std::string> destinations;
  for (const auto& m : j["mounts"]) destinations.push_back(m["destination"]);
  for (const char* want : {"/proc", "/dev", "/dev/pts", "/dev/shm", "/sys", "/usr/lib"})
    EXPECT_NE(std::find(destinations.begin(), destinations.end(), want), destinations.end()) << want;
  EXPECT_EQ(std::find(destinations.begin(), destinations.end(), "/nonexistent/lib"), destinations.end());
  for (const auto& m : j["mounts"]) {
    if (m["destination"] == "/usr/lib" || m["destination"] == "/sys") {
      auto opts = m["options"].get<std::vector<std::string>>();
      EXPECT_NE(std::find(opts.begin(), opts.end(), "ro"), opts.end()) << m.dump();
    }
  }
  EXPECT_FALSE(j["linux"]["maskedPaths"].empty());
  EXPECT_FALSE(j["linux"]["readonlyPaths"].empty());

  spec.env = {{"BAD=NAME", "x"}};
  EXPECT_EQ(agent_internal::BuildOciConfig(spec, "/srv/rootfs", "/gpupool/agent-0123456789abcdef").status().code(), StatusCode::kInvalidArgument);
}

// What a CDI spec gives a container (agent/cdi.h): a device elsewhere on the host is bound in
// with its cgroup rule, a file or directory mount keeps its options (a bind gains rbind when it
// names neither), tmpfs scratch has its size, and hooks land under their stage.
TEST(RuncRuntime, ConfigJsonCarriesCdiDevicesMountsHooksAndScratch) {
  LaunchSpec spec;
  spec.id = "cdi";
  spec.argv = {"true"};
  spec.container_devices = {{"/dev/null", "/dev/nvidia3"}, {"/dev/zero", "/dev/zero"}, {"/nonexistent", "/dev/x"}};
  spec.mounts = {{"/usr/bin/env", "/usr/bin/nvidia-smi", "", {"ro", "nosuid", "nodev", "bind"}},
                 {"/usr/lib", "/usr/lib/driver", "", {"ro"}},
                 {"none", "/run/x", "tmpfs", {"size=1m"}}};
  spec.hooks = {{"createContainer", "/usr/bin/nvidia-ctk", {"nvidia-ctk", "hook", "update-ldcache"}, {}, 5},
                {"createContainer", "/bin/true", {}, {"A=b"}, 0}};
  spec.tmpfs = {{"/scratch", int64_t{64} << 20}};
  auto text = agent_internal::BuildOciConfig(spec, "/srv/rootfs", "/gpupool/agent-0123456789abcdef");
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  auto j = nlohmann::json::parse(*text);
  std::map<std::string, nlohmann::json> mounts;
  for (const auto& m : j["mounts"]) mounts[m["destination"]] = m;
  ASSERT_TRUE(mounts.count("/dev/nvidia3")) << j["mounts"].dump();
  EXPECT_EQ(mounts["/dev/nvidia3"]["source"], "/dev/null");
  EXPECT_EQ(mounts["/dev/nvidia3"]["type"], "bind");
  EXPECT_FALSE(mounts.count("/dev/x"));  // absent on this host
  ASSERT_EQ(j["linux"]["devices"].size(), 1u);  // the one at its own path
  EXPECT_EQ(j["linux"]["devices"][0]["path"], "/dev/zero");
  const auto& rules = j["linux"]["resources"]["devices"];
  ASSERT_EQ(rules.size(), 3u);  // deny all, then /dev/null's 1:3 and /dev/zero's 1:5
  EXPECT_EQ(rules[1]["minor"], 3);
  EXPECT_EQ(rules[2]["minor"], 5);
  EXPECT_EQ(mounts["/usr/bin/nvidia-smi"]["options"], nlohmann::json({"ro", "nosuid", "nodev", "bind"}));
  EXPECT_EQ(mounts["/usr/lib/driver"]["options"], nlohmann::json({"ro", "rbind"}));
  EXPECT_EQ(mounts["/run/x"]["type"], "tmpfs");
  EXPECT_EQ(mounts["/scratch"]["type"], "tmpfs");
  EXPECT_EQ(mounts["/scratch"]["options"], nlohmann::json({"nosuid", "nodev", "mode=0700", "size=67108864"}));
  // Outer mounts before inner ones, whatever order they came in (the tmpfs /scratch came last).
  std::vector<std::string> order;
  for (const auto& m : j["mounts"]) order.push_back(m["destination"]);
  const auto at = [&order](const std::string& d) { return std::find(order.begin(), order.end(), d) - order.begin(); };
  EXPECT_LT(at("/scratch"), at("/run/x"));
  EXPECT_LT(at("/run/x"), at("/usr/lib/driver"));
  EXPECT_LT(at("/usr/bin/nvidia-smi"), at("/usr/lib/driver"));  // equals keep the order given
  EXPECT_LT(at("/proc"), at("/scratch"));  // the runtime's own first
  ASSERT_EQ(j["hooks"]["createContainer"].size(), 2u);
  EXPECT_EQ(j["hooks"]["createContainer"][0]["args"], nlohmann::json({"nvidia-ctk", "hook", "update-ldcache"}));
  EXPECT_EQ(j["hooks"]["createContainer"][0]["timeout"], 5);
  EXPECT_EQ(j["hooks"]["createContainer"][1]["env"], nlohmann::json({"A=b"}));

  spec.mounts = {{"relative", "/x", "", {}}};
  EXPECT_EQ(agent_internal::BuildOciConfig(spec, "/srv/rootfs", "/gpupool/agent-0123456789abcdef").status().code(),
            StatusCode::kInvalidArgument);
}

// A file's mountpoint is an empty file, made never through a link.
TEST(RuncRuntime, FileMountpointsAreFilesAndNeverLinks) {
  TempDir root;
  ASSERT_TRUE(agent_internal::MakeDirsBeneath(root.path(), "/usr/bin/nvidia-smi", true).ok());
  struct stat st;
  ASSERT_EQ(::lstat((root.path() + "/usr/bin/nvidia-smi").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  ASSERT_EQ(::symlink("/etc/passwd", (root.path() + "/usr/bin/link").c_str()), 0);
  auto linked = agent_internal::MakeDirsBeneath(root.path(), "/usr/bin/link", true);
  EXPECT_FALSE(linked.ok());
  EXPECT_NE(linked.message().find("a link"), std::string::npos) << linked.ToString();
  ASSERT_EQ(::mkdir((root.path() + "/usr/lib").c_str(), 0755), 0);
  EXPECT_FALSE(agent_internal::MakeDirsBeneath(root.path(), "/usr/lib", true).ok());
}

class RuncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access("/bin/busybox", X_OK) != 0) GTEST_SKIP() << "/bin/busybox is not installed";
    RuntimeOptions opts;
    opts.state_dir = dir_.path() + "/state";
    opts.container_roots = {dir_.path()};
    // Traversable by a container's mapped uid (as /var/lib is), so sandboxed containers can start.
    ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
    auto rt = MakeRuncRuntime(opts);
    if (!rt.ok()) GTEST_SKIP() << rt.status().ToString();
    rt_ = std::move(rt).value();
    rootfs_ = dir_.path() + "/rootfs";
    for (const char* d : {"", "/bin", "/proc", "/dev", "/sys", "/tmp", "/etc"})
      ASSERT_EQ(::mkdir((rootfs_ + d).c_str(), 0755), 0) << d;
    {
      std::ifstream src("/bin/busybox", std::ios::binary);
      std::ofstream dst(rootfs_ + "/bin/busybox", std::ios::binary);
      dst << src.rdbuf();
    }
    ASSERT_EQ(::chmod((rootfs_ + "/bin/busybox").c_str(), 0755), 0);
    for (const char* tool : {"sh", "echo", "sleep", "env", "cat", "id", "true"})
      ASSERT_EQ(::symlink("busybox", (rootfs_ + "/bin/" + tool).c_str()), 0) << tool;
  }

  LaunchSpec ContainerSpec(const std::string& id, std::vector<std::string> argv) {
    LaunchSpec s;
    s.id = id;
    s.argv = std::move(argv);
    s.env = {{"PATH", "/bin"}};
    s.rootfs = rootfs_;
    return s;
  }

  TempDir dir_;
  std::string rootfs_;
  std::unique_ptr<Runtime> rt_;
};

TEST_F(RuncTest, ExitCodeAndStdout) {
  EXPECT_EQ(rt_->name(), "runc");
  std::string id = UniqueId("runc-exit");
  Status st = rt_->Start(ContainerSpec(id, {"sh", "-c", "echo hi; exit 3"}));
  ASSERT_TRUE(st.ok()) << st.ToString();
  TaskStatusInfo info = WaitDone(*rt_, id);
  EXPECT_EQ(info.state, RunState::kExited) << info.message << ReadText(rt_->StderrPath(id));
  EXPECT_EQ(info.exit_code, 3) << ReadText(rt_->StderrPath(id));
  EXPECT_EQ(info.message, "exit code 3");
  EXPECT_EQ(ReadText(rt_->StdoutPath(id)), "hi\n");
  std::string bundle = dir_.path() + "/state/" + id + "/bundle";
  EXPECT_TRUE(agent_internal::PathExists(bundle + "/config.json"));
  EXPECT_TRUE(agent_internal::PathExists(dir_.path() + "/state/runc-root"));
  ASSERT_TRUE(rt_->Remove(id).ok());
  EXPECT_FALSE(agent_internal::PathExists(bundle));
  EXPECT_EQ(ReadText(rt_->StdoutPath(id)), "hi\n") << "logs stay";
  EXPECT_TRUE(rt_->List().empty());
}

TEST_F(RuncTest, EnvironmentIsPassedIn) {
  std::string id = UniqueId("runc-env");
  LaunchSpec spec = ContainerSpec(id, {"env"});
  spec.env["GPUPOOL_TASK"] = "j-1.0";
  spec.env["SPACED"] = "a b";
  ASSERT_TRUE(rt_->Start(spec).ok());
  TaskStatusInfo info = WaitDone(*rt_, id);
  EXPECT_EQ(info.exit_code, 0) << ReadText(rt_->StderrPath(id));
  std::string out = ReadText(rt_->StdoutPath(id));
  EXPECT_NE(out.find("GPUPOOL_TASK=j-1.0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("SPACED=a b\n"), std::string::npos) << out;
  EXPECT_NE(out.find("PATH=/bin\n"), std::string::npos) << out;
  ASSERT_TRUE(rt_->Remove(id).ok());
}

TEST_F(RuncTest, StopKillsATermIgnoringContainerAfterTheGracePeriod) {
  std::string id = UniqueId("runc-stop");
  ASSERT_TRUE(rt_->Start(ContainerSpec(id, {"sh", "-c", "trap '' TERM; echo ready; sleep 60"})).ok());
  ASSERT_EQ(WaitLines(rt_->StdoutPath(id), 1), "ready\n") << ReadText(rt_->StderrPath(id));
  auto start = Clock::now();
  ASSERT_TRUE(rt_->Stop(id, 1s).ok());
  EXPECT_LT(Clock::now() - start, 1s) << "Stop must not wait for the grace period";
  std::this_thread::sleep_for(300ms);
  auto r = rt_->Poll(id);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state, RunState::kRunning);
  TaskStatusInfo info = WaitDone(*rt_, id, 8s);
  EXPECT_EQ(info.state, RunState::kExited);
  EXPECT_EQ(info.term_signal, SIGKILL) << info.message;
  EXPECT_NE(info.message.find("killed by SIGKILL after the grace period"), std::string::npos) << info.message;
  EXPECT_GE(Clock::now() - start, 1s);
  ASSERT_TRUE(rt_->Remove(id).ok());
}

// A stop that comes while the container is still starting — before its process could set up a
// TERM handler, and a namespace's init ignores a TERM it does not handle — still ends it: SIGKILL
// once the grace period is over.
TEST_F(RuncTest, AStopRightAfterTheStartStillEndsTheContainer) {
  for (int delay_ms : {0, 150, 300}) {  // before runc made it, while it starts, once it runs
    std::string id = UniqueId("runc-early-stop");
    ASSERT_TRUE(
        rt_->Start(ContainerSpec(id, {"sh", "-c", "sleep 2; trap 'echo term; exit 0' TERM; echo ready; sleep 60"})).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    auto start = Clock::now();
    ASSERT_TRUE(rt_->Stop(id, 1s).ok());
    TaskStatusInfo info = WaitDone(*rt_, id, 8s);
    EXPECT_EQ(info.state, RunState::kExited) << "stopped " << delay_ms << " ms after the start: " << info.message
                                             << ReadText(rt_->StderrPath(id));
    EXPECT_LT(Clock::now() - start, 5s);
    if (info.state != RunState::kExited) {
      (void)rt_->Stop(id, 0s);
      (void)WaitDone(*rt_, id, 5s);
    }
    ASSERT_TRUE(rt_->Remove(id).ok());
  }
}

TEST_F(RuncTest, LimitsReachTheContainersCgroup) {
  std::string id = UniqueId("runc-limits");
  LaunchSpec spec = ContainerSpec(
      id, {"sh", "-c",
           "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/cpu/cpu.cfs_quota_us "
           "/sys/fs/cgroup/memory.max /sys/fs/cgroup/cpu.max 2>/dev/null; echo CG; cat /proc/self/cgroup"});
  spec.cpu_milli = 500;
  spec.memory_bytes = 64 << 20;
  spec.pids_max = 100;
  ASSERT_TRUE(rt_->Start(spec).ok());
  auto config = nlohmann::json::parse(ReadText(dir_.path() + "/state/" + id + "/bundle/config.json"));
  EXPECT_EQ(config["linux"]["resources"]["memory"]["limit"], 64 << 20);
  EXPECT_EQ(config["linux"]["resources"]["pids"]["limit"], 100);
  EXPECT_EQ(config["linux"]["resources"]["cpu"]["quota"], 50000);
  TaskStatusInfo info = WaitDone(*rt_, id);
  EXPECT_EQ(info.exit_code, 0) << ReadText(rt_->StderrPath(id));
  std::string out = ReadText(rt_->StdoutPath(id));
  EXPECT_NE(out.find(std::to_string(64 << 20) + "\n"), std::string::npos) << out;
  EXPECT_NE(out.find("50000"), std::string::npos) << out;
  // Its own cgroup namespace: its group is the root of what it sees (v1 and v2), no host path.
  EXPECT_NE(out.find("CG\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("gpupool"), std::string::npos) << out;
  EXPECT_EQ(out.find(id), std::string::npos) << out;
  ASSERT_TRUE(rt_->Remove(id).ok());
}

// runc makes the agent's scope (gpupool/agent-<hash>) in every hierarchy and removes only each
// container's own group: the scope goes when the runtime does, and is left while a group is in it.
TEST_F(RuncTest, TheAgentsCgroupScopeGoesWithTheRuntime) {
  const std::string scope = "/gpupool/" + agent_internal::CgroupScope(dir_.path() + "/state");
  std::vector<std::string> hierarchies;
  for (const char* h : {"memory", "pids", "devices", ""}) {
    const std::string base = std::string("/sys/fs/cgroup") + (*h ? "/" : "") + h;
    if (agent_internal::PathExists(base + "/cgroup.procs") || agent_internal::PathExists(base + "/tasks"))
      hierarchies.push_back(base);
  }
  const std::string id = UniqueId("runc-scope");
  LaunchSpec spec = ContainerSpec(id, {"true"});
  spec.memory_bytes = 64 << 20;
  ASSERT_TRUE(rt_->Start(spec).ok());
  EXPECT_EQ(WaitDone(*rt_, id).exit_code, 0) << ReadText(rt_->StderrPath(id));
  std::vector<std::string> made;
  for (const std::string& h : hierarchies) {
    if (agent_internal::PathExists(h + scope)) made.push_back(h + scope);
  }
  if (made.empty()) GTEST_SKIP() << "runc made no group under " << scope << " here";
  ASSERT_TRUE(rt_->Remove(id).ok());
  // A group still in the scope keeps it.
  const std::string held = made.front() + "/held";
  ASSERT_EQ(::mkdir(held.c_str(), 0755), 0) << held;
  rt_.reset();
  EXPECT_TRUE(agent_internal::PathExists(made.front()));
  for (size_t i = 1; i < made.size(); ++i) EXPECT_FALSE(agent_internal::PathExists(made[i])) << made[i];
  ASSERT_EQ(::rmdir(held.c_str()), 0);
  agent_internal::RemoveEmptyCgroupScope("/sys/fs/cgroup", agent_internal::CgroupScope(dir_.path() + "/state"));
  EXPECT_FALSE(agent_internal::PathExists(made.front())) << made.front();
}

TEST_F(RuncTest, ANewRuntimeAdoptsARunningContainer) {
  std::string id = UniqueId("runc-adopt");
  ASSERT_TRUE(rt_->Start(ContainerSpec(id, {"sh", "-c", "echo up; sleep 60"})).ok());
  ASSERT_EQ(WaitLines(rt_->StdoutPath(id), 1), "up\n") << ReadText(rt_->StderrPath(id));
  rt_.reset();
  RuntimeOptions opts;
  opts.state_dir = dir_.path() + "/state";
  auto rt2 = MakeRuncRuntime(opts);
  ASSERT_TRUE(rt2.ok());
  EXPECT_EQ((*rt2)->List(), std::vector<std::string>{id});
  auto r = (*rt2)->Poll(id);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state, RunState::kRunning);
  ASSERT_TRUE((*rt2)->Stop(id, 0s).ok());
  TaskStatusInfo info = WaitDone(**rt2, id);
  EXPECT_EQ(info.state, RunState::kExited);
  EXPECT_EQ(info.term_signal, SIGKILL) << info.message;
  ASSERT_TRUE((*rt2)->Remove(id).ok());
}

// As for a process task: a container whose supervisor died is still stopped, and seen to end.
TEST_F(RuncTest, AStopReachesAContainerWhoseSupervisorDied) {
  std::string id = UniqueId("runc-orphan");
  ASSERT_TRUE(rt_->Start(ContainerSpec(id, {"sh", "-c", "echo up; sleep 60"})).ok());
  ASSERT_EQ(WaitLines(rt_->StdoutPath(id), 1), "up\n") << ReadText(rt_->StderrPath(id));
  auto task_json = nlohmann::json::parse(ReadText(dir_.path() + "/state/" + id + "/task.json"));
  const pid_t supervisor = task_json["supervisor_pid"].get<pid_t>();
  ASSERT_GT(supervisor, 0);
  ASSERT_EQ(::kill(supervisor, SIGKILL), 0);
  auto deadline = Clock::now() + 5s;
  while (agent_internal::ProcessAlive(supervisor, 0) && Clock::now() < deadline) {
    (void)rt_->Poll(id);
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(rt_->Stop(id, 1s).ok());
  // "Unknown" while it may still run (no supervisor to say), until runc says it has stopped.
  TaskStatusInfo info;
  deadline = Clock::now() + 15s;
  do {
    auto r = rt_->Poll(id);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    info = *r;
    std::this_thread::sleep_for(50ms);
  } while (info.state != RunState::kExited && Clock::now() < deadline);
  EXPECT_EQ(info.state, RunState::kExited) << info.message;
  ASSERT_TRUE(rt_->Remove(id).ok());
}

TEST_F(RuncTest, AnExpiredLeaseKillsTheContainer) {
  std::string id = UniqueId("runc-fence");
  const std::string lease = dir_.path() + "/lease";
  // A lease that lasts until the container runs (however slow the machine), then one that ends.
  int64_t now = agent_internal::BootTimeMs();
  ASSERT_TRUE(agent_internal::WriteFileAtomic(lease, std::to_string(now + 60000) + " " + std::to_string(now + 61000)).ok());
  LaunchSpec spec = ContainerSpec(id, {"sh", "-c", "trap '' TERM; echo ready; sleep 67"});
  spec.lease_path = lease;
  ASSERT_TRUE(rt_->Start(spec).ok());
  ASSERT_EQ(WaitLines(rt_->StdoutPath(id), 1), "ready\n") << ReadText(rt_->StderrPath(id));
  now = agent_internal::BootTimeMs();
  ASSERT_TRUE(agent_internal::WriteFileAtomic(lease, std::to_string(now + 500) + " " + std::to_string(now + 1000)).ok());
  TaskStatusInfo info = WaitDone(*rt_, id, 10s);
  EXPECT_EQ(info.state, RunState::kExited) << info.message;
  EXPECT_TRUE(info.fenced) << info.message;
  // No process of the container is left.
  std::string out;
  auto rc = agent_internal::RunCommand({"/bin/sh", "-c", "ps -eo args | grep -c '[s]leep 67' || true"}, &out, 5s);
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(out, "0\n");
  ASSERT_TRUE(rt_->Remove(id).ok());
}

// The task execs only once the starter has recorded it: a starter that fails to (or dies first)
// leaves nothing running that a restarted agent would not know of, so nothing runs twice.
TEST(Spawn, TheTaskRunsOnlyAfterItsRecordIsWritten) {
  TempDir dir;
  const std::string marker = dir.path() + "/ran";
  agent_internal::SpawnRequest req;
  req.executable = "/bin/sh";
  req.argv = {"sh", "-c", "touch " + marker};
  req.envp = {"PATH=/usr/bin:/bin"};
  req.workdir = dir.path();
  req.stdout_path = dir.path() + "/out";
  req.stderr_path = dir.path() + "/err";
  req.exit_path = dir.path() + "/exit.json";
  pid_t seen_task = -1;
  req.before_exec = [&](const agent_internal::SpawnResult& s) {
    seen_task = s.task;
    return Status::IoError("the record could not be written");
  };
  auto r = agent_internal::SpawnSupervised(req);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "the record could not be written");
  EXPECT_GT(seen_task, 0);
  std::this_thread::sleep_for(200ms);
  EXPECT_NE(::access(marker.c_str(), F_OK), 0) << "the task ran although its record was never written";

  // Recorded: it runs, and the record callback saw the pids before the exec.
  req.before_exec = [&](const agent_internal::SpawnResult& s) {
    seen_task = s.task;
    return Status::Ok();
  };
  auto ok = agent_internal::SpawnSupervised(req);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(seen_task, ok->task);
  const auto deadline = Clock::now() + 5s;
  while (::access(marker.c_str(), F_OK) != 0 && Clock::now() < deadline) std::this_thread::sleep_for(20ms);
  EXPECT_EQ(::access(marker.c_str(), F_OK), 0);
  int status = 0;
  ::waitpid(ok->supervisor, &status, 0);
}

TEST(WriteFileAtomic, ALinkPlantedAtTheTemporaryNameIsRemovedNotWrittenThrough) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string victim = dir.path() + "/victim", path = dir.path() + "/state.json";
  ASSERT_TRUE(agent_internal::WriteFileAtomic(victim, "precious\n").ok());
  ASSERT_EQ(::symlink(victim.c_str(), (path + ".tmp").c_str()), 0);
  ASSERT_TRUE(agent_internal::WriteFileAtomic(path, "{}\n").ok());
  std::ifstream v(victim), p(path);
  std::string vt((std::istreambuf_iterator<char>(v)), {}), pt((std::istreambuf_iterator<char>(p)), {});
  EXPECT_EQ(vt, "precious\n");
  EXPECT_EQ(pt, "{}\n");
  struct stat st;
  EXPECT_NE(::lstat((path + ".tmp").c_str(), &st), 0) << "the temporary name is gone after the rename";
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

}  // namespace
}  // namespace gpupool
