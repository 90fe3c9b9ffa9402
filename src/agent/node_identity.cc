#include "agent/node_identity.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace gpupool {

namespace {

std::optional<std::string> Slurp(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  if (s.size() > 4096) return std::nullopt;
  return s;
}

Status WriteAtomic(const std::string& path, const std::string& content, mode_t mode, bool sync = true) {
  const std::string tmp = path + ".tmp";
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return Status::IoError(fmt::format("cannot create {}: {}", tmp, std::strerror(errno)));
  // The umask may have taken bits away, never added them; make the mode exact anyway.
  bool ok = ::fchmod(fd, mode) == 0;
  size_t off = 0;
  while (ok && off < content.size()) {
    const ssize_t n = ::write(fd, content.data() + off, content.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ok = false; else off += static_cast<size_t>(n);
  }
  ok = ok && (!sync || ::fsync(fd) == 0);
  const int saved = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    return Status::IoError(fmt::format("cannot write {}: {}", tmp, std::strerror(saved)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return Status::IoError(fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(errno)));
  return Status::Ok();
}

}  // namespace

std::string NodeCredentialPath(const std::string& state_dir) { return state_dir + "/node-credential"; }
std::string ClusterIdPath(const std::string& state_dir) { return state_dir + "/cluster-id"; }

bool LooksLikeNodeCredential(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

std::optional<std::string> ReadNodeCredential(const std::string& state_dir, const std::string& node) {
  auto text = Slurp(NodeCredentialPath(state_dir));
  if (!text) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (!j.is_object() || j.value("node", "") != node) return std::nullopt;
  const std::string cred = j.value("credential", "");
  if (!LooksLikeNodeCredential(cred)) return std::nullopt;
  return cred;
}

Status WriteNodeCredential(const std::string& state_dir, const std::string& node, const std::string& credential) {
  return WriteAtomic(NodeCredentialPath(state_dir),
                     nlohmann::json{{"node", node}, {"credential", credential}}.dump() + "\n", 0600);
}

void RemoveNodeCredential(const std::string& state_dir) { ::unlink(NodeCredentialPath(state_dir).c_str()); }

Status WritePlacementRun(const std::string& state_dir, const std::string& task, const std::string& run) {
  std::error_code ec;
  std::filesystem::create_directories(state_dir + "/runs", ec);
  // Not fsynced (see runtime_internal.h, WriteFileAtomic): a file lost with the machine reads as
  // "", which marks what is on disk under the id as another placement's: never adopted.
  return WriteAtomic(state_dir + "/runs/" + task, run + "\n", 0600, /*sync=*/false);
}

void RemovePlacementRun(const std::string& state_dir, const std::string& task) {
  ::unlink((state_dir + "/runs/" + task).c_str());
}

std::string ReadPlacementRun(const std::string& state_dir, const std::string& task) {
  auto text = Slurp(state_dir + "/runs/" + task);
  if (!text) return "";
  std::string s = *text;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string ReadClusterId(const std::string& state_dir) {
  auto text = Slurp(ClusterIdPath(state_dir));
  if (!text) return "";
  std::string s = *text;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

Status WriteClusterId(const std::string& state_dir, const std::string& id) {
  return WriteAtomic(ClusterIdPath(state_dir), id + "\n", 0644);
}

}  // namespace gpupool
