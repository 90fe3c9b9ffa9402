#include "server/node_credentials.h"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/evp.h>
#include <openssl/sha.h>

#include <ctime>
#include <stdexcept>

namespace gpupool {

using nlohmann::json;

namespace {

std::string Hex(const unsigned char* p, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(n * 2, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

std::string Iso(int64_t ms) {
  if (ms <= 0) return "";
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03}Z", buf, ms % 1000);
}

}  // namespace

std::string RandomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), static_cast<int>(bytes)) != 1)
    throw std::runtime_error("RAND_bytes failed: no secure random bytes");
  return Hex(reinterpret_cast<const unsigned char*>(raw.data()), raw.size());
}

std::string Sha256Hex(std::string_view data) {
  // Every authenticated request hashes its token: the digest's implementation is fetched once
  // (OpenSSL 3's one-shot SHA256() fetches it on every call).
  static EVP_MD* const kSha256 = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (kSha256 == nullptr || EVP_Digest(data.data(), data.size(), digest, &len, kSha256, nullptr) != 1 ||
      len != SHA256_DIGEST_LENGTH) {
    SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
    len = SHA256_DIGEST_LENGTH;
  }
  return Hex(digest, len);
}

bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

PutMeta NodeCredentials::MetaOp(const Entry& e) {
  json v = {{"hash", e.hash}, {"createdMs", e.created_ms}, {"lastUsedMs", e.last_used_ms},
            {"revokedMs", e.revoked_ms}};
  return PutMeta{std::string(kNodeCredentialMetaPrefix) + e.node, v.dump()};
}

Status NodeCredentials::Load(const std::vector<std::pair<std::string, std::string>>& meta) {
  std::lock_guard<std::mutex> lock(mu_);
  by_node_.clear();
  node_by_hash_.clear();
  for (const auto& [key, value] : meta) {
    if (!key.starts_with(kNodeCredentialMetaPrefix)) continue;
    const json v = json::parse(value, nullptr, false);
    if (!v.is_object() || !v.contains("hash") || !v["hash"].is_string() || v["hash"].get<std::string>().size() != 64)
      return Status::FailedPrecondition(fmt::format("meta {}: not a node credential record", key));
    Entry e;
    e.node = key.substr(kNodeCredentialMetaPrefix.size());
    e.hash = v["hash"].get<std::string>();
    e.created_ms = v.value("createdMs", int64_t{0});
    e.last_used_ms = v.value("lastUsedMs", int64_t{0});
    e.revoked_ms = v.value("revokedMs", int64_t{0});
    e.stored_last_used_ms = e.last_used_ms;
    if (e.revoked_ms == 0) node_by_hash_[e.hash] = e.node;
    by_node_[e.node] = std::move(e);
  }
  return Status::Ok();
}

std::string NodeCredentials::Issue(const std::string& node, int64_t now_ms, WriteBatch& batch) {
  const std::string secret = RandomHex(32);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_node_.find(node);
  if (it != by_node_.end()) node_by_hash_.erase(it->second.hash);
  Entry e;
  e.node = node;
  e.hash = Sha256Hex(secret);
  e.created_ms = now_ms;
  node_by_hash_[e.hash] = node;
  batch.Add(MetaOp(e));
  by_node_[node] = std::move(e);
  return secret;
}

void NodeCredentials::Forget(const std::string& node) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_node_.find(node);
  if (it == by_node_.end()) return;
  node_by_hash_.erase(it->second.hash);
  by_node_.erase(it);
}

std::optional<std::string> NodeCredentials::Authenticate(std::string_view secret, int64_t now_ms) {
  // Looked up by the secret's hash: what the lookup's timing could reveal is about the hash, which
  // does not lead back to a secret.
  const std::string hash = Sha256Hex(secret);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = node_by_hash_.find(hash);
  if (it == node_by_hash_.end() || !ConstantTimeEqual(it->first, hash)) return std::nullopt;
  Entry& e = by_node_[it->second];
  e.last_used_ms = now_ms;
  return e.node;
}

bool NodeCredentials::Live(const std::string& node) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_node_.find(node);
  return it != by_node_.end() && it->second.revoked_ms == 0;
}

Status NodeCredentials::Revoke(const std::string& node, int64_t now_ms, WriteBatch& batch) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_node_.find(node);
  if (it == by_node_.end()) return Status::NotFound(fmt::format("node '{}' has no credential", node));
  if (it->second.revoked_ms != 0)
    return Status::FailedPrecondition(fmt::format("the credential of node '{}' is already revoked", node));
  it->second.revoked_ms = now_ms;
  node_by_hash_.erase(it->second.hash);
  batch.Add(MetaOp(it->second));
  it->second.stored_last_used_ms = it->second.last_used_ms;
  return Status::Ok();
}

json NodeCredentials::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  json items = json::array();
  for (const auto& [node, e] : by_node_) {
    json item = {{"node", node},
                 {"state", e.revoked_ms == 0 ? "live" : "revoked"},
                 {"created", Iso(e.created_ms)},
                 {"lastUsed", e.last_used_ms > 0 ? json(Iso(e.last_used_ms)) : json(nullptr)}};
    if (e.revoked_ms != 0) item["revoked"] = Iso(e.revoked_ms);
    items.push_back(std::move(item));
  }
  return json{{"items", std::move(items)}};
}

void NodeCredentials::FlushLastUsed(int64_t min_step_ms, WriteBatch& batch) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [node, e] : by_node_) {
    if (e.last_used_ms - e.stored_last_used_ms < min_step_ms) continue;
    batch.Add(MetaOp(e));
    e.stored_last_used_ms = e.last_used_ms;
  }
}

}  // namespace gpupool
