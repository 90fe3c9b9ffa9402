// Migration in the time-based replay (sim/replay.h): the cost model of moving a running task, the
// checkpoint-aware cooldown and the cluster's budget of moves. The plan itself (which tasks move
// where) is sched/consolidation.h, the same code a server would run.
//
// The model. A task writes a checkpoint every checkpoint_seconds of work. Moved at time t, it
// stops, keeps the work up to its last checkpoint, loses the rest, and starts again on its new
// GPU after restart_seconds, from that checkpoint: its end moves later by the lost work plus the
// restart. After a move it is not moved again until it has written its next checkpoint (so no
// move throws away work a move already cost); one that has never moved may move at any time.
// At most moves_per_hour moves in any hour, cluster-wide.
//
// No I/O; plain arithmetic on seconds.
#pragma once

#include <cstdint>
#include <deque>

#include "common/status.h"

namespace gpupool {

struct MigrationOptions {
  int max_moves = 0;            // tasks one plan may move; 0: no migration (0..64)
  int moves_per_hour = 60;      // cluster-wide (>= 1)
  int64_t checkpoint_seconds = 1800;  // work between checkpoints (>= 1)
  int64_t restart_seconds = 60;       // from the stop to work again (>= 0)
  int max_candidates = 16;      // nodes a plan tries (ConsolidationOptions::max_candidates)
  int plans_per_event = 4;      // waiting jobs a plan is sought for after each pass (>= 1)
};
Status ValidateMigrationOptions(const MigrationOptions& o);

// A task's current run: since `start` (its first start or its last move), `restart` seconds of
// restarting, then work; `work_left` seconds of work were left at `start`.
struct RunSegment {
  int64_t start = 0;
  int64_t restart = 0;
  int64_t work_left = 0;
  bool moved = false;
  // Seconds of work done in this run by `now`.
  int64_t WorkDone(int64_t now) const;
  // When it ends if nothing moves it.
  int64_t End() const { return start + restart + work_left; }
};

// Whether the task may move at `now`: never moved, or it has written a checkpoint since it last
// moved.
bool MayMove(const RunSegment& run, int64_t now, const MigrationOptions& o);

struct MoveCost {
  int64_t lost_seconds = 0;     // work since the last checkpoint, done again
  int64_t restart_seconds = 0;  // the restart
};
// Stops the task at `now`: it keeps the work up to its last checkpoint (work_left shrinks by it)
// and `run` is left at `now`; returns the seconds of work lost since that checkpoint.
int64_t StopAtCheckpoint(RunSegment& run, int64_t now, const MigrationOptions& o);

// Moves the task at `now`: `run` becomes the new run, and the cost is returned.
MoveCost MoveTask(RunSegment& run, int64_t now, const MigrationOptions& o);

// Moves made in the last hour.
class MoveBudget {
 public:
  explicit MoveBudget(int per_hour) : per_hour_(per_hour) {}
  // Moves still allowed at `now`.
  int Left(int64_t now);
  void Spend(int64_t now, int moves);

 private:
  int per_hour_;
  std::deque<int64_t> times_;
};

}  // namespace gpupool
