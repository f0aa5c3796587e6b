#include "engine/backend/cuda/nvrtc_compile.h"

#include <cuda.h>
#include <nvrtc.h>

#include "engine/core/module_loader.h"

namespace td::cuda {

namespace {

// The NVRTC entry points, resolved once from the shared library (core/module_loader.h).
struct NvrtcApi {
    std::string loadError;  // empty: every entry point below is there
    decltype(&::nvrtcVersion) version = nullptr;
    decltype(&::nvrtcGetErrorString) errorString = nullptr;
    decltype(&::nvrtcCreateProgram) createProgram = nullptr;
    decltype(&::nvrtcDestroyProgram) destroyProgram = nullptr;
    decltype(&::nvrtcCompileProgram) compileProgram = nullptr;
    decltype(&::nvrtcGetProgramLogSize) getProgramLogSize = nullptr;
    decltype(&::nvrtcGetProgramLog) getProgramLog = nullptr;
    decltype(&::nvrtcGetPTXSize) getPtxSize = nullptr;
    decltype(&::nvrtcGetPTX) getPtx = nullptr;
};

NvrtcApi loadNvrtc() {
    NvrtcApi api;
    // The major version this build's headers belong to first (NVRTC's ABI is stable within a
    // major version), then whatever libnvrtc.so the loader finds.
    auto lib = SystemLibrary::open(
        "NVRTC", {"libnvrtc.so." + std::to_string(CUDA_VERSION / 1000), "libnvrtc.so"});
    if (!lib.ok()) {
        api.loadError = lib.error() +
                        " (install the CUDA toolkit's NVRTC or add its folder to LD_LIBRARY_PATH)";
        return api;
    }
    const Status resolved = lib->resolve({{"nvrtcVersion", api.version},
                                          {"nvrtcGetErrorString", api.errorString},
                                          {"nvrtcCreateProgram", api.createProgram},
                                          {"nvrtcDestroyProgram", api.destroyProgram},
                                          {"nvrtcCompileProgram", api.compileProgram},
                                          {"nvrtcGetProgramLogSize", api.getProgramLogSize},
                                          {"nvrtcGetProgramLog", api.getProgramLog},
                                          {"nvrtcGetPTXSize", api.getPtxSize},
                                          {"nvrtcGetPTX", api.getPtx}});
    if (!resolved.ok()) api.loadError = resolved.error();
    return api;
}

// Loaded on first use; never unloaded (programs may still be compiled at exit).
const NvrtcApi& nvrtc() {
    static const NvrtcApi api = loadNvrtc();
    return api;
}

}  // namespace

Result<std::string> nvrtcLibraryVersion() {
    const NvrtcApi& api = nvrtc();
    if (!api.loadError.empty()) return err(api.loadError);
    int major = 0;
    int minor = 0;
    if (api.version(&major, &minor) != NVRTC_SUCCESS) return err("NVRTC: nvrtcVersion failed");
    return std::to_string(major) + "." + std::to_string(minor);
}

Result<std::string> compileToPtx(const std::string& name, const std::string& source,
                                 const PtxOptions& options) {
    const NvrtcApi& api = nvrtc();
    if (!api.loadError.empty()) return err(api.loadError);
    const auto fail = [&](const std::string& call, nvrtcResult r) {
        return err(name + ": " + call + ": " + api.errorString(r));
    };
    nvrtcProgram prog = nullptr;
    nvrtcResult r = api.createProgram(&prog, source.c_str(), name.c_str(), 0, nullptr, nullptr);
    if (r != NVRTC_SUCCESS) return fail("nvrtcCreateProgram", r);
    // compute_XY (a virtual architecture): NVRTC emits PTX; an sm_XY target would emit a cubin.
    std::vector<std::string> args = {
        "--gpu-architecture=compute_" + std::to_string(options.computeCapability), "-std=c++17"};
    args.insert(args.end(), options.extraOptions.begin(), options.extraOptions.end());
    std::vector<const char*> argv;
    for (const std::string& a : args) argv.push_back(a.c_str());
    r = api.compileProgram(prog, static_cast<int>(argv.size()), argv.data());
    std::string log;
    size_t logSize = 0;
    if (api.getProgramLogSize(prog, &logSize) == NVRTC_SUCCESS && logSize > 1) {
        log.resize(logSize);
        if (api.getProgramLog(prog, log.data()) != NVRTC_SUCCESS) log.clear();
        while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
    }
    if (r != NVRTC_SUCCESS) {
        api.destroyProgram(&prog);
        return err(name + ": NVRTC compile for compute_" +
                   std::to_string(options.computeCapability) + " failed (" + api.errorString(r) +
                   ")" + (log.empty() ? "" : ":\n" + log));
    }
    size_t ptxSize = 0;
    r = api.getPtxSize(prog, &ptxSize);
    std::string ptx;
    if (r == NVRTC_SUCCESS) {
        ptx.resize(ptxSize);
        r = api.getPtx(prog, ptx.data());
    }
    api.destroyProgram(&prog);
    if (r != NVRTC_SUCCESS) return fail("nvrtcGetPTX", r);
    while (!ptx.empty() && ptx.back() == '\0') ptx.pop_back();
    return ptx;
}

}  // namespace td::cuda
