// Jobs over time, for the time-based replay (sim/replay.h): readers of job traces that carry
// arrival and run time, and the clusters to replay them on. A malformed row is an error naming
// file, line and reason; no row is skipped silently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/gpu_catalog.h"
#include "model/node.h"
#include "model/workload.h"

namespace gpupool {

// One job of a trace: when it arrives, how long it runs once started, and what it asks for.
struct TimedJob {
  std::string name;      // unique in the trace ("philly-<line>")
  int64_t arrival = 0;   // seconds since the trace's first arrival (>= 0)
  int64_t duration = 0;  // seconds of run time (>= 1)
  Job job;               // tenant and queue set; its groups' requests
};

struct TimedTraceLimits {
  size_t max_jobs = 1'000'000;
  int64_t max_duration = int64_t{10} * 365 * 86400;  // ten years
  int max_gpus = 1024;                                // per job
};

// The Philly job list (traces/philly/philly.csv): timestamp (UTC, "YYYY-MM-DD HH:MM:SS"),
// duration (seconds, a number, rounded up to a whole second, at least 1), num_gpus (whole GPUs,
// 1..max_gpus), cluster (the virtual cluster: the job's queue and tenant, 1..63 characters of
// [A-Za-z0-9_-]). gpu_time, when present, must be duration × num_gpus (to a second). A job of up to
// `gpus_per_task` GPUs is one task; a larger one a gang of tasks of `gpus_per_task` GPUs and one of
// the rest (the servers it runs on have no more GPUs each). Philly has no CPU or memory figures:
// the tasks ask for none. Sorted by arrival, then by line.
Result<std::vector<TimedJob>> ReadPhillyJobs(const std::string& path, int gpus_per_task = 8,
                                             const TimedTraceLimits& limits = {});

// An openb pod list with its time columns (traces/alibaba-gpu-v2023/openb_pod_list_*.csv, as
// ReadOpenbPods reads the rest): each pod a job of one task, arriving at creation_time (seconds,
// made relative to the first arrival) and running deletion_time − creation_time seconds (at least
// 1; deletion before creation is an error). The trace names no tenants or queues: every job is in
// "default". qos, pod_phase and scheduled_time are not read. Sorted by arrival, then by line.
Result<std::vector<TimedJob>> ReadOpenbTimedPods(const std::string& path, const TimedTraceLimits& limits = {});

// A task group of `replicas` tasks of `gpus` whole GPUs each, exclusive: what the job lists
// without shares of GPUs (Philly, Slurm, Kubernetes' nvidia.com/gpu) ask for.
TaskGroup WholeGpuGroup(const char* name, int replicas, int gpus);

// Seconds since 1970-01-01 of "YYYY-MM-DD HH:MM:SS" (UTC; years 1970..9999); InvalidArgument otherwise.
Result<int64_t> ParseUtcTimestamp(const std::string& text);

// A queue or tenant name a trace may carry: 1..63 characters of [A-Za-z0-9_-].
bool ValidClusterName(const std::string& s);

// Arrivals compressed by `load` (> 0): arrival / load, so 2.0 offers the same jobs in half the
// time (twice the load). Durations stay.
std::vector<TimedJob> ScaleLoad(std::vector<TimedJob> jobs, double load);

// A cluster of `servers` groups: "8x56,2x32" is 56 servers of 8 GPUs and 32 of 2 (the two server
// kinds the Philly paper describes; how many of each is the caller's choice). Each server: `model`
// GPUs, 8 CPUs and 64 GiB per GPU. Names "s<gpus>-<i>" (i counts every server). InvalidArgument for a malformed shape.
Result<std::vector<NodeSpec>> ServerCluster(const std::string& shape, const std::string& model,
                                            const GpuCatalog& catalog);

}  // namespace gpupool
