#include "server/node_mask.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "server/service_internal.h"

namespace gpupool {

using namespace service_internal;

std::vector<uint8_t> NodesHeldFrom(const PoolState& st, const PoolJob& j) {
  std::vector<uint8_t> held;
  // Placed there, the best-effort jobs a preemptor could evict in turn would only be preempted again.
  if (j.job.qos != QosClass::kBestEffort) return held;
  for (uint64_t seq : st.nominators) {
    auto it = st.by_seq.find(seq);
    if (it == st.by_seq.end() || it->second == &j) continue;
    const PoolJob& p = *it->second;
    if (j.rec.priority >= p.rec.priority && p.nominated_from_queues.count(j.rec.queue) == 0) continue;
    held.resize(std::max(held.size(), p.nominated_nodes.size()), 0);
    for (size_t i = 0; i < p.nominated_nodes.size(); ++i) held[i] |= p.nominated_nodes[i];
  }
  return held;
}

std::vector<std::pair<std::string, std::string>> ContainerNeeds(const Job& job) {
  std::vector<std::pair<std::string, std::string>> needs;  // in the job's order, once each
  const auto add = [&](std::string label, std::string what) {
    if (std::none_of(needs.begin(), needs.end(), [&](const auto& n) { return n.first == label; }))
      needs.emplace_back(std::move(label), std::move(what));
  };
  for (const TaskGroup& g : job.groups) {
    const TaskExec& e = g.exec;
    if (e.bundle.empty() && e.rootfs.empty() && e.image.empty()) continue;
    if (!e.runtime_class.empty() && e.runtime_class != "runc")
      add(kRuntimeClassLabelPrefix + e.runtime_class, "runtime class " + e.runtime_class);
    if (e.network == "pod") add(kPodNetworkLabel, "a pod network");
  }
  return needs;
}

bool ComputeNodeMask(const PoolState& st, const PoolJob& j, NodeMask& mask) {
  const size_t n = st.ledger.node_count();
  bool any = false;
  mask.reasons = {"reserved for a waiting gang", "node labels do not match the job's node affinity",
                  "no task of a together-with job on the node", "runs a task of an apart-from job",
                  "node is lost", "held for a higher-priority job that preempted for room there"};
  mask.reason.assign(n, 0);
  for (size_t i = 0; i < n && i < st.nodes.size(); ++i) {
    if (st.nodes[i].state != "ready") {
      mask.reason[i] = 5;
      any = true;
    }
  }
  if (!st.reserved_for.empty() && st.reserved_for != j.rec.id) {
    for (size_t i = 0; i < n && i < st.reserved_nodes.size(); ++i) {
      if (st.reserved_nodes[i] && mask.reason[i] == 0) {
        mask.reason[i] = 1;
        any = true;
      }
    }
  }
  const std::vector<uint8_t> held = NodesHeldFrom(st, j);
  for (size_t i = 0; i < n && i < held.size(); ++i) {
    if (held[i] && mask.reason[i] == 0) {
      mask.reason[i] = 6;
      any = true;
    }
  }
  // What the job's containers need of the node's agent (runc itself and no network, or none, every
  // agent offers).
  const auto needs = ContainerNeeds(j.job);
  if (!needs.empty()) {
    std::string what;
    for (const auto& [label, name] : needs) what += (what.empty() ? "" : " and ") + name;
    mask.reasons.push_back(fmt::format("its agent does not offer {} (the job's containers need it)", what));
    const auto code = static_cast<uint8_t>(mask.reasons.size());
    for (size_t i = 0; i < n; ++i) {
      if (mask.reason[i] != 0) continue;
      const auto& labels = st.ledger.spec(static_cast<NodeIndex>(i)).labels;
      for (const auto& [label, name] : needs) {
        auto it = labels.find(label);
        if (it == labels.end() || it->second != "true") {
          mask.reason[i] = code;
          any = true;
          break;
        }
      }
    }
  }
  const Affinity& aff = j.job.affinity;
  if (aff.empty()) return any;
  for (size_t i = 0; i < n; ++i) {
    if (mask.reason[i] != 0) continue;
    const NodeSpec& spec = st.ledger.spec(static_cast<NodeIndex>(i));
    uint8_t why = 0;
    for (const auto& req : aff.node) {
      if (!req.Matches(spec.labels)) why = 2;
    }
    if (why == 0 && (!aff.together_with.empty() || !aff.apart_from.empty())) {
      std::set<const PoolJob*> on_node;
      for (const auto& [job_id, index] : st.nodes[i].tasks) {
        auto it = st.jobs.find(job_id);
        if (it != st.jobs.end()) on_node.insert(it->second.get());
      }
      for (const auto& term : aff.together_with) {
        bool found = false;
        for (const PoolJob* other : on_node) {
          if (other != &j && LabelsMatch(term, other->job.labels)) found = true;
        }
        if (!found) why = 3;
      }
      for (const auto& term : aff.apart_from) {
        for (const PoolJob* other : on_node) {
          if (LabelsMatch(term, other->job.labels)) why = 4;
        }
      }
    }
    if (why != 0) mask.reason[i] = why;
  }
  return true;
}

}  // namespace gpupool
