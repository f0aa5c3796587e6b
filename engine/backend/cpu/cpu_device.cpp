// CPU device: host memory, oneDNN matmul primitives (bias and eltwise post-ops, user scratchpad
// allocated at compile time) and the project's own kernels for everything else. A Program is the
// LoweredProgram's instruction list with every pointer resolved at compile time: the step loop
// only walks it. The device's stream is the calling thread: run() has finished everything
// (accumulators, all-reduce, optimizer update) when it returns.
#include <omp.h>
#include <xmmintrin.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>
#include <unordered_map>

#include "dnnl.hpp"
#include "engine/backend/backend.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/core/cpu_isa.h"
#include "engine/distribute/collectives.h"
#include "engine/train/update.h"

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
};

class CpuProgram final : public Executable {
  public:
    // `updateThreads`: the team the optimizer update splits its one pass over every parameter
    // across: the step's team (the thread count the program was compiled with). Measured on a
    // 2-core machine, a wider team for the update alone is slower at batch 32: its spinning
    // worker takes the core the input pipeline forms batches on.
    CpuProgram(dnnl::engine& eng, dnnl::stream& strm, int updateThreads)
        : eng_(eng), strm_(strm), updateThreads_(updateThreads) {}
    ~CpuProgram() override { std::free(arena_); }

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
            }
        }
        return true;
    }
    const void* valuePtr(int nodeId) const override {
        return ptrs_.at(static_cast<size_t>(nodeId));
    }
    size_t arenaBytes() const override { return arenaBytes_; }

  private:
    struct Prim {
        dnnl::primitive p;
        std::unordered_map<int, dnnl::memory> args;
    };
    void* resolve(const Operand& o) const;
    Status addMatmul(const Instr& in, CpuInstr& ins);
    // Where the program reads the batch: instruction operands and oneDNN arguments in the input
    // or label space, so rebindBatch() can point them at a batch in place.
    struct BatchSite {
        enum class Kind : uint8_t { OperandA, OperandB, PrimArg } kind;
        int index = 0;  // code_ or prims_ entry
        int arg = 0;    // DNNL_ARG_* for PrimArg
        bool label = false;
        int64_t offset = 0;
    };
    void noteBatchSite(const Operand& o, BatchSite::Kind kind, int index, int arg = 0) {
        if (o.space == Space::Input || o.space == Space::Label)
            batchSites_.push_back({kind, index, arg, o.space == Space::Label, o.offset});
    }
    std::vector<BatchSite> batchSites_;

    dnnl::engine& eng_;
    dnnl::stream& strm_;
    int updateThreads_ = 1;
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
};

dnnl::memory::desc matDesc(int64_t rows, int64_t cols, bool transposed) {
    using dnnl::memory;
    // Logical [rows, cols]; a transposed operand is stored as [cols, rows] row-major.
    memory::dims strides = transposed ? memory::dims{1, rows} : memory::dims{cols, 1};
    return memory::desc({rows, cols}, memory::data_type::f32, strides);
}

void* CpuProgram::resolve(const Operand& o) const {
    const ProgramBindings& b = *bind_;
    void* base = nullptr;
    switch (o.space) {
        case Space::None:
            return nullptr;
        case Space::Input:
            base = b.input.ptr;
            break;
        case Space::Label:
            base = b.label.ptr;
            break;
        case Space::Param:
            base = b.params.at(static_cast<size_t>(o.index)).ptr;
            break;
        case Space::Grad:
            base = b.grads.at(static_cast<size_t>(o.index)).ptr;
            break;
        case Space::Arena:
            base = arena_;
            break;
        case Space::Accumulator:
            base = b.accumulators.ptr;
            break;
        case Space::FlatGrad:
            base = b.flatGrads.ptr;
            break;
        case Space::Slot:
            base = b.optimizerSlots.at(static_cast<size_t>(o.index)).ptr;
            break;
    }
    return base ? static_cast<char*>(base) + o.offset : nullptr;
}

Status CpuProgram::addMatmul(const Instr& in, CpuInstr& ins) {
    using namespace dnnl;
    const std::string what = std::string(instrOpName(in.op)) + " %" + std::to_string(in.node);
    const Shape& A = in.in[0].shape;
    const bool ta = in.transA, tb = in.transB;
    const int64_t M = in.out.shape[0], N = in.out.shape[1];
    const int64_t K = ta ? A[0] : A[1];
    memory::desc aMd = matDesc(M, K, ta), wMd = matDesc(K, N, tb), cMd = matDesc(M, N, false);
    primitive_attr attr;
    attr.set_scratchpad_mode(scratchpad_mode::user);
    memory::desc biasMd;
    const bool hasBias = in.op == InstrOp::Dense && in.in.size() == 3;
    if (hasBias) biasMd = memory::desc({1, N}, memory::data_type::f32, memory::dims{N, 1});
    if (in.op == InstrOp::Dense) {
        post_ops po;
        switch (in.act) {
            case ActKind::Linear:
                break;
            case ActKind::Relu:
                po.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
                break;
            case ActKind::LeakyRelu:
                po.append_eltwise(1.f, algorithm::eltwise_relu, in.alpha, 0.f);
                break;
            case ActKind::Elu:
                po.append_eltwise(1.f, algorithm::eltwise_elu, in.alpha, 0.f);
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
                return err(what + ": activation softmax is not a post-op");
        }
        attr.set_post_ops(po);
    }
    Prim pr;
    try {
        matmul::desc d =
            hasBias ? matmul::desc(aMd, wMd, biasMd, cMd) : matmul::desc(aMd, wMd, cMd);
        matmul::primitive_desc pd(d, attr, eng_);
        pr.p = matmul(pd);
        const size_t sp = pd.scratchpad_desc().get_size();
        scratch_.emplace_back(new char[sp + 64]);
        pr.args[DNNL_ARG_SCRATCHPAD] = memory(pd.scratchpad_desc(), eng_, scratch_.back().get());
        pr.args[DNNL_ARG_SRC] = memory(aMd, eng_, resolve(in.in[0]));
        pr.args[DNNL_ARG_WEIGHTS] = memory(wMd, eng_, resolve(in.in[1]));
        const int index = static_cast<int>(prims_.size());
        noteBatchSite(in.in[0], BatchSite::Kind::PrimArg, index, DNNL_ARG_SRC);
        noteBatchSite(in.in[1], BatchSite::Kind::PrimArg, index, DNNL_ARG_WEIGHTS);
        if (hasBias) pr.args[DNNL_ARG_BIAS] = memory(biasMd, eng_, resolve(in.in[2]));
        pr.args[DNNL_ARG_DST] = memory(cMd, eng_, resolve(in.out));
    } catch (const dnnl::error& e) {
        return err("oneDNN " + what + ": " + e.what());
    }
    ins.prim = static_cast<int>(prims_.size());
    prims_.push_back(std::move(pr));
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
        if (in.op != InstrOp::MatMul && in.op != InstrOp::Dense) {
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
        switch (in.op) {
            case InstrOp::MatMul:
            case InstrOp::Dense:
                TD_RETURN_IF_ERROR(addMatmul(in, ins));
                break;
            case InstrOp::Dropout:
            case InstrOp::DropoutGrad:
                ins.alpha = in.rate;
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
                for (const UpdateOperands& u : lp.updateTensors) {
                    UpdateTensor t;
                    t.value = static_cast<float*>(resolve(u.value));
                    t.grad = static_cast<const float*>(resolve(u.grad));
                    t.size = u.value.elements();
                    for (size_t s = 0; s < u.slot.size() && s < 3; ++s)
                        t.slot[s] = static_cast<float*>(resolve(u.slot[s]));
                    updateTensors_.push_back(t);
                }
                break;
            }
            default:
                break;
        }
        code_.push_back(ins);
    }
    bind_ = nullptr;
    return Status::success();
}

Status CpuProgram::run(const StepArgs& args) {
    for (const CpuInstr& i : code_) {
        switch (i.op) {
            case InstrOp::MatMul:
            case InstrOp::Dense: {
                Prim& pr = prims_[static_cast<size_t>(i.prim)];
                try {
                    pr.p.execute(strm_, pr.args);
                } catch (const dnnl::error& e) {
                    return err(std::string("oneDNN matmul: ") + e.what());
                }
                break;
            }
            case InstrOp::BiasAdd:
                cpu::biasAdd(i.a, static_cast<const float*>(i.b), i.out, i.rows, i.cols);
                break;
            case InstrOp::Act:
                cpu::activation(i.act, i.alpha, i.a, i.out, i.rows, i.cols);
                break;
            case InstrOp::ActGrad:
                cpu::activationGrad(i.act, i.alpha, i.usesOutput, i.a,
                                    static_cast<const float*>(i.b), i.out, i.rows, i.cols);
                break;
            case InstrOp::Dropout:
            case InstrOp::DropoutGrad:
                cpu::dropout(i.a, i.out, i.rows, i.cols, i.alpha, i.seed, args.step,
                             args.sampleBase);
                break;
            case InstrOp::Loss:
                cpu::loss(i.loss, i.a, i.b, i.out, i.rows, i.cols, i.scale);
                break;
            case InstrOp::LossGrad:
                cpu::lossGrad(i.loss, i.a, i.b, i.out, i.rows, i.cols, i.scale);
                break;
            case InstrOp::Metric:
                cpu::metric(i.metric, i.k, i.onLogits, i.a, i.b, i.out, i.rows, i.cols);
                break;
            case InstrOp::RegLoss:
                cpu::regLoss(i.a, i.rows * i.cols, i.l1, i.l2, i.out);
                break;
            case InstrOp::RegGrad:
                cpu::regGrad(i.a, static_cast<const float*>(i.b), i.out, i.rows * i.cols, i.l1,
                             i.l2);
                break;
            case InstrOp::BiasGrad:
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
                applyUpdate(update_, args.update, updateTensors_, updateThreads_);
                break;
        }
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

class CpuDevice final : public Device {
  public:
    explicit CpuDevice(int threads) : eng_(dnnl::engine::kind::cpu, 0), strm_(eng_) {
        desc_ = cpuDeviceDesc();
        if (threads > 0) desc_.threads = threads;
    }
    const DeviceDesc& desc() const override { return desc_; }
    Result<Buffer> allocate(size_t bytes) override {
        void* p = std::aligned_alloc(64, std::max<size_t>(64, (bytes + 63) / 64 * 64));
        if (!p) return err("cpu:0: cannot allocate " + std::to_string(bytes) + " bytes");
        std::memset(p, 0, bytes);
        return Buffer{p, bytes};
    }
    void release(Buffer& b) override {
        std::free(b.ptr);
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
        if (n.dtype != DType::F32 && n.op != Op::Label)
            return {false, std::string("cpu:0 runs ") + opName(n.op) + " in f32 only, got " +
                               dtypeName(n.dtype)};
        return {};
    }
    Result<std::unique_ptr<Executable>> compile(const LoweredProgram& lp,
                                                const ProgramBindings& bind) override {
        TD_RETURN_IF_ERROR(checkBindings(lp, bind));
        auto prog = std::make_unique<CpuProgram>(eng_, strm_, omp_get_max_threads());
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
        constexpr unsigned kFtzDaz = 0x8040;  // MXCSR bits FTZ (15) and DAZ (6)
        _mm_setcsr(_mm_getcsr() | kFtzDaz);
        // Every thread of the pool, including those only the optimizer update's wider team uses.
#pragma omp parallel num_threads(std::max(desc_.threads, workerThreads))
        _mm_setcsr(_mm_getcsr() | kFtzDaz);
    }
    bool hostAddressable() const override {
        return true;
    }

  private:
    int64_t events_ = 0;
    DeviceDesc desc_;
    dnnl::engine eng_;
    dnnl::stream strm_;
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

std::unique_ptr<Device> makeCpuDevice(int threads) {
    return std::make_unique<CpuDevice>(threads);
}

}  // namespace td
