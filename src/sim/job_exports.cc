#include "sim/job_exports.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <unordered_map>
#include <utility>

#include "sim/csv.h"
#include "sim/job_exports_internal.h"

namespace gpupool {

namespace exports_internal {

std::string Clip(const std::string& s) {
  return s.substr(0, 64);
}

bool AllDigits(const std::string& s, size_t at, size_t len) {
  if (at + len > s.size()) return false;
  return std::all_of(s.begin() + static_cast<ptrdiff_t>(at), s.begin() + static_cast<ptrdiff_t>(at + len),
                     [](char c) { return c >= '0' && c <= '9'; });
}

int64_t Digits(const std::string& s, size_t at, size_t len) {
  int64_t v = 0;
  for (size_t i = at; i < at + len; ++i) v = v * 10 + (s[i] - '0');
  return v;
}

int64_t WholeCount(const std::string& s) {
  if (s.empty() || s.size() > 9 || !AllDigits(s, 0, s.size())) return -1;
  return Digits(s, 0, s.size());
}

Status CheckFileSize(const std::string& path, const ExportLimits& limits) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (!ec && size > limits.max_file_bytes)
    return Status::InvalidArgument(fmt::format("{}: {} bytes, more than the {} a job export may have", path,
                                               size, limits.max_file_bytes));
  return Status::Ok();
}

Result<ExportRead> Finish(std::vector<ExportRow> rows, std::map<std::string, int64_t> skipped,
                          const std::string& path, int64_t per_second) {
  if (rows.empty()) {
    const std::string what = DescribeSkipped(skipped);
    return Status::InvalidArgument(fmt::format("{}: no jobs to replay{}", path,
                                               what.empty() ? std::string() : " (skipped: " + what + ")"));
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [](const ExportRow& a, const ExportRow& b) { return a.first < b.first; });
  ExportRead out;
  out.skipped = std::move(skipped);
  out.jobs.reserve(rows.size());
  const int64_t first = rows.front().first;
  for (ExportRow& r : rows) {
    r.second.arrival = (r.first - first) / per_second;
    out.jobs.push_back(std::move(r.second));
  }
  return out;
}


}  // namespace exports_internal

using namespace exports_internal;

namespace {

const std::set<std::string>& SlurmStates() {
  static const std::set<std::string> kStates = {
      "BOOT_FAIL",     "CANCELLED", "COMPLETED", "DEADLINE",     "FAILED",      "NODE_FAIL",
      "OUT_OF_MEMORY", "PENDING",   "PREEMPTED", "REQUEUED",     "REQUEUE_FED", "REQUEUE_HOLD",
      "RESIZING",      "REVOKED",   "RUNNING",   "SPECIAL_EXIT", "SUSPENDED",   "TIMEOUT"};
  return kStates;
}

}  // namespace

std::string DescribeSkipped(const std::map<std::string, int64_t>& skipped) {
  std::string out;
  for (const auto& [reason, n] : skipped) out += fmt::format("{}{} {}", out.empty() ? "" : ", ", n, reason);
  return out;
}

Result<int64_t> ParseSlurmTimestamp(const std::string& text) {
  if (text.size() != 19 || text[10] != 'T')
    return Status::InvalidArgument(fmt::format("timestamp '{}' is not YYYY-MM-DDTHH:MM:SS", Clip(text)));
  std::string utc = text;
  utc[10] = ' ';
  auto t = ParseUtcTimestamp(utc);
  if (!t.ok())
    return Status::InvalidArgument(fmt::format("timestamp '{}' is not YYYY-MM-DDTHH:MM:SS", Clip(text)));
  return t;
}

Result<int64_t> ParseSlurmElapsed(const std::string& text) {
  const auto bad = [&] {
    return Status::InvalidArgument(
        fmt::format("Elapsed '{}' is not [D-]HH:MM:SS or MM:SS[.fff]", Clip(text)));
  };
  const auto two = [](const std::string& s, size_t at) {
    return AllDigits(s, at, 2) ? Digits(s, at, 2) : -1;
  };
  std::string clock = text;
  int64_t days = 0;
  const size_t dash = text.find('-');
  if (dash != std::string::npos) {
    if (dash == 0 || dash > 6 || !AllDigits(text, 0, dash)) return bad();
    days = Digits(text, 0, dash);
    clock = text.substr(dash + 1);
    if (clock.size() != 8) return bad();  // days come with HH:MM:SS
  }
  int64_t h = 0, m = -1, s = -1, fraction_up = 0;
  if (clock.size() == 8 && clock[2] == ':' && clock[5] == ':') {
    h = two(clock, 0), m = two(clock, 3), s = two(clock, 6);
  } else if (dash == std::string::npos && clock.size() >= 5 && clock[2] == ':' &&
             (clock.size() == 5 || clock[5] == '.')) {
    m = two(clock, 0), s = two(clock, 3);
    if (clock.size() > 5) {
      const size_t digits = clock.size() - 6;
      if (digits < 1 || digits > 6 || !AllDigits(clock, 6, digits)) return bad();
      fraction_up = Digits(clock, 6, digits) > 0 ? 1 : 0;
    }
  } else {
    return bad();
  }
  if (h < 0 || h > 23 || m < 0 || m > 59 || s < 0 || s > 59) return bad();
  return days * 86400 + h * 3600 + m * 60 + s + fraction_up;
}

Result<int64_t> SlurmTresGpus(const std::string& tres) {
  int64_t untyped = -1, typed = 0;
  std::set<std::string> seen;
  size_t start = 0;
  while (!tres.empty() && start <= tres.size()) {
    size_t comma = tres.find(',', start);
    if (comma == std::string::npos) comma = tres.size();
    const std::string item = tres.substr(start, comma - start);
    start = comma + 1;
    const size_t eq = item.find('=');
    if (eq == 0 || eq == std::string::npos || eq + 1 == item.size())
      return Status::InvalidArgument(fmt::format("TRES item '{}' is not <name>=<count>", Clip(item)));
    const std::string key = item.substr(0, eq);
    if (!seen.insert(key).second)
      return Status::InvalidArgument(fmt::format("TRES item '{}' is there twice", Clip(key)));
    if (key != "gres/gpu" && key.rfind("gres/gpu:", 0) != 0) continue;
    const int64_t n = WholeCount(item.substr(eq + 1));
    if (n < 0)
      return Status::InvalidArgument(fmt::format("TRES item '{}' is not a whole number of GPUs", Clip(item)));
    if (key == "gres/gpu") {
      untyped = n;
    } else {
      if (key.size() == 9)
        return Status::InvalidArgument(fmt::format("TRES item '{}' names no GPU type", Clip(item)));
      typed += n;
    }
  }
  return untyped >= 0 ? untyped : typed;
}

Result<ExportRead> ReadSacctJobs(const std::string& path, int gpus_per_task, const ExportLimits& limits) {
  if (gpus_per_task < 1 || gpus_per_task > 64)
    return Status::InvalidArgument(fmt::format("GPUs per task must be 1..64, got {}", gpus_per_task));
  RETURN_IF_ERROR(CheckFileSize(path, limits));
  auto opened = CsvFile::Open(path, {"JobID", "Submit"}, '|');
  if (!opened.ok())
    return Status(opened.status().code(),
                  opened.status().message() + " (sacct --parsable2 output: '|'-separated, a header first)");
  CsvFile f = std::move(*opened);
  const auto header_error = [&](const char* what) {
    return Status::InvalidArgument(fmt::format("{}:1: header has {}", path, what));
  };
  const bool has_times = f.HasColumn("Start") && f.HasColumn("End");
  if (!f.HasColumn("Elapsed") && !has_times) return header_error("neither Elapsed nor both Start and End");
  if (!has_times && !f.HasColumn("State")) return header_error("no State (needed without Start and End)");
  if (!f.HasColumn("AllocTRES") && !f.HasColumn("ReqTRES"))
    return header_error("neither AllocTRES nor ReqTRES");

  std::vector<ExportRow> rows;
  std::map<std::string, int64_t> skipped;
  std::unordered_map<std::string, int> lines;  // JobID -> line
  while (f.Next()) {
    RETURN_IF_ERROR(f.CheckWidth());
    const auto row_error = [&](const std::string& message) {
      return f.RowError(Status::InvalidArgument(message));
    };
    const std::string& id = f.Get("JobID");
    if (id.empty() || id.size() > 64 ||
        !std::all_of(id.begin(), id.end(), [](char c) { return c > ' ' && c < 127; }))
      return row_error(fmt::format("JobID '{}' is not 1..64 printable characters", Clip(id)));
    if (id.find('.') != std::string::npos) {
      ++skipped[kSkipStep];
      continue;
    }
    if (lines.size() >= limits.max_jobs)
      return f.RowError(Status::ResourceExhausted(fmt::format("more than {} jobs", limits.max_jobs)));
    if (auto [it, fresh] = lines.emplace(id, f.line_no()); !fresh)
      return row_error(fmt::format("JobID '{}' is also on line {}", id, it->second));
    auto submit = ParseSlurmTimestamp(f.Get("Submit"));
    if (!submit.ok()) return row_error("Submit: " + submit.status().message());

    // Queue and tenant.
    const auto name_of = [&](const char* column) -> std::string {
      const std::string* v = f.GetOptional(column);
      return v == nullptr ? std::string() : *v;
    };
    std::string queue = name_of("Partition");
    queue = queue.substr(0, queue.find(','));
    const char* tenant_column = "Account";
    std::string tenant = name_of("Account");
    if (tenant.empty()) tenant_column = "User", tenant = name_of("User");
    if (queue.empty()) queue = "default";
    if (tenant.empty()) tenant = "default";
    if (!ValidClusterName(queue))
      return row_error(fmt::format("Partition '{}' is not 1..63 characters of [A-Za-z0-9_-]", Clip(queue)));
    if (!ValidClusterName(tenant))
      return row_error(
          fmt::format("{} '{}' is not 1..63 characters of [A-Za-z0-9_-]", tenant_column, Clip(tenant)));

    // Whether it ran and ended.
    const std::string* state_field = f.GetOptional("State");
    const std::string state =
        state_field == nullptr ? std::string() : state_field->substr(0, state_field->find(' '));
    if (state_field != nullptr && SlurmStates().count(state) == 0)
      return row_error(fmt::format("State '{}' is not a Slurm job state", Clip(*state_field)));
    const std::string* start = f.GetOptional("Start");
    const std::string* end = f.GetOptional("End");
    const std::string* alloc = f.GetOptional("AllocTRES");
    const auto unknown = [](const std::string* t) {
      return t != nullptr && (*t == "Unknown" || *t == "None");
    };
    if (state == "PENDING" || state.rfind("REQUEUE", 0) == 0 || unknown(start) ||
        (alloc != nullptr && alloc->empty())) {
      ++skipped[kSkipNeverStarted];
      continue;
    }
    if (state == "RUNNING" || state == "SUSPENDED" || unknown(end)) {
      ++skipped[kSkipStillRunning];
      continue;
    }

    // How long, how many GPUs.
    int64_t seconds = 0;
    if (has_times) {
      auto from = ParseSlurmTimestamp(*start);
      if (!from.ok()) return row_error("Start: " + from.status().message());
      auto to = ParseSlurmTimestamp(*end);
      if (!to.ok()) return row_error("End: " + to.status().message());
      if (*to < *from) return row_error(fmt::format("End {} is before Start {}", *end, *start));
      seconds = *to - *from;
    }
    if (const std::string* elapsed = f.GetOptional("Elapsed")) {
      auto e = ParseSlurmElapsed(*elapsed);
      if (!e.ok()) return row_error(e.status().message());
      seconds = *e;
    }
    if (seconds > limits.max_duration)
      return row_error(fmt::format("run time {} s is more than {} s", seconds, limits.max_duration));
    const char* tres_column = alloc != nullptr ? "AllocTRES" : "ReqTRES";
    const std::string* tres = alloc != nullptr ? alloc : f.GetOptional("ReqTRES");
    auto gpus = SlurmTresGpus(*tres);
    if (!gpus.ok()) return row_error(fmt::format("{}: {}", tres_column, gpus.status().message()));
    if (*gpus == 0) {
      ++skipped[kSkipNoGpus];
      continue;
    }
    if (*gpus > limits.max_gpus)
      return row_error(fmt::format("{} GPUs, more than the {} a job may have", *gpus, limits.max_gpus));
    int64_t nodes = 1;
    if (const std::string* nn = f.GetOptional("NNodes")) {
      nodes = WholeCount(*nn);
      if (nodes < 1) return row_error(fmt::format("NNodes '{}' is not a whole number of nodes", Clip(*nn)));
      if (*gpus % nodes != 0)
        return row_error(fmt::format("{} GPUs do not divide over NNodes {}", *gpus, nodes));
    }

    ExportRow row{*submit, {}};
    TimedJob& t = row.second;
    t.name = id;
    t.duration = std::max<int64_t>(1, seconds);
    t.job.name = id;
    t.job.tenant = tenant;
    t.job.queue = queue;
    const int per_node = static_cast<int>(*gpus / nodes);
    const int n = static_cast<int>(nodes);
    if (per_node <= gpus_per_task) {
      t.job.groups.push_back(WholeGpuGroup(n == 1 ? "job" : "node", n, per_node));
    } else {
      t.job.groups.push_back(WholeGpuGroup("worker", n * (per_node / gpus_per_task), gpus_per_task));
      if (per_node % gpus_per_task != 0)
        t.job.groups.push_back(WholeGpuGroup("rest", n, per_node % gpus_per_task));
    }
    rows.push_back(std::move(row));
  }
  RETURN_IF_ERROR(f.error());
  return Finish(std::move(rows), std::move(skipped), path, 1);
}

}  // namespace gpupool
