#!/usr/bin/env bash
# The Python packages the export/import interop tests run against (tests/export/interop.sh):
# onnx (the checker), onnxruntime and tensorflow-cpu (Keras 3), installed with pip into a virtual
# environment, $TRAINDECK_INTEROP_VENV (default ~/.cache/traindeck/interop-venv; the first install
# downloads about 700 MB). Prints the environment's python on success.
#   installer/pyenv.sh            install when missing or incomplete
#   installer/pyenv.sh --check    only say whether it is ready (exit 0) or not (exit 1)
set -euo pipefail
venv="${TRAINDECK_INTEROP_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/traindeck/interop-venv}"
ready() {
  [ -x "$venv/bin/python" ] && "$venv/bin/python" - <<'PY' >/dev/null 2>&1
import onnx, onnxruntime, keras
assert int(keras.__version__.split(".")[0]) >= 3
PY
}
if [ "${1:-}" = --check ]; then
  ready && { echo "$venv/bin/python"; exit 0; }
  exit 1
fi
if ! ready; then
  echo "pyenv.sh: installing onnx, onnxruntime and tensorflow-cpu into $venv" >&2
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --progress-bar off onnx onnxruntime tensorflow-cpu >&2
  ready || { echo "pyenv.sh: $venv has no working onnx, onnxruntime and Keras 3 after the install" >&2
             exit 1; }
fi
echo "$venv/bin/python"
