#include "server/disk_guard.h"

#include <sys/statvfs.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace gpupool {

Result<DiskSpace> StatvfsFreeSpace(const std::string& path) {
  struct statvfs st;
  if (::statvfs(path.c_str(), &st) != 0)
    return Status::IoError(fmt::format("statvfs {}: {}", path, std::strerror(errno)));
  DiskSpace d;
  d.free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  d.total_bytes = static_cast<uint64_t>(st.f_blocks) * st.f_frsize;
  return d;
}

namespace {

std::string Human(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 30)) return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / (1 << 30));
  if (bytes >= (uint64_t{1} << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
  return fmt::format("{} KiB", bytes / 1024);
}

}  // namespace

DiskGuard::DiskGuard(std::string path, int64_t reserve_bytes, FreeSpaceProbe probe, std::chrono::milliseconds cache)
    : path_(std::move(path)),
      reserve_bytes_(reserve_bytes),
      probe_(probe ? std::move(probe) : FreeSpaceProbe(StatvfsFreeSpace)),
      cache_(cache) {}

void DiskGuard::Refresh() {
  const auto now = std::chrono::steady_clock::now();
  if (measured_ && now - at_ < cache_) return;
  measured_ = true;
  at_ = now;
  auto r = probe_(path_);
  probe_status_ = r.ok() ? Status::Ok() : r.status();
  if (r.ok()) space_ = *r;
}

Status DiskGuard::Check() {
  if (reserve_bytes_ <= 0) return Status::Ok();
  std::lock_guard<std::mutex> lock(mu_);
  Refresh();
  if (!probe_status_.ok() || space_.free_bytes >= static_cast<uint64_t>(reserve_bytes_)) return Status::Ok();
  return Status::ResourceExhausted(fmt::format(
      "the store's disk is almost full: {} has {} free ({} bytes), less than the reserve of {} "
      "({} bytes, store.minFreeBytes); new work is refused until space is freed",
      path_, Human(space_.free_bytes), space_.free_bytes, Human(static_cast<uint64_t>(reserve_bytes_)),
      reserve_bytes_));
}

nlohmann::json DiskGuard::Health() {
  std::lock_guard<std::mutex> lock(mu_);
  Refresh();
  nlohmann::json j = {{"path", path_}, {"reserveBytes", reserve_bytes_}};
  if (!probe_status_.ok()) {
    j["ok"] = true;  // unknown: not refused
    j["error"] = probe_status_.message();
    return j;
  }
  j["freeBytes"] = space_.free_bytes;
  j["totalBytes"] = space_.total_bytes;
  j["ok"] = reserve_bytes_ <= 0 || space_.free_bytes >= static_cast<uint64_t>(reserve_bytes_);
  return j;
}

}  // namespace gpupool
