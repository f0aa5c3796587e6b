// Convolutions of the CUDA device through cuDNN (its convolution API, f32 with FMA math: no TF32,
// so results stay f32-accurate): forward, backward data and backward filter over channels-last
// images. Keras keeps kernels as [KH,KW,C/groups,F]; cuDNN's channels-last filters are
// [F,KH,KW,C/groups], so the kernel goes through a transposed copy each step. cuDNN is opened
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
    // Plans one convolution pass; null with `whyNot` set when cuDNN cannot run it (the caller
    // uses the direct kernels). Errors: cuDNN failed outright.
    static Result<std::unique_ptr<DnnConv>> plan(const DnnContext& ctx, ConvPass pass,
                                                 const ConvGeometry& g, size_t workspaceBytes,
                                                 std::string* whyNot);
    // Forward: (x, w) -> y; GradInput: (dy, w) -> dx; GradFilter: (x, dy) -> dw. The kernel
    // (read or written) is in Keras layout; `filter` holds its cuDNN-layout copy (filterFloats()).
    Status run(cudaStream_t stream, const float* a, const float* b, float* out, float* filter,
               void* workspace) const;
    int64_t filterFloats() const { return g_.kh * g_.kw * (g_.C / g_.groups) * g_.F; }

  private:
    DnnConv() = default;
    void destroy();
    const DnnContext* ctx_ = nullptr;
    ConvPass pass_ = ConvPass::Forward;
    ConvGeometry g_;
    void* xDesc_ = nullptr;
    void* yDesc_ = nullptr;
    void* wDesc_ = nullptr;
    void* convDesc_ = nullptr;
    int algo_ = 0;
    size_t workspaceBytes_ = 0;
};

}  // namespace td::cuda
