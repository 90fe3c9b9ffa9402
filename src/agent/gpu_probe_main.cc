// gpu_probe: prints what GPU discovery finds on this machine (NVML loaded at run time) as JSON,
// then the /metrics text the agent would serve. For scripts/gpu-smoke.sh on a real NVIDIA machine.
//
//   gpu_probe [--library PATH] [--node NAME] [--simulate SPEC] [--interval-ms N] [--cdi]
//
// The metrics come from a second sample taken N ms (default 1000) after a first one, as a scrape
// after an earlier scrape would: the GPM ratios (graphics engine, tensor pipe, DRAM active) are
// measured between two samples. --interval-ms 0 samples once, and those ratios are left out.
//
// Without NVML it says why and exits 2, unless --simulate SPEC is given ("8xH100-80GB",
// "dgx-h100", a YAML machine spec), which shows that simulated inventory instead.
//
// --cdi prints only the CDI spec the agent would generate for this machine (agent/cdi.h: the GPUs
// and MIG instances found, the driver files under /), as JSON, and samples nothing; compare it
// with `nvidia-ctk cdi generate` on a real NVIDIA machine.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "agent/cdi.h"
#include "agent/gpu_metrics.h"
#include "agent/inventory.h"
#include "agent/nvml.h"

namespace {

nlohmann::json InventoryJson(const gpupool::Inventory& inv) {
  nlohmann::json j;
  j["simulated"] = inv.simulated;
  j["source"] = inv.source;
  j["driverVersion"] = inv.driver_version;
  j["topology"] = inv.topology;
  j["gpus"] = nlohmann::json::array();
  for (const gpupool::GpuInfo& g : inv.gpus) {
    nlohmann::json gj = {{"index", g.index},
                         {"uuid", g.uuid},
                         {"name", g.name},
                         {"model", g.model},
                         {"memoryBytes", g.memory_bytes},
                         {"computeCapability", g.compute_capability},
                         {"pciBusId", g.pci_bus_id},
                         {"numaNode", g.numa_node},
                         {"minorNumber", g.minor_number},
                         {"migEnabled", g.mig_enabled},
                         {"healthy", g.healthy},
                         {"healthReason", g.health_reason}};
    gj["migProfiles"] = nlohmann::json::array();
    for (const gpupool::MigProfileInfo& p : g.mig_profiles) {
      gj["migProfiles"].push_back({{"id", p.profile_id},
                                   {"name", p.name},
                                   {"slices", p.slice_count},
                                   {"instances", p.instance_count},
                                   {"memoryMiB", p.memory_mib}});
    }
    gj["processes"] = nlohmann::json::array();
    for (const gpupool::GpuProcessInfo& p : g.processes) {
      gj["processes"].push_back({{"pid", p.pid}, {"usedMemoryBytes", p.used_memory_bytes}});
    }
    j["gpus"].push_back(std::move(gj));
  }
  return j;
}

// The text of /proc/driver/nvidia-caps/mig-minors (a few KiB; read no more than 1 MiB), empty
// where the driver has no MIG caps.
std::string MigMinorsText() {
  std::ifstream in("/proc/driver/nvidia-caps/mig-minors", std::ios::binary);
  std::string text(1 << 20, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

int PrintCdiSpec(const gpupool::Inventory& inv) {
  const gpupool::CdiSpec spec =
      gpupool::GenerateNvidiaCdiSpec(inv, gpupool::FindDriverFiles("/"), "/", MigMinorsText());
  std::cout << gpupool::CdiSpecToJson(spec).dump(2) << "\n";
  return 0;
}

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  std::string library;
  std::string simulate;
  std::string node = HostName();
  long interval_ms = 1000;
  bool cdi = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "gpu_probe: " << flag << " needs a value\n";
        std::exit(64);
      }
      return argv[++i];
    };
    if (arg == "--library") {
      library = value("--library");
    } else if (arg == "--simulate") {
      simulate = value("--simulate");
    } else if (arg == "--node") {
      node = value("--node");
    } else if (arg == "--interval-ms") {
      const std::string text = value("--interval-ms");
      char* end = nullptr;
      interval_ms = std::strtol(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || interval_ms < 0 || interval_ms > 60000) {
        std::cerr << "gpu_probe: --interval-ms wants 0..60000, not '" << text << "'\n";
        return 64;
      }
    } else if (arg == "--cdi") {
      cdi = true;
    } else if (arg == "-h" || arg == "--help") {
      std::cout
          << "usage: gpu_probe [--library PATH] [--node NAME] [--simulate SPEC] [--interval-ms N] [--cdi]\n";
      return 0;
    } else {
      std::cerr << "gpu_probe: unknown argument '" << arg << "' (see --help)\n";
      return 64;
    }
  }

  gpupool::Inventory inv;
  std::vector<gpupool::GpuSample> samples;
  if (simulate.empty()) {
    auto nvml = gpupool::Nvml::Load(library);
    if (!nvml.ok()) {
      std::cerr << "gpu_probe: NVML unavailable: " << nvml.status().ToString()
                << "\n  (run with --simulate 8xH100-80GB to see a simulated inventory)\n";
      return 2;
    }
    auto discovered = (*nvml)->Discover();
    if (!discovered.ok()) {
      std::cerr << "gpu_probe: discovery failed: " << discovered.status().ToString() << "\n";
      return 1;
    }
    inv = std::move(discovered).value();
    if (cdi) return PrintCdiSpec(inv);
    if (interval_ms > 0) {
      auto warmup = (*nvml)->Sample();  // the baseline for the GPM ratios
      if (!warmup.ok()) {
        std::cerr << "gpu_probe: sampling failed: " << warmup.status().ToString() << "\n";
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
    }
    auto sampled = (*nvml)->Sample();
    if (!sampled.ok()) {
      std::cerr << "gpu_probe: sampling failed: " << sampled.status().ToString() << "\n";
      return 1;
    }
    samples = std::move(sampled).value();
  } else {
    auto simulated = gpupool::SimulatedInventory(simulate, node);
    if (!simulated.ok()) {
      std::cerr << "gpu_probe: " << simulated.status().ToString() << "\n";
      return 1;
    }
    inv = std::move(simulated).value();
    if (cdi) return PrintCdiSpec(inv);  // no GPU devices (no device nodes): the driver files only
  }

  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  const long long mib =
      pages > 0 && page_size > 0 ? static_cast<long long>(pages) * page_size / (1024 * 1024) : 1024;
  const unsigned cpus = std::max(1U, std::thread::hardware_concurrency());
  nlohmann::json out;
  out["inventory"] = InventoryJson(inv);
  out["registration"] =
      gpupool::NodeRegistration(inv, node, std::to_string(cpus), fmt::format("{}Mi", mib), {});
  std::cout << out.dump(2) << "\n";
  std::cout << "# ---- /metrics ----\n";
  std::cout << gpupool::RenderGpuMetrics(node, inv, samples, {});
  return 0;
}
