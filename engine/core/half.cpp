#include "engine/core/half.h"

namespace td {

void castF32ToBf16(const float* src, uint16_t* dst, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = floatToBf16(src[i]);
}

void castBf16ToF32(const uint16_t* src, float* dst, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16ToFloat(src[i]);
}

void castF32ToF16(const float* src, uint16_t* dst, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = floatToF16(src[i]);
}

void castF16ToF32(const uint16_t* src, float* dst, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = f16ToFloat(src[i]);
}

}  // namespace td
