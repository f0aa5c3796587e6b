#!/usr/bin/env bash
# bench/reference_mlp.py, the reference trainers of traindeck_bench, lives in the repository and
# trains: options are checked with clear messages, and with PyTorch installed (Debian's
# python3-torch, or the bench virtual environment) a short run prints a result line whose rate
# and accuracy are those of a model that learned.
#   check_reference.sh SOURCE_DIR
set -uo pipefail
src="$1"
script="$src/bench/reference_mlp.py"
fail=0
[ -f "$script" ] || { echo "FAIL: $script is missing"; exit 1; }

expect_refusal() {  # expect_refusal MESSAGE ARGS...: exit 2 and MESSAGE on stderr
  local want="$1"; shift
  local out rc
  out="$(python3 "$script" "$@" 2>&1 >/dev/null)"; rc=$?
  if [ "$rc" != 2 ] || ! grep -qF -- "$want" <<<"$out"; then
    echo "FAIL: reference_mlp.py $*: expected exit 2 and '$want', got $rc: $out"; fail=1
  else
    echo "ok: refuses $*"
  fi
}
expect_refusal "--epochs: expected at least 2" --framework torch --epochs 1
expect_refusal "--hidden: expected comma-separated positive integers" --framework torch --hidden 12,x
expect_refusal "--dropout: expected a rate in [0, 1)" --framework keras --dropout 1.5
expect_refusal "--batch: expected a positive integer" --framework keras --batch 0

venv="${TRAINDECK_BENCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/traindeck/bench-venv}"
python=""
for p in /usr/bin/python3 "$venv/bin/python"; do
  if [ -x "$p" ] && "$p" -c "import torch, numpy" 2>/dev/null; then python="$p"; break; fi
done
if [ -z "$python" ]; then
  echo "no interpreter with PyTorch (installer/deps.sh --bench): skipping the training run"
  [ "$fail" = 0 ] && exit 77
  exit 1
fi
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "FAIL: Fashion-MNIST is missing (package dataset-fashion-mnist)"; exit 1
fi
out="$(OMP_NUM_THREADS=2 timeout 600 "$python" "$script" --framework torch --hidden 64 \
       --batch 128 --epochs 2 --threads 2 --limit 6000)" || {
  echo "FAIL: $python reference_mlp.py --framework torch exited with $?"; exit 1; }
echo "$out"
python3 - "$out" <<'PY' || fail=1
import json, sys
r = json.loads(sys.argv[1].strip().splitlines()[-1])
problems = []
if r["framework"] != "torch" or not r["version"]:
    problems.append(f"framework/version: {r['framework']} {r['version']}")
if r["hidden"] != [64] or r["batch"] != 128 or r["epochs"] != 2:
    problems.append(f"options not echoed: {r}")
if len(r["epoch_seconds"]) != 2 or min(r["epoch_seconds"]) <= 0:
    problems.append(f"epoch_seconds: {r['epoch_seconds']}")
# The steady rate is 6000 / epoch 2's time; epoch_seconds are printed to the millisecond, so the
# rate must lie in what 6000 / (t -+ 0.5 ms) allows (a 31 ms epoch is 1.6% either way).
t = r["epoch_seconds"][1]
low, high = 6000 / (t + 0.0005), 6000 / max(t - 0.0005, 1e-9)
if not low - 0.1 <= r["samples_per_s"] <= high + 0.1:
    problems.append(f"samples_per_s {r['samples_per_s']} is not 6000 / epoch 2 ({t} s, to the"
                    f" millisecond): {low:.1f} to {high:.1f}")
# Two epochs on 6,000 images reach about 0.75; a model that did not learn stays near 0.1.
if not 0.6 < r["test_accuracy"] <= 1:
    problems.append(f"test_accuracy {r['test_accuracy']}")
if not r["peak_rss_mib"] > 50:
    problems.append(f"peak_rss_mib {r['peak_rss_mib']}")
for p in problems:
    print("FAIL:", p)
sys.exit(1 if problems else 0)
PY
exit "$fail"
