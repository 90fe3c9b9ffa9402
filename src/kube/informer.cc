// List and watch one collection (informer.h).
#include "kube/informer.h"

#include <algorithm>
#include <optional>
#include <utility>

#include <fmt/format.h>

namespace gpupool::kube {

using Json = nlohmann::json;

std::string ObjectKey(const Json& object) {
  if (!object.is_object()) return "";
  const auto md = object.find("metadata");
  if (md == object.end() || !md->is_object()) return "";
  const std::string name = md->value("name", "");
  if (name.empty()) return "";
  std::string key = md->value("namespace", "");
  key.push_back('/');
  key.append(name);
  return key;
}

namespace {

std::string VersionOf(const Json& object) {
  const auto md = object.find("metadata");
  return md != object.end() && md->is_object() ? md->value("resourceVersion", "") : "";
}

// What a copy without objects keeps of one: its name, namespace, uid and resourceVersion.
Json Slim(const Json& object) {
  Json md = Json::object();
  if (const auto it = object.find("metadata"); it != object.end() && it->is_object())
    for (const char* field : {"name", "namespace", "uid", "resourceVersion"})
      if (const auto f = it->find(field); f != it->end() && f->is_string()) md[field] = *f;
  return Json{{"metadata", std::move(md)}};
}

}  // namespace

Informer::Informer(KubeClient* client, Options options, Handler handler)
    : client_(client), options_(std::move(options)), handler_(std::move(handler)) {}

Informer::~Informer() { Stop(); }

void Informer::Start() {
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { Run(); });
}

void Informer::Stop() {
  stop_ = true;
  interrupt_ = true;
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

uint64_t Informer::Resync() {
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ticket = list_starts_ + 1;  // the next list to start
    resync_ = true;
    interrupt_ = true;
  }
  cv_.notify_all();
  return ticket;
}

bool Informer::ListedSince(uint64_t ticket) const {
  std::lock_guard<std::mutex> lock(mu_);
  return listed_start_ >= ticket;
}

bool Informer::WaitSynced(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [this] { return synced_; });
}

std::map<std::string, Json> Informer::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return objects_;
}

std::string Informer::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

void Informer::SleepFor(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, d, [this] { return stop_.load() || resync_.load(); });
}

void Informer::Apply(const std::string& type, const Json& object) {
  const std::string key = ObjectKey(object);
  if (key.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (type == "DELETED") {
      objects_.erase(key);
    } else {
      objects_[key] = options_.keep_objects ? object : Slim(object);
    }
  }
  if (handler_) handler_(type, object);
}

bool Informer::Relist() {
  bool empty = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    empty = objects_.empty();
  }
  // Nothing to compare with (the first list, or a copy that held nothing): each item is an
  // addition, applied as its page arrives; no list of every object is held at once. Over a copy,
  // the whole list first, deletions applied before the rest: a pod gone frees what a pod bound
  // since may hold.
  Result<std::string> rv =
      empty ? client_->ListEach(options_.path, options_.query, [this](Json&& item) { Apply("ADDED", item); })
            : ListOverCopy();
  if (!rv.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    last_error_ = rv.status().ToString();
    return false;
  }
  ++lists_;
  resource_version_ = *rv;
  {
    std::lock_guard<std::mutex> lock(mu_);
    synced_ = true;
  }
  cv_.notify_all();
  return true;
}

Result<std::string> Informer::ListOverCopy() {
  ASSIGN_OR_RETURN(KubeList list, client_->List(options_.path, options_.query));
  // What changed since the copy: new objects added, changed ones modified, missing ones deleted.
  std::map<std::string, const Json*> now;
  for (const Json& item : list.items)
    if (const std::string key = ObjectKey(item); !key.empty()) now[key] = &item;
  std::vector<Json> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, obj] : objects_)
      if (now.count(key) == 0) gone.push_back(obj);
  }
  for (const Json& obj : gone) Apply("DELETED", obj);
  for (const auto& [key, item] : now) {
    std::optional<std::string> had;  // the copy's resourceVersion; none: not in the copy
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto it = objects_.find(key);
      if (it != objects_.end()) had = VersionOf(it->second);
    }
    if (!had) {
      Apply("ADDED", *item);
    } else if (*had != VersionOf(*item)) {
      Apply("MODIFIED", *item);
    }
  }
  return list.resource_version;
}

void Informer::Run() {
  std::chrono::milliseconds backoff = options_.backoff_min;
  bool need_list = true;
  while (!stop_) {
    uint64_t start = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (resync_.exchange(false)) need_list = true;
      interrupt_ = stop_.load();
      if (need_list) start = ++list_starts_;
    }
    if (need_list) {
      if (!Relist()) {
        ++failures_;
        SleepFor(backoff);
        backoff = std::min(backoff * 2, options_.backoff_max);
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        listed_start_ = start;
      }
      need_list = false;
    }
    auto end = client_->Watch(
        options_.path, options_.query, resource_version_,
        [this](const WatchEvent& e) {
          if (e.type == "BOOKMARK") {
            const std::string rv = VersionOf(e.object);
            if (!rv.empty()) resource_version_ = rv;
            return !interrupt_.load();
          }
          if (e.type != "ADDED" && e.type != "MODIFIED" && e.type != "DELETED") return !interrupt_.load();
          Apply(e.type, e.object);
          const std::string rv = VersionOf(e.object);
          if (!rv.empty()) resource_version_ = rv;
          return !interrupt_.load();
        },
        options_.watch_timeout, &interrupt_);
    if (stop_) break;
    if (resync_) continue;  // list again at once
    if (!end.ok()) {
      ++failures_;
      {
        std::lock_guard<std::mutex> lock(mu_);
        last_error_ = end.status().ToString();
      }
      SleepFor(backoff);
      backoff = std::min(backoff * 2, options_.backoff_max);
      need_list = true;
      continue;
    }
    backoff = options_.backoff_min;
    if (end->gone) need_list = true;  // too far behind: the copy is repaired from a fresh list
  }
}

}  // namespace gpupool::kube
