// Runs independent simulator jobs on a few threads: the sweep's experiments and the trainer's
// candidate runs share this one worker pool.
#pragma once

#include <cstddef>
#include <functional>

#include "common/status.h"

namespace gpupool {

// Calls fn(i) once for each i in [0, n) on `jobs` threads, this one among them (jobs <= 0: one per
// hardware thread; never more than n). After the first error no further index is started, and the
// error of the lowest failed index is returned (an exception thrown by fn counts as an Internal
// error). fn is called concurrently and must guard what it shares.
Status ParallelFor(size_t n, int jobs, const std::function<Status(size_t)>& fn);

}  // namespace gpupool
