#include "sched/preemption.h"

#include <algorithm>
#include <map>
#include <optional>

namespace gpupool {

namespace {

constexpr int64_t Resources::*kComponents[] = {&Resources::cpu, &Resources::memory, &Resources::gpu};

Resources ClampNonNegative(Resources r) {
  for (auto m : kComponents) r.*m = std::max<int64_t>(r.*m, 0);
  return r;
}

// `used` + `demand` > `limit` on some component, without overflow.
bool WouldExceed(const Resources& used, const Resources& demand, const Resources& limit) {
  for (auto m : kComponents) {
    if (demand.*m > limit.*m - std::min(used.*m, limit.*m)) return true;
  }
  return false;
}

// The queue guarantees something the job demands, and its usage plus the demand stays within the
// guarantee on every guaranteed component.
bool OwedJob(const QueueSpec& spec, const Resources& used, const Resources& demand) {
  bool demands_guaranteed = false;
  for (auto m : kComponents) {
    const int64_t g = spec.guaranteed.*m;
    if (g <= 0) continue;
    if (demand.*m > 0) demands_guaranteed = true;
    if (demand.*m > g - std::min(used.*m, g)) return false;
  }
  return demands_guaranteed;
}

// Usage beyond the guarantee on a guaranteed component, or usage of a queue that guarantees nothing.
bool OverGuarantee(const QueueSpec& spec, const Resources& used) {
  if (spec.guaranteed.IsZero()) return !used.IsZero();
  for (auto m : kComponents) {
    if (spec.guaranteed.*m > 0 && used.*m > spec.guaranteed.*m) return true;
  }
  return false;
}

}  // namespace

std::string_view PreemptReasonName(PreemptReason reason) {
  switch (reason) {
    case PreemptReason::kPriority: return "priority";
    case PreemptReason::kReclaim: return "reclaim";
  }
  return "unknown";
}

std::vector<PreemptionCandidate> PreemptionCandidates(const QueueOrder& order, const PendingEntry& preemptor,
                                                      QosClass preemptor_qos,
                                                      const std::vector<RunningEntry>& running,
                                                      const std::vector<UsageEntry>& usage) {
  std::map<std::string, Resources> used = order.QueueUsage(usage);
  const Resources demand = ClampNonNegative(preemptor.demand);

  std::map<std::string, std::vector<std::string>> ancestry_cache;
  auto ancestry = [&](const std::string& queue) -> const std::vector<std::string>& {
    auto it = ancestry_cache.find(queue);
    if (it == ancestry_cache.end()) it = ancestry_cache.emplace(queue, order.Ancestry(queue)).first;
    return it->second;
  };
  const std::vector<std::string> preemptor_path = ancestry(preemptor.queue);

  // The deepest queue on the preemptor's path whose limit its demand would break.
  std::optional<std::string> confine;
  for (const std::string& q : preemptor_path) {
    if (WouldExceed(used[q], demand, order.FindQueue(q)->limit)) {
      confine = q;
      break;
    }
  }

  // The parts of both paths strictly below their lowest common ancestor, as counts from the start.
  auto split = [&](const std::vector<std::string>& victim_path) {
    for (size_t p = 0; p < preemptor_path.size(); ++p) {
      auto it = std::find(victim_path.begin(), victim_path.end(), preemptor_path[p]);
      if (it != victim_path.end()) return std::pair<size_t, size_t>(p, it - victim_path.begin());
    }
    return std::pair<size_t, size_t>(preemptor_path.size(), victim_path.size());
  };

  const bool may_reclaim = preemptor_qos != QosClass::kBestEffort && !preemptor_path.empty();
  std::vector<size_t> eligible;
  for (size_t i = 0; i < running.size(); ++i) {
    const RunningEntry& r = running[i];
    if (r.qos != QosClass::kBestEffort) continue;
    const std::vector<std::string>& path = ancestry(r.queue);
    if (confine && std::find(path.begin(), path.end(), *confine) == path.end()) continue;
    const bool by_priority = r.priority < preemptor.priority;
    bool reclaim_possible = false;
    if (may_reclaim && !path.empty()) {
      auto [p, v] = split(path);
      reclaim_possible = p > 0 && v > 0;
    }
    if (by_priority || reclaim_possible) eligible.push_back(i);
  }
  std::sort(eligible.begin(), eligible.end(), [&](size_t a, size_t b) {
    const RunningEntry& x = running[a];
    const RunningEntry& y = running[b];
    // Lowest priority, then latest start, then highest seq; the index only breaks exact copies.
    if (x.priority != y.priority) return x.priority < y.priority;
    if (x.started_ms != y.started_ms) return x.started_ms > y.started_ms;
    if (x.seq != y.seq) return x.seq > y.seq;
    return a < b;
  });

  std::vector<PreemptionCandidate> out;
  for (size_t i : eligible) {
    const RunningEntry& r = running[i];
    const std::vector<std::string>& path = ancestry(r.queue);
    PreemptReason reason = PreemptReason::kPriority;
    if (r.priority >= preemptor.priority) {
      auto [p, v] = split(path);
      const bool owed =
          std::any_of(preemptor_path.begin(), preemptor_path.begin() + p,
                      [&](const std::string& q) { return OwedJob(*order.FindQueue(q), used[q], demand); });
      const bool over = std::any_of(path.begin(), path.begin() + v, [&](const std::string& q) {
        return OverGuarantee(*order.FindQueue(q), used[q]);
      });
      if (!owed || !over) continue;
      reason = PreemptReason::kReclaim;
    }
    out.push_back({i, reason});
    // Later candidates are judged as if this one had been released.
    const Resources freed = ClampNonNegative(r.used);
    for (const std::string& q : path) {
      Resources& u = used[q];
      for (auto m : kComponents) u.*m -= std::min(u.*m, freed.*m);
    }
  }
  return out;
}

}  // namespace gpupool
