// Keras initializers by name (shared REFERENCE.md): fills a parameter from its spec.
#pragma once

#include <cstdint>

#include "engine/core/result.h"
#include "engine/core/tensor.h"
#include "engine/model/layers.h"

namespace td {

// Fills w (numElements(shape) values, row-major) as Keras' initializer of that name and config
// would: same distribution, same fans (keras compute_fans: a vector [n] has fan_in = fan_out = n, a
// kernel [fanIn, fanOut]), not the same random stream. `seed` is used when the spec has none.
// Errors: an unknown name, a config value Keras refuses, orthogonal on a rank < 2 shape, identity
// on a shape that is not a matrix.
Status initializeParam(float* w, const Shape& shape, const InitializerSpec& spec, uint64_t seed);

}  // namespace td
