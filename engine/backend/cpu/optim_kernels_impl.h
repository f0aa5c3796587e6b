// Body of the optimizer kernels, included once per instruction-set level by
// optim_kernels_{generic,avx2,avx512}.cpp, each compiled with its own -m flags. Everything here
// lives in an unnamed namespace inside TD_OPTIM_ISA_NAMESPACE, so no inline function or template
// compiled for AVX-512 can be merged by the linker with the generic copy and run on a CPU without
// it. For the same reason it uses builtins only, no standard-library templates.
//
// The loops are written once as templates over the element type and instantiated for one SIMD
// register of floats (whatever width the translation unit's flags allow) plus a scalar tail. With
// the default -fmath-errno GCC cannot vectorise std::sqrt, hence the explicit register type.
#if !defined(TD_OPTIM_ISA_NAMESPACE) || !defined(TD_OPTIM_ISA_LEVEL)
#error "define TD_OPTIM_ISA_NAMESPACE and TD_OPTIM_ISA_LEVEL before including this file"
#endif

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#endif

#include "engine/backend/cpu/optim_kernels.h"

namespace td::TD_OPTIM_ISA_NAMESPACE {
namespace {

using namespace td::optim_kernels;

#if defined(__AVX512F__)
using VecF = float __attribute__((vector_size(64)));
// The masked form with every lane set: GCC 12's _mm512_sqrt_ps passes an uninitialised source
// operand and warns about it (-Wmaybe-uninitialized).
inline VecF vsqrt(VecF x) {
    return reinterpret_cast<VecF>(_mm512_mask_sqrt_ps(
        reinterpret_cast<__m512>(x), static_cast<__mmask16>(0xFFFF), reinterpret_cast<__m512>(x)));
}
#define TD_OPTIM_SIMD 1
#elif defined(__AVX__)
using VecF = float __attribute__((vector_size(32)));
inline VecF vsqrt(VecF x) {
    return reinterpret_cast<VecF>(_mm256_sqrt_ps(reinterpret_cast<__m256>(x)));
}
#define TD_OPTIM_SIMD 1
#elif defined(__SSE2__)
using VecF = float __attribute__((vector_size(16)));
inline VecF vsqrt(VecF x) {
    return reinterpret_cast<VecF>(_mm_sqrt_ps(reinterpret_cast<__m128>(x)));
}
#define TD_OPTIM_SIMD 1
#else
#define TD_OPTIM_SIMD 0
#endif

template <class T>
struct Lane;

template <>
struct Lane<float> {
    static constexpr int64_t kWidth = 1;
    static float load(const float* p) { return *p; }
    static void store(float* p, float v) { *p = v; }
    static float splat(float x) { return x; }
    static float sqrt(float x) { return __builtin_sqrtf(x); }
    static float max(float a, float b) { return a < b ? b : a; }  // std::max(a, b)
    static float min(float a, float b) { return b < a ? b : a; }  // std::min(a, b)
};

#if TD_OPTIM_SIMD
template <>
struct Lane<VecF> {
    static constexpr int64_t kWidth = sizeof(VecF) / sizeof(float);
    static VecF load(const float* p) {
        VecF v;
        __builtin_memcpy(&v, p, sizeof v);
        return v;
    }
    static void store(float* p, VecF v) { __builtin_memcpy(p, &v, sizeof v); }
    static VecF splat(float x) { return VecF{} + x; }  // broadcast
    static VecF sqrt(VecF x) { return vsqrt(x); }
    static VecF max(VecF a, VecF b) { return a < b ? b : a; }
    static VecF min(VecF a, VecF b) { return b < a ? b : a; }
};
#endif

// Runs step<T>(i) over [begin, end): full SIMD registers first, then the scalar tail.
template <class Step>
inline void forElements(int64_t begin, int64_t end, const Step& step) {
    int64_t i = begin;
#if TD_OPTIM_SIMD
    constexpr int64_t w = Lane<VecF>::kWidth;
    for (; i + w <= end; i += w) step.template operator()<VecF>(i);
#endif
    for (; i < end; ++i) step.template operator()<float>(i);
}

// The gradient as the update sees it: scaled by the norm clipping, then clamped by clipvalue.
// NaN passes through both, as in Keras.
template <class T>
inline T clippedGrad(const Operands& p, int64_t i) {
    using L = Lane<T>;
    return L::min(L::max(L::load(p.grad + i) * L::splat(p.gradScale), L::splat(-p.clip)),
                  L::splat(p.clip));
}

template <class T>
inline T decayed(const Operands& p, int64_t i) {
    using L = Lane<T>;
    T wi = L::load(p.w + i);
    if (p.decay) wi = wi - wi * L::splat(p.wdLr);
    return wi;
}

// Keras 3 SGD: m = momentum * m - lr * g; w += m (nesterov: w += momentum * m - lr * g);
// without momentum w -= lr * g.
template <SgdMode kMode>
void sgdLoop(const SgdArgs& a, int64_t begin, int64_t end) {
    forElements(begin, end, [&a]<class T>(int64_t i) {
        using L = Lane<T>;
        const T g = clippedGrad<T>(a.p, i);
        const T wi = decayed<T>(a.p, i);
        if constexpr (kMode == SgdMode::Plain) {
            L::store(a.p.w + i, wi - g * L::splat(a.lr));
        } else {
            const T mi = L::load(a.m + i) * L::splat(a.momentum) - g * L::splat(a.lr);
            L::store(a.m + i, mi);
            if constexpr (kMode == SgdMode::Nesterov) {
                L::store(a.p.w + i, wi + (mi * L::splat(a.momentum) - g * L::splat(a.lr)));
            } else {
                L::store(a.p.w + i, wi + mi);
            }
        }
    });
}

void sgd(const SgdArgs& a, int64_t begin, int64_t end) {
    switch (a.mode) {
        case SgdMode::Plain:
            return sgdLoop<SgdMode::Plain>(a, begin, end);
        case SgdMode::Momentum:
            return sgdLoop<SgdMode::Momentum>(a, begin, end);
        case SgdMode::Nesterov:
            return sgdLoop<SgdMode::Nesterov>(a, begin, end);
    }
}

// Keras 3 Adam: m += (g - m) * (1 - beta_1); v += (g^2 - v) * (1 - beta_2); amsgrad:
// vhat = max(vhat, v), v = vhat; w -= alpha * m / (sqrt(v) + epsilon).
template <bool kAmsgrad>
void adamLoop(const AdamArgs& a, int64_t begin, int64_t end) {
    forElements(begin, end, [&a]<class T>(int64_t i) {
        using L = Lane<T>;
        const T g = clippedGrad<T>(a.p, i);
        const T wi = decayed<T>(a.p, i);
        const T m0 = L::load(a.m + i), v0 = L::load(a.v + i);
        const T mi = m0 + (g - m0) * L::splat(a.oneMinusB1);
        const T vi = v0 + (g * g - v0) * L::splat(a.oneMinusB2);
        L::store(a.m + i, mi);
        L::store(a.v + i, vi);
        T denomV = vi;
        if constexpr (kAmsgrad) {
            denomV = L::max(vi, L::load(a.vhat + i));
            L::store(a.vhat + i, denomV);
        }
        L::store(a.p.w + i, wi - (mi * L::splat(a.alpha)) / (L::sqrt(denomV) + L::splat(a.eps)));
    });
}

void adam(const AdamArgs& a, int64_t begin, int64_t end) {
    if (a.vhat) {
        adamLoop<true>(a, begin, end);
    } else {
        adamLoop<false>(a, begin, end);
    }
}

// Keras 3 RMSprop: v = rho * v + (1 - rho) * g^2; centered: mg = rho * mg + (1 - rho) * g,
// denom = v - mg^2 + epsilon, else denom = v + epsilon; increment = lr * g / sqrt(denom);
// momentum > 0: m = momentum * m + increment, w -= m; else w -= increment.
template <bool kCentered, bool kMomentum>
void rmspropLoop(const RmsPropArgs& a, int64_t begin, int64_t end) {
    forElements(begin, end, [&a]<class T>(int64_t i) {
        using L = Lane<T>;
        const T g = clippedGrad<T>(a.p, i);
        const T wi = decayed<T>(a.p, i);
        const T vi = L::splat(a.rho) * L::load(a.velocity + i) + L::splat(a.oneMinusRho) * (g * g);
        L::store(a.velocity + i, vi);
        T denom;
        if constexpr (kCentered) {
            const T ai = L::splat(a.rho) * L::load(a.averageGrad + i) + L::splat(a.oneMinusRho) * g;
            L::store(a.averageGrad + i, ai);
            denom = vi - ai * ai + L::splat(a.eps);
        } else {
            denom = vi + L::splat(a.eps);
        }
        const T increment = (L::splat(a.lr) * g) / L::sqrt(denom);
        if constexpr (kMomentum) {
            const T mi = L::splat(a.momentum) * L::load(a.momentumSlot + i) + increment;
            L::store(a.momentumSlot + i, mi);
            L::store(a.p.w + i, wi - mi);
        } else {
            L::store(a.p.w + i, wi - increment);
        }
    });
}

void rmsprop(const RmsPropArgs& a, int64_t begin, int64_t end) {
    const bool centered = a.averageGrad != nullptr, momentum = a.momentumSlot != nullptr;
    if (centered && momentum) return rmspropLoop<true, true>(a, begin, end);
    if (centered) return rmspropLoop<true, false>(a, begin, end);
    if (momentum) return rmspropLoop<false, true>(a, begin, end);
    rmspropLoop<false, false>(a, begin, end);
}

}  // namespace

const optim_kernels::Table& table() {
    static constexpr optim_kernels::Table t{TD_OPTIM_ISA_LEVEL, &sgd, &adam, &rmsprop};
    return t;
}

}  // namespace td::TD_OPTIM_ISA_NAMESPACE

#undef TD_OPTIM_SIMD
