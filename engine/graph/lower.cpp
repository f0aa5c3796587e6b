#include "engine/graph/lower.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <unordered_map>

namespace td {

namespace {

constexpr int64_t kGradAlign = 16;  // f32 elements: 64 bytes, a cache line and an AVX-512 register

std::string where(const Node& n) {
    return "%" + std::to_string(n.id) + " = " + opName(n.op) + ": ";
}

// The node whose storage each value lives in (a reshape views its input).
std::vector<int> storageRoots(const Graph& g) {
    std::vector<int> root(g.nodes.size());
    for (const Node& n : g.nodes)
        root[static_cast<size_t>(n.id)] =
            aliasesOperand(n.op) ? root[static_cast<size_t>(n.inputs[0])] : n.id;
    return root;
}

// Per storage root: the last node that writes or reads it.
std::vector<int> lastAccess(const Graph& g, const std::vector<int>& root) {
    std::vector<int> last(g.nodes.size(), -1);
    for (const Node& n : g.nodes) {
        int& self = last[static_cast<size_t>(root[static_cast<size_t>(n.id)])];
        self = std::max(self, n.id);
        for (int in : n.inputs) {
            int& r = last[static_cast<size_t>(root[static_cast<size_t>(in)])];
            r = std::max(r, n.id);
        }
    }
    return last;
}

// When the gradient of each param is complete: the last node touching its storage (-1: never
// written, e.g. a trainable param the loss does not depend on).
std::vector<int> gradReadiness(const Graph& g, const std::vector<int>& params) {
    const std::vector<int> root = storageRoots(g);
    const std::vector<int> last = lastAccess(g, root);
    std::vector<int> ready(params.size(), -1);
    for (size_t i = 0; i < params.size(); ++i) {
        auto it = g.grads.find(params[i]);
        if (it == g.grads.end()) continue;
        ready[i] = last[static_cast<size_t>(root[static_cast<size_t>(it->second)])];
    }
    return ready;
}

}  // namespace

GradientPlan planGradients(const Graph& planned, size_t bucketBytes) {
    const Graph& g = planned;
    const std::vector<int> params = g.params();
    const std::vector<int> ready = gradReadiness(g, params);
    GradientPlan plan;
    plan.offsets.assign(params.size(), -1);
    std::vector<size_t> order;
    for (size_t i = 0; i < params.size(); ++i)
        if (g.node(params[i]).attrs.trainableOr()) order.push_back(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return ready[a] < ready[b]; });
    int64_t end = 0;
    bool open = false;
    GradBucket cur;
    for (size_t i : order) {
        const int64_t off = (end + kGradAlign - 1) / kGradAlign * kGradAlign;
        if (!open) {
            cur.offset = off;
            open = true;
        }
        plan.offsets[i] = off;
        end = off + numElements(g.node(params[i]).shape);
        cur.count = end - cur.offset;
        if (static_cast<size_t>(cur.count) * sizeof(float) >= bucketBytes) {
            plan.buckets.push_back(cur);
            open = false;
        }
    }
    if (open) plan.buckets.push_back(cur);
    plan.elements = (end + kGradAlign - 1) / kGradAlign * kGradAlign;
    return plan;
}

const char* spaceName(Space s) {
    switch (s) {
        case Space::None:
            return "none";
        case Space::Input:
            return "input";
        case Space::Label:
            return "label";
        case Space::Param:
            return "param";
        case Space::Grad:
            return "grad";
        case Space::Arena:
            return "arena";
        case Space::Accumulator:
            return "acc";
        case Space::FlatGrad:
            return "flat";
        case Space::Slot:
            return "slot";
        case Space::Shadow:
            return "shadow";
        case Space::LossScale:
            return "loss_scale";
    }
    return "?";
}

const char* instrOpName(InstrOp op) {
    switch (op) {
        case InstrOp::MatMul:
            return "matmul";
        case InstrOp::Dense:
            return "dense";
        case InstrOp::BiasAdd:
            return "bias_add";
        case InstrOp::Act:
            return "act";
        case InstrOp::ActGrad:
            return "act_grad";
        case InstrOp::Dropout:
            return "dropout";
        case InstrOp::DropoutGrad:
            return "dropout_grad";
        case InstrOp::Loss:
            return "loss";
        case InstrOp::LossGrad:
            return "loss_grad";
        case InstrOp::Metric:
            return "metric";
        case InstrOp::RegLoss:
            return "reg_loss";
        case InstrOp::RegGrad:
            return "reg_grad";
        case InstrOp::BiasGrad:
            return "bias_grad";
        case InstrOp::Add:
            return "add";
        case InstrOp::Cast:
            return "cast";
        case InstrOp::Conv2D:
            return "conv2d";
        case InstrOp::Conv2DGradInput:
            return "conv2d_grad_input";
        case InstrOp::Conv2DGradFilter:
            return "conv2d_grad_filter";
        case InstrOp::MaxPool:
            return "max_pool";
        case InstrOp::MaxPoolGrad:
            return "max_pool_grad";
        case InstrOp::AvgPool:
            return "avg_pool";
        case InstrOp::AvgPoolGrad:
            return "avg_pool_grad";
        case InstrOp::Pad2D:
            return "pad2d";
        case InstrOp::Pad2DGrad:
            return "pad2d_grad";
        case InstrOp::Scale:
            return "scale";
        case InstrOp::ChannelMean:
            return "channel_mean";
        case InstrOp::ChannelVar:
            return "channel_var";
        case InstrOp::BatchNorm:
            return "batch_norm";
        case InstrOp::BatchNormGrad:
            return "batch_norm_grad";
        case InstrOp::NormGammaGrad:
            return "norm_gamma_grad";
        case InstrOp::MovingAvg:
            return "moving_avg";
        case InstrOp::LayerNorm:
            return "layer_norm";
        case InstrOp::LayerNormGrad:
            return "layer_norm_grad";
        case InstrOp::LayerNormGammaGrad:
            return "layer_norm_gamma_grad";
        case InstrOp::Resize:
            return "resize";
        case InstrOp::RandomCrop:
            return "random_crop";
        case InstrOp::RandomFlip:
            return "random_flip";
        case InstrOp::RandomRotation:
            return "random_rotation";
        case InstrOp::RandomZoom:
            return "random_zoom";
        case InstrOp::RandomTranslation:
            return "random_translation";
        case InstrOp::RandomContrast:
            return "random_contrast";
        case InstrOp::RandomBrightness:
            return "random_brightness";
        case InstrOp::Accumulate:
            return "accumulate";
        case InstrOp::AllReduceStart:
            return "all_reduce_start";
        case InstrOp::AllReduceWait:
            return "all_reduce_wait";
        case InstrOp::Update:
            return "update";
    }
    return "?";
}

namespace {

std::optional<InstrOp> instrOpOf(Op op) {
    switch (op) {
        case Op::Input:
        case Op::Label:
        case Op::Param:
        case Op::Reshape:
            return std::nullopt;  // no work: bound buffers and views
        case Op::MatMul:
            return InstrOp::MatMul;
        case Op::Dense:
            return InstrOp::Dense;
        case Op::BiasAdd:
            return InstrOp::BiasAdd;
        case Op::Act:
            return InstrOp::Act;
        case Op::ActGrad:
            return InstrOp::ActGrad;
        case Op::Dropout:
            return InstrOp::Dropout;
        case Op::DropoutGrad:
            return InstrOp::DropoutGrad;
        case Op::Loss:
            return InstrOp::Loss;
        case Op::LossGrad:
            return InstrOp::LossGrad;
        case Op::Metric:
            return InstrOp::Metric;
        case Op::RegLoss:
            return InstrOp::RegLoss;
        case Op::RegGrad:
            return InstrOp::RegGrad;
        case Op::BiasGrad:
            return InstrOp::BiasGrad;
        case Op::Add:
            return InstrOp::Add;
        case Op::Cast:
            return InstrOp::Cast;
        case Op::Conv2D:
            return InstrOp::Conv2D;
        case Op::Conv2DGradInput:
            return InstrOp::Conv2DGradInput;
        case Op::Conv2DGradFilter:
            return InstrOp::Conv2DGradFilter;
        case Op::MaxPool:
            return InstrOp::MaxPool;
        case Op::MaxPoolGrad:
            return InstrOp::MaxPoolGrad;
        case Op::AvgPool:
            return InstrOp::AvgPool;
        case Op::AvgPoolGrad:
            return InstrOp::AvgPoolGrad;
        case Op::Pad2D:
            return InstrOp::Pad2D;
        case Op::Pad2DGrad:
            return InstrOp::Pad2DGrad;
        case Op::Scale:
            return InstrOp::Scale;
        case Op::ChannelMean:
            return InstrOp::ChannelMean;
        case Op::ChannelVar:
            return InstrOp::ChannelVar;
        case Op::BatchNorm:
            return InstrOp::BatchNorm;
        case Op::BatchNormGrad:
            return InstrOp::BatchNormGrad;
        case Op::NormGammaGrad:
            return InstrOp::NormGammaGrad;
        case Op::MovingAvg:
            return InstrOp::MovingAvg;
        case Op::LayerNorm:
            return InstrOp::LayerNorm;
        case Op::LayerNormGrad:
            return InstrOp::LayerNormGrad;
        case Op::LayerNormGammaGrad:
            return InstrOp::LayerNormGammaGrad;
        case Op::Resize:
            return InstrOp::Resize;
        case Op::RandomCrop:
            return InstrOp::RandomCrop;
        case Op::RandomFlip:
            return InstrOp::RandomFlip;
        case Op::RandomRotation:
            return InstrOp::RandomRotation;
        case Op::RandomZoom:
            return InstrOp::RandomZoom;
        case Op::RandomTranslation:
            return InstrOp::RandomTranslation;
        case Op::RandomContrast:
            return InstrOp::RandomContrast;
        case Op::RandomBrightness:
            return InstrOp::RandomBrightness;
    }
    return std::nullopt;
}

// An image op's parameters as printProgram shows them.
std::string augmentText(InstrOp op, const AugmentSpec& a) {
    std::string out;
    auto add = [&](const std::string& kv) { out += (out.empty() ? "" : ", ") + kv; };
    auto range = [&](const char* name, float lo, float hi) {
        add(std::string(name) + "=" + fmtNum(lo) + ".." + fmtNum(hi));
    };
    const bool geometric = op == InstrOp::RandomRotation || op == InstrOp::RandomZoom ||
                           op == InstrOp::RandomTranslation;
    if (op == InstrOp::Resize)
        add("box=" + std::to_string(a.boxTop) + "x" + std::to_string(a.boxLeft) + "x" +
            std::to_string(a.boxH) + "x" + std::to_string(a.boxW));
    if (op == InstrOp::RandomFlip) add(std::string("flip=") + flipName(a.flip));
    if (geometric) add(std::string("fill=") + fillName(a.fill));
    if (op == InstrOp::Resize || geometric) {
        add(std::string("interp=") + interpName(a.interp));
        if (a.fillValue != 0.f) add("fill_value=" + fmtNum(a.fillValue));
    }
    if (geometric || op == InstrOp::RandomContrast || op == InstrOp::RandomBrightness)
        range("factor", a.factorLo, a.factorHi);
    if (a.ownWidth) range("width", a.widthLo, a.widthHi);
    if (op == InstrOp::RandomContrast || op == InstrOp::RandomBrightness)
        range("value", a.valueLo, a.valueHi);
    if (op != InstrOp::Resize) add("seed=" + std::to_string(a.seed));
    return out;
}

// The instruction computing node n, with its typed parameters.
Instr instrFor(const Node& n, InstrOp op, const std::vector<Operand>& values) {
    Instr ins;
    ins.op = op;
    ins.node = n.id;
    for (int in : n.inputs) ins.in.push_back(values[static_cast<size_t>(in)]);
    ins.out = values[static_cast<size_t>(n.id)];
    const NodeAttrs& a = n.attrs;
    ins.transA = a.transA.value_or(false);
    ins.transB = a.transB.value_or(false);
    ins.act = a.actOr();
    ins.alpha = static_cast<float>(a.alphaOr());
    ins.usesOutput = a.usesOutput.value_or(false);
    ins.rate = static_cast<float>(a.rate.value_or(0.0));
    ins.seed = a.seed.value_or(0);
    ins.loss = a.loss.value_or(LossKind::Mse);
    ins.scale = static_cast<float>(a.scaleOr());
    ins.metric = a.metric.value_or(MetricKind::SparseCategorical);
    ins.k = a.kOr();
    ins.onLogits = a.onLogits.value_or(false);
    ins.l1 = static_cast<float>(a.l1.value_or(0.0));
    ins.l2 = static_cast<float>(a.l2.value_or(0.0));
    ins.dynamicScale = a.dynamicScale.value_or(false);
    ins.hasBias = a.hasBias.value_or(false);
    ins.hasGamma = a.hasGamma.value_or(false);
    ins.hasBeta = a.hasBeta.value_or(false);
    ins.batchStats = a.batchStats.value_or(false);
    ins.epsilon = static_cast<float>(a.epsilon.value_or(0.0));
    ins.momentum = static_cast<float>(a.momentum.value_or(0.0));
    ins.offset = static_cast<float>(a.offset.value_or(0.0));
    return ins;
}

}  // namespace

Result<LoweredProgram> lower(const Graph& planned, const LowerOptions& opt) {
    const Graph& g = planned;
    LoweredProgram lp;
    lp.name = g.name;
    lp.passesOff = g.passesOff;
    const std::vector<int> params = g.params();
    lp.params = static_cast<int>(params.size());
    lp.hasGrad.assign(params.size(), false);
    std::unordered_map<int, int> paramIndex;
    for (size_t i = 0; i < params.size(); ++i) paramIndex[params[i]] = static_cast<int>(i);
    const std::vector<int> root = storageRoots(g);
    std::unordered_map<int, int> gradIndex;  // storage root of a gradient -> its param
    for (const auto& [p, gr] : g.grads) {
        const int r = root[static_cast<size_t>(gr)];
        if (g.node(r).attrs.buf != BufKind::Grad) continue;  // planned elsewhere (e.g. a param)
        gradIndex[r] = paramIndex.at(p);
    }

    // Where every value lives.
    lp.values.resize(g.nodes.size());
    for (const Node& n : g.nodes) {
        Operand& v = lp.values[static_cast<size_t>(n.id)];
        if (!n.attrs.buf) return err(where(n) + "no buffer assigned (run the memory pass)");
        switch (*n.attrs.buf) {
            case BufKind::Param: {
                auto it = paramIndex.find(n.id);
                if (it == paramIndex.end()) return err(where(n) + "buf=param on a non-param value");
                v.space = Space::Param;
                v.index = it->second;
                break;
            }
            case BufKind::Grad: {
                auto it = gradIndex.find(n.id);
                if (it == gradIndex.end())
                    return err(where(n) + "buf=grad but no grad binding is written here");
                v.space = Space::Grad;
                v.index = it->second;
                lp.hasGrad[static_cast<size_t>(it->second)] = true;
                break;
            }
            case BufKind::Input:
                v.space = Space::Input;
                break;
            case BufKind::Label:
                v.space = Space::Label;
                break;
            case BufKind::Alias:
                if (n.inputs.empty()) return err(where(n) + "buf=alias needs an operand");
                v = lp.values[static_cast<size_t>(n.inputs[0])];
                break;
            case BufKind::Shadow: {
                auto it = n.op == Op::Cast ? paramIndex.find(n.inputs[0]) : paramIndex.end();
                if (it == paramIndex.end())
                    return err(where(n) + "buf=shadow on a value that is not a cast of a param");
                if (n.dtype != DType::BF16 && n.dtype != DType::F16)
                    return err(where(n) + "buf=shadow needs a bf16 or f16 cast");
                v.space = Space::Shadow;
                v.index = it->second;
                break;
            }
            case BufKind::Arena:
                if (!n.attrs.off || *n.attrs.off < 0)
                    return err(where(n) + "buf=arena without an offset (off)");
                v.space = Space::Arena;
                v.offset = *n.attrs.off;
                lp.arenaBytes =
                    std::max(lp.arenaBytes, static_cast<size_t>(*n.attrs.off) + n.bytes());
                break;
        }
        v.dtype = n.dtype;
        v.shape = n.shape;
    }

    // All-reduce of the gradient buckets: each starts once the last node touching any gradient in
    // it has run (and not before the bucket before it: buckets start in order).
    const size_t nb = opt.buckets.size();
    std::vector<int> startAfter(nb, -1);
    if (nb > 0) {
        if (opt.gradOffsets.size() != params.size())
            return err("lower: " + std::to_string(opt.gradOffsets.size()) +
                       " gradient offsets for " + std::to_string(params.size()) + " params");
        const std::vector<int> ready = gradReadiness(g, params);
        for (size_t b = 0; b < nb; ++b) {
            const GradBucket& bk = opt.buckets[b];
            for (size_t i = 0; i < params.size(); ++i) {
                const int64_t off = opt.gradOffsets[i];
                if (off < 0) continue;
                const int64_t end = off + numElements(g.node(params[i]).shape);
                if (off < bk.offset + bk.count && bk.offset < end)
                    startAfter[b] = std::max(startAfter[b], ready[i]);
            }
            if (b > 0) startAfter[b] = std::max(startAfter[b], startAfter[b - 1]);
        }
    }
    size_t nextBucket = 0;
    auto startBuckets = [&](int after) {
        for (; nextBucket < nb && startAfter[nextBucket] <= after; ++nextBucket) {
            const GradBucket& bk = opt.buckets[nextBucket];
            Instr ins;
            ins.op = InstrOp::AllReduceStart;
            ins.bucket = static_cast<int>(nextBucket);
            ins.out.space = Space::FlatGrad;
            ins.out.offset = bk.offset * static_cast<int64_t>(sizeof(float));
            ins.out.shape = {bk.count};
            lp.code.push_back(ins);
        }
    };
    lp.buckets = opt.buckets;

    startBuckets(-1);
    lp.lossScaled = opt.lossScale && opt.update != nullptr;
    for (const Node& n : g.nodes) {
        if (n.op == Op::BiasGrad && n.attrs.byProducer.value_or(false)) {
            // Written by its act_grad, the instruction just before.
            auto it = std::find_if(lp.code.rbegin(), lp.code.rend(),
                                   [&](const Instr& i) { return i.node == n.inputs[0]; });
            if (it == lp.code.rend() || it->op != InstrOp::ActGrad)
                return err(where(n) + "by_producer without its act_grad");
            it->out2 = lp.values[static_cast<size_t>(n.id)];
            startBuckets(n.id);
            continue;
        }
        if (auto op = instrOpOf(n.op)) {
            Instr ins = instrFor(n, *op, lp.values);
            if (hasConvGeometry(n.op)) {
                auto geo = convGeometry(g, n);
                if (!geo.ok()) return err(where(n) + geo.error());
                ins.geometry = *geo;
            }
            if (hasAugmentSpec(n.op)) {
                auto spec = augmentSpec(g, n);
                if (!spec.ok()) return err(where(n) + spec.error());
                ins.augment = *spec;
            }
            if (ins.op == InstrOp::Cast && ins.out.space == Space::Shadow)
                ins.refreshOnly = opt.update != nullptr;
            if (ins.op == InstrOp::LossGrad && ins.dynamicScale && !lp.lossScaled)
                return err(where(n) + "dynamic_scale without loss scaling in the update");
            lp.code.push_back(ins);
        }
        startBuckets(n.id);
    }

    // Running sums: the loss over the global batch's samples, then each metric's count.
    const int lossOut = g.output("loss");
    if (opt.accumulate && lossOut >= 0) {
        double factor = 1;
        for (const Node& n : g.nodes)
            if (n.op == Op::Loss) {
                factor = std::round(1.0 / n.attrs.scaleOr());
                break;
            }
        auto accumulate = [&](const std::string& name, int node, double f) -> Status {
            const Node& n = g.node(node);
            if (n.dtype != DType::F32 || numElements(n.shape) != 1)
                return err(where(n) + "output " + name + " must be an f32 scalar to accumulate");
            Instr ins;
            ins.op = InstrOp::Accumulate;
            ins.in.push_back(lp.values[static_cast<size_t>(node)]);
            ins.out.space = Space::Accumulator;
            ins.out.index = static_cast<int>(lp.accumulators.size());
            ins.out.offset = ins.out.index * static_cast<int64_t>(sizeof(double));
            ins.out.dtype = DType::F64;
            ins.out.shape = {1};
            ins.factor = f;
            lp.code.push_back(ins);
            lp.accumulators.push_back(name);
            return Status::success();
        };
        TD_RETURN_IF_ERROR(accumulate("loss", lossOut, factor));
        for (const auto& [name, id] : g.outputs)
            if (g.node(id).op == Op::Metric) TD_RETURN_IF_ERROR(accumulate(name, id, 1.0));
    }

    for (size_t b = 0; b < nb; ++b) {
        Instr ins;
        ins.op = InstrOp::AllReduceWait;
        ins.bucket = static_cast<int>(b);
        lp.code.push_back(ins);
    }

    if (opt.update) {
        lp.update = *opt.update;
        const int per = opt.update->slotsPerParam();
        for (size_t i = 0; i < params.size(); ++i) {
            const Node& p = g.node(params[i]);
            if (!p.attrs.trainableOr()) continue;
            UpdateOperands u;
            u.param = static_cast<int>(i);
            u.value = Operand{Space::Param, static_cast<int>(i), 0, p.dtype, p.shape};
            u.grad = Operand{Space::Grad, static_cast<int>(i), 0, DType::F32, p.shape};
            for (int k = 0; k < per; ++k)
                u.slot.push_back(Operand{Space::Slot, lp.slotBuffers++, 0, DType::F32, p.shape});
            for (const Operand& v : lp.values)
                if (v.space == Space::Shadow && v.index == static_cast<int>(i)) u.shadow = v;
            lp.updateTensors.push_back(std::move(u));
        }
        const bool global = opt.update->clip == ClipKind::GlobalNorm;
        if (!opt.fuseUpdate && (global || lp.lossScaled))
            lp.updateNote = std::string("the update stays one multi-tensor pass: ") +
                            (global ? "global_clipnorm" : "loss scaling") +
                            " needs every gradient at once";
        if (opt.fuseUpdate || global || lp.lossScaled) {
            Instr ins;
            ins.op = InstrOp::Update;
            lp.code.push_back(ins);
        } else {
            for (size_t t = 0; t < lp.updateTensors.size(); ++t) {
                Instr ins;
                ins.op = InstrOp::Update;
                ins.tensor = static_cast<int>(t);
                lp.code.push_back(ins);
            }
        }
    }
    return lp;
}

// ---- text form ----------------------------------------------------------------------------------

namespace {

std::string operandText(const Operand& o) {
    std::string s = spaceName(o.space);
    switch (o.space) {
        case Space::Param:
        case Space::Grad:
        case Space::Slot:
        case Space::Shadow:
            s += std::to_string(o.index);
            break;
        case Space::Accumulator:
            s += "[" + std::to_string(o.index) + "]";
            return s;
        case Space::Arena:
        case Space::FlatGrad:
            s += "+" + std::to_string(o.offset);
            break;
        default:
            break;
    }
    return s + " " + dtypeName(o.dtype) + shapeToString(o.shape);
}

const char* updateName(UpdateKind k) {
    switch (k) {
        case UpdateKind::Sgd:
            return "sgd";
        case UpdateKind::Adam:
            return "adam";
        case UpdateKind::RmsProp:
            return "rmsprop";
    }
    return "?";
}

}  // namespace

std::string printProgram(const LoweredProgram& p) {
    std::ostringstream os;
    os << "program " << p.name << " (arena " << p.arenaBytes << " bytes)\n";
    for (size_t i = 0; i < p.code.size(); ++i) {
        const Instr& ins = p.code[i];
        os << "  " << i << ": " << instrOpName(ins.op);
        switch (ins.op) {
            case InstrOp::AllReduceStart:
                os << " bucket " << ins.bucket << " <- " << operandText(ins.out) << "\n";
                continue;
            case InstrOp::AllReduceWait:
                os << " bucket " << ins.bucket << "\n";
                continue;
            case InstrOp::Update: {
                os << " " << (p.update ? updateName(p.update->kind) : "?");
                if (ins.tensor >= 0)
                    os << " (tensor " << ins.tensor << ")";
                else
                    os << " (" << p.updateTensors.size() << " tensors)";
                int shadows = 0;
                for (const UpdateOperands& u : p.updateTensors)
                    shadows += u.shadow.space == Space::Shadow;
                if (shadows) os << " {shadows=" << shadows << "}";
                if (p.lossScaled) os << " {loss_scale}";
                os << "\n";
                continue;
            }
            default:
                break;
        }
        if (ins.node >= 0) os << " %" << ins.node;
        os << " " << operandText(ins.out) << " <-";
        for (size_t j = 0; j < ins.in.size(); ++j) os << (j ? ", " : " ") << operandText(ins.in[j]);
        switch (ins.op) {
            case InstrOp::MatMul:
                os << " {trans_a=" << ins.transA << ", trans_b=" << ins.transB << "}";
                break;
            case InstrOp::Dense:
            case InstrOp::Act:
                os << " {act=" << actName(ins.act) << ", alpha=" << fmtNum(ins.alpha);
                if (ins.op == InstrOp::Act && ins.rate > 0)
                    os << ", rate=" << fmtNum(ins.rate) << ", seed=" << ins.seed;
                os << "}";
                break;
            case InstrOp::ActGrad:
                os << " {act=" << actName(ins.act) << ", alpha=" << fmtNum(ins.alpha)
                   << ", uses_output=" << ins.usesOutput;
                if (ins.rate > 0) os << ", rate=" << fmtNum(ins.rate) << ", seed=" << ins.seed;
                if (ins.out2.space != Space::None) os << ", bias_grad -> " << operandText(ins.out2);
                os << "}";
                break;
            case InstrOp::Cast:
                if (ins.refreshOnly) os << " {refresh_only=1}";
                break;
            case InstrOp::Dropout:
            case InstrOp::DropoutGrad:
                os << " {rate=" << fmtNum(ins.rate) << ", seed=" << ins.seed << "}";
                break;
            case InstrOp::Loss:
            case InstrOp::LossGrad:
                os << " {loss=" << lossKindName(ins.loss) << ", scale=" << fmtNum(ins.scale)
                   << (ins.dynamicScale ? ", dynamic_scale=1" : "") << "}";
                break;
            case InstrOp::Metric:
                os << " {metric=" << metricKindName(ins.metric) << ", k=" << ins.k
                   << ", on_logits=" << ins.onLogits << "}";
                break;
            case InstrOp::RegLoss:
            case InstrOp::RegGrad:
                os << " {l1=" << fmtNum(ins.l1) << ", l2=" << fmtNum(ins.l2) << "}";
                break;
            case InstrOp::Accumulate:
                os << " {factor=" << fmtNum(ins.factor) << "}";
                break;
            case InstrOp::Conv2D:
            case InstrOp::Conv2DGradInput:
            case InstrOp::Conv2DGradFilter:
            case InstrOp::MaxPool:
            case InstrOp::MaxPoolGrad:
            case InstrOp::AvgPool:
            case InstrOp::AvgPoolGrad:
            case InstrOp::Pad2D:
            case InstrOp::Pad2DGrad: {
                const ConvGeometry& w = ins.geometry;
                os << " {window=" << w.kh << "x" << w.kw << ", strides=" << w.sh << "x" << w.sw
                   << ", dilation=" << w.dh << "x" << w.dw << ", pads=" << w.padTop << "x"
                   << w.padBottom << "x" << w.padLeft << "x" << w.padRight;
                if (w.groups != 1) os << ", groups=" << w.groups;
                if (ins.op == InstrOp::Conv2D)
                    os << ", act=" << actName(ins.act) << ", has_bias=" << ins.hasBias;
                os << "}";
                break;
            }
            case InstrOp::Scale:
                os << " {scale=" << fmtNum(ins.scale) << ", offset=" << fmtNum(ins.offset) << "}";
                break;
            case InstrOp::BatchNorm:
            case InstrOp::BatchNormGrad:
            case InstrOp::NormGammaGrad:
            case InstrOp::LayerNorm:
            case InstrOp::LayerNormGrad:
            case InstrOp::LayerNormGammaGrad:
                os << " {epsilon=" << fmtNum(ins.epsilon);
                if (ins.batchStats) os << ", batch_stats=1";
                os << "}";
                break;
            case InstrOp::MovingAvg:
                os << " {momentum=" << fmtNum(ins.momentum) << "}";
                break;
            case InstrOp::Resize:
            case InstrOp::RandomCrop:
            case InstrOp::RandomFlip:
            case InstrOp::RandomRotation:
            case InstrOp::RandomZoom:
            case InstrOp::RandomTranslation:
            case InstrOp::RandomContrast:
            case InstrOp::RandomBrightness:
                os << " {" << augmentText(ins.op, ins.augment) << "}";
                break;
            default:
                break;
        }
        os << "\n";
    }
    return os.str();
}

}  // namespace td
