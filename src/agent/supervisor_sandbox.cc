#include "agent/supervisor_sandbox.h"

#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <string_view>

namespace gpupool::agent_internal {
namespace {

constexpr const char* kStandardDevices[] = {"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom",
                                            "/dev/tty"};

// `path` is `dir` or lies below it.
bool Under(std::string_view path, std::string_view dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.remove_suffix(1);
  if (path.substr(0, dir.size()) != dir) return false;
  return path.size() == dir.size() || path[dir.size()] == '/' || dir == "/";
}

// mkdir -p, every new directory root's and 0755 (inside a tmpfs of ours: nothing of the host's).
bool MakeDirsIn(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i != path.size() && path[i] != '/') continue;
    std::string prefix = path.substr(0, i);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  return true;
}

bool Fail(int32_t stage, int32_t* out_stage, int* err) {
  *out_stage = stage;
  *err = errno != 0 ? errno : EINVAL;
  return false;
}

bool BuildDev(const std::vector<DeviceNode>& devices) {
  if (::mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=1024k") != 0) return false;
  for (const DeviceNode& d : devices) {
    const size_t slash = d.path.rfind('/');
    if (slash > 4 && !MakeDirsIn(d.path.substr(0, slash))) return false;
    // mknod applies the umask; the mode is set exactly afterwards.
    if (::mknod(d.path.c_str(), d.mode, d.rdev) != 0 && errno != EEXIST) return false;
    if (::chmod(d.path.c_str(), d.mode & 07777) != 0) return false;
  }
  const std::pair<const char*, const char*> links[] = {{"/proc/self/fd", "/dev/fd"},
                                                       {"/proc/self/fd/0", "/dev/stdin"},
                                                       {"/proc/self/fd/1", "/dev/stdout"},
                                                       {"/proc/self/fd/2", "/dev/stderr"},
                                                       {"pts/ptmx", "/dev/ptmx"}};
  for (const auto& [target, name] : links)
    if (::symlink(target, name) != 0) return false;
  if (::mkdir("/dev/pts", 0755) != 0 || ::mkdir("/dev/shm", 01777) != 0 || ::chmod("/dev/shm", 01777) != 0)
    return false;
  // A fresh devpts and a fresh shared-memory tmpfs: no other task's terminals or segments.
  if (::mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620") != 0)
    return false;
  if (::mount("shm", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777") != 0) return false;
  return true;
}

// Binds `fd` (an O_PATH descriptor of a regular file) over the file `target`, read-only unless
// `writable`; closes `fd`.
bool BindFile(int fd, const char* target, bool writable) {
  struct stat st;
  int error = 0;
  if (::fstat(fd, &st) != 0) error = errno;
  else if (!S_ISREG(st.st_mode)) error = EINVAL;
  char fd_path[64];
  std::snprintf(fd_path, sizeof(fd_path), "/proc/self/fd/%d", fd);
  if (error == 0 && ::mount(fd_path, target, nullptr, MS_BIND, nullptr) != 0) error = errno;
  ::close(fd);
  if (error != 0) {
    errno = error;
    return false;
  }
  // A bind takes its flags only from a remount of it.
  const unsigned long flags = MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | (writable ? 0 : MS_RDONLY);
  return ::mount(nullptr, target, nullptr, flags, nullptr) == 0;
}

// The run files into a fresh tmpfs at kTaskRunDir (then read-only: nothing can be added, renamed or
// removed there), and the preload list over the loader's. The host's kTaskRunDir and
// kLoaderPreloadList must exist (the runtime makes them): a bind needs something to cover.
bool BindRunFiles(const SupervisorPlan& plan, const std::vector<int>& run_fds, int preload_fd) {
  if (!plan.run_files.empty()) {
    if (::mount("gpupool-run", kTaskRunDir, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k") != 0) return false;
    for (size_t i = 0; i < plan.run_files.size(); ++i) {
      const std::string target = std::string(kTaskRunDir) + "/" + plan.run_files[i].name;
      int made = ::open(target.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444);
      if (made < 0) return false;
      ::close(made);
      if (!BindFile(run_fds[i], target.c_str(), plan.run_files[i].writable)) return false;
    }
    if (::mount(nullptr, kTaskRunDir, nullptr, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr) != 0)
      return false;
  }
  return preload_fd < 0 || BindFile(preload_fd, kLoaderPreloadList, false);
}

}  // namespace

std::vector<DeviceNode> StatDevices(const std::vector<std::string>& extra) {
  std::vector<DeviceNode> out;
  auto add = [&](const std::string& path) {
    if (path.rfind("/dev/", 0) != 0 || path.find("/../") != std::string::npos || path.find("/./") != std::string::npos)
      return;
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || !(S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode))) return;
    for (const DeviceNode& d : out)
      if (d.path == path) return;
    out.push_back(DeviceNode{path, st.st_mode, st.st_rdev});
  };
  for (const char* p : kStandardDevices) add(p);
  for (const auto& p : extra) add(p);
  return out;
}

bool EnterSandbox(const SupervisorPlan& plan, const std::vector<DeviceNode>& devices, int32_t* stage, int* err) {
  errno = 0;
  if (plan.mount_namespace()) {
    if (::unshare(CLONE_NEWNS) != 0) return Fail(kMsgNamespace, stage, err);
    // Nothing mounted here reaches the host; the host's later mounts still show here.
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0) return Fail(kMsgNamespace, stage, err);
    // The directories to bring back, opened before anything covers them (in this namespace: a
    // bind needs a source in the caller's own namespace).
    std::vector<std::pair<std::string, int>> keeps;
    for (const auto& k : plan.keep_paths) {
      int fd = ::open(k.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
      if (fd < 0 && errno == ENOENT) {  // nothing there to keep (a simulated GPU's MPS pipes)
        errno = 0;
        continue;
      }
      if (fd < 0) return Fail(kMsgNamespace, stage, err);
      keeps.emplace_back(k, fd);
    }
    // The files to bind in later, opened now for the same reason (their sources sit in the task's
    // directory, under the state directory that is hidden next). All must be there.
    std::vector<int> run_fds;
    for (const auto& f : plan.run_files) {
      int fd = ::open(f.source.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) return Fail(kMsgNamespace, stage, err);
      run_fds.push_back(fd);
    }
    int preload_fd = -1;
    if (!plan.preload_list.empty()) {
      preload_fd = ::open(plan.preload_list.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
      if (preload_fd < 0) return Fail(kMsgNamespace, stage, err);
    }
    // A kept directory below an ancestor its uid may not pass (a state directory under /root,
    // mode 0700) would be unreachable: the highest such ancestor is hidden too (the task could not
    // see into it anyway), which lets the bind below bring the kept directory back.
    // Only for a task that drops root: root passes every directory, and hiding an ancestor would
    // hide everything else below it (a root queue's task lost its own files so).
    std::vector<std::string> hide = plan.hide_paths;
    for (const auto& [k, fd] : keeps) {
      if (plan.uid <= 0) break;
      for (size_t i = 1; i < k.size(); ++i) {
        if (k[i] != '/') continue;
        const std::string anc = k.substr(0, i);
        struct stat st;
        if (::stat(anc.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
        const bool passes = (st.st_mode & S_IXOTH) != 0 ||
                            (static_cast<int64_t>(st.st_uid) == plan.uid && (st.st_mode & S_IXUSR) != 0) ||
                            (static_cast<int64_t>(st.st_gid) == plan.gid && (st.st_mode & S_IXGRP) != 0);
        if (!passes) {
          bool covered = false;
          for (const auto& h : hide) covered = covered || Under(anc, h);
          if (!covered) hide.push_back(anc);
          break;
        }
      }
    }
    // Outermost first; a path inside one hidden already needs nothing more.
    std::sort(hide.begin(), hide.end(), [](const std::string& x, const std::string& y) { return x.size() < y.size(); });
    std::vector<std::string> hidden_dirs;
    for (const auto& h : hide) {
      bool inside = false;
      for (const auto& d : hidden_dirs) inside = inside || Under(h, d);
      if (inside) continue;
      struct stat st;
      if (::lstat(h.c_str(), &st) != 0) continue;  // absent, or under a path hidden already
      if (S_ISDIR(st.st_mode)) {
        if (::mount("gpupool-hidden", h.c_str(), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=64k") != 0)
          return Fail(kMsgNamespace, stage, err);
        hidden_dirs.push_back(h);
      } else if (S_ISREG(st.st_mode)) {
        if (::mount("/dev/null", h.c_str(), nullptr, MS_BIND, nullptr) != 0) return Fail(kMsgNamespace, stage, err);
      }
    }
    char fd_path[64];
    for (const auto& [path, fd] : keeps) {
      bool covered = false;
      for (const auto& h : hide) covered = covered || Under(path, h);
      if (!covered) {
        ::close(fd);
        continue;
      }
      std::snprintf(fd_path, sizeof(fd_path), "/proc/self/fd/%d", fd);
      if (!MakeDirsIn(path) || ::mount(fd_path, path.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0)
        return Fail(kMsgNamespace, stage, err);
      ::close(fd);
    }
    for (const auto& h : hidden_dirs)
      if (::mount(nullptr, h.c_str(), nullptr, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0)
        return Fail(kMsgNamespace, stage, err);
    if (!BindRunFiles(plan, run_fds, preload_fd)) return Fail(kMsgNamespace, stage, err);
    if (plan.private_dev && !BuildDev(devices)) return Fail(kMsgNamespace, stage, err);
    // Other users' processes out of sight (their command lines and what runs where). A per-mount
    // option since Linux 5.8; an older kernel refuses "invisible" (it would have changed the
    // host's /proc, shared then) and the task keeps the host's view, its environment still
    // private to its uid.
    if (plan.uid > 0)
      (void)::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=invisible");
  }
  if (plan.gid >= 0) {
    if (::setgroups(0, nullptr) != 0) return Fail(kMsgIdentity, stage, err);
    const gid_t g = static_cast<gid_t>(plan.gid);
    if (::setresgid(g, g, g) != 0) return Fail(kMsgIdentity, stage, err);
  }
  if (plan.uid > 0) {
    // Out of the bounding set too, so not even a setuid-root binary could hand one back.
    for (int cap = 0; cap <= 63; ++cap)
      if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) return Fail(kMsgIdentity, stage, err);
    errno = 0;
    (void)::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    const uid_t u = static_cast<uid_t>(plan.uid);
    // From root to a non-root uid in all three ids: the permitted and effective sets empty too.
    if (::setresuid(u, u, u) != 0) return Fail(kMsgIdentity, stage, err);
  }
  if (plan.no_new_privs && ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return Fail(kMsgIdentity, stage, err);
  return true;
}

}  // namespace gpupool::agent_internal
