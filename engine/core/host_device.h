// Per-element math shared by the CPU and CUDA backends is written once, in headers, as inline
// functions marked TD_HOST_DEVICE: __host__ __device__ under nvcc, nothing for the host compiler.
// The CPU tests then cover the math the GPU kernels run.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TD_HOST_DEVICE __host__ __device__
#else
#define TD_HOST_DEVICE
#endif

namespace td {

// The bits of a float and back (std::bit_cast is not usable in device code).
TD_HOST_DEVICE inline uint32_t floatBits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t x;
    std::memcpy(&x, &f, sizeof x);
    return x;
#endif
}

TD_HOST_DEVICE inline float bitsFloat(uint32_t x) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(x);
#else
    float f;
    std::memcpy(&f, &x, sizeof f);
    return f;
#endif
}

}  // namespace td
