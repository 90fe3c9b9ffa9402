// The steps of image_layout.h: an OCI layout read into an image config, an unpacked tree cleaned.
#include "agent/image_layout.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string_view>

#include "agent/runtime_internal.h"
#include "common/image_source.h"

namespace gpupool::agent_internal {

namespace {

using nlohmann::json;

constexpr int64_t kMaxBlobBytes = 4 << 20;
constexpr size_t kMaxConfigItems = 4096;
constexpr size_t kMaxConfigString = 64 << 10;
constexpr int kMaxDepth = 512;

Result<std::string> ReadBounded(const std::string& path, int64_t max) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return Status::IoError(fmt::format("cannot stat {}: {}", path, ErrnoText(errno)));
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(fmt::format("{} is not a regular file", path));
  if (st.st_size > max) return Status::InvalidArgument(fmt::format("{} is larger than {} bytes", path, max));
  return ReadFile(path);
}

// One string of an image config, bounded; `name` says which ("Env[3]").
Result<std::string> ConfigString(const json& v, const std::string& where, const std::string& name) {
  if (!v.is_string()) return Status::InvalidArgument(fmt::format("{}: {} is not a string", where, name));
  std::string s = v.get<std::string>();
  if (s.size() > kMaxConfigString || s.find('\0') != std::string::npos)
    return Status::InvalidArgument(
        fmt::format("{}: {} is longer than {} bytes or holds a NUL", where, name, kMaxConfigString));
  return s;
}

// The digest a field holds, checked: it names a blob path.
Result<std::string> DigestField(const json& obj, const std::string& where) {
  auto it = obj.find("digest");
  if (it == obj.end() || !it->is_string() || !IsSha256Digest(it->get<std::string>()))
    return Status::InvalidArgument(fmt::format("{}: the digest is not sha256:<64 hex>", where));
  return it->get<std::string>();
}

}  // namespace

std::vector<std::string> DirNames(DIR* dir) {
  std::vector<std::string> names;
  if (dir == nullptr) return names;
  while (dirent* e = ::readdir(dir))
    if (std::string_view(e->d_name) != "." && std::string_view(e->d_name) != "..")
      names.emplace_back(e->d_name);
  ::closedir(dir);
  return names;
}

// ---- image configs -------------------------------------------------------------------------------

Result<json> ParseJsonFile(const std::string& path, int64_t max) {
  ASSIGN_OR_RETURN(std::string text, ReadBounded(path, max));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Status::InvalidArgument(fmt::format("{} is not a JSON object", path));
  return j;
}

Result<ImageConfig> ParseConfig(const json& obj, const std::string& where,
                                const std::array<const char*, 4>& names) {
  ImageConfig c;
  if (obj.is_null()) return c;  // an image may have no runtime config at all
  if (!obj.is_object()) return Status::InvalidArgument(fmt::format("{} is not an object", where));
  std::vector<std::string>* lists[] = {&c.entrypoint, &c.cmd, &c.env};
  for (size_t k = 0; k < 3; ++k) {
    auto it = obj.find(names[k]);
    if (it == obj.end() || it->is_null()) continue;
    if (!it->is_array() || it->size() > kMaxConfigItems)
      return Status::InvalidArgument(
          fmt::format("{}: {} is not a list of at most {} strings", where, names[k], kMaxConfigItems));
    for (size_t i = 0; i < it->size(); ++i) {
      ASSIGN_OR_RETURN(std::string v, ConfigString((*it)[i], where, fmt::format("{}[{}]", names[k], i)));
      lists[k]->push_back(std::move(v));
    }
  }
  auto wd = obj.find(names[3]);
  if (wd != obj.end() && !wd->is_null()) {
    ASSIGN_OR_RETURN(c.working_dir, ConfigString(*wd, where, names[3]));
  }
  return c;
}

// The manifest our copy was tagged with, its config, and the runtime settings in that.
Result<LayoutImage> ReadLayout(const std::string& layout, const std::string& ref_name,
                               const std::string& text) {
  const std::string what = fmt::format("image {}: reading the copied layout", text);
  ASSIGN_OR_RETURN(json index, ParseJsonFile(layout + "/index.json", kMaxIndexBytes));
  std::string digest;
  auto manifests = index.find("manifests");
  if (manifests != index.end() && manifests->is_array()) {
    for (const json& m : *manifests) {
      if (!m.is_object()) continue;
      auto ann = m.find("annotations");
      if (ann == m.end() || !ann->is_object() ||
          ann->value("org.opencontainers.image.ref.name", std::string()) != ref_name)
        continue;
      ASSIGN_OR_RETURN(digest, DigestField(m, what + ": index.json's manifest"));
    }
  }
  if (digest.empty())
    return Status::InvalidArgument(fmt::format("{}: index.json names no manifest '{}'", what, ref_name));
  auto manifest = ParseJsonFile(layout + "/blobs/sha256/" + digest.substr(7), kMaxBlobBytes);
  if (!manifest.ok()) return manifest.status().WithContext(what + ": the manifest");
  auto config_desc = manifest->find("config");
  if (config_desc == manifest->end() || !config_desc->is_object())
    return Status::InvalidArgument(fmt::format("{}: the manifest has no config", what));
  ASSIGN_OR_RETURN(std::string config_digest, DigestField(*config_desc, what + ": the manifest's config"));
  auto config_blob = ParseJsonFile(layout + "/blobs/sha256/" + config_digest.substr(7), kMaxBlobBytes);
  if (!config_blob.ok()) return config_blob.status().WithContext(what + ": the image config");
  ASSIGN_OR_RETURN(ImageConfig config,
                   ParseConfig(config_blob->value("config", json()),
                               fmt::format("image {}: the image config", text), kOciNames));
  return LayoutImage{std::move(digest), std::move(config)};
}

// ---- the unpacked tree ---------------------------------------------------------------------------

// Links are never followed (lstat, O_NOFOLLOW): the tree is the image's, and its links point
// wherever the image author liked.
Status CleanTree(int dirfd, const std::string& path, int depth, TreeWalk* walk) {
  if (depth > kMaxDepth)
    return Status::InvalidArgument(fmt::format("{} is nested more than {} deep", path, kMaxDepth));
  FdCloser copy(::fcntl(dirfd, F_DUPFD_CLOEXEC, 0));
  DIR* dir = copy.get() < 0 ? nullptr : ::fdopendir(copy.get());
  if (dir == nullptr) return Status::IoError(fmt::format("cannot read {}: {}", path, ErrnoText(errno)));
  copy.release();  // the DIR has it
  for (const auto& name : DirNames(dir)) {
    const std::string child = path + "/" + name;
    struct stat st;
    if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
      return Status::IoError(fmt::format("cannot stat {}: {}", child, ErrnoText(errno)));
    // No device (a way to the host's disks or memory), FIFO or socket is served to a task.
    if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) {
      if (::unlinkat(dirfd, name.c_str(), 0) != 0)
        return Status::IoError(fmt::format("cannot remove {}: {}", child, ErrnoText(errno)));
      continue;
    }
    if (!S_ISLNK(st.st_mode) && (st.st_mode & (S_ISUID | S_ISGID)) != 0 &&
        ::fchmodat(dirfd, name.c_str(), st.st_mode & 07777 & ~(S_ISUID | S_ISGID), 0) != 0)
      return Status::IoError(
          fmt::format("cannot clear the setuid/setgid bits of {}: {}", child, ErrnoText(errno)));
    if (S_ISDIR(st.st_mode) || st.st_nlink <= 1 || walk->linked.insert({st.st_dev, st.st_ino}).second)
      walk->bytes += static_cast<int64_t>(st.st_blocks) * 512;
    if (S_ISDIR(st.st_mode)) {
      FdCloser sub(::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (sub.get() < 0) return Status::IoError(fmt::format("cannot open {}: {}", child, ErrnoText(errno)));
      RETURN_IF_ERROR(CleanTree(sub.get(), child, depth + 1, walk));
    }
  }
  return Status::Ok();
}

}  // namespace gpupool::agent_internal
