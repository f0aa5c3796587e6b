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
    // Branch-free: the kept value ANDed with an all-ones or all-zero mask (+0 where dropped, as a
    // select gives). Written as a select, GCC turned it into a branch for AVX2 and kept the loop
    // scalar: 12 us for a [32,128] mask there, against 0.5 with AVX-512's masked moves. The hash
    // has 24 bits, so a signed compare (AVX2 has no unsigned one) gives the same answer.
    const auto limit = static_cast<int32_t>(threshold);
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
        const auto h =
            static_cast<int32_t>(mix32(rowBase ^ (static_cast<uint32_t>(c) * 0x9e3779b9u)) >> 8);
        const uint32_t keep = 0u - static_cast<uint32_t>(h >= limit);
        y[c] = __builtin_bit_cast(float, __builtin_bit_cast(uint32_t, x[c] * keepScale) & keep);
    }
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

// The level's register of floats (GCC lowers the generic build's to SSE2 or scalars).
#if defined(__AVX512F__)
using VecF = float __attribute__((vector_size(64)));
#elif defined(__AVX__)
using VecF = float __attribute__((vector_size(32)));
#else
using VecF = float __attribute__((vector_size(16)));
#endif
constexpr int64_t kLanes = static_cast<int64_t>(sizeof(VecF) / sizeof(float));
static_assert(simd::kSmallProductPad % (2 * kLanes) == 0);

inline int64_t lesser(int64_t a, int64_t b) {
    return a < b ? a : b;
}

inline VecF splat(float x) {
    return VecF{} + x;
}

inline VecF loadVec(const float* p) {
    VecF v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}

// Four rows of c by two registers of columns at a time: eight sums in registers, each row's
// a(m, k) broadcast once per k for both registers. Every element's sum runs over k in order with
// a separate multiply and add (this file is compiled without contraction), so the result does
// not depend on the register width.
void smallProduct(const simd::SmallProduct& p) {
    const int64_t M = p.M, N = p.N, K = p.K, ldb = p.ldb, aRow = p.aRow, aCol = p.aCol;
    const int64_t ldc = p.ldc;
    const float* const bias = p.bias;
    const bool relu = p.relu;
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
        // Rows past M repeat the last one and are not stored.
        const float* a0 = p.a + lesser(m0, M - 1) * aRow;
        const float* a1 = p.a + lesser(m0 + 1, M - 1) * aRow;
        const float* a2 = p.a + lesser(m0 + 2, M - 1) * aRow;
        const float* a3 = p.a + lesser(m0 + 3, M - 1) * aRow;
        for (int64_t n0 = 0; n0 < N; n0 += 2 * kLanes) {
            VecF s00{}, s01{}, s10{}, s11{}, s20{}, s21{}, s30{}, s31{};
            const float* bk = p.b + n0;
            int64_t ak = 0;
            for (int64_t k = 0; k < K; ++k, bk += ldb, ak += aCol) {
                const VecF b0 = loadVec(bk), b1 = loadVec(bk + kLanes);
                const VecF x0 = splat(a0[ak]), x1 = splat(a1[ak]), x2 = splat(a2[ak]),
                           x3 = splat(a3[ak]);
                s00 = s00 + x0 * b0;
                s01 = s01 + x0 * b1;
                s10 = s10 + x1 * b0;
                s11 = s11 + x1 * b1;
                s20 = s20 + x2 * b0;
                s21 = s21 + x2 * b1;
                s30 = s30 + x3 * b0;
                s31 = s31 + x3 * b1;
            }
            const int64_t cols = lesser(2 * kLanes, N - n0);
            VecF bias0{}, bias1{};
            if (bias) {
                bias0 = loadVec(bias + n0);
                bias1 = loadVec(bias + n0 + kLanes);
            }
            const auto store = [&](int64_t r, VecF lo, VecF hi) {
                if (m0 + r >= M) return;
                if (bias) {
                    lo = lo + bias0;
                    hi = hi + bias1;
                }
                if (relu) {
                    lo = lo > 0.f ? lo : VecF{};
                    hi = hi > 0.f ? hi : VecF{};
                }
                float* c = p.c + (m0 + r) * ldc + n0;
                if (cols == 2 * kLanes) {
                    __builtin_memcpy(c, &lo, sizeof lo);
                    __builtin_memcpy(c + kLanes, &hi, sizeof hi);
                    return;
                }
                float row[2 * kLanes];
                __builtin_memcpy(row, &lo, sizeof lo);
                __builtin_memcpy(row + kLanes, &hi, sizeof hi);
                for (int64_t j = 0; j < cols; ++j) c[j] = row[j];
            };
            store(0, s00, s01);
            store(1, s10, s11);
            store(2, s20, s21);
            store(3, s30, s31);
        }
    }
}

}  // namespace

const simd::Table& table() {
    static constexpr simd::Table t{TD_SIMD_ISA_LEVEL, &dropoutRow, &reluGrad, &maxArgStep,
                                   &smallProduct};
    return t;
}

}  // namespace td::cpu::TD_SIMD_ISA_NAMESPACE
