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
//               sum_p x[p][t] k_p u_e(s_p)   <= N_t gpus_t 1000        for e in kDffEpsilonsMilli
//
//   u_e is a dual-feasible function on one GPU, in milli-GPU: u_e(s) = 1000 if s > 1000 - e, s if
//   e <= s <= 1000 - e, 0 if s < e. Any shares that fit together on one GPU have sum u_e <= 1000: if
//   one share exceeds 1000 - e the others sum below e, so they count 0 and the total is 1000;
//   otherwise u_e(s) <= s for every share and the total is at most the shares' sum. e = 0 is u_0(s) =
//   s, the plain GPU capacity. A k-GPU pod puts s on k distinct GPUs, hence k u_e(s). Summing the
//   per-GPU inequality over the N_t gpus_t GPUs of a type gives the row. The cuts are what make three
//   0.6-GPU pods on one GPU worth 0.6 GPU, not the 1.0 that capacity alone allows.
//
// Why it is an upper bound: any real run's placement of the arrived pods (placed pods only) is
// integral, respects every node's own CPU, memory and per-GPU shares, and hence satisfies every row
// above; its allocation is the objective at that point. The LP drops (each drop only enlarges the
// feasible set, so its optimum can only grow): integrality; the node boundary within a type (capacity
// is pooled over the N_t nodes, and a pod may be split among them); the arrival order (it sees the
// whole prefix at once, as an offline planner would); and the rule that a pod that fits must be placed
// (it may leave any pod out). Since pods never leave, the bound for a prefix also bounds every earlier
// row of the run.
//
// What it ignores (all relaxations, so still an upper bound): the per-node task limit, per-GPU memory
// requests, NVLink requirements, node and GPU health, and CPU-only pods. With no obligation to place
// pods, a CPU-only pod only takes capacity and adds no GPU share, so some optimum places none of them;
// leaving them out gives the same optimum with fewer variables. (That is also where the bound is
// weakest: the CPU that CPU-only pods take from GPU nodes in the cpu* traces is not charged.) MIG
// requests and MIG-enabled GPUs are not modelled and are an error.
//
// The LP value is a floating-point simplex optimum (GLPK's tolerances, ~1e-9 relative), not an exact
// rational bound.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/node.h"
#include "model/workload.h"
#include "sim/experiment.h"

namespace gpupool {

// The pseudo-policy name that RunExperiment and the sweep accept besides the scheduler's policies.
inline constexpr std::string_view kBoundPolicy = "bound";

// The e of the cuts u_e, in milli-GPU (0.0, 0.1, ..., 0.5 of a GPU); 0 is the GPU capacity row.
inline constexpr int64_t kDffEpsilonsMilli[] = {0, 100, 200, 300, 400, 500};

// u_e(share), both in milli-GPU (share 0..1000).
int64_t DffValue(int64_t epsilon_milli, int64_t share_milli);

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
                       const std::vector<int64_t>& asked, ExperimentResult& out);

}  // namespace gpupool
