#!/usr/bin/env bash
# Export/import against the real runtimes: ONNX's checker and ONNX Runtime, and Keras 3
# (tests/export/interop.py). The Python packages come from installer/pyenv.sh's virtual
# environment; without it the test reports SKIP (77) with the reason, never a pass.
#   interop.sh TRAINDECK_BINARY
set -uo pipefail
bin="$(realpath "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
python="$("$root/installer/pyenv.sh" --check)" || {
  echo "SKIP: onnx, onnxruntime and Keras 3 are not installed (run installer/pyenv.sh, which" \
       "pip-installs them into ${TRAINDECK_INTEROP_VENV:-~/.cache/traindeck/interop-venv})"
  exit 77
}
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# TrainDeck's caches (decoded sources) stay in the scratch folder.
export XDG_CACHE_HOME="$work/cache"
# One thread each for TensorFlow and TrainDeck keeps the run quiet on a shared machine.
export TF_CPP_MIN_LOG_LEVEL=3 TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 OMP_NUM_THREADS=1
export CUDA_VISIBLE_DEVICES=""
exec timeout 600 "$python" "$here/interop.py" "$bin" "$work"
