#include "sched/typical_pods.h"

#include <algorithm>
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

std::vector<TypicalPod> ComputeTypicalPods(std::span<const TaskRequest> tasks, double coverage) {
  using Key = std::tuple<int64_t, int64_t, int, std::string>;  // cpu, share, count, models
  std::map<Key, int64_t> counts;
  std::map<Key, const TaskRequest*> example;
  for (const TaskRequest& t : tasks) {
    Key k{t.cpu.units(), t.wants_gpu() ? t.gpu_share.units() : 0, t.gpu_count,
          t.wants_gpu() ? JoinModels(t.gpu_models) : std::string()};
    if (++counts[k] == 1) example[k] = &t;
  }
  std::vector<std::pair<Key, int64_t>> sorted(counts.begin(), counts.end());
  // Count descending; ties by key descending (cpu, share, count, models bytewise).
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    if (a.second != b.second) return a.second > b.second;
    return a.first > b.first;
  });
  const auto n = static_cast<double>(tasks.size());
  int64_t cum = 0;
  size_t keep = 0;
  while (keep < sorted.size()) {
    cum += sorted[keep].second;
    ++keep;
    if (static_cast<double>(cum) >= coverage * n) break;
  }
  std::vector<TypicalPod> out;
  out.reserve(keep);
  for (size_t i = 0; i < keep; ++i) {
    const auto& [key, count] = sorted[i];
    TypicalPod p;
    p.cpu = std::get<0>(key);
    p.share = std::get<1>(key);
    p.gpu_count = std::get<2>(key);
    if (p.gpu_count > 0) p.models = example[key]->gpu_models;
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

}  // namespace gpupool
