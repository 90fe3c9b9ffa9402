// Reading a JSON tree into model values with errors that name the field at fault. Shared by the
// job spec and node codecs (internal to gpupool_api; the server uses jobspec.h and node_codec.h).
//
// Every error is Status::InvalidArgument with the message "<field path>: <reason>", the path in
// the spec's own spelling: "tasks[0].resources.gpu", "affinity.nodeAffinity[1].operator". An
// error about the document as a whole has the empty path and is written "spec: <reason>".
//
// A JSON null counts as absent everywhere: YAML writes an empty value (`labels:`) as null.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/quantity.h"
#include "common/status.h"

namespace gpupool::api_internal {

using Json = nlohmann::json;

// "<path>: <reason>", or "spec: <reason>" for the empty path.
Status FieldError(std::string_view path, std::string_view reason);
// "a.b" (or "b" under the root) and "a[3]".
std::string FieldPath(std::string_view parent, std::string_view key);
std::string IndexPath(std::string_view parent, size_t index);

// "object", "array", "string", "boolean", "integer", "number" or "null".
std::string_view JsonTypeName(const Json& v);

// The members of one JSON object. Read() fails when `v` is not an object or has a member whose
// name is not in `known` (the error lists the known names), so callers only look up known names.
class ObjectFields {
 public:
  static Result<ObjectFields> Read(const Json& v, std::string path, std::initializer_list<const char*> known);

  // The member, or nullptr when it is absent or null.
  const Json* Get(std::string_view key) const;
  bool Has(std::string_view key) const { return Get(key) != nullptr; }
  // The path of member `key`.
  std::string Path(std::string_view key) const { return FieldPath(path_, key); }
  const std::string& path() const { return path_; }

 private:
  ObjectFields(const Json* object, std::string path) : object_(object), path_(std::move(path)) {}
  const Json* object_;
  std::string path_;
};

// A string of at most `max_bytes` bytes without NUL characters.
Result<std::string> ReadString(const Json& v, const std::string& path, size_t max_bytes);
// An integer in [min, max]. A float with an integral value (2.0) counts as that integer.
Result<int64_t> ReadInt(const Json& v, const std::string& path, int64_t min, int64_t max);
// A finite number.
Result<double> ReadNumber(const Json& v, const std::string& path);
Result<bool> ReadBool(const Json& v, const std::string& path);
// An array of at most `max_items` elements; the elements are the caller's to read.
Result<const Json::array_t*> ReadArray(const Json& v, const std::string& path, size_t max_items);

// CPU: a number of cores (2, 0.5) or a string ("2", "0.5", "500m"); at most `max`.
Result<MilliCpu> ReadCpu(const Json& v, const std::string& path, MilliCpu max);
// Memory: a string with a unit ("8Gi", "512Mi", "1G"); bare numbers are refused because they
// would mean bytes, which is never what a request means. Rounded up to whole MiB; at most `max`.
Result<MiB> ReadMemory(const Json& v, const std::string& path, MiB max);

// Names of jobs, tasks, tenants, queues and nodes: lowercase letters, digits, '-', '.', '_',
// starting and ending with a letter or digit, 1..max_bytes long.
bool IsName(std::string_view s, size_t max_bytes);
Status CheckName(std::string_view s, const std::string& path, size_t max_bytes);
Result<std::string> ReadName(const Json& v, const std::string& path, size_t max_bytes);

// Labels, after Kubernetes: a key is an optional DNS-subdomain prefix (<= 253 bytes) and '/',
// then a name of 1..63 bytes of [A-Za-z0-9-_.] starting and ending alphanumeric; a value is empty
// or such a name. At most `max_entries` entries. Errors name the map's path and quote the key.
Result<std::map<std::string, std::string>> ReadLabels(const Json& v, const std::string& path,
                                                      size_t max_entries);
bool IsLabelKey(std::string_view key);
bool IsLabelValue(std::string_view value);

// Renders a value for "got ..." in messages: short, strings quoted and cut at 40 bytes.
std::string DescribeValue(const Json& v);
// 'text' for a message: cut at 40 bytes on a UTF-8 boundary, control characters as \xNN, so a
// message stays short and valid UTF-8 whatever the input was.
std::string Quote(std::string_view text);
// True for well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool IsValidUtf8(std::string_view s);

// Non-empty and only the digits 0-9.
bool AllDigits(std::string_view s);
// `text` made safe for a message: bytes that are not part of well-formed UTF-8 become '?', control
// characters \xNN. For third-party error texts that quote the input (nlohmann's "last read: ...").
std::string PrintableUtf8(std::string_view text);
// True for a member name that may appear in a field path as is (letters, digits, '-', '_'; at
// most 64 bytes). Other names are quoted in the reason instead.
bool IsPathSafeKey(std::string_view key);

// Formats a double the short way (1.5, 0.25, 1e+09) for messages.
std::string FormatNumber(double d);

}  // namespace gpupool::api_internal
