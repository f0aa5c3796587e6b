// The optimizer update of one element, as scalar TD_HOST_DEVICE functions: the CUDA backend's
// multi-tensor update kernel runs these, and tests/train checks them against applyUpdate (the
// CPU's vectorised loops in optim_kernels_impl.h) bit for bit. Same IEEE single-precision
// operations in the same order as those loops (the CUDA kernels are compiled without FMA
// contraction); see optim_kernels_impl.h for the Keras 3 formulas.
#pragma once

#include <math.h>

#include "engine/core/host_device.h"

namespace td::umath {

// The gradient as the update sees it: scaled (norm clipping, loss-scale unscaling), then clamped
// by clipvalue (clip = +inf when off). NaN passes through both.
TD_HOST_DEVICE inline float clippedGrad(float grad, float gradScale, float clip) {
    const float g = grad * gradScale;
    const float lo = g < -clip ? -clip : g;  // max(g, -clip)
    return clip < lo ? clip : lo;            // min(lo, clip)
}

// Decoupled weight decay: w - w * wdLr.
TD_HOST_DEVICE inline float decayed(float w, bool decay, float wdLr) {
    return decay ? w - w * wdLr : w;
}

// SGD; m is the momentum slot (unused when momentum == 0).
TD_HOST_DEVICE inline void sgd(float g, float& w, float* m, float lr, float momentum,
                               bool nesterov) {
    if (momentum == 0) {
        w = w - g * lr;
        return;
    }
    const float mi = *m * momentum - g * lr;
    *m = mi;
    w = nesterov ? w + (mi * momentum - g * lr) : w + mi;
}

// Adam; vhat non-null: amsgrad.
TD_HOST_DEVICE inline void adam(float g, float& w, float& m, float& v, float* vhat, float alpha,
                                float oneMinusB1, float oneMinusB2, float eps) {
    const float mi = m + (g - m) * oneMinusB1;
    const float vi = v + (g * g - v) * oneMinusB2;
    m = mi;
    v = vi;
    float denomV = vi;
    if (vhat) {
        denomV = vi < *vhat ? *vhat : vi;
        *vhat = denomV;
    }
    w = w - (mi * alpha) / (sqrtf(denomV) + eps);
}

// RMSprop; momentumSlot non-null: momentum > 0; averageGrad non-null: centered.
TD_HOST_DEVICE inline void rmsprop(float g, float& w, float& velocity, float* momentumSlot,
                                   float* averageGrad, float lr, float rho, float oneMinusRho,
                                   float eps, float momentum) {
    const float vi = rho * velocity + oneMinusRho * (g * g);
    velocity = vi;
    float denom;
    if (averageGrad) {
        const float ai = rho * *averageGrad + oneMinusRho * g;
        *averageGrad = ai;
        denom = vi - ai * ai + eps;
    } else {
        denom = vi + eps;
    }
    const float increment = (lr * g) / sqrtf(denom);
    if (momentumSlot) {
        const float mi = momentum * *momentumSlot + increment;
        *momentumSlot = mi;
        w = w - mi;
    } else {
        w = w - increment;
    }
}

}  // namespace td::umath
