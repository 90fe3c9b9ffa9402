// Helpers for the scheduler's unit tests: fluent task builders, small hand-made clusters and a
// scheduler built for a named policy over them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/rng.h"
#include "common/value.h"
#include "model/gpu_catalog.h"
#include "model/ledger.h"
#include "model/node.h"
#include "model/topology.h"
#include "model/workload.h"
#include "sched/framework.h"
#include "sched/profile.h"
#include "sched/registry.h"
#include "sched/scheduler.h"
#include "sched/typical_pods.h"

namespace gpupool::testutil {

// Task("4c").Cpu(4000).Mem(1024).Gpus(1, 500).Models({"T4"}) — reads like the request it builds.
class Task {
 public:
  Task& Cpu(int64_t milli) {
    r_.cpu = MilliCpu(milli);
    return *this;
  }
  Task& Mem(int64_t mib) {
    r_.memory = MiB(mib);
    return *this;
  }
  // `count` GPUs with `share` milli-GPU each.
  Task& Gpus(int count, int64_t share) {
    r_.gpu_count = count;
    r_.gpu_share = MilliGpu(share);
    return *this;
  }
  Task& GpuMem(int64_t mib) {
    r_.gpu_memory = MiB(mib);
    return *this;
  }
  Task& Models(std::vector<std::string> models) {
    r_.gpu_models = std::move(models);
    return *this;
  }
  Task& Nvlink() {
    r_.nvlink = true;
    return *this;
  }
  Task& Mig(std::string profile) {
    r_.gpu_count = 1;
    r_.gpu_share = MilliGpu(0);
    r_.mig_profile = std::move(profile);
    return *this;
  }
  // A task of a guaranteed job; what would hold it to its share (kEnforce* bit).
  Task& Guaranteed() {
    r_.guaranteed = true;
    return *this;
  }
  Task& EnforcedBy(uint8_t bit) {
    r_.enforced_by = bit;
    return *this;
  }
  // An MPS share of `owner` (DeriveSharing: the job's tenant).
  Task& Mps(std::string owner) {
    r_.enforced_by = kEnforceMps;
    r_.mps_owner = std::move(owner);
    return *this;
  }
  TaskRequest Build() const { return r_; }
  operator TaskRequest() const { return r_; }  // NOLINT

 private:
  TaskRequest r_;
};

inline TypicalPod Typical(int64_t cpu, int64_t share, int count, double weight,
                          std::vector<std::string> models = {}) {
  TypicalPod p;
  p.cpu = cpu;
  p.share = share;
  p.gpu_count = count;
  p.models = std::move(models);
  p.weight = weight;
  return p;
}

// A ledger of hand-made nodes and a scheduler over it. Not movable: the scheduler keeps references
// to the ledger and the Rng.
class TestCluster {
 public:
  explicit TestCluster(uint64_t seed = 1) : rng_(seed) {}
  TestCluster(const TestCluster&) = delete;
  TestCluster& operator=(const TestCluster&) = delete;

  // A node with `gpus` GPUs of `model` on a flat topology.
  NodeIndex AddNode(const std::string& name, int64_t cpu, int64_t memory, int gpus,
                    const std::string& model = "T4") {
    auto n = ledger_.AddNode(MakeNode(name, MilliCpu(cpu), MiB(memory), gpus, model, ledger_.catalog()));
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    return n.ok() ? *n : 0;
  }
  // A node built from a machine preset ("pcie-4gpu-nvlink-pairs", "dgx-h100", ...).
  NodeIndex AddMachine(const std::string& name, int64_t cpu, int64_t memory, const std::string& preset) {
    auto machine = MachinePreset(preset);
    EXPECT_TRUE(machine.ok()) << machine.status().ToString();
    auto spec = MakeNodeFromMachine(name, MilliCpu(cpu), MiB(memory), *machine, ledger_.catalog());
    EXPECT_TRUE(spec.ok()) << spec.status().ToString();
    auto n = ledger_.AddNode(std::move(spec).value());
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    return n.ok() ? *n : 0;
  }
  NodeIndex AddSpec(NodeSpec spec) {
    auto n = ledger_.AddNode(std::move(spec));
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    return n.ok() ? *n : 0;
  }

  // Commits a pre-existing task straight to the ledger: `cpu` mCPU, `memory` MiB and the given
  // (GPU index, share) grants. A single grant of less than a whole GPU is a share task.
  AllocationId Commit(NodeIndex node, int64_t cpu, std::vector<std::pair<int, int64_t>> gpus = {},
                      int64_t memory = 0) {
    Placement p;
    p.node = node;
    p.cpu = MilliCpu(cpu);
    p.memory = MiB(memory);
    for (const auto& [gpu, share] : gpus)
      p.gpus.push_back(GpuGrant{gpu, MilliGpu(share), MiB(0), std::nullopt});
    p.share_task = gpus.size() == 1 && gpus.front().second < kWholeGpu.units();
    auto id = ledger_.Commit(p);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : 0;
  }

  void SetTypicalPods(std::vector<TypicalPod> pods) { typical_ = std::move(pods); }

  // Builds the scheduler of a named policy (ProfileForPolicy) with the default registry.
  Scheduler& Build(const std::string& policy) {
    auto profile = ProfileForPolicy(policy);
    EXPECT_TRUE(profile.ok()) << profile.status().ToString();
    return BuildProfile(*profile, DefaultRegistry());
  }
  Scheduler& BuildProfile(const Profile& profile, const PluginRegistry& registry) {
    PluginInit init;
    init.typical_pods = &typical_;
    auto s = Scheduler::Create(profile, registry, ledger_, rng_, init);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    sched_ = std::move(s).value();
    return *sched_;
  }

  const std::vector<TypicalPod>& typical_pods() const { return typical_; }
  Ledger& ledger() { return ledger_; }
  Rng& rng() { return rng_; }
  Scheduler& sched() { return *sched_; }
  ModelId model_of(NodeIndex n) const { return ledger_.state(n).model; }

 private:
  Ledger ledger_;
  SeededRng rng_;
  std::vector<TypicalPod> typical_;
  std::unique_ptr<Scheduler> sched_;
};

// The GPU indices of a placement, in grant order.
inline std::vector<int> GpuIndices(const Placement& p) {
  std::vector<int> out;
  for (const GpuGrant& g : p.gpus) out.push_back(g.gpu);
  return out;
}

// The pipeline's cluster view of `ledger`: the normalisation maxima as the scheduler computes them
// (largest node CPU, largest GPU count x 1000).
inline ClusterView ViewOf(const Ledger& ledger, Rng* rng) {
  ClusterView v;
  v.ledger = &ledger;
  v.rng = rng;
  for (NodeIndex i = 0; i < ledger.node_count(); ++i) {
    v.max_node_cpu = std::max(v.max_node_cpu, ledger.spec(i).cpu.units());
    v.max_node_gpu_share =
        std::max<int64_t>(v.max_node_gpu_share, static_cast<int64_t>(ledger.spec(i).gpus.size()) * 1000);
  }
  return v;
}

// `task` as the pipeline prepares it (model names resolved against the ledger).
inline PreparedTask PrepareTask(const Ledger& ledger, const TaskRequest& task) {
  PreparedTask t;
  ::gpupool::PrepareTask(ledger, task, t);
  return t;
}

// Raw scores (before normalisation) of the score plugin `name` for `task` on `nodes`, which must
// all be feasible for it.
inline std::vector<int64_t> RawScores(TestCluster& c, const std::string& name, const TaskRequest& task,
                                      const std::vector<NodeIndex>& nodes, const Value& args = Value()) {
  PluginInit init;
  init.typical_pods = &c.typical_pods();
  auto plugin = DefaultRegistry().MakeScore(name, args, init);
  EXPECT_TRUE(plugin.ok()) << plugin.status().ToString();
  if (!plugin.ok()) return {};
  const ClusterView view = ViewOf(c.ledger(), &c.rng());
  const PreparedTask t = PrepareTask(c.ledger(), task);
  (*plugin)->PreScore(view, t, nodes);
  std::vector<int64_t> out;
  for (NodeIndex n : nodes) out.push_back((*plugin)->Score(view, t, n));
  return out;
}

// Decides `task` and checks it was placed, on `node`, on exactly `gpus` (in grant order).
inline void ExpectPlaced(Scheduler& s, const TaskRequest& task, NodeIndex node, std::vector<int> gpus) {
  const Decision d = s.Decide(task);
  ASSERT_TRUE(d.error.ok()) << d.error.ToString();
  ASSERT_TRUE(d.placed) << d.diagnosis.ToString();
  EXPECT_EQ(d.placement.node, node);
  EXPECT_EQ(GpuIndices(d.placement), gpus);
}

// Every built-in placement policy.
inline constexpr const char* kEveryPolicy[] = {"bestfit", "fgd",        "balanced",      "spread",  "random",
                                               "topology", "gpupacking", "dotprod", "gpuclustering", "binpack"};

// Builds `policy`, with FGD's typical workload a quarter GPU and a whole one (for fgd).
inline Scheduler& BuildForShares(TestCluster& c, const std::string& policy) {
  c.SetTypicalPods({Typical(1000, 250, 1, 0.5), Typical(1000, 1000, 1, 0.5)});
  return c.Build(policy);
}

// Decides `t` and commits the placement when it was placed.
inline Decision DecideAndCommit(TestCluster& c, Scheduler& s, const TaskRequest& t) {
  Decision d = s.Decide(t);
  if (d.placed) {
    auto id = c.ledger().Commit(d.placement);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
  }
  return d;
}

}  // namespace gpupool::testutil
