#!/usr/bin/env bash
# Rehearses the GPU machine's half of tests/gpu/check.sh here, without a GPU: a copy of the tree
# (tracked and untracked files that git does not ignore) with the bundle carried along, run in a
# private mount namespace where the folder the bundle was built in, the Debian Fashion-MNIST
# folder and the system's Open MPI are hidden, as on the lent machine: Open MPI's and PMIx's
# folders under empty tmpfs, its libraries, launcher and daemon under /dev/null (a process that
# reached for them fails), and mpirun and mpiexec gone from /etc/alternatives, so no mpirun is on
# PATH (the suite's MPI tests skip, as there). Needs root (unshare -m) and a bundle
# (tests/gpu/check.sh --bundle). Outputs in $OUT (default a temporary folder, printed).
#   tests/gpu/simulate_run.sh [extra ctest options, e.g. -R test_cli]
# PYTHON_BIN: a folder put first on PATH, e.g. a virtual environment's bin with PyTorch.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
archive="$root/build-gpu-bundle/traindeck-gpu-bundle.tar.xz"
[ -f "$archive" ] || { echo "simulate_run.sh: no bundle; run tests/gpu/check.sh --bundle" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "simulate_run.sh: needs root (a private mount namespace)" >&2; exit 77; }
copy="$(mktemp -d)"
out="${OUT:-$(mktemp -d)}"
trap 'rm -rf "$copy"' EXIT
(cd "$root" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | tar -xf - -C "$copy"
mkdir -p "$copy/build-gpu-bundle"
cp "$archive" "$copy/build-gpu-bundle/"
built_root=$(xz -dc "$archive" | tar -xOf - build-gpu-bundle/runtime/manifest | sed -n 's/^root=//p')
hide="$(dirname "$built_root")"
case "$hide/" in
  / | "$copy"/* | "$out"/*) echo "simulate_run.sh: cannot hide $hide (the bundle's root $built_root)" >&2; exit 1 ;;
esac
case "$copy/" in "$hide"/*) echo "simulate_run.sh: the copy $copy lies under $hide" >&2; exit 1 ;; esac
export OUT="$out" TRAINDECK_GPU_CTEST_ARGS="$*"
[ -n "${PYTHON_BIN:-}" ] && export PATH="$PYTHON_BIN:$PATH"
unshare -m bash -c '
  set -e
  mount --make-rprivate /
  mount -t tmpfs tmpfs "$1"
  if [ -d /usr/share/datasets ]; then mount -t tmpfs tmpfs /usr/share/datasets; fi
  lib=/usr/lib/x86_64-linux-gnu
  for f in "$lib/libmpi.so.40" "$lib/libopen-pal.so.40" "$lib/libopen-rte.so.40" "$lib/libpmix.so.2" \
           /usr/bin/orterun /usr/bin/orted; do
    f=$(readlink -f "$f" || true)
    if [ -f "$f" ]; then mount --bind /dev/null "$f"; fi
  done
  for d in "$lib/openmpi" "$lib/pmix2" /usr/share/openmpi /etc/openmpi; do
    if [ -d "$d" ]; then mount -t tmpfs tmpfs "$d"; fi
  done
  if [ -e /etc/alternatives/mpirun ] || [ -L /etc/alternatives/mpirun ]; then
    alt=$(mktemp -d)
    cp -a /etc/alternatives/. "$alt"
    mount -t tmpfs tmpfs /etc/alternatives
    cp -a "$alt"/. /etc/alternatives
    rm -rf "$alt" /etc/alternatives/mpirun /etc/alternatives/mpiexec
  fi
  cd "$2" && tests/gpu/check.sh --run
' simulate "$hide" "$copy"
echo "outputs: $out"
