// Per-element math of the backends' kernels, shared by the CPU backend (cpu/kernels.cpp) and the
// CUDA backend (cuda/cuda_kernels.cu): the keyed dropout mask and the elementwise activations
// with their gradients. The dropout hash is in dropout_hash.h, which the CPU's vectorised loops
// (cpu/simd_kernels_impl.h) include too; their relu and leaky relu keep their own copies of the
// same expressions, the scalar loops call these.
#pragma once

#include <math.h>

#include <cstdint>

#include "engine/backend/dropout_hash.h"
#include "engine/core/host_device.h"
#include "engine/graph/ir.h"  // ActKind

namespace td::kmath {

TD_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Dropout: the key of one sample's row (global sample index) at one step.
TD_HOST_DEVICE inline uint32_t dropoutRowBase(uint64_t seed, int64_t step, int64_t sample) {
    const uint64_t rowKey =
        mix64(seed * 0x9e3779b97f4a7c15ull ^ mix64(static_cast<uint64_t>(step)) ^
              (static_cast<uint64_t>(sample) * 0xc2b2ae3d27d4eb4full));
    return static_cast<uint32_t>(rowKey) ^ static_cast<uint32_t>(rowKey >> 32);
}

// A unit is kept when its hash is at or above this threshold (rate * 2^24).
TD_HOST_DEVICE inline uint32_t dropoutThreshold(float rate) {
    return static_cast<uint32_t>(static_cast<double>(rate) * 16777216.0);
}

TD_HOST_DEVICE inline float sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}

TD_HOST_DEVICE inline float elu(float x, float alpha) {
    return x > 0.f ? x : alpha * expm1f(x);
}

// The exact (erf) form, as Keras' gelu(approximate=False).
TD_HOST_DEVICE inline float gelu(float x) {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}

// act(x) for every elementwise kind (softmax works on rows: not here).
TD_HOST_DEVICE inline float activate(ActKind k, float alpha, float x) {
    switch (k) {
        case ActKind::Relu:
            return x > 0.f ? x : 0.f;
        case ActKind::LeakyRelu:
            return x > 0.f ? x : alpha * x;
        case ActKind::Elu:
            return elu(x, alpha);
        case ActKind::Gelu:
            return gelu(x);
        case ActKind::Sigmoid:
            return sigmoid(x);
        case ActKind::Tanh:
            return tanhf(x);
        default:  // Linear (Softmax never reaches here)
            return x;
    }
}

TD_HOST_DEVICE inline float eluGrad(float dy, float x, float alpha) {
    return x > 0.f ? dy : dy * alpha * expf(x);
}
TD_HOST_DEVICE inline float eluGradFromOutput(float dy, float y, float alpha) {
    return y > 0.f ? dy : dy * (y + alpha);
}
TD_HOST_DEVICE inline float geluGrad(float dy, float x) {
    const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
    const float pdf = 0.39894228040143268f * expf(-0.5f * x * x);
    return dy * (cdf + x * pdf);
}
TD_HOST_DEVICE inline float sigmoidGrad(float dy, float y) {
    return dy * y * (1.f - y);
}
TD_HOST_DEVICE inline float tanhGrad(float dy, float y) {
    return dy * (1.f - y * y);
}

// dy * act'(.) where s is y (usesOutput) or x, for every elementwise kind.
TD_HOST_DEVICE inline float activateGrad(ActKind k, float alpha, bool usesOutput, float dy,
                                         float s) {
    switch (k) {
        case ActKind::Relu:
            return s > 0.f ? dy : 0.f;
        case ActKind::LeakyRelu:
            return s > 0.f ? dy : alpha * dy;
        case ActKind::Elu:
            return usesOutput ? eluGradFromOutput(dy, s, alpha) : eluGrad(dy, s, alpha);
        case ActKind::Gelu:
            return geluGrad(dy, s);
        case ActKind::Sigmoid:
            return sigmoidGrad(dy, usesOutput ? s : sigmoid(s));
        case ActKind::Tanh:
            return tanhGrad(dy, usesOutput ? s : tanhf(s));
        default:
            return dy;
    }
}

// L1/L2 regularization's gradient added to g.
TD_HOST_DEVICE inline float regGrad(float g, float w, float l1, float l2) {
    const float sgn = w > 0.f ? 1.f : (w < 0.f ? -1.f : 0.f);
    return g + l1 * sgn + 2.f * l2 * w;
}

}  // namespace td::kmath
