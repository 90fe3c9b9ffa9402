#include "sim/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <unordered_map>

#include "sim/csv.h"

namespace gpupool {

Result<std::vector<NodeSpec>> ReadOpenbNodes(const std::string& path, const GpuCatalog& catalog,
                                             int max_tasks) {
  ASSIGN_OR_RETURN(CsvFile f, CsvFile::Open(path, {"sn", "cpu_milli", "memory_mib", "gpu", "model"}));
  std::vector<NodeSpec> nodes;
  while (f.Next()) {
    RETURN_IF_ERROR(f.CheckWidth());
    const std::string& name = f.Get("sn");
    if (name.empty()) return f.RowError(Status::InvalidArgument("empty node name (sn)"));
    auto cpu = ParseCsvInt(f.Get("cpu_milli"), "cpu_milli");
    if (!cpu.ok()) return f.RowError(cpu.status());
    auto mem = ParseCsvInt(f.Get("memory_mib"), "memory_mib");
    if (!mem.ok()) return f.RowError(mem.status());
    auto gpus = ParseCsvInt(f.Get("gpu"), "gpu");
    if (!gpus.ok()) return f.RowError(gpus.status());
    if (*cpu < 0 || *mem < 0 || *gpus < 0 || *gpus > 64) {
      return f.RowError(Status::InvalidArgument("cpu_milli, memory_mib must be >= 0 and gpu within 0..64"));
    }
    const std::string& model = f.Get("model");
    if (*gpus > 0 && model.empty())
      return f.RowError(Status::InvalidArgument("a node with GPUs needs a model"));
    NodeSpec spec = MakeNode(name, MilliCpu(*cpu), MiB(*mem), static_cast<int>(*gpus), model, catalog);
    spec.max_tasks = max_tasks;
    if (Status st = ValidateNodeSpec(spec, catalog); !st.ok()) return f.RowError(st);
    nodes.push_back(std::move(spec));
  }
  RETURN_IF_ERROR(f.error());
  return nodes;
}

Result<TracePod> ReadOpenbPodRow(const CsvFile& f) {
  RETURN_IF_ERROR(f.CheckWidth());
  TracePod p;
  p.name = f.Get("name");
  if (p.name.empty()) return f.RowError(Status::InvalidArgument("empty pod name"));
  auto cpu = ParseCsvInt(f.Get("cpu_milli"), "cpu_milli");
  if (!cpu.ok()) return f.RowError(cpu.status());
  auto mem = ParseCsvInt(f.Get("memory_mib"), "memory_mib");
  if (!mem.ok()) return f.RowError(mem.status());
  auto num_gpu = ParseCsvInt(f.Get("num_gpu"), "num_gpu");
  if (!num_gpu.ok()) return f.RowError(num_gpu.status());
  auto milli = ParseCsvInt(f.Get("gpu_milli"), "gpu_milli");
  if (!milli.ok()) return f.RowError(milli.status());
  // Far above any node, far below any overflow of a sum over a million pods.
  constexpr int64_t kMaxAmount = int64_t{1} << 40;
  if (*cpu < 0 || *mem < 0 || *num_gpu < 0 || *cpu > kMaxAmount || *mem > kMaxAmount || *num_gpu > 1024) {
    return f.RowError(
        Status::InvalidArgument("cpu_milli and memory_mib must be 0..2^40 and num_gpu 0..1024"));
  }
  p.request.cpu = MilliCpu(*cpu);
  p.request.memory = MiB(*mem);
  if (*num_gpu == 0) {
    if (*milli != 0) return f.RowError(Status::InvalidArgument("a pod with num_gpu 0 has gpu_milli set"));
  } else {
    if (*milli <= 0) return f.RowError(Status::InvalidArgument("a GPU pod needs gpu_milli > 0"));
    p.request.gpu_count = static_cast<int>(*num_gpu);
    p.request.gpu_share = MilliGpu(std::min<int64_t>(*milli, 1000));
    if (const std::string* spec = f.GetOptional("gpu_spec")) {
      size_t start = 0;
      while (start <= spec->size()) {
        size_t bar = spec->find('|', start);
        if (bar == std::string::npos) bar = spec->size();
        if (bar > start) p.request.gpu_models.push_back(spec->substr(start, bar - start));
        start = bar + 1;
      }
    }
  }
  if (Status st = ValidateTaskRequest(p.request); !st.ok()) return f.RowError(st);
  return p;
}

Result<std::vector<TracePod>> ReadOpenbPods(const std::string& path) {
  ASSIGN_OR_RETURN(CsvFile f,
                   CsvFile::Open(path, {"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"}));
  std::vector<TracePod> pods;
  while (f.Next()) {
    ASSIGN_OR_RETURN(TracePod p, ReadOpenbPodRow(f));
    pods.push_back(std::move(p));
  }
  RETURN_IF_ERROR(f.error());
  return pods;
}

int64_t GpuDemand(const std::vector<TracePod>& pods) {
  int64_t d = 0;
  for (const auto& p : pods) d += p.request.total_gpu_share().units();
  return d;
}

std::vector<TracePod> PrepareWorkload(std::vector<TracePod> pods, int64_t capacity_milli, double ratio,
                                      Rng& rng) {
  std::sort(pods.begin(), pods.end(), [](const TracePod& a, const TracePod& b) { return a.name < b.name; });
  const std::vector<TracePod> originals = pods;
  for (size_t i = pods.size(); i > 1; --i) std::swap(pods[i - 1], pods[rng.Uniform(i)]);
  const auto target = static_cast<int64_t>(ratio * static_cast<double>(capacity_milli));
  int64_t demand = GpuDemand(pods);
  // Without GPU pods the demand never grows: nothing to resample.
  if (originals.empty() || GpuDemand(originals) == 0) return pods;
  if (demand < target) {
    for (int i = 0;; ++i) {
      const TracePod& drawn = originals[rng.Uniform(originals.size())];
      // The stop test uses the per-GPU share, as the reference experiments do.
      if (demand + drawn.request.gpu_share.units() > target) break;
      demand += drawn.request.total_gpu_share().units();
      TracePod copy = drawn;
      copy.name = fmt::format("{}-tuned-{}", drawn.name, i);
      pods.push_back(std::move(copy));
    }
  } else {
    while (demand > target && !pods.empty()) {
      const size_t idx = rng.Uniform(pods.size());
      demand -= pods[idx].request.total_gpu_share().units();
      pods.erase(pods.begin() + static_cast<std::ptrdiff_t>(idx));
    }
  }
  return pods;
}

}  // namespace gpupool
