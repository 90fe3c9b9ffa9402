#include "sim/timeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <utility>

#include "sim/csv.h"
#include "sim/trace.h"

namespace gpupool {

namespace {

// Days from 1970-01-01 to y-m-d (proleptic Gregorian), after the well-known civil-date formula.
int64_t DaysFromCivil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2 ? 1 : 0;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

int DaysInMonth(int64_t y, int64_t m) {
  static constexpr int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  return m == 2 && leap ? 29 : kDays[m - 1];
}

Result<double> ParseNumber(const std::string& s, const char* column) {
  double v = 0;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, v);
  if (s.empty() || ec != std::errc() || ptr != end || !std::isfinite(v))
    return Status::InvalidArgument(fmt::format("column '{}' is not a number: '{}'", column, s.substr(0, 64)));
  return v;
}

// Jobs with their absolute arrival times, in file order: sorted by arrival (ties keep file
// order), times made relative to the first.
using TimedRow = std::pair<int64_t, TimedJob>;
Result<std::vector<TimedJob>> FinishTimeline(std::vector<TimedRow> rows, const std::string& path) {
  if (rows.empty()) return Status::InvalidArgument(fmt::format("{}: no jobs", path));
  std::stable_sort(rows.begin(), rows.end(), [](const TimedRow& a, const TimedRow& b) { return a.first < b.first; });
  const int64_t first = rows.front().first;
  std::vector<TimedJob> out;
  out.reserve(rows.size());
  for (TimedRow& r : rows) {
    r.second.arrival = r.first - first;
    out.push_back(std::move(r.second));
  }
  return out;
}

}  // namespace

bool ValidClusterName(const std::string& s) {
  if (s.empty() || s.size() > 63) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

Result<int64_t> ParseUtcTimestamp(const std::string& text) {
  const auto bad = [&] {
    return Status::InvalidArgument(
        fmt::format("timestamp '{}' is not 'YYYY-MM-DD HH:MM:SS' (UTC)", text.substr(0, 64)));
  };
  if (text.size() != 19 || text[4] != '-' || text[7] != '-' || text[10] != ' ' || text[13] != ':' ||
      text[16] != ':')
    return bad();
  const auto field = [&](size_t at, size_t len) -> int64_t {
    int64_t v = 0;
    for (size_t i = at; i < at + len; ++i) {
      if (text[i] < '0' || text[i] > '9') return -1;
      v = v * 10 + (text[i] - '0');
    }
    return v;
  };
  const int64_t y = field(0, 4), mo = field(5, 2), d = field(8, 2), h = field(11, 2), mi = field(14, 2),
                s = field(17, 2);
  if (y < 1970 || mo < 1 || mo > 12 || d < 1 || h < 0 || h > 23 || mi < 0 || mi > 59 || s < 0 || s > 59)
    return bad();
  if (d > DaysInMonth(y, mo)) return bad();
  return DaysFromCivil(y, mo, d) * 86400 + h * 3600 + mi * 60 + s;
}

Result<std::vector<TimedJob>> ReadPhillyJobs(const std::string& path, int gpus_per_task,
                                             const TimedTraceLimits& limits) {
  if (gpus_per_task < 1 || gpus_per_task > 64)
    return Status::InvalidArgument(fmt::format("GPUs per task must be 1..64, got {}", gpus_per_task));
  ASSIGN_OR_RETURN(CsvFile f, CsvFile::Open(path, {"timestamp", "duration", "num_gpus", "cluster"}));
  std::vector<TimedRow> rows;
  while (f.Next()) {
    RETURN_IF_ERROR(f.CheckWidth());
    if (rows.size() >= limits.max_jobs)
      return f.RowError(Status::ResourceExhausted(fmt::format("more than {} jobs", limits.max_jobs)));
    auto at = ParseUtcTimestamp(f.Get("timestamp"));
    if (!at.ok()) return f.RowError(at.status());
    auto seconds = ParseNumber(f.Get("duration"), "duration");
    if (!seconds.ok()) return f.RowError(seconds.status());
    if (*seconds < 0 || *seconds > static_cast<double>(limits.max_duration))
      return f.RowError(Status::InvalidArgument(
          fmt::format("duration must be 0..{} seconds, got {}", limits.max_duration, f.Get("duration"))));
    auto gpus = ParseCsvInt(f.Get("num_gpus"), "num_gpus");
    if (!gpus.ok()) return f.RowError(gpus.status());
    if (*gpus < 1 || *gpus > limits.max_gpus)
      return f.RowError(Status::InvalidArgument(fmt::format("num_gpus must be 1..{}, got {}", limits.max_gpus, *gpus)));
    if (const std::string* gpu_time = f.GetOptional("gpu_time")) {
      auto gt = ParseNumber(*gpu_time, "gpu_time");
      if (!gt.ok()) return f.RowError(gt.status());
      if (std::fabs(*gt - *seconds * static_cast<double>(*gpus)) > 1.0)
        return f.RowError(Status::InvalidArgument(fmt::format(
            "gpu_time {} is not duration {} x num_gpus {}", *gpu_time, f.Get("duration"), *gpus)));
    }
    const std::string& cluster = f.Get("cluster");
    if (!ValidClusterName(cluster))
      return f.RowError(Status::InvalidArgument(
          fmt::format("cluster '{}' is not 1..63 characters of [A-Za-z0-9_-]", cluster.substr(0, 64))));
    TimedRow row{*at, {}};
    TimedJob& t = row.second;
    t.name = fmt::format("philly-{}", f.line_no());
    t.duration = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(*seconds)));
    t.job.name = t.name;
    t.job.tenant = cluster;
    t.job.queue = cluster;
    const auto add_group = [&](const char* name, int replicas, int count) {
      t.job.groups.push_back(WholeGpuGroup(name, replicas, count));
    };
    const int total = static_cast<int>(*gpus);
    if (total <= gpus_per_task) {
      add_group("job", 1, total);
    } else {
      add_group("worker", total / gpus_per_task, gpus_per_task);
      if (total % gpus_per_task != 0) add_group("rest", 1, total % gpus_per_task);
    }
    rows.push_back(std::move(row));
  }
  RETURN_IF_ERROR(f.error());
  return FinishTimeline(std::move(rows), path);
}

Result<std::vector<TimedJob>> ReadOpenbTimedPods(const std::string& path, const TimedTraceLimits& limits) {
  ASSIGN_OR_RETURN(CsvFile f, CsvFile::Open(path, {"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli",
                                                   "creation_time", "deletion_time"}));
  std::vector<TimedRow> rows;
  while (f.Next()) {
    if (rows.size() >= limits.max_jobs)
      return f.RowError(Status::ResourceExhausted(fmt::format("more than {} pods", limits.max_jobs)));
    ASSIGN_OR_RETURN(TracePod pod, ReadOpenbPodRow(f));
    auto created = ParseCsvInt(f.Get("creation_time"), "creation_time");
    if (!created.ok()) return f.RowError(created.status());
    auto deleted = ParseCsvInt(f.Get("deletion_time"), "deletion_time");
    if (!deleted.ok()) return f.RowError(deleted.status());
    if (*created < 0 || *created > limits.max_duration || *deleted < *created ||
        *deleted - *created > limits.max_duration)
      return f.RowError(Status::InvalidArgument(fmt::format(
          "creation_time {} and deletion_time {}: need 0 <= creation <= deletion, both within {} s", *created,
          *deleted, limits.max_duration)));
    if (pod.request.gpu_count > limits.max_gpus)
      return f.RowError(Status::InvalidArgument(fmt::format("num_gpu must be at most {}", limits.max_gpus)));
    TimedRow row{*created, {}};
    TimedJob& t = row.second;
    t.name = pod.name;
    t.duration = std::max<int64_t>(1, *deleted - *created);
    t.job.name = pod.name;
    t.job.tenant = "default";
    t.job.queue = "default";
    TaskGroup g;
    g.name = "pod";
    g.request = std::move(pod.request);
    g.exec.isolation = g.request.wants_gpu() && g.request.gpu_share < kWholeGpu ? IsolationMode::kTimeslice
                                                                               : IsolationMode::kExclusive;
    t.job.groups.push_back(std::move(g));
    rows.push_back(std::move(row));
  }
  RETURN_IF_ERROR(f.error());
  return FinishTimeline(std::move(rows), path);
}

TaskGroup WholeGpuGroup(const char* name, int replicas, int gpus) {
  TaskGroup g;
  g.name = name;
  g.replicas = replicas;
  g.request.gpu_count = gpus;
  g.request.gpu_share = kWholeGpu;
  g.exec.isolation = IsolationMode::kExclusive;
  return g;
}

std::vector<TimedJob> ScaleLoad(std::vector<TimedJob> jobs, double load) {
  if (!(load > 0) || !std::isfinite(load)) return jobs;
  for (TimedJob& j : jobs) j.arrival = static_cast<int64_t>(std::floor(static_cast<double>(j.arrival) / load));
  return jobs;
}

Result<std::vector<NodeSpec>> ServerCluster(const std::string& shape, const std::string& model,
                                            const GpuCatalog& catalog) {
  constexpr int64_t kMaxServers = 100'000;
  if (catalog.Find(model) == nullptr)
    return Status::InvalidArgument(fmt::format("GPU model '{}' is not in the catalog", model.substr(0, 64)));
  std::vector<NodeSpec> nodes;
  size_t start = 0;
  while (start <= shape.size()) {
    size_t comma = shape.find(',', start);
    if (comma == std::string::npos) comma = shape.size();
    const std::string item = shape.substr(start, comma - start);
    const size_t x = item.find('x');
    const auto bad = [&] {
      return Status::InvalidArgument(fmt::format(
          "cluster shape '{}': '{}' is not <GPUs per server>x<servers> (e.g. 8x56,2x32)", shape.substr(0, 128),
          item.substr(0, 64)));
    };
    if (x == std::string::npos) return bad();
    auto gpus = ParseCsvInt(item.substr(0, x), "gpus");
    auto count = ParseCsvInt(item.substr(x + 1), "servers");
    if (!gpus.ok() || !count.ok() || *gpus < 1 || *gpus > 64 || *count < 1 ||
        *count > kMaxServers - static_cast<int64_t>(nodes.size()))
      return bad();
    for (int64_t i = 0; i < *count; ++i) {
      NodeSpec spec = MakeNode(fmt::format("s{}-{}", *gpus, nodes.size()), MilliCpu(8000 * *gpus), MiB(65536 * *gpus),
                               static_cast<int>(*gpus), model, catalog);
      RETURN_IF_ERROR(ValidateNodeSpec(spec, catalog));
      nodes.push_back(std::move(spec));
    }
    start = comma + 1;
  }
  return nodes;
}

}  // namespace gpupool
