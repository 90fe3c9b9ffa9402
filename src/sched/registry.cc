#include "sched/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace gpupool {

namespace {

template <typename Map, typename F>
Status Add(Map& map, const char* kind, const std::string& name, F f) {
  if (name.empty()) return Status::InvalidArgument(fmt::format("{} plugin name is empty", kind));
  if (!map.emplace(name, std::move(f)).second) {
    return Status::AlreadyExists(fmt::format("{} plugin '{}' is already registered", kind, name));
  }
  return Status::Ok();
}

template <typename Map>
std::vector<std::string> Names(const Map& map) {
  std::vector<std::string> out;
  for (const auto& [name, f] : map) out.push_back(name);
  return out;
}

template <typename T, typename Map>
Result<std::unique_ptr<T>> Make(const Map& map, const char* kind, const std::string& name, const Value& args,
                                const PluginInit& init) {
  auto it = map.find(name);
  if (it == map.end()) {
    return Status::NotFound(
        fmt::format("unknown {} plugin '{}' (known: {})", kind, name, fmt::join(Names(map), ", ")));
  }
  auto made = it->second(args, init);
  if (!made.ok()) return made.status().WithContext(fmt::format("{} plugin '{}'", kind, name));
  return made;
}

}  // namespace

Status PluginRegistry::RegisterFilter(const std::string& name, FilterFactory f) {
  return Add(filters_, "filter", name, std::move(f));
}
Status PluginRegistry::RegisterScore(const std::string& name, ScoreFactory f) {
  return Add(scores_, "score", name, std::move(f));
}
Status PluginRegistry::RegisterSelector(const std::string& name, SelectorFactory f) {
  return Add(selectors_, "GPU selector", name, std::move(f));
}
Status PluginRegistry::RegisterPermit(const std::string& name, PermitFactory f) {
  return Add(permits_, "permit", name, std::move(f));
}

Result<std::unique_ptr<FilterPlugin>> PluginRegistry::MakeFilter(const std::string& name, const Value& args,
                                                                 const PluginInit& init) const {
  return Make<FilterPlugin>(filters_, "filter", name, args, init);
}
Result<std::unique_ptr<ScorePlugin>> PluginRegistry::MakeScore(const std::string& name, const Value& args,
                                                               const PluginInit& init) const {
  return Make<ScorePlugin>(scores_, "score", name, args, init);
}
Result<std::unique_ptr<GpuSelector>> PluginRegistry::MakeSelector(const std::string& name, const Value& args,
                                                                  const PluginInit& init) const {
  return Make<GpuSelector>(selectors_, "GPU selector", name, args, init);
}
Result<std::unique_ptr<PermitPlugin>> PluginRegistry::MakePermit(const std::string& name, const Value& args,
                                                                 const PluginInit& init) const {
  return Make<PermitPlugin>(permits_, "permit", name, args, init);
}

std::vector<std::string> PluginRegistry::filter_names() const {
  return Names(filters_);
}
std::vector<std::string> PluginRegistry::score_names() const {
  return Names(scores_);
}
std::vector<std::string> PluginRegistry::selector_names() const {
  return Names(selectors_);
}
std::vector<std::string> PluginRegistry::permit_names() const {
  return Names(permits_);
}

namespace {

// All-or-nothing: the job goes ahead only when at least its gang size of tasks is reserved.
class GangPermit final : public PermitPlugin {
 public:
  std::string_view name() const override { return "gang"; }
  Status Permit(const Job& job, int placed_tasks) const override {
    if (placed_tasks >= job.gang_size()) return Status::Ok();
    return Status::Unschedulable(
        fmt::format("gang needs {} tasks placed together, only {} fit", job.gang_size(), placed_tasks));
  }
};

}  // namespace

PluginRegistry DefaultRegistry() {
  PluginRegistry r;
  RegisterFilterPlugins(r);
  RegisterSimpleScorePlugins(r);
  RegisterFgdPlugins(r);
  RegisterTopologyPlugins(r);
  RegisterBalancedPlugins(r);
  RegisterSelectorPlugins(r);
  (void)r.RegisterPermit("gang",
                         [](const Value&, const PluginInit&) -> Result<std::unique_ptr<PermitPlugin>> {
                           return std::unique_ptr<PermitPlugin>(std::make_unique<GangPermit>());
                         });
  return r;
}

}  // namespace gpupool
