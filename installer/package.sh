#!/usr/bin/env bash
# Builds a Debian package (binary, desktop-app module, desktop entry, icon, example projects) with CPack.
#   installer/package.sh [BUILD_DIR]      -> BUILD_DIR/traindeck_<version>_<arch>.deb
# The package is built for any x86-64 CPU (TRAINDECK_NATIVE off, even in a build directory that
# was configured with it on) and checked: AVX code only in the kernels chosen at run time, and,
# with qemu-user installed, the binary runs on an emulated CPU without AVX.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
jobs="${TRAINDECK_JOBS:-$(nproc)}"
generator=()
[ -f "$build/CMakeCache.txt" ] || generator=(-G Ninja)
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_INSTALL_PREFIX=/usr -DTRAINDECK_NATIVE=OFF
cmake --build "$build" --target traindeck -j "$jobs"
if [ "$(uname -m)" = x86_64 ]; then
  rc=0
  "$root/tests/portable/check_portable.sh" "$build/traindeck" "$root" || rc=$?
  if [ "$rc" != 0 ] && [ "$rc" != 77 ]; then
    echo "package.sh: $build/traindeck would not run on every x86-64 CPU" >&2; exit 1
  fi
fi
(cd "$build" && cpack -G DEB -D CPACK_PACKAGING_INSTALL_PREFIX=/usr)
deb="$(ls -t "$build"/traindeck_*.deb | head -n1)"
echo "$deb"
contents="$(dpkg-deb --contents "$deb")"
for want in 'bin/traindeck$' 'lib/.*/traindeck/libtraindeck_gui\.so$' 'applications/traindeck\.desktop$' \
            'icons/.*/traindeck\.svg$' 'projects/fashion_mnist_mlp\.json$'; do
  grep -qE "$want" <<<"$contents" || {
    echo "package.sh: the package lacks $want" >&2; exit 1; }
done
