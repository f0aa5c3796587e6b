#include "engine/io/onnx_export.h"

#include <cmath>

#include "engine/io/protobuf_wire.h"
#include "engine/io/zip_archive.h"

namespace td {

namespace {

// onnx.proto field numbers and enum values used here.
namespace f {
constexpr int kModelIrVersion = 1, kModelProducerName = 2, kModelProducerVersion = 3,
              kModelGraph = 7, kModelOpsetImport = 8;
constexpr int kOpsetDomain = 1, kOpsetVersion = 2;
constexpr int kGraphNode = 1, kGraphName = 2, kGraphInitializer = 5, kGraphInput = 11,
              kGraphOutput = 12;
constexpr int kNodeInput = 1, kNodeOutput = 2, kNodeName = 3, kNodeOpType = 4, kNodeAttribute = 5;
constexpr int kAttrName = 1, kAttrF = 2, kAttrI = 3, kAttrS = 4, kAttrInts = 8, kAttrType = 20;
constexpr int kAttrTypeFloat = 1, kAttrTypeInt = 2, kAttrTypeString = 3, kAttrTypeInts = 7;
constexpr int kTensorDims = 1, kTensorDataType = 2, kTensorName = 8, kTensorRawData = 9;
constexpr int kTypeFloat = 1, kTypeInt64 = 7;
constexpr int kValueInfoName = 1, kValueInfoType = 2;
constexpr int kTypeTensorType = 1;
constexpr int kTensorTypeElemType = 1, kTensorTypeShape = 2;
constexpr int kShapeDim = 1;
constexpr int kDimValue = 1, kDimParam = 2;
}  // namespace f

struct Attr {
    std::string name;
    bool isFloat = false;
    float f = 0;
    int64_t i = 0;
    std::vector<int64_t> ints;  // an INTS attribute when not empty
    std::string s;              // a STRING attribute when not empty
};

Attr text(const std::string& name, const std::string& value) {
    Attr a;
    a.name = name;
    a.s = value;
    return a;
}

Attr ints(const std::string& name, std::vector<int64_t> values) {
    Attr a;
    a.name = name;
    a.ints = std::move(values);
    return a;
}

// The graph under construction: nodes and initializers in order, each value named once.
class GraphWriter {
  public:
    std::string node(const std::string& op, const std::string& name,
                     const std::vector<std::string>& inputs, const std::vector<Attr>& attrs = {},
                     const std::string& output = "") {
        const std::string out = output.empty() ? name + ":0" : output;
        proto::Writer n;
        for (const std::string& in : inputs) n.bytes(f::kNodeInput, in);
        n.bytes(f::kNodeOutput, out);
        n.bytes(f::kNodeName, name);
        n.bytes(f::kNodeOpType, op);
        for (const Attr& a : attrs) {
            proto::Writer w;
            w.bytes(f::kAttrName, a.name);
            if (!a.ints.empty()) {
                for (int64_t v : a.ints) w.varintSigned(f::kAttrInts, v);
                w.varint(f::kAttrType, f::kAttrTypeInts);
            } else if (!a.s.empty()) {
                w.bytes(f::kAttrS, a.s);
                w.varint(f::kAttrType, f::kAttrTypeString);
            } else {
                if (a.isFloat)
                    w.float32(f::kAttrF, a.f);
                else
                    w.varintSigned(f::kAttrI, a.i);
                w.varint(f::kAttrType, a.isFloat ? f::kAttrTypeFloat : f::kAttrTypeInt);
            }
            n.message(f::kNodeAttribute, w);
        }
        graph_.message(f::kGraphNode, n);
        return out;
    }
    // A float32 initializer, its values little-endian in raw_data.
    std::string initializer(const std::string& name, const Tensor& t) {
        proto::Writer w;
        w.packedInt64(f::kTensorDims, t.shape());
        w.varint(f::kTensorDataType, f::kTypeFloat);
        w.bytes(f::kTensorName, name);
        w.bytes(f::kTensorRawData, littleEndian(t.data<float>(), t.size()));
        initializers_.message(f::kGraphInitializer, w);
        return name;
    }
    std::string initializerInt64(const std::string& name, const std::vector<int64_t>& values) {
        proto::Writer w;
        w.packedInt64(f::kTensorDims, {static_cast<int64_t>(values.size())});
        w.varint(f::kTensorDataType, f::kTypeInt64);
        w.bytes(f::kTensorName, name);
        std::string raw;
        for (int64_t v : values)
            for (int b = 0; b < 8; ++b)
                raw.push_back(static_cast<char>((static_cast<uint64_t>(v) >> (8 * b)) & 0xff));
        w.bytes(f::kTensorRawData, raw);
        initializers_.message(f::kGraphInitializer, w);
        return name;
    }
    // "input" / "output": float32 [batch, ...shape], the batch dimension symbolic.
    void io(int field, const std::string& name, const Shape& shape) {
        proto::Writer dims;
        proto::Writer batch;
        batch.bytes(f::kDimParam, "batch");
        dims.message(f::kShapeDim, batch);
        for (int64_t d : shape) {
            proto::Writer dim;
            dim.varintSigned(f::kDimValue, d);
            dims.message(f::kShapeDim, dim);
        }
        proto::Writer tensorType;
        tensorType.varint(f::kTensorTypeElemType, f::kTypeFloat);
        tensorType.message(f::kTensorTypeShape, dims);
        proto::Writer type;
        type.message(f::kTypeTensorType, tensorType);
        proto::Writer vi;
        vi.bytes(f::kValueInfoName, name);
        vi.message(f::kValueInfoType, type);
        (field == f::kGraphInput ? inputs_ : outputs_).message(field, vi);
    }

    std::string finish(const std::string& graphName) const {
        std::string bytes = graph_.data();  // nodes (field 1)
        proto::Writer name;
        name.bytes(f::kGraphName, graphName);
        bytes += name.data();
        bytes += initializers_.data();
        bytes += inputs_.data();
        bytes += outputs_.data();
        return bytes;
    }

  private:
    static std::string littleEndian(const float* v, int64_t n) {
        std::string raw(static_cast<size_t>(n) * 4, '\0');
        for (int64_t i = 0; i < n; ++i) {
            uint32_t bits;
            std::memcpy(&bits, &v[i], 4);
            for (int b = 0; b < 4; ++b)
                raw[static_cast<size_t>(i * 4 + b)] = static_cast<char>((bits >> (8 * b)) & 0xff);
        }
        return raw;
    }
    proto::Writer graph_, initializers_, inputs_, outputs_;
};

// The activation `a` applied to `x`; returns the value's name (x itself for linear).
std::string activation(GraphWriter& g, const LayerSpec& l, ActivationKind a, const std::string& x,
                       const std::string& prefix) {
    switch (a) {
        case ActivationKind::Linear:
            return x;
        case ActivationKind::Relu:
            return g.node("Relu", prefix + "relu", {x});
        case ActivationKind::LeakyRelu:
            return g.node("LeakyRelu", prefix + "leaky_relu", {x},
                          {Attr{"alpha", true, static_cast<float>(l.negativeSlope), 0}});
        case ActivationKind::Elu:
            return g.node("Elu", prefix + "elu", {x},
                          {Attr{"alpha", true, static_cast<float>(l.eluAlpha), 0}});
        case ActivationKind::Gelu: {
            // gelu(x) = x * 0.5 * (1 + erf(x / sqrt(2))), Keras' default (approximate=False).
            Tensor c(DType::F32, {});
            c.data<float>()[0] = static_cast<float>(std::sqrt(2.0));
            const std::string sqrt2 = g.initializer(prefix + "gelu_sqrt2", c);
            c = Tensor(DType::F32, {});
            c.data<float>()[0] = 1.0f;
            const std::string one = g.initializer(prefix + "gelu_one", c);
            c = Tensor(DType::F32, {});
            c.data<float>()[0] = 0.5f;
            const std::string half = g.initializer(prefix + "gelu_half", c);
            const std::string d = g.node("Div", prefix + "gelu_div", {x, sqrt2});
            const std::string e = g.node("Erf", prefix + "gelu_erf", {d});
            const std::string p = g.node("Add", prefix + "gelu_add", {e, one});
            const std::string m = g.node("Mul", prefix + "gelu_mul", {x, p});
            return g.node("Mul", prefix + "gelu", {m, half});
        }
        case ActivationKind::Sigmoid:
            return g.node("Sigmoid", prefix + "sigmoid", {x});
        case ActivationKind::Tanh:
            return g.node("Tanh", prefix + "tanh", {x});
        case ActivationKind::Softmax:
            return g.node("Softmax", prefix + "softmax", {x}, {Attr{"axis", false, 0, -1}});
    }
    return x;
}

// A value between layers. A batch of images is [batch, H, W, C] in TrainDeck and Keras and
// [batch, C, H, W] for ONNX's Conv, pooling and BatchNormalization: the value stays channels-first
// through a run of such layers, with one Transpose into it and one out of it, where a layer that
// reads the last axis as channels (Dense, Flatten, Reshape, LayerNormalization, softmax) or the
// graph's output needs channels-last again.
struct Value {
    std::string name;
    size_t rank = 2;             // with the batch dimension
    bool channelsFirst = false;  // [batch, C, ...] rather than [batch, ..., C]
};

void toChannelsFirst(GraphWriter& g, Value& v, const std::string& prefix) {
    if (v.channelsFirst || v.rank <= 2) return;
    std::vector<int64_t> perm{0, static_cast<int64_t>(v.rank) - 1};
    for (int64_t d = 1; d + 1 < static_cast<int64_t>(v.rank); ++d) perm.push_back(d);
    v.name = g.node("Transpose", prefix + "to_channels_first", {v.name}, {ints("perm", perm)});
    v.channelsFirst = true;
}

void toChannelsLast(GraphWriter& g, Value& v, const std::string& prefix) {
    if (!v.channelsFirst) return;
    std::vector<int64_t> perm{0};
    for (int64_t d = 2; d < static_cast<int64_t>(v.rank); ++d) perm.push_back(d);
    perm.push_back(1);
    v.name = g.node("Transpose", prefix + "to_channels_last", {v.name}, {ints("perm", perm)});
    v.channelsFirst = false;
}

Tensor filled(int64_t n, float value) {
    Tensor t(DType::F32, {n});
    for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = value;
    return t;
}

Tensor scalar(float value) {
    Tensor t(DType::F32, {});
    t.data<float>()[0] = value;
    return t;
}

// A Keras Conv2D kernel [kh, kw, cin / groups, filters] as ONNX's [filters, cin / groups, kh, kw].
Tensor onnxConvKernel(const Tensor& k) {
    const int64_t kh = k.dim(0), kw = k.dim(1), ci = k.dim(2), co = k.dim(3);
    Tensor out(DType::F32, {co, ci, kh, kw});
    const float* src = k.data<float>();
    float* dst = out.data<float>();
    for (int64_t y = 0; y < kh; ++y)
        for (int64_t x = 0; x < kw; ++x)
            for (int64_t c = 0; c < ci; ++c)
                for (int64_t o = 0; o < co; ++o)
                    dst[((o * ci + c) * kh + y) * kw + x] = src[((y * kw + x) * ci + c) * co + o];
    return out;
}

// ONNX's pads for a window: [top, left, bottom, right] (begins of H and W, then their ends).
std::vector<int64_t> onnxPads(const Window2D& w) {
    return {w.pads[0], w.pads[2], w.pads[1], w.pads[3]};
}

// Resizing, CenterCrop and RandomCrop at inference: the box of the image (resizeBoxFor) cut out
// with Slice, or padded with Pad (Resizing's pad_to_aspect_ratio, its fill_value), then resized to
// the target with Resize as tf.image.resize does (bilinear: "linear" with half-pixel centres;
// nearest: tf_half_pixel_for_nn, rounding down), to sizes made from the input's batch dimension.
// A plain crop is the Slice alone; the whole image at its own size, nothing.
void resizeNodes(GraphWriter& g, const LayerSpec& l, const LayerWeights& lw, Value& v,
                 const std::string& prefix) {
    const int64_t H = lw.inputShape[0], W = lw.inputShape[1], C = lw.inputShape[2];
    const int64_t OH = lw.outputShape[0], OW = lw.outputShape[1];
    const ResizeBox b = resizeBoxFor(l, H, W);
    if (b.top == 0 && b.left == 0 && b.height == H && b.width == W && OH == H && OW == W) return;
    const int64_t hAxis = v.channelsFirst ? 2 : 1, wAxis = hAxis + 1;
    if (b.top > 0 || b.left > 0 || b.top + b.height < H || b.left + b.width < W) {
        const int64_t top = std::max<int64_t>(b.top, 0), left = std::max<int64_t>(b.left, 0);
        v.name = g.node("Slice", prefix + "crop",
                        {v.name, g.initializerInt64(prefix + "crop_starts", {top, left}),
                         g.initializerInt64(prefix + "crop_ends", {std::min(b.top + b.height, H),
                                                                   std::min(b.left + b.width, W)}),
                         g.initializerInt64(prefix + "crop_axes", {hAxis, wAxis})});
    }
    if (b.top < 0 || b.left < 0) {
        std::vector<int64_t> pads(8, 0);  // begins of the four axes, then their ends
        pads[static_cast<size_t>(hAxis)] = pads[static_cast<size_t>(hAxis + 4)] =
            -std::min<int64_t>(b.top, 0);
        pads[static_cast<size_t>(wAxis)] = pads[static_cast<size_t>(wAxis + 4)] =
            -std::min<int64_t>(b.left, 0);
        v.name =
            g.node("Pad", prefix + "pad",
                   {v.name, g.initializerInt64(prefix + "pads", pads),
                    g.initializer(prefix + "pad_value", scalar(static_cast<float>(l.fillValue)))},
                   {text("mode", "constant")});
    }
    if (b.crop) return;
    toChannelsFirst(g, v, prefix);
    const std::string shape = g.node("Shape", prefix + "input_shape", {v.name});
    const std::string batch = g.node("Slice", prefix + "batch",
                                     {shape, g.initializerInt64(prefix + "batch_starts", {0}),
                                      g.initializerInt64(prefix + "batch_ends", {1})});
    const std::string sizes =
        g.node("Concat", prefix + "sizes",
               {batch, g.initializerInt64(prefix + "channels_and_size", {C, OH, OW})},
               {Attr{"axis", false, 0, 0}});
    const bool nearest =
        l.type == LayerType::Resizing && l.interpolation == InterpolationKind::Nearest;
    std::vector<Attr> attrs{
        text("mode", nearest ? "nearest" : "linear"),
        text("coordinate_transformation_mode", nearest ? "tf_half_pixel_for_nn" : "half_pixel")};
    if (nearest) attrs.push_back(text("nearest_mode", "floor"));
    v.name = g.node("Resize", prefix + "resize", {v.name, "", "", sizes}, attrs);
}

// The activation `a` on `v`; softmax reads the channels on the last axis.
void applyActivation(GraphWriter& g, const LayerSpec& l, ActivationKind a, Value& v,
                     const std::string& prefix) {
    if (a == ActivationKind::Softmax) toChannelsLast(g, v, prefix);
    v.name = activation(g, l, a, v.name, prefix);
}

// The nodes of one layer, reading `v`, which becomes the layer's output.
Status onnxLayerNodes(GraphWriter& g, const LayerSpec& l, const LayerWeights& lw,
                      const ModelParams& params, Value& v) {
    const std::string prefix = l.name + "/";
    const std::string where =
        "layer " + std::to_string(lw.layerIndex) + " '" + l.name + "' (" + lw.typeName + "): ";
    auto param = [&](const char* variable) { return params.at(l.name + "/" + variable); };
    // An image layer's window: inputs [H, W, C].
    auto window = [&](const Shape& kernel, const Shape& dilation) -> Result<Window2D> {
        auto w = windowGeometry(lw.inputShape[0], lw.inputShape[1], kernel, effectiveStrides(l),
                                dilation, l.samePadding, "window");
        if (!w.ok()) return err(where + w.error());
        return *w;
    };
    Status done = Status::success();
    switch (l.type) {
        case LayerType::Dense: {
            toChannelsLast(g, v, prefix);
            const std::string kernel = g.initializer(l.name + "/kernel", param("kernel"));
            if (l.useBias) {
                const std::string bias = g.initializer(l.name + "/bias", param("bias"));
                v.name = g.node("Gemm", prefix + "gemm", {v.name, kernel, bias});
            } else {
                v.name = g.node("MatMul", prefix + "matmul", {v.name, kernel});
            }
            applyActivation(g, l, l.activation, v, prefix);
            break;
        }
        case LayerType::Activation:
            applyActivation(g, l, l.activation, v, prefix);
            break;
        case LayerType::Dropout:
        case LayerType::RandomFlip:
        case LayerType::RandomRotation:
        case LayerType::RandomZoom:
        case LayerType::RandomTranslation:
        case LayerType::RandomContrast:
        case LayerType::RandomBrightness:
            break;  // identity at inference
        case LayerType::Resizing:
        case LayerType::CenterCrop:
        case LayerType::RandomCrop:  // at inference: smart_resize's crop
            resizeNodes(g, l, lw, v, prefix);
            break;
        case LayerType::Flatten:
            toChannelsLast(g, v, prefix);
            v.name = g.node("Flatten", prefix + "flatten", {v.name}, {Attr{"axis", false, 0, 1}});
            break;
        case LayerType::Reshape: {
            toChannelsLast(g, v, prefix);
            std::vector<int64_t> shape{-1};
            shape.insert(shape.end(), lw.outputShape.begin(), lw.outputShape.end());
            const std::string s = g.initializerInt64(prefix + "shape", shape);
            v.name = g.node("Reshape", prefix + "reshape", {v.name, s});
            break;
        }
        case LayerType::Conv2D: {
            TD_ASSIGN_OR_RETURN(Window2D w, window(l.kernelSize, l.dilationRate));
            toChannelsFirst(g, v, prefix);
            std::vector<std::string> in{
                v.name, g.initializer(l.name + "/kernel", onnxConvKernel(param("kernel")))};
            if (l.useBias) in.push_back(g.initializer(l.name + "/bias", param("bias")));
            v.name =
                g.node("Conv", prefix + "conv", in,
                       {ints("kernel_shape", l.kernelSize), ints("strides", effectiveStrides(l)),
                        ints("dilations", l.dilationRate), ints("pads", onnxPads(w)),
                        Attr{"group", false, 0, l.groups}});
            applyActivation(g, l, l.activation, v, prefix);
            break;
        }
        case LayerType::MaxPooling2D:
        case LayerType::AveragePooling2D: {
            TD_ASSIGN_OR_RETURN(Window2D w, window(l.poolSize, Shape{1, 1}));
            toChannelsFirst(g, v, prefix);
            std::vector<Attr> attrs{ints("kernel_shape", l.poolSize),
                                    ints("strides", effectiveStrides(l)),
                                    ints("pads", onnxPads(w))};
            // Keras averages over the window's values inside the image only.
            if (l.type == LayerType::AveragePooling2D)
                attrs.push_back(Attr{"count_include_pad", false, 0, 0});
            v.name = g.node(l.type == LayerType::MaxPooling2D ? "MaxPool" : "AveragePool",
                            prefix + (l.type == LayerType::MaxPooling2D ? "max_pool" : "avg_pool"),
                            {v.name}, attrs);
            break;
        }
        case LayerType::GlobalAveragePooling2D:
            toChannelsFirst(g, v, prefix);
            v.name = g.node("GlobalAveragePool", prefix + "global_avg_pool", {v.name});
            v.name = g.node("Flatten", prefix + "flatten", {v.name}, {Attr{"axis", false, 0, 1}});
            v.rank = 2;
            v.channelsFirst = false;
            break;
        case LayerType::ZeroPadding2D: {
            const Shape& p = l.zeroPadding;  // top, bottom, left, right
            const std::vector<int64_t> pads =
                v.channelsFirst ? std::vector<int64_t>{0, 0, p[0], p[2], 0, 0, p[1], p[3]}
                                : std::vector<int64_t>{0, p[0], p[2], 0, 0, p[1], p[3], 0};
            v.name =
                g.node("Pad", prefix + "pad", {v.name, g.initializerInt64(prefix + "pads", pads)});
            break;
        }
        case LayerType::Rescaling:
            if (l.rescale != 1.0)
                v.name = g.node("Mul", prefix + "scale",
                                {v.name, g.initializer(prefix + "scale_value",
                                                       scalar(static_cast<float>(l.rescale)))});
            if (l.offset != 0.0)
                v.name = g.node("Add", prefix + "offset",
                                {v.name, g.initializer(prefix + "offset_value",
                                                       scalar(static_cast<float>(l.offset)))});
            break;
        case LayerType::BatchNormalization: {
            // Inference: the moving statistics; channels on axis 1.
            toChannelsFirst(g, v, prefix);
            const int64_t c = lw.inputShape.back();
            const std::string gamma =
                g.initializer(l.name + "/gamma", l.scale ? param("gamma") : filled(c, 1.0f));
            const std::string beta =
                g.initializer(l.name + "/beta", l.center ? param("beta") : filled(c, 0.0f));
            v.name = g.node(
                "BatchNormalization", prefix + "batch_norm",
                {v.name, gamma, beta, g.initializer(l.name + "/moving_mean", param("moving_mean")),
                 g.initializer(l.name + "/moving_variance", param("moving_variance"))},
                {Attr{"epsilon", true, static_cast<float>(l.epsilon), 0}});
            break;
        }
        case LayerType::LayerNormalization: {
            toChannelsLast(g, v, prefix);
            const int64_t c = lw.inputShape.back();
            std::vector<std::string> in{
                v.name,
                g.initializer(l.name + "/gamma", l.scale ? param("gamma") : filled(c, 1.0f))};
            if (l.center) in.push_back(g.initializer(l.name + "/beta", param("beta")));
            v.name = g.node("LayerNormalization", prefix + "layer_norm", in,
                            {Attr{"axis", false, 0, -1},
                             Attr{"epsilon", true, static_cast<float>(l.epsilon), 0}});
            break;
        }
        default:
            done = err(where + "layer type " + lw.typeName + " cannot be exported to ONNX yet");
    }
    v.rank = lw.outputShape.size() + 1;
    return done;
}

}  // namespace

Result<std::string> onnxModelBytes(const ModelWeights& weights) {
    TD_ASSIGN_OR_RETURN(std::vector<LayerWeights> layout, weightLayout(weights.model));
    TD_RETURN_IF_ERROR(checkWeights(layout, weights.params, "model weights"));
    ModelSpec model = weights.model;
    TD_ASSIGN_OR_RETURN(ModelInfo info, inferShapes(model));

    GraphWriter g;
    Value v{"input", info.inputShape.size() + 1, false};
    for (const LayerWeights& lw : layout)
        TD_RETURN_IF_ERROR(onnxLayerNodes(g, model.layers[lw.layerIndex], lw, weights.params, v));
    toChannelsLast(g, v, "output/");
    // An Identity names the graph's output "output" (and covers a model whose layers are all
    // identities at inference).
    g.node("Identity", "output_identity", {v.name}, {}, "output");
    g.io(f::kGraphInput, "input", info.inputShape);
    g.io(f::kGraphOutput, "output", info.outputShape);

    proto::Writer opset;
    opset.bytes(f::kOpsetDomain, "");
    opset.varint(f::kOpsetVersion, kOnnxOpset);
    proto::Writer m;
    m.varint(f::kModelIrVersion, kOnnxIrVersion);
    m.bytes(f::kModelProducerName, "TrainDeck");
    m.bytes(f::kModelProducerVersion, TRAINDECK_VERSION);
    m.bytes(f::kModelGraph, g.finish(model.name));
    m.message(f::kModelOpsetImport, opset);
    return m.data();
}

Status saveOnnxModel(const ModelWeights& weights, const std::string& path) {
    auto bytes = onnxModelBytes(weights);
    if (!bytes.ok()) return err(path + ": " + bytes.error());
    return writeFileAtomic(path, *bytes);
}

}  // namespace td
