// The reservation and node-mask controllers alone over a PoolState.
#include "server/reservations.h"

#include <gtest/gtest.h>

#include "api/jobspec.h"
#include "api/node_codec.h"
#include "server/node_mask.h"

namespace gpupool {
namespace {

void AddNode(PoolState& st, const std::string& name, int gpus, nlohmann::json labels = nlohmann::json::object()) {
  nlohmann::json body = {{"name", name}, {"cpu", "32"}, {"memory", "256Gi"}, {"labels", labels}};
  for (int i = 0; i < gpus; ++i) body["gpus"].push_back({{"index", i}, {"model", "A100-80GB"}});
  auto spec = ParseNodeSpec(body, st.ledger.catalog());
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  ASSERT_TRUE(st.ledger.AddNode(*spec).ok());
  st.nodes.emplace_back();
}

PoolJob& AddJob(PoolState& st, uint64_t seq, const std::string& yaml, int64_t pending_since_ms) {
  auto job = ParseJobSpec(yaml, SpecFormat::kYaml, JobSpecLimits{});
  EXPECT_TRUE(job.ok()) << job.status().ToString();
  auto j = std::make_unique<PoolJob>();
  j->rec.id = "j-" + std::to_string(seq);
  j->rec.seq = seq;
  j->rec.tenant = "t";
  j->rec.queue = "default";
  j->job = *job;
  j->demand = JobDemand(j->job);
  j->tasks.resize(static_cast<size_t>(j->job.task_count()));
  j->task_counts[static_cast<size_t>(TaskPhase::kPending)] = j->job.task_count();
  j->pending_since_ms = pending_since_ms;
  return st.AddJob(std::move(j));
}

constexpr char kGang[] = "name: g\ntasks: [{name: w, replicas: 2, resources: {cpu: 1, memory: 1Gi, gpu: 4}}]\n";

TEST(ReservationsTest, AJobThatWaitedLongEnoughGetsTheEmptiestNodesItNeedsAndNoMore) {
  PoolState st;
  for (int i = 0; i < 4; ++i) AddNode(st, "n" + std::to_string(i), 4);
  // n1 has a quarter GPU taken: the emptiest three are n0, n2, n3 (ties by index), and two of
  // them cover 8 GPUs.
  Placement p;
  p.node = 1;
  p.cpu = MilliCpu(1000);
  p.memory = MiB(1024);
  p.gpus.push_back({0, MilliGpu(250), MiB(0), std::nullopt});
  ASSERT_TRUE(st.ledger.Commit(p).ok());
  PoolJob& j = AddJob(st, 1, kGang, 1'000);
  EXPECT_FALSE(PlanReservation(st, j, 30'999, 30).has_value());  // waited 29.999 s of 30
  auto op = PlanReservation(st, j, 31'000, 30);
  ASSERT_TRUE(op.has_value());
  EXPECT_EQ(op->job_id, j.rec.id);
  EXPECT_EQ(op->nodes, (std::vector<uint8_t>{1, 0, 1, 0}));
  // One hold at a time.
  st.reserved_for = "j-other";
  EXPECT_FALSE(PlanReservation(st, j, 31'000, 30).has_value());
}

TEST(ReservationsTest, LostAndCordonedNodesAreNotHeldAndTooFewMeansNoHold) {
  PoolState st;
  for (int i = 0; i < 3; ++i) AddNode(st, "n" + std::to_string(i), 4);
  st.nodes[0].state = "lost";
  ASSERT_TRUE(st.ledger.SetCordoned(2, true).ok());
  PoolJob& j = AddJob(st, 1, kGang, 0);
  EXPECT_FALSE(PlanReservation(st, j, 100'000, 0).has_value());  // only n1 is usable: 4 of 8 GPUs
  ASSERT_TRUE(st.ledger.SetCordoned(2, false).ok());
  auto op = PlanReservation(st, j, 100'000, 0);
  ASSERT_TRUE(op.has_value());
  EXPECT_EQ(op->nodes, (std::vector<uint8_t>{0, 1, 1}));
}

TEST(NodeMaskTest, HeldLostAndUnmatchedNodesAreMaskedWithTheirReasons) {
  PoolState st;
  AddNode(st, "n0", 1, {{"rack", "a"}});
  AddNode(st, "n1", 1, {{"rack", "b"}});
  AddNode(st, "n2", 1, {{"rack", "a"}});
  AddNode(st, "n3", 1, {{"rack", "a"}});
  st.nodes[3].state = "lost";
  PoolJob& j = AddJob(st, 1, "name: a\naffinity: {nodeSelector: {rack: a}}\ntasks: [{name: w, resources: {cpu: 1, memory: 1Gi, gpu: 1}}]\n", 0);
  st.reserved_for = "j-other";
  st.reserved_nodes = {0, 0, 1, 0};
  NodeMask mask;
  ASSERT_TRUE(ComputeNodeMask(st, j, mask));
  ASSERT_EQ(mask.reason.size(), 4u);
  EXPECT_EQ(mask.reason[0], 0);                                   // free to use
  EXPECT_EQ(mask.reasons[mask.reason[1] - 1], "node labels do not match the job's node affinity");
  EXPECT_EQ(mask.reasons[mask.reason[2] - 1], "reserved for a waiting gang");
  EXPECT_EQ(mask.reasons[mask.reason[3] - 1], "node is lost");
  // The job the nodes are held for may use them; a job without affinity on ready nodes needs no mask.
  st.reserved_for = j.rec.id;
  ASSERT_TRUE(ComputeNodeMask(st, j, mask));
  EXPECT_EQ(mask.reason[2], 0);
  st.nodes[3].state = "ready";
  PoolJob& plain = AddJob(st, 2, kGang, 0);
  EXPECT_TRUE(ComputeNodeMask(st, plain, mask));  // n2 is held for the other job
  EXPECT_EQ(mask.reasons[mask.reason[2] - 1], "reserved for a waiting gang");
  st.reserved_for.clear();
  EXPECT_FALSE(ComputeNodeMask(st, plain, mask));
}

}  // namespace
}  // namespace gpupool
