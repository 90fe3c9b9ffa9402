#include "sim/replay_failures.h"

#include <fmt/format.h>

#include <cmath>

namespace gpupool {

Status ValidateFailureOptions(const FailureOptions& o) {
  if (!(o.node_mtbf_hours >= 0) || !std::isfinite(o.node_mtbf_hours) || o.node_mtbf_hours > 1e6)
    return Status::InvalidArgument(
        fmt::format("a node's mean time between failures must be 0 (none) to 1000000 hours, got {}", o.node_mtbf_hours));
  if (o.node_mtbf_hours > 0 && o.node_mtbf_hours < 0.01)
    return Status::InvalidArgument(
        fmt::format("a node's mean time between failures must be at least 0.01 hours, got {}", o.node_mtbf_hours));
  if (o.repair_seconds < 1 || o.repair_seconds > int64_t{365} * 86400)
    return Status::InvalidArgument(fmt::format("the repair time must be 1 s..1 year, got {} s", o.repair_seconds));
  if (o.scripted.size() > 1'000'000)
    return Status::InvalidArgument(fmt::format("at most 1000000 scripted failures, got {}", o.scripted.size()));
  for (const auto& [time, node] : o.scripted) {
    if (time < 0 || time > int64_t{100} * 365 * 86400)
      return Status::InvalidArgument(fmt::format("a scripted failure at {} s of node {}: the time must be 0..100 years",
                                                 time, node));
  }
  return Status::Ok();
}

NodeFailures::NodeFailures(const FailureOptions& o, uint32_t nodes)
    : o_(o), enabled_(o.node_mtbf_hours > 0 || !o.scripted.empty()), rng_(o.seed), down_until_(nodes, 0) {
  for (const auto& [time, node] : o.scripted) {
    if (node < nodes) events_.push({time, node, true, true});
  }
  if (o.node_mtbf_hours <= 0) return;
  for (uint32_t n = 0; n < nodes; ++n) events_.push({Draw(), n, true, false});
}

int64_t NodeFailures::Draw() {
  // Inverse transform of the exponential distribution; u in (0, 1].
  const double u = 1.0 - rng_.UniformDouble();
  const double seconds = -std::log(u) * o_.node_mtbf_hours * 3600.0;
  return std::max<int64_t>(1, static_cast<int64_t>(std::min(seconds, 1e15)));
}

std::optional<NodeEvent> NodeFailures::Pop(bool idle) {
  const NodeEvent e = events_.top();
  events_.pop();
  const auto next_drawn = [&] {
    if (!e.scripted && o_.node_mtbf_hours > 0) events_.push({e.time + Draw(), e.node, true, false});
  };
  if (!e.fails) {
    down_until_[e.node] = 0;
    --down_;
    next_drawn();  // a drawn failure's chain goes on after its repair
    return e;
  }
  // Passed over: idle, or the node is down already (its repair brings it back as planned).
  if (idle || down_until_[e.node] > 0) {
    next_drawn();
    return std::nullopt;
  }
  ++down_;
  down_until_[e.node] = e.time + o_.repair_seconds;
  events_.push({down_until_[e.node], e.node, false, e.scripted});
  return e;
}

}  // namespace gpupool
