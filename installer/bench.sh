#!/usr/bin/env bash
# Side-by-side benchmark: TrainDeck and the reference trainers (PyTorch from Debian with OpenBLAS,
# Keras from pip where TensorFlow installs) on the same MLPs, same threads, one invocation.
#   installer/bench.sh [traindeck_bench options, e.g. --epochs 3 --threads 2]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/installer/deps.sh" --bench
frameworks=torch
if python3 -c "import tensorflow" 2>/dev/null || python3 -m pip install -q tensorflow-cpu; then
  frameworks=torch,keras
else
  echo "bench.sh: TensorFlow did not install; comparing with PyTorch only" >&2
fi
"$root/installer/build.sh"
exec "$root/build/traindeck_bench" --frameworks "$frameworks" "$@"
