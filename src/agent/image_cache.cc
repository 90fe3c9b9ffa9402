// The image cache (image_cache.h): skopeo copies a source into a private OCI layout under tmp/,
// the manifest and config are read from it, umoci unpacks the root filesystem beside it, the tree
// is made safe to serve (no device nodes, no setuid; those two steps are in image_layout.cc), and
// the finished entry is renamed into images/<hex> whole, so images/ only ever holds complete
// entries (image.json written inside it).
#include "agent/image_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <limits.h>
#include <openssl/evp.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <system_error>
#include <thread>
#include <utility>

#include "agent/image_layout.h"
#include "agent/runtime_internal.h"
#include "common/image_source.h"

namespace gpupool {

namespace {

using namespace agent_internal;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr std::chrono::seconds kFailureKept{30};
constexpr int64_t kDockerResolvedSeconds = 600;
constexpr size_t kMaxOutputTail = 2000;
constexpr char kRefName[] = "img";  // the tag the copy gets in our private layout
constexpr char kPolicyFile[] = "/etc/containers/policy.json";

std::string Sha256Hex(const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr) != 1) len = 0;
  std::string out;
  for (unsigned int i = 0; i < len; ++i) out += fmt::format("{:02x}", md[i]);
  return out;
}

std::string RandomHex() {
  static std::atomic<uint64_t> serial{0};
  uint64_t r = 0;
  if (::getrandom(&r, sizeof(r), 0) != static_cast<ssize_t>(sizeof(r))) r = 0;
  return fmt::format("{:016x}{:x}", r, serial.fetch_add(1));
}

// The end of a helper's output: what it said last is what went wrong.
std::string Tail(std::string out) {
  while (!out.empty() && std::isspace(static_cast<unsigned char>(out.back()))) out.pop_back();
  if (out.size() > kMaxOutputTail) out = "..." + out.substr(out.size() - kMaxOutputTail);
  return out.empty() ? "(no output)" : out;
}

bool PathSafeTask(const std::string& task) {
  if (task.empty() || task.size() > 200 || task == "." || task == "..") return false;
  return std::all_of(task.begin(), task.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

bool IsHex64(const std::string& s) {
  return IsSha256Digest("sha256:" + s);
}

// The file whose size and mtime tell whether a local source changed.
std::string Fingerprint(const ImageSource& resolved) {
  const std::string file =
      resolved.transport == ImageSource::Transport::kOci ? resolved.path + "/index.json" : resolved.path;
  struct stat st;
  if (::stat(file.c_str(), &st) != 0) return "";
  return fmt::format("local {} {} {}", st.st_size,
                     int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec, file);
}

}  // namespace

struct ImageCache::Impl {
  struct Image {
    int64_t bytes = 0;
    ImageConfig config;
    std::set<std::string> users;
  };
  struct Failure {
    Status status;
    Clock::time_point at;
  };
  struct Job {
    std::string text;      // the source as given: the key of pulls, failures and sources/
    ImageSource resolved;  // local: the path with links resolved
  };

  ImageCacheOptions options;
  std::string skopeo, umoci, images_dir, sources_dir, tmp_dir;
  std::atomic<bool> cancel{false};

  std::mutex mu;  // guards what follows; never held while a helper runs or a tree is walked
  std::condition_variable cv;
  std::map<std::string, Image> images;  // complete entries by digest
  std::map<std::string, Failure> failures;
  std::set<std::string> pulling;  // queued or running
  std::deque<Job> queue;
  std::vector<std::thread> workers;
  size_t idle = 0;
  uint64_t pulls = 0, pull_failures = 0, hits = 0, evictions = 0;

  std::string EntryDir(const std::string& digest) const { return images_dir + "/" + digest.substr(7); }
  std::string SourceFile(const std::string& text) const { return sources_dir + "/" + Sha256Hex(text); }

  Result<ImageSource> Allowed(const ImageSource& s, const std::string& text) const;
  void LoadEntries();
  Status RunHelper(const Job& job, const char* step, const std::vector<std::string>& argv);
  Result<std::string> Pull(const Job& job, const std::string& work);
  void Worker();
  void CollectExcept(const std::string& keep);
  void DropUsers(const std::function<bool(const std::string&)>& drop);
};

Result<ImageSource> ImageCache::Impl::Allowed(const ImageSource& s, const std::string& text) const {
  if (!s.local()) {
    const std::string reg = s.registry();
    if (options.registries.empty() ||
        std::find(options.registries.begin(), options.registries.end(), reg) != options.registries.end())
      return s;
    return Status::PermissionDenied(
        fmt::format("image {}: the registry {} is not allowed on this node (allowed: {})", text, reg,
                    fmt::join(options.registries, ", ")));
  }
  // The roots as configured and with their links resolved now (an admin may move one).
  std::vector<std::string> given, real;
  for (std::string root : options.local_roots) {
    while (root.size() > 1 && root.back() == '/') root.pop_back();
    if (!root.empty() && root[0] == '/') given.push_back(root);
    char buf[PATH_MAX];
    if (::realpath(root.c_str(), buf) != nullptr) real.push_back(buf);
  }
  auto under = [](const std::vector<std::string>& roots, const std::string& p) {
    return std::any_of(roots.begin(), roots.end(), [&](const std::string& r) {
      return r == "/" || (p.size() > r.size() && p.compare(0, r.size(), r) == 0 && p[r.size()] == '/');
    });
  };
  auto denied = [&](const std::string& why) {
    return Status::PermissionDenied(
        fmt::format("image {}: {} ({}; the agent's --container-root)", text, why,
                    options.local_roots.empty() ? std::string("a configured root (none is)")
                                                : fmt::format("{}", fmt::join(options.local_roots, ", "))));
  };
  // Nothing outside the roots is even looked at: a job cannot probe which host paths exist.
  if (!under(given, s.path) && !under(real, s.path))
    return denied(fmt::format("{} is not under an allowed container root", s.path));
  char buf[PATH_MAX];
  if (::realpath(s.path.c_str(), buf) == nullptr)
    return Status::NotFound(fmt::format("image {}: {}: {}", text, s.path, ErrnoText(errno)));
  const std::string resolved = buf;
  if (!under(real, resolved))
    return denied(fmt::format("{} leads to {}, which is not under an allowed container root", s.path, resolved));
  struct stat st;
  const bool dir = s.transport == ImageSource::Transport::kOci;
  if (::stat(resolved.c_str(), &st) != 0 || (dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)))
    return Status::InvalidArgument(
        fmt::format("image {}: {} is not a {}", text, resolved, dir ? "directory" : "file"));
  ImageSource out = s;
  out.path = resolved;
  // What skopeo gets must pass the same checks (no ':', no '-' parts) as what the job gave.
  if (!ParseImageSource(out.ToString()).ok())
    return Status::InvalidArgument(
        fmt::format("image {}: it resolves to {}, which cannot be handed to skopeo", text, resolved));
  return out;
}

void ImageCache::Impl::LoadEntries() {
  for (const auto& name : DirNames(::opendir(images_dir.c_str()))) {
    const std::string entry = images_dir + "/" + name;
    const std::string digest = "sha256:" + name;
    auto j = ParseJsonFile(entry + "/image.json", kMaxIndexBytes);
    Image image;
    bool ok = IsHex64(name) && j.ok() && j->value("digest", std::string()) == digest;
    if (ok) {
      auto bytes = j->find("bytes");
      auto config = ParseConfig(j->value("config", json()), entry + "/image.json", kOurNames);
      ok = bytes != j->end() && bytes->is_number_integer() && config.ok();
      if (ok) {
        image.bytes = bytes->get<int64_t>();
        image.config = std::move(config).value();
      }
    }
    if (!ok) {
      (void)RemoveTree(entry);  // incomplete: a pull died before it wrote image.json
      continue;
    }
    for (const auto& user : DirNames(::opendir((entry + "/users").c_str())))
      if (PathSafeTask(user)) image.users.insert(user);
    images[digest] = std::move(image);
  }
}

Status ImageCache::Impl::RunHelper(const Job& job, const char* step, const std::vector<std::string>& argv) {
  std::string out;
  // Big layers are staged under TMPDIR: our tmp/, on the cache's own disk, cleared at start.
  auto rc = RunCommand(argv, &out, options.pull_timeout, &cancel, {"TMPDIR=" + tmp_dir});
  if (!rc.ok())
    return Status(rc.status().code(), fmt::format("image {}: {} failed: {}: {}", job.text, step,
                                                  rc.status().message(), Tail(out)));
  if (*rc != 0)
    return Status::FailedPrecondition(
        fmt::format("image {}: {} failed (exit status {}): {}", job.text, step, *rc, Tail(out)));
  return Status::Ok();
}

// Returns the digest of the image, installed under images/ (or found there).
Result<std::string> ImageCache::Impl::Pull(const Job& job, const std::string& work) {
  const ImageSource& src = job.resolved;
  const std::string fingerprint = src.local() ? Fingerprint(src) : "";
  const std::string layout = work + "/layout";
  std::vector<std::string> copy = {skopeo};
  // The admin's signature policy, for every source; without one, local sources are the admin's
  // own (under local_roots) and registries get the host's policy where there is one.
  if (!options.policy.empty()) {
    copy.insert(copy.end(), {"--policy", options.policy});
  } else if (!src.local() && PathExists(kPolicyFile)) {
    copy.insert(copy.end(), {"--policy", kPolicyFile});
  } else {
    copy.push_back("--insecure-policy");
  }
  copy.insert(copy.end(), {"copy", "--quiet"});
  if (!src.local() && !options.auth_file.empty()) copy.insert(copy.end(), {"--src-authfile", options.auth_file});
  copy.insert(copy.end(), {src.ToString(), fmt::format("oci:{}:{}", layout, kRefName)});
  RETURN_IF_ERROR(RunHelper(job, "copying it (skopeo copy)", copy));
  const int64_t resolved_at = static_cast<int64_t>(::time(nullptr));

  // The manifest our copy was tagged with, its config, and the runtime settings in that.
  ASSIGN_OR_RETURN(LayoutImage read, ReadLayout(layout, kRefName, job.text));
  const std::string& digest = read.digest;
  const ImageConfig& config = read.config;

  bool have;
  {
    std::lock_guard<std::mutex> lock(mu);
    have = images.count(digest) != 0;
  }
  if (!have) {
    // The entry is built whole under tmp/ and renamed into images/ at once.
    const std::string staged = work + "/entry";
    if (::mkdir(staged.c_str(), 0711) != 0 || ::chmod(staged.c_str(), 0711) != 0)
      return Status::IoError(
          fmt::format("image {}: cannot create {}: {}", job.text, staged, ErrnoText(errno)));
    std::vector<std::string> unpack = {umoci, "raw", "unpack"};
    if (::geteuid() != 0) unpack.push_back("--rootless");
    unpack.insert(unpack.end(), {"--image", fmt::format("{}:{}", layout, kRefName), staged + "/rootfs"});
    RETURN_IF_ERROR(RunHelper(job, "unpacking it (umoci raw unpack)", unpack));
    (void)RemoveTree(layout);  // the blobs are not needed any more: free the disk before the walk
    const std::string rootfs = staged + "/rootfs";
    FdCloser fd(::open(rootfs.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() < 0 || ::fchmod(fd.get(), 0755) != 0)
      return Status::IoError(
          fmt::format("image {}: the unpacked {}: {}", job.text, rootfs, ErrnoText(errno)));
    TreeWalk walk;
    RETURN_IF_ERROR(CleanTree(fd.get(), rootfs, 0, &walk)
                        .WithContext(fmt::format("image {}: cleaning the unpacked tree", job.text)));
    if (walk.bytes > options.max_bytes)
      return Status::ResourceExhausted(fmt::format(
          "the image {} is {} bytes unpacked; the cache holds at most {} (--image-cache-max-bytes)", job.text,
          walk.bytes, options.max_bytes));
    if (::mkdir((staged + "/users").c_str(), 0700) != 0)
      return Status::IoError(
          fmt::format("image {}: cannot create {}/users: {}", job.text, staged, ErrnoText(errno)));
    json doc = {{"digest", digest},
                {"source", job.text},
                {"config",
                 {{"entrypoint", config.entrypoint},
                  {"cmd", config.cmd},
                  {"env", config.env},
                  {"workingDir", config.working_dir}}},
                {"bytes", walk.bytes}};
    RETURN_IF_ERROR(WriteFileAtomic(staged + "/last_used", "", /*sync=*/false));
    RETURN_IF_ERROR(WriteFileAtomic(staged + "/image.json", doc.dump(2) + "\n"));
    std::lock_guard<std::mutex> lock(mu);
    const std::string entry = EntryDir(digest);
    if (images.count(digest) == 0) {  // else another source gave the same image meanwhile
      if (::rename(staged.c_str(), entry.c_str()) != 0) {
        // A directory there without a map entry is a leftover: moved aside (removed with `work`).
        const bool taken = errno == EEXIST || errno == ENOTEMPTY;
        if (!taken || ::rename(entry.c_str(), (work + "/old").c_str()) != 0 ||
            ::rename(staged.c_str(), entry.c_str()) != 0)
          return Status::IoError(
              fmt::format("image {}: cannot install {}: {}", job.text, entry, ErrnoText(errno)));
      }
      images[digest] = Image{walk.bytes, config, {}};
    }
  }
  const std::string how = src.local() ? fingerprint : fmt::format("resolved {}", resolved_at);
  RETURN_IF_ERROR(WriteFileAtomic(SourceFile(job.text), digest + "\n" + how + "\n", /*sync=*/false));
  return digest;
}

void ImageCache::Impl::Worker() {
  std::unique_lock<std::mutex> lock(mu);
  while (true) {
    ++idle;
    cv.wait(lock, [&] { return cancel.load() || !queue.empty(); });
    --idle;
    if (cancel.load()) return;
    Job job = std::move(queue.front());
    queue.pop_front();
    lock.unlock();
    const std::string work = tmp_dir + "/" + RandomHex();
    Result<std::string> result = std::string();
    if (::mkdir(work.c_str(), 0700) != 0) {
      result =
          Status::IoError(fmt::format("image {}: cannot create {}: {}", job.text, work, ErrnoText(errno)));
    } else {
      result = Pull(job, work);
    }
    (void)RemoveTree(work);
    if (result.ok()) CollectExcept(*result);  // not the image just pulled: its task is about to Use it
    lock.lock();
    pulling.erase(job.text);
    if (result.ok()) {
      ++pulls;
    } else {
      ++pull_failures;
      failures[job.text] = Failure{result.status(), Clock::now()};
    }
    const bool stopping = cancel.load();
    lock.unlock();
    if (!stopping && options.on_done) options.on_done();
    lock.lock();
  }
}

void ImageCache::Impl::CollectExcept(const std::string& keep) {
  std::vector<std::string> doomed;
  {
    std::lock_guard<std::mutex> lock(mu);
    int64_t total = 0;
    for (const auto& [digest, image] : images) total += image.bytes;
    if (total <= options.max_bytes) return;
    std::vector<std::pair<int64_t, std::string>> unused;  // (last use in ns, digest)
    for (const auto& [digest, image] : images) {
      if (!image.users.empty() || digest == keep) continue;
      struct stat st;
      int64_t when = 0;
      if (::stat((EntryDir(digest) + "/last_used").c_str(), &st) == 0)
        when = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
      unused.emplace_back(when, digest);
    }
    std::sort(unused.begin(), unused.end());
    for (const auto& [when, digest] : unused) {
      if (total <= options.max_bytes) break;
      // Renamed out under the lock (a Prepare never sees half an entry), removed after it.
      const std::string gone = tmp_dir + "/evicted-" + RandomHex();
      if (::rename(EntryDir(digest).c_str(), gone.c_str()) != 0) continue;
      total -= images[digest].bytes;
      images.erase(digest);
      ++evictions;
      doomed.push_back(gone);
    }
  }
  for (const auto& path : doomed) (void)RemoveTree(path);
}

// ---- ImageCache ----------------------------------------------------------------------------------

ImageCache::ImageCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ImageCache::~ImageCache() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->cancel = true;  // RunCommand polls it and kills the helper's process group
  }
  impl_->cv.notify_all();
  for (auto& t : impl_->workers) t.join();
}

Status CheckImagePolicyAndCredentials(const ImageCacheOptions& options) {
  if (!options.policy.empty()) {
    if (options.policy[0] != '/')
      return Status::InvalidArgument(fmt::format("the image policy {} must be an absolute path", options.policy));
    auto text = ReadFile(options.policy);
    if (!text.ok()) return text.status().WithContext("the image policy (--image-policy)");
    const json policy = json::parse(*text, nullptr, false);
    if (!policy.is_object() || !policy.contains("default") || !policy["default"].is_array())
      return Status::InvalidArgument(fmt::format(
          "the image policy {} is not a containers-policy.json (a JSON object with a \"default\" array)", options.policy));
  }
  if (!options.auth_file.empty()) {
    if (options.auth_file[0] != '/')
      return Status::InvalidArgument(fmt::format("the registry credentials {} must be an absolute path", options.auth_file));
    struct stat st;
    if (::lstat(options.auth_file.c_str(), &st) != 0)
      return Status::IoError(fmt::format("the registry credentials {}: {}", options.auth_file, ErrnoText(errno)));
    if (!S_ISREG(st.st_mode))
      return Status::InvalidArgument(fmt::format("the registry credentials {} are not a regular file", options.auth_file));
    if ((st.st_mode & 077) != 0 || (st.st_uid != 0 && st.st_uid != ::geteuid()))
      return Status::PermissionDenied(fmt::format(
          "the registry credentials {} must belong to the agent's user and be readable by it alone (mode 0600; "
          "it is {:04o}, uid {}): tasks on this node could read them",
          options.auth_file, st.st_mode & 07777, st.st_uid));
  }
  return Status::Ok();
}

Result<std::unique_ptr<ImageCache>> ImageCache::Create(ImageCacheOptions options) {
  if (options.dir.empty()) return Status::InvalidArgument("the image cache needs a directory");
  if (options.max_bytes <= 0) return Status::InvalidArgument("the image cache's max bytes must be positive");
  if (options.pull_timeout.count() <= 0)
    return Status::InvalidArgument("the image pull timeout must be positive");
  options.max_parallel_pulls = std::max(1, options.max_parallel_pulls);
  auto impl = std::make_unique<Impl>();
  const char* path_env = std::getenv("PATH");
  const std::string path_var = path_env != nullptr && *path_env != '\0' ? path_env : DefaultPath();
  for (auto [name, out] :
       {std::pair{&options.skopeo, &impl->skopeo}, std::pair{&options.umoci, &impl->umoci}}) {
    auto found = FindExecutable(*name, path_var);
    if (!found.ok() || ::access(found->c_str(), X_OK) != 0)
      return Status::FailedPrecondition(
          fmt::format("container images need '{}', which is not installed or not executable ({})", *name,
                      found.ok() ? ErrnoText(errno) : found.status().message()));
    *out = *found;
  }
  RETURN_IF_ERROR(CheckImagePolicyAndCredentials(options));
  RETURN_IF_ERROR(MakeDirs(options.dir));
  char buf[PATH_MAX];
  if (::realpath(options.dir.c_str(), buf) == nullptr)
    return Status::IoError(fmt::format("cannot resolve {}: {}", options.dir, ErrnoText(errno)));
  options.dir = buf;
  // skopeo and umoci take "<layout>:<tag>": a ':' in the path would be read as a tag.
  if (options.dir.find(':') != std::string::npos)
    return Status::InvalidArgument(
        fmt::format("the image cache directory {} must not hold ':'", options.dir));
  impl->images_dir = options.dir + "/images";
  impl->sources_dir = options.dir + "/sources";
  impl->tmp_dir = options.dir + "/tmp";
  // A container's root (a mapped uid) must pass through to its rootfs, but need not list anything.
  for (auto [dir, mode] : {std::pair{options.dir, 0711}, std::pair{impl->images_dir, 0711},
                           std::pair{impl->sources_dir, 0700}, std::pair{impl->tmp_dir, 0700}}) {
    RETURN_IF_ERROR(MakeDirs(dir));
    if (::chmod(dir.c_str(), static_cast<mode_t>(mode)) != 0)
      return Status::IoError(fmt::format("cannot chmod {}: {}", dir, ErrnoText(errno)));
  }
  // What an earlier agent left half-done.
  for (const auto& name : DirNames(::opendir(impl->tmp_dir.c_str())))
    RETURN_IF_ERROR(RemoveTree(impl->tmp_dir + "/" + name));
  impl->options = std::move(options);
  impl->LoadEntries();
  return std::unique_ptr<ImageCache>(new ImageCache(std::move(impl)));
}

Result<std::optional<PreparedImage>> ImageCache::Prepare(const std::string& source) {
  Impl& d = *impl_;
  ASSIGN_OR_RETURN(ImageSource parsed, ParseImageSource(source));
  ASSIGN_OR_RETURN(ImageSource resolved, d.Allowed(parsed, source));
  {
    std::lock_guard<std::mutex> lock(d.mu);
    auto failed = d.failures.find(source);
    if (failed != d.failures.end()) {
      if (Clock::now() - failed->second.at < kFailureKept) return failed->second.status;
      d.failures.erase(failed);
    }
    if (d.pulling.count(source) != 0) return std::optional<PreparedImage>();
  }
  // What the source resolved to last, if that still holds.
  std::string digest;
  if (auto text = ReadFile(d.SourceFile(source)); text.ok() && text->size() < 8192) {
    const size_t nl = text->find('\n');
    const std::string first = text->substr(0, nl);
    const std::string how = nl == std::string::npos ? "" : text->substr(nl + 1);
    bool valid = false;
    if (resolved.local()) {
      const std::string now = Fingerprint(resolved);
      valid = !now.empty() && how == now + "\n";
    } else {
      long long at = 0;
      const bool read = std::sscanf(how.c_str(), "resolved %lld", &at) == 1;
      const int64_t age = static_cast<int64_t>(::time(nullptr)) - at;
      valid = read && age >= 0 && age < kDockerResolvedSeconds;
    }
    if (valid && IsSha256Digest(first)) digest = first;
  }
  std::lock_guard<std::mutex> lock(d.mu);
  if (!digest.empty()) {
    auto it = d.images.find(digest);
    if (it != d.images.end()) {
      ++d.hits;
      return std::optional<PreparedImage>(
          PreparedImage{source, digest, d.EntryDir(digest) + "/rootfs", it->second.config});
    }
  }
  if (auto failed = d.failures.find(source); failed != d.failures.end()) return failed->second.status;
  if (!d.pulling.insert(source).second) return std::optional<PreparedImage>();
  d.queue.push_back(Impl::Job{source, std::move(resolved)});
  if (d.queue.size() > d.idle && d.workers.size() < static_cast<size_t>(d.options.max_parallel_pulls)) {
    try {
      d.workers.emplace_back([&d] { d.Worker(); });
    } catch (const std::system_error& e) {
      if (d.workers.empty()) {  // nobody would ever take the job
        d.queue.pop_back();
        d.pulling.erase(source);
        return Status::Internal(fmt::format("image {}: cannot start a pull: {}", source, e.what()));
      }
    }
  }
  d.cv.notify_one();
  return std::optional<PreparedImage>();
}

Status ImageCache::Use(const std::string& digest, const std::string& task) {
  if (!PathSafeTask(task)) return Status::InvalidArgument(fmt::format("'{}' is not a usable task id", task));
  if (!IsSha256Digest(digest))
    return Status::InvalidArgument(fmt::format("'{}' is not an image digest", digest));
  Impl& d = *impl_;
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.images.find(digest);
  if (it == d.images.end())
    return Status::NotFound(fmt::format("image {} is not in the cache (evicted?): prepare it again", digest));
  const std::string entry = d.EntryDir(digest);
  for (const std::string& file : {entry + "/users/" + task, entry + "/last_used"}) {
    FdCloser fd(::open(file.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (fd.get() < 0 || ::futimens(fd.get(), nullptr) != 0)
      return Status::IoError(fmt::format("cannot write {}: {}", file, ErrnoText(errno)));
  }
  it->second.users.insert(task);
  return Status::Ok();
}

void ImageCache::Impl::DropUsers(const std::function<bool(const std::string&)>& drop) {
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [digest, image] : images) {
    for (auto it = image.users.begin(); it != image.users.end();) {
      if (!drop(*it)) {
        ++it;
        continue;
      }
      ::unlink((EntryDir(digest) + "/users/" + *it).c_str());
      it = image.users.erase(it);
    }
  }
}

void ImageCache::Release(const std::string& task) {
  impl_->DropUsers([&](const std::string& user) { return user == task; });
}

void ImageCache::KeepOnly(const std::set<std::string>& live) {
  impl_->DropUsers([&](const std::string& user) { return live.count(user) == 0; });
}

void ImageCache::Collect() {
  impl_->CollectExcept("");
}

ImageCacheStats ImageCache::stats() {
  Impl& d = *impl_;
  std::lock_guard<std::mutex> lock(d.mu);
  ImageCacheStats s;
  s.pulls = d.pulls;
  s.pull_failures = d.pull_failures;
  s.hits = d.hits;
  s.evictions = d.evictions;
  for (const auto& [digest, image] : d.images) s.bytes += image.bytes;
  s.images = static_cast<int>(d.images.size());
  s.pulling = static_cast<int>(d.pulling.size());
  return s;
}

const ImageCacheOptions& ImageCache::options() const {
  return impl_->options;
}

}  // namespace gpupool
