#include "sim/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <unordered_map>

namespace gpupool {

namespace {

std::vector<std::string> SplitCsv(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : line) {
    if (c == ',') {
      out.push_back(std::move(cur));
      cur.clear();
    } else if (c != '\r') {
      cur += c;
    }
  }
  out.push_back(std::move(cur));
  return out;
}

Result<int64_t> ParseInt(const std::string& s, const char* column) {
  int64_t v = 0;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, v);
  if (ec != std::errc() || ptr != end) {
    return Status::InvalidArgument(fmt::format("column '{}' is not an integer: '{}'", column, s));
  }
  return v;
}

// Reads a CSV with a header; calls row(fields, column index) per data line.
class CsvFile {
 public:
  static Result<CsvFile> Open(const std::string& path, const std::vector<std::string>& required) {
    CsvFile f;
    f.path_ = path;
    f.in_.open(path);
    if (!f.in_) return Status::IoError(fmt::format("{}: cannot open", path));
    std::string header;
    if (!std::getline(f.in_, header))
      return Status::InvalidArgument(fmt::format("{}: empty file, no header", path));
    f.line_no_ = 1;
    const auto names = SplitCsv(header);
    for (const auto& r : required) {
      auto it = std::find(names.begin(), names.end(), r);
      if (it == names.end()) {
        return Status::InvalidArgument(fmt::format("{}:1: header has no column '{}'", path, r));
      }
      f.index_[r] = static_cast<size_t>(it - names.begin());
    }
    for (size_t i = 0; i < names.size(); ++i) f.all_[names[i]] = i;
    f.columns_ = names.size();
    return f;
  }
  bool Next() {
    while (std::getline(in_, line_)) {
      ++line_no_;
      if (!line_.empty() && line_ != "\r") {
        fields_ = SplitCsv(line_);
        return true;
      }
    }
    return false;
  }
  Status RowError(const Status& s) const {
    return Status(s.code(), fmt::format("{}:{}: {}", path_, line_no_, s.message()));
  }
  Status CheckWidth() const {
    if (fields_.size() != columns_) {
      return Status::InvalidArgument(
          fmt::format("{}:{}: {} fields, header has {}", path_, line_no_, fields_.size(), columns_));
    }
    return Status::Ok();
  }
  const std::string& Get(const std::string& column) const { return fields_[index_.at(column)]; }
  const std::string* GetOptional(const std::string& column) const {
    auto it = all_.find(column);
    return it == all_.end() ? nullptr : &fields_[it->second];
  }

 private:
  std::string path_;
  std::ifstream in_;
  std::string line_;
  std::vector<std::string> fields_;
  std::unordered_map<std::string, size_t> index_;
  std::unordered_map<std::string, size_t> all_;
  size_t columns_ = 0;
  int line_no_ = 0;
};

}  // namespace

Result<std::vector<NodeSpec>> ReadOpenbNodes(const std::string& path, const GpuCatalog& catalog,
                                             int max_tasks) {
  ASSIGN_OR_RETURN(CsvFile f, CsvFile::Open(path, {"sn", "cpu_milli", "memory_mib", "gpu", "model"}));
  std::vector<NodeSpec> nodes;
  while (f.Next()) {
    RETURN_IF_ERROR(f.CheckWidth());
    const std::string& name = f.Get("sn");
    if (name.empty()) return f.RowError(Status::InvalidArgument("empty node name (sn)"));
    auto cpu = ParseInt(f.Get("cpu_milli"), "cpu_milli");
    if (!cpu.ok()) return f.RowError(cpu.status());
    auto mem = ParseInt(f.Get("memory_mib"), "memory_mib");
    if (!mem.ok()) return f.RowError(mem.status());
    auto gpus = ParseInt(f.Get("gpu"), "gpu");
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
  return nodes;
}

Result<std::vector<TracePod>> ReadOpenbPods(const std::string& path) {
  ASSIGN_OR_RETURN(CsvFile f,
                   CsvFile::Open(path, {"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"}));
  std::vector<TracePod> pods;
  while (f.Next()) {
    RETURN_IF_ERROR(f.CheckWidth());
    TracePod p;
    p.name = f.Get("name");
    if (p.name.empty()) return f.RowError(Status::InvalidArgument("empty pod name"));
    auto cpu = ParseInt(f.Get("cpu_milli"), "cpu_milli");
    if (!cpu.ok()) return f.RowError(cpu.status());
    auto mem = ParseInt(f.Get("memory_mib"), "memory_mib");
    if (!mem.ok()) return f.RowError(mem.status());
    auto num_gpu = ParseInt(f.Get("num_gpu"), "num_gpu");
    if (!num_gpu.ok()) return f.RowError(num_gpu.status());
    auto milli = ParseInt(f.Get("gpu_milli"), "gpu_milli");
    if (!milli.ok()) return f.RowError(milli.status());
    if (*cpu < 0 || *mem < 0 || *num_gpu < 0) {
      return f.RowError(Status::InvalidArgument("cpu_milli, memory_mib and num_gpu must be >= 0"));
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
    pods.push_back(std::move(p));
  }
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
