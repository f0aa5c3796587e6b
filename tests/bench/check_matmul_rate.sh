#!/usr/bin/env bash
# traindeck_bench --matmul-rate: right after the one-device TrainDeck run, oneDNN's products alone
# at the same MLP's shapes (traindeck_bench_matmul), and the share of their rate that the run
# reached, printed and in the JSON; without the flag, neither.
#   check_matmul_rate.sh TRAINDECK_BENCH
set -uo pipefail
bench="$1"
fail=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
run=(--frameworks none --models seed-256 --epochs 2 --threads 2)

out="$("$bench" "${run[@]}" --matmul-rate --json "$tmp/with.json" 2>&1)"
rc=$?
if [ "$rc" != 0 ]; then
  echo "FAIL: traindeck_bench --matmul-rate exited with $rc: $out"
  exit 1
fi
line="$(grep "matmul rate:" <<<"$out")"
re="products alone ([0-9]+) samples/s; TrainDeck's ([0-9]+) at ([0-9]+)% of it"
if [[ "$line" =~ $re ]]; then
  alone="${BASH_REMATCH[1]}" ours="${BASH_REMATCH[2]}" pct="${BASH_REMATCH[3]}"
  # The share printed is TrainDeck's rate over the products' (rounded to a percent).
  want=$(((ours * 100 + alone / 2) / alone))
  if [ "$alone" -le 0 ] || [ "$ours" -le 0 ] || [ $((want - pct)) -gt 1 ] || [ $((pct - want)) -gt 1 ]; then
    echo "FAIL: inconsistent matmul rate line: $line (expected about $want%)"
    fail=1
  else
    echo "ok: $line"
  fi
else
  echo "FAIL: no matmul rate line in: $out"
  fail=1
fi
if ! python3 - "$tmp/with.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
shares = rows[0]["matmul_rate_shares"]
assert len(shares) == 1 and 0 < shares[0] < 10, shares
PY
then
  echo "FAIL: the JSON's matmul_rate_shares is not one share"
  fail=1
fi

out="$("$bench" "${run[@]}" --json "$tmp/without.json" 2>&1)"
if grep -q "matmul rate" <<<"$out"; then
  echo "FAIL: a matmul rate line without --matmul-rate: $out"
  fail=1
fi
if ! python3 -c 'import json, sys; assert json.load(open(sys.argv[1]))[0]["matmul_rate_shares"] == []' \
  "$tmp/without.json"; then
  echo "FAIL: matmul_rate_shares not empty without --matmul-rate"
  fail=1
fi
exit "$fail"
