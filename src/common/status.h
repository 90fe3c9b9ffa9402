// Status and Result: errors are values in gpupool. No exception crosses a library boundary;
// third-party exceptions are caught at the I/O edges (config, sim, server) and turned into Status.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace gpupool {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kAlreadyExists,
  kFailedPrecondition,
  kResourceExhausted,  // does not fit: the request is valid but capacity is missing
  kUnschedulable,
  kIoError,
  kInternal,
  kUnauthenticated,   // no credentials, or unknown ones
  kPermissionDenied,  // known caller, not allowed to do this
  kLimitExceeded,     // valid, but over a configured limit that frees up later (pending jobs of a tenant)
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  static Status InvalidArgument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
  static Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status AlreadyExists(std::string msg) { return {StatusCode::kAlreadyExists, std::move(msg)}; }
  static Status FailedPrecondition(std::string msg) {
    return {StatusCode::kFailedPrecondition, std::move(msg)};
  }
  static Status ResourceExhausted(std::string msg) {
    return {StatusCode::kResourceExhausted, std::move(msg)};
  }
  static Status Unschedulable(std::string msg) { return {StatusCode::kUnschedulable, std::move(msg)}; }
  static Status IoError(std::string msg) { return {StatusCode::kIoError, std::move(msg)}; }
  static Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }
  static Status Unauthenticated(std::string msg) { return {StatusCode::kUnauthenticated, std::move(msg)}; }
  static Status PermissionDenied(std::string msg) {
    return {StatusCode::kPermissionDenied, std::move(msg)};
  }

  static Status LimitExceeded(std::string msg) { return {StatusCode::kLimitExceeded, std::move(msg)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: gpu must be below 1 or a whole number"
  std::string ToString() const;

  // Returns a copy whose message is prefixed with `context: `.
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// A value or an error. Small enough to be swapped for std::expected later.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : data_(std::move(status)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(data_); }
  const Status& status() const {
    static const Status kOkStatus;  // constant, shared by all OK results
    return ok() ? kOkStatus : std::get<Status>(data_);
  }
  // REQUIRES: ok()
  T& value() & { return std::get<T>(data_); }
  const T& value() const& { return std::get<T>(data_); }
  T&& value() && { return std::get<T>(std::move(data_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> data_;
};

}  // namespace gpupool

#define GPUPOOL_CONCAT_INNER(a, b) a##b
#define GPUPOOL_CONCAT(a, b) GPUPOOL_CONCAT_INNER(a, b)

// Returns from the current function when `expr` (a Status) is not OK.
#define RETURN_IF_ERROR(expr)       \
  do {                              \
    ::gpupool::Status _st = (expr); \
    if (!_st.ok()) return _st;      \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, MakeX());`
#define ASSIGN_OR_RETURN(lhs, expr) ASSIGN_OR_RETURN_IMPL(GPUPOOL_CONCAT(_res_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
