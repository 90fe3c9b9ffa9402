// The agent's assignment watch: a long poll on GET .../assignments?wait=S&since=VERSION, answered
// by the server as soon as this node's assignments change (docs/agent.md#assignments). New tasks
// start within milliseconds of their placement instead of at the next poll; the heartbeat stays
// for liveness, and a server that does not answer watches (its answer has no version) is polled
// as before.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <iostream>

#include "agent/agent.h"
#include "client/api_client.h"

namespace gpupool {

ApiClient Agent::NodeApiCopy() {
  std::lock_guard<std::mutex> lock(client_mu_);
  return node_client_ ? *node_client_ : *client_;
}

void Agent::WakeLoop() {
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_now_ = true;
  }
  wake_cv_.notify_all();
}

void Agent::WatchLoop() {
  const std::string path = fmt::format("/api/v1/agent/nodes/{}/assignments", PercentEncode(options_.node));
  const int wait_s = std::clamp(options_.assignment_wait_seconds, 1, 60);
  std::string version;
  int failures = 0;
  auto pause = [this](std::chrono::milliseconds d) {
    std::unique_lock<std::mutex> lock(wake_mu_);
    wake_cv_.wait_for(lock, d, [this] { return stopping_.load(); });
  };
  while (!stopping_) {
    if (!cluster_refusal().empty()) {
      // Another cluster's server: nothing to run for it (the loop retries registering).
      watching_ = false;
      pause(std::chrono::seconds(1));
      continue;
    }
    auto r = NodeApiCopy().GetInterruptible(
        fmt::format("{}?wait={}&since={}", path, wait_s, PercentEncode(version)), *watch_interrupt_, wait_s + 10);
    if (stopping_) break;
    if (r.ok() && r->status == 304) {
      failures = 0;
      continue;
    }
    if (r.ok() && r->status == 200 && r->is_json && r->json.is_object()) {
      if (!r->json.contains("version") || !r->json["version"].is_string()) {
        // A server of before watches answered at once: the loop polls, as it always did.
        watching_ = false;
        std::cerr << fmt::format("gpupool agent {}: the server does not push assignments; polling every {} s\n",
                                 options_.node, options_.assignment_poll_seconds);
        return;
      }
      failures = 0;
      watching_ = true;
      version = r->json["version"].get<std::string>();
      // Start and stop here; the loop thread sends the reports (one thread reports, so no report
      // goes twice).
      (void)ApplyAssignmentsOnly(r->json.dump());
      WakeLoop();
      continue;
    }
    // Unreachable, or refused (401/404 while the loop registers again): back off, and until the
    // watch works again the loop polls.
    watching_ = false;
    version.clear();
    pause(std::chrono::milliseconds(std::min(5000, 100 << std::min(failures++, 6))));
  }
}

}  // namespace gpupool
