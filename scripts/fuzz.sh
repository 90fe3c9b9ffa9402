#!/usr/bin/env bash
# Builds the fuzz targets with clang++, libFuzzer, ASan and UBSan in build-fuzz/ and runs each for
# SECONDS (default 60) on a scratch copy of its seed corpus, so the checked-in seeds never change:
# jobspec_fuzz (fuzz/jobspec_fuzz.cc: the job spec codec, corpus fuzz/corpus/jobspec) and
# http_fuzz (fuzz/http_fuzz.cc: HTTP parsing with the server's limits, every JSON body, the node
# codec; corpus fuzz/corpus/http). Exits non-zero when the fuzzer finds
# a crash, a sanitizer report or a broken round trip; the input is left in build-fuzz/fuzz-run/.
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
dir=build-fuzz

# Instrument every library the target links (fuzzer coverage + sanitizers), not only the target.
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_CXX_FLAGS="$flags" -DGPUPOOL_FUZZ=ON -DGPUPOOL_BUILD_TESTS=OFF -DGPUPOOL_BUILD_BENCH=OFF >/dev/null
ninja -C "$dir" jobspec_fuzz http_fuzz

run() {
  local target=$1 corpus=$2 dict=$3 maxlen=$4
  local work="$dir/fuzz-run/$target"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts"
  cp "$corpus"/* "$work/corpus/"
  echo "fuzz: $target for ${seconds}s"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$dir/$target" -max_total_time="$seconds" -max_len="$maxlen" -timeout=10 -rss_limit_mb=2048 \
    -dict="$dict" -artifact_prefix="$work/artifacts/" -print_final_stats=1 "$work/corpus"
}
run jobspec_fuzz fuzz/corpus/jobspec fuzz/jobspec.dict 8192
run http_fuzz fuzz/corpus/http fuzz/http.dict 16384
echo "fuzz: no findings"
