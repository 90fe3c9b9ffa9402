// GLPK helpers shared by the simulator's solvers (sim/bound.cc, sim/repack.cc).
#pragma once

#include <glpk.h>

#include <memory>

namespace gpupool {

// GLPK keeps one environment per thread (the Debian build uses thread-local storage, so sweep workers
// do not share it). It is silenced for a computation and freed at the end, so a finished sweep
// thread leaves nothing behind. Each computation that uses GLPK opens one scope and creates every
// GLPK object inside it; scopes are never nested, so no GLPK object outlives its scope.
class GlpkScope {
 public:
  GlpkScope() { glp_term_out(GLP_OFF); }
  ~GlpkScope() { glp_free_env(); }
  GlpkScope(const GlpkScope&) = delete;
  GlpkScope& operator=(const GlpkScope&) = delete;
};

// A GLPK problem, deleted with its owner.
struct GlpProbDeleter {
  void operator()(glp_prob* lp) const { glp_delete_prob(lp); }
};
using GlpProb = std::unique_ptr<glp_prob, GlpProbDeleter>;

}  // namespace gpupool
