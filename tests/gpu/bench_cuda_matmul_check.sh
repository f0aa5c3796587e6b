#!/usr/bin/env bash
# CTest bench_cuda_matmul: the GPU matmul benchmark refuses bad options with the option's name,
# and then either measures (a GPU is there: every product and the step are printed, and a
# trainer rate gives a share) or says it has no GPU and exits 77 (CTest: skipped).
#   bench_cuda_matmul_check.sh BUILD/traindeck_bench_cuda_matmul
set -uo pipefail
bin="$1"
source "$(dirname "$0")/refuse_options.sh"
refuse "--layers" --layers 784,x
refuse "--layers" --layers 784,0
refuse "at least two widths" --layers 784
refuse "--dtypes" --dtypes f64
refuse "--trainer-samples-per-s" --trainer-samples-per-s fast
refuse "--batch" --batch 0
[ "$fail" = 0 ] || exit 1
out=$("$bin" --layers 784,256,10 --batch 128 --repeat 5 --trainer-samples-per-s 1000,1000 2>&1); rc=$?
echo "$out"
if [ "$rc" = 77 ]; then exit 77; fi
[ "$rc" = 0 ] || { echo "FAIL: the benchmark exited $rc"; exit 1; }
for want in "layer 1 forward" "layer 2 input grad" "step's products" "% of cuBLASLt's rate"; do
  grep -q "$want" <<<"$out" || { echo "FAIL: no '$want' line"; exit 1; }
done
[ "$(grep -c "step's products" <<<"$out")" = 2 ] || { echo "FAIL: expected f32 and bf16 steps"; exit 1; }
echo "ok: measured on the GPU"
