// A scheduling profile: which plugins run at each extension point, with weights and arguments.
// Profiles are plain data; config/profile_yaml.h reads them from YAML.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "common/value.h"

namespace gpupool {

struct PluginRef {
  std::string name;
  int64_t weight = 1;  // scores only; >= 1
  Value args;          // plugin-specific; null when none
};

struct Profile {
  std::string name = "default";
  // Empty: the default filter chain (node-unschedulable, node-resources, gpu-model, gpu-fit, mig-fit).
  std::vector<PluginRef> filters;
  std::vector<PluginRef> scores;
  PluginRef gpu_selector{"best", 1, {}};
  // Empty: the "gang" permit.
  std::vector<PluginRef> permits;
  // When exactly one node passes the filters, take it without scoring (no score plugin runs and
  // no random number is drawn), as kube-scheduler does.
  bool skip_scoring_single_node = true;
  // Cache raw scores per (node generation, task shape). Only for measuring its effect: results
  // are identical either way.
  bool cache_scores = true;
};

std::vector<std::string> DefaultFilterNames();

// The profile of a named placement policy: random, dotprod, gpuclustering, gpupacking, bestfit,
// fgd (the published policies, each with its own GPU choice), binpack, spread, topology.
Result<Profile> ProfileForPolicy(const std::string& policy);
std::vector<std::string> PolicyNames();

}  // namespace gpupool
