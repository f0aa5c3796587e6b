#!/usr/bin/env bash
# Sets up everything the tests need, builds, and runs the whole suite (unit, integration and
# offscreen GUI tests) with CTest.
#   installer/test.sh [ctest options, e.g. -L unit]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/installer/deps.sh" --test
"$root/installer/build.sh"
cd "$root/build"
export QT_QPA_PLATFORM=offscreen
ctest --output-on-failure --timeout 900 -j "${TRAINDECK_TEST_JOBS:-1}" "$@"
