#include "config/profile_yaml.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>

namespace gpupool {

namespace {

Value ScalarValue(const YAML::Node& n) {
  const std::string& s = n.Scalar();
  if (n.Tag() == "!") return Value(s);  // quoted: a string
  if (s == "true" || s == "True") return Value(true);
  if (s == "false" || s == "False") return Value(false);
  if (s == "~" || s == "null") return Value();
  try {
    size_t pos = 0;
    const long long i = std::stoll(s, &pos);
    if (pos == s.size()) return Value(static_cast<int64_t>(i));
  } catch (const std::exception&) {
  }
  try {
    size_t pos = 0;
    const double d = std::stod(s, &pos);
    if (pos == s.size()) return Value(d);
  } catch (const std::exception&) {
  }
  return Value(s);
}

Value ToValue(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Scalar: return ScalarValue(n);
    case YAML::NodeType::Sequence: {
      Value::List list;
      for (const auto& item : n) list.push_back(ToValue(item));
      return Value(std::move(list));
    }
    case YAML::NodeType::Map: {
      Value::Map map;
      for (const auto& kv : n) map.emplace_back(kv.first.as<std::string>(), ToValue(kv.second));
      return Value(std::move(map));
    }
    default: return Value();
  }
}

Result<PluginRef> ToPluginRef(const Value& v, const std::string& where) {
  PluginRef ref;
  if (v.is_string()) {
    ref.name = *v.AsString(where);
    return ref;
  }
  if (!v.is_map()) return Status::InvalidArgument(where + " must be a plugin name or a map with 'name'");
  for (const auto& [key, field] : *v.AsMap()) {
    if (key == "name") {
      ASSIGN_OR_RETURN(ref.name, field.AsString(where + ".name"));
    } else if (key == "weight") {
      ASSIGN_OR_RETURN(ref.weight, field.AsInt(where + ".weight"));
      if (ref.weight < 1) return Status::InvalidArgument(fmt::format("{}.weight must be at least 1", where));
    } else if (key == "args") {
      ref.args = field;
    } else {
      return Status::InvalidArgument(fmt::format("{}: unknown key '{}' (name, weight, args)", where, key));
    }
  }
  if (ref.name.empty()) return Status::InvalidArgument(where + " has no 'name'");
  return ref;
}

Result<std::vector<PluginRef>> ToPluginList(const Value& v, const std::string& where) {
  const Value::List* list = v.AsList();
  if (list == nullptr) return Status::InvalidArgument(where + " must be a list");
  std::vector<PluginRef> out;
  for (size_t i = 0; i < list->size(); ++i) {
    ASSIGN_OR_RETURN(PluginRef ref, ToPluginRef((*list)[i], fmt::format("{}[{}]", where, i)));
    out.push_back(std::move(ref));
  }
  return out;
}

}  // namespace

Result<Value> ParseYamlValue(const std::string& text, const std::string& source) {
  try {
    return ToValue(YAML::Load(text));
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(
        fmt::format("{}: line {}, column {}: {}", source, e.mark.line + 1, e.mark.column + 1, e.msg));
  }
}

Result<Profile> ParseProfileYaml(const std::string& text, const std::string& source) {
  ASSIGN_OR_RETURN(Value root, ParseYamlValue(text, source));
  if (!root.is_map()) return Status::InvalidArgument(source + ": a profile must be a YAML map");
  Profile p;
  for (const auto& [key, v] : *root.AsMap()) {
    if (key == "name") {
      ASSIGN_OR_RETURN(p.name, v.AsString(source + ": name"));
    } else if (key == "filters") {
      ASSIGN_OR_RETURN(p.filters, ToPluginList(v, source + ": filters"));
    } else if (key == "scores") {
      ASSIGN_OR_RETURN(p.scores, ToPluginList(v, source + ": scores"));
    } else if (key == "gpuSelector") {
      ASSIGN_OR_RETURN(p.gpu_selector, ToPluginRef(v, source + ": gpuSelector"));
    } else if (key == "permits") {
      ASSIGN_OR_RETURN(p.permits, ToPluginList(v, source + ": permits"));
    } else if (key == "skipScoringSingleNode") {
      ASSIGN_OR_RETURN(p.skip_scoring_single_node, v.AsBool(source + ": skipScoringSingleNode"));
    } else if (key == "cacheScores") {
      ASSIGN_OR_RETURN(p.cache_scores, v.AsBool(source + ": cacheScores"));
    } else {
      return Status::InvalidArgument(
          fmt::format("{}: unknown key '{}' (name, filters, scores, gpuSelector, permits, "
                      "skipScoringSingleNode, cacheScores)",
                      source, key));
    }
  }
  return p;
}

Result<Profile> LoadProfileFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::IoError(fmt::format("cannot read profile '{}'", path));
  std::stringstream buf;
  buf << in.rdbuf();
  return ParseProfileYaml(buf.str(), path);
}

}  // namespace gpupool
