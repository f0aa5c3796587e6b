// The multi-tensor optimizer update (update.h), Keras 3 semantics
// (keras/src/optimizers/{base_optimizer,sgd,adam,adamw,rmsprop}.py). Per step:
//   1. clip the gradients: clipnorm (per tensor), global_clipnorm or clipvalue (one at most);
//   2. decoupled weight decay: w -= w * weight_decay * lr (when weight_decay > 0);
//   3. the optimizer's update_step for every parameter.
// The three are fused into one pass over each parameter: the clipping is a per-tensor scale and a
// clamp applied to the gradient as it is read, so each array is touched once (twice with a norm
// clip, which reads the gradients first) and nothing is allocated. Tensors of at least
// kParallelMinElements elements are split across the OpenMP threads; smaller ones run on the
// calling thread (a fork/join costs more than updating a few thousand floats).
//
// The element loops live in optim_kernels_impl.h, compiled once per instruction-set level and
// chosen at run time (optim_kernels.h).
#include "engine/backend/cpu/update.h"

#include <omp.h>

#include <vector>

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/backend/cpu/optim_kernels.h"
#include "engine/backend/cpu/work_share.h"
#include "engine/core/half.h"
#include "engine/core/result.h"

namespace td {
namespace {

constexpr int64_t kParallelMinElements = int64_t{1} << 15;
constexpr int64_t kChunkAlign = 16;  // 64 bytes of floats: threads never share a cache line
// A WorkShare piece of the update: 16k elements (256 KiB of Adam's value, gradient and slots).
constexpr int64_t kSharePiece = int64_t{1} << 14;

// The first element of part j of `parts` over [0, total), on a kChunkAlign boundary.
int64_t partEdge(int64_t total, int64_t parts, int64_t j) {
    return j >= parts
               ? total
               : std::min(total, (total * j / parts + kChunkAlign - 1) / kChunkAlign * kChunkAlign);
}

double sumSquares(const float* g, int64_t n) {
    auto partial = [g](int64_t begin, int64_t end) {
        double acc = 0.0;
#pragma omp simd reduction(+ : acc)
        for (int64_t i = begin; i < end; ++i) acc += static_cast<double>(g[i]) * g[i];
        return acc;
    };
    if (n < kParallelMinElements || omp_get_max_threads() == 1 || omp_in_parallel()) {
        return partial(0, n);
    }
    double total = 0.0;
#pragma omp parallel reduction(+ : total)
    {
        const int64_t threads = omp_get_num_threads();
        const int64_t t = omp_get_thread_num();
        const int64_t chunk = (n + threads - 1) / threads;
        const int64_t begin = std::min(n, t * chunk);
        const int64_t end = std::min(n, begin + chunk);
        total += partial(begin, end);
    }
    return total;
}

// Keras BaseOptimizer._clip_gradients, global_clipnorm: every tensor scaled by
// min(1, clip / ||all g||), NaN when that norm is not finite.
// `unscale` (a power of two): the loss scaling's factor, applied before clipping.
float globalClipScale(const UpdateSpec& spec, std::span<const UpdateTensor> tensors,
                      float unscale) {
    double total = 0.0;
    for (const UpdateTensor& t : tensors) total += sumSquares(t.grad, t.size);
    const double norm = std::sqrt(total) * unscale;
    if (!std::isfinite(norm)) return std::numeric_limits<float>::quiet_NaN();
    if (norm > spec.clipValue) return static_cast<float>(spec.clipValue / norm);
    return 1.0f;
}

// clipnorm: clip / max(||g||, clip) for one tensor.
float normClipScale(const UpdateSpec& spec, const UpdateTensor& t, float unscale) {
    const double c = spec.clipValue;
    const double norm = std::sqrt(sumSquares(t.grad, t.size)) * unscale;
    return static_cast<float>(c / std::max(norm, c));
}

// Elements [begin, end) of one tensor.
void updateRangeOnce(const UpdateSpec& spec, const UpdateScalars& s, const optim_kernels::Table& k,
                     const UpdateTensor& t, float gradScale, int64_t begin, int64_t end) {
    optim_kernels::Operands p;
    p.w = t.value;
    p.grad = t.grad;
    p.gradScale = gradScale;
    p.clip = spec.clip == ClipKind::Value ? static_cast<float>(spec.clipValue)
                                          : std::numeric_limits<float>::infinity();
    p.decay = spec.decay;
    p.wdLr = s.wdLr;
    switch (spec.kind) {
        case UpdateKind::Sgd: {
            // Keras 3: m = momentum * m - lr * g; w += m (nesterov: w += momentum * m - lr * g);
            // without momentum w -= lr * g.
            optim_kernels::SgdArgs a;
            a.p = p;
            a.mode = spec.momentum == 0 ? optim_kernels::SgdMode::Plain
                     : spec.nesterov    ? optim_kernels::SgdMode::Nesterov
                                        : optim_kernels::SgdMode::Momentum;
            a.m = spec.momentum != 0 ? t.slot[0] : nullptr;
            a.lr = s.lr;
            a.momentum = spec.momentum;
            k.sgd(a, begin, end);
            return;
        }
        case UpdateKind::Adam: {
            // Keras 3: m += (g - m) * (1 - beta_1); v += (g^2 - v) * (1 - beta_2); amsgrad:
            // vhat = max(vhat, v), v = vhat; w -= alpha * m / (sqrt(v) + epsilon).
            optim_kernels::AdamArgs a;
            a.p = p;
            a.m = t.slot[0];
            a.v = t.slot[1];
            a.vhat = spec.amsgrad ? t.slot[2] : nullptr;
            a.alpha = s.alpha;
            a.oneMinusB1 = spec.oneMinusBeta1;
            a.oneMinusB2 = spec.oneMinusBeta2;
            a.eps = spec.epsilon;
            k.adam(a, begin, end);
            return;
        }
        case UpdateKind::RmsProp: {
            // Keras 3: v = rho * v + (1 - rho) * g^2; centered: mg = rho * mg + (1 - rho) * g,
            // denom = v - mg^2 + epsilon, else v + epsilon; increment = lr * g / sqrt(denom);
            // momentum > 0: m = momentum * m + increment, w -= m; else w -= increment.
            const bool hasMomentum = spec.momentum > 0;
            optim_kernels::RmsPropArgs a;
            a.p = p;
            a.velocity = t.slot[0];
            a.momentumSlot = hasMomentum ? t.slot[1] : nullptr;
            a.averageGrad = spec.centered ? t.slot[hasMomentum ? 2 : 1] : nullptr;
            a.lr = s.lr;
            a.rho = spec.rho;
            a.oneMinusRho = spec.oneMinusRho;
            a.eps = spec.epsilon;
            a.momentum = spec.momentum;
            k.rmsprop(a, begin, end);
            return;
        }
    }
}

// updateRange, and the tensor's 16-bit shadow written from the new values block by block while
// they are still in cache.
void updateRange(const UpdateSpec& spec, const UpdateScalars& s, const optim_kernels::Table& k,
                 const UpdateTensor& t, float gradScale, int64_t begin, int64_t end) {
    if (!t.shadow) {
        updateRangeOnce(spec, s, k, t, gradScale, begin, end);
        return;
    }
    constexpr int64_t kBlock = 4096;
    for (int64_t b = begin; b < end; b += kBlock) {
        const int64_t e = std::min(end, b + kBlock);
        updateRangeOnce(spec, s, k, t, gradScale, b, e);
        if (t.shadowF16)
            castF32ToF16(t.value + b, t.shadow + b, e - b);
        else
            castF32ToBf16(t.value + b, t.shadow + b, e - b);
    }
}

bool allFinite(std::span<const UpdateTensor> tensors) {
    double total = 0.0;
    for (const UpdateTensor& t : tensors) total += sumSquares(t.grad, t.size);
    return std::isfinite(total);
}

}  // namespace

bool applyUpdate(const UpdateSpec& spec, const UpdateScalars& scalars,
                 std::span<const UpdateTensor> tensors, int threads, LossScaleState* lossScale,
                 WorkShare* share) {
    const optim_kernels::Table& k = optim_kernels::activeKernels();
    // Loss scaling: unscale by a power of two (exact), or skip a step with non-finite gradients.
    float unscale = 1.0f;
    if (lossScale) {
        if (!allFinite(tensors)) {
            lossScale->scale *= 0.5f;
            lossScale->goodSteps = 0;
            lossScale->skippedSteps += 1;
            lossScale->lastSkipped = 1;
            return false;
        }
        unscale = 1.0f / lossScale->scale;
        lossScale->lastSkipped = 0;
        if (++lossScale->goodSteps >= lossScale->growthSteps) {
            lossScale->goodSteps = 0;
            lossScale->scale *= 2.0f;  // for the next step; this one unscales by the old scale
        }
    }
    const int per = spec.slotsPerParam();
    int64_t total = 0;
    for (const UpdateTensor& t : tensors) {
        TD_ASSERT(t.size >= 0);
        for (int s = 0; s < per; ++s) TD_ASSERT_MSG(t.slot[s] || t.size == 0, "missing slot");
        total += t.size;
    }
    // Each tensor's gradient scale (clipping), before any element changes.
    thread_local std::vector<float> scales;
    scales.assign(tensors.size(), 1.0f);
    if (spec.clip == ClipKind::GlobalNorm)
        std::fill(scales.begin(), scales.end(), globalClipScale(spec, tensors, unscale));
    else if (spec.clip == ClipKind::Norm)
        for (size_t i = 0; i < tensors.size(); ++i)
            scales[i] = normClipScale(spec, tensors[i], unscale);
    if (unscale != 1.0f)
        for (float& sc : scales) sc *= unscale;

    const float* scale = scales.data();
    // Elements [lo, hi) of the one range all tensors form.
    auto updateSpan = [&](int64_t lo, int64_t hi) {
        int64_t base = 0;
        for (size_t i = 0; i < tensors.size() && base < hi; ++i) {
            const int64_t size = tensors[i].size;
            const int64_t b = std::max<int64_t>(lo - base, 0),
                          e = std::min<int64_t>(hi - base, size);
            if (b < e) updateRange(spec, scalars, k, tensors[i], scale[i], b, e);
            base += size;
        }
    };
    const int64_t pieces = std::min<int64_t>(total / kSharePiece, 4096);
    if (share && share->width() > 1 && pieces >= 2 && !omp_in_parallel()) {
        // Pieces of about kSharePiece elements on cache-line boundaries, claimed in turn.
        share->run(pieces, [&](int64_t p, int) {
            updateSpan(partEdge(total, pieces, p), partEdge(total, pieces, p + 1));
        });
        return true;
    }
    const int team = threads > 0 ? threads : omp_get_max_threads();
    if (total < kParallelMinElements || team <= 1 || omp_in_parallel()) {
        for (size_t i = 0; i < tensors.size(); ++i)
            if (tensors[i].size > 0)
                updateRange(spec, scalars, k, tensors[i], scales[i], 0, tensors[i].size);
        return true;
    }
    // One pass over all parameters as one range, split evenly across the team on cache-line
    // boundaries: a thread's share may span several tensors (one fork and join per step). The
    // scales are the calling thread's (thread_local): the team reads them through a pointer.
#pragma omp parallel num_threads(team)
    {
        const int64_t n = omp_get_num_threads();
        const int64_t me = omp_get_thread_num();
        updateSpan(partEdge(total, n, me), partEdge(total, n, me + 1));
    }
    return true;
}

}  // namespace td

namespace td {

namespace isa_generic {
const optim_kernels::Table& table();
}
#if defined(__x86_64__)
namespace isa_avx2 {
const optim_kernels::Table& table();
}
namespace isa_avx512 {
const optim_kernels::Table& table();
}
#endif

const optim_kernels::Table& optim_kernels::kernelsFor(CpuIsa isa) {
    return kernelsForIsa(isa, &isa_generic::table, TD_ISA_X86(&isa_avx2::table),
                         TD_ISA_X86(&isa_avx512::table));
}

const optim_kernels::Table& optim_kernels::activeKernels() {
    static const Table& t = kernelsFor(activeCpuIsa().isa);
    return t;
}

}  // namespace td
