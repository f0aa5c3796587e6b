// Body of the batch-forming kernels, included once per instruction-set level by
// convert_kernels_{generic,avx2,avx512}.cpp, each compiled with its own -m flags. Everything lives
// in TD_CONVERT_ISA_NAMESPACE (an unnamed namespace inside it for the loops), so no inline code
// compiled for AVX-512 can be merged by the linker with the generic copy.
//
// A source row is read once and written once; the loops are bound by memory, and the wide levels
// win by converting 8 or 16 bytes per instruction (vpmovzxbd from memory) where SSE2 needs a
// chain of unpacks. Products and sums are separate instructions: no FMA, the generic rounding.
#if !defined(TD_CONVERT_ISA_NAMESPACE) || !defined(TD_CONVERT_ISA_LEVEL)
#error "define TD_CONVERT_ISA_NAMESPACE and TD_CONVERT_ISA_LEVEL before including this file"
#endif

#include <cstdint>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "engine/data/convert_kernels.h"

namespace td::data_kernels::TD_CONVERT_ISA_NAMESPACE {
namespace {

// The scalar form every level reduces to (and the tail of the vector loops).
template <typename Src>
void affineTail(const Src* __restrict src, float* __restrict dst, int64_t begin, int64_t n, float a,
                float b) {
    for (int64_t k = begin; k < n; ++k) dst[k] = static_cast<float>(src[k]) * a + b;
}

#if defined(__AVX512F__)

// The zero-masking forms with every lane set: GCC 12's unmasked _mm512_cvtepu8_epi32 and
// _mm512_cvtepi32_ps pass an uninitialised source operand and warn about it
// (-Wmaybe-uninitialized).
constexpr __mmask16 kAllLanes = 0xFFFF;

void affineU8(const uint8_t* __restrict src, float* __restrict dst, int64_t n, float a, float b) {
    const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k));
        const __m512 v =
            _mm512_maskz_cvtepi32_ps(kAllLanes, _mm512_maskz_cvtepu8_epi32(kAllLanes, bytes));
        _mm512_storeu_ps(dst + k, _mm512_add_ps(_mm512_mul_ps(v, va), vb));
    }
    affineTail(src, dst, k, n, a, b);
}

void affineF32(const float* __restrict src, float* __restrict dst, int64_t n, float a, float b) {
    const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        const __m512 v = _mm512_loadu_ps(src + k);
        _mm512_storeu_ps(dst + k, _mm512_add_ps(_mm512_mul_ps(v, va), vb));
    }
    affineTail(src, dst, k, n, a, b);
}

#elif defined(__AVX2__)

void affineU8(const uint8_t* __restrict src, float* __restrict dst, int64_t n, float a, float b) {
    const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + k));
        const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
        _mm256_storeu_ps(dst + k, _mm256_add_ps(_mm256_mul_ps(v, va), vb));
    }
    affineTail(src, dst, k, n, a, b);
}

void affineF32(const float* __restrict src, float* __restrict dst, int64_t n, float a, float b) {
    const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        const __m256 v = _mm256_loadu_ps(src + k);
        _mm256_storeu_ps(dst + k, _mm256_add_ps(_mm256_mul_ps(v, va), vb));
    }
    affineTail(src, dst, k, n, a, b);
}

#else

// The compiler vectorises these for the baseline (SSE2 on x86-64).
void affineU8(const uint8_t* __restrict src, float* __restrict dst, int64_t n, float a, float b) {
    affineTail(src, dst, 0, n, a, b);
}

void affineF32(const float* __restrict src, float* __restrict dst, int64_t n, float a, float b) {
    affineTail(src, dst, 0, n, a, b);
}

#endif

}  // namespace

const Table& table() {
    static constexpr Table t{TD_CONVERT_ISA_LEVEL, &affineU8, &affineF32};
    return t;
}

}  // namespace td::data_kernels::TD_CONVERT_ISA_NAMESPACE
