// `gpupool sim replay`: the time-based replay of a job trace (sim/replay.h).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace gpupool {

// Adds `replay` under the `sim` command. The callback runs it when it was chosen and gives the exit
// code; -1 when it was not.
std::function<int()> AddReplayCommand(CLI::App& sim);

}  // namespace gpupool
