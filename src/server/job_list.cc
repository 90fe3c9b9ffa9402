#include "server/job_list.h"

#include <fmt/format.h>

#include <ctime>

namespace gpupool {

namespace {
// The names of TaskPhase in enum order (server/service.h; a static_assert there keeps them in step).
constexpr const char* kTaskPhaseNames[kTaskPhaseCount] = {"pending",   "assigned", "running",   "stopping",
                                                          "succeeded", "failed",   "cancelled", "preempted"};
}  // namespace

std::string FormatTime(int64_t ms) {
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03}Z", buf, ms % 1000);
}

nlohmann::json TaskCountsJson(int total, const std::array<int32_t, kTaskPhaseCount>& counts) {
  nlohmann::json j = {{"total", total}};
  for (int p = 0; p < kTaskPhaseCount; ++p) j[kTaskPhaseNames[p]] = counts[static_cast<size_t>(p)];
  return j;
}

nlohmann::json JobSummaryJson(const JobSummary& s, bool with_spec, bool with_tasks) {
  nlohmann::json out = {{"id", s.id},
                        {"name", s.name},
                        {"tenant", s.tenant},
                        {"queue", s.queue},
                        {"priority", s.priority},
                        {"qos", QosClassName(s.qos)},
                        {"state", s.state},
                        {"reason", s.reason},
                        {"faults", s.faults},
                        {"createdAt", FormatTime(s.created_ms)},
                        {"updatedAt", FormatTime(s.updated_ms)}};
  if (s.not_before_ms > 0) out["notBefore"] = FormatTime(s.not_before_ms);
  out["taskCounts"] = TaskCountsJson(s.tasks, s.task_counts);
  if (with_spec) {
    nlohmann::json spec = nlohmann::json::parse(s.spec_json, nullptr, false);
    out["spec"] = spec.is_discarded() ? nlohmann::json::object() : std::move(spec);
  }
  if (with_tasks) out["tasks"] = s.tasks_json;
  return out;
}

}  // namespace gpupool
