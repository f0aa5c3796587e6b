// Run-time compilation of CUDA C++ to PTX through NVRTC. NVRTC needs no GPU and no driver, so
// kernels generated at run time are proven to compile on build machines without one (CTest
// test_nvrtc compiles every entry of cudaRuntimeKernelSources for each target architecture).
//
// libnvrtc is loaded on first use (dlopen), not linked: a CUDA build of TrainDeck still starts on
// a machine without the CUDA libraries, and only compiling a kernel reports that NVRTC is missing.
// Thread-safe: every call makes its own NVRTC program.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/core/result.h"

namespace td::cuda {

struct PtxOptions {
    // Virtual architecture the PTX targets, as in compute_XY: 80 = A100, 90 = H100/H200.
    int computeCapability = 80;
    // Further NVRTC options, e.g. "-default-device", "--use_fast_math", "-DTILE=64".
    std::vector<std::string> extraOptions;
};

// Compiles `source` (CUDA C++; kernels declared extern "C" keep their names in the PTX) to PTX.
// `name` names the source in the compiler's log. Errors: NVRTC missing, or the compile failed,
// with NVRTC's log ("kernel.cu(3): error: identifier \"x\" is undefined").
Result<std::string> compileToPtx(const std::string& name, const std::string& source,
                                 const PtxOptions& options = {});

// The NVRTC library's version, "13.0"; an error when it cannot be loaded (the reason).
Result<std::string> nvrtcLibraryVersion();

// Every CUDA C++ source the backend generates or keeps as text to compile at run time, as
// (name, source) pairs; each kernel is extern "C" and named after its entry (the name before
// the first '.', e.g. "td_axpy_f32.cu" -> entry td_axpy_f32). Defined in runtime_kernels.cpp.
std::vector<std::pair<std::string, std::string>> cudaRuntimeKernelSources();

}  // namespace td::cuda
