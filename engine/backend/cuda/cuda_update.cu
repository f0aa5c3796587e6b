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

// The rule on one element: g the clipped gradient, w the decayed value; s0..s2 the element's
// slots (null where the tensor has none), read and written in place.
__device__ inline void applyRule(const RuleArgs& a, float g, float& w, float* s0, float* s1,
                                 float* s2, const StepValues& v) {
    switch (a.kind) {
        case UpdateKind::Sgd:
            umath::sgd(g, w, a.momentum != 0 ? s0 : nullptr, v.lr, a.momentum, a.nesterov);
            break;
        case UpdateKind::Adam:
            umath::adam(g, w, *s0, *s1, s2, v.alpha, a.oneMinusB1, a.oneMinusB2, a.eps);
            break;
        case UpdateKind::RmsProp: {
            const bool hasMomentum = a.momentum > 0;
            float* mom = hasMomentum ? s1 : nullptr;
            float* avg = a.centered ? (hasMomentum ? s2 : s1) : nullptr;
            umath::rmsprop(g, w, *s0, mom, avg, v.lr, a.rho, a.oneMinusRho, a.eps, a.momentum);
            break;
        }
    }
}

__device__ inline bool aligned16(const void* p) {
    return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Each block updates one chunk of kUpdateChunk elements of one tensor: the tensor is found once
// per block (the last whose firstBlock is at or below the block's), not per element. Where every
// array of the tensor is 16-byte aligned (the shadow 8-byte), each thread moves four neighbouring
// elements per access, the block's threads side by side; the tail of a tensor whose size is not a
// multiple of four, and tensors that are not aligned, go one element at a time. The per-element
// math is the same either way.
__global__ void updateKernel(RuleArgs a, const UpdateTensorDev* tensors, int first, int count,
                             UpdateWork work, bool scaled, const StepValues* sv) {
    if (work.skip && work.skip[0]) return;
    const int64_t block = tensors[first].firstBlock + blockIdx.x;
    int lo = first, hi = first + count - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (tensors[mid].firstBlock <= block)
            lo = mid;
        else
            hi = mid - 1;
    }
    const UpdateTensorDev t = tensors[lo];
    const int64_t begin = (block - t.firstBlock) * kUpdateChunk;
    const int64_t end = begin + kUpdateChunk < t.size ? begin + kUpdateChunk : t.size;
    if (begin >= end) return;  // (an empty tensor shares its firstBlock with the next)
    const float gs = scaled ? work.scales[lo] : 1.0f;
    const StepValues v = *sv;
    bool vec = aligned16(t.value) && aligned16(t.grad) &&
               (reinterpret_cast<uintptr_t>(t.shadow) & 7u) == 0;
    for (int k = 0; k < 3; ++k) vec = vec && aligned16(t.slot[k]);
    // The quads [begin / 4, quadEnd): whole quads of the chunk (begin is a multiple of four).
    const int64_t quadEnd = vec ? end / 4 : begin / 4;
    for (int64_t q = begin / 4 + threadIdx.x; q < quadEnd; q += blockDim.x) {
        const float4 g4 = reinterpret_cast<const float4*>(t.grad)[q];
        const float4 w4 = reinterpret_cast<const float4*>(t.value)[q];
        float g[4] = {g4.x, g4.y, g4.z, g4.w}, w[4] = {w4.x, w4.y, w4.z, w4.w};
        float sl[3][4] = {};
        for (int k = 0; k < 3; ++k)
            if (t.slot[k]) {
                const float4 s4 = reinterpret_cast<const float4*>(t.slot[k])[q];
                sl[k][0] = s4.x;
                sl[k][1] = s4.y;
                sl[k][2] = s4.z;
                sl[k][3] = s4.w;
            }
        for (int e = 0; e < 4; ++e) {
            const float ge = umath::clippedGrad(g[e], gs, a.clip);
            w[e] = umath::decayed(w[e], a.decay, v.wdLr);
            applyRule(a, ge, w[e], t.slot[0] ? &sl[0][e] : nullptr, t.slot[1] ? &sl[1][e] : nullptr,
                      t.slot[2] ? &sl[2][e] : nullptr, v);
        }
        reinterpret_cast<float4*>(t.value)[q] = make_float4(w[0], w[1], w[2], w[3]);
        for (int k = 0; k < 3; ++k)
            if (t.slot[k])
                reinterpret_cast<float4*>(t.slot[k])[q] =
                    make_float4(sl[k][0], sl[k][1], sl[k][2], sl[k][3]);
        if (t.shadow) {
            uint32_t h[4];
            for (int e = 0; e < 4; ++e) h[e] = t.shadowF16 ? floatToF16(w[e]) : floatToBf16(w[e]);
            reinterpret_cast<uint2*>(t.shadow)[q] =
                make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
        }
    }
    for (int64_t i = (vec ? quadEnd * 4 : begin) + threadIdx.x; i < end; i += blockDim.x) {
        const float g = umath::clippedGrad(t.grad[i], gs, a.clip);
        float w = umath::decayed(t.value[i], a.decay, v.wdLr);
        applyRule(a, g, w, t.slot[0] ? t.slot[0] + i : nullptr, t.slot[1] ? t.slot[1] + i : nullptr,
                  t.slot[2] ? t.slot[2] + i : nullptr, v);
        t.value[i] = w;
        if (t.shadow) t.shadow[i] = t.shadowF16 ? floatToF16(w) : floatToBf16(w);
    }
}

}  // namespace

cudaError_t update(cudaStream_t s, const UpdateSpec& spec, const UpdateTensorDev* tensors,
                   int first, int count, int64_t blocks, const UpdateWork& work,
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
    if (blocks > 0)
        updateKernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(a, tensors, first, count,
                                                                        work, norms, sv);
    return cudaGetLastError();
}

}  // namespace td::cuda
