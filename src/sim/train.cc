#include "sim/train.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <numbers>

#include "common/rng.h"
#include "sim/experiment.h"
#include "sim/parallel.h"

namespace gpupool {

namespace {

constexpr int kColumn = 130;  // the objective's column

// The trained weights, as a vector (every field but `point`).
std::vector<double> Theta(const BalancedWeights& w) {
  BalancedWeights copy = w;
  std::vector<double> theta;
  for (double* f : copy.Fields()) {
    if (f != &copy.point) theta.push_back(*f);
  }
  return theta;
}

BalancedWeights WithTheta(const BalancedWeights& base, const std::vector<double>& theta) {
  BalancedWeights w = base;
  size_t i = 0;
  for (double* f : w.Fields()) {
    if (f != &w.point) *f = theta[i++];
  }
  return w;
}

// A standard normal draw (Box-Muller on the injected generator, so the directions are the same on
// every platform).
double Normal(Rng& rng) {
  double u = 0;
  while (u <= 0) u = rng.UniformDouble();
  const double v = rng.UniformDouble();
  return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * std::numbers::pi * v);
}

// Centred ranks of `values`: the smallest -0.5, the largest +0.5, ties share their mean rank.
std::vector<double> CentredRanks(const std::vector<double>& values) {
  const size_t n = values.size();
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return values[a] < values[b]; });
  std::vector<double> rank(n, 0);
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j + 1 < n && values[order[j + 1]] == values[order[i]]) ++j;
    const double mean = (static_cast<double>(i) + static_cast<double>(j)) / 2.0;
    for (size_t k = i; k <= j; ++k) rank[order[k]] = n > 1 ? mean / static_cast<double>(n - 1) - 0.5 : 0.0;
    i = j + 1;
  }
  return rank;
}

}  // namespace

Profile BalancedProfile(const BalancedWeights& w, const std::string& name) {
  Profile p;
  p.name = name;
  Value::Map args;
  // One set of weights for every workload: training sees exactly the weights it searches.
  args.emplace_back("adapt", Value(false));
  args.emplace_back("weights", w.ToValue());
  p.scores.push_back({"balanced", 1, Value(std::move(args))});
  p.gpu_selector = {"balanced", 1, {}};
  return p;
}

std::string FormatTrainedProfile(const TrainResult& result, const TrainOptions& options,
                                 const std::string& name, const std::string& command) {
  std::string out;
  out += fmt::format(
      "# Trained by gpupool sim train (ES over the balanced policy's weights, sim/train.h):\n#   {}\n",
      command);
  out += fmt::format(
      "# Objective, mean GPU allocation (%) at {} % arrived demand over {} trace(s) x {} seed(s): {:.4f} at "
      "the "
      "start, {:.4f} trained.\n",
      kColumn, options.traces.size(), options.seeds.size(), result.start_objective, result.best_objective);
  out += fmt::format("# {} generation(s), {} runs, {:.0f} s.\n", result.generations.size() - 1, result.runs,
                     result.seconds);
  out += fmt::format("name: {}\nscores:\n  - name: balanced\n    args:\n      adapt: false\n      weights:\n",
                     name);
  BalancedWeights w = result.weights;
  const std::vector<std::string> names = BalancedWeights::Names();
  const std::vector<double*> fields = w.Fields();
  for (size_t i = 0; i < names.size(); ++i) out += fmt::format("        {}: {}\n", names[i], *fields[i]);
  out += "gpuSelector: balanced\n";
  return out;
}

Result<TrainResult> TrainBalancedWeights(const TrainOptions& options,
                                         const std::function<void(const TrainGeneration&)>& progress) {
  const auto start = std::chrono::steady_clock::now();
  if (options.traces.empty()) return Status::InvalidArgument("train: no traces");
  if (options.seeds.empty()) return Status::InvalidArgument("train: no seeds");
  if (options.generations < 0) {
    return Status::InvalidArgument(
        fmt::format("train: generations must be >= 0, got {}", options.generations));
  }
  if (options.pairs < 1)
    return Status::InvalidArgument(fmt::format("train: pairs must be >= 1, got {}", options.pairs));
  if (!(options.sigma > 0) || !std::isfinite(options.sigma)) {
    return Status::InvalidArgument(fmt::format("train: sigma must be positive, got {}", options.sigma));
  }
  if (!(options.learning_rate > 0) || !std::isfinite(options.learning_rate)) {
    return Status::InvalidArgument(
        fmt::format("train: learning rate must be positive, got {}", options.learning_rate));
  }
  const std::filesystem::path dir(options.traces_dir);
  const std::string nodes_csv =
      options.nodes_csv.empty() ? (dir / "openb_node_list_gpu_node.csv").string() : options.nodes_csv;
  std::vector<ExperimentInputs> inputs;
  for (const std::string& trace : options.traces) {
    auto loaded = LoadExperimentInputs(nodes_csv, (dir / ("openb_pod_list_" + trace + ".csv")).string());
    if (!loaded.ok()) return loaded.status().WithContext(fmt::format("trace '{}'", trace));
    inputs.push_back(std::move(loaded).value());
  }

  TrainResult result;
  // The objective of each candidate: every (trace, seed) run, spread over the workers.
  auto evaluate = [&](const std::vector<BalancedWeights>& candidates) -> Result<std::vector<double>> {
    const size_t per = inputs.size() * options.seeds.size();
    const size_t total = candidates.size() * per;
    std::vector<double> alloc(total, 0);
    std::vector<Profile> profiles;
    for (const BalancedWeights& w : candidates) profiles.push_back(BalancedProfile(w, "train"));
    RETURN_IF_ERROR(ParallelFor(total, options.jobs, [&](size_t i) -> Status {
      const size_t c = i / per;
      const size_t t = (i % per) / options.seeds.size();
      ExperimentOptions e;
      e.trace = options.traces[t];
      e.policy = "train";
      e.seed = options.seeds[i % options.seeds.size()];
      e.inflate = options.inflate;
      e.arrival_order_dir = options.arrival_order_dir;
      e.profile = profiles[c];
      auto r = RunExperiment(inputs[t], e);
      if (!r.ok())
        return r.status().WithContext(fmt::format("training run trace={} seed={}", e.trace, e.seed));
      alloc[i] = r->alloc[kColumn];
      return Status::Ok();
    }));
    result.runs += static_cast<int64_t>(total);
    std::vector<double> objective(candidates.size(), 0);
    for (size_t c = 0; c < candidates.size(); ++c) {
      double sum = 0;
      int n = 0;
      for (size_t k = 0; k < per; ++k) {
        const double v = alloc[c * per + k];
        if (std::isnan(v)) continue;  // a column with no row
        sum += v;
        ++n;
      }
      if (n == 0) {
        return Status::InvalidArgument(
            fmt::format("train: no run reached {} % arrived demand (raise inflate)", kColumn));
      }
      objective[c] = sum / n;
    }
    return objective;
  };

  SeededRng rng(options.seed);
  std::vector<double> theta = Theta(options.start);
  const size_t d = theta.size();
  for (int g = 0; g <= options.generations; ++g) {
    // theta, then the pairs theta + sigma e_i, theta - sigma e_i (none after the last generation).
    const bool last = g == options.generations;
    std::vector<std::vector<double>> directions;
    std::vector<BalancedWeights> candidates = {WithTheta(options.start, theta)};
    if (!last) {
      for (int i = 0; i < options.pairs; ++i) {
        std::vector<double> e(d);
        for (double& x : e) x = Normal(rng);
        std::vector<double> plus = theta, minus = theta;
        for (size_t k = 0; k < d; ++k) {
          plus[k] += options.sigma * e[k];
          minus[k] -= options.sigma * e[k];
        }
        candidates.push_back(WithTheta(options.start, plus));
        candidates.push_back(WithTheta(options.start, minus));
        directions.push_back(std::move(e));
      }
    }
    ASSIGN_OR_RETURN(const std::vector<double> objective, evaluate(candidates));
    if (g == 0) {
      result.start_objective = result.best_objective = objective[0];
      result.weights = candidates[0];
    } else if (objective[0] > result.best_objective) {
      result.best_objective = objective[0];
      result.weights = candidates[0];
    }
    TrainGeneration log;
    log.generation = g;
    log.objective = objective[0];
    log.best = result.best_objective;
    log.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    result.generations.push_back(log);
    if (progress) progress(log);
    if (last) break;
    const std::vector<double> ranks =
        CentredRanks(std::vector<double>(objective.begin() + 1, objective.end()));
    std::vector<double> step(d, 0);
    for (size_t i = 0; i < directions.size(); ++i) {
      const double diff = ranks[2 * i] - ranks[2 * i + 1];
      for (size_t k = 0; k < d; ++k) step[k] += diff * directions[i][k];
    }
    const double scale =
        options.learning_rate / (2.0 * static_cast<double>(directions.size()) * options.sigma);
    for (size_t k = 0; k < d; ++k) theta[k] += scale * step[k];
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace gpupool
