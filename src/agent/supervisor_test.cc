// The task supervisor as a program of its own: its command line, what it is and what it holds
// while a task runs, and what it does with a command line that is not the agent's.
#include <fcntl.h>
#include <limits.h>
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
#include "agent/supervisor_protocol.h"

namespace gpupool {
namespace {

using namespace std::chrono_literals;
using agent_internal::DecodeSupervisorArgs;
using agent_internal::EncodeSupervisorArgs;
using agent_internal::SupervisorPlan;

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Link(const std::string& path) {
  char buf[PATH_MAX];
  ssize_t n = ::readlink(path.c_str(), buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

bool Decode(const std::vector<std::string>& args, SupervisorPlan* plan, std::string* why) {
  std::vector<const char*> argv{"gpupool-supervise"};
  for (const auto& a : args) argv.push_back(a.c_str());
  return DecodeSupervisorArgs(static_cast<int>(argv.size()), argv.data(), plan, why);
}

SupervisorPlan FullPlan() {
  SupervisorPlan p;
  p.executable = "/bin/sh";
  p.argv = {"sh", "-c", "echo --exe=/bin/evil -- x", "--", "--env=A=B", ""};
  p.envp = {"PATH=/bin", "ODD=a=b=c", "EMPTY=", "NL=line1\nline2"};
  p.workdir = "/tmp/a dir";
  p.cgroup_procs = {"/sys/fs/cgroup/cpu/gpupool/t/cgroup.procs", "/sys/fs/cgroup/memory/gpupool/t/cgroup.procs"};
  p.exit_path = "/tmp/t/exit.json";
  p.lease_path = "/tmp/lease";
  p.fence_argv = {"/usr/sbin/runc", "kill", "--all", "t", "KILL"};
  p.stdout_path = "/tmp/t/stdout.log";
  p.stderr_path = "/tmp/t/stderr.log";
  p.log_max_bytes = int64_t{64} << 20;
  p.log_keep = 3;
  p.run_files = {{"libgpupool-cuda.so", "/usr/lib/gpupool/libgpupool-cuda.so", false},
                 {"cuda-ledger", "/var/lib/gpupool/t/work/.ledger:with:colons", true}};
  p.preload_list = "/var/lib/gpupool/t/ld.so.preload";
  return p;
}

TEST(SupervisorArgs, RoundTripKeepsEveryByteOfArgvAndEnvironment) {
  const SupervisorPlan in = FullPlan();
  SupervisorPlan out;
  std::string why;
  ASSERT_TRUE(Decode(EncodeSupervisorArgs(in), &out, &why)) << why;
  EXPECT_EQ(out.executable, in.executable);
  EXPECT_EQ(out.argv, in.argv);  // options and "--" inside the task's argv stay the task's
  EXPECT_EQ(out.envp, in.envp);
  EXPECT_EQ(out.workdir, in.workdir);
  EXPECT_EQ(out.cgroup_procs, in.cgroup_procs);
  EXPECT_EQ(out.exit_path, in.exit_path);
  EXPECT_EQ(out.lease_path, in.lease_path);
  EXPECT_EQ(out.fence_argv, in.fence_argv);
  EXPECT_EQ(out.stdout_path, in.stdout_path);
  EXPECT_EQ(out.stderr_path, in.stderr_path);
  EXPECT_EQ(out.log_max_bytes, in.log_max_bytes);
  EXPECT_EQ(out.log_keep, in.log_keep);
  ASSERT_EQ(out.run_files.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(out.run_files[i].name, in.run_files[i].name);
    EXPECT_EQ(out.run_files[i].source, in.run_files[i].source);
    EXPECT_EQ(out.run_files[i].writable, in.run_files[i].writable);
  }
  EXPECT_EQ(out.preload_list, in.preload_list);
  EXPECT_TRUE(out.mount_namespace());
}

TEST(SupervisorArgs, MalformedCommandLinesAreRefusedNamingWhy) {
  auto encoded = EncodeSupervisorArgs(FullPlan());
  auto without = [&](const std::string& prefix) {
    std::vector<std::string> v;
    for (const auto& a : encoded)
      if (a.rfind(prefix, 0) != 0) v.push_back(a);
    return v;
  };
  auto with = [&](const std::string& extra) {
    std::vector<std::string> v{extra};
    v.insert(v.end(), encoded.begin(), encoded.end());
    return v;
  };
  struct Case {
    std::vector<std::string> args;
    std::string why;
  } cases[] = {
      {{}, "no --exe"},
      {without("--exe="), "no --exe"},
      {without("--exit="), "no --exit"},
      {without("--workdir="), "no --workdir"},
      {without("--stdout="), "no --stdout or --stderr"},
      {{"--exe=/bin/true", "--workdir=/", "--exit=/x", "--stdout=/o", "--stderr=/e", "--"}, "no task argv after --"},
      {with("--bogus=1"), "unknown option '--bogus'"},
      {with("stray"), "unexpected argument 'stray'"},
      {with("--exe"), "unexpected argument '--exe'"},
      {with("--log-keep=10"), "--log-keep is not an integer in [0, 9]"},
      {with("--log-keep=-1"), "--log-keep is not an integer in [0, 9]"},
      {with("--log-max-bytes=12x"), "--log-max-bytes is not an integer"},
      {with("--log-max-bytes=99999999999999999999"), "--log-max-bytes is not an integer"},
      // Run files land in a directory of the supervisor's: a name is a plain name, never a path.
      {with("--run-file=ro:../etc/passwd:/x"), "--run-file is not ro:NAME:/path or rw:NAME:/path"},
      {with("--run-file=ro:..:/x"), "--run-file is not ro:NAME:/path or rw:NAME:/path"},
      {with("--run-file=ro:a/b:/x"), "--run-file is not ro:NAME:/path or rw:NAME:/path"},
      {with("--run-file=rx:a:/x"), "--run-file is not ro:NAME:/path or rw:NAME:/path"},
      {with("--run-file=ro:a:relative"), "--run-file is not ro:NAME:/path or rw:NAME:/path"},
      {with("--run-file=ro::/x"), "--run-file is not ro:NAME:/path or rw:NAME:/path"},
      {with("--run-file=ro:a"), "--run-file is not ro:NAME:/path or rw:NAME:/path"},
      {with("--run-file=ro:a:"), "--run-file is not ro:NAME:/path or rw:NAME:/path"},
      {with("--run-file=ro:" + std::string(65, 'a') + ":/x"), "--run-file is not ro:NAME:/path or rw:NAME:/path"},
      {with("--run-file=rw:cuda-ledger:/y"), "--run-file names cuda-ledger twice"},
      {with("--preload-list=etc/ld.so.preload"), "--preload-list is not an absolute path"},
  };
  for (const auto& c : cases) {
    SupervisorPlan plan;
    std::string why;
    EXPECT_FALSE(Decode(c.args, &plan, &why)) << c.why;
    EXPECT_EQ(why, c.why);
  }
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/gpupool-sup-XXXXXX";
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

// A task's supervisor is gpupool-supervise, not a copy of the agent; it has none of the agent's
// descriptors and none of the task's environment; the task has its environment.
TEST(Supervisor, IsItsOwnSmallProgramWithoutTheAgentsFilesOrTheTasksEnvironment) {
  ASSERT_FALSE(agent_internal::SupervisorPath().empty());
  TempDir dir;
  // A descriptor of the agent's without close-on-exec, as a careless library might leave one.
  const std::string marker = dir.path() + "/agent-secret";
  int leaked = ::open(marker.c_str(), O_WRONLY | O_CREAT, 0600);
  ASSERT_GE(leaked, 0);
  RuntimeOptions opts;
  opts.state_dir = dir.path() + "/state";
  opts.cgroup_root = "none";
  auto rt = MakeProcessRuntime(opts);
  ASSERT_TRUE(rt.ok()) << rt.status().ToString();
  LaunchSpec spec;
  spec.id = "sup-" + std::to_string(::getpid());
  spec.argv = {"sleep", "30"};
  spec.env = {{"PATH", "/usr/bin:/bin"}, {"TENANT_SECRET", "hunter2"}, {"LD_PRELOAD", "/nonexistent/evil.so"}};
  ASSERT_TRUE((*rt)->Start(spec).ok());
  auto rec = nlohmann::json::parse(ReadText(opts.state_dir + "/" + spec.id + "/task.json"));
  const int sup = rec["supervisor_pid"].get<int>();
  const int task = rec["pid"].get<int>();
  ASSERT_GT(sup, 0);
  const std::string sup_proc = "/proc/" + std::to_string(sup);
  EXPECT_EQ(Link(sup_proc + "/exe"), agent_internal::SupervisorPath());
  const std::string sup_env = ReadText(sup_proc + "/environ");
  EXPECT_EQ(sup_env.find("TENANT_SECRET"), std::string::npos);
  EXPECT_EQ(sup_env.find("LD_PRELOAD"), std::string::npos);
  const std::string task_env = ReadText("/proc/" + std::to_string(task) + "/environ");
  EXPECT_NE(task_env.find(std::string("TENANT_SECRET=hunter2\0", 22)), std::string::npos);
  // Its descriptors: stdio on /dev/null, the two log files and the task's output pipes (and a
  // pidfd); none of the agent's.
  for (const char* fd : {"0", "1", "2"}) EXPECT_EQ(Link(sup_proc + "/fd/" + fd), "/dev/null") << fd;
  int count = 0;
  for (int fd = 0; fd < 64; ++fd) {
    const std::string target = Link(sup_proc + "/fd/" + std::to_string(fd));
    if (target.empty()) continue;
    ++count;
    EXPECT_NE(target, marker) << "fd " << fd;
    EXPECT_TRUE(target == "/dev/null" || target.find("/stdout.log") != std::string::npos ||
                target.find("/stderr.log") != std::string::npos || target.rfind("pipe:", 0) == 0 ||
                target.rfind("anon_inode:", 0) == 0)
        << "fd " << fd << " -> " << target;
  }
  EXPECT_LE(count, 8);
  ::close(leaked);
  ASSERT_TRUE((*rt)->Stop(spec.id, 1s).ok());
  for (int i = 0; i < 200; ++i) {
    auto st = (*rt)->Poll(spec.id);
    ASSERT_TRUE(st.ok());
    if (st->state != RunState::kRunning) break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE((*rt)->Remove(spec.id).ok());
}

// Started by hand with a command line that is not the agent's, it says so on its status pipe
// and exits; it runs nothing.
TEST(Supervisor, ACommandLineThatIsNotTheAgentsRunsNothing) {
  int status_pipe[2];
  ASSERT_EQ(::pipe(status_pipe), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::dup2(status_pipe[1], 3);
    const char* path = agent_internal::SupervisorPath().c_str();
    const char* argv[] = {"gpupool-supervise", "--exe=/bin/touch", "--", "/tmp/never", nullptr};
    ::execv(path, const_cast<char* const*>(argv));
    ::_exit(127);
  }
  ::close(status_pipe[1]);
  int32_t msg[2] = {0, 0};
  EXPECT_EQ(::read(status_pipe[0], msg, sizeof(msg)), static_cast<ssize_t>(sizeof(msg)));
  EXPECT_EQ(msg[0], agent_internal::kMsgPlan);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 126);
  ::close(status_pipe[0]);
}

}  // namespace
}  // namespace gpupool
