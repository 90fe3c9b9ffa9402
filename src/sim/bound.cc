#include "sim/bound.h"

#include <fmt/format.h>
#include <glpk.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include "model/gpu_catalog.h"
#include "sim/glpk_scope.h"

namespace gpupool {

int64_t DffValue(int64_t epsilon_milli, int64_t share_milli) {
  if (share_milli > kWholeGpu.units() - epsilon_milli) return kWholeGpu.units();
  if (share_milli >= epsilon_milli) return share_milli;
  return 0;
}

double FsDffValue(int k, int64_t share_milli) {
  const int64_t whole = kWholeGpu.units();
  if (((k + 1) * share_milli) % whole == 0) return static_cast<double>(share_milli);
  return static_cast<double>(((k + 1) * share_milli) / whole) * static_cast<double>(whole) / k;
}

double DffCutValue(size_t cut, int64_t share_milli) {
  if (cut < std::size(kDffEpsilonsMilli)) {
    return static_cast<double>(DffValue(kDffEpsilonsMilli[cut], share_milli));
  }
  return FsDffValue(static_cast<int>(cut - std::size(kDffEpsilonsMilli)) + 2, share_milli);
}

std::string DffCutName(size_t cut) {
  if (cut < std::size(kDffEpsilonsMilli)) return fmt::format("u_e e={}", kDffEpsilonsMilli[cut]);
  return fmt::format("u^({})", cut - std::size(kDffEpsilonsMilli) + 2);
}

namespace {

// An LP value this close (milli-GPU) to the demand that could be placed means "everything fits": the
// demands are whole milli-GPU, and GLPK's error on objectives of a few thousand GPUs is far below.
constexpr double kFitSlackMilli = 0.5;
// LP solves per prefix for monotone rejection's branch and bound (MonotoneRejection).
constexpr int kMonotoneSolves = 32;

struct NodeType {
  std::string model;  // "" without GPUs
  int gpus = 0;
  int64_t cpu = 0;
  int64_t memory = 0;
  int max_tasks = 0;  // 0: no limit
  int64_t count = 0;
};

Result<std::vector<NodeType>> GroupNodes(const std::vector<NodeSpec>& nodes) {
  std::map<std::tuple<std::string, int, int64_t, int64_t, int>, size_t> index;
  std::vector<NodeType> types;
  for (const NodeSpec& n : nodes) {
    for (const GpuDevice& g : n.gpus) {
      if (g.mig_enabled) {
        return Status::InvalidArgument(
            fmt::format("node '{}': the allocation bound does not model MIG-enabled GPUs", n.name));
      }
    }
    NodeType t;
    t.model = n.gpus.empty() ? "" : n.gpus.front().model;
    t.gpus = static_cast<int>(n.gpus.size());
    t.cpu = n.cpu.units();
    t.memory = n.memory.units();
    t.max_tasks = n.max_tasks;
    auto [it, inserted] =
        index.emplace(std::make_tuple(t.model, t.gpus, t.cpu, t.memory, t.max_tasks), types.size());
    if (inserted) types.push_back(std::move(t));
    ++types[it->second].count;
  }
  return types;
}

// Whether `task` accepts GPUs of `model`, as the gpu-model filter decides: an empty list accepts any;
// a name matches the node's model directly or through a catalog alias.
bool ModelAllowed(const TaskRequest& task, const std::string& model, const GpuCatalog& catalog) {
  if (task.gpu_models.empty()) return true;
  for (const std::string& name : task.gpu_models) {
    if (name == model) return true;
    const GpuModelSpec* spec = catalog.Find(name);
    if (spec != nullptr && spec->name == model) return true;
  }
  return false;
}

struct PodType {
  int64_t cpu = 0;
  int64_t memory = 0;
  int gpus = 0;
  int64_t share = 0;
  std::vector<bool> fits;  // per node type: one pod fits an empty node of that type
  // Whether fitting is only CPU, memory, GPU count, per-GPU share and model, so that the obligation to
  // place it can be argued (per-GPU memory and NVLink requests are not modelled).
  bool forceable = true;

  int64_t demand() const { return gpus * share; }
};

// Groups GPU pods into the LP's pod types. Pods that behave alike in the LP (same demands and the same
// node types they fit) share a type, whatever their model lists say.
class PodTypes {
 public:
  explicit PodTypes(const std::vector<NodeType>& nodes) : nodes_(nodes), catalog_(GpuCatalog::Builtin()) {}

  // The type of `task`; nullopt when it fits no node type, or when it takes no GPU and `cpu_only` is
  // false (then it cannot add to the allocation).
  Result<std::optional<size_t>> Add(const TaskRequest& task, bool cpu_only) {
    RETURN_IF_ERROR(ValidateTaskRequest(task));
    if (task.wants_mig()) {
      return Status::InvalidArgument(
          fmt::format("the allocation bound does not model MIG requests ({})", DescribeTaskRequest(task)));
    }
    if (!task.wants_gpu() && !cpu_only) return std::optional<size_t>();
    PodType p;
    p.cpu = task.cpu.units();
    p.memory = task.memory.units();
    p.gpus = task.gpu_count;
    p.share = task.wants_gpu() ? task.gpu_share.units() : 0;
    p.forceable = task.gpu_memory.units() == 0 && !task.nvlink;
    p.fits.resize(nodes_.size());
    bool any = false;
    for (size_t t = 0; t < nodes_.size(); ++t) {
      const NodeType& n = nodes_[t];
      p.fits[t] =
          p.cpu <= n.cpu && p.memory <= n.memory && p.gpus <= n.gpus && ModelAllowed(task, n.model, catalog_);
      any = any || p.fits[t];
    }
    if (!any) return std::optional<size_t>();
    auto [it, inserted] =
        index_.emplace(std::make_tuple(p.cpu, p.memory, p.gpus, p.share, p.forceable, p.fits), types_.size());
    if (inserted) types_.push_back(std::move(p));
    return std::optional<size_t>(it->second);
  }

  const std::vector<PodType>& types() const { return types_; }

 private:
  const std::vector<NodeType>& nodes_;
  GpuCatalog catalog_;
  std::map<std::tuple<int64_t, int64_t, int, int64_t, bool, std::vector<bool>>, size_t> index_;
  std::vector<PodType> types_;
};

// How a solve ended: an optimum, proof that the LP has no feasible point, or a failure.
enum class LpOutcome { kOptimal, kInfeasible, kFailed };

// Solves `lp` to optimality: from its current basis by dual simplex when `warm` (only bounds changed
// since the last optimum, so the basis is still dual feasible), else by primal simplex. A warm
// start that goes wrong (a singular basis, or stalling: GLPK's dual simplex was seen to cycle on a
// blocking LP of multigpu30, seed 46) gets an iteration limit and one more try from the slack basis.
// Infeasibility is only believed from the cold primal simplex, whose first phase proves it.
LpOutcome SolveLpOutcome(glp_prob* lp, bool warm) {
  glp_smcp parm;
  glp_init_smcp(&parm);
  parm.msg_lev = GLP_MSG_OFF;
  if (warm) {
    parm.meth = GLP_DUALP;
    parm.it_lim = 20'000;
    if (glp_simplex(lp, &parm) == 0 && glp_get_status(lp) == GLP_OPT) return LpOutcome::kOptimal;
  }
  glp_std_basis(lp);
  parm.meth = GLP_PRIMAL;
  parm.it_lim = INT_MAX;
  if (glp_simplex(lp, &parm) != 0) return LpOutcome::kFailed;
  const int status = glp_get_status(lp);
  if (status == GLP_OPT) return LpOutcome::kOptimal;
  if (status == GLP_NOFEAS) return LpOutcome::kInfeasible;
  return LpOutcome::kFailed;
}

bool SolveLp(glp_prob* lp, bool warm) {
  return SolveLpOutcome(lp, warm) == LpOutcome::kOptimal;
}

// The LP for a fixed set of node and pod types; only the pod counts (the bounds of the pod rows)
// change between solves, so each solve after the first starts from the previous optimal basis, which
// stays dual feasible.
class BoundLp {
 public:
  BoundLp(const std::vector<NodeType>& nodes, const std::vector<PodType>& pods) : lp_(glp_create_prob()) {
    glp_prob* lp = lp_.get();
    glp_set_obj_dir(lp, GLP_MAX);
    // Rows 1..P: the pod counts (all 0 until SetCount).
    if (!pods.empty()) glp_add_rows(lp, static_cast<int>(pods.size()));  // GLPK aborts on 0
    for (size_t p = 0; p < pods.size(); ++p) glp_set_row_bnds(lp, Row(p), GLP_UP, 0.0, 0.0);
    // Node rows, scaled by one node's capacity so that every coefficient is at most 1 and the right-hand
    // side is the node count; a zero capacity has no row (only pods that ask for none of it fit).
    struct NodeRows {
      int cpu = 0;
      int memory = 0;
      int tasks = 0;
      int gpu[kDffCuts] = {};
    };
    std::vector<NodeRows> rows(nodes.size());
    auto add_row = [&](double count) {
      const int r = glp_add_rows(lp, 1);
      glp_set_row_bnds(lp, r, GLP_UP, 0.0, count);
      return r;
    };
    for (size_t t = 0; t < nodes.size(); ++t) {
      const auto count = static_cast<double>(nodes[t].count);
      if (nodes[t].cpu > 0) rows[t].cpu = add_row(count);
      if (nodes[t].memory > 0) rows[t].memory = add_row(count);
      if (nodes[t].max_tasks > 0) rows[t].tasks = add_row(count);
      if (nodes[t].gpus > 0) {
        for (int& r : rows[t].gpu) r = add_row(count);
      }
    }
    // Columns x[p][t]; GLPK's arrays are 1-based.
    std::vector<int> ia = {0};
    std::vector<int> ja = {0};
    std::vector<double> ar = {0};
    for (size_t p = 0; p < pods.size(); ++p) {
      const PodType& pod = pods[p];
      for (size_t t = 0; t < nodes.size(); ++t) {
        if (!pod.fits[t]) continue;
        const NodeType& node = nodes[t];
        const int col = glp_add_cols(lp, 1);
        glp_set_col_bnds(lp, col, GLP_LO, 0.0, 0.0);
        glp_set_obj_coef(lp, col, static_cast<double>(pod.demand()) / 1000.0);  // GPUs
        auto put = [&](int row, double value) {
          if (row == 0 || value == 0) return;
          ia.push_back(row);
          ja.push_back(col);
          ar.push_back(value);
        };
        put(Row(p), 1.0);
        put(rows[t].cpu, static_cast<double>(pod.cpu) / static_cast<double>(node.cpu));
        put(rows[t].memory, static_cast<double>(pod.memory) / static_cast<double>(node.memory));
        if (node.max_tasks > 0) put(rows[t].tasks, 1.0 / node.max_tasks);
        const double gpu_capacity = static_cast<double>(node.gpus) * static_cast<double>(kWholeGpu.units());
        for (size_t e = 0; e < kDffCuts; ++e) {
          const double u = DffCutValue(e, pod.share);
          put(rows[t].gpu[e], pod.gpus * u / gpu_capacity);
        }
      }
    }
    columns_ = glp_get_num_cols(lp);
    if (columns_ == 0) return;  // nothing to place: Solve answers 0 without GLPK
    glp_load_matrix(lp, static_cast<int>(ia.size()) - 1, ia.data(), ja.data(), ar.data());
    glp_scale_prob(lp, GLP_SF_AUTO);
  }

  void SetCount(size_t pod_type, int64_t count) { SetCounts(pod_type, 0, count); }

  // Between `at_least` and `at_most` pods of the type are placed.
  void SetCounts(size_t pod_type, int64_t at_least, int64_t at_most) {
    const auto lo = static_cast<double>(at_least);
    const auto hi = static_cast<double>(at_most);
    glp_set_row_bnds(lp_.get(), Row(pod_type),
                     at_least == 0         ? GLP_UP
                     : at_least == at_most ? GLP_FX
                                           : GLP_DB,
                     lo, hi);
  }

  // The optimum in milli-GPU; nullopt when no point meets the rows (the count bounds ask for more
  // than fits).
  Result<std::optional<double>> SolveIfFeasible() {
    if (columns_ == 0) return std::optional<double>(0.0);
    switch (SolveLpOutcome(lp_.get(), warm_)) {
      case LpOutcome::kOptimal:
        warm_ = true;
        return std::optional<double>(glp_get_obj_val(lp_.get()) * 1000.0);
      case LpOutcome::kInfeasible: warm_ = false; return std::optional<double>();
      case LpOutcome::kFailed: break;
    }
    warm_ = false;
    return Status::Internal(
        fmt::format("allocation bound: GLPK simplex failed (status {})", glp_get_status(lp_.get())));
  }

  // Pods of the type placed in the last optimum.
  double Placed(size_t pod_type) const {
    return columns_ == 0 ? 0.0 : glp_get_row_prim(lp_.get(), Row(pod_type));
  }

  // The optimum in milli-GPU.
  Result<double> Solve() {
    // The pod rows bound every column, and a real run's placement satisfies every row (also the
    // forced lower bounds), so an optimum exists; failing here is a bug in the argument or in GLPK.
    ASSIGN_OR_RETURN(const std::optional<double> value, SolveIfFeasible());
    if (!value) return Status::Internal("allocation bound: the LP has no feasible point (a bug)");
    return *value;
  }

 private:
  static int Row(size_t pod_type) { return static_cast<int>(pod_type) + 1; }

  GlpProb lp_;
  int columns_ = 0;
  bool warm_ = false;
};

// Whether the pods that have arrived could leave every node without room for one more pod of type q
// (the "blocking" LP; see bound.h). Built once per q; only the arrived counts change between solves.
//
// For each node type t where q fits: b[t][r] nodes of the type are blocked for reason r, and
// z[p][t][r] pods of type p sit on them; the b are maximised. A node is blocked when
//   r = gpu:    more than gpus_t - k_q of its GPUs hold more than 1000 - s_q;
//   r = cpu:    more than cpu_t - cpu_q of its CPU is taken;
//   r = memory: more than mem_t - mem_q of its memory is taken;
//   r = tasks:  it holds its task limit (when it has one): sum_p z[p][t][tasks] >= limit_t b[t][tasks].
// A GPU that holds more than 1000 - s_q holds pods whose weights min(1, s / (1001 - s_q)) sum to at
// least 1 (the shares are whole milli-GPU), and a k-GPU pod puts its share on k GPUs; hence
//   sum_p z[p][t][gpu] k_p min(1, s_p / (1001 - s_q)) >= (gpus_t - k_q + 1) b[t][gpu],
//   sum_p z[p][t][cpu] cpu_p >= (cpu_t - cpu_q + 1) b[t][cpu],  the same for memory,
//   sum_r b[t][r] <= N_t,   sum_{t,r} z[p][t][r] <= arrived_p.
// Every real state in which no node has room for q gives a feasible point (each node counted under
// one reason it is blocked for, each pod under its node's reason) whose objective is the number of
// nodes q fits, so if the optimum is smaller, q fits somewhere whatever the policy did.
class BlockingLp {
 public:
  BlockingLp(const std::vector<NodeType>& nodes, const std::vector<PodType>& pods, const PodType& q)
      : lp_(glp_create_prob()) {
    glp_prob* lp = lp_.get();
    glp_set_obj_dir(lp, GLP_MAX);
    glp_add_rows(lp, static_cast<int>(pods.size()));
    for (size_t p = 0; p < pods.size(); ++p) glp_set_row_bnds(lp, static_cast<int>(p) + 1, GLP_UP, 0.0, 0.0);
    std::vector<int> ia = {0};
    std::vector<int> ja = {0};
    std::vector<double> ar = {0};
    auto put = [&](int row, int col, double value) {
      ia.push_back(row);
      ja.push_back(col);
      ar.push_back(value);
    };
    for (size_t t = 0; t < nodes.size(); ++t) {
      if (!q.fits[t]) continue;
      const NodeType& node = nodes[t];
      need_ += static_cast<double>(node.count);
      const int cover = glp_add_rows(lp, 1);
      glp_set_row_bnds(lp, cover, GLP_UP, 0.0, static_cast<double>(node.count));
      enum Reason { kGpu, kCpu, kMemory, kTasks };
      for (Reason reason : {kGpu, kCpu, kMemory, kTasks}) {
        double cost = 0;  // of blocking one node this way
        if (reason == kGpu) {
          if (q.gpus == 0) continue;  // a CPU-only pod needs no GPU
          cost = static_cast<double>(node.gpus - q.gpus + 1);
        } else if (reason == kCpu) {
          cost = static_cast<double>(node.cpu - q.cpu + 1);
        } else if (reason == kMemory) {
          cost = static_cast<double>(node.memory - q.memory + 1);
        } else {
          if (node.max_tasks == 0) continue;  // no limit
          cost = static_cast<double>(node.max_tasks);
        }
        const int row = glp_add_rows(lp, 1);  // sum z w / cost - b >= 0
        glp_set_row_bnds(lp, row, GLP_LO, 0.0, 0.0);
        const int b = glp_add_cols(lp, 1);
        glp_set_col_bnds(lp, b, GLP_LO, 0.0, 0.0);
        glp_set_obj_coef(lp, b, 1.0);
        put(cover, b, 1.0);
        put(row, b, -1.0);
        for (size_t p = 0; p < pods.size(); ++p) {
          const PodType& pod = pods[p];
          if (!pod.fits[t]) continue;
          double weight = 0;
          if (reason == kGpu) {
            weight = pod.gpus * std::min(1.0, static_cast<double>(pod.share) /
                                                  static_cast<double>(kWholeGpu.units() + 1 - q.share));
          } else if (reason == kCpu) {
            weight = static_cast<double>(pod.cpu);
          } else if (reason == kMemory) {
            weight = static_cast<double>(pod.memory);
          } else {
            weight = 1.0;
          }
          if (weight <= 0) continue;
          const int z = glp_add_cols(lp, 1);
          glp_set_col_bnds(lp, z, GLP_LO, 0.0, 0.0);
          put(static_cast<int>(p) + 1, z, 1.0);
          put(row, z, weight / cost);
        }
      }
    }
    glp_load_matrix(lp, static_cast<int>(ia.size()) - 1, ia.data(), ja.data(), ar.data());
    glp_scale_prob(lp, GLP_SF_AUTO);
  }

  void SetCount(size_t pod_type, int64_t count) {
    glp_set_row_bnds(lp_.get(), static_cast<int>(pod_type) + 1, GLP_UP, 0.0, static_cast<double>(count));
  }

  // Whether the arrived pods could block every node q fits (the LP reaches their number). Within GLPK's
  // tolerance a tie counts as "could", which only makes fewer pods forced; so does a solve that fails
  // twice (never seen), which keeps the bound valid, only looser.
  bool CanBlock() {
    if (!SolveLp(lp_.get(), warm_)) {
      warm_ = false;
      return true;
    }
    warm_ = true;
    return glp_get_obj_val(lp_.get()) >= need_ - 1e-6 * std::max(1.0, need_);
  }

 private:
  GlpProb lp_;
  double need_ = 0;
  bool warm_ = false;
};

// forced[i]: whether arrival i must have been placed by any policy. type_of[i] is its LP type
// (nullopt: it fits nowhere). Pod i of type q is forced when the arrivals before it cannot block q;
// that only gets easier as arrivals are added, so per type a binary search over q's own arrivals finds
// the first that could have been blocked, and every earlier arrival of type q is forced.
Result<std::vector<bool>> ForcedArrivals(const std::vector<NodeType>& nodes, const std::vector<PodType>& pods,
                                         const std::vector<std::optional<size_t>>& type_of) {
  std::vector<bool> forced(type_of.size(), false);
  std::vector<std::vector<size_t>> arrivals_of(pods.size());
  for (size_t i = 0; i < type_of.size(); ++i) {
    if (type_of[i]) arrivals_of[*type_of[i]].push_back(i);
  }
  // Arrived counts per type before index `end`, kept for the last `end` asked.
  std::vector<int64_t> counts(pods.size(), 0);
  size_t counted = 0;
  auto move_to = [&](BlockingLp& lp, size_t end) {
    while (counted > end) {
      --counted;
      if (type_of[counted]) --counts[*type_of[counted]];
    }
    while (counted < end) {
      if (type_of[counted]) ++counts[*type_of[counted]];
      ++counted;
    }
    for (size_t p = 0; p < pods.size(); ++p) lp.SetCount(p, counts[p]);
  };
  for (size_t q = 0; q < pods.size(); ++q) {
    if (!pods[q].forceable || arrivals_of[q].empty()) continue;
    BlockingLp lp(nodes, pods, pods[q]);
    // The first of q's own arrivals whose predecessors could block it; lo..hi brackets it (hi: none).
    const std::vector<size_t>& mine = arrivals_of[q];
    size_t lo = 0;
    size_t hi = mine.size();
    while (lo < hi) {
      const size_t mid = lo + (hi - lo) / 2;
      move_to(lp, mine[mid]);
      if (lp.CanBlock()) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    for (size_t j = 0; j < lo; ++j) forced[mine[j]] = true;
  }
  return forced;
}

// dominators[q]: the pod types r != q that cannot fit in any state where q does not (bound.h,
// "monotone rejection"). q must be forceable (its fit is decided by what the LP models); r fits only
// node types q fits, asks for at least q's CPU and memory, and, when q takes GPUs, for at least as
// many GPUs with at least q's per-GPU share. Whatever else r asks for only makes it harder to fit.
std::vector<std::vector<size_t>> Dominators(const std::vector<PodType>& pods) {
  std::vector<std::vector<size_t>> out(pods.size());
  for (size_t q = 0; q < pods.size(); ++q) {
    const PodType& a = pods[q];
    if (!a.forceable) continue;
    for (size_t r = 0; r < pods.size(); ++r) {
      const PodType& b = pods[r];
      if (r == q || b.cpu < a.cpu || b.memory < a.memory) continue;
      if (a.gpus > 0 && (b.gpus < a.gpus || b.share < a.share)) continue;
      bool within = true;
      for (size_t t = 0; t < a.fits.size() && within; ++t) within = a.fits[t] || !b.fits[t];
      if (within) out[q].push_back(r);
    }
  }
  return out;
}

// Tightens the main LP's optimum for one prefix by monotone rejection (bound.h): for a pivot type q,
// every real run places the first n_q of q's arrivals and no other, for some n_q; when n_q is short of
// all of them, q's arrival n_q + 1 found no room, and no dominator of q arriving after it can have
// found any. A branch and bound over these n: each node restricts some pivots' n_q to intervals
// [lo, hi] and solves the main LP with q's count in [lo, hi] and each dominator's count capped by its
// arrivals before q's arrival hi + 1 (no cap when hi is all of q's arrivals). The node with the
// largest optimum is split (best first): the interval of the pivot whose rule its optimum breaks most
// is halved. The children's intervals cover the parent's, so every real run lies in some leaf, and the
// largest leaf optimum bounds every run. A node whose caps fall below forced counts, or whose LP has no
// feasible point, holds no run.
class MonotoneRejection {
 public:
  MonotoneRejection(const std::vector<PodType>& pods, const std::vector<std::optional<size_t>>& type_of)
      : pods_(pods), dominators_(Dominators(pods)), arrivals_of_(pods.size()) {
    for (size_t i = 0; i < type_of.size(); ++i) {
      if (type_of[i]) arrivals_of_[*type_of[i]].push_back(i);
    }
  }

  // `lp` holds the prefix's counts ([forced, counts] per type) and has just been solved to `base`
  // (milli-GPU); its bounds are restored before returning. At most `budget` more LP solves.
  Result<double> Tighten(BoundLp& lp, double base, const std::vector<int64_t>& counts,
                         const std::vector<int64_t>& forced, int budget) {
    constexpr double kNone = -std::numeric_limits<double>::infinity();
    struct Node {
      std::map<size_t, std::pair<int64_t, int64_t>> pivots;  // q -> [lo, hi] of n_q
      double value = kNone;                                  // kNone: holds no run
      std::optional<size_t> split;                           // the pivot to split next
    };
    std::vector<Node> nodes(1);
    nodes[0].value = base;
    nodes[0].split = Worst(lp, counts, nodes[0].pivots, std::nullopt);
    std::vector<size_t> touched;  // types whose rows a solve changed
    auto solve = [&](Node& node) -> Status {
      for (size_t t : touched) lp.SetCounts(t, forced[t], counts[t]);
      touched.clear();
      std::map<size_t, std::pair<int64_t, int64_t>> range;  // type -> [lower, upper] of its count
      auto narrow = [&](size_t t, int64_t lo, int64_t hi) {
        auto [it, inserted] = range.try_emplace(t, forced[t], counts[t]);
        it->second.first = std::max(it->second.first, lo);
        it->second.second = std::min(it->second.second, hi);
      };
      for (const auto& [q, interval] : node.pivots) {
        narrow(q, interval.first, interval.second);
        if (interval.second >= counts[q]) continue;
        const size_t turned_away = arrivals_of_[q][static_cast<size_t>(interval.second)];
        for (size_t r : dominators_[q]) narrow(r, 0, Before(r, turned_away));
      }
      for (const auto& [t, r] : range) {
        if (r.first > r.second) {
          node.value = kNone;
          return Status::Ok();
        }
      }
      for (const auto& [t, r] : range) {
        lp.SetCounts(t, r.first, r.second);
        touched.push_back(t);
      }
      ASSIGN_OR_RETURN(const std::optional<double> v, lp.SolveIfFeasible());
      node.value = v.value_or(kNone);
      if (v) node.split = Worst(lp, counts, node.pivots, node.split);
      return Status::Ok();
    };
    Status status = Status::Ok();
    for (int used = 0; used + 2 <= budget;) {
      auto best = std::max_element(nodes.begin(), nodes.end(),
                                   [](const Node& a, const Node& b) { return a.value < b.value; });
      if (best->value == kNone || !best->split) break;
      const size_t q = *best->split;
      auto [it, inserted] = best->pivots.try_emplace(q, forced[q], counts[q]);
      const auto [lo, hi] = it->second;
      const int64_t mid = lo + (hi - lo) / 2;
      Node left = *best;
      Node right = *best;
      left.pivots[q] = {lo, mid};
      right.pivots[q] = {mid + 1, hi};
      left.split = right.split = q;  // kept if its rule is still broken
      status = solve(left);
      if (status.ok()) status = solve(right);
      if (!status.ok()) break;
      used += 2;
      *best = std::move(left);
      nodes.push_back(std::move(right));
    }
    for (size_t t : touched) lp.SetCounts(t, forced[t], counts[t]);
    RETURN_IF_ERROR(status);
    double bound = kNone;
    for (const Node& n : nodes) bound = std::max(bound, n.value);
    if (bound == kNone) return Status::Internal("allocation bound: every branch holds no run (a bug)");
    return std::min(bound, base);
  }

 private:
  // Arrivals of type r before arrival index `pos`.
  int64_t Before(size_t r, size_t pos) const {
    const std::vector<size_t>& a = arrivals_of_[r];
    return static_cast<int64_t>(std::lower_bound(a.begin(), a.end(), pos) - a.begin());
  }

  // The type whose rule the last optimum breaks most, among those whose interval (`pivots`, else all
  // of its arrivals) can still be split: by the GPUs (plus one per pod) its dominators placed after the
  // arrival that the optimum's count of the type says was turned away. nullopt: none is broken.
  // `keep`, the pivot split last, is kept while its rule is still broken: halving one pivot's
  // interval down to its n converges far faster than spreading the solves over many pivots.
  std::optional<size_t> Worst(const BoundLp& lp, const std::vector<int64_t>& counts,
                              const std::map<size_t, std::pair<int64_t, int64_t>>& pivots,
                              std::optional<size_t> keep) const {
    constexpr double kBroken = 1e-3;
    auto broken = [&](size_t q) {
      if (dominators_[q].empty() || counts[q] == 0) return 0.0;
      if (auto it = pivots.find(q); it != pivots.end() && it->second.first >= it->second.second) return 0.0;
      const auto placed = static_cast<int64_t>(std::floor(lp.Placed(q) + 1e-6));
      if (placed >= counts[q]) return 0.0;
      const size_t turned_away = arrivals_of_[q][static_cast<size_t>(placed)];
      double sum = 0;
      for (size_t r : dominators_[q]) {
        const double over = lp.Placed(r) - static_cast<double>(Before(r, turned_away));
        if (over > 1e-6) sum += over * static_cast<double>(pods_[r].demand() + 1000);
      }
      return sum;
    };
    if (keep && broken(*keep) > kBroken) return keep;
    std::optional<size_t> worst;
    double most = kBroken;
    for (size_t q = 0; q < pods_.size(); ++q) {
      const double sum = broken(q);
      if (sum > most) {
        most = sum;
        worst = q;
      }
    }
    return worst;
  }

  const std::vector<PodType>& pods_;
  std::vector<std::vector<size_t>> dominators_;
  std::vector<std::vector<size_t>> arrivals_of_;
};

// The LP value, clamped to what could be placed at all (the LP cannot exceed it; this removes solver
// noise) and snapped to it when within kFitSlackMilli.
double Clamp(double lp_milli, int64_t placeable_milli) {
  const auto placeable = static_cast<double>(placeable_milli);
  if (lp_milli >= placeable - kFitSlackMilli) return placeable;
  return std::max(lp_milli, 0.0);
}

int TotalGpus(const std::vector<NodeType>& nodes) {
  int64_t total = 0;
  for (const NodeType& t : nodes) total += t.count * t.gpus;
  return static_cast<int>(total);
}

}  // namespace

Result<double> GpuAllocationBound(const std::vector<NodeSpec>& nodes, std::span<const TaskRequest> pods) {
  GlpkScope glpk;
  ASSIGN_OR_RETURN(const std::vector<NodeType> node_types, GroupNodes(nodes));
  PodTypes types(node_types);
  std::vector<int64_t> counts;
  int64_t placeable = 0;
  for (const TaskRequest& pod : pods) {
    ASSIGN_OR_RETURN(const std::optional<size_t> type, types.Add(pod, /*cpu_only=*/false));
    if (!type) continue;
    if (counts.size() <= *type) counts.resize(*type + 1, 0);
    ++counts[*type];
    placeable += types.types()[*type].demand();
  }
  if (placeable == 0) return 0.0;
  BoundLp lp(node_types, types.types());
  for (size_t p = 0; p < counts.size(); ++p) lp.SetCount(p, counts[p]);
  ASSIGN_OR_RETURN(const double value, lp.Solve());
  return Clamp(value, placeable);
}

Status FillBoundResult(const std::vector<NodeSpec>& nodes, const std::vector<const TaskRequest*>& arrivals,
                       const std::vector<int64_t>& asked, BoundKind kind, ExperimentResult& out) {
  const auto start = std::chrono::steady_clock::now();
  if (!asked.empty() && asked.size() != arrivals.size()) {
    return Status::InvalidArgument(
        fmt::format("allocation bound: {} demands for {} arrivals", asked.size(), arrivals.size()));
  }
  GlpkScope glpk;
  ASSIGN_OR_RETURN(const std::vector<NodeType> node_types, GroupNodes(nodes));
  const int total_gpus = TotalGpus(node_types);
  if (total_gpus == 0) return Status::InvalidArgument("the cluster has no GPUs");
  const double tg = static_cast<double>(total_gpus);

  const bool forcing = kind == BoundKind::kForcedPlacement;

  // Per pod: its LP type, the demand it could add (0 when it fits nowhere) and its bin, as BinMetrics
  // computes it from the cumulative asked demand. With forcing, CPU-only pods are types too: a forced
  // one takes CPU and memory.
  PodTypes types(node_types);
  std::vector<std::optional<size_t>> type_of(arrivals.size());
  std::vector<int64_t> placeable(arrivals.size());  // cumulative, through pod i
  std::vector<int64_t> bin(arrivals.size());
  int64_t arrived = 0;
  int64_t placeable_sum = 0;
  for (size_t i = 0; i < arrivals.size(); ++i) {
    ASSIGN_OR_RETURN(type_of[i], types.Add(*arrivals[i], /*cpu_only=*/forcing));
    if (type_of[i]) placeable_sum += types.types()[*type_of[i]].demand();
    placeable[i] = placeable_sum;
    arrived += asked.empty() ? arrivals[i]->total_gpu_share().units() : asked[i];
    bin[i] = static_cast<int64_t>(std::nearbyint(static_cast<double>(arrived) / tg / 10.0));
  }

  // The last row of each column's rows: bin c, else bins c-1..c+1 (BinMetrics' fallback).
  std::map<int64_t, size_t> last_of_bin;
  for (size_t i = 0; i < arrivals.size(); ++i) last_of_bin[bin[i]] = i;
  auto last_row = [&](int c) -> std::optional<size_t> {
    if (auto it = last_of_bin.find(c); it != last_of_bin.end()) return it->second;
    std::optional<size_t> last;
    for (int b : {c - 1, c + 1}) {
      if (auto it = last_of_bin.find(b); it != last_of_bin.end())
        last = std::max(last.value_or(0), it->second);
    }
    return last;
  };

  // Which arrivals every policy had to place, up to the last row of the top column.
  std::vector<bool> forced(arrivals.size(), false);
  if (forcing) {
    std::optional<size_t> top;
    for (int c = 0; c < kDemandBins; ++c) {
      if (const std::optional<size_t> end = last_row(c)) top = std::max(top.value_or(0), *end);
    }
    if (top) {
      const std::vector<std::optional<size_t>> head(type_of.begin(),
                                                    type_of.begin() + static_cast<ptrdiff_t>(*top) + 1);
      ASSIGN_OR_RETURN(const std::vector<bool> f, ForcedArrivals(node_types, types.types(), head));
      std::copy(f.begin(), f.end(), forced.begin());
    }
  }

  // From the top column down: the bound only shrinks with the prefix, and once a prefix fits completely
  // (the LP places all it could), so does every shorter one, whose bound is then its placeable demand
  // (placing everything also meets every forced count).
  BoundLp lp(node_types, types.types());
  std::vector<int64_t> counts(types.types().size(), 0);
  std::vector<int64_t> forced_counts(types.types().size(), 0);
  auto set = [&](size_t i, int64_t step) {
    const size_t t = *type_of[i];
    counts[t] += step;
    if (forced[i]) forced_counts[t] += step;
    lp.SetCounts(t, forced_counts[t], counts[t]);
  };
  std::optional<MonotoneRejection> monotone;
  if (forcing) monotone.emplace(types.types(), type_of);
  size_t counted = 0;  // counts cover pods [0, counted)
  std::optional<size_t> fits_through;
  std::map<size_t, double> solved;                   // prefix end -> bound (columns may share a last row)
  std::optional<std::pair<size_t, double>> ceiling;  // the smallest bound so far, and its prefix end
  for (int c = kDemandBins - 1; c >= 0; --c) {
    const auto cell = static_cast<size_t>(c);
    out.frag[cell] = out.frag_ratio[cell] = std::nan("");
    const std::optional<size_t> end = last_row(c);
    if (!end) {
      out.alloc[cell] = std::nan("");
      continue;
    }
    double value = 0;
    if (fits_through && *end <= *fits_through) {
      value = static_cast<double>(placeable[*end]);
    } else if (auto it = solved.find(*end); it != solved.end()) {
      value = it->second;
    } else {
      // Move the counts to the prefix [0, *end].
      while (counted > *end + 1) {
        --counted;
        if (type_of[counted]) set(counted, -1);
      }
      while (counted < *end + 1) {
        if (type_of[counted]) set(counted, +1);
        ++counted;
      }
      ASSIGN_OR_RETURN(double lp_milli, lp.Solve());
      if (monotone) {
        ASSIGN_OR_RETURN(lp_milli, monotone->Tighten(lp, lp_milli, counts, forced_counts, kMonotoneSolves));
      }
      value = Clamp(lp_milli, placeable[*end]);
      solved[*end] = value;
      if (value == static_cast<double>(placeable[*end]))
        fits_through = std::max(fits_through.value_or(0), *end);
    }
    // A run's allocation only grows with the prefix, so a longer prefix's bound also bounds this one
    // (it can be the smaller: monotone rejection may tighten some prefixes more than others).
    if (ceiling && *end <= ceiling->first) value = std::min(value, ceiling->second);
    if (!ceiling || value < ceiling->second) ceiling.emplace(*end, value);
    out.alloc[cell] = NpRound2(PyRound2(value / tg / 10.0));
  }

  out.total_gpus = total_gpus;
  out.pods_arrived = static_cast<int64_t>(arrivals.size());
  out.arrived_gpu_milli = arrived;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return Status::Ok();
}

}  // namespace gpupool
