#include "server/resources_json.h"

#include <yaml-cpp/yaml.h>

#include <cmath>

#include "common/quantity.h"

namespace gpupool {

Result<Resources> ParseResourceMap(const nlohmann::json& j, const std::string& field, int64_t absent) {
  Resources r{absent, absent, absent};
  if (j.is_null()) return r;
  if (!j.is_object()) return Status::InvalidArgument(field + ": must be a map of cpu, memory and gpu");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = it.key();
    const nlohmann::json& v = it.value();
    const std::string where = field + "." + key;
    if (key == "cpu") {
      std::string text = v.is_string() ? v.get<std::string>() : v.is_number() ? v.dump() : "";
      if (text.empty())
        return Status::InvalidArgument(where + ": must be a number of cores or a string like \"500m\"");
      auto cpu = ParseCpu(text);
      if (!cpu.ok()) return Status::InvalidArgument(where + ": " + cpu.status().message());
      if (cpu->units() < 0) return Status::InvalidArgument(where + ": must not be negative");
      r.cpu = cpu->units();
    } else if (key == "memory") {
      if (!v.is_string())
        return Status::InvalidArgument(where + ": must be a string with a unit, like \"512Gi\"");
      auto mem = ParseMemory(v.get<std::string>());
      if (!mem.ok()) return Status::InvalidArgument(where + ": " + mem.status().message());
      if (mem->units() < 0) return Status::InvalidArgument(where + ": must not be negative");
      r.memory = mem->units();
    } else if (key == "gpu") {
      if (!v.is_number()) return Status::InvalidArgument(where + ": must be a number of GPUs, like 2.5");
      const double g = v.get<double>();
      if (!std::isfinite(g) || g < 0 || g > 1e6)
        return Status::InvalidArgument(where + ": must be between 0 and 1000000 GPUs");
      r.gpu = static_cast<int64_t>(std::llround(g * 1000));
    } else {
      return Status::InvalidArgument(where + ": unknown resource (known: cpu, memory, gpu)");
    }
  }
  return r;
}

nlohmann::json ResourceMapJson(const Resources& r) {
  nlohmann::json j = nlohmann::json::object();
  if (r.cpu != kUnlimited) j["cpu"] = FormatCpu(MilliCpu(r.cpu));
  if (r.memory != kUnlimited) j["memory"] = FormatMemory(MiB(r.memory));
  if (r.gpu != kUnlimited) j["gpu"] = static_cast<double>(r.gpu) / 1000.0;
  return j;
}

namespace {

nlohmann::json Convert(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined: return nullptr;
    case YAML::NodeType::Sequence: {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& e : n) a.push_back(Convert(e));
      return a;
    }
    case YAML::NodeType::Map: {
      nlohmann::json o = nlohmann::json::object();
      for (const auto& kv : n) o[kv.first.as<std::string>()] = Convert(kv.second);
      return o;
    }
    case YAML::NodeType::Scalar: {
      const std::string& s = n.Scalar();
      if (n.Tag() == "!") return s;  // quoted: a string
      if (s == "true") return true;
      if (s == "false") return false;
      if (s == "null" || s == "~") return nullptr;
      int64_t i = 0;
      if (YAML::convert<int64_t>::decode(n, i)) return i;
      double d = 0;
      if (YAML::convert<double>::decode(n, d) && std::isfinite(d)) return d;
      return s;
    }
  }
  return nullptr;
}

}  // namespace

Result<nlohmann::json> YamlToJson(const std::string& text) {
  try {
    return Convert(YAML::Load(text));
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(std::string("malformed YAML: ") + e.what());
  }
}

}  // namespace gpupool
