// The sandbox of container tasks (runc, and runsc and crun where they run), tried the way a
// hostile tenant would: its uid and capabilities, the host's network, root filesystems and bundles
// outside the allowed roots, a bundle's own config, mountpoints through links. Needs root.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "agent/runtime.h"
#include "agent/runtime_internal.h"
#include "agent/sandbox_test_util.h"

namespace gpupool {
namespace {

using namespace sandbox_test;

TEST(RuncSandboxConfig, AUidGivesAUserNamespaceNoCapabilitiesAndTheHostsSysReadOnlyWithHostNetwork) {
  LaunchSpec spec;
  spec.id = "cfg";
  spec.argv = {"sh"};
  spec.uid = 20101;
  spec.gid = 20202;
  spec.network = "host";
  spec.binds = {{"/srv/ckpt/j1", "/srv/ckpt/j1", false}};
  auto text = agent_internal::BuildOciConfig(spec, "/srv/rootfs", "/gpupool/agent-0123456789abcdef");
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  auto j = nlohmann::json::parse(*text);
  std::vector<std::string> ns;
  for (const auto& n : j["linux"]["namespaces"]) ns.push_back(n["type"]);
  EXPECT_EQ(ns, (std::vector<std::string>{"pid", "ipc", "uts", "mount", "cgroup", "user"}));
  EXPECT_EQ(j["linux"]["uidMappings"], nlohmann::json::parse(R"([{"containerID":0,"hostID":20101,"size":1}])"));
  EXPECT_EQ(j["linux"]["gidMappings"], nlohmann::json::parse(R"([{"containerID":0,"hostID":20202,"size":1}])"));
  for (const char* set : {"bounding", "effective", "permitted", "inheritable", "ambient"})
    EXPECT_TRUE(j["process"]["capabilities"][set].empty()) << set;
  EXPECT_EQ(j["process"]["noNewPrivileges"], true);
  bool sys_bound = false, ckpt_rw = false, cgroup = false;
  for (const auto& m : j["mounts"]) {
    auto opts = m.value("options", std::vector<std::string>{});
    auto has = [&](const char* o) { return std::find(opts.begin(), opts.end(), o) != opts.end(); };
    if (m["destination"] == "/sys") sys_bound = m["type"] == "bind" && has("ro");
    if (m["destination"] == "/srv/ckpt/j1") ckpt_rw = m["source"] == "/srv/ckpt/j1" && has("rw") && has("nosuid");
    if (m["destination"] == "/sys/fs/cgroup") cgroup = true;
  }
  EXPECT_TRUE(sys_bound);
  EXPECT_TRUE(ckpt_rw);
  EXPECT_FALSE(cgroup);
  spec.binds = {{"relative", "/x", true}};
  EXPECT_EQ(agent_internal::BuildOciConfig(spec, "/srv/rootfs", "/gpupool/x").status().code(), StatusCode::kInvalidArgument);
}


TEST_F(RuncSandboxTest, TheContainersRootIsTheTasksUidWithoutCapabilitiesUnderSeccomp) {
  std::string out = Run(Spec("ident", "id -u; cat /proc/self/uid_map; grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' "
                                      "/proc/self/status; touch /bin/x 2>/dev/null || echo ROOTFS-RO; "
                                      "mount -t tmpfs t /tmp 2>/dev/null || echo MOUNT-DENIED"));
  EXPECT_EQ(out.substr(0, 2), "0\n") << out;
  EXPECT_NE(out.find("20101"), std::string::npos) << out;  // the uid map: container 0 is host 20101
  for (const char* line : {"CapEff:\t0000000000000000", "CapBnd:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2",
                           "ROOTFS-RO", "MOUNT-DENIED"})
    EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
}

TEST_F(RuncSandboxTest, NetworkNoneReachesNothingOfTheHost) {
  // A port of "the server" on the host's loopback.
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  // It answers every connection with a minimal HTTP reply.
  std::thread server([fd] {
    while (true) {
      int c = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;
      const char reply[] = "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok";
      (void)!::write(c, reply, sizeof(reply) - 1);
      ::close(c);
    }
  });
  const std::string probe = "ls /sys/class/net | tr '\\n' ' '; echo; nc -w 2 127.0.0.1 " + port +
                            " </dev/null | grep -q '200 OK' && echo REACHED || echo UNREACHABLE";
  std::string out = Run(Spec("net", probe));
  EXPECT_NE(out.find("lo \nUNREACHABLE"), std::string::npos) << out;
  // The same probe with the host's network connects (the test is able to tell).
  LaunchSpec host = Spec("hostnet", probe);
  host.network = "host";
  out = Run(host);
  EXPECT_NE(out.find("REACHED"), std::string::npos) << out;
  EXPECT_EQ(out.find("UNREACHABLE"), std::string::npos) << out;
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
  server.join();
}

TEST_F(RuncSandboxTest, ARootfsOrBundleOutsideTheAllowedRootsIsRefused) {
  for (const std::string& path : {std::string("/usr"), dir_, roots_ + "/../state", std::string("/nonexistent")}) {
    LaunchSpec spec = Spec("outside", "true");
    spec.rootfs = path;
    Status st = rt_->Start(spec);
    ASSERT_FALSE(st.ok()) << path;
    EXPECT_TRUE(st.code() == StatusCode::kPermissionDenied || st.code() == StatusCode::kInvalidArgument) << st.ToString();
  }
  // Through a link inside the allowed root: resolved first.
  ASSERT_EQ(::symlink("/usr", (roots_ + "/usr-link").c_str()), 0);
  LaunchSpec spec = Spec("link", "true");
  spec.rootfs = roots_ + "/usr-link";
  Status st = rt_->Start(spec);
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.ToString();
  EXPECT_NE(st.message().find("not under an allowed container root (" + roots_), std::string::npos) << st.ToString();
  // A bundle whose root is the host's /.
  const std::string bundle = roots_ + "/evil-bundle";
  ASSERT_TRUE(agent_internal::MakeDirs(bundle).ok());
  ASSERT_TRUE(agent_internal::WriteFileAtomic(bundle + "/config.json", R"({"root": {"path": "/"}, "process": {"args": ["sh"]}})").ok());
  spec = Spec("evil-root", "true");
  spec.rootfs.clear();
  spec.bundle = bundle;
  EXPECT_EQ(rt_->Start(spec).code(), StatusCode::kPermissionDenied);
}

TEST_F(RuncSandboxTest, ARootCreatedAfterTheRuntimeStartedCounts) {
  RuntimeOptions opts;
  opts.state_dir = dir_ + "/state2";
  opts.container_roots = {dir_ + "/later"};
  auto rt = MakeRuncRuntime(opts);
  ASSERT_TRUE(rt.ok()) << rt.status().ToString();
  LaunchSpec spec = Spec("later", "true");
  spec.rootfs = rootfs_;
  EXPECT_EQ((*rt)->Start(spec).code(), StatusCode::kPermissionDenied);
  // The admin makes the root now, a link to the images: the next start is allowed.
  ASSERT_EQ(::symlink(roots_.c_str(), (dir_ + "/later").c_str()), 0);
  spec.rootfs = dir_ + "/later/busybox";
  Status st = (*rt)->Start(spec);
  EXPECT_TRUE(st.ok()) << st.ToString();
  for (int i = 0; i < 500; ++i) {
    auto r = (*rt)->Poll(spec.id);
    if (!r.ok() || r->state != RunState::kRunning) break;
    std::this_thread::sleep_for(20ms);
  }
  (void)(*rt)->Remove(spec.id);
}

TEST_F(RuncSandboxTest, ABundlesConfigIsRewrittenNotTrusted) {
  // A bundle asking for root, every capability, the host's namespaces and the host's / mounted in.
  const std::string bundle = roots_ + "/bundle";
  ASSERT_TRUE(agent_internal::MakeDirs(bundle).ok());
  nlohmann::json cfg = {
      {"ociVersion", "1.0.2"},
      {"root", {{"path", "../busybox"}}},
      {"process",
       {{"args", {"sh", "-c", "id -u; cat /proc/self/uid_map; grep CapEff /proc/self/status; ls /host 2>&1; echo $FROM_BUNDLE"}},
        {"env", {"PATH=/bin", "FROM_BUNDLE=kept"}},
        {"user", {{"uid", 0}}},
        {"capabilities", {{"bounding", {"CAP_SYS_ADMIN"}}, {"effective", {"CAP_SYS_ADMIN"}}}}}},
      {"mounts", {{{"destination", "/host"}, {"type", "bind"}, {"source", "/"}, {"options", {"rbind"}}}}},
      {"linux", {{"namespaces", nlohmann::json::array()}}}};
  ASSERT_TRUE(agent_internal::WriteFileAtomic(bundle + "/config.json", cfg.dump()).ok());
  LaunchSpec spec = Spec("bundle", "unused");
  spec.argv.clear();
  spec.rootfs.clear();
  spec.bundle = bundle;
  std::string out = Run(spec);
  EXPECT_NE(out.find("20101"), std::string::npos) << out;
  EXPECT_NE(out.find("CapEff:\t0000000000000000"), std::string::npos) << out;
  EXPECT_NE(out.find("No such file or directory"), std::string::npos) << out;  // no /host
  EXPECT_NE(out.find("kept\n"), std::string::npos) << out;
  // Malformed bundles: a clear refusal.
  ASSERT_TRUE(agent_internal::WriteFileAtomic(bundle + "/config.json", R"({"root": {"path": 5}})").ok());
  spec.id = UniqueId("bad-bundle");
  Status st = rt_->Start(spec);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("root.path is malformed"), std::string::npos) << st.ToString();
  ASSERT_TRUE(agent_internal::WriteFileAtomic(bundle + "/config.json", "[[[[").ok());
  EXPECT_EQ(rt_->Start(spec).code(), StatusCode::kInvalidArgument);
}

TEST_F(RuncSandboxTest, TheCheckpointDirectoryIsMountedWritableAtItsOwnPath) {
  const std::string ckpt = dir_ + "/shared/ckpt/job-1";
  ASSERT_TRUE(agent_internal::MakeDirs(dir_ + "/shared/ckpt").ok());
  ASSERT_TRUE(agent_internal::MakeOwnedDir(ckpt, 20101, 20101).ok());
  LaunchSpec spec = Spec("ckpt", "echo step-7 > " + ckpt + "/ck.txt && echo SAVED");
  spec.binds = {{ckpt, ckpt, false}};
  std::string out = Run(spec);
  EXPECT_NE(out.find("SAVED"), std::string::npos) << out;
  EXPECT_EQ(ReadText(ckpt + "/ck.txt"), "step-7\n");
  struct stat st;
  ASSERT_EQ(::stat((ckpt + "/ck.txt").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 20101u);  // the task's, on the host
}

// runc's own failure is the task's reason, not just "exit code 1": a bind whose source is gone.
TEST_F(RuncSandboxTest, WhyRuncFailedIsTheTasksReason) {
  LaunchSpec spec = Spec("gone", "echo never");
  spec.binds = {{dir_ + "/no-such-dir", "/srv/data", false}};
  ASSERT_TRUE(rt_->Start(spec).ok());
  const TaskStatusInfo end = WaitEnd(*rt_, spec.id, 20s);
  EXPECT_EQ(end.state, RunState::kExited);
  EXPECT_NE(end.message.find("exit code 1; runc: "), std::string::npos) << end.message;
  EXPECT_NE(end.message.find("no-such-dir"), std::string::npos) << end.message;
  EXPECT_NE(end.message.find("such file or directory"), std::string::npos) << end.message;
}

TEST(RuncErrorIn, TakesTheLastErrorLinesMessageUnescapedAndBounded) {
  using agent_internal::RuncErrorIn;
  EXPECT_EQ(RuncErrorIn(""), "");
  EXPECT_EQ(RuncErrorIn("Traceback ...\nValueError: x\n"), "");
  EXPECT_EQ(RuncErrorIn("time=\"2026-12-06T06:40:28Z\" level=error msg=\"runc run failed: error mounting \\\"/a\\\" "
                        "to rootfs at \\\"/b\\\": stat /a: no such file or directory\"\n"),
            "runc run failed: error mounting \"/a\" to rootfs at \"/b\": stat /a: no such file or directory");
  EXPECT_EQ(RuncErrorIn("level=fatal msg=\"cause\"\nother\nlevel=error msg=\"summary\"\n"), "cause (summary)");
  EXPECT_EQ(RuncErrorIn("level=error msg=\"a\tb\x01" "c"), "a b c");  // unterminated, control characters
  EXPECT_EQ(RuncErrorIn("level=error msg=\"" + std::string(5000, 'x') + "\"").size(), 400u);
}

// The shipped examples' case: a rootfs container with its checkpoint outside /tmp (runc made the
// mountpoint as the container's root and failed: "can't create ...: nonexistent directory").
TEST_F(RuncSandboxTest, ARootfsContainersCheckpointOutsideTmpIsMounted) {
  const std::string ckpt = dir_ + "/ckpt/job-4";
  ASSERT_TRUE(agent_internal::MakeDirs(dir_ + "/ckpt").ok());
  ASSERT_TRUE(agent_internal::MakeOwnedDir(ckpt, 20101, 20101).ok());
  LaunchSpec spec = Spec("ckpt-srv", "echo step-8 > /srv/checkpoints/job-4/ck.txt && echo SAVED");
  spec.binds = {{ckpt, "/srv/checkpoints/job-4", false}};
  std::string out = Run(spec);
  EXPECT_NE(out.find("SAVED"), std::string::npos) << out;
  EXPECT_EQ(ReadText(ckpt + "/ck.txt"), "step-8\n");
}

// An image's tree belongs to the host's root, which the container's root is not: the runtime makes
// the mountpoints (those of /proc, /dev, /sys, /tmp, the checkpoint directory, the working
// directory) before runc runs, and never through a link the image holds.
TEST_F(RuncSandboxTest, AnImagesMountpointsAreMadeForItAndNeverThroughALink) {
  const std::string image = dir_ + "/cache/images/abc/rootfs";  // an image with bin/ only
  ASSERT_TRUE(agent_internal::MakeDirs(image + "/bin").ok());
  ASSERT_EQ(::link((rootfs_ + "/bin/busybox").c_str(), (image + "/bin/busybox").c_str()), 0);
  ASSERT_EQ(::symlink("busybox", (image + "/bin/sh").c_str()), 0);
  const std::string ckpt = dir_ + "/ckpt/job-2";
  ASSERT_TRUE(agent_internal::MakeDirs(dir_ + "/ckpt").ok());
  ASSERT_TRUE(agent_internal::MakeOwnedDir(ckpt, 20101, 20101).ok());
  LaunchSpec spec = Spec("image", "cd /data/ckpt && busybox pwd && echo step-9 > /data/ckpt/ck.txt && echo SAVED");
  spec.rootfs.clear();
  spec.image_rootfs = image;
  spec.workdir = "/work/here";
  spec.binds = {{ckpt, "/data/ckpt", false}};
  std::string out = Run(spec);
  EXPECT_NE(out.find("/data/ckpt\nSAVED"), std::string::npos) << out;
  EXPECT_EQ(ReadText(ckpt + "/ck.txt"), "step-9\n");
  for (const char* made : {"/proc", "/dev", "/sys", "/tmp", "/data/ckpt", "/work/here"}) {
    struct stat st;
    EXPECT_TRUE(::lstat((image + made).c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == 0) << made;
  }
  // /data a link out of the image: refused, and nothing made where it points.
  const std::string hostile = dir_ + "/cache/images/def/rootfs";
  const std::string outside = dir_ + "/outside";
  ASSERT_TRUE(agent_internal::MakeDirs(hostile + "/bin").ok());
  ASSERT_TRUE(agent_internal::MakeDirs(outside).ok());
  ASSERT_EQ(::symlink(outside.c_str(), (hostile + "/data").c_str()), 0);
  spec.id = UniqueId("hostile");
  spec.image_rootfs = hostile;
  Status st = rt_->Start(spec);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("the image's /data is a link or a file"), std::string::npos) << st.ToString();
  EXPECT_FALSE(agent_internal::PathExists(outside + "/ckpt"));
  // An image goes alone: never with a rootfs of the tenant's choosing.
  spec.id = UniqueId("both");
  spec.image_rootfs = image;
  spec.rootfs = rootfs_;
  EXPECT_EQ(rt_->Start(spec).code(), StatusCode::kInvalidArgument);
}

// gVisor (Debian's runsc, on the ptrace platform): the same sandbox, with the guest's system calls
// served by gVisor's own kernel, not the host's.
class RunscSandboxTest : public RuncSandboxTest {
 protected:
  void Configure(RuntimeOptions& opts) override { ConfigureRunsc(opts); }
};

TEST_F(RunscSandboxTest, ATaskRunsUnderGvisorAsItsUidWithoutNetworkAndWritesItsCheckpoint) {
  const std::string ckpt = dir_ + "/ckpt/job-3";
  ASSERT_TRUE(agent_internal::MakeDirs(dir_ + "/ckpt").ok());
  ASSERT_TRUE(agent_internal::MakeOwnedDir(ckpt, 20101, 20101).ok());
  LaunchSpec spec = Spec("gvisor", "uname -r; id -u; ls /sys/class/net | tr '\\n' ' '; echo; "
                                   "cat /proc/self/status | grep -E '^(CapEff|Seccomp):'; "
                                   "unshare -m true 2>/dev/null || echo UNSHARE-DENIED; "
                                   "echo step-5 > " + ckpt + "/ck.txt && echo SAVED");
  spec.binds = {{ckpt, ckpt, false}};
  std::string out = Run(spec);
  EXPECT_EQ(out.substr(0, 6), "4.4.0\n") << "gVisor's kernel version, not the host's\n" << out;
  EXPECT_NE(out.find("\n0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("lo \n"), std::string::npos) << "loopback only\n" << out;
  for (const char* line : {"CapEff:\t0000000000000000", "Seccomp:\t2", "UNSHARE-DENIED", "SAVED"})
    EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
  EXPECT_EQ(ReadText(ckpt + "/ck.txt"), "step-5\n");
  struct stat st;
  ASSERT_EQ(::stat((ckpt + "/ck.txt").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 20101u);  // the task's uid on the host, as with runc
}

// crun 1.8 (Debian 12) refuses a host whose cgroup v2 hierarchy holds controllers beside v1 ones
// ("cgroups in hybrid mode not supported"); where it runs, the sandbox is runc's.
class CrunSandboxTest : public RuncSandboxTest {
 protected:
  void Configure(RuntimeOptions& opts) override {
    opts.runtime_class = "crun";
    opts.runc_binary = "crun";
  }
};

TEST_F(CrunSandboxTest, ATaskRunsAsItsUidWithoutCapabilitiesOrSaysWhyCrunCannotRunHere) {
  LaunchSpec spec = Spec("crun", "id -u; grep -E '^(CapEff|NoNewPrivs):' /proc/self/status");
  Status st = rt_->Start(spec);
  ASSERT_TRUE(st.ok()) << st.ToString();
  TaskStatusInfo info = Wait(spec.id);
  const std::string out = ReadText(rt_->StdoutPath(spec.id)), err = ReadText(rt_->StderrPath(spec.id));
  if (err.find("cgroups in hybrid mode not supported") != std::string::npos)
    GTEST_SKIP() << "crun cannot run on this host's cgroup layout: " << err;
  EXPECT_EQ(info.exit_code, 0) << out << err;
  EXPECT_EQ(out.substr(0, 2), "0\n") << out << err;
  EXPECT_NE(out.find("CapEff:\t0000000000000000"), std::string::npos) << out;
}

}  // namespace
}  // namespace gpupool
