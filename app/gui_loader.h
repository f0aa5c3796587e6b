// Opens the desktop app's module (libtraindeck_gui.so) and runs it; see app/gui_loader.cpp.
#pragma once

#include <string>

namespace td::app {

// Runs the desktop app. Returns its exit code, or 1 with a message on stderr naming the module
// and why it did not load (no such file, a missing Qt library, a module of another version).
int launchGui(int argc, char** argv, const std::string& db, const std::string& project, bool start,
              bool quitWhenDone);

}  // namespace td::app
