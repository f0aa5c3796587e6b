// CPU device: host memory, oneDNN matmul primitives (bias and eltwise post-ops, user scratchpad
// allocated at compile time) and the project's own kernels for everything else. A Program is a
// flat list of instructions with every pointer resolved at compile time: the step loop only walks
// it.
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

namespace td {

namespace {

struct Instr {
    Op op;
    const float* a = nullptr;  // first operand
    const void* b = nullptr;   // second operand (labels for loss/metric)
    float* out = nullptr;
    int64_t rows = 0, cols = 0;  // of the first operand
    float alpha = 0, scale = 0, l1 = 0, l2 = 0;
    cpu::ActKind act = cpu::ActKind::Linear;
    cpu::LossKind loss = cpu::LossKind::Mse;
    cpu::MetricKind metric = cpu::MetricKind::SparseCategorical;
    bool usesOutput = false, onLogits = false;
    int64_t k = 1;
    uint64_t seed = 0;
    int prim = -1;  // index into CpuProgram::prims_ for oneDNN ops
};

class CpuProgram final : public Executable {
  public:
    CpuProgram(dnnl::engine& eng, dnnl::stream& strm) : eng_(eng), strm_(strm) {}
    ~CpuProgram() override { std::free(arena_); }

    Status build(const Graph& g, const ProgramBindings& bind, size_t arenaBytes);
    Status run(const StepArgs& args) override;
    const void* valuePtr(int nodeId) const override {
        return ptrs_.at(static_cast<size_t>(nodeId));
    }
    size_t arenaBytes() const override { return arenaBytes_; }

  private:
    struct Prim {
        dnnl::primitive p;
        std::unordered_map<int, dnnl::memory> args;
    };
    Status addMatmul(const Graph& g, const Node& n, Instr& ins);

    dnnl::engine& eng_;
    dnnl::stream& strm_;
    std::vector<Instr> code_;
    std::vector<Prim> prims_;
    std::vector<void*> ptrs_;
    void* arena_ = nullptr;
    size_t arenaBytes_ = 0;
    std::vector<std::unique_ptr<char[]>> scratch_;
};

dnnl::memory::desc matDesc(int64_t rows, int64_t cols, bool transposed) {
    using dnnl::memory;
    // Logical [rows, cols]; a transposed operand is stored as [cols, rows] row-major.
    memory::dims strides = transposed ? memory::dims{1, rows} : memory::dims{cols, 1};
    return memory::desc({rows, cols}, memory::data_type::f32, strides);
}

Status CpuProgram::addMatmul(const Graph& g, const Node& n, Instr& ins) {
    using namespace dnnl;
    const Node& A = g.node(n.inputs[0]);
    const bool ta = n.attrI("trans_a") != 0, tb = n.attrI("trans_b") != 0;
    const int64_t M = n.shape[0], N = n.shape[1];
    const int64_t K = ta ? A.shape[0] : A.shape[1];
    memory::desc aMd = matDesc(M, K, ta), wMd = matDesc(K, N, tb), cMd = matDesc(M, N, false);
    primitive_attr attr;
    attr.set_scratchpad_mode(scratchpad_mode::user);
    memory::desc biasMd;
    const bool hasBias = n.op == Op::Dense && n.inputs.size() == 3;
    if (hasBias) biasMd = memory::desc({1, N}, memory::data_type::f32, memory::dims{N, 1});
    if (n.op == Op::Dense) {
        const std::string act = n.attr("act", "linear");
        post_ops po;
        const float alpha = static_cast<float>(n.attrF("alpha"));
        if (act == "relu")
            po.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
        else if (act == "leaky_relu")
            po.append_eltwise(1.f, algorithm::eltwise_relu, alpha, 0.f);
        else if (act == "elu")
            po.append_eltwise(1.f, algorithm::eltwise_elu, alpha, 0.f);
        else if (act == "gelu")
            po.append_eltwise(1.f, algorithm::eltwise_gelu_erf, 0.f, 0.f);
        else if (act == "sigmoid")
            po.append_eltwise(1.f, algorithm::eltwise_logistic, 0.f, 0.f);
        else if (act == "tanh")
            po.append_eltwise(1.f, algorithm::eltwise_tanh, 0.f, 0.f);
        else if (act != "linear")
            return err("dense %" + std::to_string(n.id) + ": activation " + act +
                       " is not a post-op");
        attr.set_post_ops(po);
    }
    Prim pr;
    try {
        {
            matmul::desc d =
                hasBias ? matmul::desc(aMd, wMd, biasMd, cMd) : matmul::desc(aMd, wMd, cMd);
            matmul::primitive_desc pd(d, attr, eng_);
            pr.p = matmul(pd);
            const size_t sp = pd.scratchpad_desc().get_size();
            scratch_.emplace_back(new char[sp + 64]);
            pr.args[DNNL_ARG_SCRATCHPAD] =
                memory(pd.scratchpad_desc(), eng_, scratch_.back().get());
            pr.args[DNNL_ARG_SRC] = memory(aMd, eng_, ptrs_[static_cast<size_t>(n.inputs[0])]);
            pr.args[DNNL_ARG_WEIGHTS] = memory(wMd, eng_, ptrs_[static_cast<size_t>(n.inputs[1])]);
            if (hasBias)
                pr.args[DNNL_ARG_BIAS] =
                    memory(biasMd, eng_, ptrs_[static_cast<size_t>(n.inputs[2])]);
            pr.args[DNNL_ARG_DST] = memory(cMd, eng_, ptrs_[static_cast<size_t>(n.id)]);
        }
    } catch (const dnnl::error& e) {
        return err("oneDNN matmul %" + std::to_string(n.id) + ": " + e.what());
    }
    ins.prim = static_cast<int>(prims_.size());
    prims_.push_back(std::move(pr));
    return Status::success();
}

Status CpuProgram::build(const Graph& g, const ProgramBindings& bind, size_t arenaBytes) {
    arenaBytes_ = arenaBytes;
    arena_ = std::aligned_alloc(64, std::max<size_t>(64, (arenaBytes + 63) / 64 * 64));
    if (!arena_) return err("cannot allocate a " + std::to_string(arenaBytes) + "-byte arena");
    std::memset(arena_, 0, arenaBytes);
    ptrs_.assign(g.nodes.size(), nullptr);
    std::vector<int> params = g.params();
    std::unordered_map<int, size_t> paramIndex;
    for (size_t i = 0; i < params.size(); ++i) paramIndex[params[i]] = i;
    std::unordered_map<int, size_t> gradIndex;
    for (const auto& [p, gr] : g.grads) {
        int root = gr;  // a reshaped gradient is written by the node it views
        while (g.node(root).op == Op::Reshape) root = g.node(root).inputs[0];
        gradIndex[root] = paramIndex.at(p);
    }

    for (const Node& n : g.nodes) {
        const std::string buf = n.attr("buf");
        void*& p = ptrs_[static_cast<size_t>(n.id)];
        if (buf == "param")
            p = bind.params.at(paramIndex.at(n.id)).ptr;
        else if (buf == "grad")
            p = bind.grads.at(gradIndex.at(n.id)).ptr;
        else if (buf == "input")
            p = bind.input.ptr;
        else if (buf == "label")
            p = bind.label.ptr;
        else if (buf == "alias")
            p = ptrs_[static_cast<size_t>(n.inputs[0])];
        else if (buf == "arena")
            p = static_cast<char*>(arena_) + n.attrI("off");
        else
            return err("%" + std::to_string(n.id) + ": no buffer assigned (run the memory pass)");
        if (!p) return err("%" + std::to_string(n.id) + ": buffer is not bound");
    }

    for (const Node& n : g.nodes) {
        Instr ins;
        ins.op = n.op;
        ins.out = static_cast<float*>(ptrs_[static_cast<size_t>(n.id)]);
        if (!n.inputs.empty()) {
            const Node& a = g.node(n.inputs[0]);
            ins.a = static_cast<const float*>(ptrs_[static_cast<size_t>(a.id)]);
            ins.rows = a.shape.empty() ? 1 : a.shape[0];
            ins.cols = a.shape.size() >= 2 ? numElements(a.shape) / a.shape[0] : 1;
            if (a.shape.size() == 1) {
                ins.rows = 1;
                ins.cols = a.shape[0];
            }
        }
        if (n.inputs.size() >= 2) ins.b = ptrs_[static_cast<size_t>(n.inputs[1])];
        switch (n.op) {
            case Op::Input:
            case Op::Label:
            case Op::Param:
            case Op::Reshape:
                continue;  // no work
            case Op::MatMul:
            case Op::Dense:
                TD_RETURN_IF_ERROR(addMatmul(g, n, ins));
                break;
            case Op::Act:
            case Op::ActGrad:
                ins.act = cpu::actKindFromName(n.attr("act"));
                ins.alpha = static_cast<float>(n.attrF("alpha"));
                ins.usesOutput = n.attrI("uses_output") != 0;
                break;
            case Op::Dropout:
            case Op::DropoutGrad:
                ins.alpha = static_cast<float>(n.attrF("rate"));
                ins.seed = std::strtoull(n.attr("seed").c_str(), nullptr, 10);
                break;
            case Op::Loss:
            case Op::LossGrad:
                ins.loss = cpu::lossKindFromName(n.attr("loss"));
                ins.scale = static_cast<float>(n.attrF("scale", 1.0));
                break;
            case Op::Metric:
                ins.metric = cpu::metricKindFromName(n.attr("metric"));
                ins.k = n.attrI("k", 1);
                ins.onLogits = n.attrI("on_logits") != 0;
                break;
            case Op::RegLoss:
            case Op::RegGrad:
                ins.l1 = static_cast<float>(n.attrF("l1"));
                ins.l2 = static_cast<float>(n.attrF("l2"));
                break;
            case Op::BiasAdd:
            case Op::BiasGrad:
            case Op::Add:
                break;
        }
        code_.push_back(ins);
    }
    return Status::success();
}

Status CpuProgram::run(const StepArgs& args) {
    for (const Instr& i : code_) {
        switch (i.op) {
            case Op::MatMul:
            case Op::Dense: {
                Prim& pr = prims_[static_cast<size_t>(i.prim)];
                try {
                    pr.p.execute(strm_, pr.args);
                } catch (const dnnl::error& e) {
                    return err(std::string("oneDNN matmul: ") + e.what());
                }
                break;
            }
            case Op::BiasAdd:
                cpu::biasAdd(i.a, static_cast<const float*>(i.b), i.out, i.rows, i.cols);
                break;
            case Op::Act:
                cpu::activation(i.act, i.alpha, i.a, i.out, i.rows, i.cols);
                break;
            case Op::ActGrad:
                cpu::activationGrad(i.act, i.alpha, i.usesOutput, i.a,
                                    static_cast<const float*>(i.b), i.out, i.rows, i.cols);
                break;
            case Op::Dropout:
            case Op::DropoutGrad:
                cpu::dropout(i.a, i.out, i.rows, i.cols, i.alpha, i.seed, args.step,
                             args.sampleBase);
                break;
            case Op::Loss:
                cpu::loss(i.loss, i.a, i.b, i.out, i.rows, i.cols, i.scale);
                break;
            case Op::LossGrad:
                cpu::lossGrad(i.loss, i.a, i.b, i.out, i.rows, i.cols, i.scale);
                break;
            case Op::Metric:
                cpu::metric(i.metric, i.k, i.onLogits, i.a, i.b, i.out, i.rows, i.cols);
                break;
            case Op::RegLoss:
                cpu::regLoss(i.a, i.rows * i.cols, i.l1, i.l2, i.out);
                break;
            case Op::RegGrad:
                cpu::regGrad(i.a, static_cast<const float*>(i.b), i.out, i.rows * i.cols, i.l1,
                             i.l2);
                break;
            case Op::BiasGrad:
                cpu::biasGrad(i.a, i.out, i.rows, i.cols);
                break;
            case Op::Add:
                cpu::add(i.a, static_cast<const float*>(i.b), i.out, i.rows * i.cols);
                break;
            default:
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
    Result<std::unique_ptr<Executable>> compile(const Graph& g,
                                                const ProgramBindings& bind) override {
        for (const Node& n : g.nodes) {
            Support s = supportsOp(g, n);
            if (!s.ok) return err(s.reason);
        }
        size_t arena = 0;
        for (const Node& n : g.nodes)
            if (n.attr("buf") == "arena")
                arena = std::max(arena, static_cast<size_t>(n.attrI("off")) +
                                            static_cast<size_t>(numElements(n.shape)) * 4);
        auto prog = std::make_unique<CpuProgram>(eng_, strm_);
        TD_RETURN_IF_ERROR(prog->build(g, bind, arena));
        return std::unique_ptr<Executable>(std::move(prog));
    }
    Status synchronize() override { return Status::success(); }
    void prepareThread(int workerThreads) override {
        // oneDNN sizes its thread partitioning when a primitive is created and opens a team of
        // that size when it runs, so creation and execution must see the same count.
        omp_set_num_threads(workerThreads > 0 ? workerThreads : desc_.threads);
        constexpr unsigned kFtzDaz = 0x8040;  // MXCSR bits FTZ (15) and DAZ (6)
        _mm_setcsr(_mm_getcsr() | kFtzDaz);
#pragma omp parallel
        _mm_setcsr(_mm_getcsr() | kFtzDaz);
    }
    bool hostAddressable() const override {
        return true;
    }

  private:
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
