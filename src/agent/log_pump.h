// Bounded task logs. A task never holds the descriptor of its log files: its stdout and stderr are
// pipes, and the task's supervisor (runtime_internal.h) drains them into the files itself, so a
// task cannot grow its logs past the cap however it writes. Each stream's current file
// (`stdout.log`) holds at most `max_bytes`; when a write would pass that, the file is rotated:
// `stdout.log.<keep-1>` -> `stdout.log.<keep>`, ..., `stdout.log` -> `stdout.log.1`, and a fresh
// `stdout.log` is started (with keep == 0 the file is truncated instead). So a stream never takes
// more than max_bytes * (keep + 1) bytes of disk. Write errors (a full disk) drop the bytes and
// the supervisor goes on draining: a task is never blocked on its logs.
//
// Everything here runs in the forked supervisor: no allocation, async-signal-safe calls only.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace gpupool::agent_internal {

constexpr int kMaxLogKeep = 9;
constexpr int64_t kDefaultLogMaxBytes = int64_t{64} << 20;
constexpr int kDefaultLogKeep = 1;

// "<path>.<n>": the n-th previous file of a log (n >= 1).
std::string RotatedLogPath(const std::string& path, int n);

struct LogSink {
  int fd = -1;                              // the current file; -1: bytes are dropped
  const char* path = nullptr;               // the current file's path
  const char* rotated[kMaxLogKeep] = {};    // path.1 .. path.keep
  int keep = 0;                             // previous files kept (0..kMaxLogKeep)
  int64_t max_bytes = 0;                    // per file; <= 0: unbounded
  int64_t size = 0;                         // bytes in the current file
  uint64_t dropped = 0;                     // bytes lost to write errors
  int rotations = 0;
};

// Appends `n` bytes, rotating as needed.
void LogSinkWrite(LogSink* sink, const char* data, size_t n);

// Waits up to `timeout_ms` (also woken by `wake_fd` becoming readable, when >= 0) for output on
// the pipes (non-blocking read ends; -1: closed) and moves everything readable into the sinks. A
// pipe at EOF is closed and set to -1. Returns how many pipes are still open.
int PumpLogs(int pipes[2], LogSink* sinks[2], int wake_fd, int timeout_ms);

}  // namespace gpupool::agent_internal
