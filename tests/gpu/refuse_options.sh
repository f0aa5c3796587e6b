# Sourced by the GPU benchmarks' CTest scripts (bench_cuda_*_check.sh): refuse WANT OPTIONS...
# runs "$bin" with OPTIONS and expects a refusal (an exit other than 0 and 77) whose output names
# WANT; otherwise prints FAIL and sets fail=1.
fail=0
refuse() {
  local want="$1"; shift
  local out rc
  out=$("$bin" "$@" 2>&1); rc=$?
  if [ "$rc" = 0 ] || [ "$rc" = 77 ] || ! grep -q -- "$want" <<<"$out"; then
    echo "FAIL: $* gave exit $rc and: $out"; fail=1
  else
    echo "ok: $* refused ($(head -n1 <<<"$out"))"
  fi
}
