#include "agent/pod_network.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "agent/runtime_internal.h"

namespace gpupool {

namespace {

bool ValidName(const std::string& s, size_t max) {
  return !s.empty() && s.size() <= max && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

// Run ids are the agent's own ("j-12.0", "j-12.0.r3"); anything else is not a pod's namespace.
bool ValidRunId(const std::string& s) {
  return !s.empty() && s.size() <= 96 && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

std::string Trimmed(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

// FNV-1a: a short, stable name for the host end of a pod's interface.
uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// The helpers by absolute path (RunCommand does not search PATH).
Status ResolveBinaries(PodNetworkOptions& o) {
  for (std::string* b : {&o.ip_binary, &o.bridge_binary, &o.iptables_binary}) {
    auto found = agent_internal::FindExecutable(*b, agent_internal::DefaultPath());
    if (!found.ok())
      return Status::FailedPrecondition(
          fmt::format("the pod network needs '{}' (Debian's iproute2 and iptables): {}", *b, found.status().message()));
    *b = *found;
  }
  return Status::Ok();
}

}  // namespace

std::string Ipv4ToString(uint32_t host_order) {
  return fmt::format("{}.{}.{}.{}", host_order >> 24, (host_order >> 16) & 0xff, (host_order >> 8) & 0xff,
                     host_order & 0xff);
}

std::string Ipv4Net::ToString() const { return fmt::format("{}/{}", Ipv4ToString(base), prefix); }

Result<Ipv4Net> ParseIpv4Net(const std::string& text, int min_prefix, int max_prefix) {
  const auto bad = [&](const std::string& why) {
    return Status::InvalidArgument(fmt::format("'{}' is not an IPv4 network: {}", text.substr(0, 64), why));
  };
  if (text.size() > 18) return bad("too long");
  const size_t slash = text.find('/');
  const std::string addr = text.substr(0, slash);
  int prefix = 32;
  if (slash != std::string::npos) {
    const std::string p = text.substr(slash + 1);
    if (p.empty() || p.size() > 2 || !std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return bad("the prefix length must be a number");
    prefix = std::stoi(p);
  }
  in_addr a{};
  if (::inet_pton(AF_INET, addr.c_str(), &a) != 1) return bad("not a dotted-quad address");
  if (prefix < min_prefix || prefix > max_prefix)
    return bad(fmt::format("the prefix length must be {} to {}", min_prefix, max_prefix));
  const uint32_t base = ntohl(a.s_addr);
  const uint32_t mask = prefix == 0 ? 0 : ~uint32_t{0} << (32 - prefix);
  if ((base & ~mask) != 0) return bad(fmt::format("host bits are set (the network is {}/{})", Ipv4ToString(base & mask), prefix));
  return Ipv4Net{base, prefix};
}

Result<std::string> PodSubnet(const std::string& cidr, int index, int count) {
  ASSIGN_OR_RETURN(const Ipv4Net net, ParseIpv4Net(cidr, 8, 28));
  if (count < 1 || index < 0 || index >= count) return Status::InvalidArgument("bad subnet index");
  int bits = 0;
  while ((1 << bits) < count) ++bits;
  if (net.prefix + bits > 28)
    return Status::InvalidArgument(
        fmt::format("{} is too small for {} node(s): each needs at least a /28 (give a /{} or larger)", cidr, count, 28 - bits));
  const int prefix = net.prefix + bits;
  return Ipv4Net{net.base + (static_cast<uint32_t>(index) << (32 - prefix)), prefix}.ToString();
}

Result<std::unique_ptr<PodNetwork>> PodNetwork::Create(PodNetworkOptions options) {
  auto parsed = ParseIpv4Net(options.cidr, 8, 28);
  if (!parsed.ok()) return parsed.status().WithContext("--pod-network");
  const Ipv4Net net = *parsed;
  if (!ValidName(options.bridge, 15))
    return Status::InvalidArgument(
        fmt::format("--pod-bridge '{}': must be 1-15 of [A-Za-z0-9_-] (an interface name)", options.bridge.substr(0, 64)));
  if (options.deny.size() > 64) return Status::InvalidArgument("--pod-deny: at most 64 destinations");
  for (const std::string& d : options.deny) RETURN_IF_ERROR(ParseIpv4Net(d, 0, 32).status().WithContext("--pod-deny"));
  if (::geteuid() != 0)
    return Status::FailedPrecondition("the pod network needs root (a bridge, network namespaces and iptables rules)");
  RETURN_IF_ERROR(ResolveBinaries(options));
  if (options.work_dir.empty() || options.work_dir.front() != '/')
    return Status::InvalidArgument("the pod network needs a directory of the agent's own (an absolute path)");
  RETURN_IF_ERROR(agent_internal::MakeDirs(options.work_dir).WithContext("the pod network's directory"));
  if (::chmod(options.work_dir.c_str(), 0700) != 0)
    return Status::IoError(fmt::format("cannot make {} the agent's alone", options.work_dir));
  std::unique_ptr<PodNetwork> pn(new PodNetwork(std::move(options), net));
  RETURN_IF_ERROR(pn->Setup().WithContext(fmt::format("setting up the pod network {}", net.ToString())));
  pn->Rediscover();
  return pn;
}

std::string PodNetwork::Describe() const {
  return fmt::format("pod network {} on bridge {} ({}{})", net_.ToString(), options_.bridge,
                     options_.nat ? "outbound NAT" : "routed, no NAT",
                     options_.deny.empty() ? std::string() : fmt::format("; {} denied destination(s)", options_.deny.size()));
}

Status PodNetwork::Run(const std::vector<std::string>& argv, const std::string& what, std::string* output) const {
  std::string out;
  auto rc = agent_internal::RunCommand(argv, &out, options_.command_timeout);
  if (!rc.ok()) return rc.status().WithContext(what);
  if (*rc != 0) {
    std::string cmd;
    for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    return Status::Internal(fmt::format("{}: '{}' exited {}: {}", what, cmd, *rc, Trimmed(out).substr(0, 512)));
  }
  if (output != nullptr) *output = std::move(out);
  return Status::Ok();
}

// Adds the rule unless it is there (iptables -C), at the head of built-in chains so that a host's
// own rules (a FORWARD policy of DROP) do not shadow it.
Status PodNetwork::Iptables(const std::vector<std::string>& rule, const std::string& what) const {
  // rule: {"-t", table, chain, match...}
  std::vector<std::string> check = {options_.iptables_binary, "-w", "5", "-t", rule[1], "-C"};
  check.insert(check.end(), rule.begin() + 2, rule.end());
  std::string out;
  auto rc = agent_internal::RunCommand(check, &out, options_.command_timeout);
  if (rc.ok() && *rc == 0) return Status::Ok();
  std::vector<std::string> add = {options_.iptables_binary, "-w", "5", "-t", rule[1], "-I", rule[2], "1"};
  add.insert(add.end(), rule.begin() + 3, rule.end());
  return Run(add, what);
}

Status PodNetwork::Setup() {
  const std::string& br = options_.bridge;
  const std::string& ip = options_.ip_binary;
  const std::string gateway = fmt::format("{}/{}", Ipv4ToString(net_.base + 1), net_.prefix);
  std::string out;
  auto shown = agent_internal::RunCommand({ip, "link", "show", "dev", br}, &out, options_.command_timeout);
  if (!shown.ok()) return shown.status().WithContext(fmt::format("running '{}'", ip));
  if (*shown != 0) RETURN_IF_ERROR(Run({ip, "link", "add", br, "type", "bridge"}, "making the bridge"));
  RETURN_IF_ERROR(Run({ip, "addr", "replace", gateway, "dev", br}, "giving the bridge its address"));
  RETURN_IF_ERROR(Run({ip, "link", "set", br, "up"}, "bringing the bridge up"));
  // IPv4 only: no IPv6 address on the bridge (the filter rules below are IPv4's; a link-local
  // address would let pods reach the host's services listening on [::]).
  if (const std::string v6 = "/proc/sys/net/ipv6/conf/" + br + "/disable_ipv6"; ::access(v6.c_str(), F_OK) == 0) {
    std::ofstream f(v6);
    f << "1\n";
    f.flush();
    if (!f) return Status::Internal(fmt::format("cannot turn IPv6 off on the bridge ({})", v6));
  }
  {
    std::ofstream f("/proc/sys/net/ipv4/ip_forward");
    f << "1\n";
    f.flush();
    if (!f) return Status::Internal("cannot turn on IPv4 forwarding (/proc/sys/net/ipv4/ip_forward)");
  }
  // The agent's chains, flushed and filled anew (a restarted agent with other --pod-deny).
  const std::string in = "GPUPOOL-IN-" + br, fwd = "GPUPOOL-FWD-" + br, nat = "GPUPOOL-NAT-" + br;
  const std::string& ipt = options_.iptables_binary;
  for (const auto& [table, chain] : std::vector<std::pair<std::string, std::string>>{{"filter", in}, {"filter", fwd}, {"nat", nat}}) {
    std::string ignored;
    (void)agent_internal::RunCommand({ipt, "-w", "5", "-t", table, "-N", chain}, &ignored, options_.command_timeout);
    RETURN_IF_ERROR(Run({ipt, "-w", "5", "-t", table, "-F", chain}, "flushing " + chain));
  }
  const std::string cidr = net_.ToString();
  std::vector<std::vector<std::string>> rules = {
      // The host: only replies to what the host itself opened.
      {"-A", in, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"},
      {"-A", in, "-j", "DROP"},
      // Into pods: only replies. Out of pods: anywhere but the denied destinations.
      {"-A", fwd, "-o", br, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"},
      {"-A", fwd, "-o", br, "-j", "DROP"},
  };
  for (const std::string& d : options_.deny) rules.push_back({"-A", fwd, "-i", br, "-d", d, "-j", "DROP"});
  rules.push_back({"-A", fwd, "-i", br, "-j", "ACCEPT"});
  for (auto& r : rules) {
    std::vector<std::string> argv = {ipt, "-w", "5", "-t", "filter"};
    argv.insert(argv.end(), r.begin(), r.end());
    RETURN_IF_ERROR(Run(argv, "adding a filter rule"));
  }
  if (options_.nat)
    RETURN_IF_ERROR(Run({ipt, "-w", "5", "-t", "nat", "-A", nat, "!", "-o", br, "-j", "MASQUERADE"}, "adding the NAT rule"));
  RETURN_IF_ERROR(Iptables({"-t", "filter", "INPUT", "-i", br, "-j", in}, "sending the bridge's input to " + in));
  RETURN_IF_ERROR(Iptables({"-t", "filter", "FORWARD", "-i", br, "-j", fwd}, "sending the bridge's traffic to " + fwd));
  RETURN_IF_ERROR(Iptables({"-t", "filter", "FORWARD", "-o", br, "-j", fwd}, "sending the bridge's traffic to " + fwd));
  RETURN_IF_ERROR(Iptables({"-t", "nat", "POSTROUTING", "-s", cidr, "-j", nat}, "sending the pods' traffic to " + nat));
  return Status::Ok();
}

std::string PodNetwork::HostVeth(const std::string& run_id) const {
  return fmt::format("gpv{:012x}", Fnv1a(NetnsName(run_id)) & 0xffffffffffffull);
}

void PodNetwork::Rediscover() {
  std::lock_guard<std::mutex> lock(mu_);
  addresses_.clear();
  DIR* d = ::opendir(options_.netns_dir.c_str());
  if (d == nullptr) return;
  std::vector<std::string> names;
  const std::string prefix = options_.bridge + "-";
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind(prefix, 0) == 0 && ValidRunId(name.substr(prefix.size()))) names.push_back(name);
  }
  ::closedir(d);
  for (const std::string& name : names) {
    // One without an address (an attach cut short) is still the agent's to remove.
    addresses_[name.substr(prefix.size())] = 0;
    std::string out;
    auto rc = agent_internal::RunCommand({options_.ip_binary, "-n", name, "-4", "-o", "addr", "show", "dev", "eth0"}, &out,
                                         options_.command_timeout);
    if (!rc.ok() || *rc != 0) continue;
    const size_t at = out.find(" inet ");
    if (at == std::string::npos) continue;
    const size_t start = at + 6, slash = out.find('/', start);
    if (slash == std::string::npos) continue;
    in_addr a{};
    if (::inet_pton(AF_INET, out.substr(start, slash - start).c_str(), &a) != 1) continue;
    addresses_[name.substr(prefix.size())] = ntohl(a.s_addr);
  }
}

Result<PodNetwork::Attachment> PodNetwork::Attach(const std::string& run_id) {
  if (!ValidRunId(run_id)) return Status::InvalidArgument(fmt::format("pod network: bad run id '{}'", run_id.substr(0, 96)));
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(DetachLocked(run_id));
  std::set<uint32_t> used;
  for (const auto& [run, address] : addresses_) used.insert(address);  // 0 is no host's
  const uint32_t size = uint32_t{1} << (32 - net_.prefix);
  uint32_t address = 0;
  for (uint32_t host = 2; host + 1 < size; ++host) {
    if (used.count(net_.base + host) == 0) {
      address = net_.base + host;
      break;
    }
  }
  if (address == 0)
    return Status::ResourceExhausted(fmt::format("pod network {}: all {} addresses are in use", net_.ToString(), size - 3));
  const std::string ns = NetnsName(run_id), veth = HostVeth(run_id), ip = options_.ip_binary;
  const std::string what = fmt::format("attaching task {} to the pod network", run_id);
  Attachment out{options_.netns_dir + "/" + ns, Ipv4ToString(address), Ipv4ToString(net_.base + 1)};
  Status st = Run({ip, "netns", "add", ns}, what);
  if (!st.ok()) return st;
  // Four helper commands (each a fork and exec): the pair, made on the bridge and up; its bridge
  // port isolated from the others; and, in one batch inside the namespace, eth0 without IPv6
  // (see Setup) before it comes up, its address, loopback and the default route.
  const std::string batch = fmt::format("{}/{}.batch", options_.work_dir, ns);
  st = agent_internal::WriteFileAtomic(
      batch,
      fmt::format("link set eth0 addrgenmode none\naddr add {}/{} dev eth0\nlink set eth0 up\nlink set lo up\n"
                  "route add default via {}\n",
                  out.address, net_.prefix, out.gateway),
      /*sync=*/false);
  for (const auto& argv : std::vector<std::vector<std::string>>{
           {ip, "link", "add", veth, "master", options_.bridge, "up", "type", "veth", "peer", "name", "eth0", "netns", ns},
           {options_.bridge_binary, "link", "set", "dev", veth, "isolated", "on"},
           {ip, "-n", ns, "-batch", batch},
       }) {
    if (!st.ok()) break;
    st = Run(argv, what);
  }
  (void)::unlink(batch.c_str());
  if (!st.ok()) {
    std::string ignored;
    (void)agent_internal::RunCommand({ip, "netns", "del", ns}, &ignored, options_.command_timeout);
    return st;
  }
  addresses_[run_id] = address;
  return out;
}

Status PodNetwork::DetachLocked(const std::string& run_id) {
  addresses_.erase(run_id);
  const std::string ns = NetnsName(run_id), veth = HostVeth(run_id);
  // The pair first, at once: a namespace's interfaces go only when the kernel gets to it, and an
  // attach right after (the same run again) would find the name taken.
  if (::access(("/sys/class/net/" + veth).c_str(), F_OK) == 0)
    RETURN_IF_ERROR(Run({options_.ip_binary, "link", "del", veth}, fmt::format("removing task {}'s pod interface", run_id)));
  if (::access((options_.netns_dir + "/" + ns).c_str(), F_OK) != 0) return Status::Ok();
  return Run({options_.ip_binary, "netns", "del", ns}, fmt::format("removing task {}'s pod network namespace", run_id));
}

Status PodNetwork::Detach(const std::string& run_id) {
  if (!ValidRunId(run_id)) return Status::Ok();
  std::lock_guard<std::mutex> lock(mu_);
  return DetachLocked(run_id);
}

void PodNetwork::Prune(const std::vector<std::string>& keep) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> gone;
  for (const auto& [run, address] : addresses_)
    if (std::find(keep.begin(), keep.end(), run) == keep.end()) gone.push_back(run);
  for (const std::string& run : gone) (void)DetachLocked(run);
}

std::vector<std::string> PodNetwork::Attached() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [run, address] : addresses_) out.push_back(run);
  return out;
}

void PodNetwork::Teardown(const PodNetworkOptions& given) {
  PodNetworkOptions options = given;
  if (!ResolveBinaries(options).ok()) return;
  const auto run = [&](const std::vector<std::string>& argv) {
    std::string ignored;
    auto rc = agent_internal::RunCommand(argv, &ignored, options.command_timeout);
    return rc.ok() && *rc == 0;
  };
  if (!ValidName(options.bridge, 15)) return;
  if (DIR* d = ::opendir(options.netns_dir.c_str())) {
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name.rfind(options.bridge + "-", 0) == 0 && ValidRunId(name.substr(options.bridge.size() + 1)))
        names.push_back(name);
    }
    ::closedir(d);
    for (const std::string& name : names) run({options.ip_binary, "netns", "del", name});
  }
  const std::string& br = options.bridge;
  const std::string& ipt = options.iptables_binary;
  const std::string in = "GPUPOOL-IN-" + br, fwd = "GPUPOOL-FWD-" + br, nat = "GPUPOOL-NAT-" + br;
  while (run({ipt, "-w", "5", "-t", "filter", "-D", "INPUT", "-i", br, "-j", in})) {
  }
  while (run({ipt, "-w", "5", "-t", "filter", "-D", "FORWARD", "-i", br, "-j", fwd})) {
  }
  while (run({ipt, "-w", "5", "-t", "filter", "-D", "FORWARD", "-o", br, "-j", fwd})) {
  }
  if (auto net = ParseIpv4Net(options.cidr, 0, 32); net.ok()) {
    while (run({ipt, "-w", "5", "-t", "nat", "-D", "POSTROUTING", "-s", net->ToString(), "-j", nat})) {
    }
  }
  for (const auto& [table, chain] : std::vector<std::pair<std::string, std::string>>{{"filter", in}, {"filter", fwd}, {"nat", nat}}) {
    run({ipt, "-w", "5", "-t", table, "-F", chain});
    run({ipt, "-w", "5", "-t", table, "-X", chain});
  }
  run({options.ip_binary, "link", "del", br});
}

}  // namespace gpupool
