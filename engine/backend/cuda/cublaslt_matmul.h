// Matrix products of the CUDA device through cuBLASLt: row-major [M,K] x [K,N] (either operand
// stored transposed) in f32, bf16 or f16 with f32 accumulation, the bias and ReLU as cuBLASLt
// epilogues where it has a kernel for them, else as the device's own bias/activation kernel
// after the product. cuBLASLt is opened with dlopen when the first CUDA device is created, so
// the binary starts on machines without it (and without a GPU).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "engine/core/result.h"
#include "engine/core/tensor.h"
#include "engine/graph/ir.h"

namespace td::cuda {

// The cuBLASLt library of the process (loaded once) and a handle on it.
class LtLibrary;

class LtContext {
  public:
    // Loads cuBLASLt (once per process) and creates a handle; errors say which step failed.
    static Result<std::unique_ptr<LtContext>> create();
    ~LtContext();
    LtContext(const LtContext&) = delete;
    LtContext& operator=(const LtContext&) = delete;

    const LtLibrary& lib() const { return *lib_; }
    void* handle() const { return handle_; }

  private:
    LtContext() = default;
    const LtLibrary* lib_ = nullptr;
    void* handle_ = nullptr;
};

// One planned product: C[M,N] = op(A) op(B) (+ bias[N]) (then relu when fused). The pointers are
// fixed when planned (the program's operands do not move).
struct LtMatmulShape {
    int64_t M = 0, N = 0, K = 0;
    bool transA = false, transB = false;  // the operand is stored transposed
    DType ab = DType::F32;                // both operands
    DType c = DType::F32;                 // the result
    DType bias = DType::F32;
    const void* a = nullptr;
    const void* b = nullptr;
    const void* biasPtr = nullptr;  // null: no bias
    void* out = nullptr;
    bool relu = false;  // ask for a fused ReLU
};

class LtMatmul {
  public:
    ~LtMatmul();
    // Plans the product: the fused epilogue when cuBLASLt has an algorithm for it, else the
    // plain product (fusedBias() / fusedRelu() then say false: the caller adds them).
    static Result<std::unique_ptr<LtMatmul>> plan(const LtContext& ctx, const LtMatmulShape& s,
                                                  void* workspace, size_t workspaceBytes);
    bool fusedBias() const { return fusedBias_; }
    bool fusedRelu() const { return fusedRelu_; }
    // Enqueues the product on the stream.
    Status run(cudaStream_t stream) const;

  private:
    LtMatmul() = default;
    Status tryPlan(bool bias, bool relu, bool& found);
    void destroyDescs();
    const LtContext* ctx_ = nullptr;
    LtMatmulShape s_;
    void* workspace_ = nullptr;
    size_t workspaceBytes_ = 0;
    void* desc_ = nullptr;
    void* layoutA_ = nullptr;
    void* layoutB_ = nullptr;
    void* layoutC_ = nullptr;
    std::unique_ptr<unsigned char[]> algo_;  // cublasLtMatmulAlgo_t
    bool fusedBias_ = false, fusedRelu_ = false;
    std::string lastRefusal_;  // cuBLASLt's answer when a form had no algorithm
};

}  // namespace td::cuda
