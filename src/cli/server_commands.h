// `gpupool server`: the control plane as a long-running process.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace gpupool {

// Adds `server` to `app`. The returned callback runs it when it was parsed and gives the exit
// code; -1 when `server` was not chosen.
std::function<int()> AddServerCommand(CLI::App& app);

// The default data directory: $GPUPOOL_DATA_DIR, else $XDG_DATA_HOME/gpupool, else
// ~/.local/share/gpupool (the client looks for admin.token in the same places).
std::string DefaultDataDir();

}  // namespace gpupool
