// Consolidation (defragmentation by migration): a pending task fits no node as the cluster
// stands, but would fit on one once a few running single-GPU tasks there move elsewhere. This
// plans and makes those moves through the same placement pipeline that places everything else.
//
// The rule (KAI-Scheduler's for its consolidation): a plan is taken only when every task it evicts
// is placed again in the same plan, and the pending task with them; otherwise nothing changes. So
// a consolidation never leaves an evicted task without a place.
//
// How a plan is found. A movable task whose request could not be placed anywhere as the cluster
// stands stays where it is (it will not find room once the pending task took some; that a task
// could fit only where another mover left is not looked for). For every node the embedder's mask
// allows, an estimate of the fewest moves
// that would make room there: per GPU, the movable tasks that would have to leave it (for a task
// of whole GPUs: every task on the GPU, none of them unmovable; for a share: the largest movable
// shares until the share fits), the cheapest GPUs taken, and the node's free CPU and memory plus
// what the movers hold must cover the task. Nodes are tried in order of that estimate (fewest
// moves, then least GPU share moved, then node order), at most max_candidates of them: the
// movers are released, the pending task is decided on that node alone, then each mover, the
// largest first, is decided anywhere the mask allows (its old node too). A mover that finds no
// place undoes the trial and the next node is tried.
//
// What moves: single-GPU tasks (a share or one whole GPU, not MIG) the embedder lists as movable;
// a task of several GPUs never moves. Whether a task may move (checkpointing, preemptible, not
// moved within its checkpoint interval) and how many moves an hour the cluster allows is the
// embedder's policy; max_moves bounds one plan.
//
// Plain computation like the rest of sched: no I/O, no clock. Deterministic for the same ledger,
// scheduler state and inputs.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "common/status.h"
#include "model/ledger.h"
#include "model/workload.h"
#include "sched/scheduler.h"

namespace gpupool {

// A running task that may be moved: its allocation and what it asked for (it is placed again
// through the pipeline with this request).
struct MovableTask {
  AllocationId allocation = 0;
  const TaskRequest* request = nullptr;
};

struct ConsolidationOptions {
  int max_moves = 4;        // tasks one plan may move, 1..64
  int max_candidates = 16;  // nodes tried through the pipeline for one plan, 1..4096
  // The embedder's own node restrictions (nodes held for a gang, ...): neither the pending task nor
  // a mover is placed on a node it masks. nullptr: none.
  const NodeMask* mask = nullptr;
};

// One task moved: the allocation it had and the one it has now.
struct TaskMove {
  AllocationId from = 0;
  AllocationId to = 0;
  Placement before;
  Placement after;
};

struct ConsolidationResult {
  // True: the plan is applied to the ledger — the movers hold their new allocations and the
  // pending task holds `allocation`. False: every allocation holds what it held before.
  bool placed = false;
  AllocationId allocation = 0;
  Placement placement;
  std::vector<TaskMove> moves;  // in the order they were made; at most max_moves
  // Allocations that hold a new id though not moved: a trial that was undone released them and
  // committed them again, as they were (old id, new id). The embedder renames them in its books;
  // the moves in `moves` are not listed here. Apply these first, then the moves: a task renamed
  // by an undone trial may move in a later one, and its move then starts from its new id.
  std::vector<std::pair<AllocationId, AllocationId>> renamed;
  int candidates = 0;  // nodes whose estimate allowed a plan
  int tried = 0;       // of them, tried through the pipeline
  // Internal when the ledger refused what it had just allowed (a broken ledger); InvalidArgument
  // for bad options or a pending task that cannot be consolidated for (MIG, no GPU).
  Status error;
};

// Plans and, when every mover finds a place, applies a consolidation for `pending` (one task, at
// least one GPU, not MIG). Movable entries of unknown allocations, of tasks on several GPUs, without
// a request, or listed before are ignored. The scheduler's node mask is replaced while it runs
// and set to options.mask at the end.
ConsolidationResult Consolidate(Scheduler& scheduler, const TaskRequest& pending,
                                const std::vector<MovableTask>& movable, const ConsolidationOptions& options);

}  // namespace gpupool
