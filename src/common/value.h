// A small tree of plain values (null, bool, int, double, string, list, map) used for plugin
// arguments. Config readers (YAML, JSON) convert into it at the edge, so the scheduling core
// never depends on a parser library.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/status.h"

namespace gpupool {

class Value {
 public:
  using List = std::vector<Value>;
  using Map = std::vector<std::pair<std::string, Value>>;  // keeps insertion order

  Value() = default;
  Value(bool b) : data_(b) {}                       // NOLINT
  Value(int64_t i) : data_(i) {}                    // NOLINT
  Value(int i) : data_(static_cast<int64_t>(i)) {}  // NOLINT
  Value(double d) : data_(d) {}                     // NOLINT
  Value(std::string s) : data_(std::move(s)) {}     // NOLINT
  Value(const char* s) : data_(std::string(s)) {}   // NOLINT
  Value(List l) : data_(std::move(l)) {}            // NOLINT
  Value(Map m) : data_(std::move(m)) {}             // NOLINT

  bool is_null() const { return std::holds_alternative<std::monostate>(data_); }
  bool is_map() const { return std::holds_alternative<Map>(data_); }
  bool is_list() const { return std::holds_alternative<List>(data_); }
  bool is_string() const { return std::holds_alternative<std::string>(data_); }

  // Member of a map, or nullptr when absent or when this is not a map.
  const Value* Find(const std::string& key) const;
  // Adds or replaces a member. Turns a null value into a map first.
  void Set(const std::string& key, Value v);

  // Typed reads; `what` names the value in the error ("fgd.typicalPods[3].cpu").
  Result<int64_t> AsInt(const std::string& what) const;    // accepts integral doubles
  Result<double> AsDouble(const std::string& what) const;  // accepts ints
  Result<bool> AsBool(const std::string& what) const;
  Result<std::string> AsString(const std::string& what) const;
  const List* AsList() const { return std::get_if<List>(&data_); }
  const Map* AsMap() const { return std::get_if<Map>(&data_); }

  std::string TypeName() const;

 private:
  std::variant<std::monostate, bool, int64_t, double, std::string, List, Map> data_;
};

}  // namespace gpupool
