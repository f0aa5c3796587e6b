#include "engine/backend/cuda/cudnn_conv.h"

#include <cudnn.h>

#include "engine/core/module_loader.h"

namespace td::cuda {

// The cuDNN entry points the device uses (engine/core/module_loader.h: SystemLibrary).
class DnnLibrary {
  public:
#define TD_DNN_FN(name) decltype(&::name) name = nullptr;
#define TD_DNN_FNS(X)                                \
    X(cudnnCreate)                                   \
    X(cudnnDestroy)                                  \
    X(cudnnSetStream)                                \
    X(cudnnGetErrorString)                           \
    X(cudnnCreateTensorDescriptor)                   \
    X(cudnnSetTensor4dDescriptor)                    \
    X(cudnnDestroyTensorDescriptor)                  \
    X(cudnnCreateFilterDescriptor)                   \
    X(cudnnSetFilter4dDescriptor)                    \
    X(cudnnDestroyFilterDescriptor)                  \
    X(cudnnCreateConvolutionDescriptor)              \
    X(cudnnSetConvolution2dDescriptor)               \
    X(cudnnSetConvolutionGroupCount)                 \
    X(cudnnSetConvolutionMathType)                   \
    X(cudnnDestroyConvolutionDescriptor)             \
    X(cudnnGetConvolution2dForwardOutputDim)         \
    X(cudnnGetConvolutionForwardAlgorithm_v7)        \
    X(cudnnConvolutionForward)                       \
    X(cudnnGetConvolutionBackwardDataAlgorithm_v7)   \
    X(cudnnConvolutionBackwardData)                  \
    X(cudnnGetConvolutionBackwardFilterAlgorithm_v7) \
    X(cudnnConvolutionBackwardFilter)                \
    X(cudnnCreateActivationDescriptor)               \
    X(cudnnSetActivationDescriptor)                  \
    X(cudnnDestroyActivationDescriptor)              \
    X(cudnnConvolutionBiasActivationForward)
    TD_DNN_FNS(TD_DNN_FN)
#undef TD_DNN_FN

    std::string error;  // why loading failed (empty: loaded)

    static const DnnLibrary& get() {
        static const DnnLibrary lib = load();
        return lib;
    }
    std::string statusText(cudnnStatus_t st) const {
        const char* s = cudnnGetErrorString ? cudnnGetErrorString(st) : nullptr;
        return s ? std::string(s) : "cuDNN status " + std::to_string(static_cast<int>(st));
    }

  private:
    static DnnLibrary load() {
        DnnLibrary lib;
        auto so = SystemLibrary::open("cuDNN", {"libcudnn.so.9", "libcudnn.so"});
        if (!so.ok()) {
            lib.error = so.error();
            return lib;
        }
#define TD_DNN_SLOT(name) SymbolSlot(#name, lib.name),
        const Status resolved = so->resolve({TD_DNN_FNS(TD_DNN_SLOT)});
#undef TD_DNN_SLOT
        if (!resolved.ok()) lib.error = resolved.error();
        return lib;
    }
};
#undef TD_DNN_FNS

#define TD_DNN_TRY(lib, call, what)                                                      \
    do {                                                                                 \
        const cudnnStatus_t st_ = (call);                                                \
        if (st_ != CUDNN_STATUS_SUCCESS)                                                 \
            return err(std::string(what) + ": " + #call + ": " + (lib).statusText(st_)); \
    } while (0)

Result<std::unique_ptr<DnnContext>> DnnContext::create(cudaStream_t stream) {
    const DnnLibrary& lib = DnnLibrary::get();
    if (!lib.error.empty()) return err(lib.error);
    std::unique_ptr<DnnContext> ctx(new DnnContext());
    ctx->lib_ = &lib;
    cudnnHandle_t h = nullptr;
    TD_DNN_TRY(lib, lib.cudnnCreate(&h), "cuDNN");
    ctx->handle_ = h;
    TD_DNN_TRY(lib, lib.cudnnSetStream(h, stream), "cuDNN");
    return ctx;
}

DnnContext::~DnnContext() {
    if (handle_) lib_->cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

DnnConv::~DnnConv() {
    destroy();
}

void DnnConv::destroy() {
    if (!ctx_) return;
    const DnnLibrary& lib = ctx_->lib();
    for (void* d : {xDesc_, yDesc_, biasDesc_})
        if (d) lib.cudnnDestroyTensorDescriptor(static_cast<cudnnTensorDescriptor_t>(d));
    if (actDesc_)
        lib.cudnnDestroyActivationDescriptor(static_cast<cudnnActivationDescriptor_t>(actDesc_));
    if (wDesc_) lib.cudnnDestroyFilterDescriptor(static_cast<cudnnFilterDescriptor_t>(wDesc_));
    if (convDesc_)
        lib.cudnnDestroyConvolutionDescriptor(static_cast<cudnnConvolutionDescriptor_t>(convDesc_));
    xDesc_ = yDesc_ = wDesc_ = convDesc_ = biasDesc_ = actDesc_ = nullptr;
}

namespace {

// Picks the first algorithm cuDNN ranks that succeeded and fits the workspace; for f32 operands
// only those in FMA math (no TF32, no conversion to 16 bits), for 16-bit ones any; with
// `deterministic`, only those that give the same bits on every run.
template <class Perf>
bool pick(const Perf* perf, int count, size_t workspaceBytes, bool f32, bool deterministic,
          int& algo, size_t& bytes) {
    for (int i = 0; i < count; ++i) {
        const Perf& p = perf[i];
        if (p.status != CUDNN_STATUS_SUCCESS || p.memory > workspaceBytes) continue;
        if (f32 && (p.mathType == CUDNN_TENSOR_OP_MATH ||
                    p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))
            continue;
        if (deterministic && p.determinism != CUDNN_DETERMINISTIC) continue;
        algo = static_cast<int>(p.algo);
        bytes = p.memory;
        return true;
    }
    return false;
}

bool fitsInt(int64_t v) {
    return v >= 0 && v < (int64_t{1} << 31);
}

cudnnDataType_t dnnType(Dt dt) {
    return dt == Dt::BF16  ? CUDNN_DATA_BFLOAT16
           : dt == Dt::F16 ? CUDNN_DATA_HALF
                           : CUDNN_DATA_FLOAT;
}

}  // namespace

Result<std::unique_ptr<DnnConv>> DnnConv::plan(const DnnContext& ctx, ConvPass pass,
                                               const ConvGeometry& g, Dt dt, size_t workspaceBytes,
                                               std::string* whyNot) {
    const DnnLibrary& lib = ctx.lib();
    const char* what = "cuDNN convolution";
    if (dt != Dt::F32 && dt != Dt::BF16 && dt != Dt::F16) {
        *whyNot = "operands neither f32 nor 16-bit floats";
        return std::unique_ptr<DnnConv>();
    }
    if (g.padBottom != g.padTop || g.padRight != g.padLeft) {
        *whyNot = "uneven padding";
        return std::unique_ptr<DnnConv>();
    }
    for (int64_t v : {g.B * g.H * g.W * g.C, g.B * g.OH * g.OW * g.F, g.kh * g.kw * g.C * g.F})
        if (!fitsInt(v)) {
            *whyNot = "more than 2^31 values";
            return std::unique_ptr<DnnConv>();
        }
    std::unique_ptr<DnnConv> c(new DnnConv());
    c->ctx_ = &ctx;
    c->pass_ = pass;
    c->g_ = g;
    c->dt_ = dt;
    const bool f32 = dt == Dt::F32;
    const cudnnDataType_t type = dnnType(dt);
    const int Cg = static_cast<int>(g.C / g.groups);
    cudnnTensorDescriptor_t x = nullptr, y = nullptr;
    cudnnFilterDescriptor_t w = nullptr;
    cudnnConvolutionDescriptor_t cd = nullptr;
    TD_DNN_TRY(lib, lib.cudnnCreateTensorDescriptor(&x), what);
    c->xDesc_ = x;
    TD_DNN_TRY(lib, lib.cudnnCreateTensorDescriptor(&y), what);
    c->yDesc_ = y;
    TD_DNN_TRY(lib, lib.cudnnCreateFilterDescriptor(&w), what);
    c->wDesc_ = w;
    TD_DNN_TRY(lib, lib.cudnnCreateConvolutionDescriptor(&cd), what);
    c->convDesc_ = cd;
    TD_DNN_TRY(lib,
               lib.cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NHWC, type, static_cast<int>(g.B),
                                              static_cast<int>(g.C), static_cast<int>(g.H),
                                              static_cast<int>(g.W)),
               what);
    TD_DNN_TRY(lib,
               lib.cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NHWC, type, static_cast<int>(g.B),
                                              static_cast<int>(g.F), static_cast<int>(g.OH),
                                              static_cast<int>(g.OW)),
               what);
    TD_DNN_TRY(lib,
               lib.cudnnSetFilter4dDescriptor(w, type, CUDNN_TENSOR_NHWC, static_cast<int>(g.F), Cg,
                                              static_cast<int>(g.kh), static_cast<int>(g.kw)),
               what);
    TD_DNN_TRY(lib,
               lib.cudnnSetConvolution2dDescriptor(
                   cd, static_cast<int>(g.padTop), static_cast<int>(g.padLeft),
                   static_cast<int>(g.sh), static_cast<int>(g.sw), static_cast<int>(g.dh),
                   static_cast<int>(g.dw), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
               what);
    TD_DNN_TRY(lib, lib.cudnnSetConvolutionGroupCount(cd, static_cast<int>(g.groups)), what);
    // f32: plain FMA; 16-bit: the tensor cores, accumulating in f32 (the compute type above).
    TD_DNN_TRY(lib,
               lib.cudnnSetConvolutionMathType(cd, f32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH),
               what);
    // cuDNN's output size must be the graph's (it is, for even padding).
    int n = 0, f = 0, oh = 0, ow = 0;
    TD_DNN_TRY(lib, lib.cudnnGetConvolution2dForwardOutputDim(cd, x, w, &n, &f, &oh, &ow), what);
    if (n != g.B || f != g.F || oh != g.OH || ow != g.OW) {
        *whyNot = "cuDNN computes another output size";
        return std::unique_ptr<DnnConv>();
    }
    const cudnnHandle_t h = static_cast<cudnnHandle_t>(ctx.handle());
    constexpr int kMax = 16;
    int count = 0;
    bool found = false;
    switch (pass) {
        case ConvPass::Forward: {
            cudnnConvolutionFwdAlgoPerf_t perf[kMax];
            TD_DNN_TRY(
                lib, lib.cudnnGetConvolutionForwardAlgorithm_v7(h, x, w, cd, y, kMax, &count, perf),
                what);
            found = pick(perf, count, workspaceBytes, f32, true, c->algo_, c->workspaceBytes_);
            break;
        }
        case ConvPass::GradInput: {
            cudnnConvolutionBwdDataAlgoPerf_t perf[kMax];
            TD_DNN_TRY(
                lib,
                lib.cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w, y, cd, x, kMax, &count, perf),
                what);
            found = pick(perf, count, workspaceBytes, f32, true, c->algo_, c->workspaceBytes_);
            break;
        }
        case ConvPass::GradFilter: {
            cudnnConvolutionBwdFilterAlgoPerf_t perf[kMax];
            TD_DNN_TRY(lib,
                       lib.cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x, y, cd, w, kMax,
                                                                         &count, perf),
                       what);
            found = pick(perf, count, workspaceBytes, f32, true, c->algo_, c->workspaceBytes_);
            break;
        }
    }
    if (!found) {
        *whyNot = std::string("no deterministic ") + (f32 ? "f32" : "16-bit") +
                  " algorithm within the workspace";
        return std::unique_ptr<DnnConv>();
    }
    return c;
}

Result<bool> DnnConv::fuseBiasRelu(cudaStream_t stream, const void* x, const void* w,
                                   const void* bias, void* y, void* filter, void* workspace,
                                   std::string* whyNot) {
    if (pass_ != ConvPass::Forward || dt_ != Dt::F32) {
        *whyNot = "only f32 forward convolutions are fused";
        return false;
    }
    const DnnLibrary& lib = ctx_->lib();
    const char* what = "cuDNN fused convolution";
    cudnnTensorDescriptor_t b = nullptr;
    TD_DNN_TRY(lib, lib.cudnnCreateTensorDescriptor(&b), what);
    biasDesc_ = b;
    TD_DNN_TRY(lib,
               lib.cudnnSetTensor4dDescriptor(b, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 1,
                                              static_cast<int>(g_.F), 1, 1),
               what);
    cudnnActivationDescriptor_t a = nullptr;
    TD_DNN_TRY(lib, lib.cudnnCreateActivationDescriptor(&a), what);
    actDesc_ = a;
    TD_DNN_TRY(lib,
               lib.cudnnSetActivationDescriptor(a, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0),
               what);
    // cuDNN says only at run time whether its fused kernel takes this convolution and algorithm:
    // one trial now, on this program's own buffers (y is rewritten by every step before it is
    // read); refused, the convolution and the bias/activation kernel stay apart.
    const Status tried = runFused(stream, x, w, bias, y, filter, workspace);
    const cudaError_t synced = cudaStreamSynchronize(stream);
    if (synced != cudaSuccess)
        return err(std::string(what) + ": trial run: " + cudaGetErrorString(synced));
    if (!tried.ok()) {
        lib.cudnnDestroyTensorDescriptor(b);
        lib.cudnnDestroyActivationDescriptor(a);
        biasDesc_ = actDesc_ = nullptr;
        *whyNot = tried.error();
        return false;
    }
    return true;
}

Status DnnConv::runFused(cudaStream_t stream, const void* x, const void* w, const void* bias,
                         void* y, void* filter, void* workspace) const {
    const DnnLibrary& lib = ctx_->lib();
    const cudnnHandle_t h = static_cast<cudnnHandle_t>(ctx_->handle());
    const auto yd = static_cast<cudnnTensorDescriptor_t>(yDesc_);
    const float one = 1.0f, zero = 0.0f;
    const cudaError_t e = kerasToKrsc(stream, w, filter, g_.kh, g_.kw, g_.C / g_.groups, g_.F, 4);
    if (e != cudaSuccess)
        return err(std::string("kernel transposing the filter: ") + cudaGetErrorString(e));
    // y = relu(conv(x, w) + 0 * z + bias) with z = y: alpha2 = 0, so z adds nothing.
    TD_DNN_TRY(lib,
               lib.cudnnConvolutionBiasActivationForward(
                   h, &one, static_cast<cudnnTensorDescriptor_t>(xDesc_), x,
                   static_cast<cudnnFilterDescriptor_t>(wDesc_), filter,
                   static_cast<cudnnConvolutionDescriptor_t>(convDesc_),
                   static_cast<cudnnConvolutionFwdAlgo_t>(algo_), workspace, workspaceBytes_, &zero,
                   yd, y, static_cast<cudnnTensorDescriptor_t>(biasDesc_), bias,
                   static_cast<cudnnActivationDescriptor_t>(actDesc_), yd, y),
               "cuDNN fused convolution, bias and ReLU");
    return Status::success();
}

Status DnnConv::run(cudaStream_t stream, const void* a, const void* b, void* out, void* filter,
                    void* workspace) const {
    const DnnLibrary& lib = ctx_->lib();
    const cudnnHandle_t h = static_cast<cudnnHandle_t>(ctx_->handle());
    const auto x = static_cast<cudnnTensorDescriptor_t>(xDesc_);
    const auto y = static_cast<cudnnTensorDescriptor_t>(yDesc_);
    const auto w = static_cast<cudnnFilterDescriptor_t>(wDesc_);
    const auto cd = static_cast<cudnnConvolutionDescriptor_t>(convDesc_);
    const float one = 1.0f, zero = 0.0f;
    const int64_t Cg = g_.C / g_.groups;
    const int bytes = dt_ == Dt::F32 ? 4 : 2;  // per filter value
    auto launched = [](cudaError_t e) -> Status {
        if (e != cudaSuccess)
            return err(std::string("kernel transposing the filter: ") + cudaGetErrorString(e));
        return Status::success();
    };
    switch (pass_) {
        case ConvPass::Forward:  // a = x, b = w (Keras), out = y
            TD_RETURN_IF_ERROR(
                launched(kerasToKrsc(stream, b, filter, g_.kh, g_.kw, Cg, g_.F, bytes)));
            TD_DNN_TRY(lib,
                       lib.cudnnConvolutionForward(h, &one, x, a, w, filter, cd,
                                                   static_cast<cudnnConvolutionFwdAlgo_t>(algo_),
                                                   workspace, workspaceBytes_, &zero, y, out),
                       "cuDNN convolution forward");
            break;
        case ConvPass::GradInput:  // a = dy, b = w (Keras), out = dx
            TD_RETURN_IF_ERROR(
                launched(kerasToKrsc(stream, b, filter, g_.kh, g_.kw, Cg, g_.F, bytes)));
            TD_DNN_TRY(
                lib,
                lib.cudnnConvolutionBackwardData(h, &one, w, filter, y, a, cd,
                                                 static_cast<cudnnConvolutionBwdDataAlgo_t>(algo_),
                                                 workspace, workspaceBytes_, &zero, x, out),
                "cuDNN convolution backward data");
            break;
        case ConvPass::GradFilter:  // a = x, b = dy, out = dw (Keras)
            TD_DNN_TRY(
                lib,
                lib.cudnnConvolutionBackwardFilter(
                    h, &one, x, a, y, b, cd, static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo_),
                    workspace, workspaceBytes_, &zero, w, filter),
                "cuDNN convolution backward filter");
            TD_RETURN_IF_ERROR(
                launched(krscToKeras(stream, filter, out, g_.kh, g_.kw, Cg, g_.F, bytes)));
            break;
    }
    return Status::success();
}

}  // namespace td::cuda
