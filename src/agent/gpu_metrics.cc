#include "agent/gpu_metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <tuple>

namespace gpupool {
namespace {

std::string EscapeLabel(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string EscapeHelp(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

struct Series {
  std::string labels;  // without braces
  double value = 0;
};

class Writer {
 public:
  void Metric(std::string_view name, std::string_view type, std::string_view help,
              const std::vector<Series>& series) {
    if (series.empty()) return;
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, EscapeHelp(help), name, type);
    for (const Series& s : series) out_ += fmt::format("{}{{{}}} {}\n", name, s.labels, Number(s.value));
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// One per-GPU sample field: the metric it becomes.
struct SampleField {
  const char* name;
  const char* type;
  const char* help;
  std::optional<double> GpuSample::*field;
};

// The 25 fields of dcgm-exporter's default set (INTERFACES.md section 4), in base units. Where
// each comes from, and when it may be absent: the comment at the end of Nvml::Sample().
const SampleField kSampleFields[] = {
    {"gpupool_gpu_sm_clock_hertz", "gauge", "SM clock frequency in hertz.", &GpuSample::sm_clock_hz},
    {"gpupool_gpu_memory_clock_hertz", "gauge", "Memory clock frequency in hertz.",
     &GpuSample::memory_clock_hz},
    {"gpupool_gpu_memory_temperature_celsius", "gauge", "Memory temperature in degrees Celsius.",
     &GpuSample::memory_temperature_celsius},
    {"gpupool_gpu_temperature_celsius", "gauge", "GPU temperature in degrees Celsius.",
     &GpuSample::gpu_temperature_celsius},
    {"gpupool_gpu_power_watts", "gauge", "Power draw in watts.", &GpuSample::power_watts},
    {"gpupool_gpu_energy_joules_total", "counter", "Energy consumed since the driver loaded, in joules.",
     &GpuSample::energy_joules_total},
    {"gpupool_gpu_pcie_replays_total", "counter", "PCIe replays (retries) since the driver loaded.",
     &GpuSample::pcie_replays_total},
    {"gpupool_gpu_utilization_ratio", "gauge", "Fraction of time a kernel was running on the GPU (0-1).",
     &GpuSample::gpu_utilization_ratio},
    {"gpupool_gpu_memory_copy_utilization_ratio", "gauge",
     "Fraction of time device memory was being read or written (0-1).",
     &GpuSample::memory_copy_utilization_ratio},
    {"gpupool_gpu_encoder_utilization_ratio", "gauge", "Video encoder utilization (0-1).",
     &GpuSample::encoder_utilization_ratio},
    {"gpupool_gpu_decoder_utilization_ratio", "gauge", "Video decoder utilization (0-1).",
     &GpuSample::decoder_utilization_ratio},
    {"gpupool_gpu_last_xid", "gauge", "Code of the last XID error seen (0: none).", &GpuSample::last_xid},
    {"gpupool_gpu_framebuffer_free_bytes", "gauge", "Free framebuffer memory in bytes.",
     &GpuSample::framebuffer_free_bytes},
    {"gpupool_gpu_framebuffer_used_bytes", "gauge", "Used framebuffer memory in bytes.",
     &GpuSample::framebuffer_used_bytes},
    {"gpupool_gpu_framebuffer_reserved_bytes", "gauge",
     "Framebuffer memory reserved by the driver, in bytes.", &GpuSample::framebuffer_reserved_bytes},
    {"gpupool_gpu_nvlink_bandwidth_bytes_total", "counter",
     "Data bytes sent and received over all NVLink links since the driver loaded (no protocol overhead).",
     &GpuSample::nvlink_bandwidth_bytes_total},
    {"gpupool_gpu_vgpu_license_status", "gauge",
     "vGPU software license status on a vGPU guest: 1 licensed, 0 not licensed.",
     &GpuSample::vgpu_license_status},
    {"gpupool_gpu_remapped_rows_uncorrectable_total", "counter",
     "Memory rows remapped for uncorrectable errors.", &GpuSample::remapped_rows_uncorrectable_total},
    {"gpupool_gpu_remapped_rows_correctable_total", "counter", "Memory rows remapped for correctable errors.",
     &GpuSample::remapped_rows_correctable_total},
    {"gpupool_gpu_row_remap_failure", "gauge", "1 if remapping of memory rows has failed, else 0.",
     &GpuSample::row_remap_failure},
    {"gpupool_gpu_graphics_engine_active_ratio", "gauge",
     "Fraction of time the graphics or compute engine was active since the previous scrape (0-1).",
     &GpuSample::graphics_engine_active_ratio},
    {"gpupool_gpu_tensor_pipe_active_ratio", "gauge",
     "Fraction of time the SMs ran any tensor operation since the previous scrape (0-1).",
     &GpuSample::tensor_pipe_active_ratio},
    {"gpupool_gpu_dram_active_ratio", "gauge",
     "Device memory bandwidth used as a fraction of the peak since the previous scrape (0-1).",
     &GpuSample::dram_active_ratio},
    {"gpupool_gpu_pcie_transmit_bytes_per_second", "gauge", "PCIe transmit throughput in bytes per second.",
     &GpuSample::pcie_tx_bytes_per_second},
    {"gpupool_gpu_pcie_receive_bytes_per_second", "gauge", "PCIe receive throughput in bytes per second.",
     &GpuSample::pcie_rx_bytes_per_second},
};

}  // namespace

std::string RenderGpuMetrics(const std::string& node, const Inventory& inv,
                             const std::vector<GpuSample>& samples, const std::vector<GpuHolder>& holders) {
  const std::string simulated = inv.simulated ? ",simulated=\"true\"" : "";
  std::map<int, std::string> gpu_labels;  // by index
  for (const GpuInfo& g : inv.gpus) {
    gpu_labels[g.index] =
        fmt::format("gpu=\"{}\",uuid=\"{}\",model=\"{}\",node=\"{}\"{}", g.index, EscapeLabel(g.uuid),
                    EscapeLabel(g.model.empty() ? g.name : g.model), EscapeLabel(node), simulated);
  }
  auto labels_of = [&](int index) {
    auto it = gpu_labels.find(index);
    if (it != gpu_labels.end()) return it->second;
    return fmt::format("gpu=\"{}\",uuid=\"\",model=\"\",node=\"{}\"{}", index, EscapeLabel(node), simulated);
  };

  std::vector<const GpuInfo*> gpus;
  for (const GpuInfo& g : inv.gpus) gpus.push_back(&g);
  std::sort(gpus.begin(), gpus.end(), [](const GpuInfo* a, const GpuInfo* b) { return a->index < b->index; });
  std::vector<const GpuSample*> sorted_samples;
  for (const GpuSample& s : samples) sorted_samples.push_back(&s);
  std::stable_sort(sorted_samples.begin(), sorted_samples.end(),
                   [](const GpuSample* a, const GpuSample* b) { return a->index < b->index; });

  Writer w;
  std::vector<Series> series;
  for (const GpuInfo* g : gpus) series.push_back({labels_of(g->index), static_cast<double>(g->memory_bytes)});
  w.Metric("gpupool_gpu_memory_total_bytes", "gauge", "Total framebuffer memory of the GPU in bytes.",
           series);
  series.clear();
  for (const GpuInfo* g : gpus) series.push_back({labels_of(g->index), g->healthy ? 1.0 : 0.0});
  w.Metric("gpupool_gpu_healthy", "gauge", "1 if the GPU is healthy, 0 if not (XID, ECC, row remapping).",
           series);

  for (const SampleField& f : kSampleFields) {
    series.clear();
    for (const GpuSample* s : sorted_samples) {
      if (const std::optional<double>& v = s->*f.field) series.push_back({labels_of(s->index), *v});
    }
    w.Metric(f.name, f.type, f.help, series);
  }

  std::vector<GpuHolder> sorted_holders = holders;
  std::sort(sorted_holders.begin(), sorted_holders.end(), [](const GpuHolder& a, const GpuHolder& b) {
    return std::tie(a.gpu, a.job, a.task) < std::tie(b.gpu, b.job, b.task);
  });
  // A task holding one GPU twice (should not happen) is one series: its shares add up.
  std::vector<GpuHolder> merged;
  for (const GpuHolder& h : sorted_holders) {
    if (!merged.empty() && merged.back().gpu == h.gpu && merged.back().job == h.job &&
        merged.back().task == h.task) {
      merged.back().share_milli += h.share_milli;
      merged.back().memory_bytes += h.memory_bytes;
    } else {
      merged.push_back(h);
    }
  }
  sorted_holders = std::move(merged);
  auto holder_labels = [&](const GpuHolder& h) {
    return fmt::format("{},job=\"{}\",task=\"{}\"", labels_of(h.gpu), EscapeLabel(h.job),
                       EscapeLabel(h.task));
  };
  series.clear();
  for (const GpuHolder& h : sorted_holders) series.push_back({holder_labels(h), h.share_milli / 1000.0});
  w.Metric("gpupool_gpu_allocation_share_ratio", "gauge", "Share of the GPU allocated to the task (0-1).",
           series);
  series.clear();
  for (const GpuHolder& h : sorted_holders) {
    series.push_back({holder_labels(h), static_cast<double>(h.memory_bytes)});
  }
  w.Metric("gpupool_gpu_allocation_memory_bytes", "gauge", "GPU memory allocated to the task in bytes.",
           series);
  return w.Take();
}

}  // namespace gpupool
