// A Pod's JSON to what it asks of gpupool (pod_request.h).
#include "kube/pod_request.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace gpupool::kube {

namespace {

using Json = nlohmann::json;

constexpr size_t kMaxContainers = 64;
constexpr size_t kMaxValueBytes = 1024;
constexpr size_t kMaxModels = 32;
constexpr int kMaxGpusPerPod = 64;
constexpr int kMaxPriority = 1000000;
constexpr int kMaxGang = 100000;

struct Reader {
  std::string who = "?";  // "<namespace>/<name>" once known
  Status Bad(const std::string& field, const std::string& why) const {
    return Status::InvalidArgument(fmt::format("pod {}: {}: {}", who, field, why));
  }
};

// A string field of an object, or "" (a non-string where a string belongs is an error).
Result<std::string> Text(const Reader& r, const Json& obj, const char* key, const std::string& field) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::string();
  if (!it->is_string()) return r.Bad(field, "must be a string");
  if (it->get_ref<const std::string&>().size() > kMaxValueBytes)
    return r.Bad(field, fmt::format("is longer than {} bytes", kMaxValueBytes));
  return it->get<std::string>();
}

const Json& ObjectAt(const Json& obj, const char* key) {
  static const Json kEmpty = Json::object();
  const auto it = obj.find(key);
  return it != obj.end() && it->is_object() ? *it : kEmpty;
}

// An annotation, else a label of that key ("" when neither).
Result<std::string> Setting(const Reader& r, const Json& meta, const char* key) {
  ASSIGN_OR_RETURN(std::string a, Text(r, ObjectAt(meta, "annotations"), key, fmt::format("annotation {}", key)));
  if (!a.empty()) return a;
  return Text(r, ObjectAt(meta, "labels"), key, fmt::format("label {}", key));
}

Result<int64_t> Integer(const Reader& r, const std::string& text, const std::string& field, int64_t lo, int64_t hi) {
  if (text.empty() || text.size() > 12) return r.Bad(field, fmt::format("must be an integer, got '{}'", text));
  size_t i = text[0] == '-' ? 1 : 0;
  if (i == text.size()) return r.Bad(field, fmt::format("must be an integer, got '{}'", text));
  int64_t v = 0;
  for (; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return r.Bad(field, fmt::format("must be an integer, got '{}'", text));
    v = v * 10 + (text[i] - '0');
  }
  if (text[0] == '-') v = -v;
  if (v < lo || v > hi) return r.Bad(field, fmt::format("must be in [{}, {}], got {}", lo, hi, v));
  return v;
}

// The effective requests of a pod's containers, as Kubernetes computes them: per resource, the
// larger of the app containers' sum and the largest init container's. A container's request
// defaults to its limit; extended resources (GPUs) are read from limits, else requests.
struct Totals {
  std::map<std::string, std::string> last_text;  // for errors
  int64_t gpus = 0, nvidia_gpus = 0, milli = 0;
  MiB gpu_memory{0};
  MilliCpu cpu{0};
  MiB memory{0};
  std::string mig;
};

Status AddContainer(const Reader& r, const Json& c, const std::string& where, Totals* t) {
  const Json& res = ObjectAt(c, "resources");
  const Json& limits = ObjectAt(res, "limits");
  const Json& requests = ObjectAt(res, "requests");
  auto value = [&](const std::string& name, bool extended) -> Result<std::string> {
    const Json& first = extended ? limits : requests;
    const Json& second = extended ? requests : limits;
    for (const Json* src : {&first, &second}) {
      const auto it = src->find(name);
      if (it == src->end() || it->is_null()) continue;
      if (it->is_number_integer()) return std::to_string(it->get<int64_t>());
      if (!it->is_string()) return r.Bad(fmt::format("{}.resources {}", where, name), "must be a quantity");
      return it->get<std::string>();
    }
    return std::string();
  };
  auto count = [&](const std::string& name, int64_t hi) -> Result<int64_t> {
    ASSIGN_OR_RETURN(std::string text, value(name, true));
    if (text.empty()) return int64_t{0};
    return Integer(r, text, fmt::format("{}.resources {}", where, name), 0, hi);
  };
  ASSIGN_OR_RETURN(int64_t gpus, count(kGpuResource, kMaxGpusPerPod));
  ASSIGN_OR_RETURN(int64_t nvidia, count(kNvidiaGpuResource, kMaxGpusPerPod));
  ASSIGN_OR_RETURN(int64_t milli, count(kGpuMilliKey, 1000));
  t->gpus += gpus;
  t->nvidia_gpus += nvidia;
  t->milli += milli;
  ASSIGN_OR_RETURN(std::string gmem, value(kGpuMemoryKey, true));
  if (!gmem.empty()) {
    auto m = ParseMemory(gmem);
    if (!m.ok()) return r.Bad(fmt::format("{}.resources {}", where, kGpuMemoryKey), m.status().message());
    t->gpu_memory = t->gpu_memory + *m;
  }
  std::set<std::string> mig_keys;
  for (const Json* src : {&limits, &requests})
    for (auto it = src->begin(); it != src->end(); ++it)
      if (it.key().rfind(kNvidiaMigPrefix, 0) == 0) mig_keys.insert(it.key());
  for (const std::string& key : mig_keys) {
    ASSIGN_OR_RETURN(int64_t n, count(key, 1));
    if (n == 0) continue;
    const std::string profile = key.substr(sizeof(kNvidiaMigPrefix) - 1);
    if (!t->mig.empty() && t->mig != profile)
      return r.Bad(fmt::format("{}.resources", where), "asks for two MIG instances (one per pod)");
    t->mig = profile;
  }
  ASSIGN_OR_RETURN(std::string cpu, value("cpu", false));
  if (!cpu.empty()) {
    auto v = ParseCpu(cpu);
    if (!v.ok()) return r.Bad(fmt::format("{}.resources cpu", where), v.status().message());
    t->cpu = t->cpu + *v;
  }
  ASSIGN_OR_RETURN(std::string mem, value("memory", false));
  if (!mem.empty()) {
    auto v = ParseMemory(mem);
    if (!v.ok()) return r.Bad(fmt::format("{}.resources memory", where), v.status().message());
    t->memory = t->memory + *v;
  }
  return Status::Ok();
}

Result<Totals> SumContainers(const Reader& r, const Json& spec, const char* key) {
  Totals t;
  const auto it = spec.find(key);
  if (it == spec.end() || it->is_null()) return t;
  if (!it->is_array()) return r.Bad(fmt::format("spec.{}", key), "must be a list");
  if (it->size() > kMaxContainers) return r.Bad(fmt::format("spec.{}", key), "has more than 64 containers");
  for (size_t i = 0; i < it->size(); ++i) {
    if (!(*it)[i].is_object()) return r.Bad(fmt::format("spec.{}[{}]", key, i), "must be an object");
    RETURN_IF_ERROR(AddContainer(r, (*it)[i], fmt::format("spec.{}[{}]", key, i), &t));
  }
  return t;
}

}  // namespace

Result<PodRequest> ParsePodRequest(const Json& pod) {
  Reader r;
  if (!pod.is_object()) return Status::InvalidArgument("a pod must be a JSON object");
  const Json& meta = ObjectAt(pod, "metadata");
  const Json& spec = ObjectAt(pod, "spec");
  PodRequest out;
  ASSIGN_OR_RETURN(out.namespace_name, Text(r, meta, "namespace", "metadata.namespace"));
  ASSIGN_OR_RETURN(out.name, Text(r, meta, "name", "metadata.name"));
  r.who = fmt::format("{}/{}", out.namespace_name, out.name);
  ASSIGN_OR_RETURN(out.uid, Text(r, meta, "uid", "metadata.uid"));
  if (out.name.empty() || out.uid.empty()) return r.Bad("metadata", "needs a name and a uid");
  ASSIGN_OR_RETURN(out.scheduler_name, Text(r, spec, "schedulerName", "spec.schedulerName"));
  ASSIGN_OR_RETURN(out.node_name, Text(r, spec, "nodeName", "spec.nodeName"));

  ASSIGN_OR_RETURN(Totals app, SumContainers(r, spec, "containers"));
  ASSIGN_OR_RETURN(Totals init, SumContainers(r, spec, "initContainers"));
  // Init containers run one at a time: the pod needs the most any one of them needs.
  TaskRequest& q = out.request;
  q.cpu = std::max(app.cpu, init.cpu);
  q.memory = std::max(app.memory, init.memory);
  if (init.gpus > app.gpus || init.nvidia_gpus > app.nvidia_gpus || init.milli > app.milli || !init.mig.empty())
    return r.Bad("spec.initContainers", "GPUs belong to the app containers: an init container asks for more");
  if (app.gpus > 0 && app.nvidia_gpus > 0 && app.gpus != app.nvidia_gpus)
    return r.Bad("resources", fmt::format("{} and {} disagree ({} and {})", kGpuResource, kNvidiaGpuResource,
                                          app.gpus, app.nvidia_gpus));
  int64_t gpus = std::max(app.gpus, app.nvidia_gpus);
  int64_t milli = app.milli;
  MiB gpu_memory = app.gpu_memory;
  std::string mig = app.mig;
  // The annotations say the same for pods that cannot carry extended resources.
  ASSIGN_OR_RETURN(std::string milli_text, Setting(r, meta, kGpuMilliKey));
  if (!milli_text.empty()) {
    if (milli > 0) return r.Bad(kGpuMilliKey, "given both as a resource and as an annotation");
    ASSIGN_OR_RETURN(milli, Integer(r, milli_text, fmt::format("annotation {}", kGpuMilliKey), 1, 1000));
  }
  ASSIGN_OR_RETURN(std::string gmem_text, Setting(r, meta, kGpuMemoryKey));
  if (!gmem_text.empty()) {
    if (gpu_memory.units() > 0) return r.Bad(kGpuMemoryKey, "given both as a resource and as an annotation");
    auto m = ParseMemory(gmem_text);
    if (!m.ok()) return r.Bad(fmt::format("annotation {}", kGpuMemoryKey), m.status().message());
    gpu_memory = *m;
  }
  ASSIGN_OR_RETURN(std::string mig_text, Setting(r, meta, kMigKey));
  if (!mig_text.empty()) {
    if (!mig.empty() && mig != mig_text) return r.Bad(kMigKey, "disagrees with the pod's nvidia.com/mig-* resource");
    mig = mig_text;
  }
  if (!mig.empty()) {
    // One gpupool.io/gpu device is the slot through which kube-node's device plugin hands the
    // container its instance; more would be GPUs besides.
    const bool slot_only = app.gpus == 1 && app.nvidia_gpus == 0;
    if ((gpus > 0 && !slot_only) || milli > 0 || gpu_memory.units() > 0)
      return r.Bad("resources", fmt::format("a MIG instance is the pod's whole GPU request: no GPUs, gpu-milli or "
                                            "gpu-memory besides (one {} device may carry it)", kGpuResource));
    q.gpu_count = 1;
    q.mig_profile = mig;
  } else if (milli > 0 || gpu_memory.units() > 0) {
    q.gpu_count = static_cast<int>(std::max<int64_t>(gpus, 1));
    q.gpu_share = MilliGpu(milli > 0 ? milli : 1000);
    q.gpu_memory = gpu_memory;
  } else if (gpus > 0) {
    q.gpu_count = static_cast<int>(gpus);
    q.gpu_share = kWholeGpu;
  }
  ASSIGN_OR_RETURN(std::string models, Setting(r, meta, kGpuModelsKey));
  for (size_t pos = 0; !models.empty() && pos <= models.size();) {
    size_t comma = models.find(',', pos);
    if (comma == std::string::npos) comma = models.size();
    std::string m = models.substr(pos, comma - pos);
    m.erase(0, m.find_first_not_of(' '));
    m.erase(m.find_last_not_of(' ') + 1);
    if (!m.empty()) q.gpu_models.push_back(m);
    pos = comma + 1;
  }
  if (q.gpu_models.size() > kMaxModels) return r.Bad(kGpuModelsKey, "names more than 32 models");
  ASSIGN_OR_RETURN(std::string interconnect, Setting(r, meta, kInterconnectKey));
  if (!interconnect.empty() && interconnect != "nvlink" && interconnect != "any")
    return r.Bad(kInterconnectKey, fmt::format("must be nvlink or any, got '{}'", interconnect));
  q.nvlink = interconnect == "nvlink";
  if (Status st = ValidateTaskRequest(q); !st.ok()) return r.Bad("resources", st.message());

  ASSIGN_OR_RETURN(std::string qos, Setting(r, meta, kQosKey));
  if (!qos.empty()) {
    auto parsed = ParseQosClass(qos);
    if (!parsed.ok()) return r.Bad(kQosKey, parsed.status().message());
    out.qos = *parsed;
  }
  ASSIGN_OR_RETURN(std::string isolation, Setting(r, meta, kIsolationKey));
  if (!isolation.empty()) {
    auto parsed = ParseIsolationMode(isolation);
    if (!parsed.ok()) return r.Bad(kIsolationKey, parsed.status().message());
    out.isolation = *parsed;
  } else {
    out.isolation = DefaultIsolation(q, out.qos);
  }
  if (Status st = CheckIsolation(q, out.isolation); !st.ok()) return r.Bad(kIsolationKey, st.message());

  ASSIGN_OR_RETURN(std::string queue, Setting(r, meta, kQueueKey));
  if (!queue.empty()) out.queue = queue;
  ASSIGN_OR_RETURN(out.named_tenant, Setting(r, meta, kTenantKey));
  out.tenant = out.named_tenant.empty() ? out.namespace_name : out.named_tenant;
  ASSIGN_OR_RETURN(std::string priority, Setting(r, meta, kPriorityKey));
  if (!priority.empty()) {
    ASSIGN_OR_RETURN(int64_t p, Integer(r, priority, kPriorityKey, -kMaxPriority, kMaxPriority));
    out.priority = static_cast<int>(p);
  }
  ASSIGN_OR_RETURN(out.gang, Setting(r, meta, kGangKey));
  ASSIGN_OR_RETURN(std::string gang_min, Setting(r, meta, kGangMinKey));
  if (!gang_min.empty()) {
    if (out.gang.empty()) return r.Bad(kGangMinKey, fmt::format("needs {}", kGangKey));
    ASSIGN_OR_RETURN(int64_t n, Integer(r, gang_min, kGangMinKey, 1, kMaxGang));
    out.gang_min = static_cast<int>(n);
  }
  return out;
}

Status BindTenant(PodRequest& r, const std::map<std::string, std::string>& namespace_tenants) {
  const auto it = namespace_tenants.find(r.namespace_name);
  const std::string& owner = it == namespace_tenants.end() ? r.namespace_name : it->second;
  if (!r.named_tenant.empty() && r.named_tenant != owner) {
    const std::string whose = it == namespace_tenants.end()
                                  ? fmt::format("its own tenant '{}' (no tenants.<name>.namespaces lists it)", owner)
                                  : fmt::format("tenant '{}' (tenants.{}.namespaces)", owner, owner);
    return Status::InvalidArgument(fmt::format(
        "pod {}/{}: {}: names tenant '{}', but the pods of namespace '{}' belong to {}; a pod cannot name another "
        "tenant",
        r.namespace_name, r.name, kTenantKey, r.named_tenant, r.namespace_name, whose));
  }
  r.tenant = owner;
  return Status::Ok();
}

}  // namespace gpupool::kube
