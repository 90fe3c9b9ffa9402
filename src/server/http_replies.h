// What the HTTP API's handlers share: the one error shape (code, message, field), JSON answers,
// the deferred answer of a watch, JSON bodies and query parameters read with their bounds.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "http/server.h"
#include "server/watches.h"

namespace gpupool::http_replies {

// The error's "code" string for an HTTP status and a service status code.
std::string ErrorCodeName(int http, StatusCode code);
// {"error": {"code", "message", "field"?}} with the HTTP status `http`.
void SendError(http::Response& res, int http, StatusCode code, const std::string& message,
               const std::string& field = "");
// A service status as its HTTP status and error shape (the field named by "<path>: <reason>").
void SendStatus(http::Response& res, const Status& st);
void SendJson(http::Response& res, int http, const nlohmann::json& body);

// A service watcher whose answer goes out through a deferred HTTP answer: the view, or (a view of
// the error shape: the watched job is gone) 404.
class ResponderWatcher : public Watcher {
 public:
  explicit ResponderWatcher(std::shared_ptr<http::Responder> r) : r_(std::move(r)) {}
  void Deliver(const nlohmann::json& view) override;
  bool waiting() const override { return !r_->sent(); }

 private:
  std::shared_ptr<http::Responder> r_;
};

// The request's media type, lower case, without parameters.
std::string MediaType(const http::Request& req);
// Parses a JSON body (empty: null), or writes the error (415 for another media type, 400 for
// malformed JSON) and returns nothing.
std::optional<nlohmann::json> ReadJsonBody(const http::Request& req, http::Response& res);
// Every comma-separated value of every `key` parameter.
std::set<std::string> SplitParams(const http::Request& req, const std::string& key);
// An integer parameter in [lo, hi] (absent: `def`), or InvalidArgument naming it.
Result<int64_t> IntParam(const http::Request& req, const std::string& key, int64_t def, int64_t lo, int64_t hi);

}  // namespace gpupool::http_replies
