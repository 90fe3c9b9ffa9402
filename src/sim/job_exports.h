// Readers of the job histories users export from their own clusters, for the time-based replay
// (sim/replay.h): Slurm's accounting (`sacct --parsable2`) and Kubernetes' pod list (`kubectl get
// pods -A -o json`). docs/replay.md gives the commands and the rules. As the trace readers
// (sim/timeline.h): a malformed record is an error naming the file, the line or pod and what is
// wrong, and every size is bounded. A record the GPU replay cannot use (a job step, a job that never
// started or still runs, one without GPUs) is not an error: it is counted, by reason, in
// ExportRead::skipped, which the caller shows; nothing is left out silently.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "sim/timeline.h"

namespace gpupool {

struct ExportLimits : TimedTraceLimits {
  uint64_t max_file_bytes = uint64_t{1} << 30;  // refused before reading past this
  int max_json_depth = 64;                      // nesting levels of the pod list
  size_t max_string_bytes = 64 * 1024;          // any key or string of the pod list
};

// The skip reasons (keys of ExportRead::skipped).
inline constexpr const char* kSkipStep = "job step";  // sacct: its allocation is the job
inline constexpr const char* kSkipNeverStarted = "never started";
inline constexpr const char* kSkipStillRunning = "still running";
inline constexpr const char* kSkipNoGpus = "no GPUs";
inline constexpr const char* kSkipNoFinish = "ended without a finish time";  // kubectl

struct ExportRead {
  std::vector<TimedJob> jobs;              // sorted by arrival, then by place in the file
  std::map<std::string, int64_t> skipped;  // reason -> records left out
};

// "3 job step, 1 never started" (empty when nothing was skipped).
std::string DescribeSkipped(const std::map<std::string, int64_t>& skipped);

// `sacct --parsable2` output: '|'-separated, a header naming the columns first. Needs JobID, Submit,
// AllocTRES or ReqTRES, and Elapsed or Start and End; State too unless Start and End are both
// there. Reads Partition, Account, User and NNodes when present.
//   - A step (JobID with a '.': 123.batch, 123.0) is skipped: its allocation is the job. A job that
//     never started (State PENDING or REQUEUED*, Start Unknown/None, or an empty AllocTRES) or
//     still runs (State RUNNING or SUSPENDED, End Unknown) is skipped with that reason, then one
//     with no GPUs. Every other job ran and ended, whatever its State (FAILED, CANCELLED, ...).
//   - Arrival: Submit; run time: Elapsed (a fraction of a second rounded up), else End - Start; at
//     least 1 s. Times are "YYYY-MM-DDTHH:MM:SS" in the cluster's local time: only differences are
//     used.
//   - GPUs: AllocTRES when the column is there and not empty, else ReqTRES: the `gres/gpu=N` item;
//     without one, the sum of the typed `gres/gpu:<type>=N` items.
//   - NNodes > 1: a gang of NNodes tasks of GPUs / NNodes each (an error when that does not
//     divide); one node: as the Philly reader, tasks of up to `gpus_per_task` GPUs. A node's share
//     larger than `gpus_per_task` is split the same way on every node.
//   - Queue: Partition (the first of a list), else "default"; tenant: Account, else User, else
//     "default"; both must be 1..63 characters of [A-Za-z0-9_-] (an error otherwise).
//   - Name: the JobID (123, 123_4 of an array, 123+0 of a heterogeneous job); a JobID twice is an
//     error naming both lines. Tasks ask for GPUs only (whole, exclusive), no CPU or memory.
Result<ExportRead> ReadSacctJobs(const std::string& path, int gpus_per_task = 8,
                                 const ExportLimits& limits = {});

// `kubectl get pods -A -o json`: a List (or PodList) of pods, or one Pod. Each pod is a job of one
// task named <namespace>/<name>, its queue and tenant the namespace. Arrival:
// metadata.creationTimestamp; run time: the latest state.terminated.finishedAt of
// status.containerStatuses minus status.startTime (at least 1 s). Skipped, by reason: no GPUs;
// no startTime (never started); a pod not Succeeded or Failed with a container not terminated
// (still running); a Succeeded or Failed pod with no finishedAt at all. GPUs: each container's
// resources.limits (else requests) "nvidia.com/gpu", whole; CPU and memory: requests (else limits).
// The pod's request is Kubernetes' effective one: the larger of the containers' sum (plus sidecar
// init containers, restartPolicy Always) and the largest init container (plus the sidecars started
// before it). Only the fields read are kept while parsing; a wrong type is an error naming the pod
// (items[i]) and the field.
Result<ExportRead> ReadKubectlPods(const std::string& path, const ExportLimits& limits = {});

// "YYYY-MM-DDTHH:MM:SS" as sacct prints it: seconds since 1970-01-01 taking it as UTC.
Result<int64_t> ParseSlurmTimestamp(const std::string& text);
// sacct's Elapsed, [D-]HH:MM:SS or MM:SS[.fff]: seconds, a fraction rounded up.
Result<int64_t> ParseSlurmElapsed(const std::string& text);
// GPUs of a TRES list ("billing=2,cpu=2,gres/gpu:a100=2,gres/gpu=2,mem=500M,node=1"): the gres/gpu
// item, else the sum of the typed gres/gpu:<type> items, else 0.
Result<int64_t> SlurmTresGpus(const std::string& tres);
// RFC 3339 ("2024-01-02T03:04:05Z", "...05.123456Z", "...05+05:30"): milliseconds since
// 1970-01-01 UTC, digits past the millisecond dropped.
Result<int64_t> ParseRfc3339Millis(const std::string& text);

}  // namespace gpupool
