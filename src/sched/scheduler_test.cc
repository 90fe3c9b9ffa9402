// The pipeline runner: gangs, permit and bind roll-back, determinism, the score cache, MIG, and
// the decisions of a full trace run.
#include "sched/scheduler.h"

#include <gtest/gtest.h>

#include "sched/typical_pods.h"
#include "sim/trace.h"

namespace gpupool {
namespace {

TaskRequest Task(int64_t cpu, int64_t mem, int gpus = 0, int64_t share = 0) {
  TaskRequest t;
  t.cpu = MilliCpu(cpu);
  t.memory = MiB(mem);
  t.gpu_count = gpus;
  t.gpu_share = MilliGpu(share);
  return t;
}

struct Fixture {
  explicit Fixture(const std::string& policy, std::vector<TypicalPod> typical = {{4000, 500, 1, {}, 1.0}})
      : typical_pods(std::move(typical)) {
    init.typical_pods = &typical_pods;
    profile = ProfileForPolicy(policy).value();
  }
  Scheduler& Build() {
    auto s = Scheduler::Create(profile, DefaultRegistry(), ledger, rng, init);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    scheduler = std::move(s).value();
    return *scheduler;
  }
  NodeIndex Add(const std::string& name, int64_t cpu, int64_t mem, int gpus,
                const std::string& model = "T4") {
    auto r = ledger.AddNode(MakeNode(name, MilliCpu(cpu), MiB(mem), gpus, model, ledger.catalog()));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return *r;
  }
  std::vector<TypicalPod> typical_pods;
  PluginInit init;
  Profile profile;
  Ledger ledger;
  SeededRng rng{1};
  std::unique_ptr<Scheduler> scheduler;
};

// Two nodes of 2 GPUs each. A gang of 3 whole-GPU tasks fits (2 + 1); a gang of 5 does not, and
// then nothing at all may stay allocated.
TEST(SchedulerTest, GangIsAllOrNothing) {
  Fixture f("bestfit");
  f.Add("a", 32000, 65536, 2);
  f.Add("b", 32000, 65536, 2);
  Scheduler& s = f.Build();

  Job small;
  small.name = "small";
  small.groups.push_back({"worker", 3, Task(1000, 1024, 1, 1000), {}});
  JobResult r = s.ScheduleJob(small);
  ASSERT_TRUE(r.placed) << r.status.ToString();
  EXPECT_EQ(r.allocations.size(), 3u);
  EXPECT_EQ(f.ledger.used_gpu_share(), 3000);

  Job big;
  big.name = "big";
  big.groups.push_back({"worker", 2, Task(1000, 1024, 1, 1000), {}});
  r = s.ScheduleJob(big);
  // Only one GPU is left: the gang of 2 must not keep the one task that fitted.
  EXPECT_FALSE(r.placed);
  EXPECT_EQ(r.status.code(), StatusCode::kUnschedulable);
  EXPECT_NE(r.status.message().find("gang needs 2"), std::string::npos) << r.status.message();
  EXPECT_EQ(f.ledger.used_gpu_share(), 3000);
  EXPECT_EQ(f.ledger.allocation_count(), 3u);
  EXPECT_TRUE(f.ledger.CheckInvariants().ok());
}

// minAvailable 1 of 3: the job runs with the tasks that fit.
TEST(SchedulerTest, GangMinAvailableAcceptsPartial) {
  Fixture f("bestfit");
  f.Add("a", 32000, 65536, 1);
  Scheduler& s = f.Build();
  Job job;
  job.name = "elastic";
  job.min_available = 1;
  job.groups.push_back({"worker", 3, Task(1000, 1024, 1, 1000), {}});
  JobResult r = s.ScheduleJob(job);
  ASSERT_TRUE(r.placed);
  EXPECT_EQ(r.allocations.size(), 1u);
}

class FailingBinder final : public Binder {
 public:
  Status Bind(const Job&, int task_index, AllocationId, const Placement&) override {
    ++calls;
    return task_index == 1 ? Status::IoError("agent unreachable") : Status::Ok();
  }
  int calls = 0;
};

// A bind failure on the second task rolls the whole job back.
TEST(SchedulerTest, BindFailureRollsBack) {
  Fixture f("bestfit");
  f.Add("a", 32000, 65536, 4);
  Scheduler& s = f.Build();
  Job job;
  job.name = "train";
  job.groups.push_back({"worker", 2, Task(1000, 1024, 1, 1000), {}});
  FailingBinder binder;
  JobResult r = s.ScheduleJob(job, &binder);
  EXPECT_FALSE(r.placed);
  EXPECT_EQ(binder.calls, 2);
  EXPECT_EQ(r.status.code(), StatusCode::kIoError);
  EXPECT_EQ(f.ledger.allocation_count(), 0u);
  EXPECT_EQ(f.ledger.used_gpu_share(), 0);
}

TEST(SchedulerTest, InvalidTaskIsAnErrorNotUnschedulable) {
  Fixture f("bestfit");
  f.Add("a", 32000, 65536, 1);
  Scheduler& s = f.Build();
  auto r = s.Place(Task(1000, 1024, 1, 1500));  // 1.5 GPUs of share per GPU: invalid
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.ledger.allocation_count(), 0u);
}

TEST(SchedulerTest, UnknownPluginAndBadWeightAreRejected) {
  Fixture f("bestfit");
  f.profile.scores.push_back({"no-such-plugin", 1, {}});
  auto s = Scheduler::Create(f.profile, DefaultRegistry(), f.ledger, f.rng, f.init);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("unknown score plugin 'no-such-plugin'"), std::string::npos);

  Fixture g("bestfit");
  g.profile.scores[0].weight = 0;
  auto t = Scheduler::Create(g.profile, DefaultRegistry(), g.ledger, g.rng, g.init);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("weight must be at least 1"), std::string::npos);
}

TEST(SchedulerTest, FgdWithoutTypicalWorkloadExplainsItself) {
  Ledger ledger;
  SeededRng rng(1);
  auto s = Scheduler::Create(ProfileForPolicy("fgd").value(), DefaultRegistry(), ledger, rng, {});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("typical workload"), std::string::npos) << s.status().message();
}

// A MIG request lands on a MIG-enabled A100 at a valid start; a second 4g does not fit next to
// the first (memory slices 0-3 are taken and 4g may only start at 0), and the diagnosis says why.
TEST(SchedulerTest, MigPlacement) {
  Fixture f("bestfit");
  const NodeIndex n = f.Add("dgx", 128000, 1 << 20, 2, "A100-80GB");
  ASSERT_TRUE(f.ledger.SetMigEnabled(n, 1, true).ok());
  Scheduler& s = f.Build();
  TaskRequest mig = Task(4000, 8192, 1);
  mig.mig_profile = "4g.40gb";
  Decision d;
  auto id = s.Place(mig, &d);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  ASSERT_EQ(d.placement.gpus.size(), 1u);
  EXPECT_EQ(d.placement.gpus[0].gpu, 1);
  ASSERT_TRUE(d.placement.gpus[0].mig.has_value());
  EXPECT_EQ(d.placement.gpus[0].mig->profile_id, 5);
  EXPECT_EQ(d.placement.gpus[0].mig->start, 0);

  auto again = s.Place(mig, &d);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().message(), "0/1 nodes fit: 1 no room for the MIG profile");

  TaskRequest three = Task(4000, 8192, 1);
  three.mig_profile = "3g";  // short form: the 3-slice profile, which fits at slice 4
  auto ok = s.Place(three, &d);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(d.placement.gpus[0].mig->start, 4);
  // The whole GPU 0 is still available to ordinary tasks.
  EXPECT_TRUE(s.Place(Task(1000, 1024, 1, 1000)).ok());
  EXPECT_TRUE(f.ledger.CheckInvariants().ok());
}

// Every policy, with and without the score cache, makes the very same decisions on the first
// 2,500 pods of the default trace (cluster filling up, failures included), and two runs with the
// same seed agree.
TEST(SchedulerTest, ScoreCacheNeverChangesDecisions) {
  const GpuCatalog catalog = GpuCatalog::Builtin();
  auto nodes =
      ReadOpenbNodes(std::string(GPUPOOL_DATA_DIR) + "/alibaba/openb_node_list_gpu_node.csv", catalog);
  auto pods = ReadOpenbPods(std::string(GPUPOOL_DATA_DIR) + "/alibaba/openb_pod_list_default.csv");
  ASSERT_TRUE(nodes.ok() && pods.ok());
  std::vector<TaskRequest> requests;
  for (const auto& p : *pods) requests.push_back(p.request);
  const auto typical = ComputeTypicalPods(requests);
  // Shrink the cluster so that it fills and pods start failing within the sample.
  std::vector<NodeSpec> small(nodes->begin(), nodes->begin() + 200);
  SeededRng order_rng(5);
  std::vector<TracePod> arrivals;
  for (uint32_t i : order_rng.Permutation(static_cast<uint32_t>(pods->size())))
    arrivals.push_back((*pods)[i]);
  arrivals.resize(2500);

  for (const std::string& policy : PolicyNames()) {
    std::vector<std::vector<Placement>> runs;
    for (int run = 0; run < 3; ++run) {
      Ledger ledger(catalog);
      for (const auto& n : small) ASSERT_TRUE(ledger.AddNode(n).ok());
      Profile profile = ProfileForPolicy(policy).value();
      profile.cache_scores = run != 1;
      SeededRng rng(9);
      PluginInit init;
      init.typical_pods = &typical;
      auto s = Scheduler::Create(profile, DefaultRegistry(), ledger, rng, init);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      (*s)->ShuffleTieBreakRanks();
      std::vector<Placement> decisions;
      int failed = 0;
      for (const auto& pod : arrivals) {
        Decision d;
        auto id = (*s)->Place(pod.request, &d);
        if (!id.ok()) {
          ASSERT_EQ(id.status().code(), StatusCode::kUnschedulable) << id.status().ToString();
          ++failed;
        }
        decisions.push_back(d.placed ? d.placement : Placement{});
      }
      EXPECT_GT(failed, 0) << policy << ": the sample should overfill the cluster";
      ASSERT_TRUE(ledger.CheckInvariants().ok());
      runs.push_back(std::move(decisions));
    }
    for (size_t i = 0; i < arrivals.size(); ++i) {
      ASSERT_EQ(runs[0][i], runs[1][i]) << policy << ": cache changed decision " << i;
      ASSERT_EQ(runs[0][i], runs[2][i]) << policy << ": rerun changed decision " << i;
    }
  }
}

// Past 256 indexed shapes the shape decided least recently makes room, not every shape: a shape
// decided all along keeps its index (before, the whole index was dropped and it was built again).
TEST(SchedulerTest, TheBestNodeIndexEvictsTheLeastRecentlyDecidedShape) {
  Fixture f("balanced");
  for (int i = 0; i < 4; ++i) f.Add("n" + std::to_string(i), 1000000, 1000000, 8);
  Scheduler& s = f.Build();
  auto place = [&](const TaskRequest& t) { ASSERT_TRUE(s.Place(t).ok()); };
  const TaskRequest kept = Task(50, 1, 1, 100);
  place(kept);
  for (int i = 0; i < 255; ++i) place(Task(100 + i, 1));  // 256 shapes indexed now
  EXPECT_EQ(s.stats().index_builds, 256u);
  place(kept);                                             // decided again: the most recent
  EXPECT_EQ(s.stats().index_builds, 256u);
  place(Task(400, 1));                                     // a new shape: Task(100, 1) makes room
  EXPECT_EQ(s.stats().index_builds, 257u);
  place(kept);
  EXPECT_EQ(s.stats().index_builds, 257u);
  place(Task(101, 1));                                     // still indexed
  EXPECT_EQ(s.stats().index_builds, 257u);
  place(Task(100, 1));                                     // made room: built again
  EXPECT_EQ(s.stats().index_builds, 258u);
  EXPECT_EQ(s.stats().index_decisions, 261u);
}

// The best-node index chooses what the full pass chooses, decision for decision, while balanced
// learns (relearning and adapting its weights), tasks end, nodes are cordoned, fail and come back,
// GPUs go unhealthy and the tie-break ranks are drawn again — and it does decide most tasks.
TEST(SchedulerTest, TheBestNodeIndexChoosesAsTheFullPass) {
  const GpuCatalog catalog = GpuCatalog::Builtin();
  auto nodes =
      ReadOpenbNodes(std::string(GPUPOOL_DATA_DIR) + "/alibaba/openb_node_list_gpu_node.csv", catalog);
  auto pods = ReadOpenbPods(std::string(GPUPOOL_DATA_DIR) + "/alibaba/openb_pod_list_default.csv");
  ASSERT_TRUE(nodes.ok() && pods.ok());
  std::vector<NodeSpec> small(nodes->begin(), nodes->begin() + 150);
  SeededRng order_rng(11);
  std::vector<TaskRequest> arrivals;
  for (uint32_t i : order_rng.Permutation(static_cast<uint32_t>(pods->size()))) arrivals.push_back((*pods)[i].request);
  arrivals.resize(6000);

  struct Run {
    std::vector<Placement> placements;
    std::vector<int> feasible;
    Scheduler::Stats stats;
  };
  std::vector<Run> runs;
  for (bool indexed : {true, false}) {
    Ledger ledger(catalog);
    for (const auto& n : small) ASSERT_TRUE(ledger.AddNode(n).ok());
    SeededRng rng(9), events(21);
    PluginInit init;
    auto s = Scheduler::Create(ProfileForPolicy("balanced").value(), DefaultRegistry(), ledger, rng, init);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    (*s)->SetBestNodeIndex(indexed);
    (*s)->ShuffleTieBreakRanks();
    Run run;
    std::vector<AllocationId> live;
    for (size_t i = 0; i < arrivals.size(); ++i) {
      // Events between decisions, the same in both runs (their own Rng).
      const uint64_t e = events.Next() % 100;
      if (e < 35 && !live.empty()) {  // a task ends
        const size_t k = events.Next() % live.size();
        ASSERT_TRUE(ledger.Release(live[k]).ok());
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      } else if (e < 38) {
        const auto n = static_cast<NodeIndex>(events.Next() % ledger.node_count());
        ASSERT_TRUE(ledger.SetCordoned(n, !ledger.state(n).cordoned).ok());
      } else if (e < 40) {
        const auto n = static_cast<NodeIndex>(events.Next() % ledger.node_count());
        ASSERT_TRUE(ledger.SetNodeHealthy(n, !ledger.state(n).healthy).ok());
      } else if (e < 42) {
        const auto n = static_cast<NodeIndex>(events.Next() % ledger.node_count());
        if (!ledger.state(n).gpus.empty()) {
          const int g = static_cast<int>(events.Next() % ledger.state(n).gpus.size());
          ASSERT_TRUE(ledger.SetGpuHealthy(n, g, !ledger.state(n).gpus[static_cast<size_t>(g)].healthy).ok());
        }
      } else if (e == 42) {
        (*s)->ShuffleTieBreakRanks();
      }
      (*s)->Observe(arrivals[i]);
      Decision d;
      auto id = (*s)->Place(arrivals[i], &d);
      if (id.ok()) live.push_back(*id);
      run.placements.push_back(d.placed ? d.placement : Placement{});
      run.feasible.push_back(d.diagnosis.feasible_nodes);
    }
    ASSERT_TRUE(ledger.CheckInvariants().ok());
    run.stats = (*s)->stats();
    runs.push_back(std::move(run));
  }
  for (size_t i = 0; i < arrivals.size(); ++i) {
    ASSERT_EQ(runs[0].placements[i], runs[1].placements[i]) << "decision " << i;
    ASSERT_EQ(runs[0].feasible[i], runs[1].feasible[i]) << "decision " << i;
  }
  EXPECT_GT(runs[0].stats.index_decisions, arrivals.size() / 3);
  EXPECT_EQ(runs[1].stats.index_decisions, 0u);
  // Most decisions looked at a few changed nodes, not at every node.
  EXPECT_LT(runs[0].stats.index_updates, runs[0].stats.index_decisions * 20);
  // Relearning and new ranks scored the feasible nodes again without a filter pass, as exactly.
  EXPECT_GT(runs[0].stats.index_rescores, 0u);
}

TEST(SchedulerTest, TieBreakRanksMustCoverEveryNode) {
  Fixture f("bestfit");
  f.Add("a", 32000, 65536, 1);
  f.Add("b", 32000, 65536, 1);
  Scheduler& s = f.Build();
  EXPECT_FALSE(s.SetTieBreakRanks({0}).ok());
  ASSERT_TRUE(s.SetTieBreakRanks({1, 0}).ok());
  // Identical empty nodes score the same: node b (rank 0) wins the tie.
  Decision d = s.Decide(Task(1000, 1024, 1, 1000));
  ASSERT_TRUE(d.placed);
  EXPECT_EQ(d.placement.node, 1u);
}

TEST(SchedulerTest, NodesAddedLaterAreConsidered) {
  Fixture f("bestfit");
  f.Add("a", 4000, 4096, 1);
  Scheduler& s = f.Build();
  EXPECT_FALSE(s.Decide(Task(8000, 1024)).placed);
  f.Add("b", 16000, 4096, 1);
  Decision d = s.Decide(Task(8000, 1024));
  ASSERT_TRUE(d.placed);
  EXPECT_EQ(d.placement.node, 1u);
}

}  // namespace
}  // namespace gpupool

namespace gpupool {
namespace {

// A mask removes nodes before the filters and explains them; the reserve hook lets the caller
// tighten the mask between a job's tasks (here: one replica per node).
TEST(SchedulerTest, NodeMaskSkipsNodesAndExplainsThem) {
  Fixture f("bestfit");
  f.Add("a", 32000, 65536, 4);
  f.Add("b", 32000, 65536, 4);
  f.Add("c", 32000, 65536, 4);
  Scheduler& s = f.Build();
  NodeMask mask;
  mask.reasons = {"reserved for a waiting gang"};
  mask.reason = {1, 0, 1};  // only b is allowed
  s.SetNodeMask(&mask);
  Decision d = s.Decide(Task(1000, 1024, 1, 1000));
  ASSERT_TRUE(d.placed);
  EXPECT_EQ(d.placement.node, 1u);
  EXPECT_EQ(s.ExplainNodes(Task(1000, 1024, 1, 1000))[0], "reserved for a waiting gang");
  EXPECT_EQ(s.ExplainNodes(Task(1000, 1024, 1, 1000))[1], "");

  mask.reason = {1, 1, 1};
  d = s.Decide(Task(1000, 1024, 1, 1000));
  EXPECT_FALSE(d.placed);
  EXPECT_EQ(d.diagnosis.ToString(), "0/3 nodes fit: 3 reserved for a waiting gang");

  // Spread: after each reservation, the node taken is masked for the next replica.
  mask.reasons = {"runs a replica of the same job"};
  mask.reason.assign(3, 0);
  Job spread;
  spread.name = "spread";
  spread.groups.push_back({"worker", 3, Task(1000, 1024, 1, 1000), {}});
  JobResult r = s.ScheduleJob(spread, nullptr, [&](const Placement& p) { mask.reason[p.node] = 1; });
  ASSERT_TRUE(r.placed) << r.status.ToString();
  std::vector<NodeIndex> nodes;
  for (const auto& p : r.placements) nodes.push_back(p.node);
  std::sort(nodes.begin(), nodes.end());
  EXPECT_EQ(nodes, (std::vector<NodeIndex>{0, 1, 2}));
  // A fourth replica has nowhere to go.
  mask.reason.assign(3, 0);
  spread.groups[0].replicas = 4;
  r = s.ScheduleJob(spread, nullptr, [&](const Placement& p) { mask.reason[p.node] = 1; });
  EXPECT_FALSE(r.placed);
  s.SetNodeMask(nullptr);
  EXPECT_TRUE(f.ledger.CheckInvariants().ok());
}

}  // namespace
}  // namespace gpupool
