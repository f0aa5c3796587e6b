// Element loops of the optimizer updates, compiled once per instruction-set level (generic, AVX2,
// AVX-512) and chosen at run time (engine/core/cpu_isa.h). Private to engine/train and its tests.
//
// Each function updates elements [begin, end) of one parameter; the caller splits a parameter
// across threads. Every level computes the same IEEE single-precision operations in the same
// order (no FMA contraction), so all levels give bit-identical results.
#pragma once

#include <cstdint>

#include "engine/core/cpu_isa.h"

namespace td::optim_kernels {

// The parameter and the gradient as the update reads it: g = clamp(grad * gradScale, -clip, clip)
// (clip = +inf when off); decay: w -= w * wdLr first (decoupled weight decay).
struct Operands {
    float* w = nullptr;
    const float* grad = nullptr;
    float gradScale = 1;
    float clip = 0;
    bool decay = false;
    float wdLr = 0;
};

enum class SgdMode { Plain, Momentum, Nesterov };

struct SgdArgs {
    Operands p;
    SgdMode mode = SgdMode::Plain;
    float* m = nullptr;  // momentum slot (not read in Plain mode)
    float lr = 0;
    float momentum = 0;
};

struct AdamArgs {
    Operands p;
    float* m = nullptr;
    float* v = nullptr;
    float* vhat = nullptr;  // non-null: amsgrad
    float alpha = 0;        // lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)
    float oneMinusB1 = 0;
    float oneMinusB2 = 0;
    float eps = 0;
};

struct RmsPropArgs {
    Operands p;
    float* velocity = nullptr;
    float* momentumSlot = nullptr;  // non-null: momentum > 0
    float* averageGrad = nullptr;   // non-null: centered
    float lr = 0;
    float rho = 0;
    float oneMinusRho = 0;
    float eps = 0;
    float momentum = 0;
};

struct Table {
    CpuIsa isa;
    void (*sgd)(const SgdArgs& a, int64_t begin, int64_t end);
    void (*adam)(const AdamArgs& a, int64_t begin, int64_t end);
    void (*rmsprop)(const RmsPropArgs& a, int64_t begin, int64_t end);
};

// The kernels of one level. A level above what this build has kernels for (anything but generic
// off x86-64) gives the generic table; the caller must not ask for one the CPU lacks.
const Table& kernelsFor(CpuIsa isa);

// The kernels for activeCpuIsa(), looked up once.
const Table& activeKernels();

}  // namespace td::optim_kernels
