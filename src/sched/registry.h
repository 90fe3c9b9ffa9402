// Plugins by name. A registry maps names to factories; a profile names the plugins it wants.
// Build one with DefaultRegistry() (all built-in plugins) and add your own with Register*.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/value.h"
#include "sched/framework.h"
#include "sched/typical_pods.h"

namespace gpupool {

// What a factory gets besides its own arguments.
struct PluginInit {
  // The workload the fragmentation-aware plugins measure against when their arguments give none
  // (the simulator passes the trace's typical pods).
  const std::vector<TypicalPod>* typical_pods = nullptr;
};

using FilterFactory =
    std::function<Result<std::unique_ptr<FilterPlugin>>(const Value& args, const PluginInit&)>;
using ScoreFactory =
    std::function<Result<std::unique_ptr<ScorePlugin>>(const Value& args, const PluginInit&)>;
using SelectorFactory =
    std::function<Result<std::unique_ptr<GpuSelector>>(const Value& args, const PluginInit&)>;
using PermitFactory =
    std::function<Result<std::unique_ptr<PermitPlugin>>(const Value& args, const PluginInit&)>;

class PluginRegistry {
 public:
  Status RegisterFilter(const std::string& name, FilterFactory f);
  Status RegisterScore(const std::string& name, ScoreFactory f);
  Status RegisterSelector(const std::string& name, SelectorFactory f);
  Status RegisterPermit(const std::string& name, PermitFactory f);

  Result<std::unique_ptr<FilterPlugin>> MakeFilter(const std::string& name, const Value& args,
                                                   const PluginInit& init) const;
  Result<std::unique_ptr<ScorePlugin>> MakeScore(const std::string& name, const Value& args,
                                                 const PluginInit& init) const;
  Result<std::unique_ptr<GpuSelector>> MakeSelector(const std::string& name, const Value& args,
                                                    const PluginInit& init) const;
  Result<std::unique_ptr<PermitPlugin>> MakePermit(const std::string& name, const Value& args,
                                                   const PluginInit& init) const;

  std::vector<std::string> filter_names() const;
  std::vector<std::string> score_names() const;
  std::vector<std::string> selector_names() const;
  std::vector<std::string> permit_names() const;

 private:
  std::map<std::string, FilterFactory> filters_;
  std::map<std::string, ScoreFactory> scores_;
  std::map<std::string, SelectorFactory> selectors_;
  std::map<std::string, PermitFactory> permits_;
};

// Every built-in plugin:
//   filters    node-unschedulable, node-resources, gpu-model, gpu-fit, mig-fit
//   scores     random, dotprod, gpuclustering, gpupacking, bestfit, fgd, binpack, spread, topology
//   selectors  best, random, fgd
//   permits    gang
PluginRegistry DefaultRegistry();

// Registration hooks of the plugin files (plugins/*.cc).
void RegisterFilterPlugins(PluginRegistry& r);
void RegisterSimpleScorePlugins(PluginRegistry& r);
void RegisterFgdPlugins(PluginRegistry& r);
void RegisterTopologyPlugins(PluginRegistry& r);
void RegisterBalancedPlugins(PluginRegistry& r);
void RegisterSelectorPlugins(PluginRegistry& r);

}  // namespace gpupool
