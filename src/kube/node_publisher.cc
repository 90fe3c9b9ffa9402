#include "kube/node_publisher.h"

#include <fmt/format.h>

#include "kube/json_fields.h"
#include "kube/kube_node.h"

namespace gpupool::kube {

using Json = nlohmann::json;

std::string InventoryAnnotation(const Inventory& inv, const std::string& node) {
  Json j = NodeRegistration(inv, node, "0", "0", {});
  for (const char* key : {"name", "cpu", "memory", "labels"}) j.erase(key);
  return j.dump();
}

NodePublisher::NodePublisher(KubeClient* client, Inventory inventory, Options options, HealthFn health)
    : client_(client), options_(std::move(options)), health_(std::move(health)), inventory_(std::move(inventory)) {}

NodePublisher::~NodePublisher() { Stop(); }

Inventory NodePublisher::inventory() const {
  std::lock_guard<std::mutex> lock(mu_);
  return inventory_;
}

std::string NodePublisher::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

Status NodePublisher::PublishOnce() {
  auto fail = [&](Status st) {
    std::lock_guard<std::mutex> lock(mu_);
    last_error_ = st.message();
    return st;
  };
  std::string want;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (health_) {
      auto samples = health_();
      if (samples.ok()) {
        for (const GpuHealthSample& s : *samples) {
          for (GpuInfo& g : inventory_.gpus) {
            if (g.index != s.index) continue;
            // An unhealthy GPU stays so until the daemon restarts (as the agent does: an XID is
            // an event, not a state that clears itself).
            if (!s.healthy && g.healthy) {
              g.healthy = false;
              g.health_reason = s.reason;
            }
          }
        }
      }
    }
    want = InventoryAnnotation(inventory_, options_.node);
    // Unchanged since the last write or check: the Node is read again only every resync period
    // (someone may have removed the annotation), so 5,000 nodes cost the API server ~17 reads/s.
    if (published_.load() && want == last_seen_ && std::chrono::steady_clock::now() - last_check_ < options_.resync)
      return Status::Ok();
  }
  const std::string path = "/api/v1/nodes/" + KubeClient::Escape(options_.node);
  auto node = client_->Get(path);
  if (!node.ok()) return fail(node.status().WithContext("reading the Node"));
  if (node->code != 200) {
    published_ = false;
    return fail(ErrorOf(*node, fmt::format("reading Node {}", options_.node)));
  }
  const Json& have = json_fields::At(json_fields::At(json_fields::At(node->body, "metadata"), "annotations"), kInventoryKey);
  // The Node carries `want` now: published, and nothing to read again until the resync period.
  auto done = [&] {
    published_ = true;
    std::lock_guard<std::mutex> lock(mu_);
    last_error_.clear();
    last_seen_ = want;
    last_check_ = std::chrono::steady_clock::now();
    return Status::Ok();
  };
  if (have.is_string() && have.get_ref<const std::string&>() == want) return done();
  Json patch = {{"metadata", {{"annotations", {{kInventoryKey, want}}}}}};
  auto r = client_->Request("PATCH", path, &patch, "application/merge-patch+json");
  if (!r.ok()) return fail(r.status().WithContext("writing the inventory annotation"));
  if (r->code != 200) return fail(ErrorOf(*r, fmt::format("writing the inventory annotation of Node {}", options_.node)));
  ++writes_;
  return done();
}

void NodePublisher::Start() {
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] {
    while (!stop_.load()) {
      (void)PublishOnce();
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, options_.interval, [this] { return stop_.load(); });
    }
  });
}

void NodePublisher::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace gpupool::kube
