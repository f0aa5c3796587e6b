// The desktop app lives in a module (engine/core/module_loader.h) so that the headless commands
// never load Qt's GUI libraries: a server without them runs `traindeck train`, and each headless
// run saves the memory and start-up time those libraries take.
#include "app/gui_loader.h"

#include <cstdio>

#include "engine/core/module_loader.h"

namespace td::app {

int launchGui(int argc, char** argv, const std::string& db, const std::string& project, bool start,
              bool quitWhenDone) {
    using EntryFn = int (*)(int, char**, const char*, const char*, int, int, const char*);
    auto entry =
        loadModuleSymbol("libtraindeck_gui.so", "TRAINDECK_GUI_MODULE", "traindeck_gui_main");
    if (!entry.ok()) {
        std::fprintf(stderr,
                     "traindeck: the desktop app: %s\nThe headless commands work without it "
                     "(traindeck --help; traindeck train PROJECT).\n",
                     entry.error().c_str());
        return 1;
    }
    // The module checks that it was built for this version (an old module next to a new
    // executable returns 1 with a message instead of running against another engine).
    return reinterpret_cast<EntryFn>(*entry)(argc, argv, db.c_str(), project.c_str(), start ? 1 : 0,
                                             quitWhenDone ? 1 : 0, TRAINDECK_VERSION);
}

}  // namespace td::app
