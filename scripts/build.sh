#!/usr/bin/env bash
# Configures and builds gpupool into build/ (or $1), warnings as errors.
#   scripts/build.sh [BUILD_DIR] [extra cmake args...]
# Uses ccache when it is installed (paths relative to the checkout, so clones share hits).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-build}"
shift || true
launcher=()
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUPOOL_WERROR=ON "${launcher[@]}" "$@" >/dev/null
ninja -C "$dir"
