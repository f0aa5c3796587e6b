// The element loop of batch forming: dst[k] = float(src[k]) * a + b over one row, from u8 or f32
// source values, compiled once per instruction-set level (generic, AVX2, AVX-512) and chosen at
// run time (engine/core/cpu_isa.h). Private to engine/data and its tests.
//
// Every level rounds the product and then the sum to f32 (no FMA contraction), exactly as the
// generic loop does, so all levels give bit-identical rows.
#pragma once

#include <cstdint>

#include "engine/core/cpu_isa.h"

namespace td::data_kernels {

struct Table {
    CpuIsa isa;
    // src and dst must not overlap.
    void (*affineU8)(const uint8_t* src, float* dst, int64_t n, float a, float b);
    void (*affineF32)(const float* src, float* dst, int64_t n, float a, float b);
};

// The kernels of one level. A level above what this build has kernels for (anything but generic
// off x86-64) gives the generic table; the caller must not ask for one the CPU lacks.
const Table& kernelsFor(CpuIsa isa);

// The kernels for activeCpuIsa(), looked up once.
const Table& activeKernels();

}  // namespace td::data_kernels
