#include "engine/core/module_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

#ifndef TRAINDECK_MODULE_RELDIR
#define TRAINDECK_MODULE_RELDIR "../lib/traindeck"
#endif

namespace td {

namespace {

std::vector<std::filesystem::path> candidates(const std::string& fileName, const char* envVar) {
    if (const char* env = envVar ? std::getenv(envVar) : nullptr; env && *env) return {env};
    std::error_code ec;
    const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) return {fileName};  // left to the dynamic loader's own search path
    const auto dir = exe.parent_path();
    return {dir / fileName, dir.parent_path() / fileName,
            (dir / TRAINDECK_MODULE_RELDIR / fileName).lexically_normal()};
}

}  // namespace

Result<void*> loadModuleSymbol(const std::string& fileName, const char* envVar,
                               const char* symbol) {
    std::string tried;
    for (const auto& path : candidates(fileName, envVar)) {
        std::error_code ec;
        if (path.has_parent_path() && !std::filesystem::exists(path, ec)) {
            tried += "\n  " + path.string() + ": no such file";
            continue;
        }
        void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!handle) {
            const char* why = dlerror();
            tried += "\n  " + path.string() + ": " + (why ? why : "cannot be loaded");
            continue;
        }
        if (void* sym = dlsym(handle, symbol)) return sym;
        tried += "\n  " + path.string() + ": not the TrainDeck module (no " + symbol + ")";
        dlclose(handle);
    }
    return err(fileName + " could not be loaded:" + tried);
}

Result<SystemLibrary> SystemLibrary::open(const std::string& what,
                                          const std::vector<std::string>& sonames) {
    std::string tried;
    for (const std::string& soname : sonames) {
        if (void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL))
            return SystemLibrary(what, soname, handle);
        const char* e = dlerror();
        std::string why = e ? e : "cannot be loaded";
        // glibc's reason usually starts with the name already ("libx.so.1: cannot open ...").
        if (why.rfind(soname + ": ", 0) != 0) why = soname + ": " + why;
        tried += (tried.empty() ? "" : "; ") + why;
    }
    if (sonames.empty()) tried = "no library name given";
    return err("cannot load " + what + ": " + tried);
}

Status SystemLibrary::resolve(std::initializer_list<SymbolSlot> table) const {
    std::string missing;
    for (const SymbolSlot& entry : table) {
        void* address = dlsym(handle_, entry.name);
        entry.store(entry.slot, address);
        if (!address) missing += (missing.empty() ? "" : ", ") + std::string(entry.name);
    }
    if (!missing.empty()) return err(what_ + " (" + soname_ + ") has no " + missing);
    return Status::success();
}

}  // namespace td
