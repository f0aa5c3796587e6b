#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, build-fuzz/) and fuzzes one target or all of them, then
# merges what was found into the committed corpus (tests/fuzz/corpus/<name>, minimised with
# -merge=1). Crash inputs land in tests/fuzz/crashes/<name>/; commit them with the fix, and the
# replay_<name> CTest test keeps them fixed.
#   tests/fuzz/run.sh [idx|csv|npy|tfrecord|project|keras|keras_archive|checkpoint|all] [seconds per target, default 600]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
which="${1:-all}"
secs="${2:-600}"
targets=(idx csv npy tfrecord project keras keras_archive checkpoint)
if [ "$which" != all ]; then targets=("$which"); fi
launcher=()
if command -v ccache > /dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ \
  -DTRAINDECK_FUZZ=ON -DTRAINDECK_BUILD_GUI=OFF -DTRAINDECK_CUDA=OFF "${launcher[@]}" > /dev/null
cmake --build build-fuzz -j "${TRAINDECK_JOBS:-$(nproc)}" \
  --target "${targets[@]/#/fuzz_}"
for t in "${targets[@]}"; do
  work="build-fuzz/fuzz-work/$t"
  mkdir -p "$work/corpus" "tests/fuzz/crashes/$t"
  dict=()
  if [ "$t" = project ] || [ "$t" = keras ]; then dict=(-dict=tests/fuzz/json.dict); fi
  # A .keras file (zip + HDF5) is some kilobytes even for a one-layer model.
  maxlen=4096
  if [ "$t" = keras_archive ]; then maxlen=65536; fi
  # Fork mode keeps going after a crash, so one run collects every distinct finding.
  "build-fuzz/tests/fuzz_$t" -fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1 \
    -max_total_time="$secs" -rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10 -max_len="$maxlen" \
    -artifact_prefix="tests/fuzz/crashes/$t/" "${dict[@]}" "$work/corpus" "tests/fuzz/corpus/$t" \
    2>&1 | tail -n 3
  mkdir -p "$work/merged"
  "build-fuzz/tests/fuzz_$t" -merge=1 -rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10 \
    "$work/merged" "tests/fuzz/corpus/$t" "$work/corpus" > "$work/merge.log" 2>&1
  rm -rf "tests/fuzz/corpus/$t"
  mv "$work/merged" "tests/fuzz/corpus/$t"
  echo "fuzz $t: corpus $(ls "tests/fuzz/corpus/$t" | wc -l) files," \
    "crash inputs $(ls "tests/fuzz/crashes/$t" | wc -l)"
done
