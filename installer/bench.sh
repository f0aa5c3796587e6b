#!/usr/bin/env bash
# Side-by-side benchmark: TrainDeck against the reference trainers of bench/reference_mlp.py on
# the same MLPs, same data, optimizer and threads, in one invocation.
#   installer/bench.sh [traindeck_bench options, e.g. --epochs 3 --threads 2 --models seed-32]
# References: PyTorch 2.x (eager and torch.compile) and Keras 3 (tensorflow-cpu), installed once
# from PyPI into a virtual environment ($TRAINDECK_BENCH_VENV, default
# ~/.cache/traindeck/bench-venv; the first install downloads a few GB), and Debian's PyTorch 1.13
# (python3-torch) in the system interpreter.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/installer/deps.sh" --bench
venv="${TRAINDECK_BENCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/traindeck/bench-venv}"
ready() {
  "$venv/bin/python" - <<'PY' 2>/dev/null
import torch, tensorflow, keras
assert int(torch.__version__.split(".")[0]) >= 2 and int(keras.__version__.split(".")[0]) >= 3
PY
}
if ! ready; then
  echo "bench.sh: installing PyTorch 2.x and tensorflow-cpu into $venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --progress-bar off "torch>=2" tensorflow-cpu
  ready || { echo "bench.sh: $venv has no working PyTorch 2.x and Keras 3 after the install" >&2
             exit 1; }
fi
# The input-pipeline figures (bench/reference_pipeline.py, reference_mlp.py --folder): Pillow for
# torchvision's image reading and for projects/make_image_folders.py --format jpeg; torchvision
# without its dependencies (the PyTorch above is kept; its image-folder reader and transforms are
# plain Python).
"$venv/bin/python" -c "import PIL, torchvision" 2>/dev/null || {
  "$venv/bin/python" -m pip install --quiet --progress-bar off pillow
  "$venv/bin/python" -m pip install --quiet --progress-bar off --no-deps torchvision
  "$venv/bin/python" -c "import PIL, torchvision" || {
    echo "bench.sh: $venv has no working Pillow and torchvision after the install" >&2; exit 1; }
}
/usr/bin/python3 -c "import torch" || {
  echo "bench.sh: Debian's python3-torch does not import in /usr/bin/python3" >&2; exit 1; }
"$root/installer/build.sh"
exec "$root/build/traindeck_bench" --python "$venv/bin/python" --python-debian /usr/bin/python3 "$@"
