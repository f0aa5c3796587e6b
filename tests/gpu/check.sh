#!/usr/bin/env bash
# The device check for a lent GPU machine, in two halves, because that machine has the CUDA
# toolkit, CMake, ninja and PyTorch (with its cuBLAS, cuDNN and NCCL) but none of the Debian
# packages TrainDeck builds with (Qt, oneDNN, SQLite, nlohmann-json, CLI11) and no network:
#
#   tests/gpu/check.sh --bundle    here (Debian 12 with the CUDA toolkit): builds the engine, its
#                                  test executables and traindeck_bench with the CUDA backend on
#                                  and the GUI off into build-gpu/, and packs them with every
#                                  shared library they need that is not glibc or CUDA, plus
#                                  Fashion-MNIST, into build-gpu-bundle/traindeck-gpu-bundle.tar.xz
#   tests/gpu/check.sh [--run]     there, from the root of a copy of the working tree with the
#                                  archive carried along (the device tool's carry:
#                                  build-gpu-bundle/traindeck-gpu-bundle.tar.xz, about 55 MiB, with
#                                  the tree's 4 MiB under its 64 MiB): unpacks the bundle, points the
#                                  loader at it and at the machine's CUDA libraries (the toolkit's
#                                  and those in PyTorch's environment), and runs, in under 8
#                                  minutes: `traindeck devices` against nvidia-smi, every non-GUI
#                                  test (CTest -LE 'gui|bundle'), the benchmark beside PyTorch when
#                                  it is importable, then prints one summary. With a GPU listed,
#                                  the benchmark is the GPU figures: the seed MLP (batch 256) and
#                                  784-4096-4096-10 (batch 1024) on cuda:0 in f32, mixed_bfloat16
#                                  and f32 without CUDA Graph replay, beside PyTorch on the GPU
#                                  (eager, torch.compile, each in f32 and bf16 autocast), then
#                                  traindeck_bench_cuda_matmul: cuBLASLt's own rate at the large
#                                  MLP's step products and the share of it the trainer reached,
#                                  and test_backend_ops under compute-sanitizer's memcheck.
#                                  Outputs go to $OUT when set, else build-gpu-bundle/out/ (at most
#                                  8 files).
#   tests/gpu/check.sh --verify    here: unpacks the bundle into a temporary folder and proves
#                                  what can be proven without a GPU: every dependency of every
#                                  executable resolves inside the bundle (or is glibc or a CUDA
#                                  library), `traindeck devices` started from the bundle with
#                                  LD_LIBRARY_PATH set to the bundle alone lists cpu:0 and no
#                                  cuda: device, and an engine test executable passes from it.
#                                  Exit 77 (skip) without the CUDA toolkit.
#
# The build tree's paths are absolute (CTest files, the source folder compiled into the tests), so
# the bundle records the folder it was built in; --run makes that path lead to the copy of the
# working tree (a symbolic link when the copy lives elsewhere) and unpacks build-gpu/ inside it.
# The build sits one level under the root, as build/ does, and compiles the engine with the same
# command lines, so ccache serves it the main build's objects (with or without CCACHE_BASEDIR, as
# long as both builds see the same one).
#
# Environment: TRAINDECK_JOBS (build jobs, default nproc), TRAINDECK_GPU_BUNDLE (the archive),
# TRAINDECK_GPU_CTEST_SECONDS (cap for the test suite, default 300), TRAINDECK_GPU_CTEST_ARGS
# (more ctest options, e.g. "-R test_ops"), TRAINDECK_GPU_BENCH_SECONDS (cap for the benchmark,
# default 300 on a GPU, 100 on the CPU), TRAINDECK_GPU_BENCH_DEVICE (TrainDeck's device in the
# benchmark), TRAINDECK_GPU_BENCH_MODELS / TRAINDECK_GPU_BENCH_FRAMEWORKS (its --models and
# --frameworks), TRAINDECK_GPU_SANITIZE=0 (no memcheck run), TRAINDECK_GPU_SANITIZE_SECONDS (its
# cap, default 120), CUDA_HOME / CUDA_PATH (the toolkit on the GPU machine).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="$root/build-gpu"
bundle_dir="$root/build-gpu-bundle"
archive="${TRAINDECK_GPU_BUNDLE:-$bundle_dir/traindeck-gpu-bundle.tar.xz}"
fashion_dir="${TRAINDECK_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}"

say() { echo "check.sh: $*" >&2; }
die() { say "$*"; exit 1; }

# Libraries never bundled: glibc's (every Linux has them) and the CUDA libraries, which come from
# the GPU machine's toolkit, driver or PyTorch environment.
is_system_lib() {
  case "$1" in
    linux-vdso.so.* | ld-linux-x86-64.so.* | libc.so.* | libm.so.* | libpthread.so.* | \
      libdl.so.* | librt.so.* | libresolv.so.* | libutil.so.*) return 0 ;;
  esac
  return 1
}
is_cuda_lib() {
  case "$1" in
    libcuda.so.* | libcudart.so.* | libcublas.so.* | libcublasLt.so.* | libcudnn*.so.* | \
      libnccl.so.* | libnvrtc*.so.* | libnvJitLink.so.* | libnvidia-ml.so.*) return 0 ;;
  esac
  return 1
}
# libstdc++ and libgcc_s: bundled apart (compat/), used only where the machine's are older than
# what the binaries need; a newer system copy serves both them and PyTorch.
is_compat_lib() {
  case "$1" in libstdc++.so.* | libgcc_s.so.*) return 0 ;; esac
  return 1
}
is_elf() { [ -f "$1" ] && [ "$(head -c 4 "$1" 2>/dev/null | od -An -c | tr -d ' ')" = '177ELF' ]; }

# ------------------------------------------------------------------------------------------------
bundle() {
  command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
    die "--bundle needs the CUDA toolkit (nvcc not found)"
  local jobs="${TRAINDECK_JOBS:-$(nproc)}"
  local launcher=()
  source "$root/installer/ccache_env.sh"
  if [ ${#launcher[@]} -gt 0 ]; then launcher+=(-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache); fi
  local start=$SECONDS
  mkdir -p "$bundle_dir"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRAINDECK_CUDA=ON \
    -DTRAINDECK_BUILD_GUI=OFF -DTRAINDECK_MPI=OFF -DTRAINDECK_NATIVE=OFF "${launcher[@]}" \
    >"$bundle_dir/configure.log" 2>&1 || { cat "$bundle_dir/configure.log" >&2; die "configure failed"; }
  cmake --build "$build" -j "$jobs" >"$bundle_dir/build.log" 2>&1 ||
    { tail -n 40 "$bundle_dir/build.log" >&2; die "the build failed (build-gpu-bundle/build.log)"; }
  local built=$SECONDS

  # Only the archive (and these logs) stays in the folder that travels: no unpacked runtime or
  # outputs of an earlier --run.
  local stage="$bundle_dir/stage"
  rm -rf "$stage" "$bundle_dir/runtime" "$bundle_dir/out" "$bundle_dir/python-clean"
  mkdir -p "$stage/build-gpu" "$stage/build-gpu-bundle/runtime/lib" \
    "$stage/build-gpu-bundle/runtime/compat" "$stage/build-gpu-bundle/runtime/fashion-mnist"
  local rt="$stage/build-gpu-bundle/runtime"
  # The build tree's executables and CTest files, at the same places. The executables are
  # stripped, except traindeck: CTest portable_binary attributes its AVX code by function name.
  local elves=()
  while IFS= read -r -d '' f; do
    local rel="${f#"$build"/}"
    case "$rel" in CMakeFiles/* | */CMakeFiles/*) continue ;; esac
    if [[ "$rel" == *CTestTestfile.cmake ]]; then
      mkdir -p "$stage/build-gpu/$(dirname "$rel")"
      cp -p "$f" "$stage/build-gpu/$rel"
    elif [ -x "$f" ] && is_elf "$f"; then
      mkdir -p "$stage/build-gpu/$(dirname "$rel")"
      if [ "$rel" = traindeck ]; then cp -p "$f" "$stage/build-gpu/$rel"
      else strip --strip-unneeded -o "$stage/build-gpu/$rel" "$f"; fi
      elves+=("$stage/build-gpu/$rel")
    fi
  done < <(find "$build" -type f \( -name CTestTestfile.cmake -o -perm -u+x \) -print0)
  [ ${#elves[@]} -gt 0 ] || die "no executables in $build"
  # Their shared libraries: everything ldd resolves that is neither glibc nor CUDA.
  local libs
  libs=$(for e in "${elves[@]}"; do ldd "$e"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
    sort -u)
  while read -r name path; do
    [ -n "$name" ] || continue
    if is_system_lib "$name" || is_cuda_lib "$name"; then continue; fi
    if is_compat_lib "$name"; then cp -L "$path" "$rt/compat/$name"; else cp -L "$path" "$rt/lib/$name"; fi
  done <<<"$libs"
  # Libraries that bundled libraries load at run time: oneDNN's GPU runtime is OpenCL (its ICD
  # loader is linked, found above); nothing else is dlopen'ed outside CUDA.
  for f in "$rt"/lib/*; do strip --strip-unneeded "$f" 2>/dev/null || true; done
  # The data the suite and the benchmark read (the Debian package dataset-fashion-mnist), inflated:
  # xz packs the raw images 4 MB smaller than their gzip files; --run compresses them back.
  if [ -f "$fashion_dir/train-images-idx3-ubyte.gz" ]; then
    for f in "$fashion_dir"/*-ubyte.gz; do
      gzip -dc "$f" >"$rt/fashion-mnist/$(basename "$f" .gz)"
    done
  else
    say "warning: $fashion_dir is missing: the bundle has no Fashion-MNIST (its tests will skip)"
  fi
  {
    echo "root=$root"
    echo "build=$build"
    echo "commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(
      git -C "$root" diff --quiet HEAD 2>/dev/null || echo +changes)"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "cmake=$(sed -n 's/^CMAKE_COMMAND:INTERNAL=//p' "$build/CMakeCache.txt")"
    echo "cuda=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
    echo "glibcxx=$(for e in "${elves[@]}"; do objdump -T "$e"; done 2>/dev/null |
      grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -n1)"
    echo "glibc=$(for e in "${elves[@]}" "$rt"/lib/*; do objdump -T "$e"; done 2>/dev/null |
      grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n1)"
  } >"$rt/manifest"
  rm -f "$archive"
  mkdir -p "$(dirname "$archive")"
  # One solid xz stream (one thread: blocks would split it) with a dictionary that spans several
  # executables, which share most of their code. About 1.5 GB of memory while packing.
  (cd "$stage" && tar --sort=name -cf - build-gpu build-gpu-bundle) |
    xz -T1 --lzma2=preset=6,dict=128MiB >"$archive.tmp"
  mv "$archive.tmp" "$archive"
  local nlibs
  nlibs=$(find "$rt/lib" "$rt/compat" -type f | wc -l)
  rm -rf "$stage"
  echo "bundle: $archive ($(du -h "$archive" | cut -f1); ${#elves[@]} executables, $nlibs" \
    "libraries; build $((built - start)) s, pack $((SECONDS - built)) s)"
}

# Unpacks the archive's runtime part (and, with a second argument, the build tree) into $1.
unpack() {
  local dest="$1" what=(build-gpu-bundle/runtime)
  [ "${2:-}" = all ] && what+=(build-gpu)
  [ -f "$archive" ] || die "no bundle at $archive (make it with tests/gpu/check.sh --bundle)"
  mkdir -p "$dest"
  if command -v xz >/dev/null; then
    xz -dc "$archive" | tar -xf - -C "$dest" "${what[@]}"
  else  # Python's tarfile reads xz without the xz tool.
    python3 - "$archive" "$dest" "${what[@]}" <<'PY'
import sys, tarfile
archive, dest, prefixes = sys.argv[1], sys.argv[2], sys.argv[3:]
with tarfile.open(archive, "r:xz") as t:
    t.extractall(dest, members=[m for m in t if any(m.name == p or m.name.startswith(p + "/") for p in prefixes)])
PY
  fi
}

# Folders holding the GPU machine's CUDA libraries: the toolkit's, then PyTorch's environment
# (site-packages/nvidia/*/lib, torch/lib).
cuda_lib_dirs() {
  local d sub py
  # /usr/local/nvidia: where container images mount the driver (libcuda.so.1).
  for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-* /usr/local/nvidia; do
    [ -n "$d" ] || continue
    for sub in lib64 lib targets/x86_64-linux/lib; do
      if [ -d "$d/$sub" ]; then echo "$d/$sub"; fi
    done
  done
  for py in python3 python; do
    command -v "$py" >/dev/null || continue
    "$py" - <<'PY' 2>/dev/null && break
import glob, importlib.util, os, site
roots = set(site.getsitepackages() + [site.getusersitepackages()])
for name in ("nvidia", "torch"):
    try:
        spec = importlib.util.find_spec(name)
    except Exception:
        spec = None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        roots.add(os.path.dirname(loc))
for r in sorted(roots):
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib"))) + [os.path.join(r, "torch", "lib")]:
        if os.path.isdir(d):
            print(d)
PY
  done
}

join_path() { local IFS=:; echo "$*"; }

# ------------------------------------------------------------------------------------------------
verify() {
  if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    echo "SKIP: the CUDA toolkit is not installed (nvcc not found): no GPU bundle to verify"
    exit 77
  fi
  # TRAINDECK_GPU_REBUNDLE=1 (CTest gpu_bundle): rebuild first, so the check sees this tree.
  if [ "${TRAINDECK_GPU_REBUNDLE:-0}" = 1 ] || [ ! -f "$archive" ]; then bundle; fi
  local tmp
  tmp="$(mktemp -d)"
  # shellcheck disable=SC2064  # the folder's name now: the local is gone when the trap runs
  trap "rm -rf '$tmp'" EXIT
  unpack "$tmp" all
  local rt="$tmp/build-gpu-bundle/runtime" fail=0
  # 1. Every dependency resolves inside the bundle, or is glibc / CUDA / libstdc++ (compat).
  local bad
  bad=$(find "$tmp/build-gpu" "$rt/lib" -type f | while read -r f; do
    is_elf "$f" || continue
    LD_LIBRARY_PATH="$rt/lib:$rt/compat" ldd "$f" 2>&1 | while read -r name arrow path _; do
      [ "$arrow" = "=>" ] || continue
      if is_system_lib "$name" || is_cuda_lib "$name"; then continue; fi
      case "$path" in "$rt"/lib/* | "$rt"/compat/*) ;; *) echo "${f#"$tmp"/}: $name => $path" ;; esac
    done
  done)
  if [ -n "$bad" ]; then
    echo "FAIL: dependencies outside the bundle:"; echo "$bad"; fail=1
  else
    echo "ok: every dependency of the bundle's executables and libraries resolves inside it (or is glibc or CUDA)"
  fi
  # 2. traindeck devices, with the loader pointed at the bundle only.
  local out
  if out=$(env -i PATH=/usr/bin:/bin HOME="$tmp" LD_LIBRARY_PATH="$rt/lib:$rt/compat" \
      "$tmp/build-gpu/traindeck" devices 2>&1); then
    echo "$out" | sed 's/^/  /'
    if ! grep -q '^cpu:0 ' <<<"$out"; then echo "FAIL: traindeck devices lists no cpu:0"; fail=1; fi
    if grep -q '^cuda:' <<<"$out" && [ ! -e /dev/nvidiactl ]; then
      echo "FAIL: traindeck devices lists a cuda: device on a machine without a GPU driver"; fail=1
    fi
    [ "$fail" = 0 ] && echo "ok: traindeck devices from the bundle lists cpu:0 and no cuda: device"
  else
    echo "FAIL: traindeck devices from the bundle: $out"; fail=1
  fi
  # 3. An engine test executable and the NVRTC test from the bundle.
  local t cuda_dirs=()
  mapfile -t cuda_dirs < <(cuda_lib_dirs | awk '!seen[$0]++')
  for t in test_model test_nvrtc; do
    if out=$(cd "$tmp" && env -i PATH=/usr/bin:/bin HOME="$tmp" QT_QPA_PLATFORM=offscreen \
        LD_LIBRARY_PATH="$rt/lib:$rt/compat:$(join_path "${cuda_dirs[@]}")" \
        "$tmp/build-gpu/tests/$t" 2>&1); then
      echo "ok: $t from the bundle passes ($(tail -n 1 <<<"$out"))"
    else
      echo "FAIL: $t from the bundle:"; tail -n 20 <<<"$out"; fail=1
    fi
  done
  echo "bundle: $(du -h "$archive" | cut -f1) ($archive)"
  return $fail
}

# ------------------------------------------------------------------------------------------------
run() {
  local out="${OUT:-$bundle_dir/out}"
  mkdir -p "$out"
  local log="$out/run.log"
  exec > >(tee "$log") 2>&1
  local t0=$SECONDS
  [ -f "$archive" ] || die "no bundle at $archive: build it on the Debian machine with tests/gpu/check.sh --bundle and carry build-gpu-bundle/ along"
  local rt="$bundle_dir/runtime"
  rm -rf "$rt"
  unpack "$root" # the runtime part first: the manifest says where the build belongs
  local built_root
  built_root=$(sed -n 's/^root=//p' "$rt/manifest")
  echo "bundle: $(sed -n 's/^commit=//p' "$rt/manifest"), built $(sed -n 's/^built=//p' "$rt/manifest") with CUDA $(sed -n 's/^cuda=//p' "$rt/manifest")"
  # The build tree's absolute paths must lead here.
  if [ "$(cd "$built_root" 2>/dev/null && pwd -P)" != "$(pwd -P)" ] &&
     [ "$(cd "$built_root" 2>/dev/null && pwd -P)" != "$(cd "$root" && pwd -P)" ]; then
    if [ -e "$built_root" ] || [ -L "$built_root" ]; then
      die "the bundle was built in $built_root, which exists here and is not this tree ($root); move it aside"
    fi
    mkdir -p "$(dirname "$built_root")" && ln -s "$root" "$built_root" ||
      die "cannot link $built_root to $root (the bundle's paths need it)"
    echo "linked $built_root -> $root"
  fi
  rm -rf "$build"
  unpack "$root" all
  # CTest entries that run `cmake -P` name the build machine's cmake: point them at this one's.
  local built_cmake here_cmake
  built_cmake=$(sed -n 's/^cmake=//p' "$rt/manifest")
  here_cmake=$(command -v cmake || true)
  if [ -n "$built_cmake" ] && [ -n "$here_cmake" ] && [ "$built_cmake" != "$here_cmake" ]; then
    find "$build" -name CTestTestfile.cmake -exec sed -i "s|\"$built_cmake\"|\"$here_cmake\"|g" {} +
  fi

  # The loader: the bundle, then the machine's CUDA libraries; libstdc++ from the bundle only
  # when the machine's is older than the binaries need.
  local cuda_list=() cuda_dirs
  mapfile -t cuda_list < <(cuda_lib_dirs | awk '!seen[$0]++')
  cuda_dirs=$(join_path "${cuda_list[@]}")
  local need_cxx
  need_cxx=$(sed -n 's/^glibcxx=//p' "$rt/manifest")
  local ldp="$rt/lib"
  if [ -n "$need_cxx" ] && ! { ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 /{print $NF}' |
      head -n1 | xargs -r grep -qa "$need_cxx"; }; then
    ldp="$ldp:$rt/compat"
    echo "the machine's libstdc++ lacks $need_cxx: using the bundle's"
  fi
  export LD_LIBRARY_PATH="$ldp${cuda_dirs:+:$cuda_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "CUDA libraries from: ${cuda_dirs:-(none found)}"
  local need_glibc have_glibc
  need_glibc=$(sed -n 's/^glibc=GLIBC_//p' "$rt/manifest")
  have_glibc=$(ldd --version 2>/dev/null | head -n1 | grep -o '[0-9][0-9.]*$' || true)
  if [ -n "$need_glibc" ] && [ -n "$have_glibc" ] &&
     [ "$(printf '%s\n%s\n' "$need_glibc" "$have_glibc" | sort -V | head -n1)" != "$need_glibc" ]; then
    echo "warning: the bundle needs glibc $need_glibc, this machine has $have_glibc"
  fi
  local missing
  missing=$(ldd "$build/traindeck" "$build/tests/test_training" 2>&1 | grep 'not found' | sort -u || true)
  [ -z "$missing" ] || echo "warning: unresolved libraries: $missing"

  # Fashion-MNIST where the tests look for it: the Debian package's folder (made when this user
  # may), else through TRAINDECK_FASHION_MNIST_DIR (tests that read the fixed folder then skip).
  local deb_fashion=/usr/share/datasets/fashion-mnist
  if [ ! -f "$deb_fashion/train-images-idx3-ubyte.gz" ] &&
     [ -f "$rt/fashion-mnist/train-images-idx3-ubyte" ]; then
    local dest="$deb_fashion"
    mkdir -p "$dest" 2>/dev/null && [ -w "$dest" ] || dest="$rt/fashion-mnist"
    for f in "$rt"/fashion-mnist/*-ubyte; do
      if command -v gzip >/dev/null; then gzip -1 -c "$f" >"$dest/$(basename "$f").gz"
      else python3 -c 'import gzip, shutil, sys; shutil.copyfileobj(open(sys.argv[1], "rb"), gzip.open(sys.argv[2], "wb", 1))' "$f" "$dest/$(basename "$f").gz"
      fi
    done
    if [ "$dest" = "$deb_fashion" ]; then
      echo "Fashion-MNIST installed to $deb_fashion from the bundle"
    else
      export TRAINDECK_FASHION_MNIST_DIR="$dest"
      echo "Fashion-MNIST from the bundle through TRAINDECK_FASHION_MNIST_DIR=$dest"
    fi
  fi

  local status=0 summary=()
  # 1. The GPUs: the driver's list against the engine's.
  local want=0
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,compute_cap,memory.total,memory.free,driver_version --format=csv |
      tee "$out/gpus.txt" || true
    want=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  else
    echo "nvidia-smi not found" | tee "$out/gpus.txt"
  fi
  "$build/traindeck" devices | tee "$out/devices.txt" || { status=1; summary+=("FAIL traindeck devices exited with an error"); }
  # One file for both lists ($OUT brings back at most 8 files).
  { echo "-- nvidia-smi:"; cat "$out/gpus.txt"; echo "-- traindeck devices:"; cat "$out/devices.txt"; } >"$out/devices.tmp"
  mv "$out/devices.tmp" "$out/devices.txt"; rm -f "$out/gpus.txt"
  local have
  have=$(grep -c '^cuda:' "$out/devices.txt" || true)
  local driver_cuda
  driver_cuda=$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | grep -o '[0-9.]*$' || true)
  if [ "$want" = "$have" ]; then
    summary+=("ok   devices: the driver reports $want GPU(s), the engine lists $have")
  else
    status=1
    summary+=("FAIL devices: the driver reports $want GPU(s), the engine lists $have (the driver supports CUDA ${driver_cuda:-?}; the bundle's runtime is CUDA $(sed -n 's/^cuda=//p' "$rt/manifest"), which needs a driver that supports it)")
  fi

  # 2. The whole non-GUI suite (test_cli compares the engine's GPUs with the driver's count too).
  [ "$want" -gt 0 ] && export TRAINDECK_EXPECT_GPUS="$want"
  local cap="${TRAINDECK_GPU_CTEST_SECONDS:-300}"
  local jobs
  jobs=$(( $(nproc) / 2 )); [ "$jobs" -ge 1 ] || jobs=1
  local rc=0
  # -LE: the GUI suites are not built; the bundle's own check (label bundle) builds on Debian.
  local junit=()
  ctest --help 2>/dev/null | grep -q -- --output-junit && junit=(--output-junit "$out/ctest-junit.xml")
  # TRAINDECK_GPU_CTEST_ARGS: more ctest options, e.g. "-R test_ops|test_graph" for a quick look.
  # shellcheck disable=SC2086
  (cd "$build" && timeout "$cap" ctest -LE 'gui|bundle' -j "$jobs" --timeout 240 \
     --output-on-failure "${junit[@]}" ${TRAINDECK_GPU_CTEST_ARGS:-} >"$out/ctest.txt" 2>&1) ||
    rc=$?
  tail -n 25 "$out/ctest.txt"
  local line
  line=$(grep -E 'tests passed|tests failed' "$out/ctest.txt" | tail -n1 || true)
  if [ "$rc" = 0 ]; then
    summary+=("ok   ctest (all non-GUI tests): ${line:-no summary line}")
  elif [ "$rc" = 124 ]; then
    status=1; summary+=("FAIL ctest (all non-GUI tests): stopped after ${cap} s (${line:-no summary})")
  else
    status=1
    summary+=("FAIL ctest (all non-GUI tests): $line:$(sed -n '/tests FAILED:/,$p' "$out/ctest.txt" |
      grep -E '^\s+[0-9]+ - ' | tr -s ' \t' ' ' | tr '\n' ';')")
  fi
  local skipped
  skipped=$(grep -E '^ *[0-9]+/[0-9]+ Test +#' "$out/ctest.txt" | grep -c 'Skipped\|Not Run' || true)
  summary+=("     skipped: $skipped test(s), each with its reason in ctest.txt")

  # 3. The benchmark beside PyTorch, with whatever is there, within a time cap. PyTorch runs with
  # the loader as it was before (its own libraries), not with the bundle's.
  local bcap="${TRAINDECK_GPU_BENCH_SECONDS:-}" py="" frameworks=none torch_gpu=0
  for p in python3 python; do
    if command -v "$p" >/dev/null && "$p" -c 'import torch, numpy' 2>/dev/null; then py=$(command -v "$p"); break; fi
  done
  local wrapper="$bundle_dir/python-clean"
  if [ -n "$py" ]; then
    frameworks=torch
    printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "${ORIG_LD_LIBRARY_PATH:-}" "$py" >"$wrapper"
    chmod +x "$wrapper"
    "$wrapper" -c 'import torch; print("PyTorch", torch.__version__, "CUDA", torch.version.cuda, "GPUs", torch.cuda.device_count())' || true
    if "$wrapper" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
      torch_gpu=1
    fi
  fi
  # TrainDeck on the first GPU when the engine lists one, else on the CPU;
  # TRAINDECK_GPU_BENCH_DEVICE chooses. On a GPU: the issue's figures, the seed MLP at batch 256
  # and the 784-4096-4096-10 MLP at batch 1024, each in f32, mixed_bfloat16 and f32 without CUDA
  # Graph replay, beside PyTorch on the same GPU (eager and torch.compile, f32 and bf16 autocast).
  local bdev="${TRAINDECK_GPU_BENCH_DEVICE:-}"
  if [ -z "$bdev" ]; then bdev=cpu:0; [ "$have" -gt 0 ] && bdev=cuda:0; fi
  local models=seed-256 variants=f32 epochs=2
  if [ "${bdev%%:*}" = cuda ]; then
    models=seed-256,large-1024 variants=f32,bf16,nograph epochs=5
    [ "$torch_gpu" = 1 ] && frameworks=torch-cuda,torch-compile-cuda,torch-bf16-cuda,torch-compile-bf16-cuda
    bcap="${bcap:-300}"
  else
    [ "$torch_gpu" = 1 ] && frameworks=torch,torch-cuda
    bcap="${bcap:-100}"
  fi
  models="${TRAINDECK_GPU_BENCH_MODELS:-$models}"
  frameworks="${TRAINDECK_GPU_BENCH_FRAMEWORKS:-$frameworks}"
  rc=0
  timeout "$bcap" "$build/traindeck_bench" --frameworks "$frameworks" --models "$models" \
    --epochs "$epochs" --variants "$variants" \
    --threads "$(( $(nproc) < 8 ? $(nproc) : 8 ))" --device "$bdev" ${py:+--python "$wrapper"} \
    --json "$out/bench.json" >"$out/bench.txt" 2>&1 || rc=$?
  cat "$out/bench.txt"
  if [ "$rc" = 0 ]; then
    summary+=("ok   benchmark (TrainDeck on $bdev; references: $frameworks):")
  else
    summary+=("warn benchmark (TrainDeck on $bdev; references: $frameworks) exited $rc$([ "$rc" = 124 ] && echo " (time cap ${bcap} s)"):")
  fi
  while IFS= read -r line; do summary+=("     $line"); done < <(grep -A80 '^model ' "$out/bench.txt")

  # 4. On a GPU: cuBLASLt's own rate at the large MLP's step products, and the share of it the
  # trainer reached (its f32 and bf16 rates from the benchmark's JSON).
  if [ "${bdev%%:*}" = cuda ] && [ -x "$build/traindeck_bench_cuda_matmul" ]; then
    local rates=""
    if [ -n "$py" ] && [ -f "$out/bench.json" ]; then
      rates=$("$wrapper" - "$out/bench.json" <<'PY' 2>/dev/null || true
import json, sys
rows = [r for r in json.load(open(sys.argv[1])) if r["model"].startswith("784-4096-4096-10")]
v = {x["variant"]: x["samples_per_s"] for x in (rows[0]["variants"] if rows else []) if x["ok"]}
print(",".join(str(round(v.get(k, 0))) for k in ("f32", "bf16")))
PY
)
    fi
    rc=0
    timeout 60 "$build/traindeck_bench_cuda_matmul" --layers 784,4096,4096,10 --batch 1024 \
      --dtypes f32,bf16 --device "${bdev#cuda:}" ${rates:+--trainer-samples-per-s "$rates"} \
      >"$out/matmul.txt" 2>&1 || rc=$?
    cat "$out/matmul.txt"
    if [ "$rc" = 0 ]; then summary+=("ok   cuBLASLt at the large MLP's products:")
    else summary+=("warn cuBLASLt matmul benchmark exited $rc:"); fi
    while IFS= read -r line; do summary+=("     $line"); done < <(grep -E '^(f32|bf16):|step.s products|trainer at' "$out/matmul.txt")
  fi

  # 5. On a GPU, when the toolkit has compute-sanitizer: the CUDA device's tests under its memory
  # checker (out-of-bounds and misaligned accesses, invalid frees), within a time cap; its verdict
  # goes to the summary, its findings to run.log. API errors are not reported: the device checks
  # every call's status itself, and NCCL probes for kernels that its build for other GPUs lacks
  # (cudaErrorNoKernelImageForDevice from cudaFuncGetAttributes inside ncclCommInitAll).
  local sanitizer
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n1 || true)
  if [ "$have" -gt 0 ] && [ -n "$sanitizer" ] && [ "${TRAINDECK_GPU_SANITIZE:-1}" = 1 ]; then
    local scap="${TRAINDECK_GPU_SANITIZE_SECONDS:-120}" srep="$bundle_dir/sanitize.txt"
    rc=0
    (cd "$root" && timeout "$scap" "$sanitizer" --tool memcheck --report-api-errors no --error-exitcode 3 \
       "$build/tests/test_backend_ops" >"$srep" 2>&1) || rc=$?
    grep -E '^(FAIL|=========)' "$srep" | head -n 60 || true
    tail -n 3 "$srep"
    line=$(grep -o 'ERROR SUMMARY: [0-9]* error[s]*' "$srep" | tail -n1 || true)
    if [ "$rc" = 0 ]; then
      summary+=("ok   compute-sanitizer memcheck on test_backend_ops: ${line:-no summary}")
    elif [ "$rc" = 124 ]; then
      summary+=("warn compute-sanitizer memcheck on test_backend_ops: stopped after ${scap} s (${line:-no summary yet}; $(grep -c '^ok ' "$srep" || true) cases passed before)")
    else
      status=1
      summary+=("FAIL compute-sanitizer memcheck on test_backend_ops exited $rc: ${line:-see run.log}")
    fi
  fi

  {
    echo "== TrainDeck GPU check: $(date -u +%Y-%m-%dT%H:%M:%SZ), $((SECONDS - t0)) s =="
    echo "bundle $(sed -n 's/^commit=//p' "$rt/manifest"), CUDA $(sed -n 's/^cuda=//p' "$rt/manifest")"
    grep -E '^cuda:' "$out/devices.txt" || echo "(no cuda: device listed)"
    printf '%s\n' "${summary[@]}"
    echo "result: $([ "$status" = 0 ] && echo PASS || echo FAIL)"
  } | tee "$out/summary.txt"
  return $status
}

ORIG_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
case "${1:---run}" in
  --bundle) bundle ;;
  --verify) verify ;;
  --run) run ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
  *) die "unknown option $1 (expected --bundle, --run or --verify)" ;;
esac
