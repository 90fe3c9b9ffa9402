// `gpupool sim ...`: run, sweep, compare, report.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace gpupool {

// Adds the `sim` subcommand tree to `app`. The returned callback runs whichever sim subcommand
// was parsed and gives the process exit code; it returns -1 when no sim subcommand was chosen.
std::function<int()> AddSimCommands(CLI::App& app);

}  // namespace gpupool
