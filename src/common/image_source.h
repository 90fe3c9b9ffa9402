// Container image sources as a job spec names them (`container.image`), parsed and checked without
// any I/O: the server refuses a malformed one at submission, the agent parses it again (it trusts
// no assignment) before handing it to skopeo.
//
//   oci:/abs/layout-dir[:tag]            an OCI image layout on the node
//   oci-archive:/abs/file.tar[:tag]      the same, as a tar archive
//   docker-archive:/abs/file.tar[:ref]   `docker save` output (ref: name:tag, when it holds several)
//   docker://[host[:port]/]name[:tag][@sha256:<64 hex>]   a registry
//
// Paths are absolute, normalised (no `.`/`..` parts, no `//`, no trailing `/`) and hold no `:`
// (skopeo's separator); nothing may start with `-` (it would reach skopeo as an option); no
// control characters or spaces anywhere.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace gpupool {

inline constexpr size_t kMaxImageSourceBytes = 1024;

struct ImageSource {
  enum class Transport { kOci, kOciArchive, kDockerArchive, kDocker };
  Transport transport = Transport::kOci;
  std::string path;       // the local layout directory or archive ("" for kDocker)
  std::string reference;  // tag / name:tag / registry reference ("" when not given)

  bool local() const { return transport != Transport::kDocker; }
  // kDocker: the registry host ("docker.io" when the name has none); "" otherwise.
  std::string registry() const;
  // The source as skopeo takes it ("oci:/srv/images/pytorch:24.05", "docker://docker.io/library/busybox:1.36").
  std::string ToString() const;
};

// Errors say what is wrong, without naming the field ("'oci:srv/x': the path must be absolute").
Result<ImageSource> ParseImageSource(std::string_view text);

// "sha256:" followed by 64 lower-case hex digits.
bool IsSha256Digest(std::string_view digest);

}  // namespace gpupool
