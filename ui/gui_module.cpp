// The desktop app's entry point as libtraindeck_gui.so exports it to app/gui_loader.cpp.
#include <cstdio>
#include <cstring>

#include "ui/gui_main.h"

extern "C" __attribute__((visibility("default"))) int traindeck_gui_main(
    int argc, char** argv, const char* db, const char* project, int start, int quitWhenDone,
    const char* hostVersion) {
    // The module runs on the engine of the executable that loaded it: only the same build's.
    if (!hostVersion || std::strcmp(hostVersion, TRAINDECK_VERSION) != 0) {
        std::fprintf(stderr,
                     "traindeck: the desktop app module is TrainDeck %s, the executable %s: "
                     "install them together\n",
                     TRAINDECK_VERSION, hostVersion ? hostVersion : "(unknown)");
        return 1;
    }
    return td::ui::runGui(argc, argv, db ? db : "", project ? project : "", start != 0,
                          quitWhenDone != 0);
}
