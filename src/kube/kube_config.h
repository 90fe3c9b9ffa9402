// Where the Kubernetes API server is and how to prove who we are: from a kubeconfig file
// (out-of-cluster) or from the pod's service account (in-cluster). The parts of kubeconfig(5)
// gpupool reads; anything it cannot honour (an exec or auth-provider plugin) is a clear error,
// never silently ignored.
#pragma once

#include <string>

#include "common/status.h"

namespace gpupool::kube {

struct KubeEndpoint {
  std::string server;           // https://host:port (http only for tests)
  std::string ca_pem;           // the server's CA, PEM; empty: the system's trust store
  bool insecure_skip_verify = false;
  std::string token;            // a bearer token (read from token-file when given there)
  std::string client_cert_pem;  // client certificate auth, PEM (both or neither)
  std::string client_key_pem;
  std::string namespace_name = "default";  // the context's (or the service account's) namespace
};

// A kubeconfig file's `context` (empty: its current-context). At most 1 MiB; file references
// (certificate-authority, client-certificate, client-key, tokenFile) are read relative to the
// kubeconfig's directory, each at most 1 MiB.
Result<KubeEndpoint> LoadKubeconfig(const std::string& path, const std::string& context = "");

// In a pod: $KUBERNETES_SERVICE_HOST and $KUBERNETES_SERVICE_PORT, and the service account's
// token, ca.crt and namespace under `account_dir`.
Result<KubeEndpoint> LoadInCluster(const std::string& account_dir = "/var/run/secrets/kubernetes.io/serviceaccount");

}  // namespace gpupool::kube
