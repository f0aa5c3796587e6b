// Parts of TrainDeck that pull in large libraries live in modules loaded on first use, so a run
// that does not need them never maps those libraries: the desktop app (Qt's GUI stack,
// libtraindeck_gui.so) and the Keras weights file (HDF5 with its network and crypto libraries,
// libtraindeck_h5.so).
#pragma once

#include <string>

#include "engine/core/result.h"

namespace td {

// Opens module `fileName` (RTLD_NOW: every symbol it needs resolves now, or it is refused) and
// returns dlsym(handle, symbol). Where it looks, first match wins:
//   $envVar, a path to the file, when set (packagers, tests);
//   the running executable's folder, then its parent (the build tree: tests run from build/tests);
//   <executable's folder>/TRAINDECK_MODULE_RELDIR (the installed layout, <libdir>/traindeck).
// The error names every place tried and why each failed. A loaded module stays loaded.
Result<void*> loadModuleSymbol(const std::string& fileName, const char* envVar, const char* symbol);

}  // namespace td
