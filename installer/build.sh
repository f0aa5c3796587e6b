#!/usr/bin/env bash
# Configures and builds TrainDeck (Release, warnings on) into build/.
#   installer/build.sh [extra cmake -D options]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
jobs="${TRAINDECK_JOBS:-$(nproc)}"
# ccache when installed: rebuilds, the GPU bundle's build (tests/gpu/check.sh --bundle, CTest
# gpu_bundle) and other clones of the same commit reuse these objects (installer/ccache_env.sh).
launcher=()
source "$root/installer/ccache_env.sh"
# The CUDA sources too (CMake uses this only where it finds the toolkit).
if [ ${#launcher[@]} -gt 0 ] && { [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null; }; then
  launcher+=(-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@"
cmake --build build -j "$jobs"
