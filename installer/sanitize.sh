#!/usr/bin/env bash
# Builds and runs the tests under sanitizers, each in its own build folder:
#   asan  build-asan: AddressSanitizer + LeakSanitizer + UndefinedBehaviorSanitizer, whole suite
#   tsan  build-tsan: ThreadSanitizer, the suites with threads (data pipeline, run store,
#         training session, GUI controller) with OpenMP on one thread (libgomp is not
#         instrumented, so its own synchronisation is invisible to TSan)
#   installer/sanitize.sh [asan|tsan|all] [extra ctest options]     (default: all)
# Reports stop the run (halt_on_error); library-internal reports are suppressed by the files in
# tests/sanitizers/, the project's own code never is. CXX picks the compiler (default: c++).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
mode="${1:-all}"
if [ $# -gt 0 ]; then shift; fi
case "$mode" in
  asan | tsan | all) ;;
  *) echo "sanitize.sh: unknown mode '$mode' (expected asan, tsan or all)" >&2; exit 2 ;;
esac
"$root/installer/deps.sh" --test
jobs="${TRAINDECK_JOBS:-$(nproc)}"
supp="$root/tests/sanitizers"
launcher=()
source "$root/installer/ccache_env.sh"
# The threaded suites; tsan builds and runs only these. test_ui is left out: its panels hand work
# to threads through Qt's event queue, whose locking (inside QtCore, ignored through
# tests/sanitizers/tsan.supp) TSan cannot see, so every queued closure reads as a race.
tsan_tests=(test_data test_store test_training test_run_controller test_replica_group test_strategies test_work_share)

configure() {  # configure <dir> <sanitizers> [cmake options]
  local dir="$1" sanitizers="$2"
  shift 2
  mkdir -p "$dir"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRAINDECK_CUDA=OFF \
    -DTRAINDECK_SANITIZE="$sanitizers" "${launcher[@]}" "$@" > "$dir/configure.log" ||
    { cat "$dir/configure.log"; exit 1; }
}

export QT_QPA_PLATFORM=offscreen
status=0

if [ "$mode" = asan ] || [ "$mode" = all ]; then
  start=$SECONDS
  # -O1: GCC 12 compiles UBSan's null and alignment checks slowly at -O3 (engine/train/trainer.cpp
  # 208 s at -O3, 136 s at -O2, 91 s at -O1 on a 2-core Zen 3), and the whole build at -O3 took
  # 55 minutes there. Every check stays on; the optimizer only does less around them.
  configure build-asan address,undefined -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG"
  cmake --build build-asan -j "$jobs"
  built=$SECONDS
  (
    cd build-asan
    export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:fast_unwind_on_malloc=0:detect_stack_use_after_return=1:check_initialization_order=1"
    export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
    ctest --output-on-failure --timeout 1800 -j "${TRAINDECK_TEST_JOBS:-1}" "$@"
  ) || status=1
  echo "sanitize.sh asan: build $((built - start)) s, tests $((SECONDS - built)) s"
fi

if [ "$mode" = tsan ] || [ "$mode" = all ]; then
  start=$SECONDS
  configure build-tsan thread
  cmake --build build-tsan -j "$jobs" --target "${tsan_tests[@]}"
  built=$SECONDS
  regex="^($(IFS='|'; echo "${tsan_tests[*]}"))\$"
  (
    cd build-tsan
    export TSAN_OPTIONS="suppressions=$supp/tsan.supp:halt_on_error=1:second_deadlock_stack=1:print_suppressions=0"
    ctest --output-on-failure --timeout 1800 -j "${TRAINDECK_TEST_JOBS:-1}" -R "$regex" "$@"
  ) || status=1
  echo "sanitize.sh tsan: build $((built - start)) s, tests $((SECONDS - built)) s"
fi
exit $status
