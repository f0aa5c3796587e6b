// Body of the CPU kernels' inner loops, included once per instruction-set level by
// simd_kernels_{generic,avx2,avx512}.cpp, each compiled with its own -m flags. Everything lives
// in an unnamed namespace inside TD_SIMD_ISA_NAMESPACE, and only builtins are used, so no inline
// copy compiled for a higher level can be merged by the linker into the generic code.
#if !defined(TD_SIMD_ISA_NAMESPACE) || !defined(TD_SIMD_ISA_LEVEL)
#error "define TD_SIMD_ISA_NAMESPACE and TD_SIMD_ISA_LEVEL before including this file"
#endif

#include <cstdint>

#include "engine/backend/cpu/simd_kernels.h"

namespace td::cpu::TD_SIMD_ISA_NAMESPACE {
namespace {

// The same hash as keyedUniform() and the forward pass: the mask must not depend on the level.
inline uint32_t mix32(uint32_t h) {
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    return h;
}

void dropoutRow(const float* x, float* y, int64_t cols, uint32_t rowBase, uint32_t threshold,
                float keepScale) {
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
        const uint32_t h = mix32(rowBase ^ (static_cast<uint32_t>(c) * 0x9e3779b9u)) >> 8;
        y[c] = h >= threshold ? x[c] * keepScale : 0.f;
    }
}

void reluGrad(const float* dy, const float* s, float* dx, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dx[i] = s[i] > 0.f ? dy[i] : 0.f;
}

void maxArgStep(const float* x, float* best, int32_t* at, int64_t channels, int32_t base) {
#pragma omp simd
    for (int64_t c = 0; c < channels; ++c) {
        const bool more = x[c] > best[c];
        best[c] = more ? x[c] : best[c];
        at[c] = more ? base + static_cast<int32_t>(c) : at[c];
    }
}

}  // namespace

const simd::Table& table() {
    static constexpr simd::Table t{TD_SIMD_ISA_LEVEL, &dropoutRow, &reluGrad, &maxArgStep};
    return t;
}

}  // namespace td::cpu::TD_SIMD_ISA_NAMESPACE
