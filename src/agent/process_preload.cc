#include "agent/process_preload.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "agent/container_preload.h"
#include "agent/runtime_internal.h"
#include "cuda_limiter/shared_ledger.h"

namespace gpupool::agent_internal {
namespace {

Status NotUsable(const char* path, const std::string& why) {
  return Status::FailedPrecondition(fmt::format(
      "{} {}: the CUDA limiter of process tasks needs it a root-owned {} that only root may write", path, why,
      std::string(path) == kTaskRunDir ? "directory" : "regular file"));
}

// Root's, not writable by group or others, of the type asked for.
Status CheckOwned(const char* path, const struct stat& st, bool directory) {
  if (directory ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))
    return NotUsable(path, S_ISLNK(st.st_mode) ? "is a symbolic link" : "is of the wrong type");
  if (st.st_uid != 0) return NotUsable(path, fmt::format("belongs to uid {}", st.st_uid));
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
    return NotUsable(path, fmt::format("is writable by others (mode {:o})", st.st_mode & 07777));
  return Status::Ok();
}

}  // namespace

Result<std::string> PrepareHostPreloadPoints() {
  struct stat st;
  if (::lstat(kTaskRunDir, &st) != 0) {
    if (errno != ENOENT) return Status::IoError(fmt::format("{}: {}", kTaskRunDir, ErrnoText(errno)));
    if (::mkdir(kTaskRunDir, 0755) != 0 && errno != EEXIST)
      return Status::IoError(fmt::format("cannot create {}: {}", kTaskRunDir, ErrnoText(errno)));
    if (::lstat(kTaskRunDir, &st) != 0) return Status::IoError(fmt::format("{}: {}", kTaskRunDir, ErrnoText(errno)));
  }
  RETURN_IF_ERROR(CheckOwned(kTaskRunDir, st, /*directory=*/true));

  int fd = ::open(kLoaderPreloadList, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    // None: an empty one is what the loader reads as none (EEXIST: made by another start meanwhile).
    int made = ::open(kLoaderPreloadList, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (made < 0 && errno != EEXIST)
      return Status::IoError(fmt::format("cannot create {}: {}", kLoaderPreloadList, ErrnoText(errno)));
    if (made >= 0) ::close(made);
    fd = ::open(kLoaderPreloadList, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  }
  if (fd < 0) {
    if (errno == ELOOP) return NotUsable(kLoaderPreloadList, "is a symbolic link");
    return Status::IoError(fmt::format("{}: {}", kLoaderPreloadList, ErrnoText(errno)));
  }
  FdCloser closer(fd);
  if (::fstat(fd, &st) != 0) return Status::IoError(fmt::format("{}: {}", kLoaderPreloadList, ErrnoText(errno)));
  RETURN_IF_ERROR(CheckOwned(kLoaderPreloadList, st, /*directory=*/false));
  if (st.st_size > kMaxHostPreloadListBytes)
    return NotUsable(kLoaderPreloadList, fmt::format("holds {} bytes (at most {} are read)", st.st_size,
                                                     kMaxHostPreloadListBytes));
  std::string content;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::IoError(fmt::format("reading {}: {}", kLoaderPreloadList, ErrnoText(errno)));
    if (n == 0) break;
    content.append(buf, static_cast<size_t>(n));
    if (static_cast<int64_t>(content.size()) > kMaxHostPreloadListBytes)
      return NotUsable(kLoaderPreloadList, "grew past the bytes read");
  }
  if (content.find('\0') != std::string::npos) return NotUsable(kLoaderPreloadList, "holds a NUL byte");
  return content;
}

Result<ProcessLimiterFiles> PrepareProcessCudaLimiter(const std::string& library, const std::string& task_dir,
                                                      const std::string& ledger,
                                                      std::map<std::string, std::string>* env) {
  ASSIGN_OR_RETURN(std::string host_list, PrepareHostPreloadPoints());
  // The library's own file: a link would be bound as a link (which the supervisor refuses).
  char real[PATH_MAX];
  if (::realpath(library.c_str(), real) == nullptr)
    return Status::FailedPrecondition(fmt::format("the CUDA limiter {}: {}", library, ErrnoText(errno)));
  const std::string run_dir = kTaskRunDir;
  const std::string lib_in_task = run_dir + "/" + kTaskCudaLimiterName;
  auto& preload = (*env)["LD_PRELOAD"];
  if (preload.rfind(library, 0) == 0 && (preload.size() == library.size() || preload[library.size()] == ':'))
    preload.replace(0, library.size(), lib_in_task);
  else
    preload = preload.empty() ? lib_in_task : lib_in_task + ":" + preload;
  (*env)["GPUPOOL_CUDA_LEDGER"] = run_dir + "/" + kTaskCudaLedgerName;

  ProcessLimiterFiles out;
  ASSIGN_OR_RETURN(std::string limits, CudaLimitsFileContents(*env));
  RETURN_IF_ERROR(WriteReadOnlyFile(task_dir + "/" + kTaskCudaLimitsName, limits));
  if (!host_list.empty() && host_list.back() != '\n') host_list.push_back('\n');
  out.preload_list = task_dir + "/ld.so.preload";
  RETURN_IF_ERROR(WriteReadOnlyFile(out.preload_list, lib_in_task + "\n" + host_list));
  out.run_files = {{kTaskCudaLimiterName, real, false},
                   {kTaskCudaLimitsName, task_dir + "/" + kTaskCudaLimitsName, false},
                   {kTaskCudaLedgerName, ledger, true}};
  return out;
}

Result<std::vector<uint64_t>> ReadCudaLedgerPressure(const std::string& path) {
  using cuda_limiter::kLedgerBytes;
  using cuda_limiter::kMaxDevices;
  FdCloser fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (fd.get() < 0) return Status::IoError(fmt::format("{}: {}", path, ErrnoText(errno)));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::IoError(fmt::format("{}: {}", path, ErrnoText(errno)));
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(fmt::format("{}: not a regular file", path));
  std::vector<uint64_t> out(kMaxDevices, 0);
  if (st.st_size == 0) return out;
  if (static_cast<uint64_t>(st.st_size) != kLedgerBytes)
    return Status::InvalidArgument(fmt::format("{}: {} bytes, not a ledger's {}", path, st.st_size, kLedgerBytes));
  // The magic and the counters: one read of the header's first bytes.
  const size_t want = cuda_limiter::kLedgerPressureOffset + kMaxDevices * sizeof(uint64_t);
  std::string head(want, '\0');
  size_t got = 0;
  while (got < want) {
    const ssize_t n = ::pread(fd.get(), head.data() + got, want - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::IoError(fmt::format("{}: short read", path));
    got += static_cast<size_t>(n);
  }
  uint64_t magic = 0;
  std::memcpy(&magic, head.data(), sizeof(magic));
  if (magic == 0) return out;  // sized, not yet stamped
  if (magic != cuda_limiter::kLedgerMagic) return Status::InvalidArgument(fmt::format("{}: not a ledger", path));
  std::memcpy(out.data(), head.data() + cuda_limiter::kLedgerPressureOffset, kMaxDevices * sizeof(uint64_t));
  return out;
}

}  // namespace gpupool::agent_internal
