// Libraries TrainDeck opens at run time instead of linking them:
//
// - Its own modules: parts of TrainDeck that pull in large libraries live in modules loaded on
//   first use, so a run that does not need them never maps those libraries: the desktop app (Qt's
//   GUI stack, libtraindeck_gui.so) and the Keras weights file (HDF5 with its network and crypto
//   libraries, libtraindeck_h5.so). loadModuleSymbol finds and opens them.
// - System libraries: the CUDA libraries (cuBLASLt, cuDNN, NCCL, NVRTC) and NVML are opened when
//   a feature first needs them (SystemLibrary), so a CUDA build starts on a machine without them
//   and only that feature is unavailable, with the reason.
//
// Both open with RTLD_NOW | RTLD_LOCAL (every symbol a library needs resolves at once, or it is
// refused; its symbols stay out of the global namespace) and keep what they opened loaded for
// the process.
#pragma once

#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/core/result.h"

namespace td {

// Opens module `fileName` (RTLD_NOW: every symbol it needs resolves now, or it is refused) and
// returns dlsym(handle, symbol). Where it looks, first match wins:
//   $envVar, a path to the file, when set (packagers, tests);
//   the running executable's folder, then its parent (the build tree: tests run from build/tests);
//   <executable's folder>/TRAINDECK_MODULE_RELDIR (the installed layout, <libdir>/traindeck).
// The error names every place tried and why each failed. A loaded module stays loaded.
Result<void*> loadModuleSymbol(const std::string& fileName, const char* envVar, const char* symbol);

// One entry of a symbol table: an exported function's name and the function pointer it fills,
// written SymbolSlot("cudnnCreate", lib.cudnnCreate) for a member `decltype(&::cudnnCreate)`.
struct SymbolSlot {
    template <typename Fn>
    SymbolSlot(const char* symbolName, Fn*& fn)
        : name(symbolName), slot(&fn), store([](void* s, void* address) {
              *static_cast<Fn**>(s) = reinterpret_cast<Fn*>(address);
          }) {
        static_assert(std::is_function_v<Fn>, "a symbol table fills function pointers");
    }

    const char* name;
    void* slot;                                // the Fn* to fill
    void (*store)(void* slot, void* address);  // writes dlsym's address into it as an Fn*
};

// A system library found by the dynamic loader's own search (LD_LIBRARY_PATH, the ld.so cache,
// the default folders), e.g.
//
//   TD_ASSIGN_OR_RETURN(SystemLibrary lib,
//                       SystemLibrary::open("cuDNN", {"libcudnn.so.9", "libcudnn.so"}));
//   TD_RETURN_IF_ERROR(lib.resolve({{"cudnnCreate", api.cudnnCreate}, ...}));
//
// Never closed: a copy is only a name for the loaded library.
class SystemLibrary {
  public:
    // Opens the first of `sonames` that loads (give the versioned soname of the ABI the build was
    // made against first). `what` names the library in messages. The error names every soname
    // tried with dlerror's reason: "cannot load cuDNN: libcudnn.so.9: cannot open shared object
    // file: No such file or directory; libcudnn.so: cannot open shared object file: ...".
    static Result<SystemLibrary> open(const std::string& what,
                                      const std::vector<std::string>& sonames);

    // Fills every slot of `table` with its symbol's address (null where the library has none).
    // The error names each missing symbol: "cuDNN (libcudnn.so.9) has no cudnnFoo, cudnnBar".
    Status resolve(std::initializer_list<SymbolSlot> table) const;

    // The soname that was opened.
    const std::string& soname() const { return soname_; }

  private:
    SystemLibrary(std::string what, std::string soname, void* handle)
        : what_(std::move(what)), soname_(std::move(soname)), handle_(handle) {}

    std::string what_;
    std::string soname_;
    void* handle_ = nullptr;
};

}  // namespace td
