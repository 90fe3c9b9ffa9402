// The server's two timeouts, as controllers that only read the state and say what is due
// (docs/server.md#faults): a node whose heartbeats stopped for the heartbeat timeout is lost, and
// a task whose agent did not confirm its stop by the stop deadline is released as stopped when its
// node is not ready (else held: see StateMachine::On(StopsOverdueOp)).
// PoolService acts on what they say (releases, faults, events, the store).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/state.h"

namespace gpupool {

struct SilentNode {
  NodeIndex node = 0;
  double silent_s = 0;  // since its last heartbeat
};
// Ready nodes not heard from for `timeout_s` or longer (steady clock seconds).
std::vector<SilentNode> SilentNodes(const PoolState& st, double now_mono_s, double timeout_s);

struct OverdueStops {
  std::string job_id;
  std::vector<int> tasks;  // indexes of its stopping tasks whose deadline has passed
};
// Among the jobs listed as stopping, those with a stop whose deadline is not after `now_ms` (and
// not already found overdue and held).
std::vector<OverdueStops> OverdueStopsAt(const PoolState& st, int64_t now_ms);

}  // namespace gpupool
