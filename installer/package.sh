#!/usr/bin/env bash
# Builds a Debian package (binary, desktop entry, icon, example projects) with CPack.
#   installer/package.sh [BUILD_DIR]      -> BUILD_DIR/traindeck_<version>_<arch>.deb
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
jobs="${TRAINDECK_JOBS:-$(nproc)}"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr
fi
cmake --build "$build" --target traindeck -j "$jobs"
(cd "$build" && cpack -G DEB -D CPACK_PACKAGING_INSTALL_PREFIX=/usr)
deb="$(ls -t "$build"/traindeck_*.deb | head -n1)"
echo "$deb"
dpkg-deb --contents "$deb" | grep -E 'bin/traindeck|applications/traindeck.desktop|icons/.*/traindeck.svg|projects/' || {
  echo "package.sh: the package lacks an expected file" >&2; exit 1; }
