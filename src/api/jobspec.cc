#include "api/jobspec.h"

#include <fmt/format.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <exception>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "api/fields.h"
#include "common/image_source.h"

namespace gpupool {

namespace {

using api_internal::CheckName;
using api_internal::DescribeValue;
using api_internal::FieldError;
using api_internal::FieldPath;
using api_internal::FormatNumber;
using api_internal::IndexPath;
using api_internal::IsLabelKey;
using api_internal::IsLabelValue;
using api_internal::IsPathSafeKey;
using api_internal::IsValidUtf8;
using api_internal::Json;
using api_internal::ObjectFields;
using api_internal::PrintableUtf8;
using api_internal::Quote;
using api_internal::ReadArray;
using api_internal::ReadBool;
using api_internal::ReadCpu;
using api_internal::ReadInt;
using api_internal::ReadLabels;
using api_internal::ReadMemory;
using api_internal::ReadName;
using api_internal::ReadNumber;
using api_internal::ReadString;

// ---- JSON text -> tree ----------------------------------------------------------------------

// Thrown from inside the JSON parser's callback to stop the parse with a finished error; caught
// in ParseJsonText. Never leaves this file.
struct Refusal {
  Status status;
};

// Watches the JSON parser's events: refuses duplicate member names (nlohmann would keep the last
// silently) and nesting beyond the limit, naming the field where it happens.
class JsonGuard {
 public:
  explicit JsonGuard(int max_depth) : max_depth_(max_depth) {}

  bool OnEvent(Json::parse_event_t event, const Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (static_cast<int>(frames_.size()) >= max_depth_) {
          throw Refusal{FieldError(Path(), fmt::format("nested deeper than {} levels", max_depth_))};
        }
        frames_.push_back(Frame{event == Json::parse_event_t::object_start, {}, {}, 0});
        break;
      case Json::parse_event_t::key: {
        Frame& top = frames_.back();
        const auto& key = parsed.get_ref<const std::string&>();
        top.key = key;
        if (!top.keys.insert(key).second) {
          // Path() ends before a name that cannot appear in a path; then the reason quotes it.
          throw Refusal{FieldError(Path(), IsPathSafeKey(key)
                                               ? std::string("duplicate field")
                                               : fmt::format("duplicate field {}", Quote(key)))};
        }
        break;
      }
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        frames_.pop_back();
        Advance();
        break;
      case Json::parse_event_t::value: Advance(); break;
    }
    return true;
  }

 private:
  struct Frame {
    bool object = false;
    std::set<std::string> keys;
    std::string key;   // the member being read
    size_t index = 0;  // the element being read
  };

  // An element of the innermost array is done.
  void Advance() {
    if (!frames_.empty() && !frames_.back().object) ++frames_.back().index;
  }

  // The path of the value being read. A member name that cannot appear in a path ends it there.
  std::string Path() const {
    std::string path;
    for (const Frame& f : frames_) {
      if (!f.object) {
        path = IndexPath(path, f.index);
      } else if (IsPathSafeKey(f.key)) {
        path = FieldPath(path, f.key);
      } else {
        break;
      }
    }
    return path;
  }

  int max_depth_;
  std::vector<Frame> frames_;
};

Result<Json> ParseJsonText(std::string_view text, const JobSpecLimits& limits) {
  JsonGuard guard(limits.max_depth);
  try {
    Json::parser_callback_t callback = [&guard](int /*depth*/, Json::parse_event_t event, Json& parsed) {
      return guard.OnEvent(event, parsed);
    };
    return Json::parse(text.begin(), text.end(), callback);
  } catch (const Refusal& r) {
    return r.status;
  } catch (const Json::parse_error& e) {
    // "[json.exception.parse_error.101] parse error at line 2, column 3: syntax error ..."
    std::string what = e.what();
    const size_t bracket = what.find("] ");
    if (what.rfind("[json.exception", 0) == 0 && bracket != std::string::npos)
      what = what.substr(bracket + 2);
    return FieldError("", "malformed JSON: " + PrintableUtf8(what));
  } catch (const std::exception& e) {
    return FieldError("", fmt::format("malformed JSON: {}", PrintableUtf8(e.what())));
  }
}

// ---- YAML text -> tree ----------------------------------------------------------------------

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// A plain (unquoted, untagged) YAML scalar resolved by the YAML 1.2 core schema: null, booleans,
// decimal integers and floats (with .inf and .nan); anything else is a string. yaml-cpp leaves
// this to the reader, and it decides whether `gpu: 0.25` is a number.
Json ResolvePlainScalar(const std::string& s) {
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;

  std::string_view body = s;
  bool negative = false;
  if (body.front() == '+' || body.front() == '-') {
    negative = body.front() == '-';
    body.remove_prefix(1);
  }
  if (body == ".inf" || body == ".Inf" || body == ".INF") {
    return negative ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  }
  if (s == ".nan" || s == ".NaN" || s == ".NAN") return std::numeric_limits<double>::quiet_NaN();

  // Integers: [-+]?[0-9]+.
  if (AllDigits(body)) {
    int64_t value = 0;
    const std::string signed_text = (negative ? "-" : "") + std::string(body);
    const auto [end, ec] =
        std::from_chars(signed_text.data(), signed_text.data() + signed_text.size(), value);
    if (ec == std::errc() && end == signed_text.data() + signed_text.size()) return value;
    // Too large for int64: fall through to a float, which a range check will refuse.
  }
  // Floats: [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?
  size_t i = 0;
  size_t mantissa_digits = 0;
  while (i < body.size() && body[i] >= '0' && body[i] <= '9') {
    ++i;
    ++mantissa_digits;
  }
  if (i < body.size() && body[i] == '.') {
    ++i;
    while (i < body.size() && body[i] >= '0' && body[i] <= '9') {
      ++i;
      ++mantissa_digits;
    }
  }
  if (mantissa_digits == 0) return s;
  if (i < body.size() && (body[i] == 'e' || body[i] == 'E')) {
    ++i;
    if (i < body.size() && (body[i] == '+' || body[i] == '-')) ++i;
    if (!AllDigits(body.substr(std::min(i, body.size())))) return s;
    i = body.size();
  }
  if (i != body.size()) return s;
  double value = 0;
  const auto [end, ec] = std::from_chars(body.data(), body.data() + body.size(), value);
  if (end != body.data() + body.size()) return s;
  if (ec == std::errc::result_out_of_range) {
    // Underflow reads as 0, overflow as infinity (which the readers refuse as not finite).
    const bool huge = body.find_first_of("eE") != std::string_view::npos &&
                      body.find("e-") == std::string_view::npos && body.find("E-") == std::string_view::npos;
    value = huge ? std::numeric_limits<double>::infinity() : 0.0;
  } else if (ec != std::errc()) {
    return s;
  }
  return negative ? -value : value;
}

// Builds the JSON tree the spec reader takes straight from yaml-cpp's parse events, within the
// limits. yaml-cpp's own node tree is not used: its LoadAll() can loop forever on some malformed
// input (the parser keeps reporting empty documents; found by the fuzzer), and building the tree
// here lets the limits apply while parsing instead of after.
//
// Aliases are expanded (an alias is a reference to the anchored node), so every expansion is
// charged to the value and byte budgets: that is what stops a "billion laughs" document. The
// first refusal is thrown as Refusal, which stops the parser; ParseYamlText catches it.
class YamlTreeBuilder : public YAML::EventHandler {
 public:
  explicit YamlTreeBuilder(const JobSpecLimits& limits)
      : limits_(limits), nodes_left_(limits.max_yaml_nodes), bytes_left_(limits.max_yaml_scalar_bytes) {}

  bool has_root() const { return has_root_; }
  Json TakeRoot() { return std::move(root_); }

  void OnDocumentStart(const YAML::Mark& /*mark*/) override {}
  void OnDocumentEnd() override {}

  void OnNull(const YAML::Mark& /*mark*/, YAML::anchor_t anchor) override {
    if (ExpectingKey()) throw Refusal{FieldError(Top().path, "a member name must be a string, not null")};
    Add(Json(nullptr), anchor, Cost{1, 0});
  }

  void OnAlias(const YAML::Mark& /*mark*/, YAML::anchor_t anchor) override {
    auto it = anchors_.find(anchor);
    if (it == anchors_.end())
      throw Refusal{FieldError(ChildPath(), "an alias refers to a node that is not complete")};
    const Anchored& anchored = it->second;
    if (ExpectingKey()) {
      if (!anchored.value.is_string())
        throw Refusal{FieldError(Top().path, "a member name must be a plain string")};
      Charge(anchored.cost);
      SetKey(anchored.value.get<std::string>());
      return;
    }
    Charge(anchored.cost);
    Add(anchored.value, YAML::NullAnchor, anchored.cost, /*charged=*/true);
  }

  void OnScalar(const YAML::Mark& /*mark*/, const std::string& tag, YAML::anchor_t anchor,
                const std::string& value) override {
    if (!IsValidUtf8(value)) {
      throw Refusal{FieldError(ExpectingKey() ? Top().path : ChildPath(), "is not valid UTF-8")};
    }
    if (ExpectingKey()) {
      Charge(Cost{1, static_cast<int64_t>(value.size())});
      SetKey(value);
      if (anchor != YAML::NullAnchor)
        anchors_[anchor] = Anchored{Json(value), Cost{1, static_cast<int64_t>(value.size())}};
      return;
    }
    Json resolved;
    if (tag == "?") {
      resolved = ResolvePlainScalar(value);  // plain: by its look
    } else if (tag == "!" || tag == "tag:yaml.org,2002:str") {
      resolved = value;  // quoted or !!str: a string
    } else {
      throw Refusal{FieldError(ChildPath(), fmt::format("unsupported YAML tag {}", Quote(tag)))};
    }
    Add(std::move(resolved), anchor, Cost{1, static_cast<int64_t>(value.size())});
  }

  void OnSequenceStart(const YAML::Mark& /*mark*/, const std::string& tag, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value /*style*/) override {
    Open(Json::array(), tag, "tag:yaml.org,2002:seq", anchor);
  }
  void OnSequenceEnd() override { Close(); }

  void OnMapStart(const YAML::Mark& /*mark*/, const std::string& tag, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value /*style*/) override {
    Open(Json::object(), tag, "tag:yaml.org,2002:map", anchor);
  }
  void OnMapEnd() override { Close(); }

 private:
  // Values and scalar bytes of a subtree, charged again each time an alias repeats it.
  struct Cost {
    int64_t nodes = 0;
    int64_t bytes = 0;
  };
  struct Anchored {
    Json value;
    Cost cost;
  };
  // An array or object being built.
  struct Frame {
    Json value;
    std::string path;
    YAML::anchor_t anchor = YAML::NullAnchor;
    Cost cost;                       // of the subtree so far
    std::optional<std::string> key;  // objects: the member name read, its value still to come
  };

  Frame& Top() { return stack_.back(); }
  bool ExpectingKey() const {
    return !stack_.empty() && stack_.back().value.is_object() && !stack_.back().key;
  }

  // The path of the value about to be added.
  std::string ChildPath() const {
    if (stack_.empty()) return "";
    const Frame& top = stack_.back();
    if (top.value.is_array()) return IndexPath(top.path, top.value.size());
    if (top.key && IsPathSafeKey(*top.key)) return FieldPath(top.path, *top.key);
    return top.path;
  }

  void Charge(const Cost& cost) {
    nodes_left_ -= cost.nodes;
    bytes_left_ -= cost.bytes;
    if (nodes_left_ < 0) {
      throw Refusal{
          FieldError("", fmt::format("expands to more than {} values (too many, or aliases repeated "
                                     "too often)",
                                     limits_.max_yaml_nodes))};
    }
    if (bytes_left_ < 0) {
      throw Refusal{
          FieldError("", fmt::format("expands to more than {} bytes of text (aliases repeated too often?)",
                                     limits_.max_yaml_scalar_bytes))};
    }
  }

  void SetKey(const std::string& key) {
    Frame& top = Top();
    const std::string path = IsPathSafeKey(key) ? FieldPath(top.path, key) : top.path;
    if (top.value.contains(key)) {
      throw Refusal{
          FieldError(path, IsPathSafeKey(key) ? "duplicate field" : "duplicate field " + Quote(key))};
    }
    top.key = key;
  }

  // Adds a finished value at the current position. `charged`: an alias expansion already paid for.
  void Add(Json value, YAML::anchor_t anchor, const Cost& cost, bool charged = false) {
    if (!charged) Charge(cost);
    if (anchor != YAML::NullAnchor) anchors_[anchor] = Anchored{value, cost};
    if (stack_.empty()) {
      root_ = std::move(value);
      has_root_ = true;
      return;
    }
    Frame& top = Top();
    top.cost.nodes += cost.nodes;
    top.cost.bytes += cost.bytes;
    if (top.value.is_array()) {
      top.value.push_back(std::move(value));
    } else {
      top.value.emplace(*top.key, std::move(value));
      top.key.reset();
    }
  }

  void Open(Json empty, const std::string& tag, std::string_view own_tag, YAML::anchor_t anchor) {
    if (ExpectingKey()) throw Refusal{FieldError(Top().path, "a member name must be a plain string")};
    const std::string path = ChildPath();
    if (static_cast<int>(stack_.size()) >= limits_.max_depth) {
      throw Refusal{FieldError(path, fmt::format("nested deeper than {} levels", limits_.max_depth))};
    }
    if (!(tag.empty() || tag == "?" || tag == "!" || tag == own_tag)) {
      throw Refusal{FieldError(path, fmt::format("unsupported YAML tag {}", Quote(tag)))};
    }
    Charge(Cost{1, 0});
    stack_.push_back(Frame{std::move(empty), path, anchor, Cost{1, 0}, std::nullopt});
  }

  void Close() {
    Frame done = std::move(stack_.back());
    stack_.pop_back();
    // Its values were charged as they came; pass the cost up without charging twice.
    Add(std::move(done.value), done.anchor, done.cost, /*charged=*/true);
  }

  const JobSpecLimits& limits_;
  int64_t nodes_left_;
  int64_t bytes_left_;
  std::vector<Frame> stack_;
  std::map<YAML::anchor_t, Anchored> anchors_;
  Json root_;
  bool has_root_ = false;
};

constexpr std::string_view kMoreDocuments =
    "has a second YAML document, or text after the first; send one job";

// Refuses any document after the first without reading it.
class MoreDocuments : public YAML::EventHandler {
 public:
  struct Found {};
  void OnDocumentStart(const YAML::Mark& /*mark*/) override { throw Found{}; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
  }
  void OnMapEnd() override {}
};

Result<Json> ParseYamlText(std::string_view text, const JobSpecLimits& limits) {
  try {
    std::istringstream in{std::string(text)};
    YAML::Parser parser(in);
    YamlTreeBuilder builder(limits);
    if (!parser.HandleNextDocument(builder) || !builder.has_root()) return FieldError("", "is empty");
    // One more call at most: the parser may report empty documents without end on broken input.
    MoreDocuments more;
    try {
      if (parser.HandleNextDocument(more)) return FieldError("", kMoreDocuments);
    } catch (const MoreDocuments::Found&) {
      return FieldError("", kMoreDocuments);
    }
    return builder.TakeRoot();
  } catch (const Refusal& r) {
    return r.status;
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) return FieldError("", fmt::format("malformed YAML: {}", PrintableUtf8(e.msg)));
    return FieldError("", fmt::format("malformed YAML at line {}, column {}: {}", e.mark.line + 1,
                                      e.mark.column + 1, PrintableUtf8(e.msg)));
  } catch (const std::exception& e) {
    return FieldError("", fmt::format("malformed YAML: {}", PrintableUtf8(e.what())));
  }
}

// ---- tree -> Job ----------------------------------------------------------------------------

constexpr int kMinPriority = -1000000;
constexpr int kMaxPriority = 1000000;
constexpr size_t kMaxGpuModelBytes = 128;
constexpr size_t kMaxEnvNameBytes = 256;
constexpr size_t kMaxLabelKeyBytes = 253 + 1 + 63;  // DNS prefix, '/', name
constexpr size_t kMaxLabelValueBytes = 63;

// Environment variable names, as Kubernetes allows them: [-._a-zA-Z][-._a-zA-Z0-9]*.
bool IsEnvName(std::string_view s) {
  if (s.empty() || s.size() > kMaxEnvNameBytes) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '-' || c == '.';
    if (!(alpha || (i > 0 && c >= '0' && c <= '9'))) return false;
  }
  return true;
}

// "3g", "3g.40gb", "1g.10gb+me": the shapes GpuCatalog's MIG profile names take. Whether a node's
// GPU offers the profile is the scheduler's question.
bool IsMigProfileName(std::string_view s) {
  if (s.size() < 2 || s[0] < '1' || s[0] > '7' || s[1] != 'g') return false;
  if (s.size() == 2) return true;
  if (s[2] != '.') return false;
  std::string_view rest = s.substr(3);
  if (rest.size() >= 3 && rest.substr(rest.size() - 3) == "+me") rest.remove_suffix(3);
  if (rest.size() < 3 || rest.substr(rest.size() - 2) != "gb") return false;
  const std::string_view digits = rest.substr(0, rest.size() - 2);
  return !digits.empty() && digits.size() <= 4 && AllDigits(digits);
}

constexpr int64_t kMaxTimeLimitSeconds = 365LL * 86400;
constexpr size_t kMaxDependencies = 64;

// "j-" and 1-20 digits: the server's job ids.
bool IsJobId(std::string_view s) {
  if (s.size() < 3 || s.size() > 22 || s.substr(0, 2) != "j-") return false;
  return std::all_of(s.begin() + 2, s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// A duration: whole seconds, or a string of <number><unit> parts, units d, h, m, s ("1h30m",
// "90m", "45s", "2d"); between min and max seconds.
Result<int64_t> ReadDuration(const Json& v, const std::string& path, int64_t min, int64_t max) {
  const std::string range = fmt::format("between {} s and {} s", min, max);
  if (v.is_number_integer()) {
    ASSIGN_OR_RETURN(int64_t n, ReadInt(v, path, min, max));
    return n;
  }
  if (!v.is_string())
    return FieldError(path, fmt::format("expected seconds or a duration such as \"1h30m\", got {}", DescribeValue(v)));
  const std::string& s = v.get_ref<const std::string&>();
  if (s.empty() || s.size() > 32) return FieldError(path, fmt::format("expected a duration such as \"1h30m\", got {}", Quote(s)));
  int64_t total = 0;
  size_t i = 0;
  std::string units_seen;
  while (i < s.size()) {
    size_t start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    if (i == start || i - start > 9 || i == s.size())
      return FieldError(path, fmt::format("expected a duration such as \"1h30m\", got {}", Quote(s)));
    const int64_t n = std::stoll(s.substr(start, i - start));
    const char unit = s[i++];
    const int64_t scale = unit == 'd' ? 86400 : unit == 'h' ? 3600 : unit == 'm' ? 60 : unit == 's' ? 1 : 0;
    if (scale == 0 || units_seen.find(unit) != std::string::npos)
      return FieldError(path, fmt::format("expected a duration such as \"1h30m\" (units d, h, m, s, each once), got {}", Quote(s)));
    units_seen.push_back(unit);
    total += n * scale;
    if (total > max) return FieldError(path, fmt::format("must be {}, got {}", range, Quote(s)));
  }
  if (total < min) return FieldError(path, fmt::format("must be {}, got {}", range, Quote(s)));
  return total;
}

Result<std::string> ReadAbsolutePath(const Json& v, const std::string& path, const JobSpecLimits& limits) {
  ASSIGN_OR_RETURN(std::string s, ReadString(v, path, limits.max_string_bytes));
  if (s.empty() || s.front() != '/')
    return FieldError(path, fmt::format("must be an absolute path, got {}", Quote(s)));
  return s;
}

// resources: {cpu, memory, gpu, gpuMemory, gpuModels, migProfile, gpuInterconnect}.
Status ReadResources(const Json& v, const std::string& path, const JobSpecLimits& limits, TaskRequest* r) {
  ASSIGN_OR_RETURN(
      ObjectFields f,
      ObjectFields::Read(v, path,
                         {"cpu", "memory", "gpu", "gpuMemory", "gpuModels", "migProfile", "gpuInterconnect"}));
  if (const Json* cpu = f.Get("cpu")) {
    ASSIGN_OR_RETURN(r->cpu, ReadCpu(*cpu, f.Path("cpu"), MilliCpu(limits.max_cpu_milli)));
  }
  if (const Json* memory = f.Get("memory")) {
    ASSIGN_OR_RETURN(r->memory, ReadMemory(*memory, f.Path("memory"), MiB(limits.max_memory_mib)));
  }

  const Json* gpu_field = f.Get("gpu");
  double gpu = 0;
  if (gpu_field != nullptr) {
    ASSIGN_OR_RETURN(gpu, ReadNumber(*gpu_field, f.Path("gpu")));
    if (gpu < 0)
      return FieldError(f.Path("gpu"), fmt::format("must not be negative, got {}", FormatNumber(gpu)));
  }
  if (const Json* mig = f.Get("migProfile")) {
    ASSIGN_OR_RETURN(r->mig_profile, ReadString(*mig, f.Path("migProfile"), limits.max_name_bytes));
    if (!IsMigProfileName(r->mig_profile)) {
      return FieldError(
          f.Path("migProfile"),
          fmt::format("must be a MIG profile such as \"3g.40gb\", \"1g.10gb+me\" or \"3g\", got {}",
                      Quote(r->mig_profile)));
    }
    if (gpu_field != nullptr && gpu != 1) {
      return FieldError(
          f.Path("gpu"),
          fmt::format("must be 1 or absent with migProfile (one MIG instance), got {}", FormatNumber(gpu)));
    }
    if (f.Has("gpuMemory")) {
      return FieldError(f.Path("gpuMemory"),
                        "cannot be combined with migProfile (the profile sets the memory)");
    }
    r->gpu_count = 1;
    r->gpu_share = MilliGpu(0);
  } else if (gpu == 0) {
    r->gpu_count = 0;
  } else if (gpu < 1) {
    const auto share = static_cast<int64_t>(std::llround(gpu * 1000.0));
    if (share < 1) {
      return FieldError(f.Path("gpu"),
                        fmt::format("a share of a GPU must be at least 0.001, got {}", FormatNumber(gpu)));
    }
    r->gpu_count = 1;
    r->gpu_share = MilliGpu(std::min<int64_t>(share, kWholeGpu.units()));
  } else {
    if (gpu != std::floor(gpu)) {
      return FieldError(f.Path("gpu"),
                        fmt::format("must be below 1 (a share of one GPU) or a whole number of GPUs, got {}",
                                    FormatNumber(gpu)));
    }
    if (gpu > limits.max_gpus_per_task) {
      return FieldError(f.Path("gpu"), fmt::format("must be at most {} GPUs, got {}",
                                                   limits.max_gpus_per_task, FormatNumber(gpu)));
    }
    r->gpu_count = static_cast<int>(gpu);
    r->gpu_share = kWholeGpu;
  }

  if (const Json* gpu_memory = f.Get("gpuMemory")) {
    if (!r->wants_gpu()) {
      return FieldError(f.Path("gpuMemory"), "needs gpu: GPU memory is reserved on the task's GPUs");
    }
    ASSIGN_OR_RETURN(r->gpu_memory,
                     ReadMemory(*gpu_memory, f.Path("gpuMemory"), MiB(limits.max_gpu_memory_mib)));
  }
  if (const Json* models = f.Get("gpuModels")) {
    const std::string mpath = f.Path("gpuModels");
    if (!r->wants_gpu()) return FieldError(mpath, "needs gpu or migProfile");
    ASSIGN_OR_RETURN(const Json::array_t* list,
                     ReadArray(*models, mpath, static_cast<size_t>(limits.max_gpu_models)));
    for (size_t i = 0; i < list->size(); ++i) {
      ASSIGN_OR_RETURN(std::string model, ReadString((*list)[i], IndexPath(mpath, i), kMaxGpuModelBytes));
      if (model.empty()) return FieldError(IndexPath(mpath, i), "must not be empty");
      r->gpu_models.push_back(std::move(model));
    }
  }
  if (const Json* link = f.Get("gpuInterconnect")) {
    const std::string lpath = f.Path("gpuInterconnect");
    ASSIGN_OR_RETURN(const std::string value, ReadString(*link, lpath, limits.max_name_bytes));
    if (value != "any" && value != "nvlink") {
      return FieldError(lpath, fmt::format("must be \"any\" or \"nvlink\", got {}", Quote(value)));
    }
    r->nvlink = value == "nvlink";
    if (r->nvlink && (r->gpu_count < 2 || r->wants_mig())) {
      return FieldError(lpath, fmt::format("\"nvlink\" needs gpu of 2 or more (the link joins the task's GPUs), got {}",
                                           r->wants_mig() ? std::string("a MIG profile") : FormatNumber(gpu)));
    }
  }
  return Status::Ok();
}

// The isolation a task gets when its spec names none: a MIG instance runs as MIG; whole GPUs
// exclusively; a share of one GPU under MPS when the job is guaranteed (hard compute and memory
// limits), else time-sliced; a CPU-only task exclusive, which means nothing for it.
IsolationMode DefaultIsolation(const TaskRequest& r, QosClass qos) {
  if (r.wants_mig()) return IsolationMode::kMig;
  if (r.wants_gpu() && r.gpu_share < kWholeGpu) {
    return qos == QosClass::kGuaranteed ? IsolationMode::kMps : IsolationMode::kTimeslice;
  }
  return IsolationMode::kExclusive;
}

Status CheckIsolation(const TaskGroup& g, const std::string& path) {
  const TaskRequest& r = g.request;
  const IsolationMode mode = g.exec.isolation;
  const std::string_view name = IsolationModeName(mode);
  if (r.wants_mig() && mode != IsolationMode::kMig) {
    return FieldError(
        path, fmt::format("a MIG instance (resources.migProfile) runs with isolation 'mig', not '{}'", name));
  }
  switch (mode) {
    case IsolationMode::kMig:
      if (!r.wants_mig()) return FieldError(path, "'mig' needs resources.migProfile");
      break;
    case IsolationMode::kExclusive:
      if (r.is_share()) {
        return FieldError(path,
                          "'exclusive' needs whole GPUs; a share of one GPU runs with mps or timeslice");
      }
      break;
    case IsolationMode::kMps:
    case IsolationMode::kTimeslice:
      if (!r.wants_gpu()) {
        return FieldError(path,
                          fmt::format("'{}' applies to GPU shares, and the task asks for no GPU", name));
      }
      break;
  }
  return Status::Ok();
}

Status ReadTask(const Json& v, const std::string& path, QosClass qos, const JobSpecLimits& limits,
                TaskGroup* g) {
  ASSIGN_OR_RETURN(ObjectFields f, ObjectFields::Read(v, path,
                                                      {"name", "replicas", "resources", "isolation",
                                                       "command", "env", "workingDir", "container", "checkpoint"}));
  const Json* name = f.Get("name");
  if (name == nullptr) return FieldError(f.Path("name"), "is required");
  ASSIGN_OR_RETURN(g->name, ReadName(*name, f.Path("name"), limits.max_name_bytes));
  if (const Json* replicas = f.Get("replicas")) {
    ASSIGN_OR_RETURN(int64_t n, ReadInt(*replicas, f.Path("replicas"), 1, limits.max_tasks));
    g->replicas = static_cast<int>(n);
  }
  if (const Json* resources = f.Get("resources")) {
    RETURN_IF_ERROR(ReadResources(*resources, f.Path("resources"), limits, &g->request));
  }
  if (const Json* isolation = f.Get("isolation")) {
    ASSIGN_OR_RETURN(std::string mode, ReadString(*isolation, f.Path("isolation"), limits.max_name_bytes));
    Result<IsolationMode> parsed = ParseIsolationMode(mode);
    if (!parsed.ok()) {
      return FieldError(f.Path("isolation"),
                        fmt::format("must be exclusive, mps, mig or timeslice, got {}", Quote(mode)));
    }
    g->exec.isolation = *parsed;
  } else {
    g->exec.isolation = DefaultIsolation(g->request, qos);
  }
  RETURN_IF_ERROR(CheckIsolation(*g, f.Path("isolation")));

  if (const Json* command = f.Get("command")) {
    const std::string cpath = f.Path("command");
    ASSIGN_OR_RETURN(const Json::array_t* args,
                     ReadArray(*command, cpath, static_cast<size_t>(limits.max_command_args)));
    for (size_t i = 0; i < args->size(); ++i) {
      ASSIGN_OR_RETURN(std::string arg, ReadString((*args)[i], IndexPath(cpath, i), limits.max_string_bytes));
      g->exec.command.push_back(std::move(arg));
    }
  }
  if (const Json* env = f.Get("env")) {
    const std::string epath = f.Path("env");
    if (!env->is_object())
      return FieldError(epath, fmt::format("expected an object of names to strings, got {}",
                                           api_internal::JsonTypeName(*env)));
    if (env->size() > static_cast<size_t>(limits.max_env)) {
      return FieldError(epath,
                        fmt::format("has {} entries, over the limit of {}", env->size(), limits.max_env));
    }
    for (const auto& [key, value] : env->items()) {
      if (!IsEnvName(key)) {
        return FieldError(epath, fmt::format("variable name {} must be letters, digits, '_', '-' or '.', not "
                                             "starting with a digit",
                                             Quote(key)));
      }
      const std::string vpath = IsPathSafeKey(key) ? FieldPath(epath, key) : epath;
      // The agent sets these to enforce the allocation (docs/agent.md); a job may not.
      if (key.rfind("GPUPOOL_", 0) == 0 || key.rfind("CUDA_MPS_", 0) == 0 || key == "CUDA_VISIBLE_DEVICES" ||
          key == "NVIDIA_VISIBLE_DEVICES") {
        return FieldError(vpath, "is set by gpupool to enforce the task's allocation; a job may not set it");
      }
      ASSIGN_OR_RETURN(std::string s, ReadString(value, vpath, limits.max_string_bytes));
      g->exec.env.emplace(key, std::move(s));
    }
  }
  if (const Json* dir = f.Get("workingDir")) {
    ASSIGN_OR_RETURN(g->exec.working_dir, ReadAbsolutePath(*dir, f.Path("workingDir"), limits));
  }
  if (const Json* container = f.Get("container")) {
    ASSIGN_OR_RETURN(ObjectFields c,
                     ObjectFields::Read(*container, f.Path("container"),
                                        {"image", "bundle", "rootfs", "network", "runtimeClass"}));
    const int roots = int{c.Has("image")} + int{c.Has("bundle")} + int{c.Has("rootfs")};
    if (roots > 1) return FieldError(c.path(), "takes one of image, bundle or rootfs");
    if (roots == 0) return FieldError(c.path(), "needs an image, a bundle or a rootfs");
    if (const Json* image = c.Get("image")) {
      ASSIGN_OR_RETURN(std::string text, ReadString(*image, c.Path("image"), kMaxImageSourceBytes));
      auto source = ParseImageSource(text);
      if (!source.ok()) return FieldError(c.Path("image"), source.status().message());
      g->exec.image = source->ToString();
    }
    if (const Json* rc = c.Get("runtimeClass")) {
      ASSIGN_OR_RETURN(std::string cls, ReadString(*rc, c.Path("runtimeClass"), 16));
      if (cls != "runc" && cls != "crun" && cls != "runsc" && cls != "kata")
        return FieldError(c.Path("runtimeClass"), "must be runc, crun, runsc or kata");
      if (cls != "runc") g->exec.runtime_class = cls;
    }
    if (const Json* network = c.Get("network")) {
      ASSIGN_OR_RETURN(std::string n, ReadString(*network, c.Path("network"), 16));
      if (n != "none" && n != "host") return FieldError(c.Path("network"), "must be none or host");
      if (n == "host") g->exec.network = n;
    }
    if (const Json* bundle = c.Get("bundle")) {
      ASSIGN_OR_RETURN(g->exec.bundle, ReadAbsolutePath(*bundle, c.Path("bundle"), limits));
    }
    if (const Json* rootfs = c.Get("rootfs")) {
      ASSIGN_OR_RETURN(g->exec.rootfs, ReadAbsolutePath(*rootfs, c.Path("rootfs"), limits));
    }
  }
  if (const Json* checkpoint = f.Get("checkpoint")) {
    ASSIGN_OR_RETURN(ObjectFields c,
                     ObjectFields::Read(*checkpoint, f.Path("checkpoint"), {"dir", "intervalSeconds"}));
    if (const Json* dir = c.Get("dir")) {
      ASSIGN_OR_RETURN(g->exec.checkpoint.dir, ReadAbsolutePath(*dir, c.Path("dir"), limits));
    }
    if (const Json* interval = c.Get("intervalSeconds")) {
      ASSIGN_OR_RETURN(int64_t seconds, ReadInt(*interval, c.Path("intervalSeconds"), 0,
                                                limits.max_checkpoint_interval_seconds));
      g->exec.checkpoint.interval_seconds = static_cast<int>(seconds);
    }
    if (g->exec.checkpoint.interval_seconds > 0 && g->exec.checkpoint.dir.empty()) {
      return FieldError(c.Path("dir"), "is required when intervalSeconds is set");
    }
  }
  return Status::Ok();
}

// A list of label sets (togetherWith, apartFrom); each set must name at least one label.
Result<std::vector<std::map<std::string, std::string>>> ReadLabelTerms(const Json& v, const std::string& path,
                                                                       const JobSpecLimits& limits) {
  ASSIGN_OR_RETURN(const Json::array_t* terms,
                   ReadArray(v, path, static_cast<size_t>(limits.max_affinity_terms)));
  std::vector<std::map<std::string, std::string>> out;
  for (size_t i = 0; i < terms->size(); ++i) {
    const std::string tpath = IndexPath(path, i);
    ASSIGN_OR_RETURN(auto labels, ReadLabels((*terms)[i], tpath, static_cast<size_t>(limits.max_labels)));
    if (labels.empty()) return FieldError(tpath, "must name at least one label");
    out.push_back(std::move(labels));
  }
  return out;
}

Status ReadAffinity(const Json& v, const std::string& path, const JobSpecLimits& limits, Affinity* a) {
  ASSIGN_OR_RETURN(
      ObjectFields f,
      ObjectFields::Read(v, path, {"nodeSelector", "nodeAffinity", "togetherWith", "apartFrom"}));
  const auto max_terms = static_cast<size_t>(limits.max_affinity_terms);
  if (const Json* selector = f.Get("nodeSelector")) {
    ASSIGN_OR_RETURN(auto labels, ReadLabels(*selector, f.Path("nodeSelector"), max_terms));
    for (auto& [key, value] : labels)
      a->node.push_back(LabelRequirement{key, LabelRequirement::Op::kIn, {value}});
  }
  if (const Json* node_affinity = f.Get("nodeAffinity")) {
    const std::string npath = f.Path("nodeAffinity");
    ASSIGN_OR_RETURN(const Json::array_t* reqs, ReadArray(*node_affinity, npath, max_terms));
    if (a->node.size() + reqs->size() > max_terms) {
      return FieldError(npath, fmt::format("with nodeSelector makes {} requirements, over the limit of {}",
                                           a->node.size() + reqs->size(), max_terms));
    }
    for (size_t i = 0; i < reqs->size(); ++i) {
      ASSIGN_OR_RETURN(ObjectFields r,
                       ObjectFields::Read((*reqs)[i], IndexPath(npath, i), {"key", "operator", "values"}));
      LabelRequirement req;
      const Json* key = r.Get("key");
      if (key == nullptr) return FieldError(r.Path("key"), "is required");
      ASSIGN_OR_RETURN(req.key, ReadString(*key, r.Path("key"), kMaxLabelKeyBytes));
      if (!IsLabelKey(req.key)) {
        return FieldError(r.Path("key"), fmt::format("{} is not a label name", Quote(req.key)));
      }
      const Json* op = r.Get("operator");
      if (op == nullptr)
        return FieldError(r.Path("operator"), "is required (In, NotIn, Exists or DoesNotExist)");
      ASSIGN_OR_RETURN(std::string op_name, ReadString(*op, r.Path("operator"), limits.max_name_bytes));
      Result<LabelRequirement::Op> parsed = ParseLabelOp(op_name);
      if (!parsed.ok()) {
        return FieldError(r.Path("operator"),
                          fmt::format("must be In, NotIn, Exists or DoesNotExist, got {}", Quote(op_name)));
      }
      req.op = *parsed;
      if (const Json* values = r.Get("values")) {
        const std::string vpath = r.Path("values");
        ASSIGN_OR_RETURN(const Json::array_t* list,
                         ReadArray(*values, vpath, static_cast<size_t>(limits.max_affinity_values)));
        for (size_t k = 0; k < list->size(); ++k) {
          ASSIGN_OR_RETURN(std::string value,
                           ReadString((*list)[k], IndexPath(vpath, k), kMaxLabelValueBytes));
          if (!IsLabelValue(value)) {
            return FieldError(IndexPath(vpath, k), fmt::format("{} is not a label value", Quote(value)));
          }
          req.values.push_back(std::move(value));
        }
      }
      const bool set_op = req.op == LabelRequirement::Op::kIn || req.op == LabelRequirement::Op::kNotIn;
      if (set_op && req.values.empty()) {
        return FieldError(r.Path("values"), fmt::format("{} needs at least one value", op_name));
      }
      if (!set_op && !req.values.empty())
        return FieldError(r.Path("values"), fmt::format("{} takes no values", op_name));
      a->node.push_back(std::move(req));
    }
  }
  if (const Json* together = f.Get("togetherWith")) {
    ASSIGN_OR_RETURN(a->together_with, ReadLabelTerms(*together, f.Path("togetherWith"), limits));
  }
  if (const Json* apart = f.Get("apartFrom")) {
    ASSIGN_OR_RETURN(a->apart_from, ReadLabelTerms(*apart, f.Path("apartFrom"), limits));
  }
  return Status::Ok();
}

// ValidateJob backs up the checks above; they should leave it nothing to find. Should it find
// something anyway, point at the task group it names (or the job) and keep its words.
Status FromValidateJob(const Status& st, const Job& job) {
  std::string message = st.message();
  const std::string job_prefix = fmt::format("job '{}': ", job.name);
  if (message.rfind(job_prefix, 0) == 0) message = message.substr(job_prefix.size());
  for (size_t i = 0; i < job.groups.size(); ++i) {
    const std::string group_prefix = fmt::format("task group '{}': ", job.groups[i].name);
    if (message.rfind(group_prefix, 0) == 0) {
      return FieldError(IndexPath("tasks", i), message.substr(group_prefix.size()));
    }
  }
  if (message.find("minAvailable") != std::string::npos) return FieldError("gang.minAvailable", message);
  if (message.find("affinity") != std::string::npos) return FieldError("affinity", message);
  return FieldError("", message);
}

Result<Job> ReadJob(const Json& root, const JobSpecLimits& limits) {
  ASSIGN_OR_RETURN(ObjectFields f, ObjectFields::Read(root, "",
                                                      {"name", "tenant", "queue", "priority", "qos", "labels",
                                                       "gang", "affinity", "tasks", "retry", "timeLimit",
                                                       "dependsOn"}));
  Job job;
  const Json* name = f.Get("name");
  if (name == nullptr) return FieldError("name", "is required");
  ASSIGN_OR_RETURN(job.name, ReadName(*name, "name", limits.max_name_bytes));
  if (const Json* tenant = f.Get("tenant")) {
    ASSIGN_OR_RETURN(job.tenant, ReadName(*tenant, "tenant", limits.max_name_bytes));
  }
  if (const Json* queue = f.Get("queue")) {
    ASSIGN_OR_RETURN(job.queue, ReadName(*queue, "queue", limits.max_name_bytes));
  }
  if (const Json* priority = f.Get("priority")) {
    ASSIGN_OR_RETURN(int64_t p, ReadInt(*priority, "priority", kMinPriority, kMaxPriority));
    job.priority = static_cast<int>(p);
  }
  if (const Json* qos = f.Get("qos")) {
    ASSIGN_OR_RETURN(std::string qos_name, ReadString(*qos, "qos", limits.max_name_bytes));
    Result<QosClass> parsed = ParseQosClass(qos_name);
    if (!parsed.ok()) {
      return FieldError("qos",
                        fmt::format("must be guaranteed, burstable or best-effort, got {}", Quote(qos_name)));
    }
    job.qos = *parsed;
  }
  if (const Json* labels = f.Get("labels")) {
    ASSIGN_OR_RETURN(job.labels, ReadLabels(*labels, "labels", static_cast<size_t>(limits.max_labels)));
  }

  const Json* tasks = f.Get("tasks");
  if (tasks == nullptr) return FieldError("tasks", "is required");
  ASSIGN_OR_RETURN(const Json::array_t* groups,
                   ReadArray(*tasks, "tasks", static_cast<size_t>(limits.max_task_groups)));
  if (groups->empty()) return FieldError("tasks", "must have at least one task");
  int64_t total = 0;
  for (size_t i = 0; i < groups->size(); ++i) {
    const std::string path = IndexPath("tasks", i);
    TaskGroup g;
    RETURN_IF_ERROR(ReadTask((*groups)[i], path, job.qos, limits, &g));
    for (size_t k = 0; k < job.groups.size(); ++k) {
      if (job.groups[k].name == g.name) {
        return FieldError(FieldPath(path, "name"),
                          fmt::format("{} is also the name of tasks[{}]", Quote(g.name), k));
      }
    }
    total += g.replicas;
    if (total > limits.max_tasks) {
      return FieldError(
          FieldPath(path, "replicas"),
          fmt::format("brings the job to {} tasks, over the limit of {}", total, limits.max_tasks));
    }
    job.groups.push_back(std::move(g));
  }

  if (const Json* gang = f.Get("gang")) {
    ASSIGN_OR_RETURN(ObjectFields g, ObjectFields::Read(*gang, "gang", {"minAvailable"}));
    if (const Json* min_available = g.Get("minAvailable")) {
      const int count = job.task_count();
      Result<int64_t> n = ReadInt(*min_available, g.Path("minAvailable"), 1, count);
      if (!n.ok()) {
        if (!min_available->is_number()) return n.status();
        return FieldError(g.Path("minAvailable"),
                          fmt::format("must be between 1 and the task count {}, got {}", count,
                                      DescribeValue(*min_available)));
      }
      // All tasks is stored as 0, the model's spelling of "the whole job".
      job.min_available = *n == count ? 0 : static_cast<int>(*n);
    }
  }
  if (const Json* affinity = f.Get("affinity")) {
    RETURN_IF_ERROR(ReadAffinity(*affinity, "affinity", limits, &job.affinity));
  }
  if (const Json* retry = f.Get("retry")) {
    ASSIGN_OR_RETURN(ObjectFields r, ObjectFields::Read(*retry, "retry",
                                                        {"maxRestarts", "backoffSeconds", "maxBackoffSeconds",
                                                         "onFailure"}));
    if (const Json* v = r.Get("maxRestarts")) {
      ASSIGN_OR_RETURN(int64_t n, ReadInt(*v, r.Path("maxRestarts"), 0, 10000));
      job.retry.max_restarts = static_cast<int>(n);
    }
    if (const Json* v = r.Get("backoffSeconds")) {
      ASSIGN_OR_RETURN(int64_t n, ReadInt(*v, r.Path("backoffSeconds"), 0, 86400));
      job.retry.backoff_seconds = static_cast<int>(n);
    }
    if (const Json* v = r.Get("maxBackoffSeconds")) {
      ASSIGN_OR_RETURN(int64_t n, ReadInt(*v, r.Path("maxBackoffSeconds"), 0, 7 * 86400));
      job.retry.max_backoff_seconds = static_cast<int>(n);
    }
    if (const Json* v = r.Get("onFailure")) {
      if (!v->is_boolean())
        return FieldError(r.Path("onFailure"), fmt::format("must be true or false, got {}", DescribeValue(*v)));
      job.retry.on_failure = v->get<bool>();
    }
    if (job.retry.max_backoff_seconds < job.retry.backoff_seconds) {
      return FieldError(r.Path("maxBackoffSeconds"),
                        fmt::format("must be at least backoffSeconds ({}), got {}", job.retry.backoff_seconds,
                                    job.retry.max_backoff_seconds));
    }
  }

  if (const Json* limit = f.Get("timeLimit")) {
    ASSIGN_OR_RETURN(job.time_limit_seconds, ReadDuration(*limit, "timeLimit", 1, kMaxTimeLimitSeconds));
  }
  if (const Json* deps = f.Get("dependsOn")) {
    ASSIGN_OR_RETURN(const Json::array_t* items, ReadArray(*deps, "dependsOn", kMaxDependencies));
    for (size_t i = 0; i < items->size(); ++i) {
      const std::string dpath = IndexPath("dependsOn", i);
      ASSIGN_OR_RETURN(ObjectFields d, ObjectFields::Read((*items)[i], dpath, {"job", "condition"}));
      Dependency dep;
      const Json* id = d.Get("job");
      if (id == nullptr) return FieldError(d.Path("job"), "is required");
      ASSIGN_OR_RETURN(dep.job, ReadString(*id, d.Path("job"), 64));
      if (!IsJobId(dep.job)) return FieldError(d.Path("job"), fmt::format("must be a job id (j-000000000042), got {}", Quote(dep.job)));
      if (const Json* c = d.Get("condition")) {
        ASSIGN_OR_RETURN(std::string cond, ReadString(*c, d.Path("condition"), limits.max_name_bytes));
        if (cond == "succeeded") {
          dep.condition = Dependency::Condition::kSucceeded;
        } else if (cond == "ended") {
          dep.condition = Dependency::Condition::kEnded;
        } else {
          return FieldError(d.Path("condition"), fmt::format("must be succeeded or ended, got {}", Quote(cond)));
        }
      }
      for (size_t k = 0; k < job.depends_on.size(); ++k) {
        if (job.depends_on[k].job == dep.job)
          return FieldError(d.Path("job"), fmt::format("{} is also dependsOn[{}]", Quote(dep.job), k));
      }
      job.depends_on.push_back(std::move(dep));
    }
  }

  const Status valid = ValidateJob(job);
  if (!valid.ok()) return FromValidateJob(valid, job);
  return job;
}

// ---- Job -> canonical tree ------------------------------------------------------------------

Json LabelsJson(const std::map<std::string, std::string>& labels) {
  Json out = Json::object();
  for (const auto& [k, v] : labels) out[k] = v;
  return out;
}

Json GpuJson(const TaskRequest& r) {
  if (!r.wants_gpu()) return 0;
  if (r.wants_mig()) return 1;
  if (r.gpu_share < kWholeGpu) return static_cast<double>(r.gpu_share.units()) / 1000.0;
  return r.gpu_count;
}

Json TaskJson(const TaskGroup& g) {
  const TaskRequest& r = g.request;
  Json resources = {{"cpu", FormatCpu(r.cpu)}, {"memory", FormatMemory(r.memory)}, {"gpu", GpuJson(r)}};
  if (!r.gpu_memory.is_zero()) resources["gpuMemory"] = FormatMemory(r.gpu_memory);
  if (!r.gpu_models.empty()) resources["gpuModels"] = r.gpu_models;
  if (r.wants_mig()) resources["migProfile"] = r.mig_profile;
  if (r.nvlink) resources["gpuInterconnect"] = "nvlink";

  Json task = {{"name", g.name},
               {"replicas", g.replicas},
               {"resources", std::move(resources)},
               {"isolation", IsolationModeName(g.exec.isolation)},
               {"command", Json::array()},
               {"env", LabelsJson(g.exec.env)}};
  for (const auto& arg : g.exec.command) task["command"].push_back(arg);
  if (!g.exec.working_dir.empty()) task["workingDir"] = g.exec.working_dir;
  if (!g.exec.image.empty() || !g.exec.bundle.empty() || !g.exec.rootfs.empty()) {
    Json container = Json::object();
    if (!g.exec.image.empty()) container["image"] = g.exec.image;
    if (!g.exec.bundle.empty()) container["bundle"] = g.exec.bundle;
    if (!g.exec.rootfs.empty()) container["rootfs"] = g.exec.rootfs;
    if (!g.exec.network.empty()) container["network"] = g.exec.network;
    if (!g.exec.runtime_class.empty()) container["runtimeClass"] = g.exec.runtime_class;
    task["container"] = std::move(container);
  }
  if (!g.exec.checkpoint.dir.empty() || g.exec.checkpoint.interval_seconds != 0) {
    task["checkpoint"] = {{"dir", g.exec.checkpoint.dir},
                          {"intervalSeconds", g.exec.checkpoint.interval_seconds}};
  }
  return task;
}

}  // namespace

Result<Job> ParseJobSpec(std::string_view text, SpecFormat format, const JobSpecLimits& limits) {
  if (text.size() > limits.max_bytes) {
    return FieldError("", fmt::format("is {} bytes, over the limit of {}", text.size(), limits.max_bytes));
  }
  Result<Json> tree = format == SpecFormat::kJson ? ParseJsonText(text, limits) : ParseYamlText(text, limits);
  if (!tree.ok()) return tree.status();
  try {
    return ReadJob(*tree, limits);
  } catch (const std::exception& e) {
    // The readers check types before every access, so this is a bug; still no exception escapes.
    return Status::Internal(fmt::format("spec: reading the job failed: {}", e.what()));
  }
}

Json JobSpecToJson(const Job& job) {
  Json j = Json::object();
  j["name"] = job.name;
  if (!job.tenant.empty()) j["tenant"] = job.tenant;
  if (!job.queue.empty()) j["queue"] = job.queue;
  j["priority"] = job.priority;
  j["qos"] = QosClassName(job.qos);
  j["labels"] = LabelsJson(job.labels);
  j["gang"] = {{"minAvailable", job.gang_size()}};

  Json node_affinity = Json::array();
  for (const LabelRequirement& req : job.affinity.node) {
    node_affinity.push_back({{"key", req.key}, {"operator", LabelOpName(req.op)}, {"values", req.values}});
  }
  Json together = Json::array();
  for (const auto& term : job.affinity.together_with) together.push_back(LabelsJson(term));
  Json apart = Json::array();
  for (const auto& term : job.affinity.apart_from) apart.push_back(LabelsJson(term));
  j["affinity"] = {{"nodeAffinity", std::move(node_affinity)},
                   {"togetherWith", std::move(together)},
                   {"apartFrom", std::move(apart)}};

  j["retry"] = {{"maxRestarts", job.retry.max_restarts},
                {"backoffSeconds", job.retry.backoff_seconds},
                {"maxBackoffSeconds", job.retry.max_backoff_seconds},
                {"onFailure", job.retry.on_failure}};

  if (job.time_limit_seconds > 0) j["timeLimit"] = job.time_limit_seconds;
  if (!job.depends_on.empty()) {
    Json deps = Json::array();
    for (const Dependency& d : job.depends_on)
      deps.push_back({{"job", d.job}, {"condition", DependencyConditionName(d.condition)}});
    j["dependsOn"] = std::move(deps);
  }

  Json tasks = Json::array();
  for (const TaskGroup& g : job.groups) tasks.push_back(TaskJson(g));
  j["tasks"] = std::move(tasks);
  return j;
}

bool SameJobSpec(const Job& a, const Job& b) {
  if (a.name != b.name || a.tenant != b.tenant || a.queue != b.queue || a.priority != b.priority ||
      a.qos != b.qos || a.gang_size() != b.gang_size() || a.labels != b.labels ||
      !(a.affinity == b.affinity) || !(a.retry == b.retry) || a.groups.size() != b.groups.size() ||
      a.time_limit_seconds != b.time_limit_seconds || a.depends_on != b.depends_on) {
    return false;
  }
  for (size_t i = 0; i < a.groups.size(); ++i) {
    const TaskGroup& x = a.groups[i];
    const TaskGroup& y = b.groups[i];
    if (x.name != y.name || x.replicas != y.replicas || !(x.request == y.request) || !(x.exec == y.exec)) {
      return false;
    }
  }
  return true;
}

Result<nlohmann::json> ParseJsonBody(std::string_view text, int max_depth) {
  JobSpecLimits limits;
  limits.max_depth = max_depth;
  return ParseJsonText(text, limits);
}

Status CheckSpecName(std::string_view name, const std::string& path, const JobSpecLimits& limits) {
  return CheckName(name, path, limits.max_name_bytes);
}

std::string ErrorField(const Status& status) {
  if (status.code() != StatusCode::kInvalidArgument) return "";
  const std::string& m = status.message();
  const size_t colon = m.find(": ");
  if (colon == std::string::npos || colon == 0) return "";
  const std::string prefix = m.substr(0, colon);
  if (prefix == "spec") return "";
  for (char c : prefix) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '-' || c == '.' || c == '[' || c == ']';
    if (!ok) return "";
  }
  return prefix;
}

}  // namespace gpupool
