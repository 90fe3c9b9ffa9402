// cgroups of tasks (runtime_internal.h): which hierarchy the machine offers (v2, or v1 cpu, memory
// and pids), the agent's scope in it, and each task's group with its limits. Checked on v1 here
// and on a real v2 kernel by tests/vm/cgroup2_vm.sh.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "agent/runtime_internal.h"

namespace gpupool::agent_internal {

namespace {

bool WritableDir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && ::access(path.c_str(), W_OK) == 0;
}

// v2: the hierarchy at `mount` must offer cpu and memory, let us create gpupool/ and enable both
// controllers for its children.
bool TryV2(const std::string& mount, const std::string& scope, CgroupLayout* layout, std::string* why) {
  auto controllers = ReadFile(mount + "/cgroup.controllers");
  if (!controllers.ok()) {
    *why += fmt::format("{}: not a cgroup v2 hierarchy; ", mount);
    return false;
  }
  const std::string& c = *controllers;
  auto has = [&](const char* name) {
    std::string padded = " " + c + " ";
    for (char& ch : padded)
      if (ch == '\n') ch = ' ';
    return padded.find(std::string(" ") + name + " ") != std::string::npos;
  };
  if (!has("cpu") || !has("memory")) {
    *why += fmt::format("{}: cgroup v2 without the cpu and memory controllers; ", mount);
    return false;
  }
  std::string base = mount + "/gpupool";
  if (::mkdir(base.c_str(), 0755) != 0 && errno != EEXIST) {
    *why += fmt::format("{}: cannot create gpupool/ ({}); ", mount, ErrnoText(errno));
    return false;
  }
  const std::string scoped = base + "/" + scope;
  if (::mkdir(scoped.c_str(), 0755) != 0 && errno != EEXIST) {
    *why += fmt::format("{}: cannot create gpupool/{} ({}); ", mount, scope, ErrnoText(errno));
    return false;
  }
  // Each level hands cpu and memory (and pids, where the kernel has it) down to the next:
  // mount -> gpupool -> scope -> task.
  const std::string wanted = has("pids") ? "+cpu +memory +pids" : "+cpu +memory";
  Status st = WriteControlFile(mount + "/cgroup.subtree_control", wanted);
  if (st.ok()) st = WriteControlFile(base + "/cgroup.subtree_control", wanted);
  if (st.ok()) st = WriteControlFile(scoped + "/cgroup.subtree_control", wanted);
  if (!st.ok()) {
    *why += fmt::format("{}: cannot enable {}: {}; ", mount, wanted, st.message());
    return false;
  }
  layout->kind = CgroupLayout::Kind::kV2;
  layout->v2_base = scoped;
  layout->v2_pids = has("pids");
  return true;
}

bool TryV1(const std::string& root, const std::string& scope, CgroupLayout* layout, std::string* why) {
  std::string cpu = root + "/cpu";
  std::string mem = root + "/memory";
  if (!PathExists(cpu + "/cpu.cfs_quota_us") || !PathExists(mem + "/memory.limit_in_bytes")) {
    *why += fmt::format("{}: no cgroup v1 cpu and memory hierarchies; ", root);
    return false;
  }
  if (!WritableDir(cpu) || !WritableDir(mem)) {
    *why += fmt::format("{}: cgroup v1 cpu/memory not writable; ", root);
    return false;
  }
  for (const std::string& dir : {cpu + "/gpupool", mem + "/gpupool", cpu + "/gpupool/" + scope,
                                 mem + "/gpupool/" + scope}) {
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      *why += fmt::format("cannot create {} ({}); ", dir, ErrnoText(errno));
      return false;
    }
  }
  layout->kind = CgroupLayout::Kind::kV1;
  layout->v1_cpu_base = cpu + "/gpupool/" + scope;
  layout->v1_mem_base = mem + "/gpupool/" + scope;
  // The pids hierarchy is optional: without it tasks have CPU and memory limits only.
  const std::string pids = root + "/pids";
  if (PathExists(pids + "/cgroup.procs") && WritableDir(pids) &&
      (::mkdir((pids + "/gpupool").c_str(), 0755) == 0 || errno == EEXIST) &&
      (::mkdir((pids + "/gpupool/" + scope).c_str(), 0755) == 0 || errno == EEXIST))
    layout->v1_pids_base = pids + "/gpupool/" + scope;
  return true;
}

constexpr int64_t kCpuPeriodUs = 100000;

int64_t CpuQuotaUs(int64_t cpu_milli) {
  return std::max<int64_t>(1000, cpu_milli * kCpuPeriodUs / 1000);
}

}  // namespace

// ---- cgroups -----------------------------------------------------------------------------------

std::string CgroupScope(const std::string& state_dir_abs) {
  // FNV-1a, 64 bits: stable across builds and hosts (std::hash is neither promised).
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : state_dir_abs) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return fmt::format("agent-{:016x}", h);
}

CgroupLayout DetectCgroups(const std::string& root, const std::string& scope) {
  CgroupLayout layout;
  if (root == "none") {
    layout.note = "cgroup limits turned off (cgroup_root=none); tasks run without CPU/memory limits";
    return layout;
  }
  std::string why;
  std::string base = root.empty() ? "/sys/fs/cgroup" : root;
  if (TryV2(base, scope, &layout, &why)) return layout;
  if (root.empty() && TryV2(base + "/unified", scope, &layout, &why)) return layout;
  if (TryV1(base, scope, &layout, &why)) return layout;
  if (!why.empty() && why.size() >= 2) why.resize(why.size() - 2);
  layout.note = fmt::format("no writable cgroup, tasks run without CPU/memory limits ({})", why);
  return layout;
}

Result<std::vector<std::string>> CreateTaskCgroups(const CgroupLayout& layout, const std::string& id,
                                                   int64_t cpu_milli, int64_t memory_bytes, int64_t pids_max) {
  std::vector<std::string> dirs;
  auto make = [&](const std::string& dir) -> Status {
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
      return Status::IoError(fmt::format("cannot create cgroup {}: {}", dir, ErrnoText(errno)));
    dirs.push_back(dir);
    return Status::Ok();
  };
  Status st;
  if (layout.kind == CgroupLayout::Kind::kV2) {
    std::string dir = layout.v2_base + "/" + id;
    st = make(dir);
    if (st.ok() && cpu_milli > 0)
      st = WriteControlFile(dir + "/cpu.max", fmt::format("{} {}", CpuQuotaUs(cpu_milli), kCpuPeriodUs));
    if (st.ok() && memory_bytes > 0) {
      st = WriteControlFile(dir + "/memory.max", std::to_string(memory_bytes));
      // Without swap accounting the file is absent; a limit on swap is then moot.
      if (st.ok() && PathExists(dir + "/memory.swap.max")) st = WriteControlFile(dir + "/memory.swap.max", "0");
    }
    if (st.ok() && pids_max > 0 && layout.v2_pids) st = WriteControlFile(dir + "/pids.max", std::to_string(pids_max));
  } else if (layout.kind == CgroupLayout::Kind::kV1) {
    std::string cpu = layout.v1_cpu_base + "/" + id;
    std::string mem = layout.v1_mem_base + "/" + id;
    st = make(cpu);
    if (st.ok()) st = make(mem);
    if (st.ok() && cpu_milli > 0) {
      st = WriteControlFile(cpu + "/cpu.cfs_period_us", std::to_string(kCpuPeriodUs));
      if (st.ok()) st = WriteControlFile(cpu + "/cpu.cfs_quota_us", std::to_string(CpuQuotaUs(cpu_milli)));
    }
    if (st.ok() && memory_bytes > 0)
      st = WriteControlFile(mem + "/memory.limit_in_bytes", std::to_string(memory_bytes));
    if (st.ok() && pids_max > 0 && !layout.v1_pids_base.empty()) {
      const std::string pids = layout.v1_pids_base + "/" + id;
      st = make(pids);
      if (st.ok()) st = WriteControlFile(pids + "/pids.max", std::to_string(pids_max));
    }
  }
  if (!st.ok()) {
    (void)RemoveCgroupDirs(dirs);
    return st.WithContext(fmt::format("setting the limits of task {}", id));
  }
  return dirs;
}

void PruneCgroups(const CgroupLayout& layout, const std::set<std::string>& keep, bool and_scope) {
  std::vector<std::string> bases;
  if (layout.kind == CgroupLayout::Kind::kV2) bases = {layout.v2_base};
  if (layout.kind == CgroupLayout::Kind::kV1) bases = {layout.v1_cpu_base, layout.v1_mem_base};
  if (!layout.v1_pids_base.empty()) bases.push_back(layout.v1_pids_base);
  for (const std::string& base : bases) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(base, ec)) {
      std::error_code type_ec;
      if (!entry.is_directory(type_ec) || keep.count(entry.path().filename().string()) != 0) continue;
      (void)::rmdir(entry.path().c_str());  // EBUSY while it holds a process or a child group
    }
    if (and_scope) (void)::rmdir(base.c_str());  // only once empty
  }
}

void RemoveEmptyCgroupScope(const std::string& cgroup_root, const std::string& scope) {
  if (scope.empty() || scope.find('/') != std::string::npos) return;
  const std::string tail = "/gpupool/" + scope;
  (void)::rmdir((cgroup_root + tail).c_str());  // v2: the root is the hierarchy
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(cgroup_root, ec)) {
    std::error_code type_ec;
    // v1 hierarchies (cpu, memory, pids, ..., hybrid's unified); cpu,cpuacct-style links name
    // a hierarchy twice, and the second rmdir finds nothing.
    if (entry.is_directory(type_ec)) (void)::rmdir((entry.path().string() + tail).c_str());
  }
}

Status RemoveCgroupDirs(const std::vector<std::string>& dirs) {
  Status result;
  for (const std::string& dir : dirs) {
    if (!PathExists(dir)) continue;
    bool removed = false;
    for (int attempt = 0; attempt < 50 && !removed; ++attempt) {
      if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) {
        removed = true;
        break;
      }
      if (errno != EBUSY) break;
      // Stragglers that left the process group: kill them, then give the kernel a moment.
      auto procs = ReadFile(dir + "/cgroup.procs");
      if (procs.ok()) {
        size_t pos = 0;
        while (pos < procs->size()) {
          long pid = std::strtol(procs->c_str() + pos, nullptr, 10);
          if (pid > 0) ::kill(static_cast<pid_t>(pid), SIGKILL);
          size_t nl = procs->find('\n', pos);
          if (nl == std::string::npos) break;
          pos = nl + 1;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!removed && result.ok())
      result = Status::IoError(fmt::format("cannot remove cgroup {}: {}", dir, ErrnoText(errno)));
  }
  return result;
}

}  // namespace gpupool::agent_internal
