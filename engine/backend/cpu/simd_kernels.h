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
    // ReLU's gradient over `rows` rows of `cols` channels with the column sums: v = s > 0 ? dy
    // : 0 (branch-free, as reluGrad), written to dx in f32 or, where dx16 is not null, to dx16
    // in bf16 rounded as floatToBf16 (engine/core/half.h); sums[c] += v row by row, in order, of
    // the values before rounding (a bias gradient).
    void (*reluGradSums)(const float* dy, const float* s, float* dx, uint16_t* dx16, float* sums,
                         int64_t rows, int64_t cols);
    // A max-pooling window of rows x cols positions, position (i, j) at x + i * rowStride + j *
    // channels: y[c] = the maximum of channel c (the first position, then a later one where
    // strictly greater).
    void (*maxWindow)(const float* x, float* y, int64_t rows, int64_t cols, int64_t rowStride,
                      int64_t channels);
    // The gradient through such a window when windows do not overlap: dx (laid out as x) gets
    // g[c] at the first maximum of channel c in row-major order (as maxArgStep finds it) and
    // +0 at the window's other positions; every position of the window is written.
    void (*maxWindowGrad)(const float* x, const float* g, float* dx, int64_t rows, int64_t cols,
                          int64_t rowStride, int64_t channels);
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
