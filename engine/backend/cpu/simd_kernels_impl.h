// Body of the CPU kernels' inner loops, included once per instruction-set level by
// simd_kernels_{generic,avx2,avx512}.cpp, each compiled with its own -m flags. Everything lives
// in an unnamed namespace inside TD_SIMD_ISA_NAMESPACE, and only builtins and functions of
// internal linkage (the dropout hash) are used, so no inline copy compiled for a higher level can
// be merged by the linker into the generic code.
#if !defined(TD_SIMD_ISA_NAMESPACE) || !defined(TD_SIMD_ISA_LEVEL)
#error "define TD_SIMD_ISA_NAMESPACE and TD_SIMD_ISA_LEVEL before including this file"
#endif

#include <cstdint>

#include "engine/backend/cpu/simd_kernels.h"
#include "engine/backend/dropout_hash.h"

namespace td::cpu::TD_SIMD_ISA_NAMESPACE {
namespace {

void dropoutRow(const float* x, float* y, int64_t cols, uint32_t rowBase, uint32_t threshold,
                float keepScale) {
    // Branch-free: the kept value ANDed with an all-ones or all-zero mask (+0 where dropped, as a
    // select gives). Written as a select, GCC turned it into a branch for AVX2 and kept the loop
    // scalar: 12 us for a [32,128] mask there, against 0.5 with AVX-512's masked moves. The hash
    // has 24 bits, so a signed compare (AVX2 has no unsigned one) gives the same answer.
    const auto limit = static_cast<int32_t>(threshold);
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
        const auto h = static_cast<int32_t>(kmath::dropoutHash24(rowBase, c));
        const uint32_t keep = 0u - static_cast<uint32_t>(h >= limit);
        y[c] = __builtin_bit_cast(float, __builtin_bit_cast(uint32_t, x[c] * keepScale) & keep);
    }
}

// One loop per case (no per-element decision); ReLU by ANDing bits, as dropoutRow.
template <bool kBias, bool kRelu>
void lastPartialLoop(float* o, const float* p, const float* bias, int64_t cols) {
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
        float v = o[c] + p[c];
        if constexpr (kBias) v = v + bias[c];
        if constexpr (kRelu)
            v = __builtin_bit_cast(
                float, __builtin_bit_cast(uint32_t, v) & (0u - static_cast<uint32_t>(v > 0.f)));
        o[c] = v;
    }
}

void lastPartialRow(float* o, const float* p, const float* bias, bool relu, int64_t cols) {
    if (bias)
        return relu ? lastPartialLoop<true, true>(o, p, bias, cols)
                    : lastPartialLoop<true, false>(o, p, bias, cols);
    return relu ? lastPartialLoop<false, true>(o, p, bias, cols)
                : lastPartialLoop<false, false>(o, p, bias, cols);
}

// Branch-free as dropoutRow, for the same reason.
void reluGrad(const float* dy, const float* s, float* dx, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
        const uint32_t active = 0u - static_cast<uint32_t>(s[i] > 0.f);
        dx[i] = __builtin_bit_cast(float, __builtin_bit_cast(uint32_t, dy[i]) & active);
    }
}

void maxArgStep(const float* x, float* best, int32_t* at, int64_t channels, int32_t base) {
#pragma omp simd
    for (int64_t c = 0; c < channels; ++c) {
        const bool more = x[c] > best[c];
        best[c] = more ? x[c] : best[c];
        at[c] = more ? base + static_cast<int32_t>(c) : at[c];
    }
}

template <bool kBf16>
void reluGradSumsLoop(const float* dy, const float* s, float* dx, uint16_t* dx16,
                      float* __restrict sums, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* g = dy + r * cols;
        const float* a = s + r * cols;
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) {
            const uint32_t active = 0u - static_cast<uint32_t>(a[c] > 0.f);
            const uint32_t bits = __builtin_bit_cast(uint32_t, g[c]) & active;
            const float v = __builtin_bit_cast(float, bits);
            sums[c] += v;
            if constexpr (kBf16) {
                // floatToBf16: NaN quieted, else rounded to nearest even.
                const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
                const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
                dx16[r * cols + c] = static_cast<uint16_t>(nan ? (bits >> 16) | 0x40u : rounded);
            } else {
                dx[r * cols + c] = v;
            }
        }
    }
}

void reluGradSums(const float* dy, const float* s, float* dx, uint16_t* dx16, float* sums,
                  int64_t rows, int64_t cols) {
    if (dx16)
        reluGradSumsLoop<true>(dy, s, dx, dx16, sums, rows, cols);
    else
        reluGradSumsLoop<false>(dy, s, dx, dx16, sums, rows, cols);
}

// A max-pooling window of rows x cols positions (position (i, j) at x + i * rowStride + j *
// channels), every channel at once in chunks that stay in registers and L1: the first position,
// then a later one where strictly greater (the first maximum in row-major order).
constexpr int64_t kWindowChunk = 64;

void maxWindow(const float* x, float* y, int64_t rows, int64_t cols, int64_t rowStride,
               int64_t channels) {
    for (int64_t c0 = 0; c0 < channels; c0 += kWindowChunk) {
        const int64_t n = channels - c0 < kWindowChunk ? channels - c0 : kWindowChunk;
        float* out = y + c0;
        const float* first = x + c0;
#pragma omp simd
        for (int64_t c = 0; c < n; ++c) out[c] = first[c];
        for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = i == 0 ? 1 : 0; j < cols; ++j) {
                const float* p = x + i * rowStride + j * channels + c0;
#pragma omp simd
                for (int64_t c = 0; c < n; ++c) out[c] = p[c] > out[c] ? p[c] : out[c];
            }
    }
}

void maxWindowGrad(const float* x, const float* g, float* dx, int64_t rows, int64_t cols,
                   int64_t rowStride, int64_t channels) {
    float best[kWindowChunk];
    int32_t at[kWindowChunk];
    for (int64_t c0 = 0; c0 < channels; c0 += kWindowChunk) {
        const int64_t n = channels - c0 < kWindowChunk ? channels - c0 : kWindowChunk;
        const float* first = x + c0;
#pragma omp simd
        for (int64_t c = 0; c < n; ++c) {
            best[c] = first[c];
            at[c] = 0;
        }
        for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = i == 0 ? 1 : 0; j < cols; ++j) {
                const float* p = x + i * rowStride + j * channels + c0;
                const auto here = static_cast<int32_t>(i * cols + j);
#pragma omp simd
                for (int64_t c = 0; c < n; ++c) {
                    const bool more = p[c] > best[c];
                    best[c] = more ? p[c] : best[c];
                    at[c] = more ? here : at[c];
                }
            }
        const float* gc = g + c0;
        for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = 0; j < cols; ++j) {
                float* q = dx + i * rowStride + j * channels + c0;
                const auto here = static_cast<int32_t>(i * cols + j);
#pragma omp simd
                for (int64_t c = 0; c < n; ++c) {
                    // Branch-free as dropoutRow: g ANDed with an all-ones or all-zero mask.
                    const uint32_t hit = 0u - static_cast<uint32_t>(at[c] == here);
                    q[c] = __builtin_bit_cast(float, __builtin_bit_cast(uint32_t, gc[c]) & hit);
                }
            }
    }
}

void expShifted(const float* x, float shift, float* y, int64_t n) {
    // Round to nearest by the 1.5 * 2^23 trick (no rounding call, so the loop vectorises); ln2 in
    // two parts, the first with trailing zero bits so that k * ln2Hi is exact for |k| <= 2^11.
    constexpr float kLog2e = 1.44269504088896341f, kRound = 12582912.0f;
    constexpr float kLn2Hi = 0.693145751953125f, kLn2Lo = 1.42860682030941723e-6f;
    constexpr float kLow = -87.3365479f, kHigh = 88.0f;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
        // Selects by masks, as in dropoutRow (GCC keeps a float select a branch); NaN passes both
        // clamps.
        float t = x[i] - shift;
        const uint32_t under = 0u - static_cast<uint32_t>(t < kLow);
        const uint32_t over = 0u - static_cast<uint32_t>(t > kHigh);
        t = __builtin_bit_cast(float, (__builtin_bit_cast(uint32_t, t) & ~(under | over)) |
                                          (__builtin_bit_cast(uint32_t, kLow) & under) |
                                          (__builtin_bit_cast(uint32_t, kHigh) & over));
        const float k = (t * kLog2e + kRound) - kRound;
        const float r = (t - k * kLn2Hi) - k * kLn2Lo;
        float p = 1.0f / 5040.0f;
        p = p * r + 1.0f / 720.0f;
        p = p * r + 1.0f / 120.0f;
        p = p * r + 1.0f / 24.0f;
        p = p * r + 1.0f / 6.0f;
        p = p * r + 0.5f;
        p = p * r + 1.0f;
        p = p * r + 1.0f;
        // 2^k from its exponent bits (k in [-126, 127] after the clamps; a NaN's k is whatever
        // the conversion gives, and p is NaN).
        const auto bits = static_cast<uint32_t>(static_cast<int32_t>(k) + 127) << 23;
        const float e = p * __builtin_bit_cast(float, bits);
        y[i] = __builtin_bit_cast(float, __builtin_bit_cast(uint32_t, e) & ~under);
    }
}

}  // namespace

const simd::Table& table() {
    static constexpr simd::Table t{TD_SIMD_ISA_LEVEL, &dropoutRow,    &lastPartialRow,
                                   &reluGrad,         &maxArgStep,    &reluGradSums,
                                   &maxWindow,        &maxWindowGrad, &expShifted};
    return t;
}

}  // namespace td::cpu::TD_SIMD_ISA_NAMESPACE
