#include "server/rendezvous.h"

#include <map>
#include <vector>

#include <fmt/format.h>

namespace gpupool {

std::string NodeAddress(const NodeSpec& node) {
  auto it = node.labels.find("gpupool.io/address");
  return it != node.labels.end() && !it->second.empty() ? it->second : node.name;
}

int RendezvousPort(uint64_t seq) { return 20000 + static_cast<int>(seq % 10000); }

nlohmann::json RendezvousJson(const PoolState& state, const PoolJob& job, int index) {
  if (job.tasks.size() < 2 || index < 0 || static_cast<size_t>(index) >= job.tasks.size()) return nullptr;
  const auto live = [](const PoolTask& t) {
    return t.placed && (t.phase == TaskPhase::kAssigned || t.phase == TaskPhase::kRunning ||
                        t.phase == TaskPhase::kStopping);
  };
  // Nodes by their lowest rank; each task's node rank and local rank.
  std::map<NodeIndex, int> node_rank;
  std::vector<NodeIndex> nodes;
  std::vector<int> on_node;  // tasks per node rank
  int local_rank = 0;
  int master_rank = -1;
  for (size_t r = 0; r < job.tasks.size(); ++r) {
    const PoolTask& t = job.tasks[r];
    if (!live(t)) continue;
    if (master_rank < 0) master_rank = static_cast<int>(r);
    auto [it, fresh] = node_rank.emplace(t.placement.node, static_cast<int>(nodes.size()));
    if (fresh) {
      nodes.push_back(t.placement.node);
      on_node.push_back(0);
    }
    if (static_cast<int>(r) == index) local_rank = on_node[static_cast<size_t>(it->second)];
    ++on_node[static_cast<size_t>(it->second)];
  }
  const PoolTask& self = job.tasks[static_cast<size_t>(index)];
  if (!live(self) || master_rank < 0) return nullptr;
  const int self_node = node_rank.at(self.placement.node);
  nlohmann::json hosts = nlohmann::json::array();
  for (size_t n = 0; n < nodes.size(); ++n)
    hosts.push_back(fmt::format("{}:{}", NodeAddress(state.ledger.spec(nodes[n])), on_node[n]));
  const NodeIndex master = job.tasks[static_cast<size_t>(master_rank)].placement.node;
  return {{"masterAddr", NodeAddress(state.ledger.spec(master))},
          {"masterPort", RendezvousPort(job.rec.seq)},
          {"worldSize", static_cast<int>(job.tasks.size())},
          {"rank", index},
          {"localRank", local_rank},
          {"localWorldSize", on_node[static_cast<size_t>(self_node)]},
          {"nodeRank", self_node},
          {"nodes", static_cast<int>(nodes.size())},
          {"hosts", hosts}};
}

}  // namespace gpupool
