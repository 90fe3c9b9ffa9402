#include "common/image_source.h"

#include <fmt/format.h>

#include <array>

namespace gpupool {

namespace {

struct Prefix {
  std::string_view text;
  ImageSource::Transport transport;
};
constexpr std::array<Prefix, 4> kPrefixes = {{
    {"oci:", ImageSource::Transport::kOci},
    {"oci-archive:", ImageSource::Transport::kOciArchive},
    {"docker-archive:", ImageSource::Transport::kDockerArchive},
    {"docker://", ImageSource::Transport::kDocker},
}};

bool Lower(char c) { return c >= 'a' && c <= 'z'; }
bool Upper(char c) { return c >= 'A' && c <= 'Z'; }
bool Digit(char c) { return c >= '0' && c <= '9'; }
bool Hex(char c) { return Digit(c) || (c >= 'a' && c <= 'f'); }

Status Bad(std::string_view text, std::string_view why) {
  return Status::InvalidArgument(fmt::format("'{}': {}", text, why));
}

// An absolute, normalised path with no ':' and only printable, non-space characters.
Status CheckPath(std::string_view text, std::string_view path) {
  if (path.empty() || path[0] != '/') return Bad(text, "the path must be absolute");
  if (path.size() > 1 && path.back() == '/') return Bad(text, "the path must not end with '/'");
  size_t start = 1;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    const std::string_view part = path.substr(start, end - start);
    if (part.empty() && end != path.size()) return Bad(text, "the path must not hold '//'");
    if (part == "." || part == "..") return Bad(text, "the path must not hold '.' or '..' parts");
    if (!part.empty() && part[0] == '-') return Bad(text, "no part of the path may start with '-'");
    start = end + 1;
  }
  return Status::Ok();
}

// A tag of an OCI layout: [A-Za-z0-9_][A-Za-z0-9._-]{0,127}.
bool IsTag(std::string_view s) {
  if (s.empty() || s.size() > 128) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool ok = Lower(c) || Upper(c) || Digit(c) || c == '_' || (i > 0 && (c == '.' || c == '-'));
    if (!ok) return false;
  }
  return true;
}

// A registry reference: [host[:port]/]name[:tag][@sha256:hex], the name in lower case.
Status CheckDockerReference(std::string_view text, std::string_view ref) {
  if (ref.empty()) return Bad(text, "docker:// needs an image name");
  std::string_view name = ref;
  const size_t at = ref.find('@');
  if (at != std::string_view::npos) {
    if (!IsSha256Digest(ref.substr(at + 1))) return Bad(text, "a digest must be sha256: and 64 lower-case hex digits");
    name = ref.substr(0, at);
  }
  // A tag follows the last ':' after the last '/' (a ':' before it is the registry's port).
  const size_t slash = name.rfind('/');
  const size_t colon = name.rfind(':');
  if (colon != std::string_view::npos && (slash == std::string_view::npos || colon > slash)) {
    if (!IsTag(name.substr(colon + 1))) return Bad(text, "the tag must be letters, digits, '_', '.', '-' (at most 128)");
    name = name.substr(0, colon);
  }
  if (name.empty()) return Bad(text, "docker:// needs an image name");
  size_t start = 0;
  bool first = true;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string_view::npos) end = name.size();
    const std::string_view part = name.substr(start, end - start);
    if (part.empty()) return Bad(text, "an empty part in the image name");
    const bool host = first && end != name.size() &&
                      (part.find('.') != std::string_view::npos || part.find(':') != std::string_view::npos ||
                       part == "localhost");
    // A host's port: one ':' and at least one digit, digits only ("ghcr.io:" or "h:1:2" is no host).
    const size_t port = host ? part.find(':') : std::string_view::npos;
    const bool bad_port = port != std::string_view::npos &&
                          (port + 1 == part.size() || part.find_first_not_of("0123456789", port + 1) != std::string_view::npos);
    for (size_t i = 0; i < part.size(); ++i) {
      const char c = part[i];
      bool ok = Lower(c) || Digit(c) || (i > 0 && (c == '.' || c == '_' || c == '-'));
      if (host) ok = !bad_port && (ok || Upper(c) || (i > 0 && c == ':'));
      if (!ok)
        return Bad(text, host ? "the registry host must be a host name with an optional :port"
                              : "the image name must be lower-case letters, digits and '.', '_', '-' inside");
    }
    first = false;
    start = end + 1;
  }
  return Status::Ok();
}

}  // namespace

bool IsSha256Digest(std::string_view digest) {
  constexpr std::string_view kAlg = "sha256:";
  if (digest.size() != kAlg.size() + 64 || digest.substr(0, kAlg.size()) != kAlg) return false;
  for (char c : digest.substr(kAlg.size()))
    if (!Hex(c)) return false;
  return true;
}

Result<ImageSource> ParseImageSource(std::string_view text) {
  if (text.empty()) return Status::InvalidArgument("must not be empty");
  if (text.size() > kMaxImageSourceBytes)
    return Status::InvalidArgument(fmt::format("at most {} bytes", kMaxImageSourceBytes));
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f) return Bad(text, "only printable ASCII without spaces");
  }
  ImageSource s;
  std::string_view rest;
  bool known = false;
  for (const Prefix& p : kPrefixes) {
    if (text.substr(0, p.text.size()) == p.text) {
      s.transport = p.transport;
      rest = text.substr(p.text.size());
      known = true;
      break;
    }
  }
  if (!known) return Bad(text, "must start with oci:, oci-archive:, docker-archive: or docker://");
  if (s.transport == ImageSource::Transport::kDocker) {
    RETURN_IF_ERROR(CheckDockerReference(text, rest));
    s.reference = std::string(rest);
    return s;
  }
  const size_t colon = rest.find(':');
  const std::string_view path = rest.substr(0, colon);
  RETURN_IF_ERROR(CheckPath(text, path));
  s.path = std::string(path);
  if (colon != std::string_view::npos) {
    const std::string_view ref = rest.substr(colon + 1);
    if (s.transport == ImageSource::Transport::kDockerArchive) {
      // name:tag, as `docker save` recorded it.
      const size_t tag = ref.rfind(':');
      if (tag == std::string_view::npos || ref.find('@') != std::string_view::npos)
        return Bad(text, "a docker-archive reference is name:tag");
      RETURN_IF_ERROR(CheckDockerReference(text, ref));
    } else if (!IsTag(ref)) {
      return Bad(text, "the tag must be letters, digits, '_', '.', '-' (at most 128)");
    }
    s.reference = std::string(ref);
  }
  return s;
}

std::string ImageSource::registry() const {
  if (transport != Transport::kDocker) return "";
  const size_t slash = reference.find('/');
  if (slash == std::string::npos) return "docker.io";
  const std::string first = reference.substr(0, slash);
  if (first.find('.') != std::string::npos || first.find(':') != std::string::npos || first == "localhost")
    return first;
  return "docker.io";
}

std::string ImageSource::ToString() const {
  switch (transport) {
    case Transport::kDocker:
      return "docker://" + reference;
    case Transport::kOci:
      return "oci:" + path + (reference.empty() ? "" : ":" + reference);
    case Transport::kOciArchive:
      return "oci-archive:" + path + (reference.empty() ? "" : ":" + reference);
    case Transport::kDockerArchive:
      return "docker-archive:" + path + (reference.empty() ? "" : ":" + reference);
  }
  return "";
}

}  // namespace gpupool
