// Training the balanced policy's weights in the simulator: evolution strategies (ES) over the
// weights of plugins/balanced.h, with the same scheduling code as every other run.
//
// Objective: the mean GPU allocation at 130 % arrived demand (the published column) over a grid of
// (trace, seed) runs, the training set. Each generation draws `pairs` Gaussian directions e_i and runs
// the weights theta +- sigma e_i (antithetic pairs); their objectives are replaced by centred ranks
// (in [-0.5, 0.5], so one lucky run cannot dominate) and theta moves by
//   learning_rate / (2 pairs sigma) sum_i (rank(theta + sigma e_i) - rank(theta - sigma e_i)) e_i.
// theta itself is run every generation too, and the best theta seen (the start included) is the
// result, so training never returns weights worse on the training set than it started from. All
// runs are deterministic: the same options give the same weights.
//
// The weight `point` (score units per FGD point) is the scale and is not trained; the other eight
// are, starting from the hand-made policy's values.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "sched/plugins/balanced.h"
#include "sched/profile.h"

namespace gpupool {

struct TrainOptions {
  std::string traces_dir;  // holds openb_pod_list_<trace>.csv
  std::string nodes_csv;   // empty: traces_dir/openb_node_list_gpu_node.csv
  std::vector<std::string> traces;
  std::vector<uint64_t> seeds = {42};
  std::optional<std::string> arrival_order_dir;  // as in ExperimentOptions
  double inflate = 1.3;
  int generations = 15;
  int pairs = 6;  // antithetic pairs per generation
  double sigma = 0.2;
  double learning_rate = 0.1;
  uint64_t seed = 1;  // of the directions
  int jobs = 1;       // worker threads; <= 0: the number of hardware threads
  BalancedWeights start;
};

struct TrainGeneration {
  int generation = 0;
  double objective = 0;  // of theta at the start of the generation
  double best = 0;       // best objective so far (theta's, not the perturbed runs')
  double seconds = 0;    // since training began
};

struct TrainResult {
  BalancedWeights weights;  // the best theta seen
  double start_objective = 0;
  double best_objective = 0;
  int64_t runs = 0;  // experiments run
  double seconds = 0;
  std::vector<TrainGeneration> generations;
};

// The profile that runs `w`: balanced's score with these weights, and its GPU choice.
Profile BalancedProfile(const BalancedWeights& w, const std::string& name);

// A profile YAML file (config/profile_yaml.h) that runs the trained weights, headed by comments: the
// command that trained them (`command`) and the objective before and after.
std::string FormatTrainedProfile(const TrainResult& result, const TrainOptions& options,
                                 const std::string& name, const std::string& command);

// Errors: bad options (no traces or seeds, non-positive sigma or learning rate, negative
// generations, pairs < 1), unreadable traces, a failed run (named).
Result<TrainResult> TrainBalancedWeights(const TrainOptions& options,
                                         const std::function<void(const TrainGeneration&)>& progress = {});

}  // namespace gpupool
