// CDI spec files: reading and checking one, and the JSON form. Loading the spec directories and
// resolving devices are in cdi_load.cc, generating a spec in cdi_generate.cc.
//
// JSON and YAML are both turned into one nlohmann::json tree first (YAML scalars as strings), so a
// single reader checks every field the same way whatever the file's format.
#include "agent/cdi.h"

#include <fmt/format.h>
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <exception>
#include <map>
#include <set>
#include <utility>

namespace gpupool {

void CdiEdits::Append(const CdiEdits& other) {
  env.insert(env.end(), other.env.begin(), other.env.end());
  device_nodes.insert(device_nodes.end(), other.device_nodes.begin(), other.device_nodes.end());
  mounts.insert(mounts.end(), other.mounts.begin(), other.mounts.end());
  hooks.insert(hooks.end(), other.hooks.begin(), other.hooks.end());
}

namespace {

using nlohmann::json;

// Far deeper than any CDI field (a hook's args entry is five levels down). It bounds the recursion
// of the YAML conversion and what an ignored key may hold.
constexpr int kMaxDepth = 32;
// A YAML alias is converted once per reference, so a few lines of nested aliases can stand for
// billions of nodes ("billion laughs"); the conversion stops long before memory would run out.
constexpr size_t kMaxYamlNodes = size_t{1} << 20;
constexpr size_t kMaxYamlScalarBytes = 4 * kCdiMaxSpecBytes;

bool IsLetter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool IsDigit(char c) {
  return c >= '0' && c <= '9';
}
bool IsAlnum(char c) {
  return IsLetter(c) || IsDigit(c);
}

bool IsValidKindPart(std::string_view s) {
  if (s.empty() || !IsLetter(s.front()) || !IsAlnum(s.back())) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return IsAlnum(c) || c == '.' || c == '-' || c == '_'; });
}

// A value for an error message, quoted and cut short (at a UTF-8 character boundary) when long.
std::string Quote(std::string_view v) {
  constexpr size_t kShown = 80;
  if (v.size() <= kShown) return fmt::format("'{}'", v);
  size_t cut = kShown;
  while (cut > 0 && (static_cast<unsigned char>(v[cut]) & 0xC0) == 0x80) --cut;
  return fmt::format("'{}...' ({} bytes)", v.substr(0, cut), v.size());
}

std::string Child(const std::string& field, std::string_view key) {
  return field.empty() ? std::string(key) : fmt::format("{}.{}", field, key);
}

std::string Item(const std::string& field, size_t i) {
  return fmt::format("{}[{}]", field, i);
}

// The offset of the first byte that is not valid UTF-8 or is a control character neither JSON nor
// YAML allows unescaped (C0 except tab, LF and CR; DEL), or npos. Checked before any parser sees the
// text, so that no garbage reaches a parser, an error message or a JSON dump (which would throw).
size_t FirstBadByte(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f) return i;
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0;
    uint32_t min = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      return i;
    }
    if (len > s.size() - i) return i;
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

// Errors below are "<field>: <what>"; ParseCdiSpec puts the source in front.
Status FieldError(const std::string& field, const std::string& what) {
  return Status::InvalidArgument(field.empty() ? what : fmt::format("{}: {}", field, what));
}

struct YamlBudget {
  size_t nodes = kMaxYamlNodes;
  size_t scalar_bytes = kMaxYamlScalarBytes;
};

// Scalars stay strings (the reader decides what a field's text means: "1.0" is a version, not a
// number); null, "~" and empty values become null.
Status YamlToJson(const YAML::Node& n, const std::string& field, int depth, YamlBudget& budget, json& out) {
  if (budget.nodes == 0) {
    return FieldError(field, fmt::format("the YAML expands to more than {} nodes (aliases?)", kMaxYamlNodes));
  }
  --budget.nodes;
  if (depth > kMaxDepth) return FieldError(field, fmt::format("nested deeper than {} levels", kMaxDepth));
  switch (n.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null: out = nullptr; return Status::Ok();
    case YAML::NodeType::Scalar: {
      const std::string& s = n.Scalar();
      if (s.size() > budget.scalar_bytes) {
        return FieldError(
            field, fmt::format("the YAML expands to more than {} bytes (aliases?)", kMaxYamlScalarBytes));
      }
      budget.scalar_bytes -= s.size();
      out = s;
      return Status::Ok();
    }
    case YAML::NodeType::Sequence: {
      out = json::array();
      size_t i = 0;
      for (const YAML::Node& e : n) {
        json v;
        RETURN_IF_ERROR(YamlToJson(e, Item(field, i++), depth + 1, budget, v));
        out.push_back(std::move(v));
      }
      return Status::Ok();
    }
    case YAML::NodeType::Map: {
      out = json::object();
      for (const auto& kv : n) {
        if (!kv.first.IsScalar()) return FieldError(field, "a mapping key is not a plain string");
        const std::string& key = kv.first.Scalar();
        json v;
        RETURN_IF_ERROR(YamlToJson(kv.second, Child(field, key), depth + 1, budget, v));
        out[key] = std::move(v);
      }
      return Status::Ok();
    }
  }
  return FieldError(field, "unknown YAML node type");
}

Status ParseYaml(const std::string& text, json& out) {
  YAML::Node root;
  try {
    // yaml-cpp has a nesting limit of its own (a few hundred levels) and throws DeepRecursion.
    root = YAML::Load(text);
  } catch (const YAML::DeepRecursion& e) {
    return Status::InvalidArgument(fmt::format("not valid YAML: nested too deeply (line {}, column {})",
                                               e.mark.line + 1, e.mark.column + 1));
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(fmt::format("not valid YAML: {}", e.what()));
  }
  YamlBudget budget;
  return YamlToJson(root, "", 0, budget, out);
}

Status ParseJson(std::string_view text, json& out) {
  // nlohmann's parser is iterative; values nested too deep are dropped while parsing (the callback
  // says not to keep them), so no deep tree is ever built, and the error names the top-level key.
  bool too_deep = false;
  std::string key;
  std::string deep_key;
  const json::parser_callback_t keep = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key && parsed.is_string()) {
      key = parsed.get_ref<const std::string&>();
    }
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth > kMaxDepth) {
      if (!too_deep) deep_key = key;
      too_deep = true;
      return false;
    }
    return true;
  };
  try {
    out = json::parse(text.begin(), text.end(), keep);
  } catch (const json::exception& e) {
    std::string what = e.what();  // "[json.exception.parse_error.101] parse error at line 2, ..."
    if (const size_t close = what.find("] ");
        what.starts_with("[json.exception.") && close != std::string::npos) {
      what.erase(0, close + 2);
    }
    return Status::InvalidArgument(fmt::format("not valid JSON: {}", what));
  }
  if (too_deep) return FieldError(deep_key, fmt::format("nested deeper than {} levels", kMaxDepth));
  return Status::Ok();
}

bool SupportedVersion(std::string_view v) {
  int parts[3] = {-1, -1, -1};
  const char* p = v.data();
  const char* end = v.data() + v.size();
  for (int i = 0; i < 3; ++i) {
    if (i > 0) {
      if (p == end || *p != '.') return false;
      ++p;
    }
    const auto [next, ec] = std::from_chars(p, end, parts[i]);
    if (ec != std::errc() || next == p) return false;
    p = next;
  }
  return p == end && parts[0] == 0 && parts[1] >= 3 && parts[1] <= 8;
}

// Absolute and, for a path inside the container, without "..": a runtime that joins it to the
// rootfs naively would otherwise be led outside, and no real spec needs it.
Status CheckPath(const std::string& field, const std::string& path, bool in_container) {
  if (path.empty() || path.front() != '/')
    return FieldError(field, fmt::format("{} is not absolute", Quote(path)));
  if (in_container) {
    for (size_t pos = 0; pos != std::string::npos;) {
      const size_t next = path.find('/', pos + 1);
      if (path.substr(pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1) == "..") {
        return FieldError(field, fmt::format("{} has a '..' component", Quote(path)));
      }
      pos = next;
    }
  }
  return Status::Ok();
}

Status CheckEnv(const std::string& field, const std::vector<std::string>& env) {
  for (size_t i = 0; i < env.size(); ++i) {
    const size_t eq = env[i].find('=');
    if (eq == std::string::npos || eq == 0) {
      return FieldError(Item(field, i), fmt::format("{} is not NAME=VALUE", Quote(env[i])));
    }
  }
  return Status::Ok();
}

// Reads the checked tree into a CdiSpec. Every accessor says which field is wrong.
class SpecReader {
 public:
  explicit SpecReader(bool from_yaml) : from_yaml_(from_yaml) {}

  Status Read(const json& root, CdiSpec* spec) const {
    if (!root.is_object())
      return FieldError("", fmt::format("a CDI spec must be a mapping, not {}", Type(root)));
    RETURN_IF_ERROR(String(root, "cdiVersion", "", &spec->version, true));
    if (!SupportedVersion(spec->version)) {
      return FieldError("cdiVersion",
                        fmt::format("{} is not supported (supported: 0.3.0 to 0.8.0)", Quote(spec->version)));
    }
    RETURN_IF_ERROR(String(root, "kind", "", &spec->kind, true));
    if (!IsValidCdiKind(spec->kind)) {
      return FieldError("kind", fmt::format("{} is not vendor/class (like nvidia.com/gpu: letters, digits, "
                                            "'.', '-', '_', each part starting with a letter and ending "
                                            "with a letter or digit)",
                                            Quote(spec->kind)));
    }
    const json* devices = nullptr;
    RETURN_IF_ERROR(List(root, "devices", "", kCdiMaxDevices, &devices));
    if (devices == nullptr || devices->empty())
      return FieldError("devices", "a CDI spec must define a device");
    std::map<std::string, size_t> seen;
    for (size_t i = 0; i < devices->size(); ++i) {
      const json& d = (*devices)[i];
      const std::string field = Item("devices", i);
      if (!d.is_object()) return FieldError(field, fmt::format("must be a mapping, not {}", Type(d)));
      std::string name;
      RETURN_IF_ERROR(String(d, "name", field, &name, true));
      if (!IsValidCdiDeviceName(name)) {
        return FieldError(Child(field, "name"),
                          fmt::format("{} is not a CDI device name (a letter or digit, then letters, digits, "
                                      "'_', '.', ':', '-')",
                                      Quote(name)));
      }
      if (const auto [it, inserted] = seen.emplace(name, i); !inserted) {
        return FieldError(Child(field, "name"),
                          fmt::format("{} is defined twice (also devices[{}])", Quote(name), it->second));
      }
      RETURN_IF_ERROR(Edits(d, Child(field, "containerEdits"), &spec->devices[name]));
    }
    return Edits(root, "containerEdits", &spec->common);
  }

 private:
  static std::string Type(const json& v) { return v.type_name(); }

  // `*out` keeps its value when `key` is absent or null and not `required`.
  Status String(const json& obj, const char* key, const std::string& parent, std::string* out,
                bool required) const {
    const std::string field = Child(parent, key);
    const auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) {
      return required ? FieldError(field, "is required") : Status::Ok();
    }
    RETURN_IF_ERROR(Scalar(*it, field, out));
    if (required && out->empty()) return FieldError(field, "is required");
    return Status::Ok();
  }

  static Status Scalar(const json& v, const std::string& field, std::string* out) {
    if (!v.is_string()) return FieldError(field, fmt::format("must be a string, not {}", Type(v)));
    const auto& s = v.get_ref<const std::string&>();
    if (s.size() > kCdiMaxStringBytes) {
      return FieldError(
          field, fmt::format("is {} bytes long, more than the {} allowed", s.size(), kCdiMaxStringBytes));
    }
    *out = s;
    return Status::Ok();
  }

  // `*out` is null when `key` is absent or null.
  static Status List(const json& obj, const char* key, const std::string& parent, size_t max,
                     const json** out) {
    const std::string field = Child(parent, key);
    *out = nullptr;
    const auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return Status::Ok();
    if (!it->is_array()) return FieldError(field, fmt::format("must be a list, not {}", Type(*it)));
    if (it->size() > max) {
      return FieldError(field, fmt::format("has {} entries, more than the {} allowed", it->size(), max));
    }
    *out = &*it;
    return Status::Ok();
  }

  static Status StringList(const json& obj, const char* key, const std::string& parent,
                           std::vector<std::string>* out) {
    const json* list = nullptr;
    RETURN_IF_ERROR(List(obj, key, parent, kCdiMaxListEntries, &list));
    if (list == nullptr) return Status::Ok();
    const std::string field = Child(parent, key);
    out->resize(list->size());
    for (size_t i = 0; i < list->size(); ++i) RETURN_IF_ERROR(Scalar((*list)[i], Item(field, i), &(*out)[i]));
    return Status::Ok();
  }

  // Each element of the list `key` must be a mapping; `read` reads one.
  template <typename T, typename ReadOne>
  Status Objects(const json& obj, const char* key, const std::string& parent, std::vector<T>* out,
                 ReadOne read) const {
    const json* list = nullptr;
    RETURN_IF_ERROR(List(obj, key, parent, kCdiMaxListEntries, &list));
    if (list == nullptr) return Status::Ok();
    const std::string field = Child(parent, key);
    out->resize(list->size());
    for (size_t i = 0; i < list->size(); ++i) {
      const json& e = (*list)[i];
      if (!e.is_object())
        return FieldError(Item(field, i), fmt::format("must be a mapping, not {}", Type(e)));
      RETURN_IF_ERROR(read(e, Item(field, i), &(*out)[i]));
    }
    return Status::Ok();
  }

  Status Edits(const json& parent_obj, const std::string& field, CdiEdits* out) const {
    const auto it = parent_obj.find("containerEdits");
    if (it == parent_obj.end() || it->is_null()) return Status::Ok();
    if (!it->is_object()) return FieldError(field, fmt::format("must be a mapping, not {}", Type(*it)));
    const json& e = *it;
    RETURN_IF_ERROR(StringList(e, "env", field, &out->env));
    RETURN_IF_ERROR(CheckEnv(Child(field, "env"), out->env));
    RETURN_IF_ERROR(
        Objects(e, "deviceNodes", field, &out->device_nodes,
                [this](const json& o, const std::string& f, CdiDeviceNode* n) { return Node(o, f, n); }));
    RETURN_IF_ERROR(
        Objects(e, "mounts", field, &out->mounts,
                [this](const json& o, const std::string& f, CdiMount* m) { return Mount(o, f, m); }));
    return Objects(e, "hooks", field, &out->hooks,
                   [this](const json& o, const std::string& f, CdiHook* h) { return Hook(o, f, h); });
  }

  Status Node(const json& o, const std::string& field, CdiDeviceNode* n) const {
    RETURN_IF_ERROR(String(o, "path", field, &n->path, true));
    RETURN_IF_ERROR(CheckPath(Child(field, "path"), n->path, true));
    RETURN_IF_ERROR(String(o, "hostPath", field, &n->host_path, false));
    if (!n->host_path.empty()) RETURN_IF_ERROR(CheckPath(Child(field, "hostPath"), n->host_path, false));
    RETURN_IF_ERROR(String(o, "permissions", field, &n->permissions, false));
    if (n->permissions.empty()) n->permissions = "rwm";
    std::set<char> letters;
    for (char c : n->permissions) {
      if ((c != 'r' && c != 'w' && c != 'm') || !letters.insert(c).second) {
        return FieldError(Child(field, "permissions"),
                          fmt::format("{} is not a combination of r, w and m", Quote(n->permissions)));
      }
    }
    return Status::Ok();
  }

  Status Mount(const json& o, const std::string& field, CdiMount* m) const {
    RETURN_IF_ERROR(String(o, "hostPath", field, &m->host_path, true));
    RETURN_IF_ERROR(CheckPath(Child(field, "hostPath"), m->host_path, false));
    RETURN_IF_ERROR(String(o, "containerPath", field, &m->container_path, true));
    RETURN_IF_ERROR(CheckPath(Child(field, "containerPath"), m->container_path, true));
    RETURN_IF_ERROR(StringList(o, "options", field, &m->options));
    return String(o, "type", field, &m->type, false);
  }

  Status Hook(const json& o, const std::string& field, CdiHook* h) const {
    RETURN_IF_ERROR(String(o, "hookName", field, &h->hook_name, true));
    static const std::set<std::string> kHookNames = {"prestart",       "createRuntime", "createContainer",
                                                     "startContainer", "poststart",     "poststop"};
    if (!kHookNames.contains(h->hook_name)) {
      return FieldError(
          Child(field, "hookName"),
          fmt::format("{} is not one of prestart, createRuntime, createContainer, startContainer, "
                      "poststart, poststop",
                      Quote(h->hook_name)));
    }
    RETURN_IF_ERROR(String(o, "path", field, &h->path, true));
    RETURN_IF_ERROR(CheckPath(Child(field, "path"), h->path, false));
    RETURN_IF_ERROR(StringList(o, "args", field, &h->args));
    RETURN_IF_ERROR(StringList(o, "env", field, &h->env));
    RETURN_IF_ERROR(CheckEnv(Child(field, "env"), h->env));
    return Timeout(o, Child(field, "timeout"), &h->timeout);
  }

  // JSON: an integer. YAML: the scalar's text, which must be one.
  Status Timeout(const json& o, const std::string& field, int* out) const {
    const auto it = o.find("timeout");
    if (it == o.end() || it->is_null()) return Status::Ok();
    const std::string bad = fmt::format("must be a whole number of seconds from 0 to {}", INT_MAX);
    if (from_yaml_ && it->is_string()) {
      const auto& s = it->get_ref<const std::string&>();
      const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
      if (s.empty() || ec != std::errc() || ptr != s.data() + s.size() || *out < 0) {
        return FieldError(field, fmt::format("{}, not {}", bad, Quote(s)));
      }
      return Status::Ok();
    }
    if (it->is_number_unsigned() && it->get<uint64_t>() <= static_cast<uint64_t>(INT_MAX)) {
      *out = static_cast<int>(it->get<uint64_t>());
      return Status::Ok();
    }
    if (it->is_number_integer() && !it->is_number_unsigned())
      return FieldError(field, fmt::format("{}, not {}", bad, it->get<int64_t>()));
    return FieldError(field, fmt::format("{}, not {}", bad, it->is_number() ? it->dump() : Type(*it)));
  }

  bool from_yaml_;
};

Result<CdiSpec> ParseChecked(std::string_view text, const std::string& source) {
  if (text.size() > kCdiMaxSpecBytes) {
    return Status::InvalidArgument(
        fmt::format("{} bytes, more than the {} allowed for a CDI spec", text.size(), kCdiMaxSpecBytes));
  }
  if (const size_t bad = FirstBadByte(text); bad != std::string_view::npos) {
    return Status::InvalidArgument(
        fmt::format("not UTF-8 text: byte 0x{:02x} at offset {} is invalid there or a "
                    "control character",
                    static_cast<unsigned char>(text[bad]), bad));
  }
  std::string_view body = text;
  if (body.starts_with("\xEF\xBB\xBF")) body.remove_prefix(3);  // a byte-order mark
  const size_t first = body.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return Status::InvalidArgument("empty: no CDI spec in it");
  json tree;
  const bool from_yaml = body[first] != '{' && body[first] != '[';
  RETURN_IF_ERROR(from_yaml ? ParseYaml(std::string(body), tree) : ParseJson(body, tree));
  CdiSpec spec;
  spec.source = source;
  RETURN_IF_ERROR(SpecReader(from_yaml).Read(tree, &spec));
  return spec;
}

}  // namespace

bool IsValidCdiKind(std::string_view kind) {
  const size_t slash = kind.find('/');
  if (slash == std::string_view::npos) return false;
  return IsValidKindPart(kind.substr(0, slash)) && IsValidKindPart(kind.substr(slash + 1));
}

bool IsValidCdiDeviceName(std::string_view name) {
  if (name.empty() || name.size() > kCdiMaxStringBytes || !IsAlnum(name.front())) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return IsAlnum(c) || c == '_' || c == '.' || c == ':' || c == '-'; });
}

Result<CdiSpec> ParseCdiSpec(std::string_view text, const std::string& source) {
  Result<CdiSpec> spec = Status::Internal("unset");
  try {
    spec = ParseChecked(text, source);
  } catch (const std::exception& e) {
    // Not expected (the parsers' exceptions are caught where they are called); this keeps a bug or
    // an allocation failure from taking the agent down over one file.
    spec = Status::InvalidArgument(fmt::format("cannot be read: {}", e.what()));
  }
  if (!spec.ok()) return spec.status().WithContext(source);
  return spec;
}

namespace {

json EditsJson(const CdiEdits& e) {
  json j = json::object();
  if (!e.env.empty()) j["env"] = e.env;
  for (const CdiDeviceNode& n : e.device_nodes) {
    json nj = {{"path", n.path}};
    if (!n.host_path.empty()) nj["hostPath"] = n.host_path;
    if (!n.permissions.empty()) nj["permissions"] = n.permissions;
    j["deviceNodes"].push_back(std::move(nj));
  }
  for (const CdiMount& m : e.mounts) {
    json mj = {{"hostPath", m.host_path}, {"containerPath", m.container_path}};
    if (!m.options.empty()) mj["options"] = m.options;
    if (!m.type.empty()) mj["type"] = m.type;
    j["mounts"].push_back(std::move(mj));
  }
  for (const CdiHook& h : e.hooks) {
    json hj = {{"hookName", h.hook_name}, {"path", h.path}};
    if (!h.args.empty()) hj["args"] = h.args;
    if (!h.env.empty()) hj["env"] = h.env;
    if (h.timeout != 0) hj["timeout"] = h.timeout;
    j["hooks"].push_back(std::move(hj));
  }
  return j;
}

}  // namespace

json CdiSpecToJson(const CdiSpec& spec) {
  json j = {{"cdiVersion", spec.version}, {"kind", spec.kind}, {"devices", json::array()}};
  for (const auto& [name, edits] : spec.devices) {
    j["devices"].push_back({{"name", name}, {"containerEdits", EditsJson(edits)}});
  }
  if (!spec.common.empty()) j["containerEdits"] = EditsJson(spec.common);
  return j;
}

}  // namespace gpupool
