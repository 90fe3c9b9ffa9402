// ClusterState's preemption (cluster_state.h): for a pod or gang that does not fit, which of
// gpupool's best-effort pods to evict so that it does — the candidates and their order from
// sched/preemption.h (lower priority first, or queues over their guarantee when the preemptor's is
// under its own), the same rules the pool server applies. A gang's bound members are one victim:
// evicting part of a gang would leave the rest holding GPUs for nothing. It tries on the real
// ledger: releases the candidates one victim at a time until the unit fits, and puts every
// released placement back before it answers; only the prefix that made it fit is evicted.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "kube/cluster_state.h"
#include "sched/preemption.h"

namespace gpupool::kube {

size_t ClusterState::VictimsLeft(const std::string& preemptor) {
  auto it = preempting_.find(preemptor);
  if (it == preempting_.end()) return 0;
  for (auto v = it->second.begin(); v != it->second.end();) {
    const auto p = pods_.find(*v);
    v = (p == pods_.end() || !p->second.evicting) ? it->second.erase(v) : std::next(v);
  }
  const size_t left = it->second.size();
  if (left == 0) preempting_.erase(it);
  return left;
}

bool ClusterState::TryPreempt(const Unit& u, int held, const PendingEntry& entry, const NodeMask* mask,
                              CycleResult& out) {
  if (!options_.preemption || u.members().empty()) return false;
  Pod& first = *u.members().front();
  // Victims evicted for it earlier and not gone yet: wait for them, plan nothing more.
  if (const size_t left = VictimsLeft(first.uid); left > 0) {
    for (Pod* p : u.members())
      Report(*p, "Preempting", fmt::format("waiting for {} preempted pod(s) to end", left), out,
             p->nominated ? node_of_index_[p->nominated->node] : std::string());
    return true;
  }

  // gpupool's running best-effort pods, a gang's bound members together.
  std::vector<RunningEntry> running;
  std::vector<std::vector<Pod*>> victims;
  std::map<std::string, size_t> gang_index;
  for (const std::string& uid : best_effort_held_) {
    const auto found = pods_.find(uid);
    if (found == pods_.end()) continue;
    Pod& p = found->second;
    if (!p.ours || !p.counted || !p.alloc || p.evicting || p.protected_ || p.qos != QosClass::kBestEffort) continue;
    size_t i = running.size();
    if (!p.gang.empty()) {
      auto [g, fresh] = gang_index.try_emplace(p.gang, running.size());
      i = g->second;
      if (!fresh) {
        RunningEntry& e = running[i];
        e.used += p.demand;
        e.priority = std::max(e.priority, p.priority);
        e.started_ms = std::max<int64_t>(e.started_ms, static_cast<int64_t>(p.held_seq));
        victims[i].push_back(&p);
        continue;
      }
    }
    running.push_back({p.held_seq, p.tenant, p.queue, p.priority, p.qos, p.demand, static_cast<int64_t>(p.held_seq)});
    victims.push_back({&p});
  }
  if (running.empty()) return false;
  std::vector<UsageEntry> usage;
  for (const auto& [key, r] : usage_) usage.push_back({key.first, key.second, r});
  const PodRequest& req = *first.request;
  const std::vector<PreemptionCandidate> candidates = PreemptionCandidates(*order_, entry, req.qos, running, usage);
  if (candidates.empty()) return false;

  // What if: release victims in order until the unit fits, then put everything back exactly.
  std::vector<Pod*> released;
  std::vector<Placement> planned;  // where the unit's members would go, in member order
  size_t needed = 0;
  bool fits = false;
  for (size_t c = 0; c < candidates.size() && !fits; ++c) {
    for (Pod* v : victims[candidates[c].index]) {
      (void)ledger_->Release(*v->alloc);
      released.push_back(v);
    }
    needed = c + 1;
    scheduler_->SetNodeMask(mask);
    if (u.gang.empty()) {
      Decision d;
      auto id = scheduler_->Place(req.request, &d);
      if (id.ok()) {
        (void)ledger_->Release(*id);
        planned = {d.placement};
        fits = true;
      }
    } else {
      JobResult trial = scheduler_->ScheduleJob(GangJob(u, held, entry.priority));
      if (trial.placed) {
        for (AllocationId a : trial.allocations) (void)ledger_->Release(a);
        planned = trial.placements;
        fits = true;
      }
    }
    scheduler_->SetNodeMask(nullptr);
  }
  for (Pod* v : released) {
    // Just released: committing it again cannot fail unless the ledger is broken.
    auto id = ledger_->Commit(*v->placement);
    if (id.ok()) v->alloc = *id;
  }
  if (!fits) return false;

  const std::string who = u.gang.empty() ? fmt::format("{}/{}", first.namespace_name, first.name)
                                         : fmt::format("gang {}", u.gang);
  std::set<std::string>& mine = preempting_[first.uid];
  std::vector<std::string> names;
  for (size_t c = 0; c < needed; ++c) {
    const RunningEntry& e = running[candidates[c].index];
    const std::string why =
        candidates[c].reason == PreemptReason::kPriority
            ? fmt::format("preempted by {} (priority {} > {})", who, entry.priority, e.priority)
            : fmt::format("preempted by {} (queue '{}' reclaims its guaranteed quota)", who, req.queue);
    for (Pod* v : victims[candidates[c].index]) {
      v->evicting = true;
      mine.insert(v->uid);
      names.push_back(fmt::format("{}/{}", v->namespace_name, v->name));
      out.evictions.push_back({v->uid, v->namespace_name, v->name, why});
    }
  }
  const std::string message =
      fmt::format("preempting {} pod(s): {}", names.size(), fmt::join(names.begin(), names.begin() + std::min<size_t>(names.size(), 10), ", "));
  for (size_t i = 0; i < u.members().size(); ++i) {
    Pod& p = *u.members()[i];
    p.nominated.reset();
    std::string node;
    if (i < planned.size()) {
      p.nominated = planned[i];
      nominated_uids_.insert(p.uid);
      node = node_of_index_[planned[i].node];
    }
    Report(p, "Preempting", message + (node.empty() ? "" : fmt::format(" (nominated node {})", node)), out, node);
  }
  return true;
}

}  // namespace gpupool::kube
