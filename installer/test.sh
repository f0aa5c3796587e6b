#!/usr/bin/env bash
# Sets up everything the tests need, builds, and runs the whole suite (unit, integration and
# offscreen GUI tests) with CTest.
#   installer/test.sh [ctest options, e.g. -L unit]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/installer/deps.sh" --test
# onnx, onnxruntime and Keras for the export interop tests; without them those tests report SKIP.
"$root/installer/pyenv.sh" >/dev/null || echo "test.sh: the interop environment could not be installed; its tests will SKIP" >&2
"$root/installer/build.sh"
cd "$root/build"
export QT_QPA_PLATFORM=offscreen
ctest --output-on-failure --timeout 900 -j "${TRAINDECK_TEST_JOBS:-1}" "$@"
