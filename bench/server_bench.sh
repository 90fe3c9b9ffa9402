#!/usr/bin/env bash
# Control-plane throughput as a scripted run (figures go to docs/performance.md): durable
# submissions/s over HTTP (synchronous=FULL and NORMAL, 1/4/16/64 clients, with a breakdown by
# layer) and the placement rate with 1,000 nodes and 20,000 queued jobs (bestfit and fgd).
# Builds bench/server_bench.cc in Release mode into build-bench/ (or $BUILD_DIR) and runs it;
# arguments go to server_bench (e.g. --skip-place, --jobs 2000, --threads 16).
#   bench/server_bench.sh [server_bench args...]
# The databases go under $TMPDIR (default /tmp): point it at the disk the server would use.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${BUILD_DIR:-build-bench}"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPUPOOL_WERROR=ON -DGPUPOOL_BUILD_BENCH=ON \
  -DGPUPOOL_BUILD_TESTS=OFF >/dev/null
ninja -C "$dir" server_bench
echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n): $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
echo "== load before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
"./$dir/server_bench" "$@"
echo "== load after the run: $(cut -d' ' -f1-3 /proc/loadavg)"
