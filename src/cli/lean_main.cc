// gpupool: what users run. The client commands (submit, get, list, cancel, events, logs, nodes,
// queues, run, version) run here, in a small program that starts in a few milliseconds; the
// commands that run the pool or the simulator (server, agent, up, sim, demo, policies, profile) are
// the same process continuing as `gpupool-core` beside it (exec: same pid, same arguments), so
// `gpupool up` and every other command work as they always did.
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/client_commands.h"
#include "cli/run_command.h"

namespace {

struct CoreCommand {
  const char* name;
  const char* help;
};
// Kept in step with the subcommands of gpupool-core (E2eProcessTest compares the two --help).
constexpr CoreCommand kCoreCommands[] = {
    {"demo", "Schedule the bundled Alibaba cluster under each placement policy"},
    {"policies", "List placement policies and plugins"},
    {"profile", "Scheduling profiles"},
    {"sim", "Trace-driven simulator: the FGD experiments, and replays over time"},
    {"server", "Run the control plane: REST API, job store and scheduling loop"},
    {"agent", "Run a node agent: discover GPUs, run the tasks the server assigns"},
    {"up", "Server and local agent(s) in one process: the pool on this machine"},
    {"kube-scheduler", "Schedule Kubernetes pods with schedulerName gpupool (docs/kubernetes.md)"},
    {"kube-node", "Publish this Kubernetes node's GPUs and their health for gpupool (docs/kubernetes.md)"},
};

bool IsCoreCommand(std::string_view arg) {
  for (const CoreCommand& c : kCoreCommands)
    if (arg == c.name) return true;
  return false;
}

// GPUPOOL_CORE when set, else gpupool-core beside this program.
std::string CorePath() {
  if (const char* env = std::getenv("GPUPOOL_CORE"); env != nullptr && *env != '\0') return env;
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "gpupool-core";
  std::string dir(self, static_cast<size_t>(n));
  dir.resize(dir.rfind('/') + 1);
  return dir + "gpupool-core";
}

[[noreturn]] void ExecCore(int argc, char** argv) {
  const std::string core = CorePath();
  std::vector<char*> args(argv, argv + argc);
  args.push_back(nullptr);
  ::execv(core.c_str(), args.data());
  std::cerr << fmt::format("gpupool: cannot run {} for '{}': {}\n", core, argv[1], std::strerror(errno));
  std::exit(127);
}

}  // namespace

int main(int argc, char** argv) {
  // The first word that is not an option names the command.
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (!arg.empty() && arg[0] == '-') continue;
    if (IsCoreCommand(arg)) ExecCore(argc, argv);
    break;
  }

  CLI::App app{"gpupool: a GPU pooling scheduler for AI workloads"};
  app.require_subcommand(1);
  // Listed for --help, in gpupool-core's order; never parsed here (they run in gpupool-core, above).
  CLI::App* version_cmd = nullptr;
  for (const CoreCommand& c : kCoreCommands) {
    app.add_subcommand(c.name, c.help)->allow_extras();
    if (std::string_view(c.name) == "profile") version_cmd = app.add_subcommand("version", "Print the version");
  }
  const std::function<int()> run_job = gpupool::AddRunCommand(app);
  int client_exit = -1;
  gpupool::RegisterClientCommands(app, &client_exit);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Usage errors exit 2, which scripts can tell apart from a failed operation (1).
    (void)app.exit(e);
    return 2;
  }
  if (client_exit >= 0) return client_exit;
  if (const int rc = run_job(); rc >= 0) return rc;
  if (*version_cmd) {
    fmt::print("gpupool {}\n", GPUPOOL_VERSION);
    return 0;
  }
  return 0;
}
