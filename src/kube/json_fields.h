// Reading fields of untrusted Kubernetes objects without exceptions (internal to src/kube): a field
// that is missing, of another type, or under a non-object reads as null or "".
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace gpupool::kube::json_fields {

// obj[key], or null when obj is not an object or has no such key.
inline const nlohmann::json& At(const nlohmann::json& obj, const char* key) {
  static const nlohmann::json kNull;
  if (!obj.is_object()) return kNull;
  const auto it = obj.find(key);
  return it == obj.end() ? kNull : *it;
}

// A string field's text; "" for anything else, and for text over 1 KiB (no name, UID or setting
// gpupool reads this way is longer).
inline std::string Str(const nlohmann::json& v) {
  return v.is_string() && v.get_ref<const std::string&>().size() <= 1024 ? v.get<std::string>() : std::string();
}

}  // namespace gpupool::kube::json_fields
