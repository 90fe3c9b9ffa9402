#include "sched/consolidation.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "sched/framework.h"

namespace gpupool {

namespace {

struct Mover {
  AllocationId allocation;
  const TaskRequest* request;
  const Placement* placement;
  int64_t share;  // milli-GPU held on its one GPU
};

// A node the estimate allows, and what would leave it.
struct Candidate {
  NodeIndex node = 0;
  int64_t moved_share = 0;
  std::vector<size_t> movers;  // indices into the movers list
};

bool Masked(const NodeMask* mask, NodeIndex n) {
  return mask != nullptr && n < mask->reason.size() && mask->reason[n] != 0 &&
         mask->reason[n] <= mask->reasons.size();
}

// The fewest movers on GPU `gpu` (their indices in `on_gpu`, which is sorted by share, largest
// first) whose leaving makes room for one GPU of `task`; nullopt when no choice of them does.
std::optional<std::vector<size_t>> GpuMovers(const GpuState& g, const std::vector<size_t>& on_gpu,
                                             const std::vector<Mover>& movers, const PreparedTask& task) {
  int64_t movable = 0;
  for (size_t m : on_gpu) movable += movers[m].share;
  const int64_t held = 1000 - g.free_share;
  const int64_t fixed = held - movable;
  if (task.share >= 1000) {
    if (fixed > 0 || static_cast<int64_t>(on_gpu.size()) < g.tasks) return std::nullopt;
    return on_gpu;
  }
  if (1000 - fixed < task.share) return std::nullopt;
  std::vector<size_t> out;
  int64_t free = g.free_share;
  for (size_t m : on_gpu) {
    if (free >= task.share) break;
    out.push_back(m);
    free += movers[m].share;
  }
  if (free < task.share) return std::nullopt;
  return out;
}

}  // namespace

ConsolidationResult Consolidate(Scheduler& scheduler, const TaskRequest& pending,
                                const std::vector<MovableTask>& movable, const ConsolidationOptions& options) {
  ConsolidationResult r;
  Ledger& ledger = scheduler.ledger();
  const NodeMask* base = options.mask;
  scheduler.SetNodeMask(base);
  if (options.max_moves < 1 || options.max_moves > 64 || options.max_candidates < 1 ||
      options.max_candidates > 4096) {
    r.error = Status::InvalidArgument(fmt::format("consolidation needs max_moves 1..64 and max_candidates 1..4096, "
                                                  "got {} and {}",
                                                  options.max_moves, options.max_candidates));
    return r;
  }
  if (!pending.wants_gpu() || pending.wants_mig()) {
    r.error = Status::InvalidArgument(
        fmt::format("only a task of GPUs (not MIG) can be made room for by moving others: {}",
                    DescribeTaskRequest(pending)));
    return r;
  }
  if (Status v = ValidateTaskRequest(pending); !v.ok()) {
    r.error = v;
    return r;
  }
  PreparedTask task;
  PrepareTask(ledger, pending, task);

  // Where a mover could go at best: per node the largest free GPU share with the node's free CPU
  // and memory, over the nodes the mask allows, kept as the points no other beats on all three
  // (largest share first). A mover no point covers has no place as the cluster stands, nor once the
  // pending task has taken room, so it stays where it is. A necessary condition only (GPU models,
  // GPU memory and the sharing rules are the pipeline's to judge in the trial); that a mover could
  // fit only where another mover left is not looked for.
  struct Room {
    int64_t share, cpu, memory;
  };
  std::vector<Room> rooms;
  for (NodeIndex n = 0; n < ledger.node_count(); ++n) {
    const NodeState& s = ledger.state(n);
    if (s.schedulable() && !Masked(base, n) && s.max_free_share > 0)
      rooms.push_back({s.max_free_share, s.free_cpu, s.free_memory});
  }
  std::sort(rooms.begin(), rooms.end(), [](const Room& a, const Room& b) {
    if (a.share != b.share) return a.share > b.share;
    if (a.cpu != b.cpu) return a.cpu > b.cpu;
    return a.memory > b.memory;
  });
  std::vector<Room> front;
  for (const Room& p : rooms) {
    const bool beaten = std::any_of(front.begin(), front.end(),
                                    [&](const Room& f) { return f.cpu >= p.cpu && f.memory >= p.memory; });
    if (!beaten) front.push_back(p);
  }
  const auto has_room = [&](int64_t share, int64_t cpu, int64_t memory) {
    for (const Room& f : front) {
      if (f.share < share) return false;
      if (f.cpu >= cpu && f.memory >= memory) return true;
    }
    return false;
  };

  // The movers that could go somewhere, by node and GPU, each GPU's largest first.
  std::vector<Mover> movers;
  movers.reserve(movable.size());
  std::unordered_map<uint64_t, std::vector<size_t>> by_gpu;  // (node << 32 | gpu) -> movers
  std::unordered_map<NodeIndex, std::vector<size_t>> by_node;
  std::unordered_set<AllocationId> listed;
  for (const MovableTask& m : movable) {
    const Placement* p = ledger.Find(m.allocation);
    if (p == nullptr || m.request == nullptr || p->gpus.size() != 1 || p->gpus.front().mig) continue;
    if (!listed.insert(m.allocation).second) continue;
    const int64_t share = p->gpus.front().share.units();
    if (!has_room(share, p->cpu.units(), p->memory.units())) continue;
    movers.push_back({m.allocation, m.request, p, share});
    by_gpu[(uint64_t{p->node} << 32) | static_cast<uint32_t>(p->gpus.front().gpu)].push_back(movers.size() - 1);
    by_node[p->node].push_back(movers.size() - 1);
  }
  for (auto& [key, list] : by_gpu) {
    std::sort(list.begin(), list.end(), [&](size_t a, size_t b) {
      return movers[a].share != movers[b].share ? movers[a].share > movers[b].share
                                                : movers[a].allocation < movers[b].allocation;
    });
  }

  // The estimate, node by node.
  std::vector<Candidate> candidates;
  const std::vector<size_t> none;
  std::vector<uint8_t> chosen_mover(movers.size(), 0);
  for (NodeIndex n = 0; n < ledger.node_count(); ++n) {
    const NodeState& s = ledger.state(n);
    if (!s.schedulable() || Masked(base, n) || !task.ModelAllowed(s.model)) continue;
    if (s.usable_gpus < task.gpu_count) continue;
    // Per GPU: the movers that would leave it, cheapest GPUs first.
    std::vector<std::pair<int, std::vector<size_t>>> gpus;  // (GPU, movers)
    for (size_t gi = 0; gi < s.gpus.size(); ++gi) {
      const GpuState& g = s.gpus[gi];
      if (!g.usable() || g.mig_enabled) continue;
      auto it = by_gpu.find((uint64_t{n} << 32) | static_cast<uint32_t>(gi));
      auto chosen = GpuMovers(g, it == by_gpu.end() ? none : it->second, movers, task);
      if (chosen) gpus.emplace_back(static_cast<int>(gi), std::move(*chosen));
    }
    if (static_cast<int>(gpus.size()) < task.gpu_count) continue;
    std::stable_sort(gpus.begin(), gpus.end(),
                     [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
    Candidate c;
    c.node = n;
    int64_t cpu = s.free_cpu, memory = s.free_memory;
    const auto take = [&](size_t m) {
      c.movers.push_back(m);
      chosen_mover[m] = 1;
      c.moved_share += movers[m].share;
      cpu += movers[m].placement->cpu.units();
      memory += movers[m].placement->memory.units();
    };
    for (int k = 0; k < task.gpu_count; ++k) {
      for (size_t m : gpus[static_cast<size_t>(k)].second) take(m);
    }
    // Short of CPU or memory: the node's other movers, the most CPU first, until the task fits.
    if (cpu < pending.cpu.units() || memory < pending.memory.units()) {
      auto it = by_node.find(n);
      std::vector<size_t> rest;
      if (it != by_node.end()) {
        for (size_t m : it->second) {
          if (!chosen_mover[m]) rest.push_back(m);
        }
      }
      std::stable_sort(rest.begin(), rest.end(), [&](size_t a, size_t b) {
        return movers[a].placement->cpu.units() > movers[b].placement->cpu.units();
      });
      for (size_t m : rest) {
        if (cpu >= pending.cpu.units() && memory >= pending.memory.units()) break;
        if (static_cast<int>(c.movers.size()) >= options.max_moves) break;
        take(m);
      }
    }
    for (size_t m : c.movers) chosen_mover[m] = 0;
    // No move needed means something else than room refuses the task here.
    if (c.movers.empty() || static_cast<int>(c.movers.size()) > options.max_moves) continue;
    if (cpu < pending.cpu.units() || memory < pending.memory.units()) continue;
    candidates.push_back(std::move(c));
  }
  r.candidates = static_cast<int>(candidates.size());
  std::stable_sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.movers.size() != b.movers.size() ? a.movers.size() < b.movers.size() : a.moved_share < b.moved_share;
  });

  // The pending task's mask: the one candidate node only (and what the embedder masks, kept).
  NodeMask only;
  only.reasons = base != nullptr ? base->reasons : std::vector<std::string>{};
  only.reasons.push_back("not the node being consolidated");
  const auto not_here = static_cast<uint8_t>(only.reasons.size());
  if (only.reasons.size() > 255) {
    r.error = Status::InvalidArgument("the node mask has too many reasons to add the consolidation's own");
    return r;
  }
  only.reason.assign(ledger.node_count(), not_here);
  if (base != nullptr) {
    for (size_t n = 0; n < std::min(base->reason.size(), only.reason.size()); ++n) {
      if (Masked(base, static_cast<NodeIndex>(n))) only.reason[n] = base->reason[n];
    }
  }

  const auto fail_stop = [&](const Status& st, const char* what) {
    r.error = Status::Internal(fmt::format("consolidation: the ledger refused {} it had just allowed: {}", what,
                                           st.ToString()));
    scheduler.SetNodeMask(base);
  };

  for (const Candidate& c : candidates) {
    if (r.tried >= options.max_candidates) break;
    ++r.tried;
    // Release the movers, largest first (the order the estimate chose them in).
    std::vector<size_t> order = c.movers;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return movers[a].share > movers[b].share; });
    std::vector<Placement> before;
    before.reserve(order.size());
    for (size_t m : order) {
      before.push_back(*movers[m].placement);
      if (Status st = ledger.Release(movers[m].allocation); !st.ok()) {
        fail_stop(st, "a release");
        return r;
      }
    }
    // Puts the movers back where they were (new ids), after a trial that did not work.
    const auto restore = [&]() -> bool {
      for (size_t i = 0; i < order.size(); ++i) {
        auto id = ledger.Commit(before[i]);
        if (!id.ok()) {
          fail_stop(id.status(), "restoring a moved task");
          return false;
        }
        r.renamed.emplace_back(movers[order[i]].allocation, *id);
        movers[order[i]].allocation = *id;
        movers[order[i]].placement = ledger.Find(*id);
      }
      return true;
    };
    only.reason[c.node] = 0;
    scheduler.SetNodeMask(&only);
    Decision d = scheduler.Decide(pending);
    only.reason[c.node] = not_here;
    scheduler.SetNodeMask(base);
    if (!d.error.ok()) {
      r.error = d.error;
      (void)restore();
      return r;
    }
    if (!d.placed) {
      if (!restore()) return r;
      continue;
    }
    auto pid = ledger.Commit(d.placement);
    if (!pid.ok()) {
      fail_stop(pid.status(), "the pending task's placement");
      return r;
    }
    std::vector<TaskMove> moves;
    bool all = true;
    for (size_t i = 0; i < order.size(); ++i) {
      Decision md = scheduler.Decide(*movers[order[i]].request);
      if (!md.error.ok()) r.error = md.error;
      if (!md.placed || !md.error.ok()) {
        all = false;
        break;
      }
      auto mid = ledger.Commit(md.placement);
      if (!mid.ok()) {
        fail_stop(mid.status(), "a moved task's placement");
        return r;
      }
      moves.push_back({movers[order[i]].allocation, *mid, before[i], md.placement});
    }
    if (all) {
      r.placed = true;
      r.allocation = *pid;
      r.placement = d.placement;
      r.moves = std::move(moves);
      return r;
    }
    for (const TaskMove& m : moves) {
      if (Status st = ledger.Release(m.to); !st.ok()) {
        fail_stop(st, "undoing a move");
        return r;
      }
    }
    if (Status st = ledger.Release(*pid); !st.ok()) {
      fail_stop(st, "undoing the pending task's placement");
      return r;
    }
    if (!restore() || !r.error.ok()) return r;
  }
  return r;
}

}  // namespace gpupool
