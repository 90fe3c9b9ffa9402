// `gpupool run`: submit a one-task job from the command line (or a spec file), stream its output
// while it runs, turn Ctrl-C into a cancel, and exit with the task's exit code — what `srun`,
// `docker run` and `kubectl run -i` users expect (docs/cli.md#run).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "client/api_client.h"

namespace gpupool {

struct RunOptions {
  std::string file;  // a spec file instead of a command ("-": stdin)
  std::vector<std::string> command;
  std::string name;  // default: from the command
  std::string queue, qos, isolation, gpu_memory;
  std::string gpu;  // "0.25", "2"; empty: no GPU
  std::string cpu = "1";
  std::string memory = "1Gi";
  std::optional<int64_t> priority;
  std::vector<std::string> env;  // KEY=VALUE
  bool verbose = false;
};

// The job spec (JSON) of a command line; InvalidArgument naming the flag when one is malformed.
Result<std::string> RunSpecJson(const RunOptions& o);

// Exit code of a finished job's JSON: 0 when every task succeeded; the first failed task's exit
// code (128 + N for one killed by signal N, 1 when neither is known); 1 for a job that failed
// without a failed task, or was cancelled.
int RunExitCode(const nlohmann::ordered_json& job);

// Runs the job through `client`: output to `out`/`err`, notes to `err` prefixed "gpupool run: ".
// `interrupted` is polled: once it returns 1 the job is cancelled (its output still streams until
// it ends); 2 or more, the command gives up waiting and returns 130.
int RunJob(const RunOptions& o, const ApiClient& client, std::istream& in, std::ostream& out, std::ostream& err,
           const std::function<int()>& interrupted);

// Registers `gpupool run` on `app`; the returned function runs it when it was chosen (-1 otherwise).
std::function<int()> AddRunCommand(CLI::App& app);

}  // namespace gpupool
