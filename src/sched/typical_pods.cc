#include "sched/typical_pods.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

namespace gpupool {

namespace {
std::string JoinModels(const std::vector<std::string>& models) {
  std::string out;
  for (size_t i = 0; i < models.size(); ++i) {
    if (i > 0) out += '|';
    out += models[i];
  }
  return out;
}
}  // namespace

void TaskShapeCounter::Add(int64_t cpu, int64_t share, int gpu_count,
                           const std::vector<std::string>& models) {
  auto [it, inserted] =
      counts_.try_emplace({cpu, share, gpu_count, gpu_count > 0 ? JoinModels(models) : std::string()});
  if (inserted) {
    TypicalPod& p = it->second.first;
    p.cpu = cpu;
    p.share = share;
    p.gpu_count = gpu_count;
    if (gpu_count > 0) p.models = models;
  }
  ++it->second.second;
}

std::vector<TypicalPod> TaskShapeCounter::Typical(double coverage) const {
  std::vector<std::pair<TypicalPod, int64_t>> shapes;
  shapes.reserve(counts_.size());
  for (const auto& [key, entry] : counts_) shapes.push_back(entry);
  return TypicalPodsFromCounts(std::move(shapes), coverage);
}

std::vector<TypicalPod> ComputeTypicalPods(std::span<const TaskRequest> tasks, double coverage) {
  TaskShapeCounter counter;
  for (const TaskRequest& t : tasks) {
    counter.Add(t.cpu.units(), t.wants_gpu() ? t.gpu_share.units() : 0, t.gpu_count, t.gpu_models);
  }
  return counter.Typical(coverage);
}

std::vector<TypicalPod> TypicalOfGpuTasks(std::span<const TaskRequest> tasks) {
  std::vector<TaskRequest> gpu_tasks;
  for (const TaskRequest& t : tasks)
    if (t.wants_gpu()) gpu_tasks.push_back(t);
  return gpu_tasks.empty() ? std::vector<TypicalPod>{{0, 1000, 1, {}, 1.0}} : ComputeTypicalPods(gpu_tasks);
}

double WorkloadDistance(const std::vector<TypicalPod>& a, const std::vector<TypicalPod>& b) {
  using Key = std::tuple<int64_t, int64_t, int, std::string>;
  std::map<Key, double> diff;
  for (const TypicalPod& p : a) diff[Key{p.cpu, p.share, p.gpu_count, JoinModels(p.models)}] += p.weight;
  for (const TypicalPod& p : b) diff[Key{p.cpu, p.share, p.gpu_count, JoinModels(p.models)}] -= p.weight;
  double total = 0;
  for (const auto& [key, d] : diff) total += std::abs(d);
  return total / 2;
}

std::vector<TypicalPod> TypicalPodsFromCounts(std::vector<std::pair<TypicalPod, int64_t>> shapes,
                                              double coverage) {
  using Key = std::tuple<int64_t, int64_t, int, std::string>;
  auto key = [](const TypicalPod& p) { return Key{p.cpu, p.share, p.gpu_count, JoinModels(p.models)}; };
  std::vector<std::pair<Key, size_t>> order;
  order.reserve(shapes.size());
  int64_t n_total = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    order.emplace_back(key(shapes[i].first), i);
    n_total += shapes[i].second;
  }
  // Count descending; ties by key descending (cpu, share, count, models bytewise).
  std::sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    const int64_t ca = shapes[a.second].second, cb = shapes[b.second].second;
    if (ca != cb) return ca > cb;
    return a.first > b.first;
  });
  const auto n = static_cast<double>(n_total);
  int64_t cum = 0;
  size_t keep = 0;
  while (keep < order.size()) {
    cum += shapes[order[keep].second].second;
    ++keep;
    if (static_cast<double>(cum) >= coverage * n) break;
  }
  std::vector<TypicalPod> out;
  out.reserve(keep);
  for (size_t i = 0; i < keep; ++i) {
    auto& [pod, count] = shapes[order[i].second];
    TypicalPod p = std::move(pod);
    p.weight = (static_cast<double>(count) / n) / (static_cast<double>(cum) / n);
    out.push_back(std::move(p));
  }
  return out;
}

const std::vector<uint8_t>& FragmentationModel::AccessFor(const Ledger& ledger, ModelId model) const {
  if (access_.size() <= model) {
    access_.resize(static_cast<size_t>(model) + 1);
    access_ready_.resize(static_cast<size_t>(model) + 1, 0);
  }
  if (!access_ready_[model]) {
    const std::string& name = ledger.model_name(model);
    auto& a = access_[model];
    a.assign(pods_.size(), 1);
    for (size_t i = 0; i < pods_.size(); ++i) {
      if (pods_[i].models.empty()) continue;
      a[i] = std::find(pods_[i].models.begin(), pods_[i].models.end(), name) != pods_[i].models.end();
    }
    access_ready_[model] = 1;
  }
  return access_[model];
}

double FragmentationModel::NodeFragment(const Ledger& ledger, ModelId model, int64_t free_cpu,
                                        std::span<const int32_t> free) const {
  int64_t total = 0;
  for (int32_t g : free) total += g;
  const auto all = static_cast<double>(total);
  const std::vector<uint8_t>& access = AccessFor(ledger, model);
  double q1 = 0, q2 = 0, q4 = 0, xl = 0, xr = 0, na = 0;
  for (size_t i = 0; i < pods_.size(); ++i) {
    const TypicalPod& p = pods_[i];
    const double w = p.weight;
    if (p.share == 0) {
      if (free_cpu >= p.cpu) {
        xl += w * all;
      } else {
        xr += w * all;
      }
      continue;
    }
    if (!access[i]) {
      na += w * all;
      continue;
    }
    int fitting = 0;
    int64_t stranded = 0;  // share on GPUs too small for one GPU of this pod
    for (int32_t g : free) {
      if (g >= p.share) {
        ++fitting;
      } else {
        stranded += g;
      }
    }
    const bool gpu_ok = fitting >= p.gpu_count;
    const bool cpu_ok = free_cpu >= p.cpu;
    if (gpu_ok && cpu_ok) {
      q2 += w * static_cast<double>(stranded);
    } else if (gpu_ok) {
      q4 += w * all;
    } else if (cpu_ok) {
      q2 += w * all;
    } else {
      q1 += w * all;
    }
  }
  return q1 + q2 + q4 + xl + xr + na;
}

double FragmentationModel::NodeFragment(const Ledger& ledger, NodeIndex node) const {
  const NodeState& s = ledger.state(node);
  std::vector<int32_t> free;
  free.reserve(s.gpus.size());
  for (const GpuState& g : s.gpus) {
    if (g.healthy && !g.mig_enabled) free.push_back(g.free_share);
  }
  return NodeFragment(ledger, s.model, s.free_cpu, free);
}

double FragmentationModel::ClusterFragment(const Ledger& ledger) const {
  double total = 0;
  for (NodeIndex n = 0; n < ledger.node_count(); ++n) total += NodeFragment(ledger, n);
  return total;
}

Result<std::vector<TypicalPod>> ParseTypicalPods(const Value& list) {
  const Value::List* items = list.AsList();
  if (items == nullptr) return Status::InvalidArgument("typicalPods must be a list");
  std::vector<TypicalPod> out;
  for (size_t i = 0; i < items->size(); ++i) {
    const Value& v = (*items)[i];
    const std::string where = fmt::format("typicalPods[{}]", i);
    if (!v.is_map()) return Status::InvalidArgument(where + " must be a map");
    TypicalPod p;
    for (const auto& [key, field] : *v.AsMap()) {
      const std::string what = where + "." + key;
      if (key == "cpu") {
        ASSIGN_OR_RETURN(p.cpu, field.AsInt(what));
      } else if (key == "gpuShare") {
        ASSIGN_OR_RETURN(p.share, field.AsInt(what));
      } else if (key == "gpuCount") {
        ASSIGN_OR_RETURN(int64_t c, field.AsInt(what));
        p.gpu_count = static_cast<int>(c);
      } else if (key == "weight") {
        ASSIGN_OR_RETURN(p.weight, field.AsDouble(what));
      } else if (key == "models") {
        const Value::List* models = field.AsList();
        if (models == nullptr) return Status::InvalidArgument(what + " must be a list of model names");
        for (const Value& m : *models) {
          ASSIGN_OR_RETURN(std::string name, m.AsString(what));
          p.models.push_back(std::move(name));
        }
      } else {
        return Status::InvalidArgument(
            fmt::format("{}: unknown field '{}' (cpu, gpuShare, gpuCount, models, weight)", where, key));
      }
    }
    if (p.cpu < 0 || p.share < 0 || p.share > 1000 || p.gpu_count < 0 || !(p.weight > 0) ||
        (p.gpu_count == 0) != (p.share == 0)) {
      return Status::InvalidArgument(where +
                                     ": needs cpu >= 0 (mCPU), gpuShare 0..1000 with gpuCount >= 1 "
                                     "(or both 0), and weight > 0");
    }
    out.push_back(std::move(p));
  }
  if (out.empty()) return Status::InvalidArgument("typicalPods is empty");
  return out;
}

}  // namespace gpupool
