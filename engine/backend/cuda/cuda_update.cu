// The optimizer update of the CUDA device (cuda_kernels.h): one pass over every element of the
// tensors, with the per-element math of backend/update_math.h (the CPU's, bit for bit on equal
// inputs: no FMA contraction in these kernels). The gradient norms that clipping and loss
// scaling need are computed first on the device; a one-thread kernel then turns them into the
// per-tensor gradient scales and the loss-scale decision, as applyUpdate (backend/cpu/update.cpp)
// does on the host. Nothing is read back: a skipped step is a flag in device memory.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "engine/backend/cuda/cuda_common.cuh"
#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/backend/update_math.h"
#include "engine/core/half.h"

namespace td::cuda {

using namespace detail;

namespace {

// norms[t] += sum of squares of tensor t's gradient (blockIdx.y: the tensor, first-relative).
__global__ void sumSquaresKernel(const UpdateTensorDev* tensors, int first, double* norms) {
    __shared__ double part[kThreads];
    const UpdateTensorDev& t = tensors[first + blockIdx.y];
    double s = 0.0;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < t.size;
         i += static_cast<int64_t>(gridDim.x) * kThreads) {
        const double g = t.grad[i];
        s += g * g;
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w >>= 1) {
        if (static_cast<int>(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(&norms[first + blockIdx.y], part[0]);
}

// One thread: the loss-scale decision and each tensor's gradient scale (applyUpdate's prologue).
__global__ void prepareKernel(ClipKind clip, double clipValue, int first, int count,
                              UpdateWork work, LossScaleState* ls) {
    float unscale = 1.0f;
    work.skip[0] = 0;
    if (ls) {
        double total = 0.0;
        for (int t = first; t < first + count; ++t) total += work.norms[t];
        if (!isfinite(total)) {
            ls->scale *= 0.5f;
            ls->goodSteps = 0;
            ls->skippedSteps += 1;
            ls->lastSkipped = 1;
            work.skip[0] = 1;
            return;
        }
        unscale = 1.0f / ls->scale;
        ls->lastSkipped = 0;
        if (++ls->goodSteps >= ls->growthSteps) {
            ls->goodSteps = 0;
            ls->scale *= 2.0f;  // for the next step; this one unscales by the old scale
        }
    }
    float global = 1.0f;
    if (clip == ClipKind::GlobalNorm) {
        double total = 0.0;
        for (int t = first; t < first + count; ++t) total += work.norms[t];
        const double norm = sqrt(total) * unscale;
        if (!isfinite(norm))
            global = NAN;
        else if (norm > clipValue)
            global = static_cast<float>(clipValue / norm);
    }
    for (int t = first; t < first + count; ++t) {
        float sc = 1.0f;
        if (clip == ClipKind::GlobalNorm) {
            sc = global;
        } else if (clip == ClipKind::Norm) {
            const double norm = sqrt(work.norms[t]) * unscale;
            sc = static_cast<float>(clipValue / (norm > clipValue ? norm : clipValue));
        }
        if (unscale != 1.0f) sc *= unscale;
        work.scales[t] = sc;
    }
}

struct RuleArgs {
    UpdateKind kind;
    float momentum;
    bool nesterov;
    float oneMinusB1, oneMinusB2;
    float rho, oneMinusRho;
    float eps;
    bool decay;
    float clip;  // clipvalue, +inf when off
    bool centered;
};

__global__ void updateKernel(RuleArgs a, const UpdateTensorDev* tensors, int first, int count,
                             int64_t elements, UpdateWork work, bool scaled, const StepValues* sv) {
    if (work.skip && work.skip[0]) return;
    const int64_t base = tensors[first].start;
    TD_GRID_STRIDE(j, elements) {
        // The tensor holding global element base + j: the last whose start is at or below it.
        const int64_t e = base + j;
        int lo = first, hi = first + count - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (tensors[mid].start <= e)
                lo = mid;
            else
                hi = mid - 1;
        }
        const UpdateTensorDev& t = tensors[lo];
        const int64_t i = e - t.start;
        if (i >= t.size) continue;  // (empty tensors share a start with the next)
        const float gs = scaled ? work.scales[lo] : 1.0f;
        const float g = umath::clippedGrad(t.grad[i], gs, a.clip);
        float w = umath::decayed(t.value[i], a.decay, sv->wdLr);
        switch (a.kind) {
            case UpdateKind::Sgd:
                umath::sgd(g, w, a.momentum != 0 ? t.slot[0] + i : nullptr, sv->lr, a.momentum,
                           a.nesterov);
                break;
            case UpdateKind::Adam:
                umath::adam(g, w, t.slot[0][i], t.slot[1][i], t.slot[2] ? t.slot[2] + i : nullptr,
                            sv->alpha, a.oneMinusB1, a.oneMinusB2, a.eps);
                break;
            case UpdateKind::RmsProp: {
                const bool hasMomentum = a.momentum > 0;
                float* mom = hasMomentum ? t.slot[1] + i : nullptr;
                float* avg = a.centered ? t.slot[hasMomentum ? 2 : 1] + i : nullptr;
                umath::rmsprop(g, w, t.slot[0][i], mom, avg, sv->lr, a.rho, a.oneMinusRho, a.eps,
                               a.momentum);
                break;
            }
        }
        t.value[i] = w;
        if (t.shadow) t.shadow[i] = t.shadowF16 ? floatToF16(w) : floatToBf16(w);
    }
}

}  // namespace

cudaError_t update(cudaStream_t s, const UpdateSpec& spec, const UpdateTensorDev* tensors,
                   int first, int count, int64_t elements, const UpdateWork& work,
                   LossScaleState* lossScale, const StepValues* sv) {
    if (count <= 0) return cudaSuccess;
    const bool norms =
        lossScale || spec.clip == ClipKind::Norm || spec.clip == ClipKind::GlobalNorm;
    if (norms) {
        cudaError_t e = cudaMemsetAsync(work.norms + first, 0, sizeof(double) * count, s);
        if (e != cudaSuccess) return e;
        const dim3 grid(64, static_cast<unsigned>(count));
        sumSquaresKernel<<<grid, kThreads, 0, s>>>(tensors, first, work.norms);
        prepareKernel<<<1, 1, 0, s>>>(spec.clip, spec.clipValue, first, count, work, lossScale);
    } else {
        cudaError_t e = cudaMemsetAsync(work.skip, 0, sizeof(int32_t), s);
        if (e != cudaSuccess) return e;
    }
    RuleArgs a;
    a.kind = spec.kind;
    a.momentum = spec.momentum;
    a.nesterov = spec.nesterov;
    a.oneMinusB1 = spec.oneMinusBeta1;
    a.oneMinusB2 = spec.oneMinusBeta2;
    a.rho = spec.rho;
    a.oneMinusRho = spec.oneMinusRho;
    a.eps = spec.epsilon;
    a.decay = spec.decay;
    a.clip = spec.clip == ClipKind::Value ? static_cast<float>(spec.clipValue) : INFINITY;
    a.centered = spec.centered;
    if (elements > 0)
        updateKernel<<<blocksFor(elements), kThreads, 0, s>>>(a, tensors, first, count, elements,
                                                              work, norms, sv);
    return cudaGetLastError();
}

}  // namespace td::cuda
