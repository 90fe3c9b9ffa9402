// The embedded default Store: one SQLite database file in WAL mode with synchronous=FULL, so an
// acknowledged batch survives a crash of the process or of the machine. The schema is versioned:
// Open() applies every migration the file has not seen yet, each in its own transaction, and
// refuses a file written by a newer gpupool.
#pragma once

#include <memory>
#include <string>

#include "store/store.h"

namespace gpupool {

struct SqliteStoreOptions {
  std::string path;          // the database file; created when absent
  bool synchronous_full = true;  // false: synchronous=NORMAL (survives process crashes only)
};

Result<std::unique_ptr<Store>> OpenSqliteStore(const SqliteStoreOptions& options);

// The newest schema version this build knows.
int SqliteSchemaVersion();

}  // namespace gpupool
