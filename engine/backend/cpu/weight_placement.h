// Where the CPU device places a weight matrix: on a cache line, or kWeightsOffset bytes past one
// where oneDNN runs AVX2 kernels and the rows lie a multiple of 1 KiB (at least 2 KiB) apart.
// The measurements behind the rule are at offsetWeights in cpu_device.cpp. Header-only, so that
// traindeck_bench_matmul, which links oneDNN alone, places its reference's weights the same way.
#pragma once

#include <cstddef>

#include "dnnl.hpp"

namespace td::cpu {

constexpr size_t kWeightsOffset = 16;

// Whether a weight matrix with rows `rowBytes` apart starts kWeightsOffset bytes past a cache line
// when oneDNN's effective instruction set is `isa`.
inline bool weightsOffsetFor(dnnl::cpu_isa isa, size_t rowBytes) {
    const bool avx2 =
        isa == dnnl::cpu_isa::avx || isa == dnnl::cpu_isa::avx2 || isa == dnnl::cpu_isa::avx2_vnni;
    return avx2 && rowBytes >= 2048 && rowBytes % 1024 == 0;
}

}  // namespace td::cpu
