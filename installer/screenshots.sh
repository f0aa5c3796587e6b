#!/usr/bin/env bash
# Renders each panel of the app during a real training run under Xvfb into docs/screenshots/.
#   installer/screenshots.sh [BUILD_DIR] [PROJECT.json]
# Needs xvfb-run (Debian: xvfb xauth xfonts-base). The run goes to a temporary database; the
# screenshots are model.png, data.png, training.png, monitor.png and runs.png.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
project="${2:-$root/projects/fashion_mnist_mlp.json}"
out="$root/docs/screenshots"
bin="$build/traindeck"
[ -x "$bin" ] || { echo "screenshots.sh: $bin not found; build first (installer/build.sh)" >&2; exit 1; }
command -v xvfb-run >/dev/null || { echo "screenshots.sh: xvfb-run not found (apt install xvfb)" >&2; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
# A first short run so the Runs panel has something to compare with the live one.
"$bin" train "$project" --db "$tmp/runs.db" --epochs 1 --run-name "warm-up (CLI)" --plain >/dev/null
# Own settings and data folders: never touch the user's.
export XDG_CONFIG_HOME="$tmp/config" XDG_DATA_HOME="$tmp/data"
export TRAINDECK_SCREENSHOTS="$out" TRAINDECK_SCREENSHOT_SECONDS="${TRAINDECK_SCREENSHOT_SECONDS:-5}"
timeout 300 xvfb-run -a -s "-screen 0 1600x1000x24" \
  "$bin" --db "$tmp/runs.db" "$project" --start
ls -l "$out"/*.png
