// libFuzzer target for the request path every byte from a client takes before a handler: the HTTP
// parser with the server's limits (http::ParseRequestBytes: head, target, percent-decoding, text
// checks, body), then the guarded JSON parse every body goes through (ParseJsonBody), then the
// node spec codec agents' registrations go through. Whatever the input: no crash, no sanitizer
// report, no exception; every refusal is a 4xx the server can put in a JSON error (valid UTF-8);
// every accepted request has a path and parameters that are text. Run with scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "api/jobspec.h"
#include "api/node_codec.h"
#include "http/server.h"
#include "model/gpu_catalog.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "http_fuzz: %s\n%s\n", what, detail.c_str());
  std::abort();
}

void CheckMessage(const gpupool::Status& st) {
  try {
    (void)nlohmann::json(st.message()).dump();
  } catch (const std::exception& e) {
    Fail("error message is not valid UTF-8", e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  gpupool::http::ServerOptions options;
  options.max_body_bytes = 64 << 10;
  options.max_header_bytes = 8 << 10;
  gpupool::http::Request req;
  int status = 0;
  try {
    const gpupool::Status st = gpupool::http::ParseRequestBytes(bytes, options, &req, &status);
    if (!st.ok()) {
      if (status != 400 && status != 413 && status != 414 && status != 431)
        Fail("refusal is not 400/413/414/431", std::to_string(status));
      CheckMessage(st);
      return 0;
    }
    if (!gpupool::http::ValidText(req.path)) Fail("accepted a path that is not text", req.path);
    for (const auto& [k, v] : req.params) {
      if (!gpupool::http::ValidText(k) || !gpupool::http::ValidText(v)) Fail("accepted a parameter that is not text", k);
    }
    if (req.body.empty()) return 0;
    auto body = gpupool::ParseJsonBody(req.body);
    if (!body.ok()) {
      if (body.status().code() != gpupool::StatusCode::kInvalidArgument) Fail("not InvalidArgument", body.status().ToString());
      CheckMessage(body.status());
      return 0;
    }
    (void)body->dump();  // an accepted body is valid JSON text: dumping cannot throw
    static const gpupool::GpuCatalog catalog = gpupool::GpuCatalog::Builtin();
    auto spec = gpupool::ParseNodeSpec(*body, catalog);
    if (!spec.ok()) CheckMessage(spec.status());
  } catch (const std::exception& e) {
    Fail("exception", e.what());
  }
  return 0;
}
