// The best-node index of Scheduler (scheduler.h, SetBestNodeIndex): per request shape, the feasible
// nodes ordered by total score, kept up to date from the ledger's change log, so that a decision
// costs the nodes that changed since the shape was last decided rather than a pass over every node.
//
// Exactness: a node's feasibility and total are functions of its state (its generation), the
// request, the plugins' epochs and the tie-break ranks — the same assumptions the score cache makes
// — and, with absolute scores (no normalisation over the feasible set), the full pass chooses the
// node of highest total, ties to the lower rank, then the lower index. The index orders its entries
// the same way and drops an entry once its node's generation moved on, so its top is that node.
// PreScore is called exactly when the full pass would call it (two feasible nodes or more, or one
// without skip_scoring_single_node), and a change of a plugin's epoch or of the ranks scores every
// feasible node again (feasibility depends on neither: RescoreIndex filters only the changed nodes).
#include <algorithm>
#include <cstring>

#include "sched/scheduler.h"

namespace gpupool {

namespace {

constexpr size_t kMaxIndexedShapes = 256;

// Worse-than, for a max-heap whose top is the full pass's choice.
bool Worse(const auto& a, const auto& b) {
  if (a.total != b.total) return a.total < b.total;
  if (a.rank != b.rank) return a.rank > b.rank;
  return a.node > b.node;
}

}  // namespace

bool Scheduler::IndexUsable() const {
  if (!index_enabled_ || mask_ != nullptr || !profile_.cache_scores || scores_.empty()) return false;
  for (const ScoreSlot& slot : scores_)
    if ((slot.fields & kUncacheable) || !slot.plugin->absolute_scores()) return false;
  return true;
}

uint64_t Scheduler::IndexSignature() const {
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ ranks_version_;
  for (const ScoreSlot& slot : scores_) h = h * 0x100000001b3ULL ^ (slot.plugin->epoch() + 0x9e3779b97f4a7c15ULL);
  return h;
}

std::string Scheduler::IndexKey(const TaskRequest& t) const {
  std::string key;
  const int64_t flags = (t.nvlink ? 1 : 0) | (t.guaranteed ? 2 : 0) | (int64_t{t.enforced_by} << 2);
  const int64_t fixed[] = {t.cpu.units(), t.memory.units(), t.gpu_count, t.gpu_share.units(), t.gpu_memory.units(),
                           flags};
  key.resize(sizeof(fixed));
  std::memcpy(key.data(), fixed, sizeof(fixed));
  key += t.mig_profile;
  if (t.enforced_by == kEnforceMps) {  // MPS shares of different owners go on different GPUs
    key += '\x01';
    key += t.mps_owner;
  }
  for (const std::string& m : t.gpu_models) {
    key += '\0';
    key += m;
  }
  return key;
}

bool Scheduler::NodeFeasible(NodeIndex node) {
  one_.assign(1, node);
  for (size_t i = 0; i < filters_.size() && !one_.empty(); ++i)
    filters_[i]->Filter(view_, prepared_, one_, filter_reason_base_[i], one_reasons_);
  return !one_.empty();
}

int64_t Scheduler::NodeTotal(NodeIndex node) {
  int64_t total = 0;
  for (ScoreSlot& slot : scores_) total += slot.weight * slot.plugin->Score(view_, prepared_, node);
  return total;
}

void Scheduler::BuildIndex(ShapeIndex& index) {
  ++stats_.index_builds;
  const size_t n = ledger_.node_count();
  const auto& states = ledger_.states();
  index.log_position = ledger_.change_log_end();
  index.seen.resize(n);
  index.live.assign(n, 0);
  for (size_t i = 0; i < n; ++i) index.seen[i] = states[i].generation;
  RunFilters(prepared_);
  for (const NodeIndex node : feasible_) index.live[node] = 1;
  index.live_count = feasible_.size();
  ScoreIntoHeap(index);
}

// Only the plugins' epochs or the ranks moved: which nodes are feasible depends on neither, so the
// nodes that changed since are filtered again and every feasible node scored again, without a
// filter pass over every node.
void Scheduler::RescoreIndex(ShapeIndex& index) {
  ++stats_.index_rescores;
  const auto& states = ledger_.states();
  for (uint64_t pos = index.log_position, end = ledger_.change_log_end(); pos < end; ++pos) {
    const NodeIndex node = ledger_.changed_node(pos);
    const uint64_t gen = states[node].generation;
    if (index.seen[node] == gen) continue;
    index.seen[node] = gen;
    const bool feasible = NodeFeasible(node);
    index.live_count += static_cast<size_t>(feasible) - static_cast<size_t>(index.live[node]);
    index.live[node] = feasible ? 1 : 0;
  }
  index.log_position = ledger_.change_log_end();
  feasible_.clear();
  for (size_t i = 0; i < index.live.size(); ++i)
    if (index.live[i] != 0) feasible_.push_back(static_cast<NodeIndex>(i));
  ScoreIntoHeap(index);
}

// The heap of feasible_ (every feasible node, filtered at its current generation) by total score.
void Scheduler::ScoreIntoHeap(ShapeIndex& index) {
  const auto& states = ledger_.states();
  index.signature = IndexSignature();
  total_.assign(feasible_.size(), 0);
  for (size_t p = 0; p < scores_.size(); ++p) {
    ScoreWith(p, prepared_, raw_);
    for (size_t i = 0; i < raw_.size(); ++i) total_[i] += scores_[p].weight * raw_[i];
  }
  index.heap.clear();
  index.heap.reserve(feasible_.size());
  for (size_t i = 0; i < feasible_.size(); ++i) {
    const NodeIndex node = feasible_[i];
    index.heap.push_back({total_[i], ranks_[node], node, states[node].generation});
  }
  std::make_heap(index.heap.begin(), index.heap.end(), [](const IndexEntry& a, const IndexEntry& b) { return Worse(a, b); });
}

void Scheduler::UpdateIndex(ShapeIndex& index) {
  const auto& states = ledger_.states();
  const auto worse = [](const IndexEntry& a, const IndexEntry& b) { return Worse(a, b); };
  for (uint64_t pos = index.log_position, end = ledger_.change_log_end(); pos < end; ++pos) {
    const NodeIndex node = ledger_.changed_node(pos);
    const uint64_t gen = states[node].generation;
    if (index.seen[node] == gen) continue;  // changed more than once since: looked at already
    ++stats_.index_updates;
    index.seen[node] = gen;
    const bool feasible = NodeFeasible(node);
    index.live_count += static_cast<size_t>(feasible) - static_cast<size_t>(index.live[node]);
    index.live[node] = feasible ? 1 : 0;
    if (!feasible) continue;  // its old entry, if any, is stale now
    index.heap.push_back({NodeTotal(node), ranks_[node], node, gen});
    std::push_heap(index.heap.begin(), index.heap.end(), worse);
  }
  index.log_position = ledger_.change_log_end();
  // Stale entries leave as they surface; past twice the live ones (and some), all at once.
  if (index.heap.size() > 2 * index.live_count + 1024) {
    std::erase_if(index.heap, [&](const IndexEntry& e) { return e.generation != states[e.node].generation; });
    std::make_heap(index.heap.begin(), index.heap.end(), worse);
  }
  while (!index.heap.empty() && index.heap.front().generation != states[index.heap.front().node].generation) {
    std::pop_heap(index.heap.begin(), index.heap.end(), worse);
    index.heap.pop_back();
  }
}

std::optional<NodeIndex> Scheduler::ChooseFromIndex(const TaskRequest& task) {
  one_reasons_.Reset(reason_names_.size());
  const std::string key = IndexKey(task);
  auto it = index_.find(key);
  if (it == index_.end()) {
    if (index_.size() >= kMaxIndexedShapes) {
      // Full: the shape decided least recently makes room (O(shapes), once per new shape).
      auto oldest = index_.begin();
      for (auto i = index_.begin(); i != index_.end(); ++i)
        if (i->second.last_used < oldest->second.last_used) oldest = i;
      index_.erase(oldest);
    }
    it = index_.emplace(key, ShapeIndex{}).first;
    BuildIndex(it->second);
  }
  ShapeIndex& index = it->second;
  index.last_used = ++index_clock_;
  if (index.log_position < ledger_.change_log_begin() || index.seen.size() != ledger_.node_count()) {
    BuildIndex(index);  // the change log no longer reaches back to it, or nodes joined
  } else if (index.signature != IndexSignature()) {
    RescoreIndex(index);
  }
  UpdateIndex(index);
  if (index.live_count == 0) return std::nullopt;
  if (index.live_count > 1 || !profile_.skip_scoring_single_node) {
    // As the full pass: the plugins see the decision coming before they score (balanced adapts its
    // weights here once after relearning; a new epoch means new totals).
    for (ScoreSlot& slot : scores_) slot.plugin->PreScore(view_, prepared_, {});
    if (index.signature != IndexSignature()) {
      RescoreIndex(index);
      UpdateIndex(index);
    }
  }
  ++stats_.index_decisions;
  index_feasible_ = index.live_count;
  return index.heap.front().node;
}

}  // namespace gpupool
