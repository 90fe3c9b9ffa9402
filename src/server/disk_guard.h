// The store's disk guard: the server refuses new work (HTTP 507 Insufficient Storage) while the
// filesystem of its data directory has less free space than a reserve, instead of running the disk
// full and then stopping on the first store write that fails (PoolService's FailStop, exit 70).
// The reserve is left for what must keep working: agents' heartbeats and task status reports,
// the scheduling loop's placements, cancellations, so running jobs end cleanly.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace gpupool {

struct DiskSpace {
  uint64_t free_bytes = 0;   // available to this (unprivileged) process: statvfs f_bavail
  uint64_t total_bytes = 0;
};
// How free space is measured; tests inject their own.
using FreeSpaceProbe = std::function<Result<DiskSpace>(const std::string& path)>;
// statvfs(2) of `path`.
Result<DiskSpace> StatvfsFreeSpace(const std::string& path);

class DiskGuard {
 public:
  // `reserve_bytes` 0: never refuses. `probe` empty: StatvfsFreeSpace. A measurement is reused for
  // `cache` (so a burst of submissions costs one statvfs).
  DiskGuard(std::string path, int64_t reserve_bytes, FreeSpaceProbe probe,
            std::chrono::milliseconds cache = std::chrono::seconds(1));

  // Ok, or ResourceExhausted: "the store's disk is almost full: /var/lib/gpupool has 100 MiB free
  // (104857600 bytes), less than the reserve of 256 MiB (store.minFreeBytes); new work is refused
  // until space is freed". A probe that fails (no such path) does not refuse: it is reported in
  // Health.
  Status Check();
  // {"path", "freeBytes", "totalBytes", "reserveBytes", "ok"} (+ "error" when the probe failed).
  nlohmann::json Health();

 private:
  void Refresh();  // with mu_ held

  std::string path_;
  int64_t reserve_bytes_;
  FreeSpaceProbe probe_;
  std::chrono::milliseconds cache_;
  std::mutex mu_;
  bool measured_ = false;
  std::chrono::steady_clock::time_point at_{};
  Status probe_status_ = Status::Ok();
  DiskSpace space_;
};

}  // namespace gpupool
