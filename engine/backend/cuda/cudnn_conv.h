// Convolutions of the CUDA device through cuDNN (its convolution API): forward, backward data and
// backward filter over channels-last images, in the operands' dtype. f32 runs with FMA math (no
// TF32, so results stay f32-accurate); bf16 and f16 (mixed precision's 16-bit convolutions,
// Device::halfConvolutions) run on the tensor cores with f32 accumulation and write their result
// in that 16-bit dtype. Keras keeps kernels as [KH,KW,C/groups,F]; cuDNN's channels-last filters
// are [F,KH,KW,C/groups], so the kernel goes through a transposed copy each step. cuDNN is opened
// with dlopen when a CUDA device is created; where it is missing, or has no algorithm for a
// convolution (e.g. uneven padding, which it cannot express), the device's direct kernels run
// that convolution instead.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/core/result.h"

namespace td::cuda {

class DnnLibrary;

class DnnContext {
  public:
    // Loads cuDNN (once per process) and creates a handle bound to `stream`.
    static Result<std::unique_ptr<DnnContext>> create(cudaStream_t stream);
    ~DnnContext();
    DnnContext(const DnnContext&) = delete;
    DnnContext& operator=(const DnnContext&) = delete;
    const DnnLibrary& lib() const { return *lib_; }
    void* handle() const { return handle_; }

  private:
    DnnContext() = default;
    const DnnLibrary* lib_ = nullptr;
    void* handle_ = nullptr;
};

enum class ConvPass { Forward, GradInput, GradFilter };

class DnnConv {
  public:
    ~DnnConv();
    // Plans one convolution pass with every operand and the result in `dt` (F32, BF16 or F16);
    // null with `whyNot` set when cuDNN cannot run it (the caller uses the direct kernels).
    // Errors: cuDNN failed outright.
    static Result<std::unique_ptr<DnnConv>> plan(const DnnContext& ctx, ConvPass pass,
                                                 const ConvGeometry& g, Dt dt,
                                                 size_t workspaceBytes, std::string* whyNot);
    // Forward: (x, w) -> y; GradInput: (dy, w) -> dx; GradFilter: (x, dy) -> dw, all in the
    // planned dtype. The kernel (read or written) is in Keras layout; `filter` holds its
    // cuDNN-layout copy (filterBytes()).
    Status run(cudaStream_t stream, const void* a, const void* b, void* out, void* filter,
               void* workspace) const;
    // A forward f32 convolution with its bias and ReLU in cuDNN's fused call: sets it up and
    // tries it once on these operands (synchronizing `stream`). False with `whyNot` set where
    // cuDNN refuses it (the caller keeps run() and its own bias/activation kernel).
    Result<bool> fuseBiasRelu(cudaStream_t stream, const void* x, const void* w, const void* bias,
                              void* y, void* filter, void* workspace, std::string* whyNot);
    // y = relu(conv(x, w) + bias) after fuseBiasRelu said yes; w in Keras layout, f32.
    Status runFused(cudaStream_t stream, const void* x, const void* w, const void* bias, void* y,
                    void* filter, void* workspace) const;
    int64_t filterBytes() const {
        return g_.kh * g_.kw * (g_.C / g_.groups) * g_.F * (dt_ == Dt::F32 ? 4 : 2);
    }

  private:
    DnnConv() = default;
    void destroy();
    const DnnContext* ctx_ = nullptr;
    ConvPass pass_ = ConvPass::Forward;
    ConvGeometry g_;
    Dt dt_ = Dt::F32;
    void* xDesc_ = nullptr;
    void* yDesc_ = nullptr;
    void* wDesc_ = nullptr;
    void* convDesc_ = nullptr;
    void* biasDesc_ = nullptr;  // fused: the bias [1,F,1,1]
    void* actDesc_ = nullptr;   // fused: ReLU
    int algo_ = 0;
    size_t workspaceBytes_ = 0;
};

}  // namespace td::cuda
