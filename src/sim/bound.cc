#include "sim/bound.h"

#include <fmt/format.h>
#include <glpk.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include "model/gpu_catalog.h"

namespace gpupool {

int64_t DffValue(int64_t epsilon_milli, int64_t share_milli) {
  if (share_milli > kWholeGpu.units() - epsilon_milli) return kWholeGpu.units();
  if (share_milli >= epsilon_milli) return share_milli;
  return 0;
}

namespace {

// An LP value this close (milli-GPU) to the demand that could be placed means "everything fits": the
// demands are whole milli-GPU, and GLPK's error on objectives of a few thousand GPUs is far below.
constexpr double kFitSlackMilli = 0.5;

struct NodeType {
  std::string model;  // "" without GPUs
  int gpus = 0;
  int64_t cpu = 0;
  int64_t memory = 0;
  int64_t count = 0;
};

Result<std::vector<NodeType>> GroupNodes(const std::vector<NodeSpec>& nodes) {
  std::map<std::tuple<std::string, int, int64_t, int64_t>, size_t> index;
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
    auto [it, inserted] = index.emplace(std::make_tuple(t.model, t.gpus, t.cpu, t.memory), types.size());
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

  int64_t demand() const { return gpus * share; }
};

// Groups GPU pods into the LP's pod types. Pods that behave alike in the LP (same demands and the same
// node types they fit) share a type, whatever their model lists say.
class PodTypes {
 public:
  explicit PodTypes(const std::vector<NodeType>& nodes) : nodes_(nodes), catalog_(GpuCatalog::Builtin()) {}

  // The type of `task`; nullopt when it takes no GPU share or fits no node type (it cannot add to the
  // allocation).
  Result<std::optional<size_t>> Add(const TaskRequest& task) {
    RETURN_IF_ERROR(ValidateTaskRequest(task));
    if (task.wants_mig()) {
      return Status::InvalidArgument(
          fmt::format("the allocation bound does not model MIG requests ({})", DescribeTaskRequest(task)));
    }
    if (!task.wants_gpu()) return std::optional<size_t>();
    PodType p;
    p.cpu = task.cpu.units();
    p.memory = task.memory.units();
    p.gpus = task.gpu_count;
    p.share = task.gpu_share.units();
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
        index_.emplace(std::make_tuple(p.cpu, p.memory, p.gpus, p.share, p.fits), types_.size());
    if (inserted) types_.push_back(std::move(p));
    return std::optional<size_t>(it->second);
  }

  const std::vector<PodType>& types() const { return types_; }

 private:
  const std::vector<NodeType>& nodes_;
  GpuCatalog catalog_;
  std::map<std::tuple<int64_t, int64_t, int, int64_t, std::vector<bool>>, size_t> index_;
  std::vector<PodType> types_;
};

// GLPK keeps one environment per thread (the Debian build uses thread-local storage, so sweep workers
// do not share it). It is silenced for the computation and freed at the end, so a finished sweep
// thread leaves nothing behind. No other code in the process uses GLPK, so no GLPK object outlives
// the scope.
class GlpkScope {
 public:
  GlpkScope() { glp_term_out(GLP_OFF); }
  ~GlpkScope() { glp_free_env(); }
  GlpkScope(const GlpkScope&) = delete;
  GlpkScope& operator=(const GlpkScope&) = delete;
};

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
      int gpu[std::size(kDffEpsilonsMilli)] = {};
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
        const double gpu_capacity = static_cast<double>(node.gpus) * static_cast<double>(kWholeGpu.units());
        for (size_t e = 0; e < std::size(kDffEpsilonsMilli); ++e) {
          const int64_t u = DffValue(kDffEpsilonsMilli[e], pod.share);
          put(rows[t].gpu[e], static_cast<double>(pod.gpus * u) / gpu_capacity);
        }
      }
    }
    columns_ = glp_get_num_cols(lp);
    if (columns_ == 0) return;  // nothing to place: Solve answers 0 without GLPK
    glp_load_matrix(lp, static_cast<int>(ia.size()) - 1, ia.data(), ja.data(), ar.data());
    glp_scale_prob(lp, GLP_SF_AUTO);
  }

  void SetCount(size_t pod_type, int64_t count) {
    glp_set_row_bnds(lp_.get(), Row(pod_type), GLP_UP, 0.0, static_cast<double>(count));
  }

  // The optimum in milli-GPU.
  Result<double> Solve() {
    if (columns_ == 0) return 0.0;
    glp_smcp parm;
    glp_init_smcp(&parm);
    parm.msg_lev = GLP_MSG_OFF;
    parm.meth = warm_ ? GLP_DUALP : GLP_PRIMAL;
    int ret = glp_simplex(lp_.get(), &parm);
    if (ret != 0 || glp_get_status(lp_.get()) != GLP_OPT) {
      // A warm start that went wrong (e.g. a singular basis): once more from the slack basis. x = 0 is
      // feasible and the pod rows bound every column, so an optimum always exists.
      glp_std_basis(lp_.get());
      parm.meth = GLP_PRIMAL;
      ret = glp_simplex(lp_.get(), &parm);
      if (ret != 0 || glp_get_status(lp_.get()) != GLP_OPT) {
        warm_ = false;
        return Status::Internal(
            fmt::format("allocation bound: GLPK simplex failed (return code {}, status {})", ret,
                        glp_get_status(lp_.get())));
      }
    }
    warm_ = true;
    return glp_get_obj_val(lp_.get()) * 1000.0;
  }

 private:
  static int Row(size_t pod_type) { return static_cast<int>(pod_type) + 1; }

  struct Deleter {
    void operator()(glp_prob* lp) const { glp_delete_prob(lp); }
  };
  std::unique_ptr<glp_prob, Deleter> lp_;
  int columns_ = 0;
  bool warm_ = false;
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
    ASSIGN_OR_RETURN(const std::optional<size_t> type, types.Add(pod));
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
                       const std::vector<int64_t>& asked, ExperimentResult& out) {
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

  // Per pod: its LP type, the demand it could add (0 when it fits nowhere) and its bin, as BinMetrics
  // computes it from the cumulative asked demand.
  PodTypes types(node_types);
  std::vector<std::optional<size_t>> type_of(arrivals.size());
  std::vector<int64_t> placeable(arrivals.size());  // cumulative, through pod i
  std::vector<int64_t> bin(arrivals.size());
  int64_t arrived = 0;
  int64_t placeable_sum = 0;
  for (size_t i = 0; i < arrivals.size(); ++i) {
    ASSIGN_OR_RETURN(type_of[i], types.Add(*arrivals[i]));
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

  // From the top column down: the bound only shrinks with the prefix, and once a prefix fits completely
  // (the LP places all it could), so does every shorter one, whose bound is then its placeable demand.
  BoundLp lp(node_types, types.types());
  std::vector<int64_t> counts(types.types().size(), 0);
  size_t counted = 0;  // counts cover pods [0, counted)
  std::optional<size_t> fits_through;
  std::map<size_t, double> solved;  // prefix end -> bound (columns may share a last row)
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
        if (type_of[counted]) lp.SetCount(*type_of[counted], --counts[*type_of[counted]]);
      }
      while (counted < *end + 1) {
        if (type_of[counted]) lp.SetCount(*type_of[counted], ++counts[*type_of[counted]]);
        ++counted;
      }
      ASSIGN_OR_RETURN(const double lp_milli, lp.Solve());
      value = Clamp(lp_milli, placeable[*end]);
      solved[*end] = value;
      if (value == static_cast<double>(placeable[*end]))
        fits_through = std::max(fits_through.value_or(0), *end);
    }
    out.alloc[cell] = NpRound2(PyRound2(value / tg / 10.0));
  }

  out.total_gpus = total_gpus;
  out.pods_arrived = static_cast<int64_t>(arrivals.size());
  out.arrived_gpu_milli = arrived;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return Status::Ok();
}

}  // namespace gpupool
