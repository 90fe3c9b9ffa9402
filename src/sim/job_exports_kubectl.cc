// ReadKubectlPods (sim/job_exports.h): the pod list of `kubectl get pods -A -o json`.
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <istream>
#include <new>
#include <nlohmann/json.hpp>
#include <set>
#include <streambuf>
#include <unordered_map>
#include <utility>

#include "common/quantity.h"
#include "sim/job_exports.h"
#include "sim/job_exports_internal.h"

namespace gpupool {

using namespace exports_internal;

namespace {

using nlohmann::json;

// The fields of a pod the reader uses, as paths below the pod ("[]": an array's items, "*": any
// key). Everything else is dropped while parsing, so what is kept stays small whatever pods carry
// (managed fields, annotations, volumes, messages).
const std::set<std::string>& KeptPaths() {
  static const std::set<std::string> kPaths = [] {
    std::set<std::string> p = {"kind",
                               "apiVersion",
                               "items",
                               "metadata",
                               "metadata.name",
                               "metadata.namespace",
                               "metadata.creationTimestamp",
                               "spec",
                               "status",
                               "status.phase",
                               "status.startTime",
                               "status.containerStatuses",
                               "status.containerStatuses.[]",
                               "status.containerStatuses.[].state",
                               "status.containerStatuses.[].state.*",
                               "status.containerStatuses.[].state.terminated.finishedAt"};
    for (const char* list : {"spec.containers", "spec.initContainers"}) {
      for (const char* tail :
           {"", ".[]", ".[].restartPolicy", ".[].resources", ".[].resources.limits", ".[].resources.limits.*",
            ".[].resources.requests", ".[].resources.requests.*"})
        p.insert(std::string(list) + tail);
    }
    return p;
  }();
  return kPaths;
}

// The parser's callback: tracks where in the document it is, keeps only KeptPaths, and notes (to
// refuse the file) nesting past the limit, a string past the limit, or too many pods.
struct ParseGuard {
  const ExportLimits& limits;
  std::vector<std::string> path;  // the key (or "[]") at each level
  size_t items = 0;
  bool too_deep = false, too_long = false, too_many = false;

  bool Wanted() const {
    const size_t from = path.size() >= 2 && path[0] == "items" && path[1] == "[]" ? 2 : 0;
    std::string parent;
    for (size_t i = from; i + 1 < path.size(); ++i) parent += path[i] + ".";
    return KeptPaths().count(parent + path.back()) != 0 || KeptPaths().count(parent + "*") != 0;
  }

  bool operator()(int depth, json::parse_event_t event, json& parsed) {
    const auto d = static_cast<size_t>(std::max(depth, 0));
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= limits.max_json_depth) {
          too_deep = true;
          return false;
        }
        if (event == json::parse_event_t::array_start) {
          path.resize(d);
          path.push_back("[]");
        } else if (d == 2 && path.size() >= 2 && path[0] == "items" && path[1] == "[]" &&
                   ++items > limits.max_jobs) {
          too_many = true;
          return false;
        }
        return true;
      case json::parse_event_t::key:
      case json::parse_event_t::value:
        if (parsed.is_string() && parsed.get_ref<const std::string&>().size() > limits.max_string_bytes) {
          too_long = true;
          return false;
        }
        if (event == json::parse_event_t::value || !parsed.is_string() || d == 0) return true;
        path.resize(d - 1);
        path.push_back(parsed.get_ref<const std::string&>());
        return Wanted();
      default: return true;
    }
  }
};

// obj[key] when there (and not null), nullptr when not; an error naming `where` and `field` when it
// has another type.
Result<const json*> Field(const json& obj, const char* key, json::value_t type, const std::string& where,
                          const std::string& field) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return static_cast<const json*>(nullptr);
  if (it->type() != type)
    return Status::InvalidArgument(
        fmt::format("{}: {} is {}, not {}", where, field, it->type_name(), json(type).type_name()));
  return &*it;
}

// What a container (or a pod) asks for: mCPU, MiB, GPUs.
struct Need {
  int64_t cpu = 0, memory = 0, gpus = 0;
};
constexpr int64_t kMaxUnits = int64_t{1} << 40;

// One container's need: GPUs from limits (else requests), CPU and memory from requests (else limits).
Result<Need> ContainerNeed(const json& c, const std::string& where, const std::string& field,
                           const ExportLimits& limits) {
  if (!c.is_object())
    return Status::InvalidArgument(fmt::format("{}: {} is {}, not object", where, field, c.type_name()));
  ASSIGN_OR_RETURN(const json* resources,
                   Field(c, "resources", json::value_t::object, where, field + ".resources"));
  Need n;
  if (resources == nullptr) return n;
  const json* lists[2] = {nullptr, nullptr};  // requests, limits
  const char* names[2] = {"requests", "limits"};
  for (int i = 0; i < 2; ++i) {
    ASSIGN_OR_RETURN(lists[i], Field(*resources, names[i], json::value_t::object, where,
                                     fmt::format("{}.resources.{}", field, names[i])));
  }
  // The quantity of `resource`, looked up in `order` of the lists; nullptr when none has it.
  const auto quantity = [&](const char* resource, std::initializer_list<int> order) -> Result<const json*> {
    for (int i : order) {
      if (lists[i] == nullptr) continue;
      ASSIGN_OR_RETURN(const json* q, Field(*lists[i], resource, json::value_t::string, where,
                                            fmt::format("{}.resources.{}.{}", field, names[i], resource)));
      if (q != nullptr) return q;
    }
    return static_cast<const json*>(nullptr);
  };
  ASSIGN_OR_RETURN(const json* gpu, quantity("nvidia.com/gpu", {1, 0}));
  if (gpu != nullptr) {
    n.gpus = WholeCount(gpu->get_ref<const std::string&>());
    if (n.gpus < 0 || n.gpus > limits.max_gpus)
      return Status::InvalidArgument(
          fmt::format("{}: {}: nvidia.com/gpu '{}' is not a whole number of GPUs 0..{}", where, field,
                      Clip(gpu->get_ref<const std::string&>()), limits.max_gpus));
  }
  ASSIGN_OR_RETURN(const json* cpu, quantity("cpu", {0, 1}));
  if (cpu != nullptr) {
    auto v = ParseCpu(cpu->get_ref<const std::string&>());
    if (!v.ok())
      return Status::InvalidArgument(fmt::format("{}: {}: {}", where, field, v.status().message()));
    n.cpu = v->units();
  }
  ASSIGN_OR_RETURN(const json* memory, quantity("memory", {0, 1}));
  if (memory != nullptr) {
    auto v = ParseMemory(memory->get_ref<const std::string&>());
    if (!v.ok())
      return Status::InvalidArgument(fmt::format("{}: {}: {}", where, field, v.status().message()));
    n.memory = v->units();
  }
  if (n.cpu > kMaxUnits || n.memory > kMaxUnits)
    return Status::InvalidArgument(
        fmt::format("{}: {}: cpu and memory must be at most 2^40 mCPU and MiB", where, field));
  return n;
}

// A stream buffer over `in` that ends, noting it, past `limit` bytes: the file is parsed as it is
// read, never held whole, and never read past the limit.
class BoundedBuf : public std::streambuf {
 public:
  BoundedBuf(std::streambuf* in, uint64_t limit) : in_(in), left_(limit) {}
  bool exceeded() const { return exceeded_; }

 protected:
  int_type underflow() override {
    if (left_ == 0) {
      exceeded_ = exceeded_ || in_->sgetc() != traits_type::eof();
      return traits_type::eof();
    }
    const std::streamsize n =
        in_->sgetn(buffer_, static_cast<std::streamsize>(std::min<uint64_t>(sizeof buffer_, left_)));
    if (n <= 0) return traits_type::eof();
    left_ -= static_cast<uint64_t>(n);
    setg(buffer_, buffer_, buffer_ + n);
    return traits_type::to_int_type(buffer_[0]);
  }

 private:
  std::streambuf* in_;
  uint64_t left_;
  bool exceeded_ = false;
  char buffer_[1 << 16];
};

}  // namespace

Result<int64_t> ParseRfc3339Millis(const std::string& text) {
  const auto bad = [&] {
    return Status::InvalidArgument(
        fmt::format("timestamp '{}' is not RFC 3339 (YYYY-MM-DDTHH:MM:SS[.fff](Z|+HH:MM))", Clip(text)));
  };
  if (text.size() < 20 || text.size() > 35 || text[10] != 'T') return bad();
  std::string utc = text.substr(0, 19);
  utc[10] = ' ';
  auto seconds = ParseUtcTimestamp(utc);
  if (!seconds.ok()) return bad();
  size_t at = 19;
  int64_t millis = 0;
  if (text[at] == '.') {
    size_t digits = 0;
    while (at + 1 + digits < text.size() && text[at + 1 + digits] >= '0' && text[at + 1 + digits] <= '9')
      ++digits;
    if (digits < 1 || digits > 9) return bad();
    for (size_t i = 0; i < 3; ++i) millis = millis * 10 + (i < digits ? text[at + 1 + i] - '0' : 0);
    at += 1 + digits;
  }
  int64_t offset = 0;
  if (at + 1 == text.size() && text[at] == 'Z') {
    offset = 0;
  } else if (at + 6 == text.size() && (text[at] == '+' || text[at] == '-') && text[at + 3] == ':' &&
             AllDigits(text, at + 1, 2) && AllDigits(text, at + 4, 2)) {
    const int64_t oh = Digits(text, at + 1, 2), om = Digits(text, at + 4, 2);
    if (oh > 23 || om > 59) return bad();
    offset = (text[at] == '+' ? 1 : -1) * (oh * 3600 + om * 60);
  } else {
    return bad();
  }
  return (*seconds - offset) * 1000 + millis;
}

Result<ExportRead> ReadKubectlPods(const std::string& path, const ExportLimits& limits) {
  RETURN_IF_ERROR(CheckFileSize(path, limits));
  std::filebuf file;
  if (file.open(path, std::ios::in | std::ios::binary) == nullptr)
    return Status::IoError(fmt::format("{}: cannot open", path));
  BoundedBuf bounded(&file, limits.max_file_bytes);  // also when the size was unknown (a pipe)
  std::istream in(&bounded);
  ParseGuard guard{limits, {}, 0, false, false, false};
  json doc;
  try {
    doc = json::parse(in, [&guard](int depth, json::parse_event_t event, json& parsed) {
      return guard(depth, event, parsed);
    });
  } catch (const json::exception& e) {
    if (!guard.too_deep && !bounded.exceeded())
      return Status::InvalidArgument(
          fmt::format("{}: not JSON: {}", path, std::string(e.what()).substr(0, 256)));
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(fmt::format("{}: out of memory while reading the pods", path));
  }
  if (bounded.exceeded())
    return Status::InvalidArgument(
        fmt::format("{}: more than the {} bytes a job export may have", path, limits.max_file_bytes));
  if (guard.too_deep)
    return Status::InvalidArgument(
        fmt::format("{}: JSON nested deeper than {} levels", path, limits.max_json_depth));
  if (guard.too_long)
    return Status::InvalidArgument(
        fmt::format("{}: a key or string longer than {} bytes", path, limits.max_string_bytes));
  if (guard.too_many)
    return Status::ResourceExhausted(fmt::format("{}: more than {} pods", path, limits.max_jobs));
  if (!doc.is_object())
    return Status::InvalidArgument(
        fmt::format("{}: the top level is {}, not an object", path, doc.type_name()));
  ASSIGN_OR_RETURN(const json* kind, Field(doc, "kind", json::value_t::string, path, "kind"));
  const std::string top_kind = kind == nullptr ? std::string() : kind->get<std::string>();
  std::vector<const json*> pods;
  if (top_kind == "List" || top_kind == "PodList") {
    ASSIGN_OR_RETURN(const json* items, Field(doc, "items", json::value_t::array, path, "items"));
    if (items == nullptr)
      return Status::InvalidArgument(fmt::format("{}: a {} without items", path, top_kind));
    for (const json& item : *items) pods.push_back(&item);
  } else if (top_kind == "Pod") {
    pods.push_back(&doc);
  } else {
    return Status::InvalidArgument(fmt::format(
        "{}: kind '{}' is not List, PodList or Pod (kubectl get pods -A -o json)", path, Clip(top_kind)));
  }

  std::vector<ExportRow> rows;
  std::map<std::string, int64_t> skipped;
  std::unordered_map<std::string, size_t> seen;  // namespace/name -> index
  for (size_t i = 0; i < pods.size(); ++i) {
    const json& pod = *pods[i];
    std::string where =
        top_kind == "Pod" ? fmt::format("{}: the pod", path) : fmt::format("{}: items[{}]", path, i);
    const auto error = [&](const std::string& field, const std::string& what) {
      return Status::InvalidArgument(fmt::format("{}: {}: {}", where, field, what));
    };
    if (!pod.is_object())
      return Status::InvalidArgument(fmt::format("{} is {}, not an object", where, pod.type_name()));
    ASSIGN_OR_RETURN(const json* item_kind, Field(pod, "kind", json::value_t::string, where, "kind"));
    if (item_kind != nullptr && *item_kind != "Pod")
      return error("kind", fmt::format("'{}' is not Pod", Clip(item_kind->get<std::string>())));
    // Who and when.
    ASSIGN_OR_RETURN(const json* metadata, Field(pod, "metadata", json::value_t::object, where, "metadata"));
    if (metadata == nullptr) return error("metadata", "missing");
    const json* meta[3] = {};
    const char* meta_names[3] = {"name", "namespace", "creationTimestamp"};
    for (int k = 0; k < 3; ++k) {
      const std::string field = std::string("metadata.") + meta_names[k];
      ASSIGN_OR_RETURN(meta[k], Field(*metadata, meta_names[k], json::value_t::string, where, field));
      if (meta[k] == nullptr) return error(field, "missing");
    }
    const std::string& name = meta[0]->get_ref<const std::string&>();
    const std::string& ns = meta[1]->get_ref<const std::string&>();
    if (name.empty() || name.size() > 253 || !std::all_of(name.begin(), name.end(), [](char c) {
          return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                 c == '-' || c == '_';
        }))
      return error("metadata.name",
                   fmt::format("'{}' is not 1..253 characters of [A-Za-z0-9._-]", Clip(name)));
    if (!ValidClusterName(ns))
      return error("metadata.namespace",
                   fmt::format("'{}' is not 1..63 characters of [A-Za-z0-9_-]", Clip(ns)));
    const std::string full = ns + "/" + name;
    where += " (" + full + ")";
    if (auto [it, fresh] = seen.emplace(full, i); !fresh)
      return Status::InvalidArgument(fmt::format("{}: pod '{}' is also items[{}]", where, full, it->second));
    auto created = ParseRfc3339Millis(meta[2]->get_ref<const std::string&>());
    if (!created.ok()) return error("metadata.creationTimestamp", created.status().message());

    // What it asks for: Kubernetes' effective request over containers and init containers.
    ASSIGN_OR_RETURN(const json* spec, Field(pod, "spec", json::value_t::object, where, "spec"));
    if (spec == nullptr) return error("spec", "missing");
    Need sum, sidecars, init_max;
    const auto add = [&](Need& to, const Need& n) -> Status {
      to.cpu += n.cpu, to.memory += n.memory, to.gpus += n.gpus;
      if (to.cpu > kMaxUnits || to.memory > kMaxUnits || to.gpus > limits.max_gpus)
        return error("spec", fmt::format("asks for more than 2^40 mCPU or MiB, or more than {} GPUs",
                                         limits.max_gpus));
      return Status::Ok();
    };
    for (const char* list : {"containers", "initContainers"}) {
      const bool init = list[0] == 'i';
      ASSIGN_OR_RETURN(const json* containers,
                       Field(*spec, list, json::value_t::array, where, std::string("spec.") + list));
      if (containers == nullptr && !init) return error("spec.containers", "missing");
      if (containers == nullptr) continue;
      for (size_t j = 0; j < containers->size(); ++j) {
        const std::string field = fmt::format("spec.{}[{}]", list, j);
        ASSIGN_OR_RETURN(Need n, ContainerNeed((*containers)[j], where, field, limits));
        if (!init) {
          RETURN_IF_ERROR(add(sum, n));
          continue;
        }
        ASSIGN_OR_RETURN(const json* policy, Field((*containers)[j], "restartPolicy", json::value_t::string,
                                                   where, field + ".restartPolicy"));
        Need candidate = n;
        if (policy != nullptr && *policy == "Always") {  // a sidecar: runs beside what follows
          RETURN_IF_ERROR(add(sidecars, n));
          candidate = sidecars;
        } else {
          RETURN_IF_ERROR(add(candidate, sidecars));
        }
        init_max.cpu = std::max(init_max.cpu, candidate.cpu);
        init_max.memory = std::max(init_max.memory, candidate.memory);
        init_max.gpus = std::max(init_max.gpus, candidate.gpus);
      }
    }
    RETURN_IF_ERROR(add(sum, sidecars));
    const Need need{std::max(sum.cpu, init_max.cpu), std::max(sum.memory, init_max.memory),
                    std::max(sum.gpus, init_max.gpus)};

    // When it ran.
    ASSIGN_OR_RETURN(const json* status, Field(pod, "status", json::value_t::object, where, "status"));
    const json empty = json::object();
    if (status == nullptr) status = &empty;
    ASSIGN_OR_RETURN(const json* phase_field,
                     Field(*status, "phase", json::value_t::string, where, "status.phase"));
    const std::string phase = phase_field == nullptr ? std::string() : phase_field->get<std::string>();
    if (phase_field != nullptr && phase != "Pending" && phase != "Running" && phase != "Succeeded" &&
        phase != "Failed" && phase != "Unknown")
      return error("status.phase",
                   fmt::format("'{}' is not Pending, Running, Succeeded, Failed or Unknown", Clip(phase)));
    ASSIGN_OR_RETURN(const json* start_field,
                     Field(*status, "startTime", json::value_t::string, where, "status.startTime"));
    int64_t start = 0;
    if (start_field != nullptr) {
      auto t = ParseRfc3339Millis(start_field->get<std::string>());
      if (!t.ok()) return error("status.startTime", t.status().message());
      start = *t;
    }
    ASSIGN_OR_RETURN(const json* statuses, Field(*status, "containerStatuses", json::value_t::array, where,
                                                 "status.containerStatuses"));
    bool all_finished = statuses != nullptr && !statuses->empty();
    int64_t end = INT64_MIN;
    for (size_t j = 0; statuses != nullptr && j < statuses->size(); ++j) {
      const std::string field = fmt::format("status.containerStatuses[{}]", j);
      const json& cs = (*statuses)[j];
      if (!cs.is_object()) return error(field, fmt::format("is {}, not object", cs.type_name()));
      ASSIGN_OR_RETURN(const json* state, Field(cs, "state", json::value_t::object, where, field + ".state"));
      const json* terminated = nullptr;
      if (state != nullptr) {
        ASSIGN_OR_RETURN(terminated, Field(*state, "terminated", json::value_t::object, where,
                                           field + ".state.terminated"));
      }
      const json* finished = nullptr;
      if (terminated != nullptr) {
        ASSIGN_OR_RETURN(finished, Field(*terminated, "finishedAt", json::value_t::string, where,
                                         field + ".state.terminated.finishedAt"));
      }
      if (finished == nullptr) {
        all_finished = false;
        continue;
      }
      auto t = ParseRfc3339Millis(finished->get<std::string>());
      if (!t.ok()) return error(field + ".state.terminated.finishedAt", t.status().message());
      end = std::max(end, *t);
    }
    const bool ended = phase == "Succeeded" || phase == "Failed";
    const char* skip = need.gpus == 0              ? kSkipNoGpus
                       : start_field == nullptr    ? kSkipNeverStarted
                       : ended && end == INT64_MIN ? kSkipNoFinish
                       : !ended && !all_finished   ? kSkipStillRunning
                                                   : nullptr;
    if (skip != nullptr) {
      ++skipped[skip];
      continue;
    }
    if (end < start)
      return error("status", fmt::format("the last finishedAt is before startTime {}",
                                         start_field->get<std::string>()));
    const int64_t seconds = (end - start + 999) / 1000;
    if (seconds > limits.max_duration)
      return error("status", fmt::format("run time {} s is more than {} s", seconds, limits.max_duration));

    ExportRow row{*created, {}};
    TimedJob& t = row.second;
    t.name = full;
    t.duration = std::max<int64_t>(1, seconds);
    t.job.name = full;
    t.job.tenant = ns;
    t.job.queue = ns;
    TaskGroup g = WholeGpuGroup("pod", 1, static_cast<int>(need.gpus));
    g.request.cpu = MilliCpu(need.cpu);
    g.request.memory = MiB(need.memory);
    t.job.groups.push_back(std::move(g));
    rows.push_back(std::move(row));
  }
  return Finish(std::move(rows), std::move(skipped), path, 1000);
}

}  // namespace gpupool
