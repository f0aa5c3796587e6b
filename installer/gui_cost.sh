#!/usr/bin/env bash
# Measures what the desktop app costs a training run: the seed project trained headless and
# started from the GUI (under Xvfb, Monitor tab live), alternating A/B/A/B on this machine, with
# steady samples/s (epochs after the first) read back from each run's store. Also prints the GUI
# thread's event latency during the GUI runs.
#   installer/gui_cost.sh [EPOCHS=4] [ROUNDS=2]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/traindeck"
epochs="${1:-4}"
rounds="${2:-2}"
[ -x "$bin" ] || { echo "gui_cost.sh: build first (installer/build.sh)" >&2; exit 1; }
command -v xvfb-run >/dev/null || { echo "gui_cost.sh: needs xvfb-run (apt install xvfb xauth)" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export XDG_CONFIG_HOME="$tmp/config" XDG_DATA_HOME="$tmp/data"   # never touch the user's settings
python3 - "$root/projects/fashion_mnist_mlp.json" "$tmp/seed.json" "$epochs" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["training"]["epochs"] = int(sys.argv[3])
base = sys.argv[1].rsplit("/", 1)[0]
json.dump(p, open(sys.argv[2], "w"), indent=2)
PY
steady() {  # steady samples/s of the newest run in a store
  "$bin" show "$2" --db "$1" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
e = r["epochs"][1:] or r["epochs"]
print(round(60000 * len(e) / sum(x["seconds"] for x in e)))'
}
echo "seed project, $epochs epochs, $rounds rounds (A = headless, B = GUI)"
for i in $(seq 1 "$rounds"); do
  "$bin" train "$tmp/seed.json" --db "$tmp/headless.db" --run-name "headless-$i" --plain >/dev/null
  h=$(steady "$tmp/headless.db" "headless-$i")
  out=$(xvfb-run -a -s "-screen 0 1400x900x24" "$bin" --db "$tmp/gui.db" "$tmp/seed.json" --start --quit-when-done 2>/dev/null)
  g=$("$bin" runs --db "$tmp/gui.db" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')
  g=$(steady "$tmp/gui.db" "$g")
  echo "round $i: headless $h samples/s, GUI $g samples/s, GUI/headless $(python3 -c "print(f'{$g/$h:.3f}')")"
  echo "  ${out##*; }"
done
