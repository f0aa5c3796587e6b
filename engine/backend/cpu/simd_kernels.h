// Inner loops of the CPU kernels that the baseline x86-64 instruction set cannot vectorise
// (SSE2 has no 32-bit lane multiply), compiled once per instruction-set level and chosen at run
// time (engine/core/cpu_isa.h). Every level computes the same integer and IEEE float operations,
// so all levels give bit-identical results. Private to engine/backend/cpu and its tests.
#pragma once

#include <cstdint>

#include "engine/core/cpu_isa.h"

namespace td::cpu::simd {

struct Table {
    CpuIsa isa;
    // One row of inverted dropout: y[c] = x[c] * keepScale when
    // mix32(rowBase ^ (c * 0x9e3779b9)) >> 8 >= threshold, else 0, for c in [0, cols).
    void (*dropoutRow)(const float* x, float* y, int64_t cols, uint32_t rowBase, uint32_t threshold,
                       float keepScale);
    // The last pass over one row of a product split along K: o[c] = (o[c] + p[c]) + bias[c]
    // (bias null: no such term), with ReLU v > 0 ? v : +0 (NaN gives +0).
    void (*lastPartialRow)(float* o, const float* p, const float* bias, bool relu, int64_t cols);
    // ReLU's gradient: dx[i] = s[i] > 0 ? dy[i] : 0 (s: the input or the output), branch-free.
    void (*reluGrad)(const float* dy, const float* s, float* dx, int64_t n);
    // One position of a max-pooling window, every channel at once: where x[c] > best[c] (a later
    // position wins only when strictly greater), best[c] = x[c] and at[c] = base + c.
    void (*maxArgStep)(const float* x, float* best, int32_t* at, int64_t channels, int32_t base);
    // y[i] = exp(x[i] - shift) for x[i] - shift <= 88 (softmax's rows, shifted by their max, stay
    // at or below 0). Cody-Waite reduction to
    // r in [-ln2/2, ln2/2] and a degree-7 Taylor polynomial (truncation below 2^-27): within
    // about one unit in the last place of std::exp; values below -87.3365 (where std::exp goes
    // subnormal) give 0, NaN gives NaN.
    void (*expShifted)(const float* x, float shift, float* y, int64_t n);
};

// The loops of one level (the generic ones for a level this build has none for).
const Table& kernelsFor(CpuIsa isa);
// The loops for activeCpuIsa(), looked up once.
const Table& activeKernels();

}  // namespace td::cpu::simd
