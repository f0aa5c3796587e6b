#!/usr/bin/env bash
# CTest bench_cuda_ops: the GPU pooling / BatchNormalization / conv benchmark refuses bad options
# with the option's name, and then either measures (a GPU is there: the rows are printed and its
# result checks pass) or says it has no GPU and exits 77 (CTest: skipped).
#   bench_cuda_ops_check.sh BUILD/traindeck_bench_cuda_ops
set -uo pipefail
bin="$1"
source "$(dirname "$0")/refuse_options.sh"
refuse "--batch" --batch 0
refuse "--batch" --batch x
refuse "--repeat" --repeat x
refuse "--repeat" --repeat 0
refuse "--device" --device -1
[ "$fail" = 0 ] || exit 1
out=$("$bin" --batch 8 --repeat 5 2>&1); rc=$?
echo "$out"
if [ "$rc" = 77 ]; then exit 77; fi
[ "$rc" = 0 ] || { echo "FAIL: the benchmark exited $rc"; exit 1; }
for want in "max pool fwd" "batchnorm grad" "conv1 bias relu f32"; do
  grep -q "$want" <<<"$out" || { echo "FAIL: no '$want' line"; exit 1; }
done
echo "ok: measured on the GPU"
