// Preemption candidates: which running jobs may be evicted so that a pending one can run, and in
// which order. This decides "who may be evicted"; whether evicting them makes the job fit on some
// node is the placement pipeline's question, so the caller releases candidates in the returned
// order until the job fits (and keeps the rest).
//
// Plain computation like queueing.h: no I/O, no clock (start times come in as milliseconds).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/workload.h"
#include "sched/queueing.h"

namespace gpupool {

// A job that runs now. `queue` "" means "default".
struct RunningEntry {
  uint64_t seq = 0;
  std::string tenant;
  std::string queue;
  int priority = 0;
  QosClass qos = QosClass::kBurstable;
  Resources used;
  int64_t started_ms = 0;
};

enum class PreemptReason {
  kPriority,  // the victim's priority is below the preemptor's
  kReclaim,   // the preemptor's side is owed its guarantee and the victim's side is over its own
};
std::string_view PreemptReasonName(PreemptReason reason);  // "priority", "reclaim"

struct PreemptionCandidate {
  size_t index = 0;  // into `running`
  PreemptReason reason = PreemptReason::kPriority;
  bool operator==(const PreemptionCandidate&) const = default;
};

// The running jobs that may be evicted for `preemptor`, in eviction order. `usage` is what running
// work holds now (normally the same jobs as `running`, summed per tenant and queue). Only the
// queue tree of `order` matters here, not its ordering policy.
//
// Rules:
//  - Only best-effort jobs are ever victims; guaranteed and burstable jobs never are.
//  - kPriority: victim.priority < preemptor.priority. Any preemptor QoS, any queue.
//  - kReclaim (never for a best-effort preemptor): let A be the lowest common ancestor of the two
//    jobs' queues (the implicit root when they share none). Reclaim is allowed when
//      * some queue on the preemptor's side strictly below A is owed the job: it guarantees
//        something the job demands (guaranteed_r > 0 and demand_r > 0 for some r) and its usage
//        plus the demand stays within the guarantee on every guaranteed component, and
//      * some queue on the victim's side strictly below A is over its guarantee: its usage
//        exceeds the guarantee on a guaranteed component, or it guarantees nothing and uses
//        something.
//    For flat queues this reads: the preemptor's queue is below its guarantee with room for the
//    job, and the victim's queue is above its own. Victims in the preemptor's own queue, in its
//    subtree or on its ancestors (A is one of the two queues) are therefore allowed only by
//    priority: moving work between them does not change what the owed queue holds relative to
//    its siblings.
//  - A victim eligible by both rules is reported as kPriority.
//  - Limits: when the preemptor's demand alone would take a queue on its path over its limit given
//    current usage, evicting work outside that queue cannot help, so only victims inside the
//    subtree of the deepest such queue are listed.
//
// Order: lowest priority first, then most recently started first (less work lost), then seq
// descending. Reclaim eligibility is checked along that order against usage from which the
// candidates listed before have been taken away, so releasing a prefix never keeps taking from a
// queue that has already fallen back to its guarantee.
std::vector<PreemptionCandidate> PreemptionCandidates(const QueueOrder& order, const PendingEntry& preemptor,
                                                      QosClass preemptor_qos,
                                                      const std::vector<RunningEntry>& running,
                                                      const std::vector<UsageEntry>& usage);

}  // namespace gpupool
