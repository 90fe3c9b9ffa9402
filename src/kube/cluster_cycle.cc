// ClusterState's scheduling cycle (cluster_state.h): units (a pod, or a gang's pending members) in
// the queue order, placed through the placement pipeline, decisions turned into bind orders and
// pending reports.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "kube/cluster_state.h"
#include "kube/cluster_state_internal.h"
#include "sched/queue_access.h"
#include "sched/recording_binder.h"

namespace gpupool::kube {

using cluster_internal::DemandOf;

// ---- the cycle ----------------------------------------------------------------------------------

Resources ClusterState::ClusterTotal() const {
  Resources total;
  for (NodeIndex n = 0; n < ledger_->node_count(); ++n) {
    const NodeSpec& s = ledger_->spec(n);
    total.cpu += s.cpu.units();
    total.memory += s.memory.units();
    for (const auto& g : s.gpus) total.gpu += g.mig_enabled ? 0 : 1000;
  }
  return total;
}

const NodeMask* ClusterState::MaskFor(const NodeConstraints& c) {
  if (c.empty()) return nullptr;
  auto& [epoch, mask] = masks_[c.key()];
  if (epoch == mask_epoch_ && mask.reason.size() == ledger_->node_count()) return &mask;
  epoch = mask_epoch_;
  mask.reasons = {"node selector, affinity or taints"};
  mask.reason.assign(ledger_->node_count(), 0);
  for (NodeIndex n = 0; n < ledger_->node_count(); ++n) {
    const auto it = nodes_.find(node_of_index_[n]);
    if (it == nodes_.end() || !c.Allows(it->second)) mask.reason[n] = 1;
  }
  return &mask;
}

bool ClusterState::AnyToTry() const {
  for (const auto& [seq, p] : pending_pods_)
    if (p->failed_epoch != capacity_epoch_ || p->nominated || p->reservation) return true;
  return false;
}

void ClusterState::Report(Pod& p, const std::string& reason, const std::string& message, CycleResult& out,
                          const std::string& nominated_node) {
  p.failed_epoch = capacity_epoch_;  // not tried again until the capacity changes (AnyToTry)
  if (p.last_reason == reason && p.last_message == message) return;
  p.last_reason = reason;
  p.last_message = message;
  out.pending.push_back({p.uid, p.namespace_name, p.name, reason, message, nominated_node});
}

// A preemptor whose victims are gone gets their space held for it while the units before it in the
// queue order are placed, so that a pod ahead of it cannot take what was freed for it (and make it
// preempt again). A nomination that no longer fits (the node changed) is dropped.
void ClusterState::Reserve() {
  for (auto it = nominated_uids_.begin(); it != nominated_uids_.end();) {
    const auto found = pods_.find(*it);
    if (found == pods_.end() || !found->second.nominated || found->second.phase != PodPhase::kPending) {
      if (found != pods_.end()) found->second.nominated.reset();
      it = nominated_uids_.erase(it);
      continue;
    }
    Pod& p = found->second;
    ++it;
    if (p.reservation || p.parked || VictimsLeft(p.uid) > 0) continue;
    auto id = ledger_->Commit(*p.nominated);
    if (id.ok()) p.reservation = *id;
    else p.nominated.reset();
  }
}

void ClusterState::Unreserve(Pod& p) {
  if (!p.reservation) return;
  (void)ledger_->Release(*p.reservation);
  p.reservation.reset();
}

void ClusterState::ReleaseReserved() {
  for (const std::string& uid : nominated_uids_)
    if (auto it = pods_.find(uid); it != pods_.end()) Unreserve(it->second);
}

void ClusterState::Assume(Pod& p, const PodRequest& req, AllocationId id, const Placement& placement,
                          CycleResult& out) {
  Unpend(p);
  SetPhase(p, PodPhase::kAssumed);
  p.node = node_of_index_[placement.node];
  p.alloc = id;
  p.placement = placement;
  p.last_reason.clear();
  p.last_message.clear();
  p.nominated.reset();
  Hold(p, req);
  out.binds.push_back(
      {p.uid, p.namespace_name, p.name, p.node, AssignmentJson(p.uid, placement, *ledger_).dump()});
}

Job ClusterState::GangJob(const Unit& u, int held, int priority) const {
  const PodRequest& first = *u.members().front()->request;
  const int members = static_cast<int>(u.members().size());
  Job job;
  job.id = u.gang;
  job.name = u.gang;
  job.tenant = first.tenant;
  job.queue = first.queue;
  job.priority = priority;
  job.qos = first.qos;
  job.min_available = u.gang_min > 0 ? std::min(u.gang_min - held, members) : 0;
  for (size_t i = 0; i < u.members().size(); ++i) {
    TaskGroup g;
    g.name = fmt::format("m{}", i);
    g.request = u.members()[i]->request->request;
    job.groups.push_back(std::move(g));
  }
  return job;
}

CycleResult ClusterState::Cycle() {
  CycleResult out;
  // The profile built once already, so neither can fail.
  if (rebuild_) {
    if (Status st = Rebuild(); !st.ok()) return out;
  } else if (since_learn_ >= std::max<uint64_t>(kLearnEvery, ledger_->node_count())) {
    if (Status st = Relearn(); !st.ok()) return out;
  }
  if (pending_.empty()) return out;
  // Nothing to try: every pending pod failed (or was found invalid or short of its gang) at the
  // capacity there is now, and nothing else moved (poked_: set by what could make a pod fit, see
  // CapacityChanged, and checked by CheckInvariants). A cluster with 100,000 pods that fit nowhere
  // then costs nothing per cycle, not a queue order over all of them. Every 256th such cycle
  // scans them anyway (a pointer each), should a change have been missed.
  if (!poked_ && nominated_uids_.empty() && (++quiet_cycles_ % 256 != 0 || !AnyToTry())) return out;
  poked_ = false;

  // Units: a pod alone, or a gang's pending members (namespace/gang), in first-seen order.
  std::vector<Unit> units;
  std::map<std::string, size_t> gang_unit;
  units.reserve(pending_pods_.size());
  for (const auto& [seq, pod] : pending_pods_) {
    Pod& p = *pod;
    if (!p.request.ok()) {
      Report(p, "Invalid", p.request.status().message(), out);
      continue;
    }
    if (!p.constraints.ok()) {
      Report(p, "Invalid", fmt::format("pod {}/{}: {}", p.namespace_name, p.name, p.constraints.status().message()), out);
      continue;
    }
    const PodRequest& r = *p.request;
    if (!order_->HasQueue(r.queue)) {
      Report(p, "Invalid", fmt::format("queue '{}' does not exist", r.queue), out);
      continue;
    }
    if (Status st = CheckQueueAccess(*order_, r.queue, r.tenant, r.priority, r.qos); !st.ok()) {
      Report(p, "Invalid", fmt::format("pod {}/{} (tenant '{}'): {}", p.namespace_name, p.name, r.tenant, st.message()),
             out);
      continue;
    }
    if (r.gang.empty()) {
      units.push_back({&p, {}, "", 0});
      continue;
    }
    const std::string key = r.namespace_name + "/" + r.gang;
    auto [g, fresh] = gang_unit.try_emplace(key, units.size());
    if (fresh) units.push_back({nullptr, {}, key, 0});
    Unit& u = units[g->second];
    u.gang_members.push_back(&p);
    u.gang_min = std::max(u.gang_min, r.gang_min);
  }
  if (units.empty() || ledger_->node_count() == 0) {
    for (Unit& u : units)
      for (Pod* p : u.members()) Report(*p, "Unschedulable", "no nodes with a readable inventory", out);
    return out;
  }

  std::vector<PendingEntry> entries;
  entries.reserve(units.size());
  for (const Unit& u : units) {
    PendingEntry e;
    const PodRequest& first = *u.members().front()->request;
    e.seq = u.members().front()->seq;
    e.tenant = first.tenant;
    e.queue = first.queue;
    e.priority = first.priority;
    for (const Pod* p : u.members()) {
      e.priority = std::max(e.priority, p->request->priority);
      e.demand += DemandOf(p->request->request);
    }
    entries.push_back(std::move(e));
  }
  std::vector<UsageEntry> usage;
  for (const auto& [key, r] : usage_) usage.push_back({key.first, key.second, r});
  QueueOrder::Pass pass = order_->Begin(entries, usage, ClusterTotal());
  Reserve();
  // Shapes that failed this cycle: capacity only shrinks within a cycle, so the same shape
  // cannot fit either.
  std::map<std::string, std::string> failed_shapes;
  while (auto next = pass.Next()) {
    if (out.decisions >= options_.max_pods_per_cycle) {
      poked_ = true;  // the rest are untried: the next cycle goes on
      break;
    }
    Unit& u = units[*next];
    const int held = u.gang.empty() ? 0 : (gang_held_.count(u.gang) ? gang_held_[u.gang] : 0);
    const int members = static_cast<int>(u.members().size());
    if (u.gang_min > 0 && members + held < u.gang_min) {
      for (Pod* p : u.members())
        Report(*p, "WaitingForGang",
               fmt::format("gang {}: {} of {} members exist ({} {})", u.gang, members + held, u.gang_min,
                           kGangMinKey, u.gang_min),
               out);
      pass.Skipped(*next);
      continue;
    }
    bool unchanged = true;
    // A gang that waited for members and has them now was never tried at this capacity.
    for (const Pod* p : u.members())
      unchanged &= p->failed_epoch == capacity_epoch_ && !p->reservation && p->last_reason != "WaitingForGang";
    if (unchanged) {
      pass.Skipped(*next);
      continue;
    }
    for (Pod* p : u.members()) Unreserve(*p);  // its own reserved space is its to take
    Pod& first = *u.members().front();
    const NodeMask* mask = MaskFor(*first.constraints);
    const bool alone = u.gang.empty() || (u.gang_min > 0 && held >= u.gang_min);
    std::string shape;
    if (u.gang.empty()) {
      const TaskRequest& r = first.request->request;
      // With the priority: a higher one may preempt where a lower could not.
      shape = fmt::format("{}/{}/{}/{}/{}/{}/{}/{}/p{}", r.cpu.units(), r.memory.units(), r.gpu_count,
                          r.gpu_share.units(), r.gpu_memory.units(), fmt::join(r.gpu_models, ","), r.mig_profile,
                          r.nvlink, first.request->priority);
      shape += first.constraints->key();
      if (auto f = failed_shapes.find(shape); f != failed_shapes.end() && !first.nominated) {
        first.failed_epoch = capacity_epoch_;
        Report(first, "Unschedulable", f->second, out);
        pass.Skipped(*next);
        continue;
      }
    }
    ++out.decisions;
    scheduler_->SetNodeMask(mask);
    if (alone) {
      // A pod alone, or more members of a gang whose minimum is running already.
      bool any = false;
      for (Pod* p : u.members()) {
        Decision d;
        auto id = scheduler_->Place(p->request->request, &d);
        if (id.ok()) {
          Assume(*p, *p->request, *id, d.placement, out);
          any = true;
          continue;
        }
        p->failed_epoch = capacity_epoch_;
        if (u.gang.empty() && d.error.ok() && TryPreempt(u, 0, entries[*next], mask, out)) continue;
        std::string message = d.error.ok() ? d.diagnosis.ToString() : d.error.message();
        if (!u.gang.empty()) message = fmt::format("gang {}: {}", u.gang, message);
        if (!shape.empty()) failed_shapes[shape] = message;
        Report(*p, "Unschedulable", message, out);
      }
      scheduler_->SetNodeMask(nullptr);
      if (any) pass.Placed(*next);
      else pass.Skipped(*next);
      continue;
    }
    Job job = GangJob(u, held, entries[*next].priority);
    RecordingBinder binder;
    JobResult r = scheduler_->ScheduleJob(job, &binder);
    scheduler_->SetNodeMask(nullptr);
    if (r.placed) {
      for (const auto& b : binder.bound) {
        Pod& p = *u.members()[static_cast<size_t>(b.task)];
        Assume(p, *p.request, b.allocation, b.placement, out);
      }
      pass.Placed(*next);
      continue;
    }
    for (Pod* p : u.members()) p->failed_epoch = capacity_epoch_;
    if (TryPreempt(u, held, entries[*next], mask, out)) {
      pass.Skipped(*next);
      continue;
    }
    const std::string why = r.status.message().empty() ? r.diagnosis.ToString() : r.status.message();
    const std::string message =
        fmt::format("gang {}: {} member(s) must fit together{}: {}", u.gang, job.gang_size(),
                    held > 0 ? fmt::format(" ({} running)", held) : std::string(), why);
    for (Pod* p : u.members()) {
      p->failed_epoch = capacity_epoch_;
      Report(*p, "Unschedulable", message, out);
    }
    pass.Skipped(*next);
  }
  ReleaseReserved();
  return out;
}

}  // namespace gpupool::kube
