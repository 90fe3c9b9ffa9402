// kubeconfig and in-cluster configuration (kube_config.h).
#include "kube/kube_config.h"

#include <openssl/evp.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "api/spec_text.h"

namespace gpupool::kube {

namespace {

using Json = nlohmann::json;
constexpr size_t kMaxFile = 1 << 20;

Result<std::string> ReadSmallFile(const std::string& path, const std::string& what) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return Status::IoError(fmt::format("{} {}: {}", what, path, ec.message()));
  if (size > kMaxFile) return Status::InvalidArgument(fmt::format("{} {} is larger than 1 MiB", what, path));
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in.good() && !in.eof()) return Status::IoError(fmt::format("cannot read {} {}", what, path));
  return ss.str();
}

Result<std::string> Base64Decode(const std::string& text, const std::string& what) {
  std::string in;
  for (char c : text)
    if (c != '\n' && c != '\r' && c != ' ') in.push_back(c);
  if (in.size() % 4 != 0) return Status::InvalidArgument(fmt::format("{}: not base64", what));
  std::string out(in.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  if (n < 0) return Status::InvalidArgument(fmt::format("{}: not base64", what));
  size_t len = static_cast<size_t>(n);
  if (!in.empty() && in.back() == '=') --len;
  if (in.size() >= 2 && in[in.size() - 2] == '=') --len;
  out.resize(len);
  return out;
}

// The named entry of a kubeconfig list (clusters, users, contexts): {name, <field>: {...}}.
Result<Json> Named(const Json& doc, const std::string& list, const std::string& field, const std::string& name) {
  const auto it = doc.find(list);
  if (it != doc.end() && it->is_array()) {
    for (const Json& e : *it) {
      if (e.is_object() && e.value("name", "") == name) {
        const auto f = e.find(field);
        if (f == e.end() || !f->is_object())
          return Status::InvalidArgument(fmt::format("kubeconfig: {} entry '{}' has no {}", list, name, field));
        return *f;
      }
    }
  }
  return Status::InvalidArgument(fmt::format("kubeconfig: no {} entry named '{}'", list, name));
}

std::string Str(const Json& obj, const char* key) {
  const auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

Result<KubeEndpoint> LoadKubeconfig(const std::string& path, const std::string& context_name) {
  ASSIGN_OR_RETURN(const std::string text, ReadSmallFile(path, "kubeconfig"));
  auto parsed = api_internal::ParseYamlText(text, JobSpecLimits{});
  if (!parsed.ok()) return parsed.status().WithContext(fmt::format("kubeconfig {}", path));
  const Json& doc = *parsed;
  if (!doc.is_object()) return Status::InvalidArgument(fmt::format("kubeconfig {} is not a mapping", path));
  const std::string dir = std::filesystem::path(path).parent_path().string();
  auto relative = [&dir](const std::string& p) { return p.empty() || p[0] == '/' || dir.empty() ? p : dir + "/" + p; };

  const std::string name = context_name.empty() ? Str(doc, "current-context") : context_name;
  if (name.empty()) return Status::InvalidArgument(fmt::format("kubeconfig {}: no current-context and none given", path));
  ASSIGN_OR_RETURN(const Json ctx, Named(doc, "contexts", "context", name));
  ASSIGN_OR_RETURN(const Json cluster, Named(doc, "clusters", "cluster", Str(ctx, "cluster")));
  KubeEndpoint ep;
  ep.server = Str(cluster, "server");
  if (ep.server.rfind("https://", 0) != 0 && ep.server.rfind("http://", 0) != 0)
    return Status::InvalidArgument(fmt::format("kubeconfig {}: cluster '{}' has no http(s) server", path,
                                               Str(ctx, "cluster")));
  while (ep.server.size() > 8 && ep.server.back() == '/') ep.server.pop_back();
  if (const std::string ns = Str(ctx, "namespace"); !ns.empty()) ep.namespace_name = ns;
  if (const auto it = cluster.find("insecure-skip-tls-verify"); it != cluster.end() && it->is_boolean())
    ep.insecure_skip_verify = it->get<bool>();
  if (const std::string data = Str(cluster, "certificate-authority-data"); !data.empty()) {
    ASSIGN_OR_RETURN(ep.ca_pem, Base64Decode(data, "certificate-authority-data"));
  } else if (const std::string file = Str(cluster, "certificate-authority"); !file.empty()) {
    ASSIGN_OR_RETURN(ep.ca_pem, ReadSmallFile(relative(file), "certificate-authority"));
  }

  const std::string user_name = Str(ctx, "user");
  if (!user_name.empty()) {
    ASSIGN_OR_RETURN(const Json user, Named(doc, "users", "user", user_name));
    for (const char* plugin : {"exec", "auth-provider", "username"}) {
      if (user.contains(plugin))
        return Status::InvalidArgument(fmt::format(
            "kubeconfig {}: user '{}' authenticates with '{}', which gpupool does not run (use a token, a token "
            "file or a client certificate)",
            path, user_name, plugin));
    }
    ep.token = Str(user, "token");
    if (const std::string file = Str(user, "tokenFile"); ep.token.empty() && !file.empty()) {
      ASSIGN_OR_RETURN(ep.token, ReadSmallFile(relative(file), "tokenFile"));
    }
    while (!ep.token.empty() && (ep.token.back() == '\n' || ep.token.back() == '\r' || ep.token.back() == ' '))
      ep.token.pop_back();
    if (const std::string data = Str(user, "client-certificate-data"); !data.empty()) {
      ASSIGN_OR_RETURN(ep.client_cert_pem, Base64Decode(data, "client-certificate-data"));
    } else if (const std::string file = Str(user, "client-certificate"); !file.empty()) {
      ASSIGN_OR_RETURN(ep.client_cert_pem, ReadSmallFile(relative(file), "client-certificate"));
    }
    if (const std::string data = Str(user, "client-key-data"); !data.empty()) {
      ASSIGN_OR_RETURN(ep.client_key_pem, Base64Decode(data, "client-key-data"));
    } else if (const std::string file = Str(user, "client-key"); !file.empty()) {
      ASSIGN_OR_RETURN(ep.client_key_pem, ReadSmallFile(relative(file), "client-key"));
    }
    if (ep.client_cert_pem.empty() != ep.client_key_pem.empty())
      return Status::InvalidArgument(
          fmt::format("kubeconfig {}: user '{}' has a client certificate without its key, or a key without its "
                      "certificate",
                      path, user_name));
  }
  return ep;
}

Result<KubeEndpoint> LoadInCluster(const std::string& account_dir) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (host == nullptr || *host == '\0' || port == nullptr || *port == '\0')
    return Status::FailedPrecondition(
        "not in a Kubernetes pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set (give a "
        "kubeconfig)");
  KubeEndpoint ep;
  const std::string h = host;
  ep.server = fmt::format("https://{}:{}", h.find(':') != std::string::npos ? "[" + h + "]" : h, port);
  ASSIGN_OR_RETURN(ep.token, ReadSmallFile(account_dir + "/token", "the service account token"));
  while (!ep.token.empty() && (ep.token.back() == '\n' || ep.token.back() == ' ')) ep.token.pop_back();
  ASSIGN_OR_RETURN(ep.ca_pem, ReadSmallFile(account_dir + "/ca.crt", "the service account CA"));
  if (auto ns = ReadSmallFile(account_dir + "/namespace", "the service account namespace"); ns.ok() && !ns->empty()) {
    ep.namespace_name = *ns;
    while (!ep.namespace_name.empty() && ep.namespace_name.back() == '\n') ep.namespace_name.pop_back();
  }
  return ep;
}

}  // namespace gpupool::kube
