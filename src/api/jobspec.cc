#include "api/jobspec.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <exception>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "api/fields.h"
#include "api/spec_text.h"
#include "common/image_source.h"

namespace gpupool {

namespace {

using api_internal::AllDigits;
using api_internal::CheckName;
using api_internal::DescribeValue;
using api_internal::FieldError;
using api_internal::FieldPath;
using api_internal::FormatNumber;
using api_internal::IndexPath;
using api_internal::IsLabelKey;
using api_internal::IsLabelValue;
using api_internal::IsPathSafeKey;
using api_internal::IsValidUtf8;
using api_internal::Json;
using api_internal::ObjectFields;
using api_internal::ParseJsonText;
using api_internal::ParseYamlText;
using api_internal::PrintableUtf8;
using api_internal::Quote;
using api_internal::ReadArray;
using api_internal::ReadBool;
using api_internal::ReadCpu;
using api_internal::ReadInt;
using api_internal::ReadLabels;
using api_internal::ReadMemory;
using api_internal::ReadName;
using api_internal::ReadNumber;
using api_internal::ReadString;

// ---- tree -> Job ----------------------------------------------------------------------------

constexpr int kMinPriority = -1000000;
constexpr int kMaxPriority = 1000000;
constexpr size_t kMaxGpuModelBytes = 128;
constexpr size_t kMaxEnvNameBytes = 256;
constexpr size_t kMaxLabelKeyBytes = 253 + 1 + 63;  // DNS prefix, '/', name
constexpr size_t kMaxLabelValueBytes = 63;
constexpr size_t kMaxVolumes = 32;

// Environment variable names, as Kubernetes allows them: [-._a-zA-Z][-._a-zA-Z0-9]*.
bool IsEnvName(std::string_view s) {
  if (s.empty() || s.size() > kMaxEnvNameBytes) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '-' || c == '.';
    if (!(alpha || (i > 0 && c >= '0' && c <= '9'))) return false;
  }
  return true;
}

// "3g", "3g.40gb", "1g.10gb+me": the shapes GpuCatalog's MIG profile names take. Whether a node's
// GPU offers the profile is the scheduler's question.
bool IsMigProfileName(std::string_view s) {
  if (s.size() < 2 || s[0] < '1' || s[0] > '7' || s[1] != 'g') return false;
  if (s.size() == 2) return true;
  if (s[2] != '.') return false;
  std::string_view rest = s.substr(3);
  if (rest.size() >= 3 && rest.substr(rest.size() - 3) == "+me") rest.remove_suffix(3);
  if (rest.size() < 3 || rest.substr(rest.size() - 2) != "gb") return false;
  const std::string_view digits = rest.substr(0, rest.size() - 2);
  return !digits.empty() && digits.size() <= 4 && AllDigits(digits);
}

constexpr int64_t kMaxTimeLimitSeconds = 365LL * 86400;
constexpr size_t kMaxDependencies = 64;

// "j-" and 1-20 digits: the server's job ids.
bool IsJobId(std::string_view s) {
  if (s.size() < 3 || s.size() > 22 || s.substr(0, 2) != "j-") return false;
  return std::all_of(s.begin() + 2, s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// A duration: whole seconds, or a string of <number><unit> parts, units d, h, m, s ("1h30m",
// "90m", "45s", "2d"); between min and max seconds.
Result<int64_t> ReadDuration(const Json& v, const std::string& path, int64_t min, int64_t max) {
  const std::string range = fmt::format("between {} s and {} s", min, max);
  if (v.is_number_integer()) {
    ASSIGN_OR_RETURN(int64_t n, ReadInt(v, path, min, max));
    return n;
  }
  if (!v.is_string())
    return FieldError(path, fmt::format("expected seconds or a duration such as \"1h30m\", got {}", DescribeValue(v)));
  const std::string& s = v.get_ref<const std::string&>();
  if (s.empty() || s.size() > 32) return FieldError(path, fmt::format("expected a duration such as \"1h30m\", got {}", Quote(s)));
  int64_t total = 0;
  size_t i = 0;
  std::string units_seen;
  while (i < s.size()) {
    size_t start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    if (i == start || i - start > 9 || i == s.size())
      return FieldError(path, fmt::format("expected a duration such as \"1h30m\", got {}", Quote(s)));
    const int64_t n = std::stoll(s.substr(start, i - start));
    const char unit = s[i++];
    const int64_t scale = unit == 'd' ? 86400 : unit == 'h' ? 3600 : unit == 'm' ? 60 : unit == 's' ? 1 : 0;
    if (scale == 0 || units_seen.find(unit) != std::string::npos)
      return FieldError(path, fmt::format("expected a duration such as \"1h30m\" (units d, h, m, s, each once), got {}", Quote(s)));
    units_seen.push_back(unit);
    total += n * scale;
    if (total > max) return FieldError(path, fmt::format("must be {}, got {}", range, Quote(s)));
  }
  if (total < min) return FieldError(path, fmt::format("must be {}, got {}", range, Quote(s)));
  return total;
}

Result<std::string> ReadAbsolutePath(const Json& v, const std::string& path, const JobSpecLimits& limits) {
  ASSIGN_OR_RETURN(std::string s, ReadString(v, path, limits.max_string_bytes));
  if (s.empty() || s.front() != '/')
    return FieldError(path, fmt::format("must be an absolute path, got {}", Quote(s)));
  return s;
}

// resources: {cpu, memory, gpu, gpuMemory, gpuModels, migProfile, gpuInterconnect}.
Status ReadResources(const Json& v, const std::string& path, const JobSpecLimits& limits, TaskRequest* r) {
  ASSIGN_OR_RETURN(
      ObjectFields f,
      ObjectFields::Read(v, path,
                         {"cpu", "memory", "gpu", "gpuMemory", "gpuModels", "migProfile", "gpuInterconnect"}));
  if (const Json* cpu = f.Get("cpu")) {
    ASSIGN_OR_RETURN(r->cpu, ReadCpu(*cpu, f.Path("cpu"), MilliCpu(limits.max_cpu_milli)));
  }
  if (const Json* memory = f.Get("memory")) {
    ASSIGN_OR_RETURN(r->memory, ReadMemory(*memory, f.Path("memory"), MiB(limits.max_memory_mib)));
  }

  const Json* gpu_field = f.Get("gpu");
  double gpu = 0;
  if (gpu_field != nullptr) {
    ASSIGN_OR_RETURN(gpu, ReadNumber(*gpu_field, f.Path("gpu")));
    if (gpu < 0)
      return FieldError(f.Path("gpu"), fmt::format("must not be negative, got {}", FormatNumber(gpu)));
  }
  if (const Json* mig = f.Get("migProfile")) {
    ASSIGN_OR_RETURN(r->mig_profile, ReadString(*mig, f.Path("migProfile"), limits.max_name_bytes));
    if (!IsMigProfileName(r->mig_profile)) {
      return FieldError(
          f.Path("migProfile"),
          fmt::format("must be a MIG profile such as \"3g.40gb\", \"1g.10gb+me\" or \"3g\", got {}",
                      Quote(r->mig_profile)));
    }
    if (gpu_field != nullptr && gpu != 1) {
      return FieldError(
          f.Path("gpu"),
          fmt::format("must be 1 or absent with migProfile (one MIG instance), got {}", FormatNumber(gpu)));
    }
    if (f.Has("gpuMemory")) {
      return FieldError(f.Path("gpuMemory"),
                        "cannot be combined with migProfile (the profile sets the memory)");
    }
    r->gpu_count = 1;
    r->gpu_share = MilliGpu(0);
  } else if (gpu == 0) {
    r->gpu_count = 0;
  } else if (gpu < 1) {
    const auto share = static_cast<int64_t>(std::llround(gpu * 1000.0));
    if (share < 1) {
      return FieldError(f.Path("gpu"),
                        fmt::format("a share of a GPU must be at least 0.001, got {}", FormatNumber(gpu)));
    }
    r->gpu_count = 1;
    r->gpu_share = MilliGpu(std::min<int64_t>(share, kWholeGpu.units()));
  } else {
    if (gpu != std::floor(gpu)) {
      return FieldError(f.Path("gpu"),
                        fmt::format("must be below 1 (a share of one GPU) or a whole number of GPUs, got {}",
                                    FormatNumber(gpu)));
    }
    if (gpu > limits.max_gpus_per_task) {
      return FieldError(f.Path("gpu"), fmt::format("must be at most {} GPUs, got {}",
                                                   limits.max_gpus_per_task, FormatNumber(gpu)));
    }
    r->gpu_count = static_cast<int>(gpu);
    r->gpu_share = kWholeGpu;
  }

  if (const Json* gpu_memory = f.Get("gpuMemory")) {
    if (!r->wants_gpu()) {
      return FieldError(f.Path("gpuMemory"), "needs gpu: GPU memory is reserved on the task's GPUs");
    }
    ASSIGN_OR_RETURN(r->gpu_memory,
                     ReadMemory(*gpu_memory, f.Path("gpuMemory"), MiB(limits.max_gpu_memory_mib)));
  }
  if (const Json* models = f.Get("gpuModels")) {
    const std::string mpath = f.Path("gpuModels");
    if (!r->wants_gpu()) return FieldError(mpath, "needs gpu or migProfile");
    ASSIGN_OR_RETURN(const Json::array_t* list,
                     ReadArray(*models, mpath, static_cast<size_t>(limits.max_gpu_models)));
    for (size_t i = 0; i < list->size(); ++i) {
      ASSIGN_OR_RETURN(std::string model, ReadString((*list)[i], IndexPath(mpath, i), kMaxGpuModelBytes));
      if (model.empty()) return FieldError(IndexPath(mpath, i), "must not be empty");
      r->gpu_models.push_back(std::move(model));
    }
  }
  if (const Json* link = f.Get("gpuInterconnect")) {
    const std::string lpath = f.Path("gpuInterconnect");
    ASSIGN_OR_RETURN(const std::string value, ReadString(*link, lpath, limits.max_name_bytes));
    if (value != "any" && value != "nvlink") {
      return FieldError(lpath, fmt::format("must be \"any\" or \"nvlink\", got {}", Quote(value)));
    }
    r->nvlink = value == "nvlink";
    if (r->nvlink && (r->gpu_count < 2 || r->wants_mig())) {
      return FieldError(lpath, fmt::format("\"nvlink\" needs gpu of 2 or more (the link joins the task's GPUs), got {}",
                                           r->wants_mig() ? std::string("a MIG profile") : FormatNumber(gpu)));
    }
  }
  return Status::Ok();
}

// The isolation rules are the model's (DefaultIsolation, CheckIsolation in model/workload.h),
// shared with the Kubernetes pod reader; here they get the field's path.
Status CheckIsolation(const TaskGroup& g, const std::string& path) {
  if (Status st = gpupool::CheckIsolation(g.request, g.exec.isolation); !st.ok()) return FieldError(path, st.message());
  return Status::Ok();
}

// A path a mount lands on: absolute and in its simplest spelling (no "//", ".", ".." or trailing
// "/"), so that two spellings of one place are seen as one, and none of the container's own.
Result<std::string> ReadMountPath(const Json& v, const std::string& path, const JobSpecLimits& limits) {
  ASSIGN_OR_RETURN(std::string s, ReadAbsolutePath(v, path, limits));
  if (s == "/") return FieldError(path, "must not be the container's root");
  if (s.back() == '/' || s.find("//") != std::string::npos || s.find("/./") != std::string::npos ||
      s.find("/../") != std::string::npos || s.ends_with("/.") || s.ends_with("/.."))
    return FieldError(path, fmt::format("must be a normalised path (no '//', '.', '..' or trailing '/'), got {}",
                                        Quote(s)));
  for (const char* own : {"/proc", "/sys", "/dev"}) {
    const std::string_view o(own);
    if (s == o || (s.starts_with(o) && s[o.size()] == '/'))
      return FieldError(path, fmt::format("must not be under {}: the runtime mounts it", own));
  }
  return s;
}

// Whether one of two normalised paths is the other or lies under it.
bool Nested(std::string_view a, std::string_view b) {
  if (a.size() > b.size()) std::swap(a, b);
  return b.starts_with(a) && (b.size() == a.size() || b[a.size()] == '/');
}

// volumes: [{mountPath, hostPath, readOnly} | {mountPath, scratch: {medium, sizeLimit}}]. Containers
// only: a process task sees the host's files where they are.
Status ReadVolumes(const Json& v, const std::string& path, const JobSpecLimits& limits, TaskExec* exec) {
  ASSIGN_OR_RETURN(const Json::array_t* list, ReadArray(v, path, kMaxVolumes));
  if (!list->empty() && exec->image.empty() && exec->bundle.empty() && exec->rootfs.empty())
    return FieldError(path, "need a container (image, rootfs or bundle): a process task sees the host's files");
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string vpath = IndexPath(path, i);
    ASSIGN_OR_RETURN(ObjectFields f, ObjectFields::Read((*list)[i], vpath, {"mountPath", "hostPath", "readOnly",
                                                                            "scratch"}));
    Volume vol;
    if (f.Has("hostPath") == f.Has("scratch")) return FieldError(vpath, "takes one of hostPath or scratch");
    if (const Json* host = f.Get("hostPath")) {
      ASSIGN_OR_RETURN(vol.host_path, ReadMountPath(*host, f.Path("hostPath"), limits));
      vol.mount_path = vol.host_path;
      if (const Json* ro = f.Get("readOnly")) {
        ASSIGN_OR_RETURN(vol.read_only, ReadBool(*ro, f.Path("readOnly")));
      }
    } else {
      if (f.Has("readOnly")) return FieldError(f.Path("readOnly"), "is for hostPath volumes (scratch is writable)");
      vol.read_only = false;
      ASSIGN_OR_RETURN(ObjectFields sc, ObjectFields::Read(*f.Get("scratch"), f.Path("scratch"),
                                                           {"medium", "sizeLimit"}));
      if (const Json* medium = sc.Get("medium")) {
        ASSIGN_OR_RETURN(std::string m, ReadString(*medium, sc.Path("medium"), 16));
        if (m != "disk" && m != "memory") return FieldError(sc.Path("medium"), "must be disk or memory");
        vol.memory = m == "memory";
      }
      if (const Json* size = sc.Get("sizeLimit")) {
        // Memory scratch is bounded by what a task may ask of memory; disk scratch by 64 TiB.
        constexpr int64_t kMaxDiskScratchMiB = int64_t{64} << 20;
        ASSIGN_OR_RETURN(MiB mib, ReadMemory(*size, sc.Path("sizeLimit"),
                                             MiB(vol.memory ? limits.max_memory_mib : kMaxDiskScratchMiB)));
        if (mib.units() < 1) return FieldError(sc.Path("sizeLimit"), "must be at least 1Mi");
        vol.size_bytes = mib.units() * 1024 * 1024;
      } else if (vol.memory) {
        return FieldError(sc.Path("sizeLimit"), "is required for medium: memory");
      }
      if (!f.Has("mountPath")) return FieldError(f.Path("mountPath"), "is required for scratch");
    }
    if (const Json* mount = f.Get("mountPath")) {
      ASSIGN_OR_RETURN(vol.mount_path, ReadMountPath(*mount, f.Path("mountPath"), limits));
    }
    if (!exec->checkpoint.dir.empty() && Nested(vol.mount_path, exec->checkpoint.dir))
      return FieldError(f.Path("mountPath"), fmt::format("{} overlaps the checkpoint directory {} (mounted by gpupool)",
                                                         Quote(vol.mount_path), Quote(exec->checkpoint.dir)));
    for (const Volume& other : exec->volumes) {
      if (other.mount_path == vol.mount_path)
        return FieldError(f.Path("mountPath"), fmt::format("{} is mounted twice", Quote(vol.mount_path)));
    }
    exec->volumes.push_back(std::move(vol));
  }
  return Status::Ok();
}

Status ReadTask(const Json& v, const std::string& path, QosClass qos, const JobSpecLimits& limits,
                TaskGroup* g) {
  ASSIGN_OR_RETURN(ObjectFields f, ObjectFields::Read(v, path,
                                                      {"name", "replicas", "resources", "isolation",
                                                       "framework", "command", "env", "workingDir",
                                                       "container", "checkpoint", "volumes"}));
  const Json* name = f.Get("name");
  if (name == nullptr) return FieldError(f.Path("name"), "is required");
  ASSIGN_OR_RETURN(g->name, ReadName(*name, f.Path("name"), limits.max_name_bytes));
  if (const Json* replicas = f.Get("replicas")) {
    ASSIGN_OR_RETURN(int64_t n, ReadInt(*replicas, f.Path("replicas"), 1, limits.max_tasks));
    g->replicas = static_cast<int>(n);
  }
  if (const Json* resources = f.Get("resources")) {
    RETURN_IF_ERROR(ReadResources(*resources, f.Path("resources"), limits, &g->request));
  }
  if (const Json* isolation = f.Get("isolation")) {
    ASSIGN_OR_RETURN(std::string mode, ReadString(*isolation, f.Path("isolation"), limits.max_name_bytes));
    Result<IsolationMode> parsed = ParseIsolationMode(mode);
    if (!parsed.ok()) {
      return FieldError(f.Path("isolation"),
                        fmt::format("must be exclusive, mps, mig or timeslice, got {}", Quote(mode)));
    }
    g->exec.isolation = *parsed;
  } else {
    g->exec.isolation = DefaultIsolation(g->request, qos);
  }
  RETURN_IF_ERROR(CheckIsolation(*g, f.Path("isolation")));
  if (const Json* framework = f.Get("framework")) {
    ASSIGN_OR_RETURN(std::string fw, ReadString(*framework, f.Path("framework"), limits.max_name_bytes));
    Result<Framework> parsed = ParseFramework(fw);
    if (!parsed.ok())
      return FieldError(f.Path("framework"), fmt::format("{}, got {}", parsed.status().message(), Quote(fw)));
    g->exec.framework = *parsed;
  }

  if (const Json* command = f.Get("command")) {
    const std::string cpath = f.Path("command");
    ASSIGN_OR_RETURN(const Json::array_t* args,
                     ReadArray(*command, cpath, static_cast<size_t>(limits.max_command_args)));
    for (size_t i = 0; i < args->size(); ++i) {
      ASSIGN_OR_RETURN(std::string arg, ReadString((*args)[i], IndexPath(cpath, i), limits.max_string_bytes));
      g->exec.command.push_back(std::move(arg));
    }
  }
  if (const Json* env = f.Get("env")) {
    const std::string epath = f.Path("env");
    if (!env->is_object())
      return FieldError(epath, fmt::format("expected an object of names to strings, got {}",
                                           api_internal::JsonTypeName(*env)));
    if (env->size() > static_cast<size_t>(limits.max_env)) {
      return FieldError(epath,
                        fmt::format("has {} entries, over the limit of {}", env->size(), limits.max_env));
    }
    for (const auto& [key, value] : env->items()) {
      if (!IsEnvName(key)) {
        return FieldError(epath, fmt::format("variable name {} must be letters, digits, '_', '-' or '.', not "
                                             "starting with a digit",
                                             Quote(key)));
      }
      const std::string vpath = IsPathSafeKey(key) ? FieldPath(epath, key) : epath;
      // The agent sets these to enforce the allocation (docs/agent.md); a job may not.
      if (key.rfind("GPUPOOL_", 0) == 0 || key.rfind("CUDA_MPS_", 0) == 0 || key == "CUDA_VISIBLE_DEVICES" ||
          key == "NVIDIA_VISIBLE_DEVICES") {
        return FieldError(vpath, "is set by gpupool to enforce the task's allocation; a job may not set it");
      }
      ASSIGN_OR_RETURN(std::string s, ReadString(value, vpath, limits.max_string_bytes));
      g->exec.env.emplace(key, std::move(s));
    }
  }
  if (const Json* dir = f.Get("workingDir")) {
    ASSIGN_OR_RETURN(g->exec.working_dir, ReadAbsolutePath(*dir, f.Path("workingDir"), limits));
  }
  if (const Json* container = f.Get("container")) {
    ASSIGN_OR_RETURN(ObjectFields c,
                     ObjectFields::Read(*container, f.Path("container"),
                                        {"image", "bundle", "rootfs", "network", "runtimeClass"}));
    const int roots = int{c.Has("image")} + int{c.Has("bundle")} + int{c.Has("rootfs")};
    if (roots > 1) return FieldError(c.path(), "takes one of image, bundle or rootfs");
    if (roots == 0) return FieldError(c.path(), "needs an image, a bundle or a rootfs");
    if (const Json* image = c.Get("image")) {
      ASSIGN_OR_RETURN(std::string text, ReadString(*image, c.Path("image"), kMaxImageSourceBytes));
      auto source = ParseImageSource(text);
      if (!source.ok()) return FieldError(c.Path("image"), source.status().message());
      g->exec.image = source->ToString();
    }
    if (const Json* rc = c.Get("runtimeClass")) {
      ASSIGN_OR_RETURN(std::string cls, ReadString(*rc, c.Path("runtimeClass"), 16));
      if (cls != "runc" && cls != "crun" && cls != "runsc" && cls != "kata")
        return FieldError(c.Path("runtimeClass"), "must be runc, crun, runsc or kata");
      if (cls != "runc") g->exec.runtime_class = cls;
    }
    if (const Json* network = c.Get("network")) {
      ASSIGN_OR_RETURN(std::string n, ReadString(*network, c.Path("network"), 16));
      if (n != "none" && n != "host" && n != "pod") return FieldError(c.Path("network"), "must be none, pod or host");
      if (n != "none") g->exec.network = n;
    }
    if (const Json* bundle = c.Get("bundle")) {
      ASSIGN_OR_RETURN(g->exec.bundle, ReadAbsolutePath(*bundle, c.Path("bundle"), limits));
    }
    if (const Json* rootfs = c.Get("rootfs")) {
      ASSIGN_OR_RETURN(g->exec.rootfs, ReadAbsolutePath(*rootfs, c.Path("rootfs"), limits));
    }
  }
  if (const Json* checkpoint = f.Get("checkpoint")) {
    ASSIGN_OR_RETURN(ObjectFields c,
                     ObjectFields::Read(*checkpoint, f.Path("checkpoint"), {"dir", "intervalSeconds"}));
    if (const Json* dir = c.Get("dir")) {
      ASSIGN_OR_RETURN(g->exec.checkpoint.dir, ReadAbsolutePath(*dir, c.Path("dir"), limits));
    }
    if (const Json* interval = c.Get("intervalSeconds")) {
      ASSIGN_OR_RETURN(int64_t seconds, ReadInt(*interval, c.Path("intervalSeconds"), 0,
                                                limits.max_checkpoint_interval_seconds));
      g->exec.checkpoint.interval_seconds = static_cast<int>(seconds);
    }
    if (g->exec.checkpoint.interval_seconds > 0 && g->exec.checkpoint.dir.empty()) {
      return FieldError(c.Path("dir"), "is required when intervalSeconds is set");
    }
  }
  if (const Json* volumes = f.Get("volumes")) {
    RETURN_IF_ERROR(ReadVolumes(*volumes, f.Path("volumes"), limits, &g->exec));
  }
  return Status::Ok();
}

// A list of label sets (togetherWith, apartFrom); each set must name at least one label.
Result<std::vector<std::map<std::string, std::string>>> ReadLabelTerms(const Json& v, const std::string& path,
                                                                       const JobSpecLimits& limits) {
  ASSIGN_OR_RETURN(const Json::array_t* terms,
                   ReadArray(v, path, static_cast<size_t>(limits.max_affinity_terms)));
  std::vector<std::map<std::string, std::string>> out;
  for (size_t i = 0; i < terms->size(); ++i) {
    const std::string tpath = IndexPath(path, i);
    ASSIGN_OR_RETURN(auto labels, ReadLabels((*terms)[i], tpath, static_cast<size_t>(limits.max_labels)));
    if (labels.empty()) return FieldError(tpath, "must name at least one label");
    out.push_back(std::move(labels));
  }
  return out;
}

Status ReadAffinity(const Json& v, const std::string& path, const JobSpecLimits& limits, Affinity* a) {
  ASSIGN_OR_RETURN(
      ObjectFields f,
      ObjectFields::Read(v, path, {"nodeSelector", "nodeAffinity", "togetherWith", "apartFrom"}));
  const auto max_terms = static_cast<size_t>(limits.max_affinity_terms);
  if (const Json* selector = f.Get("nodeSelector")) {
    ASSIGN_OR_RETURN(auto labels, ReadLabels(*selector, f.Path("nodeSelector"), max_terms));
    for (auto& [key, value] : labels)
      a->node.push_back(LabelRequirement{key, LabelRequirement::Op::kIn, {value}});
  }
  if (const Json* node_affinity = f.Get("nodeAffinity")) {
    const std::string npath = f.Path("nodeAffinity");
    ASSIGN_OR_RETURN(const Json::array_t* reqs, ReadArray(*node_affinity, npath, max_terms));
    if (a->node.size() + reqs->size() > max_terms) {
      return FieldError(npath, fmt::format("with nodeSelector makes {} requirements, over the limit of {}",
                                           a->node.size() + reqs->size(), max_terms));
    }
    for (size_t i = 0; i < reqs->size(); ++i) {
      ASSIGN_OR_RETURN(ObjectFields r,
                       ObjectFields::Read((*reqs)[i], IndexPath(npath, i), {"key", "operator", "values"}));
      LabelRequirement req;
      const Json* key = r.Get("key");
      if (key == nullptr) return FieldError(r.Path("key"), "is required");
      ASSIGN_OR_RETURN(req.key, ReadString(*key, r.Path("key"), kMaxLabelKeyBytes));
      if (!IsLabelKey(req.key)) {
        return FieldError(r.Path("key"), fmt::format("{} is not a label name", Quote(req.key)));
      }
      const Json* op = r.Get("operator");
      if (op == nullptr)
        return FieldError(r.Path("operator"), "is required (In, NotIn, Exists or DoesNotExist)");
      ASSIGN_OR_RETURN(std::string op_name, ReadString(*op, r.Path("operator"), limits.max_name_bytes));
      Result<LabelRequirement::Op> parsed = ParseLabelOp(op_name);
      if (!parsed.ok()) {
        return FieldError(r.Path("operator"),
                          fmt::format("must be In, NotIn, Exists or DoesNotExist, got {}", Quote(op_name)));
      }
      req.op = *parsed;
      if (const Json* values = r.Get("values")) {
        const std::string vpath = r.Path("values");
        ASSIGN_OR_RETURN(const Json::array_t* list,
                         ReadArray(*values, vpath, static_cast<size_t>(limits.max_affinity_values)));
        for (size_t k = 0; k < list->size(); ++k) {
          ASSIGN_OR_RETURN(std::string value,
                           ReadString((*list)[k], IndexPath(vpath, k), kMaxLabelValueBytes));
          if (!IsLabelValue(value)) {
            return FieldError(IndexPath(vpath, k), fmt::format("{} is not a label value", Quote(value)));
          }
          req.values.push_back(std::move(value));
        }
      }
      const bool set_op = req.op == LabelRequirement::Op::kIn || req.op == LabelRequirement::Op::kNotIn;
      if (set_op && req.values.empty()) {
        return FieldError(r.Path("values"), fmt::format("{} needs at least one value", op_name));
      }
      if (!set_op && !req.values.empty())
        return FieldError(r.Path("values"), fmt::format("{} takes no values", op_name));
      a->node.push_back(std::move(req));
    }
  }
  if (const Json* together = f.Get("togetherWith")) {
    ASSIGN_OR_RETURN(a->together_with, ReadLabelTerms(*together, f.Path("togetherWith"), limits));
  }
  if (const Json* apart = f.Get("apartFrom")) {
    ASSIGN_OR_RETURN(a->apart_from, ReadLabelTerms(*apart, f.Path("apartFrom"), limits));
  }
  return Status::Ok();
}

// ValidateJob backs up the checks above; they should leave it nothing to find. Should it find
// something anyway, point at the task group it names (or the job) and keep its words.
Status FromValidateJob(const Status& st, const Job& job) {
  std::string message = st.message();
  const std::string job_prefix = fmt::format("job '{}': ", job.name);
  if (message.rfind(job_prefix, 0) == 0) message = message.substr(job_prefix.size());
  for (size_t i = 0; i < job.groups.size(); ++i) {
    const std::string group_prefix = fmt::format("task group '{}': ", job.groups[i].name);
    if (message.rfind(group_prefix, 0) == 0) {
      return FieldError(IndexPath("tasks", i), message.substr(group_prefix.size()));
    }
  }
  if (message.find("minAvailable") != std::string::npos) return FieldError("gang.minAvailable", message);
  if (message.find("affinity") != std::string::npos) return FieldError("affinity", message);
  return FieldError("", message);
}

Result<Job> ReadJob(const Json& root, const JobSpecLimits& limits) {
  ASSIGN_OR_RETURN(ObjectFields f, ObjectFields::Read(root, "",
                                                      {"name", "tenant", "queue", "priority", "qos", "labels",
                                                       "gang", "affinity", "tasks", "retry", "timeLimit",
                                                       "dependsOn"}));
  Job job;
  const Json* name = f.Get("name");
  if (name == nullptr) return FieldError("name", "is required");
  ASSIGN_OR_RETURN(job.name, ReadName(*name, "name", limits.max_name_bytes));
  if (const Json* tenant = f.Get("tenant")) {
    ASSIGN_OR_RETURN(job.tenant, ReadName(*tenant, "tenant", limits.max_name_bytes));
  }
  if (const Json* queue = f.Get("queue")) {
    ASSIGN_OR_RETURN(job.queue, ReadName(*queue, "queue", limits.max_name_bytes));
  }
  if (const Json* priority = f.Get("priority")) {
    ASSIGN_OR_RETURN(int64_t p, ReadInt(*priority, "priority", kMinPriority, kMaxPriority));
    job.priority = static_cast<int>(p);
  }
  if (const Json* qos = f.Get("qos")) {
    ASSIGN_OR_RETURN(std::string qos_name, ReadString(*qos, "qos", limits.max_name_bytes));
    Result<QosClass> parsed = ParseQosClass(qos_name);
    if (!parsed.ok()) {
      return FieldError("qos",
                        fmt::format("must be guaranteed, burstable or best-effort, got {}", Quote(qos_name)));
    }
    job.qos = *parsed;
  }
  if (const Json* labels = f.Get("labels")) {
    ASSIGN_OR_RETURN(job.labels, ReadLabels(*labels, "labels", static_cast<size_t>(limits.max_labels)));
  }

  const Json* tasks = f.Get("tasks");
  if (tasks == nullptr) return FieldError("tasks", "is required");
  ASSIGN_OR_RETURN(const Json::array_t* groups,
                   ReadArray(*tasks, "tasks", static_cast<size_t>(limits.max_task_groups)));
  if (groups->empty()) return FieldError("tasks", "must have at least one task");
  int64_t total = 0;
  for (size_t i = 0; i < groups->size(); ++i) {
    const std::string path = IndexPath("tasks", i);
    TaskGroup g;
    RETURN_IF_ERROR(ReadTask((*groups)[i], path, job.qos, limits, &g));
    for (size_t k = 0; k < job.groups.size(); ++k) {
      if (job.groups[k].name == g.name) {
        return FieldError(FieldPath(path, "name"),
                          fmt::format("{} is also the name of tasks[{}]", Quote(g.name), k));
      }
    }
    total += g.replicas;
    if (total > limits.max_tasks) {
      return FieldError(
          FieldPath(path, "replicas"),
          fmt::format("brings the job to {} tasks, over the limit of {}", total, limits.max_tasks));
    }
    job.groups.push_back(std::move(g));
  }

  if (const Json* gang = f.Get("gang")) {
    ASSIGN_OR_RETURN(ObjectFields g, ObjectFields::Read(*gang, "gang", {"minAvailable"}));
    if (const Json* min_available = g.Get("minAvailable")) {
      const int count = job.task_count();
      Result<int64_t> n = ReadInt(*min_available, g.Path("minAvailable"), 1, count);
      if (!n.ok()) {
        if (!min_available->is_number()) return n.status();
        return FieldError(g.Path("minAvailable"),
                          fmt::format("must be between 1 and the task count {}, got {}", count,
                                      DescribeValue(*min_available)));
      }
      // All tasks is stored as 0, the model's spelling of "the whole job".
      job.min_available = *n == count ? 0 : static_cast<int>(*n);
    }
  }
  if (const Json* affinity = f.Get("affinity")) {
    RETURN_IF_ERROR(ReadAffinity(*affinity, "affinity", limits, &job.affinity));
  }
  if (const Json* retry = f.Get("retry")) {
    ASSIGN_OR_RETURN(ObjectFields r, ObjectFields::Read(*retry, "retry",
                                                        {"maxRestarts", "backoffSeconds", "maxBackoffSeconds",
                                                         "onFailure"}));
    if (const Json* v = r.Get("maxRestarts")) {
      ASSIGN_OR_RETURN(int64_t n, ReadInt(*v, r.Path("maxRestarts"), 0, 10000));
      job.retry.max_restarts = static_cast<int>(n);
    }
    if (const Json* v = r.Get("backoffSeconds")) {
      ASSIGN_OR_RETURN(int64_t n, ReadInt(*v, r.Path("backoffSeconds"), 0, 86400));
      job.retry.backoff_seconds = static_cast<int>(n);
    }
    if (const Json* v = r.Get("maxBackoffSeconds")) {
      ASSIGN_OR_RETURN(int64_t n, ReadInt(*v, r.Path("maxBackoffSeconds"), 0, 7 * 86400));
      job.retry.max_backoff_seconds = static_cast<int>(n);
    }
    if (const Json* v = r.Get("onFailure")) {
      if (!v->is_boolean())
        return FieldError(r.Path("onFailure"), fmt::format("must be true or false, got {}", DescribeValue(*v)));
      job.retry.on_failure = v->get<bool>();
    }
    if (job.retry.max_backoff_seconds < job.retry.backoff_seconds) {
      return FieldError(r.Path("maxBackoffSeconds"),
                        fmt::format("must be at least backoffSeconds ({}), got {}", job.retry.backoff_seconds,
                                    job.retry.max_backoff_seconds));
    }
  }

  if (const Json* limit = f.Get("timeLimit")) {
    ASSIGN_OR_RETURN(job.time_limit_seconds, ReadDuration(*limit, "timeLimit", 1, kMaxTimeLimitSeconds));
  }
  if (const Json* deps = f.Get("dependsOn")) {
    ASSIGN_OR_RETURN(const Json::array_t* items, ReadArray(*deps, "dependsOn", kMaxDependencies));
    for (size_t i = 0; i < items->size(); ++i) {
      const std::string dpath = IndexPath("dependsOn", i);
      ASSIGN_OR_RETURN(ObjectFields d, ObjectFields::Read((*items)[i], dpath, {"job", "condition"}));
      Dependency dep;
      const Json* id = d.Get("job");
      if (id == nullptr) return FieldError(d.Path("job"), "is required");
      ASSIGN_OR_RETURN(dep.job, ReadString(*id, d.Path("job"), 64));
      if (!IsJobId(dep.job)) return FieldError(d.Path("job"), fmt::format("must be a job id (j-000000000042), got {}", Quote(dep.job)));
      if (const Json* c = d.Get("condition")) {
        ASSIGN_OR_RETURN(std::string cond, ReadString(*c, d.Path("condition"), limits.max_name_bytes));
        if (cond == "succeeded") {
          dep.condition = Dependency::Condition::kSucceeded;
        } else if (cond == "ended") {
          dep.condition = Dependency::Condition::kEnded;
        } else {
          return FieldError(d.Path("condition"), fmt::format("must be succeeded or ended, got {}", Quote(cond)));
        }
      }
      for (size_t k = 0; k < job.depends_on.size(); ++k) {
        if (job.depends_on[k].job == dep.job)
          return FieldError(d.Path("job"), fmt::format("{} is also dependsOn[{}]", Quote(dep.job), k));
      }
      job.depends_on.push_back(std::move(dep));
    }
  }

  DeriveSharing(job);
  const Status valid = ValidateJob(job);
  if (!valid.ok()) return FromValidateJob(valid, job);
  return job;
}

// ---- Job -> canonical tree ------------------------------------------------------------------

Json LabelsJson(const std::map<std::string, std::string>& labels) {
  Json out = Json::object();
  for (const auto& [k, v] : labels) out[k] = v;
  return out;
}

Json GpuJson(const TaskRequest& r) {
  if (!r.wants_gpu()) return 0;
  if (r.wants_mig()) return 1;
  if (r.gpu_share < kWholeGpu) return static_cast<double>(r.gpu_share.units()) / 1000.0;
  return r.gpu_count;
}

Json TaskJson(const TaskGroup& g) {
  const TaskRequest& r = g.request;
  Json resources = {{"cpu", FormatCpu(r.cpu)}, {"memory", FormatMemory(r.memory)}, {"gpu", GpuJson(r)}};
  if (!r.gpu_memory.is_zero()) resources["gpuMemory"] = FormatMemory(r.gpu_memory);
  if (!r.gpu_models.empty()) resources["gpuModels"] = r.gpu_models;
  if (r.wants_mig()) resources["migProfile"] = r.mig_profile;
  if (r.nvlink) resources["gpuInterconnect"] = "nvlink";

  Json task = {{"name", g.name},
               {"replicas", g.replicas},
               {"resources", std::move(resources)},
               {"isolation", IsolationModeName(g.exec.isolation)},
               {"command", Json::array()},
               {"env", LabelsJson(g.exec.env)}};
  if (g.exec.framework != Framework::kAuto) task["framework"] = FrameworkName(g.exec.framework);
  for (const auto& arg : g.exec.command) task["command"].push_back(arg);
  if (!g.exec.working_dir.empty()) task["workingDir"] = g.exec.working_dir;
  if (!g.exec.image.empty() || !g.exec.bundle.empty() || !g.exec.rootfs.empty()) {
    Json container = Json::object();
    if (!g.exec.image.empty()) container["image"] = g.exec.image;
    if (!g.exec.bundle.empty()) container["bundle"] = g.exec.bundle;
    if (!g.exec.rootfs.empty()) container["rootfs"] = g.exec.rootfs;
    if (!g.exec.network.empty()) container["network"] = g.exec.network;
    if (!g.exec.runtime_class.empty()) container["runtimeClass"] = g.exec.runtime_class;
    task["container"] = std::move(container);
  }
  if (!g.exec.checkpoint.dir.empty() || g.exec.checkpoint.interval_seconds != 0) {
    task["checkpoint"] = {{"dir", g.exec.checkpoint.dir},
                          {"intervalSeconds", g.exec.checkpoint.interval_seconds}};
  }
  if (!g.exec.volumes.empty()) task["volumes"] = VolumesToJson(g.exec.volumes);
  return task;
}

}  // namespace

Json VolumesToJson(const std::vector<Volume>& volumes) {
  Json out = Json::array();
  for (const Volume& v : volumes) {
    Json j = {{"mountPath", v.mount_path}};
    if (!v.host_path.empty()) {
      j["hostPath"] = v.host_path;
      j["readOnly"] = v.read_only;
    } else if (v.memory) {
      j["scratch"] = {{"medium", "memory"}, {"sizeLimit", FormatMemory(MiB(v.size_bytes >> 20))}};
    } else {
      j["scratch"] = {{"medium", "disk"}};
      if (v.size_bytes > 0) j["scratch"]["sizeLimit"] = FormatMemory(MiB(v.size_bytes >> 20));
    }
    out.push_back(std::move(j));
  }
  return out;
}

Result<std::vector<Volume>> ParseVolumes(const Json& v, const std::string& path, const TaskExec& exec,
                                         const JobSpecLimits& limits) {
  TaskExec copy = exec;
  copy.volumes.clear();
  RETURN_IF_ERROR(ReadVolumes(v, path, limits, &copy));
  return std::move(copy.volumes);
}

Result<Job> ParseJobSpec(std::string_view text, SpecFormat format, const JobSpecLimits& limits) {
  if (text.size() > limits.max_bytes) {
    return FieldError("", fmt::format("is {} bytes, over the limit of {}", text.size(), limits.max_bytes));
  }
  Result<Json> tree = format == SpecFormat::kJson ? ParseJsonText(text, limits) : ParseYamlText(text, limits);
  if (!tree.ok()) return tree.status();
  try {
    return ReadJob(*tree, limits);
  } catch (const std::exception& e) {
    // The readers check types before every access, so this is a bug; still no exception escapes.
    return Status::Internal(fmt::format("spec: reading the job failed: {}", e.what()));
  }
}

Json JobSpecToJson(const Job& job) {
  Json j = Json::object();
  j["name"] = job.name;
  if (!job.tenant.empty()) j["tenant"] = job.tenant;
  if (!job.queue.empty()) j["queue"] = job.queue;
  j["priority"] = job.priority;
  j["qos"] = QosClassName(job.qos);
  j["labels"] = LabelsJson(job.labels);
  j["gang"] = {{"minAvailable", job.gang_size()}};

  Json node_affinity = Json::array();
  for (const LabelRequirement& req : job.affinity.node) {
    node_affinity.push_back({{"key", req.key}, {"operator", LabelOpName(req.op)}, {"values", req.values}});
  }
  Json together = Json::array();
  for (const auto& term : job.affinity.together_with) together.push_back(LabelsJson(term));
  Json apart = Json::array();
  for (const auto& term : job.affinity.apart_from) apart.push_back(LabelsJson(term));
  j["affinity"] = {{"nodeAffinity", std::move(node_affinity)},
                   {"togetherWith", std::move(together)},
                   {"apartFrom", std::move(apart)}};

  j["retry"] = {{"maxRestarts", job.retry.max_restarts},
                {"backoffSeconds", job.retry.backoff_seconds},
                {"maxBackoffSeconds", job.retry.max_backoff_seconds},
                {"onFailure", job.retry.on_failure}};

  if (job.time_limit_seconds > 0) j["timeLimit"] = job.time_limit_seconds;
  if (!job.depends_on.empty()) {
    Json deps = Json::array();
    for (const Dependency& d : job.depends_on)
      deps.push_back({{"job", d.job}, {"condition", DependencyConditionName(d.condition)}});
    j["dependsOn"] = std::move(deps);
  }

  Json tasks = Json::array();
  for (const TaskGroup& g : job.groups) tasks.push_back(TaskJson(g));
  j["tasks"] = std::move(tasks);
  return j;
}

bool SameJobSpec(const Job& a, const Job& b) {
  if (a.name != b.name || a.tenant != b.tenant || a.queue != b.queue || a.priority != b.priority ||
      a.qos != b.qos || a.gang_size() != b.gang_size() || a.labels != b.labels ||
      !(a.affinity == b.affinity) || !(a.retry == b.retry) || a.groups.size() != b.groups.size() ||
      a.time_limit_seconds != b.time_limit_seconds || a.depends_on != b.depends_on) {
    return false;
  }
  for (size_t i = 0; i < a.groups.size(); ++i) {
    const TaskGroup& x = a.groups[i];
    const TaskGroup& y = b.groups[i];
    if (x.name != y.name || x.replicas != y.replicas || !(x.request == y.request) || !(x.exec == y.exec)) {
      return false;
    }
  }
  return true;
}

Result<nlohmann::json> ParseJsonBody(std::string_view text, int max_depth) {
  JobSpecLimits limits;
  limits.max_depth = max_depth;
  return ParseJsonText(text, limits);
}

Status CheckSpecName(std::string_view name, const std::string& path, const JobSpecLimits& limits) {
  return CheckName(name, path, limits.max_name_bytes);
}

std::string ErrorField(const Status& status) {
  if (status.code() != StatusCode::kInvalidArgument) return "";
  const std::string& m = status.message();
  const size_t colon = m.find(": ");
  if (colon == std::string::npos || colon == 0) return "";
  const std::string prefix = m.substr(0, colon);
  if (prefix == "spec") return "";
  for (char c : prefix) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '-' || c == '.' || c == '[' || c == ']';
    if (!ok) return "";
  }
  return prefix;
}

}  // namespace gpupool
