// The CUDA limiter in a process task (docs/cuda_limiter.md "In process tasks"): what the process
// runtime prepares on the host so that the task's own mount namespace (supervisor_sandbox.cc) can
// hold the limiter the way a container does. In that namespace kTaskRunDir is a read-only tmpfs
// with the library, the task's limits (read-only) and its memory ledger bound in, and the loader's
// /etc/ld.so.preload is a read-only file naming the library: a process that clears LD_PRELOAD or
// sets its own GPUPOOL_GPU_* before an exec is still limited, and by the same numbers.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "agent/supervisor_protocol.h"
#include "common/status.h"

namespace gpupool::agent_internal {

// The names in kTaskRunDir.
inline constexpr const char* kTaskCudaLimiterName = "libgpupool-cuda.so";
inline constexpr const char* kTaskCudaLimitsName = "cuda-limits";
inline constexpr const char* kTaskCudaLedgerName = "cuda-ledger";

// The host's list of preloads is read as untrusted (it is what every program on the host loads):
// at most this many bytes.
inline constexpr int64_t kMaxHostPreloadListBytes = 64 * 1024;

// The host's mount points, made when missing: kTaskRunDir a directory (root's, 0755) and
// kLoaderPreloadList a file (root's, 0644, empty: the loader preloads nothing for it). Returns the
// host list's contents, which the task's list keeps after the limiter. FailedPrecondition, naming
// the path, when either is a link, of the wrong type, not root's or writable by others, or the list
// is larger than kMaxHostPreloadListBytes.
Result<std::string> PrepareHostPreloadPoints();

// What a task's supervisor binds.
struct ProcessLimiterFiles {
  std::vector<SupervisorPlan::RunFile> run_files;
  std::string preload_list;
};

// For a task whose environment `env` preloads `library` (the host's path, first in LD_PRELOAD):
// writes `task_dir`/cuda-limits and `task_dir`/ld.so.preload (root's, 0444, anew), points the
// environment at the namespace's paths (LD_PRELOAD's first entry and GPUPOOL_CUDA_LEDGER) and says
// what to bind: the library (read-only), the limits (read-only), `ledger` (the task's, read-write).
Result<ProcessLimiterFiles> PrepareProcessCudaLimiter(const std::string& library, const std::string& task_dir,
                                                      const std::string& ledger,
                                                      std::map<std::string, std::string>* env);

// The CUDA limiter's pressure counters in a task's ledger file (src/cuda_limiter/shared_ledger.h):
// per device ordinal of the task, the allocations within its cap that the driver refused. Read from
// the host; the file is the task's, so it is taken as hostile: opened without following a link and
// without blocking, a regular file of exactly the ledger's size with the ledger's magic. An empty
// file (no process of the task has used CUDA yet) is all zeros. Anything else is an error naming
// why (the task has broken its own ledger; its limiter refuses CUDA then).
Result<std::vector<uint64_t>> ReadCudaLedgerPressure(const std::string& path);

}  // namespace gpupool::agent_internal
