// The dropout mask's hash, the one definition every backend uses (the CPU's scalar and vectorised
// kernels, the CUDA kernels): a unit's mask must be the same bits on every device and at every
// instruction-set level, so that N replicas equal one device and a GPU run equals a CPU run.
// Internal linkage (static): each translation unit compiles its own copy with its own flags, so
// the linker can never merge an AVX-512 copy into code that runs on a lesser CPU.
#pragma once

#include <cstdint>

#include "engine/core/host_device.h"

namespace td::kmath {

TD_HOST_DEVICE static inline uint32_t mix32(uint32_t h) {
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    return h;
}

// The top 24 bits of the keyed hash of column `col` in a row whose key is `rowBase`
// (keyedUniform * 2^24).
TD_HOST_DEVICE static inline uint32_t dropoutHash24(uint32_t rowBase, int64_t col) {
    return mix32(rowBase ^ (static_cast<uint32_t>(col) * 0x9e3779b9u)) >> 8;
}

}  // namespace td::kmath
