// The CUDA device's own kernels (everything but matrix products, which go to cuBLASLt): launch
// functions callable from host C++ (cuda_device.cpp), compiled by nvcc in cuda_kernels.cu. Every
// launch is enqueued on the given stream and returns the launch's error (cudaSuccess: enqueued).
// Operands are typed views (Ten): f32, bf16 or f16 values are read into f32, computed in f32 and
// rounded to nearest even when stored, as the CPU backend's block mode does. Per-element math is
// shared with the CPU backend (backend/kernel_math.h, core/half.h, backend/update_math.h).
//
// Layouts are the CPU backend's (cpu/kernels.h, cpu/image_kernels.h): [rows, cols] row-major,
// images channels-last [B,H,W,C], Keras kernels [KH,KW,C/groups,F].
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/graph/conv_geometry.h"
#include "engine/graph/image_augment.h"
#include "engine/graph/ir.h"  // ActKind, LossKind, MetricKind
#include "engine/graph/update_spec.h"

namespace td::cuda {

enum class Dt : uint8_t { F32, BF16, F16, I32 };

// A typed operand: the address of its first element and its element type.
struct Ten {
    void* p = nullptr;
    Dt dt = Dt::F32;
};

// The per-step values a program reads, kept in device memory: a captured CUDA Graph replays
// the same kernel arguments every step, so anything that changes per step is read from here
// (written by an async copy from pinned host memory before each run).
struct StepValues {
    int64_t step = 0;
    int64_t sampleBase = 0;
    float lr = 0, alpha = 0, wdLr = 0;
    int32_t refreshShadows = 0;
};

// Dropout fused into an elementwise kernel: rate 0 = none. The mask of element (r, c) of a
// [rows, cols] value is keyed by (seed, step, sampleBase + r, c), as cpu::dropout.
struct DropMask {
    float rate = 0;
    uint64_t seed = 0;
};

// y = act(x + bias) with an optional dropout mask on the result. bias (per column, cols values)
// may be null; act may not be softmax.
cudaError_t biasAct(cudaStream_t s, Ten x, Ten bias, Ten y, int64_t rows, int64_t cols, ActKind act,
                    float alpha, DropMask drop, const StepValues* sv);
// Row-wise softmax of x [rows, cols].
cudaError_t softmax(cudaStream_t s, Ten x, Ten y, int64_t rows, int64_t cols);
// dx = act'(.) * (dropout mask of dy); saved is y (usesOutput) or x. Softmax included (rows).
cudaError_t actGrad(cudaStream_t s, Ten dy, Ten saved, Ten dx, int64_t rows, int64_t cols,
                    ActKind act, float alpha, bool usesOutput, DropMask drop, const StepValues* sv);
// out[c] = sum over rows of x[r, c], summed in row pieces in a fixed order (deterministic).
// `scratch`: colSumsScratchFloats(rows, cols) floats.
cudaError_t colSums(cudaStream_t s, Ten x, Ten out, int64_t rows, int64_t cols, float* scratch);
int64_t colSumsScratchFloats(int64_t rows, int64_t cols);
// y = a + b (n values); y = x with the dropout mask (rows x cols).
cudaError_t add(cudaStream_t s, Ten a, Ten b, Ten y, int64_t n);
cudaError_t dropout(cudaStream_t s, Ten x, Ten y, int64_t rows, int64_t cols, DropMask drop,
                    const StepValues* sv);
// dst = src converted (n values). onlyWhenRefresh: a shadow refresh, skipped unless
// sv->refreshShadows.
cudaError_t cast(cudaStream_t s, Ten src, Ten dst, int64_t n, bool onlyWhenRefresh,
                 const StepValues* sv);

// Losses and metrics: pred [rows, cols]; labels i32 [rows] or f32 [rows, cols]. `scratch`:
// lossScratchDoubles(rows) doubles. out: one f32.
int64_t lossScratchDoubles(int64_t rows);
cudaError_t loss(cudaStream_t s, LossKind k, Ten pred, Ten labels, float* out, int64_t rows,
                 int64_t cols, float scale, double* scratch);
// dynScale non-null: the gradient is also multiplied by dynScale->scale (mixed_float16).
cudaError_t lossGrad(cudaStream_t s, LossKind k, Ten pred, Ten labels, Ten dpred, int64_t rows,
                     int64_t cols, float scale, const LossScaleState* dynScale);
cudaError_t metric(cudaStream_t s, MetricKind k, int64_t topK, bool onLogits, Ten pred, Ten labels,
                   float* out, int64_t rows, int64_t cols, double* scratch);
cudaError_t regLoss(cudaStream_t s, Ten w, int64_t n, float l1, float l2, float* out,
                    double* scratch);
cudaError_t regGrad(cudaStream_t s, Ten g, Ten w, Ten out, int64_t n, float l1, float l2);
// acc[0] += double(x[0]) * factor.
cudaError_t accumulate(cudaStream_t s, const float* x, double* acc, double factor);

// Images and normalization (f32). Pooling and the convolutions take the instruction's geometry
// (Instr::geometry, graph/conv_geometry.h) by value into their kernels.
cudaError_t maxPool(cudaStream_t s, const ConvGeometry& p, const float* x, float* y);
cudaError_t maxPoolGrad(cudaStream_t s, const ConvGeometry& p, const float* dy, const float* x,
                        float* dx);
cudaError_t avgPool(cudaStream_t s, const ConvGeometry& p, const float* x, float* y);
cudaError_t avgPoolGrad(cudaStream_t s, const ConvGeometry& p, const float* dy, float* dx);
cudaError_t pad2d(cudaStream_t s, const float* x, float* y, int64_t B, int64_t H, int64_t W,
                  int64_t C, int64_t top, int64_t bottom, int64_t left, int64_t right);
cudaError_t pad2dGrad(cudaStream_t s, const float* dy, float* dx, int64_t B, int64_t H, int64_t W,
                      int64_t C, int64_t top, int64_t bottom, int64_t left, int64_t right);
cudaError_t scale(cudaStream_t s, const float* x, float* y, int64_t n, float scale, float offset);
// Reductions over rows of x [rows, C]; scratch: normScratchFloats(rows, C) floats.
int64_t normScratchFloats(int64_t rows, int64_t C);
cudaError_t channelMean(cudaStream_t s, const float* x, float* mean, int64_t rows, int64_t C,
                        float* scratch);
cudaError_t channelVar(cudaStream_t s, const float* x, const float* mean, float* var, int64_t rows,
                       int64_t C, float* scratch);
cudaError_t batchNorm(cudaStream_t s, const float* x, const float* mean, const float* var,
                      const float* gamma, const float* beta, float* y, int64_t rows, int64_t C,
                      float eps);
cudaError_t batchNormGrad(cudaStream_t s, const float* dy, const float* x, const float* mean,
                          const float* var, const float* gamma, float* dx, int64_t rows, int64_t C,
                          float eps, bool batchStats, float* scratch);
cudaError_t normGammaGrad(cudaStream_t s, const float* dy, const float* x, const float* mean,
                          const float* var, float* dgamma, int64_t rows, int64_t C, float eps,
                          float* scratch);
cudaError_t movingAvg(cudaStream_t s, float* param, const float* stat, int64_t n, float momentum);
cudaError_t layerNorm(cudaStream_t s, const float* x, const float* gamma, const float* beta,
                      float* y, int64_t rows, int64_t C, float eps);
cudaError_t layerNormGrad(cudaStream_t s, const float* dy, const float* x, const float* gamma,
                          float* dx, int64_t rows, int64_t C, float eps);
cudaError_t layerNormGammaGrad(cudaStream_t s, const float* dy, const float* x, float* dgamma,
                               int64_t rows, int64_t C, float eps, float* scratch);

// Image preprocessing and augmentation (f32), x [B,H,W,C] -> y [B,OH,OW,C] as `a` says
// (graph/image_augment.h), with the CPU's per-element math (backend/augment_math.h). The random
// ones key sample b's draws by (a.seed, sv->step, sv->sampleBase + b), as cpu::randomFlip etc.
cudaError_t resize(cudaStream_t s, const AugmentSpec& a, const float* x, float* y);
cudaError_t randomCrop(cudaStream_t s, const AugmentSpec& a, const float* x, float* y,
                       const StepValues* sv);
cudaError_t randomFlip(cudaStream_t s, const AugmentSpec& a, const float* x, float* y,
                       const StepValues* sv);
cudaError_t randomRotation(cudaStream_t s, const AugmentSpec& a, const float* x, float* y,
                           const StepValues* sv);
cudaError_t randomZoom(cudaStream_t s, const AugmentSpec& a, const float* x, float* y,
                       const StepValues* sv);
cudaError_t randomTranslation(cudaStream_t s, const AugmentSpec& a, const float* x, float* y,
                              const StepValues* sv);
// `scratch`: contrastScratchFloats(a) floats (each sample's channel means).
int64_t contrastScratchFloats(const AugmentSpec& a);
cudaError_t randomContrast(cudaStream_t s, const AugmentSpec& a, const float* x, float* y,
                           float* scratch, const StepValues* sv);
cudaError_t randomBrightness(cudaStream_t s, const AugmentSpec& a, const float* x, float* y,
                             const StepValues* sv);

// Direct convolutions over channels-last images, where cuDNN cannot run one (cudnn_conv.h): one
// thread per output value, the filter gradient one block per kernel value.
// x [B,H,W,C], w [KH,KW,C/groups,F], y [B,OH,OW,F].
// y = act(conv(x, w) + bias); bias may be null.
cudaError_t conv2d(cudaStream_t s, const ConvGeometry& g, const float* x, const float* w,
                   const float* bias, float* y, ActKind act, float alpha);
cudaError_t conv2dGradInput(cudaStream_t s, const ConvGeometry& g, const float* dy, const float* w,
                            float* dx);
cudaError_t conv2dGradFilter(cudaStream_t s, const ConvGeometry& g, const float* x, const float* dy,
                             float* dw);
// A kernel between Keras' layout [KH,KW,Cg,F] and cuDNN's channels-last filters [F,KH,KW,Cg].
cudaError_t kerasToKrsc(cudaStream_t s, const float* src, float* dst, int64_t kh, int64_t kw,
                        int64_t cg, int64_t f);
cudaError_t krscToKeras(cudaStream_t s, const float* src, float* dst, int64_t kh, int64_t kw,
                        int64_t cg, int64_t f);
// The same for values of `elementBytes` (4: f32, 2: bf16 or f16).
cudaError_t kerasToKrsc(cudaStream_t s, const void* src, void* dst, int64_t kh, int64_t kw,
                        int64_t cg, int64_t f, int elementBytes);
cudaError_t krscToKeras(cudaStream_t s, const void* src, void* dst, int64_t kh, int64_t kw,
                        int64_t cg, int64_t f, int elementBytes);

// The replicas sharing one GPU: dst[r][i] = sum over q of src[q][i] for every replica r, summed
// in replica order (the same bits in every replica's bucket). At most kMaxSharedReplicas.
constexpr int kMaxSharedReplicas = 8;
struct SharedBuckets {
    float* p[kMaxSharedReplicas] = {};
    int n = 0;
};
cudaError_t sumShared(cudaStream_t s, SharedBuckets buckets, int64_t count);

// The optimizer update (graph/update_spec.h) over tensors [first, first + count) of `tensors`, with
// the clipping norms computed on the device, the per-step scalars read from `sv`, and dynamic
// loss scaling when lossScale is non-null (the step is skipped on the device when a gradient is
// not finite).
struct UpdateTensorDev {
    float* value = nullptr;
    const float* grad = nullptr;
    float* slot[3] = {nullptr, nullptr, nullptr};
    uint16_t* shadow = nullptr;
    int32_t shadowF16 = 0;
    int64_t size = 0;
    int64_t firstBlock = 0;  // the update's blocks before this tensor's (updateBlocks of each)
};
struct UpdateWork {
    double* norms = nullptr;  // per tensor: sum of squares of its gradient
    float* scales = nullptr;  // per tensor: the gradient scale (clipping, unscaling)
    int32_t* skip = nullptr;  // 1: this step is skipped (non-finite gradients)
};
// The update's blocks take kUpdateChunk elements of one tensor each: updateBlocks(size) of them
// per tensor, and `blocks` is their sum over the tensors updated.
constexpr int64_t kUpdateChunk = 4096;
inline int64_t updateBlocks(int64_t size) {
    return (size + kUpdateChunk - 1) / kUpdateChunk;
}
cudaError_t update(cudaStream_t s, const UpdateSpec& spec, const UpdateTensorDev* tensors,
                   int first, int count, int64_t blocks, const UpdateWork& work,
                   LossScaleState* lossScale, const StepValues* sv);

}  // namespace td::cuda
