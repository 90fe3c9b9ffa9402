// Node failures in the time-based replay (sim/replay.h): each node fails after an exponentially
// distributed time up (mean mtbf_hours), stays down repair_seconds, and comes back. Drawn from one
// seeded generator, per node in turn, so the same options give the same failures. A node that
// fails stops its tasks: each job with a task there starts again from its last checkpoint once it
// is placed again (sim/replay_migration.h's checkpoint model).
//
// No I/O; deterministic.
#pragma once

#include <cstdint>
#include <optional>
#include <queue>
#include <utility>
#include <vector>

#include "common/rng.h"
#include "common/status.h"

namespace gpupool {

struct FailureOptions {
  double node_mtbf_hours = 0;      // mean time between failures of one node; 0: no failures
  int64_t repair_seconds = 3600;   // down time of a failed node (>= 1)
  uint64_t seed = 1;
  // Failures at given times besides the drawn ones (seconds, node index): a node already down
  // then stays down until its repair. At most 1,000,000.
  std::vector<std::pair<int64_t, uint32_t>> scripted;
};
Status ValidateFailureOptions(const FailureOptions& o);

struct NodeEvent {
  int64_t time = 0;
  uint32_t node = 0;
  bool fails = true;      // false: the node is repaired
  bool scripted = false;  // one of FailureOptions::scripted (or its repair), not drawn
  bool operator>(const NodeEvent& o) const {
    if (time != o.time) return time > o.time;
    if (node != o.node) return node > o.node;
    if (fails != o.fails) return fails > o.fails;  // a repair before a failure at the same instant
    return scripted > o.scripted;
  }
};

class NodeFailures {
 public:
  NodeFailures(const FailureOptions& o, uint32_t nodes);
  bool enabled() const { return enabled_; }
  // The next event, if any.
  const NodeEvent* Next() const { return events_.empty() ? nullptr : &events_.top(); }
  // Takes the next event; a failure schedules its repair, a repair the node's next drawn failure.
  // With `idle` (no work that a failure could stop) a failure is passed over instead: the node's
  // next one is drawn and nothing is returned, so that an idle replay's repairs run out.
  std::optional<NodeEvent> Pop(bool idle);
  // Whether node `n` is down.
  bool is_down(uint32_t n) const { return n < down_until_.size() && down_until_[n] > 0; }
  int down() const { return down_; }

 private:
  int64_t Draw();  // seconds up before the next failure (>= 1)

  FailureOptions o_;
  bool enabled_ = false;
  SeededRng rng_;
  std::priority_queue<NodeEvent, std::vector<NodeEvent>, std::greater<NodeEvent>> events_;
  int down_ = 0;
  std::vector<int64_t> down_until_;  // per node: when its repair is due; 0: up
};

}  // namespace gpupool
