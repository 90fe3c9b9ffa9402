#include "kube/cluster_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "api/node_codec.h"
#include "kube/cluster_state_internal.h"
#include "kube/json_fields.h"
#include "sched/registry.h"

namespace gpupool::kube {

namespace {

using Json = nlohmann::json;
using cluster_internal::DemandOf;
using json_fields::At;
using json_fields::Str;

// What a pending pod's scheduling depends on, to tell a real change from a status update.
size_t SchedulingHash(const Json& pod) {
  const Json& meta = At(pod, "metadata");
  std::string text = At(pod, "spec").dump();
  text += At(meta, "annotations").dump();
  text += At(meta, "labels").dump();
  return std::hash<std::string>()(text);
}

}  // namespace

ClusterState::ClusterState(ClusterOptions options, GpuCatalog catalog)
    : options_(std::move(options)), catalog_(std::move(catalog)) {}

Result<std::unique_ptr<ClusterState>> ClusterState::Create(ClusterOptions options, GpuCatalog catalog) {
  if (options.profile.scores.empty()) {
    auto p = ProfileForPolicy("balanced");
    if (!p.ok()) return p.status();
    options.profile = std::move(p).value();
  }
  if (options.max_pods_per_cycle < 1) return Status::InvalidArgument("max pods per cycle must be at least 1");
  std::unique_ptr<ClusterState> s(new ClusterState(std::move(options), std::move(catalog)));
  auto order = QueueOrder::Create(s->options_.ordering);
  if (!order.ok()) return order.status().WithContext("queues");
  s->order_.emplace(std::move(order).value());
  s->typical_pods_ = {{0, 1000, 1, {}, 1.0}};
  RETURN_IF_ERROR(s->Rebuild());
  return s;
}

// ---- nodes --------------------------------------------------------------------------------------

namespace {

// The spec without health (which changes in place, not by rebuilding).
NodeSpec Healthy(NodeSpec s) {
  s.healthy = true;
  for (GpuDevice& g : s.gpus) g.healthy = true;
  return s;
}

// The health the ledger is told of (ApplyHealth), for two specs SameNodeSpec calls equal.
bool SameHealth(const NodeSpec& a, const NodeSpec& b) {
  if (a.healthy != b.healthy || a.gpus.size() != b.gpus.size()) return false;
  for (size_t g = 0; g < a.gpus.size(); ++g)
    if (a.gpus[g].healthy != b.gpus[g].healthy) return false;
  return true;
}

}  // namespace

void ClusterState::ApplyHealth(NodeIndex idx, const KubeNode& kn) {
  (void)ledger_->SetNodeHealthy(idx, kn.ready && kn.spec.healthy);
  (void)ledger_->SetCordoned(idx, kn.cordoned);
  for (size_t g = 0; g < kn.spec.gpus.size(); ++g) (void)ledger_->SetGpuHealthy(idx, static_cast<int>(g), kn.spec.gpus[g].healthy);
  // The MIG instances that exist: a preference for placement; a layout the GPU cannot have is
  // ignored (the GPU is then treated as reporting none).
  for (const auto& [gpu, instances] : kn.mig_present) {
    if (!ledger_->SetMigPresent(idx, gpu, instances).ok()) (void)ledger_->SetMigPresent(idx, gpu, std::nullopt);
  }
}

void ClusterState::ApplyNode(const std::string& type, const Json& node) {
  const std::string name = Str(At(At(node, "metadata"), "name"));
  if (name.empty()) return;
  if (type == "DELETED") {
    ++mask_epoch_;
    bad_nodes_.erase(name);
    if (nodes_.erase(name) > 0) rebuild_ = true;
    return;
  }
  auto parsed = ParseKubeNode(node, catalog_);
  if (!parsed.ok()) {
    ++mask_epoch_;
    bad_nodes_[name] = parsed.status().message();
    if (nodes_.erase(name) > 0) rebuild_ = true;
    return;
  }
  bad_nodes_.erase(name);
  KubeNode kn = std::move(parsed).value();
  auto it = nodes_.find(name);
  if (it != nodes_.end()) {
    const KubeNode& was = it->second;
    const bool same = SameNodeSpec(Healthy(was.spec), Healthy(kn.spec));
    const bool same_labels = was.labels == kn.labels && was.taints == kn.taints;
    const bool same_health = was.ready == kn.ready && was.cordoned == kn.cordoned && SameHealth(was.spec, kn.spec) &&
                             was.mig_present == kn.mig_present;
    it->second = std::move(kn);
    if (!same) {
      ++mask_epoch_;
      rebuild_ = true;
      return;
    }
    // A status update that changes nothing placement reads (the kubelet's heartbeats, conditions
    // gpupool does not read) leaves the failed pods failed: they are not all tried again for it.
    if (same_labels && same_health) return;
    if (!same_labels) ++mask_epoch_;
    CapacityChanged();  // healthier or not, cordoned or not, other labels: decisions may differ now
    if (!rebuild_) {
      if (auto idx = ledger_->FindNode(name)) ApplyHealth(*idx, it->second);
    }
    return;
  }
  it = nodes_.emplace(name, std::move(kn)).first;
  ++mask_epoch_;
  CapacityChanged();
  if (rebuild_) return;
  auto idx = ledger_->AddNode(Healthy(it->second.spec));
  if (!idx.ok()) {
    bad_nodes_[name] = idx.status().message();
    nodes_.erase(it);
    return;
  }
  node_of_index_.push_back(name);
  ApplyHealth(*idx, it->second);
  // Pods bound to it before it was known hold their part now.
  auto waiting = waiting_node_.find(name);
  if (waiting != waiting_node_.end()) {
    const std::set<std::string> uids = std::move(waiting->second);
    waiting_node_.erase(waiting);
    for (const std::string& uid : uids) {
      auto p = pods_.find(uid);
      if (p == pods_.end()) continue;
      Json object = std::move(p->second.object);
      p->second.object = Json();
      Charge(p->second, object);
    }
  }
}

Status ClusterState::Rebuild() {
  ledger_ = std::make_unique<Ledger>(catalog_);
  node_of_index_.clear();
  std::vector<std::string> refused;
  for (const auto& [name, kn] : nodes_) {
    auto idx = ledger_->AddNode(Healthy(kn.spec));
    if (!idx.ok()) {
      bad_nodes_[name] = idx.status().message();
      refused.push_back(name);
      continue;
    }
    node_of_index_.push_back(name);
    ApplyHealth(*idx, kn);
  }
  for (const std::string& name : refused) nodes_.erase(name);
  // Nominations name nodes of the old ledger: preemptors plan again.
  for (auto& [uid, p] : pods_) p.nominated.reset();
  nominated_uids_.clear();
  // Pods hold again what they held, in a fixed order (uids sorted) so a rebuild is reproducible.
  std::vector<std::string> uids;
  for (const auto& [uid, p] : pods_)
    if (p.phase != PodPhase::kPending) uids.push_back(uid);
  std::sort(uids.begin(), uids.end());
  unaccounted_ = 0;
  for (const std::string& uid : uids) {
    Pod& p = pods_[uid];
    p.alloc.reset();
    p.unaccounted = false;
    auto idx = ledger_->FindNode(p.node);
    if (!p.placement || !idx) {
      if (p.phase == PodPhase::kBound && p.object.is_object()) {
        waiting_node_[p.node].insert(uid);
      } else if (p.phase == PodPhase::kBound) {
        // Its placement named a node that is gone: it waits for the node to come back, and is
        // charged as a pod without an assignment then.
        waiting_node_[p.node].insert(uid);
      }
      continue;
    }
    Placement placement = *p.placement;
    placement.node = *idx;
    auto id = ledger_->Commit(placement);
    if (id.ok()) {
      p.alloc = *id;
      p.placement = placement;
    } else {
      p.unaccounted = true;
      ++unaccounted_;
    }
  }
  RETURN_IF_ERROR(RebuildScheduler(TypicalOfGpuTasks(recent_)));
  masks_.clear();
  CapacityChanged();
  ++mask_epoch_;
  rebuild_ = false;
  return Status::Ok();
}

// A rebuilt pipeline starts its caches and best-node indexes over (a pass over every node for every
// shape decided again, 0.3 s at 10,000 nodes): not worth it while the recent mix holds still.
// Policies that learn online (balanced) keep learning from every pod meanwhile.
Status ClusterState::Relearn() {
  since_learn_ = 0;
  std::vector<TypicalPod> learned = TypicalOfGpuTasks(recent_);
  if (scheduler_ != nullptr && WorkloadDistance(learned, typical_pods_) < kWorkloadMinChange) {
    ++relearn_kept_;
    return Status::Ok();
  }
  ++relearned_;
  return RebuildScheduler(std::move(learned));
}

// The pipeline anew: FGD's typical workload learned from the recent GPU pods (a single whole-GPU
// pod until there are any), and policies that learn online (balanced) shown the recent window
// again, oldest first — as the pool server does.
Status ClusterState::RebuildScheduler(std::vector<TypicalPod> typical) {
  typical_pods_ = std::move(typical);
  PluginInit init;
  init.typical_pods = &typical_pods_;
  auto s = Scheduler::Create(options_.profile, DefaultRegistry(), *ledger_, rng_, init);
  if (!s.ok()) return s.status().WithContext("profile " + options_.profile.name);
  scheduler_ = std::move(s).value();
  const size_t n = recent_.size();
  const size_t first = n < kRecentTasks ? 0 : recent_next_;
  for (size_t i = 0; i < n; ++i) scheduler_->Observe(recent_[(first + i) % n]);
  since_learn_ = 0;
  return Status::Ok();
}

void ClusterState::Observe(const TaskRequest& task) {
  if (recent_.size() < kRecentTasks) {
    recent_.push_back(task);
  } else {
    recent_[recent_next_] = task;
    recent_next_ = (recent_next_ + 1) % kRecentTasks;
  }
  ++since_learn_;
  scheduler_->Observe(task);
}

// ---- pods ---------------------------------------------------------------------------------------

Result<Placement> ClusterState::ForeignPlacement(NodeIndex n, const Json& object) const {
  Placement p;
  p.node = n;
  auto req = ParsePodRequest(object);
  if (!req.ok()) return p;  // unreadable: it holds a pod slot, nothing gpupool can count
  const TaskRequest& r = req->request;
  p.cpu = r.cpu;
  p.memory = r.memory;
  if (!r.wants_gpu() || r.wants_mig()) return p;
  const NodeState& s = ledger_->state(n);
  if (r.is_share()) {
    int best = -1;
    for (size_t g = 0; g < s.gpus.size(); ++g) {
      const GpuState& gs = s.gpus[g];
      if (gs.mig_enabled || gs.free_share < r.gpu_share.units() ||
          gs.free_memory < GrantMemory(r.gpu_share.units(), r.gpu_memory.units(), gs.memory))
        continue;
      if (best < 0 || gs.free_share > s.gpus[static_cast<size_t>(best)].free_share) best = static_cast<int>(g);
    }
    if (best < 0) return Status::ResourceExhausted("no GPU has the share it holds");
    const GpuState& chosen = s.gpus[static_cast<size_t>(best)];
    p.gpus.push_back({best, r.gpu_share, MiB(GrantMemory(r.gpu_share.units(), r.gpu_memory.units(), chosen.memory)),
                      std::nullopt});
    p.share_task = true;
    return p;
  }
  for (size_t g = 0; g < s.gpus.size() && static_cast<int>(p.gpus.size()) < r.gpu_count; ++g) {
    const GpuState& gs = s.gpus[g];
    if (gs.mig_enabled || gs.free_share != 1000) continue;
    p.gpus.push_back({static_cast<int>(g), MilliGpu(1000), MiB(gs.free_memory), std::nullopt});
  }
  if (static_cast<int>(p.gpus.size()) < r.gpu_count)
    return Status::ResourceExhausted(fmt::format("fewer than {} free GPUs", r.gpu_count));
  return p;
}

void ClusterState::Charge(Pod& pod, const Json& object) {
  auto idx = rebuild_ ? std::nullopt : ledger_->FindNode(pod.node);
  if (!idx) {
    waiting_node_[pod.node].insert(pod.uid);
    pod.object = object;
    return;
  }
  std::optional<Placement> placement;
  const Json& ann = At(At(At(object, "metadata"), "annotations"), kAssignmentKey);
  if (ann.is_string()) {
    auto p = ParseAssignment(ann.get<std::string>(), pod.uid, pod.node, *ledger_);
    if (p.ok()) placement = std::move(p).value();
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!placement) {
      auto p = ForeignPlacement(*idx, object);
      if (!p.ok()) break;
      placement = std::move(p).value();
    }
    auto id = ledger_->Commit(*placement);
    if (id.ok()) {
      pod.alloc = *id;
      pod.placement = std::move(placement);
      return;
    }
    placement.reset();  // an assignment that no longer fits: count it as the device plugin would
  }
  pod.unaccounted = true;
  ++unaccounted_;
}

Result<PodRequest> ClusterState::ReadRequest(const Json& pod) const {
  ASSIGN_OR_RETURN(PodRequest r, ParsePodRequest(pod));
  RETURN_IF_ERROR(BindTenant(r, options_.namespace_tenants));
  return r;
}

void ClusterState::Hold(Pod& pod, const PodRequest& req) {
  if (pod.counted || !pod.ours) return;
  pod.counted = true;
  pod.tenant = req.tenant;
  pod.queue = req.queue;
  pod.gang = req.gang.empty() ? std::string() : req.namespace_name + "/" + req.gang;
  pod.demand = DemandOf(req.request);
  pod.priority = req.priority;
  pod.qos = req.qos;
  pod.held_seq = next_held_seq_++;
  if (pod.qos == QosClass::kBestEffort) best_effort_held_.insert(pod.uid);
  usage_[{pod.tenant, pod.queue}] += pod.demand;
  if (!pod.gang.empty()) ++gang_held_[pod.gang];
}

void ClusterState::Uncharge(Pod& pod) {
  if (pod.alloc) {
    (void)ledger_->Release(*pod.alloc);
    pod.alloc.reset();
    CapacityChanged();
  }
  pod.placement.reset();
  if (pod.unaccounted) {
    pod.unaccounted = false;
    --unaccounted_;
  }
  if (auto w = waiting_node_.find(pod.node); w != waiting_node_.end()) {
    w->second.erase(pod.uid);
    if (w->second.empty()) waiting_node_.erase(w);
  }
  pod.object = Json();
  if (pod.counted) {
    pod.counted = false;
    best_effort_held_.erase(pod.uid);
    usage_[{pod.tenant, pod.queue}] -= pod.demand;
    if (!pod.gang.empty() && --gang_held_[pod.gang] <= 0) gang_held_.erase(pod.gang);
  }
  pod.node.clear();
}

void ClusterState::Unpend(Pod& pod) {
  if (pod.seq != 0 && pending_.erase(pod.seq) > 0) pending_pods_.erase(pod.seq);
}

void ClusterState::CapacityChanged() {
  ++capacity_epoch_;
  poked_ = true;  // every failed pod is worth trying again
}

void ClusterState::SetPhase(Pod& pod, PodPhase phase) {
  if (pod.phase == PodPhase::kAssumed) --assumed_;
  if (phase == PodPhase::kAssumed) ++assumed_;
  pod.phase = phase;
}

void ClusterState::ForgetPod(const std::string& uid) {
  auto it = pods_.find(uid);
  if (it == pods_.end()) return;
  Uncharge(it->second);
  Unpend(it->second);
  SetPhase(it->second, PodPhase::kBound);  // out of the assumed count
  pods_.erase(it);
}

void ClusterState::ApplyPod(const std::string& type, const Json& pod) {
  const Json& meta = At(pod, "metadata");
  const std::string uid = Str(At(meta, "uid"));
  if (uid.empty()) return;
  const std::string phase = Str(At(At(pod, "status"), "phase"));
  if (type == "DELETED" || phase == "Succeeded" || phase == "Failed") {
    ForgetPod(uid);
    return;
  }
  const Json& spec = At(pod, "spec");
  const std::string node = Str(At(spec, "nodeName"));
  const bool ours = Str(At(spec, "schedulerName")) == options_.scheduler_name;
  if (node.empty() && (!ours || !At(meta, "deletionTimestamp").is_null())) {
    // Not gpupool's to place (another scheduler's, or on its way out before it ran).
    if (auto it = pods_.find(uid); it != pods_.end() && it->second.phase != PodPhase::kAssumed) ForgetPod(uid);
    return;
  }
  auto [it, inserted] = pods_.try_emplace(uid);
  Pod& p = it->second;
  if (inserted) {
    p.uid = uid;
    p.namespace_name = Str(At(meta, "namespace"));
    p.name = Str(At(meta, "name"));
  }
  p.ours = ours;
  if (!node.empty()) {
    Unpend(p);
    p.parked = false;
    if (p.phase != PodPhase::kPending && p.node == node) {
      SetPhase(p, PodPhase::kBound);  // our own decision, now seen: it already holds its part
      return;
    }
    Uncharge(p);
    SetPhase(p, PodPhase::kBound);
    p.node = node;
    poked_ = true;  // a gang's member bound elsewhere counts towards its minimum
    Charge(p, pod);
    if (ours) {
      auto req = ReadRequest(pod);
      if (req.ok()) Hold(p, *req);
    }
    return;
  }
  if (p.phase == PodPhase::kAssumed) return;  // its binding is on its way
  if (p.phase == PodPhase::kBound) Uncharge(p);
  SetPhase(p, PodPhase::kPending);
  const size_t hash = SchedulingHash(pod);
  if (p.seq != 0 && (pending_.count(p.seq) || p.parked) && hash == p.hash) return;  // a status update: nothing to redo
  p.hash = hash;
  p.request = ReadRequest(pod);
  p.constraints = NodeConstraints::FromPod(pod);
  p.failed_epoch = ~uint64_t{0};
  poked_ = true;  // new, or changed in what its placement reads: to be tried
  if (p.seq == 0) p.seq = next_seq_++;
  if (p.parked) return;  // waits out its back-off first
  if (pending_.insert(p.seq).second) {
    pending_pods_[p.seq] = &p;
    if (p.request.ok()) Observe(p.request->request);
  }
}

void ClusterState::BindFailed(const std::string& uid, bool park) {
  auto it = pods_.find(uid);
  if (it == pods_.end() || it->second.phase != PodPhase::kAssumed) return;
  Pod& p = it->second;
  Uncharge(p);
  SetPhase(p, PodPhase::kPending);
  p.failed_epoch = ~uint64_t{0};
  poked_ = true;
  p.last_message.clear();
  p.parked = park;
  if (!park && pending_.insert(p.seq).second) pending_pods_[p.seq] = &p;
}

void ClusterState::EvictFailed(const std::string& uid) {
  auto it = pods_.find(uid);
  if (it == pods_.end() || !it->second.evicting) return;
  it->second.evicting = false;
  it->second.protected_ = true;
  for (auto p = preempting_.begin(); p != preempting_.end();) {
    p->second.erase(uid);
    p = p->second.empty() ? preempting_.erase(p) : std::next(p);
  }
  CapacityChanged();  // its preemptor tries again (and may plan anew)
}

void ClusterState::Unprotect(const std::string& uid) {
  auto it = pods_.find(uid);
  if (it == pods_.end() || !it->second.protected_) return;
  it->second.protected_ = false;
  CapacityChanged();
}

void ClusterState::Unpark(const std::string& uid) {
  auto it = pods_.find(uid);
  if (it == pods_.end() || !it->second.parked) return;
  Pod& p = it->second;
  p.parked = false;
  if (p.phase == PodPhase::kPending && pending_.insert(p.seq).second) pending_pods_[p.seq] = &p;
  poked_ = true;
}

// ---- views --------------------------------------------------------------------------------------

ClusterCounts ClusterState::counts() const {
  ClusterCounts c;
  c.nodes = nodes_.size();
  c.bad_nodes = bad_nodes_.size();
  c.pods_pending = pending_.size();
  c.pods_unaccounted = unaccounted_;
  c.relearned = relearned_;
  c.relearn_kept = relearn_kept_;
  for (const auto& [name, uids] : waiting_node_) c.pods_waiting_node += uids.size();
  // Kept as they change, not counted: a walk over 100,000 pods a few times a second was a tenth of
  // the kube-scheduler's time. CheckInvariants counts them.
  c.pods_charged = ledger_->allocation_count();
  c.pods_assumed = assumed_;
  return c;
}

std::map<std::string, size_t> ClusterState::PendingByReason() const {
  std::map<std::string, size_t> out;
  for (const auto& [seq, pod] : pending_pods_)
    ++out[pod->last_reason.empty() ? std::string("Untried") : pod->last_reason];
  return out;
}

Status ClusterState::CheckInvariants() const {
  RETURN_IF_ERROR(ledger_->CheckInvariants());
  size_t charged = 0, assumed = 0;
  for (const auto& [uid, p] : pods_) {
    if (p.phase == PodPhase::kAssumed) ++assumed;
    if (!p.alloc) continue;
    ++charged;
    const Placement* held = ledger_->Find(*p.alloc);
    if (!held || !p.placement || !(*held == *p.placement))
      return Status::Internal(fmt::format("pod {}/{} holds an allocation the ledger does not have", p.namespace_name, p.name));
    if (node_of_index_[held->node] != p.node)
      return Status::Internal(fmt::format("pod {}/{} is charged on {}, it is on {}", p.namespace_name, p.name,
                                          node_of_index_[held->node], p.node));
  }
  if (charged != ledger_->allocation_count())
    return Status::Internal(fmt::format("{} allocations in the ledger, {} pods hold one", ledger_->allocation_count(), charged));
  if (assumed != assumed_) return Status::Internal(fmt::format("{} pods assumed, {} counted", assumed, assumed_));
  // A pod that could be placed now is never left for want of a cycle that looks (poked_).
  if (!poked_ && nominated_uids_.empty() && AnyToTry())
    return Status::Internal("a pending pod is untried at this capacity, yet no cycle would try it");
  return Status::Ok();
}

}  // namespace gpupool::kube
