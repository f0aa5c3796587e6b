#!/usr/bin/env bash
# Configures and builds TrainDeck (Release, warnings on) into build/.
#   installer/build.sh [extra cmake -D options]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
jobs="${TRAINDECK_JOBS:-$(nproc)}"
# ccache when installed: rebuilds, and the GPU bundle's build (tests/gpu/check.sh --bundle, CTest
# gpu_bundle), reuse these objects.
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@"
cmake --build build -j "$jobs"
