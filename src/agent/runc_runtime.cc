// The runc runtime: each task is an OCI container. The supervisor (runtime_internal.h) runs
// `runc run <id>` in the foreground: runc passes its own stdio (the log files) to the container
// and exits with the container's status (128+signal when killed), which the supervisor records
// in exit.json. runc's own state lives under <state_dir>/runc-root.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <ctime>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "agent/container_preload.h"
#include "agent/runtime.h"
#include "agent/runtime_internal.h"

namespace gpupool {

namespace agent_internal {

namespace {

// Everything is allowed but the system calls no task needs and that have been ways out of
// containers or into the kernel (module loading, kexec, handles to host files, keyrings, BPF,
// userfaultfd, the clock, swap, reboot, mounting): they fail with EPERM. Names this kernel or
// libseccomp does not know are skipped by runc.
nlohmann::json SeccompProfile() {
  static const char* const kDenied[] = {
      "acct",          "add_key",          "bpf",           "clock_adjtime", "clock_settime", "create_module",
      "delete_module", "finit_module",     "fsconfig",      "fsmount",       "fsopen",        "fspick",
      "get_kernel_syms", "init_module",    "ioperm",        "iopl",          "kcmp",          "kexec_file_load",
      "kexec_load",    "keyctl",           "lookup_dcookie", "mount",        "mount_setattr", "move_mount",
      "name_to_handle_at", "nfsservctl",   "open_by_handle_at", "open_tree", "perf_event_open", "pivot_root",
      "process_vm_readv", "process_vm_writev", "quotactl",  "reboot",        "request_key",   "setns",
      "settimeofday",  "swapoff",          "swapon",        "syslog",        "umount2",       "unshare",
      "uselib",        "userfaultfd",      "ustat",         "vhangup",       "adjtimex"};
  nlohmann::json names = nlohmann::json::array();
  for (const char* n : kDenied) names.push_back(n);
  return {{"defaultAction", "SCMP_ACT_ALLOW"},
          {"syscalls", nlohmann::json::array({{{"names", names}, {"action", "SCMP_ACT_ERRNO"}, {"errnoRet", 1}}})}};
}

}  // namespace

Result<std::string> BuildOciConfig(const LaunchSpec& spec, const std::string& rootfs_abs,
                                   const std::string& cgroup_parent,
                                   const std::vector<LaunchSpec::Bind>& last_binds) {
  using nlohmann::json;
  if (spec.argv.empty()) return Status::InvalidArgument(fmt::format("task {}: argv is empty", spec.id));
  json env = json::array();
  for (const auto& [k, v] : spec.env) {
    if (k.empty() || k.find('=') != std::string::npos)
      return Status::InvalidArgument(fmt::format("task {}: bad environment variable name '{}'", spec.id, k));
    env.push_back(k + "=" + v);
  }
  // Sandboxed (a uid given): a user namespace maps the task's uid to the container's root, and the
  // container keeps no capability at all. Otherwise (a queue allowed root) runc's usual set.
  const bool userns = spec.uid >= 0;
  const json caps = userns ? json::array()
                           : json{"CAP_CHOWN",   "CAP_DAC_OVERRIDE", "CAP_FSETID",           "CAP_FOWNER",
                                  "CAP_MKNOD",   "CAP_NET_RAW",      "CAP_SETGID",           "CAP_SETUID",
                                  "CAP_SETFCAP", "CAP_SETPCAP",      "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT",
                                  "CAP_KILL",    "CAP_AUDIT_WRITE"};
  const bool host_network = spec.network == "host";
  const bool pod_network = spec.network == "pod";
  if (pod_network && (spec.netns_path.empty() || spec.netns_path.front() != '/'))
    return Status::InvalidArgument(fmt::format("task {}: network pod needs the path of its network namespace", spec.id));
  if (!host_network && !pod_network && spec.network != "none" && !spec.network.empty())
    return Status::InvalidArgument(fmt::format("task {}: network must be none, pod or host", spec.id));
  json process = {
      {"terminal", false},
      {"user", {{"uid", 0}, {"gid", 0}}},
      {"args", spec.argv},
      {"env", env},
      {"cwd", spec.workdir.empty() ? std::string("/") : spec.workdir},
      {"capabilities", {{"bounding", caps}, {"effective", caps}, {"permitted", caps}, {"inheritable", json::array()}, {"ambient", json::array()}}},
      // No rlimits: the container inherits the agent's (a fixed RLIMIT_NOFILE above the host's
      // hard limit would make every start fail).
      {"noNewPrivileges", true},
  };
  json mounts = json::array({
      {{"destination", "/proc"}, {"type", "proc"}, {"source", "proc"}},
      {{"destination", "/dev"},
       {"type", "tmpfs"},
       {"source", "tmpfs"},
       {"options", {"nosuid", "strictatime", "mode=755", "size=65536k"}}},
      {{"destination", "/dev/pts"},
       {"type", "devpts"},
       {"source", "devpts"},
       {"options", {"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}}},
      {{"destination", "/dev/shm"},
       {"type", "tmpfs"},
       {"source", "shm"},
       {"options", {"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}}},
      {{"destination", "/dev/mqueue"}, {"type", "mqueue"}, {"source", "mqueue"}, {"options", {"nosuid", "noexec", "nodev"}}},
      // A writable scratch directory: the root filesystem is read-only.
      {{"destination", "/tmp"}, {"type", "tmpfs"}, {"source", "tmpfs"}, {"options", {"nosuid", "nodev", "mode=1777"}}},
  });
  // sysfs needs a network namespace of the container's own when it has a user namespace; with the
  // host's network or a pod's (the agent's namespace, not the container's), the host's /sys
  // read-only. The cgroup tree is not the task's business then.
  if (userns && (host_network || pod_network)) {
    mounts.push_back({{"destination", "/sys"}, {"type", "bind"}, {"source", "/sys"},
                      {"options", {"rbind", "nosuid", "noexec", "nodev", "ro"}}});
  } else {
    mounts.push_back({{"destination", "/sys"}, {"type", "sysfs"}, {"source", "sysfs"},
                      {"options", {"nosuid", "noexec", "nodev", "ro"}}});
  }
  if (!userns) {
    mounts.push_back({{"destination", "/sys/fs/cgroup"}, {"type", "cgroup"}, {"source", "cgroup"},
                      {"options", {"nosuid", "noexec", "nodev", "relatime", "ro"}}});
  }
  const size_t runtime_mounts = mounts.size();  // /proc, /dev, /sys, /tmp, ...: before everything else
  for (const auto& b : spec.binds) {
    if (b.source.empty() || b.source[0] != '/' || b.destination.empty() || b.destination[0] != '/')
      return Status::InvalidArgument(fmt::format("task {}: a bind needs absolute paths ('{}' -> '{}')", spec.id,
                                                 b.source, b.destination));
    json opts = {"rbind", b.readonly ? "ro" : "rw", "nosuid", "nodev"};
    mounts.push_back({{"destination", b.destination}, {"type", "bind"}, {"source", b.source}, {"options", opts}});
  }
  for (const auto& t : spec.tmpfs) {
    if (t.destination.empty() || t.destination[0] != '/' || t.size_bytes <= 0)
      return Status::InvalidArgument(fmt::format("task {}: a tmpfs needs an absolute path and a size ('{}')", spec.id,
                                                 t.destination));
    mounts.push_back({{"destination", t.destination},
                      {"type", "tmpfs"},
                      {"source", "tmpfs"},
                      {"options", {"nosuid", "nodev", "mode=0700", fmt::format("size={}", t.size_bytes)}}});
  }
  for (const auto& m : spec.mounts) {
    const bool bind = m.type.empty() || m.type == "bind";
    if ((bind && (m.source.empty() || m.source[0] != '/')) || m.destination.empty() || m.destination[0] != '/')
      return Status::InvalidArgument(fmt::format("task {}: a mount needs absolute paths ('{}' -> '{}')", spec.id,
                                                 m.source, m.destination));
    json opts = m.options;
    if (bind && std::none_of(m.options.begin(), m.options.end(),
                             [](const std::string& o) { return o == "bind" || o == "rbind"; }))
      opts.push_back("rbind");
    mounts.push_back({{"destination", m.destination}, {"type", bind ? "bind" : m.type}, {"source", m.source},
                      {"options", opts}});
  }
  for (const auto& path : spec.readonly_binds) {
    if (path.empty() || path[0] != '/' || !PathExists(path)) continue;  // absent on this host
    mounts.push_back({{"destination", path},
                      {"type", "bind"},
                      {"source", path},
                      {"options", {"rbind", "ro", "nosuid", "nodev"}}});
  }

  // Device cgroup: deny everything, runc adds its defaults (null, zero, tty, ...), we allow GPUs.
  json device_rules = json::array({{{"allow", false}, {"access", "rwm"}}});
  json devices = json::array();
  std::vector<LaunchSpec::Device> nodes;
  for (const auto& path : spec.devices) nodes.push_back({path, path});
  nodes.insert(nodes.end(), spec.container_devices.begin(), spec.container_devices.end());
  for (const auto& [host_path, path] : nodes) {
    struct stat st;
    if (path.empty() || path[0] != '/' || host_path.empty() || ::stat(host_path.c_str(), &st) != 0)
      continue;  // absent on this host
    if (!S_ISCHR(st.st_mode) && !S_ISBLK(st.st_mode)) continue;
    const char* type = S_ISCHR(st.st_mode) ? "c" : "b";
    int64_t major_n = major(st.st_rdev), minor_n = minor(st.st_rdev);
    device_rules.push_back({{"allow", true}, {"type", type}, {"major", major_n}, {"minor", minor_n}, {"access", "rwm"}});
    if (host_path != path) {
      // Elsewhere on the host (a CDI spec's hostPath): bound in, as runc itself does for every
      // device in a user namespace, where it may not make device nodes; the cgroup rule above holds.
      mounts.push_back({{"destination", path},
                        {"type", "bind"},
                        {"source", host_path},
                        {"options", {"bind", "nosuid", "noexec"}}});
      continue;
    }
    devices.push_back({{"path", path},
                       {"type", type},
                       {"major", major_n},
                       {"minor", minor_n},
                       {"fileMode", st.st_mode & 07777},
                       {"uid", 0},
                       {"gid", 0}});
  }

  json resources = {{"devices", device_rules}};
  if (spec.cpu_milli > 0) {
    constexpr int64_t kPeriod = 100000;
    resources["cpu"] = {{"quota", std::max<int64_t>(1000, spec.cpu_milli * kPeriod / 1000)}, {"period", kPeriod}};
  }
  if (spec.memory_bytes > 0) resources["memory"] = {{"limit", spec.memory_bytes}};
  if (spec.pids_max > 0) resources["pids"] = {{"limit", spec.pids_max}};

  // network "none": a namespace of its own, loopback only (nothing of the host's ports, the
  // server's and the agent's included); "host": the host's (needs a queue the admin allows it
  // for: NCCL and RDMA over the host's NICs).
  // A cgroup namespace of its own: the container sees its own group as the root of the tree
  // (its limits at /sys/fs/cgroup/memory.max under cgroup v2, where without it the cgroup2 mount
  // shows the host's whole hierarchy, every other task's group included), and /proc/self/cgroup
  // names no host path.
  json namespaces = json::array(
      {{{"type", "pid"}}, {{"type", "ipc"}}, {{"type", "uts"}}, {{"type", "mount"}}, {{"type", "cgroup"}}});
  // "pod": the namespace the agent made, with an interface on its bridge (agent/pod_network.h).
  if (pod_network) {
    namespaces.push_back({{"type", "network"}, {"path", spec.netns_path}});
  } else if (!host_network) {
    namespaces.push_back({{"type", "network"}});
  }
  if (userns) namespaces.push_back({{"type", "user"}});
  json linux_section = {
      {"namespaces", namespaces},
      {"cgroupsPath", cgroup_parent + "/" + spec.id},
      {"resources", resources},
      {"devices", devices},
      {"maskedPaths",
       {"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
        "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware"}},
      {"readonlyPaths", {"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}},
      {"seccomp", SeccompProfile()},
  };
  if (userns) {
    const int64_t gid = spec.gid >= 0 ? spec.gid : spec.uid;
    linux_section["uidMappings"] = json::array({{{"containerID", 0}, {"hostID", spec.uid}, {"size", 1}}});
    linux_section["gidMappings"] = json::array({{{"containerID", 0}, {"hostID", gid}, {"size", 1}}});
  }
  // runc mounts in order: an outer mount after an inner one would hide it (a tmpfs at /mem over a
  // volume at /mem/data). Fewer path parts first; the order given among equals.
  std::stable_sort(mounts.begin() + static_cast<std::ptrdiff_t>(runtime_mounts), mounts.end(),
                   [](const json& x, const json& y) {
                     const auto depth = [](const json& m) {
                       const std::string& d = m["destination"].get_ref<const std::string&>();
                       return std::count(d.begin(), d.end(), '/');
                     };
                     return depth(x) < depth(y);
                   });
  for (const auto& b : last_binds) {
    if (b.source.empty() || b.source[0] != '/' || b.destination.empty() || b.destination[0] != '/')
      return Status::InvalidArgument(fmt::format("task {}: a bind needs absolute paths ('{}' -> '{}')", spec.id,
                                                 b.source, b.destination));
    mounts.push_back({{"destination", b.destination},
                      {"type", "bind"},
                      {"source", b.source},
                      {"options", {"bind", b.readonly ? "ro" : "rw", "nosuid", "nodev"}}});
  }
  json hooks = json::object();
  for (const auto& h : spec.hooks) {
    json hook = {{"path", h.path}};
    if (!h.args.empty()) hook["args"] = h.args;
    if (!h.env.empty()) hook["env"] = h.env;
    if (h.timeout_seconds > 0) hook["timeout"] = h.timeout_seconds;
    hooks[h.stage].push_back(std::move(hook));
  }
  json config = {
      {"ociVersion", "1.0.2"},
      {"process", process},
      {"root", {{"path", rootfs_abs}, {"readonly", true}}},
      {"hostname", spec.id},
      {"mounts", mounts},
      {"linux", linux_section},
  };
  if (!hooks.empty()) config["hooks"] = std::move(hooks);
  return config.dump(2) + "\n";
}

namespace {

// The msg="..." of one of runc's log lines starting at `from` (just past the opening quote),
// unescaped, control characters as spaces, at most `max` bytes.
std::string LogfmtMessage(std::string_view text, size_t from, size_t max) {
  std::string out;
  for (size_t i = from; i < text.size() && text[i] != '\n' && out.size() < max; ++i) {
    char c = text[i];
    if (c == '"') break;
    if (c == '\\' && i + 1 < text.size() && text[i + 1] != '\n') c = text[++i];
    out.push_back(static_cast<unsigned char>(c) < 0x20 || c == 0x7f ? ' ' : c);
  }
  return out;
}

}  // namespace

std::string RuncErrorIn(std::string_view tail) {
  // runc (and its nsexec stage) log `level=fatal` or `level=error`: the first such line is the
  // cause ("failed to open mount source ..."), the last one runc's summary of it.
  std::string first, last;
  for (size_t pos = 0; pos < tail.size();) {
    size_t end = tail.find('\n', pos);
    if (end == std::string_view::npos) end = tail.size();
    const std::string_view line = tail.substr(pos, end - pos);
    for (std::string_view mark : {std::string_view("level=fatal msg=\""), std::string_view("level=error msg=\"")}) {
      const size_t at = line.find(mark);
      if (at == std::string_view::npos) continue;
      last = LogfmtMessage(line, at + mark.size(), 400);
      if (first.empty()) first = last;
      break;
    }
    pos = end + 1;
  }
  return first == last ? first : first + " (" + last + ")";
}

std::string ReadTail(const std::string& path, size_t max_bytes) {
  FdCloser fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  struct stat st;
  if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return "";
  const off_t size = st.st_size;
  const off_t from = size > static_cast<off_t>(max_bytes) ? size - static_cast<off_t>(max_bytes) : 0;
  std::string out(static_cast<size_t>(size - from), '\0');
  const ssize_t n = ::pread(fd.get(), out.data(), out.size(), from);
  out.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return out;
}

Status MakeDirsBeneath(const std::string& root, const std::string& path, bool file) {
  int fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Status::IoError(fmt::format("the image root {}: {}", root, ErrnoText(errno)));
  std::string walked;
  size_t start = 0;
  Status result = Status::Ok();
  while (start < path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    const std::string part = path.substr(start, end - start);
    start = end + 1;
    if (part.empty() || part == ".") continue;
    walked += "/" + part;
    if (part == "..") {
      result = Status::InvalidArgument(fmt::format("the mountpoint {} holds '..'", path));
      break;
    }
    if (file && path.find_first_not_of('/', end) == std::string::npos) {
      // A file's mountpoint (a driver library, a binary): an empty file, never through a link.
      const int made = ::openat(fd, part.c_str(), O_CREAT | O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
      if (made < 0) {
        const int err = errno;
        result = Status::FailedPrecondition(fmt::format(
            "the image's {} is {}: {} cannot be mounted there", walked,
            err == ELOOP ? "a link" : err == EISDIR ? "a directory" : ErrnoText(err), path));
      } else {
        ::close(made);
      }
      break;
    }
    if (::mkdirat(fd, part.c_str(), 0755) != 0 && errno != EEXIST) {
      result = Status::IoError(fmt::format("cannot make the mountpoint {} in the image: {}", walked, ErrnoText(errno)));
      break;
    }
    const int next = ::openat(fd, part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) {
      const int err = errno;
      result = Status::FailedPrecondition(fmt::format(
          "the image's {} is {}: {} cannot be mounted there", walked,
          err == ELOOP || err == ENOTDIR ? "a link or a file, not a directory" : ErrnoText(err), path));
      break;
    }
    ::close(fd);
    fd = next;
  }
  ::close(fd);
  return result;
}

}  // namespace agent_internal

namespace {

using namespace agent_internal;

constexpr std::chrono::seconds kHelperTimeout{20};

std::string AbsolutePath(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) != nullptr) return buf;
  return path;
}

class RuncRuntime final : public SupervisedRuntime {
 public:
  RuncRuntime(std::string state_dir, const RuntimeOptions& options, std::string runc)
      : SupervisedRuntime(std::move(state_dir), options),
        runc_(std::move(runc)),
        runc_root_(state_dir_ + "/runc-root"),
        class_(options.runtime_class),
        global_flags_(options.global_flags),
        network_flag_(options.network_flag) {
    for (const auto& root : options.container_roots)
      if (!root.empty() && root[0] == '/') roots_.push_back(root);
    AdoptExisting();
    for (auto it = tasks_.begin(); it != tasks_.end();) {
      if (!it->second.runc)
        it = tasks_.erase(it);
      else
        ++it;
    }
  }

  // runc removes each container's group; the agent's scope goes with the runtime, if empty.
  ~RuncRuntime() override { RemoveEmptyCgroupScope("/sys/fs/cgroup", CgroupScope(state_dir_)); }

  std::string name() const override { return class_; }

  Status Start(const LaunchSpec& given) override {
    std::lock_guard<std::mutex> lock(mu_);
    LaunchSpec spec = given;
    RETURN_IF_ERROR(ValidateTaskId(spec.id));
    // Debian's runsc (20221219) starts its sandbox outside a namespace the spec names ("cannot run
    // with network enabled in root network namespace"): a pod's network is for runc and crun.
    if (network_flag_ && spec.network == "pod")
      return Status::FailedPrecondition(fmt::format(
          "task {}: runtime class {} cannot join a pod network (its sandbox starts outside the pod's namespace); "
          "use runc or crun, or network: none", spec.id, name()));
    // A bundle is read for its command, environment, working directory and root, and nothing else:
    // the agent writes the configuration every container runs with (identity, namespaces, mounts,
    // devices, limits), whatever the bundle's says.
    std::string rootfs = spec.rootfs;
    if (!spec.image_rootfs.empty() && (!spec.bundle.empty() || !spec.rootfs.empty()))
      return Status::InvalidArgument(fmt::format("task {}: an image goes with neither a bundle nor a rootfs", spec.id));
    if (!spec.bundle.empty()) {
      if (!spec.rootfs.empty())
        return Status::InvalidArgument(fmt::format("task {}: give a bundle or a rootfs, not both", spec.id));
      ASSIGN_OR_RETURN(std::string bundle_dir, AllowedPath(spec.id, "bundle", spec.bundle));
      ASSIGN_OR_RETURN(rootfs, ReadBundle(bundle_dir, &spec));
    }
    if (rootfs.empty() && spec.image_rootfs.empty())
      return Status::InvalidArgument(fmt::format("task {}: neither a bundle nor a rootfs was given", spec.id));
    std::string rootfs_abs;
    if (!spec.image_rootfs.empty()) {
      rootfs_abs = AbsolutePath(spec.image_rootfs);
    } else {
      ASSIGN_OR_RETURN(rootfs_abs, AllowedPath(spec.id, "rootfs", rootfs));
    }
    RETURN_IF_ERROR(ValidateLaunchSpec(spec));
    std::vector<LaunchSpec::Bind> limiter_binds;
    if (!spec.cuda_limiter.empty()) {
      ASSIGN_OR_RETURN(limiter_binds,
                       PrepareCudaLimiter(&spec, rootfs_abs, TaskDir(spec.id), CudaLedgerPath(spec.id)));
    }
    {
      // runc makes a mount's missing mountpoint as the container's root, which may not write in a
      // root-owned tree (runsc makes them on the host's side, where it may not either): the agent
      // makes them first. In an image (the agent's own) that must work; in a rootfs or bundle
      // of the admin's it is best effort (a read-only one, a link runc resolves inside it).
      std::vector<std::string> points = {"/proc", "/dev", "/sys", "/tmp"};
      for (const auto& t : spec.tmpfs) points.push_back(t.destination);
      if (!spec.workdir.empty()) points.push_back(spec.workdir);
      std::vector<std::pair<std::string, bool>> made_points;
      for (const auto& p : points) made_points.push_back({p, false});
      for (const auto& b : spec.binds) {
        struct stat st;
        made_points.push_back({b.destination, ::stat(b.source.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)});
      }
      for (const auto& m : spec.mounts) {
        struct stat st;
        const bool file = (m.type.empty() || m.type == "bind") && ::stat(m.source.c_str(), &st) == 0 &&
                          !S_ISDIR(st.st_mode);
        made_points.push_back({m.destination, file});
      }
      for (const auto& [p, file] : made_points) {
        Status made = MakeDirsBeneath(rootfs_abs, p, file);
        if (!made.ok() && !spec.image_rootfs.empty()) return made.WithContext("task " + spec.id);
      }
      // The limiter's: made, never through a link (whose target could be a directory the task
      // may rename), or the start fails.
      for (const auto& b : limiter_binds) {
        if (Status made = MakeDirsBeneath(rootfs_abs, b.destination, true); !made.ok())
          return made.WithContext(fmt::format("task {}: the CUDA limiter's mountpoint", spec.id));
      }
    }
    if (spec.uid >= 0) {
      // runc mounts them as the container's root, which is the task's uid on the host.
      RETURN_IF_ERROR(Reachable(spec.id, "rootfs", rootfs_abs, spec.uid));
      for (const auto& b : spec.binds) RETURN_IF_ERROR(Reachable(spec.id, "mount", b.source, spec.uid));
      for (const auto& b : limiter_binds) RETURN_IF_ERROR(Reachable(spec.id, "mount", b.source, spec.uid));
    }
    ASSIGN_OR_RETURN(std::string config,
                     BuildOciConfig(spec, rootfs_abs, "/gpupool/" + CgroupScope(state_dir_), limiter_binds));
    RETURN_IF_ERROR(PrepareTaskDir(spec.id));
    RETURN_IF_ERROR(MakeCudaLimiterFiles(spec, limiter_binds));
    const std::string generated = TaskDir(spec.id) + "/bundle";
    RETURN_IF_ERROR(MakeDirs(generated));
    RETURN_IF_ERROR(WriteFileAtomic(generated + "/config.json", config, /*sync=*/false));  // rewritten every start
    const std::string bundle = generated;
    RETURN_IF_ERROR(MakeDirs(runc_root_));
    // A container of this name left in runc's state (an earlier crash) would make `run` fail.
    std::string ignored;
    (void)RunCommand(Cmd({"delete", "--force", spec.id}), &ignored, kHelperTimeout);

    SpawnRequest req;
    req.executable = runc_;
    std::vector<std::string> run = {"run", "--bundle", bundle, spec.id};
    if (network_flag_) run.insert(run.begin(), spec.network == "host" ? "--network=host" : "--network=none");
    req.argv = Cmd(run);
    req.envp = {"PATH=" + DefaultPath()};
    req.workdir = TaskDir(spec.id);
    SetLogFiles(spec.id, &req);
    req.exit_path = ExitPath(spec.id);
    req.lease_path = spec.lease_path;
    // Killing the group of `runc run` alone may leave the container running: fence through runc.
    if (!spec.lease_path.empty()) req.fence_kill_argv = Cmd({"kill", "--all", spec.id, "KILL"});
    // The record is written before `runc run` may exec (see SpawnRequest::before_exec).
    req.before_exec = [&](const SpawnResult& spawned) {
      TaskRecord rec = RecordFor(spec.id, spec.argv, spawned);
      rec.runc = true;
      rec.bundle_dir = generated;
      return Register(std::move(rec));
    };
    auto spawned = SpawnSupervised(req);
    if (!spawned.ok()) {
      Unregister(spec.id);
      return spawned.status().WithContext(fmt::format("starting container {}", spec.id));
    }
    return Status::Ok();
  }

 protected:
  Status Signal(TaskRecord& rec, int sig) override {
    std::string out;
    const char* name = sig == SIGKILL ? "KILL" : sig == SIGTERM ? "TERM" : nullptr;
    if (name != nullptr) {
      auto rc = RunCommand(Cmd({"kill", rec.id, name}), &out, kHelperTimeout);
      if (rc.ok() && *rc == 0) return Status::Ok();
    }
    // The container is not (yet, or any more) known to runc: signal the foreground `runc run`,
    // which forwards the signal to the container or, before the container exists, just ends.
    if (ProcessAlive(rec.pid, rec.start_time) && ::kill(-rec.pgid, sig) != 0 && errno != ESRCH)
      return Status::Internal(fmt::format("runc kill {} failed ({}) and kill(-{}) failed: {}", rec.id, out,
                                          rec.pgid, ErrnoText(errno)));
    return Status::Ok();
  }

  // The container runc still knows, not stopped; or the foreground `runc run` (and its group).
  bool TaskMayRun(TaskRecord& rec) override {
    std::string out;
    auto rc = RunCommand(Cmd({"state", rec.id}), &out, kHelperTimeout);
    if (rc.ok() && *rc == 0) {
      const nlohmann::json state = nlohmann::json::parse(out, nullptr, false);
      if (state.is_object() && state.value("status", "") != "stopped") return true;
    }
    return SupervisedRuntime::TaskMayRun(rec);
  }

  Status Cleanup(TaskRecord& rec) override {
    std::string out;
    ASSIGN_OR_RETURN(int rc, RunCommand(Cmd({"delete", "--force", rec.id}), &out, kHelperTimeout));
    if (rc != 0 && out.find("not exist") == std::string::npos)
      return Status::Internal(fmt::format("runc delete {} exited with {}: {}", rec.id, rc, out));
    if (!rec.bundle_dir.empty()) RETURN_IF_ERROR(RemoveTree(rec.bundle_dir));
    return Status::Ok();
  }

 private:
  // Every directory above `path` lets `uid` pass (others' x bit, or its own).
  static Status Reachable(const std::string& id, const char* what, const std::string& path, int64_t uid) {
    for (size_t i = 1; i < path.size(); ++i) {
      if (path[i] != '/') continue;
      const std::string dir = path.substr(0, i);
      struct stat st;
      if (::stat(dir.c_str(), &st) != 0) continue;
      const bool passes = (st.st_mode & S_IXOTH) != 0 || (static_cast<int64_t>(st.st_uid) == uid && (st.st_mode & S_IXUSR));
      if (!passes)
        return Status::FailedPrecondition(fmt::format(
            "task {}: the {} {} is out of reach of the container's root (host uid {}): {} (mode {:o}) does not let "
            "others pass; give it o+x or keep images and checkpoints elsewhere",
            id, what, path, uid, dir, st.st_mode & 07777));
    }
    return Status::Ok();
  }

  // `path` resolved (links followed) and inside one of the allowed container roots, and a
  // directory; otherwise an error naming the roots.
  Result<std::string> AllowedPath(const std::string& id, const char* what, const std::string& path) const {
    char buf[PATH_MAX];
    struct stat st;
    if (path.empty() || path[0] != '/' || ::realpath(path.c_str(), buf) == nullptr || ::stat(buf, &st) != 0 ||
        !S_ISDIR(st.st_mode))
      return Status::InvalidArgument(fmt::format("task {}: {} {} is not a directory", id, what, path));
    const std::string resolved = buf;
    // The roots are resolved now, not at start: one the admin creates (or re-links) later counts.
    std::vector<std::string> roots;
    for (const auto& configured : roots_) {
      char rbuf[PATH_MAX];
      if (::realpath(configured.c_str(), rbuf) != nullptr) roots.push_back(rbuf);
    }
    for (const auto& root : roots) {
      if (resolved.size() > root.size() && resolved.compare(0, root.size(), root) == 0 &&
          (resolved[root.size()] == '/' || root == "/"))
        return resolved;
    }
    return Status::PermissionDenied(fmt::format(
        "task {}: {} {} is not under an allowed container root ({}; the agent's --container-root)", id, what,
        resolved, roots_.empty() ? std::string("none is configured") : fmt::format("{}", fmt::join(roots_, ", "))));
  }

  // Reads <bundle>/config.json (at most 1 MiB): process.args (when the spec has no command),
  // process.env (under the spec's own), process.cwd (when the spec has none) and root.path
  // (relative to the bundle or absolute), which it returns.
  static Result<std::string> ReadBundle(const std::string& dir, LaunchSpec* spec) {
    using nlohmann::json;
    const std::string path = dir + "/config.json";
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      return Status::InvalidArgument(fmt::format("task {}: bundle {} has no config.json", spec->id, dir));
    if (st.st_size > (1 << 20))
      return Status::InvalidArgument(fmt::format("task {}: {} is larger than 1 MiB", spec->id, path));
    ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    json cfg = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (cfg.is_discarded() || !cfg.is_object())
      return Status::InvalidArgument(fmt::format("task {}: {} is not a JSON object", spec->id, path));
    auto bad = [&](const char* field) {
      return Status::InvalidArgument(fmt::format("task {}: {}: {} is malformed", spec->id, path, field));
    };
    const json process = cfg.value("process", json::object());
    if (!process.is_object()) return bad("process");
    if (spec->argv.empty() && process.contains("args")) {
      const json& args = process["args"];
      if (!args.is_array() || args.size() > 1024) return bad("process.args");
      for (const auto& a : args) {
        if (!a.is_string()) return bad("process.args");
        spec->argv.push_back(a.get<std::string>());
      }
    }
    if (process.contains("env")) {
      const json& env = process["env"];
      if (!env.is_array() || env.size() > 1024) return bad("process.env");
      for (const auto& e : env) {
        if (!e.is_string()) return bad("process.env");
        const std::string kv = e.get<std::string>();
        const size_t eq = kv.find('=');
        if (eq == 0 || eq == std::string::npos) return bad("process.env");
        spec->env.emplace(kv.substr(0, eq), kv.substr(eq + 1));  // the spec's own value wins
      }
    }
    if (spec->workdir.empty() && process.contains("cwd")) {
      if (!process["cwd"].is_string()) return bad("process.cwd");
      spec->workdir = process["cwd"].get<std::string>();
    }
    const json root = cfg.value("root", json::object());
    if (!root.is_object() || !root.contains("path") || !root["path"].is_string()) return bad("root.path");
    std::string rootfs = root["path"].get<std::string>();
    if (rootfs.empty()) return bad("root.path");
    return rootfs[0] == '/' ? rootfs : dir + "/" + rootfs;
  }

  // The runtime's command line: the binary, its state root, the class's global flags, then `args`.
  std::vector<std::string> Cmd(std::vector<std::string> args) const {
    std::vector<std::string> argv = {runc_, "--root", runc_root_};
    argv.insert(argv.end(), global_flags_.begin(), global_flags_.end());
    argv.insert(argv.end(), std::make_move_iterator(args.begin()), std::make_move_iterator(args.end()));
    return argv;
  }

  std::string runc_;
  std::string runc_root_;
  std::string class_;
  std::vector<std::string> global_flags_;
  bool network_flag_ = false;
  std::vector<std::string> roots_;  // as configured (absolute)
};

}  // namespace

Result<std::unique_ptr<Runtime>> MakeRuncRuntime(const RuntimeOptions& options) {
  if (options.state_dir.empty()) return Status::InvalidArgument("runc runtime: state_dir is empty");
  const char* path_env = std::getenv("PATH");
  auto runc = FindExecutable(options.runc_binary, path_env != nullptr ? path_env : DefaultPath());
  if (runc.ok() && ::access(runc->c_str(), X_OK) != 0)
    runc = Status::NotFound(fmt::format("{}: {}", *runc, ErrnoText(errno)));
  if (!runc.ok())
    return Status::FailedPrecondition(fmt::format("{} runtime: the binary '{}' is not available ({})",
                                                  options.runtime_class, options.runc_binary,
                                                  runc.status().message()));
  RETURN_IF_ERROR(MakeDirs(options.state_dir).WithContext("runc runtime"));
  std::string state_dir = AbsolutePath(options.state_dir);
  std::unique_ptr<Runtime> rt = std::make_unique<RuncRuntime>(state_dir, options, AbsolutePath(*runc));
  return rt;
}

}  // namespace gpupool
