#include "kube/pod_admission.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <tuple>

#include "api/jobspec.h"
#include "common/quantity.h"
#include "kube/json_fields.h"
#include "kube/kube_node.h"
#include "kube/pod_request.h"

namespace gpupool::kube {

using Json = nlohmann::json;
using json_fields::At;
using json_fields::Str;

namespace {

constexpr size_t kMaxAssignedGpus = 64;
constexpr int64_t kMaxDevices = 1 << 20;

// A container's count of `resource` (limits, else requests; extended resources are integers).
// -1: not a count.
int64_t ContainerCount(const Json& container, const std::string& resource) {
  const Json& res = At(container, "resources");
  for (const char* part : {"limits", "requests"}) {
    const Json& v = At(At(res, part), resource.c_str());
    if (v.is_number_integer()) {
      const int64_t n = v.get<int64_t>();
      return n >= 0 && n <= kMaxDevices ? n : -1;
    }
    if (v.is_string()) {
      const std::string& s = v.get_ref<const std::string&>();
      int64_t n = 0;
      const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
      if (ec != std::errc() || end != s.data() + s.size() || n < 0 || n > kMaxDevices) return -1;
      return n;
    }
    if (!v.is_null()) return -1;
  }
  return 0;
}

struct ContainerNeed {
  std::string name;
  int64_t count = 0;
  bool init = false;
};

// The containers that ask for `resource`, init containers first (kubelet's allocation order).
std::vector<ContainerNeed> Needs(const Json& pod, const std::string& resource, std::string* bad) {
  std::vector<ContainerNeed> out;
  const Json& spec = At(pod, "spec");
  for (const char* key : {"initContainers", "containers"}) {
    const Json& list = At(spec, key);
    if (!list.is_array()) continue;
    for (size_t i = 0; i < list.size() && i < 64; ++i) {
      const int64_t n = ContainerCount(list[i], resource);
      if (n < 0) {
        *bad = fmt::format("spec.{}[{}].resources {}: not a device count", key, i, resource);
        continue;
      }
      if (n > 0) out.push_back({Str(At(list[i], "name")), n, std::string_view(key) == "initContainers"});
    }
  }
  return out;
}

std::string PodName(const Json& pod) {
  const Json& meta = At(pod, "metadata");
  return fmt::format("{}/{}", Str(At(meta, "namespace")), Str(At(meta, "name")));
}

}  // namespace

std::string SlotId(const std::string& gpu_uuid, int slot) { return fmt::format("{}::{}", gpu_uuid, slot); }

std::string SlotGpu(std::string_view id) {
  const size_t sep = id.rfind("::");
  if (sep == std::string_view::npos || sep == 0 || sep + 2 >= id.size()) return {};
  for (size_t i = sep + 2; i < id.size(); ++i)
    if (id[i] < '0' || id[i] > '9') return {};
  return std::string(id.substr(0, sep));
}

Result<std::vector<AssignedGpu>> ParseNodeAssignment(const std::string& text, const std::string& pod_uid,
                                                     const std::string& node) {
  auto read = ReadAssignment(text, pod_uid, node);
  if (!read.ok()) return read.status();
  const Json& j = *read;
  const Json& gpus = At(j, "gpus");
  if (!gpus.is_array()) return Status::InvalidArgument("the assignment's gpus must be a list");
  if (gpus.size() > kMaxAssignedGpus) return Status::InvalidArgument("the assignment names more than 64 GPUs");
  std::vector<AssignedGpu> out;
  for (size_t i = 0; i < gpus.size(); ++i) {
    const Json& g = gpus[i];
    auto bad = [&](const char* field, const std::string& why) {
      return Status::InvalidArgument(fmt::format("the assignment's gpus[{}].{}: {}", i, field, why));
    };
    if (!g.is_object()) return bad("", "must be an object");
    AssignedGpu a;
    const Json& index = At(g, "index");
    if (!index.is_number_integer() || index.get<int64_t>() < 0 || index.get<int64_t>() >= 1024)
      return bad("index", "must be a GPU index");
    a.index = static_cast<int>(index.get<int64_t>());
    a.uuid = Str(At(g, "uuid"));
    const Json& share = At(g, "share");
    if (!share.is_number_integer() || share.get<int64_t>() < 0 || share.get<int64_t>() > 1000)
      return bad("share", "must be 0 to 1000");
    a.share_milli = share.get<int64_t>();
    if (const std::string mem = Str(At(g, "memory")); !mem.empty()) {
      auto m = ParseMemory(mem);
      if (!m.ok()) return bad("memory", m.status().message());
      a.memory_bytes = m->units() * 1024 * 1024;
    }
    const Json& mig = At(g, "mig");
    if (mig.is_object()) {
      a.mig_profile = Str(At(mig, "profile"));
      const Json& id = At(mig, "profileId");
      const Json& start = At(mig, "start");
      if (!start.is_number_integer() || start.get<int64_t>() < 0 || start.get<int64_t>() > 64)
        return bad("mig.start", "must be a memory slice");
      a.mig_start = static_cast<int>(start.get<int64_t>());
      if (id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < 1024)
        a.mig_profile_id = static_cast<int>(id.get<int64_t>());
      if (a.mig_profile.empty() && a.mig_profile_id < 0) return bad("mig", "names no profile");
    } else if (!mig.is_null()) {
      return bad("mig", "must be an object");
    }
    out.push_back(std::move(a));
  }
  return out;
}

Result<AdmittedContainer> FindAdmittedContainer(const std::vector<Json>& pods, const AdmissionQuery& q) {
  std::set<std::string> kubelet_pods;
  std::map<std::string, const KubeletPod*> kubelet_by_name;
  if (q.kubelet) {
    for (const KubeletPod& k : *q.kubelet) kubelet_by_name[k.namespace_name + "/" + k.name] = &k;
  }
  struct Candidate {
    std::string created, key;
    AdmittedContainer c;
  };
  std::vector<Candidate> found;
  std::vector<std::string> near;  // why pods of this node that ask for the resource were passed over
  for (const Json& pod : pods) {
    const Json& meta = At(pod, "metadata");
    const Json& spec = At(pod, "spec");
    if (Str(At(spec, "nodeName")) != q.node) continue;
    const std::string key = PodName(pod);
    std::string bad;
    std::vector<ContainerNeed> needs = Needs(pod, q.resource, &bad);
    if (!bad.empty()) {
      near.push_back(fmt::format("{}: {}", key, bad));
      continue;
    }
    if (needs.empty()) continue;  // not a pod of this resource
    const std::string phase = Str(At(At(pod, "status"), "phase"));
    if ((!phase.empty() && phase != "Pending") || !At(meta, "deletionTimestamp").is_null()) continue;
    const std::string uid = Str(At(meta, "uid"));
    const Json& annotation = At(At(meta, "annotations"), kAssignmentKey);
    if (!annotation.is_string()) {
      near.push_back(fmt::format("{}: no {} annotation (not placed by gpupool)", key, kAssignmentKey));
      continue;
    }
    auto gpus = ParseNodeAssignment(annotation.get<std::string>(), uid, q.node);
    if (!gpus.ok()) {
      near.push_back(fmt::format("{}: {}", key, gpus.status().message()));
      continue;
    }
    const KubeletPod* held = nullptr;
    if (q.kubelet) {
      const auto it = kubelet_by_name.find(key);
      if (it == kubelet_by_name.end()) {
        near.push_back(fmt::format("{}: not admitted by kubelet yet", key));
        continue;
      }
      held = it->second;
    }
    // The next container of the pod that has no devices of the resource yet.
    const ContainerNeed* next = nullptr;
    for (const ContainerNeed& n : needs) {
      if (q.answered.count(uid + "/" + n.name) != 0) continue;
      if (held != nullptr) {
        const auto c = held->devices.find(n.name);
        if (c != held->devices.end()) {
          const auto r = c->second.find(q.resource);
          if (r != c->second.end() && !r->second.empty()) continue;
        }
      }
      next = &n;
      break;
    }
    if (next == nullptr) continue;  // every container has its devices
    if (static_cast<size_t>(next->count) != q.count) {
      near.push_back(fmt::format("{}: container {} asks for {}", key, next->name, next->count));
      continue;
    }
    auto request = ParsePodRequest(pod);
    if (!request.ok()) {
      near.push_back(request.status().message());
      continue;
    }
    AdmittedContainer c;
    c.uid = uid;
    c.namespace_name = Str(At(meta, "namespace"));
    c.name = Str(At(meta, "name"));
    c.container = next->name;
    c.requested = next->count;
    Assignment& a = c.assignment;
    a.job_id = uid;
    a.name = key;
    a.tenant = request->tenant;
    a.qos = std::string(QosClassName(request->qos));
    a.isolation = std::string(IsolationModeName(request->isolation));
    // This container's part of the pod's GPUs: init containers run before the app containers and
    // take the first ones; app containers take consecutive runs in order. Counts that do not add up
    // to the GPUs (a fraction asked as one device) give the container all of them.
    std::vector<AssignedGpu> all = std::move(gpus).value();
    c.pod_gpus = all;
    size_t offset = 0;
    if (!next->init) {
      for (const ContainerNeed& n : needs) {
        if (&n == next) break;
        if (!n.init) offset += static_cast<size_t>(n.count);
      }
    }
    int64_t app_total = 0;
    for (const ContainerNeed& n : needs) app_total += n.init ? 0 : n.count;
    const bool split = static_cast<size_t>(app_total) == all.size() && offset + q.count <= all.size();
    if (split) {
      a.gpus.assign(all.begin() + static_cast<std::ptrdiff_t>(offset),
                    all.begin() + static_cast<std::ptrdiff_t>(offset + q.count));
    } else {
      a.gpus = std::move(all);
    }
    found.push_back({Str(At(meta, "creationTimestamp")), key, std::move(c)});
  }
  if (found.empty()) {
    std::string why = near.empty() ? "no pod bound here asks for it" : fmt::format("{}", fmt::join(near, "; "));
    return Status::NotFound(
        fmt::format("no pod on node {} waits for {} {}: {}", q.node, q.count, q.resource, why));
  }
  std::sort(found.begin(), found.end(), [](const Candidate& x, const Candidate& y) {
    return std::tie(x.created, x.key) < std::tie(y.created, y.key);
  });
  return std::move(found.front().c);
}

Status CheckNodeCapacity(const std::vector<Json>& pods, const AdmittedContainer& c, const Inventory& inv,
                         const std::string& node) {
  struct Held {
    int64_t share = 0, memory = 0;
    std::string by;  // a pod holding part of it
  };
  std::vector<Held> held(inv.gpus.size());
  std::map<std::tuple<int, int, std::string, int>, std::string> instances;  // (gpu, start, profile, id) -> pod
  const std::string self = fmt::format("{}/{}", c.namespace_name, c.name);
  // Adds one pod's GPUs; `check` says whether going over is this pod's fault (the candidate's).
  auto add = [&](const std::vector<AssignedGpu>& gpus, const std::string& who, bool check) -> Status {
    for (const AssignedGpu& g : gpus) {
      if (g.index < 0 || static_cast<size_t>(g.index) >= inv.gpus.size()) {
        if (!check) continue;
        return Status::FailedPrecondition(fmt::format("the assignment names GPU {}, node {} has {}", g.index, node,
                                                      inv.gpus.size()));
      }
      const GpuInfo& info = inv.gpus[static_cast<size_t>(g.index)];
      if (check && !g.uuid.empty() && g.uuid != info.uuid)
        return Status::FailedPrecondition(
            fmt::format("the assignment names GPU {} as {}, node {} has {} there", g.index, g.uuid, node, info.uuid));
      const bool mig = !g.mig_profile.empty() || g.mig_profile_id >= 0;
      if (check && mig != info.mig_enabled)
        return Status::FailedPrecondition(fmt::format(
            "the assignment asks for {} on GPU {} ({}), which is {}", mig ? "a MIG instance" : "a share", g.index,
            info.uuid, info.mig_enabled ? "in MIG mode" : "not in MIG mode"));
      Held& h = held[static_cast<size_t>(g.index)];
      if (mig) {
        auto [it, fresh] = instances.try_emplace({g.index, g.mig_start, g.mig_profile, g.mig_profile_id}, who);
        if (!fresh && check)
          return Status::FailedPrecondition(fmt::format("the MIG instance {} at slice {} of GPU {} ({}) is pod {}'s",
                                                        g.mig_profile, g.mig_start, g.index, info.uuid, it->second));
        continue;
      }
      h.share += g.share_milli;
      h.memory += g.memory_bytes;
      if (check && (h.share > 1000 || h.memory > info.memory_bytes)) {
        const std::string what = h.share > 1000
                                     ? fmt::format("shares would add up to {} milli-GPU of 1000", h.share)
                                     : fmt::format("memory grants would add up to {} MiB of its {} MiB", h.memory >> 20,
                                                   info.memory_bytes >> 20);
        return Status::FailedPrecondition(fmt::format("GPU {} ({}) would be overcommitted: its {} with this pod's ({})",
                                                      g.index, info.uuid, what,
                                                      h.by.empty() ? std::string("no other pod holds it")
                                                                   : fmt::format("pod {} holds part of it", h.by)));
      }
      if (h.by.empty()) h.by = who;
    }
    return Status::Ok();
  };
  for (const Json& pod : pods) {
    const Json& meta = At(pod, "metadata");
    const std::string uid = Str(At(meta, "uid"));
    if (uid == c.uid || Str(At(At(pod, "spec"), "nodeName")) != node) continue;
    const std::string phase = Str(At(At(pod, "status"), "phase"));
    if (phase == "Succeeded" || phase == "Failed") continue;
    const Json& annotation = At(At(meta, "annotations"), kAssignmentKey);
    if (!annotation.is_string()) continue;
    auto gpus = ParseNodeAssignment(annotation.get<std::string>(), uid, node);
    if (!gpus.ok()) continue;  // unreadable: it was never given a GPU here
    (void)add(*gpus, PodName(pod), false);
  }
  if (Status st = add(c.pod_gpus, self, true); !st.ok())
    return Status::FailedPrecondition(fmt::format("pod {}: {}", self, st.message()));
  return Status::Ok();
}

std::map<std::string, std::set<std::string>> MpsUsers(const std::vector<Json>& pods, const std::string& node,
                                                      const Inventory& inv, const std::set<std::string>& admitted) {
  std::map<std::string, std::set<std::string>> out;
  for (const Json& pod : pods) {
    const Json& meta = At(pod, "metadata");
    if (Str(At(At(pod, "spec"), "nodeName")) != node) continue;
    const std::string phase = Str(At(At(pod, "status"), "phase"));
    if (phase == "Succeeded" || phase == "Failed") continue;
    const std::string uid = Str(At(meta, "uid"));
    if (phase != "Running" && admitted.count(uid) == 0) continue;
    const Json& annotation = At(At(meta, "annotations"), kAssignmentKey);
    if (!annotation.is_string()) continue;
    auto request = ParsePodRequest(pod);
    if (!request.ok() || request->isolation != IsolationMode::kMps) continue;
    auto gpus = ParseNodeAssignment(annotation.get<std::string>(), uid, node);
    if (!gpus.ok()) continue;
    for (const AssignedGpu& g : *gpus)
      if (g.index >= 0 && static_cast<size_t>(g.index) < inv.gpus.size())
        out[inv.gpus[static_cast<size_t>(g.index)].uuid].insert(uid);
  }
  return out;
}

Result<ContainerGrant> GrantFor(const AdmittedContainer& c, const Inventory& inv, const GrantOptions& options) {
  TaskEnvOptions eo;
  eo.node = options.node;
  eo.mps_pipe_root = options.mps_pipe_root;
  eo.mps_daemons = options.mps_daemons;
  ASSIGN_OR_RETURN(auto env, TaskEnvironment(c.assignment, inv, eo));
  ContainerGrant out;
  // What describes a gpupool job rather than the pod's GPUs stays out: the pod has its own.
  for (const char* drop : {"PATH", "HOME", "GPUPOOL_JOB_ID", "GPUPOOL_TASK_INDEX", "GPUPOOL_TASK_NAME",
                           "GPUPOOL_RESTARTS", "GPUPOOL_CPU_MILLI", "GPUPOOL_MEMORY_BYTES"})
    env.erase(drop);
  env["GPUPOOL_POD_UID"] = c.uid;
  const bool mig = c.assignment.isolation == "mig";
  std::vector<std::string> visible;  // GPU or MIG instance UUIDs
  for (const AssignedGpu& g : c.assignment.gpus) {
    const GpuInfo& info = inv.gpus[static_cast<size_t>(g.index)];  // TaskEnvironment checked the index
    if (mig) {
      ASSIGN_OR_RETURN(MigInstanceInfo inst, FindMigInstance(g, inv, options.node));
      visible.push_back(inst.uuid);
    } else {
      visible.push_back(info.uuid);
    }
  }
  if (!inv.simulated) {
    if (!options.cdi_kind.empty()) {
      for (const std::string& u : visible) out.cdi_devices.push_back(fmt::format("{}={}", options.cdi_kind, u));
    } else {
      for (const std::string& d : options.control_devices) out.devices.push_back({d, "rw"});
      for (const AssignedGpu& g : c.assignment.gpus) {
        const GpuInfo& info = inv.gpus[static_cast<size_t>(g.index)];
        if (info.minor_number < 0)
          return Status::FailedPrecondition(
              fmt::format("GPU {} ({}): its /dev/nvidia minor number is unknown", g.index, info.uuid));
        out.devices.push_back({fmt::format("/dev/nvidia{}", info.minor_number), "rw"});
      }
      if (mig) {
        ASSIGN_OR_RETURN(auto caps, TaskMigCapDevices(c.assignment, inv, options.mig_minors));
        for (std::string& d : caps) out.devices.push_back({std::move(d), "rw"});
      }
    }
  }
  if (c.assignment.isolation == "mps") {
    const auto pipe = env.find("CUDA_MPS_PIPE_DIRECTORY");
    if (pipe != env.end()) out.mounts.push_back({pipe->second, pipe->second, false});
  }
  out.env = std::move(env);
  return out;
}

std::vector<std::string> PreferredSlots(const std::vector<std::string>& available,
                                        const std::vector<std::string>& must_include, size_t size,
                                        const std::vector<std::string>& prefer) {
  std::vector<std::string> out;
  std::set<std::string> taken;
  for (const std::string& id : must_include) {
    if (out.size() >= size) break;
    if (taken.insert(id).second) out.push_back(id);
  }
  // Free slots of each preferred GPU, in the order given.
  std::map<std::string, std::vector<const std::string*>> by_gpu;
  for (const std::string& id : available)
    if (taken.count(id) == 0) by_gpu[SlotGpu(id)].push_back(&id);
  std::map<std::string, size_t> used;
  for (bool progress = true; progress && out.size() < size;) {
    progress = false;
    for (const std::string& gpu : prefer) {
      if (out.size() >= size) break;
      auto it = by_gpu.find(gpu);
      if (it == by_gpu.end()) continue;
      size_t& u = used[gpu];
      while (u < it->second.size() && taken.count(*it->second[u]) != 0) ++u;
      if (u >= it->second.size()) continue;
      taken.insert(*it->second[u]);
      out.push_back(*it->second[u]);
      ++u;
      progress = true;
    }
  }
  for (const std::string& id : available) {
    if (out.size() >= size) break;
    if (taken.insert(id).second) out.push_back(id);
  }
  return out;
}

}  // namespace gpupool::kube
