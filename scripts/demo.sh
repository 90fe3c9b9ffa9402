#!/usr/bin/env bash
# The newcomer's main command: install what is needed, build, and run the scheduling demo on the
# bundled Alibaba cluster (1,213 nodes, 6,212 GPUs) under each placement policy.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build -DGPUPOOL_BUILD_TESTS=OFF -DGPUPOOL_BUILD_BENCH=OFF
exec ./build/gpupool demo "$@"
