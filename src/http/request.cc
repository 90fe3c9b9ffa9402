// Requests and responses as handlers see them, and the parsing every request's head goes through
// before routing: percent-decoding, the text check, the target split (http/server.h).
#include <fmt/format.h>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http.hpp>

#include "http/request_internal.h"
#include "http/server.h"

namespace gpupool::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;

// ---- Request / Response ---------------------------------------------------------------------------

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool Request::has_header(const std::string& name) const { return headers.count(Lower(name)) > 0; }

std::string Request::get_header_value(const std::string& name) const {
  auto it = headers.find(Lower(name));
  return it == headers.end() ? std::string() : it->second;
}

bool Request::has_param(const std::string& key) const { return params.count(key) > 0; }

std::string Request::get_param_value(const std::string& key, size_t index) const {
  auto [lo, hi] = params.equal_range(key);
  for (auto it = lo; it != hi; ++it, --index) {
    if (index == 0) return it->second;
  }
  return {};
}

size_t Request::get_param_value_count(const std::string& key) const { return params.count(key); }

std::shared_ptr<Responder> Response::Defer(std::chrono::milliseconds timeout, Response on_timeout) {
  if (!defer_hook || deferred_) return nullptr;
  deferred_ = true;
  return defer_hook(timeout, std::move(on_timeout));
}

void Response::set_content(std::string content, const std::string& content_type) {
  body = std::move(content);
  set_header("Content-Type", content_type);
}

void Response::set_header(const std::string& name, const std::string& value) {
  // Header values come from handlers, which may echo what a client sent: no line breaks.
  std::string v = value;
  for (char& c : v) {
    if (c == '\r' || c == '\n' || c == '\0') c = ' ';
  }
  for (auto& [k, old] : headers) {
    if (Lower(k) == Lower(name)) {
      old = v;
      return;
    }
  }
  headers.emplace_back(name, v);
}

bool Response::has_header(const std::string& name) const {
  for (const auto& [k, v] : headers) {
    if (Lower(k) == Lower(name)) return true;
  }
  return false;
}

// ---- text -----------------------------------------------------------------------------------------

bool PercentDecode(std::string_view in, bool plus_is_space, std::string* out) {
  out->clear();
  out->reserve(in.size());
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) return false;
      const int h = hex(in[i + 1]), l = hex(in[i + 2]);
      if (h < 0 || l < 0) return false;
      out->push_back(static_cast<char>(h * 16 + l));
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out->push_back(' ');
    } else {
      out->push_back(c);
    }
  }
  return true;
}

bool ValidText(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      if (b < 0x20 || b == 0x7f) return false;
      ++i;
      continue;
    }
    int n = 0;
    uint32_t cp = 0;
    if ((b & 0xe0) == 0xc0) {
      n = 1;
      cp = b & 0x1f;
    } else if ((b & 0xf0) == 0xe0) {
      n = 2;
      cp = b & 0x0f;
    } else if ((b & 0xf8) == 0xf0) {
      n = 3;
      cp = b & 0x07;
    } else {
      return false;
    }
    if (i + static_cast<size_t>(n) >= s.size()) return false;
    for (int k = 1; k <= n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((c & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    if (cp >= 0x80 && cp < 0xa0) return false;  // C1 controls
    i += static_cast<size_t>(n) + 1;
  }
  return true;
}

Status ParseTarget(std::string_view t, Request* req) {
  if (t.empty() || t[0] != '/') return Status::InvalidArgument("request target: must start with '/'");
  const auto q = t.find('?');
  std::string_view raw_path = t.substr(0, q);
  if (!PercentDecode(raw_path, false, &req->path)) return Status::InvalidArgument("path: bad percent escape");
  if (!ValidText(req->path)) return Status::InvalidArgument("path: not valid UTF-8 text");
  if (q == std::string_view::npos) return Status::Ok();
  std::string_view query = t.substr(q + 1);
  size_t count = 0;
  while (!query.empty()) {
    const auto amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (pair.empty()) continue;
    if (++count > 64) return Status::InvalidArgument("query: more than 64 parameters");
    const auto eq = pair.find('=');
    std::string k, v;
    if (!PercentDecode(pair.substr(0, eq), true, &k) ||
        (eq != std::string_view::npos && !PercentDecode(pair.substr(eq + 1), true, &v)))
      return Status::InvalidArgument("query: bad percent escape");
    if (!ValidText(k)) return Status::InvalidArgument("query: a parameter name is not valid UTF-8 text");
    if (!ValidText(v)) return Status::InvalidArgument(fmt::format("{}: not valid UTF-8 text", k));
    req->params.emplace(std::move(k), std::move(v));
  }
  return Status::Ok();
}


Status ParseRequestBytes(std::string_view bytes, const ServerOptions& options, Request* req, int* http_status) {
  *http_status = 400;
  bhttp::request_parser<bhttp::string_body> parser;
  parser.header_limit(static_cast<uint32_t>(options.max_header_bytes));
  parser.body_limit(options.max_body_bytes);
  parser.eager(true);
  beast::error_code ec;
  size_t used = 0;
  while (used < bytes.size() && !parser.is_done()) {
    const size_t n = parser.put(net::buffer(bytes.data() + used, bytes.size() - used), ec);
    if (ec == bhttp::error::need_more) break;
    if (ec) break;
    if (n == 0) break;
    used += n;
  }
  if (ec == bhttp::error::body_limit) {
    *http_status = 413;
    return Status::InvalidArgument("body: larger than the server's limit");
  }
  if (ec == bhttp::error::header_limit) {
    *http_status = 431;
    return Status::InvalidArgument("request head: larger than the server's limit");
  }
  if (ec && ec != bhttp::error::need_more) return Status::InvalidArgument(fmt::format("malformed HTTP request: {}", ec.message()));
  if (!parser.is_header_done()) return Status::InvalidArgument("malformed HTTP request: incomplete head");
  const auto& h = parser.get();
  *req = Request{};
  req->method = std::string(h.method_string());
  req->target = std::string(h.target());
  for (const auto& f : h) req->headers.emplace(Lower(std::string(f.name_string())), std::string(f.value()));
  if (req->target.size() > options.max_target_bytes) {
    *http_status = 414;
    return Status::InvalidArgument(fmt::format("request target: longer than {} bytes", options.max_target_bytes));
  }
  RETURN_IF_ERROR(ParseTarget(req->target, req));
  if (const auto len = parser.content_length(); len && *len > options.max_body_bytes) {
    *http_status = 413;
    return Status::InvalidArgument("body: larger than the server's limit");
  }
  if (!parser.is_done()) return Status::InvalidArgument("malformed HTTP request: incomplete body");
  req->body = parser.get().body();
  *http_status = 200;
  return Status::Ok();
}

}  // namespace gpupool::http
