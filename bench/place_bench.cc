// Placement decisions per second, one thread.
//
//   BM_Place/<policy>/<cluster>/<fill%>         the pipeline as configured (score cache on)
//   BM_PlaceNoCache/<policy>/<cluster>/<fill%>  the same with the score cache off (before/after)
//
// Clusters: "openb" = the Alibaba cluster (1,213 nodes, 6,212 GPUs); "synth5000" = 5,000 nodes x
// 8 GPUs, models cycled from the Alibaba node list, 128 CPUs and 1 TiB each. The cluster is first
// filled to <fill%> of its GPU share with pods drawn from the default trace; each iteration then
// places one more drawn pod (a full decision: filter, score, node and GPU selection, commit) and
// releases it again, so the fill stays put and one node changes per decision, as in a busy pool.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "common/rng.h"
#include "common/value.h"
#include "model/ledger.h"
#include "sched/registry.h"
#include "sched/scheduler.h"
#include "sched/typical_pods.h"
#include "sim/trace.h"

namespace gpupool {
namespace {

struct Inputs {
  std::vector<NodeSpec> openb;
  std::vector<TracePod> pods;
  std::vector<TypicalPod> typical;
};

const Inputs& LoadInputs() {
  static const Inputs inputs = [] {
    Inputs in;
    const GpuCatalog catalog = GpuCatalog::Builtin();
    auto nodes =
        ReadOpenbNodes(std::string(GPUPOOL_DATA_DIR) + "/alibaba/openb_node_list_gpu_node.csv", catalog);
    auto pods = ReadOpenbPods(std::string(GPUPOOL_DATA_DIR) + "/alibaba/openb_pod_list_default.csv");
    if (!nodes.ok() || !pods.ok()) std::abort();
    in.openb = std::move(nodes).value();
    in.pods = std::move(pods).value();
    std::vector<TaskRequest> requests;
    for (const auto& p : in.pods) requests.push_back(p.request);
    in.typical = ComputeTypicalPods(requests);
    return in;
  }();
  return inputs;
}

std::vector<NodeSpec> MakeCluster(const std::string& cluster, const GpuCatalog& catalog) {
  const Inputs& in = LoadInputs();
  if (cluster == "openb") return in.openb;
  std::vector<NodeSpec> nodes;
  for (int i = 0; i < 5000; ++i) {
    const std::string& model = in.openb[static_cast<size_t>(i) % in.openb.size()].gpus.front().model;
    NodeSpec n =
        MakeNode("synth-" + std::to_string(i), MilliCpu(128000), MiB(1024 * 1024), 8, model, catalog);
    n.max_tasks = 1001;
    nodes.push_back(std::move(n));
  }
  return nodes;
}

void BM_Place(benchmark::State& state, std::string policy, std::string cluster, int fill, bool cache) {
  const Inputs& in = LoadInputs();
  const GpuCatalog catalog = GpuCatalog::Builtin();
  Ledger ledger(catalog);
  for (auto& n : MakeCluster(cluster, catalog)) {
    if (!ledger.AddNode(std::move(n)).ok()) std::abort();
  }
  // "balanced-fixed": balanced without adapting its weights to the workload (adapt: false), to
  // measure what adapting costs beside it.
  const bool fixed = policy == "balanced-fixed";
  auto profile = ProfileForPolicy(fixed ? "balanced" : policy);
  if (!profile.ok()) std::abort();
  if (fixed) profile->scores[0].args = Value(Value::Map{{"adapt", false}});
  profile->cache_scores = cache;
  SeededRng rng(42);
  PluginInit init;
  init.typical_pods = &in.typical;
  auto scheduler = Scheduler::Create(*profile, DefaultRegistry(), ledger, rng, init);
  if (!scheduler.ok()) std::abort();
  Scheduler& s = **scheduler;
  s.ShuffleTieBreakRanks();

  SeededRng draw(7);
  const int64_t target = ledger.total_gpu_share() * fill / 100;
  int misses = 0;
  while (ledger.used_gpu_share() < target && misses < 2000) {
    const TracePod& p = in.pods[draw.Uniform(in.pods.size())];
    if (!p.request.wants_gpu()) continue;
    s.Observe(p.request);  // what a policy that learns online sees (others ignore it)
    misses = s.Place(p.request).ok() ? 0 : misses + 1;
  }
  const double reached =
      100.0 * static_cast<double>(ledger.used_gpu_share()) / static_cast<double>(ledger.total_gpu_share());

  int64_t placed = 0;
  for (auto _ : state) {
    const TracePod& p = in.pods[draw.Uniform(in.pods.size())];
    s.Observe(p.request);
    auto id = s.Place(p.request);
    if (id.ok()) {
      ++placed;
      if (!ledger.Release(*id).ok()) std::abort();
    }
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["fill_pct"] = reached;
  state.counters["placed_pct"] =
      state.iterations() ? 100.0 * static_cast<double>(placed) / static_cast<double>(state.iterations()) : 0;
  const auto& st = s.stats();
  const double lookups = static_cast<double>(st.score_cache_hits + st.score_cache_misses);
  state.counters["cache_hit_pct"] =
      lookups > 0 ? 100.0 * static_cast<double>(st.score_cache_hits) / lookups : 0;
}

void RegisterAll() {
  const std::vector<std::string> policies = {"random",  "dotprod", "gpuclustering", "gpupacking",
                                             "bestfit", "fgd",     "balanced",      "balanced-fixed",
                                             "binpack", "spread",  "topology"};
  for (const std::string cluster : {"openb", "synth5000"}) {
    for (int fill : {50, 90}) {
      for (const auto& policy : policies) {
        const std::string name = "BM_Place/" + policy + "/" + cluster + "/" + std::to_string(fill);
        benchmark::RegisterBenchmark(name.c_str(), BM_Place, policy, cluster, fill, true)
            ->Unit(benchmark::kMicrosecond);
      }
      const std::string name = "BM_PlaceNoCache/fgd/" + cluster + "/" + std::to_string(fill);
      benchmark::RegisterBenchmark(name.c_str(), BM_Place, std::string("fgd"), cluster, fill, false)
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

}  // namespace
}  // namespace gpupool

int main(int argc, char** argv) {
  gpupool::RegisterAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
