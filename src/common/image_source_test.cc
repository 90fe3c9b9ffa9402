#include "common/image_source.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gpupool {
namespace {

using Transport = ImageSource::Transport;

ImageSource MustParse(const std::string& text) {
  auto r = ParseImageSource(text);
  EXPECT_TRUE(r.ok()) << text << ": " << r.status().ToString();
  return r.ok() ? *r : ImageSource{};
}

// The error, which must be InvalidArgument and quote the source (or its size).
std::string Refused(const std::string& text) {
  auto r = ParseImageSource(text);
  EXPECT_FALSE(r.ok()) << "accepted: " << text;
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << text;
  return r.status().message();
}

TEST(ImageSourceTest, OciLayouts) {
  ImageSource s = MustParse("oci:/srv/images/pytorch");
  EXPECT_EQ(s.transport, Transport::kOci);
  EXPECT_EQ(s.path, "/srv/images/pytorch");
  EXPECT_EQ(s.reference, "");
  EXPECT_TRUE(s.local());
  EXPECT_EQ(s.registry(), "");

  s = MustParse("oci:/srv/images/pytorch:24.05-py3_x");
  EXPECT_EQ(s.path, "/srv/images/pytorch");
  EXPECT_EQ(s.reference, "24.05-py3_x");
  s = MustParse("oci:/x:_t");
  EXPECT_EQ(s.reference, "_t");
  s = MustParse("oci:/a.b/c-d/e_f");  // '-' and '.' inside a part are fine
  EXPECT_EQ(s.path, "/a.b/c-d/e_f");
  MustParse("oci:/x:" + std::string(128, 'a'));
}

TEST(ImageSourceTest, Archives) {
  ImageSource s = MustParse("oci-archive:/srv/img.tar");
  EXPECT_EQ(s.transport, Transport::kOciArchive);
  EXPECT_EQ(s.path, "/srv/img.tar");
  EXPECT_TRUE(s.local());
  s = MustParse("oci-archive:/srv/img.tar:v1");
  EXPECT_EQ(s.reference, "v1");

  s = MustParse("docker-archive:/srv/saved.tar");
  EXPECT_EQ(s.transport, Transport::kDockerArchive);
  EXPECT_EQ(s.path, "/srv/saved.tar");
  EXPECT_EQ(s.reference, "");
  s = MustParse("docker-archive:/srv/saved.tar:test/img:1");
  EXPECT_EQ(s.path, "/srv/saved.tar");
  EXPECT_EQ(s.reference, "test/img:1");
  s = MustParse("docker-archive:/srv/saved.tar:localhost:5000/team/img:2.0");
  EXPECT_EQ(s.reference, "localhost:5000/team/img:2.0");
}

TEST(ImageSourceTest, Registries) {
  ImageSource s = MustParse("docker://busybox");
  EXPECT_EQ(s.transport, Transport::kDocker);
  EXPECT_FALSE(s.local());
  EXPECT_EQ(s.path, "");
  EXPECT_EQ(s.reference, "busybox");
  EXPECT_EQ(s.registry(), "docker.io");

  EXPECT_EQ(MustParse("docker://library/busybox:1.36").registry(), "docker.io");
  EXPECT_EQ(MustParse("docker://ghcr.io/x/y:1").registry(), "ghcr.io");
  EXPECT_EQ(MustParse("docker://localhost:5000/x").registry(), "localhost:5000");
  EXPECT_EQ(MustParse("docker://localhost/x").registry(), "localhost");
  EXPECT_EQ(MustParse("docker://Registry.Example.com:443/team/img").registry(), "Registry.Example.com:443");
  // A first part without '.', ':' or "localhost" is a Docker Hub namespace.
  EXPECT_EQ(MustParse("docker://team/img").registry(), "docker.io");

  const std::string digest = "sha256:" + std::string(64, 'a');
  s = MustParse("docker://ghcr.io/x/y:1@" + digest);
  EXPECT_EQ(s.reference, "ghcr.io/x/y:1@" + digest);
  EXPECT_EQ(s.registry(), "ghcr.io");
  MustParse("docker://busybox@" + digest);
  MustParse("docker://nvcr.io/nvidia/pytorch:24.05-py3");
  MustParse("docker://a.b/c_d/e-f.g:T_1");
}

TEST(ImageSourceTest, RoundTrips) {
  const std::string digest = "sha256:" + std::string(64, '0');
  for (const std::string& text : std::vector<std::string>{
           "oci:/srv/images/x", "oci:/srv/images/x:t", "oci-archive:/a/b.tar", "oci-archive:/a/b.tar:v1",
           "docker-archive:/a/b.tar", "docker-archive:/a/b.tar:test/img:1", "docker://busybox",
           "docker://docker.io/library/busybox:1.36", "docker://localhost:5000/x@" + digest}) {
    auto r = ParseImageSource(text);
    ASSERT_TRUE(r.ok()) << text << ": " << r.status().ToString();
    EXPECT_EQ(r->ToString(), text);
    auto again = ParseImageSource(r->ToString());
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->transport, r->transport);
    EXPECT_EQ(again->path, r->path);
    EXPECT_EQ(again->reference, r->reference);
  }
  ImageSource built;
  built.transport = Transport::kOciArchive;
  built.path = "/p.tar";
  EXPECT_EQ(built.ToString(), "oci-archive:/p.tar");
}

TEST(ImageSourceTest, PathsMustBeAbsoluteAndNormal) {
  EXPECT_NE(Refused("oci:srv/x").find("absolute"), std::string::npos);
  EXPECT_NE(Refused("oci:").find("absolute"), std::string::npos);
  EXPECT_NE(Refused("oci-archive:./x.tar").find("absolute"), std::string::npos);
  EXPECT_NE(Refused("oci:/srv/../etc").find("'..'"), std::string::npos);
  EXPECT_NE(Refused("oci:/srv/./x").find("'.'"), std::string::npos);
  EXPECT_NE(Refused("oci:/srv/x/..").find("'..'"), std::string::npos);
  EXPECT_NE(Refused("oci:/srv//x").find("'//'"), std::string::npos);
  EXPECT_NE(Refused("oci:/srv/x/").find("end with '/'"), std::string::npos);
  EXPECT_NE(Refused("oci:/srv/x/:t").find("end with '/'"), std::string::npos);
  EXPECT_NE(Refused("oci:/-x").find("'-'"), std::string::npos);
  EXPECT_NE(Refused("docker-archive:/srv/--help.tar").find("'-'"), std::string::npos);
  Refused("oci-archive:/a/-rf/b.tar");
  // The error quotes the source.
  EXPECT_NE(Refused("oci:srv/x").find("'oci:srv/x'"), std::string::npos);
}

TEST(ImageSourceTest, CharactersAndSize) {
  Refused("");
  Refused("oci:/srv/my image");
  Refused("oci:/srv/x\t");
  Refused(std::string("oci:/srv/x\0y", 12));
  Refused("oci:/srv/x\n");
  Refused("oci:/srv/x\x7f");
  Refused("oci:/srv/caf\xc3\xa9");
  Refused("docker://busybox\x01");
  // 1024 bytes is the most; 1025 is refused, naming the limit.
  const std::string base = "oci:/";
  MustParse(base + std::string(kMaxImageSourceBytes - base.size(), 'a'));
  const std::string long_one = base + std::string(kMaxImageSourceBytes + 1 - base.size(), 'a');
  ASSERT_EQ(long_one.size(), 1025u);
  EXPECT_NE(Refused(long_one).find("1024"), std::string::npos);
}

TEST(ImageSourceTest, UnknownTransports) {
  for (const std::string text : {"/srv/x", "busybox", "docker:busybox", "docker:/busybox", "OCI:/x", "dir:/x",
                                 "containers-storage:x", "http://x/y", "oci-archive/x"}) {
    EXPECT_NE(Refused(text).find("must start with"), std::string::npos) << text;
  }
}

TEST(ImageSourceTest, BadTags) {
  Refused("oci:/x:");
  Refused("oci:/x:-t");
  Refused("oci:/x:.t");
  Refused("oci:/x:" + std::string(129, 'a'));
  Refused("oci:/x:a/b");
  Refused("oci:/x:a:b");  // a second ':' (paths hold none, so it lands in the tag)
  Refused("oci:/x:t@sha256");
  Refused("oci-archive:/x.tar:");
  Refused("docker://busybox:");
  Refused("docker://busybox:-1");
  Refused("docker://busybox:" + std::string(129, 'a'));
}

TEST(ImageSourceTest, BadDockerNames) {
  Refused("docker://");
  EXPECT_NE(Refused("docker://BusyBox").find("lower-case"), std::string::npos);
  Refused("docker://ghcr.io/Team/img");
  Refused("docker://-busybox");
  Refused("docker://busybox-/../x");
  Refused("docker://a//b");
  Refused("docker://a/");
  Refused("docker:///a");
  Refused("docker://_x");
  // A port is digits: an empty or second one is refused (the registry would not match any allowed).
  Refused("docker://ghcr.io:/x");
  Refused("docker://ghcr.io:a/x");
  Refused("docker://h.io:1:2/x");
  Refused("docker://localhost:/x");
  Refused("docker://-h.io/x");
}

TEST(ImageSourceTest, BadDigests) {
  const std::string hex64(64, 'a');
  Refused("docker://busybox@");
  Refused("docker://busybox@sha256:" + std::string(63, 'a'));
  Refused("docker://busybox@sha256:" + std::string(65, 'a'));
  Refused("docker://busybox@sha256:" + std::string(64, 'A'));
  Refused("docker://busybox@sha256:" + std::string(63, 'a') + "g");
  Refused("docker://busybox@sha512:" + hex64);
  Refused("docker://busybox@" + hex64);
  Refused("docker://busybox@sha256:" + hex64 + "@sha256:" + hex64);
}

TEST(ImageSourceTest, DockerArchiveReferences) {
  EXPECT_NE(Refused("docker-archive:/x.tar:busybox").find("name:tag"), std::string::npos);
  Refused("docker-archive:/x.tar:test/img");
  Refused("docker-archive:/x.tar:busybox@sha256:" + std::string(64, 'a'));
  Refused("docker-archive:/x.tar:busybox:1@sha256:" + std::string(64, 'a'));
  Refused("docker-archive:/x.tar:Test/img:1");
  Refused("docker-archive:/x.tar:img:");
  Refused("docker-archive:/x.tar::1");
}

TEST(ImageSourceTest, Sha256Digests) {
  const std::string hex(64, 'f');
  EXPECT_TRUE(IsSha256Digest("sha256:" + hex));
  EXPECT_TRUE(IsSha256Digest("sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"));
  EXPECT_FALSE(IsSha256Digest(""));
  EXPECT_FALSE(IsSha256Digest("sha256:"));
  EXPECT_FALSE(IsSha256Digest(hex));
  EXPECT_FALSE(IsSha256Digest("sha256:" + hex.substr(1)));
  EXPECT_FALSE(IsSha256Digest("sha256:" + hex + "f"));
  EXPECT_FALSE(IsSha256Digest("sha256:" + std::string(64, 'F')));
  EXPECT_FALSE(IsSha256Digest("sha256:" + std::string(63, 'f') + "g"));
  EXPECT_FALSE(IsSha256Digest("SHA256:" + hex));
  EXPECT_FALSE(IsSha256Digest("sha512:" + hex));
  EXPECT_FALSE(IsSha256Digest(" sha256:" + hex.substr(1)));
}

}  // namespace
}  // namespace gpupool
