#!/usr/bin/env bash
# Builds the job spec fuzz target (fuzz/jobspec_fuzz.cc) with clang++, libFuzzer, ASan and UBSan in
# build-fuzz/, and runs it for SECONDS (default 60) on a scratch copy of the seed corpus
# fuzz/corpus/jobspec, so the checked-in seeds never change. Exits non-zero when the fuzzer finds
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
ninja -C "$dir" jobspec_fuzz

work="$dir/fuzz-run"
rm -rf "$work"
mkdir -p "$work/corpus" "$work/artifacts"
cp fuzz/corpus/jobspec/* "$work/corpus/"
echo "fuzz: jobspec_fuzz for ${seconds}s"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  "$dir/jobspec_fuzz" -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
  -dict=fuzz/jobspec.dict -artifact_prefix="$work/artifacts/" -print_final_stats=1 "$work/corpus"
echo "fuzz: no findings"
