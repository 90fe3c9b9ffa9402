// Disk scratch with a size limit: a loop-mounted ext4 image per scratch volume (scratch_disk.h).
#include "agent/scratch_disk.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "agent/runtime_internal.h"

namespace gpupool::agent_internal {

Result<ScratchDiskTools> FindScratchDiskTools() {
  ScratchDiskTools tools;
  auto mkfs = FindExecutable("mkfs.ext4", DefaultPath());
  if (!mkfs.ok())
    return Status::FailedPrecondition("disk scratch with a sizeLimit needs mkfs.ext4 (Debian's e2fsprogs) on the node");
  auto mount = FindExecutable("mount", DefaultPath());
  if (!mount.ok())
    return Status::FailedPrecondition("disk scratch with a sizeLimit needs mount (Debian's mount, util-linux) on the node");
  tools.mkfs = *mkfs;
  tools.mount = *mount;
  return tools;
}

namespace {

Status Run(const std::vector<std::string>& argv, std::chrono::milliseconds timeout, const std::string& what) {
  std::string out;
  auto rc = RunCommand(argv, &out, timeout);
  if (!rc.ok()) return rc.status().WithContext(what);
  if (*rc != 0) {
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    if (out.size() > 300) out = "..." + out.substr(out.size() - 300);
    return Status::IoError(fmt::format("{}: {} exited {}: {}", what, argv[0], *rc, out));
  }
  return Status::Ok();
}

}  // namespace

Status MountScratchDisk(const ScratchDiskTools& tools, const std::string& image, const std::string& dir,
                        int64_t bytes, int64_t uid, int64_t gid) {
  if (bytes <= 0) return Status::InvalidArgument("a scratch disk needs a size");
  // The image is sparse: its limit caps the task, it reserves nothing. A limit beyond what the
  // disk has free could never hold, and would let one task fill the node's disk: refused.
  struct statvfs vfs {};
  const std::string parent = image.substr(0, image.rfind('/') + 1);
  if (::statvfs(parent.c_str(), &vfs) != 0)
    return Status::IoError(fmt::format("cannot stat the file system of {}: {}", parent, ErrnoText(errno)));
  const auto free_bytes = static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
  if (bytes > free_bytes)
    return Status::ResourceExhausted(fmt::format("a sizeLimit of {} MiB is more than the {} MiB free under {}",
                                                 bytes >> 20, free_bytes >> 20, parent));
  {
    FdCloser fd(::open(image.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (fd.get() < 0) return Status::IoError(fmt::format("cannot create {}: {}", image, ErrnoText(errno)));
    if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
      const int e = errno;
      ::unlink(image.c_str());
      return Status::IoError(fmt::format("cannot size {} to {} bytes: {}", image, bytes, ErrnoText(e)));
    }
  }
  // No journal (scratch goes with its run; nothing to recover), no reserved blocks, the root
  // directory the task's from the start.
  Status st = Run({tools.mkfs, "-q", "-F", "-m", "0", "-O", "^has_journal", "-E",
                   fmt::format("root_owner={}:{},lazy_itable_init=1,nodiscard", uid, gid), image},
                  tools.timeout, "formatting the scratch disk");
  if (st.ok())
    st = Run({tools.mount, "-t", "ext4", "-o", "loop,nosuid,nodev,noatime", image, dir}, tools.timeout,
             "mounting the scratch disk");
  if (st.ok()) {
    (void)::rmdir((dir + "/lost+found").c_str());
    if (::chmod(dir.c_str(), 0700) != 0) {
      st = Status::IoError(fmt::format("cannot chmod {}: {}", dir, ErrnoText(errno)));
      UnmountScratch(dir);
    }
  }
  if (!st.ok()) ::unlink(image.c_str());
  return st;
}

void UnmountScratch(const std::string& dir) {
  // EINVAL: nothing mounted there; ENOENT: no directory.
  (void)::umount2(dir.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW);
}

}  // namespace gpupool::agent_internal
