#!/usr/bin/env bash
# The newcomer's main command: install what is needed, build, and start the pool on this machine
# with `gpupool up` (the server and a local node agent in one process; simulated GPUs when the
# machine has none). Arguments go to `gpupool up` (e.g. --simulate 8xH100-80GB-SXM --nodes 2).
# The trace-driven scheduling demo is `./build/gpupool demo` once built.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build -DGPUPOOL_BUILD_TESTS=OFF -DGPUPOOL_BUILD_BENCH=OFF
exec ./build/gpupool up "$@"
