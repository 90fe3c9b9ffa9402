#include "sim/replay_migration.h"

#include <fmt/format.h>

#include <algorithm>

namespace gpupool {

Status ValidateMigrationOptions(const MigrationOptions& o) {
  if (o.max_moves < 0 || o.max_moves > 64)
    return Status::InvalidArgument(fmt::format("moves per plan must be 0..64, got {}", o.max_moves));
  if (o.moves_per_hour < 1 || o.moves_per_hour > 1'000'000)
    return Status::InvalidArgument(fmt::format("moves per hour must be 1..1000000, got {}", o.moves_per_hour));
  if (o.checkpoint_seconds < 1 || o.checkpoint_seconds > int64_t{365} * 86400)
    return Status::InvalidArgument(
        fmt::format("the checkpoint interval must be 1 s..1 year, got {} s", o.checkpoint_seconds));
  if (o.restart_seconds < 0 || o.restart_seconds > 86400)
    return Status::InvalidArgument(fmt::format("the restart time must be 0..86400 s, got {} s", o.restart_seconds));
  if (o.max_candidates < 1 || o.max_candidates > 4096)
    return Status::InvalidArgument(fmt::format("candidate nodes must be 1..4096, got {}", o.max_candidates));
  if (o.plans_per_event < 1 || o.plans_per_event > 1000)
    return Status::InvalidArgument(fmt::format("plans per event must be 1..1000, got {}", o.plans_per_event));
  return Status::Ok();
}

int64_t RunSegment::WorkDone(int64_t now) const {
  return std::clamp<int64_t>(now - start - restart, 0, work_left);
}

bool MayMove(const RunSegment& run, int64_t now, const MigrationOptions& o) {
  return !run.moved || run.WorkDone(now) >= o.checkpoint_seconds;
}

int64_t StopAtCheckpoint(RunSegment& run, int64_t now, const MigrationOptions& o) {
  const int64_t done = run.WorkDone(now);
  const int64_t saved = done / o.checkpoint_seconds * o.checkpoint_seconds;
  run.work_left -= saved;
  run.start = now;
  run.restart = 0;
  return done - saved;
}

MoveCost MoveTask(RunSegment& run, int64_t now, const MigrationOptions& o) {
  MoveCost cost;
  cost.lost_seconds = StopAtCheckpoint(run, now, o);
  // A move during the restart throws the rest of the restart away too: it starts again.
  cost.restart_seconds = o.restart_seconds;
  run.restart = o.restart_seconds;
  run.moved = true;
  return cost;
}

int MoveBudget::Left(int64_t now) {
  while (!times_.empty() && times_.front() <= now - 3600) times_.pop_front();
  return std::max(0, per_hour_ - static_cast<int>(times_.size()));
}

void MoveBudget::Spend(int64_t now, int moves) {
  for (int i = 0; i < moves; ++i) times_.push_back(now);
}

}  // namespace gpupool
