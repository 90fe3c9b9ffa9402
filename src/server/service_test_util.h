// What the PoolService tests share: a service over an SQLite store in a directory (fsync off: the
// tests exercise recovery by reopening, not power loss).
#pragma once

#include <memory>
#include <string>

#include "server/service.h"
#include "store/sqlite_store.h"

namespace gpupool::testing_util {

inline Result<std::unique_ptr<PoolService>> OpenServiceIn(const std::string& dir, const ServerConfig& config) {
  SqliteStoreOptions o;
  o.path = dir + "/gpupool.db";
  o.synchronous_full = false;
  auto store = OpenSqliteStore(o);
  if (!store.ok()) return store.status();
  return PoolService::Open(config, std::move(store).value());
}

}  // namespace gpupool::testing_util
