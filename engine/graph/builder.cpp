#include "engine/graph/builder.h"

#include <algorithm>
#include <cctype>
#include <map>

namespace td {

namespace {

bool isSparse(const LossConfig& l) {
    return l.name == "sparse_categorical_crossentropy";
}
bool isCategorical(const LossConfig& l) {
    return l.name == "categorical_crossentropy";
}
bool isBinary(const LossConfig& l) {
    return l.name == "binary_crossentropy";
}
bool isMse(const LossConfig& l) {
    return l.name == "mean_squared_error" || l.name == "mse";
}

ActKind irActivation(ActivationKind a) {
    switch (a) {
        case ActivationKind::Linear:
            return ActKind::Linear;
        case ActivationKind::Relu:
            return ActKind::Relu;
        case ActivationKind::LeakyRelu:
            return ActKind::LeakyRelu;
        case ActivationKind::Elu:
            return ActKind::Elu;
        case ActivationKind::Gelu:
            return ActKind::Gelu;
        case ActivationKind::Sigmoid:
            return ActKind::Sigmoid;
        case ActivationKind::Tanh:
            return ActKind::Tanh;
        case ActivationKind::Softmax:
            return ActKind::Softmax;
    }
    return ActKind::Linear;
}

FillMode irFill(FillModeKind f) {
    switch (f) {
        case FillModeKind::Reflect:
            return FillMode::Reflect;
        case FillModeKind::Wrap:
            return FillMode::Wrap;
        case FillModeKind::Constant:
            return FillMode::Constant;
        case FillModeKind::Nearest:
            return FillMode::Nearest;
    }
    return FillMode::Reflect;
}

Interp irInterp(InterpolationKind k) {
    return k == InterpolationKind::Nearest ? Interp::Nearest : Interp::Bilinear;
}

FlipMode irFlip(FlipModeKind f) {
    switch (f) {
        case FlipModeKind::Horizontal:
            return FlipMode::Horizontal;
        case FlipModeKind::Vertical:
            return FlipMode::Vertical;
        case FlipModeKind::HorizontalAndVertical:
            return FlipMode::HorizontalAndVertical;
    }
    return FlipMode::HorizontalAndVertical;
}

NodeAttrs matmulAttrs(bool transA, bool transB) {
    NodeAttrs a;
    a.transA = transA;
    a.transB = transB;
    return a;
}

NodeAttrs paramAttrs(const LayerSpec& L, const char* suffix, bool trainable) {
    NodeAttrs a;
    a.name = L.name + "/" + suffix;
    if (!trainable) a.trainable = false;
    return a;
}

// The nodes of a convolutional, pooling, padding, rescaling or normalization layer reading x;
// returns the layer's output (before a Conv2D's activation). Moving statistics updates of a
// training BatchNormalization become graph outputs "moving.<param id>.<layer>_mean" (and
// _variance).
Result<int> addImageLayer(Graph& g, const LayerSpec& L, int x, const Shape& outShape,
                          GraphMode mode, std::vector<std::pair<int, RegularizerSpec>>& regs) {
    const Shape in = g.node(x).shape;  // [B, H, W, C] for the image layers
    auto window = [&](const Shape& kernel, const Shape& dilation) -> Result<NodeAttrs> {
        TD_ASSIGN_OR_RETURN(Window2D w, windowGeometry(in[1], in[2], kernel, effectiveStrides(L),
                                                       dilation, L.samePadding, "window"));
        NodeAttrs a;
        const Shape st = effectiveStrides(L);
        if (st != Shape{1, 1}) a.strides = st;
        if (dilation != Shape{1, 1}) a.dilation = dilation;
        if (w.pads != Shape{0, 0, 0, 0}) a.pads = w.pads;
        return a;
    };
    switch (L.type) {
        case LayerType::Conv2D: {
            int w = g.add(Op::Param, {}, DType::F32,
                          {L.kernelSize[0], L.kernelSize[1], in[3] / L.groups, L.filters},
                          paramAttrs(L, "kernel", L.trainable));
            if (L.kernelRegularizer.active()) regs.emplace_back(w, L.kernelRegularizer);
            TD_ASSIGN_OR_RETURN(NodeAttrs a, window(L.kernelSize, L.dilationRate));
            if (L.groups != 1) a.groups = L.groups;
            int y = g.add(Op::Conv2D, {x, w}, DType::F32, outShape, a);
            if (L.useBias) {
                int b = g.add(Op::Param, {}, DType::F32, {L.filters},
                              paramAttrs(L, "bias", L.trainable));
                if (L.biasRegularizer.active()) regs.emplace_back(b, L.biasRegularizer);
                y = g.add(Op::BiasAdd, {y, b}, DType::F32, outShape);
            }
            return y;
        }
        case LayerType::MaxPooling2D:
        case LayerType::AveragePooling2D: {
            TD_ASSIGN_OR_RETURN(NodeAttrs a, window(L.poolSize, Shape{1, 1}));
            a.window = L.poolSize;
            return g.add(L.type == LayerType::MaxPooling2D ? Op::MaxPool : Op::AvgPool, {x},
                         DType::F32, outShape, a);
        }
        case LayerType::GlobalAveragePooling2D: {
            NodeAttrs a;
            a.window = Shape{in[1], in[2]};
            int p = g.add(Op::AvgPool, {x}, DType::F32, {in[0], 1, 1, in[3]}, a);
            return g.add(Op::Reshape, {p}, DType::F32, outShape);
        }
        case LayerType::ZeroPadding2D: {
            NodeAttrs a;
            a.pads = L.zeroPadding;
            return g.add(Op::Pad2D, {x}, DType::F32, outShape, a);
        }
        case LayerType::Rescaling: {
            NodeAttrs a;
            a.scale = textNumber(L.rescale);
            a.offset = textNumber(L.offset);
            return g.add(Op::Scale, {x}, DType::F32, outShape, a);
        }
        case LayerType::BatchNormalization:
        case LayerType::LayerNormalization: {
            const Shape c{in.back()};
            std::vector<int> gb;
            if (L.scale)
                gb.push_back(
                    g.add(Op::Param, {}, DType::F32, c, paramAttrs(L, "gamma", L.trainable)));
            if (L.center)
                gb.push_back(
                    g.add(Op::Param, {}, DType::F32, c, paramAttrs(L, "beta", L.trainable)));
            NodeAttrs a;
            a.epsilon = textNumber(L.epsilon);
            if (L.scale) a.hasGamma = true;
            if (L.center) a.hasBeta = true;
            if (L.type == LayerType::LayerNormalization) {
                std::vector<int> ops{x};
                ops.insert(ops.end(), gb.begin(), gb.end());
                return g.add(Op::LayerNorm, ops, DType::F32, outShape, a);
            }
            int mm = g.add(Op::Param, {}, DType::F32, c, paramAttrs(L, "moving_mean", false));
            int mv = g.add(Op::Param, {}, DType::F32, c, paramAttrs(L, "moving_variance", false));
            int mean = mm, var = mv;
            // Keras: a training step normalizes with the batch's statistics and moves the moving
            // ones towards them; a frozen layer (trainable=False) runs in inference mode.
            if (mode == GraphMode::Train && L.trainable) {
                mean = g.add(Op::ChannelMean, {x}, DType::F32, c);
                var = g.add(Op::ChannelVar, {x, mean}, DType::F32, c);
                NodeAttrs ma;
                ma.momentum = textNumber(L.momentum);
                // Output names stay words of the text form: "moving.<param id>.<layer>_mean".
                auto outputName = [&](int param, const char* what) {
                    std::string layer = L.name;
                    for (char& ch : layer)
                        if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' &&
                            ch != '.' && ch != '-')
                            ch = '_';
                    return "moving." + std::to_string(param) + "." + layer + "_" + what;
                };
                g.outputs.emplace_back(outputName(mm, "mean"),
                                       g.add(Op::MovingAvg, {mm, mean}, DType::F32, c, ma));
                g.outputs.emplace_back(outputName(mv, "variance"),
                                       g.add(Op::MovingAvg, {mv, var}, DType::F32, c, ma));
            }
            std::vector<int> ops{x, mean, var};
            ops.insert(ops.end(), gb.begin(), gb.end());
            return g.add(Op::BatchNorm, ops, DType::F32, outShape, a);
        }
        default:
            return err(std::string("buildGraph: no nodes for layer type ") + layerTypeName(L.type));
    }
}

// The nodes of a preprocessing or augmentation layer reading x; returns x itself where the layer
// is the identity (a Random* layer outside training, a Resizing to the same size). `seed` keys a
// random layer's draws (with the step and each sample's global index).
int addPreprocessingLayer(Graph& g, const LayerSpec& L, int x, const Shape& outShape,
                          GraphMode mode, uint64_t seed) {
    const Shape in = g.node(x).shape;  // [B, H, W, C]
    auto resize = [&](const ResizeBox& b) {
        if (b.top == 0 && b.left == 0 && b.height == in[1] && b.width == in[2] && outShape == in)
            return x;  // the whole image at its own size: tf.image.resize copies it
        NodeAttrs a;
        a.box = std::vector<int64_t>{b.top, b.left, b.height, b.width};
        // CenterCrop's and RandomCrop's smart_resize is bilinear; only Resizing pads.
        const bool resizing = L.type == LayerType::Resizing;
        a.interp = resizing ? irInterp(L.interpolation) : Interp::Bilinear;
        if (resizing && L.fillValue != 0.0) a.fillValue = textNumber(L.fillValue);
        return g.add(Op::Resize, {x}, DType::F32, outShape, a);
    };
    if (L.type == LayerType::Resizing || L.type == LayerType::CenterCrop)
        return resize(resizeBoxFor(L, in[1], in[2]));
    // Keras: a random crop only where the image is larger both ways, otherwise (and at
    // inference) smart_resize's crop.
    if (L.type == LayerType::RandomCrop &&
        !(mode == GraphMode::Train && in[1] > L.targetHeight && in[2] > L.targetWidth))
        return resize(resizeBoxFor(L, in[1], in[2]));
    if (mode != GraphMode::Train) return x;  // Keras: the Random* layers pass inference through
    NodeAttrs a;
    a.seed = seed;
    auto transform = [&] {  // the geometric ones' fill and interpolation
        a.fill = irFill(L.fillMode);
        a.interp = irInterp(L.interpolation);
        if (L.fillValue != 0.0) a.fillValue = textNumber(L.fillValue);
    };
    auto factor = [&](const FactorRange& r) {
        a.factorLo = textNumber(r.lower);
        a.factorHi = textNumber(r.upper);
    };
    Op op = Op::RandomFlip;
    switch (L.type) {
        case LayerType::RandomCrop:
            op = Op::RandomCrop;
            break;
        case LayerType::RandomFlip:
            a.flip = irFlip(L.flipMode);
            break;
        case LayerType::RandomRotation:
            op = Op::RandomRotation;
            transform();
            factor(L.factor);
            break;
        case LayerType::RandomZoom:
        case LayerType::RandomTranslation:
            op = L.type == LayerType::RandomZoom ? Op::RandomZoom : Op::RandomTranslation;
            transform();
            factor(L.heightFactor);
            if (L.widthFactor) {
                a.widthLo = textNumber(L.widthFactor->lower);
                a.widthHi = textNumber(L.widthFactor->upper);
            }
            break;
        default:  // RandomContrast, RandomBrightness
            op = L.type == LayerType::RandomContrast ? Op::RandomContrast : Op::RandomBrightness;
            factor(L.factor);
            a.valueLo = textNumber(L.valueLow);
            a.valueHi = textNumber(L.valueHigh);
            break;
    }
    return g.add(op, {x}, DType::F32, outShape, a);
}

}  // namespace

Result<std::vector<MetricSpec>> resolveMetrics(const std::vector<std::string>& names,
                                               const LossConfig& loss) {
    std::vector<MetricSpec> out;
    for (const std::string& raw : names) {
        std::string n = raw;
        std::transform(n.begin(), n.end(), n.begin(),
                       [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        MetricSpec m;
        m.key = n;
        if (n == "accuracy" || n == "acc") {
            m.key = "accuracy";
            if (isSparse(loss))
                m.kind = MetricKind::SparseCategorical;
            else if (isCategorical(loss))
                m.kind = MetricKind::Categorical;
            else if (isBinary(loss))
                m.kind = MetricKind::Binary;
            else
                return err("metric 'accuracy' needs a classification loss, not " + loss.name);
        } else if (n == "sparse_categorical_accuracy") {
            m.kind = MetricKind::SparseCategorical;
        } else if (n == "categorical_accuracy") {
            m.kind = MetricKind::Categorical;
        } else if (n == "binary_accuracy") {
            m.kind = MetricKind::Binary;
        } else if (n.find("top") != std::string::npos) {
            // "sparse_top_k_categorical_accuracy" (k=5), "sparse_top_3_categorical_accuracy",
            // "top_k_categorical_accuracy", "top5"...
            m.k = 5;
            for (size_t i = 0; i < n.size(); ++i)
                if (std::isdigit(static_cast<unsigned char>(n[i]))) {
                    m.k = std::atoll(n.c_str() + i);
                    break;
                }
            bool sparse = n.rfind("sparse", 0) == 0 || (n.rfind("top", 0) == 0 && isSparse(loss));
            m.kind = sparse ? MetricKind::SparseTopK : MetricKind::TopK;
            if (m.k < 1) return err("metric '" + raw + "': k must be >= 1");
        } else {
            return err("unknown metric '" + raw +
                       "' (expected accuracy, sparse_categorical_accuracy, categorical_accuracy, "
                       "binary_accuracy, sparse_top_k_categorical_accuracy, "
                       "top_k_categorical_accuracy)");
        }
        bool sparseKind =
            m.kind == MetricKind::SparseCategorical || m.kind == MetricKind::SparseTopK;
        if (sparseKind && !isSparse(loss))
            return err("metric '" + raw + "' needs integer class labels, but loss " + loss.name +
                       " uses one-hot or real-valued targets");
        if ((m.kind == MetricKind::Categorical || m.kind == MetricKind::TopK) &&
            !isCategorical(loss))
            return err("metric '" + raw + "' needs one-hot labels (categorical_crossentropy)");
        out.push_back(m);
    }
    return out;
}

Result<LabelSpec> labelSpecFor(const LossConfig& loss, const Shape& out) {
    if (out.size() != 1)
        return err("loss " + loss.name + " expects a flat model output, got " + shapeToString(out));
    if (isSparse(loss)) {
        if (out[0] < 2)
            return err("loss sparse_categorical_crossentropy needs at least 2 output units, got " +
                       std::to_string(out[0]));
        return LabelSpec{DType::I32, {}};
    }
    if (isCategorical(loss) || isBinary(loss) || isMse(loss)) return LabelSpec{DType::F32, out};
    return err("unknown loss '" + loss.name +
               "' (expected sparse_categorical_crossentropy, categorical_crossentropy, "
               "binary_crossentropy, mean_squared_error)");
}

Result<Graph> buildGraph(const ModelSpec& model, const ModelInfo& info, const BuildOptions& opt) {
    Graph g;
    g.name = opt.mode == GraphMode::Train  ? "train"
             : opt.mode == GraphMode::Eval ? "eval"
                                           : "predict";
    const int64_t B = opt.batch;
    auto withBatch = [&](const Shape& s) {
        Shape r{B};
        r.insert(r.end(), s.begin(), s.end());
        return r;
    };
    int x = g.add(Op::Input, {}, DType::F32, withBatch(info.inputShape));
    std::vector<std::pair<int, RegularizerSpec>> regs;
    int lastAct = -1;  // node id of a trailing Act, to pair softmax/sigmoid with the loss

    size_t layerIdx = 0;
    for (const LayerSpec& L : model.layers) {
        if (L.type == LayerType::Input) continue;
        const LayerInfo& li = info.layers.at(layerIdx++);
        const Shape outShape = withBatch(li.outputShape);
        lastAct = -1;
        g.layerScope = L.name;
        auto addAct = [&](int in, ActivationKind a) {
            if (a == ActivationKind::Linear) return in;
            NodeAttrs at;
            at.act = irActivation(a);
            if (a == ActivationKind::LeakyRelu) at.alpha = textNumber(L.negativeSlope);
            if (a == ActivationKind::Elu) at.alpha = textNumber(L.eluAlpha);
            int id = g.add(Op::Act, {in}, DType::F32, g.node(in).shape, at);
            lastAct = id;
            return id;
        };
        switch (L.type) {
            case LayerType::Flatten:
            case LayerType::Reshape:
                if (g.node(x).shape != outShape) x = g.add(Op::Reshape, {x}, DType::F32, outShape);
                break;
            case LayerType::Dense: {
                const int64_t in = g.node(x).shape[1];
                NodeAttrs pa;
                pa.name = L.name + "/kernel";
                if (!L.trainable) pa.trainable = false;
                int w = g.add(Op::Param, {}, DType::F32, {in, L.units}, pa);
                if (L.kernelRegularizer.active()) regs.emplace_back(w, L.kernelRegularizer);
                x = g.add(Op::MatMul, {x, w}, DType::F32, outShape, matmulAttrs(false, false));
                if (L.useBias) {
                    NodeAttrs pb;
                    pb.name = L.name + "/bias";
                    if (!L.trainable) pb.trainable = false;
                    int b = g.add(Op::Param, {}, DType::F32, {L.units}, pb);
                    if (L.biasRegularizer.active()) regs.emplace_back(b, L.biasRegularizer);
                    x = g.add(Op::BiasAdd, {x, b}, DType::F32, outShape);
                }
                x = addAct(x, L.activation);
                break;
            }
            case LayerType::Activation:
                x = addAct(x, L.activation);
                break;
            case LayerType::Dropout:
                if (opt.mode == GraphMode::Train && L.rate > 0) {
                    uint64_t seed = L.seed ? *L.seed : opt.seed * 1000003ull + layerIdx;
                    NodeAttrs da;
                    da.rate = textNumber(L.rate);
                    da.seed = seed;
                    x = g.add(Op::Dropout, {x}, DType::F32, g.node(x).shape, da);
                }
                break;
            case LayerType::Input:
                break;
            case LayerType::Resizing:
            case LayerType::CenterCrop:
            case LayerType::RandomCrop:
            case LayerType::RandomFlip:
            case LayerType::RandomRotation:
            case LayerType::RandomZoom:
            case LayerType::RandomTranslation:
            case LayerType::RandomContrast:
            case LayerType::RandomBrightness:
                x = addPreprocessingLayer(g, L, x, outShape, opt.mode,
                                          L.seed ? *L.seed : opt.seed * 1000003ull + layerIdx);
                break;
            default: {
                TD_ASSIGN_OR_RETURN(x, addImageLayer(g, L, x, outShape, opt.mode, regs));
                x = addAct(x, L.type == LayerType::Conv2D ? L.activation : ActivationKind::Linear);
                break;
            }
        }
    }
    const int pred = x;
    if (opt.mode == GraphMode::Predict || opt.predictions)
        g.outputs.emplace_back("predictions", pred);
    if (opt.mode == GraphMode::Predict) return g;

    TD_ASSIGN_OR_RETURN(LabelSpec ls, labelSpecFor(opt.loss, info.outputShape));
    int y = g.add(Op::Label, {}, ls.dtype, withBatch(ls.shape));

    // Pick the loss kernel; pair a trailing softmax/sigmoid with its loss so the pair is
    // computed stably from logits.
    const Node* last = lastAct == pred ? &g.node(pred) : nullptr;
    LossKind lossKind = LossKind::Mse;
    int lossIn = pred;
    bool onLogits = false;
    const LossConfig& L = opt.loss;
    if (isSparse(L) || isCategorical(L)) {
        const LossKind fused = isSparse(L) ? LossKind::SparseSoftmaxXent : LossKind::SoftmaxXent;
        const LossKind probs = isSparse(L) ? LossKind::SparseXent : LossKind::Xent;
        if (L.fromLogits) {
            lossKind = fused;
            onLogits = true;
        } else if (last && last->attrs.act == ActKind::Softmax && opt.fuseSoftmaxXent) {
            lossKind = fused;
            lossIn = last->inputs[0];
            onLogits = true;
        } else {
            lossKind = probs;
        }
    } else if (isBinary(L)) {
        if (L.fromLogits) {
            lossKind = LossKind::SigmoidBce;
            onLogits = true;
        } else if (last && last->attrs.act == ActKind::Sigmoid && opt.fuseSoftmaxXent) {
            lossKind = LossKind::SigmoidBce;
            lossIn = last->inputs[0];
            onLogits = true;
        } else {
            lossKind = LossKind::Bce;
        }
    } else {
        lossKind = LossKind::Mse;
    }
    // tf.distribute: each replica sums the loss over its rows and divides by the global batch;
    // a regularization term is added once per replica, so each replica adds 1/replicas of it.
    // Summed over the replicas, loss and gradients are those of one device with the global batch.
    const int64_t globalBatch = opt.globalBatch > 0 ? opt.globalBatch : B;
    g.layerScope = "the loss";
    NodeAttrs la;
    la.loss = lossKind;
    la.scale = textNumber(1.0 / static_cast<double>(globalBatch));
    int loss = g.add(Op::Loss, {lossIn, y}, DType::F32, {1}, la);
    const double regScale = 1.0 / static_cast<double>(std::max(1, opt.replicas));
    for (const auto& [p, r] : regs) {
        NodeAttrs ra;
        ra.l1 = textNumber(r.l1 * regScale);
        ra.l2 = textNumber(r.l2 * regScale);
        int rl = g.add(Op::RegLoss, {p}, DType::F32, {1}, ra);
        loss = g.add(Op::Add, {loss, rl}, DType::F32, {1});
    }
    g.outputs.emplace_back("loss", loss);

    TD_ASSIGN_OR_RETURN(auto metrics, resolveMetrics(opt.metrics, opt.loss));
    for (const MetricSpec& m : metrics) {
        NodeAttrs ma;
        ma.metric = m.kind;
        ma.k = m.k;
        ma.onLogits = onLogits;
        int id = g.add(Op::Metric, {lossIn, y}, DType::F32, {1}, ma);
        g.outputs.emplace_back(m.key, id);
    }
    g.layerScope.clear();
    if (opt.compute != DType::F32) g = insertCasts(g, opt.compute, opt.halfConv);
    TD_RETURN_IF_ERROR(verifyGraph(g));
    return g;
}

// The shortest sum (KH * KW * C/groups terms) a 16-bit convolution computes (see insertCasts).
constexpr int64_t kMinHalfConvDepth = 64;

Graph insertCasts(const Graph& fwd, DType compute, bool halfConv) {
    Graph g;
    g.name = fwd.name;
    std::vector<int> remap(fwd.nodes.size(), -1);
    std::map<std::pair<int, DType>, int> casts;  // (value, dtype) -> its cast, made once
    auto castTo = [&](int v, DType dt) {
        if (g.node(v).dtype == dt) return v;
        auto [it, fresh] = casts.try_emplace({v, dt}, -1);
        if (fresh) it->second = g.add(Op::Cast, {v}, dt, g.node(v).shape);
        return it->second;
    };
    for (const Node& n : fwd.nodes) {
        g.layerScope = n.layer;  // its casts belong to its layer
        std::vector<int> in;
        for (int i : n.inputs) in.push_back(remap[static_cast<size_t>(i)]);
        DType dt = n.dtype;
        switch (n.op) {
            case Op::Conv2D: {
                // With halfConv its image and kernel in `compute`; the result in f32 either way
                // (16-bit convolutions accumulate in f32): the bias, activation, normalization
                // and pooling after it then read it without a cast. A convolution whose sums
                // are short (a first layer over one or three channels) stays f32: its 16-bit
                // kernel gains nothing there and the casts of x and dy would be all it adds.
                const Shape& k = fwd.node(n.inputs[1]).shape;  // [KH, KW, C/groups, F]
                const bool half = halfConv && k[0] * k[1] * k[2] >= kMinHalfConvDepth;
                for (int& v : in) v = castTo(v, half ? compute : DType::F32);
                dt = DType::F32;
                break;
            }
            case Op::MatMul:
            case Op::Dense:
                in[0] = castTo(in[0], compute);
                in[1] = castTo(in[1], compute);
                dt = compute;
                break;
            case Op::BiasAdd:
            case Op::Dropout:
            case Op::Reshape:
                dt = g.node(in[0]).dtype;
                break;
            case Op::Act:
                if (n.attrs.actOr() == ActKind::Softmax) in[0] = castTo(in[0], DType::F32);
                dt = g.node(in[0]).dtype;
                break;
            case Op::Loss:
            case Op::Metric:
                in[0] = castTo(in[0], DType::F32);
                break;
            case Op::MaxPool:
            case Op::AvgPool:
            case Op::Pad2D:
            case Op::Scale:
            case Op::ChannelMean:
            case Op::ChannelVar:
            case Op::BatchNorm:
            case Op::LayerNorm:
            case Op::MovingAvg:
            case Op::Resize:
            case Op::RandomCrop:
            case Op::RandomFlip:
            case Op::RandomRotation:
            case Op::RandomZoom:
            case Op::RandomTranslation:
            case Op::RandomContrast:
            case Op::RandomBrightness:
                // Computed in f32 (normalization as Keras does; the other image ops have no
                // 16-bit kernels here): their operands are cast to f32.
                for (int& v : in) v = castTo(v, DType::F32);
                dt = DType::F32;
                break;
            default:
                break;
        }
        remap[static_cast<size_t>(n.id)] = g.add(n.op, std::move(in), dt, n.shape, n.attrs);
    }
    g.layerScope = "the loss";
    for (const auto& [name, id] : fwd.outputs) {
        int v = remap[static_cast<size_t>(id)];
        if (name == "predictions") v = castTo(v, DType::F32);
        g.outputs.emplace_back(name, v);
    }
    g.layerScope.clear();
    return g;
}

// ---- autodiff
// ------------------------------------------------------------------------------------

namespace {
bool actUsesOutput(ActKind act) {
    return act == ActKind::Relu || act == ActKind::Sigmoid || act == ActKind::Tanh ||
           act == ActKind::Softmax;
}
}  // namespace

Status autodiff(Graph& g, bool dynamicLossScale) {
    const int root = g.output("loss");
    if (root < 0) return err("autodiff: the graph has no 'loss' output");
    const size_t n0 = g.nodes.size();

    // Which nodes depend on a trainable param (only those need gradients).
    std::vector<bool> needs(n0, false);
    for (size_t i = 0; i < n0; ++i) {
        const Node& nd = g.nodes[i];
        if (nd.op == Op::Param) needs[i] = nd.attrs.trainableOr();
        for (int in : nd.inputs) needs[i] = needs[i] || needs[static_cast<size_t>(in)];
    }

    // Loss terms: leaves of the add-tree under the root.
    std::vector<int> terms, stack{root};
    while (!stack.empty()) {
        int id = stack.back();
        stack.pop_back();
        const Node& nd = g.node(id);
        if (nd.op == Op::Add) {
            stack.push_back(nd.inputs[0]);
            stack.push_back(nd.inputs[1]);
        } else if (nd.op == Op::Loss || nd.op == Op::RegLoss) {
            terms.push_back(id);
        } else {
            return err("autodiff: the loss must be a sum of loss and reg_loss terms, found " +
                       std::string(opName(nd.op)) + " %" + std::to_string(id));
        }
    }

    std::vector<std::vector<int>> contrib(n0);
    std::map<int, RegularizerSpec> regOf;
    for (int t : terms) {
        const Node nd = g.node(t);
        if (nd.op == Op::RegLoss) {
            regOf[nd.inputs[0]] =
                RegularizerSpec{nd.attrs.l1.value_or(0.0), nd.attrs.l2.value_or(0.0)};
            continue;
        }
        int pred = nd.inputs[0];
        if (!needs[static_cast<size_t>(pred)]) continue;
        g.layerScope = nd.layer;
        NodeAttrs la = nd.attrs;
        if (dynamicLossScale) la.dynamicScale = true;
        int d =
            g.add(Op::LossGrad, {pred, nd.inputs[1]}, g.node(pred).dtype, g.node(pred).shape, la);
        contrib[static_cast<size_t>(pred)].push_back(d);
    }

    auto sumOf = [&](size_t id) {
        auto& c = contrib[id];
        int acc = c[0];
        for (size_t i = 1; i < c.size(); ++i)
            acc = g.add(Op::Add, {acc, c[i]}, g.node(acc).dtype, g.node(acc).shape);
        return acc;
    };

    for (size_t ii = n0; ii-- > 0;) {
        if (contrib[ii].empty()) continue;
        const Node nd = g.nodes[ii];  // copy: g.nodes grows below
        if (nd.op == Op::Param) continue;
        g.layerScope = nd.layer;  // a gradient belongs to the layer of what it differentiates
        const int dy = sumOf(ii);
        auto give = [&](int input, int grad) {
            contrib[static_cast<size_t>(input)].push_back(grad);
        };
        auto wants = [&](int input) { return needs[static_cast<size_t>(input)]; };
        // A gradient has the dtype of the value it is the gradient of.
        auto dt = [&](int input) { return g.node(input).dtype; };
        switch (nd.op) {
            case Op::Reshape:
                if (wants(nd.inputs[0]))
                    give(nd.inputs[0],
                         g.add(Op::Reshape, {dy}, dt(nd.inputs[0]), g.node(nd.inputs[0]).shape));
                break;
            case Op::MatMul: {
                if (nd.attrs.transA.value_or(false) || nd.attrs.transB.value_or(false))
                    return err("autodiff: transposed matmul in a forward graph is not supported");
                int a = nd.inputs[0], b = nd.inputs[1];
                if (wants(a))  // dA = dY B^T
                    give(a, g.add(Op::MatMul, {dy, b}, dt(a), g.node(a).shape,
                                  matmulAttrs(false, true)));
                if (wants(b))  // dB = A^T dY
                    give(b, g.add(Op::MatMul, {a, dy}, dt(b), g.node(b).shape,
                                  matmulAttrs(true, false)));
                break;
            }
            case Op::BiasAdd:
                if (wants(nd.inputs[0])) give(nd.inputs[0], dy);
                if (wants(nd.inputs[1]))
                    give(nd.inputs[1],
                         g.add(Op::BiasGrad, {dy}, dt(nd.inputs[1]), g.node(nd.inputs[1]).shape));
                break;
            case Op::Act: {
                if (!wants(nd.inputs[0])) break;
                NodeAttrs attrs = nd.attrs;
                const bool useOut = actUsesOutput(nd.attrs.actOr());
                attrs.usesOutput = useOut;
                int saved = useOut ? nd.id : nd.inputs[0];
                give(nd.inputs[0],
                     g.add(Op::ActGrad, {dy, saved}, dt(nd.inputs[0]), nd.shape, attrs));
                break;
            }
            case Op::Dropout:
                if (wants(nd.inputs[0]))
                    give(nd.inputs[0],
                         g.add(Op::DropoutGrad, {dy}, dt(nd.inputs[0]), nd.shape, nd.attrs));
                break;
            case Op::Add:
                if (wants(nd.inputs[0])) give(nd.inputs[0], dy);
                if (wants(nd.inputs[1])) give(nd.inputs[1], dy);
                break;
            case Op::Conv2D: {
                if (nd.inputs.size() != 2 || nd.attrs.act)
                    return err("autodiff: conv2d %" + std::to_string(nd.id) +
                               " with a fused bias or activation (run fusion after autodiff)");
                const int x = nd.inputs[0], w = nd.inputs[1];
                NodeAttrs a = nd.attrs;
                // The gradients read dy in the operands' dtype (16-bit operands, an f32 result:
                // mixed precision's convolutions), cast once for both.
                const int dyOp =
                    g.node(dy).dtype == dt(w) ? dy : g.add(Op::Cast, {dy}, dt(w), g.node(dy).shape);
                if (wants(x))
                    give(x, g.add(Op::Conv2DGradInput, {dyOp, w}, dt(x), g.node(x).shape, a));
                if (wants(w))
                    give(w, g.add(Op::Conv2DGradFilter, {x, dyOp}, dt(w), g.node(w).shape, a));
                break;
            }
            case Op::MaxPool:
                if (wants(nd.inputs[0]))
                    give(nd.inputs[0], g.add(Op::MaxPoolGrad, {dy, nd.inputs[0]}, dt(nd.inputs[0]),
                                             g.node(nd.inputs[0]).shape, nd.attrs));
                break;
            case Op::AvgPool:
                if (wants(nd.inputs[0]))
                    give(nd.inputs[0], g.add(Op::AvgPoolGrad, {dy}, dt(nd.inputs[0]),
                                             g.node(nd.inputs[0]).shape, nd.attrs));
                break;
            case Op::Pad2D:
                if (wants(nd.inputs[0]))
                    give(nd.inputs[0], g.add(Op::Pad2DGrad, {dy}, dt(nd.inputs[0]),
                                             g.node(nd.inputs[0]).shape, nd.attrs));
                break;
            case Op::Scale:
                if (wants(nd.inputs[0])) {
                    NodeAttrs a;
                    a.scale = nd.attrs.scale;
                    give(nd.inputs[0],
                         g.add(Op::Scale, {dy}, dt(nd.inputs[0]), g.node(nd.inputs[0]).shape, a));
                }
                break;
            case Op::BatchNorm: {
                const int x = nd.inputs[0], mean = nd.inputs[1], var = nd.inputs[2];
                const bool hasGamma = nd.attrs.hasGamma.value_or(false);
                const bool hasBeta = nd.attrs.hasBeta.value_or(false);
                const int gamma = hasGamma ? nd.inputs[3] : -1;
                const int beta = hasBeta ? nd.inputs[3 + hasGamma] : -1;
                NodeAttrs eps;
                eps.epsilon = nd.attrs.epsilon;
                if (wants(x)) {
                    NodeAttrs a = eps;
                    if (hasGamma) a.hasGamma = true;
                    // Batch statistics depend on x: their part of the gradient is in dx.
                    if (g.node(mean).op == Op::ChannelMean) a.batchStats = true;
                    std::vector<int> ops{dy, x, mean, var};
                    if (hasGamma) ops.push_back(gamma);
                    give(x, g.add(Op::BatchNormGrad, ops, dt(x), g.node(x).shape, a));
                }
                if (hasGamma && wants(gamma))
                    give(gamma, g.add(Op::NormGammaGrad, {dy, x, mean, var}, dt(gamma),
                                      g.node(gamma).shape, eps));
                if (hasBeta && wants(beta))
                    give(beta, g.add(Op::BiasGrad, {dy}, dt(beta), g.node(beta).shape));
                break;
            }
            case Op::LayerNorm: {
                const int x = nd.inputs[0];
                const bool hasGamma = nd.attrs.hasGamma.value_or(false);
                const bool hasBeta = nd.attrs.hasBeta.value_or(false);
                const int gamma = hasGamma ? nd.inputs[1] : -1;
                const int beta = hasBeta ? nd.inputs[1 + hasGamma] : -1;
                NodeAttrs eps;
                eps.epsilon = nd.attrs.epsilon;
                if (wants(x)) {
                    NodeAttrs a = eps;
                    if (hasGamma) a.hasGamma = true;
                    std::vector<int> ops{dy, x};
                    if (hasGamma) ops.push_back(gamma);
                    give(x, g.add(Op::LayerNormGrad, ops, dt(x), g.node(x).shape, a));
                }
                if (hasGamma && wants(gamma))
                    give(gamma, g.add(Op::LayerNormGammaGrad, {dy, x}, dt(gamma),
                                      g.node(gamma).shape, eps));
                if (hasBeta && wants(beta))
                    give(beta, g.add(Op::BiasGrad, {dy}, dt(beta), g.node(beta).shape));
                break;
            }
            case Op::RandomFlip:  // a flip is its own inverse: the same flip of the gradient
                if (wants(nd.inputs[0]))
                    give(nd.inputs[0],
                         g.add(Op::RandomFlip, {dy}, dt(nd.inputs[0]), nd.shape, nd.attrs));
                break;
            case Op::Resize: {  // a plain crop (CenterCrop): the gradient padded with zeros
                const int x = nd.inputs[0];
                if (!wants(x)) break;
                const Shape& xs = g.node(x).shape;
                const std::vector<int64_t> b = nd.attrs.box.value_or(std::vector<int64_t>{});
                if (b.size() != 4 || b[0] < 0 || b[1] < 0 || b[2] != nd.shape[1] ||
                    b[3] != nd.shape[2] || b[0] + b[2] > xs[1] || b[1] + b[3] > xs[2])
                    return err("autodiff: resize %" + std::to_string(nd.id) +
                               " resizes (only a plain crop has a gradient rule); place it "
                               "before any layer with trainable weights");
                NodeAttrs a;
                a.pads = std::vector<int64_t>{b[0], xs[1] - b[0] - b[2], b[1], xs[2] - b[1] - b[3]};
                give(x, g.add(Op::Pad2D, {dy}, dt(x), xs, a));
                break;
            }
            case Op::Cast:  // the gradient goes back to the operand's dtype
                if (wants(nd.inputs[0]))
                    give(nd.inputs[0],
                         g.add(Op::Cast, {dy}, dt(nd.inputs[0]), g.node(nd.inputs[0]).shape));
                break;
            default:
                return err(std::string("autodiff: no gradient rule for ") + opName(nd.op) + " %" +
                           std::to_string(nd.id));
        }
    }

    for (int p : g.params()) {
        const Node& pn = g.node(p);
        if (!pn.attrs.trainableOr()) continue;
        auto& c = contrib[static_cast<size_t>(p)];
        if (c.empty()) continue;
        g.layerScope = pn.layer;
        int gr = sumOf(static_cast<size_t>(p));
        auto it = regOf.find(p);
        if (it != regOf.end()) {
            NodeAttrs ra;
            ra.l1 = it->second.l1;  // as the reg_loss holds them
            ra.l2 = it->second.l2;
            gr = g.add(Op::RegGrad, {gr, p}, pn.dtype, pn.shape, ra);
        }
        g.grads[p] = gr;
    }
    g.layerScope.clear();
    return verifyGraph(g);
}

}  // namespace td
