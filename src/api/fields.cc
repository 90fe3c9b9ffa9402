#include "api/fields.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace gpupool::api_internal {

Status FieldError(std::string_view path, std::string_view reason) {
  return Status::InvalidArgument(
      fmt::format("{}: {}", path.empty() ? std::string_view("spec") : path, reason));
}

std::string FieldPath(std::string_view parent, std::string_view key) {
  if (parent.empty()) return std::string(key);
  return fmt::format("{}.{}", parent, key);
}

std::string IndexPath(std::string_view parent, size_t index) {
  return fmt::format("{}[{}]", parent, index);
}

std::string_view JsonTypeName(const Json& v) {
  switch (v.type()) {
    case Json::value_t::object: return "object";
    case Json::value_t::array: return "array";
    case Json::value_t::string: return "string";
    case Json::value_t::boolean: return "boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "integer";
    case Json::value_t::number_float: return "number";
    case Json::value_t::null: return "null";
    default: return "value";
  }
}

std::string FormatNumber(double d) {
  return fmt::format("{}", d);
}

namespace {

// The length of the well-formed UTF-8 sequence at the start of `s`, or 0 when there is none.
size_t Utf8SequenceLength(std::string_view s) {
  const auto c = static_cast<unsigned char>(s[0]);
  size_t len = 0;
  uint32_t cp = 0;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) {
    len = 2;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    const auto cc = static_cast<unsigned char>(s[k]);
    if ((cc & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3F);
  }
  // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8.
  const uint32_t min_cp = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
  if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = Utf8SequenceLength(s.substr(i));
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::string PrintableUtf8(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const size_t len = Utf8SequenceLength(text.substr(i));
    const auto c = static_cast<unsigned char>(text[i]);
    if (len == 0) {
      out += '?';
      ++i;
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
      ++i;
    } else {
      out.append(text.substr(i, len));
      i += len;
    }
  }
  return out;
}

std::string Quote(std::string_view text) {
  constexpr size_t kMax = 40;
  size_t cut = text.size();
  if (cut > kMax) {
    // Back off to the start of a character, so a well-formed text stays well-formed.
    cut = kMax;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  }
  return fmt::format("'{}{}'", PrintableUtf8(text.substr(0, cut)), cut < text.size() ? "..." : "");
}

bool IsPathSafeKey(std::string_view key) {
  if (key.empty() || key.size() > 64) return false;
  for (char c : key) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
    if (!ok) return false;
  }
  return true;
}

std::string DescribeValue(const Json& v) {
  switch (v.type()) {
    case Json::value_t::string: return Quote(v.get_ref<const std::string&>());
    case Json::value_t::boolean: return v.get<bool>() ? "true" : "false";
    case Json::value_t::number_integer: return fmt::format("{}", v.get<int64_t>());
    case Json::value_t::number_unsigned: return fmt::format("{}", v.get<uint64_t>());
    case Json::value_t::number_float: return FormatNumber(v.get<double>());
    case Json::value_t::null: return "null";
    case Json::value_t::array: return fmt::format("an array of {}", v.size());
    case Json::value_t::object: return "an object";
    default: return "a value";
  }
}

namespace {

// "expected a string, got integer 8080". Scalars of the wrong kind are shown; YAML users mostly
// hit this with unquoted numbers, so say how to fix it.
Status TypeError(const Json& v, const std::string& path, std::string_view expected) {
  std::string got(JsonTypeName(v));
  if (v.is_primitive() && !v.is_null()) got = fmt::format("{} {}", got, DescribeValue(v));
  std::string hint;
  if (expected == "a string" && (v.is_number() || v.is_boolean())) hint = " (quote it in YAML)";
  return FieldError(path, fmt::format("expected {}, got {}{}", expected, got, hint));
}

}  // namespace

Result<ObjectFields> ObjectFields::Read(const Json& v, std::string path,
                                        std::initializer_list<const char*> known) {
  if (!v.is_object()) return TypeError(v, path, "an object");
  for (const auto& [key, value] : v.items()) {
    bool found = false;
    for (const char* k : known) found = found || key == k;
    if (found) continue;
    std::string names;
    for (const char* k : known) names += names.empty() ? std::string(k) : fmt::format(", {}", k);
    if (IsPathSafeKey(key))
      return FieldError(FieldPath(path, key), fmt::format("unknown field (known: {})", names));
    return FieldError(path, fmt::format("unknown field {} (known: {})", Quote(key), names));
  }
  return ObjectFields(&v, std::move(path));
}

const Json* ObjectFields::Get(std::string_view key) const {
  auto it = object_->find(key);
  if (it == object_->end() || it->is_null()) return nullptr;
  return &*it;
}

Result<std::string> ReadString(const Json& v, const std::string& path, size_t max_bytes) {
  if (!v.is_string()) return TypeError(v, path, "a string");
  const auto& s = v.get_ref<const std::string&>();
  if (s.size() > max_bytes) {
    return FieldError(path, fmt::format("is {} bytes long, over the limit of {}", s.size(), max_bytes));
  }
  if (s.find('\0') != std::string::npos) return FieldError(path, "must not contain NUL characters");
  return s;
}

Result<int64_t> ReadInt(const Json& v, const std::string& path, int64_t min, int64_t max) {
  int64_t value = 0;
  if (v.is_number_integer() && !v.is_number_unsigned()) {
    value = v.get<int64_t>();
  } else if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(max)) {
      return FieldError(path, fmt::format("must be between {} and {}, got {}", min, max, u));
    }
    value = static_cast<int64_t>(u);
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) return TypeError(v, path, "an integer");
    // Compare as doubles first: a double beyond int64's range may not be cast.
    if (d < static_cast<double>(min) || d > static_cast<double>(max)) {
      return FieldError(path, fmt::format("must be between {} and {}, got {}", min, max, FormatNumber(d)));
    }
    value = static_cast<int64_t>(d);
  } else {
    return TypeError(v, path, "an integer");
  }
  if (value < min || value > max) {
    return FieldError(path, fmt::format("must be between {} and {}, got {}", min, max, value));
  }
  return value;
}

Result<double> ReadNumber(const Json& v, const std::string& path) {
  if (!v.is_number()) return TypeError(v, path, "a number");
  const double d = v.get<double>();
  if (!std::isfinite(d))
    return FieldError(path, fmt::format("must be a finite number, got {}", FormatNumber(d)));
  return d;
}

Result<bool> ReadBool(const Json& v, const std::string& path) {
  if (!v.is_boolean()) return TypeError(v, path, "a boolean (true or false)");
  return v.get<bool>();
}

Result<const Json::array_t*> ReadArray(const Json& v, const std::string& path, size_t max_items) {
  if (!v.is_array()) return TypeError(v, path, "an array");
  if (v.size() > max_items) {
    return FieldError(path, fmt::format("has {} entries, over the limit of {}", v.size(), max_items));
  }
  return v.get_ptr<const Json::array_t*>();
}

namespace {

// A quantity string: a plain decimal number ("2", "0.5", ".5", "1.") and then only letters (the
// unit). Keeps out what strtod would also take: whitespace, signs, hex, exponents, inf and nan.
bool IsQuantityText(std::string_view s) {
  size_t i = 0;
  size_t digits = 0;
  const auto skip_digits = [&] {
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      ++i;
      ++digits;
    }
  };
  skip_digits();
  if (i < s.size() && s[i] == '.') {
    ++i;
    skip_digits();
  }
  if (digits == 0) return false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) return false;
  }
  return true;
}

bool HasUnit(std::string_view s) {
  return !s.empty() && ((s.back() >= 'a' && s.back() <= 'z') || (s.back() >= 'A' && s.back() <= 'Z'));
}

}  // namespace

Result<MilliCpu> ReadCpu(const Json& v, const std::string& path, MilliCpu max) {
  Result<MilliCpu> cpu = MilliCpu(0);
  if (v.is_number()) {
    ASSIGN_OR_RETURN(double cores, ReadNumber(v, path));
    if (cores < 0) return FieldError(path, fmt::format("must not be negative, got {}", FormatNumber(cores)));
    if (cores > static_cast<double>(max.units()) / 1000.0) {
      return FieldError(path,
                        fmt::format("must be at most {} cores, got {}", FormatCpu(max), FormatNumber(cores)));
    }
    cpu = CpuFromCores(cores);
  } else if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    if (!IsQuantityText(s)) {
      return FieldError(
          path, fmt::format("must be a number of cores such as 2, \"0.5\" or \"500m\", got {}", Quote(s)));
    }
    cpu = ParseCpu(s);
  } else {
    return TypeError(v, path, "a number of cores or a string such as \"500m\"");
  }
  if (!cpu.ok()) return FieldError(path, cpu.status().message());
  if (*cpu > max) {
    return FieldError(path, fmt::format("must be at most {} cores, got {}", FormatCpu(max), FormatCpu(*cpu)));
  }
  return *cpu;
}

Result<MiB> ReadMemory(const Json& v, const std::string& path, MiB max) {
  if (v.is_number()) {
    return FieldError(
        path, fmt::format("needs a unit, e.g. \"8Gi\" or \"512Mi\" (a bare number would be bytes), got {}",
                          DescribeValue(v)));
  }
  if (!v.is_string()) return TypeError(v, path, "a string with a unit such as \"8Gi\"");
  const auto& s = v.get_ref<const std::string&>();
  if (!IsQuantityText(s)) {
    return FieldError(
        path, fmt::format("must be an amount with a unit such as \"8Gi\" or \"512Mi\", got {}", Quote(s)));
  }
  if (!HasUnit(s)) {
    return FieldError(
        path, fmt::format("needs a unit, e.g. \"8Gi\" or \"512Mi\" (a bare number would be bytes), got {}",
                          Quote(s)));
  }
  Result<MiB> mem = ParseMemory(s);
  if (!mem.ok()) return FieldError(path, mem.status().message());
  if (*mem > max) {
    return FieldError(path, fmt::format("must be at most {}, got {}", FormatMemory(max), Quote(s)));
  }
  return *mem;
}

namespace {

bool IsLower(char c) {
  return c >= 'a' && c <= 'z';
}
bool IsDigit(char c) {
  return c >= '0' && c <= '9';
}
bool IsAlnum(char c) {
  return IsLower(c) || IsDigit(c) || (c >= 'A' && c <= 'Z');
}

// 1..63 bytes of [A-Za-z0-9-_.], alphanumeric at both ends.
bool IsLabelName(std::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  if (!IsAlnum(s.front()) || !IsAlnum(s.back())) return false;
  for (char c : s) {
    if (!(IsAlnum(c) || c == '-' || c == '_' || c == '.')) return false;
  }
  return true;
}

// A DNS subdomain: dot-separated lowercase labels of [a-z0-9-], alphanumeric at both ends.
bool IsDnsSubdomain(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  size_t start = 0;
  while (start <= s.size()) {
    size_t dot = s.find('.', start);
    if (dot == std::string_view::npos) dot = s.size();
    const std::string_view part = s.substr(start, dot - start);
    if (part.empty() || part.size() > 63) return false;
    if (!(IsLower(part.front()) || IsDigit(part.front())) || !(IsLower(part.back()) || IsDigit(part.back())))
      return false;
    for (char c : part) {
      if (!(IsLower(c) || IsDigit(c) || c == '-')) return false;
    }
    start = dot + 1;
  }
  return true;
}

}  // namespace

bool IsName(std::string_view s, size_t max_bytes) {
  if (s.empty() || s.size() > max_bytes) return false;
  const auto edge = [](char c) { return IsLower(c) || IsDigit(c); };
  if (!edge(s.front()) || !edge(s.back())) return false;
  for (char c : s) {
    if (!(edge(c) || c == '-' || c == '.' || c == '_')) return false;
  }
  return true;
}

Status CheckName(std::string_view s, const std::string& path, size_t max_bytes) {
  if (s.empty()) return FieldError(path, "must not be empty");
  if (s.size() > max_bytes) {
    return FieldError(path, fmt::format("is {} bytes long, over the limit of {}", s.size(), max_bytes));
  }
  if (!IsName(s, max_bytes)) {
    return FieldError(path, fmt::format("{} must be lowercase letters, digits, '-', '.' or '_', starting and "
                                        "ending with a letter or digit",
                                        Quote(s)));
  }
  return Status::Ok();
}

Result<std::string> ReadName(const Json& v, const std::string& path, size_t max_bytes) {
  if (!v.is_string()) return TypeError(v, path, "a string");
  const auto& s = v.get_ref<const std::string&>();
  RETURN_IF_ERROR(CheckName(s, path, max_bytes));
  return s;
}

bool IsLabelKey(std::string_view key) {
  const size_t slash = key.find('/');
  if (slash == std::string_view::npos) return IsLabelName(key);
  return IsDnsSubdomain(key.substr(0, slash)) && IsLabelName(key.substr(slash + 1));
}

bool IsLabelValue(std::string_view value) {
  return value.empty() || IsLabelName(value);
}

Result<std::map<std::string, std::string>> ReadLabels(const Json& v, const std::string& path,
                                                      size_t max_entries) {
  if (!v.is_object()) return TypeError(v, path, "an object of label names to strings");
  if (v.size() > max_entries) {
    return FieldError(path, fmt::format("has {} entries, over the limit of {}", v.size(), max_entries));
  }
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : v.items()) {
    if (!IsLabelKey(key)) {
      return FieldError(path, fmt::format("label name {} must be 1..63 of letters, digits, '-', '_' or '.', "
                                          "alphanumeric at both ends, optionally after a DNS prefix and '/'",
                                          Quote(key)));
    }
    if (!value.is_string()) {
      return FieldError(
          path, fmt::format("label {} must have a string value, got {}{}", Quote(key), JsonTypeName(value),
                            value.is_number() || value.is_boolean() ? " (quote it in YAML)" : ""));
    }
    const auto& s = value.get_ref<const std::string&>();
    if (!IsLabelValue(s)) {
      return FieldError(path,
                        fmt::format("label {} has value {}; values are empty or 1..63 of letters, digits, "
                                    "'-', '_' or '.', alphanumeric at both ends",
                                    Quote(key), Quote(s)));
    }
    out.emplace(key, s);
  }
  return out;
}

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace gpupool::api_internal
