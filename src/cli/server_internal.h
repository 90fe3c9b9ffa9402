// What `gpupool server`, `gpupool agent` (server_commands.cc) and `gpupool up` (up_command.cc)
// share: the server's flags, a started control plane, and the small parsers of their flags.
#pragma once

#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "server/config.h"
#include "server/http_api.h"
#include "server/service.h"

namespace gpupool::cli_internal {

struct ServerFlags {
  std::string data_dir;
  std::string listen;
  std::string config;
  bool init = false;  // start a new pool although the data dir says one existed here
};

// A started control plane: the service with its loop running and the HTTP API listening.
struct RunningServer {
  ServerConfig config;
  std::unique_ptr<PoolService> service;
  std::unique_ptr<HttpApi> api;
  std::string url;
  std::string agent_token;  // a token agents in this process may use
  void Stop() {
    if (api) api->Stop();
    if (service) service->Stop();
  }
};

// Prints the error and gives the exit code: 2 for a bad argument, 1 otherwise.
int Fail(const Status& st);
// mkdir -p, mode 0700.
Status MakeDirs(const std::string& path);
// "64Mi", "512Ki", "1Gi", "1048576" (also K, M, G as powers of 1000) -> bytes, at most 1Ti.
Result<int64_t> ParseByteSize(const std::string& text, const std::string& what);
// --log-max-bytes and --log-keep: a per-file cap of 0 (unbounded) or at least 4 KiB; 0..9 files kept.
Status ParseLogFlags(const std::string& max, int keep, int64_t* max_bytes, int* keep_out);
// --image-cache-max: a byte size of at least 64Mi.
Status ParseImageCacheMax(const std::string& text, int64_t* bytes);
// Blocks SIGINT and SIGTERM in this thread (and so in every thread started after), so that only a
// sigwait on the returned set sees them. Call before starting any thread.
sigset_t BlockStopSignals();
// The control plane of `flags`, started (its store opened, its loop and API running).
Result<std::unique_ptr<RunningServer>> StartServer(const ServerFlags& flags, const char* who);

// Adds `up` to `app`; the callback runs it when it was parsed and gives the exit code, -1 when
// `up` was not chosen.
std::function<int()> AddUpCommand(CLI::App& app);

}  // namespace gpupool::cli_internal
