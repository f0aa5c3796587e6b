#!/usr/bin/env bash
# MultiWorkerMirrored through the command line under mpirun (tests/distribute/mpi_launch.sh):
#   check_mwms.sh TRAINDECK SOURCE_DIR equal   2 workers == one process with the same global batch:
#                                              the loss after every step (from the two run
#                                              stores) and the test metrics, to float tolerance;
#                                              only the chief stores the run, with both workers'
#                                              per-replica figures
#   check_mwms.sh TRAINDECK SOURCE_DIR kill    worker 1 is killed (SIGKILL) after step 5: the
#                                              launcher exits non-zero within the bound, the
#                                              chief's error names rank 1, the stored run failed
#   check_mwms.sh TRAINDECK SOURCE_DIR hang    worker 1 stops answering after step 5: the chief
#                                              fails after timeout_seconds naming rank 1
#   check_mwms.sh TRAINDECK SOURCE_DIR chief   the chief (rank 0) is killed after step 5: the
#                                              surviving worker records why in the store, whose
#                                              run is 'interrupted' with that report
#   check_mwms.sh TRAINDECK SOURCE_DIR off     shard_policy "off": each worker its own order and
#                                              a batch of global / workers; the run completes
#   check_mwms.sh TRAINDECK SOURCE_DIR resume  worker 1 killed in epoch 2, train --resume under a
#                                              new launch: the losses equal an uninterrupted run's
#   check_mwms.sh TRAINDECK SOURCE_DIR resume_mid  the same from a ModelCheckpoint written every 4
#                                              steps, in the middle of epoch 2: every worker's
#                                              share of the epoch's sums goes on from the file
# Exit 77 (skipped) when the build has no MPI or mpirun is missing.
set -uo pipefail
bin="$1"
src="$2"
what="$3"
launch="$src/tests/distribute/mpi_launch.sh"
project="$src/tests/strategy/mwms_blobs.json"

avail="$("$bin" devices | grep '^strategy multi_worker_mirrored')"
case "$avail" in
  *unavailable*) echo "SKIP: ${avail#strategy }"; exit 77 ;;
esac
if ! command -v mpirun >/dev/null 2>&1; then
  echo "SKIP: mpirun not found (Debian: openmpi-bin)"
  exit 77
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# The same run in one process (one worker, one replica: no launcher, so no MPI) and as 2 workers.
sed 's/"multi_worker_mirrored"/"one_device"/; s/, "timeout_seconds": 20//' "$project" > "$work/one.json"
cp "$project" "$work/mw.json"

# The steps table of the only run in a store: "global_step loss" lines.
losses() {
  python3 - "$1" <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
for step, value in db.execute(
        "SELECT global_step, value FROM steps WHERE name = 'loss' ORDER BY global_step"):
    print(step, repr(value))
PY
}

# kill_and_resume STEP PATTERN: worker 1 of mw.json's run is killed after global step STEP; then
# `train --resume 1` under a new launch must log PATTERN, complete, and store every loss of an
# uninterrupted run bit for bit.
kill_and_resume() {
  OMP_NUM_THREADS=1 TRAINDECK_FAULT_WORKER="kill:1:$1" timeout 120 "$launch" 2 "$bin" train \
    "$work/mw.json" --plain --db "$work/killed.db" > "$work/killed.log" 2>&1
  [ $? != 0 ] || { cat "$work/killed.log"; fail "the launcher exited 0 although worker 1 died"; }
  OMP_NUM_THREADS=1 timeout 300 "$launch" 2 "$bin" train --resume 1 --plain \
    --db "$work/killed.db" > "$work/resumed.log" 2>&1
  local rc=$?
  cat "$work/resumed.log"
  [ $rc = 0 ] || fail "the resumed launch exited with $rc"
  grep -q "$2" "$work/resumed.log" || fail "no line '$2' in the resumed run's log"
  OMP_NUM_THREADS=1 timeout 300 "$launch" 2 "$bin" train "$work/mw.json" --plain \
    --db "$work/straight.db" > "$work/straight.log" 2>&1 || fail "the uninterrupted run failed"
  [ "$(losses "$work/killed.db" | wc -l)" = 48 ] || fail "expected 48 logged steps"
  [ "$(losses "$work/killed.db")" = "$(losses "$work/straight.db")" ] ||
    fail "the resumed run's losses differ from the uninterrupted run's"
  read -r count status message < <(run_status "$work/killed.db")
  [ "$count" = 1 ] && [ "$status" = completed ] ||
    fail "expected one completed run, found $count ($status)"
}

run_status() {
  python3 - "$1" <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
rows = list(db.execute("SELECT status, message FROM runs"))
print(len(rows), rows[0][0] if rows else "-", rows[0][1] if rows else "-")
PY
}

case "$what" in
  equal)
    timeout 300 "$bin" train "$work/one.json" --plain --db "$work/one.db" > "$work/one.log" 2>&1 ||
      { cat "$work/one.log"; fail "the one-process run failed"; }
    OMP_NUM_THREADS=1 timeout 300 "$launch" 2 "$bin" train "$work/mw.json" --plain \
      --db "$work/mw.db" > "$work/mw.log" 2>&1
    rc=$?
    cat "$work/mw.log"
    [ $rc = 0 ] || fail "mpirun -np 2 exited with $rc"
    grep -q "2 replicas (multi_worker_mirrored, 2 workers)" "$work/mw.log" ||
      fail "the chief did not report 2 replicas over 2 workers"
    [ "$(grep -c '^Stored in' "$work/mw.log")" = 1 ] || fail "expected one 'Stored in' (the chief)"
    python3 - "$work/one.db" "$work/mw.db" "$work/one.log" "$work/mw.log" <<'PY' || exit 1
import re, sqlite3, sys
def losses(path):
    db = sqlite3.connect(path)
    return [v for (v,) in db.execute(
        "SELECT value FROM steps WHERE name = 'loss' ORDER BY global_step")]
one, mw = losses(sys.argv[1]), losses(sys.argv[2])
if len(one) != 48 or len(mw) != 48:
    sys.exit(f"FAIL: expected 48 logged steps in each store, got {len(one)} and {len(mw)}")
worst = max(abs(a - b) / max(1e-6, abs(a)) for a, b in zip(one, mw))
print(f"per-step loss: largest relative difference {worst:.2e} over {len(one)} steps")
if worst > 1e-4:
    sys.exit("FAIL: the losses differ beyond float tolerance")
def test_metrics(path):
    text = open(path).read()
    m = re.search(r"^Test - test_accuracy: ([0-9.]+) - test_loss: ([0-9.]+)", text, re.M)
    if not m:
        sys.exit(f"FAIL: no test metrics in {path}")
    return float(m.group(1)), float(m.group(2))
(a1, l1), (a2, l2) = test_metrics(sys.argv[3]), test_metrics(sys.argv[4])
print(f"test accuracy {a1} vs {a2}, test loss {l1} vs {l2}")
if abs(a1 - a2) > 2 / 256 or abs(l1 - l2) > 1e-3 * max(1, l1):
    sys.exit("FAIL: the test metrics differ")
db = sqlite3.connect(sys.argv[2])
status = list(db.execute("SELECT status, devices FROM runs"))
if len(status) != 1 or status[0][0] != "completed":
    sys.exit(f"FAIL: the chief's store should hold one completed run, has {status}")
print("PASS: 2 workers == one process; the chief stored one run:", status[0][1])
PY
    # Both workers' figures reached the chief's store.
    python3 - "$work/mw.db" <<'PY' || exit 1
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
replicas = {r for (r,) in db.execute("SELECT DISTINCT replica FROM replica_stats")}
if replicas != {0, 1}:
    sys.exit(f"FAIL: per-replica figures of replicas {sorted(replicas)} in the store, expected 0 and 1")
print("PASS: per-replica figures of both workers stored")
PY
    ;;
  off)
    # shard_policy "off": every worker reads all the data in its own order with a batch of
    # 64 / 2, so an epoch has 1024 / 32 = 32 steps of the global batch of 64.
    sed 's/"timeout_seconds": 20/"timeout_seconds": 20, "shard_policy": "off"/' "$project" > "$work/off.json"
    OMP_NUM_THREADS=1 timeout 300 "$launch" 2 "$bin" train "$work/off.json" --plain \
      --db "$work/off.db" > "$work/off.log" 2>&1
    rc=$?
    cat "$work/off.log"
    [ $rc = 0 ] || fail "mpirun -np 2 with shard_policy off exited with $rc"
    grep -q "batch 64, 32 steps/epoch" "$work/off.log" || fail "expected 32 steps of 64 per epoch"
    python3 - "$work/off.db" <<'PY' || exit 1
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
steps = db.execute("SELECT COUNT(*) FROM steps WHERE name = 'loss'").fetchone()[0]
status = db.execute("SELECT status FROM runs").fetchone()[0]
if steps != 96 or status != "completed":
    sys.exit(f"FAIL: expected 96 logged steps of a completed run, got {steps} ({status})")
print("PASS: shard_policy off: 2 workers x 32 steps of 32 samples per epoch, run completed")
PY
    ;;
  kill | hang)
    sed 's/"timeout_seconds": 20/"timeout_seconds": 3/' "$project" > "$work/mw.json"
    t0=$(date +%s)
    OMP_NUM_THREADS=1 TRAINDECK_FAULT_WORKER="$what:1:5" timeout 120 "$launch" 2 "$bin" train \
      "$work/mw.json" --plain --db "$work/mw.db" > "$work/mw.log" 2>&1
    rc=$?
    elapsed=$(( $(date +%s) - t0 ))
    cat "$work/mw.log"
    [ $rc != 0 ] || fail "the launcher exited 0 although worker 1 $( [ "$what" = kill ] && echo died || echo hung)"
    [ $rc != 124 ] || fail "the job did not end within 120 s"
    [ "$elapsed" -le 60 ] || fail "the job took ${elapsed} s to end (bound 60 s)"
    grep -E "traindeck: error: .*(rank 1|worker rank 1)" "$work/mw.log" > /dev/null ||
      fail "no error naming worker rank 1"
    read -r count status message < <(run_status "$work/mw.db")
    [ "$count" = 1 ] || fail "expected one stored run, found $count"
    [ "$status" = failed ] || fail "the stored run is '$status', expected failed"
    echo "PASS: worker 1 ${what}: launcher exit $rc after ${elapsed} s; stored run failed: $message"
    ;;
  chief)
    sed 's/"timeout_seconds": 20/"timeout_seconds": 3/' "$project" > "$work/mw.json"
    t0=$(date +%s)
    OMP_NUM_THREADS=1 TRAINDECK_FAULT_WORKER="kill:0:5" timeout 120 "$launch" 2 "$bin" train \
      "$work/mw.json" --plain --db "$work/mw.db" > "$work/mw.log" 2>&1
    rc=$?
    elapsed=$(( $(date +%s) - t0 ))
    cat "$work/mw.log"
    [ $rc != 0 ] || fail "the launcher exited 0 although the chief died"
    [ "$elapsed" -le 60 ] || fail "the job took ${elapsed} s to end (bound 60 s)"
    read -r count status message < <(run_status "$work/mw.db")
    [ "$count" = 1 ] || fail "expected one stored run, found $count"
    [ "$status" = interrupted ] || fail "the stored run is '$status', expected interrupted"
    case "$message" in
      *"ended without a final status; worker rank 1 reported: "*) ;;
      *) fail "the run's message does not carry worker 1's report: $message" ;;
    esac
    echo "PASS: chief killed: launcher exit $rc after ${elapsed} s; stored run interrupted: $message"
    ;;
  resume)
    # Worker 1 killed in epoch 2 (16 steps an epoch); the chief's checkpoint at the end of epoch
    # 1 resumes the run under a new launch.
    kill_and_resume 20 "resuming from .*run-16.tdckpt at global step 16"
    echo "PASS: killed at step 20, resumed from step 16: 48 losses equal bit for bit"
    ;;
  resume_mid)
    # A ModelCheckpoint every 4 steps; worker 1 killed after step 22, so the newest checkpoint is
    # step 20, the 4th of epoch 2, with the epoch's loss and metric sums of both workers.
    python3 - "$work/mw.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["training"]["callbacks"] = [{"class_name": "ModelCheckpoint", "config": {"save_freq": 4,
                                                                         "keep_last": 2}}]
json.dump(p, open(sys.argv[1], "w"))
PY
    kill_and_resume 22 "resuming from .*model-20.tdckpt at global step 20 (epoch 2, step 4)"
    echo "PASS: killed at step 22, resumed mid-epoch from step 20: 48 losses equal bit for bit"
    ;;
  *) echo "check_mwms.sh: unknown case $what" >&2; exit 2 ;;
esac
