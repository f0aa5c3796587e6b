#!/usr/bin/env bash
# The GUI thread's event latency with the Runs tab open on a large store while a headless run
# writes into it: RUNS finished runs of STEPS logged steps each (filled through the store API by
# td_fill_store), one `traindeck train` running, SECONDS of measurement under Xvfb (the app's
# TRAINDECK_LATENCY_SECONDS mode: a 10 ms precise timer's lateness, worst / p99 / median).
#   installer/gui_runs_latency.sh [RUNS=10000] [STEPS=1000] [SECONDS=30] [BUILD_DIR=build]
# The filled store is kept as BUILD_DIR/latency-store/runs-RUNSxSTEPS.db and reused by later
# measurements (each adds the one run it trains); delete it to start afresh.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
runs="${1:-10000}"
steps="${2:-1000}"
seconds="${3:-30}"
build="${4:-$root/build}"
bin="$build/traindeck"
fill="$build/tests/td_fill_store"
for x in "$bin" "$fill"; do
  [ -x "$x" ] || { echo "gui_runs_latency.sh: $x not found; build first (cmake --build $build --target traindeck td_fill_store)" >&2; exit 1; }
done
command -v xvfb-run >/dev/null || { echo "gui_runs_latency.sh: needs xvfb-run (apt install xvfb xauth)" >&2; exit 1; }

mkdir -p "$build/latency-store"
db="$build/latency-store/runs-${runs}x${steps}.db"
if [ ! -f "$db.complete" ]; then
  rm -f "$db" "$db-wal" "$db-shm"
  echo "filling $db: $runs runs of $steps steps"
  "$fill" "$db" "$runs" "$steps" "$root/projects/synthetic_blobs.json"
  touch "$db.complete"
fi
echo "store: $(du -h "$db" | cut -f1), $("$bin" runs --db "$db" --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))') runs"

tmp="$(mktemp -d)"
trainer=""
cleanup() {
  if [ -n "$trainer" ]; then kill "$trainer" 2>/dev/null || true; wait "$trainer" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
export XDG_CONFIG_HOME="$tmp/config" XDG_DATA_HOME="$tmp/data"   # never touch the user's settings

"$bin" train "$root/projects/synthetic_blobs.json" --db "$db" --epochs 100000 --plain \
  --run-name "live (headless)" >"$tmp/train.log" 2>&1 &
trainer=$!
sleep 2
kill -0 "$trainer" 2>/dev/null || { echo "gui_runs_latency.sh: the headless run ended early:" >&2; cat "$tmp/train.log" >&2; exit 1; }

TRAINDECK_TAB=5 TRAINDECK_LATENCY_SECONDS="$seconds" \
  xvfb-run -a -s "-screen 0 1400x900x24" "$bin" --db "$db" 2>"$tmp/gui.log" | tee "$tmp/gui.out"
grep -q "GUI event latency" "$tmp/gui.out" || { echo "gui_runs_latency.sh: no measurement from the app:" >&2; cat "$tmp/gui.log" >&2; exit 1; }
kill -0 "$trainer" 2>/dev/null || { echo "gui_runs_latency.sh: the headless run ended during the measurement" >&2; exit 1; }
echo "headless run: still writing, $(grep -c "^Epoch" "$tmp/train.log" || true) epochs so far"
