#include "kube/kube_node.h"

#include "kube/json_fields.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "api/jobspec.h"
#include "api/mig_report.h"
#include "api/node_codec.h"
#include "common/quantity.h"

namespace gpupool::kube {

namespace {

using Json = nlohmann::json;
using json_fields::At;
using json_fields::Str;

constexpr size_t kMaxInventoryBytes = 256 << 10;
constexpr int kMaxGpus = 256;
constexpr size_t kMaxTaints = 256;
constexpr size_t kMaxTerms = 64;
constexpr size_t kMaxValues = 256;

// A quantity of an allocatable map as text ("64", "63500m", "512Gi"); numbers are accepted too.
std::string QuantityText(const Json& v) {
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  return Str(v);
}

Result<int64_t> Count(const std::string& text, const std::string& what) {
  int64_t v = 0;
  const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || v < 0)
    return Status::InvalidArgument(fmt::format("{}: must be a whole number, got '{}'", what, text));
  return v;
}

std::map<std::string, std::string> StringMap(const Json& obj) {
  std::map<std::string, std::string> out;
  if (!obj.is_object()) return out;
  for (auto it = obj.begin(); it != obj.end(); ++it)
    if (it->is_string()) out[it.key()] = it->get<std::string>();
  return out;
}

// "NVIDIA-A100-SXM4-80GB" -> the catalog's name when it knows the product, else the label as is.
std::string ModelFromProduct(std::string product, const GpuCatalog& catalog) {
  if (const GpuModelSpec* m = catalog.Find(product)) return m->name;
  std::replace(product.begin(), product.end(), ' ', '-');
  for (std::string_view prefix : {"NVIDIA-", "Tesla-"}) {
    if (product.starts_with(prefix)) {
      std::string rest = product.substr(prefix.size());
      if (const GpuModelSpec* m = catalog.Find(rest)) return m->name;
    }
  }
  return product;
}

}  // namespace

Result<KubeNode> ParseKubeNode(const Json& node, const GpuCatalog& catalog) {
  const Json& meta = At(node, "metadata");
  const std::string name = Str(At(meta, "name"));
  if (name.empty()) return Status::InvalidArgument("node: metadata.name: missing");
  auto bad = [&](const std::string& field, const std::string& why) {
    return Status::InvalidArgument(fmt::format("node {}: {}: {}", name, field, why));
  };
  KubeNode out;
  out.labels = StringMap(At(meta, "labels"));
  const Json& spec = At(node, "spec");
  out.cordoned = At(spec, "unschedulable").is_boolean() && At(spec, "unschedulable").get<bool>();
  const Json& taints = At(spec, "taints");
  if (taints.is_array()) {
    if (taints.size() > kMaxTaints) return bad("spec.taints", fmt::format("more than {}", kMaxTaints));
    for (const Json& t : taints) {
      Taint taint{Str(At(t, "key")), Str(At(t, "value")), Str(At(t, "effect"))};
      if (taint.effect == "NoSchedule" || taint.effect == "NoExecute") out.taints.push_back(std::move(taint));
    }
  }
  const Json& status = At(node, "status");
  const Json& conditions = At(status, "conditions");
  if (conditions.is_array())
    for (const Json& c : conditions)
      if (Str(At(c, "type")) == "Ready") out.ready = Str(At(c, "status")) == "True";

  const Json& alloc = At(status, "allocatable");
  NodeSpec base;
  base.name = name;
  if (std::string cpu = QuantityText(At(alloc, "cpu")); !cpu.empty()) {
    auto v = ParseCpu(cpu);
    if (!v.ok()) return bad("status.allocatable.cpu", v.status().message());
    base.cpu = *v;
  }
  if (std::string mem = QuantityText(At(alloc, "memory")); !mem.empty()) {
    auto v = ParseMemory(mem);
    if (!v.ok()) return bad("status.allocatable.memory", v.status().message());
    base.memory = *v;
  }
  if (std::string pods = QuantityText(At(alloc, "pods")); !pods.empty()) {
    auto v = Count(pods, "status.allocatable.pods");
    if (!v.ok()) return bad("status.allocatable.pods", v.status().message());
    base.max_tasks = static_cast<int>(std::min<int64_t>(*v, 1 << 20));
  }

  const Json& inventory = At(At(meta, "annotations"), kInventoryKey);
  if (!inventory.is_null()) {
    if (!inventory.is_string()) return bad(fmt::format("annotation {}", kInventoryKey), "must be a string");
    const std::string& text = inventory.get_ref<const std::string&>();
    if (text.size() > kMaxInventoryBytes)
      return bad(fmt::format("annotation {}", kInventoryKey), fmt::format("over {} bytes", kMaxInventoryBytes));
    auto parsed = ParseJsonBody(text, 16);
    if (!parsed.ok()) return bad(fmt::format("annotation {}", kInventoryKey), parsed.status().message());
    Json j = std::move(parsed).value();
    if (!j.is_object()) return bad(fmt::format("annotation {}", kInventoryKey), "must be a JSON object");
    // The Node object says what kubelet may give pods: its allocatable CPU, memory and pods win.
    j["name"] = name;
    j["cpu"] = FormatCpu(base.cpu);
    j["memory"] = FormatMemory(base.memory);
    j["maxTasks"] = base.max_tasks;
    j.erase("labels");
    auto mig = TakeMigInstances(j);
    if (!mig.ok()) return bad(fmt::format("annotation {}", kInventoryKey), mig.status().message());
    out.mig_present = std::move(mig).value();
    auto s = ParseNodeSpec(j, catalog);
    if (!s.ok()) return bad(fmt::format("annotation {}", kInventoryKey), s.status().message());
    out.spec = std::move(s).value();
    if (static_cast<int>(out.spec.gpus.size()) > kMaxGpus)
      return bad(fmt::format("annotation {}", kInventoryKey), fmt::format("more than {} GPUs", kMaxGpus));
    out.gpu_source = out.spec.gpus.empty() ? "" : "inventory";
    return out;
  }

  // No inventory: whole GPUs as NVIDIA's device plugin advertises them, the model from GPU feature
  // discovery's labels. (gpupool.io/gpu is not a GPU count: kube-node advertises slots, several per
  // GPU, and always publishes the inventory.)
  int64_t count = 0;
  for (const char* res : {"nvidia.com/gpu"}) {
    const std::string text = QuantityText(At(alloc, res));
    if (text.empty()) continue;
    auto v = Count(text, std::string("status.allocatable.") + res);
    if (!v.ok()) return bad(std::string("status.allocatable.") + res, v.status().message());
    count = std::max(count, *v);
  }
  if (count > kMaxGpus) return bad("status.allocatable", fmt::format("more than {} GPUs", kMaxGpus));
  base.topology = Topology::Flat(static_cast<int>(count));
  if (count > 0) {
    const auto product = out.labels.find(kGpuProductLabel);
    if (product == out.labels.end())
      return bad(fmt::format("label {}", kGpuProductLabel),
                 fmt::format("missing: a node with GPUs needs the annotation {} or this label", kInventoryKey));
    const std::string model = ModelFromProduct(product->second, catalog);
    MiB memory{0};
    if (const auto mem = out.labels.find(kGpuMemoryLabel); mem != out.labels.end()) {
      auto v = Count(mem->second, fmt::format("label {}", kGpuMemoryLabel));
      if (!v.ok()) return bad(fmt::format("label {}", kGpuMemoryLabel), v.status().message());
      memory = MiB(*v);
    } else if (const GpuModelSpec* m = catalog.Find(model)) {
      memory = m->memory;
    }
    for (int i = 0; i < count; ++i) {
      GpuDevice g;
      g.index = i;
      g.model = model;
      g.memory = memory;
      if (const GpuModelSpec* m = catalog.Find(model)) {
        g.sm_count = m->sm_count;
        g.compute_capability = m->compute_capability;
      }
      base.gpus.push_back(std::move(g));
    }
    out.gpu_source = "labels";
  }
  out.spec = std::move(base);
  return out;
}

// ---- constraints --------------------------------------------------------------------------------

Result<NodeConstraints> NodeConstraints::FromPod(const Json& pod) {
  NodeConstraints c;
  const Json& spec = At(pod, "spec");
  auto bad = [](const std::string& field, const std::string& why) {
    return Status::InvalidArgument(fmt::format("{}: {}", field, why));
  };
  const Json& selector = At(spec, "nodeSelector");
  if (!selector.is_null() && !selector.is_object()) return bad("spec.nodeSelector", "must be a map");
  if (selector.is_object()) {
    if (selector.size() > kMaxValues) return bad("spec.nodeSelector", "too many labels");
    for (auto it = selector.begin(); it != selector.end(); ++it) {
      if (!it->is_string()) return bad("spec.nodeSelector." + it.key(), "must be a string");
      c.selector_[it.key()] = it->get<std::string>();
    }
  }
  const Json& affinity = At(spec, "affinity");
  for (const char* unsupported : {"podAffinity", "podAntiAffinity"}) {
    const Json& a = At(affinity, unsupported);
    if (a.is_object() && !a.empty())
      return Status::InvalidArgument(fmt::format("spec.affinity.{}: gpupool does not honour it yet", unsupported));
  }
  const Json& required = At(At(At(affinity, "nodeAffinity"), "requiredDuringSchedulingIgnoredDuringExecution"),
                            "nodeSelectorTerms");
  if (!required.is_null()) {
    if (!required.is_array() || required.size() > kMaxTerms)
      return bad("spec.affinity.nodeAffinity", fmt::format("nodeSelectorTerms must be a list of at most {}", kMaxTerms));
    for (size_t t = 0; t < required.size(); ++t) {
      const std::string where = fmt::format("spec.affinity.nodeAffinity...nodeSelectorTerms[{}]", t);
      if (!At(required[t], "matchFields").is_null())
        return Status::InvalidArgument(where + ".matchFields: gpupool does not honour it yet");
      const Json& exprs = At(required[t], "matchExpressions");
      std::vector<Requirement> term;
      if (!exprs.is_null() && (!exprs.is_array() || exprs.size() > kMaxValues))
        return bad(where + ".matchExpressions", "must be a list");
      for (size_t e = exprs.is_array() ? 0 : exprs.size(); exprs.is_array() && e < exprs.size(); ++e) {
        Requirement r{Str(At(exprs[e], "key")), Str(At(exprs[e], "operator")), {}};
        const Json& values = At(exprs[e], "values");
        if (values.is_array()) {
          if (values.size() > kMaxValues) return bad(where, "too many values");
          for (const Json& v : values) r.values.push_back(Str(v));
        }
        const bool listed = r.op == "In" || r.op == "NotIn";
        const bool bare = r.op == "Exists" || r.op == "DoesNotExist";
        const bool number = r.op == "Gt" || r.op == "Lt";
        if (r.key.empty() || !(listed || bare || number))
          return bad(fmt::format("{}.matchExpressions[{}]", where, e), "needs a key and an operator In, NotIn, Exists, DoesNotExist, Gt or Lt");
        if ((listed && r.values.empty()) || (bare && !r.values.empty()) || (number && r.values.size() != 1))
          return bad(fmt::format("{}.matchExpressions[{}].values", where, e), "the wrong number for " + r.op);
        term.push_back(std::move(r));
      }
      // An empty term matches no node (as in Kubernetes).
      c.terms_.push_back(std::move(term));
    }
  }
  const Json& tolerations = At(spec, "tolerations");
  if (tolerations.is_array()) {
    if (tolerations.size() > kMaxTaints) return bad("spec.tolerations", "too many");
    for (const Json& t : tolerations) {
      Toleration tol{Str(At(t, "key")), Str(At(t, "operator")), Str(At(t, "value")), Str(At(t, "effect"))};
      if (tol.op.empty()) tol.op = "Equal";
      c.tolerations_.push_back(std::move(tol));
    }
  }
  if (!c.selector_.empty() || !c.terms_.empty() || !c.tolerations_.empty()) {
    Json k = {{"s", c.selector_}, {"t", required.is_null() ? Json() : required}, {"o", tolerations}};
    c.key_ = k.dump();
  }
  return c;
}

bool NodeConstraints::Allows(const KubeNode& node) const {
  for (const auto& [k, v] : selector_) {
    const auto it = node.labels.find(k);
    if (it == node.labels.end() || it->second != v) return false;
  }
  if (!terms_.empty()) {
    bool any = false;
    for (const auto& term : terms_) {
      bool all = !term.empty();
      for (const Requirement& r : term) {
        const auto it = node.labels.find(r.key);
        const bool has = it != node.labels.end();
        bool ok = false;
        if (r.op == "In") ok = has && std::find(r.values.begin(), r.values.end(), it->second) != r.values.end();
        else if (r.op == "NotIn") ok = !has || std::find(r.values.begin(), r.values.end(), it->second) == r.values.end();
        else if (r.op == "Exists") ok = has;
        else if (r.op == "DoesNotExist") ok = !has;
        else {
          int64_t label = 0, value = 0;
          const std::string& want = r.values[0];
          ok = has && Count(it->second, "").ok() && Count(want, "").ok();
          if (ok) {
            label = *Count(it->second, "");
            value = *Count(want, "");
            ok = r.op == "Gt" ? label > value : label < value;
          }
        }
        if (!ok) {
          all = false;
          break;
        }
      }
      if (all) {
        any = true;
        break;
      }
    }
    if (!any) return false;
  }
  for (const Taint& taint : node.taints) {
    bool tolerated = false;
    for (const Toleration& t : tolerations_) {
      if (!t.effect.empty() && t.effect != taint.effect) continue;
      if (t.op == "Exists" ? (t.key.empty() || t.key == taint.key) : (t.key == taint.key && t.value == taint.value)) {
        tolerated = true;
        break;
      }
    }
    if (!tolerated) return false;
  }
  return true;
}

// ---- the assignment -----------------------------------------------------------------------------

Json AssignmentJson(const std::string& pod_uid, const Placement& placement, const Ledger& ledger) {
  Json j = PlacementToJson(placement, ledger);
  j["podUID"] = pod_uid;
  return j;
}

Result<Json> ReadAssignment(const std::string& text, const std::string& pod_uid, const std::string& node) {
  if (text.size() > 64 * 1024) return Status::InvalidArgument("the assignment is over 64 KiB");
  ASSIGN_OR_RETURN(Json j, ParseJsonBody(text, 8));
  if (!j.is_object()) return Status::InvalidArgument("the assignment must be a JSON object");
  if (Str(At(j, "podUID")) != pod_uid)
    return Status::InvalidArgument(fmt::format("the assignment is for pod UID '{}', not this pod ({})",
                                               Str(At(j, "podUID")), pod_uid));
  if (Str(At(j, "node")) != node)
    return Status::InvalidArgument(
        fmt::format("the assignment is for node '{}', the pod is bound to '{}'", Str(At(j, "node")), node));
  return j;
}

Result<Placement> ParseAssignment(const std::string& text, const std::string& pod_uid, const std::string& node,
                                  const Ledger& ledger) {
  ASSIGN_OR_RETURN(Json j, ReadAssignment(text, pod_uid, node));
  j.erase("podUID");
  return PlacementFromJson(j, ledger);
}

}  // namespace gpupool::kube
