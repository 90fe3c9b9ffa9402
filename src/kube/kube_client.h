// A client of the Kubernetes API server: requests over HTTPS through libcurl (Debian's), JSON through
// nlohmann-json, lists page by page, watches as streams of events. It knows the API's protocol
// (paging, watch events, Status errors), not gpupool's objects: the scheduler and the node daemon
// build on it. Every answer is bounded in size and time.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "kube/kube_config.h"

namespace gpupool::kube {

struct KubeResponse {
  long code = 0;        // the HTTP status
  nlohmann::json body;  // the JSON answer (null when it was not JSON)
};

struct KubeList {
  std::string resource_version;  // of the snapshot every page was read from
  std::vector<nlohmann::json> items;
};

struct WatchEvent {
  std::string type;  // ADDED, MODIFIED, DELETED, BOOKMARK
  nlohmann::json object;
};

struct WatchEnd {
  bool gone = false;             // the resourceVersion was too old (410): list again
  std::string resource_version;  // the last one seen (an object's or a bookmark's)
  uint64_t events = 0;
};

// A failed answer as a Status: 401 Unauthenticated, 403 PermissionDenied, 404 NotFound, 409
// AlreadyExists ("Conflict": another writer won; read again), 400/422 InvalidArgument, 410
// FailedPrecondition ("Gone"), 429 and 5xx IoError; the API server's message included.
Status ErrorOf(const KubeResponse& r, std::string_view what);

class KubeClient {
 public:
  struct Options {
    std::chrono::milliseconds timeout{30000};  // one request (not a watch)
    size_t max_body = size_t{64} << 20;        // one answer, or one watch event
    int page = 500;                             // List's page size
  };

  static Result<std::unique_ptr<KubeClient>> Create(KubeEndpoint endpoint, Options options);
  static Result<std::unique_ptr<KubeClient>> Create(KubeEndpoint endpoint) { return Create(std::move(endpoint), {}); }
  ~KubeClient();
  KubeClient(const KubeClient&) = delete;
  KubeClient& operator=(const KubeClient&) = delete;

  const KubeEndpoint& endpoint() const { return endpoint_; }

  // One request; `path` starts with '/' and may carry a query. Transport failures (connection,
  // TLS, timeout, an answer over max_body) are errors; any HTTP answer is a response.
  Result<KubeResponse> Request(std::string_view method, const std::string& path, const nlohmann::json* body = nullptr,
                               std::string_view content_type = "application/json");
  Result<KubeResponse> Get(const std::string& path) { return Request("GET", path); }

  // Every item of a collection, `page` at a time, all from one snapshot (continue); `query` is
  // added to each request (labelSelector=..., fieldSelector=..., URL-encoded by the caller).
  Result<KubeList> List(const std::string& path, const std::string& query = "");

  // The same list given item by item to `on_item` as each page arrives, the next page fetched
  // meanwhile (so the server writes it while this side reads the last); returns the snapshot's
  // resourceVersion. An error after some pages: those items were given already.
  Result<std::string> ListEach(const std::string& path, const std::string& query,
                               const std::function<void(nlohmann::json&&)>& on_item);

  // Watches `path` from `resource_version` (empty: the current state first, as ADDED events),
  // with bookmarks. Each event goes to `on_event`; returning false ends the watch. Ends when the
  // server closes the stream, after `timeout`, when `stop` becomes true (checked about once a
  // second), or on an ERROR event (410: WatchEnd::gone; others: an error).
  Result<WatchEnd> Watch(const std::string& path, const std::string& query, const std::string& resource_version,
                         const std::function<bool(const WatchEvent&)>& on_event, std::chrono::seconds timeout,
                         const std::atomic<bool>* stop = nullptr);

  // Percent-encodes a query parameter's value.
  static std::string Escape(std::string_view value);

  // Connections (in idle easy handles), TLS sessions and DNS answers kept and shared by every
  // request of this client, on any thread: a binding does not pay a TCP and TLS handshake.
  struct Shared;

 private:
  KubeClient(KubeEndpoint endpoint, Options options);
  KubeEndpoint endpoint_;
  Options options_;
  std::unique_ptr<Shared> shared_;
};

}  // namespace gpupool::kube
