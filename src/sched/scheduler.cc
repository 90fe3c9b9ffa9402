#include "sched/scheduler.h"

#include <fmt/format.h>

#include <algorithm>

namespace gpupool {

namespace {
constexpr size_t kMaxCachedShapes = 4096;
}

std::string Diagnosis::ToString() const {
  std::string out = fmt::format("{}/{} nodes fit", feasible_nodes, total_nodes);
  if (reasons.empty()) return out;
  out += ": ";
  for (size_t i = 0; i < reasons.size(); ++i) {
    if (i > 0) out += ", ";
    out += fmt::format("{} {}", reasons[i].second, reasons[i].first);
  }
  return out;
}

size_t Scheduler::ShapeKeyHash::operator()(const ShapeKey& k) const {
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  auto mix = [&h](uint64_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
  mix(static_cast<uint64_t>(k.cpu));
  mix(static_cast<uint64_t>(k.memory));
  mix(static_cast<uint64_t>(k.share));
  mix(static_cast<uint64_t>(k.gpu_memory));
  mix(static_cast<uint64_t>(k.gpu_count));
  mix(static_cast<uint64_t>(k.models_id));
  mix(static_cast<uint64_t>(k.mig_id));
  mix(static_cast<uint64_t>(k.qos));
  mix(k.mps_owner);
  return static_cast<size_t>(h);
}

Scheduler::Scheduler(Profile profile, Ledger& ledger, Rng& rng)
    : profile_(std::move(profile)), ledger_(ledger), rng_(rng) {
  view_.ledger = &ledger_;
  view_.rng = &rng_;
}

Result<std::unique_ptr<Scheduler>> Scheduler::Create(const Profile& profile, const PluginRegistry& registry,
                                                     Ledger& ledger, Rng& rng, PluginInit init) {
  std::unique_ptr<Scheduler> s(new Scheduler(profile, ledger, rng));
  std::vector<PluginRef> filters = profile.filters;
  if (filters.empty()) {
    for (const auto& name : DefaultFilterNames()) filters.push_back({name, 1, {}});
  }
  for (const PluginRef& ref : filters) {
    ASSIGN_OR_RETURN(auto f, registry.MakeFilter(ref.name, ref.args, init));
    s->filter_reason_base_.push_back(static_cast<int>(s->reason_names_.size()));
    for (auto& r : f->reasons()) s->reason_names_.push_back(std::move(r));
    s->filters_.push_back(std::move(f));
  }
  for (const PluginRef& ref : profile.scores) {
    if (ref.weight < 1) {
      return Status::InvalidArgument(
          fmt::format("score plugin '{}': weight must be at least 1, got {}", ref.name, ref.weight));
    }
    ASSIGN_OR_RETURN(auto p, registry.MakeScore(ref.name, ref.args, init));
    ScoreSlot slot;
    slot.fields = p->fields_read();
    slot.plugin = std::move(p);
    slot.weight = ref.weight;
    s->scores_.push_back(std::move(slot));
  }
  // A score plugin that also chooses GPUs (FGD) serves as the selector of the same name.
  for (auto& slot : s->scores_) {
    if (slot.plugin->name() == profile.gpu_selector.name && profile.gpu_selector.args.is_null()) {
      if (auto* sel = dynamic_cast<GpuSelector*>(slot.plugin.get())) s->selector_ = sel;
    }
  }
  if (s->selector_ == nullptr) {
    ASSIGN_OR_RETURN(s->owned_selector_,
                     registry.MakeSelector(profile.gpu_selector.name, profile.gpu_selector.args, init));
    s->selector_ = s->owned_selector_.get();
  }
  std::vector<PluginRef> permits = profile.permits;
  if (permits.empty()) permits.push_back({"gang", 1, {}});
  for (const PluginRef& ref : permits) {
    ASSIGN_OR_RETURN(auto p, registry.MakePermit(ref.name, ref.args, init));
    s->permits_.push_back(std::move(p));
  }
  s->RefreshClusterView();
  return s;
}

Status Scheduler::SetTieBreakRanks(std::vector<uint32_t> ranks) {
  if (ranks.size() != ledger_.node_count()) {
    return Status::InvalidArgument(
        fmt::format("{} tie-break ranks for {} nodes", ranks.size(), ledger_.node_count()));
  }
  ranks_ = std::move(ranks);
  ++ranks_version_;
  return Status::Ok();
}

void Scheduler::ShuffleTieBreakRanks() {
  ranks_ = rng_.Permutation(static_cast<uint32_t>(ledger_.node_count()));
  ++ranks_version_;
}

void Scheduler::RefreshClusterView() {
  const size_t n = ledger_.node_count();
  if (n == view_nodes_) return;
  int64_t max_cpu = 1;
  int64_t max_gpu = 1000;
  for (NodeIndex i = 0; i < n; ++i) {
    const NodeSpec& spec = ledger_.spec(i);
    max_cpu = std::max(max_cpu, spec.cpu.units());
    max_gpu = std::max<int64_t>(max_gpu, static_cast<int64_t>(spec.gpus.size()) * kWholeGpu.units());
  }
  // Scores may read cluster-wide facts (the normalisation constants, the best topology of any
  // node), so a change in the node set makes every cached score stale.
  for (auto& slot : scores_) {
    slot.shapes.clear();
    slot.cache.clear();
  }
  index_.clear();
  view_.max_node_cpu = max_cpu;
  view_.max_node_gpu_share = max_gpu;
  for (size_t i = ranks_.size(); i < n; ++i) ranks_.push_back(static_cast<uint32_t>(i));
  all_nodes_.resize(n);
  for (size_t i = 0; i < n; ++i) all_nodes_[i] = static_cast<NodeIndex>(i);
  view_nodes_ = n;
}

void Scheduler::Prepare(const TaskRequest& task, PreparedTask& out) {
  PrepareTask(ledger_, task, out);
}

void Scheduler::RunFilters(const PreparedTask& task) {
  const size_t mask_reasons = mask_ != nullptr ? mask_->reasons.size() : 0;
  reasons_.Reset(reason_names_.size() + mask_reasons);
  if (mask_ != nullptr) {
    feasible_.clear();
    const auto& reason = mask_->reason;
    for (NodeIndex n : all_nodes_) {
      const uint8_t r = n < reason.size() ? reason[n] : 0;
      if (r == 0 || r > mask_reasons) {
        feasible_.push_back(n);
      } else {
        reasons_.Add(static_cast<int>(reason_names_.size() + r - 1));
      }
    }
  } else {
    feasible_ = all_nodes_;
  }
  for (size_t i = 0; i < filters_.size() && !feasible_.empty(); ++i) {
    filters_[i]->Filter(view_, task, feasible_, filter_reason_base_[i], reasons_);
  }
}

Diagnosis Scheduler::MakeDiagnosis() const {
  Diagnosis d;
  d.total_nodes = static_cast<int>(ledger_.node_count());
  d.feasible_nodes = static_cast<int>(feasible_.size());
  const auto& counts = reasons_.counts();
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] == 0) continue;
    d.reasons.emplace_back(
        i < reason_names_.size() ? reason_names_[i] : mask_->reasons[i - reason_names_.size()], counts[i]);
  }
  std::stable_sort(d.reasons.begin(), d.reasons.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  return d;
}

void Scheduler::ScoreWith(size_t plugin, const PreparedTask& task, std::vector<int64_t>& out) {
  ScoreSlot& slot = scores_[plugin];
  out.resize(feasible_.size());
  if ((slot.fields & kUncacheable) || !profile_.cache_scores) {
    for (size_t i = 0; i < feasible_.size(); ++i) out[i] = slot.plugin->Score(view_, task, feasible_[i]);
    return;
  }
  if (slot.epoch != slot.plugin->epoch()) {  // the plugin learned: its old scores are stale
    slot.shapes.clear();
    slot.cache.clear();
    slot.epoch = slot.plugin->epoch();
  }
  auto string_id = [this](const std::string& s) -> int32_t {
    auto [it, inserted] = string_ids_.emplace(s, static_cast<int32_t>(string_ids_.size()));
    return it->second;
  };
  const uint32_t f = slot.fields;
  ShapeKey key{};
  if (f & kFieldCpu) key.cpu = task.cpu;
  if (f & kFieldMemory) key.memory = task.memory;
  if (f & kFieldGpuShare) key.share = task.share;
  if (f & kFieldGpuMemory) key.gpu_memory = task.gpu_memory;
  if (f & kFieldGpuCount) key.gpu_count = task.gpu_count;
  key.models_id = -1;
  key.mig_id = -1;
  if ((f & kFieldGpuModels) && !task.request->gpu_models.empty()) {
    std::string joined;
    for (const auto& m : task.request->gpu_models) joined += m + "|";
    key.models_id = string_id(joined);
  }
  if ((f & kFieldMig) && task.mig) key.mig_id = string_id(task.request->mig_profile);
  if (f & kFieldQos) {
    key.qos = (task.guaranteed ? 256 : 0) | task.enforced_by;
    key.mps_owner = task.mps_owner;
  }

  auto it = slot.shapes.find(key);
  if (it == slot.shapes.end()) {
    if (slot.shapes.size() >= kMaxCachedShapes) {
      slot.shapes.clear();
      slot.cache.clear();
    }
    it = slot.shapes.emplace(key, static_cast<uint32_t>(slot.cache.size())).first;
    slot.cache.emplace_back();
  }
  std::vector<CacheEntry>& entries = slot.cache[it->second];
  if (entries.size() < ledger_.node_count()) entries.resize(ledger_.node_count());
  const auto& states = ledger_.states();
  for (size_t i = 0; i < feasible_.size(); ++i) {
    const NodeIndex n = feasible_[i];
    CacheEntry& e = entries[n];
    if (e.generation == states[n].generation) {
      ++stats_.score_cache_hits;
    } else {
      ++stats_.score_cache_misses;
      e.score = slot.plugin->Score(view_, task, n);
      e.generation = states[n].generation;
    }
    out[i] = e.score;
  }
}

Result<std::vector<GpuGrant>> Scheduler::SelectGpus(const PreparedTask& task, NodeIndex node) {
  if (task.mig) {
    auto grant = SelectMigGrant(ledger_, node, task);
    if (!grant) {
      return Status::Internal(fmt::format("node '{}' passed the MIG filter but has no place for '{}'",
                                          ledger_.spec(node).name, task.request->mig_profile));
    }
    return std::vector<GpuGrant>{*grant};
  }
  return selector_->Select(view_, task, node);
}

void Scheduler::Observe(const TaskRequest& task) {
  if (!ValidateTaskRequest(task).ok()) return;
  PreparedTask prepared;
  PrepareTask(ledger_, task, prepared);
  for (ScoreSlot& slot : scores_) slot.plugin->Observe(prepared);
  // A selector that is also a score plugin has just seen it.
  if (owned_selector_ != nullptr) owned_selector_->Observe(prepared);
}

Decision Scheduler::Decide(const TaskRequest& task) {
  Decision d;
  ++stats_.decisions;
  if (Status v = ValidateTaskRequest(task); !v.ok()) {
    d.error = v;
    return d;
  }
  RefreshClusterView();
  Prepare(task, prepared_);
  std::optional<NodeIndex> indexed;
  if (IndexUsable()) indexed = ChooseFromIndex(task);
  if (!indexed) RunFilters(prepared_);
  d.diagnosis.total_nodes = static_cast<int>(ledger_.node_count());
  d.diagnosis.feasible_nodes = static_cast<int>(indexed ? index_feasible_ : feasible_.size());
  if (!indexed && feasible_.empty()) {
    d.diagnosis = MakeDiagnosis();
    return d;
  }
  NodeIndex chosen = indexed ? *indexed : feasible_.front();
  if (!indexed && (feasible_.size() > 1 || !profile_.skip_scoring_single_node)) {
    total_.assign(feasible_.size(), 0);
    for (size_t p = 0; p < scores_.size(); ++p) {
      ScoreSlot& slot = scores_[p];
      slot.plugin->PreScore(view_, prepared_, feasible_);
      ScoreWith(p, prepared_, raw_);
      slot.plugin->Normalize(raw_);
      for (size_t i = 0; i < raw_.size(); ++i) total_[i] += slot.weight * raw_[i];
    }
    size_t best = 0;
    for (size_t i = 1; i < feasible_.size(); ++i) {
      if (total_[i] > total_[best] ||
          (total_[i] == total_[best] && ranks_[feasible_[i]] < ranks_[feasible_[best]])) {
        best = i;
      }
    }
    chosen = feasible_[best];
  }
  Placement& p = d.placement;
  p.node = chosen;
  p.cpu = task.cpu;
  p.memory = task.memory;
  p.share_task = prepared_.share_task;
  p.guaranteed = prepared_.guaranteed;
  p.enforced = prepared_.EnforcedOn(ledger_.state(chosen));
  p.mps_owner.reset();
  if (prepared_.mps) p.mps_owner = task.mps_owner;
  if (prepared_.wants_gpu()) {
    auto grants = SelectGpus(prepared_, chosen);
    if (!grants.ok()) {
      d.error = grants.status();
      return d;
    }
    p.gpus = std::move(grants).value();
  }
  d.placed = true;
  return d;
}

Result<AllocationId> Scheduler::Place(const TaskRequest& task, Decision* decision) {
  Decision d = Decide(task);
  Result<AllocationId> out = Status::Internal("unreachable");
  if (!d.error.ok()) {
    out = d.error;
  } else if (!d.placed) {
    out = Status::Unschedulable(d.diagnosis.ToString());
  } else {
    out = ledger_.Commit(d.placement);
  }
  if (decision != nullptr) *decision = std::move(d);
  return out;
}

JobResult Scheduler::ScheduleJob(const Job& job, Binder* binder,
                                 const std::function<void(const Placement&)>& on_reserve) {
  JobResult r;
  if (Status v = ValidateJob(job); !v.ok()) {
    r.status = v;
    return r;
  }
  std::vector<int> task_index;  // position of each placed task in the job's task order
  int index = 0;
  bool first_failure = true;
  for (const TaskGroup& g : job.groups) {
    for (int rep = 0; rep < g.replicas; ++rep, ++index) {
      Decision d;
      auto id = Place(g.request, &d);
      if (id.ok()) {
        r.allocations.push_back(*id);
        r.placements.push_back(d.placement);
        task_index.push_back(index);
        if (on_reserve) on_reserve(d.placement);
        continue;
      }
      if (first_failure) {
        r.diagnosis = d.diagnosis;
        r.first_failed_task = index;
        r.status = id.status().WithContext(
            fmt::format("task {}[{}]", g.name.empty() ? std::string("task") : g.name, rep));
        first_failure = false;
      }
    }
  }
  auto rollback = [&]() {
    for (AllocationId a : r.allocations) (void)ledger_.Release(a);
    r.allocations.clear();
    r.placements.clear();
  };
  const int placed = static_cast<int>(r.allocations.size());
  for (const auto& permit : permits_) {
    if (Status st = permit->Permit(job, placed); !st.ok()) {
      // Nothing fitted at all: the first task's own reason says more than the gang's.
      if (placed == 0 && !r.status.ok()) {
        rollback();
        return r;
      }
      if (r.status.ok()) {
        r.status = st;
      } else {
        r.status = Status(st.code(), st.message() + "; first failure: " + r.status.message());
      }
      rollback();
      return r;
    }
  }
  if (binder != nullptr) {
    for (size_t i = 0; i < r.allocations.size(); ++i) {
      if (Status st = binder->Bind(job, task_index[i], r.allocations[i], r.placements[i]); !st.ok()) {
        r.status = st.WithContext("bind");
        rollback();
        return r;
      }
    }
  }
  r.placed = true;
  r.status = Status::Ok();
  return r;
}

std::vector<std::string> Scheduler::ExplainNodes(const TaskRequest& task) {
  RefreshClusterView();
  std::vector<std::string> out(ledger_.node_count());
  if (Status v = ValidateTaskRequest(task); !v.ok()) {
    for (auto& s : out) s = v.message();
    return out;
  }
  PreparedTask prepared;
  Prepare(task, prepared);
  ReasonCounter counter;
  std::vector<NodeIndex> one;
  for (NodeIndex n = 0; n < ledger_.node_count(); ++n) {
    if (mask_ != nullptr && n < mask_->reason.size() && mask_->reason[n] != 0 &&
        mask_->reason[n] <= mask_->reasons.size()) {
      out[n] = mask_->reasons[mask_->reason[n] - 1];
      continue;
    }
    counter.Reset(reason_names_.size());
    one.assign(1, n);
    for (size_t i = 0; i < filters_.size() && !one.empty(); ++i) {
      filters_[i]->Filter(view_, prepared, one, filter_reason_base_[i], counter);
    }
    if (one.empty()) {
      const auto& counts = counter.counts();
      for (size_t r = 0; r < counts.size(); ++r) {
        if (counts[r] > 0) out[n] = reason_names_[r];
      }
    }
  }
  return out;
}

}  // namespace gpupool
