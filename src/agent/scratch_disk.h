// Disk scratch with a size limit (docs/jobspec.md#volumes): a sparse file under the agent's
// --scratch-root, formatted ext4 and loop-mounted on the task's scratch directory, so the task can
// never write more than its limit there, whatever it does. Through Debian's mkfs.ext4 (e2fsprogs)
// and mount (util-linux, which sets up the loop device and frees it at unmount). Needs root.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace gpupool::agent_internal {

struct ScratchDiskTools {
  std::string mkfs;   // absolute path of mkfs.ext4
  std::string mount;  // absolute path of mount
  std::chrono::milliseconds timeout{30000};
};

// Finds mkfs.ext4 and mount on the default PATH; FailedPrecondition naming what is missing.
Result<ScratchDiskTools> FindScratchDiskTools();

// Makes `image` (a new file: never an existing one, never through a link; the host's root's,
// 0600) of `bytes`, sparse, formats it with its root directory owned by uid:gid (mode 0700, no
// lost+found), and mounts it (nosuid, nodev, noatime) on `dir`, which must exist. The image is
// sparse (a cap, not a reservation): `bytes` beyond what its file system has free is refused
// (ResourceExhausted). On failure nothing is left mounted and the image is removed.
Status MountScratchDisk(const ScratchDiskTools& tools, const std::string& image, const std::string& dir,
                        int64_t bytes, int64_t uid, int64_t gid);

// Detaches whatever is mounted on `dir` (lazily: a container that still holds it keeps it until
// it ends); nothing mounted there is fine.
void UnmountScratch(const std::string& dir);

}  // namespace gpupool::agent_internal
