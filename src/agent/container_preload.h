// The CUDA limiter in containers (docs/cuda_limiter.md "In containers"): where it goes in the
// container, and whether an image's C library can load it at all. The library is built against
// the host's glibc; a container's dynamic loader refuses to preload it ("cannot be preloaded") when
// the image's glibc lacks a symbol version it needs, or has no glibc, and then runs the task with
// no limit. So the runtime checks first, from the ELF version sections of the library and of the
// image's own libraries, and a start that would run unlimited fails instead.
//
// Everything here reads files the agent does not trust (an image is a tenant's, and so is any
// link in it): every read is bounded, every path of the image is resolved inside the image.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agent/runtime.h"
#include "common/status.h"

namespace gpupool::agent_internal {

// Where the runc runtime puts the limiter's pieces in a container (all bind mounts).
inline constexpr const char* kContainerCudaLimiterPath = "/usr/lib/gpupool/libgpupool-cuda.so";  // read-only
inline constexpr const char* kContainerPreloadPath = "/etc/ld.so.preload";                      // read-only
inline constexpr const char* kContainerCudaLedgerPath = "/run/gpupool/cuda-ledger";             // the task's, 0600
// The limits the library reads instead of the environment's GPUPOOL_GPU_* (src/cuda_limiter,
// kLimitsFile): root's, 0444, read-only.
inline constexpr const char* kContainerCudaLimitsPath = "/run/gpupool/cuda-limits";

// The limits file's contents for a task's environment: "memory_bytes=<GPUPOOL_GPU_MEMORY_BYTES>\n
// shares_milli=<GPUPOOL_GPU_SHARES_MILLI>\nledger=<GPUPOOL_CUDA_LEDGER>\n" (an unset variable
// gives an empty value, as the library reads an unset one). InvalidArgument when a value holds a
// newline, a CR or a NUL (the agent never sets one; the file would be refused by the library).
Result<std::string> CudaLimitsFileContents(const std::map<std::string, std::string>& env);

// Writes `content` to `path` anew (atomically, not synced) and makes it 0444: the limits file and the
// preload list, which a task may read and nobody may write.
Status WriteReadOnlyFile(const std::string& path, const std::string& content);

// What an ELF shared object says about symbol versions.
struct ElfVersions {
  uint16_t machine = 0;                // e_machine
  std::vector<std::string> needed;     // DT_NEEDED, in order
  // .gnu.version_r: per file it needs, the versions it needs from it ("libc.so.6": GLIBC_2.34, ...)
  std::vector<std::pair<std::string, std::vector<std::string>>> requires_versions;
  std::vector<std::string> defines;    // .gnu.version_d, less the file's own (base) entry
};

// At most this many bytes of a file are considered; a larger file is refused.
inline constexpr int64_t kMaxElfFileBytes = int64_t{512} << 20;

// Parses an open file (a 64-bit little-endian ELF file, through its section headers). `what`
// names it in errors. Any malformed, truncated or oversized input is an InvalidArgument error,
// never a crash and never a read outside the file.
Result<ElfVersions> ReadElfVersions(int fd, const std::string& what);
// The same for a host path (the agent's own library: opened without following a final link).
Result<ElfVersions> ReadElfVersionsAt(const std::string& path);

// "GLIBC_2.34" -> {2, 34}; "GLIBC_2.3.4" -> {2, 3, 4}. nullopt for anything else (no other prefix,
// no empty part, digits only, at most 4 parts of at most 6 digits).
std::optional<std::vector<int>> ParseGlibcVersion(std::string_view name);
// The newest GLIBC_ version among `names` without its prefix ("2.34"); "" when none.
std::string NewestGlibcVersion(const std::vector<std::string>& names);

// Opens `path` (absolute, as the container sees it) below `root` for reading, every link resolved
// inside `root` (as if `root` were /: ".." stops there, absolute targets start there), no
// /proc magic links. Only a regular file; NotFound when it does not exist.
Result<int> OpenInRoot(const std::string& root, const std::string& path);

// The directories the check looks in for a library, in order (the dynamic loader's defaults).
std::vector<std::string> ImageLibraryDirs();

// Ok when every library `lib` needs is in the image at `rootfs` (ImageLibraryDirs) and defines
// every version `lib` needs from it, for the same machine. Otherwise FailedPrecondition naming
// what is missing; for glibc "the image's glibc is 2.31 ...; the CUDA limiter needs GLIBC_2.34"
// or "the image has no glibc".
Status CheckPreloadFits(const std::string& rootfs, const ElfVersions& lib);

// The runc runtime's preparation of the limiter (LaunchSpec::cuda_limiter) for a container whose
// root is `rootfs_abs`: fails unless the image can load it and nothing of the task's is mounted at
// or above its paths, then sets the task's environment and says what to bind where (the preload
// list and limits file in `task_dir`, the ledger at `ledger_path`).
Result<std::vector<LaunchSpec::Bind>> PrepareCudaLimiter(LaunchSpec* spec, const std::string& rootfs_abs,
                                                         const std::string& task_dir,
                                                         const std::string& ledger_path);
// The files PrepareCudaLimiter's binds name, made once the task's directory exists: the preload
// list and the limits root's and read-only (written anew at each start), the ledger empty and the
// task's.
Status MakeCudaLimiterFiles(const LaunchSpec& spec, const std::vector<LaunchSpec::Bind>& binds);

}  // namespace gpupool::agent_internal
