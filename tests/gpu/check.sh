#!/usr/bin/env bash
# The device check for a lent GPU machine, in two halves, because that machine has the CUDA
# toolkit, CMake, ninja and PyTorch (with its cuBLAS, cuDNN and NCCL) but none of the Debian
# packages TrainDeck builds with (Qt, oneDNN, SQLite, nlohmann-json, CLI11) and no network:
#
#   tests/gpu/check.sh --bundle    here (Debian 12 with the CUDA toolkit): builds the engine, its
#                                  test executables and traindeck_bench with the CUDA backend and
#                                  MPI on and the GUI off into build-gpu/, and packs them with every
#                                  shared library they need that is not glibc or CUDA (HDF5's
#                                  network and crypto libraries as stubs: stub_hdf5_network), Open
#                                  MPI's launcher (mpirun, orted, the MCA and PMIx components with
#                                  their libraries, help texts and parameter file, under
#                                  runtime/openmpi/; what is left out and why: bundle_openmpi) and
#                                  Fashion-MNIST into build-gpu-bundle/traindeck-gpu-bundle.tar.xz
#   tests/gpu/check.sh [--run]     there, from the root of a copy of the working tree with the
#                                  archive carried along (the device tool's carry:
#                                  build-gpu-bundle/traindeck-gpu-bundle.tar.xz, about 57 MiB, with
#                                  the tree's 4 MiB under its 64 MiB): unpacks the bundle, points the
#                                  loader at it and at the machine's CUDA libraries (the toolkit's
#                                  and those in PyTorch's environment), and runs, in under 8
#                                  minutes: `traindeck devices` against nvidia-smi, every non-GUI
#                                  test (CTest -LE 'gui|bundle'; those that need mpirun on PATH
#                                  skip), on a GPU Mirrored with 2 replicas on cuda:0 and
#                                  MultiWorkerMirrored with 2 processes on cuda:0 started by the
#                                  bundle's mpirun (ompi_env), each against one device with the
#                                  same global batch (losses from the run stores; the summary says
#                                  which path the gradient sums took), the image-folder CNN's
#                                  samples/s and input-wait share per epoch on the GPU (PNG folders
#                                  written there first: input_share), the benchmark beside PyTorch
#                                  when it is importable, then prints one summary. With a GPU
#                                  listed, the benchmark is the GPU figures: the seed MLP (batch
#                                  256), 784-4096-4096-10 (batch 1024) and the CNN project's model
#                                  (batch 64; PyTorch channels-last) on cuda:0 in f32,
#                                  mixed_bfloat16 and f32 without CUDA Graph replay, beside PyTorch
#                                  on the GPU (eager, torch.compile, each in f32 and bf16
#                                  autocast; TrainDeck's bf16 also with the update after the backward
#                                  pass and with f32 convolutions), then
#                                  traindeck_bench_cuda_matmul: cuBLASLt's own rate at the large
#                                  MLP's step products and the share of it the trainer reached,
#                                  traindeck_bench_cuda_ops: pooling, BatchNormalization and the
#                                  convolutions against cuDNN's, the CNN's bf16 step kernel by
#                                  kernel (TRAINDECK_PROFILE=1; these three into kernels.txt), and
#                                  test_backend_ops under compute-sanitizer's memcheck.
#                                  Outputs go to $OUT when set, else build-gpu-bundle/out/ (at most
#                                  8 files).
#   tests/gpu/check.sh --verify    here: unpacks the bundle into a temporary folder and proves
#                                  what can be proven without a GPU: every dependency of every
#                                  executable, Open MPI's included, resolves inside the bundle (or
#                                  is glibc or a CUDA library), `traindeck devices` started from the
#                                  bundle with LD_LIBRARY_PATH set to the bundle alone lists cpu:0
#                                  and no cuda: device, an engine test executable, the NVRTC test
#                                  and the export test (HDF5) pass from it, and MultiWorkerMirrored
#                                  with 2 workers on the CPU, started by the bundle's mpirun with
#                                  nothing but the bundle in the environment, matches one process
#                                  step for step, with every Open MPI object of the launch from the
#                                  bundle (verify_mpi). Exit 77 (skip) without the CUDA toolkit.
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
# HDF5's network and crypto libraries. Debian's libhdf5 links libcurl and libcrypto for its
# read-only S3 driver (ROS3) alone (8 curl functions, 3 of libcrypto's), and with them come about
# 25 more libraries (TLS, Kerberos, LDAP, SSH, IDN, ...): 5 MB of the archive, which the device
# tool's 64 MiB cannot spare. Nothing the GPU machine runs reads HDF5 over S3, so where libhdf5 is
# their only user in the bundle each becomes a stub of the same name and symbol version whose
# functions return 0 (no curl handle, no digest: the S3 driver fails to open anything; HDF5 asks
# nothing of them otherwise), and the libraries only the real ones needed are left out.
# stub_hdf5_network RT ELF...: RT is the runtime folder, the ELFs the bundle's executables.
stub_hdf5_network() {
  local rt="$1"; shift
  local hdf5
  hdf5=$(find "$rt/lib" -name 'libhdf5*.so.*' -print -quit)
  [ -n "$hdf5" ] || return 0
  command -v cc >/dev/null || { say "no C compiler: HDF5's network libraries stay in the bundle"; return 0; }
  local tmp stubs lib ver syms f
  tmp=$(mktemp -d)
  stubs="$tmp/lib"
  mkdir -p "$stubs"
  # The version each of the two libraries gives libhdf5's symbols ("File: libcurl.so.4", then
  # "Name: CURL_OPENSSL_4" in its version needs).
  while read -r lib ver; do
    case "$lib" in libcurl.so.* | libcrypto.so.*) ;; *) continue ;; esac
    [ -f "$rt/lib/$lib" ] || continue
    syms=$(nm -D --undefined-only "$hdf5" | awk -v v="@$ver" '{ n = $NF } substr(n, length(n) - length(v) + 1) == v { print substr(n, 1, length(n) - length(v)) }')
    [ -n "$syms" ] || continue
    # shellcheck disable=SC2086  # one symbol a word
    { echo "$ver { global:"; printf '  %s;\n' $syms; echo "local: *; };"; } >"$tmp/$lib.map"
    # shellcheck disable=SC2086
    printf 'long %s(void) { return 0; }\n' $syms >"$tmp/$lib.c"
    cc -shared -fPIC -O1 -s -o "$stubs/$lib" -Wl,-soname,"$lib" -Wl,--version-script="$tmp/$lib.map" \
      "$tmp/$lib.c" || { say "could not build a stub $lib"; rm -f "$stubs/$lib"; }
  done < <(readelf -V -W "$hdf5" | awk '{ for (i = 1; i < NF; i++) {
      if ($i == "File:") f = $(i + 1); else if ($i == "Name:" && f != "") print f, $(i + 1) } }')
  # The bundle with the stubs: what its executables need now, and whether anything but libhdf5
  # still needs a stubbed library.
  local needed users=""
  needed=$(for f in "$@"; do LD_LIBRARY_PATH="$stubs:$rt/lib:$rt/compat" ldd "$f"; done 2>/dev/null |
    awk '$2 == "=>" && $3 ~ /^\// {print $1}' | sort -u)
  for f in "$stubs"/*; do
    [ -f "$f" ] || continue
    lib=$(basename "$f")
    for g in "$@" $(sed "s|^|$rt/lib/|" <<<"$needed"); do
      [ -f "$g" ] && [ "$g" != "$hdf5" ] && [ ! -e "$stubs/$(basename "$g")" ] || continue
      if readelf -d "$g" 2>/dev/null | grep -q "NEEDED.*\[$lib\]"; then users+=" $(basename "$g") needs $lib;"; fi
    done
  done
  if [ -n "$users" ] || [ -z "$(ls "$stubs")" ]; then
    say "HDF5's network libraries stay in the bundle:${users:- no stub built}"
  else
    cp "$stubs"/* "$rt/lib/"
    local dropped=()
    for f in "$rt"/lib/*; do
      grep -qx "$(basename "$f")" <<<"$needed" || { dropped+=("$(basename "$f")"); rm -f "$f"; }
    done
    say "HDF5's $(ls "$stubs" | tr '\n' ' ')stubbed; left out: ${dropped[*]}"
  fi
  rm -rf "$tmp"
}

# ------------------------------------------------------------------------------------------------
# Open MPI, for MultiWorkerMirrored between processes. The executables' ldd pass carries libmpi and
# what it links (libopen-pal, libopen-rte, hwloc, libevent) into runtime/lib; bundle_openmpi adds
# what a relocated mpirun needs besides, under runtime/openmpi/:
#   bin/            orterun (mpirun and mpiexec are links to it) and orted
#   lib/            the libraries the components need that runtime/lib lacks (PMIx, munge, ...)
#   lib/openmpi3/   the MCA components, stripped
#   lib/pmix/       PMIx's components (Debian builds Open MPI against its separate PMIx)
#   share/openmpi/, share/pmix/   the help texts
#   etc/            openmpi-mca-params.conf and openmpi-default-hostfile
# Components left out, and the libraries only they need:
#   - network fabrics: UCX (pml, osc, atomic, spml, sshmem ucx), libfabric (btl and mtl ofi),
#     verbs (btl openib), PSM and PSM2 (mtl psm, psm2): links between machines, with several MB of
#     libraries and plugins of their own. Workers on one machine talk through shared memory (btl
#     vader) and TCP, and Debian's openmpi-mca-params.conf turns most of them off anyway.
#   - OpenSHMEM's (atomic, memheap, scoll, spml, sshmem): they need liboshmem, which an MPI program
#     never loads.
#   - a component whose libraries do not resolve here (said while bundling).
# Debian's Open MPI has no CUDA-aware or Java components. PMIx's parameter file is not carried
# (it only names Debian's component folder), nor hwloc's plugins (PCI, OpenCL, GL, libxml2): the
# topology is the CPUs' alone, here as on the GPU machine, which has none of them.
ompi_left_out='lib(ucp|ucs|uct|ucm)\.so|libfabric\.so|libibverbs\.so|librdmacm\.so|libpsm|libinfinipath\.so|liboshmem\.so|libmca_common_(ucx|ofi|verbs)\.so'

# The environment that points the bundle's Open MPI (runtime/openmpi at $1) at itself, as NAME=VALUE
# lines for env. Debian's build derives its folders from the prefix (bindir ${prefix}/bin, libdir
# ${prefix}/lib/x86_64-linux-gnu/openmpi/lib, pkglibdir ${libdir}/openmpi3, pkgdatadir
# ${datadir}/openmpi with datadir ${prefix}/share; `ompi_info --path all`) except sysconfdir, which
# is /etc/openmpi; so OPAL_PREFIX, with libdir and sysconfdir named. Its PMIx has absolute folders:
# PMIX_LIBDIR gives its components (${libdir}/pmix), PMIX_DATADIR its help texts (${datadir}/pmix),
# PMIX_SYSCONFDIR keeps it from Debian's parameter file. hwloc gets a plugin folder that does not
# exist. OMPI_MCA_plm=isolated: the workers run on this machine alone, and ORTE's default launcher
# (plm rsh) refuses to start at all where there is no ssh or rsh, as on the GPU machine. mpirun
# hands the variables to the workers it starts.
ompi_env() {
  local p="$1"
  printf '%s\n' "OPAL_PREFIX=$p" "OPAL_LIBDIR=$p/lib" "OPAL_SYSCONFDIR=$p/etc" \
    "PMIX_LIBDIR=$p/lib" "PMIX_DATADIR=$p/share" "PMIX_SYSCONFDIR=$p/etc" \
    "HWLOC_PLUGINS_PATH=$p/lib/hwloc" "OMPI_MCA_plm=isolated"
}
# mpirun's options (TRAINDECK_MPIRUN_FLAGS of tests/distribute/mpi_launch.sh) that export those
# variables and the loader's path to the workers by name (set, all of them, wherever it is used).
ompi_pass_flags() {
  local v
  for v in LD_LIBRARY_PATH $(ompi_env . | cut -d= -f1); do printf -- '-x %s ' "$v"; done
}

bundle_openmpi() {
  local rt="$1" om="$1/openmpi"
  command -v ompi_info >/dev/null || die "an MPI build needs Open MPI's ompi_info (Debian: openmpi-bin)"
  local paths bindir pkglibdir pkgdatadir sysconfdir
  paths=$(ompi_info --parsable --path all)
  bindir=$(sed -n 's/^path:bindir://p' <<<"$paths" | head -n1)
  pkglibdir=$(sed -n 's/^path:pkglibdir://p' <<<"$paths" | head -n1)
  pkgdatadir=$(sed -n 's/^path:pkgdatadir://p' <<<"$paths" | head -n1)
  sysconfdir=$(sed -n 's/^path:sysconfdir://p' <<<"$paths" | head -n1)
  [ -d "$pkglibdir" ] || die "Open MPI's component folder $pkglibdir is missing"
  # mpirun: Debian's is /usr/bin/mpirun -> /etc/alternatives/mpirun -> mpirun.openmpi -> orterun.
  local launcher
  launcher=$(readlink -f "$(command -v mpirun || echo "$bindir/mpirun")")
  # The alternatives may lead to another MPI's mpirun (MPICH's); the engine links Open MPI's.
  if ! "$launcher" --version 2>&1 | grep -qE 'Open MPI|OpenRTE'; then launcher="$bindir/orterun"; fi
  [ -x "$launcher" ] && [ -x "$bindir/orted" ] || die "no mpirun or orted in $bindir (Debian: openmpi-bin)"
  mkdir -p "$om/bin" "$om/lib/openmpi3" "$om/lib/pmix" "$om/share" "$om/etc"
  strip --strip-unneeded -o "$om/bin/$(basename "$launcher")" "$launcher"
  strip --strip-unneeded -o "$om/bin/orted" "$bindir/orted"
  local name
  for name in mpirun mpiexec orterun; do
    [ -e "$om/bin/$name" ] || ln -s "$(basename "$launcher")" "$om/bin/$name"
  done
  local c deps left=()
  for c in "$pkglibdir"/*.so; do
    deps=$(ldd "$c" 2>&1)
    if grep -q 'not found' <<<"$deps" || grep -Eq "$ompi_left_out" <<<"$deps"; then
      left+=("$(basename "$c" .so)"); continue
    fi
    strip --strip-unneeded -o "$om/lib/openmpi3/$(basename "$c")" "$c"
  done
  # PMIx: its components and help texts beside its library (Debian: /usr/lib/x86_64-linux-gnu/pmix2).
  local pmix_lib
  pmix_lib=$(ldd "$om"/lib/openmpi3/mca_pmix_*.so 2>/dev/null | awk '$1 ~ /^libpmix\.so/ && $3 ~ /^\// {print $3; exit}')
  if [ -n "$pmix_lib" ]; then
    local pmix_dir
    pmix_dir=$(dirname "$(readlink -f "$pmix_lib")")
    for c in "$pmix_dir"/pmix/*.so; do
      if [ -f "$c" ]; then strip --strip-unneeded -o "$om/lib/pmix/$(basename "$c")" "$c"; fi
    done
    if [ -d "$pmix_dir/../share/pmix" ]; then cp -r "$pmix_dir/../share/pmix" "$om/share/pmix"; fi
  fi
  # The libraries all of them need, past those runtime/lib and compat/ hold already.
  local libs path
  libs=$(for c in "$om"/bin/* "$om"/lib/openmpi3/*.so "$om"/lib/pmix/*.so; do
    [ -L "$c" ] || ldd "$c" 2>/dev/null; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u)
  while read -r name path; do
    [ -n "$name" ] || continue
    if is_system_lib "$name" || is_cuda_lib "$name" || [ -e "$rt/lib/$name" ] ||
       [ -e "$rt/compat/$name" ]; then continue; fi
    cp -L "$path" "$om/lib/$name"
    strip --strip-unneeded "$om/lib/$name" 2>/dev/null || true
  done <<<"$libs"
  cp -r "$pkgdatadir" "$om/share/openmpi"
  for c in openmpi-mca-params.conf openmpi-default-hostfile; do
    if [ -f "$sysconfdir/$c" ]; then cp "$sysconfdir/$c" "$om/etc/$c"; fi
  done
  say "Open MPI $(ompi_info --version 2>/dev/null | sed -n 's/^Open MPI v//p'):" \
    "$(find "$om/lib/openmpi3" -name '*.so' | wc -l) components carried, ${#left[@]} left out" \
    "(${left[*]})"
}

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
    -DTRAINDECK_BUILD_GUI=OFF -DTRAINDECK_MPI=ON -DTRAINDECK_NATIVE=OFF "${launcher[@]}" \
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
  stub_hdf5_network "$rt" "${elves[@]}"
  # Libraries that bundled libraries load at run time: oneDNN's GPU runtime is OpenCL (its ICD
  # loader is linked, found above); nothing else is dlopen'ed outside CUDA.
  for f in "$rt"/lib/*; do strip --strip-unneeded "$f" 2>/dev/null || true; done
  # With MPI, the launcher for MultiWorkerMirrored: runtime/openmpi (bundle_openmpi).
  local mpi=""
  if [ -n "$(find "$rt/lib" -name 'libmpi.so.*' -print -quit)" ]; then
    bundle_openmpi "$rt"
    mpi=$(ompi_info --version 2>/dev/null | sed -n 's/^Open MPI v//p')
  fi
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
    echo "glibc=$(for e in "${elves[@]}" "$rt"/lib/* "$rt"/openmpi/lib/* "$rt"/openmpi/lib/*/*.so \
      "$rt"/openmpi/bin/*; do objdump -T "$e"; done 2>/dev/null |
      grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n1)"
    echo "openmpi=$mpi"
  } >"$rt/manifest"
  rm -f "$archive"
  mkdir -p "$(dirname "$archive")"
  # One solid xz stream (one thread: blocks would split it) with a dictionary that spans several
  # executables, which share most of their code, after the x86 branch filter (call and jump
  # targets made absolute, so that the same code at other addresses matches: 1 MB less). About
  # 1.5 GB of memory while packing.
  (cd "$stage" && tar --sort=name -cf - build-gpu build-gpu-bundle) |
    xz -T1 --x86 --lzma2=preset=6,dict=128MiB >"$archive.tmp"
  mv "$archive.tmp" "$archive"
  local nlibs
  nlibs=$(find "$rt/lib" "$rt/compat" -type f | wc -l)
  if [ -d "$rt/openmpi" ]; then nlibs="$nlibs (+ Open MPI $mpi: $(find "$rt/openmpi" -type f | wc -l) files)"; fi
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

# compare_losses WORK LABEL SECONDS ONE_STRATEGY TWO_STRATEGY -- ONE_COMMAND... -- TWO_COMMAND...
# Trains tests/strategy/mwms_blobs.json twice with `traindeck train --plain`: with the strategy
# ONE_STRATEGY through ONE_COMMAND, then TWO_STRATEGY through TWO_COMMAND (strategies as JSON, ''
# for the project's own; each command ends with the traindeck executable, after a launcher such as
# env or mpi_launch.sh), within SECONDS in all, and compares the loss after every step from the two
# run stores: 48 steps each, largest relative difference under 1e-4. A multi_worker_mirrored run's
# log must report its workers. Prints one line, "ok   LABEL: ..." or "FAIL LABEL: ...", naming the
# path the gradient sums took when the log says, and fails with the latter. The projects, stores
# and logs (one.log, two.log) stay in WORK.
compare_losses() {
  python3 - "$root/tests/strategy/mwms_blobs.json" "$@" <<'PY'
import json, os, re, signal, sqlite3, subprocess, sys, time
project, work, label, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
strategies, commands = sys.argv[5:7], []
for a in sys.argv[7:]:
    if a == "--":
        commands.append([])
    elif commands:
        commands[-1].append(a)

def fail(why):
    print(f"FAIL {label}: {why}")
    sys.exit(1)

if len(commands) != 2 or not all(commands):
    fail("compare_losses needs two commands, each after --")
base = json.load(open(project))
deadline = time.monotonic() + seconds

def run(name, strategy, command):
    p = dict(base)
    if strategy:
        p["strategy"] = json.loads(strategy)
    path, db, log = (f"{work}/{name}.{x}" for x in ("json", "db", "log"))
    with open(path, "w") as f:
        json.dump(p, f, indent=1)
    with open(log, "w") as out:
        # A session of its own: at the deadline the whole launch stops (mpirun passes SIGTERM on
        # to its workers), not only its first process.
        proc = subprocess.Popen(command + ["train", path, "--plain", "--db", db], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            fail(f"{name}: stopped after {seconds:g} s for both runs")
    text = open(log, errors="replace").read()
    if rc != 0:
        fail(f"{name}: exited {rc}: " + " | ".join(text.strip().splitlines()[-4:])[-400:])
    losses = [v for (v,) in sqlite3.connect(db).execute(
        "SELECT value FROM steps WHERE name = 'loss' ORDER BY global_step")]
    return losses, text

one, _ = run("one", strategies[0], commands[0])
two, log = run("two", strategies[1], commands[1])
if len(one) != 48 or len(two) != 48:
    fail(f"expected 48 logged steps each, got {len(one)} and {len(two)}")
strategy = json.loads(strategies[1]) if strategies[1] else base["strategy"]
if strategy["type"] == "multi_worker_mirrored":
    m = re.search(r"\d+ replicas \(multi_worker_mirrored, (\d+) workers\)", log)
    if not m or int(m.group(1)) < 2:
        fail("the chief did not report 2 workers (no 'replicas (multi_worker_mirrored, 2 workers)')")
# The run's log says when the sums leave the devices (trainer: "gradient sums between ... go
# through ...: why"); GPU replicas without that line sum with NCCL.
note = re.search(r"gradient sums between [^:\n]* go through ([^:\n]*)", log)
if note:
    how = "; sums through " + note.group(1)
elif any(d.startswith("cuda:") for d in strategy.get("devices", [])):
    how = "; sums on the GPU (NCCL)"
else:
    how = ""
worst = max(abs(a - b) / max(abs(a), 1e-6) for a, b in zip(one, two))
verdict = "ok  " if worst < 1e-4 else "FAIL"
print(f"{verdict} {label}: 48 steps, worst relative loss difference {worst:.2g} "
      f"(tolerance 1e-4{how})")
sys.exit(0 if worst < 1e-4 else 1)
PY
}

# input_share WORK DEVICE SECONDS: writes Fashion-MNIST as PNG folders into WORK (from
# TRAINDECK_FASHION_MNIST_DIR or Debian's folder), trains projects/fashion_mnist_folder_cnn.json on
# them on DEVICE for 3 epochs within SECONDS, and prints one line: "ok   input-bound share on
# DEVICE: ..." with each epoch's samples/s and input-wait share from the run store ("warn" when
# the trainer said an epoch was input-bound, 20% or more), or "FAIL ...".
input_share() {
  python3 - "$root" "$@" <<'PY'
import json, os, sqlite3, subprocess, sys, time
root, work, device, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
label = f"input-bound share on {device}"
start = time.monotonic()

def fail(why):
    print(f"FAIL {label}: {why}")
    sys.exit(1)

env = dict(os.environ)
made = subprocess.run([sys.executable, f"{root}/projects/make_image_folders.py", "--out",
                       f"{work}/png"], capture_output=True, text=True, env=env)
if made.returncode != 0:
    fail("make_image_folders.py: " + (made.stdout + made.stderr).strip()[-300:])
p = json.load(open(f"{root}/projects/fashion_mnist_folder_cnn.json"))
p["data"]["source"]["directory"] = f"{work}/png/train"
p["data"]["source"]["test_directory"] = f"{work}/png/test"
p["training"]["epochs"] = 3
p["strategy"] = {"type": "one_device", "devices": [device]}
json.dump(p, open(f"{work}/folder.json", "w"), indent=1)
with open(f"{work}/train.log", "w") as log:
    try:
        rc = subprocess.run([f"{root}/build-gpu/traindeck", "train", f"{work}/folder.json",
                             "--plain", "--db", f"{work}/runs.db"], stdout=log,
                            stderr=subprocess.STDOUT,
                            timeout=max(1.0, seconds - (time.monotonic() - start))).returncode
    except subprocess.TimeoutExpired:
        fail(f"stopped after {seconds:g} s")
if rc != 0:
    fail(f"traindeck exited {rc}: " + open(f"{work}/train.log").read().strip()[-300:])
rows = sqlite3.connect(f"{work}/runs.db").execute(
    "SELECT epoch, metrics_json FROM epochs ORDER BY epoch").fetchall()
if len(rows) != 3:
    fail(f"expected 3 stored epochs, got {len(rows)}")
parts = []
for epoch, metrics in rows:
    m = json.loads(metrics)
    parts.append(f"epoch {epoch + 1}: {m.get('samples_per_s', 0):,.0f} samples/s, "
                 f"{100 * m.get('input_wait_share', 0):.1f}% waiting")
bound = "input-bound" in open(f"{work}/train.log").read()
print(("warn" if bound else "ok  ") + f" {label} (folder CNN, {os.cpu_count()} cores): " +
      "; ".join(parts) + ("; the trainer said input-bound" if bound else ""))
PY
}

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
  # 1. Every dependency resolves inside the bundle, or is glibc / CUDA / libstdc++ (compat); Open
  # MPI's executables, components and libraries included.
  local bad om="$rt/openmpi"
  bad=$(find "$tmp/build-gpu" "$rt/lib" "$om" -type f 2>/dev/null | while read -r f; do
    is_elf "$f" || continue
    LD_LIBRARY_PATH="$rt/lib:$om/lib:$rt/compat" ldd "$f" 2>&1 | while read -r name arrow path _; do
      [ "$arrow" = "=>" ] || continue
      if is_system_lib "$name" || is_cuda_lib "$name"; then continue; fi
      case "$path" in "$rt"/lib/* | "$om"/lib/* | "$rt"/compat/*) ;; *) echo "${f#"$tmp"/}: $name => $path" ;; esac
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
  # 3. An engine test executable, the NVRTC test and the export test (Keras files through
  # libtraindeck_h5.so and HDF5, whose network libraries are stubs: stub_hdf5_network) from the
  # bundle.
  local t cuda_dirs=()
  mapfile -t cuda_dirs < <(cuda_lib_dirs | awk '!seen[$0]++')
  for t in test_model test_nvrtc test_export; do
    if out=$(cd "$tmp" && env -i PATH=/usr/bin:/bin HOME="$tmp" QT_QPA_PLATFORM=offscreen \
        LD_LIBRARY_PATH="$rt/lib:$rt/compat:$(join_path "${cuda_dirs[@]}")" \
        "$tmp/build-gpu/tests/$t" 2>&1); then
      echo "ok: $t from the bundle passes ($(tail -n 1 <<<"$out"))"
    else
      echo "FAIL: $t from the bundle:"; tail -n 20 <<<"$out"; fail=1
    fi
  done
  # 4. MultiWorkerMirrored through the bundle's Open MPI alone: 2 workers on the CPU started by its
  # mpirun (through tests/distribute/mpi_launch.sh, with the flags every run takes) against one
  # process with the same global batch, as tests/strategy/check_mwms.sh's `equal` case does; the
  # environment, the loader's path and the launcher's all lead into the unpacked bundle.
  if [ ! -x "$om/bin/mpirun" ]; then
    echo "FAIL: the bundle has no Open MPI (runtime/openmpi/bin/mpirun): MultiWorkerMirrored cannot start there"
    fail=1
  else
    verify_mpi "$tmp" || fail=1
  fi
  echo "bundle: $(du -h "$archive" | cut -f1) ($archive)"
  return $fail
}

# Which Open MPI the launch used is proven two ways. LD_DEBUG=files has the loader of every process
# of the launch (mpi_launch.sh's shell, then mpirun in its place, the workers) write down each
# shared object it maps, the MCA components that Open MPI opens with dlopen included: none of Open
# MPI's, PMIx's, hwloc's or libevent's may come from outside the bundle, and the workers' pml
# component must be among them (so the trace did see them); the mpirun that mpi_launch.sh finds on
# that PATH must be the bundle's. That works for any user and any layout. Files are not libraries,
# so as root (where unshare works) the
# launch also runs in a mount namespace in which the system's Open MPI folders (components, help
# texts, parameter file, PMIx) lie under empty tmpfs and its launcher and daemon under /dev/null:
# a lookup that missed the bundle fails there instead of finding Debian's copy; a help text
# mpirun prints (for a program that is not there) then shows it finds its own.
verify_mpi() {
  local tmp="$1" rt="$1/build-gpu-bundle/runtime" mw="$1/mwms" ompi=() hide=() line rc=0
  local om="$rt/openmpi"
  mkdir -p "$mw/ld"
  mapfile -t ompi < <(ompi_env "$om")
  if [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; then
    # shellcheck disable=SC2016  # expanded by the namespace's shell
    hide=(unshare -m sh -c 'mount --make-rprivate / &&
      for d in /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 /usr/share/openmpi \
               /etc/openmpi; do if [ -d "$d" ]; then mount -t tmpfs tmpfs "$d" || exit 1; fi; done &&
      for f in /usr/bin/orterun /usr/bin/orted; do
        if [ -f "$f" ]; then mount --bind /dev/null "$f" || exit 1; fi; done && exec "$@"' hide)
  fi
  local launch=("${hide[@]}" env -i PATH="$om/bin:/usr/bin:/bin" HOME="$tmp"
    LD_LIBRARY_PATH="$rt/lib:$om/lib:$rt/compat" "${ompi[@]}" OMP_NUM_THREADS=1
    TRAINDECK_MPIRUN_FLAGS="$(ompi_pass_flags)")
  line=$(compare_losses "$mw" "MultiWorkerMirrored, 2 workers under the bundle's mpirun = one process" 300 \
    '{"type": "one_device"}' '' \
    -- env -i PATH=/usr/bin:/bin HOME="$tmp" LD_LIBRARY_PATH="$rt/lib:$rt/compat" "$tmp/build-gpu/traindeck" \
    -- "${launch[@]}" LD_DEBUG=files LD_DEBUG_OUTPUT="$mw/ld/trace" \
       "$root/tests/distribute/mpi_launch.sh" 2 "$tmp/build-gpu/traindeck") || rc=$?
  [ -n "$line" ] || line="FAIL MultiWorkerMirrored under the bundle's mpirun: no verdict"
  sed 's/^ok   /ok: /; s/^FAIL /FAIL: /' <<<"$line"
  if [ "$rc" != 0 ]; then
    tail -n 30 "$mw/two.log" 2>/dev/null | sed 's/^/  /'
    return 1
  fi
  # Where every shared object of the launch came from (the loader's "calling init: PATH").
  local objects strays ntraces launcher help
  objects=$(sed -n 's/.*calling init: \(\/[^ ]*\).*/\1/p' "$mw"/ld/trace.* | sort -u)
  ntraces=$(find "$mw/ld" -name 'trace.*' | wc -l)
  strays=$(grep -E '/(lib(mpi|open-pal|open-rte|pmix|mca_common_|oshmem|hwloc|event)[^/]*|mca_[^/]*|pmix_mca_[^/]*|hwloc_[^/]*)$' \
    <<<"$objects" | grep -v "^$tmp/" || true)
  launcher=$("${launch[@]}" sh -c 'command -v mpirun' 2>&1 || true)
  help=$("${launch[@]}" "$root/tests/distribute/mpi_launch.sh" 1 "$mw/absent" 2>&1 || true)
  if [ -n "$strays" ]; then
    echo "FAIL: the MPI launch mapped Open MPI's objects from outside the bundle:"; sed 's/^/  /' <<<"$strays"
    return 1
  elif [ "$launcher" != "$om/bin/mpirun" ]; then
    echo "FAIL: the launch's mpirun is ${launcher:-none}, not the bundle's"
    return 1
  elif ! grep -qFx "$om/lib/openmpi3/mca_pml_ob1.so" <<<"$objects"; then
    echo "FAIL: the loader's trace ($ntraces processes) shows no pml component of the bundle: nothing proven"
    return 1
  elif grep -q "You were supposed to get help" <<<"$help" || ! grep -q "could not access" <<<"$help"; then
    echo "FAIL: the bundle's mpirun did not find its help texts:"; head -n 8 <<<"$help" | sed 's/^/  /'
    return 1
  fi
  echo "ok: the launch used the bundle's Open MPI alone: $ntraces processes traced, every Open MPI," \
    "PMIx, hwloc and libevent object from the bundle, help texts found$(
    [ ${#hide[@]} -gt 0 ] && echo ", with the system's Open MPI hidden" ||
      echo " (the system's Open MPI not hidden: that needs root)")"
}

# ------------------------------------------------------------------------------------------------
run() {
  local out="${OUT:-$bundle_dir/out}"
  mkdir -p "$out"
  rm -f "$out/kernels.txt"  # appended to below
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
  if [ -d "$rt/openmpi/lib" ]; then ldp="$ldp:$rt/openmpi/lib"; fi
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

  # 2b. On a GPU: Mirrored with 2 replicas on cuda:0 (NCCL takes one rank per GPU, so their sums
  # go through cuda:0's own sum kernel, as the run's log says) against one device with the same
  # global batch, through the command line: the loss after every step, from the two run stores.
  if [ "$have" -gt 0 ]; then
    local mr="$out/.mirrored"
    rm -rf "$mr"; mkdir -p "$mr"
    rc=0
    line=$(compare_losses "$mr" "Mirrored, 2 replicas on cuda:0 = one device" 180 \
      '{"type": "one_device", "devices": ["cuda:0"]}' \
      '{"type": "mirrored", "devices": ["cuda:0"], "replicas": 2}' \
      -- "$build/traindeck" -- "$build/traindeck") || rc=$?
    echo "${line:=FAIL Mirrored, 2 replicas on cuda:0: no verdict}"
    summary+=("$line")
    if [ "$rc" != 0 ]; then status=1; tail -n 20 "$mr/two.log" 2>/dev/null || true; fi
    rm -rf "$mr"
  fi

  # 2c. On a GPU: MultiWorkerMirrored, 2 processes on cuda:0 started by the bundle's mpirun
  # (through tests/distribute/mpi_launch.sh, with the flags every run takes), against one process
  # on cuda:0 with the same global batch. NCCL takes one rank per GPU, so two workers that share one
  # sum through MPI in host memory ("gradient sums between workers go through MPI (host memory),
  # not NCCL: worker ranks 0 and 1 share one GPU, ..."); the summary names the path they took. The
  # machine's own MPI settings (an image's OMPI_MCA_pml=ucx, an OPAL_PREFIX for HPC-X) would steer
  # the bundle's Open MPI to components it lacks: none of them goes along.
  if [ "$have" -gt 0 ]; then
    local mw="$out/.mwms" om="$rt/openmpi" ompi=() clear=() v
    rm -rf "$mw"; mkdir -p "$mw"
    rc=0
    if [ -x "$om/bin/mpirun" ]; then
      mapfile -t ompi < <(ompi_env "$om")
      for v in $(compgen -e | grep -E '^(OMPI_|OPAL_|PMIX_|ORTE_|HWLOC_)' || true); do clear+=(-u "$v"); done
      line=$(compare_losses "$mw" "MultiWorkerMirrored, 2 processes on cuda:0 = one device" 180 \
        '{"type": "one_device", "devices": ["cuda:0"]}' \
        '{"type": "multi_worker_mirrored", "devices": ["cuda:0"], "timeout_seconds": 20}' \
        -- "$build/traindeck" \
        -- env "${clear[@]}" "${ompi[@]}" PATH="$om/bin:$PATH" TRAINDECK_MPIRUN_FLAGS="$(ompi_pass_flags)" \
           "$root/tests/distribute/mpi_launch.sh" 2 "$build/traindeck") || rc=$?
    else
      rc=1 line="FAIL MultiWorkerMirrored, 2 processes on cuda:0: the bundle has no Open MPI (built without MPI)"
    fi
    echo "${line:=FAIL MultiWorkerMirrored, 2 processes on cuda:0: no verdict}"
    summary+=("$line")
    if [ "$rc" != 0 ]; then status=1; tail -n 30 "$mw/two.log" 2>/dev/null || true; fi
    rm -rf "$mw"
  fi

  # 2d. Does the GPU wait for input? The image-folder CNN project (Fashion-MNIST as 70,000 PNG
  # files, written first by projects/make_image_folders.py) on the first GPU, its pipeline as the
  # docs set it up (decoded in the parallel map on every core, a memory cache after the decode), 3
  # epochs: samples/s and the share of each epoch's step time spent waiting for input, as stored.
  # On a CPU-only machine, on cpu:0 (TRAINDECK_GPU_INPUT_DEVICE chooses; =none skips it).
  local idev="${TRAINDECK_GPU_INPUT_DEVICE:-$([ "$have" -gt 0 ] && echo cuda:0 || echo cpu:0)}"
  if [ "$idev" != none ]; then
    local fw="$out/.folders"
    rm -rf "$fw"; mkdir -p "$fw"
    rc=0
    line=$(input_share "$fw" "$idev" 240) || rc=$?
    echo "${line:=FAIL input-bound share on $idev: no verdict}"
    summary+=("$line")
    if [ "$rc" != 0 ]; then status=1; tail -n 20 "$fw/train.log" 2>/dev/null || true; fi
    rm -rf "$fw"
  fi

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
  # TRAINDECK_GPU_BENCH_DEVICE chooses. On a GPU: the issue's figures, the seed MLP at batch 256,
  # the 784-4096-4096-10 MLP at batch 1024 and the CNN project's model at batch 64 (last: the
  # MLPs' figures print first should the cap stop it), each in f32, mixed_bfloat16 and f32 without
  # CUDA Graph replay, beside PyTorch on the same GPU (eager and torch.compile, f32 and bf16
  # autocast; the CNN channels-last).
  local bdev="${TRAINDECK_GPU_BENCH_DEVICE:-}"
  if [ -z "$bdev" ]; then bdev=cpu:0; [ "$have" -gt 0 ] && bdev=cuda:0; fi
  local models=seed-256 variants=f32 epochs=2
  if [ "${bdev%%:*}" = cuda ]; then
    models=seed-256,large-1024,cnn-64 variants=f32,bf16,nograph,bf16-inline-update,bf16-f32-conv epochs=5
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
      >"$bundle_dir/matmul.txt" 2>&1 || rc=$?
    tee -a "$out/kernels.txt" <"$bundle_dir/matmul.txt"
    if [ "$rc" = 0 ]; then summary+=("ok   cuBLASLt at the large MLP's products:")
    else summary+=("warn cuBLASLt matmul benchmark exited $rc:"); fi
    while IFS= read -r line; do summary+=("     $line"); done < <(grep -E '^(f32|bf16):|step.s products|trainer at' "$bundle_dir/matmul.txt")
  fi

  # 4b. On a GPU: the device's max pooling and BatchNormalization kernels against cuDNN's at the
  # CNN project's shapes (batch 64), and its convolutions with bias and ReLU apart against cuDNN's
  # fused call and in bf16.
  if [ "${bdev%%:*}" = cuda ] && [ -x "$build/traindeck_bench_cuda_ops" ]; then
    rc=0
    timeout 60 "$build/traindeck_bench_cuda_ops" --batch 64 --repeat 200 --device "${bdev#cuda:}" \
      >"$bundle_dir/ops.txt" 2>&1 || rc=$?
    tee -a "$out/kernels.txt" <"$bundle_dir/ops.txt"
    if [ "$rc" = 0 ]; then summary+=("ok   pooling, BatchNormalization and convolutions against cuDNN (batch 64):")
    else summary+=("warn cuDNN comparison benchmark exited $rc:"); fi
    while IFS= read -r line; do summary+=("     $line"); done < <(grep -E '^(max pool|batchnorm|conv[12]|check:.*FAIL|cuDNN:)' "$bundle_dir/ops.txt")
  fi

  # 4c. On a GPU: where the CNN's mixed_bfloat16 step goes, kernel by kernel (TRAINDECK_PROFILE=1:
  # no CUDA Graph, an event between launches; each convolution's label says how it ran: cuDNN in
  # bf16 or f32, fused, or the direct kernels and why), one epoch, into kernels.txt.
  if [ "${bdev%%:*}" = cuda ]; then
    local prof="$bundle_dir/profile_cnn.json"
    rc=0
    python3 - "$root/projects/fashion_mnist_cnn.json" "$prof" "$bdev" <<'PY' || rc=$?
import json, sys
p = json.load(open(sys.argv[1]))
p["precision"] = "mixed_bfloat16"
p["training"]["epochs"] = 1
p["strategy"] = {"type": "one_device", "devices": [sys.argv[3]], "replicas": 0}
json.dump(p, open(sys.argv[2], "w"), indent=1)
PY
    [ "$rc" = 0 ] && { TRAINDECK_PROFILE=1 timeout 90 "$build/traindeck" train "$prof" --plain \
      --db "$bundle_dir/profile.db" >"$bundle_dir/profile.txt" 2>&1 || rc=$?; }
    { echo "== TRAINDECK_PROFILE=1: projects/fashion_mnist_cnn.json, mixed_bfloat16, $bdev, 1 epoch =="
      cat "$bundle_dir/profile.txt"; } >>"$out/kernels.txt"
    tail -n 40 "$bundle_dir/profile.txt"
    if [ "$rc" = 0 ]; then
      summary+=("ok   the CNN's bf16 step kernel by kernel (kernels.txt): $(grep -m1 -o 'profile: .*' "$bundle_dir/profile.txt" || echo 'no profile line')")
    else
      summary+=("warn the CNN's profiled bf16 run exited $rc (kernels.txt)")
    fi
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
