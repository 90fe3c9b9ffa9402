// The CUDA limiter in containers (agent/container_preload.h, LaunchSpec::cuda_limiter): the ELF
// version reading against the real library and hostile files, the glibc check against root
// filesystems with no glibc, an old one, links out of the image; and real containers (runc, a
// root filesystem of the host's glibc and a dynamically linked program) that get the library
// through /etc/ld.so.preload and cannot take it away. The containers need root and runc.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "agent/container_preload.h"
#include "agent/runtime.h"
#include "agent/runtime_internal.h"
#include "agent/sandbox_test_util.h"

namespace gpupool {
namespace {

using namespace agent_internal;
using namespace sandbox_test;

constexpr const char* kLibrary = GPUPOOL_CUDA_PRELOAD_PATH;

// ---- a small ELF writer: the sections the reader looks at, nothing else -------------------------

template <typename T>
void Put(std::string* b, size_t off, T v) {
  if (b->size() < off + sizeof(T)) b->resize(off + sizeof(T), '\0');
  std::memcpy(b->data() + off, &v, sizeof(T));
}

struct FakeElf {
  uint16_t machine = 62;  // x86-64
  std::string soname = "libc.so.6";
  std::vector<std::string> defines;                                        // .gnu.version_d
  std::vector<std::pair<std::string, std::vector<std::string>>> requires_; // .gnu.version_r
  std::vector<std::string> needed;                                         // DT_NEEDED
};

std::string BuildElf(const FakeElf& f) {
  std::string strtab(1, '\0');
  auto str = [&](const std::string& s) {
    const uint32_t at = static_cast<uint32_t>(strtab.size());
    strtab += s;
    strtab.push_back('\0');
    return at;
  };
  std::string verdef;
  std::vector<std::string> defs = {f.soname};
  defs.insert(defs.end(), f.defines.begin(), f.defines.end());
  for (size_t i = 0; i < defs.size(); ++i) {
    const size_t at = verdef.size();
    Put<uint16_t>(&verdef, at, 1);                                     // vd_version
    Put<uint16_t>(&verdef, at + 2, i == 0 ? 1 : 0);                    // vd_flags: the base
    Put<uint16_t>(&verdef, at + 4, static_cast<uint16_t>(i + 1));      // vd_ndx
    Put<uint16_t>(&verdef, at + 6, 1);                                 // vd_cnt
    Put<uint32_t>(&verdef, at + 8, 0);                                 // vd_hash
    Put<uint32_t>(&verdef, at + 12, 20);                               // vd_aux
    Put<uint32_t>(&verdef, at + 16, i + 1 < defs.size() ? 28 : 0);     // vd_next
    Put<uint32_t>(&verdef, at + 20, str(defs[i]));                     // vda_name
    Put<uint32_t>(&verdef, at + 24, 0);                                // vda_next
  }
  std::string verneed;
  for (size_t i = 0; i < f.requires_.size(); ++i) {
    const auto& [file, versions] = f.requires_[i];
    const size_t at = verneed.size();
    Put<uint16_t>(&verneed, at, 1);
    Put<uint16_t>(&verneed, at + 2, static_cast<uint16_t>(versions.size()));
    Put<uint32_t>(&verneed, at + 4, str(file));
    Put<uint32_t>(&verneed, at + 8, 16);
    Put<uint32_t>(&verneed, at + 12, i + 1 < f.requires_.size() ? static_cast<uint32_t>(16 + 16 * versions.size()) : 0);
    for (size_t j = 0; j < versions.size(); ++j) {
      const size_t a = at + 16 + 16 * j;
      Put<uint32_t>(&verneed, a, 0);
      Put<uint16_t>(&verneed, a + 4, 0);
      Put<uint16_t>(&verneed, a + 6, static_cast<uint16_t>(j + 2));
      Put<uint32_t>(&verneed, a + 8, str(versions[j]));
      Put<uint32_t>(&verneed, a + 12, j + 1 < versions.size() ? 16 : 0);
    }
  }
  std::string dynamic;
  for (const std::string& n : f.needed) {
    Put<uint64_t>(&dynamic, dynamic.size(), 1);
    Put<uint64_t>(&dynamic, dynamic.size(), str(n));
  }
  Put<uint64_t>(&dynamic, dynamic.size(), 0);
  Put<uint64_t>(&dynamic, dynamic.size(), 0);

  std::string out(64, '\0');
  std::memcpy(out.data(), "\x7f" "ELF", 4);
  out[4] = 2;  // 64-bit
  out[5] = 1;  // little-endian
  out[6] = 1;
  Put<uint16_t>(&out, 16, 3);  // ET_DYN
  Put<uint16_t>(&out, 18, f.machine);
  struct Sec {
    uint32_t type;
    const std::string* data;
    uint32_t link;
    uint32_t info;
  };
  const std::vector<Sec> secs = {{3, &strtab, 0, 0},
                                 {0x6ffffffd, &verdef, 1, static_cast<uint32_t>(defs.size())},
                                 {0x6ffffffe, &verneed, 1, static_cast<uint32_t>(f.requires_.size())},
                                 {6, &dynamic, 1, 0}};
  std::vector<uint64_t> offsets;
  for (const Sec& s : secs) {
    offsets.push_back(out.size());
    out += *s.data;
    while (out.size() % 8 != 0) out.push_back('\0');
  }
  const uint64_t shoff = out.size();
  Put<uint64_t>(&out, 40, shoff);
  Put<uint16_t>(&out, 52, 64);
  Put<uint16_t>(&out, 58, 64);
  Put<uint16_t>(&out, 60, static_cast<uint16_t>(secs.size() + 1));
  out.append(64, '\0');  // section 0
  for (size_t i = 0; i < secs.size(); ++i) {
    const size_t at = out.size();
    out.append(64, '\0');
    Put<uint32_t>(&out, at + 4, secs[i].type);
    Put<uint64_t>(&out, at + 24, offsets[i]);
    Put<uint64_t>(&out, at + 32, secs[i].data->size());
    Put<uint32_t>(&out, at + 40, secs[i].link);
    Put<uint32_t>(&out, at + 44, secs[i].info);
  }
  return out;
}

// glibc 2.2.5 .. 2.<newest> as its libc.so.6 defines them.
FakeElf FakeLibc(int newest_minor, uint16_t machine) {
  FakeElf f;
  f.machine = machine;
  f.defines = {"GLIBC_2.2.5", "GLIBC_2.3", "GLIBC_2.3.2"};
  for (int m = 4; m <= newest_minor; ++m) f.defines.push_back("GLIBC_2." + std::to_string(m));
  f.defines.push_back("GLIBC_PRIVATE");
  return f;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/gpupool-cpl-XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) path_ = tmpl;
    if (!path_.empty()) (void)::chmod(path_.c_str(), 0755);
  }
  ~TempDir() {
    if (!path_.empty()) (void)RemoveTree(path_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

bool WriteBytes(const std::string& path, const std::string& bytes) {
  if (!MakeDirs(path.substr(0, path.rfind('/'))).ok()) return false;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  return static_cast<bool>(out);
}

Result<ElfVersions> ParseBytes(const TempDir& dir, const std::string& bytes) {
  const std::string path = dir.path() + "/elf";
  if (!WriteBytes(path, bytes)) return Status::IoError("write");
  return ReadElfVersionsAt(path);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The library's own needs from libc.so.6 ("2.34").
std::string LibraryGlibc(const ElfVersions& lib) {
  for (const auto& [file, versions] : lib.requires_versions)
    if (file == "libc.so.6") return NewestGlibcVersion(versions);
  return "";
}

// ---- version names ------------------------------------------------------------------------------

TEST(GlibcVersion, ParsesOnlyWellFormedNames) {
  EXPECT_EQ(ParseGlibcVersion("GLIBC_2.34"), (std::vector<int>{2, 34}));
  EXPECT_EQ(ParseGlibcVersion("GLIBC_2.2.5"), (std::vector<int>{2, 2, 5}));
  EXPECT_EQ(ParseGlibcVersion("GLIBC_2.0.0.1"), (std::vector<int>{2, 0, 0, 1}));
  for (const char* bad : {"", "GLIBC_", "GLIBC_2", "GLIBC_2.", "GLIBC_.2", "GLIBC_2..3", "GLIBC_2.34a", "GLIBC_-1.2",
                          "GLIBC_+2.3", "GLIBC_2.3 ", " GLIBC_2.3", "GLIBC_1234567.1", "GLIBC_1.2.3.4.5", "GCC_3.0",
                          "glibc_2.3", "GLIBC_PRIVATE", "GLIBC_2.3\n", "GLIBC_2,3"})
    EXPECT_FALSE(ParseGlibcVersion(bad).has_value()) << bad;
  EXPECT_FALSE(ParseGlibcVersion(std::string_view("GLIBC_2.3\0.9", 12)).has_value());
  EXPECT_FALSE(ParseGlibcVersion(std::string(100000, '9')).has_value());
  EXPECT_FALSE(ParseGlibcVersion("GLIBC_" + std::string(100000, '9') + ".1").has_value());
}

TEST(GlibcVersion, TheNewestIsComparedNumberByNumber) {
  EXPECT_EQ(NewestGlibcVersion({"GLIBC_2.2.5", "GLIBC_2.34", "GLIBC_2.4", "GLIBC_PRIVATE", "GCC_9.0"}), "2.34");
  EXPECT_EQ(NewestGlibcVersion({"GLIBC_2.9", "GLIBC_2.10"}), "2.10");
  EXPECT_EQ(NewestGlibcVersion({"GLIBC_2.3", "GLIBC_2.3.4"}), "2.3.4");
  EXPECT_EQ(NewestGlibcVersion({"GCC_3.0", "GLIBC_PRIVATE", "junk"}), "");
  EXPECT_EQ(NewestGlibcVersion({}), "");
}

// ---- ELF version sections ----------------------------------------------------------------------

TEST(ElfVersions, TheBuiltLibraryNeedsGlibcVersionsTheHostDefines) {
  auto lib = ReadElfVersionsAt(kLibrary);
  ASSERT_TRUE(lib.ok()) << lib.status().ToString();
  EXPECT_NE(std::find(lib->needed.begin(), lib->needed.end(), "libc.so.6"), lib->needed.end());
  const std::string glibc = LibraryGlibc(*lib);
  ASSERT_FALSE(glibc.empty());
  EXPECT_TRUE(ParseGlibcVersion("GLIBC_" + glibc).has_value());
  // The host built it, so the host can load it: its own / passes the check.
  EXPECT_TRUE(CheckPreloadFits("/", *lib).ok()) << CheckPreloadFits("/", *lib).ToString();
}

TEST(ElfVersions, AFakeLibcReadsBackAsWritten) {
  TempDir dir;
  FakeElf f = FakeLibc(31, 62);
  f.requires_ = {{"ld-linux-x86-64.so.2", {"GLIBC_2.3"}}, {"libgcc_s.so.1", {"GCC_3.0", "GCC_4.2.0"}}};
  f.needed = {"ld-linux-x86-64.so.2", "libgcc_s.so.1"};
  auto got = ParseBytes(dir, BuildElf(f));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->machine, 62);
  EXPECT_EQ(got->defines, f.defines);  // the base (soname) entry is not a version
  EXPECT_EQ(got->requires_versions, f.requires_);
  EXPECT_EQ(got->needed, f.needed);
  EXPECT_EQ(NewestGlibcVersion(got->defines), "2.31");
}

// Truncated, mutated and malformed files: an InvalidArgument error, never a crash or a hang.
TEST(ElfVersions, HostileAndTruncatedFilesAreErrorsNotCrashes) {
  TempDir dir;
  FakeElf f = FakeLibc(34, 62);
  f.requires_ = {{"ld-linux-x86-64.so.2", {"GLIBC_2.3"}}};
  f.needed = {"ld-linux-x86-64.so.2"};
  const std::string good = BuildElf(f);
  for (size_t n = 0; n < good.size(); ++n) {
    auto r = ParseBytes(dir, good.substr(0, n));
    // Cut anywhere before the section headers' end: some section or the headers are past the end.
    EXPECT_FALSE(r.ok()) << n;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << n << r.status().ToString();
    }
  }
  // The real library cut short.
  const std::string real = ReadAll(kLibrary);
  ASSERT_GT(real.size(), 4096u);
  for (size_t n : {size_t{0}, size_t{3}, size_t{63}, size_t{64}, size_t{4096}, real.size() / 2, real.size() - 1}) {
    auto r = ParseBytes(dir, real.substr(0, n));
    EXPECT_FALSE(r.ok()) << n;
  }
  // Random damage: any answer but a crash.
  std::mt19937 rng(12345);
  for (int i = 0; i < 1000; ++i) {
    std::string bad = good;
    const int flips = 1 + static_cast<int>(rng() % 8);
    for (int k = 0; k < flips; ++k) bad[rng() % bad.size()] = static_cast<char>(rng() & 0xff);
    (void)ParseBytes(dir, bad);
  }
  // Chosen damage.
  auto with = [&](size_t off, auto value) {
    std::string bad = good;
    Put(&bad, off, value);
    return ParseBytes(dir, bad);
  };
  const uint64_t shoff = [&] {
    uint64_t v;
    std::memcpy(&v, good.data() + 40, 8);
    return v;
  }();
  const size_t verdef_sh = shoff + 2 * 64, verneed_sh = shoff + 3 * 64, dyn_sh = shoff + 4 * 64;
  uint64_t verdef_off, verneed_off;
  std::memcpy(&verdef_off, good.data() + verdef_sh + 24, 8);
  std::memcpy(&verneed_off, good.data() + verneed_sh + 24, 8);
  const std::vector<std::pair<std::string, Result<ElfVersions>>> cases = {
      {"32-bit", with(4, uint8_t{1})},
      {"big-endian", with(5, uint8_t{2})},
      {"no magic", with(0, uint8_t{0})},
      {"section headers past the end", with(40, uint64_t{1} << 62)},
      {"section headers of another size", with(58, uint16_t{40})},
      {"no section headers", with(60, uint16_t{0})},
      {"65535 section headers", with(60, uint16_t{65535})},
      {"a section of 2^63 bytes", with(verdef_sh + 32, uint64_t{1} << 63)},
      {"a section offset that wraps", with(verdef_sh + 24, ~uint64_t{0} - 4)},
      {"a string table link out of range", with(verdef_sh + 40, uint32_t{99})},
      {"a link to a section that is not a string table", with(verdef_sh + 40, uint32_t{2})},
      {"a dynamic section linking to itself", with(dyn_sh + 40, uint32_t{4})},
      {"a version definition chain that loops", with(verdef_off + 16, uint32_t{1})},
      {"a version definition chain past the end", with(verdef_off + 16, uint32_t{0xfffffff0})},
      {"a definition's name past the end", with(verdef_off + 12, uint32_t{0x7ffffff0})},
      {"a name outside the string table", with(verdef_off + 20, uint32_t{0x7fffffff})},
      {"65535 needed versions", with(verneed_off + 2, uint16_t{65535})},
      {"a version need chain that loops", with(verneed_off + 12, uint32_t{8})},
      {"a needed version's chain that loops", with(verneed_off + 16 + 12, uint32_t{4})},
  };
  for (const auto& [what, r] : cases) {
    EXPECT_FALSE(r.ok()) << what;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << what << ": " << r.status().ToString();
      EXPECT_NE(r.status().message().find("not a usable ELF shared object"), std::string::npos)
          << what << ": " << r.status().ToString();
    }
  }
  // A string table without its terminating NUL.
  {
    std::string bad = good;
    uint64_t str_off, str_size;
    std::memcpy(&str_off, good.data() + shoff + 64 + 24, 8);
    std::memcpy(&str_size, good.data() + shoff + 64 + 32, 8);
    for (uint64_t i = 1; i < str_size; ++i) bad[str_off + i] = 'A';
    EXPECT_FALSE(ParseBytes(dir, bad).ok());
  }
  // Not regular files.
  EXPECT_FALSE(ReadElfVersionsAt(dir.path()).ok());
  const std::string fifo = dir.path() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_FALSE(ReadElfVersionsAt(fifo).ok());  // and no hang
  EXPECT_FALSE(ReadElfVersionsAt(dir.path() + "/absent").ok());
  ASSERT_EQ(::symlink(kLibrary, (dir.path() + "/link").c_str()), 0);
  EXPECT_FALSE(ReadElfVersionsAt(dir.path() + "/link").ok());  // never through a final link
}

// ---- whether an image can load it ----------------------------------------------------------------

class PreloadFitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto lib = ReadElfVersionsAt(kLibrary);
    ASSERT_TRUE(lib.ok()) << lib.status().ToString();
    lib_ = *lib;
    glibc_ = LibraryGlibc(lib_);
    ASSERT_FALSE(glibc_.empty());
    ASSERT_FALSE(dir_.path().empty());
    root_ = dir_.path() + "/rootfs";
    ASSERT_TRUE(MakeDirs(root_ + "/etc").ok());
    libdir_ = ImageLibraryDirs().front();
  }
  // Every library the limiter needs, as fake ELF files defining what it needs, in the first
  // library directory; libc.so.6 as `libc` says.
  void Populate(const FakeElf& libc) {
    for (const auto& [file, versions] : lib_.requires_versions) {
      FakeElf f;
      f.machine = lib_.machine;
      f.soname = file;
      f.defines = versions;
      ASSERT_TRUE(WriteBytes(root_ + libdir_ + "/" + file, file == "libc.so.6" ? BuildElf(libc) : BuildElf(f)));
    }
    for (const auto& n : lib_.needed) {
      if (PathExists(root_ + libdir_ + "/" + n)) continue;
      FakeElf f;
      f.machine = lib_.machine;
      f.soname = n;
      ASSERT_TRUE(WriteBytes(root_ + libdir_ + "/" + n, BuildElf(f)));
    }
  }
  int NewestMinor() const { return ParseGlibcVersion("GLIBC_" + glibc_)->at(1); }

  TempDir dir_;
  ElfVersions lib_;
  std::string glibc_, root_, libdir_;
};

TEST_F(PreloadFitsTest, AnImageWithTheNeededGlibcFits) {
  Populate(FakeLibc(NewestMinor(), lib_.machine));
  EXPECT_TRUE(CheckPreloadFits(root_, lib_).ok()) << CheckPreloadFits(root_, lib_).ToString();
}

TEST_F(PreloadFitsTest, AnOlderGlibcIsRefusedNamingBothVersions) {
  const int old_minor = NewestMinor() - 3;
  Populate(FakeLibc(old_minor, lib_.machine));
  const Status st = CheckPreloadFits(root_, lib_);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  const std::string old_version = "2." + std::to_string(old_minor);
  EXPECT_NE(st.message().find("the image's glibc is " + old_version), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("needs glibc " + glibc_), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("GLIBC_" + glibc_), std::string::npos) << st.ToString();
}

TEST_F(PreloadFitsTest, NoGlibcIsRefused) {
  const Status st = CheckPreloadFits(root_, lib_);  // an empty image: static or musl
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("the image has no glibc"), std::string::npos) << st.ToString();
  // musl's loader and libc, but no libc.so.6.
  ASSERT_TRUE(WriteBytes(root_ + "/lib/ld-musl-x86_64.so.1", "musl"));
  ASSERT_TRUE(WriteBytes(root_ + "/lib/libc.musl-x86_64.so.1", "musl"));
  EXPECT_NE(CheckPreloadFits(root_, lib_).message().find("the image has no glibc"), std::string::npos);
}

TEST_F(PreloadFitsTest, AnotherMachinesGlibcIsRefused) {
  Populate(FakeLibc(NewestMinor(), 183));  // aarch64's
  const Status st = CheckPreloadFits(root_, lib_);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("ELF machine 183"), std::string::npos) << st.ToString();
}

TEST_F(PreloadFitsTest, AMissingHelperLibraryIsRefused) {
  Populate(FakeLibc(NewestMinor(), lib_.machine));
  for (const auto& n : lib_.needed) {
    if (n == "libc.so.6") continue;
    ASSERT_EQ(::unlink((root_ + libdir_ + "/" + n).c_str()), 0);
    const Status st = CheckPreloadFits(root_, lib_);
    EXPECT_FALSE(st.ok()) << n;
    EXPECT_NE(st.message().find("the image has no " + n), std::string::npos) << st.ToString();
    Populate(FakeLibc(NewestMinor(), lib_.machine));
  }
}

// Links are the image's: resolved inside it, never on the host (whose glibc would pass).
TEST_F(PreloadFitsTest, LinksAreResolvedInsideTheImage) {
  Populate(FakeLibc(NewestMinor(), lib_.machine));
  const std::string libc = root_ + libdir_ + "/libc.so.6";
  // A link within the image, relative and absolute: followed inside it.
  ASSERT_EQ(::rename(libc.c_str(), (root_ + libdir_ + "/libc-real.so").c_str()), 0);
  ASSERT_EQ(::symlink("libc-real.so", libc.c_str()), 0);
  EXPECT_TRUE(CheckPreloadFits(root_, lib_).ok()) << CheckPreloadFits(root_, lib_).ToString();
  ASSERT_EQ(::unlink(libc.c_str()), 0);
  ASSERT_EQ(::symlink((libdir_ + "/libc-real.so").c_str(), libc.c_str()), 0);
  EXPECT_TRUE(CheckPreloadFits(root_, lib_).ok()) << CheckPreloadFits(root_, lib_).ToString();
  // Links that would leave the image, to the host's own libc.so.6 (which would pass): they stay in
  // it and find nothing there.
  for (const std::string& target : {libdir_ + "/../../../../../../../../" + libdir_ + "/libc.so.6",
                                   "../../../../../../../../../.." + libdir_ + "/libc.so.6",
                                   std::string("/proc/self/root") + libdir_ + "/libc.so.6"}) {
    ASSERT_EQ(::unlink(libc.c_str()), 0);
    ASSERT_EQ(::symlink(target.c_str(), libc.c_str()), 0);
    const Status st = CheckPreloadFits(root_, lib_);
    EXPECT_FALSE(st.ok()) << target;
    EXPECT_EQ(st.message().find("glibc is"), std::string::npos) << target << ": " << st.ToString();
  }
  // A directory of the path that is a link out of the image.
  ASSERT_TRUE(RemoveTree(root_ + "/lib").ok());
  ASSERT_TRUE(RemoveTree(root_ + "/usr").ok());
  // (In the image, /lib -> /../../../../lib is /lib itself: a loop, an error; never the host's.)
  ASSERT_EQ(::symlink("/../../../../lib", (root_ + "/lib").c_str()), 0);
  Status out = CheckPreloadFits(root_, lib_);
  EXPECT_FALSE(out.ok());
  EXPECT_EQ(out.message().find("glibc is"), std::string::npos) << out.ToString();
  ASSERT_EQ(::unlink((root_ + "/lib").c_str()), 0);
  ASSERT_EQ(::symlink("../../../../../../../../../../lib", (root_ + "/lib").c_str()), 0);
  out = CheckPreloadFits(root_, lib_);
  EXPECT_FALSE(out.ok());
  EXPECT_EQ(out.message().find("glibc is"), std::string::npos) << out.ToString();
  // A link loop and a FIFO: errors, no hang.
  ASSERT_EQ(::unlink((root_ + "/lib").c_str()), 0);
  Populate(FakeLibc(NewestMinor(), lib_.machine));
  ASSERT_EQ(::unlink(libc.c_str()), 0);
  ASSERT_EQ(::symlink("loop", (root_ + libdir_ + "/loop").c_str()), 0);
  ASSERT_EQ(::symlink("loop", libc.c_str()), 0);
  EXPECT_FALSE(CheckPreloadFits(root_, lib_).ok());
  ASSERT_EQ(::unlink(libc.c_str()), 0);
  ASSERT_EQ(::mkfifo(libc.c_str(), 0644), 0);
  const Status fifo = CheckPreloadFits(root_, lib_);
  EXPECT_FALSE(fifo.ok());
  EXPECT_NE(fifo.message().find("not a regular file"), std::string::npos) << fifo.ToString();
}

// ---- real containers --------------------------------------------------------------------------

// A busybox root filesystem (static: a preload never reaches it) with the host's glibc and the
// libraries the limiter needs, and /opt/cat, the host's dynamically linked cat.
class ContainerPreloadTest : public RuncSandboxTest {
 protected:
  void SetUp() override {
    RuncSandboxTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    auto lib = ReadElfVersionsAt(kLibrary);
    ASSERT_TRUE(lib.ok()) << lib.status().ToString();
    lib_ = *lib;
    const std::string libdir = ImageLibraryDirs().front();
    std::vector<std::string> files = lib_.needed;
    for (const auto& [file, v] : lib_.requires_versions) files.push_back(file);
    for (const std::string& f : files) {
      char real[PATH_MAX];
      if (::realpath((libdir + "/" + f).c_str(), real) == nullptr) GTEST_SKIP() << "the host has no " << libdir << "/" << f;
      ASSERT_TRUE(WriteBytes(rootfs_ + libdir + "/" + f, ReadAll(real)));
    }
    char interp[PATH_MAX];
    if (::realpath("/lib64/ld-linux-x86-64.so.2", interp) == nullptr) GTEST_SKIP() << "no /lib64/ld-linux-x86-64.so.2";
    ASSERT_TRUE(WriteBytes(rootfs_ + "/lib64/ld-linux-x86-64.so.2", ReadAll(interp)));
    ASSERT_TRUE(WriteBytes(rootfs_ + "/opt/cat", ReadAll("/bin/cat")));
    for (const std::string& f : {rootfs_ + "/opt/cat", rootfs_ + "/lib64/ld-linux-x86-64.so.2"})
      ASSERT_EQ(::chmod(f.c_str(), 0755), 0);
  }
  LaunchSpec Fractional(const std::string& id, const std::string& script) {
    LaunchSpec s = Spec(id, script);
    s.cuda_limiter = kLibrary;
    s.cuda_ledger = true;
    s.env["LD_PRELOAD"] = kContainerCudaLimiterPath;  // as task_env.cc sets it
    s.env["GPUPOOL_GPU_MEMORY_BYTES"] = std::to_string(int64_t{1} << 30);
    s.env["GPUPOOL_GPU_SHARES_MILLI"] = "250";
    return s;
  }
  ElfVersions lib_;
};

TEST_F(ContainerPreloadTest, AFractionalTaskHasTheLimiterInEveryDynamicProcessEvenWithoutLdPreload) {
  const std::string out = Run(Fractional(
      "preload",
      "echo \"PRELOAD=$(cat /etc/ld.so.preload)\"; echo \"LEDGER=$GPUPOOL_CUDA_LEDGER\"; "
      "stat -c 'LEDGER-FILE %u %a %F' /run/gpupool/cuda-ledger; "
      "/opt/cat /proc/self/maps | grep -q /usr/lib/gpupool/libgpupool-cuda.so && echo MAPPED; "
      "unset LD_PRELOAD; /opt/cat /proc/self/maps | grep -q /usr/lib/gpupool/libgpupool-cuda.so && echo MAPPED-UNSET; "
      "busybox env -i /opt/cat /proc/self/maps | grep -q /usr/lib/gpupool/libgpupool-cuda.so && echo MAPPED-EMPTY-ENV; "
      "/opt/cat /proc/self/status | grep -q . && echo CAT-RAN"));
  EXPECT_NE(out.find("PRELOAD=/usr/lib/gpupool/libgpupool-cuda.so\n"), std::string::npos) << out;
  EXPECT_NE(out.find("LEDGER=/run/gpupool/cuda-ledger\n"), std::string::npos) << out;
  EXPECT_NE(out.find("LEDGER-FILE 0 600 regular"), std::string::npos) << out;  // the task's uid, 0600
  for (const char* line : {"MAPPED\n", "MAPPED-UNSET\n", "MAPPED-EMPTY-ENV\n", "CAT-RAN\n"})
    EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
  EXPECT_EQ(out.find("cannot be preloaded"), std::string::npos) << out;
}

TEST_F(ContainerPreloadTest, TheTaskCannotChangeThePreloadListOrTheLibrary) {
  const std::string out = Run(Fractional(
      "preload-ro",
      "echo > /etc/ld.so.preload 2>/dev/null || echo PRELOAD-RO; "
      "echo x >> /usr/lib/gpupool/libgpupool-cuda.so 2>/dev/null || echo LIB-RO; "
      "busybox rm -f /etc/ld.so.preload 2>/dev/null; busybox mv /etc/ld.so.preload /tmp/x 2>/dev/null; "
      "busybox umount /etc/ld.so.preload 2>/dev/null || echo UMOUNT-DENIED; "
      "busybox rm -f /usr/lib/gpupool/libgpupool-cuda.so 2>/dev/null; "
      "echo \"STILL=$(cat /etc/ld.so.preload)\"; "
      "test -s /usr/lib/gpupool/libgpupool-cuda.so && echo LIB-STILL; "
      "test -w /run/gpupool/cuda-ledger && echo LEDGER-RW; "
      "unset LD_PRELOAD; /opt/cat /proc/self/maps | grep -q libgpupool-cuda && echo MAPPED"));
  for (const char* line : {"PRELOAD-RO\n", "LIB-RO\n", "UMOUNT-DENIED\n", "STILL=/usr/lib/gpupool/libgpupool-cuda.so\n",
                           "LIB-STILL\n", "LEDGER-RW\n", "MAPPED\n"})
    EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
  // The host's copies are untouched.
  EXPECT_EQ(ReadAll(dir_ + "/state/" + UniqueId("preload-ro") + "/ld.so.preload"), "/usr/lib/gpupool/libgpupool-cuda.so\n");
}

// The limits come from a read-only file of root's, not from the environment the task can change
// (the library reads /run/gpupool/cuda-limits when it exists).
TEST_F(ContainerPreloadTest, TheLimitsAreInAReadOnlyFileTheTaskCannotChange) {
  const std::string out = Run(Fractional(
      "limits",
      "busybox cat /run/gpupool/cuda-limits | busybox sed 's/^/LIMITS /'; "
      "stat -c 'LIMITS-FILE %a %F' /run/gpupool/cuda-limits; "
      "echo x > /run/gpupool/cuda-limits 2>/dev/null || echo LIMITS-RO; "
      "echo x >> /run/gpupool/cuda-limits 2>/dev/null || echo LIMITS-APPEND-RO; "
      "busybox chmod 0666 /run/gpupool/cuda-limits 2>/dev/null || echo LIMITS-CHMOD-DENIED; "
      "busybox rm -f /run/gpupool/cuda-limits 2>/dev/null; busybox mv /run/gpupool/cuda-limits /tmp/x 2>/dev/null; "
      "busybox umount /run/gpupool/cuda-limits 2>/dev/null || echo LIMITS-UMOUNT-DENIED; "
      "busybox mv /run/gpupool /tmp/gp 2>/dev/null; "
      "test -f /run/gpupool/cuda-limits && echo LIMITS-STILL; "
      "busybox cat /run/gpupool/cuda-limits | busybox sed 's/^/AFTER /'"));
  const std::string memory = "memory_bytes=" + std::to_string(int64_t{1} << 30) + "\n";
  for (const std::string& line :
       {"LIMITS " + memory, std::string("LIMITS shares_milli=250\n"), std::string("LIMITS ledger=/run/gpupool/cuda-ledger\n"),
        std::string("LIMITS-FILE 444 regular"), std::string("LIMITS-RO\n"), std::string("LIMITS-APPEND-RO\n"),
        std::string("LIMITS-CHMOD-DENIED\n"), std::string("LIMITS-UMOUNT-DENIED\n"), std::string("LIMITS-STILL\n"),
        "AFTER " + memory, std::string("AFTER shares_milli=250\n")})
    EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
  // The host's copy: root's (the agent's), 0444, unchanged.
  const std::string host = dir_ + "/state/" + UniqueId("limits") + "/cuda-limits";
  EXPECT_EQ(ReadAll(host), memory + "shares_milli=250\nledger=/run/gpupool/cuda-ledger\n");
  struct stat st;
  ASSERT_EQ(::stat(host.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0444u);
  EXPECT_EQ(st.st_uid, ::geteuid());
}

TEST(CudaLimitsFile, MirrorsTheEnvironmentAndRefusesLineBreaks) {
  auto text = agent_internal::CudaLimitsFileContents(
      {{"GPUPOOL_GPU_MEMORY_BYTES", "1073741824,0"}, {"GPUPOOL_GPU_SHARES_MILLI", "250,1000"},
       {"GPUPOOL_CUDA_LEDGER", "/run/gpupool/cuda-ledger"}, {"OTHER", "x"}});
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text, "memory_bytes=1073741824,0\nshares_milli=250,1000\nledger=/run/gpupool/cuda-ledger\n");
  text = agent_internal::CudaLimitsFileContents({});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "memory_bytes=\nshares_milli=\nledger=\n");
  for (const std::string& bad : {std::string("1\nledger=/tmp/x"), std::string("1\r"), std::string("1\0", 2)})
    EXPECT_FALSE(agent_internal::CudaLimitsFileContents({{"GPUPOOL_GPU_MEMORY_BYTES", bad}}).ok());
}

TEST_F(ContainerPreloadTest, AWholeGpuTaskGetsNoPreload) {
  LaunchSpec spec = Spec("no-preload", "cat /etc/ld.so.preload 2>/dev/null; echo \"LEDGER=$GPUPOOL_CUDA_LEDGER\"; "
                                       "test -e /run/gpupool/cuda-limits || echo NO-LIMITS-FILE; "
                                       "/opt/cat /proc/self/maps | grep -q libgpupool-cuda || echo NOT-MAPPED");
  const std::string out = Run(spec);
  EXPECT_EQ(out.find("libgpupool-cuda.so"), std::string::npos) << out;
  EXPECT_NE(out.find("LEDGER=\n"), std::string::npos) << out;
  EXPECT_NE(out.find("NOT-MAPPED\n"), std::string::npos) << out;
  EXPECT_NE(out.find("NO-LIMITS-FILE\n"), std::string::npos) << out;
}

TEST_F(ContainerPreloadTest, AnImageThatCannotLoadTheLimiterDoesNotStart) {
  const std::string glibc = LibraryGlibc(lib_);
  const int minor = ParseGlibcVersion("GLIBC_" + glibc)->at(1);
  const std::string libc = rootfs_ + ImageLibraryDirs().front() + "/libc.so.6";
  ASSERT_TRUE(WriteBytes(libc, BuildElf(FakeLibc(minor - 4, lib_.machine))));
  Status st = rt_->Start(Fractional("old-glibc", "echo RAN"));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("the image's glibc is 2." + std::to_string(minor - 4)), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("needs glibc " + glibc), std::string::npos) << st.ToString();
  EXPECT_TRUE(rt_->List().empty());
  // No glibc at all (a static or musl image).
  ASSERT_EQ(::unlink(libc.c_str()), 0);
  st = rt_->Start(Fractional("no-glibc", "echo RAN"));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("the image has no glibc"), std::string::npos) << st.ToString();
  // Nothing of the task's may be mounted where the limiter's go.
  ASSERT_TRUE(WriteBytes(libc, ReadAll(ImageLibraryDirs().front() + "/libc.so.6")));
  for (const char* dest : {"/etc/ld.so.preload", "/etc", "//usr/./lib/", "/run", "/run/gpupool/cuda-limits", "/"}) {
    LaunchSpec over = Fractional("over", "echo RAN");
    over.binds = {{dir_, dest, false}};
    st = rt_->Start(over);
    ASSERT_FALSE(st.ok()) << dest;
    EXPECT_NE(st.message().find("the CUDA limiter's; nothing else may be mounted there"), std::string::npos)
        << st.ToString();
  }
  LaunchSpec scratch = Fractional("over", "echo RAN");
  scratch.tmpfs = {{"/usr/lib", 1 << 20}};
  EXPECT_FALSE(rt_->Start(scratch).ok());
  // A link on the way to a mountpoint of the limiter's: refused (its target could be renamed).
  ASSERT_TRUE(RemoveTree(rootfs_ + "/etc").ok());
  ASSERT_EQ(::symlink("tmp", (rootfs_ + "/etc").c_str()), 0);
  st = rt_->Start(Fractional("linked-etc", "echo RAN"));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("the CUDA limiter's mountpoint"), std::string::npos) << st.ToString();
  EXPECT_TRUE(rt_->List().empty());
}

}  // namespace
}  // namespace gpupool

namespace gpupool {
namespace {

// The limiter's binds go after every other mount, whatever its depth: a deeper mount of the task's
// (through a link of its image, say) cannot cover them.
TEST(ContainerPreloadConfig, TheLimitersBindsAreMountedLast) {
  LaunchSpec spec;
  spec.id = "j-1.0";
  spec.argv = {"sh"};
  spec.uid = 20101;
  spec.binds = {{"/srv/vol", "/a/b/c/d/e/f", false}};
  spec.tmpfs = {{"/x/y/z/w/v/u", 1 << 20}};
  const std::vector<LaunchSpec::Bind> last = {{"/lib/gpupool.so", agent_internal::kContainerCudaLimiterPath, true},
                                              {"/state/j-1.0/ld.so.preload", agent_internal::kContainerPreloadPath, true},
                                              {"/state/j-1.0/cuda-ledger", agent_internal::kContainerCudaLedgerPath, false},
                                              {"/state/j-1.0/cuda-limits", agent_internal::kContainerCudaLimitsPath, true}};
  auto text = agent_internal::BuildOciConfig(spec, "/srv/rootfs", "/gpupool/x", last);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  const auto config = nlohmann::json::parse(*text);
  const auto& mounts = config["mounts"];
  ASSERT_GE(mounts.size(), last.size());
  for (size_t i = 0; i < last.size(); ++i) {
    const auto& m = mounts[mounts.size() - last.size() + i];
    EXPECT_EQ(m["destination"], last[i].destination);
    EXPECT_EQ(m["source"], last[i].source);
    const auto opts = m["options"].get<std::vector<std::string>>();
    EXPECT_NE(std::find(opts.begin(), opts.end(), last[i].readonly ? "ro" : "rw"), opts.end()) << m.dump();
  }
}

}  // namespace
}  // namespace gpupool
