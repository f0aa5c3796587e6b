// Compile-time proof without a GPU: every kernel source the CUDA backend compiles at run time
// (cudaRuntimeKernelSources) compiles to PTX through NVRTC for each target architecture, and the
// PTX holds the kernel's entry. A broken source fails with NVRTC's log. Exit 77 (CTest SKIP) with
// the reason on a build without the CUDA backend.
#include <cstdio>
#include <string>

#ifdef TRAINDECK_HAVE_CUDA
#include "engine/backend/cuda/nvrtc_compile.h"
#endif

int main() {
#ifndef TRAINDECK_HAVE_CUDA
    std::printf(
        "SKIP: this build has no CUDA backend (the CUDA toolkit was not found when it "
        "was configured)\n");
    return 77;
#else
    int failures = 0;
    const auto check = [&](bool ok, const std::string& what) {
        std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
        if (!ok) ++failures;
    };
    auto version = td::cuda::nvrtcLibraryVersion();
    check(version.ok(),
          "NVRTC loads" + (version.ok() ? " (" + *version + ")" : ": " + version.error()));
    if (!version.ok()) return 1;

    const auto sources = td::cuda::cudaRuntimeKernelSources();
    check(!sources.empty(), "cudaRuntimeKernelSources lists at least one kernel");
    for (int cc : {80, 90}) {
        for (const auto& [name, source] : sources) {
            const std::string entry = name.substr(0, name.find('.'));
            const std::string what = name + " -> PTX for compute_" + std::to_string(cc);
            auto ptx = td::cuda::compileToPtx(name, source, {cc, {}});
            if (!ptx.ok()) {
                check(false, what + ": " + ptx.error());
                continue;
            }
            check(ptx->find(".target sm_" + std::to_string(cc)) != std::string::npos,
                  what + ": targets sm_" + std::to_string(cc));
            check(ptx->find(".entry " + entry) != std::string::npos, what + ": has entry " + entry);
        }
    }

    // The failure path: a broken source is an error carrying the compiler's log.
    auto broken = td::cuda::compileToPtx(
        "broken.cu", "extern \"C\" __global__ void k(float* y) { y[0] = undefined_name; }\n");
    check(!broken.ok() && broken.error().find("undefined_name") != std::string::npos &&
              broken.error().find("broken.cu") != std::string::npos,
          "a broken source fails with NVRTC's log" +
              (broken.ok() ? std::string(" (it compiled)") : ": " + broken.error()));
    // Extra options reach the compiler: a macro the source needs.
    auto defined = td::cuda::compileToPtx(
        "macro.cu", "extern \"C\" __global__ void td_fill(float* y) { y[0] = TD_VALUE; }\n",
        {90, {"-DTD_VALUE=2.5f"}});
    check(defined.ok() && defined->find(".entry td_fill") != std::string::npos,
          "extra options reach NVRTC" + (defined.ok() ? "" : ": " + defined.error()));

    std::printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
#endif
}
