// The CUDA C++ sources compiled at run time through NVRTC (nvrtc_compile.h). Add an entry per
// kernel family the backend generates; CTest test_nvrtc compiles every one for each target
// architecture on every build with the toolkit, GPU or not.
#include "engine/backend/cuda/nvrtc_compile.h"

namespace td::cuda {

namespace {

// y[i] = alpha * x[i] + y[i] over n f32 elements, grid-stride: the shape every generated
// elementwise kernel takes.
constexpr const char* kAxpyF32 = R"cuda(
extern "C" __global__ void td_axpy_f32(long long n, float alpha, const float* __restrict__ x,
                                       float* __restrict__ y) {
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<long long>(gridDim.x) * blockDim.x)
        y[i] = alpha * x[i] + y[i];
}
)cuda";

}  // namespace

std::vector<std::pair<std::string, std::string>> cudaRuntimeKernelSources() {
    return {{"td_axpy_f32.cu", kAxpyF32}};
}

}  // namespace td::cuda
