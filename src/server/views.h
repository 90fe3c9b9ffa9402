// The JSON views of the pool's state (docs/api.md): a task, a job, a node, built from a PoolState
// alone — no lock, no I/O, no clock of their own — so that they can be built from any consistent
// copy of the state. PoolService adds what only it knows (a job's watch version).
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "server/state.h"

namespace gpupool {

nlohmann::json TaskView(const PoolState& st, const PoolJob& j, int index);
// `now_ms`: a pending job shows `notBefore` while its backoff lasts.
nlohmann::json JobView(const PoolState& st, const PoolJob& j, int64_t now_ms);
nlohmann::json NodeView(const PoolState& st, NodeIndex n);

}  // namespace gpupool
