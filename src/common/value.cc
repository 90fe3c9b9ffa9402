#include "common/value.h"

#include <fmt/format.h>

#include <cmath>

namespace gpupool {

const Value* Value::Find(const std::string& key) const {
  const Map* m = AsMap();
  if (m == nullptr) return nullptr;
  for (const auto& [k, v] : *m) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Value::Set(const std::string& key, Value v) {
  if (is_null()) data_ = Map{};
  Map& m = std::get<Map>(data_);
  for (auto& [k, existing] : m) {
    if (k == key) {
      existing = std::move(v);
      return;
    }
  }
  m.emplace_back(key, std::move(v));
}

std::string Value::TypeName() const {
  switch (data_.index()) {
    case 0: return "null";
    case 1: return "bool";
    case 2: return "integer";
    case 3: return "number";
    case 4: return "string";
    case 5: return "list";
    default: return "map";
  }
}

Result<int64_t> Value::AsInt(const std::string& what) const {
  if (const auto* i = std::get_if<int64_t>(&data_)) return *i;
  if (const auto* d = std::get_if<double>(&data_)) {
    if (std::isfinite(*d) && std::floor(*d) == *d && std::fabs(*d) < 9007199254740992.0) {
      return static_cast<int64_t>(*d);
    }
  }
  return Status::InvalidArgument(fmt::format("{} must be an integer, got {}", what, TypeName()));
}

Result<double> Value::AsDouble(const std::string& what) const {
  if (const auto* d = std::get_if<double>(&data_)) return *d;
  if (const auto* i = std::get_if<int64_t>(&data_)) return static_cast<double>(*i);
  return Status::InvalidArgument(fmt::format("{} must be a number, got {}", what, TypeName()));
}

Result<bool> Value::AsBool(const std::string& what) const {
  if (const auto* b = std::get_if<bool>(&data_)) return *b;
  return Status::InvalidArgument(fmt::format("{} must be true or false, got {}", what, TypeName()));
}

Result<std::string> Value::AsString(const std::string& what) const {
  if (const auto* s = std::get_if<std::string>(&data_)) return *s;
  return Status::InvalidArgument(fmt::format("{} must be a string, got {}", what, TypeName()));
}

}  // namespace gpupool
