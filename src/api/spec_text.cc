#include "api/spec_text.h"

#include <fmt/format.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <exception>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace gpupool::api_internal {

namespace {

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

Result<Json> JsonTextToTree(std::string_view text, const JobSpecLimits& limits) {
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

Result<Json> YamlTextToTree(std::string_view text, const JobSpecLimits& limits) {
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

}  // namespace

Result<Json> ParseJsonText(std::string_view text, const JobSpecLimits& limits) { return JsonTextToTree(text, limits); }

Result<Json> ParseYamlText(std::string_view text, const JobSpecLimits& limits) { return YamlTextToTree(text, limits); }

}  // namespace gpupool::api_internal
