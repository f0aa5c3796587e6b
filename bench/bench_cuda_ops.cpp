// The CUDA device's own max pooling and BatchNormalization kernels (engine/backend/cuda/
// cuda_kernels.h) against cuDNN's, at the shapes of projects/fashion_mnist_cnn.json, and each of
// its convolutions with bias and ReLU as the device runs them (cuDNN's convolution, then the
// biasAct kernel) against cuDNN's fused call, plus what the same convolution takes in bf16. Prints
// the microseconds per run of each side and their ratio, one line per row, then checks that both
// sides computed the same values.
//
//   traindeck_bench_cuda_ops [--batch 64] [--repeat 200] [--device 0]
//
// Rows at batch B: 2x2 stride-2 max pooling of [B,26,26,32] and [B,11,11,64], forward and gradient;
// BatchNormalization in training over [B,26,26,32] (forward: channelMean, channelVar, batchNorm;
// backward: batchNormGrad, normGammaGrad, and colSums for beta) against cuDNN's spatial and
// spatial-persistent modes, the faster reported; conv1 [B,28,28,1] -> 32 3x3 filters and conv2
// [B,13,13,32] -> 64, f32 in FMA math (no TF32) with the algorithm the device would pick. cuDNN is
// opened with dlopen as the device opens it; where it cannot be, the TrainDeck side is still
// timed. Each row: 10 warm-up runs, then --repeat runs between two events on one stream, captured
// into a CUDA Graph and replayed as the device replays its steps (launched one by one, and said
// so, where capture fails).
// Without a GPU it says so and exits 77; a failed check exits 1.
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/core/half.h"
#include "engine/core/module_loader.h"

namespace {

namespace cuda = td::cuda;

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // the device's cuDNN workspace
constexpr int kWarmup = 10;
constexpr float kOne = 1.0f, kZero = 0.0f;
constexpr const char* kVsDnn = "cuDNN/TrainDeck; above 1: TrainDeck faster";

// The cuDNN entry points the benchmark calls (opened as engine/backend/cuda/cudnn_conv.cpp does).
// clang-format off
#define TD_OPS_DNN_FNS(X)                                                                         \
    X(cudnnGetVersion) X(cudnnGetErrorString) X(cudnnCreate) X(cudnnDestroy) X(cudnnSetStream)    \
    X(cudnnCreateTensorDescriptor) X(cudnnSetTensor4dDescriptor) X(cudnnDestroyTensorDescriptor)  \
    X(cudnnCreateFilterDescriptor) X(cudnnSetFilter4dDescriptor) X(cudnnDestroyFilterDescriptor)  \
    X(cudnnCreateConvolutionDescriptor) X(cudnnSetConvolution2dDescriptor)                        \
    X(cudnnSetConvolutionMathType) X(cudnnDestroyConvolutionDescriptor)                           \
    X(cudnnGetConvolutionForwardAlgorithm_v7) X(cudnnGetConvolutionForwardWorkspaceSize)          \
    X(cudnnConvolutionForward) X(cudnnConvolutionBiasActivationForward)                           \
    X(cudnnCreateActivationDescriptor) X(cudnnSetActivationDescriptor)                            \
    X(cudnnDestroyActivationDescriptor) X(cudnnCreatePoolingDescriptor)                           \
    X(cudnnSetPooling2dDescriptor) X(cudnnDestroyPoolingDescriptor) X(cudnnPoolingForward)        \
    X(cudnnPoolingBackward) X(cudnnDeriveBNTensorDescriptor)                                      \
    X(cudnnBatchNormalizationForwardTraining) X(cudnnBatchNormalizationBackward)
// clang-format on

struct Dnn {
#define TD_OPS_DNN_FN(name) decltype(&::name) name = nullptr;
    TD_OPS_DNN_FNS(TD_OPS_DNN_FN)
#undef TD_OPS_DNN_FN
    cudnnHandle_t h = nullptr;
    std::string soname;
    std::string error;  // why cuDNN cannot be used (empty: it can)

    // Empty for success, else cuDNN's name for the status.
    std::string text(cudnnStatus_t st) const {
        if (st == CUDNN_STATUS_SUCCESS) return "";
        const char* s = cudnnGetErrorString ? cudnnGetErrorString(st) : nullptr;
        return s ? std::string(s) : "cuDNN status " + std::to_string(static_cast<int>(st));
    }
};

void openDnn(Dnn& d, cudaStream_t stream) {
    auto lib = td::SystemLibrary::open("cuDNN", {"libcudnn.so.9", "libcudnn.so"});
    if (!lib.ok()) {
        d.error = lib.error();
        return;
    }
    d.soname = lib->soname();
#define TD_OPS_DNN_SLOT(name) td::SymbolSlot(#name, d.name),
    const td::Status resolved = lib->resolve({TD_OPS_DNN_FNS(TD_OPS_DNN_SLOT)});
#undef TD_OPS_DNN_SLOT
    if (!resolved.ok()) {
        d.error = resolved.error();
        return;
    }
    if (std::string e = d.text(d.cudnnCreate(&d.h)); !e.empty())
        d.error = "cudnnCreate: " + e;
    else if (e = d.text(d.cudnnSetStream(d.h, stream)); !e.empty())
        d.error = "cudnnSetStream: " + e;
}

// Records the first failed cuDNN call of a row's setup: `check(dnn.cudnnFoo(...))`.
struct DnnCheck {
    const Dnn& dnn;
    std::string failed;
    bool operator()(cudnnStatus_t st) {
        if (st != CUDNN_STATUS_SUCCESS && failed.empty()) failed = dnn.text(st);
        return st == CUDNN_STATUS_SUCCESS;
    }
};

// One side of a row: microseconds per run, or why it did not run.
struct Timing {
    double us = 0;
    std::string failed;    // non-empty: no time
    bool skipped = false;  // cuDNN not loaded
    bool graph = false;    // timed as CUDA Graph replays (else launched one by one)
    bool ok() const { return failed.empty(); }
};

Timing dnnMissing() {
    return {0, "not loaded (see above)", true};
}

// Empty when every launch was enqueued, else the first one's error.
std::string launched(std::initializer_list<cudaError_t> launches) {
    for (cudaError_t e : launches)
        if (e != cudaSuccess) return cudaGetErrorString(e);
    return "";
}

struct Ctx {
    Dnn dnn;
    cudaStream_t stream = nullptr;
    cudaEvent_t start = nullptr, stop = nullptr;
    int repeat = 0;
    void* workspace = nullptr;
    std::vector<std::function<void()>> cleanup;  // run last first at the end
    std::vector<std::string> failedChecks;

    ~Ctx() {
        for (auto it = cleanup.rbegin(); it != cleanup.rend(); ++it) (*it)();
    }

    // kWarmup runs, then `repeat` timed ones; `run` enqueues one and returns its error (empty:
    // none). The timed runs are captured into one CUDA Graph and replayed, as the device replays
    // its steps, so that a run shorter than its launches' host cost is still timed on the GPU;
    // where capture fails they are launched one by one.
    template <class Run>
    Timing time(Run run) const {
        Timing t;
        for (int i = 0; i < kWarmup && t.ok(); ++i) t.failed = run();
        if (!t.ok()) return t;
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
            std::string failed;
            for (int i = 0; i < repeat && failed.empty(); ++i) failed = run();
            if (cudaStreamEndCapture(stream, &graph) != cudaSuccess || !failed.empty() || !graph ||
                cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess)
                exec = nullptr;
        }
        (void)cudaGetLastError();  // a refused capture's error: the runs go one by one instead
        auto runAll = [&] {
            if (exec) {
                if (const cudaError_t e = cudaGraphLaunch(exec, stream); e != cudaSuccess)
                    t.failed = cudaGetErrorString(e);
                return;
            }
            for (int i = 0; i < repeat && t.ok(); ++i) t.failed = run();
        };
        runAll();  // the graph's first replay uploads it
        cudaEventRecord(start, stream);
        runAll();
        cudaEventRecord(stop, stream);
        if (const cudaError_t e = cudaEventSynchronize(stop); e != cudaSuccess && t.ok())
            t.failed = cudaGetErrorString(e);
        float ms = 0;
        cudaEventElapsedTime(&ms, start, stop);
        t.us = 1e3 * ms / repeat;
        t.graph = exec != nullptr;
        if (exec) cudaGraphExecDestroy(exec);
        if (graph) cudaGraphDestroy(graph);
        return t;
    }
};

// Device memory freed at the end; out of memory ends the benchmark.
template <class T>
T* alloc(Ctx& c, int64_t n) {
    void* p = nullptr;
    if (const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(n) * sizeof(T));
        e != cudaSuccess) {
        std::fprintf(stderr, "bench_cuda_ops: cudaMalloc of %lld bytes: %s\n",
                     static_cast<long long>(n * sizeof(T)), cudaGetErrorString(e));
        std::exit(1);
    }
    c.cleanup.push_back([p] { cudaFree(p); });
    cudaMemsetAsync(p, 0, static_cast<size_t>(n) * sizeof(T), c.stream);
    return static_cast<T*>(p);
}

template <class T>
T* upload(Ctx& c, const std::vector<T>& v) {
    T* p = alloc<T>(c, static_cast<int64_t>(v.size()));
    cudaMemcpyAsync(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, c.stream);
    return p;
}

std::vector<float> download(const Ctx& c, const float* p, int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    cudaMemcpyAsync(v.data(), p, v.size() * sizeof(float), cudaMemcpyDeviceToHost, c.stream);
    cudaStreamSynchronize(c.stream);
    return v;
}

// Deterministic values in [lo, hi): a 64-bit LCG's top 24 bits.
std::vector<float> randomValues(int64_t n, uint64_t seed, float lo, float hi) {
    std::vector<float> v(static_cast<size_t>(n));
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (float& x : v) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x = lo + (hi - lo) * static_cast<float>(s >> 40) * 0x1p-24f;
    }
    return v;
}

std::vector<uint16_t> toBf16(const std::vector<float>& v) {
    std::vector<uint16_t> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = td::floatToBf16(v[i]);
    return out;
}

// A cuDNN descriptor destroyed at the end (null if it could not be created).
template <class D>
D makeDesc(Ctx& c, DnnCheck& check, cudnnStatus_t (*create)(D*), cudnnStatus_t (*destroy)(D)) {
    D d = nullptr;
    if (check(create(&d))) c.cleanup.push_back([destroy, d] { destroy(d); });
    return d;
}

// An NHWC image's descriptor (cuDNN takes the sizes in NCHW order).
cudnnTensorDescriptor_t tensorDesc(Ctx& c, DnnCheck& check, cudnnDataType_t dt, int64_t n,
                                   int64_t ch, int64_t h, int64_t w) {
    auto d =
        makeDesc(c, check, c.dnn.cudnnCreateTensorDescriptor, c.dnn.cudnnDestroyTensorDescriptor);
    check(c.dnn.cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NHWC, dt, static_cast<int>(n),
                                           static_cast<int>(ch), static_cast<int>(h),
                                           static_cast<int>(w)));
    return d;
}

std::string shapeText(std::initializer_list<int64_t> dims) {
    std::string s;
    for (int64_t d : dims) s += (s.empty() ? "[" : ",") + std::to_string(d);
    return s + "]";
}

std::string sideText(const std::string& name, const Timing& t) {
    if (t.skipped) return name + ": " + t.failed;
    if (!t.ok()) return name + " failed: " + t.failed;
    char buf[64];
    std::snprintf(buf, sizeof buf, " %.1f us%s", t.us, t.graph ? "" : " (launched one by one)");
    return name + buf;
}

void printRow(const std::string& label, const std::string& nameA, const Timing& a,
              const std::string& nameB, const Timing& b, const char* ratioNote,
              const std::string& extra = "") {
    std::string line = label + ": " + sideText(nameA, a) + ", " + sideText(nameB, b);
    if (a.ok() && b.ok() && a.us > 0) {
        char buf[32];
        std::snprintf(buf, sizeof buf, ", ratio %.2f", b.us / a.us);
        line += buf + std::string(" (") + ratioNote + ")";
    }
    std::printf("%s%s\n", line.c_str(), extra.c_str());
}

// Prints a check's line; a difference over `limit` fails the benchmark.
void checkDiff(Ctx& c, const std::string& what, const char* kind, double diff, double limit) {
    const bool ok = diff <= limit;  // NaN fails
    std::printf("check: %s: max %s diff %.3g (limit %.0g)%s\n", what.c_str(), kind, diff, limit,
                ok ? "" : " FAILED");
    if (!ok) c.failedChecks.push_back(what);
}

// max |a - b| / max(|a|, |b|, 1) (rel) or max |a - b|.
double maxDiff(const std::vector<float>& a, const std::vector<float>& b, bool rel) {
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        const double d = std::fabs(double(a[i]) - double(b[i]));
        const double scale =
            rel ? std::max({1.0, std::fabs(double(a[i])), std::fabs(double(b[i]))}) : 1.0;
        m = std::isnan(d) ? d : std::max(m, d / scale);
    }
    return m;
}

void benchMaxPool(Ctx& c, int64_t B, int64_t H, int64_t W, int64_t C, uint64_t seed) {
    const td::ConvGeometry g{.B = B,
                             .H = H,
                             .W = W,
                             .C = C,
                             .OH = (H - 2) / 2 + 1,
                             .OW = (W - 2) / 2 + 1,
                             .F = C,
                             .kh = 2,
                             .kw = 2,
                             .sh = 2,
                             .sw = 2};
    const int64_t nx = B * H * W * C, ny = B * g.OH * g.OW * C;
    float* x = upload(c, randomValues(nx, seed, -1, 1));
    float* dy = upload(c, randomValues(ny, seed + 1, -1, 1));
    float *y = alloc<float>(c, ny), *dx = alloc<float>(c, nx);
    float *yDnn = alloc<float>(c, ny), *dxDnn = alloc<float>(c, nx);
    const Timing fwd = c.time([&] { return launched({cuda::maxPool(c.stream, g, x, y)}); });
    const Timing grad =
        c.time([&] { return launched({cuda::maxPoolGrad(c.stream, g, dy, x, dx)}); });
    Timing dnnFwd = dnnMissing(), dnnGrad = dnnMissing();
    if (c.dnn.error.empty()) {
        const Dnn& d = c.dnn;
        DnnCheck check{d, ""};
        auto xd = tensorDesc(c, check, CUDNN_DATA_FLOAT, B, C, H, W);
        auto yd = tensorDesc(c, check, CUDNN_DATA_FLOAT, B, C, g.OH, g.OW);
        auto pd =
            makeDesc(c, check, d.cudnnCreatePoolingDescriptor, d.cudnnDestroyPoolingDescriptor);
        check(d.cudnnSetPooling2dDescriptor(pd, CUDNN_POOLING_MAX_DETERMINISTIC,
                                            CUDNN_NOT_PROPAGATE_NAN, 2, 2, 0, 0, 2, 2));
        dnnFwd = dnnGrad = Timing{0, check.failed};
        if (check.failed.empty()) {
            dnnFwd = c.time([&] {
                return d.text(d.cudnnPoolingForward(d.h, pd, &kOne, xd, x, &kZero, yd, yDnn));
            });
            // cuDNN's gradient reads y too: TrainDeck's (the same values, checked below).
            dnnGrad = c.time([&] {
                return d.text(d.cudnnPoolingBackward(d.h, pd, &kOne, yd, y, yd, dy, xd, x, &kZero,
                                                     xd, dxDnn));
            });
        }
    }
    const std::string shape = shapeText({B, H, W, C});
    printRow("max pool fwd  " + shape, "TrainDeck", fwd, "cuDNN", dnnFwd, kVsDnn);
    printRow("max pool grad " + shape, "TrainDeck", grad, "cuDNN", dnnGrad, kVsDnn);
    if (fwd.ok() && dnnFwd.ok())
        checkDiff(c, "max pool fwd " + shape, "abs",
                  maxDiff(download(c, y, ny), download(c, yDnn, ny), false), 0.0);
}

void benchBatchNorm(Ctx& c, int64_t B, int64_t H, int64_t W, int64_t C) {
    const int64_t R = B * H * W, n = R * C;  // rows and channels, as the device runs it
    const float eps = 1e-3f;                 // Keras' default
    float* x = upload(c, randomValues(n, 11, -1, 3));
    float* dy = upload(c, randomValues(n, 12, -1, 1));
    float* gamma = upload(c, randomValues(C, 13, 0.5f, 1.5f));
    float* beta = upload(c, randomValues(C, 14, -0.5f, 0.5f));
    float *y = alloc<float>(c, n), *dx = alloc<float>(c, n);
    float *mean = alloc<float>(c, C), *var = alloc<float>(c, C);
    float *dgamma = alloc<float>(c, C), *dbeta = alloc<float>(c, C);
    float* scratch =
        alloc<float>(c, std::max(cuda::normScratchFloats(R, C), cuda::colSumsScratchFloats(R, C)));
    const cudaStream_t s = c.stream;
    const Timing fwd = c.time([&] {
        return launched({cuda::channelMean(s, x, mean, R, C, scratch),
                         cuda::channelVar(s, x, mean, var, R, C, scratch),
                         cuda::batchNorm(s, x, mean, var, gamma, beta, y, R, C, eps)});
    });
    const Timing grad = c.time([&] {
        return launched(
            {cuda::batchNormGrad(s, dy, x, mean, var, gamma, dx, R, C, eps, true, scratch),
             cuda::normGammaGrad(s, dy, x, mean, var, dgamma, R, C, eps, scratch),
             cuda::colSums(s, cuda::Ten{dy}, cuda::Ten{dbeta}, R, C, scratch)});
    });
    const std::string shape = shapeText({B, H, W, C});
    if (!c.dnn.error.empty()) {
        printRow("batchnorm fwd  " + shape, "TrainDeck", fwd, "cuDNN", dnnMissing(), kVsDnn);
        printRow("batchnorm grad " + shape, "TrainDeck", grad, "cuDNN", dnnMissing(), kVsDnn);
        return;
    }
    const Dnn& d = c.dnn;
    float *yDnn = alloc<float>(c, n), *dxDnn = alloc<float>(c, n);
    float *runMean = alloc<float>(c, C), *runVar = alloc<float>(c, C);
    float *saveMean = alloc<float>(c, C), *saveInvVar = alloc<float>(c, C);
    float *dgammaDnn = alloc<float>(c, C), *dbetaDnn = alloc<float>(c, C);
    DnnCheck check{d, ""};
    auto xd = tensorDesc(c, check, CUDNN_DATA_FLOAT, B, C, H, W);
    // gamma, beta and the statistics: [1,C,1,1]
    auto pd = makeDesc(c, check, d.cudnnCreateTensorDescriptor, d.cudnnDestroyTensorDescriptor);
    check(d.cudnnDeriveBNTensorDescriptor(pd, xd, CUDNN_BATCHNORM_SPATIAL));
    struct Mode {
        cudnnBatchNormMode_t mode;
        const char* name;
        Timing fwd, grad;
    };
    Mode modes[] = {{CUDNN_BATCHNORM_SPATIAL, "spatial", {}, {}},
                    {CUDNN_BATCHNORM_SPATIAL_PERSISTENT, "spatial persistent", {}, {}}};
    auto forward = [&](const Mode& m) {
        return d.text(d.cudnnBatchNormalizationForwardTraining(
            d.h, m.mode, &kOne, &kZero, xd, x, xd, yDnn, pd, gamma, beta, 0.01, runMean, runVar,
            eps, saveMean, saveInvVar));
    };
    for (Mode& m : modes) {
        m.fwd = m.grad = Timing{0, check.failed};
        if (!check.failed.empty()) continue;
        m.fwd = c.time([&] { return forward(m); });
        // The gradient reads the statistics this mode's forward saved (none if it failed).
        const float* sm = m.fwd.ok() ? saveMean : nullptr;
        const float* si = m.fwd.ok() ? saveInvVar : nullptr;
        m.grad = c.time([&] {
            return d.text(d.cudnnBatchNormalizationBackward(
                d.h, m.mode, &kOne, &kZero, &kOne, &kZero, xd, x, xd, dy, xd, dxDnn, pd, gamma,
                dgammaDnn, dbetaDnn, eps, sm, si));
        });
    }
    // The faster mode of a pass, named; both failed: both reasons.
    auto faster = [&](Timing Mode::*pass, const std::string& label, const Timing& ours) {
        const Timing &a = modes[0].*pass, &b = modes[1].*pass;
        const Mode* best = a.ok() && (!b.ok() || a.us <= b.us) ? &modes[0]
                           : b.ok()                            ? &modes[1]
                                                               : nullptr;
        if (best)
            printRow(label, "TrainDeck", ours, std::string("cuDNN (") + best->name + ")",
                     best->*pass, kVsDnn);
        else
            printRow(label, "TrainDeck", ours, "cuDNN",
                     Timing{0, a.failed == b.failed ? a.failed
                                                    : std::string(modes[0].name) + ": " + a.failed +
                                                          "; " + modes[1].name + ": " + b.failed},
                     kVsDnn);
    };
    faster(&Mode::fwd, "batchnorm fwd  " + shape, fwd);
    faster(&Mode::grad, "batchnorm grad " + shape, grad);
    if (!fwd.ok()) return;
    const std::vector<float> ours = download(c, y, n);
    for (const Mode& m : modes)
        if (m.fwd.ok() && forward(m).empty())
            checkDiff(c, "batchnorm fwd " + shape + " cuDNN " + m.name, "abs",
                      maxDiff(ours, download(c, yDnn, n), false), 1e-4);
}

const char* algoName(int algo) {
    static const char* const names[] = {
        "IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING",
        "WINOGRAD",      "WINOGRAD_NONFUSED"};
    return algo >= 0 && algo < 8 ? names[algo] : "?";
}

// One convolution's cuDNN descriptors in one dtype, and the algorithm the device would pick: the
// first that cuDNN ranks successful, deterministic, within the workspace and (f32) in FMA math.
struct ConvPlan {
    cudnnTensorDescriptor_t x = nullptr, y = nullptr;
    cudnnFilterDescriptor_t w = nullptr;
    cudnnConvolutionDescriptor_t conv = nullptr;
    cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
    size_t bytes = 0;
    std::string failed;
};

ConvPlan planConv(Ctx& c, bool f32, int64_t B, int64_t H, int64_t W, int64_t C, int64_t F,
                  int64_t k) {
    const Dnn& d = c.dnn;
    const cudnnDataType_t dt = f32 ? CUDNN_DATA_FLOAT : CUDNN_DATA_BFLOAT16;
    DnnCheck check{d, ""};
    ConvPlan p;
    p.x = tensorDesc(c, check, dt, B, C, H, W);
    p.y = tensorDesc(c, check, dt, B, F, H - k + 1, W - k + 1);
    p.w = makeDesc(c, check, d.cudnnCreateFilterDescriptor, d.cudnnDestroyFilterDescriptor);
    check(d.cudnnSetFilter4dDescriptor(p.w, dt, CUDNN_TENSOR_NHWC, static_cast<int>(F),
                                       static_cast<int>(C), static_cast<int>(k),
                                       static_cast<int>(k)));
    p.conv =
        makeDesc(c, check, d.cudnnCreateConvolutionDescriptor, d.cudnnDestroyConvolutionDescriptor);
    check(d.cudnnSetConvolution2dDescriptor(p.conv, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                            CUDNN_DATA_FLOAT));
    check(d.cudnnSetConvolutionMathType(p.conv, f32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
    cudnnConvolutionFwdAlgoPerf_t perf[16];
    int count = 0;
    if (check.failed.empty() && check(d.cudnnGetConvolutionForwardAlgorithm_v7(
                                    d.h, p.x, p.w, p.conv, p.y, 16, &count, perf))) {
        check.failed = "no deterministic algorithm within 32 MiB";
        for (int i = 0; i < count; ++i) {
            const cudnnConvolutionFwdAlgoPerf_t& q = perf[i];
            if (q.status != CUDNN_STATUS_SUCCESS || q.memory > kWorkspaceBytes ||
                q.determinism != CUDNN_DETERMINISTIC)
                continue;
            if (f32 && (q.mathType == CUDNN_TENSOR_OP_MATH ||
                        q.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))
                continue;
            p.algo = q.algo;
            p.bytes = q.memory;
            check.failed.clear();
            break;
        }
    }
    p.failed = check.failed;
    return p;
}

void benchConv(Ctx& c, const char* name, int64_t B, int64_t H, int64_t W, int64_t C, int64_t F,
               uint64_t seed) {
    const std::string biasRelu = std::string(name) + " bias relu f32";
    const std::string toBf16Row = std::string(name) + " f32 -> bf16";
    if (!c.dnn.error.empty()) {
        std::printf("%s: cuDNN: not loaded (see above)\n%s: cuDNN: not loaded (see above)\n",
                    biasRelu.c_str(), toBf16Row.c_str());
        return;
    }
    const Dnn& d = c.dnn;
    const int64_t k = 3, rows = B * (H - k + 1) * (W - k + 1), ny = rows * F;
    const std::vector<float> hx = randomValues(B * H * W * C, seed, -1, 1);
    const std::vector<float> hw = randomValues(F * k * k * C, seed + 1, -0.5f, 0.5f);
    float *x = upload(c, hx), *w = upload(c, hw);  // w: cuDNN's [F,KH,KW,C]
    float* bias = upload(c, randomValues(F, seed + 2, -0.5f, 0.5f));
    float *ySep = alloc<float>(c, ny), *yFused = alloc<float>(c, ny);
    uint16_t *xb = upload(c, toBf16(hx)), *wb = upload(c, toBf16(hw));
    uint16_t* yb = alloc<uint16_t>(c, ny);
    const ConvPlan p = planConv(c, true, B, H, W, C, F, k);
    const ConvPlan pb = planConv(c, false, B, H, W, C, F, k);
    auto conv = [&] {
        return d.text(d.cudnnConvolutionForward(d.h, &kOne, p.x, x, p.w, w, p.conv, p.algo,
                                                c.workspace, p.bytes, &kZero, p.y, ySep));
    };
    Timing f32{0, p.failed}, separate{0, p.failed}, fused{0, p.failed}, bf16{0, pb.failed};
    cudnnConvolutionFwdAlgo_t fusedAlgo = p.algo;
    if (p.failed.empty()) {
        f32 = c.time(conv);  // first: `separate` leaves ySep holding conv + bias + ReLU
        separate = c.time([&] {
            std::string e = conv();
            if (e.empty())
                e = launched(
                    {cuda::biasAct(c.stream, cuda::Ten{ySep}, cuda::Ten{bias}, cuda::Ten{ySep},
                                   rows, F, td::ActKind::Relu, 0.f, cuda::DropMask{}, nullptr)});
            return e;
        });
        DnnCheck check{d, ""};
        cudnnTensorDescriptor_t bd = tensorDesc(c, check, CUDNN_DATA_FLOAT, 1, F, 1, 1);
        auto ad = makeDesc(c, check, d.cudnnCreateActivationDescriptor,
                           d.cudnnDestroyActivationDescriptor);
        check(d.cudnnSetActivationDescriptor(ad, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN,
                                             0.0));
        size_t fusedBytes = p.bytes;
        auto fusedRun = [&] {  // z = y with alpha2 = 0: y = relu(conv(x) + bias)
            return d.text(d.cudnnConvolutionBiasActivationForward(
                d.h, &kOne, p.x, x, p.w, w, p.conv, fusedAlgo, c.workspace, fusedBytes, &kZero, p.y,
                yFused, bd, bias, ad, p.y, yFused));
        };
        if (check.failed.empty() && !fusedRun().empty()) {  // cuDNN's documented fused algorithm
            fusedAlgo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
            if (check(d.cudnnGetConvolutionForwardWorkspaceSize(d.h, p.x, p.w, p.conv, p.y,
                                                                fusedAlgo, &fusedBytes)) &&
                fusedBytes > kWorkspaceBytes)
                check.failed = "IMPLICIT_PRECOMP_GEMM needs more than 32 MiB";
        }
        fused = check.failed.empty() ? c.time(fusedRun) : Timing{0, check.failed};
    }
    if (pb.failed.empty())
        bf16 = c.time([&] {
            return d.text(d.cudnnConvolutionForward(d.h, &kOne, pb.x, xb, pb.w, wb, pb.conv,
                                                    pb.algo, c.workspace, pb.bytes, &kZero, pb.y,
                                                    yb));
        });
    const std::string algos = std::string("; algorithms ") + algoName(p.algo) + ", " +
                              algoName(fusedAlgo) + ", bf16 " + algoName(pb.algo);
    printRow(biasRelu, "separate", separate, "fused", fused,
             "fused/separate; above 1: separate faster", algos);
    printRow(toBf16Row, "f32", f32, "bf16", bf16, "bf16/f32; below 1: bf16 faster");
    if (separate.ok() && fused.ok())
        checkDiff(c, biasRelu + " fused vs separate", "rel",
                  maxDiff(download(c, ySep, ny), download(c, yFused, ny), true), 1e-4);
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"TrainDeck's CUDA pooling and BatchNormalization kernels against cuDNN's"};
    int64_t batch = 64;
    int repeat = 200, device = 0;
    // The largest batch whose [B,26,26,32] tensors have fewer than 2^31 values (cuDNN's int sizes).
    const int64_t maxBatch = ((int64_t{1} << 31) - 1) / (26 * 26 * 32);
    app.add_option("--batch", batch, "Batch (B)")->check(CLI::Range(int64_t{1}, maxBatch));
    app.add_option("--repeat", repeat, "Timed runs per row")->check(CLI::Range(1, 100000));
    app.add_option("--device", device, "CUDA device index")->check(CLI::Range(0, 65535));
    CLI11_PARSE(app, argc, argv);
    int count = 0;
    if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        const std::string why = e != cudaSuccess
                                    ? std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) +
                                          ": " + cudaGetErrorString(e)
                                    : "cudaGetDeviceCount reports 0 devices";
        std::printf("bench_cuda_ops: no CUDA device (%s)\n", why.c_str());
        return 77;
    }
    if (device >= count) {
        std::fprintf(stderr, "bench_cuda_ops: --device %d: this machine has %d GPU(s)\n", device,
                     count);
        return 2;
    }
    cudaDeviceProp prop{};
    if (cudaSetDevice(device) != cudaSuccess ||
        cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        std::fprintf(stderr, "bench_cuda_ops: cuda:%d: %s\n", device,
                     cudaGetErrorString(cudaGetLastError()));
        return 1;
    }
    Ctx c;
    c.repeat = repeat;
    if (cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreate(&c.start) != cudaSuccess || cudaEventCreate(&c.stop) != cudaSuccess) {
        std::fprintf(stderr, "bench_cuda_ops: stream or events: %s\n",
                     cudaGetErrorString(cudaGetLastError()));
        return 1;
    }
    c.cleanup.push_back([&c] {
        cudaEventDestroy(c.start);
        cudaEventDestroy(c.stop);
        cudaStreamDestroy(c.stream);
    });
    c.workspace = alloc<char>(c, static_cast<int64_t>(kWorkspaceBytes));
    openDnn(c.dnn, c.stream);
    if (c.dnn.h) c.cleanup.push_back([&c] { c.dnn.cudnnDestroy(c.dnn.h); });

    std::printf("device: %s, batch %lld, %d runs each\n", prop.name, static_cast<long long>(batch),
                repeat);
    if (c.dnn.error.empty()) {
        const size_t v = c.dnn.cudnnGetVersion();
        std::printf("cuDNN: %zu.%zu.%zu (%s)\n", v / 10000, v / 100 % 100, v % 100,
                    c.dnn.soname.c_str());
    } else {
        std::printf("cuDNN: not loaded (%s)\n", c.dnn.error.c_str());
    }
    benchMaxPool(c, batch, 26, 26, 32, 1);
    benchMaxPool(c, batch, 11, 11, 64, 3);
    benchBatchNorm(c, batch, 26, 26, 32);
    benchConv(c, "conv1", batch, 28, 28, 1, 32, 21);
    benchConv(c, "conv2", batch, 13, 13, 32, 64, 31);
    if (!c.failedChecks.empty()) {
        for (const std::string& what : c.failedChecks)
            std::printf("bench_cuda_ops: check failed: %s\n", what.c_str());
        return 1;
    }
    return 0;
}
