#!/usr/bin/env bash
# GPU smoke test for a machine with an NVIDIA driver: builds gpu_probe if needed, then prints what
# GPU discovery (NVML, loaded at run time) finds, the node registration body, and the /metrics
# text, and checks the metrics with promtool when it is installed.
#
#   scripts/gpu-smoke.sh                      # real NVML
#   scripts/gpu-smoke.sh --simulate dgx-h100  # no GPU: a simulated inventory
#   GPUPOOL_BUILD_DIR=build scripts/gpu-smoke.sh --library /path/to/libnvidia-ml.so.1
#   scripts/gpu-smoke.sh --interval-ms 2000   # GPM ratios over 2 s instead of 1 s
#
# gpu_probe samples twice, 1 s apart (--interval-ms), so that the GPM ratios (graphics engine,
# tensor pipe, DRAM active; Hopper and later) appear. The script then lists which GPU metric
# families the machine gave. Absent by design, not by fault: memory temperature on GDDR boards,
# NVLink bandwidth on GPUs without NVLink, the GPM ratios before Hopper or with MIG enabled, the
# vGPU license status anywhere but on a vGPU guest (see docs/agent.md, "GPU metrics").
#
# Exit status: gpu_probe's (2: NVML not available), or promtool's when the metrics fail lint.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${GPUPOOL_BUILD_DIR:-$root/build-gpu-smoke}"
probe="$build/gpu_probe"

if [[ ! -x "$probe" ]]; then
  echo "== building gpu_probe in $build" >&2
  if [[ ! -f "$build/build.ninja" && ! -f "$build/Makefile" ]]; then
    generator=()
    command -v ninja >/dev/null && generator=(-G Ninja)
    cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUPOOL_BUILD_TESTS=OFF >&2
  fi
  cmake --build "$build" --target gpu_probe -j "$(nproc)" >&2
fi

if command -v nvidia-smi >/dev/null; then
  echo "== nvidia-smi -L" >&2
  nvidia-smi -L >&2 || true
fi

out="$(mktemp)"
trap 'rm -f "$out"' EXIT
set +e
"$probe" "$@" >"$out"
rc=$?
set -e
cat "$out"
if [[ $rc -ne 0 ]]; then
  echo "== gpu_probe exited $rc" >&2
  exit "$rc"
fi

echo "== GPU metric families present" >&2
grep '^# TYPE gpupool_gpu_' "$out" | awk '{print "   " $3 " (" $4 ")"}' >&2 || true

if command -v promtool >/dev/null; then
  echo "== promtool check metrics" >&2
  sed -n '/^# ---- \/metrics ----$/,$p' "$out" | tail -n +2 | promtool check metrics
  echo "== metrics OK" >&2
else
  echo "== promtool not installed: metrics not linted" >&2
fi
