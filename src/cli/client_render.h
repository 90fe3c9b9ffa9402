// Shared by the client commands (client_commands.cc) and their rendering (client_render.cc):
// how answers are read (JSON access that never throws), shown (tables, fields, JSON/YAML) and how
// errors are printed. Internal to src/cli.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/client_commands.h"

namespace gpupool::cli_internal {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::system_clock;

inline constexpr std::string_view kJsonType = "application/json";
inline constexpr std::string_view kYamlType = "application/yaml";

// ---- text ----------------------------------------------------------------------------------------
std::string Join(const std::vector<std::string>& parts, std::string_view sep);
// Table cells and key/value lines stay on one line.
std::string OneLine(std::string s);
size_t DisplayWidth(std::string_view s);
// "gpupool: <message>" on `err`.
void PrintError(std::ostream& err, std::string_view message);

// ---- JSON access without exceptions ----------------------------------------------------------------
const Json* Member(const Json& j, const std::string& key);  // nullptr: absent or `j` not an object
const Json& Array(const Json& j, const std::string& key);   // an empty array unless an array
std::string String(const Json& j, const std::string& key);  // "" unless a string
std::string Text(const Json& j, const std::string& key);    // any value as display text

// ---- output ----------------------------------------------------------------------------------------
// Aligned columns, three spaces apart, no trailing blanks.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void Add(std::vector<std::string> row) {
    row.resize(rows_.front().size());
    rows_.push_back(std::move(row));
  }
  void Print(std::ostream& out) const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

// Prints `body` as JSON or YAML when one of them was asked for and gives the exit code; nullopt
// for table output, which each command renders itself.
std::optional<int> PrintStructured(const CommandOptions& options, const Json& body, std::ostream& out,
                                   std::ostream& err);
// Prints a single object: as JSON/YAML, or through `table`.
int PrintObject(const CommandOptions& options, const Json& body, std::ostream& out, std::ostream& err,
                const std::function<void(const Json&, std::ostream&)>& table);
// Runs a command body; anything thrown becomes exit 1.
int Guard(std::ostream& err, const std::function<int()>& body);
// "More <what>: add --page-token ..." when the page has a next one.
void PrintMoreHint(const Json& page, std::string_view what, std::ostream& err);

// ---- renderings ------------------------------------------------------------------------------------
void PrintJobTable(const CommandOptions& options, const Json& items, std::ostream& out);
void PrintJob(const Json& job, std::ostream& out);
void PrintNodeTable(const Json& items, std::ostream& out);
void PrintNode(const Json& node, std::ostream& out);
void PrintQueueTable(const Json& items, std::ostream& out);
void PrintQueue(const Json& q, std::ostream& out);

}  // namespace gpupool::cli_internal
