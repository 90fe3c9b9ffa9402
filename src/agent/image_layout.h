// The image cache's steps from a copied source to a servable image (image_cache.cc runs them):
// reading a private OCI layout's index.json, manifest and config blobs into an ImageConfig (every
// file and field bounded, errors naming the field), and walking an unpacked root filesystem to make
// it safe to serve (no device nodes, FIFOs or sockets; no setuid/setgid bits) while summing its
// size. Also reads the cache's own image.json (the same config, under our field names).
#pragma once

#include <dirent.h>
#include <sys/types.h>

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "agent/image_cache.h"
#include "common/status.h"

namespace gpupool::agent_internal {

inline constexpr int64_t kMaxIndexBytes = 1 << 20;  // index.json and our image.json

// The keys of entrypoint, cmd, env and the working directory: in an OCI image config, and in the
// "config" of our image.json.
inline constexpr std::array<const char*, 4> kOciNames = {"Entrypoint", "Cmd", "Env", "WorkingDir"};
inline constexpr std::array<const char*, 4> kOurNames = {"entrypoint", "cmd", "env", "workingDir"};

// The names in `dir` but "." and "..", and closes it; nothing for null.
std::vector<std::string> DirNames(DIR* dir);

// The JSON object in `path`, a regular file of at most `max` bytes.
Result<nlohmann::json> ParseJsonFile(const std::string& path, int64_t max);

// The runtime settings in `obj` (null: none); `names` as kOciNames / kOurNames; `where` starts
// every error.
Result<ImageConfig> ParseConfig(const nlohmann::json& obj, const std::string& where,
                                const std::array<const char*, 4>& names);

struct LayoutImage {
  std::string digest;  // the manifest's, "sha256:<64 hex>"
  ImageConfig config;
};

// The manifest tagged `ref_name` in the OCI layout at `layout`, and the runtime settings of its
// config. `text`: the source as given, named in errors.
Result<LayoutImage> ReadLayout(const std::string& layout, const std::string& ref_name,
                               const std::string& text);

struct TreeWalk {
  int64_t bytes = 0;
  std::set<std::pair<dev_t, ino_t>> linked;  // hard-linked files: counted once
};

// Removes device nodes, FIFOs and sockets under the directory `dirfd` (named `path` in errors),
// clears setuid/setgid bits, and adds the blocks it keeps to walk->bytes. Links are never followed.
Status CleanTree(int dirfd, const std::string& path, int depth, TreeWalk* walk);

}  // namespace gpupool::agent_internal
