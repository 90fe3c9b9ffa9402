#include "server/node_mask.h"

#include <set>

#include "server/service_internal.h"

namespace gpupool {

using namespace service_internal;

bool ComputeNodeMask(const PoolState& st, const PoolJob& j, NodeMask& mask) {
  const size_t n = st.ledger.node_count();
  bool any = false;
  mask.reasons = {"reserved for a waiting gang", "node labels do not match the job's node affinity",
                  "no task of a together-with job on the node", "runs a task of an apart-from job",
                  "node is lost"};
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
