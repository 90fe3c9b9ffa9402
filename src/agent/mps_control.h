// Private to MpsDaemons (mps.cc, mps_limits.cc) and its tests: running nvidia-cuda-mps-control, and
// reading what it answers. Everything the control program prints is hostile input: it is captured
// up to a bound, parsed strictly (a reply of any other form is an error, never a guess), and quoted
// in error messages only as a short excerpt with control characters escaped.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace gpupool::mps_internal {

// Captured output beyond this is dropped (and `truncated` set).
constexpr size_t kMaxOutput = 64 * 1024;

struct CommandResult {
  int status = 0;          // the exit status, or 128 + signal
  bool timed_out = false;  // killed after the timeout
  bool truncated = false;  // it printed more than kMaxOutput bytes
  std::string output;      // stdout and stderr together, at most kMaxOutput bytes
};

// Runs `exe` with `argv` and exactly `env`, `input` (at most 4 KiB) on its stdin, and its stdout and
// stderr captured, until it exits or `timeout` passes (then it is killed). No shell. The child gets
// its own session and no descriptor of ours beyond stdio, so a daemon it leaves behind holds neither
// the agent's terminal nor its sockets. A daemonizing program may leave a grandchild holding the
// output pipe: the exit of the child, not the end of its output, ends the wait.
Result<CommandResult> RunCommand(const std::string& exe, const std::vector<std::string>& argv,
                                 const std::vector<std::string>& env, const std::string& input,
                                 std::chrono::milliseconds timeout);

// "exit status 3", "killed by signal 9", "killed after the timeout".
std::string DescribeStatus(const CommandResult& r);
// "output: <excerpt>" or "no output".
std::string DescribeOutput(const CommandResult& r);
// At most 200 bytes of `text` between single quotes, trailing white space dropped, bytes outside
// printable ASCII as \xNN ("..." marks a cut): safe to put in a message and a log line.
std::string Excerpt(std::string_view text);

// `get_server_list`: one server PID a line (decimal, 1..2^22, the kernel's largest pid_max), no
// other text; an empty reply is no server. At most 1024 lines.
Result<std::vector<pid_t>> ParseServerList(std::string_view output);
// `get_active_thread_percentage <PID>`: one number 0..100, either an integer or with a fraction of
// zeros ("25" or "25.0"; drivers print the latter). One line.
Result<int> ParsePercentage(std::string_view output);
// `get_device_pinned_mem_limit <PID> <dev>`: one line, a whole number and its unit, the form
// `set_device_pinned_mem_limit` takes ("20480M", "20G"); also accepted with a fraction of zeros or a
// space before the unit, and MB/MiB/GB/GiB for M/G (all binary: M is MiB). In MiB; a limit above
// 2^40 MiB is refused. NVIDIA does not document this reply's form: any other (a limit that is not a
// whole number of MiB, a word) is an error naming it, so that a driver that answers differently
// fails the task clearly rather than letting it run unverified.
Result<int64_t> ParsePinnedMib(std::string_view output);
// The real uid of process `pid`, from the "Uid:" line of <proc_root>/<pid>/status; NotFound when
// the process is gone.
Result<int64_t> ProcUid(pid_t pid, const std::string& proc_root = "/proc");

}  // namespace gpupool::mps_internal
