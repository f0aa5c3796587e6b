// Keras initializers by name (shared REFERENCE.md): fills a parameter from its spec.
#pragma once

#include <cstdint>

#include "engine/core/result.h"
#include "engine/model/layers.h"

namespace td {

// w has n = fanIn * fanOut values for a kernel [fanIn, fanOut], or fanOut for a bias.
// `seed` is used when the spec has no seed of its own.
Status initializeParam(float* w, int64_t n, int64_t fanIn, int64_t fanOut,
                       const InitializerSpec& spec, uint64_t seed);

}  // namespace td
