#include "model/ledger.h"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

namespace gpupool {

Ledger::Ledger(GpuCatalog catalog) : catalog_(std::move(catalog)) {
  model_names_.emplace_back("");
  mps_owner_names_.emplace_back("");
}

uint32_t Ledger::InternMpsOwner(const std::string& owner) {
  auto [it, added] = mps_owner_ids_.try_emplace(owner, static_cast<uint32_t>(mps_owner_names_.size()));
  if (added) mps_owner_names_.push_back(owner);
  return it->second;
}

std::optional<uint32_t> Ledger::FindMpsOwner(const std::string& owner) const {
  auto it = mps_owner_ids_.find(owner);
  if (it == mps_owner_ids_.end()) return std::nullopt;
  return it->second;
}

ModelId Ledger::InternModel(const std::string& name) {
  for (size_t i = 0; i < model_names_.size(); ++i) {
    if (model_names_[i] == name) return static_cast<ModelId>(i);
  }
  model_names_.push_back(name);
  return static_cast<ModelId>(model_names_.size() - 1);
}

std::optional<ModelId> Ledger::FindModel(const std::string& name) const {
  for (size_t i = 1; i < model_names_.size(); ++i) {
    if (model_names_[i] == name) return static_cast<ModelId>(i);
  }
  return std::nullopt;
}

std::optional<NodeIndex> Ledger::FindNode(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

void Ledger::RecountNode(NodeState& s) const {
  s.free_gpu_share = 0;
  s.fully_free_gpus = 0;
  s.usable_gpus = 0;
  s.max_free_share = 0;
  s.memory_short_gpus = 0;
  s.guaranteed_gpus = 0;
  s.mps_gpus = 0;
  s.usable_free.fill(0);
  s.usable_index.fill(0);
  const bool compact = s.compact();
  for (size_t i = 0; i < s.gpus.size(); ++i) {
    const GpuState& g = s.gpus[i];
    if (!g.healthy || g.mig_enabled) continue;
    if (compact) {
      s.usable_free[static_cast<size_t>(s.usable_gpus)] = static_cast<int16_t>(g.free_share);
      s.usable_index[static_cast<size_t>(s.usable_gpus)] = static_cast<uint8_t>(i);
    }
    ++s.usable_gpus;
    s.free_gpu_share += g.free_share;
    s.max_free_share = std::max(s.max_free_share, g.free_share);
    if (g.free_share == kWholeGpu.units()) ++s.fully_free_gpus;
    if (g.free_memory < ShareMemory(g.free_share, g.memory)) ++s.memory_short_gpus;
    if (g.guaranteed_shares > 0) ++s.guaranteed_gpus;
    if (g.mps_shares > 0) ++s.mps_gpus;
  }
}

void Ledger::Recount(NodeState& s) {
  const int32_t before = s.guaranteed_gpus;
  const int32_t mps_before = s.mps_gpus;
  RecountNode(s);
  guaranteed_gpus_ += s.guaranteed_gpus - before;
  mps_gpus_ += s.mps_gpus - mps_before;
}

Result<NodeIndex> Ledger::AddNode(NodeSpec spec) {
  RETURN_IF_ERROR(ValidateNodeSpec(spec, catalog_));
  if (by_name_.count(spec.name) != 0) {
    return Status::AlreadyExists(fmt::format("node '{}' already exists", spec.name));
  }
  NodeState s;
  s.free_cpu = spec.cpu.units();
  s.free_memory = spec.memory.units();
  s.healthy = spec.healthy;
  s.max_tasks = spec.max_tasks;
  s.enforces = ShareEnforcementOf(spec.labels);
  // Intern the catalog's canonical name, so a spec that spells an alias ("A100-SXM4-80GB") shares
  // its ModelId with nodes and requests that use the canonical name.
  const GpuModelSpec* model_spec = spec.gpus.empty() ? nullptr : catalog_.Find(spec.gpus.front().model);
  if (!spec.gpus.empty()) {
    s.model = InternModel(model_spec != nullptr ? model_spec->name : spec.gpus.front().model);
  }
  s.gpus.reserve(spec.gpus.size());
  for (const GpuDevice& d : spec.gpus) {
    GpuState g;
    g.free_share = static_cast<int32_t>(kWholeGpu.units());
    g.free_memory = d.memory.units();
    g.memory = d.memory.units();
    g.healthy = d.healthy;
    g.mig_enabled = d.mig_enabled;
    s.gpus.push_back(std::move(g));
    if (!d.mig_enabled) {
      ++total_gpus_;
      total_gpu_share_ += kWholeGpu.units();
    }
  }
  RecountNode(s);
  const auto index = static_cast<NodeIndex>(specs_.size());
  node_model_spec_.push_back(model_spec);
  mig_present_.emplace_back(spec.gpus.size());
  by_name_.emplace(spec.name, index);
  specs_.push_back(std::move(spec));
  states_.push_back(std::move(s));
  return index;
}

Status Ledger::CheckFits(const Placement& p) const {
  if (p.node >= specs_.size())
    return Status::InvalidArgument(fmt::format("placement names unknown node #{}", p.node));
  const NodeSpec& spec = specs_[p.node];
  const NodeState& s = states_[p.node];
  const std::string where = fmt::format("node '{}'", spec.name);
  if (p.cpu.units() < 0 || p.memory.units() < 0) {
    return Status::InvalidArgument(where + ": placement with negative CPU or memory");
  }
  if (!s.healthy) return Status::FailedPrecondition(where + ": node is unhealthy");
  if (p.cpu.units() > s.free_cpu) {
    return Status::ResourceExhausted(
        fmt::format("{}: insufficient CPU: asks {}m, {}m free", where, p.cpu.units(), s.free_cpu));
  }
  if (p.memory.units() > s.free_memory) {
    return Status::ResourceExhausted(fmt::format("{}: insufficient memory: asks {} MiB, {} MiB free", where,
                                                 p.memory.units(), s.free_memory));
  }
  if (spec.max_tasks > 0 && s.tasks >= spec.max_tasks) {
    return Status::ResourceExhausted(
        fmt::format("{}: already holds its maximum of {} tasks", where, spec.max_tasks));
  }
  const MigGeometry* geometry = nullptr;
  if (const GpuModelSpec* model = node_model_spec_[p.node]; model != nullptr && model->mig)
    geometry = &*model->mig;
  std::vector<bool> seen(s.gpus.size(), false);
  for (const GpuGrant& g : p.gpus) {
    if (g.gpu < 0 || static_cast<size_t>(g.gpu) >= s.gpus.size()) {
      return Status::InvalidArgument(fmt::format("{}: no GPU {}", where, g.gpu));
    }
    if (seen[static_cast<size_t>(g.gpu)]) {
      return Status::InvalidArgument(fmt::format("{}: GPU {} appears twice in one placement", where, g.gpu));
    }
    seen[static_cast<size_t>(g.gpu)] = true;
    const GpuState& gs = s.gpus[static_cast<size_t>(g.gpu)];
    if (!gs.healthy) return Status::FailedPrecondition(fmt::format("{}: GPU {} is unhealthy", where, g.gpu));
    if (g.share.units() < 0 || g.memory.units() < 0) {
      return Status::InvalidArgument(fmt::format("{}: negative amount on GPU {}", where, g.gpu));
    }
    if (g.mig) {
      if (!gs.mig_enabled)
        return Status::InvalidArgument(fmt::format("{}: GPU {} is not in MIG mode", where, g.gpu));
      if (!g.share.is_zero() || !g.memory.is_zero()) {
        return Status::InvalidArgument(
            fmt::format("{}: a MIG grant on GPU {} carries share or memory", where, g.gpu));
      }
      if (geometry == nullptr)
        return Status::Internal(fmt::format("{}: MIG GPU without MIG geometry", where));
      MigLayout trial = gs.mig;
      RETURN_IF_ERROR(trial.Add(*geometry, *g.mig).WithContext(fmt::format("{}: GPU {}", where, g.gpu)));
      continue;
    }
    if (gs.mig_enabled) {
      return Status::InvalidArgument(
          fmt::format("{}: GPU {} is in MIG mode and takes MIG requests only", where, g.gpu));
    }
    if (g.share.units() < 1)
      return Status::InvalidArgument(fmt::format("{}: zero GPU share on GPU {}", where, g.gpu));
    if (g.share.units() > gs.free_share) {
      return Status::ResourceExhausted(fmt::format("{}: insufficient GPU share on GPU {}: asks {}, {} free",
                                                   where, g.gpu, g.share.units(), gs.free_share));
    }
    if (g.memory.units() > gs.free_memory) {
      return Status::ResourceExhausted(
          fmt::format("{}: insufficient GPU memory on GPU {}: asks {} MiB, {} MiB free", where, g.gpu,
                      g.memory.units(), gs.free_memory));
    }
    if (g.share < kWholeGpu && !QosAllows(gs, p.guaranteed, p.enforced)) {
      return Status::FailedPrecondition(fmt::format(
          "{}: GPU {} holds {}, and a {} may not share a GPU with it", where, g.gpu,
          p.guaranteed ? "a share nothing holds to its size" : "a guaranteed share",
          p.guaranteed ? "guaranteed share" : "share nothing holds to its size"));
    }
    if (g.share < kWholeGpu && p.mps_owner && gs.mps_shares > 0) {
      const std::optional<uint32_t> owner = FindMpsOwner(*p.mps_owner);
      if (!MpsAllows(gs, owner.value_or(0))) {
        return Status::FailedPrecondition(
            fmt::format("{}: GPU {} holds MPS shares of '{}', and its MPS server runs for one owner at a "
                        "time (this share is '{}''s)",
                        where, g.gpu, mps_owner_names_[gs.mps_owner], *p.mps_owner));
      }
    }
  }
  return Status::Ok();
}

void Ledger::Apply(const Placement& p, int sign) {
  NodeState& s = states_[p.node];
  s.free_cpu -= sign * p.cpu.units();
  s.free_memory -= sign * p.memory.units();
  s.tasks += sign;
  const MigGeometry* geometry = nullptr;
  if (const GpuModelSpec* model = node_model_spec_[p.node]; model != nullptr && model->mig)
    geometry = &*model->mig;
  for (const GpuGrant& g : p.gpus) {
    GpuState& gs = s.gpus[static_cast<size_t>(g.gpu)];
    gs.tasks += sign;
    if (g.mig) {
      // CheckFits (commit) or the commit itself (release) guarantees these succeed.
      Status st = sign > 0 ? gs.mig.Add(*geometry, *g.mig) : gs.mig.Remove(*g.mig);
      (void)st;
      continue;
    }
    gs.free_share -= static_cast<int32_t>(sign * g.share.units());
    gs.free_memory -= sign * g.memory.units();
    if (g.share < kWholeGpu) {
      if (p.guaranteed) gs.guaranteed_shares = static_cast<int16_t>(gs.guaranteed_shares + sign);
      if (!p.enforced) gs.unlimited_shares = static_cast<int16_t>(gs.unlimited_shares + sign);
      if (p.mps_owner) {
        if (sign > 0) gs.mps_owner = InternMpsOwner(*p.mps_owner);
        gs.mps_shares = static_cast<int16_t>(gs.mps_shares + sign);
      }
    }
    used_gpu_share_ += sign * g.share.units();
  }
  if (!p.gpus.empty()) {
    if (p.share_task) {
      s.share_tasks += sign;
    } else {
      const size_t k = p.gpus.size();
      if (s.tasks_by_gpu_count.size() <= k) s.tasks_by_gpu_count.resize(k + 1, 0);
      s.tasks_by_gpu_count[k] += sign;
    }
  }
  Recount(s);
  Changed(p.node);
}

void Ledger::Changed(NodeIndex node) {
  ++states_[node].generation;
  // Bounded: past twice the larger of 4,096 and the node count, the older half goes.
  const size_t cap = 2 * std::max<size_t>(4096, states_.size());
  if (log_.size() >= cap) {
    const size_t drop = log_.size() / 2;
    log_.erase(log_.begin(), log_.begin() + static_cast<std::ptrdiff_t>(drop));
    log_base_ += drop;
  }
  log_.push_back(node);
}

Result<AllocationId> Ledger::Commit(const Placement& placement) {
  RETURN_IF_ERROR(CheckFits(placement));
  Apply(placement, +1);
  const AllocationId id = next_id_++;
  allocations_.emplace(id, placement);
  return id;
}

Status Ledger::Release(AllocationId id) {
  auto it = allocations_.find(id);
  if (it == allocations_.end()) return Status::NotFound(fmt::format("no allocation {}", id));
  Apply(it->second, -1);
  allocations_.erase(it);
  return Status::Ok();
}

const Placement* Ledger::Find(AllocationId id) const {
  auto it = allocations_.find(id);
  return it == allocations_.end() ? nullptr : &it->second;
}

Status Ledger::SetCordoned(NodeIndex node, bool cordoned) {
  if (node >= states_.size()) return Status::NotFound(fmt::format("no node #{}", node));
  states_[node].cordoned = cordoned;
  Changed(node);
  return Status::Ok();
}

Status Ledger::SetNodeHealthy(NodeIndex node, bool healthy) {
  if (node >= states_.size()) return Status::NotFound(fmt::format("no node #{}", node));
  states_[node].healthy = healthy;
  Changed(node);
  return Status::Ok();
}

Status Ledger::SetGpuHealthy(NodeIndex node, int gpu, bool healthy) {
  if (node >= states_.size()) return Status::NotFound(fmt::format("no node #{}", node));
  NodeState& s = states_[node];
  if (gpu < 0 || static_cast<size_t>(gpu) >= s.gpus.size()) {
    return Status::NotFound(fmt::format("node '{}' has no GPU {}", specs_[node].name, gpu));
  }
  s.gpus[static_cast<size_t>(gpu)].healthy = healthy;
  Recount(s);
  Changed(node);
  return Status::Ok();
}

Status Ledger::SetMigEnabled(NodeIndex node, int gpu, bool enabled) {
  if (node >= states_.size()) return Status::NotFound(fmt::format("no node #{}", node));
  NodeState& s = states_[node];
  const std::string where = fmt::format("node '{}'", specs_[node].name);
  if (gpu < 0 || static_cast<size_t>(gpu) >= s.gpus.size()) {
    return Status::NotFound(fmt::format("{} has no GPU {}", where, gpu));
  }
  GpuState& g = s.gpus[static_cast<size_t>(gpu)];
  if (g.mig_enabled == enabled) return Status::Ok();
  const GpuModelSpec* model = node_model_spec_[node];
  if (enabled && (model == nullptr || !model->mig)) {
    return Status::FailedPrecondition(fmt::format("{}: GPU model '{}' does not support MIG", where,
                                                  specs_[node].gpus[static_cast<size_t>(gpu)].model));
  }
  if (g.tasks != 0) return Status::FailedPrecondition(fmt::format("{}: GPU {} is in use", where, gpu));
  g.mig_enabled = enabled;
  mig_present_[node][static_cast<size_t>(gpu)].reset();
  specs_[node].gpus[static_cast<size_t>(gpu)].mig_enabled = enabled;
  total_gpus_ += enabled ? -1 : 1;
  total_gpu_share_ += (enabled ? -1 : 1) * kWholeGpu.units();
  Recount(s);
  Changed(node);
  return Status::Ok();
}

namespace {
std::vector<MigInstance> Sorted(std::vector<MigInstance> v) {
  std::sort(v.begin(), v.end(), [](const MigInstance& a, const MigInstance& b) {
    return std::tie(a.start, a.profile_id) < std::tie(b.start, b.profile_id);
  });
  return v;
}
}  // namespace

Status Ledger::CheckInvariants() const {
  // Rebuild every node's state from scratch: capacity minus the live allocations.
  std::vector<NodeState> expect(states_.size());
  int64_t used_share = 0;
  int64_t total_share = 0;
  int total_gpus = 0;
  for (size_t n = 0; n < specs_.size(); ++n) {
    const NodeSpec& spec = specs_[n];
    NodeState& e = expect[n];
    e.free_cpu = spec.cpu.units();
    e.free_memory = spec.memory.units();
    e.gpus.resize(spec.gpus.size());
    for (size_t i = 0; i < spec.gpus.size(); ++i) {
      e.gpus[i].free_share = static_cast<int32_t>(kWholeGpu.units());
      e.gpus[i].free_memory = spec.gpus[i].memory.units();
      e.gpus[i].memory = spec.gpus[i].memory.units();
      if (!spec.gpus[i].mig_enabled) {
        ++total_gpus;
        total_share += kWholeGpu.units();
      }
    }
  }
  std::vector<std::vector<std::vector<MigInstance>>> mig(states_.size());
  for (size_t n = 0; n < specs_.size(); ++n) mig[n].resize(specs_[n].gpus.size());
  std::vector<std::vector<int>> unlimited_guaranteed(states_.size());  // shares both at once, per GPU
  for (size_t n = 0; n < specs_.size(); ++n) unlimited_guaranteed[n].assign(specs_[n].gpus.size(), 0);
  for (const auto& [id, p] : allocations_) {
    NodeState& e = expect[p.node];
    e.free_cpu -= p.cpu.units();
    e.free_memory -= p.memory.units();
    ++e.tasks;
    for (const GpuGrant& g : p.gpus) {
      auto& eg = e.gpus[static_cast<size_t>(g.gpu)];
      ++eg.tasks;
      eg.free_share -= static_cast<int32_t>(g.share.units());
      eg.free_memory -= g.memory.units();
      used_share += g.share.units();
      if (g.mig) mig[p.node][static_cast<size_t>(g.gpu)].push_back(*g.mig);
      if (!g.mig && g.share < kWholeGpu) {
        eg.guaranteed_shares = static_cast<int16_t>(eg.guaranteed_shares + (p.guaranteed ? 1 : 0));
        eg.unlimited_shares = static_cast<int16_t>(eg.unlimited_shares + (p.enforced ? 0 : 1));
        if (p.guaranteed && !p.enforced) ++unlimited_guaranteed[p.node][static_cast<size_t>(g.gpu)];
        if (p.mps_owner) {
          ++eg.mps_shares;
          const std::optional<uint32_t> owner = FindMpsOwner(*p.mps_owner);
          if (!owner)
            return Status::Internal(
                fmt::format("MPS owner '{}' of a placement was never interned", *p.mps_owner));
          if (eg.mps_shares > 1 && eg.mps_owner != *owner) {
            return Status::Internal(fmt::format("node '{}' GPU {}: MPS shares of '{}' and '{}'",
                                                specs_[p.node].name, g.gpu, mps_owner_names_[eg.mps_owner],
                                                *p.mps_owner));
          }
          eg.mps_owner = *owner;
        }
      }
    }
    if (!p.gpus.empty()) {
      if (p.share_task) {
        ++e.share_tasks;
      } else {
        if (e.tasks_by_gpu_count.size() <= p.gpus.size()) e.tasks_by_gpu_count.resize(p.gpus.size() + 1, 0);
        ++e.tasks_by_gpu_count[p.gpus.size()];
      }
    }
  }
  for (size_t n = 0; n < specs_.size(); ++n) {
    const NodeSpec& spec = specs_[n];
    const NodeState& s = states_[n];
    NodeState& e = expect[n];
    const std::string where = fmt::format("node '{}'", spec.name);
    if (s.free_cpu != e.free_cpu || s.free_cpu < 0 || s.free_cpu > spec.cpu.units()) {
      return Status::Internal(
          fmt::format("{}: free CPU {} but allocations leave {}", where, s.free_cpu, e.free_cpu));
    }
    if (s.free_memory != e.free_memory || s.free_memory < 0 || s.free_memory > spec.memory.units()) {
      return Status::Internal(
          fmt::format("{}: free memory {} but allocations leave {}", where, s.free_memory, e.free_memory));
    }
    if (s.tasks != e.tasks || (spec.max_tasks > 0 && s.tasks > spec.max_tasks)) {
      return Status::Internal(fmt::format("{}: {} tasks recorded, {} allocated", where, s.tasks, e.tasks));
    }
    for (size_t i = 0; i < spec.gpus.size(); ++i) {
      const GpuState& g = s.gpus[i];
      const GpuState& eg = e.gpus[i];
      if (g.free_share != eg.free_share || g.free_share < 0 || g.free_share > kWholeGpu.units()) {
        return Status::Internal(fmt::format("{} GPU {}: free share {} but allocations leave {}", where, i,
                                            g.free_share, eg.free_share));
      }
      if (g.free_memory != eg.free_memory || g.free_memory < 0 ||
          g.free_memory > spec.gpus[i].memory.units()) {
        return Status::Internal(fmt::format("{} GPU {}: free memory {} but allocations leave {}", where, i,
                                            g.free_memory, eg.free_memory));
      }
      if (g.tasks != eg.tasks)
        return Status::Internal(fmt::format("{} GPU {}: task count drifted", where, i));
      if (g.guaranteed_shares != eg.guaranteed_shares || g.unlimited_shares != eg.unlimited_shares)
        return Status::Internal(fmt::format("{} GPU {}: QoS share counts drifted", where, i));
      if (g.mps_shares != eg.mps_shares || (g.mps_shares > 0 && g.mps_owner != eg.mps_owner))
        return Status::Internal(fmt::format("{} GPU {}: MPS share count or owner drifted", where, i));
      // A guaranteed share beside a share nothing holds: allowed only when both are one task's.
      if (g.guaranteed_shares > 0 && g.unlimited_shares > 0 &&
          !(g.guaranteed_shares == 1 && g.unlimited_shares == 1 && unlimited_guaranteed[n][i] == 1)) {
        return Status::Internal(fmt::format("{} GPU {}: a guaranteed share shares it with a share nothing holds",
                                            where, i));
      }
      if (g.memory != spec.gpus[i].memory.units())
        return Status::Internal(fmt::format("{} GPU {}: memory drifted from the spec", where, i));
      if (Sorted(g.mig.instances()) != Sorted(mig[n][i])) {
        return Status::Internal(fmt::format("{} GPU {}: MIG layout does not match allocations", where, i));
      }
      if (g.mig_enabled != spec.gpus[i].mig_enabled) {
        return Status::Internal(fmt::format("{} GPU {}: MIG mode drifted", where, i));
      }
    }
    e.healthy = s.healthy;
    for (size_t i = 0; i < spec.gpus.size(); ++i) {
      e.gpus[i].healthy = s.gpus[i].healthy;
      e.gpus[i].mig_enabled = s.gpus[i].mig_enabled;
    }
    RecountNode(e);
    if (s.free_gpu_share != e.free_gpu_share || s.fully_free_gpus != e.fully_free_gpus ||
        s.usable_gpus != e.usable_gpus || s.max_free_share != e.max_free_share ||
        s.max_tasks != spec.max_tasks || s.usable_free != e.usable_free || s.usable_index != e.usable_index ||
        s.memory_short_gpus != e.memory_short_gpus || s.guaranteed_gpus != e.guaranteed_gpus ||
        s.mps_gpus != e.mps_gpus || s.enforces != ShareEnforcementOf(spec.labels)) {
      return Status::Internal(fmt::format("{}: GPU share summary drifted", where));
    }
    if (s.share_tasks != e.share_tasks)
      return Status::Internal(fmt::format("{}: share task count drifted", where));
    auto trimmed = [](std::vector<int32_t> v) {
      while (!v.empty() && v.back() == 0) v.pop_back();
      return v;
    };
    if (trimmed(s.tasks_by_gpu_count) != trimmed(e.tasks_by_gpu_count)) {
      return Status::Internal(fmt::format("{}: multi-GPU task counts drifted", where));
    }
  }
  int64_t guaranteed_gpus = 0;
  for (const NodeState& e : expect) guaranteed_gpus += e.guaranteed_gpus;
  if (guaranteed_gpus != guaranteed_gpus_) return Status::Internal("count of GPUs with guaranteed shares drifted");
  int64_t mps_gpus = 0;
  for (const NodeState& e : expect) mps_gpus += e.mps_gpus;
  if (mps_gpus != mps_gpus_) return Status::Internal("count of GPUs with MPS shares drifted");
  if (used_share != used_gpu_share_ || total_share != total_gpu_share_ || total_gpus != total_gpus_) {
    return Status::Internal("cluster GPU totals drifted");
  }
  return Status::Ok();
}

const MigGeometry* Ledger::GeometryOf(NodeIndex node) const {
  const GpuModelSpec* model = node < node_model_spec_.size() ? node_model_spec_[node] : nullptr;
  return model != nullptr && model->mig ? &*model->mig : nullptr;
}

Status Ledger::CheckMigPresent(NodeIndex node, int gpu, const std::vector<MigInstance>& instances) const {
  if (node >= states_.size()) return Status::NotFound(fmt::format("no node #{}", node));
  const std::string where = fmt::format("node '{}'", specs_[node].name);
  const NodeState& s = states_[node];
  if (gpu < 0 || static_cast<size_t>(gpu) >= s.gpus.size())
    return Status::NotFound(fmt::format("{} has no GPU {}", where, gpu));
  const bool mig = s.gpus[static_cast<size_t>(gpu)].mig_enabled;
  if (!mig && instances.empty()) return Status::Ok();
  if (!mig) return Status::InvalidArgument(fmt::format("{}: GPU {} is not in MIG mode", where, gpu));
  const MigGeometry* geometry = GeometryOf(node);
  if (geometry == nullptr)
    return Status::InvalidArgument(fmt::format("{}: GPU {} has no MIG geometry in the catalog", where, gpu));
  auto layout = MigLayoutOf(*geometry, instances);
  if (!layout.ok()) return layout.status().WithContext(fmt::format("{}: GPU {}", where, gpu));
  return Status::Ok();
}

Status Ledger::SetMigPresent(NodeIndex node, int gpu, std::optional<std::vector<MigInstance>> instances) {
  if (instances) RETURN_IF_ERROR(CheckMigPresent(node, gpu, *instances));
  if (node >= states_.size() || gpu < 0 || static_cast<size_t>(gpu) >= states_[node].gpus.size())
    return Status::NotFound(fmt::format("no GPU {} on node #{}", gpu, node));
  std::optional<MigLayout>& slot = mig_present_[node][static_cast<size_t>(gpu)];
  std::optional<MigLayout> next;
  if (instances && states_[node].gpus[static_cast<size_t>(gpu)].mig_enabled)
    next = *MigLayoutOf(*GeometryOf(node), *instances);
  const auto sorted = [](const std::optional<MigLayout>& l) {
    std::vector<std::pair<int, int>> v;
    if (l)
      for (const MigInstance& m : l->instances()) v.emplace_back(m.start, m.profile_id);
    std::sort(v.begin(), v.end());
    return std::make_pair(l.has_value(), v);
  };
  if (sorted(slot) == sorted(next)) return Status::Ok();
  slot = std::move(next);
  // Placement prefers what exists: a decision cached for this node may change.
  Changed(node);
  return Status::Ok();
}

const MigLayout* Ledger::mig_present(NodeIndex node, int gpu) const {
  if (node >= mig_present_.size() || gpu < 0 || static_cast<size_t>(gpu) >= mig_present_[node].size()) return nullptr;
  const std::optional<MigLayout>& l = mig_present_[node][static_cast<size_t>(gpu)];
  return l ? &*l : nullptr;
}

}  // namespace gpupool
