#!/usr/bin/env bash
# Configures and builds gpupool into build/ (or $1), warnings as errors.
#   scripts/build.sh [BUILD_DIR] [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-build}"
shift || true
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUPOOL_WERROR=ON "$@" >/dev/null
ninja -C "$dir"
