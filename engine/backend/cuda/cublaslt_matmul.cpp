#include "engine/backend/cuda/cublaslt_matmul.h"

#include <cublasLt.h>

#include <cstring>
#include <mutex>

#include "engine/core/module_loader.h"

namespace td::cuda {

// The cuBLASLt entry points the device uses (engine/core/module_loader.h: SystemLibrary).
class LtLibrary {
  public:
#define TD_LT_FN(name) decltype(&::name) name = nullptr;
#define TD_LT_FNS(X)                        \
    X(cublasLtCreate)                       \
    X(cublasLtDestroy)                      \
    X(cublasLtGetStatusString)              \
    X(cublasLtMatmulDescCreate)             \
    X(cublasLtMatmulDescDestroy)            \
    X(cublasLtMatmulDescSetAttribute)       \
    X(cublasLtMatrixLayoutCreate)           \
    X(cublasLtMatrixLayoutDestroy)          \
    X(cublasLtMatmulPreferenceCreate)       \
    X(cublasLtMatmulPreferenceDestroy)      \
    X(cublasLtMatmulPreferenceSetAttribute) \
    X(cublasLtMatmulAlgoGetHeuristic)       \
    X(cublasLtMatmul)
    TD_LT_FNS(TD_LT_FN)
#undef TD_LT_FN

    std::string error;  // why loading failed (empty: loaded)

    static const LtLibrary& get() {
        static const LtLibrary lib = load();
        return lib;
    }

    std::string statusText(cublasStatus_t st) const {
        const char* s = cublasLtGetStatusString ? cublasLtGetStatusString(st) : nullptr;
        return s ? std::string(s) : "cuBLAS status " + std::to_string(static_cast<int>(st));
    }

  private:
    static LtLibrary load() {
        LtLibrary lib;
        auto so = SystemLibrary::open("cuBLASLt",
                                      {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"});
        if (!so.ok()) {
            lib.error = so.error();
            return lib;
        }
#define TD_LT_SLOT(name) SymbolSlot(#name, lib.name),
        const Status resolved = so->resolve({TD_LT_FNS(TD_LT_SLOT)});
#undef TD_LT_SLOT
        if (!resolved.ok()) lib.error = resolved.error();
        return lib;
    }
};
#undef TD_LT_FNS

namespace {

cudaDataType_t cudaType(DType d) {
    switch (d) {
        case DType::BF16:
            return CUDA_R_16BF;
        case DType::F16:
            return CUDA_R_16F;
        default:
            return CUDA_R_32F;
    }
}

// The largest power of two (up to 256) the address is a multiple of.
uint32_t alignmentOf(const void* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    uint32_t al = 256;
    while (al > 1 && a % al != 0) al /= 2;
    return al;
}

}  // namespace

#define TD_LT_TRY(lib, call, what)                                                       \
    do {                                                                                 \
        const cublasStatus_t st_ = (call);                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                \
            return err(std::string(what) + ": " + #call + ": " + (lib).statusText(st_)); \
    } while (0)

Result<std::unique_ptr<LtContext>> LtContext::create() {
    const LtLibrary& lib = LtLibrary::get();
    if (!lib.error.empty()) return err(lib.error);
    std::unique_ptr<LtContext> ctx(new LtContext());
    ctx->lib_ = &lib;
    cublasLtHandle_t h = nullptr;
    TD_LT_TRY(lib, lib.cublasLtCreate(&h), "cuBLASLt");
    ctx->handle_ = h;
    return ctx;
}

LtContext::~LtContext() {
    if (handle_) lib_->cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

LtMatmul::~LtMatmul() {
    destroyDescs();
}

void LtMatmul::destroyDescs() {
    if (!ctx_) return;
    const LtLibrary& lib = ctx_->lib();
    if (desc_) lib.cublasLtMatmulDescDestroy(static_cast<cublasLtMatmulDesc_t>(desc_));
    for (void* l : {layoutA_, layoutB_, layoutC_})
        if (l) lib.cublasLtMatrixLayoutDestroy(static_cast<cublasLtMatrixLayout_t>(l));
    desc_ = layoutA_ = layoutB_ = layoutC_ = nullptr;
}

// Row-major C[M,N] is column-major C^T[N,M] = op(B)^T op(A)^T: cuBLASLt's "A" is our B's storage
// and its "B" our A's. A row-major [r,c] array is a column-major [c,r] one with leading dimension
// c, so an operand stored as it is read needs no transpose there, and one stored transposed does.
Status LtMatmul::tryPlan(bool bias, bool relu, bool& found) {
    const LtLibrary& lib = ctx_->lib();
    const std::string what = "cuBLASLt matmul " + std::to_string(s_.M) + "x" +
                             std::to_string(s_.K) + "x" + std::to_string(s_.N);
    destroyDescs();
    found = false;
    cublasLtMatmulDesc_t desc = nullptr;
    TD_LT_TRY(lib, lib.cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), what);
    desc_ = desc;
    const cublasOperation_t opA = s_.transB ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A: our B
    const cublasOperation_t opB = s_.transA ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B: our A
    TD_LT_TRY(
        lib,
        lib.cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof opA),
        what);
    TD_LT_TRY(
        lib,
        lib.cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof opB),
        what);
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (bias && relu)
        epi = CUBLASLT_EPILOGUE_RELU_BIAS;
    else if (bias)
        epi = CUBLASLT_EPILOGUE_BIAS;
    else if (relu)
        epi = CUBLASLT_EPILOGUE_RELU;
    TD_LT_TRY(
        lib,
        lib.cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
        what);
    if (bias) {
        const void* bp = s_.biasPtr;
        TD_LT_TRY(lib,
                  lib.cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp,
                                                     sizeof bp),
                  what);
        const int32_t bt = static_cast<int32_t>(cudaType(s_.bias));
        TD_LT_TRY(lib,
                  lib.cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                                     sizeof bt),
                  what);
    }
    // cuBLASLt's A (our B): [N,K] column-major when stored as read ([K,N] row-major).
    const uint64_t aRows = s_.transB ? s_.K : s_.N, aCols = s_.transB ? s_.N : s_.K;
    const uint64_t bRows = s_.transA ? s_.M : s_.K, bCols = s_.transA ? s_.K : s_.M;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    TD_LT_TRY(lib, lib.cublasLtMatrixLayoutCreate(&la, cudaType(s_.ab), aRows, aCols, aRows), what);
    layoutA_ = la;
    TD_LT_TRY(lib, lib.cublasLtMatrixLayoutCreate(&lb, cudaType(s_.ab), bRows, bCols, bRows), what);
    layoutB_ = lb;
    TD_LT_TRY(lib, lib.cublasLtMatrixLayoutCreate(&lc, cudaType(s_.c), s_.N, s_.M, s_.N), what);
    layoutC_ = lc;

    cublasLtMatmulPreference_t pref = nullptr;
    TD_LT_TRY(lib, lib.cublasLtMatmulPreferenceCreate(&pref), what);
    struct PrefGuard {
        const LtLibrary& lib;
        cublasLtMatmulPreference_t p;
        ~PrefGuard() { lib.cublasLtMatmulPreferenceDestroy(p); }
    } guard{lib, pref};
    const uint64_t ws = workspaceBytes_;
    TD_LT_TRY(lib,
              lib.cublasLtMatmulPreferenceSetAttribute(
                  pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
              what);
    // The operands' actual alignment (arena offsets need not be multiples of 256 bytes).
    const uint32_t alA = alignmentOf(s_.b), alB = alignmentOf(s_.a), alC = alignmentOf(s_.out);
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alA},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alB},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alC},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alC}};
    for (const auto& [attr, al] : aligns)
        TD_LT_TRY(lib, lib.cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof al), what);
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    const cublasStatus_t st =
        lib.cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(ctx_->handle()), desc, la,
                                           lb, lc, lc, pref, 1, &result, &count);
    if (st != CUBLAS_STATUS_SUCCESS || count == 0) {
        // No algorithm for this form (found stays false): the caller tries a plainer one.
        lastRefusal_ = st != CUBLAS_STATUS_SUCCESS ? lib.statusText(st) : "no algorithm";
        return Status::success();
    }
    algo_.reset(new unsigned char[sizeof(cublasLtMatmulAlgo_t)]);
    std::memcpy(algo_.get(), &result.algo, sizeof(cublasLtMatmulAlgo_t));
    found = true;
    return Status::success();
}

Result<std::unique_ptr<LtMatmul>> LtMatmul::plan(const LtContext& ctx, const LtMatmulShape& s,
                                                 void* workspace, size_t workspaceBytes) {
    std::unique_ptr<LtMatmul> m(new LtMatmul());
    m->ctx_ = &ctx;
    m->s_ = s;
    m->workspace_ = workspace;
    m->workspaceBytes_ = workspaceBytes;
    const bool bias = s.biasPtr != nullptr;
    // The fused forms first, then the plain product (the caller adds what was not fused).
    const std::pair<bool, bool> forms[] = {{bias, s.relu}, {bias, false}, {false, false}};
    for (const auto& [b, r] : forms) {
        if ((b && !bias) || (r && !s.relu)) continue;
        bool found = false;
        TD_RETURN_IF_ERROR(m->tryPlan(b, r, found));
        if (found) {
            m->fusedBias_ = b;
            m->fusedRelu_ = r;
            return m;
        }
    }
    return err("cuBLASLt has no algorithm for a " + std::to_string(s.M) + "x" +
               std::to_string(s.K) + "x" + std::to_string(s.N) + " product of " + dtypeName(s.ab) +
               " into " + dtypeName(s.c) + " (" + m->lastRefusal_ + ")");
}

Status LtMatmul::run(cudaStream_t stream) const {
    const LtLibrary& lib = ctx_->lib();
    const float one = 1.0f, zero = 0.0f;
    TD_LT_TRY(lib,
              lib.cublasLtMatmul(static_cast<cublasLtHandle_t>(ctx_->handle()),
                                 static_cast<cublasLtMatmulDesc_t>(desc_), &one, s_.b,
                                 static_cast<cublasLtMatrixLayout_t>(layoutA_), s_.a,
                                 static_cast<cublasLtMatrixLayout_t>(layoutB_), &zero, s_.out,
                                 static_cast<cublasLtMatrixLayout_t>(layoutC_), s_.out,
                                 static_cast<cublasLtMatrixLayout_t>(layoutC_),
                                 reinterpret_cast<const cublasLtMatmulAlgo_t*>(algo_.get()),
                                 workspace_, workspaceBytes_, stream),
              "cuBLASLt matmul");
    return Status::success();
}

}  // namespace td::cuda
