// Loading the CDI spec directories (with CDI's priority of later directories) and resolving device
// names to the edits a container needs.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <utility>

#include "agent/cdi.h"

namespace gpupool {

namespace fs = std::filesystem;

namespace {

// Reads at most one byte over the limit, so that a file that grew after its size was looked at is
// still refused rather than read whole.
Result<std::string> ReadLimited(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IoError("cannot be opened");
  std::string text(kCdiMaxSpecBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) return Status::IoError("cannot be read");
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kCdiMaxSpecBytes) {
    return Status::InvalidArgument(
        fmt::format("larger than the {} bytes allowed for a CDI spec", kCdiMaxSpecBytes));
  }
  return text;
}

bool IsSpecFileName(const std::string& name) {
  return name.ends_with(".json") || name.ends_with(".yaml") || name.ends_with(".yml");
}

// The spec files of `dir` in name order; a missing directory has none.
std::vector<fs::path> SpecFiles(const std::string& dir, std::vector<std::string>& warnings) {
  std::vector<fs::path> files;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) {
    if (ec != std::errc::no_such_file_or_directory) {
      warnings.push_back(fmt::format("CDI spec directory {} cannot be read: {}", dir, ec.message()));
    }
    return files;
  }
  size_t looked_at = 0;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (++looked_at > kCdiMaxListEntries) {
      warnings.push_back(fmt::format("CDI spec directory {} has more than {} entries; the rest are ignored",
                                     dir, kCdiMaxListEntries));
      break;
    }
    const fs::path& path = it->path();
    if (!IsSpecFileName(path.filename().string())) continue;
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec)) {
      warnings.push_back(fmt::format("skipping {}: not a regular file", path.string()));
      continue;
    }
    files.push_back(path);
  }
  if (ec) warnings.push_back(fmt::format("CDI spec directory {} cannot be listed: {}", dir, ec.message()));
  std::sort(files.begin(), files.end(), [](const fs::path& a, const fs::path& b) {
    return a.filename().string() < b.filename().string();
  });
  return files;
}

}  // namespace

Result<std::vector<CdiSpec>> LoadCdiSpecs(const std::vector<std::string>& dirs,
                                          std::vector<std::string>* warnings) {
  std::vector<std::string> discarded;
  std::vector<std::string>& warn = warnings != nullptr ? *warnings : discarded;
  for (const std::string& dir : dirs) {
    if (dir.empty() || dir.front() != '/') {
      return Status::InvalidArgument(fmt::format("CDI spec directory '{}' is not absolute", dir));
    }
  }
  struct Owner {
    size_t spec;  // index into `specs`
    size_t dir;   // index into `dirs`
  };
  std::vector<CdiSpec> specs;
  std::map<std::pair<std::string, std::string>, Owner> owners;  // (kind, device name) -> defining spec
  for (size_t d = 0; d < dirs.size(); ++d) {
    for (const fs::path& path : SpecFiles(dirs[d], warn)) {
      Result<std::string> text = ReadLimited(path);
      if (!text.ok()) {
        warn.push_back(fmt::format("skipping {}: {}", path.string(), text.status().message()));
        continue;
      }
      Result<CdiSpec> spec = ParseCdiSpec(*text, path.string());
      if (!spec.ok()) {
        warn.push_back(fmt::format("skipping {}", spec.status().message()));  // the message names the file
        continue;
      }
      for (const auto& [name, edits] : spec->devices) {
        const auto [it, inserted] = owners.try_emplace({spec->kind, name}, Owner{specs.size(), d});
        if (inserted) continue;
        CdiSpec& earlier = specs[it->second.spec];
        if (it->second.dir == d) {
          warn.push_back(fmt::format("{}={} is defined by both {} and {} of the same directory; {} wins",
                                     spec->kind, name, earlier.source, spec->source, spec->source));
        }
        earlier.devices.erase(name);
        it->second = Owner{specs.size(), d};
      }
      specs.push_back(std::move(spec).value());
    }
  }
  std::erase_if(specs, [](const CdiSpec& s) { return s.devices.empty(); });
  return specs;
}

Result<CdiEdits> ResolveCdiDevices(const std::vector<CdiSpec>& specs, const std::string& kind,
                                   const std::vector<std::string>& names) {
  std::vector<std::string> wanted;  // `names` without repeats
  std::vector<size_t> provider;     // the spec that gives wanted[i]: the last one defining it
  for (const std::string& name : names) {
    if (std::find(wanted.begin(), wanted.end(), name) != wanted.end()) continue;
    size_t found = specs.size();
    for (size_t s = 0; s < specs.size(); ++s) {
      if (specs[s].kind == kind && specs[s].devices.contains(name)) found = s;
    }
    if (found == specs.size()) return Status::NotFound(fmt::format("no CDI spec provides {}={}", kind, name));
    wanted.push_back(name);
    provider.push_back(found);
  }
  CdiEdits all;
  for (size_t s = 0; s < specs.size(); ++s) {
    if (std::find(provider.begin(), provider.end(), s) == provider.end()) continue;
    all.Append(specs[s].common);
    for (size_t i = 0; i < wanted.size(); ++i) {
      if (provider[i] == s) all.Append(specs[s].devices.at(wanted[i]));
    }
  }
  // The same library or device node is commonly listed by several devices of a spec; the container
  // gets it once, as the first of them describes it.
  CdiEdits out;
  std::set<std::string> env_seen, node_paths, mount_paths;
  for (std::string& e : all.env) {
    if (env_seen.insert(e).second) out.env.push_back(std::move(e));
  }
  for (CdiDeviceNode& n : all.device_nodes) {
    if (node_paths.insert(n.path).second) out.device_nodes.push_back(std::move(n));
  }
  for (CdiMount& m : all.mounts) {
    if (mount_paths.insert(m.container_path).second) out.mounts.push_back(std::move(m));
  }
  out.hooks = std::move(all.hooks);
  return out;
}

}  // namespace gpupool
