// `gpupool kube-scheduler` (the Kubernetes secondary scheduler) and `gpupool kube-node` (the node
// side) (docs/kubernetes.md).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace gpupool {

// Adds the Kubernetes commands to `app`. The returned callback runs the chosen one and gives its
// exit code; -1 when none was chosen.
std::function<int()> AddKubeCommands(CLI::App& app);

}  // namespace gpupool
