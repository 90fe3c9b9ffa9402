// The cost libgpupool-cuda.so adds to the driver calls it wraps, on the fake driver
// (tests/fake_cuda): a cuMemAlloc_v2 + cuMemFree_v2 pair of 1 MiB, and a cuLaunchKernel of a
// zero-length kernel (synchronised every 1,000). Each configuration runs in a child process of its
// own (the limiter is only ever preloaded), the four in turn, --reps times; the table shows the
// median per call.
//
//   cuda_limiter_bench [--reps N] [--iterations N]
//
// Configurations: the driver alone; the limiter preloaded with no limits (its pass-through);
// the limiter with a memory cap and a 50 % share on both fake devices (accounting, and two timing
// events per launch, never a wait: the kernels take no time); the same with the task's shared
// memory ledger file (GPUPOOL_CUDA_LEDGER).
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "cuda_limiter/cuda_abi.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

double NsPerCall(Clock::time_point start, long calls) {
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / static_cast<double>(calls);
}

// The measuring child: prints alloc_free_ns=... and launch_ns=...
int Measure(long iterations) {
  CUdevice device = 0;
  CUcontext context = nullptr;
  CUstream stream = nullptr;
  if (cuInit(0) != 0 || cuDeviceGet(&device, 0) != 0 || cuCtxCreate_v2(&context, 0, device) != 0 ||
      cuStreamCreate(&stream, 0) != 0) {
    std::fprintf(stderr, "cuda_limiter_bench: the driver did not start\n");
    return 1;
  }
  for (int pass = 0; pass < 2; ++pass) {  // the first pass warms up
    const long calls = pass == 0 ? iterations / 10 : iterations;
    auto start = Clock::now();
    for (long i = 0; i < calls; ++i) {
      CUdeviceptr pointer = 0;
      if (cuMemAlloc_v2(&pointer, size_t{1} << 20) != 0 || cuMemFree_v2(pointer) != 0) return 1;
    }
    const double alloc_free = NsPerCall(start, calls);
    uint32_t microseconds = 0;
    void* params[] = {&microseconds};
    auto function = reinterpret_cast<CUfunction>(uintptr_t{0x1000});
    start = Clock::now();
    for (long i = 0; i < calls; ++i) {
      if (cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, stream, params, nullptr) != 0) return 1;
      if (i % 1000 == 999) cuStreamSynchronize(stream);
    }
    cuStreamSynchronize(stream);
    const double launch = NsPerCall(start, calls);
    if (pass == 1) std::printf("alloc_free_ns=%.1f\nlaunch_ns=%.1f\n", alloc_free, launch);
  }
  return 0;
}

struct Config {
  const char* name;
  bool preload;
  std::vector<std::string> env;
};

// Runs this program as a measuring child with config's environment; its key=value output.
std::map<std::string, double> RunChild(const Config& config, long iterations) {
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string variable(*entry);
    if (variable.rfind("LD_PRELOAD=", 0) != 0 && variable.rfind("GPUPOOL_", 0) != 0) {
      environment.push_back(variable);
    }
  }
  if (config.preload) environment.push_back(std::string("LD_PRELOAD=") + GPUPOOL_CUDA_PRELOAD_PATH);
  environment.insert(environment.end(), config.env.begin(), config.env.end());
  std::string self = "/proc/self/exe", flag = "--child", count = std::to_string(iterations);
  std::vector<char*> argv = {self.data(), flag.data(), count.data(), nullptr};
  std::vector<char*> envp;
  for (std::string& variable : environment) envp.push_back(variable.data());
  envp.push_back(nullptr);

  std::map<std::string, double> values;
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return values;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  std::string output;
  char buffer[512];
  for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof(buffer))) > 0;)
    output.append(buffer, static_cast<size_t>(n));
  close(pipe_fds[0]);
  int status = 0;
  if (spawned != 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return {};
  size_t start = 0;
  while (start < output.size()) {
    const size_t end = std::min(output.find('\n', start), output.size());
    const std::string line = output.substr(start, end - start);
    const size_t eq = line.find('=');
    if (eq != std::string::npos) values[line.substr(0, eq)] = std::strtod(line.c_str() + eq + 1, nullptr);
    start = end + 1;
  }
  return values;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  long iterations = 200000;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--child") == 0 && i + 1 < argc)
      return Measure(std::max(1L, std::atol(argv[i + 1])));
    if (std::strcmp(argv[i], "--iterations") == 0 && i + 1 < argc)
      iterations = std::max(10L, std::atol(argv[++i]));
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
  }
  const std::string cap = std::to_string(uint64_t{64} << 30);
  // The task's shared ledger (GPUPOOL_CUDA_LEDGER), in a directory of the bench's own.
  char ledger_dir[] = "/tmp/cuda_limiter_bench_XXXXXX";
  if (mkdtemp(ledger_dir) == nullptr) {
    std::fprintf(stderr, "cuda_limiter_bench: mkdtemp failed\n");
    return 1;
  }
  const std::string ledger = std::string(ledger_dir) + "/ledger";
  const std::vector<Config> configs = {
      {"driver alone", false, {}},
      {"preloaded, no limits", true, {}},
      {"preloaded, cap + 50% share",
       true,
       {"GPUPOOL_GPU_MEMORY_BYTES=" + cap + "," + cap, "GPUPOOL_GPU_SHARES_MILLI=500,500"}},
      {"... + shared ledger",
       true,
       {"GPUPOOL_GPU_MEMORY_BYTES=" + cap + "," + cap, "GPUPOOL_GPU_SHARES_MILLI=500,500",
        "GPUPOOL_CUDA_LEDGER=" + ledger}},
  };
  std::map<std::string, std::vector<double>> samples;
  for (int rep = 0; rep < reps; ++rep) {
    for (const Config& config : configs) {
      const std::map<std::string, double> values = RunChild(config, iterations);
      if (values.count("alloc_free_ns") == 0 || values.count("launch_ns") == 0) {
        std::fprintf(stderr, "cuda_limiter_bench: the child for \"%s\" failed\n", config.name);
        unlink(ledger.c_str());
        rmdir(ledger_dir);
        return 1;
      }
      samples[std::string(config.name) + "/alloc"].push_back(values.at("alloc_free_ns"));
      samples[std::string(config.name) + "/launch"].push_back(values.at("launch_ns"));
    }
  }
  std::printf("cuda_limiter_bench: fake driver, %ld calls per figure, median of %d runs (ns per call)\n",
              iterations, reps);
  std::printf("%-28s %22s %22s\n", "configuration", "cuMemAlloc+cuMemFree", "cuLaunchKernel");
  const double base_alloc = Median(samples["driver alone/alloc"]);
  const double base_launch = Median(samples["driver alone/launch"]);
  for (const Config& config : configs) {
    const double alloc = Median(samples[std::string(config.name) + "/alloc"]);
    const double launch = Median(samples[std::string(config.name) + "/launch"]);
    std::printf("%-28s %12.0f (%+7.0f) %12.0f (%+7.0f)\n", config.name, alloc, alloc - base_alloc, launch,
                launch - base_launch);
  }
  unlink(ledger.c_str());
  rmdir(ledger_dir);
  return 0;
}
