#!/usr/bin/env bash
# Runs one case of test_mpi_collectives as NP workers (default 2) under mpirun (mpi_launch.sh) and
# checks the workers' reports, the launcher's exit status and the wall time (a hang fails the test
# instead of blocking CI).
#   check_mpi.sh CASE TEST_BINARY [NP]      CASE: reduce host hang abort kill bench
# Exit 77 (skipped) when the build has no MPI or mpirun is not installed.
set -uo pipefail
what="$1"
bin="$2"
np="${3:-2}"
here="$(cd "$(dirname "$0")" && pwd)"

# A build without MPI says so at once, without a launcher.
probe="$("$bin" "$what" 2>&1)"
if [ $? = 77 ]; then
  echo "$probe"
  exit 77
fi
if ! command -v mpirun >/dev/null 2>&1; then
  echo "SKIP: mpirun not found (Debian: openmpi-bin)"
  exit 77
fi

# expect: launcher exit (0 or nonzero), wall-time bound in seconds, lines that must appear.
case "$what" in
  reduce) want_rc=0; bound=120
          lines=("[rank 0] PASS step 2: result hash identical on every rank")
          for ((r = 0; r < np; r++)); do lines+=("[rank $r] done"); done ;;
  host)   want_rc=0; bound=60
          lines=("[rank 0] PASS allReduceHost sums in rank order" "[rank 0] PASS barrier waited"
                 "[rank 1] PASS allGatherHost rank-major" "[rank 0] done" "[rank 1] done") ;;
  # Rank 1 sleeps 8 s; rank 0 fails after 2 s and ends the job, which must not wait for rank 1.
  hang)   want_rc=nonzero; bound=30
          lines=("[rank 0] PASS the wait names rank 1" "[rank 0] PASS failed within the timeout"
                 "[rank 0] PASS a later call fails at once with the same error"
                 "[rank 0] ending the job") ;;
  abort)  want_rc=nonzero; bound=60
          lines=("[rank 1] PASS the wait ends with the abort's reason"
                 "[rank 0] PASS the error carries rank 1's reason"
                 "[rank 0] PASS failed at once" "[rank 0] done (group broken") ;;
  kill)   want_rc=nonzero; bound=60
          lines=("[rank 1] killing myself" "[rank 0] PASS the error names rank 1"
                 "[rank 0] done (group broken") ;;
  bench)  want_rc=0; bound=300; lines=("[rank 0] done") ;;
  *) echo "check_mpi.sh: unknown case $what" >&2; exit 2 ;;
esac

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
t0=$(date +%s.%N)
timeout -k 10 "$bound" "$here/mpi_launch.sh" "$np" "$bin" "$what" >"$log" 2>&1
rc=$?
t1=$(date +%s.%N)
wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
cat "$log"
echo "--- mpirun exit status $rc after $wall s"

fail=0
if [ "$rc" = 77 ]; then exit 77; fi
if [ "$rc" = 124 ] || [ "$rc" = 137 ] && [ "$(awk -v w="$wall" -v b="$bound" 'BEGIN{print (w >= b)}')" = 1 ]; then
  echo "FAIL: the job did not end within $bound s"
  fail=1
fi
if [ "$want_rc" = 0 ] && [ "$rc" != 0 ]; then
  echo "FAIL: expected exit status 0, got $rc"; fail=1
fi
if [ "$want_rc" = nonzero ] && [ "$rc" = 0 ]; then
  echo "FAIL: expected a non-zero exit status (a failed multi-worker run)"; fail=1
fi
for l in "${lines[@]}"; do
  if ! grep -qF -- "$l" "$log"; then
    echo "FAIL: missing line: $l"; fail=1
  fi
done
if grep -E '^\[rank [0-9]+\] FAIL' "$log"; then
  echo "FAIL: a worker reported a failed check"; fail=1
fi
if [ "$fail" = 0 ]; then echo "ok: mpi_collectives $what, $np workers ($wall s)"; fi
exit "$fail"
