#!/usr/bin/env bash
# Start-up cost of client programs, side by side: CPU time (task-clock) and wall time of
# `PROGRAM version` (or any command line), averaged by `perf stat -r N`, the programs taking turns
# for several rounds so that a slow spell of this shared machine hits all of them.
#
#   bench/client_startup.sh [-r N] [-k ROUNDS] 'build/gpupool version' 'sbatch --version' ...
#
# Prints one line per program and round: task-clock ms, wall ms. Needs perf (linux-perf).
set -euo pipefail
reps=100
rounds=3
while getopts "r:k:" opt; do
  case $opt in
    r) reps=$OPTARG ;;
    k) rounds=$OPTARG ;;
    *) echo "usage: $0 [-r N] [-k ROUNDS] 'command' ..." >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || { echo "usage: $0 [-r N] [-k ROUNDS] 'command' ..." >&2; exit 2; }
command -v perf >/dev/null || { echo "$0: perf is not installed (apt-get install linux-perf)" >&2; exit 2; }

printf '%-40s %6s %14s %10s\n' command round task-clock_ms wall_ms
for ((k = 1; k <= rounds; k++)); do
  for cmd in "$@"; do
    # perf runs the program itself (no shell between): what a script's loop pays per call.
    # shellcheck disable=SC2086
    out=$(perf stat -e task-clock -r "$reps" -- $cmd 2>&1 >/dev/null || true)
    tc=$(awk '/task-clock/ {gsub(",", "", $1); print $1; exit}' <<<"$out")
    wall=$(awk '/seconds time elapsed/ {print $1 * 1000; exit}' <<<"$out")
    printf '%-40s %6d %14s %10s\n' "$cmd" "$k" "$tc" "$wall"
  done
done
