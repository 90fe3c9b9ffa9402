// The Kubernetes API client (kube_client.h) on libcurl.
#include "kube/kube_client.h"

#include <curl/curl.h>

#include <cctype>
#include <future>
#include <mutex>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace gpupool::kube {

namespace {

using Json = nlohmann::json;

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct ListDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};
using Headers = std::unique_ptr<curl_slist, ListDeleter>;

// What a transfer collects: the whole body (a request) or line by line (a watch).
struct Sink {
  size_t max = 0;
  bool too_big = false;
  std::string buffer;
  std::function<bool(std::string_view)> on_line;  // a watch: false stops it
  bool stopped = false;
  const std::atomic<bool>* stop = nullptr;
};

size_t OnData(char* data, size_t size, size_t count, void* user) {
  auto* sink = static_cast<Sink*>(user);
  const size_t n = size * count;
  sink->buffer.append(data, n);
  if (sink->on_line) {
    size_t start = 0;
    for (size_t nl; (nl = sink->buffer.find('\n', start)) != std::string::npos; start = nl + 1) {
      if (!sink->on_line(std::string_view(sink->buffer).substr(start, nl - start))) {
        sink->stopped = true;
        return 0;  // ends the transfer
      }
    }
    sink->buffer.erase(0, start);
  }
  if (sink->buffer.size() > sink->max) {
    sink->too_big = true;
    return 0;
  }
  return n;
}

int OnProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto* sink = static_cast<Sink*>(user);
  return sink->stop != nullptr && sink->stop->load() ? 1 : 0;
}

}  // namespace

Status ErrorOf(const KubeResponse& r, std::string_view what) {
  std::string message = r.body.is_object() ? r.body.value("message", "") : "";
  if (message.empty()) message = fmt::format("HTTP {}", r.code);
  const std::string text = fmt::format("{}: {} ({})", what, message, r.code);
  switch (r.code) {
    case 400:
    case 422:
      return Status::InvalidArgument(text);
    case 401:
      return Status(StatusCode::kUnauthenticated, text);
    case 403:
      return Status::PermissionDenied(text);
    case 404:
      return Status::NotFound(text);
    case 409:
      return Status(StatusCode::kAlreadyExists, text);
    case 410:
      return Status::FailedPrecondition(text);
    default:
      return Status::IoError(text);
  }
}

Result<std::unique_ptr<KubeClient>> KubeClient::Create(KubeEndpoint endpoint, Options options) {
  if (endpoint.server.rfind("https://", 0) != 0 && endpoint.server.rfind("http://", 0) != 0)
    return Status::InvalidArgument(fmt::format("the API server '{}' is not an http(s) URL", endpoint.server));
  if (options.max_body < 4096 || options.page < 1) return Status::InvalidArgument("kube client: bad options");
  GlobalInit();
  return std::unique_ptr<KubeClient>(new KubeClient(std::move(endpoint), options));
}

// What the client's transfers share: TLS sessions and DNS answers (a libcurl share, locked), and
// idle easy handles. A handle keeps its connections open between requests, so a request takes an
// idle one and gives it back: the API server sees kept-open connections, not a new connection (and
// on its side, a new thread) per request. libcurl's shared connection cache is not used: libcurl
// documents it as unsafe between concurrent threads.
struct KubeClient::Shared {
  static constexpr size_t kMaxIdle = 64;
  CURLSH* share = nullptr;
  std::mutex locks[CURL_LOCK_DATA_LAST];
  std::mutex pool_mu;
  std::vector<CURL*> idle;
  CURL* Take() {
    {
      std::lock_guard<std::mutex> lock(pool_mu);
      if (!idle.empty()) {
        CURL* c = idle.back();
        idle.pop_back();
        curl_easy_reset(c);  // options only: its connections stay open
        return c;
      }
    }
    return curl_easy_init();
  }
  void Give(CURL* c) {
    {
      std::lock_guard<std::mutex> lock(pool_mu);
      if (idle.size() < kMaxIdle) {
        idle.push_back(c);
        return;
      }
    }
    curl_easy_cleanup(c);
  }
  static void Lock(CURL*, curl_lock_data data, curl_lock_access, void* self) {
    static_cast<Shared*>(self)->locks[data].lock();
  }
  static void Unlock(CURL*, curl_lock_data data, void* self) { static_cast<Shared*>(self)->locks[data].unlock(); }
  Shared() {
    share = curl_share_init();
    if (share == nullptr) return;
    curl_share_setopt(share, CURLSHOPT_LOCKFUNC, &Shared::Lock);
    curl_share_setopt(share, CURLSHOPT_UNLOCKFUNC, &Shared::Unlock);
    curl_share_setopt(share, CURLSHOPT_USERDATA, this);
    curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
  }
  ~Shared() {
    for (CURL* c : idle) curl_easy_cleanup(c);
    if (share != nullptr) curl_share_cleanup(share);
  }
};

namespace {

// An easy handle on loan from the pool: given back when it goes out of scope.
struct GiveBack {
  KubeClient::Shared* pool = nullptr;
  void operator()(CURL* c) const { pool->Give(c); }
};
using Easy = std::unique_ptr<CURL, GiveBack>;

}  // namespace

KubeClient::KubeClient(KubeEndpoint endpoint, Options options)
    : endpoint_(std::move(endpoint)), options_(options), shared_(std::make_unique<Shared>()) {}

KubeClient::~KubeClient() = default;

std::string KubeClient::Escape(std::string_view value) {
  std::string out;
  for (unsigned char c : value) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

namespace {

// A configured easy handle for `url`, or an error.
Result<Easy> Prepare(const KubeEndpoint& ep, const std::string& url, Headers* headers, Sink* sink,
                     KubeClient::Shared* shared) {
  Easy easy(shared->Take(), GiveBack{shared});
  if (!easy) return Status::Internal("curl_easy_init failed");
  CURL* c = easy.get();
  if (shared->share != nullptr) curl_easy_setopt(c, CURLOPT_SHARE, shared->share);
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, OnData);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, sink);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, OnProgress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, sink);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "gpupool");
  curl_easy_setopt(c, CURLOPT_ACCEPT_ENCODING, "");
  if (!ep.ca_pem.empty()) {
    curl_blob blob{const_cast<char*>(ep.ca_pem.data()), ep.ca_pem.size(), CURL_BLOB_COPY};
    curl_easy_setopt(c, CURLOPT_CAINFO_BLOB, &blob);
  }
  if (ep.insecure_skip_verify) {
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  if (!ep.client_cert_pem.empty()) {
    curl_blob cert{const_cast<char*>(ep.client_cert_pem.data()), ep.client_cert_pem.size(), CURL_BLOB_COPY};
    curl_blob key{const_cast<char*>(ep.client_key_pem.data()), ep.client_key_pem.size(), CURL_BLOB_COPY};
    curl_easy_setopt(c, CURLOPT_SSLCERT_BLOB, &cert);
    curl_easy_setopt(c, CURLOPT_SSLCERTTYPE, "PEM");
    curl_easy_setopt(c, CURLOPT_SSLKEY_BLOB, &key);
    curl_easy_setopt(c, CURLOPT_SSLKEYTYPE, "PEM");
  }
  curl_slist* h = curl_slist_append(nullptr, "Accept: application/json");
  if (!ep.token.empty()) h = curl_slist_append(h, ("Authorization: Bearer " + ep.token).c_str());
  headers->reset(h);
  return easy;
}

Status Perform(CURL* c, const Sink& sink, const std::string& what, size_t max) {
  const CURLcode rc = curl_easy_perform(c);
  if (sink.too_big) return Status::ResourceExhausted(fmt::format("{}: the answer is larger than {} bytes", what, max));
  if (rc != CURLE_OK && !(rc == CURLE_WRITE_ERROR && sink.stopped) &&
      !(rc == CURLE_ABORTED_BY_CALLBACK && sink.stop != nullptr && sink.stop->load()))
    return Status::IoError(fmt::format("{}: {}", what, curl_easy_strerror(rc)));
  return Status::Ok();
}

}  // namespace

Result<KubeResponse> KubeClient::Request(std::string_view method, const std::string& path, const Json* body,
                                         std::string_view content_type) {
  const std::string what = fmt::format("{} {}", method, path);
  Sink sink;
  sink.max = options_.max_body;
  Headers headers;
  ASSIGN_OR_RETURN(Easy easy, Prepare(endpoint_, endpoint_.server + path, &headers, &sink, shared_.get()));
  CURL* c = easy.get();
  std::string payload;
  if (body != nullptr) {
    payload = body->dump();
    headers.reset(curl_slist_append(headers.release(), fmt::format("Content-Type: {}", content_type).c_str()));
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, payload.c_str());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(payload.size()));
  }
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, std::string(method).c_str());
  if (method == "GET") curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(options_.timeout.count()));
  RETURN_IF_ERROR(Perform(c, sink, what, options_.max_body));
  KubeResponse r;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.code);
  r.body = Json::parse(sink.buffer, nullptr, false);
  if (r.body.is_discarded()) r.body = nullptr;
  return r;
}

Result<KubeList> KubeClient::List(const std::string& path, const std::string& query) {
  KubeList out;
  ASSIGN_OR_RETURN(out.resource_version,
                   ListEach(path, query, [&out](Json&& item) { out.items.push_back(std::move(item)); }));
  return out;
}

Result<std::string> KubeClient::ListEach(const std::string& path, const std::string& query,
                                         const std::function<void(Json&&)>& on_item) {
  std::string resource_version;
  auto fetch = [this, &path, &query](const std::string& cont) {
    std::string q = fmt::format("?limit={}", options_.page);
    if (!query.empty()) q += "&" + query;
    if (!cont.empty()) q += "&continue=" + Escape(cont);
    return Get(path + q);
  };
  Result<KubeResponse> page = fetch("");
  for (int pages = 0;; ++pages) {
    if (pages > 100000) return Status::Internal(fmt::format("GET {}: no end to its pages", path));
    if (!page.ok()) return page.status();
    KubeResponse r = std::move(page).value();
    if (r.code != 200 || !r.body.is_object()) return ErrorOf(r, "GET " + path);
    const Json& meta = r.body.value("metadata", Json::object());
    if (resource_version.empty() && meta.is_object()) resource_version = meta.value("resourceVersion", "");
    const std::string cont = meta.is_object() ? meta.value("continue", "") : "";
    // The next page is asked for before this one's items are handed over.
    std::future<Result<KubeResponse>> next;
    if (!cont.empty()) next = std::async(std::launch::async, fetch, cont);
    if (const auto it = r.body.find("items"); it != r.body.end() && it->is_array())
      for (Json& item : *it) on_item(std::move(item));
    if (cont.empty()) return resource_version;
    page = next.get();
  }
}

Result<WatchEnd> KubeClient::Watch(const std::string& path, const std::string& query,
                                   const std::string& resource_version,
                                   const std::function<bool(const WatchEvent&)>& on_event, std::chrono::seconds timeout,
                                   const std::atomic<bool>* stop) {
  const std::string what = "watch " + path;
  WatchEnd end;
  end.resource_version = resource_version;
  Status error = Status::Ok();
  Sink sink;
  sink.max = options_.max_body;
  sink.stop = stop;
  sink.on_line = [&](std::string_view line) {
    if (line.empty() || line == "\r") return true;
    Json ev = Json::parse(line, nullptr, false);
    if (!ev.is_object() || !ev.contains("type") || !ev["type"].is_string() || !ev.contains("object") ||
        !ev["object"].is_object()) {
      error = Status::IoError(fmt::format("{}: an event that is not {{type, object}}", what));
      return false;
    }
    WatchEvent event{ev["type"].get<std::string>(), std::move(ev["object"])};
    if (event.type == "ERROR") {
      const int code = event.object.value("code", 0);
      if (code == 410) {
        end.gone = true;
      } else {
        error = ErrorOf(KubeResponse{code, event.object}, what);
      }
      return false;
    }
    if (const auto md = event.object.find("metadata"); md != event.object.end() && md->is_object())
      if (const std::string rv = md->value("resourceVersion", ""); !rv.empty()) end.resource_version = rv;
    ++end.events;
    return on_event(event);
  };
  std::string q = "?watch=true&allowWatchBookmarks=true&timeoutSeconds=" + std::to_string(timeout.count());
  if (!resource_version.empty()) q += "&resourceVersion=" + Escape(resource_version);
  if (!query.empty()) q += "&" + query;
  Headers headers;
  ASSIGN_OR_RETURN(Easy easy, Prepare(endpoint_, endpoint_.server + path + q, &headers, &sink, shared_.get()));
  CURL* c = easy.get();
  curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
  // The server ends the stream at timeoutSeconds; a little later, the client does.
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>((timeout.count() + 10) * 1000));
  const Status st = Perform(c, sink, what, options_.max_body);
  long code = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
  if (code != 0 && code != 200) {
    KubeResponse r{code, Json::parse(sink.buffer, nullptr, false)};
    if (r.body.is_discarded()) r.body = nullptr;
    if (code == 410) {
      end.gone = true;
      return end;
    }
    return ErrorOf(r, what);
  }
  if (!error.ok()) return error;
  if (!st.ok()) {
    // The client's own deadline (the server did not end the stream at timeoutSeconds) ends a watch
    // like the server's end does; anything else is an error.
    const CURLcode timed_out = CURLE_OPERATION_TIMEDOUT;
    if (st.message().find(curl_easy_strerror(timed_out)) != std::string::npos) return end;
    return st;
  }
  return end;
}

}  // namespace gpupool::kube
