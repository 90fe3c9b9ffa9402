#include "cli/server_commands.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "server/config.h"
#include "server/http_api.h"
#include "server/service.h"
#include "store/sqlite_store.h"

namespace gpupool {

std::string DefaultDataDir() {
  if (const char* d = std::getenv("GPUPOOL_DATA_DIR"); d != nullptr && *d != '\0') return d;
  if (const char* x = std::getenv("XDG_DATA_HOME"); x != nullptr && *x != '\0')
    return std::string(x) + "/gpupool";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0')
    return std::string(h) + "/.local/share/gpupool";
  return ".gpupool";
}

namespace {

struct ServerFlags {
  std::string data_dir;
  std::string listen;
  std::string config;
};

Status MakeDirs(const std::string& path) {
  std::string partial;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || (path[i] == '/' && i > 0)) {
      partial = path.substr(0, i);
      if (::mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST)
        return Status::IoError(fmt::format("cannot create directory {}", partial));
    }
  }
  return Status::Ok();
}

int Fail(const Status& st) {
  std::cerr << "gpupool server: " << st.ToString() << "\n";
  return st.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

int RunServer(const ServerFlags& flags) {
  ServerConfig config;
  if (!flags.config.empty()) {
    auto c = LoadServerConfig(flags.config);
    if (!c.ok()) return Fail(c.status());
    config = std::move(c).value();
  }
  if (!flags.listen.empty()) config.listen = flags.listen;
  if (!flags.data_dir.empty()) config.data_dir = flags.data_dir;
  if (config.data_dir.empty()) config.data_dir = DefaultDataDir();
  std::string host;
  int port = 0;
  if (Status st = ParseListen(config.listen, &host, &port); !st.ok()) return Fail(st);
  if (Status st = MakeDirs(config.data_dir); !st.ok()) return Fail(st);
  if (config.tokens.empty()) {
    auto token = EnsureAdminToken(config.data_dir);
    if (!token.ok()) return Fail(token.status());
    config.tokens[*token] = Principal{"", Role::kAdmin};
    std::cout << fmt::format("gpupool server: no config: one admin token, in {}/admin.token\n",
                             config.data_dir);
  }
  SqliteStoreOptions store_options;
  store_options.path = config.data_dir + "/gpupool.db";
  store_options.synchronous_full = config.sync_full;
  auto store = OpenSqliteStore(store_options);
  if (!store.ok()) return Fail(store.status());

  // Block the stop signals before any thread starts, so that only sigwait below sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto service = PoolService::Open(config, std::move(store).value());
  if (!service.ok()) return Fail(service.status());
  (*service)->Start();
  HttpApi api(**service, config);
  auto bound = api.Start(host, port);
  if (!bound.ok()) return Fail(bound.status());
  std::cout << fmt::format("gpupool server: listening on http://{}:{} (data in {})\n", host, *bound,
                           config.data_dir)
            << std::flush;
  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::cout << "gpupool server: stopping\n" << std::flush;
  api.Stop();
  (*service)->Stop();
  return 0;
}

}  // namespace

std::function<int()> AddServerCommand(CLI::App& app) {
  auto flags = std::make_shared<ServerFlags>();
  auto* cmd = app.add_subcommand("server", "Run the control plane: REST API, job store and scheduling loop");
  cmd->add_option("--data-dir", flags->data_dir,
                  "Where the store and the admin token live (default: " + DefaultDataDir() + ")");
  cmd->add_option("--listen", flags->listen, "host:port to serve on (default 127.0.0.1:8470)");
  cmd->add_option("--config", flags->config, "Server config YAML (tokens, queues, ordering; docs/server.md)");
  return [cmd, flags]() -> int {
    if (!*cmd) return -1;
    return RunServer(*flags);
  };
}

}  // namespace gpupool
