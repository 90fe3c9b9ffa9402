// The agent runtimes' file helpers (runtime_internal.h): reads, atomic writes, owned directories
// under fixed roots, removal without following links, task id and launch spec checks, PATH lookup.
#include "agent/runtime_internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

namespace gpupool::agent_internal {

// ---- files -------------------------------------------------------------------------------------

std::string ErrnoText(int err) { return std::strerror(err); }

Result<std::string> ReadFile(const std::string& path) {
  FdCloser fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return Status::IoError(fmt::format("cannot open {}: {}", path, ErrnoText(errno)));
  std::string out;
  char buf[4096];
  while (true) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IoError(fmt::format("cannot read {}: {}", path, ErrnoText(errno)));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

Status WriteFileAtomic(const std::string& path, const std::string& content, bool sync) {
  std::string tmp = path + ".tmp";
  {
    // A stale temporary (an earlier crash) is removed, never written through: a link planted at
    // its name makes the open fail rather than write wherever it points.
    if (::unlink(tmp.c_str()) != 0 && errno != ENOENT)
      return Status::IoError(fmt::format("cannot remove {}: {}", tmp, ErrnoText(errno)));
    FdCloser fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (fd.get() < 0) return Status::IoError(fmt::format("cannot create {}: {}", tmp, ErrnoText(errno)));
    size_t off = 0;
    while (off < content.size()) {
      ssize_t n = ::write(fd.get(), content.data() + off, content.size() - off);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::IoError(fmt::format("cannot write {}: {}", tmp, ErrnoText(errno)));
      }
      off += static_cast<size_t>(n);
    }
    if (sync && ::fsync(fd.get()) != 0)
      return Status::IoError(fmt::format("cannot sync {}: {}", tmp, ErrnoText(errno)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return Status::IoError(fmt::format("cannot rename {} to {}: {}", tmp, path, ErrnoText(errno)));
  return Status::Ok();
}

Status WriteControlFile(const std::string& path, const std::string& content) {
  FdCloser fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (fd.get() < 0) return Status::IoError(fmt::format("cannot open {}: {}", path, ErrnoText(errno)));
  ssize_t n = ::write(fd.get(), content.data(), content.size());
  if (n != static_cast<ssize_t>(content.size()))
    return Status::IoError(fmt::format("cannot write '{}' to {}: {}", content, path, ErrnoText(errno)));
  return Status::Ok();
}

Status MakeDirs(const std::string& path) {
  if (path.empty()) return Status::InvalidArgument("empty directory path");
  std::string cur;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t next = path.find('/', pos);
    if (next == std::string::npos) next = path.size();
    cur = path.substr(0, next);
    if (!cur.empty() && ::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
      return Status::IoError(fmt::format("cannot create directory {}: {}", cur, ErrnoText(errno)));
    pos = next + 1;
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return Status::IoError(fmt::format("{} is not a directory", path));
  return Status::Ok();
}

// Never through a link: the task's directory is the task's to change between runs.
Status MakeCudaLedger(const std::string& path, int64_t uid, int64_t gid) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0600);
  if (fd < 0) return Status::Internal(fmt::format("creating the CUDA ledger {}: {}", path, ErrnoText(errno)));
  struct stat st {};
  Status status = Status::Ok();
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    status = Status::Internal(fmt::format("the CUDA ledger {} is not a regular file", path));
  } else if ((uid >= 0 && ::fchown(fd, static_cast<uid_t>(uid), static_cast<gid_t>(gid)) != 0) ||
             ::fchmod(fd, 0600) != 0) {
    status = Status::Internal(fmt::format("making the CUDA ledger {} the task's: {}", path, ErrnoText(errno)));
  }
  ::close(fd);
  return status;
}

Status MakeOwnedDir(const std::string& path, int64_t uid, int64_t gid) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
    return Status::IoError(fmt::format("cannot create {}: {}", path, ErrnoText(errno)));
  FdCloser fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) return Status::IoError(fmt::format("cannot open {}: {}", path, ErrnoText(errno)));
  if (::fchown(fd.get(), static_cast<uid_t>(uid), static_cast<gid_t>(gid < 0 ? uid : gid)) != 0 ||
      ::fchmod(fd.get(), 0700) != 0)
    return Status::IoError(fmt::format("cannot give {} to {}:{}: {}", path, uid, gid, ErrnoText(errno)));
  return Status::Ok();
}

Status EnsureOwnedDirUnder(const std::vector<std::string>& roots, const std::string& path, int64_t uid, int64_t gid) {
  if (path.empty() || path[0] != '/') return Status::InvalidArgument(fmt::format("'{}' is not an absolute path", path));
  std::vector<std::string> parts;
  for (size_t pos = 1; pos <= path.size();) {
    size_t next = path.find('/', pos);
    if (next == std::string::npos) next = path.size();
    std::string part = path.substr(pos, next - pos);
    if (part == "." || part == "..")
      return Status::InvalidArgument(fmt::format("'{}' has a '{}' part", path, part));
    if (!part.empty()) parts.push_back(std::move(part));
    pos = next + 1;
  }
  std::string normal;
  for (const auto& p : parts) normal += "/" + p;
  for (std::string root : roots) {
    while (root.size() > 1 && root.back() == '/') root.pop_back();
    if (root.empty() || root[0] != '/' || normal.size() <= root.size() + 1 ||
        normal.compare(0, root.size(), root) != 0 || (root != "/" && normal[root.size()] != '/'))
      continue;
    RETURN_IF_ERROR(MakeDirs(root));
    FdCloser dir(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dir.get() < 0) return Status::IoError(fmt::format("cannot open {}: {}", root, ErrnoText(errno)));
    const std::string rest = normal.substr(root == "/" ? 1 : root.size() + 1);
    size_t pos = 0;
    while (pos <= rest.size()) {
      size_t next = rest.find('/', pos);
      if (next == std::string::npos) next = rest.size();
      const std::string part = rest.substr(pos, next - pos);
      const bool last = next == rest.size();
      if (last) {
        // Made under a temporary name, given to the task, then renamed into place: nobody (another
        // agent starting a replica of the same job) ever sees it root's.
        static std::atomic<uint64_t> serial{0};
        const std::string tmp = fmt::format(".{}.gpupool-{}-{}", part, ::getpid(), serial.fetch_add(1));
        if (::mkdirat(dir.get(), tmp.c_str(), 0700) == 0) {
          FdCloser t(::openat(dir.get(), tmp.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
          const bool given = t.get() >= 0 && ::fchown(t.get(), static_cast<uid_t>(uid), static_cast<gid_t>(gid)) == 0 &&
                             ::fchmod(t.get(), 0700) == 0;
          if (!given || ::renameat2(dir.get(), tmp.c_str(), dir.get(), part.c_str(), RENAME_NOREPLACE) != 0) {
            const int e = errno;
            ::unlinkat(dir.get(), tmp.c_str(), AT_REMOVEDIR);
            if (!given || e != EEXIST)
              return Status::IoError(fmt::format("cannot create {} for uid {}: {}", normal, uid, ErrnoText(e)));
          }
        } else if (errno != EEXIST) {
          return Status::IoError(fmt::format("cannot create {}: {}", normal, ErrnoText(errno)));
        }
      } else if (::mkdirat(dir.get(), part.c_str(), 0755) != 0 && errno != EEXIST) {
        return Status::IoError(fmt::format("cannot create {}: {}", normal, ErrnoText(errno)));
      }
      FdCloser sub(::openat(dir.get(), part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (sub.get() < 0)
        return Status::PermissionDenied(fmt::format("{}: '{}' is a link or not a directory ({})", normal, part, ErrnoText(errno)));
      if (last) {
        struct stat st;
        if (::fstat(sub.get(), &st) != 0) return Status::IoError(fmt::format("stat {}: {}", normal, ErrnoText(errno)));
        if (static_cast<int64_t>(st.st_uid) != uid) {
          return Status::PermissionDenied(
              fmt::format("{} exists and belongs to uid {}, not to this task's uid {}", normal, st.st_uid, uid));
        }
        return Status::Ok();
      }
      dir.reset(sub.release());
      pos = next + 1;
    }
  }
  return Status::PermissionDenied(fmt::format("{} is not below an allowed checkpoint root ({})", normal,
                                              roots.empty() ? std::string("none is configured") : fmt::format("{}", fmt::join(roots, ", "))));
}

Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return Status::IoError(fmt::format("cannot stat {}: {}", path, ErrnoText(errno)));
  }
  if (S_ISDIR(st.st_mode)) {
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) return Status::IoError(fmt::format("cannot open {}: {}", path, ErrnoText(errno)));
    std::vector<std::string> names;
    while (dirent* e = ::readdir(dir)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(dir);
    for (const auto& n : names) RETURN_IF_ERROR(RemoveTree(path + "/" + n));
    if (::rmdir(path.c_str()) != 0)
      return Status::IoError(fmt::format("cannot remove {}: {}", path, ErrnoText(errno)));
    return Status::Ok();
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    return Status::IoError(fmt::format("cannot remove {}: {}", path, ErrnoText(errno)));
  return Status::Ok();
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

Status ValidateTaskId(const std::string& id) {
  if (id.empty()) return Status::InvalidArgument("task id is empty");
  if (id.size() > 128) return Status::InvalidArgument(fmt::format("task id '{}' is longer than 128 characters", id));
  if (id[0] == '.') return Status::InvalidArgument(fmt::format("task id '{}' starts with '.'", id));
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '_' || c == '-';
    if (!ok)
      return Status::InvalidArgument(
          fmt::format("task id '{}' may hold only letters, digits, '.', '_' and '-'", id));
  }
  if (id == "runc-root") return Status::InvalidArgument("task id 'runc-root' is reserved");
  return Status::Ok();
}

Status ValidateLaunchSpec(const LaunchSpec& spec) {
  RETURN_IF_ERROR(ValidateTaskId(spec.id));
  if (spec.argv.empty() || spec.argv[0].empty())
    return Status::InvalidArgument(fmt::format("task {}: argv is empty", spec.id));
  if (spec.cpu_milli < 0 || spec.memory_bytes < 0)
    return Status::InvalidArgument(fmt::format("task {}: negative CPU or memory limit", spec.id));
  return Status::Ok();
}

std::string DefaultPath() { return "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"; }

Result<std::string> FindExecutable(const std::string& name, const std::string& path_var) {
  if (name.empty()) return Status::InvalidArgument("the command is empty");
  if (name.find('/') != std::string::npos) return name;
  size_t pos = 0;
  while (pos <= path_var.size()) {
    size_t next = path_var.find(':', pos);
    if (next == std::string::npos) next = path_var.size();
    std::string_view dir = std::string_view(path_var).substr(pos, next - pos);
    std::string candidate = fmt::format("{}/{}", dir.empty() ? std::string_view(".") : dir, name);
    struct stat st;
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    pos = next + 1;
  }
  return Status::NotFound(fmt::format("no such command '{}' (searched PATH={})", name, path_var));
}

}  // namespace gpupool::agent_internal
