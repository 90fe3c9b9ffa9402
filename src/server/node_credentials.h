// Node-bound agent credentials (docs/server.md#node-credentials).
//
// The `agent` token of the config is a bootstrap credential: it may only register a node. A
// registration answers with a fresh random credential bound to that node; the server keeps only
// its SHA-256 (in the store's meta table), the agent keeps the secret (mode 0600). Every node-side
// route checks that the credential's node is the node it acts on. An admin lists and revokes them.
//
// Also the small crypto helpers the server's authentication uses: random hex, SHA-256, and a
// constant-time comparison.
//
// Thread safety: NodeCredentials has its own mutex; every method may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "store/store.h"

namespace gpupool {

// `bytes` random bytes from the OS CSPRNG (OpenSSL RAND_bytes), hex-encoded.
std::string RandomHex(size_t bytes);
// SHA-256 of `data`, lowercase hex (64 digits).
std::string Sha256Hex(std::string_view data);
// Equal contents, in time that depends only on the lengths (CRYPTO_memcmp).
bool ConstantTimeEqual(std::string_view a, std::string_view b);

// The meta key prefix node credentials are stored under ("node-credential/<node>").
inline constexpr std::string_view kNodeCredentialMetaPrefix = "node-credential/";

class NodeCredentials {
 public:
  struct Entry {
    std::string node;
    std::string hash;  // SHA-256 hex of the secret
    int64_t created_ms = 0;
    int64_t last_used_ms = 0;
    int64_t revoked_ms = 0;  // 0: live
    int64_t stored_last_used_ms = 0;  // what the store has (last-used is written back lazily)
  };

  // Reads the entries from the store's meta rows; other keys are ignored. A malformed entry is an
  // error naming its key (the store is ours: it does not hold malformed rows unless damaged).
  Status Load(const std::vector<std::pair<std::string, std::string>>& meta);

  // A new credential for `node`, replacing any earlier one. Returns the secret (shown once, never
  // stored) and adds the store write to `batch`. The caller commits the batch.
  std::string Issue(const std::string& node, int64_t now_ms, WriteBatch& batch);
  // Undo of Issue when the batch could not be committed.
  void Forget(const std::string& node);

  // The node a live credential belongs to; nothing for an unknown or revoked one. Marks it used.
  std::optional<std::string> Authenticate(std::string_view secret, int64_t now_ms);

  // Whether `node` has a live (not revoked) credential.
  bool Live(const std::string& node) const;

  // Revokes the credential of `node`: NotFound when it has none, FailedPrecondition when already
  // revoked. Adds the store write to `batch`.
  Status Revoke(const std::string& node, int64_t now_ms, WriteBatch& batch);

  // {items: [{node, created, lastUsed, revoked, state}]}: never the secret nor its hash.
  nlohmann::json List() const;

  // Store writes for last-used times that moved more than `min_step_ms` past what is stored.
  void FlushLastUsed(int64_t min_step_ms, WriteBatch& batch);

 private:
  static PutMeta MetaOp(const Entry& e);
  mutable std::mutex mu_;
  std::map<std::string, Entry> by_node_;
  std::map<std::string, std::string> node_by_hash_;  // live credentials only
};

}  // namespace gpupool
