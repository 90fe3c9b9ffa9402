#!/usr/bin/env bash
# Simulator speed and memory, as a scripted run (figures go to docs/performance.md):
#   1. one experiment, default trace, FGD, seed 42, published arrival order: wall time and peak RSS,
#      five times (the machine is shared: read the minimum and the median);
#   2. the whole published grid, 17 traces x 6 policies x seeds 42-51, on --jobs 2.
# Needs ../shared/traces (the published arrival orders) and a build in build/.
#   bench/sim_bench.sh [--no-sweep]
set -euo pipefail
cd "$(dirname "$0")/.."
T=${TRACES:-../shared/traces}
B=./build/gpupool
[ -x "$B" ] || { echo "build first: bash scripts/build.sh" >&2; exit 1; }
[ -d "$T/fgd-arrival-orders" ] || { echo "no published arrival orders under $T" >&2; exit 1; }

echo "== one experiment: default / fgd / seed 42 (5 runs)"
for i in 1 2 3 4 5; do
  /usr/bin/time -f "%e s wall, %M KiB peak RSS" "$B" sim run \
    --nodes "$T/alibaba-gpu-v2023/openb_node_list_gpu_node.csv" \
    --pods "$T/alibaba-gpu-v2023/openb_pod_list_default.csv" \
    --policy fgd --seed 42 --arrival-order "$T/fgd-arrival-orders" 2>&1 | grep -E "time:|peak RSS"
done

if [ "${1:-}" != "--no-sweep" ]; then
  echo "== the published grid: 1,020 runs on 2 jobs"
  out=$(mktemp -d)
  start=$(date +%s.%N)
  "$B" sim sweep --traces "$T/alibaba-gpu-v2023" --policies all --seeds 42-51 \
    --arrival-order "$T/fgd-arrival-orders" --out "$out" --jobs 2
  end=$(date +%s.%N)
  echo "sweep wall time: $(echo "$end - $start" | bc) s"
  rm -rf "$out"
fi
