// The node's container images: a job's `container.image` is copied by skopeo into an OCI layout,
// its root filesystem unpacked once by umoci into a content-addressed cache, and kept while tasks
// use it; unused images are evicted, least recently used first, when the cache outgrows its size.
//
// Layout under ImageCacheOptions::dir:
//   images/<hex>/rootfs/        the unpacked root filesystem (<hex>: the manifest's sha256)
//   images/<hex>/image.json     {"digest", "source", "config": {entrypoint, cmd, env, workingDir},
//                               "bytes"}; written last: an entry without it is incomplete
//   images/<hex>/users/<task>   one empty file per task that uses the image (kept across restarts)
//   images/<hex>/last_used      its mtime: when a task last started from it
//   sources/<sha256 of source>  "<digest>\n": the digest a source last resolved to (local sources:
//                               with the size and mtime of the file it came from)
//   tmp/                        layouts being copied, rootfs being unpacked (cleared at start)
//
// Pulls never run on the caller's thread: Prepare() answers at once (ready, still pulling, or the
// pull's error) and a worker thread runs skopeo and umoci with a time limit; a finished pull calls
// the `on_done` given to Create (the agent wakes its loop). Every source is parsed again here
// (ParseImageSource) and a local one must resolve (links followed) under one of `local_roots`;
// a registry one must name a registry in `registries` (empty: any).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"

namespace gpupool {

struct ImageConfig {
  std::vector<std::string> entrypoint;
  std::vector<std::string> cmd;
  std::vector<std::string> env;  // "KEY=value"
  std::string working_dir;
};

struct PreparedImage {
  std::string source;  // as given
  std::string digest;  // "sha256:<64 hex>" of the image manifest
  std::string rootfs;  // absolute path of the unpacked root filesystem
  ImageConfig config;
};

struct ImageCacheOptions {
  std::string dir;                          // the cache root (created; it and images/ 0711: a sandboxed
                                            // container's root must pass through; rootfs dirs 0755)
  int64_t max_bytes = int64_t{50} << 30;    // unused images are evicted above it
  std::vector<std::string> local_roots;     // oci:, oci-archive:, docker-archive: sources only under these
  std::vector<std::string> registries;      // docker:// registries allowed; empty: any
  // The signature policy (containers-policy.json(5)) every pull is checked against, local sources
  // too; empty: /etc/containers/policy.json for registries where it exists, else none.
  std::string policy;
  // Registry credentials (containers-auth.json(5)) for docker:// sources: a regular file of the
  // agent's user (or root), readable by nobody else; never given for local sources.
  std::string auth_file;
  std::string skopeo = "skopeo";            // looked up in PATH when not absolute
  std::string umoci = "umoci";
  std::chrono::seconds pull_timeout{1800};  // one skopeo copy or umoci unpack
  int max_parallel_pulls = 2;
  std::function<void()> on_done;            // called (on a worker thread) after each pull ends
};

struct ImageCacheStats {
  uint64_t pulls = 0;           // pulls that ended well
  uint64_t pull_failures = 0;
  uint64_t hits = 0;            // Prepare answered from the cache
  uint64_t evictions = 0;
  int64_t bytes = 0;            // the unpacked images on disk
  int images = 0;
  int pulling = 0;
};

// The policy must be a readable containers-policy.json (a JSON object with a "default" array:
// skopeo would otherwise fail every pull, later and less clearly); the credentials a regular file
// that nobody but its owner (the agent's user or root) can read or change, since process tasks
// see the host's files. Create checks both; the agent also at its start.
Status CheckImagePolicyAndCredentials(const ImageCacheOptions& options);

class ImageCache {
 public:
  // Fails when skopeo or umoci is not installed, or the directory cannot be made.
  static Result<std::unique_ptr<ImageCache>> Create(ImageCacheOptions options);
  ~ImageCache();  // stops pulls in flight (their helpers are killed) and joins the workers
  ImageCache(const ImageCache&) = delete;
  ImageCache& operator=(const ImageCache&) = delete;

  // Non-blocking. The image when it is in the cache; nullopt while it is being pulled (a pull is
  // started if none runs for this source); the error of a pull that failed (every call within
  // 30 s of the failure gets it; the first call after that pulls again), or of a source that is
  // malformed or not allowed (InvalidArgument / PermissionDenied). A local source whose file (or
  // layout's index.json) has the size and mtime it had when it last resolved is not copied again;
  // a docker:// one is re-resolved when it was last resolved more than 10 minutes ago.
  Result<std::optional<PreparedImage>> Prepare(const std::string& source);

  // `task` (a path-safe task id) runs from the image: it is kept, and its last use is now.
  Status Use(const std::string& digest, const std::string& task);
  // The task no longer needs its image (no-op when it had none).
  void Release(const std::string& task);
  // Forgets the users that are not in `live` (tasks that ended while no agent ran).
  void KeepOnly(const std::set<std::string>& live);
  // Evicts images no task uses, least recently used first, until the cache fits max_bytes.
  void Collect();

  ImageCacheStats stats();
  const ImageCacheOptions& options() const;

 private:
  struct Impl;
  explicit ImageCache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpupool
