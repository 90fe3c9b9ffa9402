// An upper bound on the GPU allocation that any placement policy, online or offline, could reach on
// a pod sequence: the pseudo-policy `bound` of the simulator. It shows how much headroom is left
// above the policies.
//
// The bound is a linear program, solved with GLPK, for the multiset of pods that has arrived:
//
//   Nodes are grouped into types t by (GPU model, GPU count, CPU, memory), N_t nodes each; pods into
//   types p by (CPU, memory, GPU count k, per-GPU share s, the node types they fit), n_p pods each.
//   x[p][t] >= 0 (pods of type p placed on nodes of type t) exists only where one pod p fits an empty
//   node of type t: CPU, memory, k <= GPUs of t, s <= 1000, the model allowed.
//
//   maximise    sum x[p][t] k_p s_p                                   (allocated milli-GPU)
//   subject to  sum_t x[p][t]                <= n_p                    for each pod type
//               sum_p x[p][t] cpu_p          <= N_t cpu_t              for each node type
//               sum_p x[p][t] mem_p          <= N_t mem_t
//               sum_p x[p][t]                <= N_t limit_t            where nodes have a task limit
//               sum_p x[p][t] k_p u(s_p)     <= N_t gpus_t 1000        for each cut u (below)
//
//   u_e is a dual-feasible function on one GPU, in milli-GPU: u_e(s) = 1000 if s > 1000 - e, s if
//   e <= s <= 1000 - e, 0 if s < e. Any shares that fit together on one GPU have sum u_e <= 1000: if
//   one share exceeds 1000 - e the others sum below e, so they count 0 and the total is 1000;
//   otherwise u_e(s) <= s for every share and the total is at most the shares' sum. e = 0 is u_0(s) =
//   s, the plain GPU capacity. A k-GPU pod puts s on k distinct GPUs, hence k u_e(s). Summing the
//   per-GPU inequality over the N_t gpus_t GPUs of a type gives the row. The cuts are what make three
//   0.6-GPU pods on one GPU worth 0.6 GPU, not the 1.0 that capacity alone allows.
//
//   The other cuts are Fekete and Schepers' dual-feasible functions u^(k), k = 2..6: u^(k)(s) = s when
//   (k+1) s is a multiple of 1000, else floor((k+1) s / 1000) 1000 / k. They price shares just over
//   1000 / (k+1) (two 0.34-GPU pods fill a GPU under u^(2), as only two fit), which matters when GPU-
//   sharing pods dominate (gpushare*). A unit test checks every cut by brute force on every multiset of
//   the trace's shares that fits on one GPU.
//
// Forced placement (the pseudo-policy `bound`; `bound-relaxed` leaves it out). In this protocol no
// policy, online or offline, decides *whether* a pod is placed, only where: a pod is placed if any
// node has room for it, and pods never leave. So some pods must be placed whatever the policy did
// before: pod i is forced when the pods that arrived before it could not possibly have left every
// node without room for it. A second, small LP per pod type q decides that (BlockingLp in bound.cc):
// can the arrived pods block every node type q fits, each node through its GPUs (more than
// gpus - k_q of them holding more than 1000 - s_q), its CPU, its memory or its task limit? If the LP
// optimum cannot block them all, no real run could have, and the pod was placed. Blocking only gets
// easier as pods arrive, so a binary search over each type's arrivals finds the first that could
// have been blocked; all earlier ones were forced. The main LP then gets a lower bound per pod type
// (x sums to between the forced pods of the prefix and n_p), and CPU-only pods become pod types too:
// a forced one takes CPU and memory and adds nothing. On the default trace this is what stops the LP
// from leaving out the 0.81-GPU pods, whose 0.19-GPU remainders only the rare pods under 0.2 GPU can
// use. Forcing assumes that a pod fits wherever CPU, memory, GPU count, per-GPU share, model and task
// limit allow, as the simulator's filters decide; pods with per-GPU memory or NVLink requests are
// never forced.
//
// Monotone rejection (also `bound` only). Pods never leave, so a node's free resources only shrink:
// once a pod of forceable type q finds no room, no later pod finds room that asks for at least as much
// in every respect (a "dominator" r of q: it fits only node types q fits, at least q's CPU and memory,
// and, when q takes GPUs, at least as many GPUs with at least q's per-GPU share; whatever else r asks
// for only makes it harder). So every run places exactly the first n_q of q's arrivals for some n_q,
// and when n_q falls short of all of them, every dominator arriving after q's arrival n_q + 1 was
// turned away. A branch and bound over n_q (MonotoneRejection in bound.cc) solves the main LP with
// q's count in an interval [lo, hi] and each dominator's count capped by its arrivals before q's
// arrival hi + 1 (no cap when hi takes all of q's arrivals), halving the interval of the LP optimum
// that breaks the rule most, pivot after pivot, for a fixed number of solves per prefix; the bound is
// the largest optimum over the leaves, whose intervals cover every n_q. This is what stops the LP
// from turning away the 0.81-GPU pods early while still placing the whole-GPU pods that arrive after
// them, which no run can do: a whole-GPU pod that asks for at least a 0.81 pod's CPU and memory fits
// only where the 0.81 pod would have. A bound for a prefix also bounds every shorter prefix of the
// same run, so each column takes the smallest bound at or after it.
//
// Why it is an upper bound: any real run's placement of the arrived pods (placed pods only) is
// integral, respects every node's own CPU, memory, task limit and per-GPU shares, places every
// forced pod and obeys monotone rejection, and hence satisfies every row of some leaf above; its
// allocation is the objective at that point. The LP drops (each drop only enlarges the feasible
// set, so its optimum can only grow): integrality; the node boundary within a type (capacity is
// pooled over the N_t nodes, and a pod may be split among them); the arrival order beyond what
// forcing and monotone rejection take from it (it sees the whole prefix at once, as an offline
// planner would); and, for the pods that were not forced, the rule that a pod that fits must be
// placed (`bound-relaxed` drops it for every pod). Since pods never leave, the bound for a prefix
// also bounds every earlier row of the run.
//
// What it ignores (all relaxations, so still an upper bound): per-GPU memory requests, NVLink
// requirements, and node and GPU health. `bound-relaxed` also leaves out CPU-only pods: free to leave
// any pod out, a CPU-only pod only takes capacity and adds no GPU share, so some optimum places none
// of them, and leaving them out gives the same optimum with fewer variables. (That is also where the
// relaxed bound is weakest: the CPU that CPU-only pods take from GPU nodes in the cpu* traces is not
// charged; `bound` charges the forced ones.) MIG requests and MIG-enabled GPUs are not modelled and
// are an error.
//
// The LP value is a floating-point simplex optimum (GLPK's tolerances, ~1e-9 relative), not an exact
// rational bound.
#pragma once

#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/node.h"
#include "model/workload.h"
#include "sim/experiment.h"

namespace gpupool {

// The pseudo-policy names that RunExperiment and the sweep accept besides the scheduler's policies:
// the bound with forced placement, and the looser one that may leave any pod out.
inline constexpr std::string_view kBoundPolicy = "bound";
inline constexpr std::string_view kRelaxedBoundPolicy = "bound-relaxed";

enum class BoundKind {
  kForcedPlacement,  // pods that some node must have had room for are placed
  kRelaxed,          // any subset of the pods may be placed
};

// The e of the cuts u_e, in milli-GPU (0.0, 0.1, ..., 0.5 of a GPU); 0 is the GPU capacity row.
inline constexpr int64_t kDffEpsilonsMilli[] = {0, 100, 200, 300, 400, 500};
// The largest k of the cuts u^(k), k = 2..kFsDffMaxK.
inline constexpr int kFsDffMaxK = 6;
// All cuts: the u_e in the order of kDffEpsilonsMilli, then u^(2)..u^(kFsDffMaxK).
inline constexpr size_t kDffCuts = std::size(kDffEpsilonsMilli) + kFsDffMaxK - 1;

// u_e(share), both in milli-GPU (share 0..1000).
int64_t DffValue(int64_t epsilon_milli, int64_t share_milli);
// u^(k)(share) in milli-GPU (fractional: multiples of 1000 / k).
double FsDffValue(int k, int64_t share_milli);
// Cut number `cut` (0..kDffCuts-1) of `share`, and its name for messages.
double DffCutValue(size_t cut, int64_t share_milli);
std::string DffCutName(size_t cut);

// The bound for the multiset `pods` on `nodes`, in milli-GPU: the most GPU share any placement of
// some of the pods could allocate. GLPK failures and unsupported requests (MIG) are errors.
Result<double> GpuAllocationBound(const std::vector<NodeSpec>& nodes, std::span<const TaskRequest> pods);

// The bound for an arrival sequence, as an experiment's published columns: alloc[c] is the bound for
// the prefix that ends at the last pod of column c's rows (the rows BinMetrics averages: a ==
// round-half-even(arrived / total_gpus / 10) == c, else c-1 <= a <= c+1), rounded as BinMetrics
// rounds a single row. The bound grows with the prefix, so it bounds every row of the column and hence
// their mean. frag and frag_ratio are NaN; so is alloc[c] where the column has no rows.
// `asked[i]` is pod i's arrived GPU demand as it asked for it (milli-GPU; it differs from the request
// in exclusive mode), which decides the columns; empty: each request's own demand. Fills alloc, frag,
// frag_ratio, total_gpus, pods_arrived, arrived_gpu_milli and seconds (the LP time); the other fields
// of `out` are left as they are.
Status FillBoundResult(const std::vector<NodeSpec>& nodes, const std::vector<const TaskRequest*>& arrivals,
                       const std::vector<int64_t>& asked, BoundKind kind, ExperimentResult& out);

}  // namespace gpupool
