// The matrix products of one training step of an MLP, alone, through cuBLASLt on one GPU, with the
// plans the CUDA device makes (engine/backend/cuda/cublaslt_matmul.h: the same heuristic, the same
// 32 MiB workspace, bias and ReLU epilogues on the hidden layers' forward products): the rate a
// trainer could reach on that GPU if nothing but its matmuls took time. Prints each product's time
// and TFLOP/s and the step's, and, given the trainer's measured samples/s, the share of the step
// those products account for: the fraction of cuBLASLt's own matmul rate the trainer reaches.
//
//   traindeck_bench_cuda_matmul [--layers 784,4096,4096,10] [--batch 1024] [--dtypes f32,bf16]
//                               [--repeat 50] [--device 0] [--trainer-samples-per-s 1e5,4e5]
//
// Per layer with input width K, output width N and batch M: forward [M,K]x[K,N] into the compute
// dtype; the weight gradient [K,M]x[M,N] (the input transposed) into f32 (the master gradient);
// the input gradient [M,N]x[N,K] (the weights transposed) into the compute dtype, for every layer
// but the first, as the device runs them. f32 is plain FP32 arithmetic (no TF32), bf16 has f32
// accumulation. Without a GPU it says so and exits 77.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/cuda/cublaslt_matmul.h"

namespace {

struct Product {
    std::string what;
    int64_t m, k, n;
    bool transA, transB;
    bool wgrad;     // the result is f32 (a master gradient)
    bool biasRelu;  // a hidden layer's forward product: bias and ReLU epilogue
    double ms = 0;  // per run
};

bool cudaOk(cudaError_t e, const std::string& what) {
    if (e == cudaSuccess) return true;
    std::fprintf(stderr, "bench_cuda_matmul: %s: %s (%s)\n", what.c_str(), cudaGetErrorName(e),
                 cudaGetErrorString(e));
    return false;
}

// Device memory freed at scope end.
struct DeviceBuffer {
    void* p = nullptr;
    ~DeviceBuffer() {
        if (p) cudaFree(p);
    }
};

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"cuBLASLt's own rate at an MLP's training-step products on one GPU"};
    std::vector<int64_t> layers{784, 4096, 4096, 10};
    std::vector<std::string> dtypeNames{"f32", "bf16"};
    std::vector<double> trainer;
    int64_t batch = 1024;
    int repeat = 50, device = 0;
    app.add_option("--layers", layers, "Widths, input first (comma-separated)")
        ->delimiter(',')
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
    app.add_option("--batch", batch, "Batch (M)")->check(CLI::PositiveNumber);
    app.add_option("--dtypes", dtypeNames, "Operand dtypes: f32, bf16, f16 (comma-separated)")
        ->delimiter(',')
        ->check(CLI::IsMember({"f32", "bf16", "f16"}));
    app.add_option("--repeat", repeat, "Timed steps")->check(CLI::Range(1, 100000));
    app.add_option("--device", device, "CUDA device index")->check(CLI::NonNegativeNumber);
    app.add_option("--trainer-samples-per-s", trainer,
                   "Measured training rates, one per dtype in --dtypes order: prints the share of "
                   "the step the products take")
        ->delimiter(',')
        ->check(CLI::Range(0.0, 1e12));
    CLI11_PARSE(app, argc, argv);

    if (layers.size() < 2) {
        std::fprintf(stderr, "bench_cuda_matmul: --layers needs at least two widths\n");
        return 2;
    }
    std::vector<td::DType> dtypes;
    for (const std::string& d : dtypeNames)
        dtypes.push_back(d == "f32"    ? td::DType::F32
                         : d == "bf16" ? td::DType::BF16
                                       : td::DType::F16);
    std::string layersText;
    for (int64_t w : layers) layersText += (layersText.empty() ? "" : ",") + std::to_string(w);
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        std::printf("SKIP: no CUDA device (cudaGetDeviceCount reports none)\n");
        return 77;
    }
    if (device >= count) {
        std::fprintf(stderr, "bench_cuda_matmul: --device %d: this machine has %d GPU(s)\n", device,
                     count);
        return 2;
    }
    if (!cudaOk(cudaSetDevice(device), "cudaSetDevice")) return 1;
    cudaDeviceProp prop{};
    if (!cudaOk(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties")) return 1;
    auto ctx = td::cuda::LtContext::create();
    if (!ctx.ok()) {
        std::fprintf(stderr, "bench_cuda_matmul: %s\n", ctx.error().c_str());
        return 1;
    }
    cudaStream_t stream = nullptr;
    if (!cudaOk(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream")) return 1;
    DeviceBuffer workspace;
    const size_t wsBytes = size_t{32} << 20;
    if (!cudaOk(cudaMalloc(&workspace.p, wsBytes), "workspace")) return 1;

    std::printf("cuBLASLt on %s (cuda:%d), MLP %s, batch %lld, %d timed steps\n", prop.name, device,
                layersText.c_str(), static_cast<long long>(batch), repeat);
    for (size_t di = 0; di < dtypes.size(); ++di) {
        const td::DType dt = dtypes[di];
        std::vector<Product> products;
        for (size_t l = 0; l + 1 < layers.size(); ++l) {
            const int64_t k = layers[l], n = layers[l + 1];
            const std::string layer = "layer " + std::to_string(l + 1);
            const bool hidden = l + 2 < layers.size();
            products.push_back({layer + " forward", batch, k, n, false, false, false, hidden});
            products.push_back({layer + " weight grad", k, batch, n, true, false, true, false});
            if (l > 0)
                products.push_back({layer + " input grad", batch, n, k, false, true, false, false});
        }
        // One buffer per operand, each large enough for the biggest product's, every byte 0x3c
        // (about 0.0115 in f32 and in bf16; 1.06 in f16): finite values, no denormals.
        int64_t maxElems = 0;
        for (const Product& p : products)
            maxElems = std::max({maxElems, p.m * p.k, p.k * p.n, p.m * p.n});
        DeviceBuffer a, b, c, bias;
        const size_t bytes = static_cast<size_t>(maxElems) * 4;
        if (!cudaOk(cudaMalloc(&a.p, bytes), "operand A") ||
            !cudaOk(cudaMalloc(&b.p, bytes), "operand B") ||
            !cudaOk(cudaMalloc(&c.p, bytes), "result") ||
            !cudaOk(cudaMalloc(&bias.p, 4 * 65536), "bias"))
            return 1;
        for (void* p : {a.p, b.p, c.p}) cudaMemset(p, 0x3c, bytes);
        cudaMemset(bias.p, 0, 4 * 65536);
        std::vector<std::unique_ptr<td::cuda::LtMatmul>> plans;
        for (const Product& p : products) {
            td::cuda::LtMatmulShape s;
            s.M = p.m;
            s.N = p.n;
            s.K = p.k;
            s.transA = p.transA;
            s.transB = p.transB;
            s.ab = dt;
            s.c = p.wgrad ? td::DType::F32 : dt;
            s.bias = dt == td::DType::F32 ? td::DType::F32 : dt;
            s.a = a.p;
            s.b = b.p;
            s.out = c.p;
            if (p.biasRelu) {
                s.biasPtr = bias.p;
                s.relu = true;
            }
            auto plan = td::cuda::LtMatmul::plan(**ctx, s, workspace.p, wsBytes);
            if (!plan.ok()) {
                std::fprintf(stderr, "bench_cuda_matmul: %s %s: %s\n", td::dtypeName(dt),
                             p.what.c_str(), plan.error().c_str());
                return 1;
            }
            plans.push_back(std::move(*plan));
        }
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        double stepMs = 0, flops = 0;
        for (size_t i = 0; i < products.size(); ++i) {
            Product& p = products[i];
            for (int w = 0; w < 5; ++w)
                if (auto st = plans[i]->run(stream); !st.ok()) {
                    std::fprintf(stderr, "bench_cuda_matmul: %s\n", st.error().c_str());
                    return 1;
                }
            cudaEventRecord(e0, stream);
            for (int r = 0; r < repeat; ++r) (void)plans[i]->run(stream);
            cudaEventRecord(e1, stream);
            if (!cudaOk(cudaEventSynchronize(e1), p.what)) return 1;
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            p.ms = ms / repeat;
            stepMs += p.ms;
            flops += 2.0 * double(p.m) * double(p.k) * double(p.n);
        }
        std::printf("%s:\n", td::dtypeName(dt));
        for (const Product& p : products)
            std::printf("  %-22s %6lld x %6lld x %6lld  %9.4f ms  %7.1f TFLOP/s\n", p.what.c_str(),
                        static_cast<long long>(p.m), static_cast<long long>(p.k),
                        static_cast<long long>(p.n), p.ms,
                        2.0 * double(p.m) * double(p.k) * double(p.n) / (p.ms * 1e9));
        const double rate = flops / (stepMs * 1e9);
        std::printf(
            "  step's products: %.4f ms, %.3f GFLOP, %.1f TFLOP/s; %.0f samples/s if "
            "nothing else took time\n",
            stepMs, flops / 1e9, rate, double(batch) / (stepMs / 1e3));
        if (di < trainer.size() && trainer[di] > 0) {
            const double trainerMs = double(batch) / trainer[di] * 1e3;
            std::printf(
                "  trainer at %.0f samples/s: %.4f ms a step, %.1f TFLOP/s = %.0f%% of "
                "cuBLASLt's rate at these products\n",
                trainer[di], trainerMs, flops / (trainerMs * 1e9), 100.0 * stepMs / trainerMs);
        }
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    cudaStreamDestroy(stream);
    return 0;
}
