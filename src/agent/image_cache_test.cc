// Tests of the image cache. Images are built here with umoci (a busybox root filesystem) and
// pulled through the real skopeo and umoci, without network; the tests skip when either tool or
// /bin/busybox is missing, or when not root (umoci unpack without --rootless needs root). A few
// replace skopeo by a script (ImageCacheOptions::skopeo) to see its arguments, to hold a pull, or
// to serve a docker:// source from a local layout.
#include "agent/image_cache.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "agent/runtime_internal.h"
#include "common/image_source.h"

namespace gpupool {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using agent_internal::FindExecutable;
using agent_internal::MakeDirs;
using agent_internal::RemoveTree;

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteText(const std::string& path, const std::string& text, mode_t mode = 0644) {
  std::ofstream(path) << text;
  ::chmod(path.c_str(), mode);
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

// Runs a shell command; its exit status, and its output in `out`.
int Sh(const std::string& cmd, std::string* out = nullptr) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) text.append(buf, n);
  const int rc = ::pclose(p);
  if (out != nullptr) *out = text;
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

#define SH(cmd)                                            \
  do {                                                     \
    std::string _out;                                      \
    ASSERT_EQ(Sh(cmd, &_out), 0) << (cmd) << "\n" << _out; \
  } while (0)

std::vector<std::string> Children(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    names.push_back(e.path().filename().string());
  return names;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/gpupool-img-XXXXXX";
    char* p = ::mkdtemp(tmpl);
    path_ = p != nullptr ? p : "";
  }
  ~TempDir() {
    if (!path_.empty()) (void)RemoveTree(path_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Polls until the source is ready or failed (nullopt only when `timeout` passed).
Result<std::optional<PreparedImage>> WaitReady(ImageCache& cache, const std::string& source,
                                               std::chrono::milliseconds timeout = 60s) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    auto r = cache.Prepare(source);
    if (!r.ok() || r->has_value() || Clock::now() > deadline) return r;
    std::this_thread::sleep_for(20ms);
  }
}

// The manifest digest tagged `tag` in a layout's index.json.
std::string LayoutDigest(const std::string& layout, const std::string& tag = "t") {
  auto j = nlohmann::json::parse(ReadText(layout + "/index.json"), nullptr, false);
  if (j.is_discarded()) return "";
  for (const auto& m : j.value("manifests", nlohmann::json::array()))
    if (m.value("annotations", nlohmann::json::object()).value("org.opencontainers.image.ref.name", "") ==
        tag)
      return m.value("digest", "");
  return "";
}

class ImageCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* path = std::getenv("PATH");
    const std::string path_var = path != nullptr ? path : agent_internal::DefaultPath();
    for (const char* tool : {"skopeo", "umoci"})
      if (!FindExecutable(tool, path_var).ok()) GTEST_SKIP() << tool << " is not installed";
    if (::access("/bin/busybox", X_OK) != 0) GTEST_SKIP() << "/bin/busybox is not installed";
    if (::geteuid() != 0) GTEST_SKIP() << "building the test images (umoci unpack) needs root";
    ASSERT_FALSE(tmp_.path().empty());
    root_ = tmp_.path() + "/images";
    ASSERT_TRUE(MakeDirs(root_).ok());
    dir_ = tmp_.path() + "/cache";
  }

  ImageCacheOptions Options() {
    ImageCacheOptions o;
    o.dir = dir_;
    o.local_roots = {root_};
    o.pull_timeout = 60s;
    o.on_done = [this] { done_.fetch_add(1); };
    return o;
  }

  std::unique_ptr<ImageCache> NewCache(ImageCacheOptions o) {
    auto r = ImageCache::Create(std::move(o));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }

  // An OCI layout under the root holding a busybox image tagged "t" (entrypoint /bin/sh, FOO=bar,
  // workdir /w); `extra` may change the root filesystem before it is packed.
  std::string Build(const std::string& name, const std::function<void(const std::string&)>& extra = {}) {
    const std::string layout = root_ + "/" + name;
    const std::string bundle = tmp_.path() + "/bundle-" + name;
    std::string out;
    const std::string cmd = "set -e; umoci init --layout " + layout + "; umoci new --image " + layout +
                            ":t; umoci unpack --image " + layout + ":t " + bundle + "; mkdir -p " + bundle +
                            "/rootfs/bin; cp /bin/busybox " + bundle + "/rootfs/bin/; ln -s busybox " +
                            bundle + "/rootfs/bin/sh";
    EXPECT_EQ(Sh(cmd, &out), 0) << out;
    if (extra) extra(bundle + "/rootfs");
    const std::string pack = "set -e; umoci repack --image " + layout + ":t " + bundle +
                             "; umoci config --image " + layout +
                             ":t --config.entrypoint /bin/sh --config.env FOO=bar --config.workingdir /w";
    EXPECT_EQ(Sh(pack, &out), 0) << out;
    (void)RemoveTree(bundle);
    EXPECT_TRUE(IsSha256Digest(LayoutDigest(layout))) << ReadText(layout + "/index.json");
    return layout;
  }

  // A script in place of skopeo.
  std::string Script(const std::string& name, const std::string& body) {
    const std::string path = tmp_.path() + "/" + name;
    WriteText(path, "#!/bin/sh\n" + body + "\n", 0755);
    return path;
  }

  // How many pulls have told on_done so far, once at least `want` have (or 10 s have passed): a
  // worker records a pull's outcome before it calls on_done, so a waiter may see the outcome first.
  int DoneAtLeast(int want) {
    for (int i = 0; i < 1000 && done_.load() < want; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return done_.load();
  }

  TempDir tmp_;
  std::string root_, dir_;
  std::atomic<int> done_{0};
};

TEST_F(ImageCacheTest, PullsAnOciLayoutOnceThenHits) {
  const std::string layout = Build("a");
  auto cache = NewCache(Options());
  ASSERT_NE(cache, nullptr);
  const std::string source = "oci:" + layout + ":t";
  auto first = cache->Prepare(source);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_FALSE(first->has_value());  // pulled on a worker, never on the caller's thread

  auto r = WaitReady(*cache, source);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->has_value()) << "not ready within 60 s";
  const PreparedImage& img = **r;
  EXPECT_EQ(img.source, source);
  EXPECT_EQ(img.digest, LayoutDigest(layout));
  EXPECT_EQ(img.rootfs, dir_ + "/images/" + img.digest.substr(7) + "/rootfs");
  struct stat st;
  ASSERT_EQ(::lstat((img.rootfs + "/bin/busybox").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  char link[64] = {};
  EXPECT_EQ(::readlink((img.rootfs + "/bin/sh").c_str(), link, sizeof(link) - 1), 7);
  EXPECT_STREQ(link, "busybox");
  ASSERT_EQ(::stat(img.rootfs.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  EXPECT_EQ(img.config.entrypoint, std::vector<std::string>{"/bin/sh"});
  EXPECT_NE(std::find(img.config.env.begin(), img.config.env.end(), "FOO=bar"), img.config.env.end());
  EXPECT_EQ(img.config.working_dir, "/w");
  EXPECT_TRUE(Exists(dir_ + "/images/" + img.digest.substr(7) + "/image.json"));
  EXPECT_TRUE(Children(dir_ + "/tmp").empty());
  EXPECT_GE(DoneAtLeast(1), 1);

  ImageCacheStats s = cache->stats();
  EXPECT_EQ(s.pulls, 1u);
  EXPECT_EQ(s.pull_failures, 0u);
  EXPECT_EQ(s.images, 1);
  EXPECT_EQ(s.pulling, 0);
  EXPECT_GT(s.bytes, 1 << 20);  // busybox itself
  const uint64_t hits = s.hits;

  auto again = cache->Prepare(source);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(again->has_value());  // at once: no pull
  EXPECT_EQ((*again)->digest, img.digest);
  EXPECT_EQ((*again)->config.working_dir, "/w");
  s = cache->stats();
  EXPECT_EQ(s.pulls, 1u);
  EXPECT_EQ(s.hits, hits + 1);
  EXPECT_EQ(s.pulling, 0);
}

TEST_F(ImageCacheTest, ArchivesArePulled) {
  const std::string layout = Build("a");
  SH("skopeo --insecure-policy copy --quiet oci:" + layout + ":t docker-archive:" + root_ +
     "/x.tar:test/img:1");
  SH("skopeo --insecure-policy copy --quiet oci:" + layout + ":t oci-archive:" + root_ + "/y.tar:t");
  auto cache = NewCache(Options());
  ASSERT_NE(cache, nullptr);
  auto oci = WaitReady(*cache, "oci-archive:" + root_ + "/y.tar:t");
  ASSERT_TRUE(oci.ok()) << oci.status().ToString();
  ASSERT_TRUE(oci->has_value());
  EXPECT_EQ((*oci)->digest, LayoutDigest(layout));  // the same manifest, byte for byte
  for (const std::string& source : std::vector<std::string>{"docker-archive:" + root_ + "/x.tar:test/img:1",
                                                            "docker-archive:" + root_ + "/x.tar"}) {
    auto docker = WaitReady(*cache, source);
    ASSERT_TRUE(docker.ok()) << source << ": " << docker.status().ToString();
    ASSERT_TRUE(docker->has_value()) << source;
    // Converted from Docker's manifest format, so a digest of its own.
    EXPECT_TRUE(IsSha256Digest((*docker)->digest));
    EXPECT_TRUE(Exists((*docker)->rootfs + "/bin/busybox"));
    EXPECT_EQ((*docker)->config.entrypoint, std::vector<std::string>{"/bin/sh"});
  }
  EXPECT_EQ(cache->stats().pulls, 3u);
  EXPECT_EQ(cache->stats().images, 2);  // both docker-archive sources name one image
}

TEST_F(ImageCacheTest, LocalSourcesStayUnderTheRoots) {
  const std::string outside = tmp_.path() + "/outside";
  ASSERT_TRUE(MakeDirs(outside + "/L").ok());
  WriteText(outside + "/L/index.json", "{}");
  ASSERT_EQ(::symlink((outside + "/L").c_str(), (root_ + "/link").c_str()), 0);
  auto cache = NewCache(Options());
  ASSERT_NE(cache, nullptr);

  for (const std::string& source : std::vector<std::string>{"oci:" + outside + "/L", "oci:/etc",
                                                            "oci-archive:/etc/passwd", "oci:" + root_}) {
    auto r = cache->Prepare(source);
    ASSERT_FALSE(r.ok()) << source;
    EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied) << source << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find(root_), std::string::npos) << r.status().ToString();
  }
  auto linked = cache->Prepare("oci:" + root_ + "/link");
  ASSERT_FALSE(linked.ok());
  EXPECT_EQ(linked.status().code(), StatusCode::kPermissionDenied) << linked.status().ToString();
  EXPECT_NE(linked.status().message().find(outside + "/L"), std::string::npos) << linked.status().ToString();
  EXPECT_NE(linked.status().message().find(root_), std::string::npos) << linked.status().ToString();

  auto missing = cache->Prepare("oci:" + root_ + "/nothing");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().ToString();
  ASSERT_TRUE(MakeDirs(root_ + "/sub").ok());
  auto wrong_kind = cache->Prepare("oci-archive:" + root_ + "/sub");  // a directory, not an archive
  EXPECT_EQ(wrong_kind.status().code(), StatusCode::kInvalidArgument) << wrong_kind.status().ToString();

  const ImageCacheStats s = cache->stats();
  EXPECT_EQ(s.pulls + s.pull_failures, 0u);
  EXPECT_EQ(s.pulling, 0);

  // No root at all: nothing local.
  ImageCacheOptions none = Options();
  none.local_roots.clear();
  none.dir = tmp_.path() + "/cache2";
  auto bare = NewCache(none);
  ASSERT_NE(bare, nullptr);
  auto r = bare->Prepare("oci:" + root_ + "/link");
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied) << r.status().ToString();
}

TEST_F(ImageCacheTest, RootsAreResolvedWhenUsed) {
  const std::string layout = Build("a");
  const std::string alias = tmp_.path() + "/alias";
  ASSERT_EQ(::symlink(root_.c_str(), alias.c_str()), 0);
  ImageCacheOptions o = Options();
  o.local_roots = {alias + "/"};
  auto cache = NewCache(o);
  ASSERT_NE(cache, nullptr);
  for (const std::string& source :
       std::vector<std::string>{"oci:" + layout + ":t", "oci:" + alias + "/a:t"}) {
    auto r = WaitReady(*cache, source);
    ASSERT_TRUE(r.ok()) << source << ": " << r.status().ToString();
    EXPECT_TRUE(r->has_value()) << source;
  }
}

TEST_F(ImageCacheTest, RegistriesAndSyntaxAreChecked) {
  const std::string args = tmp_.path() + "/args";
  ImageCacheOptions o = Options();
  o.registries = {"registry.example.com", "localhost:5000"};
  o.skopeo = Script("skopeo", "echo \"$@\" > " + args + "; echo \"TMPDIR=$TMPDIR\" >> " + args +
                                  "; echo 'no network here' >&2; exit 3");
  auto cache = NewCache(o);
  ASSERT_NE(cache, nullptr);

  auto hub = cache->Prepare("docker://busybox:1.36");
  ASSERT_FALSE(hub.ok());
  EXPECT_EQ(hub.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(hub.status().message().find("docker.io"), std::string::npos) << hub.status().ToString();
  EXPECT_NE(hub.status().message().find("registry.example.com"), std::string::npos)
      << hub.status().ToString();
  for (const std::string& bad :
       std::vector<std::string>{"oci:relative/x", "docker://BusyBox", "busybox", "oci:/x/../y", ""}) {
    auto r = cache->Prepare(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad << ": " << r.status().ToString();
  }
  EXPECT_FALSE(Exists(args));  // skopeo never ran

  // An allowed registry gets a pull: through the host's policy file when there is one.
  auto allowed = WaitReady(*cache, "docker://localhost:5000/x:1");
  ASSERT_FALSE(allowed.ok());
  EXPECT_NE(allowed.status().message().find("no network here"), std::string::npos)
      << allowed.status().ToString();
  EXPECT_NE(allowed.status().message().find("exit status 3"), std::string::npos)
      << allowed.status().ToString();
  const std::string seen = ReadText(args);
  const std::string policy =
      Exists("/etc/containers/policy.json") ? "--policy /etc/containers/policy.json" : "--insecure-policy";
  EXPECT_EQ(seen.rfind(policy + " copy --quiet docker://localhost:5000/x:1 oci:" + dir_ + "/tmp/", 0), 0u)
      << seen;
  EXPECT_NE(seen.find("/layout:img\n"), std::string::npos) << seen;
  EXPECT_NE(seen.find("TMPDIR=" + dir_ + "/tmp\n"), std::string::npos) << seen;
}

// The admin's signature policy is skopeo's to enforce, for local sources too: a policy that
// rejects everything fails the pull with skopeo's reason; one that accepts lets it through.
TEST_F(ImageCacheTest, TheAdminsSignaturePolicyDecidesEveryPull) {
  const std::string layout = Build("a");
  const std::string reject = tmp_.path() + "/reject.json";
  WriteText(reject, R"({"default": [{"type": "reject"}]})", 0644);
  ImageCacheOptions o = Options();
  o.policy = reject;
  auto cache = NewCache(o);
  ASSERT_NE(cache, nullptr);
  auto refused = WaitReady(*cache, "oci:" + layout + ":t");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("rejected by policy"), std::string::npos) << refused.status().ToString();
  EXPECT_EQ(cache->stats().images, 0);

  const std::string accept = tmp_.path() + "/accept.json";
  WriteText(accept, R"({"default": [{"type": "insecureAcceptAnything"}]})", 0644);
  o = Options();
  o.dir = tmp_.path() + "/cache2";
  o.policy = accept;
  auto open = NewCache(o);
  ASSERT_NE(open, nullptr);
  auto pulled = WaitReady(*open, "oci:" + layout + ":t");
  EXPECT_TRUE(pulled.ok()) << pulled.status().ToString();

  // A policy skopeo could not read is the agent's error at once, not every pull's later.
  for (const std::string& text : {std::string("not json"), std::string(R"({"transports": {}})")}) {
    WriteText(tmp_.path() + "/bad.json", text, 0644);
    o = Options();
    o.policy = tmp_.path() + "/bad.json";
    auto bad = ImageCache::Create(o);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_NE(bad.status().message().find("is not a containers-policy.json"), std::string::npos) << bad.status().ToString();
  }
  o = Options();
  o.policy = tmp_.path() + "/missing.json";
  EXPECT_FALSE(ImageCache::Create(o).ok());
}

// Registry credentials go to skopeo for docker:// sources only, from a file nobody but the agent
// can read (process tasks see the host's files).
TEST_F(ImageCacheTest, RegistryCredentialsGoToRegistryPullsOnlyFromAPrivateFile) {
  const std::string auth = tmp_.path() + "/auth.json";
  WriteText(auth, R"({"auths": {"localhost:5000": {"auth": "dTpw"}}})", 0644);
  const std::string args = tmp_.path() + "/args";
  ImageCacheOptions o = Options();
  o.auth_file = auth;
  o.skopeo = Script("skopeo", "echo \"$@\" >> " + args + "; exit 3");
  auto readable = ImageCache::Create(o);
  ASSERT_FALSE(readable.ok());
  EXPECT_EQ(readable.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(readable.status().message().find("mode 0600; it is 0644"), std::string::npos) << readable.status().ToString();
  ASSERT_EQ(::chmod(auth.c_str(), 0600), 0);
  o.auth_file = tmp_.path() + "/auth-link";
  ASSERT_EQ(::symlink(auth.c_str(), o.auth_file.c_str()), 0);
  EXPECT_FALSE(ImageCache::Create(o).ok()) << "a link";
  o.auth_file = auth;
  auto cache = NewCache(o);
  ASSERT_NE(cache, nullptr);
  EXPECT_FALSE(WaitReady(*cache, "docker://localhost:5000/x:1").ok());
  const std::string layout = Build("a");
  EXPECT_FALSE(WaitReady(*cache, "oci:" + layout + ":t").ok());
  const std::string seen = ReadText(args);
  EXPECT_NE(seen.find("copy --quiet --src-authfile " + auth + " docker://localhost:5000/x:1 oci:"), std::string::npos)
      << seen;
  EXPECT_NE(seen.find("copy --quiet oci:" + layout + ":t oci:"), std::string::npos) << seen;
  EXPECT_EQ(seen.find("authfile", seen.find("oci:" + layout)), std::string::npos) << seen;
}

TEST_F(ImageCacheTest, FailuresAreKeptAndNotRetried) {
  const std::string layout = Build("a");
  // Truncate the largest blob (the layer): skopeo finds the digest wrong.
  std::string biggest;
  uintmax_t size = 0;
  for (const auto& e : std::filesystem::directory_iterator(layout + "/blobs/sha256"))
    if (e.file_size() > size) {
      size = e.file_size();
      biggest = e.path().string();
    }
  ASSERT_EQ(::truncate(biggest.c_str(), static_cast<off_t>(size / 2)), 0);
  auto cache = NewCache(Options());
  ASSERT_NE(cache, nullptr);
  const std::string source = "oci:" + layout + ":t";
  auto r = WaitReady(*cache, source);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("skopeo copy"), std::string::npos)
      << r.status().ToString();  // the step
  EXPECT_NE(r.status().message().find(source), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("igest"), std::string::npos)
      << r.status().ToString();  // skopeo's words
  for (int i = 0; i < 10; ++i) {
    auto again = cache->Prepare(source);
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.status().ToString(), r.status().ToString());
    std::this_thread::sleep_for(50ms);
  }
  const ImageCacheStats s = cache->stats();
  EXPECT_EQ(s.pull_failures, 1u);
  EXPECT_EQ(s.pulls, 0u);
  EXPECT_EQ(s.pulling, 0);
  EXPECT_EQ(s.images, 0);
  EXPECT_TRUE(Children(dir_ + "/tmp").empty());
}

TEST_F(ImageCacheTest, MalformedConfigIsNamed) {
  // A layout written by hand: no layers, a config whose Env is not a list.
  const std::string layout = root_ + "/bad";
  const std::string blobs = layout + "/blobs/sha256";
  ASSERT_TRUE(MakeDirs(blobs).ok());
  WriteText(layout + "/oci-layout", R"({"imageLayoutVersion":"1.0.0"})");
  const std::string config = R"({"architecture":"amd64","os":"linux","config":{"Env":"FOO=bar"},)"
                             R"("rootfs":{"type":"layers","diff_ids":[]}})";
  WriteText(blobs + "/tmp", config);
  std::string hex;
  ASSERT_EQ(Sh("sha256sum " + blobs + "/tmp | cut -c1-64 | tr -d '\\n'", &hex), 0);
  ASSERT_EQ(::rename((blobs + "/tmp").c_str(), (blobs + "/" + hex).c_str()), 0);
  const std::string manifest =
      R"({"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":)"
      R"("application/vnd.oci.image.config.v1+json","digest":"sha256:)" +
      hex + R"(","size":)" + std::to_string(config.size()) + R"(},"layers":[]})";
  WriteText(blobs + "/tmp", manifest);
  std::string mhex;
  ASSERT_EQ(Sh("sha256sum " + blobs + "/tmp | cut -c1-64 | tr -d '\\n'", &mhex), 0);
  ASSERT_EQ(::rename((blobs + "/tmp").c_str(), (blobs + "/" + mhex).c_str()), 0);
  WriteText(
      layout + "/index.json",
      R"({"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:)" +
          mhex + R"(","size":)" + std::to_string(manifest.size()) +
          R"(,"annotations":{"org.opencontainers.image.ref.name":"t"}}]})");
  auto cache = NewCache(Options());
  ASSERT_NE(cache, nullptr);
  auto r = WaitReady(*cache, "oci:" + layout + ":t");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  EXPECT_NE(r.status().message().find("Env"), std::string::npos) << r.status().ToString();
}

TEST_F(ImageCacheTest, DevicesAndSetuidBitsAreRemoved) {
  const std::string layout = Build("dev", [](const std::string& rootfs) {
    SH("set -e; mknod " + rootfs + "/null2 c 1 3; mkfifo " + rootfs + "/fifo; mkdir -p " + rootfs +
       "/x; cp /bin/busybox " + rootfs + "/x/su; chmod 4755 " + rootfs + "/x/su; touch " + rootfs +
       "/x/sg; chmod 2711 " + rootfs + "/x/sg");
  });
  auto cache = NewCache(Options());
  ASSERT_NE(cache, nullptr);
  auto r = WaitReady(*cache, "oci:" + layout + ":t");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->has_value());
  const std::string rootfs = (*r)->rootfs;
  EXPECT_FALSE(Exists(rootfs + "/null2"));
  EXPECT_FALSE(Exists(rootfs + "/fifo"));
  struct stat st;
  ASSERT_EQ(::lstat((rootfs + "/x/su").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  ASSERT_EQ(::lstat((rootfs + "/x/sg").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0711u);
  EXPECT_TRUE(Exists(rootfs + "/bin/busybox"));
}

TEST_F(ImageCacheTest, AnImageLargerThanTheCacheFails) {
  const std::string layout = Build("a");
  ImageCacheOptions o = Options();
  o.max_bytes = 1 << 20;  // busybox alone is about 2 MB
  auto cache = NewCache(o);
  ASSERT_NE(cache, nullptr);
  const std::string source = "oci:" + layout + ":t";
  auto r = WaitReady(*cache, source);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("the image " + source + " is "), std::string::npos)
      << r.status().ToString();
  EXPECT_NE(
      r.status().message().find("bytes unpacked; the cache holds at most 1048576 (--image-cache-max-bytes)"),
      std::string::npos)
      << r.status().ToString();
  EXPECT_TRUE(Children(dir_ + "/images").empty());
  EXPECT_TRUE(Children(dir_ + "/tmp").empty());
}

TEST_F(ImageCacheTest, EvictsUnusedImagesLeastRecentlyUsedFirst) {
  const std::string a = "oci:" + Build("a") + ":t";
  const std::string b =
      "oci:" +
      Build("b",
            [](const std::string& rootfs) { SH("head -c 300000 /dev/urandom > " + rootfs + "/extra"); }) +
      ":t";
  // The sizes, measured in a cache of their own.
  int64_t size_a = 0, size_b = 0;
  {
    ImageCacheOptions o = Options();
    o.dir = tmp_.path() + "/measure";
    auto m = NewCache(o);
    ASSERT_NE(m, nullptr);
    ASSERT_TRUE(WaitReady(*m, a).ok());
    size_a = m->stats().bytes;
    ASSERT_TRUE(WaitReady(*m, b).ok());
    size_b = m->stats().bytes - size_a;
  }
  ASSERT_GT(size_b, size_a);
  ImageCacheOptions o = Options();
  o.max_bytes = size_b + 4096;  // one image at a time
  auto cache = NewCache(o);
  ASSERT_NE(cache, nullptr);
  auto ra = WaitReady(*cache, a);
  ASSERT_TRUE(ra.ok() && ra->has_value()) << ra.status().ToString();
  const std::string digest_a = (*ra)->digest;
  ASSERT_TRUE(cache->Use(digest_a, "task-1").ok());
  EXPECT_TRUE(Exists(dir_ + "/images/" + digest_a.substr(7) + "/users/task-1"));

  // b fits only alone; a is in use, and b, just pulled, is kept for the task about to use it.
  auto rb = WaitReady(*cache, b);
  ASSERT_TRUE(rb.ok() && rb->has_value()) << rb.status().ToString();
  const std::string digest_b = (*rb)->digest;
  EXPECT_EQ(cache->stats().images, 2);
  EXPECT_EQ(cache->stats().evictions, 0u);
  // An explicit collection evicts b: unused; a is kept.
  cache->Collect();
  EXPECT_EQ(cache->stats().evictions, 1u);
  EXPECT_EQ(cache->stats().images, 1);
  EXPECT_TRUE(Exists((*ra)->rootfs + "/bin/busybox"));
  EXPECT_FALSE(Exists(dir_ + "/images/" + digest_b.substr(7)));
  EXPECT_EQ(cache->stats().bytes, size_a);

  // b again (a miss now), then a's task ends while no agent ran: KeepOnly forgets it; a, used
  // longest ago, goes.
  auto again = cache->Prepare(b);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->has_value());
  rb = WaitReady(*cache, b);
  ASSERT_TRUE(rb.ok() && rb->has_value()) << rb.status().ToString();
  EXPECT_EQ(cache->stats().images, 2);  // its own pull keeps b; a is in use
  cache->KeepOnly({"task-2"});
  EXPECT_FALSE(Exists(dir_ + "/images/" + digest_a.substr(7) + "/users/task-1"));
  // Make the order certain: a was used an hour ago.
  const timespec old[2] = {{::time(nullptr) - 3600, 0}, {::time(nullptr) - 3600, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, (dir_ + "/images/" + digest_a.substr(7) + "/last_used").c_str(), old, 0),
            0);
  cache->Collect();
  EXPECT_EQ(cache->stats().evictions, 2u);
  EXPECT_FALSE(Exists(dir_ + "/images/" + digest_a.substr(7)));
  EXPECT_TRUE(Exists((*rb)->rootfs + "/extra"));
  // b now: the oldest (and only) unused one, but the cache fits: nothing more goes.
  cache->Collect();
  EXPECT_EQ(cache->stats().evictions, 2u);
}

TEST_F(ImageCacheTest, LruOrderDecidesWhichUnusedImageGoes) {
  const std::string a = "oci:" + Build("a") + ":t";
  const std::string b =
      "oci:" + Build("b", [](const std::string& rootfs) { SH("echo x > " + rootfs + "/extra"); }) + ":t";
  for (const bool a_older : {true, false}) {
    SCOPED_TRACE(a_older ? "a older" : "b older");
    (void)RemoveTree(dir_);
    ImageCacheOptions o = Options();
    o.max_bytes = 3 << 20;  // either, not both (about 2 MB each)
    auto cache = NewCache(o);
    ASSERT_NE(cache, nullptr);
    auto ra = WaitReady(*cache, a);
    ASSERT_TRUE(ra.ok() && ra->has_value()) << ra.status().ToString();
    ASSERT_TRUE(cache->Use((*ra)->digest, "t").ok());  // else b's pull would evict a at once
    auto rb = WaitReady(*cache, b);
    ASSERT_TRUE(rb.ok() && rb->has_value()) << rb.status().ToString();
    cache->Release("t");
    ASSERT_EQ(cache->stats().images, 2);
    const std::string older = a_older ? (*ra)->digest : (*rb)->digest;
    const std::string newer = a_older ? (*rb)->digest : (*ra)->digest;
    const timespec t_old[2] = {{::time(nullptr) - 7200, 0}, {::time(nullptr) - 7200, 0}};
    const timespec t_new[2] = {{::time(nullptr) - 60, 0}, {::time(nullptr) - 60, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, (dir_ + "/images/" + older.substr(7) + "/last_used").c_str(), t_old, 0),
              0);
    ASSERT_EQ(::utimensat(AT_FDCWD, (dir_ + "/images/" + newer.substr(7) + "/last_used").c_str(), t_new, 0),
              0);
    cache->Collect();
    EXPECT_FALSE(Exists(dir_ + "/images/" + older.substr(7)));
    EXPECT_TRUE(Exists(dir_ + "/images/" + newer.substr(7) + "/rootfs/bin/busybox"));
    EXPECT_EQ(cache->stats().evictions, 1u);
  }
}

TEST_F(ImageCacheTest, UseAndReleaseCheckTheirArguments) {
  const std::string source = "oci:" + Build("a") + ":t";
  auto cache = NewCache(Options());
  ASSERT_NE(cache, nullptr);
  auto r = WaitReady(*cache, source);
  ASSERT_TRUE(r.ok() && r->has_value());
  const std::string digest = (*r)->digest;
  for (const std::string& bad : std::vector<std::string>{"", ".", "..", "../x", "a/b", "a b",
                                                         std::string(201, 'a'), std::string("a\0b", 3)}) {
    Status st = cache->Use(digest, bad);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << "'" << bad << "'";
  }
  EXPECT_TRUE(cache->Use(digest, std::string(200, 'a')).ok());
  EXPECT_EQ(cache->Use("sha256:" + std::string(64, 'e'), "t1").code(), StatusCode::kNotFound);
  EXPECT_EQ(cache->Use("latest", "t1").code(), StatusCode::kInvalidArgument);
  const std::string users = dir_ + "/images/" + digest.substr(7) + "/users/";
  const std::string last_used = dir_ + "/images/" + digest.substr(7) + "/last_used";
  const timespec old[2] = {{1000, 0}, {1000, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, last_used.c_str(), old, 0), 0);
  ASSERT_TRUE(cache->Use(digest, "j-1.0").ok());
  EXPECT_TRUE(Exists(users + "j-1.0"));
  struct stat st;
  ASSERT_EQ(::stat(last_used.c_str(), &st), 0);
  EXPECT_GT(st.st_mtime, ::time(nullptr) - 60);  // touched now
  cache->Release("nobody");                      // a no-op
  cache->Release("../../x");
  EXPECT_TRUE(Exists(users + "j-1.0"));
  cache->Release("j-1.0");
  EXPECT_FALSE(Exists(users + "j-1.0"));
  EXPECT_TRUE(Exists(users + std::string(200, 'a')));
}

TEST_F(ImageCacheTest, ANewCacheFindsCompleteEntriesAndDropsTheRest) {
  const std::string source = "oci:" + Build("a") + ":t";
  std::string digest;
  int64_t bytes = 0;
  {
    auto cache = NewCache(Options());
    ASSERT_NE(cache, nullptr);
    auto r = WaitReady(*cache, source);
    ASSERT_TRUE(r.ok() && r->has_value());
    digest = (*r)->digest;
    bytes = cache->stats().bytes;
    ASSERT_TRUE(cache->Use(digest, "t1").ok());
  }
  const std::string incomplete = dir_ + "/images/" + std::string(64, 'b');
  ASSERT_TRUE(MakeDirs(incomplete + "/rootfs/bin").ok());
  ASSERT_TRUE(MakeDirs(dir_ + "/images/junk").ok());
  ASSERT_TRUE(MakeDirs(dir_ + "/tmp/0123/layout").ok());

  auto cache = NewCache(Options());
  ASSERT_NE(cache, nullptr);
  EXPECT_FALSE(Exists(incomplete));
  EXPECT_FALSE(Exists(dir_ + "/images/junk"));
  EXPECT_TRUE(Children(dir_ + "/tmp").empty());
  ImageCacheStats s = cache->stats();
  EXPECT_EQ(s.images, 1);
  EXPECT_EQ(s.bytes, bytes);
  auto hit = cache->Prepare(source);
  ASSERT_TRUE(hit.ok()) << hit.status().ToString();
  ASSERT_TRUE(hit->has_value());  // no pull
  EXPECT_EQ((*hit)->digest, digest);
  EXPECT_EQ((*hit)->config.entrypoint, std::vector<std::string>{"/bin/sh"});
  EXPECT_EQ((*hit)->config.working_dir, "/w");
  EXPECT_EQ(cache->stats().pulls, 0u);
  EXPECT_EQ(cache->stats().hits, 1u);
  // The user survived the restart until KeepOnly says its task is gone.
  const std::string user = dir_ + "/images/" + digest.substr(7) + "/users/t1";
  EXPECT_TRUE(Exists(user));
  cache->KeepOnly({"t1"});
  EXPECT_TRUE(Exists(user));
  cache->KeepOnly({});
  EXPECT_FALSE(Exists(user));
}

TEST_F(ImageCacheTest, AChangedLocalSourceIsPulledAgain) {
  const std::string layout = Build("a");
  const std::string source = "oci:" + layout + ":t";
  auto cache = NewCache(Options());
  ASSERT_NE(cache, nullptr);
  auto r = WaitReady(*cache, source);
  ASSERT_TRUE(r.ok() && r->has_value());
  const std::string old_digest = (*r)->digest;
  SH("umoci config --image " + layout + ":t --config.env BAR=2");
  auto changed = cache->Prepare(source);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(changed->has_value());
  r = WaitReady(*cache, source);
  ASSERT_TRUE(r.ok() && r->has_value()) << r.status().ToString();
  EXPECT_NE((*r)->digest, old_digest);
  EXPECT_EQ((*r)->digest, LayoutDigest(layout));
  EXPECT_NE(std::find((*r)->config.env.begin(), (*r)->config.env.end(), "BAR=2"), (*r)->config.env.end());
  EXPECT_EQ(cache->stats().pulls, 2u);
}

TEST_F(ImageCacheTest, ARegistrySourceIsResolvedAgainAfterTenMinutes) {
  // "skopeo" serves any docker:// source from the local layout (its last argument is the target).
  const std::string layout = Build("a");
  const std::string count = tmp_.path() + "/count";
  ImageCacheOptions o = Options();
  o.skopeo = Script("skopeo", "echo x >> " + count +
                                  "; for last; do :; done; exec skopeo --insecure-policy copy --quiet oci:" +
                                  layout + ":t \"$last\"");
  auto cache = NewCache(o);
  ASSERT_NE(cache, nullptr);
  const std::string source = "docker://registry.example.com/team/img:1";
  auto r = WaitReady(*cache, source);
  ASSERT_TRUE(r.ok() && r->has_value()) << r.status().ToString();
  EXPECT_EQ((*r)->digest, LayoutDigest(layout));
  auto hit = cache->Prepare(source);
  ASSERT_TRUE(hit.ok() && hit->has_value());
  EXPECT_EQ(ReadText(count), "x\n");
  // Resolved 11 minutes ago: copied again (the same image: no second unpack, no second entry).
  const std::vector<std::string> files = Children(dir_ + "/sources");
  ASSERT_EQ(files.size(), 1u);
  const std::string file = dir_ + "/sources/" + files[0];
  const std::string text = ReadText(file);
  WriteText(file,
            text.substr(0, text.find('\n') + 1) + "resolved " + std::to_string(::time(nullptr) - 660) + "\n");
  auto stale = cache->Prepare(source);
  ASSERT_TRUE(stale.ok());
  EXPECT_FALSE(stale->has_value());
  r = WaitReady(*cache, source);
  ASSERT_TRUE(r.ok() && r->has_value()) << r.status().ToString();
  EXPECT_EQ(ReadText(count), "x\nx\n");
  EXPECT_EQ(cache->stats().images, 1);
  EXPECT_EQ(cache->stats().pulls, 2u);
}

TEST_F(ImageCacheTest, ConcurrentPreparesStartOnePull) {
  const std::string layout = Build("a");
  const std::string count = tmp_.path() + "/count";
  ImageCacheOptions o = Options();
  o.skopeo = Script("skopeo", "echo x >> " + count + "; sleep 0.3; exec skopeo \"$@\"");
  auto cache = NewCache(o);
  ASSERT_NE(cache, nullptr);
  const std::string source = "oci:" + layout + ":t";
  std::atomic<int> ready{0}, failed{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      auto r = WaitReady(*cache, source);
      (r.ok() && r->has_value() ? ready : failed).fetch_add(1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ready.load(), 8);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(ReadText(count), "x\n");
  EXPECT_EQ(cache->stats().pulls, 1u);
}

TEST_F(ImageCacheTest, PullsBeyondTheLimitWait) {
  const std::string log = tmp_.path() + "/overlap";
  const std::string lock = tmp_.path() + "/running";
  ImageCacheOptions o = Options();
  o.max_parallel_pulls = 1;
  // mkdir is atomic: a second copy while one runs leaves a mark.
  o.skopeo = Script("skopeo", "mkdir " + lock + " 2>/dev/null || echo overlap >> " + log +
                                  "; sleep 0.2; rmdir " + lock + "; exec skopeo \"$@\"");
  const std::string a = "oci:" + Build("a") + ":t";
  const std::string b = "oci:" + Build("b") + ":t";
  const std::string c = "oci:" + Build("c") + ":t";
  auto cache = NewCache(o);
  ASSERT_NE(cache, nullptr);
  for (const auto& s : {a, b, c}) ASSERT_TRUE(cache->Prepare(s).ok());
  EXPECT_EQ(cache->stats().pulling, 3);
  for (const auto& s : {a, b, c}) {
    auto r = WaitReady(*cache, s);
    ASSERT_TRUE(r.ok() && r->has_value()) << s << ": " << r.status().ToString();
  }
  EXPECT_FALSE(Exists(log)) << ReadText(log);
  EXPECT_EQ(cache->stats().pulls, 3u);
}

TEST_F(ImageCacheTest, DestroyingTheCacheStopsAPull) {
  const std::string pidfile = tmp_.path() + "/pid";
  ImageCacheOptions o = Options();
  // The copy that never ends, in a grandchild: the whole group must die.
  o.skopeo = Script("skopeo", "sleep 30 & echo $! > " + pidfile + "; wait");
  const std::string source = "oci:" + Build("a") + ":t";
  auto cache = NewCache(o);
  ASSERT_NE(cache, nullptr);
  auto r = cache->Prepare(source);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  const auto deadline = Clock::now() + 10s;
  while (ReadText(pidfile).empty() && Clock::now() < deadline) std::this_thread::sleep_for(20ms);
  const pid_t sleeper = std::atoi(ReadText(pidfile).c_str());
  ASSERT_GT(sleeper, 0);
  auto again = cache->Prepare(source);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->has_value());
  EXPECT_EQ(cache->stats().pulling, 1);
  const auto start = Clock::now();
  cache.reset();
  EXPECT_LT(Clock::now() - start, 20s);
  EXPECT_EQ(done_.load(), 0);  // nobody is told about a pull cut short by the cache going away
  // Gone, or a zombie waiting for init: not sleeping on.
  char state = '?';
  for (auto until = Clock::now() + 5s; Clock::now() < until; std::this_thread::sleep_for(20ms)) {
    const std::string stat = ReadText("/proc/" + std::to_string(sleeper) + "/stat");
    const size_t paren = stat.rfind(')');
    state = paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : 'X';
    if (state == 'X' || state == 'Z') break;
  }
  EXPECT_TRUE(state == 'X' || state == 'Z') << "the copy's child is still there: state " << state;
}

TEST_F(ImageCacheTest, APullTimesOut) {
  ImageCacheOptions o = Options();
  o.pull_timeout = 1s;
  o.skopeo = Script("skopeo", "echo started; exec sleep 30");
  const std::string source = "oci:" + Build("a") + ":t";
  auto cache = NewCache(o);
  ASSERT_NE(cache, nullptr);
  const auto start = Clock::now();
  auto r = WaitReady(*cache, source, 20s);
  ASSERT_FALSE(r.ok());
  EXPECT_LT(Clock::now() - start, 20s);
  EXPECT_NE(r.status().message().find("did not finish within 1000 ms"), std::string::npos)
      << r.status().ToString();
  EXPECT_NE(r.status().message().find("started"), std::string::npos) << r.status().ToString();
  EXPECT_GE(DoneAtLeast(1), 1);
}

TEST(ImageCacheCreateTest, MissingToolsAreNamed) {
  TempDir tmp;
  ImageCacheOptions o;
  o.dir = tmp.path() + "/cache";
  o.skopeo = "/nonexistent/skopeo";
  auto r = ImageCache::Create(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("/nonexistent/skopeo"), std::string::npos) << r.status().ToString();
  o.skopeo = "/bin/sh";
  o.umoci = "no-such-umoci-here";
  r = ImageCache::Create(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no-such-umoci-here"), std::string::npos) << r.status().ToString();
  o.umoci = "/bin/sh";
  o.max_bytes = 0;
  EXPECT_EQ(ImageCache::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.max_bytes = 1 << 20;
  o.dir = tmp.path() + "/with:colon";
  EXPECT_EQ(ImageCache::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.dir = tmp.path() + "/ok";
  r = ImageCache::Create(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  struct stat st;
  ASSERT_EQ(::stat(o.dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0711u);
  ASSERT_EQ(::stat((o.dir + "/tmp").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ((*r)->options().dir, o.dir);
}

}  // namespace
}  // namespace gpupool
