// How the client shows what the server answers: tables, key/value fields, JSON and YAML, ages and
// times (see client_render.h).
#include "cli/client_render.h"

#include <exception>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <set>
#include <sstream>

#include "client/api_client.h"

namespace gpupool::cli_internal {

// ---- small text helpers -----------------------------------------------------

// Trim and Lower: client/api_client.h.

std::string Join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += sep;
    out += parts[i];
  }
  return out;
}

// Table cells and key/value lines stay on one line.
std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  return s;
}

// Width on a terminal, counting UTF-8 code points.
size_t DisplayWidth(std::string_view s) {
  return static_cast<size_t>(std::count_if(
      s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

void PrintError(std::ostream& err, std::string_view message) {
  err << "gpupool: " << message << "\n";
}

// ---- JSON access without exceptions --------------------------------------------

const Json& EmptyArray() {
  static const Json kEmpty = Json::array();
  return kEmpty;
}

const Json* Member(const Json& j, const std::string& key) {
  if (!j.is_object()) return nullptr;
  const auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

const Json& Array(const Json& j, const std::string& key) {
  const Json* v = Member(j, key);
  return v != nullptr && v->is_array() ? *v : EmptyArray();
}

std::string String(const Json& j, const std::string& key) {
  const Json* v = Member(j, key);
  return v != nullptr && v->is_string() ? v->get<std::string>() : std::string();
}

std::string Number(double d) {
  return fmt::format("{}", d);
}

std::string Text(const Json* v);

// {"cpu": "64", "gpu": 8} -> "cpu=64,gpu=8"; empty or absent -> "-".
std::string MapText(const Json* v) {
  if (v == nullptr || !v->is_object() || v->empty()) return "-";
  std::vector<std::string> parts;
  for (const auto& [key, value] : v->items()) parts.push_back(fmt::format("{}={}", key, Text(&value)));
  return Join(parts, ",");
}

// A table cell for any value; "-" for absent, null and empty.
std::string Text(const Json* v) {
  if (v == nullptr || v->is_null()) return "-";
  switch (v->type()) {
    case Json::value_t::string: {
      std::string s = v->get<std::string>();
      return s.empty() ? "-" : OneLine(std::move(s));
    }
    case Json::value_t::boolean: return v->get<bool>() ? "true" : "false";
    case Json::value_t::number_integer: return fmt::format("{}", v->get<int64_t>());
    case Json::value_t::number_unsigned: return fmt::format("{}", v->get<uint64_t>());
    case Json::value_t::number_float: return Number(v->get<double>());
    case Json::value_t::object: return MapText(v);
    case Json::value_t::array: {
      if (v->empty()) return "-";
      std::vector<std::string> parts;
      for (const Json& item : *v) parts.push_back(Text(&item));
      return Join(parts, ",");
    }
    default: return "-";
  }
}

std::string Text(const Json& j, const std::string& key) {
  return Text(Member(j, key));
}

std::string YesNo(const Json& j, const std::string& key) {
  const Json* v = Member(j, key);
  if (v == nullptr || !v->is_boolean()) return "-";
  return v->get<bool>() ? "yes" : "no";
}

// "free/capacity", e.g. "60/64".
std::string FreeOf(const Json& node, const std::string& key) {
  const Json* free = Member(node, "free");
  const Json* capacity = Member(node, "capacity");
  return fmt::format("{}/{}", Text(free != nullptr ? Member(*free, key) : nullptr),
                     Text(capacity != nullptr ? Member(*capacity, key) : nullptr));
}

// ---- times ------------------------------------------------------------------

// RFC 3339: 2026-12-02T14:00:00.123Z or with a +hh:mm / -hh:mm offset.
std::optional<Clock::time_point> ParseTime(std::string_view s) {
  const auto digits = [&](size_t pos, size_t len, int* out) {
    if (pos + len > s.size()) return false;
    int v = 0;
    for (size_t i = pos; i < pos + len; ++i) {
      if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
      v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return true;
  };
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
  if (!digits(0, 4, &year) || s.size() < 20 || s[4] != '-' || !digits(5, 2, &month) || s[7] != '-' ||
      !digits(8, 2, &day) || (s[10] != 'T' && s[10] != 't' && s[10] != ' ') || !digits(11, 2, &hour) ||
      s[13] != ':' || !digits(14, 2, &minute) || s[16] != ':' || !digits(17, 2, &second)) {
    return std::nullopt;
  }
  size_t i = 19;
  int64_t millis = 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    int n = 0;
    for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i, ++n) {
      if (n < 3) millis = millis * 10 + (s[i] - '0');
    }
    if (n == 0) return std::nullopt;
    for (; n < 3; ++n) millis *= 10;
  }
  int offset_minutes = 0;
  if (i < s.size() && (s[i] == 'Z' || s[i] == 'z') && i + 1 == s.size()) {
    offset_minutes = 0;
  } else if (i < s.size() && (s[i] == '+' || s[i] == '-') && i + 6 == s.size() && s[i + 3] == ':') {
    int oh = 0, om = 0;
    if (!digits(i + 1, 2, &oh) || !digits(i + 4, 2, &om)) return std::nullopt;
    offset_minutes = (oh * 60 + om) * (s[i] == '-' ? -1 : 1);
  } else {
    return std::nullopt;
  }
  const std::chrono::year_month_day ymd{std::chrono::year(year),
                                        std::chrono::month(static_cast<unsigned>(month)),
                                        std::chrono::day(static_cast<unsigned>(day))};
  if (!ymd.ok() || hour > 23 || minute > 59 || second > 60) return std::nullopt;
  return std::chrono::time_point_cast<Clock::duration>(
      std::chrono::sys_days(ymd) + std::chrono::hours(hour) + std::chrono::minutes(minute) +
      std::chrono::seconds(second) + std::chrono::milliseconds(millis) -
      std::chrono::minutes(offset_minutes));
}

// "45s", "12m", "3h", "5d"; "-" when the time is missing or unreadable.
std::string Age(const CommandOptions& options, const Json& object, const std::string& key) {
  const auto t = ParseTime(String(object, key));
  if (!t) return "-";
  const Clock::time_point now = options.now.value_or(Clock::now());
  const int64_t s = std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::seconds>(now - *t).count());
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m", s / 60);
  if (s < 86400) return fmt::format("{}h", s / 3600);
  return fmt::format("{}d", s / 86400);
}

// ---- output -----------------------------------------------------------------

void Table::Print(std::ostream& out) const {
  std::vector<size_t> width(rows_.front().size(), 0);
  for (const auto& row : rows_) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], DisplayWidth(row[c]));
  }
  for (const auto& row : rows_) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(width[c] - DisplayWidth(row[c]) + 3, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << "\n";
  }
}

using Fields = std::vector<std::pair<std::string, std::string>>;

// "Key:   value" lines with the values aligned three spaces after the longest key.
void PrintFields(std::ostream& out, const Fields& fields) {
  size_t width = 0;
  for (const auto& [key, value] : fields) width = std::max(width, key.size() + 1);
  for (const auto& [key, value] : fields) {
    out << key << ':' << std::string(width - key.size() - 1 + 3, ' ') << OneLine(value) << "\n";
  }
}

// Strings a YAML reader would take for something else (a number, a bool, a null, a time) are
// quoted; yaml-cpp quotes the ones that are not plain scalars at all.
bool NeedsQuotes(const std::string& s) {
  if (s.empty()) return true;
  static const std::set<std::string> kWords = {"y",     "Y",     "yes",  "Yes",  "YES",  "n",    "N",
                                               "no",    "No",    "NO",   "true", "True", "TRUE", "false",
                                               "False", "FALSE", "on",   "On",   "ON",   "off",  "Off",
                                               "OFF",   "null",  "Null", "NULL", "~",    "<<",   "="};
  if (kWords.count(s) > 0) return true;
  const auto c0 = static_cast<unsigned char>(s[0]);
  if (std::isdigit(c0)) return true;
  if ((c0 == '+' || c0 == '-' || c0 == '.') && s.size() > 1) {
    if (std::isdigit(static_cast<unsigned char>(s[1])) || s[1] == '.') return true;
    const std::string lower = Lower(s);
    if (lower == ".inf" || lower == "-.inf" || lower == "+.inf" || lower == ".nan") return true;
  }
  return false;
}

void EmitString(YAML::Emitter& e, const std::string& s) {
  if (NeedsQuotes(s)) e << YAML::DoubleQuoted;
  e << s;
}

void EmitYaml(YAML::Emitter& e, const Json& j) {
  switch (j.type()) {
    case Json::value_t::object:
      if (j.empty()) {
        e << YAML::Flow << YAML::BeginMap << YAML::EndMap;
        return;
      }
      e << YAML::BeginMap;
      for (const auto& [key, value] : j.items()) {
        e << YAML::Key;
        EmitString(e, key);
        e << YAML::Value;
        EmitYaml(e, value);
      }
      e << YAML::EndMap;
      return;
    case Json::value_t::array:
      if (j.empty()) {
        e << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
        return;
      }
      e << YAML::BeginSeq;
      for (const Json& item : j) EmitYaml(e, item);
      e << YAML::EndSeq;
      return;
    case Json::value_t::string: EmitString(e, j.get<std::string>()); return;
    case Json::value_t::boolean: e << (j.get<bool>() ? "true" : "false"); return;
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float: e << j.dump(); return;
    default: e << YAML::Null; return;
  }
}

// Prints `body` as JSON or YAML when one of them was asked for and gives the exit code; nullopt
// for table output, which each command renders itself.
std::optional<int> PrintStructured(const CommandOptions& options, const Json& body, std::ostream& out,
                                   std::ostream& err) {
  switch (options.output) {
    case OutputFormat::kJson:
      out << body.dump(2, ' ', false, Json::error_handler_t::replace) << "\n";
      return 0;
    case OutputFormat::kYaml: {
      YAML::Emitter e;
      EmitYaml(e, body);
      if (!e.good()) {
        PrintError(err, "cannot write the answer as YAML: " + e.GetLastError());
        return kExitError;
      }
      out << e.c_str() << "\n";
      return 0;
    }
    case OutputFormat::kTable: break;
  }
  return std::nullopt;
}
// ---- renderings ---------------------------------------------------------------

std::string TaskCount(const Json& job) {
  // List items carry taskCounts; a job read on its own (or from an older server) its tasks.
  const Json* counts = Member(job, "taskCounts");
  if (counts != nullptr && counts->is_object()) return fmt::format("{}/{}", Text(*counts, "running"), Text(*counts, "total"));
  const Json* tasks = Member(job, "tasks");
  if (tasks == nullptr || !tasks->is_array()) return "-";
  const auto running = std::count_if(tasks->begin(), tasks->end(),
                                     [](const Json& t) { return String(t, "state") == "running"; });
  return fmt::format("{}/{}", running, tasks->size());
}

void PrintJobTable(const CommandOptions& options, const Json& items, std::ostream& out) {
  Table t({"ID", "NAME", "TENANT", "QUEUE", "PRIO", "QOS", "STATE", "TASKS", "AGE"});
  for (const Json& job : items) {
    t.Add({Text(job, "id"), Text(job, "name"), Text(job, "tenant"), Text(job, "queue"), Text(job, "priority"),
           Text(job, "qos"), Text(job, "state"), TaskCount(job), Age(options, job, "createdAt")});
  }
  t.Print(out);
}

// "0:250,1:1000": GPU index and share of each GPU a task holds.
std::string TaskGpus(const Json& task) {
  std::vector<std::string> parts;
  for (const Json& gpu : Array(task, "gpus"))
    parts.push_back(fmt::format("{}:{}", Text(gpu, "index"), Text(gpu, "share")));
  return parts.empty() ? "-" : Join(parts, ",");
}

void PrintJob(const Json& job, std::ostream& out) {
  Fields fields = {
      {"ID", Text(job, "id")},       {"Name", Text(job, "name")},         {"Tenant", Text(job, "tenant")},
      {"Queue", Text(job, "queue")}, {"Priority", Text(job, "priority")}, {"QoS", Text(job, "qos")},
      {"State", Text(job, "state")}};
  if (!String(job, "reason").empty()) fields.emplace_back("Reason", Text(job, "reason"));
  // Fault restarts against the retry budget (docs/jobspec.md#retry), once there are any.
  const Json* faults = Member(job, "faults");
  if (faults != nullptr && faults->is_number_integer() && faults->get<int64_t>() > 0) {
    const Json* spec = Member(job, "spec");
    const Json* retry = spec != nullptr ? Member(*spec, "retry") : nullptr;
    const Json* max = retry != nullptr ? Member(*retry, "maxRestarts") : nullptr;
    fields.emplace_back("Faults", max != nullptr ? fmt::format("{} of {} restarts", Text(faults), Text(max))
                                                 : Text(faults));
  }
  if (Member(job, "notBefore") != nullptr) fields.emplace_back("Restarts at", Text(job, "notBefore"));
  // The batch basics of the spec (docs/jobspec.md): walltime and the jobs it waits for.
  if (const Json* spec = Member(job, "spec"); spec != nullptr) {
    if (const Json* limit = Member(*spec, "timeLimit"); limit != nullptr && limit->is_number_integer())
      fields.emplace_back("Time limit", fmt::format("{} s", limit->get<int64_t>()));
    std::vector<std::string> deps;
    for (const Json& d : Array(*spec, "dependsOn")) deps.push_back(fmt::format("{} ({})", Text(d, "job"), Text(d, "condition")));
    if (!deps.empty()) fields.emplace_back("Depends on", Join(deps, ", "));
  }
  fields.emplace_back("Created", Text(job, "createdAt"));
  fields.emplace_back("Updated", Text(job, "updatedAt"));
  PrintFields(out, fields);
  const Json& tasks = Array(job, "tasks");
  out << "\n";
  if (tasks.empty()) {
    out << "No tasks.\n";
    return;
  }
  Table t({"INDEX", "GROUP", "REPLICA", "STATE", "NODE", "CPU", "MEMORY", "GPUS", "EXIT", "RESTARTS"});
  for (const Json& task : tasks) {
    t.Add({Text(task, "index"), Text(task, "group"), Text(task, "replica"), Text(task, "state"),
           Text(task, "node"), Text(task, "cpu"), Text(task, "memory"), TaskGpus(task),
           Text(task, "exitCode"), Text(task, "restarts")});
  }
  t.Print(out);
  // Container tasks: the image each ran from, pinned by digest (too long for a column).
  Table images({"INDEX", "IMAGE"});
  bool any = false;
  for (const Json& task : tasks) {
    if (String(task, "image").empty()) continue;
    images.Add({Text(task, "index"), Text(task, "image")});
    any = true;
  }
  if (any) {
    out << "\n";
    images.Print(out);
  }
}

std::string NodeState(const Json& node) {
  std::string state = Text(node, "state");
  const Json* draining = Member(node, "draining");
  if (draining != nullptr && draining->is_boolean() && draining->get<bool>()) state += ",draining";
  return state;
}

void PrintNodeTable(const Json& items, std::ostream& out) {
  Table t({"NAME", "STATE", "GPUS", "FREE-SHARE", "CPU-FREE", "MEM-FREE", "CORDONED"});
  for (const Json& node : items) {
    const Json* capacity = Member(node, "capacity");
    t.Add({Text(node, "name"), NodeState(node),
           Text(capacity != nullptr ? Member(*capacity, "gpus") : nullptr), FreeOf(node, "gpuShare"),
           FreeOf(node, "cpu"), FreeOf(node, "memory"), YesNo(node, "cordoned")});
  }
  t.Print(out);
}

void PrintNode(const Json& node, std::ostream& out) {
  PrintFields(out, {{"Name", Text(node, "name")},
                    {"State", Text(node, "state")},
                    {"Cordoned", YesNo(node, "cordoned")},
                    {"Draining", YesNo(node, "draining")},
                    {"Labels", Text(node, "labels")},
                    {"Last heartbeat", Text(node, "lastHeartbeat")},
                    {"Capacity", Text(node, "capacity")},
                    {"Free", Text(node, "free")}});
  const Json& gpus = Array(node, "gpus");
  out << "\n";
  if (gpus.empty()) {
    out << "No GPUs.\n";
    return;
  }
  Table t({"INDEX", "MODEL", "MEMORY", "HEALTHY", "MIG", "FREE-SHARE", "FREE-MEM", "TASKS"});
  for (const Json& gpu : gpus) {
    std::vector<std::string> tasks;
    for (const Json& task : Array(gpu, "tasks")) {
      tasks.push_back(fmt::format("{}[{}]:{}", Text(task, "job"), Text(task, "index"), Text(task, "share")));
    }
    // Why a GPU takes no placements: its fault, or that it runs hot.
    std::string healthy = YesNo(gpu, "healthy");
    if (Member(gpu, "fault") != nullptr) {
      healthy = "no: " + Text(gpu, "fault");
    } else if (Member(gpu, "hotReason") != nullptr) {
      healthy = "hot: " + Text(gpu, "hotReason");
    }
    t.Add({Text(gpu, "index"), Text(gpu, "model"), Text(gpu, "memory"), healthy,
           YesNo(gpu, "migEnabled"), Text(gpu, "freeShare"), Text(gpu, "freeMemory"),
           tasks.empty() ? "-" : Join(tasks, ",")});
  }
  t.Print(out);
}

void PrintQueueTable(const Json& items, std::ostream& out) {
  Table t({"NAME", "PARENT", "WEIGHT", "GUARANTEED", "LIMIT", "USED", "PENDING", "RUNNING"});
  for (const Json& q : items) {
    t.Add({Text(q, "name"), Text(q, "parent"), Text(q, "weight"), Text(q, "guaranteed"), Text(q, "limit"),
           Text(q, "used"), Text(q, "pending"), Text(q, "running")});
  }
  t.Print(out);
}

void PrintQueue(const Json& q, std::ostream& out) {
  PrintFields(out, {{"Name", Text(q, "name")},
                    {"Parent", Text(q, "parent")},
                    {"Weight", Text(q, "weight")},
                    {"Guaranteed", Text(q, "guaranteed")},
                    {"Limit", Text(q, "limit")},
                    {"Used", Text(q, "used")},
                    {"Pending", Text(q, "pending")},
                    {"Running", Text(q, "running")}});
}

void PrintMoreHint(const Json& page, std::string_view what, std::ostream& err) {
  const std::string next = String(page, "nextPageToken");
  if (!next.empty())
    err << fmt::format("More {}: add --page-token {} for the next page, or --all.\n", what, next);
}

// Prints a single object: as JSON/YAML, or through `table`.
int PrintObject(const CommandOptions& options, const Json& body, std::ostream& out, std::ostream& err,
                const std::function<void(const Json&, std::ostream&)>& table) {
  if (auto rc = PrintStructured(options, body, out, err)) return *rc;
  table(body, out);
  return kExitOk;
}


// Runs a command body; anything thrown becomes exit 1.
int Guard(std::ostream& err, const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& ex) {
    PrintError(err, ex.what());
  } catch (...) {
    PrintError(err, "unexpected error");
  }
  return kExitError;
}

}  // namespace gpupool::cli_internal
