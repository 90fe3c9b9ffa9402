#include "sched/queueing.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <unordered_map>
#include <utility>

#include "common/quantity.h"

namespace gpupool {

namespace {

// 128-bit integers for exact ratio comparisons. __extension__ keeps -Wpedantic quiet about a type
// ISO C++ does not have; g++ and clang both provide it on 64-bit targets.
__extension__ typedef unsigned __int128 U128;
__extension__ typedef __int128 I128;

constexpr int64_t Resources::*kComponents[] = {&Resources::cpu, &Resources::memory, &Resources::gpu};
constexpr const char* kComponentNames[] = {"cpu", "memory", "gpu"};
constexpr const char* kShortNames[] = {"cpu", "mem", "gpu"};
constexpr int kNumComponents = 3;

std::string FormatComponent(int c, int64_t v) {
  if (v == kUnlimited) return "unlimited";
  switch (c) {
    case 0: return FormatCpu(MilliCpu(v));
    case 1: return FormatMemory(MiB(v));
    default: return FormatGpu(MilliGpu(v));
  }
}

Resources ClampNonNegative(Resources r) {
  for (auto m : kComponents) r.*m = std::max<int64_t>(r.*m, 0);
  return r;
}

// a + b for non-negative operands, saturating at INT64_MAX instead of overflowing.
void AddSaturating(Resources& a, const Resources& b) {
  for (auto m : kComponents) {
    const int64_t room = kUnlimited - a.*m;
    a.*m = b.*m > room ? kUnlimited : a.*m + b.*m;
  }
}

// An exact non-negative fraction num / den (den > 0).
struct Fraction {
  U128 num = 0;
  U128 den = 1;
};

// Three-way comparison of a/b and c/d, exact for any operands below 2^128. When all four fit in
// 64 bits, cross-multiplication in 128 bits is exact. Otherwise compare integer parts and recurse
// on the inverted remainders (a continued-fraction expansion, as fast as Euclid's algorithm).
int CompareFractions(U128 a, U128 b, U128 c, U128 d) {
  constexpr U128 kLow = ~static_cast<uint64_t>(0);
  while (true) {
    if (a <= kLow && b <= kLow && c <= kLow && d <= kLow) {
      const U128 left = a * d;
      const U128 right = c * b;
      return left < right ? -1 : (left > right ? 1 : 0);
    }
    const U128 qa = a / b;
    const U128 qc = c / d;
    if (qa != qc) return qa < qc ? -1 : 1;
    const U128 ra = a % b;
    const U128 rc = c % d;
    if (ra == 0 || rc == 0) return ra == rc ? 0 : (ra == 0 ? -1 : 1);
    // ra/b < rc/d  <=>  d/rc < b/ra: continue with the inverted remainders.
    const U128 next_a = d, next_b = rc, next_c = b, next_d = ra;
    a = next_a;
    b = next_b;
    c = next_c;
    d = next_d;
  }
}

int Compare(const Fraction& x, const Fraction& y) {
  return CompareFractions(x.num, x.den, y.num, y.den);
}

int64_t ToPpm(const Fraction& f) {
  const U128 ppm = f.num * 1000000 / f.den;
  return ppm > static_cast<U128>(kUnlimited) ? kUnlimited : static_cast<int64_t>(ppm);
}

// max over components with total > 0 of used / total; 0 when no total is positive.
Fraction DominantShare(const Resources& used, const Resources& total) {
  Fraction best{0, 1};
  for (auto m : kComponents) {
    if (total.*m <= 0) continue;
    const Fraction f{static_cast<U128>(used.*m), static_cast<U128>(total.*m)};
    if (Compare(f, best) > 0) best = f;
  }
  return best;
}

// share * 1000 / weight_milli. num stays below 2^73 and den below 2^126.
Fraction Weighted(const Fraction& share, int64_t weight_milli) {
  return {share.num * 1000, share.den * static_cast<U128>(weight_milli)};
}

// max over components with guaranteed > 0 of used / guaranteed; nullopt when nothing is guaranteed.
std::optional<Fraction> GuaranteeRatio(const Resources& used, const Resources& guaranteed) {
  std::optional<Fraction> best;
  for (auto m : kComponents) {
    if (guaranteed.*m <= 0) continue;
    const Fraction f{static_cast<U128>(used.*m), static_cast<U128>(guaranteed.*m)};
    if (!best || Compare(f, *best) > 0) best = f;
  }
  return best;
}

}  // namespace

Resources JobDemand(const Job& job) {
  Resources total;
  for (const TaskGroup& g : job.groups) {
    const int64_t n = std::max(g.replicas, 0);
    const TaskRequest& r = g.request;
    const int64_t gpu = r.wants_mig() ? kWholeGpu.units() : r.total_gpu_share().units();
    total += Resources{r.cpu.units() * n, r.memory.units() * n, gpu * n};
  }
  return total;
}

std::string FormatResources(const Resources& r) {
  std::string out;
  for (int c = 0; c < kNumComponents; ++c) {
    if (c > 0) out += ' ';
    out += fmt::format("{}={}", kShortNames[c], FormatComponent(c, r.*kComponents[c]));
  }
  return out;
}

std::string_view OrderingPolicyName(OrderingPolicy policy) {
  switch (policy) {
    case OrderingPolicy::kFifo: return "fifo";
    case OrderingPolicy::kPriority: return "priority";
    case OrderingPolicy::kDrf: return "drf";
    case OrderingPolicy::kHierarchical: return "hierarchical";
  }
  return "unknown";
}

Result<OrderingPolicy> ParseOrderingPolicy(std::string_view name) {
  for (OrderingPolicy p : {OrderingPolicy::kFifo, OrderingPolicy::kPriority, OrderingPolicy::kDrf,
                           OrderingPolicy::kHierarchical}) {
    if (OrderingPolicyName(p) == name) return p;
  }
  return Status::InvalidArgument(
      fmt::format("unknown ordering policy '{}' (use fifo, priority, drf or hierarchical)", name));
}

// ---- the queue tree -------------------------------------------------------------------------

struct QueueOrder::Tree {
  QueueOrderOptions options;  // queues[i] is queue i
  std::unordered_map<std::string, size_t> index;
  std::vector<std::vector<size_t>> children;  // per queue
  std::vector<size_t> top_level;              // children of the root
  std::vector<std::vector<size_t>> path;      // per queue: itself, its parent, ..., a top-level queue

  const QueueSpec& spec(size_t q) const { return options.queues[q]; }
  size_t default_queue = 0;
  std::optional<size_t> Find(const std::string& name) const {
    if (name.empty()) return default_queue;
    auto it = index.find(name);
    if (it == index.end()) return std::nullopt;
    return it->second;
  }
  int64_t TenantWeight(const std::string& tenant) const {
    auto it = options.tenant_weight_milli.find(tenant);
    return it == options.tenant_weight_milli.end() ? 1000 : it->second;
  }
  // Per queue, the subtree sums of `usage` (clamped to non-negative, saturating).
  std::vector<Resources> SubtreeUsage(const std::vector<UsageEntry>& usage) const {
    std::vector<Resources> used(options.queues.size());
    for (const UsageEntry& u : usage) {
      auto q = Find(u.queue);
      if (!q) continue;
      const Resources r = ClampNonNegative(u.used);
      for (size_t a : path[*q]) AddSaturating(used[a], r);
    }
    return used;
  }
};

Result<QueueOrder> QueueOrder::Create(QueueOrderOptions options) {
  for (const auto& [tenant, weight] : options.tenant_weight_milli) {
    if (weight <= 0) {
      return Status::InvalidArgument(
          fmt::format("tenant '{}': weight_milli must be > 0, got {}", tenant, weight));
    }
  }
  auto tree = std::make_shared<Tree>();
  std::vector<QueueSpec>& queues = options.queues;
  if (std::none_of(queues.begin(), queues.end(), [](const QueueSpec& q) { return q.name == "default"; })) {
    QueueSpec def;
    def.name = "default";
    queues.push_back(std::move(def));
  }
  for (size_t i = 0; i < queues.size(); ++i) {
    const QueueSpec& q = queues[i];
    if (q.name.empty()) return Status::InvalidArgument(fmt::format("queue #{}: name must not be empty", i));
    if (!tree->index.emplace(q.name, i).second) {
      return Status::InvalidArgument(fmt::format("queue '{}': name is used by more than one queue", q.name));
    }
    if (q.weight_milli <= 0) {
      return Status::InvalidArgument(
          fmt::format("queue '{}': weight_milli must be > 0, got {}", q.name, q.weight_milli));
    }
    for (int c = 0; c < kNumComponents; ++c) {
      const int64_t g = q.guaranteed.*kComponents[c];
      const int64_t l = q.limit.*kComponents[c];
      if (g < 0) {
        return Status::InvalidArgument(
            fmt::format("queue '{}': guaranteed.{} must not be negative", q.name, kComponentNames[c]));
      }
      if (l < 0) {
        return Status::InvalidArgument(
            fmt::format("queue '{}': limit.{} must not be negative", q.name, kComponentNames[c]));
      }
      if (g > l) {
        return Status::InvalidArgument(fmt::format("queue '{}': guaranteed.{} ({}) exceeds limit.{} ({})",
                                                   q.name, kComponentNames[c], FormatComponent(c, g),
                                                   kComponentNames[c], FormatComponent(c, l)));
      }
    }
  }
  const size_t n = queues.size();
  std::vector<std::optional<size_t>> parent(n);
  for (size_t i = 0; i < n; ++i) {
    const QueueSpec& q = queues[i];
    if (q.parent.empty()) continue;
    if (q.parent == q.name)
      return Status::InvalidArgument(fmt::format("queue '{}': parent is itself", q.name));
    auto it = tree->index.find(q.parent);
    if (it == tree->index.end()) {
      return Status::InvalidArgument(fmt::format("queue '{}': parent '{}' does not exist", q.name, q.parent));
    }
    parent[i] = it->second;
  }
  tree->children.resize(n);
  tree->path.resize(n);
  for (size_t i = 0; i < n; ++i) {
    // A chain longer than the number of queues revisits one of them: a cycle.
    std::optional<size_t> at = i;
    while (at) {
      if (tree->path[i].size() >= n) {
        return Status::InvalidArgument(fmt::format("queue '{}': parent chain forms a cycle", queues[i].name));
      }
      tree->path[i].push_back(*at);
      at = parent[*at];
    }
    if (parent[i]) {
      tree->children[*parent[i]].push_back(i);
    } else {
      tree->top_level.push_back(i);
    }
  }
  tree->default_queue = tree->index.at("default");
  tree->options = std::move(options);
  return QueueOrder(std::move(tree));
}

QueueOrder::QueueOrder(std::shared_ptr<const Tree> tree) : tree_(std::move(tree)) {}

const QueueOrderOptions& QueueOrder::options() const {
  return tree_->options;
}

bool QueueOrder::HasQueue(const std::string& name) const {
  return tree_->Find(name).has_value();
}

const QueueSpec* QueueOrder::FindQueue(const std::string& name) const {
  auto q = tree_->Find(name);
  return q ? &tree_->spec(*q) : nullptr;
}

std::vector<std::string> QueueOrder::Ancestry(const std::string& name) const {
  std::vector<std::string> out;
  if (auto q = tree_->Find(name)) {
    for (size_t a : tree_->path[*q]) out.push_back(tree_->spec(a).name);
  }
  return out;
}

Status QueueOrder::Admit(const std::string& queue, const Resources& demand) const {
  auto q = tree_->Find(queue);
  if (!q)
    return Status::NotFound(fmt::format("queue '{}' does not exist", queue.empty() ? "default" : queue));
  const std::string& own = tree_->spec(*q).name;
  for (size_t a : tree_->path[*q]) {
    const QueueSpec& spec = tree_->spec(a);
    for (int c = 0; c < kNumComponents; ++c) {
      const int64_t want = demand.*kComponents[c];
      const int64_t limit = spec.limit.*kComponents[c];
      if (want <= limit) continue;
      const std::string whose = a == *q ? std::string("the queue's limit")
                                        : fmt::format("the limit of its ancestor queue '{}'", spec.name);
      return Status::ResourceExhausted(
          fmt::format("queue '{}': the job asks for {}={} but {} is {}={}, so it could never run", own,
                      kComponentNames[c], FormatComponent(c, want), whose, kComponentNames[c],
                      FormatComponent(c, limit)));
    }
  }
  return Status::Ok();
}

std::map<std::string, Resources> QueueOrder::QueueUsage(const std::vector<UsageEntry>& usage) const {
  const std::vector<Resources> used = tree_->SubtreeUsage(usage);
  std::map<std::string, Resources> out;
  for (size_t q = 0; q < used.size(); ++q) out.emplace(tree_->spec(q).name, used[q]);
  return out;
}

int64_t QueueOrder::QueueSharePpm(const std::string& queue, const std::vector<UsageEntry>& usage,
                                  const Resources& cluster_total) const {
  auto q = tree_->Find(queue);
  if (!q) return 0;
  const Resources used = tree_->SubtreeUsage(usage)[*q];
  return ToPpm(Weighted(DominantShare(used, ClampNonNegative(cluster_total)), tree_->spec(*q).weight_milli));
}

int64_t QueueOrder::TenantSharePpm(const std::string& tenant, const std::vector<UsageEntry>& usage,
                                   const Resources& cluster_total) const {
  Resources used;
  for (const UsageEntry& u : usage) {
    if (u.tenant == tenant) AddSaturating(used, ClampNonNegative(u.used));
  }
  return ToPpm(Weighted(DominantShare(used, ClampNonNegative(cluster_total)), tree_->TenantWeight(tenant)));
}

int64_t QueueOrder::GuaranteeRatioPpm(const std::string& queue, const std::vector<UsageEntry>& usage) const {
  auto q = tree_->Find(queue);
  if (!q) return 0;
  auto ratio = GuaranteeRatio(tree_->SubtreeUsage(usage)[*q], tree_->spec(*q).guaranteed);
  return ratio ? ToPpm(*ratio) : 0;
}

// ---- a pass ---------------------------------------------------------------------------------
//
// Jobs are grouped (one group for FIFO and priority, one per tenant for DRF, one per leaf for
// hierarchical). A group's order never changes during a pass, so it is sorted once and read with
// a cursor. What changes is which group goes next; groups sit in ordered sets keyed by their
// share, and a placement re-keys only the groups it touched (its tenant, or the queues on its
// path). Jobs that can no longer go (done, or over a limit) are dropped when they reach the front:
// usage only grows during a pass, so a job over a limit stays over it.

namespace {

struct Group {
  std::vector<size_t> jobs;  // sorted
  size_t cursor = 0;
};

struct PassJob {
  uint64_t seq = 0;
  int priority = 0;
  std::optional<size_t> queue;
  size_t tenant = 0;
  Resources demand;
  bool done = false;    // placed, skipped, or unable to go in this pass
  bool placed = false;  // its demand was added to usage
};

// A group's place in its parent's ordered set: lower goes first.
struct Key {
  int cls = 1;  // 0: under guarantee (hierarchical only), 1: the rest
  Fraction value;
  const std::string* name = nullptr;  // nullptr: the implicit leaf, named ""
};

std::string_view NameOf(const Key& k) {
  return k.name != nullptr ? std::string_view(*k.name) : std::string_view();
}

int CompareKeys(const Key& a, const Key& b) {
  if (a.cls != b.cls) return a.cls < b.cls ? -1 : 1;
  if (const int c = Compare(a.value, b.value); c != 0) return c;
  return NameOf(a).compare(NameOf(b));
}

}  // namespace

struct QueueOrder::Pass::State {
  // Orders group ids by their cached keys. The State never moves (Pass holds it by pointer), so
  // the back pointer stays valid.
  struct ByKey {
    const State* state;
    bool operator()(size_t a, size_t b) const {
      const int c = CompareKeys(state->keys[a], state->keys[b]);
      return c != 0 ? c < 0 : a < b;
    }
  };

  // A node of the hierarchical walk: a queue, the root, or the implicit leaf of an inner queue.
  struct Node {
    std::optional<size_t> parent;  // node id; nullopt for the root
    std::optional<size_t> queue;   // the queue it stands for (the owner, for an implicit leaf)
    bool implicit_leaf = false;
    Group group;                                        // jobs (leaves only)
    std::unique_ptr<std::set<size_t, ByKey>> children;  // active children (inner nodes only)
    bool active = false;                                // in its parent's set
  };

  std::shared_ptr<const Tree> tree;
  OrderingPolicy policy = OrderingPolicy::kHierarchical;
  Resources total;
  std::vector<PassJob> jobs;
  std::vector<Resources> queue_used;  // per queue, subtree sums
  std::vector<Resources> own_used;    // per queue, recorded on the queue itself
  std::vector<std::string> tenant_names;
  std::vector<Resources> tenant_used;

  // FIFO, priority: one group.
  Group all;
  // DRF: one group per tenant; keys per tenant.
  std::vector<Group> tenant_groups;
  // Hierarchical: nodes; keys per node. Node ids: queue q is node q, the root is node Q, implicit
  // leaves follow.
  std::vector<Node> nodes;
  std::vector<std::optional<size_t>> implicit_leaf_of;  // per queue
  size_t root = 0;

  std::vector<Key> keys;  // per tenant (DRF) or per node (hierarchical)
  std::set<size_t, ByKey> tenant_set{ByKey{this}};

  bool FitsLimits(const PassJob& job) const {
    for (size_t a : tree->path[*job.queue]) {
      const Resources& limit = tree->spec(a).limit;
      for (auto m : kComponents) {
        if (static_cast<I128>(queue_used[a].*m) + job.demand.*m > limit.*m) return false;
      }
    }
    return true;
  }

  std::optional<size_t> Head(Group& g) {
    while (g.cursor < g.jobs.size()) {
      PassJob& job = jobs[g.jobs[g.cursor]];
      if (!job.done && FitsLimits(job)) return g.jobs[g.cursor];
      job.done = true;
      ++g.cursor;
    }
    return std::nullopt;
  }

  Key TenantKey(size_t t) const {
    return {1, Weighted(DominantShare(tenant_used[t], total), tree->TenantWeight(tenant_names[t])),
            &tenant_names[t]};
  }

  Key NodeKey(size_t n) const {
    const Node& node = nodes[n];
    if (node.implicit_leaf) {
      return {1, Weighted(DominantShare(own_used[*node.queue], total), 1000), nullptr};
    }
    const QueueSpec& spec = tree->spec(*node.queue);
    const Resources& used = queue_used[*node.queue];
    if (auto ratio = GuaranteeRatio(used, spec.guaranteed); ratio && ratio->num < ratio->den) {
      return {0, *ratio, &spec.name};
    }
    return {1, Weighted(DominantShare(used, total), spec.weight_milli), &spec.name};
  }

  // Re-keys node n in its parent's set after `change` altered its usage.
  template <typename Change>
  void Rekey(size_t n, Change change) {
    Node& node = nodes[n];
    std::set<size_t, ByKey>* siblings = node.active ? nodes[*node.parent].children.get() : nullptr;
    if (siblings != nullptr) siblings->erase(n);
    change();
    keys[n] = NodeKey(n);
    if (siblings != nullptr) siblings->insert(n);
  }

  std::optional<size_t> Pick(size_t n) {
    Node& node = nodes[n];
    if (!node.children) return Head(node.group);
    while (!node.children->empty()) {
      const size_t child = *node.children->begin();
      if (auto job = Pick(child)) return job;
      node.children->erase(node.children->begin());
      nodes[child].active = false;
    }
    return std::nullopt;
  }

  std::optional<size_t> Next() {
    switch (policy) {
      case OrderingPolicy::kFifo:
      case OrderingPolicy::kPriority: return Head(all);
      case OrderingPolicy::kDrf:
        while (!tenant_set.empty()) {
          const size_t t = *tenant_set.begin();
          if (auto job = Head(tenant_groups[t])) return job;
          tenant_set.erase(tenant_set.begin());
        }
        return std::nullopt;
      case OrderingPolicy::kHierarchical: return Pick(root);
    }
    return std::nullopt;
  }

  void Placed(size_t i) {
    PassJob& job = jobs[i];
    job.done = true;
    job.placed = true;
    const size_t t = job.tenant;
    if (policy == OrderingPolicy::kDrf) {
      const bool active = tenant_set.erase(t) > 0;
      AddSaturating(tenant_used[t], job.demand);
      keys[t] = TenantKey(t);
      if (active) tenant_set.insert(t);
    } else {
      AddSaturating(tenant_used[t], job.demand);
    }
    if (!job.queue) return;
    const size_t q = *job.queue;
    if (policy != OrderingPolicy::kHierarchical) {
      AddSaturating(own_used[q], job.demand);
      for (size_t a : tree->path[q]) AddSaturating(queue_used[a], job.demand);
      return;
    }
    if (implicit_leaf_of[q]) {
      Rekey(*implicit_leaf_of[q], [&] { AddSaturating(own_used[q], job.demand); });
    } else {
      AddSaturating(own_used[q], job.demand);
    }
    // Bottom-up: a node's key depends only on its own usage, so each re-key is independent.
    for (size_t a : tree->path[q]) Rekey(a, [&] { AddSaturating(queue_used[a], job.demand); });
  }

  void Init(const std::vector<PendingEntry>& pending, const std::vector<UsageEntry>& usage) {
    const size_t nq = tree->options.queues.size();
    queue_used.assign(nq, Resources{});
    own_used.assign(nq, Resources{});
    std::unordered_map<std::string, size_t> tenant_ids;
    auto tenant_id = [&](const std::string& name) {
      auto [it, added] = tenant_ids.emplace(name, tenant_names.size());
      if (added) {
        tenant_names.push_back(name);
        tenant_used.emplace_back();
      }
      return it->second;
    };
    for (const UsageEntry& u : usage) {
      const Resources r = ClampNonNegative(u.used);
      AddSaturating(tenant_used[tenant_id(u.tenant)], r);
      if (auto q = tree->Find(u.queue)) {
        AddSaturating(own_used[*q], r);
        for (size_t a : tree->path[*q]) AddSaturating(queue_used[a], r);
      }
    }
    jobs.resize(pending.size());
    for (size_t i = 0; i < pending.size(); ++i) {
      const PendingEntry& p = pending[i];
      PassJob& job = jobs[i];
      job.seq = p.seq;
      job.priority = p.priority;
      job.queue = tree->Find(p.queue);
      job.tenant = tenant_id(p.tenant);
      job.demand = ClampNonNegative(p.demand);
      job.done = !job.queue;  // a job in an unknown queue is never offered
    }
    const bool by_seq = policy == OrderingPolicy::kFifo;
    auto job_less = [&](size_t a, size_t b) {
      const PassJob& x = jobs[a];
      const PassJob& y = jobs[b];
      if (!by_seq && x.priority != y.priority) return x.priority > y.priority;
      if (x.seq != y.seq) return x.seq < y.seq;
      return a < b;
    };
    auto finish = [&](Group& g) { std::sort(g.jobs.begin(), g.jobs.end(), job_less); };

    switch (policy) {
      case OrderingPolicy::kFifo:
      case OrderingPolicy::kPriority:
        for (size_t i = 0; i < jobs.size(); ++i) {
          if (!jobs[i].done) all.jobs.push_back(i);
        }
        finish(all);
        break;
      case OrderingPolicy::kDrf:
        tenant_groups.resize(tenant_names.size());
        for (size_t i = 0; i < jobs.size(); ++i) {
          if (!jobs[i].done) tenant_groups[jobs[i].tenant].jobs.push_back(i);
        }
        keys.resize(tenant_names.size());
        for (size_t t = 0; t < tenant_names.size(); ++t) {
          keys[t] = TenantKey(t);
          if (tenant_groups[t].jobs.empty()) continue;
          finish(tenant_groups[t]);
          tenant_set.insert(t);
        }
        break;
      case OrderingPolicy::kHierarchical: InitHierarchy(finish); break;
    }
  }

  template <typename Finish>
  void InitHierarchy(Finish finish) {
    const size_t nq = tree->options.queues.size();
    root = nq;
    nodes.resize(nq + 1);
    implicit_leaf_of.assign(nq, std::nullopt);
    auto inner = [&](size_t n) {
      nodes[n].children = std::make_unique<std::set<size_t, ByKey>>(ByKey{this});
    };
    inner(root);
    for (size_t q = 0; q < nq; ++q) {
      nodes[q].queue = q;
      nodes[q].parent = tree->path[q].size() > 1 ? tree->path[q][1] : root;
      if (!tree->children[q].empty()) inner(q);
    }
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (jobs[i].done) continue;
      const size_t q = *jobs[i].queue;
      size_t leaf = q;
      if (nodes[q].children) {
        if (!implicit_leaf_of[q]) {
          implicit_leaf_of[q] = nodes.size();
          Node node;
          node.parent = q;
          node.queue = q;
          node.implicit_leaf = true;
          nodes.push_back(std::move(node));
        }
        leaf = *implicit_leaf_of[q];
      }
      nodes[leaf].group.jobs.push_back(i);
    }
    keys.resize(nodes.size());
    for (size_t n = 0; n < nodes.size(); ++n) {
      if (n != root) keys[n] = NodeKey(n);
    }
    // Activate every leaf with jobs and its ancestors, so the sets hold only nodes with work below.
    for (size_t n = 0; n < nodes.size(); ++n) {
      if (nodes[n].children || nodes[n].group.jobs.empty()) continue;
      finish(nodes[n].group);
      for (size_t at = n; at != root && !nodes[at].active; at = *nodes[at].parent) {
        nodes[at].active = true;
        nodes[*nodes[at].parent].children->insert(at);
      }
    }
  }
};

QueueOrder::Pass::Pass(std::unique_ptr<State> state) : state_(std::move(state)) {}
QueueOrder::Pass::Pass(Pass&&) noexcept = default;
QueueOrder::Pass& QueueOrder::Pass::operator=(Pass&&) noexcept = default;
QueueOrder::Pass::~Pass() = default;

std::optional<size_t> QueueOrder::Pass::Next() {
  return state_->Next();
}

void QueueOrder::Pass::Placed(size_t i) {
  if (i < state_->jobs.size() && !state_->jobs[i].placed) state_->Placed(i);
}

void QueueOrder::Pass::Skipped(size_t i) {
  if (i < state_->jobs.size()) state_->jobs[i].done = true;
}

QueueOrder::Pass QueueOrder::Begin(const std::vector<PendingEntry>& pending,
                                   const std::vector<UsageEntry>& usage, Resources cluster_total) const {
  auto state = std::make_unique<Pass::State>();
  state->tree = tree_;
  state->policy = tree_->options.policy;
  state->total = ClampNonNegative(cluster_total);
  state->Init(pending, usage);
  return Pass(std::move(state));
}

}  // namespace gpupool
