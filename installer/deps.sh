#!/usr/bin/env bash
# Installs what TrainDeck needs to build, run and test on Debian 12, from Debian's packages.
#   installer/deps.sh            build + run dependencies
#   installer/deps.sh --test     also what the tests and benchmarks need
#   installer/deps.sh --bench    also Debian's PyTorch and what installer/bench.sh needs to install
#                                PyTorch 2.x and Keras into a virtual environment (venv, the
#                                Python headers torch.compile compiles against)
set -euo pipefail

want_test=0
want_bench=0
for a in "$@"; do
  case "$a" in
    --test) want_test=1 ;;
    --bench) want_test=1; want_bench=1 ;;
    *) echo "deps.sh: unknown option $a" >&2; exit 2 ;;
  esac
done

pkgs=(
  build-essential cmake ninja-build pkg-config git
  libdnnl-dev ocl-icd-opencl-dev libsqlite3-dev nlohmann-json3-dev libcli11-dev zlib1g-dev libomp-dev
  qt6-base-dev qt6-base-dev-tools
  libhdf5-dev
  libjpeg62-turbo-dev libpng-dev libstb-dev
  libqcustomplot-dev libqcustomplot2.1-qt6
  dataset-fashion-mnist
  libopenmpi-dev openmpi-bin
)
if [ "$want_test" = 1 ]; then
  # qemu-user: the portable_binary test runs the binary on an emulated CPU without AVX.
  # clang + libclang-rt: the libFuzzer build (tests/fuzz/run.sh).
  # python3-venv: installer/pyenv.sh's environment for the export interop tests.
  # ccache: the GPU bundle's build (CTest gpu_bundle) reuses the main build's objects.
  # python3-pil: projects/make_image_folders.py --format jpeg (the colour JPEG folders).
  # openssh-server, openssh-client: test_remote runs the CLI over a real sshd it starts.
  pkgs+=(xvfb xauth xfonts-base python3 python3-numpy python3-pil python3-venv qemu-user clang libclang-rt-14-dev
         ccache openssh-server openssh-client)
fi
if [ "$want_bench" = 1 ]; then
  pkgs+=(python3-torch libopenblas0-pthread python3-venv python3-dev)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "deps.sh: all ${#pkgs[@]} packages present"
  exit 0
fi
echo "deps.sh: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
