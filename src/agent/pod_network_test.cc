// The pod network (agent/pod_network.h), with real namespaces, a real bridge and real iptables
// rules, and real containers (runc, busybox): what a pod reaches (out, through NAT), and what it
// must not (the host's ports on any address, another pod, a denied destination, anything inbound).
// "Outside" is a network namespace of the test's own behind a veth pair. Needs root, iproute2 and
// iptables; skips and says so without them.
#include "agent/pod_network.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "agent/runtime.h"
#include "agent/runtime_internal.h"
#include "agent/sandbox_test_util.h"

namespace gpupool {
namespace {

using namespace sandbox_test;

TEST(Ipv4NetTest, ParsesOnlyWellFormedNetworks) {
  auto n = ParseIpv4Net("10.88.0.0/24", 8, 28);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(n->ToString(), "10.88.0.0/24");
  EXPECT_EQ(ParseIpv4Net("192.0.2.7", 0, 32)->ToString(), "192.0.2.7/32");
  for (const char* bad : {"10.88.0.1/24", "10.88.0.0/7", "10.88.0.0/29", "10.88.0.0/", "10.88.0.0/x", "10.88.0/24",
                          "10.88.0.0.0/24", "", "10.88.0.0/024x", "::1/128", "300.1.1.1/32", "10.88.0.0/24 "}) {
    auto r = ParseIpv4Net(bad, 8, 28);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(Ipv4NetTest, PodSubnetsSplitTheNetworkEvenlyBetweenNodes) {
  EXPECT_EQ(*PodSubnet("10.88.0.0/24", 0, 1), "10.88.0.0/24");
  EXPECT_EQ(*PodSubnet("10.88.0.0/24", 1, 2), "10.88.0.128/25");
  EXPECT_EQ(*PodSubnet("10.88.0.0/16", 2, 3), "10.88.128.0/18");
  EXPECT_EQ(*PodSubnet("10.88.0.0/24", 15, 16), "10.88.0.240/28");
  auto small = PodSubnet("10.88.0.0/24", 0, 17);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("at least a /28"), std::string::npos) << small.status().ToString();
  EXPECT_FALSE(PodSubnet("10.88.0.0/24", 2, 2).ok());
  EXPECT_FALSE(PodSubnet("10.88.0.1/24", 0, 1).ok());
}

TEST(PodNetworkOptionsTest, BadOptionsAreRefusedNamingTheFlag) {
  PodNetworkOptions o;
  o.cidr = "10.88.0.1/24";
  auto r = PodNetwork::Create(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--pod-network"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("host bits"), std::string::npos) << r.status().ToString();
  o.cidr = "10.88.0.0/24";
  for (const char* bridge : {"", "a b", "much-too-long-bridge", "br;rm"}) {
    o.bridge = bridge;
    r = PodNetwork::Create(o);
    ASSERT_FALSE(r.ok()) << bridge;
    EXPECT_NE(r.status().message().find("--pod-bridge"), std::string::npos) << r.status().ToString();
  }
  o.bridge = "gpupool0";
  o.deny = {"10.0.0.0/8", "-j ACCEPT"};
  r = PodNetwork::Create(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--pod-deny"), std::string::npos) << r.status().ToString();
}

TEST(PodNetworkConfigTest, APodContainerJoinsItsNamespaceAndSeesTheHostsSysReadOnly) {
  LaunchSpec spec;
  spec.id = "pod";
  spec.argv = {"sh"};
  spec.uid = 20101;
  spec.gid = 20101;
  spec.network = "pod";
  spec.netns_path = "/run/netns/gpupool0-j-1.0";
  auto text = agent_internal::BuildOciConfig(spec, "/srv/rootfs", "/gpupool/agent-0123456789abcdef");
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  auto j = nlohmann::json::parse(*text);
  bool joined = false;
  for (const auto& n : j["linux"]["namespaces"])
    if (n["type"] == "network") joined = n.value("path", "") == spec.netns_path;
  EXPECT_TRUE(joined) << j["linux"]["namespaces"].dump();
  bool sys_bound = false;
  for (const auto& m : j["mounts"])
    if (m["destination"] == "/sys") sys_bound = m["type"] == "bind";
  EXPECT_TRUE(sys_bound);
  spec.netns_path.clear();
  EXPECT_EQ(agent_internal::BuildOciConfig(spec, "/srv/rootfs", "/x").status().code(), StatusCode::kInvalidArgument);
  spec.network = "bridge";
  spec.netns_path = "/run/netns/x";
  EXPECT_EQ(agent_internal::BuildOciConfig(spec, "/srv/rootfs", "/x").status().code(), StatusCode::kInvalidArgument);
}

bool Sh(std::vector<std::string> argv, std::string* out = nullptr) {
  std::string ignored;
  auto exe = agent_internal::FindExecutable(argv[0], agent_internal::DefaultPath());
  if (!exe.ok()) return false;
  argv[0] = *exe;
  auto rc = agent_internal::RunCommand(argv, out != nullptr ? out : &ignored, std::chrono::seconds(10));
  return rc.ok() && *rc == 0;
}

// A TCP server on 0.0.0.0:`port` in the network namespace at `netns` (or the test's own when
// empty) that answers every connection with "HTTP/1.0 200 OK" and the peer's address.
class Server {
 public:
  Server(const std::string& netns, int port) {
    std::atomic<int> ready{0};
    thread_ = std::thread([this, netns, port, &ready] {
      if (!netns.empty()) {
        int nfd = ::open(netns.c_str(), O_RDONLY | O_CLOEXEC);
        if (nfd < 0 || ::setns(nfd, CLONE_NEWNET) != 0) {
          ready = -1;
          return;
        }
        ::close(nfd);
      }
      fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      int one = 1;
      ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(port));
      if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd_, 8) != 0) {
        ready = -1;
        return;
      }
      socklen_t len = sizeof(addr);
      ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
      port_ = ntohs(addr.sin_port);
      ready = 1;
      while (true) {
        sockaddr_in peer{};
        socklen_t plen = sizeof(peer);
        int c = ::accept4(fd_, reinterpret_cast<sockaddr*>(&peer), &plen, SOCK_CLOEXEC);
        if (c < 0) return;
        char ip[INET_ADDRSTRLEN] = {};
        ::inet_ntop(AF_INET, &peer.sin_addr, ip, sizeof(ip));
        const std::string reply = std::string("HTTP/1.0 200 OK\r\n\r\nfrom=") + ip + "\n";
        (void)!::write(c, reply.data(), reply.size());
        ::close(c);
      }
    });
    while (ready == 0) std::this_thread::sleep_for(5ms);
    ok_ = ready == 1;
  }
  ~Server() {
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return ok_; }
  int port() const { return port_; }

 private:
  std::thread thread_;
  int fd_ = -1;
  int port_ = 0;
  bool ok_ = false;
};

// Pods on a bridge of the test's own; "outside" at 100.127.253.2 and .3 (the latter denied)
// behind the host's 100.127.253.1.
class PodNetworkTest : public RuncSandboxTest {
 protected:
  void SetUp() override {
    RuncSandboxTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    for (const char* tool : {"ip", "bridge", "iptables"}) {
      if (!Sh({tool, "-V"})) GTEST_SKIP() << tool << " is not installed";
    }
    // One at a time on this host (ctest runs tests in parallel processes, and every one of them
    // gives the host 100.127.253.1 on its link to "outside").
    lock_ = ::open("/tmp/gpupool-pod-network-test.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    ASSERT_GE(lock_, 0);
    ASSERT_EQ(::flock(lock_, LOCK_EX), 0);
    const int tag = ::getpid() % 100000;
    options_.bridge = "gpt" + std::to_string(tag);
    options_.cidr = "10.254." + std::to_string(tag % 250) + ".0/28";
    options_.deny = {"100.127.253.3/32"};
    options_.work_dir = dir_ + "/pod-network";
    ext_ns_ = "gptx-" + std::to_string(tag);
    ext_veth_ = "gptx" + std::to_string(tag);
    PodNetwork::Teardown(options_);
    (void)Sh({"ip", "netns", "del", ext_ns_});
    ASSERT_TRUE(Sh({"ip", "netns", "add", ext_ns_}));
    ASSERT_TRUE(Sh({"ip", "link", "add", ext_veth_, "type", "veth", "peer", "name", "eth0", "netns", ext_ns_}));
    ASSERT_TRUE(Sh({"ip", "addr", "add", "100.127.253.1/29", "dev", ext_veth_}));
    ASSERT_TRUE(Sh({"ip", "link", "set", ext_veth_, "up"}));
    ASSERT_TRUE(Sh({"ip", "-n", ext_ns_, "addr", "add", "100.127.253.2/29", "dev", "eth0"}));
    ASSERT_TRUE(Sh({"ip", "-n", ext_ns_, "addr", "add", "100.127.253.3/29", "dev", "eth0"}));
    ASSERT_TRUE(Sh({"ip", "-n", ext_ns_, "link", "set", "eth0", "up"}));
    ASSERT_TRUE(Sh({"ip", "-n", ext_ns_, "link", "set", "lo", "up"}));
    for (const char* tool : {"ip", "timeout", "sleep"})
      ASSERT_EQ(::symlink("busybox", (rootfs_ + "/bin/" + tool).c_str()), 0) << tool;
  }
  void TearDown() override {
    RuncSandboxTest::TearDown();
    if (!ext_ns_.empty()) {
      (void)Sh({"ip", "netns", "del", ext_ns_});
      (void)Sh({"ip", "link", "del", ext_veth_});
    }
    if (!options_.bridge.empty()) PodNetwork::Teardown(options_);
    if (lock_ >= 0) ::close(lock_);  // and with it the lock
  }
  LaunchSpec PodSpec(const std::string& id, const PodNetwork::Attachment& at, const std::string& script) {
    LaunchSpec s = Spec(id, script);
    s.network = "pod";
    s.netns_path = at.netns_path;
    return s;
  }
  // The first IPv4 address of the host's that is not loopback, nor the test's bridge or link.
  std::string HostAddress() {
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0) return "";
    std::string out;
    for (ifaddrs* i = list; i != nullptr && out.empty(); i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || (i->ifa_flags & IFF_LOOPBACK)) continue;
      const std::string name = i->ifa_name;
      if (name == options_.bridge || name == ext_veth_) continue;
      char ip[INET_ADDRSTRLEN] = {};
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, ip, sizeof(ip));
      out = ip;
    }
    ::freeifaddrs(list);
    return out;
  }
  // Whether something listens on `port` in the namespace (/proc/net/tcp, state 0A).
  bool Listening(const std::string& netns_name, int port) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), ":%04X", port);
    for (int i = 0; i < 100; ++i) {
      std::string out;
      if (Sh({"ip", "netns", "exec", netns_name, "cat", "/proc/net/tcp", "/proc/net/tcp6"}, &out)) {
        std::istringstream lines(out);
        for (std::string line; std::getline(lines, line);) {
          std::istringstream fields(line);
          std::string slot, local, remote, state;
          fields >> slot >> local >> remote >> state;
          if (local.size() > 5 && local.substr(local.size() - 5) == hex && state == "0A") return true;
        }
      }
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }

  PodNetworkOptions options_;
  std::string ext_ns_, ext_veth_;
  int lock_ = -1;
};

TEST_F(PodNetworkTest, APodReachesOutThroughNatButNotTheHostAnotherPodOrADeniedDestination) {
  auto pn = PodNetwork::Create(options_);
  ASSERT_TRUE(pn.ok()) << pn.status().ToString();
  Server outside("/run/netns/" + ext_ns_, 8080);
  ASSERT_TRUE(outside.ok());
  Server host("", 0);  // the server's or the agent's port, on every host address
  ASSERT_TRUE(host.ok());
  const std::string hport = std::to_string(host.port());

  const std::string id_a = UniqueId("pod-a"), id_b = UniqueId("pod-b");
  auto a = (*pn)->Attach(id_a);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = (*pn)->Attach(id_b);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_NE(a->address, b->address);
  EXPECT_EQ(a->gateway, "10.254." + std::to_string((::getpid() % 100000) % 250) + ".1");

  // Pod A listens; pod B tries everything.
  ASSERT_TRUE(rt_->Start(PodSpec("pod-a", *a, "echo hi-from-a | timeout 20 nc -l -p 9000")).ok());
  ASSERT_TRUE(Listening(options_.bridge + "-" + id_a, 9000));
  const auto probe = [](const std::string& name, const std::string& addr, const std::string& port, const std::string& want) {
    return "nc -w 2 " + addr + " " + port + " </dev/null | grep -q '" + want + "' && echo " + name + "-REACHED || echo " +
           name + "-UNREACHABLE; ";
  };
  std::string script = "ip -4 -o addr show dev eth0; ip route | grep default; "
                       "ip -6 -o addr show dev eth0 | grep -q inet6 && echo HAS-IPV6 || echo NO-IPV6; "
                       "nc -w 2 100.127.253.2 8080 </dev/null | grep from= || echo OUT-UNREACHABLE; " +
                       probe("DENIED", "100.127.253.3", "8080", "from=") + probe("GATEWAY", b->gateway, hport, "200 OK") +
                       probe("LOOPBACK", "127.0.0.1", hport, "200 OK") + probe("PEER", a->address, "9000", "hi-from-a");
  const std::string host_ip = HostAddress();
  if (!host_ip.empty()) script += probe("HOSTIP", host_ip, hport, "200 OK");
  std::string out = Run(PodSpec("pod-b", *b, script));
  EXPECT_NE(out.find("inet " + b->address + "/28"), std::string::npos) << out;
  EXPECT_NE(out.find("default via " + b->gateway + " dev eth0"), std::string::npos) << out;
  // Out through NAT: the outside sees the host's address on its link, not the pod's.
  EXPECT_NE(out.find("from=100.127.253.1\n"), std::string::npos) << out;
  for (const char* line : {"NO-IPV6", "DENIED-UNREACHABLE", "GATEWAY-UNREACHABLE", "LOOPBACK-UNREACHABLE", "PEER-UNREACHABLE"})
    EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
  if (!host_ip.empty()) {
    EXPECT_NE(out.find("HOSTIP-UNREACHABLE"), std::string::npos) << host_ip << "\n" << out;
  }
  // The same probes from the host's side tell that each was reachable at all: A listened the whole
  // time (the host, which opened the connection, gets its answer), the host port answers.
  std::string reply;
  EXPECT_TRUE(Sh({"sh", "-c", "busybox nc -w 2 " + a->address + " 9000 </dev/null"}, &reply)) << reply;
  EXPECT_NE(reply.find("hi-from-a"), std::string::npos) << reply;
  EXPECT_TRUE(Sh({"sh", "-c", "busybox nc -w 2 " + b->gateway + " " + hport + " </dev/null"}, &reply));
  EXPECT_NE(reply.find("200 OK"), std::string::npos) << reply;
  EXPECT_TRUE(Sh({"ip", "netns", "exec", ext_ns_, "busybox", "nc", "-w", "2", "100.127.253.3", "8080"}, &reply)) << reply;
  // Nothing comes in from outside: the outside has no route to the pods, and with one a new
  // connection is dropped.
  ASSERT_TRUE(Sh({"ip", "-n", ext_ns_, "route", "add", options_.cidr, "via", "100.127.253.1"}));
  EXPECT_FALSE(Sh({"ip", "netns", "exec", ext_ns_, "busybox", "nc", "-w", "2", a->address, "9000"}, &reply)) << reply;
}

TEST_F(PodNetworkTest, NamespacesAreRemovedOnDetachAndFoundAgainByARestartedAgent) {
  auto pn = PodNetwork::Create(options_);
  ASSERT_TRUE(pn.ok()) << pn.status().ToString();
  const std::string id1 = UniqueId("r1"), id2 = UniqueId("r2.0.r3"), id3 = UniqueId("r3");
  auto a1 = (*pn)->Attach(id1);
  auto a2 = (*pn)->Attach(id2);
  ASSERT_TRUE(a1.ok() && a2.ok());
  EXPECT_EQ(::access(a1->netns_path.c_str(), F_OK), 0);
  // Again for the same run: a fresh namespace, at the same address (the one that was freed).
  auto again = (*pn)->Attach(id1);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->address, a1->address);

  // Another agent on the same options (a restart) knows both and hands out a third address.
  pn->reset();
  auto second = PodNetwork::Create(options_);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  auto attached = (*second)->Attached();
  EXPECT_EQ(std::set<std::string>(attached.begin(), attached.end()), (std::set<std::string>{id1, id2}));
  auto a3 = (*second)->Attach(id3);
  ASSERT_TRUE(a3.ok()) << a3.status().ToString();
  EXPECT_NE(a3->address, a1->address);
  EXPECT_NE(a3->address, a2->address);

  ASSERT_TRUE((*second)->Detach(id1).ok());
  EXPECT_NE(::access(a1->netns_path.c_str(), F_OK), 0);
  EXPECT_TRUE((*second)->Detach(id1).ok());  // twice is fine
  (*second)->Prune({id3});
  EXPECT_NE(::access(a2->netns_path.c_str(), F_OK), 0);
  EXPECT_EQ((*second)->Attached(), std::vector<std::string>{id3});
  // The host ends of the pairs went with their namespaces: only id3's is left on the bridge.
  std::string links;
  ASSERT_TRUE(Sh({"ip", "-o", "link", "show", "master", options_.bridge}, &links));
  EXPECT_EQ(std::count(links.begin(), links.end(), '\n'), 1) << links;
  EXPECT_FALSE((*second)->Attach("../../etc").ok());
}

TEST_F(PodNetworkTest, ASubnetRunsOutOfAddressesWithAClearError) {
  PodNetworkOptions o = options_;
  auto pn = PodNetwork::Create(o);
  ASSERT_TRUE(pn.ok()) << pn.status().ToString();
  // A /28: 16 addresses, less the network, the gateway and the broadcast.
  for (int i = 0; i < 13; ++i) ASSERT_TRUE((*pn)->Attach(UniqueId("n" + std::to_string(i))).ok()) << i;
  auto full = (*pn)->Attach(UniqueId("n13"));
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("all 13 addresses are in use"), std::string::npos) << full.status().ToString();
}

// gVisor (Debian's runsc 20221219) starts its sandbox outside the pod's namespace (tried: "cannot
// run with network enabled in root network namespace"): the task fails at start, saying so.
class RunscPodNetworkTest : public PodNetworkTest {
 protected:
  void Configure(RuntimeOptions& opts) override { ConfigureRunsc(opts); }
};

TEST_F(RunscPodNetworkTest, APodUnderGvisorIsRefusedSayingSo) {
  auto pn = PodNetwork::Create(options_);
  ASSERT_TRUE(pn.ok()) << pn.status().ToString();
  auto at = (*pn)->Attach(UniqueId("gvisor-pod"));
  ASSERT_TRUE(at.ok()) << at.status().ToString();
  Status st = rt_->Start(PodSpec("gvisor-pod", *at, "true"));
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("runtime class runsc cannot join a pod network"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace gpupool
