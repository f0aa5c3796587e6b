// Entry point of the desktop app, called by app/main.cpp when no headless subcommand is given.
#pragma once

#include <string>

namespace td::ui {

// dbPath: run store (empty: the last one used, else AppDataLocation/runs.db). projectPath: the
// project to open (empty: the last project, else the built-in Fashion-MNIST example). start: begin
// training at once (scripted demos); quitWhenDone: leave the event loop when that run ends (for
// measurements such as installer/gui_cost.sh). Returns the exit code of the event loop.
// Environment: TRAINDECK_SCREENSHOTS=DIR renders each panel to DIR/*.png during the run and quits.
int runGui(int argc, char** argv, const std::string& dbPath, const std::string& projectPath,
           bool start, bool quitWhenDone = false);

}  // namespace td::ui
