// The pod network of one agent (docs/agent.md#pod-network): a container task asking for
// `network: pod` gets a network namespace of its own with loopback and one interface, eth0, on a
// bridge of the agent's, an address from the agent's subnet, and a default route through the
// bridge. What it may reach:
//   - out: anything but the host itself and the admin's denied destinations, its source address
//     rewritten to the host's (outbound NAT) unless the admin routes the subnet themselves;
//   - in: nothing that it did not open (no port of a pod can be reached from outside);
//   - the host: nothing (the server's, the agent's and every other port on any host address);
//   - other pods: nothing (every pod's bridge port is isolated from the others).
// Made with iproute2 (`ip`, `bridge`) and iptables, which the agent runs as helper commands; it
// needs root. Its state is the kernel's: the namespaces are named `<bridge>-<run id>` (in
// /run/netns), so an agent that restarts finds the addresses in use there.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"

namespace gpupool {

struct PodNetworkOptions {
  std::string cidr;                 // IPv4 "10.88.0.0/24": prefix 8-28, host bits zero
  std::string bridge = "gpupool0";  // created when missing; 1-15 of [A-Za-z0-9_-]
  bool nat = true;                  // outbound NAT to the host's address
  std::vector<std::string> deny;    // destinations ("10.0.0.0/8", "192.0.2.7") pods may not reach
  std::string ip_binary = "ip";
  std::string bridge_binary = "bridge";
  std::string iptables_binary = "iptables";
  std::string netns_dir = "/run/netns";  // where `ip netns` keeps its namespaces
  std::string work_dir;                   // the agent's own (0700): the batch files of `ip -batch`
  std::chrono::milliseconds command_timeout{10000};
};

// An IPv4 network in CIDR form, parsed strictly.
struct Ipv4Net {
  uint32_t base = 0;  // host order, host bits zero
  int prefix = 0;
  std::string ToString() const;
};
Result<Ipv4Net> ParseIpv4Net(const std::string& text, int min_prefix, int max_prefix);
// The index-th of `count` equal parts of `cidr` (as many as the next power of two), for the nodes
// of `gpupool up` on one host; each part must keep at least a /28.
Result<std::string> PodSubnet(const std::string& cidr, int index, int count);
std::string Ipv4ToString(uint32_t host_order);

class PodNetwork {
 public:
  // Makes (or takes over) the bridge, its gateway address, forwarding and the filter rules; reads
  // the addresses of the namespaces an earlier agent left. Idempotent.
  static Result<std::unique_ptr<PodNetwork>> Create(PodNetworkOptions options);

  struct Attachment {
    std::string netns_path;  // for the container's network namespace
    std::string address;     // "10.88.0.5"
    std::string gateway;
  };
  // A namespace for the run, its interface and address. Again for the same run: the same
  // namespace is made anew.
  Result<Attachment> Attach(const std::string& run_id);
  // Removes the run's namespace (its interface goes with it); nothing to remove is fine.
  Status Detach(const std::string& run_id);
  // Removes the namespaces of runs not in `keep` (those of runs an earlier agent left behind).
  void Prune(const std::vector<std::string>& keep);
  // Run ids with a namespace now.
  std::vector<std::string> Attached() const;
  // Removes everything Create and Attach made for these options: the namespaces, the rules and
  // chains, the bridge (tests). Forwarding stays on.
  static void Teardown(const PodNetworkOptions& options);
  const PodNetworkOptions& options() const { return options_; }
  std::string Describe() const;  // "pod network 10.88.0.0/24 on bridge gpupool0 (outbound NAT)"

 private:
  explicit PodNetwork(PodNetworkOptions options, Ipv4Net net) : options_(std::move(options)), net_(net) {}
  Status Setup();
  Status Run(const std::vector<std::string>& argv, const std::string& what, std::string* output = nullptr) const;
  Status Iptables(const std::vector<std::string>& rule, const std::string& what) const;
  std::string NetnsName(const std::string& run_id) const { return options_.bridge + "-" + run_id; }
  std::string HostVeth(const std::string& run_id) const;
  void Rediscover();
  Status DetachLocked(const std::string& run_id);

  PodNetworkOptions options_;
  Ipv4Net net_;
  mutable std::mutex mu_;
  std::map<std::string, uint32_t> addresses_;  // run id -> address
};

}  // namespace gpupool
