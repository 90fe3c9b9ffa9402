// GET /api/v1/jobs, cheaply: the scheduler's lock is held only to copy a page of job summaries
// (O(page) work: per-phase task counts are kept incrementally), and the JSON is built from the
// copies after the lock is released (docs/api.md#list-jobs).
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/workload.h"

namespace gpupool {

// "2026-01-02T03:04:05.678Z"
std::string FormatTime(int64_t ms);

inline constexpr int kTaskPhaseCount = 8;  // TaskPhase values (server/service.h)

// What a list item says about one job, copied under the lock.
struct JobSummary {
  std::string id, name, tenant, queue, reason;
  int priority = 0;
  QosClass qos = QosClass::kBurstable;
  std::string_view state;  // JobPhaseName (static storage)
  int faults = 0;
  int64_t created_ms = 0, updated_ms = 0;
  int64_t not_before_ms = 0;  // > 0: shown as notBefore
  int tasks = 0;
  std::array<int32_t, kTaskPhaseCount> task_counts{};  // indexed by TaskPhase
  // Only when asked for (fields=spec, fields=tasks): the canonical spec as stored, and the tasks'
  // JSON (built under the lock, so pages that carry them are bounded by task count).
  std::string spec_json;
  nlohmann::json tasks_json;
};

// {"total": n, "pending": .., "assigned": .., ...}: every phase, zeros included.
nlohmann::json TaskCountsJson(int total, const std::array<int32_t, kTaskPhaseCount>& counts);
// A list item: the job's fields and its task counts; spec and tasks when the summary carries them.
nlohmann::json JobSummaryJson(const JobSummary& s, bool with_spec, bool with_tasks);

}  // namespace gpupool
