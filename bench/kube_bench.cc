// The Kubernetes scheduler's core at cluster scale, one thread, no I/O: the cluster state built from
// Node and Pod objects (JSON, as the informers hand them over), then scheduling cycles until
// nothing more fits, every binding echoed back as the bound pod the informer would deliver. Beside
// it, in the same run, the placement core alone (Scheduler::Place on a Ledger) on the same cluster
// and pods, twice: with the full filter-and-score pass at every decision and with the best-node
// index (Scheduler::SetBestNodeIndex), which choose the same nodes.
//
//   kube_bench [--nodes 5000,10000] [--pods 100000] [--no-core]   (--no-core: the kube state alone)
//
// Nodes: 8 GPUs each, models cycled from the Alibaba node list, 128 CPUs, 1 TiB; the inventory
// annotation kube-node writes. Pods: the Alibaba default trace's pods (openb_pod_list_default),
// cycled and renamed, as `nvidia.com/gpu: N` or `gpupool.io/gpu-milli` pods with CPU and memory
// requests. Reports (docs/performance.md): the time to take in the nodes and the pods, to the first
// binding order, pods bound per second over the whole run, decisions per second, and the
// process's peak resident memory.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kube/cluster_state.h"
#include "model/ledger.h"
#include "sched/registry.h"
#include "sched/scheduler.h"
#include "sim/trace.h"

namespace {

using gpupool::kube::BindOrder;
using gpupool::kube::ClusterState;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

long PeakRssMiB() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::atol(line.c_str() + 6) / 1024;
  return -1;
}

std::vector<std::string> Models() {
  auto nodes = gpupool::ReadOpenbNodes(std::string(GPUPOOL_DATA_DIR) + "/alibaba/openb_node_list_gpu_node.csv",
                                       gpupool::GpuCatalog::Builtin());
  if (!nodes.ok()) std::abort();
  std::vector<std::string> models;
  for (const auto& n : *nodes)
    if (!n.gpus.empty()) models.push_back(n.gpus.front().model);
  return models;
}

Json NodeJson(int i, const std::string& model) {
  Json inv = {{"gpus", Json::array()}};
  for (int g = 0; g < 8; ++g) inv["gpus"].push_back({{"index", g}, {"uuid", fmt::format("GPU-{}-{}", i, g)}, {"model", model}});
  return {{"metadata", {{"name", fmt::format("node-{}", i)}, {"annotations", {{"gpupool.io/inventory", inv.dump()}}}}},
          {"status",
           {{"allocatable", {{"cpu", "128"}, {"memory", "1Ti"}, {"pods", "1001"}}},
            {"conditions", Json::array({{{"type", "Ready"}, {"status", "True"}}})}}}};
}

Json PodJson(int i, const gpupool::TaskRequest& r) {
  Json limits = Json::object();
  if (r.gpu_count > 0 && r.gpu_share.units() >= 1000) limits["nvidia.com/gpu"] = r.gpu_count;
  if (r.gpu_count > 0 && r.gpu_share.units() < 1000) limits["gpupool.io/gpu-milli"] = r.gpu_share.units();
  Json requests = {{"cpu", fmt::format("{}m", r.cpu.units())}, {"memory", fmt::format("{}Mi", r.memory.units())}};
  return {{"metadata", {{"name", fmt::format("pod-{}", i)}, {"namespace", "ml"}, {"uid", fmt::format("uid-{}", i)}}},
          {"spec",
           {{"schedulerName", "gpupool"},
            {"containers", Json::array({{{"name", "c"}, {"resources", {{"limits", limits}, {"requests", requests}}}}})}}},
          {"status", {{"phase", "Pending"}}}};
}

void Run(int node_count, int pod_count, bool with_core, const std::vector<std::string>& models,
         const std::vector<gpupool::TracePod>& trace) {
  std::vector<Json> nodes, pods;
  for (int i = 0; i < node_count; ++i) nodes.push_back(NodeJson(i, models[static_cast<size_t>(i) % models.size()]));
  std::vector<gpupool::TaskRequest> requests;
  for (int i = 0; i < pod_count; ++i) {
    const auto& r = trace[static_cast<size_t>(i) % trace.size()].request;
    requests.push_back(r);
    pods.push_back(PodJson(i, r));
  }

  // The informer's echo of a cycle's bindings: each pod bound, with the binding's annotation.
  auto echo = [&pods](ClusterState& state, const gpupool::kube::CycleResult& r) {
    for (const BindOrder& b : r.binds) {
      const size_t i = static_cast<size_t>(std::atol(b.name.c_str() + 4));
      pods[i]["spec"]["nodeName"] = b.node;
      pods[i]["metadata"]["annotations"]["gpupool.io/assignment"] = b.assignment;
      state.ApplyPod("MODIFIED", pods[i]);
    }
  };

  // ---- the Kubernetes scheduler's state and cycles ----
  const auto t0 = Clock::now();
  auto created = ClusterState::Create({});
  if (!created.ok()) std::abort();
  ClusterState& state = **created;
  for (const Json& n : nodes) state.ApplyNode("ADDED", n);
  const double t_nodes = Since(t0);
  for (const Json& p : pods) state.ApplyPod("ADDED", p);
  const double t_pods = Since(t0);
  double t_first = -1;
  size_t bound = 0;
  uint64_t decisions = 0;
  double in_cycles = 0;
  while (true) {
    const auto c0 = Clock::now();
    gpupool::kube::CycleResult r = state.Cycle();
    in_cycles += Since(c0);
    decisions += static_cast<uint64_t>(r.decisions);
    if (!r.binds.empty() && t_first < 0) t_first = Since(t0);
    if (r.decisions == 0) break;
    echo(state, r);
    bound += r.binds.size();
  }
  const double t_all = Since(t0);
  const long rss = PeakRssMiB();
  if (!state.CheckInvariants().ok()) std::abort();

  // ---- the same pods arriving 1,000 at a time, a cycle after each batch (a live cluster: the
  // typical workload is learned again as pods arrive) ----
  double arrive_cycles = 0;
  uint64_t arrive_decisions = 0;
  size_t arrive_bound = 0;
  gpupool::kube::ClusterCounts arrive_counts;
  {
    for (Json& p : pods) {
      p["spec"].erase("nodeName");
      p["metadata"].erase("annotations");
    }
    auto fresh = ClusterState::Create({});
    if (!fresh.ok()) std::abort();
    ClusterState& live = **fresh;
    for (const Json& n : nodes) live.ApplyNode("ADDED", n);
    constexpr size_t kBatch = 1000;
    for (size_t next = 0;;) {
      const size_t end = std::min(pods.size(), next + kBatch);
      for (; next < end; ++next) live.ApplyPod("ADDED", pods[next]);
      const auto c0 = Clock::now();
      gpupool::kube::CycleResult r = live.Cycle();
      arrive_cycles += Since(c0);
      arrive_decisions += static_cast<uint64_t>(r.decisions);
      echo(live, r);
      arrive_bound += r.binds.size();
      if (next >= pods.size() && r.decisions == 0) break;
    }
    if (!live.CheckInvariants().ok()) std::abort();
    arrive_counts = live.counts();
  }

  // ---- the placement core alone, same cluster and pods: the full pass, then the best-node index ----
  struct Core {
    size_t placed = 0;
    double seconds = 0;
    gpupool::Scheduler::Stats stats;
  };
  auto core = [&](bool indexed) {
    gpupool::Ledger ledger;
    for (int i = 0; i < node_count; ++i) {
      gpupool::NodeSpec s = gpupool::MakeNode(fmt::format("node-{}", i), gpupool::MilliCpu(128000), gpupool::MiB(1 << 20), 8,
                                              models[static_cast<size_t>(i) % models.size()], gpupool::GpuCatalog::Builtin());
      s.max_tasks = 1001;
      if (!ledger.AddNode(std::move(s)).ok()) std::abort();
    }
    auto profile = gpupool::ProfileForPolicy("balanced");
    gpupool::SeededRng rng(1);
    std::vector<gpupool::TypicalPod> typical = {{0, 1000, 1, {}, 1.0}};
    gpupool::PluginInit init;
    init.typical_pods = &typical;
    auto sched = gpupool::Scheduler::Create(*profile, gpupool::DefaultRegistry(), ledger, rng, init);
    if (!sched.ok()) std::abort();
    (*sched)->SetBestNodeIndex(indexed);
    Core out;
    const auto c0 = Clock::now();
    for (const auto& r : requests) {
      (*sched)->Observe(r);
      if ((*sched)->Place(r).ok()) ++out.placed;
    }
    out.seconds = Since(c0);
    out.stats = (*sched)->stats();
    return out;
  };
  Core full, indexed;
  if (with_core) {
    full = core(false);
    indexed = core(true);
  }

  fmt::print("{} nodes x 8 GPUs, {} pending pods (Alibaba default trace, cycled)\n", node_count, pod_count);
  fmt::print("  kube state: nodes taken in {:.2f} s, pods {:.2f} s; first binding order at {:.2f} s\n", t_nodes,
             t_pods - t_nodes, t_first);
  fmt::print("  kube state: {} pods bound in {:.2f} s from the start ({:.0f} pods/s); {} decisions, {:.0f}/s in cycles\n",
             bound, t_all, bound / t_all, decisions, decisions / in_cycles);
  fmt::print("  kube state, pods arriving 1000 per cycle: {} bound, {} decisions, {:.0f}/s in cycles; relearning: {} "
             "rebuilt, {} kept\n",
             arrive_bound, arrive_decisions, arrive_decisions / arrive_cycles, arrive_counts.relearned,
             arrive_counts.relearn_kept);
  if (with_core) {
  fmt::print("  core alone, full pass: {} of {} placed in {:.2f} s ({:.0f} decisions/s)\n", full.placed, requests.size(),
             full.seconds, requests.size() / full.seconds);
  fmt::print("  core alone, best-node index: {} of {} placed in {:.2f} s ({:.0f} decisions/s); {} through the index, "
             "{} index builds, {} re-scorings, {:.1f} nodes looked at again per decision\n",
             indexed.placed, requests.size(), indexed.seconds, requests.size() / indexed.seconds,
             indexed.stats.index_decisions, indexed.stats.index_builds, indexed.stats.index_rescores,
             static_cast<double>(indexed.stats.index_updates) / static_cast<double>(requests.size()));
  }
  fmt::print("  peak resident memory so far: {} MiB\n", rss);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes = {5000, 10000};
  int pods = 100000;
  bool with_core = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-core") {
      with_core = false;
      continue;
    }
    if (i + 1 >= argc) {
      fmt::print(stderr, "usage: kube_bench [--nodes 5000,10000] [--pods 100000] [--no-core]\n");
      return 2;
    }
    if (a == "--pods") {
      pods = std::atoi(argv[++i]);
    } else if (a == "--nodes") {
      sizes.clear();
      for (const char* p = argv[++i]; *p;) {
        sizes.push_back(std::atoi(p));
        while (*p && *p != ',') ++p;
        if (*p == ',') ++p;
      }
    } else {
      fmt::print(stderr, "usage: kube_bench [--nodes 5000,10000] [--pods 100000] [--no-core]\n");
      return 2;
    }
  }
  auto trace = gpupool::ReadOpenbPods(std::string(GPUPOOL_DATA_DIR) + "/alibaba/openb_pod_list_default.csv");
  if (!trace.ok() || pods < 1) return 2;
  const std::vector<std::string> models = Models();
  for (int n : sizes) Run(n, pods, with_core, models, *trace);
  return 0;
}
