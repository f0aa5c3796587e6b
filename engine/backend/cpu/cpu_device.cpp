// CPU device: host memory, oneDNN matmul primitives (bias and eltwise post-ops, user scratchpad
// allocated at compile time) and the project's own kernels for everything else. A Program is the
// LoweredProgram's instruction list with every pointer resolved at compile time: the step loop
// only walks it. The device's stream is the calling thread: run() has finished everything
// (accumulators, all-reduce, optimizer update) when it returns.
#include <omp.h>
#include <xmmintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "dnnl.hpp"
#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_passes.h"
#include "engine/backend/cpu/image_kernels.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/cpu/simd_kernels.h"
#include "engine/backend/cpu/sparse_kernels.h"
#include "engine/backend/cpu/update.h"
#include "engine/backend/cpu/weight_placement.h"
#include "engine/backend/cpu/work_share.h"
#include "engine/backend/host_threads.h"
#include "engine/backend/kernel_math.h"
#include "engine/core/cpu_isa.h"
#include "engine/core/half.h"
#include "engine/distribute/collectives.h"

namespace td {

namespace {

// One lowered instruction with its pointers resolved.
struct CpuInstr {
    InstrOp op = InstrOp::Add;
    const float* a = nullptr;  // first operand
    const void* b = nullptr;   // second operand (labels for loss/metric)
    float* out = nullptr;
    int64_t rows = 0, cols = 0;  // of the first operand
    float alpha = 0, scale = 0, l1 = 0, l2 = 0;
    ActKind act = ActKind::Linear;
    LossKind loss = LossKind::Mse;
    MetricKind metric = MetricKind::SparseCategorical;
    bool usesOutput = false, onLogits = false;
    int64_t k = 1;
    uint64_t seed = 0;
    int prim = -1;          // index into CpuProgram::prims_ for oneDNN ops
    double* acc = nullptr;  // Accumulate
    double factor = 1;
    int bucket = -1;  // AllReduceStart / AllReduceWait
    float* data = nullptr;
    int64_t count = 0;
    int update = -1;                      // Update: the tensor (-1: all)
    LossScaleState* lossScale = nullptr;  // LossGrad (dynamic scale)
    bool refreshOnly = false;             // Cast into a shadow
    // Block mode (any 16-bit operand, a fused dropout mask or a fused bias gradient): the rows go
    // through in blocks that stay in cache; 16-bit operands are converted to f32 on the way in
    // and out. Index into CpuProgram::blocks_, -1: the plain f32 kernel on whole arrays.
    int block = -1;
    float rate = 0;  // Act / ActGrad: the fused dropout's rate (0: none)
    // Cast, and a matmul's conversions when oneDNN has no kernel for its dtype.
    int conversion = -1;  // index into CpuProgram::conversions_
    // Images and normalization: further operands (gamma, beta, mean, var), the geometry.
    const float* c = nullptr;
    const float* d = nullptr;
    const float* e = nullptr;
    ConvGeometry geometry;  // pooling and padding (Instr::geometry)
    AugmentSpec augment;    // the image preprocessing ops (Instr::augment)
    float epsilon = 0, momentum = 0, offset = 0;
    bool batchStats = false;
    // A convolution's weight reorders around its primitive (-1: none): into the layout the
    // primitive chose before it runs, out of it (a filter gradient) after.
    int reorderBefore = -1, reorderAfter = -1;
    // A product split into `pieces` primitives (prims_[prim], prims_[prim + 1], ...), each a
    // slice of the output's rows or columns, run on the device's WorkShare (1: one primitive).
    int pieces = 1;
    // A forward product split along K (see kSplitEdges): piece 0 writes the output, piece p > 0
    // the partial sum kPartials[p - 1]; then the partials, the bias (kBias, null: none) and the
    // activation (act, alpha) are added on the calling thread.
    std::vector<float*> kPartials;
    const float* kBias = nullptr;
    int64_t kRows = 0, kCols = 0;  // of the output
    // A product whose pieces may skip the zeros of their input (sparse_kernels.h): index into
    // CpuProgram::sparse_ (-1: always dense).
    int sparse = -1;
    // A whole f32 product with a narrow output run by the narrow kernel (sparse_kernels.h)
    // instead of its primitive, whose arguments still say where the operands are: A's element
    // (r, k) at r * narrowSr + k * narrowSk, M x K times K x N.
    const cpu::sparse::Kernels* narrow = nullptr;
    int64_t narrowSr = 0, narrowSk = 0, narrowM = 0, narrowK = 0, narrowN = 0;
    // Instead a product with a short inner dimension and B transposed (the input gradient of a
    // narrow layer), by the same kernels' shortProduct: A [M,K], B [N,K], both row-major.
    bool shortInner = false;
    // A bias gradient of an image: summed by fixed pieces across the team (cpu::channelSums, as
    // act_grad's team rows sum it when fused).
    bool imageSums = false;
    // cpu_share_norm_sums: the batch_norm_grad that writes normSums_[normSums] (sum(dy), then
    // sum(dy * x_hat)), or the norm_gamma_grad or bias_grad that copies its part (-1: none).
    int normSums = -1;
};

// The row-wise, loss, metric and regularization instructions: those with a block form (runBlock),
// each a plain loop on the calling thread otherwise.
bool hasBlockForm(InstrOp op) {
    switch (op) {
        case InstrOp::BiasAdd:
        case InstrOp::Act:
        case InstrOp::ActGrad:
        case InstrOp::Dropout:
        case InstrOp::DropoutGrad:
        case InstrOp::Add:
        case InstrOp::BiasGrad:
        case InstrOp::LossGrad:
        case InstrOp::Loss:
        case InstrOp::Metric:
        case InstrOp::RegLoss:
        case InstrOp::RegGrad:
            return true;
        default:
            return false;
    }
}

// An operand as block mode reads or writes it.
struct BlockOperand {
    const void* ptr = nullptr;
    DType dtype = DType::F32;
    int64_t rowElems = 0;  // elements a row advances (0: the same for every row, e.g. a bias)
};

struct BlockPlan {
    int64_t blockRows = 1;
    BlockOperand in[2];
    int inputs = 0;
    bool floatB = false;  // in[1] holds floats (else labels, read as they are)
    BlockOperand out;
    BlockOperand out2;       // column sums of the result (bias gradient); ptr null: none
    bool outIsSums = false;  // bias_grad itself: only column sums of in[0]
    bool whole = false;      // a reduction: every row in one block, in the whole-operand buffers
    // Rows of an image's channels (act_grad with its bias gradient over [B,H,W,C]): the rows
    // split into cpu::kChannelSumBlocks fixed pieces, each with its own buffers and column sums,
    // the sums added in piece order as cpu::channelSums adds them (the same bits as the bias
    // gradient on its own, whatever the thread count). The pieces run across the OpenMP team
    // above kTeamRowsMin elements, else on this thread.
    bool teamRows = false;
    // Team rows of ReLU's gradient with f32 operands, f32 sums and an f32 or bf16 result: each
    // piece in one pass of simd::Table::reluGradSums, without the block buffers.
    bool reluSums = false;
};

// Conversions around an instruction (whole arrays).
struct Conversion {
    const void* src = nullptr;
    DType from = DType::F32;
    void* dst = nullptr;
    DType to = DType::F32;
    int64_t n = 0;
};
struct ConversionPlan {
    std::vector<Conversion> before, after;
};

// dst (dtype `to`) = src (dtype `from`), rounded to nearest even; via f32 when neither is f32.
void convert(const Conversion& c, float* tmp, int64_t tmpElems) {
    if (c.from == c.to) {
        std::memcpy(c.dst, c.src, static_cast<size_t>(c.n) * dtypeSize(c.to));
        return;
    }
    // Only 16-bit dtypes reach these (f32 to f32 is the copy above).
    auto toF32 = [&](const void* src, float* dst, int64_t n) {
        if (c.from == DType::BF16)
            castBf16ToF32(static_cast<const uint16_t*>(src), dst, n);
        else
            castF16ToF32(static_cast<const uint16_t*>(src), dst, n);
    };
    auto fromF32 = [&](const float* src, void* dst, int64_t n) {
        if (c.to == DType::BF16)
            castF32ToBf16(src, static_cast<uint16_t*>(dst), n);
        else
            castF32ToF16(src, static_cast<uint16_t*>(dst), n);
    };
    if (c.from == DType::F32 || c.to == DType::F32) {
        // Elements [i, i + m): a large array in pieces across the program's OpenMP team (a
        // program on one thread converts on it).
        auto piece = [&](int64_t i, int64_t m) {
            if (c.from == DType::F32)
                fromF32(static_cast<const float*>(c.src) + i, static_cast<char*>(c.dst) + i * 2, m);
            else
                toF32(static_cast<const char*>(c.src) + i * 2, static_cast<float*>(c.dst) + i, m);
        };
        constexpr int64_t kPiece = 1 << 14;
        if (c.n > 4 * kPiece && omp_get_max_threads() > 1) {
            const int64_t pieces = (c.n + kPiece - 1) / kPiece;
#pragma omp parallel for schedule(static)
            for (int64_t k = 0; k < pieces; ++k)
                piece(k * kPiece, std::min(kPiece, c.n - k * kPiece));
        } else {
            piece(0, c.n);
        }
    } else {
        for (int64_t i = 0; i < c.n; i += tmpElems) {
            const int64_t m = std::min(tmpElems, c.n - i);
            toF32(static_cast<const char*>(c.src) + i * 2, tmp, m);
            fromF32(tmp, static_cast<char*>(c.dst) + i * 2, m);
        }
    }
}

bool is16(DType d) {
    return d == DType::BF16 || d == DType::F16;
}

class CpuProgram final : public Executable {
  public:
    // `updateThreads`: the OpenMP team the optimizer update splits its one pass over every
    // parameter across: the step's team (the thread count the program was compiled with).
    // `share`: when the program runs on fewer threads than the device has (a small step), the
    // device's helpers, which take pieces of the large products and of the update instead (null:
    // none). An OpenMP team for those was measured slower on a 2-core machine: its members wait
    // at a barrier for whichever one the input pipeline's thread has displaced.
    // `passes`: which of the device's own passes are on (cpu_passes.h).
    CpuProgram(dnnl::engine& eng, dnnl::stream& strm, int updateThreads, WorkShare* share,
               std::span<dnnl::stream> helperStreams, cpu::PassRunner passes)
        : eng_(eng),
          strm_(strm),
          updateThreads_(updateThreads),
          share_(share),
          helperStreams_(helperStreams),
          passes_(std::move(passes)) {
        teamPieces_ = !share_ && updateThreads_ > 1 && cpu::sparse::active() &&
                      passes_.enabled(cpu::Pass::SkipZeros) &&
                      passes_.enabled(cpu::Pass::TeamPieces);
        if (teamPieces_)
            for (int w = 1; w < updateThreads_; ++w) teamStreams_.emplace_back(eng_);
    }
    ~CpuProgram() override {
        printProfile();
        std::free(arena_);
    }

    Status build(const LoweredProgram& lp, const ProgramBindings& bind);
    Status run(const StepArgs& args) override;
    bool rebindBatch(const void* input, const void* label) override {
        for (const BatchSite& site : batchSites_) {
            const void* base = site.label ? label : input;
            if (!base) continue;
            void* p = const_cast<char*>(static_cast<const char*>(base)) + site.offset;
            switch (site.kind) {
                case BatchSite::Kind::OperandA:
                    code_[static_cast<size_t>(site.index)].a = static_cast<const float*>(p);
                    break;
                case BatchSite::Kind::OperandB:
                    code_[static_cast<size_t>(site.index)].b = p;
                    break;
                case BatchSite::Kind::PrimArg:
                    prims_[static_cast<size_t>(site.index)].args.at(site.arg).set_data_handle(p);
                    break;
                case BatchSite::Kind::ConversionSrc:
                    conversions_[static_cast<size_t>(site.index)].before.at(0).src = p;
                    break;
                case BatchSite::Kind::BlockIn:
                    blocks_[static_cast<size_t>(site.index)].in[site.arg].ptr = p;
                    break;
            }
        }
        return true;
    }
    const void* valuePtr(int nodeId) const override {
        return ptrs_.at(static_cast<size_t>(nodeId));
    }
    size_t arenaBytes() const override { return arenaBytes_; }
    std::vector<BackendPassRecord> passRecords() const override { return passes_.records(); }

  private:
    struct Prim {
        dnnl::primitive p;
        std::unordered_map<int, dnnl::memory> args;
    };
    void* resolve(const Operand& o) const;
    Status addMatmul(const Instr& in, CpuInstr& ins);
    Status addConv(const Instr& in, CpuInstr& ins);
    Status setupImageOp(const Instr& in, CpuInstr& ins);
    void* scratchBytes(size_t bytes) {
        scratch_.emplace_back(new char[bytes + 64]);
        const auto p = reinterpret_cast<uintptr_t>(scratch_.back().get());
        return reinterpret_cast<void*>((p + 63) / 64 * 64);
    }
    // Where the program reads the batch: instruction operands and oneDNN arguments in the input
    // or label space, so rebindBatch() can point them at a batch in place.
    struct BatchSite {
        enum class Kind : uint8_t { OperandA, OperandB, PrimArg, ConversionSrc, BlockIn } kind;
        int index = 0;  // code_, prims_, conversions_ or blocks_ entry
        int arg = 0;    // DNNL_ARG_* for PrimArg; the operand for BlockIn
        bool label = false;
        int64_t offset = 0;
    };
    // `extra`: bytes past the operand's start (a product piece's slice).
    void noteBatchSite(const Operand& o, BatchSite::Kind kind, int index, int arg = 0,
                       int64_t extra = 0) {
        if (o.space == Space::Input || o.space == Space::Label)
            batchSites_.push_back({kind, index, arg, o.space == Space::Label, o.offset + extra});
    }
    std::vector<BatchSite> batchSites_;

    dnnl::engine& eng_;
    dnnl::stream& strm_;
    int updateThreads_ = 1;
    WorkShare* share_ = nullptr;
    std::span<dnnl::stream> helperStreams_;  // one per WorkShare helper
    cpu::PassRunner passes_;
    // A program on the device's whole OpenMP team (no WorkShare: a large step) runs its products
    // whole on oneDNN's team, except the weight gradients that may skip their input's zeros
    // (x^T . dy, f32, at least kTeamPiecesMinCols outputs): those split by rows as on the
    // WorkShare, one run of pieces per member of the team (teamStreams_: the other members'
    // oneDNN streams, where a piece runs dense), with their optimizer update in their pieces
    // (fuseUpdates). The forward and input-gradient products stay whole: in row pieces each
    // piece reads every weight, and oneDNN's team splits them better. 784-1024-1024-10 MLP, batch
    // 256, Adam, on the 2-core AVX-512 Xeon: four alternating pairs of 3-epoch runs, 24,823-27,214
    // samples/s in epochs 2-3 against 22,171-25,797 with the pass cpu_team_pieces off (which keeps
    // every product whole and the update apart, for measurements), faster in every pair; in the
    // profile (TRAINDECK_PROFILE=1, one run each, one after the other) the two weight gradients
    // with their update 1,917 and 1,768 us against 1,965 and 1,578 whole plus 900 for the update
    // (of it, dy's blocks packed: sparse_kernels_impl.h, packsGradBlocks; read in place, three
    // pairs, 24,844-26,343 against 25,232-27,992). A weight gradient with few outputs (the
    // classifier's, [1024,10]) took longer in pieces (160 us against 91-106), hence the bound. The
    // CNN project at batch 64 came out even (its dense layer's gradient with the update 186-203 us
    // against 120 plus about 125 of the update).
    bool teamPieces_ = false;
    std::vector<dnnl::stream> teamStreams_;
    static constexpr int64_t kTeamPiecesMinCols = 64;
    // The threads a product's pieces are shared by: the WorkShare's, the team's, or one.
    int pieceWidth() const { return share_ ? share_->width() : teamPieces_ ? updateThreads_ : 1; }
    dnnl::stream& workerStream(int worker) {
        if (worker == 0) return strm_;
        return share_ ? helperStreams_[static_cast<size_t>(worker - 1)]
                      : teamStreams_[static_cast<size_t>(worker - 1)];
    }
    // fn(piece, worker) for every piece: on the WorkShare (each thread its own pieces first,
    // then any left), or on the OpenMP team, each member exactly its own run of pieces. A piece
    // run on a team member that runs a oneDNN primitive runs it on that member alone (a nested
    // region).
    template <class F>
    void runPieces(int64_t pieces, F&& fn) {
        if (share_) {
            share_->run(pieces, std::forward<F>(fn));
            return;
        }
        // A region may get fewer threads than asked for (nested in another region, a thread
        // limit): then each thread runs the pieces of every width-th worker from its own, as
        // that worker, so every piece still runs.
        const int width = pieceWidth();
#pragma omp parallel num_threads(width)
        {
            const int threads = omp_get_num_threads();
            for (int w = omp_get_thread_num(); w < width; w += threads) {
                const int64_t end = WorkShare::firstOwned(pieces, w + 1, width);
                for (int64_t p = WorkShare::firstOwned(pieces, w, width); p < end; ++p) fn(p, w);
            }
        }
    }
    const ProgramBindings* bind_ = nullptr;  // during build() only
    std::vector<CpuInstr> code_;
    std::vector<Prim> prims_;
    std::vector<void*> ptrs_;
    void* arena_ = nullptr;
    size_t arenaBytes_ = 0;
    std::vector<std::unique_ptr<char[]>> scratch_;
    Collectives* collectives_ = nullptr;
    UpdateSpec update_;
    std::vector<UpdateTensor> updateTensors_;
    LossScaleState* lossScale_ = nullptr;
    std::vector<BlockPlan> blocks_;
    std::vector<ConversionPlan> conversions_;
    // Block mode's f32 buffers, shared by every instruction (they run one after another):
    // in0, in1, out, a temporary and the column sums, each kBlockElems, then three buffers of
    // the largest reduction's operands.
    std::vector<float> blockScratch_;
    int64_t wholeElems_ = 0;
    // Team rows (BlockPlan::teamRows): four block buffers per OpenMP thread (sized at the first
    // run that needs them; ReLU's one pass needs none), and the column sums of each of
    // cpu::kChannelSumBlocks pieces.
    std::vector<float> teamScratch_;
    std::vector<float> teamSums_;
    std::vector<std::vector<float>> normSums_;           // 2 x C each (cpu_share_norm_sums)
    std::vector<std::unique_ptr<float[]>> convScratch_;  // a matmul's f32 copies of f16 operands

    // A product split into pieces on the WorkShare that can skip the zeros of its input x: the
    // forward product's pieces along K (y = x . w) or a weight gradient's (dw = x^T . dy, by
    // rows of dw). Each piece reads its operands' current addresses from its oneDNN
    // arguments (the batch is rebound there). The zero-skipping kernel runs while the work it
    // lists (positions where either of a pair of x's rows or columns is nonzero) is small enough
    // to pay, judged on each run's own input (sparseRun); otherwise oneDNN runs.
    // The pass cpu_skip_zeros off: always oneDNN.
    struct SparseProduct {
        const cpu::sparse::Kernels* kernels = nullptr;
        bool grad = false;
        struct Piece {
            int64_t rows = 0, inner = 0, cols = 0;  // x's rows and columns in the piece; N
            int64_t ldx = 0, ldw = 0, ldy = 0;
            int64_t listed = 0;  // the kernel's last count
            int64_t first = 0;   // along K: the piece's first row of w (column of x)
        };
        std::vector<Piece> pieces;
        int64_t sparseRuns = 0;
        double work = 1;  // listed / dense, the last run that measured it
    };
    std::vector<SparseProduct> sparse_;
    bool sparseRun(const CpuInstr& i);
    void runSparsePiece(const CpuInstr& i, int64_t piece);
    void noteSparseRun(const CpuInstr& i);
    // The device's rewrites (cpu_passes.h), in the order build() runs them: each returns the
    // places it changed.
    int64_t planNarrowKernels(const LoweredProgram& lp);
    int64_t planShareNormSums(const LoweredProgram& lp);

    Status planBlock(const Instr& in, CpuInstr& ins);
    Status exec(const CpuInstr& i, const StepArgs& args);
    // TRAINDECK_PROFILE=1: every instruction is timed (from the second run on), and the program
    // prints the mean time of each when it is destroyed (to stderr; programs run fewer than 10
    // times print nothing).
    void printProfile() const;
    bool profile_ = false;
    std::vector<double> profileSeconds_;
    std::vector<std::string> profileNames_;
    int64_t profileRuns_ = 0;
    void addPartials(const CpuInstr& i);
    void runBlock(const CpuInstr& i, const StepArgs& args);

    // What instruction k writes: its output, its column sums, a loss it computes for another.
    Status execTimed(size_t k, const StepArgs& args);
    void runProduct(const CpuInstr& i, dnnl::stream& s);
};

constexpr int64_t kBlockElems = 8192;  // 32 KiB of f32 per block operand: in L1/L2
// Block mode's rows of an image go to the team above this many elements (kernels.cpp's
// threshold for an elementwise kernel).
constexpr int64_t kTeamRowsMin = 1 << 16;

dnnl::memory::data_type dnnlType(DType d) {
    switch (d) {
        case DType::BF16:
            return dnnl::memory::data_type::bf16;
        case DType::F16:
            return dnnl::memory::data_type::f16;
        default:
            return dnnl::memory::data_type::f32;
    }
}

dnnl::memory::desc matDesc(int64_t rows, int64_t cols, bool transposed, DType dtype = DType::F32) {
    using dnnl::memory;
    // Logical [rows, cols]; a transposed operand is stored as [cols, rows] row-major.
    memory::dims strides = transposed ? memory::dims{1, rows} : memory::dims{cols, 1};
    return memory::desc({rows, cols}, dnnlType(dtype), strides);
}

// The activation of a fused dense or conv2d as a oneDNN eltwise post-op (false: softmax).
bool appendActPostOp(dnnl::post_ops& po, ActKind act, float alpha) {
    using dnnl::algorithm;
    switch (act) {
        case ActKind::Linear:
            break;
        case ActKind::Relu:
            po.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
            break;
        case ActKind::LeakyRelu:
            po.append_eltwise(1.f, algorithm::eltwise_relu, alpha, 0.f);
            break;
        case ActKind::Elu:
            po.append_eltwise(1.f, algorithm::eltwise_elu, alpha, 0.f);
            break;
        case ActKind::Gelu:
            po.append_eltwise(1.f, algorithm::eltwise_gelu_erf, 0.f, 0.f);
            break;
        case ActKind::Sigmoid:
            po.append_eltwise(1.f, algorithm::eltwise_logistic, 0.f, 0.f);
            break;
        case ActKind::Tanh:
            po.append_eltwise(1.f, algorithm::eltwise_tanh, 0.f, 0.f);
            break;
        case ActKind::Softmax:
            return false;
    }
    return true;
}

// An image [B,H,W,C] as oneDNN sees it: logical NCHW dims, channels-last memory.
dnnl::memory::desc imageDesc(const Shape& s, DType dt) {
    return dnnl::memory::desc({s[0], s[3], s[1], s[2]}, dnnlType(dt),
                              dnnl::memory::format_tag::nhwc);
}

// A Keras kernel [KH,KW,C/groups,F] as oneDNN weights: OIHW (GOIHW with groups) over its memory.
dnnl::memory::desc kernelDesc(const Shape& w, int64_t groups, DType dt) {
    const int64_t KH = w[0], KW = w[1], Cg = w[2], F = w[3];
    if (groups == 1)
        return dnnl::memory::desc({F, Cg, KH, KW}, dnnlType(dt),
                                  dnnl::memory::dims{1, F, KW * Cg * F, Cg * F});
    return dnnl::memory::desc({groups, F / groups, Cg, KH, KW}, dnnlType(dt),
                              dnnl::memory::dims{F / groups, 1, F, KW * Cg * F, Cg * F});
}

// How a product [M,K]x[K,N] splits into pieces for a WorkShare of `width` threads: along the
// output's rows when every thread gets at least kMinRows of them (each piece re-reads all of B),
// else along its columns (each re-reads all of A), at whole 16-float vectors, up to
// kPiecesPerWorker pieces per thread so that a late thread leaves little behind. A small product
// stays whole: waking a helper costs more than it saves. Measured on a 2-core AVX-512 machine
// (seed MLP, Adam, batch 32), with the step's own timer around each instruction: the forward
// [32,784]x[784,128] (6.4 MFLOP) takes 37 us in two row pieces against 43 whole, and 49 in four
// column pieces; the weight gradient [784,32]x[32,128] takes 26-32 us in four row pieces against
// 43. A small batch's forward product of weights splits along K instead (kSplitEdges). No split:
// edges is empty.
//
// A small batch's weight gradient ([K,B]x[B,N] with B under kKSplitRows per thread, see
// kSplitEdges) splits into kSmallGradPiecesPerWorker pieces per thread: each piece re-reads only
// the batch's output gradient (B x N, 16 KB for the seed MLP at batch 32), and where the helper's
// core runs late (a busy host) the caller takes more of its share, a smaller piece at a time.
// Seed MLP at batch 32 on the 2-core AVX2 machine, 8 pieces against 4 in alternating steps of the
// same runs (4 emulated by running the 8 two at a time, so both see the same host): mean step
// 0-7% shorter in six runs of three epochs (154-202 us against 155-208 on a busy host), the
// median even; 16 against 8 (the same way): 0.5-2.5% shorter in five of six runs, 2% longer in
// one.
constexpr double kSplitMinFlops = 4e6;
constexpr double kSplitMinFlopsColumns = 32e6;
constexpr int64_t kPiecesPerWorker = 2;
constexpr int64_t kSmallGradPiecesPerWorker = 8;
constexpr int64_t kMinRows = 16;
constexpr int64_t kMinCols = 32;
struct ProductSplit {
    bool alongRows = true;
    std::vector<int64_t> edges;  // pieces + 1 boundaries along the split dimension
};

// smallGrad: a small batch's weight gradient (see above).
ProductSplit splitProduct(int64_t M, int64_t N, int64_t K, int width, bool smallGrad) {
    ProductSplit s;
    s.alongRows = M >= width * kMinRows;
    const double flops =
        2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
    if (width < 2 || flops < (s.alongRows ? kSplitMinFlops : kSplitMinFlopsColumns)) return s;
    const int64_t dim = s.alongRows ? M : N;
    const int64_t perWorker =
        smallGrad && s.alongRows ? kSmallGradPiecesPerWorker : kPiecesPerWorker;
    const int64_t pieces =
        std::min<int64_t>(width * perWorker, dim / (s.alongRows ? kMinRows : kMinCols));
    if (pieces < 2) return s;
    for (int64_t j = 0; j <= pieces; ++j)
        s.edges.push_back(j == pieces ? dim : (dim * j / pieces + 15) / 16 * 16);
    return s;
}

// A small batch's forward product of trainable weights, [M,K]x[K,N] with M under kKSplitRows per
// thread, splits along K instead: each thread multiplies the rows of the weights whose gradient
// and update it computes (the weight gradient's pieces by rows, split as splitProduct splits that
// [K,N] product, and the runs of them each thread owns), so those weights stay in its core's
// cache from the update to the next forward pass, instead of every core reading all of them, half
// just written by the other. The partial sums are then added with the bias and the activation.
// Measured on a 2-core AVX-512 machine, seed MLP, Adam, batch 32 (TRAINDECK_PROFILE=1, four
// alternating pairs against the pass cpu_split_k off): the forward product
// 39.8-54.7 us against 42.8-45.0 in row pieces, the weight gradient with its update 55.4-95.9
// against 74.9-91.7, the step 110.3-171.1 us against 133.5-152.5 (medians 116.9 and 138.7). At
// batch 64 it was even, at 256 slower (the forward 325-412 us against 219-252).
// Edges along K, one piece per thread; empty: no such split.
constexpr int64_t kKSplitRows = 32;
// Whether a weight gradient x^T . dy over B batch rows is a small batch's (splitProduct).
bool smallBatchGradient(int64_t B, int width) {
    return B < width * kKSplitRows;
}
std::vector<int64_t> kSplitEdges(int64_t M, int64_t N, int64_t K, int width) {
    if (width < 2 || !smallBatchGradient(M, width)) return {};
    const ProductSplit grad = splitProduct(K, N, M, width, true);
    if (!grad.alongRows || grad.edges.empty()) return {};
    const auto pieces = static_cast<int64_t>(grad.edges.size()) - 1;
    std::vector<int64_t> edges;
    for (int w = 0; w <= width; ++w)
        edges.push_back(grad.edges[static_cast<size_t>(pieces * w / width)]);
    for (size_t j = 1; j < edges.size(); ++j)
        if (edges[j] <= edges[j - 1]) return {};
    return edges;
}

void* CpuProgram::resolve(const Operand& o) const {
    return operandAddress(*bind_, arena_, o);
}

Status CpuProgram::addMatmul(const Instr& in, CpuInstr& ins) {
    using namespace dnnl;
    const std::string what = std::string(instrOpName(in.op)) + " %" + std::to_string(in.node);
    const Shape& A = in.in[0].shape;
    const bool ta = in.transA, tb = in.transB;
    const int64_t M = in.out.shape[0], N = in.out.shape[1];
    const int64_t K = ta ? A[0] : A[1];
    primitive_attr attr;
    attr.set_scratchpad_mode(scratchpad_mode::user);
    memory::desc biasMd;
    const bool hasBias = in.op == InstrOp::Dense && in.in.size() == 3;
    if (hasBias) biasMd = memory::desc({1, N}, memory::data_type::f32, memory::dims{N, 1});
    if (in.op == InstrOp::Dense) {
        post_ops po;
        if (!appendActPostOp(po, in.act, in.alpha))
            return err(what + ": activation softmax is not a post-op");
        attr.set_post_ops(po);
    }
    // 16-bit products run where this build of oneDNN has a kernel for the CPU (bf16: AMX,
    // AVX512-BF16 or AVX-512 emulation; f16 on fewer), else the operands are converted to f32
    // around an f32 product (oneDNN 2.6 has no bf16 matmul below AVX-512, for one).
    DType opType = in.in[0].dtype, outType = in.out.dtype;
    bool convertHalf = false;  // the 16-bit operands (f16 or bf16) converted to f32
    if (opType == DType::F16 || opType == DType::BF16) {
        try {
            const memory::desc a = matDesc(M, K, ta, opType), w = matDesc(K, N, tb, opType),
                               c = matDesc(M, N, false, outType);
            matmul::primitive_desc probe(
                hasBias ? matmul::desc(a, w, biasMd, c) : matmul::desc(a, w, c), attr, eng_);
        } catch (const dnnl::error&) {
            convertHalf = true;
        }
    }
    const DType primOp = convertHalf ? DType::F32 : opType;
    const DType primOut = convertHalf ? DType::F32 : outType;
    memory::desc aMd = matDesc(M, K, ta, primOp), wMd = matDesc(K, N, tb, primOp),
                 cMd = matDesc(M, N, false, primOut);
    try {
        void* aPtr = resolve(in.in[0]);
        void* wPtr = resolve(in.in[1]);
        void* cPtr = resolve(in.out);
        if (convertHalf) {
            // f32 copies of the f16 operands (and the result), converted on every run.
            ConversionPlan cp;
            auto f32Copy = [&](void* src, DType from, int64_t n, bool before) {
                convScratch_.emplace_back(new float[static_cast<size_t>(n)]);
                float* copy = convScratch_.back().get();
                if (before)
                    cp.before.push_back({src, from, copy, DType::F32, n});
                else
                    cp.after.push_back({copy, DType::F32, src, from, n});
                return copy;
            };
            aPtr = f32Copy(aPtr, opType, in.in[0].elements(), true);
            wPtr = f32Copy(wPtr, opType, in.in[1].elements(), true);
            if (outType != DType::F32) cPtr = f32Copy(cPtr, outType, in.out.elements(), false);
            ins.conversion = static_cast<int>(conversions_.size());
            conversions_.push_back(std::move(cp));
        }
        // One primitive per piece; a piece reads a slice of A's rows or B's columns and writes
        // the same slice of C (and reads that slice of the bias).
        // A program on one thread (a share without helpers, see solo_) splits as for two
        // threads, but only the products whose pieces may skip zeros (below), and runs the pieces
        // in turn: the same pieces, so the same bits, as on two threads.
        const bool solo = share_ && share_->width() == 1;
        const int width = solo ? 2 : pieceWidth();
        ProductSplit split = convertHalf || !(share_ || (teamPieces_ && in.op == InstrOp::MatMul &&
                                                         ta && !tb && N >= kTeamPiecesMinCols))
                                 ? ProductSplit{}
                                 : splitProduct(M, N, K, width,
                                                in.op == InstrOp::MatMul && ta && !tb &&
                                                    smallBatchGradient(K, width));
        // A forward product reading a trainable weight matrix (f32, as stored): along K
        // (cpu_split_k). Not with an all-reduce: the update then runs after it, not in the
        // gradient's pieces.
        std::vector<int64_t> kEdges;
        if (passes_.enabled(cpu::Pass::SplitK) && !convertHalf && share_ && !collectives_ && !ta &&
            !tb && in.in[1].space == Space::Param && primOp == DType::F32 &&
            primOut == DType::F32 && in.act != ActKind::Softmax)
            kEdges = kSplitEdges(M, N, K, width);
        if (!kEdges.empty()) split = ProductSplit{true, kEdges};
        bool alongK = !kEdges.empty();
        const cpu::sparse::Kernels* sparseKernels = cpu::sparse::active();
        // Whether the pieces may skip the zeros of x (see below; cpu_skip_zeros). The kernels
        // list the dense operand's rows as 32-bit indices (below K).
        const bool grad = in.op == InstrOp::MatMul && ta && !tb && split.alongRows && !alongK;
        const bool mayBeSparse = sparseKernels && passes_.enabled(cpu::Pass::SkipZeros) &&
                                 !convertHalf && split.edges.size() > 2 && (alongK || grad) &&
                                 K <= std::numeric_limits<int32_t>::max() &&
                                 in.in[0].dtype == DType::F32 && in.in[1].dtype == DType::F32 &&
                                 outType == DType::F32;
        if ((solo || teamPieces_) && !mayBeSparse) {
            split = ProductSplit{};
            alongK = false;
        }
        const int pieces = static_cast<int>(split.edges.size()) - 1;
        if (alongK) passes_.note(cpu::Pass::SplitK);
        if (pieces > 1 && solo) passes_.note(cpu::Pass::SoloPieces);
        if (pieces > 1 && teamPieces_) passes_.note(cpu::Pass::TeamPieces);
        const int64_t aSize = static_cast<int64_t>(dtypeSize(primOp));
        const int64_t cSize = static_cast<int64_t>(dtypeSize(primOut));
        void* biasPtr = hasBias ? resolve(in.in[2]) : nullptr;
        ins.prim = static_cast<int>(prims_.size());
        ins.pieces = std::max(pieces, 1);
        if (pieces > 1 && split.alongRows && !alongK) {
        }
        if (alongK) {
            for (int piece = 1; piece < pieces; ++piece) {
                convScratch_.emplace_back(new float[static_cast<size_t>(M * N)]);
                ins.kPartials.push_back(convScratch_.back().get());
            }
            ins.kBias = hasBias ? static_cast<const float*>(biasPtr) : nullptr;
            ins.kRows = M;
            ins.kCols = N;
        }
        for (int piece = 0; piece < ins.pieces; ++piece) {
            memory::desc aP = aMd, wP = wMd, cP = cMd, bP = biasMd;
            int64_t aOff = 0, wOff = 0, cOff = 0, bOff = 0;  // elements
            if (alongK) {
                const int64_t lo = split.edges[static_cast<size_t>(piece)];
                const int64_t n = split.edges[static_cast<size_t>(piece) + 1] - lo;
                aP = memory::desc({M, n}, dnnlType(primOp), memory::dims{K, 1});
                aOff = lo;
                wP = memory::desc({n, N}, dnnlType(primOp), memory::dims{N, 1});
                wOff = lo * N;
            } else if (pieces > 1) {
                const int64_t lo = split.edges[static_cast<size_t>(piece)];
                const int64_t n = split.edges[static_cast<size_t>(piece) + 1] - lo;
                if (split.alongRows) {
                    aP = memory::desc({n, K}, dnnlType(primOp),
                                      ta ? memory::dims{1, M} : memory::dims{K, 1});
                    aOff = ta ? lo : lo * K;
                    cP = memory::desc({n, N}, dnnlType(primOut), memory::dims{N, 1});
                    cOff = lo * N;
                } else {
                    wP = memory::desc({K, n}, dnnlType(primOp),
                                      tb ? memory::dims{1, K} : memory::dims{N, 1});
                    wOff = tb ? lo * K : lo;
                    cP = memory::desc({M, n}, dnnlType(primOut), memory::dims{N, 1});
                    cOff = lo;
                    if (hasBias)
                        bP = memory::desc({1, n}, memory::data_type::f32, memory::dims{n, 1});
                    bOff = lo;
                }
            }
            // Along K: partial sums without the bias or the activation (added after).
            primitive_attr plain;
            plain.set_scratchpad_mode(scratchpad_mode::user);
            const bool withBias = hasBias && !alongK;
            matmul::desc d = withBias ? matmul::desc(aP, wP, bP, cP) : matmul::desc(aP, wP, cP);
            matmul::primitive_desc pd(d, alongK ? plain : attr, eng_);
            Prim pr;
            pr.p = matmul(pd);
            const size_t sp = pd.scratchpad_desc().get_size();
            scratch_.emplace_back(new char[sp + 64]);
            pr.args[DNNL_ARG_SCRATCHPAD] =
                memory(pd.scratchpad_desc(), eng_, scratch_.back().get());
            pr.args[DNNL_ARG_SRC] = memory(aP, eng_, static_cast<char*>(aPtr) + aOff * aSize);
            pr.args[DNNL_ARG_WEIGHTS] = memory(wP, eng_, static_cast<char*>(wPtr) + wOff * aSize);
            const int index = static_cast<int>(prims_.size());
            if (!convertHalf) {
                noteBatchSite(in.in[0], BatchSite::Kind::PrimArg, index, DNNL_ARG_SRC,
                              aOff * aSize);
                noteBatchSite(in.in[1], BatchSite::Kind::PrimArg, index, DNNL_ARG_WEIGHTS,
                              wOff * aSize);
            }
            if (withBias)
                pr.args[DNNL_ARG_BIAS] = memory(bP, eng_, static_cast<float*>(biasPtr) + bOff);
            void* dst = alongK && piece > 0
                            ? static_cast<void*>(ins.kPartials[static_cast<size_t>(piece) - 1])
                            : static_cast<void*>(static_cast<char*>(cPtr) + cOff * cSize);
            pr.args[DNNL_ARG_DST] = memory(cP, eng_, dst);
            prims_.push_back(std::move(pr));
        }
        // Pieces that may skip the zeros of x: f32 throughout, on the WorkShare, nothing fused
        // (along K the bias and activation are added after the sums). A forward product only
        // along K, where each thread reads the weight rows it updated: in row pieces every
        // thread reads every weight row, half from the other core, and skipping zeros there was
        // slower in the step (seed MLP, batch 256, TRAINDECK_PROFILE=1, three alternating
        // pairs: 230-236 us against 169-228 for the forward product, even with prefetching).
        // On the AVX2 machine, with rows paired by their zeros (pairRows) and bias and ReLU added
        // per piece, it was even: 293-308 us against 302-308, six alternating pairs.
        if (mayBeSparse) {
            passes_.note(cpu::Pass::SkipZeros);
            SparseProduct sp;
            sp.kernels = sparseKernels;
            sp.grad = grad;
            for (int piece = 0; piece < pieces; ++piece) {
                const int64_t n = split.edges[static_cast<size_t>(piece) + 1] -
                                  split.edges[static_cast<size_t>(piece)];
                SparseProduct::Piece pc;
                if (grad)  // dw rows [lo, lo + n) = x[K, M] columns [lo, lo + n), transposed
                    pc = {K, n, N, M, N, N, 0};
                else  // y (or a partial) = x[:, lo, lo + n) . w[lo, lo + n)
                    pc = {M, n, N, K, N, N, 0, split.edges[static_cast<size_t>(piece)]};
                sp.pieces.push_back(pc);
            }
            ins.sparse = static_cast<int>(sparse_.size());
            sparse_.push_back(std::move(sp));
        }
    } catch (const dnnl::error& e) {
        return err("oneDNN " + what + " (" + dtypeName(opType) + " -> " + dtypeName(outType) +
                   "): " + e.what());
    }
    return Status::success();
}

// A convolution (forward with bias and eltwise post-ops, backward data, backward weights) as a
// oneDNN primitive over channels-last images. The weights go in the layout the primitive
// prefers (`any`): when it differs from the Keras kernel's, a reorder runs before (the kernel
// read) or after (the filter gradient written) on every step. Its two operands are f32, or bf16
// (mixed_bfloat16 where cpuHalfConvolutions holds), with the result in their dtype or f32 and
// the bias in f32.
Status CpuProgram::addConv(const Instr& in, CpuInstr& ins) {
    using namespace dnnl;
    const std::string what = std::string(instrOpName(in.op)) + " %" + std::to_string(in.node);
    // conv2d: (x, k) -> y; conv2d_grad_input: (dy, k) -> dx; conv2d_grad_filter: (x, dy) -> dk.
    const DType opType = in.in[0].dtype, outType = in.out.dtype;
    if ((opType != DType::F32 && opType != DType::BF16) || in.in[1].dtype != opType ||
        (outType != opType && outType != DType::F32))
        return err(what + ": runs with f32 or bf16 operands (the result in theirs or f32), got " +
                   dtypeName(in.in[0].dtype) + " and " + dtypeName(in.in[1].dtype) + " -> " +
                   dtypeName(outType));
    const ConvGeometry& g = in.geometry;
    const Shape x{g.B, g.H, g.W, g.C}, y{g.B, g.OH, g.OW, g.F};
    const Shape k{g.kh, g.kw, g.C / g.groups, g.F};
    const memory::dims strides{g.sh, g.sw}, dilates{g.dh - 1, g.dw - 1}, padL{g.padTop, g.padLeft},
        padR{g.padBottom, g.padRight};
    // The operands in opType; the result (y, dx or dk) in outType.
    const bool filterOut = in.op == InstrOp::Conv2DGradFilter;
    const DType kType = filterOut ? outType : opType;
    const memory::desc xMd = imageDesc(x, opType), yMd = imageDesc(y, opType),
                       kUser = kernelDesc(k, g.groups, kType);
    const memory::desc xOut = imageDesc(x, outType), yOut = imageDesc(y, outType);
    const memory::desc kAny(kUser.dims(), dnnlType(kType), memory::format_tag::any);
    const memory::desc kAnyOp(kUser.dims(), dnnlType(opType), memory::format_tag::any);
    const bool bias = in.op == InstrOp::Conv2D && in.hasBias && in.in.size() == 3;
    if (bias && in.in[2].dtype != DType::F32)
        return err(what + ": a bias in f32, got " + dtypeName(in.in[2].dtype));
    const memory::desc bMd =
        bias ? memory::desc({g.F}, memory::data_type::f32, memory::format_tag::x) : memory::desc();
    primitive_attr attr;
    attr.set_scratchpad_mode(scratchpad_mode::user);
    if (in.op == InstrOp::Conv2D) {
        post_ops po;
        if (!appendActPostOp(po, in.act, in.alpha))
            return err(what + ": activation softmax is not a post-op");
        attr.set_post_ops(po);
    }
    try {
        // The forward (the gradients' hint: the operands' dtype throughout).
        const memory::desc fwdY = in.op == InstrOp::Conv2D ? yOut : yMd;
        const convolution_forward::desc fd =
            bias ? convolution_forward::desc(prop_kind::forward_training,
                                             algorithm::convolution_direct, xMd, kAnyOp, bMd, fwdY,
                                             strides, dilates, padL, padR)
                 : convolution_forward::desc(prop_kind::forward_training,
                                             algorithm::convolution_direct, xMd, kAnyOp, fwdY,
                                             strides, dilates, padL, padR);
        primitive_attr fwdAttr = in.op == InstrOp::Conv2D ? attr : primitive_attr();
        fwdAttr.set_scratchpad_mode(scratchpad_mode::user);
        const convolution_forward::primitive_desc fpd(fd, fwdAttr, eng_);
        Prim pr;
        memory::desc kPrim, scratchMd;
        if (in.op == InstrOp::Conv2D) {
            pr.p = convolution_forward(fpd);
            kPrim = fpd.weights_desc();
            scratchMd = fpd.scratchpad_desc();
        } else if (in.op == InstrOp::Conv2DGradInput) {
            const convolution_backward_data::primitive_desc bpd(
                convolution_backward_data::desc(algorithm::convolution_direct, xOut, kAny, yMd,
                                                strides, dilates, padL, padR),
                attr, eng_, fpd);
            pr.p = convolution_backward_data(bpd);
            kPrim = bpd.weights_desc();
            scratchMd = bpd.scratchpad_desc();
        } else {
            const convolution_backward_weights::primitive_desc bpd(
                convolution_backward_weights::desc(algorithm::convolution_direct, xMd, kAny, yMd,
                                                   strides, dilates, padL, padR),
                attr, eng_, fpd);
            pr.p = convolution_backward_weights(bpd);
            kPrim = bpd.diff_weights_desc();
            scratchMd = bpd.scratchpad_desc();
        }
        pr.args[DNNL_ARG_SCRATCHPAD] = memory(scratchMd, eng_, scratchBytes(scratchMd.get_size()));
        // The kernel operand: the user's buffer, or a copy in the primitive's layout.
        void* kUserPtr = resolve(filterOut ? in.out : in.in[1]);
        memory kUserMem(kUser, eng_, kUserPtr);
        memory kMem = kUserMem;
        if (kPrim != kUser) {
            kMem = memory(kPrim, eng_, scratchBytes(kPrim.get_size()));
            Prim ro;
            ro.p = filterOut ? reorder(kMem, kUserMem) : reorder(kUserMem, kMem);
            ro.args[DNNL_ARG_FROM] = filterOut ? kMem : kUserMem;
            ro.args[DNNL_ARG_TO] = filterOut ? kUserMem : kMem;
            (filterOut ? ins.reorderAfter : ins.reorderBefore) = static_cast<int>(prims_.size());
            prims_.push_back(std::move(ro));
        }
        const int index = static_cast<int>(prims_.size());
        switch (in.op) {
            case InstrOp::Conv2D:
                pr.args[DNNL_ARG_SRC] = memory(xMd, eng_, resolve(in.in[0]));
                pr.args[DNNL_ARG_WEIGHTS] = kMem;
                if (bias) pr.args[DNNL_ARG_BIAS] = memory(bMd, eng_, resolve(in.in[2]));
                pr.args[DNNL_ARG_DST] = memory(yOut, eng_, resolve(in.out));
                noteBatchSite(in.in[0], BatchSite::Kind::PrimArg, index, DNNL_ARG_SRC);
                break;
            case InstrOp::Conv2DGradInput:
                pr.args[DNNL_ARG_DIFF_DST] = memory(yMd, eng_, resolve(in.in[0]));
                pr.args[DNNL_ARG_WEIGHTS] = kMem;
                pr.args[DNNL_ARG_DIFF_SRC] = memory(xOut, eng_, resolve(in.out));
                break;
            default:
                pr.args[DNNL_ARG_SRC] = memory(xMd, eng_, resolve(in.in[0]));
                pr.args[DNNL_ARG_DIFF_DST] = memory(yMd, eng_, resolve(in.in[1]));
                pr.args[DNNL_ARG_DIFF_WEIGHTS] = kMem;
                noteBatchSite(in.in[0], BatchSite::Kind::PrimArg, index, DNNL_ARG_SRC);
                break;
        }
        ins.prim = index;
        prims_.push_back(std::move(pr));
    } catch (const dnnl::error& e) {
        return err("oneDNN " + what + " (x " + shapeToString(x) + ", kernel " + shapeToString(k) +
                   "): " + e.what());
    }
    return Status::success();
}

// Pointers and geometry of the own image and normalization kernels. Every operand is f32
// (insertCasts computes these ops in f32).
Status CpuProgram::setupImageOp(const Instr& in, CpuInstr& ins) {
    const std::string what = std::string(instrOpName(in.op)) + " %" + std::to_string(in.node);
    for (const Operand& o : in.in)
        if (o.dtype != DType::F32)
            return err(what + ": runs in f32, got a " + dtypeName(o.dtype) + " operand");
    if (in.out.dtype != DType::F32) return err(what + ": writes f32 only");
    auto at = [&](size_t i) {
        return i < in.in.size() ? static_cast<const float*>(resolve(in.in[i])) : nullptr;
    };
    ins.epsilon = in.epsilon;
    ins.momentum = in.momentum;
    ins.offset = in.offset;
    ins.batchStats = in.batchStats;
    switch (in.op) {
        case InstrOp::MaxPool:
        case InstrOp::AvgPool:
        case InstrOp::MaxPoolGrad:
        case InstrOp::AvgPoolGrad:
        case InstrOp::Pad2D:
        case InstrOp::Pad2DGrad: {
            const ConvGeometry& g = in.geometry;
            ins.geometry = g;
            if (g.H * g.W * g.C >= (int64_t(1) << 31))
                return err(what + ": an image of " + shapeToString(Shape{g.B, g.H, g.W, g.C}) +
                           " has 2^31 values or more");
            break;
        }
        case InstrOp::Scale:
            ins.rows = 1;
            ins.cols = in.out.elements();
            break;
        case InstrOp::Resize:
        case InstrOp::RandomCrop:
        case InstrOp::RandomFlip:
        case InstrOp::RandomRotation:
        case InstrOp::RandomZoom:
        case InstrOp::RandomTranslation:
        case InstrOp::RandomContrast:
        case InstrOp::RandomBrightness:
            ins.augment = in.augment;
            break;
        case InstrOp::ChannelMean:
        case InstrOp::ChannelVar:
        case InstrOp::LayerNorm:
        case InstrOp::BatchNorm: {
            const Shape& x = in.in[0].shape;
            ins.cols = x.back();
            ins.rows = numElements(x) / ins.cols;
            break;
        }
        case InstrOp::BatchNormGrad:
        case InstrOp::NormGammaGrad:
        case InstrOp::LayerNormGrad:
        case InstrOp::LayerNormGammaGrad: {
            const Shape& x = in.in[1].shape;
            ins.cols = x.back();
            ins.rows = numElements(x) / ins.cols;
            break;
        }
        case InstrOp::MovingAvg:
            ins.cols = in.out.elements();
            if (resolve(in.out) != resolve(in.in[0]))
                return err(what + ": must write the parameter it reads");
            break;
        default:
            break;
    }
    // Operands beyond the first two.
    switch (in.op) {
        case InstrOp::BatchNorm:  // x, mean, var[, gamma][, beta]
            ins.c = at(2);
            ins.d = in.hasGamma ? at(3) : nullptr;
            ins.e = in.hasBeta ? at(3 + (in.hasGamma ? 1 : 0)) : nullptr;
            break;
        case InstrOp::BatchNormGrad:  // dy, x, mean, var[, gamma]
            ins.c = at(2);
            ins.d = at(3);
            ins.e = in.hasGamma ? at(4) : nullptr;
            break;
        case InstrOp::NormGammaGrad:
            ins.c = at(2);
            ins.d = at(3);
            break;
        case InstrOp::LayerNorm:  // x[, gamma][, beta]
            ins.c = in.hasGamma ? at(1) : nullptr;
            ins.d = in.hasBeta ? at(1 + (in.hasGamma ? 1 : 0)) : nullptr;
            break;
        case InstrOp::LayerNormGrad:  // dy, x[, gamma]
            ins.c = in.hasGamma ? at(2) : nullptr;
            break;
        default:
            break;
    }
    return Status::success();
}

Status CpuProgram::build(const LoweredProgram& lp, const ProgramBindings& bind) {
    bind_ = &bind;
    arenaBytes_ = lp.arenaBytes;
    arena_ = std::aligned_alloc(64, std::max<size_t>(64, (arenaBytes_ + 63) / 64 * 64));
    if (!arena_) return err("cannot allocate a " + std::to_string(arenaBytes_) + "-byte arena");
    std::memset(arena_, 0, arenaBytes_);
    ptrs_.assign(lp.values.size(), nullptr);
    for (size_t i = 0; i < lp.values.size(); ++i) ptrs_[i] = resolve(lp.values[i]);
    collectives_ = bind.collectives;

    for (const Instr& in : lp.code) {
        CpuInstr ins;
        ins.op = in.op;
        ins.out = static_cast<float*>(resolve(in.out));
        if (!in.in.empty()) {
            const Operand& a = in.in[0];
            ins.a = static_cast<const float*>(resolve(a));
            ins.rows = a.shape.empty() ? 1 : a.shape[0];
            ins.cols = a.shape.size() >= 2 ? numElements(a.shape) / a.shape[0] : 1;
            if (a.shape.size() == 1) {
                ins.rows = 1;
                ins.cols = a.shape[0];
            }
        }
        if (in.in.size() >= 2) ins.b = resolve(in.in[1]);
        const bool convOp = in.op == InstrOp::Conv2D || in.op == InstrOp::Conv2DGradInput ||
                            in.op == InstrOp::Conv2DGradFilter;
        if (in.op != InstrOp::MatMul && in.op != InstrOp::Dense && !convOp) {
            const int index = static_cast<int>(code_.size());
            if (!in.in.empty()) noteBatchSite(in.in[0], BatchSite::Kind::OperandA, index);
            if (in.in.size() >= 2) noteBatchSite(in.in[1], BatchSite::Kind::OperandB, index);
        }
        ins.act = in.act;
        ins.alpha = in.alpha;
        ins.usesOutput = in.usesOutput;
        ins.loss = in.loss;
        ins.scale = in.scale;
        ins.metric = in.metric;
        ins.k = in.k;
        ins.onLogits = in.onLogits;
        ins.l1 = in.l1;
        ins.l2 = in.l2;
        ins.seed = in.seed;
        ins.rate = in.rate;
        // Bias, its gradient and a softmax on an image work per position: rows of its channels.
        const bool perChannel =
            in.op == InstrOp::BiasAdd || in.op == InstrOp::BiasGrad ||
            ((in.op == InstrOp::Act || in.op == InstrOp::ActGrad) && in.act == ActKind::Softmax) ||
            (in.op == InstrOp::ActGrad && in.out2.space != Space::None);
        if (perChannel && in.in[0].shape.size() > 2) {
            ins.cols = in.in[0].shape.back();
            ins.rows = in.in[0].elements() / ins.cols;
            ins.imageSums = in.op == InstrOp::BiasGrad;
        }
        switch (in.op) {
            case InstrOp::MatMul:
            case InstrOp::Dense:
                TD_RETURN_IF_ERROR(addMatmul(in, ins));
                break;
            case InstrOp::Conv2D:
            case InstrOp::Conv2DGradInput:
            case InstrOp::Conv2DGradFilter:
                TD_RETURN_IF_ERROR(addConv(in, ins));
                break;
            case InstrOp::MaxPool:
            case InstrOp::MaxPoolGrad:
            case InstrOp::AvgPool:
            case InstrOp::AvgPoolGrad:
            case InstrOp::Pad2D:
            case InstrOp::Pad2DGrad:
            case InstrOp::Scale:
            case InstrOp::ChannelMean:
            case InstrOp::ChannelVar:
            case InstrOp::BatchNorm:
            case InstrOp::BatchNormGrad:
            case InstrOp::NormGammaGrad:
            case InstrOp::MovingAvg:
            case InstrOp::LayerNorm:
            case InstrOp::LayerNormGrad:
            case InstrOp::LayerNormGammaGrad:
            case InstrOp::Resize:
            case InstrOp::RandomCrop:
            case InstrOp::RandomFlip:
            case InstrOp::RandomRotation:
            case InstrOp::RandomZoom:
            case InstrOp::RandomTranslation:
            case InstrOp::RandomContrast:
            case InstrOp::RandomBrightness:
                TD_RETURN_IF_ERROR(setupImageOp(in, ins));
                break;
            case InstrOp::Dropout:
            case InstrOp::DropoutGrad:
                ins.alpha = in.rate;
                break;
            case InstrOp::Cast: {
                ConversionPlan cp;
                cp.before.push_back({resolve(in.in[0]), in.in[0].dtype, resolve(in.out),
                                     in.out.dtype, in.out.elements()});
                ins.conversion = static_cast<int>(conversions_.size());
                noteBatchSite(in.in[0], BatchSite::Kind::ConversionSrc, ins.conversion);
                ins.refreshOnly = in.refreshOnly;
                conversions_.push_back(std::move(cp));
                break;
            }
            case InstrOp::LossGrad:
                if (in.dynamicScale) {
                    if (!bind.lossScale.ptr)
                        return err("loss_grad: dynamic scale without lossScale");
                    ins.lossScale = static_cast<LossScaleState*>(bind.lossScale.ptr);
                }
                break;
            case InstrOp::Accumulate:
                ins.acc = static_cast<double*>(resolve(in.out));
                ins.out = nullptr;
                ins.factor = in.factor;
                break;
            case InstrOp::AllReduceStart:
                ins.bucket = in.bucket;
                ins.data = static_cast<float*>(resolve(in.out));
                ins.count = in.out.elements();
                break;
            case InstrOp::AllReduceWait:
                ins.bucket = in.bucket;
                break;
            case InstrOp::Update: {
                TD_ASSERT(lp.update);
                update_ = *lp.update;
                if (updateTensors_.empty())
                    for (const UpdateOperands& u : lp.updateTensors) {
                        UpdateTensor t;
                        t.value = static_cast<float*>(resolve(u.value));
                        t.grad = static_cast<const float*>(resolve(u.grad));
                        t.size = u.value.elements();
                        for (size_t s = 0; s < u.slot.size() && s < 3; ++s)
                            t.slot[s] = static_cast<float*>(resolve(u.slot[s]));
                        if (u.shadow.space == Space::Shadow) {
                            t.shadow = static_cast<uint16_t*>(resolve(u.shadow));
                            t.shadowF16 = u.shadow.dtype == DType::F16;
                        }
                        updateTensors_.push_back(t);
                    }
                ins.update = in.tensor;
                if (lp.lossScaled) lossScale_ = static_cast<LossScaleState*>(bind.lossScale.ptr);
                break;
            }
            default:
                break;
        }
        TD_RETURN_IF_ERROR(planBlock(in, ins));
        code_.push_back(ins);
    }
    if (!blocks_.empty())
        blockScratch_.assign(static_cast<size_t>(5 * kBlockElems + wholeElems_), 0.f);
    int64_t teamSums = 0;
    for (const CpuInstr& ins : code_)
        if (ins.block >= 0 && blocks_[static_cast<size_t>(ins.block)].teamRows)
            teamSums = std::max<int64_t>(teamSums, cpu::kChannelSumBlocks * ins.cols);
    if (teamSums > 0) teamSums_.assign(static_cast<size_t>(teamSums), 0.f);
    // The rewrites (cpu_passes.h), in the order of its table; a pass turned off is skipped.
    using Rewrite = int64_t (CpuProgram::*)(const LoweredProgram&);
    static constexpr std::pair<cpu::Pass, Rewrite> kRewrites[] = {
        {cpu::Pass::NarrowKernel, &CpuProgram::planNarrowKernels},
        {cpu::Pass::ShareNormSums, &CpuProgram::planShareNormSums},
    };
    for (const auto& [pass, rewrite] : kRewrites)
        passes_.run(pass, [&, rewrite = rewrite] { return (this->*rewrite)(lp); });
    if (const char* p = std::getenv("TRAINDECK_PROFILE"); p && *p && std::strcmp(p, "0") != 0) {
        profile_ = true;
        profileSeconds_.assign(code_.size(), 0.0);
        for (size_t k = 0; k < code_.size(); ++k) {
            const CpuInstr& i = code_[k];
            std::string name = std::string(instrOpName(i.op)) + " %" +
                               std::to_string(lp.code[k].node) + " " +
                               shapeToString(lp.code[k].out.shape);
            if (i.pieces > 1) name += ", " + std::to_string(i.pieces) + " pieces";
            if (i.narrow) name += i.shortInner ? ", short kernel" : ", narrow kernel";
            if (!i.kPartials.empty()) name += " along K";
            if (i.block >= 0) name += ", blocks";
            profileNames_.push_back(std::move(name));
        }
    }
    bind_ = nullptr;
    return Status::success();
}

// A product split along K: out += each partial sum, then the bias and the activation, row by row
// while the row is in cache. ReLU inline: calling cpu::activation on the whole output after the
// sums measured about 20 us a step here (seed MLP, batch 32), the whole pass inline 2-3 us.
void CpuProgram::addPartials(const CpuInstr& i) {
    const int64_t rows = i.kRows, cols = i.kCols;
    const size_t parts = i.kPartials.size();
    const auto lastRow = cpu::simd::activeKernels().lastPartialRow;
    // The last partial sum, the bias and ReLU in one pass over each row: the same operations in
    // the same order as one pass each.
    for (int64_t r = 0; r < rows; ++r) {
        float* const o = i.out + r * cols;
        for (size_t q = 0; q + 1 < parts; ++q) {
            const float* const p = i.kPartials[q] + r * cols;
#pragma omp simd
            for (int64_t c = 0; c < cols; ++c) o[c] += p[c];
        }
        lastRow(o, i.kPartials[parts - 1] + r * cols, i.kBias, i.act == ActKind::Relu, cols);
    }
    if (i.act != ActKind::Linear && i.act != ActKind::Relu)
        cpu::activation(i.act, i.alpha, i.out, i.out, rows, cols);
}

// See SparseProduct. One thread of a 2-core AVX-512 machine (AMD Zen 5), [32,392]x[392,128] with
// the batch at stride 784 and its weight gradient, against oneDNN, by the share of the dense work
// listed (random zeros): 70% 1.10x and 1.14x, 75% 1.05x and 1.10x, 80% 0.90x and 1.09x, 84%
// 0.95x and 0.98x; at batch 256: 70% 1.11x and 1.08x, 75% 1.03x and 1.01x, 80% 0.95x and 1.02x.
// Fashion-MNIST batches (46% nonzero pixels) list 59-61% and 51%: 1.20-1.23x and 1.40-1.49x.
// The listed work runs 1.1-1.3 times x's share of nonzeros (random zeros pair worse than an
// image's), so up to 60% nonzeros the kernel lists about 75% or less.
constexpr double kSparseMaxNonzero = 0.60;
constexpr int64_t kSparseSampleRows = 8;
constexpr int64_t kSparseSampleStride = 4;  // every 4th value of a sampled row

// Whether a run skips zeros, judged on the run's own input: x's nonzeros at every
// kSparseSampleStride-th value of kSparseSampleRows of its rows, spread over them (a fraction of
// a microsecond for the seed MLP's products). The choice changes the order of the
// additions, so the result's bits; made from the batch itself, it is the same whenever the same
// batch comes, a resumed run's included, and never depends on the runs before.
bool CpuProgram::sparseRun(const CpuInstr& i) {
    if (i.sparse < 0) return false;
    const SparseProduct& sp = sparse_[static_cast<size_t>(i.sparse)];
    const SparseProduct::Piece& first = sp.pieces.front();
    // Piece 0's x is the whole product's (its first column, or its first row of K).
    const auto* x = static_cast<const float*>(
        prims_[static_cast<size_t>(i.prim)].args.at(DNNL_ARG_SRC).get_data_handle());
    int64_t cols = 0;
    for (const SparseProduct::Piece& pc : sp.pieces) cols += pc.inner;
    const int64_t every = std::max<int64_t>(1, first.rows / kSparseSampleRows);
    int64_t nonzero = 0, seen = 0;
    for (int64_t r = 0; r < first.rows; r += every) {
        const float* row = x + r * first.ldx;
        for (int64_t k = 0; k < cols; k += kSparseSampleStride) nonzero += row[k] != 0.0f;
        seen += (cols + kSparseSampleStride - 1) / kSparseSampleStride;
    }
    return static_cast<double>(nonzero) <= kSparseMaxNonzero * static_cast<double>(seen);
}

void CpuProgram::runSparsePiece(const CpuInstr& i, int64_t piece) {
    SparseProduct& sp = sparse_[static_cast<size_t>(i.sparse)];
    SparseProduct::Piece& pc = sp.pieces[static_cast<size_t>(piece)];
    Prim& pp = prims_[static_cast<size_t>(i.prim + piece)];
    const auto* x = static_cast<const float*>(pp.args.at(DNNL_ARG_SRC).get_data_handle());
    const auto* w = static_cast<const float*>(pp.args.at(DNNL_ARG_WEIGHTS).get_data_handle());
    auto* y = static_cast<float*>(pp.args.at(DNNL_ARG_DST).get_data_handle());
    if (!sp.grad) {  // along K: the piece's columns of x and rows of w, from piece 0's operands
        Prim& p0 = prims_[static_cast<size_t>(i.prim)];
        x = static_cast<const float*>(p0.args.at(DNNL_ARG_SRC).get_data_handle()) + pc.first;
        w = static_cast<const float*>(p0.args.at(DNNL_ARG_WEIGHTS).get_data_handle()) +
            pc.first * pc.cols;
    }
    const cpu::sparse::Kernels& k = *sp.kernels;
    pc.listed =
        sp.grad
            ? k.transposedTimesDense(x, pc.ldx, pc.rows, pc.inner, w, pc.ldw, pc.cols, y, pc.ldy)
            : k.rowsTimesDense(x, pc.ldx, pc.rows, pc.inner, w, pc.ldw, pc.cols, y, pc.ldy);
}

// After the pieces (the WorkShare's run has joined them): the share of the dense work the kernel
// listed, for the profile.
void CpuProgram::noteSparseRun(const CpuInstr& i) {
    SparseProduct& sp = sparse_[static_cast<size_t>(i.sparse)];
    int64_t listed = 0, dense = 0;
    for (const SparseProduct::Piece& pc : sp.pieces) {
        listed += pc.listed;
        const int64_t g = sp.grad ? sp.kernels->colsGroup : sp.kernels->rowsGroup;
        dense += sp.grad ? (pc.inner + g - 1) / g * pc.rows : (pc.rows + g - 1) / g * pc.inner;
    }
    sp.work = dense > 0 ? static_cast<double>(listed) / static_cast<double>(dense) : 1.0;
    ++sp.sparseRuns;
}

void CpuProgram::printProfile() const {
    if (!profile_ || profileRuns_ < 10) return;
    double total = 0;
    for (double t : profileSeconds_) total += t;
    const auto timedRuns = static_cast<double>(profileRuns_ - 1);  // the first is not timed
    const bool split =
        std::any_of(code_.begin(), code_.end(), [](const CpuInstr& i) { return i.pieces > 1; });
    std::fprintf(stderr,
                 "profile: %zu instructions, %lld runs, %.1f us per run (the first untimed)%s\n",
                 code_.size(), static_cast<long long>(profileRuns_), total / timedRuns * 1e6,
                 teamPieces_ && split  ? " (weight gradients in pieces on the OpenMP team)"
                 : !share_             ? ""
                 : share_->width() > 1 ? " (products and update shared with the WorkShare)"
                 : split               ? " (products and update in pieces on one thread)"
                                       : "");
    for (size_t k = 0; k < code_.size(); ++k) {
        std::fprintf(stderr, "  %3zu  %-48s %9.1f us  %5.1f%%\n", k, profileNames_[k].c_str(),
                     profileSeconds_[k] / timedRuns * 1e6,
                     total > 0 ? 100.0 * profileSeconds_[k] / total : 0.0);
        if (code_[k].sparse >= 0) {
            const SparseProduct& sp = sparse_[static_cast<size_t>(code_[k].sparse)];
            std::fprintf(stderr, "        skipped zeros in %lld of %lld runs",
                         static_cast<long long>(sp.sparseRuns),
                         static_cast<long long>(profileRuns_));
            if (sp.sparseRuns > 0)
                std::fprintf(stderr, " (last: %.0f%% of the dense work)", 100.0 * sp.work);
            if (!sp.grad && sp.pieces.size() == 2)
                std::fprintf(stderr, ", pieces along K split at %lld of %lld",
                             static_cast<long long>(sp.pieces[1].first),
                             static_cast<long long>(sp.pieces[0].inner + sp.pieces[1].inner));
            std::fprintf(stderr, "\n");
        }
    }
}

// Which instructions run in block mode, and how: one with a 16-bit operand, a fused dropout mask
// or a fused bias gradient. Losses, metrics and regularization read their operands whole (they
// reduce over everything), so their block is every row.
Status CpuProgram::planBlock(const Instr& in, CpuInstr& ins) {
    if (!hasBlockForm(in.op)) return Status::success();
    bool any16 = is16(in.out.dtype) || (in.out2.space != Space::None && is16(in.out2.dtype));
    for (const Operand& o : in.in) any16 = any16 || is16(o.dtype);
    const bool fusedMask = (in.op == InstrOp::Act || in.op == InstrOp::ActGrad) && in.rate > 0;
    const bool fusedSums = in.out2.space != Space::None;
    if (!any16 && !fusedMask && !fusedSums) return Status::success();
    const std::string what = std::string(instrOpName(in.op)) + " %" + std::to_string(in.node);
    BlockPlan bp;
    const Operand& a = in.in.at(0);
    const int64_t rows = ins.rows, cols = ins.cols;
    const bool whole = in.op == InstrOp::Loss || in.op == InstrOp::Metric ||
                       in.op == InstrOp::RegLoss || in.op == InstrOp::RegGrad;
    if (whole && rows * cols > 64 * kBlockElems && any16)
        return err(what + ": 16-bit operands of " + std::to_string(rows * cols) +
                   " elements are more than a reduction converts at once");
    bp.blockRows = whole ? rows : std::max<int64_t>(1, kBlockElems / std::max<int64_t>(1, cols));
    if (cols > kBlockElems && !whole)
        return err(what + ": rows of " + std::to_string(cols) + " values exceed the block of " +
                   std::to_string(kBlockElems));
    // How far an operand advances per row: a [rows, cols] value by a row, class ids [rows] by
    // one, a bias (or any other operand read whole by every row) not at all.
    enum class Rows { Full, Ids, Broadcast };
    auto operand = [&](const Operand& o, Rows kind) {
        BlockOperand b;
        b.ptr = resolve(o);
        b.dtype = o.dtype;
        b.rowElems = kind == Rows::Full  ? o.elements() / std::max<int64_t>(1, rows)
                     : kind == Rows::Ids ? 1
                                         : 0;
        return b;
    };
    bp.inputs = static_cast<int>(in.in.size());
    bp.in[0] = operand(a, Rows::Full);
    if (in.in.size() >= 2) {
        const bool labels =
            in.op == InstrOp::LossGrad || in.op == InstrOp::Loss || in.op == InstrOp::Metric;
        const Operand& b = in.in[1];
        bp.in[1] = operand(b, in.op == InstrOp::BiasAdd         ? Rows::Broadcast
                              : labels && b.dtype == DType::I32 ? Rows::Ids
                                                                : Rows::Full);
        bp.floatB = !labels;
    }
    if (in.op == InstrOp::BiasGrad) {
        bp.outIsSums = true;
        bp.out2 = operand(in.out, Rows::Broadcast);
    } else {
        const bool scalar =
            in.op == InstrOp::Loss || in.op == InstrOp::Metric || in.op == InstrOp::RegLoss;
        bp.out = operand(in.out, scalar ? Rows::Broadcast : Rows::Full);
        if (fusedSums) bp.out2 = operand(in.out2, Rows::Broadcast);
    }
    bp.whole = whole;
    bp.teamRows = in.op == InstrOp::ActGrad && fusedSums && !fusedMask && a.shape.size() > 2;
    bp.reluSums = bp.teamRows && in.act == ActKind::Relu && bp.in[0].dtype == DType::F32 &&
                  in.in.size() == 2 && bp.in[1].dtype == DType::F32 &&
                  (bp.out.dtype == DType::F32 || bp.out.dtype == DType::BF16) &&
                  bp.out2.dtype == DType::F32;
    if (whole) wholeElems_ = std::max(wholeElems_, 3 * rows * cols);
    if (in.op == InstrOp::Act && fusedMask) ins.rate = in.rate;
    ins.block = static_cast<int>(blocks_.size());
    for (size_t k = 0; k < in.in.size() && k < 2; ++k)
        noteBatchSite(in.in[k], BatchSite::Kind::BlockIn, ins.block, static_cast<int>(k));
    blocks_.push_back(bp);
    return Status::success();
}

// A narrow product on a thread of its own (a program on one thread, or with a WorkShare, whose
// callers run one thread each): the narrow kernel instead of its primitive, for a Dense without
// an activation or with ReLU (run after it, as the post-op would). A product with few terms in
// each sum and B transposed, a narrow layer's input gradient ([M, classes] x [K, classes]^T): the
// short kernel, on a thread of its own as well. Whole f32 products only; the primitive's
// arguments still say where the operands are.
int64_t CpuProgram::planNarrowKernels(const LoweredProgram& lp) {
    const cpu::sparse::Kernels* kernels = cpu::sparse::active();
    if (!kernels || !(share_ || updateThreads_ <= 1)) return 0;
    int64_t changed = 0;
    for (size_t j = 0; j < code_.size(); ++j) {
        CpuInstr& ins = code_[j];
        const Instr& in = lp.code[j];
        if ((in.op != InstrOp::MatMul && in.op != InstrOp::Dense) || ins.pieces != 1 ||
            ins.conversion >= 0 || in.in[0].dtype != DType::F32 || in.out.dtype != DType::F32)
            continue;
        const bool ta = in.transA, tb = in.transB;
        const int64_t M = in.out.shape[0], N = in.out.shape[1];
        const int64_t K = ta ? in.in[0].shape[0] : in.in[0].shape[1];
        if (!tb && N <= kernels->narrowMaxCols &&
            (in.op == InstrOp::MatMul || in.act == ActKind::Linear || in.act == ActKind::Relu)) {
            ins.narrowSr = ta ? 1 : K;
            ins.narrowSk = ta ? M : 1;
        } else if (tb && !ta && in.op == InstrOp::MatMul && K <= kernels->shortMaxInner) {
            ins.shortInner = true;
        } else {
            continue;
        }
        ins.narrow = kernels;
        ins.narrowM = M;
        ins.narrowK = K;
        ins.narrowN = N;
        ++changed;
    }
    return changed;
}

// A BatchNormalization trained on batch statistics already sums dy and dy * x_hat per channel for
// its input gradient: these are its beta and gamma gradients. The norm_gamma_grad reading the
// same dy, x, mean and var, and the bias_grad of the same dy (f32, not in block mode), copy them
// instead of reading dy and x again, where they read the same values: the same buffers, which no
// instruction from the batch_norm_grad on writes before they read them (the arena reuses a dead
// value's bytes, e.g. an act_grad written over its dy).
int64_t CpuProgram::planShareNormSums(const LoweredProgram& lp) {
    // Whether an instruction in [from, to) writes any of the bytes of operand o.
    auto writtenBetween = [&](size_t from, size_t to, const Operand& o) {
        const auto* lo = static_cast<const char*>(resolve(o));
        const char* hi = lo + o.bytes();
        for (size_t m = from; m < to; ++m)
            for (const Operand* w : {&lp.code[m].out, &lp.code[m].out2}) {
                if (w->space == Space::None) continue;
                const auto* wlo = static_cast<const char*>(resolve(*w));
                if (wlo < hi && lo < wlo + w->bytes()) return true;
            }
        return false;
    };
    int64_t changed = 0;
    for (size_t j = 0; j < code_.size(); ++j) {
        CpuInstr& bn = code_[j];
        if (bn.op != InstrOp::BatchNormGrad || !bn.batchStats) continue;
        const auto slot = static_cast<int>(normSums_.size());
        bool used = false;
        for (size_t k = j + 1; k < code_.size(); ++k) {
            CpuInstr& o = code_[k];
            const Instr& in = lp.code[k];
            const bool gamma = o.op == InstrOp::NormGammaGrad && o.a == bn.a && o.b == bn.b &&
                               o.c == bn.c && o.d == bn.d && o.epsilon == bn.epsilon;
            const bool beta = o.op == InstrOp::BiasGrad && o.imageSums && o.block < 0 &&
                              o.a == bn.a && in.in[0].dtype == DType::F32;
            if (!(gamma || beta) || o.rows != bn.rows || o.cols != bn.cols || o.normSums >= 0)
                continue;
            bool rewritten = false;
            for (size_t operand = 0; operand < (gamma ? 4u : 1u); ++operand)
                rewritten = rewritten || writtenBetween(j, k, lp.code[j].in[operand]);
            if (rewritten) continue;
            o.normSums = slot;
            used = true;
            ++changed;
        }
        if (!used) continue;
        bn.normSums = slot;
        normSums_.emplace_back(static_cast<size_t>(2 * bn.cols), 0.f);
    }
    return changed;
}

void CpuProgram::runBlock(const CpuInstr& i, const StepArgs& args) {
    const BlockPlan& bp = blocks_[static_cast<size_t>(i.block)];
    const int64_t rows = i.rows, cols = i.cols;
    // Four block buffers, the column sums, then (reductions) three whole-operand buffers.
    float* scratch = blockScratch_.data();
    float* sums = scratch + 4 * kBlockElems;
    float* wholeBuf[4];
    for (int k = 0; k < 4; ++k)
        wholeBuf[k] =
            bp.whole ? sums + kBlockElems + k % 3 * rows * cols : scratch + k * kBlockElems;
    // The f32 view of rows [r0, r0 + n) of an operand: the operand itself, or converted into dst.
    auto load = [&](const BlockOperand& o, int64_t r0, int64_t n, float* dst) -> const float* {
        const int64_t first = r0 * o.rowElems;
        const int64_t count = o.rowElems ? n * o.rowElems : cols;
        if (o.dtype == DType::F32) return static_cast<const float*>(o.ptr) + first;
        const auto* src = static_cast<const uint16_t*>(o.ptr) + first;
        if (o.dtype == DType::BF16)
            castBf16ToF32(src, dst, count);
        else
            castF16ToF32(src, dst, count);
        return dst;
    };
    auto store = [&](const BlockOperand& o, int64_t r0, const float* src, int64_t count) {
        auto* dst = static_cast<uint16_t*>(const_cast<void*>(o.ptr)) + r0 * o.rowElems;
        if (o.dtype == DType::BF16)
            castF32ToBf16(src, dst, count);
        else
            castF32ToF16(src, dst, count);
    };
    const bool scalarOut =
        i.op == InstrOp::Loss || i.op == InstrOp::Metric || i.op == InstrOp::RegLoss;
    // Column sums (bias gradient): accumulated row by row in order, as biasGrad does.
    float* acc = nullptr;
    if (bp.out2.ptr) {
        acc = bp.out2.dtype == DType::F32 ? static_cast<float*>(const_cast<void*>(bp.out2.ptr))
                                          : sums;
        std::memset(acc, 0, static_cast<size_t>(cols) * sizeof(float));
    }
    // Rows [r0, r0 + n) through the four block buffers `buf`; adds them row by row to the column
    // sums `sumsTo` (null: none).
    auto runRows = [&](int64_t r0, int64_t n, float* const* buf, float* sumsTo) {
        const float* a = load(bp.in[0], r0, n, buf[0]);
        const void* b = nullptr;
        if (bp.inputs >= 2) {
            if (bp.floatB) {
                b = load(bp.in[1], r0, n, buf[1]);
            } else {
                const BlockOperand& o = bp.in[1];
                b = static_cast<const char*>(o.ptr) +
                    static_cast<size_t>(r0 * o.rowElems) * dtypeSize(o.dtype);
            }
        }
        float* out = nullptr;
        if (scalarOut)
            out = i.out;
        else if (!bp.outIsSums)
            out = bp.out.dtype == DType::F32
                      ? static_cast<float*>(const_cast<void*>(bp.out.ptr)) + r0 * bp.out.rowElems
                      : buf[2];
        const float* fb = static_cast<const float*>(b);
        switch (i.op) {
            case InstrOp::BiasAdd:
                cpu::biasAdd(a, fb, out, n, cols);
                break;
            case InstrOp::Act:
                cpu::activation(i.act, i.alpha, a, out, n, cols);
                if (i.rate > 0)
                    cpu::dropout(out, out, n, cols, i.rate, i.seed, args.step,
                                 args.sampleBase + r0);
                break;
            case InstrOp::ActGrad: {
                const float* dy = a;
                if (i.rate > 0) {
                    cpu::dropout(a, buf[3], n, cols, i.rate, i.seed, args.step,
                                 args.sampleBase + r0);
                    dy = buf[3];
                }
                cpu::activationGrad(i.act, i.alpha, i.usesOutput, dy, fb, out, n, cols);
                break;
            }
            case InstrOp::Dropout:
            case InstrOp::DropoutGrad:
                cpu::dropout(a, out, n, cols, i.alpha, i.seed, args.step, args.sampleBase + r0);
                break;
            case InstrOp::Add:
                cpu::add(a, fb, out, n * cols);
                break;
            case InstrOp::LossGrad: {
                const float sc = i.lossScale ? i.scale * i.lossScale->scale : i.scale;
                cpu::lossGrad(i.loss, a, b, out, n, cols, sc);
                break;
            }
            case InstrOp::Loss:
                cpu::loss(i.loss, a, b, out, n, cols, i.scale);
                break;
            case InstrOp::Metric:
                cpu::metric(i.metric, i.k, i.onLogits, a, b, out, n, cols);
                break;
            case InstrOp::RegLoss:
                cpu::regLoss(a, n * cols, i.l1, i.l2, out);
                break;
            case InstrOp::RegGrad:
                cpu::regGrad(a, fb, out, n * cols, i.l1, i.l2);
                break;
            case InstrOp::BiasGrad:
                break;
            default:
                TD_ASSERT_MSG(false, "instruction without a block form");
        }
        if (sumsTo) {
            const float* src = bp.outIsSums ? a : out;
            for (int64_t r = 0; r < n; ++r) {
                const float* g = src + r * cols;
#pragma omp simd
                for (int64_t c = 0; c < cols; ++c) sumsTo[c] += g[c];
            }
        }
        if (!bp.outIsSums && !scalarOut && bp.out.dtype != DType::F32)
            store(bp.out, r0, out, bp.out.rowElems ? n * bp.out.rowElems : cols);
    };
    if (bp.teamRows) {
        const auto reluSums = cpu::simd::activeKernels().reluGradSums;
        const int64_t pieces = std::min(cpu::kChannelSumBlocks, rows);
        float* partial = teamSums_.data();
        // Sized on the thread that runs the step (its team may differ from the compiling one's).
        const auto need = static_cast<size_t>(omp_get_max_threads() * 4 * kBlockElems);
        if (!bp.reluSums && teamScratch_.size() < need) teamScratch_.resize(need);
#pragma omp parallel for schedule(static) if (rows * cols > kTeamRowsMin)
        for (int64_t piece = 0; piece < pieces; ++piece) {
            float* pieceSums = acc ? partial + piece * cols : nullptr;
            if (pieceSums) std::memset(pieceSums, 0, static_cast<size_t>(cols) * sizeof(float));
            const int64_t r1 = rows * (piece + 1) / pieces;
            if (bp.reluSums) {
                const int64_t r0 = rows * piece / pieces, at = r0 * cols;
                const bool f32 = bp.out.dtype == DType::F32;
                void* out = const_cast<void*>(bp.out.ptr);
                reluSums(static_cast<const float*>(bp.in[0].ptr) + at,
                         static_cast<const float*>(bp.in[1].ptr) + at,
                         f32 ? static_cast<float*>(out) + at : nullptr,
                         f32 ? nullptr : static_cast<uint16_t*>(out) + at, pieceSums, r1 - r0,
                         cols);
                continue;
            }
            float* own = teamScratch_.data() + omp_get_thread_num() * 4 * kBlockElems;
            float* buf[4] = {own, own + kBlockElems, own + 2 * kBlockElems, own + 3 * kBlockElems};
            for (int64_t r0 = rows * piece / pieces; r0 < r1; r0 += bp.blockRows)
                runRows(r0, std::min(bp.blockRows, r1 - r0), buf, pieceSums);
        }
        if (acc) cpu::addPieceSums(partial, pieces, cols, acc);
    } else {
        for (int64_t r0 = 0; r0 < rows; r0 += bp.blockRows)
            runRows(r0, std::min(bp.blockRows, rows - r0), wholeBuf, acc);
    }
    if (acc && bp.out2.dtype != DType::F32) store(bp.out2, 0, acc, cols);
}

Status CpuProgram::run(const StepArgs& args) {
    for (size_t k = 0; k < code_.size(); ++k) TD_RETURN_IF_ERROR(execTimed(k, args));
    if (profile_) ++profileRuns_;
    return Status::success();
}

// A whole product: its primitive, or the narrow kernel on the operands the primitive's arguments
// hold (rebindBatch moves those with the batch), then a Dense's ReLU as its post-op would.
void CpuProgram::runProduct(const CpuInstr& i, dnnl::stream& s) {
    Prim& pr = prims_[static_cast<size_t>(i.prim)];
    if (!i.narrow) {
        pr.p.execute(s, pr.args);
        return;
    }
    auto at = [&pr](int arg) { return static_cast<float*>(pr.args.at(arg).get_data_handle()); };
    float* c = at(DNNL_ARG_DST);
    if (i.shortInner) {
        i.narrow->shortProduct(at(DNNL_ARG_SRC), i.narrowK, i.narrowM, i.narrowK,
                               at(DNNL_ARG_WEIGHTS), i.narrowK, i.narrowN, c, i.narrowN);
        return;
    }
    const auto bias = pr.args.find(DNNL_ARG_BIAS);
    i.narrow->narrowProduct(
        at(DNNL_ARG_SRC), i.narrowSr, i.narrowSk, i.narrowM, i.narrowK, at(DNNL_ARG_WEIGHTS),
        i.narrowN, i.narrowN,
        bias == pr.args.end() ? nullptr : static_cast<const float*>(bias->second.get_data_handle()),
        c, i.narrowN);
    if (i.op == InstrOp::Dense && i.act == ActKind::Relu)
        cpu::activation(ActKind::Relu, 0, c, c, i.narrowM, i.narrowN);
}

// Instruction k, timed under TRAINDECK_PROFILE. The first run is not timed: oneDNN generates its
// kernels when a primitive first runs (the first f32 product of a process took about 15 ms
// here), which would land on whichever instruction runs one first.
Status CpuProgram::execTimed(size_t k, const StepArgs& args) {
    if (!profile_) return exec(code_[k], args);
    using ProfileClock = std::chrono::steady_clock;
    const auto t0 = ProfileClock::now();
    TD_RETURN_IF_ERROR(exec(code_[k], args));
    if (profileRuns_ > 0)
        profileSeconds_[k] += std::chrono::duration<double>(ProfileClock::now() - t0).count();
    return Status::success();
}

Status CpuProgram::exec(const CpuInstr& i, const StepArgs& args) {
    if (i.block >= 0) {
        runBlock(i, args);
        return Status::success();
    }
    switch (i.op) {
        case InstrOp::MatMul:
        case InstrOp::Dense: {
            const ConversionPlan* cp =
                i.conversion >= 0 ? &conversions_[static_cast<size_t>(i.conversion)] : nullptr;
            if (cp)
                for (const Conversion& c : cp->before) convert(c, nullptr, 0);
            try {
                if (i.pieces == 1) {
                    runProduct(i, strm_);
                } else {
                    std::atomic<bool> failed{false};
                    std::string failure;
                    const bool sparse = sparseRun(i);
                    runPieces(i.pieces, [&](int64_t piece, int worker) {
                        Prim& pp = prims_[static_cast<size_t>(i.prim + piece)];
                        try {
                            if (sparse)
                                runSparsePiece(i, piece);
                            else
                                pp.p.execute(workerStream(worker), pp.args);
                        } catch (const dnnl::error& e) {
                            if (!failed.exchange(true)) failure = e.what();
                            return;
                        }
                    });
                    if (failed.load()) return err("oneDNN matmul: " + failure);
                    if (sparse) noteSparseRun(i);
                    if (!i.kPartials.empty()) addPartials(i);
                }
            } catch (const dnnl::error& e) {
                return err(std::string("oneDNN matmul: ") + e.what());
            }
            if (cp)
                for (const Conversion& c : cp->after) convert(c, nullptr, 0);
            break;
        }
        case InstrOp::Conv2D:
        case InstrOp::Conv2DGradInput:
        case InstrOp::Conv2DGradFilter: {
            try {
                if (i.reorderBefore >= 0) {
                    Prim& ro = prims_[static_cast<size_t>(i.reorderBefore)];
                    ro.p.execute(strm_, ro.args);
                }
                Prim& pr = prims_[static_cast<size_t>(i.prim)];
                pr.p.execute(strm_, pr.args);
                if (i.reorderAfter >= 0) {
                    Prim& ro = prims_[static_cast<size_t>(i.reorderAfter)];
                    ro.p.execute(strm_, ro.args);
                }
            } catch (const dnnl::error& e) {
                return err(std::string("oneDNN ") + instrOpName(i.op) + ": " + e.what());
            }
            break;
        }
        case InstrOp::MaxPool:
            cpu::maxPool(i.geometry, i.a, i.out);
            break;
        case InstrOp::MaxPoolGrad:
            cpu::maxPoolGrad(i.geometry, i.a, static_cast<const float*>(i.b), i.out);
            break;
        case InstrOp::AvgPool:
            cpu::avgPool(i.geometry, i.a, i.out);
            break;
        case InstrOp::AvgPoolGrad:
            cpu::avgPoolGrad(i.geometry, i.a, i.out);
            break;
        case InstrOp::Pad2D: {
            const ConvGeometry& g = i.geometry;
            cpu::pad2d(i.a, i.out, g.B, g.H, g.W, g.C, g.padTop, g.padBottom, g.padLeft,
                       g.padRight);
            break;
        }
        case InstrOp::Pad2DGrad: {
            const ConvGeometry& g = i.geometry;
            cpu::pad2dGrad(i.a, i.out, g.B, g.H, g.W, g.C, g.padTop, g.padBottom, g.padLeft,
                           g.padRight);
            break;
        }
        case InstrOp::Scale:
            cpu::scale(i.a, i.out, i.cols, i.scale, i.offset);
            break;
        case InstrOp::ChannelMean:
            cpu::channelMean(i.a, i.out, i.rows, i.cols);
            break;
        case InstrOp::ChannelVar:
            cpu::channelVar(i.a, static_cast<const float*>(i.b), i.out, i.rows, i.cols);
            break;
        case InstrOp::BatchNorm:
            cpu::batchNorm(i.a, static_cast<const float*>(i.b), i.c, i.d, i.e, i.out, i.rows,
                           i.cols, i.epsilon);
            break;
        case InstrOp::BatchNormGrad: {
            float* sums =
                i.normSums >= 0 ? normSums_[static_cast<size_t>(i.normSums)].data() : nullptr;
            cpu::batchNormGrad(i.a, static_cast<const float*>(i.b), i.c, i.d, i.e, i.out, i.rows,
                               i.cols, i.epsilon, i.batchStats, sums,
                               sums ? sums + i.cols : nullptr);
            break;
        }
        case InstrOp::NormGammaGrad:
            if (i.normSums >= 0)
                std::memcpy(i.out, normSums_[static_cast<size_t>(i.normSums)].data() + i.cols,
                            static_cast<size_t>(i.cols) * sizeof(float));
            else
                cpu::normGammaGrad(i.a, static_cast<const float*>(i.b), i.c, i.d, i.out, i.rows,
                                   i.cols, i.epsilon);
            break;
        case InstrOp::MovingAvg:
            cpu::movingAvg(i.out, static_cast<const float*>(i.b), i.cols, i.momentum);
            break;
        case InstrOp::LayerNorm:
            cpu::layerNorm(i.a, i.c, i.d, i.out, i.rows, i.cols, i.epsilon);
            break;
        case InstrOp::LayerNormGrad:
            cpu::layerNormGrad(i.a, static_cast<const float*>(i.b), i.c, i.out, i.rows, i.cols,
                               i.epsilon);
            break;
        case InstrOp::LayerNormGammaGrad:
            cpu::layerNormGammaGrad(i.a, static_cast<const float*>(i.b), i.out, i.rows, i.cols,
                                    i.epsilon);
            break;
        case InstrOp::Resize:
            cpu::resize(i.augment, i.a, i.out);
            break;
        case InstrOp::RandomCrop:
            cpu::randomCrop(i.augment, i.a, i.out, args.step, args.sampleBase);
            break;
        case InstrOp::RandomFlip:
            cpu::randomFlip(i.augment, i.a, i.out, args.step, args.sampleBase);
            break;
        case InstrOp::RandomRotation:
            cpu::randomRotation(i.augment, i.a, i.out, args.step, args.sampleBase);
            break;
        case InstrOp::RandomZoom:
            cpu::randomZoom(i.augment, i.a, i.out, args.step, args.sampleBase);
            break;
        case InstrOp::RandomTranslation:
            cpu::randomTranslation(i.augment, i.a, i.out, args.step, args.sampleBase);
            break;
        case InstrOp::RandomContrast:
            cpu::randomContrast(i.augment, i.a, i.out, args.step, args.sampleBase);
            break;
        case InstrOp::RandomBrightness:
            cpu::randomBrightness(i.augment, i.a, i.out, args.step, args.sampleBase);
            break;
        case InstrOp::Cast: {
            if (i.refreshOnly && !args.refreshShadows) break;
            float tmp[1024];
            for (const Conversion& c : conversions_[static_cast<size_t>(i.conversion)].before)
                convert(c, tmp, 1024);
            break;
        }
        case InstrOp::BiasAdd:
            cpu::biasAdd(i.a, static_cast<const float*>(i.b), i.out, i.rows, i.cols);
            break;
        case InstrOp::Act:
            cpu::activation(i.act, i.alpha, i.a, i.out, i.rows, i.cols);
            break;
        case InstrOp::ActGrad:
            cpu::activationGrad(i.act, i.alpha, i.usesOutput, i.a, static_cast<const float*>(i.b),
                                i.out, i.rows, i.cols);
            break;
        case InstrOp::Dropout:
        case InstrOp::DropoutGrad:
            cpu::dropout(i.a, i.out, i.rows, i.cols, i.alpha, i.seed, args.step, args.sampleBase);
            break;
        case InstrOp::Loss:
            cpu::loss(i.loss, i.a, i.b, i.out, i.rows, i.cols, i.scale);
            break;
        case InstrOp::LossGrad: {
            const float scale = i.lossScale ? i.scale * i.lossScale->scale : i.scale;
            cpu::lossGrad(i.loss, i.a, i.b, i.out, i.rows, i.cols, scale);
            break;
        }
        case InstrOp::Metric:
            cpu::metric(i.metric, i.k, i.onLogits, i.a, i.b, i.out, i.rows, i.cols);
            break;
        case InstrOp::RegLoss:
            cpu::regLoss(i.a, i.rows * i.cols, i.l1, i.l2, i.out);
            break;
        case InstrOp::RegGrad:
            cpu::regGrad(i.a, static_cast<const float*>(i.b), i.out, i.rows * i.cols, i.l1, i.l2);
            break;
        case InstrOp::BiasGrad:
            if (i.normSums >= 0)
                std::memcpy(i.out, normSums_[static_cast<size_t>(i.normSums)].data(),
                            static_cast<size_t>(i.cols) * sizeof(float));
            else if (i.imageSums)
                cpu::channelSums(i.a, i.out, i.rows, i.cols);
            else
                cpu::biasGrad(i.a, i.out, i.rows, i.cols);
            break;
        case InstrOp::Add:
            cpu::add(i.a, static_cast<const float*>(i.b), i.out, i.rows * i.cols);
            break;
        case InstrOp::Accumulate:
            *i.acc += static_cast<double>(i.a[0]) * i.factor;
            break;
        case InstrOp::AllReduceStart: {
            Status s = collectives_->allReduceStart(i.bucket, i.data, i.count);
            if (!s.ok()) return err(s.error());
            break;
        }
        case InstrOp::AllReduceWait: {
            Status s = collectives_->allReduceWait(i.bucket);
            if (!s.ok()) return err(s.error());
            break;
        }
        case InstrOp::Update:
            if (i.update >= 0)
                applyUpdate(update_, args.update,
                            std::span<const UpdateTensor>(
                                &updateTensors_[static_cast<size_t>(i.update)], 1),
                            updateThreads_, nullptr, share_);
            else
                applyUpdate(update_, args.update, updateTensors_, updateThreads_, lossScale_,
                            share_);
            break;
    }
    return Status::success();
}

std::string cpuModelName() {
    std::ifstream f("/proc/cpuinfo");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("model name", 0) == 0) {
            auto p = line.find(':');
            if (p != std::string::npos) return line.substr(p + 2);
        }
    return "CPU";
}

int64_t hostMemoryBytes() {
    std::ifstream f("/proc/meminfo");
    std::string key;
    int64_t kb = 0;
    while (f >> key >> kb) {
        if (key == "MemTotal:") return kb * 1024;
        std::string unit;
        f >> unit;
    }
    return 0;
}

constexpr unsigned kFtzDaz = 0x8040;  // MXCSR bits FTZ (15) and DAZ (6)

// Weight matrices placed 16 bytes past a cache line. oneDNN 2.6's f32 matmul on AVX2 reads a
// 32-byte aligned right operand in place instead of packing it first, and when its rows are a
// multiple of 1 KiB apart (1024 or 2048 floats wide, say) those reads keep landing in the same
// few cache sets: [256,1024] x [1024,1024] with bias and ReLU took 11.7 ms on one core of the
// AMD Zen 3 machine with the weights aligned against 6.6 ms 16 bytes off (3.4 against 5.9 ms on
// two; 1024 x 2048 weights 13.1 against 23.6 ms; any offset that is not a multiple of 32 bytes
// does it). Rows of 128 or 256 floats and widths off those multiples measured the same either
// way or slightly faster aligned, and TrainDeck's own loops read with unaligned loads but pay
// for the lines they straddle (the seed MLP's step measured 126 us against 113 with every
// weight offset), so only rows of at least 2 KiB and a multiple of 1 KiB move, and only where
// oneDNN runs AVX2 kernels (on the AVX-512 Xeon oneDNN's products alone ran about 1% faster
// aligned: README, the matmul benchmark's placement). The rule is cpu::weightsOffsetFor
// (weight_placement.h), which traindeck_bench_matmul shares; its --weights-aligned and
// --weights-offset measure either placement.
using cpu::kWeightsOffset;

bool offsetWeights(size_t rowBytes) {
    return cpu::weightsOffsetFor(dnnl::get_effective_cpu_isa(), rowBytes);
}

class CpuDevice final : public Device, public HostThreads {
  public:
    HostThreads* hostThreads() override { return this; }
    explicit CpuDevice(int threads) : eng_(dnnl::engine::kind::cpu, 0), strm_(eng_) {
        desc_ = cpuDeviceDesc();
        if (threads > 0) desc_.threads = threads;
    }
    const DeviceDesc& desc() const override { return desc_; }
    Result<Buffer> allocate(size_t bytes) override { return allocateAt(bytes, 0); }
    Result<Buffer> allocateWeights(size_t bytes, size_t rowBytes) override {
        return allocateAt(bytes, offsetWeights(rowBytes) ? kWeightsOffset : 0);
    }
    void release(Buffer& b) override {
        if (!b.ptr) return;
        bool offset = false;
        {
            std::lock_guard<std::mutex> lk(offsetMu_);
            offset = offsetBuffers_.erase(b.ptr) > 0;
        }
        std::free(static_cast<char*>(b.ptr) - (offset ? kWeightsOffset : 0));
        b = {};
    }
    Result<Buffer> allocateHost(size_t bytes) override { return allocate(bytes); }
    void releaseHost(Buffer& b) override { release(b); }
    Status copyToDeviceAsync(const Buffer& dst, size_t off, const void* src,
                             size_t bytes) override {
        return copyToDevice(dst, off, src, bytes);
    }
    Status copyToHostAsync(void* dst, const Buffer& src, size_t off, size_t bytes) override {
        return copyToHost(dst, src, off, bytes);
    }
    Status fillZero(const Buffer& dst, size_t off, size_t bytes) override {
        TD_ASSERT(off + bytes <= dst.bytes);
        std::memset(static_cast<char*>(dst.ptr) + off, 0, bytes);
        return Status::success();
    }
    Status copyToDevice(const Buffer& dst, size_t off, const void* src, size_t bytes) override {
        TD_ASSERT(off + bytes <= dst.bytes);
        std::memcpy(static_cast<char*>(dst.ptr) + off, src, bytes);
        return Status::success();
    }
    Status copyToHost(void* dst, const Buffer& src, size_t off, size_t bytes) override {
        TD_ASSERT(off + bytes <= src.bytes);
        std::memcpy(dst, static_cast<const char*>(src.ptr) + off, bytes);
        return Status::success();
    }
    Support supportsOp(const Graph&, const Node& n) const override {
        if (n.op == Op::Label) return {};
        if (n.dtype != DType::F32 && n.dtype != DType::BF16 && n.dtype != DType::F16)
            return {false, std::string("cpu:0 runs ") + opName(n.op) +
                               " in f32, bf16 or f16, not " + dtypeName(n.dtype)};
        return {};
    }
    bool halfConvolutions(DType compute) const override { return cpuHalfConvolutions(compute); }
    Result<std::unique_ptr<Executable>> compile(const LoweredProgram& lp,
                                                const ProgramBindings& bind) override {
        TD_RETURN_IF_ERROR(checkBindings(lp, bind));
        // A program on fewer threads than the device has (a small step, on one thread) shares
        // its large products and its update with helpers on the other cores.
        const int team = omp_get_max_threads();
        if (team < desc_.threads && !share_) {
            share_ = std::make_unique<WorkShare>(desc_.threads - 1, [] {
                omp_set_num_threads(1);
                _mm_setcsr(_mm_getcsr() | kFtzDaz);
            });
            for (int h = 1; h < desc_.threads; ++h) helperStreams_.emplace_back(eng_);
        }
        // A device of one thread: a share without helpers, so that its products skip zeros and
        // the update runs in the weight gradient's pieces as on more threads (the pieces in turn
        // on the calling thread). Seed MLP at batch 32 on one thread: see the README.
        // The passes cpu_solo_pieces or cpu_skip_zeros off keep oneDNN's whole products there.
        cpu::PassRunner passes(lp.passesOff);
        WorkShare* share = team < desc_.threads ? share_.get() : nullptr;
        if (!share && team == 1 && desc_.threads == 1 && cpu::sparse::active() &&
            passes.enabled(cpu::Pass::SkipZeros) && passes.enabled(cpu::Pass::SoloPieces)) {
            if (!solo_) solo_ = std::make_unique<WorkShare>(0);
            share = solo_.get();
        }
        auto prog = std::make_unique<CpuProgram>(eng_, strm_, team, share, helperStreams_,
                                                 std::move(passes));
        TD_RETURN_IF_ERROR(prog->build(lp, bind));
        return std::unique_ptr<Executable>(std::move(prog));
    }
    Status synchronize() override { return Status::success(); }
    // Work on the CPU device is done when its call returns: every marker has passed.
    Result<int64_t> recordEvent() override { return ++events_; }
    Status waitEvent(int64_t event) override {
        TD_ASSERT(event <= events_);
        return Status::success();
    }
    void prepareThread(int workerThreads) override {
        // oneDNN sizes its thread partitioning when a primitive is created and opens a team of
        // that size when it runs, so creation and execution must see the same count.
        omp_set_num_threads(workerThreads > 0 ? workerThreads : desc_.threads);
        _mm_setcsr(_mm_getcsr() | kFtzDaz);
        // Every thread of the pool, including those only the optimizer update's wider team uses.
#pragma omp parallel num_threads(std::max(desc_.threads, workerThreads))
        _mm_setcsr(_mm_getcsr() | kFtzDaz);
    }
    bool hostAddressable() const override {
        return true;
    }
    bool startAside(void (*task)(void*), void* ctx) override {
        return share_ && share_->post(task, ctx);
    }
    void finishAside() override {
        if (share_) share_->finishPosted();
    }
    bool runsAside() const override {
        return share_ && share_->width() > 1;
    }

  private:
    // `offset` bytes past a 64-byte boundary (released with the offset taken back off).
    Result<Buffer> allocateAt(size_t bytes, size_t offset) {
        void* p = std::aligned_alloc(64, std::max<size_t>(64, (bytes + offset + 63) / 64 * 64));
        if (!p) return err("cpu:0: cannot allocate " + std::to_string(bytes) + " bytes");
        std::memset(p, 0, bytes + offset);
        char* at = static_cast<char*>(p) + offset;
        if (offset) {
            std::lock_guard<std::mutex> lk(offsetMu_);
            offsetBuffers_.insert(at);
        }
        return Buffer{at, bytes};
    }
    std::mutex offsetMu_;
    std::unordered_set<void*> offsetBuffers_;  // allocateWeights' buffers placed off alignment

    int64_t events_ = 0;
    DeviceDesc desc_;
    dnnl::engine eng_;
    dnnl::stream strm_;
    std::vector<dnnl::stream> helperStreams_;  // before share_: its helpers use them
    std::unique_ptr<WorkShare> share_;
    std::unique_ptr<WorkShare> solo_;  // no helpers: a device of one thread (compile)
};

}  // namespace

DeviceDesc cpuDeviceDesc() {
    static const DeviceDesc d = [] {
        DeviceDesc x;
        x.kind = DeviceKind::Cpu;
        x.index = 0;
        x.id = "cpu:0";
        x.threads = omp_get_max_threads();
        // The level of TrainDeck's own vector kernels; oneDNN picks its own for its primitives.
        x.name = cpuModelName() + " (" + std::to_string(x.threads) + " threads, " +
                 cpuIsaName(activeCpuIsa().isa) + ")";
        x.memoryBytes = hostMemoryBytes();
        return x;
    }();
    return d;
}

bool cpuHalfConvolutions(DType compute) {
    if (compute != DType::BF16) return false;  // oneDNN 2.6 has no f16 convolution on CPUs
    static const bool native = [] {
        const CpuHalfSupport h = cpuHalfSupport();
        if (!h.amxBf16 && !h.avx512Bf16) return false;  // emulated: slower than f32
        // A convolution of the CNN's kind, forward and both gradients, each without a
        // reference implementation.
        using namespace dnnl;
        try {
            const engine eng(engine::kind::cpu, 0);
            const auto bf16 = memory::data_type::bf16, f32 = memory::data_type::f32;
            const memory::desc x({8, 16, 12, 12}, bf16, memory::format_tag::nhwc),
                y({8, 32, 10, 10}, bf16, memory::format_tag::nhwc),
                x32({8, 16, 12, 12}, f32, memory::format_tag::nhwc),
                k({32, 16, 3, 3}, bf16, memory::format_tag::any),
                k32({32, 16, 3, 3}, f32, memory::format_tag::any),
                b({32}, f32, memory::format_tag::x);
            const memory::dims s{1, 1}, d{0, 0}, p{0, 0};
            const convolution_forward::primitive_desc f(
                convolution_forward::desc(prop_kind::forward_training,
                                          algorithm::convolution_direct, x, k, b, y, s, d, p, p),
                eng);
            const convolution_backward_data::primitive_desc bd(
                convolution_backward_data::desc(algorithm::convolution_direct, x32, k, y, s, d, p,
                                                p),
                eng, f);
            const convolution_backward_weights::primitive_desc bw(
                convolution_backward_weights::desc(algorithm::convolution_direct, x, k32, y, s, d,
                                                   p, p),
                eng, f);
            for (const char* impl : {f.impl_info_str(), bd.impl_info_str(), bw.impl_info_str()})
                if (std::strncmp(impl, "ref", 3) == 0) return false;
            return true;
        } catch (const dnnl::error&) {
            return false;
        }
    }();
    return native;
}

std::unique_ptr<Device> makeCpuDevice(int threads) {
    return std::make_unique<CpuDevice>(threads);
}

}  // namespace td
