#!/usr/bin/env bash
# The device check, for a machine with NVIDIA GPUs: builds with the CUDA backend forced on, runs
# the whole test suite there, and reports what the engine detects. One short script, so a lent GPU
# machine's time goes to checking rather than typing.
#   tests/gpu/check.sh            (output under $OUT when set, else build-gpu/)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${OUT:-$root/build-gpu}"
mkdir -p "$out"
cd "$root"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpus.csv" || true
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRAINDECK_CUDA=ON \
  -DTRAINDECK_BUILD_GUI=OFF 2>&1 | tail -n 3
cmake --build build-gpu -j "$(nproc)" 2>&1 | tail -n 3
./build-gpu/traindeck devices | tee "$out/devices.txt"
# Every GPU the driver reports must be listed by the engine.
want=$(nvidia-smi -L 2>/dev/null | wc -l || echo 0)
have=$(grep -c '^cuda:' "$out/devices.txt" || true)
echo "driver reports $want GPU(s), engine lists $have"
[ "$want" = "$have" ] || { echo "check.sh: GPU count mismatch" >&2; exit 1; }
(cd build-gpu && QT_QPA_PLATFORM=offscreen ctest --output-on-failure -LE gui 2>&1 | tee "$out/ctest.txt" | tail -n 5)
