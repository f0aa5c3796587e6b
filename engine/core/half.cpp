#include "engine/core/half.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace td {

namespace {

void f32ToF16Scalar(const float* src, uint16_t* dst, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = floatToF16(src[i]);
}

void f16ToF32Scalar(const uint16_t* src, float* dst, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = f16ToFloat(src[i]);
}

}  // namespace

#if defined(__x86_64__)
namespace half::isa_f16c {
namespace {
// F16C: eight values per instruction, rounding to nearest even. Neither direction depends on
// MXCSR's flush or denormals-are-zero bits for the values it produces (a float denormal becomes a
// half zero either way), so it gives the scalar code's bits; tests/graph/test_precision checks
// every half value and a sweep of floats.
__attribute__((target("f16c,avx"))) void f32ToF16Hw(const float* src, uint16_t* dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(src + i);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                         _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    f32ToF16Scalar(src + i, dst + i, n - i);
}

__attribute__((target("f16c,avx"))) void f16ToF32Hw(const uint16_t* src, float* dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(
            dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
    f16ToF32Scalar(src + i, dst + i, n - i);
}
}  // namespace
}  // namespace half::isa_f16c

namespace {
bool hasF16c() {
    static const bool yes = [] {
        __builtin_cpu_init();
        return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
    }();
    return yes;
}
#endif

}  // namespace

void castF32ToBf16(const float* src, uint16_t* dst, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = floatToBf16(src[i]);
}

void castBf16ToF32(const uint16_t* src, float* dst, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16ToFloat(src[i]);
}

void castF32ToF16(const float* src, uint16_t* dst, int64_t n) {
#if defined(__x86_64__)
    if (hasF16c()) return half::isa_f16c::f32ToF16Hw(src, dst, n);
#endif
    f32ToF16Scalar(src, dst, n);
}

void castF16ToF32(const uint16_t* src, float* dst, int64_t n) {
#if defined(__x86_64__)
    if (hasF16c()) return half::isa_f16c::f16ToF32Hw(src, dst, n);
#endif
    f16ToF32Scalar(src, dst, n);
}

void castF32ToF16Portable(const float* src, uint16_t* dst, int64_t n) {
    f32ToF16Scalar(src, dst, n);
}

void castF16ToF32Portable(const uint16_t* src, float* dst, int64_t n) {
    f16ToF32Scalar(src, dst, n);
}

}  // namespace td
