// The task sandbox of the process runtime, tried the way a hostile tenant would: another task's
// files, logs and environment, the agent's state, devices it was not given, setuid binaries, the
// supervisor's command line. Needs root (it switches identities and builds mount namespaces); as
// another user every test is skipped and says so.
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "agent/runtime.h"
#include "agent/runtime_internal.h"
#include "agent/sandbox_test_util.h"

namespace gpupool {
namespace {

using namespace sandbox_test;

constexpr int64_t kUidA = 20101;
constexpr int64_t kUidB = 20102;

std::string UniqueId(const std::string& name) { return name + "-" + std::to_string(::getpid()); }

class SandboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "the sandbox needs root";
    char tmpl[] = "/tmp/gpupool-sb-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    // A state directory any user may traverse (as /var/lib is): the sandbox must still hide it.
    ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);
    RuntimeOptions opts;
    opts.state_dir = dir_ + "/state";
    opts.log_dir = dir_ + "/logs";
    opts.cgroup_root = "none";
    auto rt = MakeProcessRuntime(opts);
    ASSERT_TRUE(rt.ok()) << rt.status().ToString();
    rt_ = std::move(rt).value();
  }
  void TearDown() override {
    if (rt_) StopAndRemoveAll(*rt_);
    if (!dir_.empty()) (void)agent_internal::RemoveTree(dir_);
  }

  LaunchSpec Spec(const std::string& id, int64_t uid, const std::string& script) {
    LaunchSpec s;
    s.id = UniqueId(id);
    s.argv = {"sh", "-c", script};
    s.env = {{"PATH", "/usr/bin:/bin"}};
    s.uid = uid;
    s.gid = uid;
    s.no_new_privs = true;
    s.private_dev = true;
    return s;
  }

  TaskStatusInfo Wait(const std::string& id) { return WaitEnd(*rt_, id, 10s); }
  std::string Run(const LaunchSpec& spec) { return RunToEnd(*rt_, spec, 10s); }

  std::string dir_;
  std::unique_ptr<Runtime> rt_;
};

TEST_F(SandboxTest, TheTaskRunsAsItsUidWithNoGroupsNoCapabilitiesAndNoNewPrivileges) {
  LaunchSpec spec = Spec("ident", kUidA,
                         "id -u; id -g; id -G; grep -E '^(CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status; "
                         "pwd; stat -c '%u %a' .");
  std::string out = Run(spec);
  EXPECT_NE(out.find("20101\n20101\n20101\n"), std::string::npos) << out;
  for (const char* line : {"CapPrm:\t0000000000000000", "CapEff:\t0000000000000000", "CapBnd:\t0000000000000000",
                           "CapAmb:\t0000000000000000", "NoNewPrivs:\t1"})
    EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
  // Its working directory is its own, mode 0700.
  EXPECT_NE(out.find(dir_ + "/state/" + spec.id + "/work\n20101 700\n"), std::string::npos) << out;
}

TEST_F(SandboxTest, ATaskCannotReadAnotherTenantsFilesLogsEnvironmentOrTheAgentsState) {
  // Tenant A: a secret in its environment, its log and its directory; it waits.
  LaunchSpec a = Spec("victim", kUidA, "echo log-secret-a; echo file-secret-a > secret; echo $$ > pid; sleep 30");
  a.env["DB_PASSWORD"] = "env-secret-a";
  ASSERT_TRUE(rt_->Start(a).ok());
  const std::string a_work = dir_ + "/state/" + a.id + "/work";
  std::string pid;
  for (int i = 0; i < 200 && pid.empty(); ++i) {
    pid = ReadText(a_work + "/pid");
    if (pid.empty()) std::this_thread::sleep_for(20ms);
  }
  ASSERT_FALSE(pid.empty());
  while (!pid.empty() && pid.back() == '\n') pid.pop_back();
  // The log pump copies the task's output to its log on its own time: the pid file may come first.
  const std::string a_log = rt_->StdoutPath(a.id);
  for (int i = 0; i < 250 && ReadText(a_log).find("log-secret-a") == std::string::npos; ++i)
    std::this_thread::sleep_for(20ms);
  ASSERT_NE(ReadText(a_log).find("log-secret-a"), std::string::npos);
  // A file of the agent's that any user could read on the host.
  ASSERT_TRUE(agent_internal::WriteFileAtomic(dir_ + "/state/agent-token", "agent-secret\n").ok());
  ASSERT_EQ(::chmod((dir_ + "/state/agent-token").c_str(), 0644), 0);

  // Tenant B tries each, and says what it saw.
  std::string probe =
      "for f in " + a_work + "/secret " + a_log + " /proc/" + pid + "/environ /proc/" + pid + "/cmdline " + dir_ +
      "/state/agent-token " + dir_ + "/state/" + a.id + "/task.json; do "
      "if cat $f >/dev/null 2>&1; then echo READ $f; else echo DENIED $f; fi; done; "
      "ls -A " + dir_ + "/state | sed 's/^/STATE /'; ls -A " + dir_ + "/logs 2>&1 | sed 's/^/LOGS /'; "
      "[ -e /proc/1/status ] && echo INIT-VISIBLE; [ -e /proc/" + pid + " ] && echo VICTIM-VISIBLE; true";
  std::string out = Run(Spec("thief", kUidB, probe));
  for (const std::string& f : {a_work + "/secret", a_log, "/proc/" + pid + "/environ", "/proc/" + pid + "/cmdline",
                               dir_ + "/state/agent-token", dir_ + "/state/" + a.id + "/task.json"})
    EXPECT_NE(out.find("DENIED " + f + "\n"), std::string::npos) << f << "\n" << out;
  EXPECT_EQ(out.find("READ "), std::string::npos) << out;
  EXPECT_EQ(out.find("secret-a"), std::string::npos) << out;
  // The state directory shows only the path to B's own work directory; the logs nothing.
  const std::string thief_id = UniqueId("thief");
  EXPECT_NE(out.find("STATE " + thief_id + "\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("STATE " + a.id), std::string::npos) << out;
  EXPECT_EQ(out.find("STATE agent-token"), std::string::npos) << out;
  EXPECT_EQ(out.find("LOGS "), std::string::npos) << out;
  // Only its own processes (its shell and the tools it runs), none of the host's or A's.
  EXPECT_EQ(out.find("INIT-VISIBLE"), std::string::npos) << out;
  EXPECT_EQ(out.find("VICTIM-VISIBLE"), std::string::npos) << out;
}

TEST_F(SandboxTest, OnlyTheAssignedDevicesAreInTheTasksDev) {
  // A stand-in for "its GPU" and "another GPU": two loop devices of the host.
  struct stat st;
  if (::stat("/dev/loop1", &st) != 0 || ::stat("/dev/loop2", &st) != 0) GTEST_SKIP() << "no /dev/loop1 and loop2";
  LaunchSpec spec = Spec("dev", kUidA, "ls /dev | tr '\\n' ' '; echo; for d in /dev/loop1 /dev/loop2; do "
                                       "[ -e $d ] && echo HAS $d || echo NO $d; done; echo x > /dev/null && echo NULL-OK");
  spec.devices = {"/dev/loop1", "/dev/gpupool-absent", "/etc/passwd"};
  std::string out = Run(spec);
  EXPECT_NE(out.find("HAS /dev/loop1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("NO /dev/loop2\n"), std::string::npos) << out;
  EXPECT_NE(out.find("NULL-OK"), std::string::npos) << out;
  EXPECT_NE(out.find("fd full loop1 null ptmx pts random shm stderr stdin stdout tty urandom zero \n"), std::string::npos)
      << out;
}

TEST_F(SandboxTest, ASetuidRootBinaryGrantsNothing) {
  // A setuid-root copy of `id` where the task can run it.
  const std::string bin = dir_ + "/suid-id";
  {
    std::ifstream src("/usr/bin/id", std::ios::binary);
    std::ofstream dst(bin, std::ios::binary);
    dst << src.rdbuf();
  }
  ASSERT_EQ(::chmod(bin.c_str(), 04755), 0);
  LaunchSpec spec = Spec("suid", kUidA, bin + " -u; " + bin + " -ru");
  std::string out = Run(spec);
  // Effective and real: the task's, not root's.
  EXPECT_EQ(out.substr(0, 12), "20101\n20101\n") << out;
}

TEST_F(SandboxTest, HiddenPathsAreEmptyAndKeptPathsStayWritable) {
  const std::string secret_dir = dir_ + "/server-data";
  const std::string keep = secret_dir + "/ckpt/job-1";
  ASSERT_TRUE(agent_internal::MakeDirs(keep).ok());
  ASSERT_EQ(::chmod(secret_dir.c_str(), 0755), 0);
  ASSERT_TRUE(agent_internal::MakeOwnedDir(keep, kUidA, kUidA).ok());
  ASSERT_TRUE(agent_internal::WriteFileAtomic(secret_dir + "/admin.token", "tok-secret\n").ok());
  ASSERT_EQ(::chmod((secret_dir + "/admin.token").c_str(), 0644), 0);
  ASSERT_TRUE(agent_internal::WriteFileAtomic(dir_ + "/server.yaml", "tokens: secret\n").ok());
  ASSERT_EQ(::chmod((dir_ + "/server.yaml").c_str(), 0644), 0);
  LaunchSpec spec = Spec("hide", kUidA, "cat " + secret_dir + "/admin.token; cat " + dir_ + "/server.yaml | wc -c; "
                                        "echo step > " + keep + "/ck.txt && echo WROTE; touch " + secret_dir +
                                        "/x 2>/dev/null || echo RO");
  spec.hide_paths = {secret_dir, dir_ + "/server.yaml"};
  spec.keep_paths = {keep};
  std::string out = Run(spec);
  EXPECT_EQ(out.find("tok-secret"), std::string::npos) << out;
  EXPECT_NE(out.find("0\nWROTE\nRO\n"), std::string::npos) << out;
  EXPECT_EQ(ReadText(keep + "/ck.txt"), "step\n");
}

TEST_F(SandboxTest, TheSupervisorsCommandLineDoesNotCarryTheTasksEnvironment) {
  LaunchSpec spec = Spec("cmdline", kUidA, "sleep 30");
  spec.env["DB_PASSWORD"] = "env-secret-in-cmdline";
  ASSERT_TRUE(rt_->Start(spec).ok());
  auto rec = nlohmann::json::parse(ReadText(dir_ + "/state/" + spec.id + "/task.json"));
  const int sup = rec.value("supervisor_pid", -1);
  ASSERT_GT(sup, 0) << rec.dump();
  std::string cmdline = ReadText("/proc/" + std::to_string(sup) + "/cmdline");
  ASSERT_FALSE(cmdline.empty());
  EXPECT_EQ(cmdline.find("env-secret"), std::string::npos) << cmdline;
  EXPECT_EQ(cmdline.find("DB_PASSWORD"), std::string::npos) << cmdline;
}

TEST_F(SandboxTest, ARootQueuesTaskWithTheStateHiddenStillRunsInItsTaskDirectory) {
  // Under a directory only root may pass (a CI checkout in a mkdtemp directory): root's task
  // still sees its files beside the state directory.
  ASSERT_EQ(::chmod(dir_.c_str(), 0700), 0);
  ASSERT_TRUE(agent_internal::WriteFileAtomic(dir_ + "/task.py", "print('hi')\n").ok());
  LaunchSpec spec = Spec("root-task", -1, "id -u; pwd; echo ok > mark && cat mark; cat " + dir_ + "/task.py");
  spec.gid = -1;
  spec.hide_paths = {dir_ + "/state"};
  std::string out = Run(spec);
  EXPECT_EQ(out.substr(0, 2), "0\n") << out;
  EXPECT_NE(out.find(dir_ + "/state/" + spec.id + "\nok\nprint('hi')\n"), std::string::npos) << out;
}

TEST_F(SandboxTest, AWorkingDirectoryTheTaskMayNotEnterIsRefusedAtStart) {
  ASSERT_TRUE(agent_internal::MakeDirs(dir_ + "/root-only").ok());
  ASSERT_EQ(::chmod((dir_ + "/root-only").c_str(), 0700), 0);
  LaunchSpec spec = Spec("wd", kUidA, "true");
  spec.workdir = dir_ + "/root-only";
  Status st = rt_->Start(spec);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("cannot change to the working directory"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("Permission denied"), std::string::npos) << st.ToString();
}

// workingDir is the job's choice: it never brings back what the sandbox hides (a root queue's task
// whose working directory is the hidden directory sees it empty), and it works where the task may go.
TEST_F(SandboxTest, AWorkingDirectoryOfTheJobsChoiceNeverUncoversAHiddenPath) {
  const std::string secret_dir = dir_ + "/state-of-another";
  ASSERT_TRUE(agent_internal::MakeDirs(secret_dir + "/task-b/work").ok());
  ASSERT_TRUE(agent_internal::WriteFileAtomic(secret_dir + "/task-b/work/secret", "other-tenant-secret\n").ok());
  LaunchSpec spec = Spec("wd-hidden", -1, "pwd; cat secret 2>/dev/null || echo NOSECRET");
  spec.gid = -1;
  spec.hide_paths = {secret_dir};
  spec.workdir = secret_dir + "/task-b/work";
  Status st = rt_->Start(spec);
  if (st.ok()) {  // started (the directory shows empty) or refused: never the other task's files
    Wait(spec.id);
    const std::string out = ReadText(rt_->StdoutPath(spec.id));
    EXPECT_EQ(out.find("other-tenant-secret"), std::string::npos) << out;
  } else {
    EXPECT_NE(st.message().find("cannot change to the working directory"), std::string::npos) << st.ToString();
  }
  std::string out;

  const std::string data = dir_ + "/data";
  ASSERT_TRUE(agent_internal::MakeOwnedDir(data, kUidA, kUidA).ok());
  LaunchSpec mine = Spec("wd-mine", kUidA, "pwd; echo x > out && echo WROTE");
  mine.workdir = data;
  mine.hide_paths = {secret_dir};
  out = Run(mine);
  EXPECT_NE(out.find(data + "\nWROTE\n"), std::string::npos) << out;
}

// The CUDA limiter preloaded into a process task is a property of its mount namespace, as in a
// container: a program run with LD_PRELOAD cleared still loads it (/etc/ld.so.preload), the limits
// it reads are a read-only file, and none of it can be changed, moved or unmounted by the task.
// The host's own /etc/ld.so.preload is left naming nothing of the task's.
TEST_F(SandboxTest, TheCudaLimiterHoldsAProcessTaskThatClearsItsEnvironment) {
  const std::string host_list_before = ReadText("/etc/ld.so.preload");
  LaunchSpec spec =
      Spec("limiter", kUidA,
           "echo \"preload=$LD_PRELOAD\"; echo \"ledger=$GPUPOOL_CUDA_LEDGER\"; "
           "(env -u LD_PRELOAD GPUPOOL_GPU_MEMORY_BYTES=99999999999 grep -q '/run/gpupool/libgpupool-cuda.so' /proc/self/maps "
           "&& echo MAPPED || echo NOT-MAPPED); "
           "cat /run/gpupool/cuda-limits; echo list:; cat /etc/ld.so.preload; ls /run/gpupool | tr '\\n' ' '; echo; "
           "(echo memory_bytes= > /run/gpupool/cuda-limits) 2>/dev/null || echo LIMITS-RO; "
           "(echo /tmp/mine.so > /etc/ld.so.preload) 2>/dev/null || echo LIST-RO; "
           "touch /run/gpupool/cuda-limits-2 2>/dev/null || echo DIR-RO; "
           "mv /run/gpupool/cuda-limits /run/gpupool/x 2>/dev/null || echo NO-MOVE; "
           "umount /etc/ld.so.preload 2>/dev/null || umount -l /run/gpupool 2>/dev/null || echo NO-UMOUNT; "
           "test -w /run/gpupool/cuda-ledger && echo LEDGER-RW");
  spec.cuda_ledger = true;
  spec.cuda_limiter = GPUPOOL_CUDA_PRELOAD_PATH;
  spec.env["LD_PRELOAD"] = GPUPOOL_CUDA_PRELOAD_PATH;
  spec.env["GPUPOOL_GPU_MEMORY_BYTES"] = "1073741824";
  spec.env["GPUPOOL_GPU_SHARES_MILLI"] = "250";
  const std::string out = Run(spec);
  EXPECT_NE(out.find("preload=/run/gpupool/libgpupool-cuda.so\nledger=/run/gpupool/cuda-ledger\n"), std::string::npos)
      << out;
  // Mapped into a program whose environment had no LD_PRELOAD (grep reads its own maps).
  EXPECT_NE(out.find("\nMAPPED\n"), std::string::npos) << out;
  EXPECT_NE(out.find("memory_bytes=1073741824\nshares_milli=250\nledger=/run/gpupool/cuda-ledger\nlist:\n"
                     "/run/gpupool/libgpupool-cuda.so\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("cuda-ledger cuda-limits libgpupool-cuda.so \n"), std::string::npos) << out;
  EXPECT_NE(out.find("LIMITS-RO\nLIST-RO\nDIR-RO\nNO-MOVE\nNO-UMOUNT\nLEDGER-RW\n"), std::string::npos) << out;
  // The host's list is what it was (an empty one is made when there was none), and nothing of the
  // task's is in the host's /run/gpupool.
  EXPECT_EQ(ReadText("/etc/ld.so.preload"), host_list_before);
  struct stat st;
  EXPECT_NE(::stat("/run/gpupool/cuda-limits", &st), 0);
  // The task's limits file, as the agent wrote it: root's and read-only.
  ASSERT_EQ(::stat((dir_ + "/state/" + spec.id + "/cuda-limits").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(st.st_mode & 07777, 0444u);
}

}  // namespace
}  // namespace gpupool
