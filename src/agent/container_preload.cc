// See container_preload.h.
#include "agent/container_preload.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "agent/runtime_internal.h"

namespace gpupool::agent_internal {
namespace {

constexpr uint32_t kShtStrtab = 3;
constexpr uint32_t kShtDynamic = 6;
constexpr uint32_t kShtVerdef = 0x6ffffffd;
constexpr uint32_t kShtVerneed = 0x6ffffffe;
constexpr uint64_t kDtNull = 0;
constexpr uint64_t kDtNeeded = 1;
constexpr uint16_t kVerFlgBase = 1;
// Bounds on what one file may make the reader do.
constexpr uint64_t kMaxSectionBytes = uint64_t{16} << 20;
constexpr size_t kMaxEntries = 4096;   // needed files, version entries, auxiliaries: each
constexpr size_t kMaxNameBytes = 1024;

template <typename T>
T Get(const std::string& b, uint64_t off) {
  T v{};
  std::memcpy(&v, b.data() + off, sizeof(T));
  return v;  // little-endian host (checked by the caller's e_ident test)
}

class ElfReader {
 public:
  ElfReader(int fd, std::string what, uint64_t size) : fd_(fd), what_(std::move(what)), size_(size) {}

  Status Bad(const std::string& why) const {
    return Status::InvalidArgument(fmt::format("{}: not a usable ELF shared object: {}", what_, why));
  }

  // `len` bytes at `off`, all inside the file.
  Result<std::string> Read(uint64_t off, uint64_t len, const char* part) const {
    if (len > kMaxSectionBytes) return Bad(fmt::format("its {} is {} bytes, more than {}", part, len, kMaxSectionBytes));
    if (off > size_ || len > size_ - off) return Bad(fmt::format("its {} lies past the end of the file", part));
    std::string out(static_cast<size_t>(len), '\0');
    size_t got = 0;
    while (got < out.size()) {
      const ssize_t n = ::pread(fd_, out.data() + got, out.size() - got, static_cast<off_t>(off + got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Bad(fmt::format("reading its {}: {}", part, n < 0 ? ErrnoText(errno) : "the file is shorter"));
      got += static_cast<size_t>(n);
    }
    return out;
  }

  struct Section {
    uint32_t type = 0;
    uint64_t offset = 0, size = 0;
    uint32_t link = 0, info = 0;
  };

  Result<ElfVersions> Parse() {
    ASSIGN_OR_RETURN(const std::string eh, Read(0, 64, "header"));
    if (std::memcmp(eh.data(), "\x7f" "ELF", 4) != 0) return Bad("no ELF magic");
    if (eh[4] != 2) return Bad("not a 64-bit ELF file");
    if (eh[5] != 1) return Bad("not a little-endian ELF file");
    ElfVersions out;
    out.machine = Get<uint16_t>(eh, 18);
    const uint64_t shoff = Get<uint64_t>(eh, 40);
    const uint16_t shentsize = Get<uint16_t>(eh, 58);
    const uint16_t shnum = Get<uint16_t>(eh, 60);
    if (shoff == 0 || shnum == 0) return Bad("no section headers");
    if (shentsize != 64) return Bad(fmt::format("section headers of {} bytes, not 64", shentsize));
    ASSIGN_OR_RETURN(const std::string sh, Read(shoff, uint64_t{shnum} * 64, "section headers"));
    sections_.resize(shnum);
    for (uint16_t i = 0; i < shnum; ++i) {
      const uint64_t at = uint64_t{i} * 64;
      Section& s = sections_[i];
      s.type = Get<uint32_t>(sh, at + 4);
      s.offset = Get<uint64_t>(sh, at + 24);
      s.size = Get<uint64_t>(sh, at + 32);
      s.link = Get<uint32_t>(sh, at + 40);
      s.info = Get<uint32_t>(sh, at + 44);
    }
    for (const Section& s : sections_) {
      if (s.type == kShtDynamic) RETURN_IF_ERROR(Dynamic(s, &out));
      if (s.type == kShtVerneed) RETURN_IF_ERROR(Verneed(s, &out));
      if (s.type == kShtVerdef) RETURN_IF_ERROR(Verdef(s, &out));
    }
    return out;
  }

 private:
  // The string table a section links to.
  Result<std::string> Strings(const Section& s, const char* part) {
    if (s.link == 0 || s.link >= sections_.size() || sections_[s.link].type != kShtStrtab)
      return Bad(fmt::format("its {} links to no string table", part));
    const Section& t = sections_[s.link];
    return Read(t.offset, t.size, "string table");
  }
  Result<std::string> Name(const std::string& strtab, uint64_t off) const {
    if (off >= strtab.size()) return Bad("a name lies outside its string table");
    const size_t end = strtab.find('\0', static_cast<size_t>(off));
    if (end == std::string::npos) return Bad("a name is not terminated");
    if (end - off > kMaxNameBytes) return Bad("a name is too long");
    return strtab.substr(static_cast<size_t>(off), end - static_cast<size_t>(off));
  }

  Status Dynamic(const Section& s, ElfVersions* out) {
    ASSIGN_OR_RETURN(const std::string strtab, Strings(s, "dynamic section"));
    ASSIGN_OR_RETURN(const std::string dyn, Read(s.offset, s.size, "dynamic section"));
    for (uint64_t at = 0; at + 16 <= dyn.size(); at += 16) {
      const uint64_t tag = Get<uint64_t>(dyn, at);
      if (tag == kDtNull) break;
      if (tag != kDtNeeded) continue;
      if (out->needed.size() >= kMaxEntries) return Bad("too many needed libraries");
      ASSIGN_OR_RETURN(std::string name, Name(strtab, Get<uint64_t>(dyn, at + 8)));
      out->needed.push_back(std::move(name));
    }
    return Status::Ok();
  }

  // Entries chained by relative offsets: each step must stay inside the section and move forward
  // (so a chain cannot loop), at most kMaxEntries of them.
  Status Verneed(const Section& s, ElfVersions* out) {
    ASSIGN_OR_RETURN(const std::string strtab, Strings(s, "version needs"));
    ASSIGN_OR_RETURN(const std::string d, Read(s.offset, s.size, "version needs"));
    if (d.empty()) return Status::Ok();  // a section with no entries
    uint64_t at = 0;
    for (size_t n = 0;; ++n) {
      if (n >= kMaxEntries || out->requires_versions.size() >= kMaxEntries) return Bad("too many version needs");
      if (at > d.size() || d.size() - at < 16) return Bad("a version need lies past its section");
      const uint16_t cnt = Get<uint16_t>(d, at + 2);
      ASSIGN_OR_RETURN(std::string file, Name(strtab, Get<uint32_t>(d, at + 4)));
      const uint32_t aux = Get<uint32_t>(d, at + 8);
      const uint32_t next = Get<uint32_t>(d, at + 12);
      std::vector<std::string> versions;
      uint64_t a = at + aux;
      for (uint16_t i = 0; i < cnt; ++i) {
        if (aux == 0 || a > d.size() || d.size() - a < 16) return Bad("a version need's entry lies past its section");
        ASSIGN_OR_RETURN(std::string v, Name(strtab, Get<uint32_t>(d, a + 8)));
        versions.push_back(std::move(v));
        const uint32_t anext = Get<uint32_t>(d, a + 12);
        if (anext == 0) {
          if (i + 1 != cnt) return Bad("a version need has fewer entries than it counts");
          break;
        }
        if (anext < 16) return Bad("a version need's entries overlap");
        a += anext;
      }
      out->requires_versions.emplace_back(std::move(file), std::move(versions));
      if (next == 0) break;
      if (next < 16) return Bad("version needs overlap");
      at += next;
    }
    return Status::Ok();
  }

  Status Verdef(const Section& s, ElfVersions* out) {
    ASSIGN_OR_RETURN(const std::string strtab, Strings(s, "version definitions"));
    ASSIGN_OR_RETURN(const std::string d, Read(s.offset, s.size, "version definitions"));
    if (d.empty()) return Status::Ok();  // a section with no entries
    uint64_t at = 0;
    for (size_t n = 0;; ++n) {
      if (n >= kMaxEntries) return Bad("too many version definitions");
      if (at > d.size() || d.size() - at < 20) return Bad("a version definition lies past its section");
      const uint16_t flags = Get<uint16_t>(d, at + 2);
      const uint16_t cnt = Get<uint16_t>(d, at + 6);
      const uint32_t aux = Get<uint32_t>(d, at + 12);
      const uint32_t next = Get<uint32_t>(d, at + 16);
      if (cnt > 0) {
        // The first auxiliary entry names the version; later ones its parents.
        const uint64_t a = at + aux;
        if (aux == 0 || a > d.size() || d.size() - a < 8) return Bad("a version definition's name lies past its section");
        ASSIGN_OR_RETURN(std::string v, Name(strtab, Get<uint32_t>(d, a)));
        if ((flags & kVerFlgBase) == 0) out->defines.push_back(std::move(v));
      }
      if (next == 0) break;
      if (next < 20) return Bad("version definitions overlap");
      at += next;
    }
    return Status::Ok();
  }

  int fd_;
  std::string what_;
  uint64_t size_;
  std::vector<Section> sections_;
};

bool VersionLess(const std::vector<int>& a, const std::vector<int>& b) {
  return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
}

std::string JoinVersion(const std::vector<int>& v) { return fmt::format("{}", fmt::join(v, ".")); }

const char* MachineTriple() {
#if defined(__x86_64__)
  return "x86_64-linux-gnu";
#elif defined(__aarch64__)
  return "aarch64-linux-gnu";
#elif defined(__powerpc64__)
  return "powerpc64le-linux-gnu";
#else
  return "";
#endif
}

}  // namespace

Result<ElfVersions> ReadElfVersions(int fd, const std::string& what) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::IoError(fmt::format("{}: {}", what, ErrnoText(errno)));
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(fmt::format("{}: not a regular file", what));
  if (st.st_size > kMaxElfFileBytes)
    return Status::InvalidArgument(fmt::format("{}: {} bytes, more than the {} read", what, st.st_size, kMaxElfFileBytes));
  ElfReader reader(fd, what, static_cast<uint64_t>(st.st_size));
  return reader.Parse();
}

Result<ElfVersions> ReadElfVersionsAt(const std::string& path) {
  FdCloser fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  if (fd.get() < 0) return Status::IoError(fmt::format("{}: {}", path, ErrnoText(errno)));
  return ReadElfVersions(fd.get(), path);
}

std::optional<std::vector<int>> ParseGlibcVersion(std::string_view name) {
  constexpr std::string_view kPrefix = "GLIBC_";
  if (name.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  name.remove_prefix(kPrefix.size());
  std::vector<int> out;
  while (true) {
    const size_t dot = name.find('.');
    const std::string_view part = name.substr(0, dot);
    if (part.empty() || part.size() > 6 || out.size() >= 4) return std::nullopt;
    int v = 0;
    for (char c : part) {
      if (c < '0' || c > '9') return std::nullopt;
      v = v * 10 + (c - '0');
    }
    out.push_back(v);
    if (dot == std::string_view::npos) break;
    name.remove_prefix(dot + 1);
  }
  if (out.size() < 2) return std::nullopt;
  return out;
}

std::string NewestGlibcVersion(const std::vector<std::string>& names) {
  std::optional<std::vector<int>> best;
  for (const std::string& n : names) {
    const auto v = ParseGlibcVersion(n);
    if (v && (!best || VersionLess(*best, *v))) best = v;
  }
  return best ? JoinVersion(*best) : "";
}

Result<int> OpenInRoot(const std::string& root, const std::string& path) {
  FdCloser dir(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (dir.get() < 0) return Status::IoError(fmt::format("the root {}: {}", root, ErrnoText(errno)));
  struct open_how how;
  std::memset(&how, 0, sizeof how);
  how.flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  const size_t first = path.find_first_not_of('/');
  if (first == std::string::npos) return Status::InvalidArgument(fmt::format("'{}': not a file's path", path));
  const std::string rel = path.substr(first);
  int fd;
  do {
    fd = static_cast<int>(::syscall(SYS_openat2, dir.get(), rel.c_str(), &how, sizeof how));
  } while (fd < 0 && errno == EAGAIN);  // a rename raced the lookup: tried again
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) return Status::NotFound(fmt::format("{}{}: {}", root, path, ErrnoText(err)));
    return Status::IoError(fmt::format("{} in {}: {}", path, root, ErrnoText(err)));
  }
  FdCloser file(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::IoError(fmt::format("{} in {}: {}", path, root, ErrnoText(errno)));
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(fmt::format("{} in {}: not a regular file", path, root));
  return file.release();
}

std::vector<std::string> ImageLibraryDirs() {
  std::vector<std::string> dirs;
  const std::string triple = MachineTriple();
  if (!triple.empty()) {
    dirs.push_back("/lib/" + triple);
    dirs.push_back("/usr/lib/" + triple);
  }
  for (const char* d : {"/lib64", "/usr/lib64", "/lib", "/usr/lib"}) dirs.push_back(d);
  return dirs;
}

Status CheckPreloadFits(const std::string& rootfs, const ElfVersions& lib) {
  const std::vector<std::string> dirs = ImageLibraryDirs();
  // Every file the library needs, with the versions it needs from it (none for some).
  std::vector<std::pair<std::string, std::vector<std::string>>> wants = lib.requires_versions;
  for (const std::string& n : lib.needed) {
    if (std::none_of(wants.begin(), wants.end(), [&](const auto& w) { return w.first == n; })) wants.push_back({n, {}});
  }
  // glibc first: an image without it is told so, not that it lacks the loader.
  std::stable_partition(wants.begin(), wants.end(), [](const auto& w) { return w.first == "libc.so.6"; });
  for (const auto& [file, versions] : wants) {
    const bool libc = file == "libc.so.6";
    if (file.empty() || file.find('/') != std::string::npos)
      return Status::FailedPrecondition(fmt::format("the CUDA limiter needs a library named '{}', which is not a file name", file));
    std::string where;
    std::optional<ElfVersions> found;
    for (const std::string& d : dirs) {
      auto fd = OpenInRoot(rootfs, d + "/" + file);
      if (!fd.ok() && fd.status().code() == StatusCode::kNotFound) continue;
      if (!fd.ok()) return Status::FailedPrecondition(fmt::format(
          "the image's {}/{} cannot be read ({}); the CUDA limiter cannot be loaded in it", d, file, fd.status().message()));
      FdCloser closer(*fd);
      where = d + "/" + file;
      auto parsed = ReadElfVersions(*fd, "the image's " + where);
      if (!parsed.ok())
        return Status::FailedPrecondition(fmt::format("{}; the CUDA limiter cannot be loaded in the image",
                                                      parsed.status().message()));
      found = std::move(parsed).value();
      break;
    }
    if (!found) {
      if (libc)
        return Status::FailedPrecondition(fmt::format(
            "the image has no glibc (no libc.so.6 in {}): a static or musl image cannot load the CUDA limiter, which "
            "holds fractional timeslice GPU tasks here (the limiter needs glibc {} or newer)",
            fmt::join(dirs, ", "), NewestGlibcVersion(versions)));
      return Status::FailedPrecondition(fmt::format("the image has no {} (looked in {}), which the CUDA limiter needs",
                                                    file, fmt::join(dirs, ", ")));
    }
    if (found->machine != lib.machine)
      return Status::FailedPrecondition(fmt::format(
          "the image's {} is for ELF machine {}, the CUDA limiter for {}", where, found->machine, lib.machine));
    std::vector<std::string> missing;
    for (const std::string& v : versions)
      if (std::find(found->defines.begin(), found->defines.end(), v) == found->defines.end()) missing.push_back(v);
    if (missing.empty()) continue;
    if (libc) {
      const std::string has = NewestGlibcVersion(found->defines);
      return Status::FailedPrecondition(fmt::format(
          "the image's glibc is {} ({} defines versions up to GLIBC_{}); the CUDA limiter needs glibc {} (it lacks {}): "
          "use an image with glibc {} or newer, or whole GPUs",
          has.empty() ? "unknown" : has, where, has.empty() ? "?" : has, NewestGlibcVersion(versions),
          fmt::join(missing, ", "), NewestGlibcVersion(versions)));
    }
    return Status::FailedPrecondition(fmt::format("the image's {} lacks {}, which the CUDA limiter needs", where,
                                                  fmt::join(missing, ", ")));
  }
  return Status::Ok();
}

Status WriteReadOnlyFile(const std::string& path, const std::string& content) {
  RETURN_IF_ERROR(WriteFileAtomic(path, content, /*sync=*/false));
  if (::chmod(path.c_str(), 0444) != 0) return Status::Internal(fmt::format("chmod {}: {}", path, ErrnoText(errno)));
  return Status::Ok();
}

Result<std::string> CudaLimitsFileContents(const std::map<std::string, std::string>& env) {
  std::string out;
  for (const auto& [key, variable] : {std::pair<const char*, const char*>{"memory_bytes", "GPUPOOL_GPU_MEMORY_BYTES"},
                                      {"shares_milli", "GPUPOOL_GPU_SHARES_MILLI"},
                                      {"ledger", "GPUPOOL_CUDA_LEDGER"}}) {
    const auto it = env.find(variable);
    const std::string value = it == env.end() ? "" : it->second;
    if (value.find_first_of(std::string("\n\r\0", 3)) != std::string::npos)
      return Status::InvalidArgument(fmt::format("{} holds a line break or a NUL", variable));
    out += fmt::format("{}={}\n", key, value);
  }
  return out;
}

namespace {

// Nothing of the task's is mounted at the limiter's paths or above them: a writable volume there
// would let the task rename a directory from under a bind and leave /etc/ld.so.preload naming
// nothing (the loader then runs the program unlimited).
Status CheckLimiterPathsUncovered(const LaunchSpec& spec) {
  std::vector<std::string> destinations;
  for (const auto& b : spec.binds) destinations.push_back(b.destination);
  for (const auto& m : spec.mounts) destinations.push_back(m.destination);
  for (const auto& t : spec.tmpfs) destinations.push_back(t.destination);
  for (const auto& r : spec.readonly_binds) destinations.push_back(r);
  for (const std::string& d : destinations) {
    std::string clean;  // "//etc/./" -> "/etc"
    for (size_t i = 0; i < d.size();) {
      const size_t end = std::min(d.find('/', i), d.size());
      const std::string part = d.substr(i, end - i);
      if (!part.empty() && part != ".") clean += "/" + part;
      i = end + 1;
    }
    for (const char* path :
         {kContainerCudaLimiterPath, kContainerPreloadPath, kContainerCudaLedgerPath, kContainerCudaLimitsPath}) {
      const std::string p = path;
      if (clean.empty() || p == clean || (p.compare(0, clean.size(), clean) == 0 && p[clean.size()] == '/'))
        return Status::InvalidArgument(fmt::format(
            "task {}: a mount at {} would cover {}, the CUDA limiter's; nothing else may be mounted there or above it",
            spec.id, d, p));
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<LaunchSpec::Bind>> PrepareCudaLimiter(LaunchSpec* spec, const std::string& rootfs_abs,
                                                         const std::string& task_dir,
                                                         const std::string& ledger_path) {
  auto lib = ReadElfVersionsAt(spec->cuda_limiter);
  if (!lib.ok())
    return Status::FailedPrecondition(fmt::format("task {}: the CUDA limiter cannot be checked: {}", spec->id,
                                                  lib.status().message()));
  if (Status fits = CheckPreloadFits(rootfs_abs, *lib); !fits.ok())
    return Status::FailedPrecondition(fmt::format(
        "task {}: its GPU share is held by the CUDA limiter, which its image cannot load: {}", spec->id,
        fits.message()));
  RETURN_IF_ERROR(CheckLimiterPathsUncovered(*spec));
  spec->env["GPUPOOL_CUDA_LEDGER"] = kContainerCudaLedgerPath;
  // The limits too, from a file the task cannot change: a program that execs another with other
  // GPUPOOL_GPU_* values (or none) changes nothing (the library reads the file when it exists).
  if (auto limits = CudaLimitsFileContents(spec->env); !limits.ok())
    return Status::InvalidArgument(fmt::format("task {}: {}", spec->id, limits.status().message()));
  // LD_PRELOAD too (task_env.cc puts the library first): a process that unsets it still has
  // /etc/ld.so.preload.
  auto& preload_env = spec->env["LD_PRELOAD"];
  if (preload_env.rfind(kContainerCudaLimiterPath, 0) != 0)
    preload_env = preload_env.empty() ? std::string(kContainerCudaLimiterPath)
                                      : std::string(kContainerCudaLimiterPath) + ":" + preload_env;
  return std::vector<LaunchSpec::Bind>{{spec->cuda_limiter, kContainerCudaLimiterPath, true},
                                       {task_dir + "/ld.so.preload", kContainerPreloadPath, true},
                                       {ledger_path, kContainerCudaLedgerPath, false},
                                       {task_dir + "/cuda-limits", kContainerCudaLimitsPath, true}};
}

Status MakeCudaLimiterFiles(const LaunchSpec& spec, const std::vector<LaunchSpec::Bind>& binds) {
  for (const auto& b : binds) {
    if (b.destination == kContainerPreloadPath || b.destination == kContainerCudaLimitsPath) {
      std::string content = std::string(kContainerCudaLimiterPath) + "\n";
      if (b.destination == kContainerCudaLimitsPath) {
        ASSIGN_OR_RETURN(content, CudaLimitsFileContents(spec.env));
      }
      RETURN_IF_ERROR(WriteReadOnlyFile(b.source, content));
    } else if (b.destination == kContainerCudaLedgerPath) {
      RETURN_IF_ERROR(MakeCudaLedger(b.source, spec.uid, spec.gid >= 0 ? spec.gid : spec.uid));
    }
  }
  return Status::Ok();
}

}  // namespace gpupool::agent_internal
