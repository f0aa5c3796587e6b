#!/usr/bin/env bash
# Sets up everything on a fresh Debian 12 machine, builds TrainDeck and runs it on its embedded
# default project (Fashion-MNIST, the TensorFlow guide's MLP): the desktop app when a display is
# present, otherwise a headless training run with a progress bar. Extra arguments go to traindeck.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/installer/deps.sh"
"$root/installer/build.sh"
bin="$root/build/traindeck"
if [ $# -gt 0 ]; then
  exec "$bin" "$@"
fi
# The desktop app when there is a display and the build has it: the app is a module beside the
# executable (app/gui_loader.cpp), which the headless commands never load. It opens the last
# project, or the embedded Fashion-MNIST default on first start.
if [ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ] && [ -f "$root/build/libtraindeck_gui.so" ]; then
  exec "$bin"
fi
exec "$bin" train "$root/projects/fashion_mnist_mlp.json"
