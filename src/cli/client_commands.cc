#include "cli/client_commands.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <tuple>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include "client/api_client.h"

namespace gpupool {

namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::system_clock;

constexpr std::string_view kJsonType = "application/json";
constexpr std::string_view kYamlType = "application/yaml";

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

// Aligned columns, three spaces apart, no trailing blanks.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void Add(std::vector<std::string> row) {
    row.resize(rows_.front().size());
    rows_.push_back(std::move(row));
  }
  void Print(std::ostream& out) const {
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

 private:
  std::vector<std::vector<std::string>> rows_;
};

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

// ---- requests ---------------------------------------------------------------

enum class Method { kGet, kPost, kPut, kDelete };

// The JSON body of a successful answer, or the exit code after the error went to `err`.
struct Answer {
  int exit = kExitOk;
  Json body;
};

int ExitForStatus(const Status& st) {
  switch (st.code()) {
    case StatusCode::kIoError: return kExitUnavailable;
    case StatusCode::kInvalidArgument: return kExitUsage;
    default: return kExitError;
  }
}

Answer Fail(std::ostream& err, int code, std::string_view message) {
  PrintError(err, message);
  return {code, nullptr};
}

// Every request of a command goes where, and authenticated as, the options say, with their TLS
// settings (before, commands other than `run` dropped the CA file and the client certificate).
ClientConfig ClientConfigFor(const CommandOptions& options) {
  ClientConfig config;
  config.server = options.server;
  config.token = options.token;
  config.ca_file = options.ca_file;
  config.client_cert_file = options.client_cert_file;
  config.client_key_file = options.client_key_file;
  return config;
}

Answer Call(const CommandOptions& options, std::ostream& err, Method method, const std::string& path,
            const QueryParams& query = {}, const std::string& body = {},
            std::string_view content_type = kJsonType) {
  Result<ApiClient> client = ApiClient::Create(ClientConfigFor(options));
  if (!client.ok()) return Fail(err, ExitForStatus(client.status()), client.status().message());

  const std::string target = WithQuery(path, query);
  Result<HttpReply> reply = Status::Internal("no request");
  switch (method) {
    case Method::kGet: reply = client->Get(target); break;
    case Method::kPost: reply = client->Post(target, body, content_type); break;
    case Method::kPut: reply = client->Put(target, body, content_type); break;
    case Method::kDelete: reply = client->Delete(target); break;
  }
  if (!reply.ok()) return Fail(err, ExitForStatus(reply.status()), reply.status().message());

  const int code = ExitCodeForHttpStatus(reply->status);
  if (code != kExitOk) return Fail(err, code, ErrorMessage(*reply));
  if (!reply->is_json) {
    if (Trim(reply->body).empty()) return {kExitOk, Json::object()};
    return Fail(err, kExitError, fmt::format("the server's answer (HTTP {}) is not JSON", reply->status));
  }
  return {kExitOk, std::move(reply->json)};
}

// Lists: the page as it came, or with `all` every page merged into the first, without
// nextPageToken.
Answer FetchList(const CommandOptions& options, std::ostream& err, const std::string& path,
                 const QueryParams& query, std::string page_token, bool all) {
  Answer merged;
  Json items = Json::array();
  std::set<std::string> seen;
  bool first = true;
  for (;;) {
    QueryParams q = query;
    if (!page_token.empty()) q.emplace_back("pageToken", page_token);
    Answer page = Call(options, err, Method::kGet, path, q);
    if (page.exit != kExitOk) return page;
    const Json* page_items = Member(page.body, "items");
    if (page_items == nullptr || !page_items->is_array()) {
      return Fail(err, kExitError, fmt::format("the server's answer to GET {} has no items list", path));
    }
    if (!all) return page;
    for (const Json& item : *page_items) items.push_back(item);
    const std::string next = String(page.body, "nextPageToken");
    if (first) {
      merged = std::move(page);
      first = false;
    }
    if (next.empty()) break;
    if (!seen.insert(next).second) {
      return Fail(err, kExitError, fmt::format("the server repeated the page token '{}'", next));
    }
    page_token = next;
  }
  merged.body["items"] = std::move(items);
  merged.body.erase("nextPageToken");
  return merged;
}

std::string JobPath(const std::string& id) {
  return "/api/v1/jobs/" + PercentEncode(id);
}
std::string NodePath(const std::string& name) {
  return "/api/v1/nodes/" + PercentEncode(name);
}
std::string QueuePath(const std::string& name) {
  return "/api/v1/queues/" + PercentEncode(name);
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

// ---- input ------------------------------------------------------------------

// "cpu=64,memory=512Gi,gpu=8" -> {"cpu": "64", "memory": "512Gi", "gpu": 8}; "" -> {}.
// gpu is a number (fractions allowed), the others are quantities sent as strings.
Result<Json> ParseResources(std::string_view flag, std::string_view text) {
  Json map = Json::object();
  if (Trim(text).empty()) return map;
  const auto bad = [&](std::string_view why) {
    return Status::InvalidArgument(
        fmt::format("{} '{}': {} (expected e.g. cpu=64,memory=512Gi,gpu=8)", flag, text, why));
  };
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = Trim(text.substr(start, comma - start));
    start = comma + 1;
    if (item.empty()) return bad("empty item");
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) return bad(fmt::format("'{}' is not resource=quantity", item));
    const std::string key(Trim(item.substr(0, eq)));
    const std::string_view value = Trim(item.substr(eq + 1));
    if (key.empty() || value.empty()) return bad(fmt::format("'{}' is not resource=quantity", item));
    if (map.contains(key)) return bad(fmt::format("'{}' given twice", key));
    if (key == "gpu") {
      double gpus = 0;
      const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), gpus);
      if (ec != std::errc() || ptr != value.data() + value.size() || !std::isfinite(gpus)) {
        return bad(fmt::format("gpu '{}' is not a number of GPUs", value));
      }
      if (gpus == std::floor(gpus) && std::fabs(gpus) < 1e15) {
        map[key] = static_cast<int64_t>(gpus);
      } else {
        map[key] = gpus;
      }
    } else {
      map[key] = std::string(value);
    }
  }
  return map;
}

Json WeightJson(double weight) {
  if (weight == std::floor(weight) && std::fabs(weight) < 1e15) return static_cast<int64_t>(weight);
  return weight;
}

Result<std::string> ReadInput(const std::string& file, std::istream& in) {
  std::ostringstream text;
  if (file == "-") {
    text << in.rdbuf();
    if (in.bad()) return Status::InvalidArgument("cannot read the job spec from stdin");
    return text.str();
  }
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) return Status::InvalidArgument(file + ": is a directory");
  std::ifstream f(file, std::ios::binary);
  if (!f) return Status::InvalidArgument(fmt::format("cannot open {}: {}", file, std::strerror(errno)));
  text << f.rdbuf();
  if (f.bad()) return Status::InvalidArgument(fmt::format("cannot read {}", file));
  return text.str();
}

std::string_view SpecContentType(const std::string& file, std::string_view body) {
  if (file != "-") {
    const std::string ext = Lower(std::filesystem::path(file).extension().string());
    if (ext == ".json") return kJsonType;
    if (ext == ".yaml" || ext == ".yml") return kYamlType;
  }
  std::string_view rest = body;
  if (rest.substr(0, 3) == "\xEF\xBB\xBF") rest.remove_prefix(3);
  rest = Trim(rest);
  if (!rest.empty() && (rest.front() == '{' || rest.front() == '[') && Json::accept(rest)) return kJsonType;
  return kYamlType;
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

}  // namespace

// ---- commands -----------------------------------------------------------------

int SubmitJob(const CommandOptions& options, const std::string& file, std::istream& in, std::ostream& out,
              std::ostream& err) {
  return Guard(err, [&] {
    Result<std::string> body = ReadInput(file, in);
    if (!body.ok()) return Fail(err, kExitUsage, body.status().message()).exit;
    if (Trim(*body).empty()) {
      return Fail(err, kExitUsage, fmt::format("{} is empty", file == "-" ? "stdin" : file)).exit;
    }
    const std::string_view type = SpecContentType(file, *body);
    Answer a = Call(options, err, Method::kPost, "/api/v1/jobs", {}, *body, type);
    if (a.exit != kExitOk) return a.exit;
    return PrintObject(options, a.body, out, err, [](const Json& job, std::ostream& o) {
      o << fmt::format("job {} submitted (state {})\n", Text(job, "id"), Text(job, "state"));
    });
  });
}

int GetJob(const CommandOptions& options, const std::string& job_id, std::ostream& out, std::ostream& err) {
  return Guard(err, [&] {
    Answer a = Call(options, err, Method::kGet, JobPath(job_id));
    if (a.exit != kExitOk) return a.exit;
    return PrintObject(options, a.body, out, err, PrintJob);
  });
}

int ListJobs(const CommandOptions& options, const ListJobsOptions& list, std::ostream& out,
             std::ostream& err) {
  return Guard(err, [&] {
    QueryParams query;
    const auto filter = [&](const char* name, const std::vector<std::string>& values) {
      if (!values.empty()) query.emplace_back(name, Join(values, ","));
    };
    filter("state", list.states);
    filter("tenant", list.tenants);
    filter("queue", list.queues);
    if (list.limit > 0) query.emplace_back("limit", std::to_string(list.limit));
    Answer a = FetchList(options, err, "/api/v1/jobs", query, list.page_token, list.all);
    if (a.exit != kExitOk) return a.exit;
    if (auto rc = PrintStructured(options, a.body, out, err)) return *rc;
    const Json& items = Array(a.body, "items");
    if (items.empty()) {
      err << "No jobs found.\n";
    } else {
      PrintJobTable(options, items, out);
    }
    PrintMoreHint(a.body, "jobs", err);
    return kExitOk;
  });
}

int CancelJob(const CommandOptions& options, const std::string& job_id, std::ostream& out,
              std::ostream& err) {
  return Guard(err, [&] {
    Answer a = Call(options, err, Method::kPost, JobPath(job_id) + "/cancel");
    if (a.exit != kExitOk) return a.exit;
    return PrintObject(options, a.body, out, err, [&](const Json& job, std::ostream& o) {
      const std::string state = Text(job, "state");
      if (state == "cancelled") {
        o << fmt::format("job {} cancelled\n", job_id);
      } else {
        o << fmt::format("job {}: cancel requested (state {})\n", job_id, state);
      }
    });
  });
}

int JobEvents(const CommandOptions& options, const EventsOptions& events, std::ostream& out,
              std::ostream& err) {
  return Guard(err, [&] {
    QueryParams query;
    if (events.after) query.emplace_back("after", std::to_string(*events.after));
    if (events.limit > 0) query.emplace_back("limit", std::to_string(events.limit));
    Answer a = Call(options, err, Method::kGet, JobPath(events.job_id) + "/events", query);
    if (a.exit != kExitOk) return a.exit;
    return PrintObject(options, a.body, out, err, [](const Json& body, std::ostream& o) {
      const Json& items = Array(body, "items");
      if (items.empty()) {
        o << "No events.\n";
      } else {
        Table t({"ID", "TIME", "TYPE", "MESSAGE"});
        for (const Json& ev : items) {
          t.Add({Text(ev, "id"), Text(ev, "time"), Text(ev, "type"), Text(ev, "message")});
        }
        t.Print(o);
      }
      const Json* pending = Member(body, "pending");
      if (pending == nullptr || !pending->is_object()) return;
      const std::string task = String(*pending, "task");
      const std::string message = String(*pending, "message");
      o << fmt::format("\nWhy pending{}: {} of {} nodes feasible{}\n",
                       task.empty() ? "" : fmt::format(" (task {})", task), Text(*pending, "feasibleNodes"),
                       Text(*pending, "totalNodes"),
                       message.empty() ? "" : fmt::format(" ({})", OneLine(message)));
      const Json& reasons = Array(*pending, "reasons");
      if (reasons.empty()) return;
      Table t({"NODES", "REASON"});
      for (const Json& r : reasons) t.Add({Text(r, "nodes"), Text(r, "reason")});
      t.Print(o);
    });
  });
}

int TaskLogs(const CommandOptions& options, const LogsOptions& logs, std::ostream& out, std::ostream& err) {
  return Guard(err, [&] {
    Result<ApiClient> client = ApiClient::Create(ClientConfigFor(options));
    if (!client.ok()) return Fail(err, ExitForStatus(client.status()), client.status().message()).exit;
    const std::string path = fmt::format("{}/tasks/{}/logs", JobPath(logs.job_id), logs.task);
    const std::string stream = logs.stderr_stream ? "stderr" : "stdout";
    int64_t offset = 0;
    for (;;) {
      const QueryParams query = {{"stream", stream}, {"offset", std::to_string(offset)}};
      Result<HttpReply> reply = client->Get(WithQuery(path, query));
      if (!reply.ok()) return Fail(err, ExitForStatus(reply.status()), reply.status().message()).exit;
      // A follower waits for a task that has not run yet (409), or whose agent has not started it
      // yet (404 from its node), instead of giving up; the job check below ends the wait.
      const bool not_yet = (reply->status == 409 || reply->status == 404) && logs.follow;
      if (reply->status != 200 && !not_yet) {
        return Fail(err, ExitCodeForHttpStatus(reply->status), ErrorMessage(*reply)).exit;
      }
      if (reply->status == 200 && !reply->body.empty()) {
        out << reply->body << std::flush;
        offset += static_cast<int64_t>(reply->body.size());
        continue;  // there may be more already
      }
      if (reply->status == 200 && reply->log_size >= 0 && reply->log_size < offset) {
        // The file is shorter than what was read: the agent rotated it (--log-max-bytes) and
        // started a new one. Follow the new file from its start.
        err << fmt::format("gpupool logs: the {} log was rotated; following the new file\n", stream) << std::flush;
        offset = 0;
        continue;
      }
      if (!logs.follow) return kExitOk;
      // Nothing new: done once the task has finished (and everything it wrote was read).
      Answer job = Call(options, err, Method::kGet, JobPath(logs.job_id));
      if (job.exit != kExitOk) return job.exit;
      const Json& tasks = Array(job.body, "tasks");
      if (logs.task < 0 || static_cast<size_t>(logs.task) >= tasks.size()) {
        return Fail(err, kExitNotFound, fmt::format("job {} has no task {}", logs.job_id, logs.task)).exit;
      }
      const std::string state = String(tasks[static_cast<size_t>(logs.task)], "state");
      if (state == "succeeded" || state == "failed" || state == "cancelled" || state == "preempted") {
        if (!not_yet) return kExitOk;
        // Finished without ever running anywhere: nothing to print.
        return Fail(err, kExitConflict, ErrorMessage(*reply)).exit;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(logs.poll_ms));
    }
  });
}

int ListNodes(const CommandOptions& options, std::ostream& out, std::ostream& err) {
  return Guard(err, [&] {
    Answer a = FetchList(options, err, "/api/v1/nodes", {}, "", /*all=*/true);
    if (a.exit != kExitOk) return a.exit;
    if (auto rc = PrintStructured(options, a.body, out, err)) return *rc;
    const Json& items = Array(a.body, "items");
    if (items.empty()) {
      err << "No nodes found.\n";
    } else {
      PrintNodeTable(items, out);
    }
    return kExitOk;
  });
}

int GetNode(const CommandOptions& options, const std::string& name, std::ostream& out, std::ostream& err) {
  return Guard(err, [&] {
    Answer a = Call(options, err, Method::kGet, NodePath(name));
    if (a.exit != kExitOk) return a.exit;
    return PrintObject(options, a.body, out, err, PrintNode);
  });
}

int ChangeNode(const CommandOptions& options, NodeAction action, const std::string& name, std::ostream& out,
               std::ostream& err) {
  return Guard(err, [&] {
    std::string_view verb = "cordon";
    std::string_view done = "cordoned";
    if (action == NodeAction::kUncordon) {
      verb = "uncordon";
      done = "uncordoned";
    } else if (action == NodeAction::kDrain) {
      verb = "drain";
      done = "draining";
    }
    Answer a = Call(options, err, Method::kPost, fmt::format("{}/{}", NodePath(name), verb));
    if (a.exit != kExitOk) return a.exit;
    return PrintObject(options, a.body, out, err,
                       [&](const Json&, std::ostream& o) { o << fmt::format("node {} {}\n", name, done); });
  });
}

int ListNodeCredentials(const CommandOptions& options, std::ostream& out, std::ostream& err) {
  return Guard(err, [&] {
    Answer a = Call(options, err, Method::kGet, "/api/v1/node-credentials");
    if (a.exit != kExitOk) return a.exit;
    if (auto rc = PrintStructured(options, a.body, out, err)) return *rc;
    const Json& items = Array(a.body, "items");
    if (items.empty()) {
      err << "No node credentials found.\n";
      return kExitOk;
    }
    Table t({"NODE", "STATE", "CREATED", "LAST USED", "REVOKED"});
    for (const Json& c : items)
      t.Add({Text(c, "node"), Text(c, "state"), Text(c, "created"), Text(c, "lastUsed"), Text(c, "revoked")});
    t.Print(out);
    return kExitOk;
  });
}

int RevokeNodeCredential(const CommandOptions& options, const std::string& name, std::ostream& out,
                         std::ostream& err) {
  return Guard(err, [&] {
    Answer a = Call(options, err, Method::kDelete, "/api/v1/node-credentials/" + PercentEncode(name));
    if (a.exit != kExitOk) return a.exit;
    return PrintObject(options, a.body, out, err, [&](const Json&, std::ostream& o) {
      o << fmt::format("node {}: credential revoked (its agent registers again with the bootstrap token)\n", name);
    });
  });
}

int ListQueues(const CommandOptions& options, std::ostream& out, std::ostream& err) {
  return Guard(err, [&] {
    Answer a = FetchList(options, err, "/api/v1/queues", {}, "", /*all=*/true);
    if (a.exit != kExitOk) return a.exit;
    if (auto rc = PrintStructured(options, a.body, out, err)) return *rc;
    const Json& items = Array(a.body, "items");
    if (items.empty()) {
      err << "No queues found.\n";
    } else {
      PrintQueueTable(items, out);
    }
    return kExitOk;
  });
}

int GetQueue(const CommandOptions& options, const std::string& name, std::ostream& out, std::ostream& err) {
  return Guard(err, [&] {
    Answer a = Call(options, err, Method::kGet, QueuePath(name));
    if (a.exit != kExitOk) return a.exit;
    return PrintObject(options, a.body, out, err, PrintQueue);
  });
}

namespace {

// Adds weight, guaranteed and limit from the flags to `body`; false after printing a usage error.
bool AddQueueFields(const QueueOptions& queue, Json* body, std::ostream& err) {
  if (queue.weight) {
    if (!std::isfinite(*queue.weight)) {
      PrintError(err, "--weight must be a finite number");
      return false;
    }
    (*body)["weight"] = WeightJson(*queue.weight);
  }
  if (queue.guaranteed) {
    Result<Json> map = ParseResources("--guaranteed", *queue.guaranteed);
    if (!map.ok()) {
      PrintError(err, map.status().message());
      return false;
    }
    (*body)["guaranteed"] = std::move(*map);
  }
  if (queue.limit) {
    Result<Json> map = ParseResources("--limit", *queue.limit);
    if (!map.ok()) {
      PrintError(err, map.status().message());
      return false;
    }
    (*body)["limit"] = std::move(*map);
  }
  // Lists and whole numbers; "" sends null, which lifts the rule. The server checks the values.
  for (const auto& [flag, key, value] :
       {std::tuple<const char*, const char*, const std::optional<std::string>*>{"--tenants", "tenants", &queue.tenants},
        {"--allowed-qos", "allowedQos", &queue.allowed_qos}}) {
    if (!*value) continue;
    if ((*value)->empty()) {
      (*body)[key] = nullptr;
      continue;
    }
    Json list = Json::array();
    std::string_view rest = **value;
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      const std::string_view item = Trim(rest.substr(0, comma));
      if (!item.empty()) list.push_back(std::string(item));
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    }
    (*body)[key] = std::move(list);
  }
  for (const auto& [flag, key, value] : {std::tuple<const char*, const char*, const std::optional<std::string>*>{
                                             "--max-priority", "maxPriority", &queue.max_priority},
                                         {"--max-pending-jobs", "maxPendingJobs", &queue.max_pending_jobs},
                                         {"--max-pending-tasks", "maxPendingTasks", &queue.max_pending_tasks}}) {
    if (!*value) continue;
    if ((*value)->empty()) {
      (*body)[key] = nullptr;
      continue;
    }
    const std::string& text = **value;
    int64_t n = 0;
    const char* first = text.data() + (text[0] == '-' ? 1 : 0);
    const auto [end, ec] = std::from_chars(first, text.data() + text.size(), n);
    if (ec != std::errc() || end != text.data() + text.size() || text.size() > 12) {
      PrintError(err, fmt::format("{} must be a whole number ('' to lift it), got '{}'", flag, text));
      return false;
    }
    (*body)[key] = text[0] == '-' ? -n : n;
  }
  return true;
}

}  // namespace

int CreateQueue(const CommandOptions& options, const QueueOptions& queue, std::ostream& out,
                std::ostream& err) {
  return Guard(err, [&] {
    Json body = Json::object();
    body["name"] = queue.name;
    if (queue.parent && !queue.parent->empty()) body["parent"] = *queue.parent;
    if (!AddQueueFields(queue, &body, err)) return kExitUsage;
    Answer a = Call(options, err, Method::kPost, "/api/v1/queues", {}, body.dump());
    if (a.exit != kExitOk) return a.exit;
    return PrintObject(options, a.body, out, err, [&](const Json&, std::ostream& o) {
      o << fmt::format("queue {} created\n", queue.name);
    });
  });
}

int UpdateQueue(const CommandOptions& options, const QueueOptions& queue, std::ostream& out,
                std::ostream& err) {
  return Guard(err, [&] {
    if (queue.parent) return Fail(err, kExitUsage, "the parent of a queue cannot change").exit;
    if (!queue.any_update()) {
      return Fail(err, kExitUsage,
                  "nothing to update: give --weight, --guaranteed, --limit, --tenants, --max-priority, "
                  "--allowed-qos, --max-pending-jobs or --max-pending-tasks")
          .exit;
    }
    Json body = Json::object();
    if (!AddQueueFields(queue, &body, err)) return kExitUsage;
    Answer current = Call(options, err, Method::kGet, QueuePath(queue.name));
    if (current.exit != kExitOk) return current.exit;
    Json merged = Json::object();
    for (const char* key : {"weight", "guaranteed", "limit", "tenants", "maxPriority", "allowedQos",
                            "maxPendingJobs", "maxPendingTasks"}) {
      if (body.contains(key)) {
        merged[key] = body[key];  // null included: it lifts the rule
      } else if (const Json* old = Member(current.body, key); old != nullptr && !old->is_null()) {
        merged[key] = *old;
      }
    }
    Answer a = Call(options, err, Method::kPut, QueuePath(queue.name), {}, merged.dump());
    if (a.exit != kExitOk) return a.exit;
    return PrintObject(options, a.body, out, err, [&](const Json&, std::ostream& o) {
      o << fmt::format("queue {} updated\n", queue.name);
    });
  });
}

// ---- CLI11 wiring -----------------------------------------------------------------

namespace {

// What `queues create|update` read, and the options that tell whether a flag was given.
struct QueueFlags {
  std::string parent;
  double weight = 1;
  std::string guaranteed;
  std::string limit;
  CLI::Option* parent_opt = nullptr;
  CLI::Option* weight_opt = nullptr;
  CLI::Option* guaranteed_opt = nullptr;
  CLI::Option* limit_opt = nullptr;
  // --tenants, --max-priority, --allowed-qos, --max-pending-jobs, --max-pending-tasks
  std::string rules[5];
  CLI::Option* rule_opts[5] = {};
};

// Where CLI11 stores what it parsed; one command runs per process, so they share the storage.
struct CliState {
  ClientFlags flags;
  std::string output = "table";
  std::string file;
  std::string id;
  std::string name;
  ListJobsOptions list;
  EventsOptions events;
  LogsOptions logs;
  int64_t after = 0;
  CLI::Option* after_opt = nullptr;
  QueueFlags create;
  QueueFlags update;
};

void AddConnectionOptions(CLI::App* cmd, CliState* s) {
  cmd->add_option("--server", s->flags.server,
                  "Server address (default: $GPUPOOL_SERVER, else http://127.0.0.1:8470)");
  cmd->add_option("--token", s->flags.token,
                  "Bearer token (default: $GPUPOOL_TOKEN, else <data dir>/admin.token)");
  cmd->add_option("--token-file", s->flags.token_file, "Read the bearer token from this file");
  cmd->add_option("-o,--output", s->output, "Output format: table, json or yaml")
      ->check(CLI::IsMember({"table", "json", "yaml"}))
      ->capture_default_str();
}

OutputFormat ParseOutput(const std::string& text) {
  if (text == "json") return OutputFormat::kJson;
  if (text == "yaml") return OutputFormat::kYaml;
  return OutputFormat::kTable;
}

// Sets the callback of `cmd`: resolve server and token, then run `body` on std::cout/std::cerr. A
// parent's callback runs after its child's; it does nothing then (`nodes get` does not list).
void OnRun(CLI::App* cmd, const std::shared_ptr<CliState>& s, int* exit_code,
           std::function<int(const CommandOptions&)> body) {
  cmd->callback([cmd, s, exit_code, body = std::move(body)] {
    if (!cmd->get_subcommands().empty()) return;
    *exit_code = Guard(std::cerr, [&] {
      Result<ClientConfig> config = ResolveClientConfig(s->flags, ProcessEnv());
      if (!config.ok()) return Fail(std::cerr, kExitUsage, config.status().message()).exit;
      if (!config->warning.empty()) std::cerr << "gpupool: " << config->warning << "\n";
      CommandOptions options;
      options.server = config->server;
      options.token = config->token;
      options.ca_file = config->ca_file;
      options.client_cert_file = config->client_cert_file;
      options.client_key_file = config->client_key_file;
      options.output = ParseOutput(s->output);
      return body(options);
    });
  });
}

QueueOptions QueueFrom(const std::string& name, const QueueFlags& f) {
  QueueOptions q;
  q.name = name;
  if (f.parent_opt != nullptr && f.parent_opt->count() > 0) q.parent = f.parent;
  if (f.weight_opt->count() > 0) q.weight = f.weight;
  if (f.guaranteed_opt->count() > 0) q.guaranteed = f.guaranteed;
  if (f.limit_opt->count() > 0) q.limit = f.limit;
  std::optional<std::string>* rules[5] = {&q.tenants, &q.max_priority, &q.allowed_qos, &q.max_pending_jobs,
                                          &q.max_pending_tasks};
  for (int i = 0; i < 5; ++i) {
    if (f.rule_opts[i]->count() > 0) *rules[i] = f.rules[i];
  }
  return q;
}

void AddQueueResourceOptions(CLI::App* cmd, QueueFlags* f) {
  f->weight_opt = cmd->add_option("--weight", f->weight, "Share of the parent's spare capacity (positive)");
  f->guaranteed_opt = cmd->add_option("--guaranteed", f->guaranteed,
                                      "Guaranteed resources, e.g. cpu=64,memory=512Gi,gpu=8 ('' for none)");
  f->limit_opt =
      cmd->add_option("--limit", f->limit, "Most resources the queue may use, same form ('' for no limit)");
  const char* names[5] = {"--tenants", "--max-priority", "--allowed-qos", "--max-pending-jobs", "--max-pending-tasks"};
  const char* help[5] = {"Tenants that may submit, e.g. vision,nlp ('' for any)",
                         "Highest priority a job may ask for ('' for no cap)",
                         "QoS classes a job may have, e.g. burstable,best-effort ('' for any)",
                         "Most pending jobs in the queue ('' for no cap)",
                         "Most tasks of pending jobs in the queue ('' for no cap)"};
  for (int i = 0; i < 5; ++i) f->rule_opts[i] = cmd->add_option(names[i], f->rules[i], help[i]);
}

}  // namespace

void RegisterClientCommands(CLI::App& app, int* exit_code) {
  auto s = std::make_shared<CliState>();
  CliState* st = s.get();

  auto* submit = app.add_subcommand("submit", "Submit a job spec (YAML or JSON) to the server");
  submit->add_option("-f,--file", st->file, "Job spec file, or - for stdin")->required();
  AddConnectionOptions(submit, st);
  OnRun(submit, s, exit_code,
        [st](const CommandOptions& o) { return SubmitJob(o, st->file, std::cin, std::cout, std::cerr); });

  auto* get = app.add_subcommand("get", "Show a job and its tasks");
  get->add_option("id", st->id, "Job id")->required();
  AddConnectionOptions(get, st);
  OnRun(get, s, exit_code, [st](const CommandOptions& o) { return GetJob(o, st->id, std::cout, std::cerr); });

  auto* list = app.add_subcommand("list", "List jobs, oldest first");
  list->add_option("--state", st->list.states, "Only jobs in these states (comma list or repeated)")
      ->allow_extra_args(false);
  list->add_option("--tenant", st->list.tenants, "Only jobs of these tenants (comma list or repeated)")
      ->allow_extra_args(false);
  list->add_option("--queue", st->list.queues, "Only jobs in these queues (comma list or repeated)")
      ->allow_extra_args(false);
  list->add_option("--limit", st->list.limit, "Jobs per page (1..1000; default: the server's, 100)")
      ->check(CLI::Range(1, 1000));
  list->add_option("--page-token", st->list.page_token, "Start at this page (nextPageToken of the last one)");
  list->add_flag("--all", st->list.all, "Follow nextPageToken and list every job");
  AddConnectionOptions(list, st);
  OnRun(list, s, exit_code,
        [st](const CommandOptions& o) { return ListJobs(o, st->list, std::cout, std::cerr); });

  auto* cancel = app.add_subcommand("cancel", "Cancel a job");
  cancel->add_option("id", st->id, "Job id")->required();
  AddConnectionOptions(cancel, st);
  OnRun(cancel, s, exit_code,
        [st](const CommandOptions& o) { return CancelJob(o, st->id, std::cout, std::cerr); });

  auto* events = app.add_subcommand("events", "Show a job's events and why it is pending");
  events->add_option("id", st->events.job_id, "Job id")->required();
  st->after_opt = events->add_option("--after", st->after, "Only events after this event id");
  events->add_option("--limit", st->events.limit, "At most this many events (1..1000)")
      ->check(CLI::Range(1, 1000));
  AddConnectionOptions(events, st);
  OnRun(events, s, exit_code, [st](const CommandOptions& o) {
    EventsOptions e = st->events;
    if (st->after_opt->count() > 0) e.after = st->after;
    return JobEvents(o, e, std::cout, std::cerr);
  });

  auto* logs = app.add_subcommand("logs", "Print a task's output, as its node's agent kept it");
  logs->add_option("id", st->logs.job_id, "Job id")->required();
  logs->add_option("--task", st->logs.task, "Task index within the job (default 0)")->check(CLI::Range(0, 999999));
  logs->add_flag("--stderr", st->logs.stderr_stream, "Print stderr instead of stdout");
  logs->add_flag("-f,--follow", st->logs.follow, "Keep printing until the task has finished");
  AddConnectionOptions(logs, st);
  OnRun(logs, s, exit_code, [st](const CommandOptions& o) { return TaskLogs(o, st->logs, std::cout, std::cerr); });

  // nodes and queues list without a subcommand.
  auto* nodes = app.add_subcommand("nodes", "List nodes, or show or act on one");
  nodes->require_subcommand(0, 1);
  AddConnectionOptions(nodes, st);
  OnRun(nodes, s, exit_code, [](const CommandOptions& o) { return ListNodes(o, std::cout, std::cerr); });

  auto* node_get = nodes->add_subcommand("get", "Show a node with its GPUs and their tasks");
  node_get->add_option("name", st->name, "Node name")->required();
  AddConnectionOptions(node_get, st);
  OnRun(node_get, s, exit_code,
        [st](const CommandOptions& o) { return GetNode(o, st->name, std::cout, std::cerr); });
  const std::pair<const char*, NodeAction> actions[] = {
      {"cordon", NodeAction::kCordon}, {"uncordon", NodeAction::kUncordon}, {"drain", NodeAction::kDrain}};
  const char* const action_help[] = {"Stop new placements on a node", "Allow placements on a node again",
                                     "Cordon a node and stop every task on it (they are requeued)"};
  for (size_t i = 0; i < std::size(actions); ++i) {
    auto* cmd = nodes->add_subcommand(actions[i].first, action_help[i]);
    cmd->add_option("name", st->name, "Node name")->required();
    AddConnectionOptions(cmd, st);
    const NodeAction action = actions[i].second;
    OnRun(cmd, s, exit_code, [st, action](const CommandOptions& o) {
      return ChangeNode(o, action, st->name, std::cout, std::cerr);
    });
  }

  auto* creds = nodes->add_subcommand("credentials", "List the node credentials the server issued (admin)");
  AddConnectionOptions(creds, st);
  OnRun(creds, s, exit_code, [](const CommandOptions& o) { return ListNodeCredentials(o, std::cout, std::cerr); });
  auto* revoke = nodes->add_subcommand("revoke", "Revoke a node's credential (admin)");
  revoke->add_option("name", st->name, "Node name")->required();
  AddConnectionOptions(revoke, st);
  OnRun(revoke, s, exit_code,
        [st](const CommandOptions& o) { return RevokeNodeCredential(o, st->name, std::cout, std::cerr); });

  auto* queues = app.add_subcommand("queues", "List queues, or show, create or update one");
  queues->require_subcommand(0, 1);
  AddConnectionOptions(queues, st);
  OnRun(queues, s, exit_code, [](const CommandOptions& o) { return ListQueues(o, std::cout, std::cerr); });

  auto* queue_get = queues->add_subcommand("get", "Show a queue");
  queue_get->add_option("name", st->name, "Queue name")->required();
  AddConnectionOptions(queue_get, st);
  OnRun(queue_get, s, exit_code,
        [st](const CommandOptions& o) { return GetQueue(o, st->name, std::cout, std::cerr); });

  auto* queue_create = queues->add_subcommand("create", "Create a queue (admin)");
  queue_create->add_option("name", st->name, "Queue name")->required();
  st->create.parent_opt = queue_create->add_option("--parent", st->create.parent,
                                                   "Parent queue (default: none, a top-level queue)");
  AddQueueResourceOptions(queue_create, &st->create);
  AddConnectionOptions(queue_create, st);
  OnRun(queue_create, s, exit_code, [st](const CommandOptions& o) {
    return CreateQueue(o, QueueFrom(st->name, st->create), std::cout, std::cerr);
  });

  auto* queue_update =
      queues->add_subcommand("update", "Change a queue's weight, guarantee or limit (admin)");
  queue_update->add_option("name", st->name, "Queue name")->required();
  AddQueueResourceOptions(queue_update, &st->update);
  AddConnectionOptions(queue_update, st);
  OnRun(queue_update, s, exit_code, [st](const CommandOptions& o) {
    return UpdateQueue(o, QueueFrom(st->name, st->update), std::cout, std::cerr);
  });
}

}  // namespace gpupool
