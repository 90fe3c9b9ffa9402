#include "server/http_replies.h"

#include <fmt/format.h>

#include <sstream>

#include "api/jobspec.h"
#include "server/http_api.h"

namespace gpupool::http_replies {

using nlohmann::json;

std::string ErrorCodeName(int http, StatusCode code) {
  switch (http) {
    case 413: return "PayloadTooLarge";
    case 415: return "UnsupportedMediaType";
    case 502: return "BadGateway";
    case 422: return "QuotaExceeded";
    case 405: return "MethodNotAllowed";
    case 414: return "UriTooLong";
    case 431: return "HeaderTooLarge";
    case 503: return "Unavailable";
    case 507: return "InsufficientStorage";
    default: break;
  }
  if (code == StatusCode::kIoError) return "Internal";
  return std::string(StatusCodeName(code));
}

void SendError(http::Response& res, int http, StatusCode code, const std::string& message,
               const std::string& field) {
  json err = {{"code", ErrorCodeName(http, code)}, {"message", message}};
  if (!field.empty()) err["field"] = field;
  res.status = http;
  // Replace, never throw: a message may quote bytes a client sent.
  res.set_content(json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void SendStatus(http::Response& res, const Status& st) {
  const int http = HttpApi::HttpStatusFor(st.code());
  std::string field;
  if (http == 400 || http == 403 || http == 422) field = ErrorField(st);
  if (http == 403 && field.empty() && st.code() == StatusCode::kPermissionDenied) {
    // Queue access refusals say which field of the job the rule is about ("queue: ...").
    const std::string& m = st.message();
    for (const char* f : {"queue", "priority", "qos"}) {
      if (m.rfind(std::string(f) + ": ", 0) == 0) field = f;
    }
  }
  SendError(res, http, st.code(), st.message(), field);
  // A pending limit lifts as the tenant's (or queue's) jobs start or end: a client that retries
  // should not do it at once.
  if (http == 429) res.set_header("Retry-After", "5");
}

void SendJson(http::Response& res, int http, const json& body) {
  res.status = http;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void ResponderWatcher::Deliver(const json& view) {
  http::Response res;
  SendJson(res, view.contains("error") ? 404 : 200, view);
  r_->Send(std::move(res));
}

std::string MediaType(const http::Request& req) {
  std::string ct = req.get_header_value("Content-Type");
  const auto semi = ct.find(';');
  if (semi != std::string::npos) ct = ct.substr(0, semi);
  while (!ct.empty() && ct.back() == ' ') ct.pop_back();
  for (char& c : ct) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ct;
}

// Parses a JSON body (empty: null), or writes the error (415 for another media type, 400 for
// malformed JSON) and returns nothing.
std::optional<json> ReadJsonBody(const http::Request& req, http::Response& res) {
  const std::string ct = MediaType(req);
  if (!ct.empty() && ct != "application/json") {
    SendError(res, 415, StatusCode::kInvalidArgument,
              fmt::format("body: content type '{}' is not supported here (use application/json)", ct));
    return std::nullopt;
  }
  if (req.body.empty()) return json(nullptr);
  // Depth-bounded and duplicate-free, like job specs: no body can exhaust the stack.
  auto j = ParseJsonBody(req.body);
  if (!j.ok()) {
    SendStatus(res, j.status());
    return std::nullopt;
  }
  return *std::move(j);
}

std::set<std::string> SplitParams(const http::Request& req, const std::string& key) {
  std::set<std::string> out;
  const size_t n = req.get_param_value_count(key);
  for (size_t i = 0; i < n; ++i) {
    std::stringstream ss(req.get_param_value(key, i));
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (!item.empty()) out.insert(item);
    }
  }
  return out;
}

Result<int64_t> IntParam(const http::Request& req, const std::string& key, int64_t def, int64_t lo,
                         int64_t hi) {
  if (!req.has_param(key.c_str())) return def;
  const std::string v = req.get_param_value(key.c_str());
  if (v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos)
    return Status::InvalidArgument(fmt::format("{}: must be a whole number, got '{}'", key, v));
  const int64_t x = std::stoll(v);
  if (x < lo || x > hi)
    return Status::InvalidArgument(fmt::format("{}: must be between {} and {}", key, lo, hi));
  return x;
}

}  // namespace gpupool::http_replies
