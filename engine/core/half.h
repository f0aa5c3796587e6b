// 16-bit floats as mixed precision stores them: bfloat16 (the top half of an IEEE single) and
// IEEE binary16. Conversions round to nearest even and keep NaN a (quiet) NaN; float16 overflows
// to infinity above 65504 and keeps its subnormals. The loops are written so compilers vectorise
// them, and give the same bits on every instruction-set level (no hardware conversion whose
// denormal handling depends on MXCSR). The scalar conversions are TD_HOST_DEVICE: the CUDA
// kernels round exactly as the CPU does.
#pragma once

#include <cstdint>

#include "engine/core/host_device.h"

namespace td {

TD_HOST_DEVICE inline uint16_t floatToBf16(float f) {
    uint32_t x = floatBits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return static_cast<uint16_t>(x >> 16);
}

TD_HOST_DEVICE inline float bf16ToFloat(uint16_t h) {
    return bitsFloat(static_cast<uint32_t>(h) << 16);
}

TD_HOST_DEVICE inline uint16_t floatToF16(float f) {
    uint32_t x = floatBits(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    uint32_t h;
    if (x >= 0x47800000u) {  // >= 65536, infinity or NaN (quieted, top payload bits kept)
        h = x > 0x7f800000u ? 0x7e00u | ((x >> 13) & 0x3ffu) : 0x7c00u;
    } else if (x < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
        // Adding 0.5 puts the half's subnormal bits at the bottom of the mantissa, rounded to
        // nearest even by the addition itself (the sum is a normal float).
        const float t = bitsFloat(x) + 0.5f;
        h = floatBits(t) - 0x3f000000u;
    } else {
        const uint32_t odd = (x >> 13) & 1u;
        x += 0xc8000000u + 0xfffu + odd;  // rebias the exponent (127 -> 15) and round
        h = x >> 13;                      // a carry out of the mantissa gives 0x7c00: infinity
    }
    return static_cast<uint16_t>(h | sign);
}

TD_HOST_DEVICE inline float f16ToFloat(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t em = h & 0x7fffu;
    uint32_t x;
    if (em > 0x7c00u)  // NaN: quieted, payload kept (as the hardware conversion does)
        x = 0x7fc00000u | ((em & 0x3ffu) << 13);
    else if (em == 0x7c00u)
        x = 0x7f800000u;
    else if (em >= 0x0400u)
        x = (em << 13) + 0x38000000u;
    else  // subnormal: em * 2^-24, exact in float
        x = floatBits(static_cast<float>(em) * 5.9604644775390625e-8f);
    return bitsFloat(x | sign);
}

// Whole arrays (n elements). The f16 ones use F16C where the CPU has it (same bits).
void castF32ToBf16(const float* src, uint16_t* dst, int64_t n);
void castBf16ToF32(const uint16_t* src, float* dst, int64_t n);
void castF32ToF16(const float* src, uint16_t* dst, int64_t n);
void castF16ToF32(const uint16_t* src, float* dst, int64_t n);
// The scalar code alone (tests compare it with the F16C path).
void castF32ToF16Portable(const float* src, uint16_t* dst, int64_t n);
void castF16ToF32Portable(const uint16_t* src, float* dst, int64_t n);

}  // namespace td
