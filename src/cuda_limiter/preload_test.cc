// libgpupool-cuda.so preloaded into tests/fake_cuda/cuda_probe on the fake driver
// (tests/fake_cuda/fake_cuda.cc): what a program sees of the limits, through each way a program
// reaches the driver. Each test runs the probe as a child process; none asserts a lower bound on
// time.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cuda_limiter/shared_ledger.h"

extern char** environ;

namespace gpupool::cuda_limiter {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

struct ProbeRun {
  int status = -1;  // exit status, or -1
  std::map<std::string, std::string> values;
  std::string err;
  uint64_t U(const std::string& key) const {
    auto it = values.find(key);
    return it == values.end() ? UINT64_MAX : std::strtoull(it->second.c_str(), nullptr, 10);
  }
  double D(const std::string& key) const {
    auto it = values.find(key);
    return it == values.end() ? 1e9 : std::strtod(it->second.c_str(), nullptr);
  }
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A probe started and not yet waited for.
struct StartedProbe {
  pid_t pid = -1;
  std::string out_path, err_path;
};

// Starts cuda_probe with the fake driver, the limiter preloaded (unless preload is false) and env
// added to this process's environment (less anything the limiter or the fake reads).
// With cwd, the probe runs there with the test build of the library (whose limits file is
// GPUPOOL_CUDA_LIMITS_TEST_FILE, relative to the working directory).
StartedProbe StartProbe(const std::vector<std::string>& args, const std::vector<std::string>& env,
                        bool preload = true, const std::string& cwd = "") {
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string variable(*entry);
    if (variable.rfind("LD_PRELOAD=", 0) != 0 && variable.rfind("LD_LIBRARY_PATH=", 0) != 0 &&
        variable.rfind("GPUPOOL_", 0) != 0 && variable.rfind("FAKE_CUDA_", 0) != 0) {
      environment.push_back(variable);
    }
  }
  environment.push_back(std::string("LD_LIBRARY_PATH=") + FAKE_CUDA_DIR + ":" + FAKE_NVML_DIR);
  if (preload)
    environment.push_back(std::string("LD_PRELOAD=") +
                          (cwd.empty() ? GPUPOOL_CUDA_PRELOAD_PATH : GPUPOOL_CUDA_LIMITS_TEST_PRELOAD_PATH));
  environment.insert(environment.end(), env.begin(), env.end());
  std::vector<std::string> argv_strings = {CUDA_PROBE_PATH};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv, envp;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  for (std::string& s : environment) envp.push_back(s.data());
  argv.push_back(nullptr);
  envp.push_back(nullptr);

  char out_path[] = "/tmp/cuda_probe_out_XXXXXX";
  char err_path[] = "/tmp/cuda_probe_err_XXXXXX";
  const int out = mkstemp(out_path), err = mkstemp(err_path);
  StartedProbe started;
  if (out < 0 || err < 0) return started;
  started.out_path = out_path;
  started.err_path = err_path;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err, STDERR_FILENO);
  if (!cwd.empty()) posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str());
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, CUDA_PROBE_PATH, &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(out);
  close(err);
  if (spawned == 0) started.pid = pid;
  return started;
}

// Waits (at most 30 s, then kills it) for a started probe and reads what it printed.
ProbeRun FinishProbe(const StartedProbe& started) {
  ProbeRun run;
  if (started.pid > 0) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    int wstatus = 0;
    while (waitpid(started.pid, &wstatus, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(started.pid, SIGKILL);
        waitpid(started.pid, &wstatus, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (WIFEXITED(wstatus)) run.status = WEXITSTATUS(wstatus);
  }
  if (started.out_path.empty()) return run;
  std::istringstream lines(ReadAll(started.out_path));
  for (std::string line; std::getline(lines, line);) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) run.values[line.substr(0, eq)] = line.substr(eq + 1);
  }
  run.err = ReadAll(started.err_path);
  unlink(started.out_path.c_str());
  unlink(started.err_path.c_str());
  return run;
}

ProbeRun Probe(const std::vector<std::string>& args, const std::vector<std::string>& env,
               bool preload = true) {
  return FinishProbe(StartProbe(args, env, preload));
}

// Runs the probe with the test build of the library in a directory of its own, holding a limits
// file with `contents` and `mode` (none when contents is nullopt).
ProbeRun ProbeWithLimitsFile(const std::vector<std::string>& args, const std::vector<std::string>& env,
                             const std::optional<std::string>& contents, mode_t mode = 0444) {
  char dir[] = "/tmp/cuda_limits_XXXXXX";
  if (mkdtemp(dir) == nullptr) return ProbeRun{};
  const std::string file = std::string(dir) + "/" + GPUPOOL_CUDA_LIMITS_TEST_FILE;
  if (contents) {
    std::ofstream(file) << *contents;
    chmod(file.c_str(), mode);
  }
  ProbeRun run = FinishProbe(StartProbe(args, env, true, dir));
  unlink(file.c_str());
  rmdir(dir);
  return run;
}

// 10 GiB on device 0 of the fake's two, no cap on device 1.
const std::string kTenGiB = "GPUPOOL_GPU_MEMORY_BYTES=" + std::to_string(10 * kGiB) + ",0";
constexpr uint64_t kCap = 10 * kGiB;
constexpr uint64_t kFakeDevice = 80 * kGiB;  // the fake's default

// The figures of one `alloc` run against a cap: what it got, what it could get back after freeing
// and what cuMemGetInfo said, all within the cap.
void ExpectCapped(const ProbeRun& run, const std::string& kind) {
  SCOPED_TRACE(kind + "\n" + run.err);
  ASSERT_EQ(run.status, 0);
  EXPECT_EQ(run.U("init"), 0U);
  const uint64_t obtained = run.U("obtained");
  EXPECT_LE(obtained, kCap);
  EXPECT_GT(obtained, kCap - 2 * kGiB);
  EXPECT_EQ(run.U("obtained_error"), 2U);  // CUDA_ERROR_OUT_OF_MEMORY
  EXPECT_EQ(run.U("info_total"), kCap);
  EXPECT_EQ(run.U("info_free"), kCap - obtained);
  const uint64_t freed = run.U("freed"), reobtained = run.U("reobtained");
  EXPECT_GT(freed, 0U);
  EXPECT_GE(reobtained + kGiB + 1024 * 1024, freed);  // what was freed can be had again
  const uint64_t held = obtained - freed + reobtained;
  EXPECT_LE(held, kCap);
  EXPECT_EQ(run.U("final_total"), kCap);
  EXPECT_EQ(run.U("final_free"), kCap - held);
  EXPECT_EQ(run.U("destroy"), 0U);
  if (kind == "vmm") {
    EXPECT_EQ(run.U("after_destroy"), 0U);  // VMM handles outlive contexts
  } else {
    EXPECT_GT(run.U("after_destroy"), kCap - 2 * kGiB);
    EXPECT_LE(run.U("after_destroy"), kCap);
  }
}

class AllocationKindTest : public testing::TestWithParam<const char*> {};

TEST_P(AllocationKindTest, StopsAtTheCapAndCountsFrees) {
  ExpectCapped(Probe({"alloc", GetParam()}, {kTenGiB}), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Kinds, AllocationKindTest,
                         testing::Values("plain", "pitch", "managed", "async", "pool", "vmm"));

TEST(PreloadTest, RuntimeStyleAndDlsymStyleLookupsAreLimitedToo) {
  ExpectCapped(Probe({"runtime-style", "plain"}, {kTenGiB}), "runtime-style plain");
  ExpectCapped(Probe({"runtime-style", "async"}, {kTenGiB}), "runtime-style async (_ptsz)");
  ExpectCapped(Probe({"dlsym-style", "plain"}, {kTenGiB}), "dlsym-style plain");
  ExpectCapped(Probe({"dlsym-style", "vmm"}, {kTenGiB}), "vmm");
}

TEST(PreloadTest, ThreadsAllocatingAtOnceShareOneCap) {
  const ProbeRun run = Probe({"alloc-threads", "8"}, {kTenGiB});
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(run.U("threads_obtained"), kCap);  // 256 MiB chunks fill it exactly, never more
  EXPECT_EQ(run.U("info_free"), 0U);
}

TEST(PreloadTest, NoLimitsNoCaps) {
  for (bool preload : {true, false}) {
    const ProbeRun run = Probe({"alloc", "plain"}, {}, preload);
    SCOPED_TRACE(run.err);
    ASSERT_EQ(run.status, 0);
    EXPECT_EQ(run.U("obtained"), kFakeDevice);
    EXPECT_EQ(run.U("info_total"), kFakeDevice);
    EXPECT_TRUE(run.err.empty());
  }
}

TEST(PreloadTest, EachDeviceHasItsOwnCap) {
  ProbeRun run = Probe({"alloc", "plain", "1"}, {kTenGiB});
  EXPECT_EQ(run.U("obtained"), kFakeDevice) << run.err;  // 0: no cap on device 1
  run = Probe({"alloc", "plain", "0"}, {kTenGiB});
  EXPECT_EQ(run.U("obtained"), kCap) << run.err;
}

// dlsym is interposed, but dlsym(RTLD_NEXT) still searches after its real caller: from the
// program, the next cuInit is the limiter's, the one RTLD_DEFAULT finds too (called through a
// wrapper it would search after the limiter and find the driver's).
TEST(PreloadTest, DlsymRtldNextStillSearchesAfterItsCaller) {
  const ProbeRun run = Probe({"info"}, {kTenGiB});
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(run.U("rtld_next_same"), 1U);
}

TEST(PreloadTest, MalformedLimitsRefuseCuda) {
  for (const std::string& env :
       {std::string("GPUPOOL_GPU_MEMORY_BYTES=10G,0"), std::string("GPUPOOL_GPU_SHARES_MILLI=0,1000")}) {
    const ProbeRun run = Probe({"info"}, {env});
    EXPECT_EQ(run.status, 3) << env;
    EXPECT_EQ(run.U("init"), 3U);  // CUDA_ERROR_NOT_INITIALIZED
    EXPECT_EQ(run.err.rfind("gpupool-cuda: GPUPOOL_GPU_", 0), 0U) << run.err;
    EXPECT_NE(run.err.find("CUDA is refused"), std::string::npos) << run.err;
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  }
}

TEST(PreloadTest, MoreDevicesThanTheListsCoverRefuseCuda) {
  const std::string one_entry = "GPUPOOL_GPU_MEMORY_BYTES=" + std::to_string(10 * kGiB);
  const ProbeRun run = Probe({"info"}, {one_entry});  // two fake devices
  EXPECT_EQ(run.status, 3);
  EXPECT_NE(run.err.find("gpupool-cuda: the task sees 2 devices but the limits list 1"), std::string::npos)
      << run.err;
  EXPECT_EQ(Probe({"info"}, {one_entry, "FAKE_CUDA_DEVICES=1"}).status, 0);
}

TEST(PreloadTest, LegacyAllocationIsRefusedUnderACap) {
  EXPECT_EQ(Probe({"legacy"}, {kTenGiB}).U("legacy"), 801U);  // CUDA_ERROR_NOT_SUPPORTED
}

TEST(PreloadTest, NvmlShowsTheCapAndTheTasksUse) {
  ProbeRun run = Probe({"nvml"}, {kTenGiB});
  SCOPED_TRACE(run.err);
  ASSERT_EQ(run.status, 0) << run.values["error"];
  for (const std::string prefix : {"nvml_", "nvml_v2_"}) {
    EXPECT_EQ(run.U(prefix + "result"), 0U);
    EXPECT_EQ(run.U(prefix + "total"), kCap);
    EXPECT_EQ(run.U(prefix + "used"), 3 * kGiB);
    EXPECT_EQ(run.U(prefix + "free"), kCap - 3 * kGiB);
  }
  // No cap: NVML's own figures, as without the limiter.
  run = Probe({"nvml"}, {});
  const ProbeRun alone = Probe({"nvml"}, {}, /*preload=*/false);
  for (const char* key : {"nvml_total", "nvml_used", "nvml_free", "nvml_v2_total", "nvml_v2_free"}) {
    EXPECT_NE(run.U(key), UINT64_MAX) << key;
    EXPECT_EQ(run.U(key), alone.U(key)) << key;
  }
}

// Upper bounds only: a slow machine can only make the fraction lower.
TEST(PreloadTest, AQuarterShareKeepsTheGpuBusyAQuarterOfTheTime) {
  const ProbeRun run = Probe({"launch", "2", "2000"}, {"GPUPOOL_GPU_SHARES_MILLI=250,1000"});
  SCOPED_TRACE(run.err);
  ASSERT_EQ(run.status, 0);
  EXPECT_EQ(run.U("launch_result"), 0U);
  EXPECT_GT(run.U("launches"), 0U);
  EXPECT_LE(run.D("busy_fraction"), 0.25 + 0.05);
}

TEST(PreloadTest, PacingHoldsThroughTheRuntimesEntryPoints) {
  const ProbeRun run = Probe({"launch", "1", "5000", "runtime"}, {"GPUPOOL_GPU_SHARES_MILLI=250,1000"});
  SCOPED_TRACE(run.err);
  ASSERT_EQ(run.status, 0);
  EXPECT_GT(run.U("launches"), 0U);
  EXPECT_LE(run.D("busy_fraction"), 0.25 + 0.05);
}

TEST(PreloadTest, FullShareLaunchesUnpaced) {
  const ProbeRun run = Probe({"launch", "0.2", "1000"}, {"GPUPOOL_GPU_SHARES_MILLI=1000,1000"});
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(run.U("launch_result"), 0U);
  EXPECT_GT(run.U("launches"), 0U);
}


// ---- One ledger for the task's processes (GPUPOOL_CUDA_LEDGER) -----------------------------------

// A private directory for a ledger file, removed with what is in it.
class LedgerDir {
 public:
  LedgerDir() {
    char path[] = "/tmp/cuda_ledger_XXXXXX";
    if (mkdtemp(path) != nullptr) dir_ = path;
  }
  ~LedgerDir() {
    for (const char* name : {"ledger", "link", "sub"}) {
      const std::string path = dir_ + "/" + name;
      if (unlink(path.c_str()) != 0) rmdir(path.c_str());
    }
    rmdir(dir_.c_str());
  }
  std::string Path(const char* name = "ledger") const { return dir_ + "/" + name; }
  std::string Env(const char* name = "ledger") const { return "GPUPOOL_CUDA_LEDGER=" + Path(name); }

 private:
  std::string dir_;
};

// Waits (at most 20 s) until a started probe has printed ready=1.
bool WaitReady(const StartedProbe& probe) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    if (ReadAll(probe.out_path).find("ready=1") != std::string::npos) return true;
    int wstatus = 0;
    if (waitpid(probe.pid, &wstatus, WNOHANG) != 0) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

const std::string kEightGiB = std::to_string(8 * kGiB);

TEST(PreloadLedgerTest, TheTasksProcessesShareOneCapAndADeadOnesBytesComeBack) {
  const LedgerDir dir;
  const std::vector<std::string> env = {kTenGiB, dir.Env()};
  // The first process holds 8 GiB of the 10 and stays.
  const StartedProbe first = StartProbe({"hold", kEightGiB, "wait"}, env);
  ASSERT_TRUE(WaitReady(first)) << ReadAll(first.err_path);
  // The second gets what is left: 2 GiB, then OUT_OF_MEMORY; it sees the task's use.
  const ProbeRun second = Probe({"hold", kEightGiB}, env);
  SCOPED_TRACE(second.err);
  ASSERT_EQ(second.status, 0);
  EXPECT_EQ(second.U("held"), 2 * kGiB);
  EXPECT_EQ(second.U("held_error"), 2U);  // CUDA_ERROR_OUT_OF_MEMORY
  EXPECT_EQ(second.U("info_total"), kCap);
  EXPECT_EQ(second.U("info_free"), 0U);
  // The first is killed holding its 8 GiB (the second exited holding 2): neither leaks.
  kill(first.pid, SIGKILL);
  const ProbeRun killed = FinishProbe(first);
  EXPECT_EQ(killed.U("held"), 8 * kGiB);
  const ProbeRun third = Probe({"hold", kEightGiB}, env);
  SCOPED_TRACE(third.err);
  ASSERT_EQ(third.status, 0);
  EXPECT_EQ(third.U("held"), 8 * kGiB);
  EXPECT_EQ(third.U("info_free"), kCap - 8 * kGiB);
  struct stat st {};
  ASSERT_EQ(stat(dir.Path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600U);
}

// The ledger's pressure counter of device 0, as the agent reads it (raw, at its offset).
uint64_t LedgerPressure(const std::string& path) {
  const std::string bytes = ReadAll(path);
  uint64_t value = 0;
  if (bytes.size() != kLedgerBytes) return UINT64_MAX;
  std::memcpy(&value, bytes.data() + kLedgerPressureOffset, sizeof(value));
  return value;
}

// An allocation within the cap that the driver refuses (the device is full of others' use) is
// pressure, counted in the ledger; the limiter's own refusals at the cap are not.
TEST(PreloadLedgerTest, TheDriversRefusalsWithinTheCapAreCountedAsPressure) {
  const LedgerDir full;
  const ProbeRun small = Probe({"hold", kEightGiB}, {kTenGiB, full.Env(), "FAKE_CUDA_MEMORY_MIB=4096"});
  SCOPED_TRACE(small.err);
  ASSERT_EQ(small.status, 0);
  EXPECT_LE(small.U("held"), 4 * kGiB);
  EXPECT_EQ(small.U("held_error"), 2U);  // CUDA_ERROR_OUT_OF_MEMORY, from the driver
  EXPECT_EQ(LedgerPressure(full.Path()), 1U);

  const LedgerDir capped;
  const ProbeRun big = Probe({"hold", std::to_string(16 * kGiB)}, {kTenGiB, capped.Env()});
  SCOPED_TRACE(big.err);
  ASSERT_EQ(big.status, 0);
  EXPECT_EQ(big.U("held"), kCap);
  EXPECT_EQ(big.U("held_error"), 2U);  // the same error, from the limiter
  EXPECT_EQ(LedgerPressure(capped.Path()), 0U);
}

// Two processes of one 25 % task, launching at once for the same 2 s: with the task's ledger they
// share one window, so together they keep the GPU busy about a quarter of the time, not a quarter
// each (each process alone is paced to 0.25: AQuarterShareKeepsTheGpuBusyAQuarterOfTheTime). An
// upper bound only (a slow machine can only lower it); the window's words in the file show where
// the time was counted.
TEST(PreloadLedgerTest, TheTasksProcessesShareOneComputeWindow) {
  const LedgerDir dir;
  const std::vector<std::string> env = {"GPUPOOL_GPU_SHARES_MILLI=250,1000", dir.Env()};
  const StartedProbe one = StartProbe({"launch", "2", "2000"}, env);
  const StartedProbe two = StartProbe({"launch", "2", "2000"}, env);
  const ProbeRun first = FinishProbe(one);
  const ProbeRun second = FinishProbe(two);
  ASSERT_EQ(first.status, 0) << first.err;
  ASSERT_EQ(second.status, 0) << second.err;
  EXPECT_GT(first.U("launches"), 0U);
  EXPECT_GT(second.U("launches"), 0U);
  EXPECT_LE(first.D("busy_fraction") + second.D("busy_fraction"), 0.25 + 0.07)
      << first.D("busy_fraction") << " + " << second.D("busy_fraction");
  const std::string bytes = ReadAll(dir.Path());
  ASSERT_EQ(bytes.size(), kLedgerBytes);
  uint64_t busy = 0;
  for (int b = 0; b < kSharedWindowBuckets; ++b) {
    uint64_t word = 0;
    std::memcpy(&word, bytes.data() + offsetof(LedgerLayout, window) + b * sizeof(word), sizeof(word));
    busy += word & ((uint64_t{1} << kWindowBusyBits) - 1);
  }
  EXPECT_GT(busy, 0U);
}

TEST(PreloadLedgerTest, WithoutTheLedgerEachProcessHasTheWholeCap) {
  const StartedProbe first = StartProbe({"hold", kEightGiB, "wait"}, {kTenGiB});
  ASSERT_TRUE(WaitReady(first)) << ReadAll(first.err_path);
  const ProbeRun second = Probe({"hold", kEightGiB}, {kTenGiB});
  kill(first.pid, SIGKILL);
  FinishProbe(first);
  ASSERT_EQ(second.status, 0) << second.err;
  EXPECT_EQ(second.U("held"), 8 * kGiB);
  EXPECT_EQ(second.U("info_free"), kCap - 8 * kGiB);
}

void WriteFile(const std::string& path, const std::string& content, mode_t mode) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
  chmod(path.c_str(), mode);
}

TEST(PreloadLedgerTest, AnUnusableLedgerFileRefusesCudaWithOneLine) {
  struct Case {
    std::string name;
    std::function<void(const LedgerDir&)> make;
    const char* env_name = "ledger";
  };
  const std::vector<Case> cases = {
      {"garbage", [](const LedgerDir& d) { WriteFile(d.Path(), std::string(100, '\x5a'), 0600); }},
      {"garbage of a ledger's size",
       [](const LedgerDir& d) { WriteFile(d.Path(), std::string(kLedgerBytes, '\xff'), 0600); }},
      {"open to others", [](const LedgerDir& d) { WriteFile(d.Path(), "", 0644); }},
      {"a symlink",
       [](const LedgerDir& d) {
         WriteFile(d.Path(), "", 0600);
         ASSERT_EQ(symlink(d.Path().c_str(), d.Path("link").c_str()), 0);
       },
       "link"},
      {"a directory", [](const LedgerDir& d) { ASSERT_EQ(mkdir(d.Path("sub").c_str(), 0700), 0); }, "sub"},
      {"in a missing directory", [](const LedgerDir&) {}, "sub/ledger"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const LedgerDir dir;
    c.make(dir);
    const ProbeRun run = Probe({"hold", kEightGiB}, {kTenGiB, dir.Env(c.env_name)});
    EXPECT_EQ(run.U("init"), 3U);  // CUDA_ERROR_NOT_INITIALIZED
    EXPECT_EQ(run.U("held"), UINT64_MAX);
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
    EXPECT_NE(run.err.find("gpupool-cuda: GPUPOOL_CUDA_LEDGER ("), std::string::npos) << run.err;
  }
}

TEST(PreloadLedgerTest, AnotherUidsLedgerFileIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a file of another uid";
  const LedgerDir dir;
  WriteFile(dir.Path(), "", 0600);
  ASSERT_EQ(chown(dir.Path().c_str(), 65534, 65534), 0);
  const ProbeRun run = Probe({"hold", kEightGiB}, {kTenGiB, dir.Env()});
  EXPECT_EQ(run.U("init"), 3U);
  EXPECT_NE(run.err.find("owned by uid 65534"), std::string::npos) << run.err;
}

// ---- the limits file (docs/cuda_limiter.md "In containers") -------------------------------------

std::string LimitsFile(const std::string& memory, const std::string& shares, const std::string& ledger = "") {
  return "memory_bytes=" + memory + "\nshares_milli=" + shares + "\nledger=" + ledger + "\n";
}

// With the file, its limits hold and the environment's are not read, whatever they say.
TEST(LimitsFileTest, TheFilesLimitHoldsWhateverTheEnvironmentSays) {
  const std::string file = LimitsFile(std::to_string(kCap) + ",0", "1000,1000");
  for (const std::vector<std::string>& env :
       {std::vector<std::string>{}, {"GPUPOOL_GPU_MEMORY_BYTES=" + std::to_string(70 * kGiB) + ",0"},
        {"GPUPOOL_GPU_MEMORY_BYTES=0,0", "GPUPOOL_GPU_SHARES_MILLI=1000,1000"},
        {"GPUPOOL_GPU_MEMORY_BYTES=garbage"}}) {
    SCOPED_TRACE(env.empty() ? "(no env)" : env[0]);
    ExpectCapped(ProbeWithLimitsFile({"alloc", "plain"}, env, file), "plain");
  }
}

// The ledger named by the environment is not used either when the file names none.
TEST(LimitsFileTest, TheLedgerComesFromTheFileToo) {
  char dir[] = "/tmp/cuda_limits_ledger_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string env_ledger = std::string(dir) + "/env-ledger";
  const ProbeRun run = ProbeWithLimitsFile({"alloc", "plain"}, {"GPUPOOL_CUDA_LEDGER=" + env_ledger},
                                           LimitsFile(std::to_string(kCap) + ",0", "1000,1000"));
  ExpectCapped(run, "plain");
  struct stat st;
  EXPECT_NE(stat(env_ledger.c_str(), &st), 0);  // never made
  const std::string file_ledger = std::string(dir) + "/file-ledger";
  const ProbeRun with = ProbeWithLimitsFile({"alloc", "plain"}, {"GPUPOOL_CUDA_LEDGER=" + env_ledger},
                                            LimitsFile(std::to_string(kCap) + ",0", "1000,1000", file_ledger));
  ExpectCapped(with, "plain");
  EXPECT_EQ(stat(file_ledger.c_str(), &st), 0);
  EXPECT_NE(stat(env_ledger.c_str(), &st), 0);
  unlink(file_ledger.c_str());
  rmdir(dir);
}

// Without the file the test build reads the environment, as the real library does.
TEST(LimitsFileTest, WithoutTheFileTheEnvironmentIsRead) {
  ExpectCapped(ProbeWithLimitsFile({"alloc", "plain"}, {kTenGiB}, std::nullopt), "plain");
  const ProbeRun run = ProbeWithLimitsFile({"alloc", "plain"}, {}, std::nullopt);
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(run.U("obtained"), kFakeDevice);
}

TEST(LimitsFileTest, AMalformedOrUnsafeFileRefusesCuda) {
  using namespace std::string_literals;
  const std::string good = LimitsFile(std::to_string(kCap) + ",0", "250,1000");
  struct Case {
    std::string name;
    std::string contents;
    mode_t mode = 0444;
  };
  const std::vector<Case> cases = {
      {"empty", ""},
      {"no final newline", good.substr(0, good.size() - 1)},
      {"unknown key", good + "extra=1\n"},
      {"repeated key", good + "memory_bytes=1\n"},
      {"missing key", "memory_bytes=1,0\nshares_milli=1000,1000\n"},
      {"no equals", "memory_bytes\nshares_milli=\nledger=\n"},
      {"a sign", LimitsFile("+10737418240,0", "1000,1000")},
      {"a unit", LimitsFile("10G,0", "1000,1000")},
      {"hex", LimitsFile("0x10,0", "1000,1000")},
      {"a space", LimitsFile(" 10737418240,0", "1000,1000")},
      {"too large", LimitsFile("99999999999999999999,0", "1000,1000")},
      {"share 0", LimitsFile("0,0", "0,1000")},
      {"share over 1000", LimitsFile("0,0", "1001,1000")},
      {"lists of two lengths", LimitsFile("1,0", "1000")},
      {"empty entry", LimitsFile("1,,0", "1000,1000,1000")},
      {"CR", "memory_bytes=1,0\r\nshares_milli=1000,1000\nledger=\n"},
      {"NUL", "memory_bytes=1,0\nshares_milli=1000,1000\nledger=\0\n"s},
      {"relative ledger", LimitsFile("1,0", "1000,1000", "ledger")},
      {"oversized", good + std::string(kMaxLimitsFileBytes, '#')},
      {"writable", good, 0644},
      {"writable by the group", good, 0464},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const ProbeRun run = ProbeWithLimitsFile({"info"}, {kTenGiB}, c.contents, c.mode);
    EXPECT_EQ(run.status, 3);
    EXPECT_EQ(run.U("init"), 3U);  // CUDA_ERROR_NOT_INITIALIZED
    EXPECT_EQ(run.err.rfind(std::string("gpupool-cuda: ") + GPUPOOL_CUDA_LIMITS_TEST_FILE, 0), 0U) << run.err;
    EXPECT_NE(run.err.find("CUDA is refused"), std::string::npos) << run.err;
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  }
}

// A link or a directory at the path refuses CUDA too (never followed, never taken as absent).
TEST(LimitsFileTest, ALinkOrADirectoryRefusesCuda) {
  char dir[] = "/tmp/cuda_limits_link_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/" + GPUPOOL_CUDA_LIMITS_TEST_FILE;
  const std::string target = std::string(dir) + "/target";
  std::ofstream(target) << LimitsFile("0,0", "1000,1000");
  chmod(target.c_str(), 0444);
  for (bool link : {true, false}) {
    ASSERT_EQ(link ? symlink(target.c_str(), path.c_str()) : mkdir(path.c_str(), 0555), 0);
    const ProbeRun run = FinishProbe(StartProbe({"info"}, {}, true, dir));
    EXPECT_EQ(run.status, 3) << link;
    EXPECT_NE(run.err.find("CUDA is refused"), std::string::npos) << run.err;
    if (link) unlink(path.c_str()); else rmdir(path.c_str());
  }
  unlink(target.c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace gpupool::cuda_limiter
