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
constexpr int kAttrName = 1, kAttrF = 2, kAttrI = 3, kAttrType = 20;
constexpr int kAttrTypeFloat = 1, kAttrTypeInt = 2;
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
};

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
            if (a.isFloat)
                w.float32(f::kAttrF, a.f);
            else
                w.varintSigned(f::kAttrI, a.i);
            w.varint(f::kAttrType, a.isFloat ? f::kAttrTypeFloat : f::kAttrTypeInt);
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

// The nodes of one layer, reading `x`; returns the layer's output value.
Result<std::string> onnxLayerNodes(GraphWriter& g, const LayerSpec& l, const LayerWeights& lw,
                                   const ModelParams& params, const std::string& x) {
    const std::string prefix = l.name + "/";
    switch (l.type) {
        case LayerType::Dense: {
            const std::string kernel =
                g.initializer(l.name + "/kernel", params.at(l.name + "/kernel"));
            std::string y;
            if (l.useBias) {
                const std::string bias =
                    g.initializer(l.name + "/bias", params.at(l.name + "/bias"));
                y = g.node("Gemm", prefix + "gemm", {x, kernel, bias});
            } else {
                y = g.node("MatMul", prefix + "matmul", {x, kernel});
            }
            return activation(g, l, l.activation, y, prefix);
        }
        case LayerType::Activation:
            return activation(g, l, l.activation, x, prefix);
        case LayerType::Dropout:
            return x;  // identity at inference
        case LayerType::Flatten:
            return g.node("Flatten", prefix + "flatten", {x}, {Attr{"axis", false, 0, 1}});
        case LayerType::Reshape: {
            std::vector<int64_t> shape{-1};
            shape.insert(shape.end(), lw.outputShape.begin(), lw.outputShape.end());
            const std::string s = g.initializerInt64(prefix + "shape", shape);
            return g.node("Reshape", prefix + "reshape", {x, s});
        }
        default:
            return err("layer " + std::to_string(lw.layerIndex) + " '" + l.name + "' (" +
                       lw.typeName + "): layer type " + lw.typeName +
                       " cannot be exported to ONNX yet");
    }
}

}  // namespace

Result<std::string> onnxModelBytes(const ModelWeights& weights) {
    TD_ASSIGN_OR_RETURN(std::vector<LayerWeights> layout, weightLayout(weights.model));
    TD_RETURN_IF_ERROR(checkWeights(layout, weights.params, "model weights"));
    ModelSpec model = weights.model;
    TD_ASSIGN_OR_RETURN(ModelInfo info, inferShapes(model));

    GraphWriter g;
    std::string x = "input";
    for (const LayerWeights& lw : layout) {
        TD_ASSIGN_OR_RETURN(x,
                            onnxLayerNodes(g, model.layers[lw.layerIndex], lw, weights.params, x));
    }
    // An Identity names the graph's output "output" (and covers a model whose layers are all
    // identities at inference).
    g.node("Identity", "output_identity", {x}, {}, "output");
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
