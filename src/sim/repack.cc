#include "sim/repack.h"

#include <fmt/format.h>
#include <glpk.h>

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "sim/glpk_scope.h"

namespace gpupool {
namespace {

constexpr int64_t kGpuMilli = 1000;
constexpr int kTimeLimitMs = 30'000;  // branch and bound; the LP bound stands in beyond it

}  // namespace

Result<RepackResult> RepackSharePods(const Ledger& ledger) {
  RepackResult r;
  std::map<int64_t, int64_t> count;  // share -> pods
  std::set<std::pair<NodeIndex, int>> gpus;
  for (const auto& [id, p] : ledger.allocations()) {
    if (!p.share_task) continue;
    for (const GpuGrant& g : p.gpus) {
      const int64_t share = g.share.units();
      if (share <= 0 || share >= kGpuMilli) {
        return Status::Internal(
            fmt::format("repack: share task {} holds {} milli-GPU of one GPU", id, share));
      }
      ++count[share];
      ++r.share_pods;
      r.share_milli += share;
      gpus.emplace(p.node, g.gpu);
    }
  }
  r.share_gpus = static_cast<int64_t>(gpus.size());
  if (count.empty()) return r;

  // Every pattern: how many pods of each share one GPU holds (at least one pod).
  std::vector<int64_t> shares, pods;
  for (const auto& [share, n] : count) {
    shares.push_back(share);
    pods.push_back(n);
  }
  const size_t k = shares.size();
  std::vector<std::vector<int>> patterns;
  std::vector<int> current(k, 0);
  bool too_many = false;
  std::function<void(size_t, int64_t)> enumerate = [&](size_t i, int64_t used) {
    if (too_many) return;
    if (i == k) {
      if (used > 0) patterns.push_back(current);
      if (static_cast<int64_t>(patterns.size()) > kMaxRepackPatterns) too_many = true;
      return;
    }
    for (int m = 0; used + m * shares[i] <= kGpuMilli && m <= pods[i]; ++m) {
      current[i] = m;
      enumerate(i + 1, used + m * shares[i]);
    }
    current[i] = 0;
  };
  enumerate(0, 0);
  if (too_many) {
    return Status::InvalidArgument(
        fmt::format("repack: more than {} per-GPU patterns of {} distinct shares", kMaxRepackPatterns, k));
  }
  r.patterns = static_cast<int64_t>(patterns.size());

  const GlpkScope scope;
  GlpProb lp(glp_create_prob());
  glp_set_obj_dir(lp.get(), GLP_MIN);
  glp_add_rows(lp.get(), static_cast<int>(k));
  for (size_t i = 0; i < k; ++i) {
    const auto n = static_cast<double>(pods[i]);
    glp_set_row_bnds(lp.get(), static_cast<int>(i + 1), GLP_LO, n, 0);  // every pod somewhere
  }
  glp_add_cols(lp.get(), static_cast<int>(patterns.size()));
  std::vector<int> ia{0}, ja{0};
  std::vector<double> ar{0};
  for (size_t p = 0; p < patterns.size(); ++p) {
    const int col = static_cast<int>(p + 1);
    glp_set_col_bnds(lp.get(), col, GLP_LO, 0, 0);
    glp_set_col_kind(lp.get(), col, GLP_IV);
    glp_set_obj_coef(lp.get(), col, 1);
    for (size_t i = 0; i < k; ++i) {
      if (patterns[p][i] == 0) continue;
      ia.push_back(static_cast<int>(i + 1));
      ja.push_back(col);
      ar.push_back(patterns[p][i]);
    }
  }
  glp_load_matrix(lp.get(), static_cast<int>(ia.size() - 1), ia.data(), ja.data(), ar.data());
  glp_smcp simplex;
  glp_init_smcp(&simplex);
  simplex.msg_lev = GLP_MSG_OFF;
  if (glp_simplex(lp.get(), &simplex) != 0 || glp_get_status(lp.get()) != GLP_OPT) {
    return Status::Internal("repack: GLPK's simplex found no optimum of the pattern LP");
  }
  // The LP optimum rounded up is a lower bound; a small tolerance keeps 1919.0000001 at 1919.
  const auto lp_bound = static_cast<int64_t>(std::ceil(glp_get_obj_val(lp.get()) - 1e-6));
  glp_iocp mip;
  glp_init_iocp(&mip);
  mip.msg_lev = GLP_MSG_OFF;
  mip.tm_lim = kTimeLimitMs;
  const int rc = glp_intopt(lp.get(), &mip);
  if (rc == 0 && glp_mip_status(lp.get()) == GLP_OPT) {
    r.min_gpus = std::llround(glp_mip_obj_val(lp.get()));
    r.optimal = true;
  } else {
    r.min_gpus = lp_bound;
    r.optimal = false;
  }
  return r;
}

}  // namespace gpupool
