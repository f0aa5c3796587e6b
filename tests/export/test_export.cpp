// Export and import (engine/io: zip_archive, keras_weights_h5, keras_archive, onnx_export;
// engine/api/export.h): the zip and HDF5 layers, .keras round trips (equal model, equal weights,
// equal predictions), the ONNX file read back field by field, initial weights through a project
// and a Session, a stored run's model (export RUN, predict on its checkpoint) and the errors for
// damaged or mismatched files and runs without checkpoints.
#include <zlib.h>

#include <QProcess>
#include <QtTest>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/api/export.h"
#include "engine/data/pipeline.h"
#include "engine/io/keras_archive.h"
#include "engine/io/keras_weights_h5.h"
#include "engine/io/onnx_export.h"
#include "engine/io/zip_archive.h"
#include "engine/train/checkpoint.h"
#include "tests/source_dir.h"

using namespace td;
namespace fs = std::filesystem;

namespace {

QString q(const std::string& s) {
    return QString::fromStdString(s);
}

#define TD_VERIFY_OK(expr)                                                 \
    do {                                                                   \
        const auto& td_r = (expr);                                         \
        QVERIFY2(td_r.ok(), td_r.ok() ? "" : qPrintable(q(td_r.error()))); \
    } while (0)

#define TD_VERIFY_ERROR(expr, fragment)                                                     \
    do {                                                                                    \
        const auto& td_r = (expr);                                                          \
        QVERIFY2(!td_r.ok(), "expected an error");                                          \
        QVERIFY2(td_r.error().find(fragment) != std::string::npos,                          \
                 qPrintable(q("'" + std::string(fragment) + "' not in: " + td_r.error()))); \
    } while (0)

LayerSpec layer(LayerType t, const std::string& name) {
    LayerSpec l;
    l.type = t;
    l.name = name;
    return l;
}

// Input [12] -> Dense 16 relu -> Dropout -> Dense 8 gelu -> Activation tanh -> Dense 3 softmax
ModelSpec mlp() {
    ModelSpec m;
    m.name = "mlp";
    LayerSpec in = layer(LayerType::Input, "input_layer");
    in.inputShape = {12};
    LayerSpec d1 = layer(LayerType::Dense, "dense");
    d1.units = 16;
    d1.activation = ActivationKind::Relu;
    LayerSpec dr = layer(LayerType::Dropout, "dropout");
    dr.rate = 0.3;
    LayerSpec d2 = layer(LayerType::Dense, "dense_1");
    d2.units = 8;
    d2.activation = ActivationKind::Gelu;
    LayerSpec act = layer(LayerType::Activation, "activation");
    act.activation = ActivationKind::Tanh;
    LayerSpec d3 = layer(LayerType::Dense, "dense_2");
    d3.units = 3;
    d3.activation = ActivationKind::Softmax;
    m.layers = {in, d1, dr, d2, act, d3};
    return m;
}

// Input [3,4] -> Flatten -> Dense 5 leaky_relu (no bias) -> Reshape [5,1] -> LeakyReLU(0.1)
// -> Flatten -> Dense 2 elu
ModelSpec shaped() {
    ModelSpec m;
    m.name = "shaped";
    LayerSpec in = layer(LayerType::Input, "input_layer");
    in.inputShape = {3, 4};
    LayerSpec d1 = layer(LayerType::Dense, "dense");
    d1.units = 5;
    d1.useBias = false;
    d1.activation = ActivationKind::LeakyRelu;
    LayerSpec rs = layer(LayerType::Reshape, "reshape");
    rs.targetShape = {5, 1};
    LayerSpec leaky = layer(LayerType::Activation, "leaky_re_lu");
    leaky.activation = ActivationKind::LeakyRelu;
    leaky.negativeSlope = 0.1;
    LayerSpec d2 = layer(LayerType::Dense, "dense_1");
    d2.units = 2;
    d2.activation = ActivationKind::Elu;
    m.layers = {in,    layer(LayerType::Flatten, "flatten"),   d1, rs,
                leaky, layer(LayerType::Flatten, "flatten_1"), d2};
    return m;
}

// Input [9,8,2] -> Rescaling(0.5, 0.1) -> ZeroPadding2D(1,0,2,1) -> Conv2D 4 3x3 same stride 2
// relu -> BatchNormalization -> Conv2D 4 2x2 valid dilation (2,1) groups 2 -> MaxPooling2D 2 same
// -> LayerNormalization -> AveragePooling2D 2 same stride 1 -> Flatten -> Dense 3 softmax
ModelSpec cnn() {
    ModelSpec m;
    m.name = "cnn";
    LayerSpec in = layer(LayerType::Input, "input_layer");
    in.inputShape = {9, 8, 2};
    LayerSpec rs = layer(LayerType::Rescaling, "rescaling");
    rs.rescale = 0.5;
    rs.offset = 0.1;
    LayerSpec pad = layer(LayerType::ZeroPadding2D, "zero_padding2d");
    pad.zeroPadding = {1, 0, 2, 1};
    LayerSpec c1 = layer(LayerType::Conv2D, "conv2d");
    c1.filters = 4;
    c1.kernelSize = {3, 3};
    c1.samePadding = true;
    c1.strides = {2, 2};
    c1.activation = ActivationKind::Relu;
    LayerSpec bn = layer(LayerType::BatchNormalization, "batch_normalization");
    LayerSpec c2 = layer(LayerType::Conv2D, "conv2d_1");
    c2.filters = 4;
    c2.kernelSize = {2, 2};
    c2.dilationRate = {2, 1};
    c2.groups = 2;
    LayerSpec mp = layer(LayerType::MaxPooling2D, "max_pooling2d");
    mp.samePadding = true;
    LayerSpec ln = layer(LayerType::LayerNormalization, "layer_normalization");
    LayerSpec ap = layer(LayerType::AveragePooling2D, "average_pooling2d");
    ap.samePadding = true;
    ap.strides = {1, 1};
    LayerSpec d = layer(LayerType::Dense, "dense");
    d.units = 3;
    d.activation = ActivationKind::Softmax;
    m.layers = {in, rs, pad, c1, bn, c2, mp, ln, ap, layer(LayerType::Flatten, "flatten"), d};
    return m;
}

// Input [6,6,1] -> Conv2D 3 3x3 same tanh without bias -> BatchNormalization without beta ->
// LayerNormalization without gamma -> GlobalAveragePooling2D -> Dense 2
ModelSpec cnnGap() {
    ModelSpec m;
    m.name = "cnn_gap";
    LayerSpec in = layer(LayerType::Input, "input_layer");
    in.inputShape = {6, 6, 1};
    LayerSpec c = layer(LayerType::Conv2D, "conv2d");
    c.filters = 3;
    c.samePadding = true;
    c.useBias = false;
    c.activation = ActivationKind::Tanh;
    LayerSpec bn = layer(LayerType::BatchNormalization, "batch_normalization");
    bn.center = false;
    LayerSpec ln = layer(LayerType::LayerNormalization, "layer_normalization");
    ln.scale = false;
    LayerSpec d = layer(LayerType::Dense, "dense");
    d.units = 2;
    m.layers = {in, c, bn, ln, layer(LayerType::GlobalAveragePooling2D, "global_average_pooling2d"),
                d};
    return m;
}

// What Keras 3.15 writes for the image preprocessing layers (model.to_json() of a Sequential with
// each of them, non-default arguments included).
const char* const kKerasPreprocessingJson =
    R"({"module": "keras", "class_name": "Sequential", "config": {"name": "sequential", "trainable": true, "dtype": {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"}, "registered_name": null}, "layers": [{"module": "keras.layers", "class_name": "InputLayer", "config": {"batch_shape": [null, 28, 30, 3], "dtype": "float32", "sparse": false, "ragged": false, "name": "input_layer", "optional": false}, "registered_name": null}, {"module": "keras.layers", "class_name": "Resizing", "config": {"name": "resizing", "trainable": true, "dtype": {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"}, "registered_name": null}, "data_format": "channels_last", "height": 24, "width": 26, "interpolation": "nearest", "crop_to_aspect_ratio": false, "pad_to_aspect_ratio": true, "fill_mode": "constant", "fill_value": 0.5, "antialias": false}, "registered_name": null, "build_config": {"input_shape": [null, 28, 30, 3]}}, {"module": "keras.layers", "class_name": "CenterCrop", "config": {"name": "center_crop", "trainable": true, "dtype": {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"}, "registered_name": null}, "data_format": "channels_last", "height": 20, "width": 22}, "registered_name": null, "build_config": {"input_shape": [null, 24, 26, 3]}}, {"module": "keras.layers", "class_name": "RandomCrop", "config": {"name": "random_crop", "trainable": true, "dtype": {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"}, "registered_name": null}, "data_format": "channels_last", "height": 16, "width": 18, "seed": 3}, "registered_name": null, "build_config": {"input_shape": [null, 20, 22, 3]}}, {"module": "keras.layers", "class_name": "RandomFlip", "config": {"name": "random_flip", "trainable": true, "dtype": {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"}, "registered_name": null}, "data_format": "channels_last", "seed": 1, "mode": "vertical"}, "registered_name": null, "build_config": {"input_shape": [null, 16, 18, 3]}}, {"module": "keras.layers", "class_name": "RandomRotation", "config": {"name": "random_rotation", "trainable": true, "dtype": {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"}, "registered_name": null}, "data_format": "channels_last", "factor": [-0.2, 0.1], "fill_mode": "wrap", "fill_value": 0.0, "interpolation": "nearest", "seed": 2}, "registered_name": null, "build_config": {"input_shape": [null, 16, 18, 3]}}, {"module": "keras.layers", "class_name": "RandomZoom", "config": {"name": "random_zoom", "trainable": true, "dtype": {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"}, "registered_name": null}, "data_format": "channels_last", "height_factor": 0.1, "width_factor": [-0.3, 0.2], "fill_mode": "constant", "interpolation": "bilinear", "seed": null, "fill_value": 1.0}, "registered_name": null, "build_config": {"input_shape": [null, 16, 18, 3]}}, {"module": "keras.layers", "class_name": "RandomTranslation", "config": {"name": "random_translation", "trainable": true, "dtype": {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"}, "registered_name": null}, "data_format": "channels_last", "height_factor": 0.1, "width_factor": 0.2, "fill_mode": "nearest", "interpolation": "bilinear", "seed": null, "fill_value": 0.0}, "registered_name": null, "build_config": {"input_shape": [null, 16, 18, 3]}}, {"module": "keras.layers", "class_name": "RandomContrast", "config": {"name": "random_contrast", "trainable": true, "dtype": {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"}, "registered_name": null}, "data_format": "channels_last", "factor": [0, 0.2], "value_range": [0, 1], "seed": null}, "registered_name": null, "build_config": {"input_shape": [null, 16, 18, 3]}}, {"module": "keras.layers", "class_name": "RandomBrightness", "config": {"name": "random_brightness", "trainable": true, "dtype": {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"}, "registered_name": null}, "data_format": "channels_last", "factor": [-0.3, 0.3], "value_range": [-1, 1], "seed": 4}, "registered_name": null, "build_config": {"input_shape": [null, 16, 18, 3]}}], "build_input_shape": [null, 28, 30, 3]}, "registered_name": null, "build_config": {"input_shape": [null, 28, 30, 3]}, "compile_config": {}})";

// Input [10,13,2] -> Resizing 8x8 cropped to the aspect ratio -> RandomFlip -> CenterCrop 6x5 ->
// RandomContrast -> Conv2D 3 2x2 -> Flatten -> Dense 3 softmax
ModelSpec preprocessed() {
    ModelSpec m;
    m.name = "preprocessed";
    LayerSpec in = layer(LayerType::Input, "input_layer");
    in.inputShape = {10, 13, 2};
    LayerSpec rs = layer(LayerType::Resizing, "resizing");
    rs.targetHeight = rs.targetWidth = 8;
    rs.cropToAspectRatio = true;
    LayerSpec cc = layer(LayerType::CenterCrop, "center_crop");
    cc.targetHeight = 6;
    cc.targetWidth = 5;
    LayerSpec ct = layer(LayerType::RandomContrast, "random_contrast");
    ct.factor = {0.0, 0.3};
    LayerSpec c = layer(LayerType::Conv2D, "conv2d");
    c.filters = 3;
    c.kernelSize = {2, 2};
    c.strides = {1, 1};
    LayerSpec d = layer(LayerType::Dense, "dense");
    d.units = 3;
    d.activation = ActivationKind::Softmax;
    m.layers = {in, rs, layer(LayerType::RandomFlip, "random_flip"), cc,
                ct, c,  layer(LayerType::Flatten, "flatten"),        d};
    return m;
}

ModelWeights randomWeights(const ModelSpec& model, uint32_t seed) {
    ModelWeights w;
    w.model = model;
    auto layout = weightLayout(model);
    TD_ASSERT(layout.ok());
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-0.8f, 0.8f);
    for (const LayerWeights& lw : *layout)
        for (const WeightSlot& s : lw.variables) {
            Tensor t(DType::F32, s.shape);
            for (int64_t i = 0; i < t.size(); ++i) t.data<float>()[i] = u(rng);
            if (s.variable == "moving_variance")  // a variance: positive
                for (int64_t i = 0; i < t.size(); ++i)
                    t.data<float>()[i] = 0.2f + std::abs(t.data<float>()[i]);
            w.params[s.param] = t;
        }
    return w;
}

Tensor randomInput(int64_t n, const Shape& sample, uint32_t seed) {
    Shape shape{n};
    shape.insert(shape.end(), sample.begin(), sample.end());
    Tensor x(DType::F32, shape);
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(0.f, 1.f);
    for (int64_t i = 0; i < x.size(); ++i) x.data<float>()[i] = g(rng);
    return x;
}

bool sameBits(const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && a.dtype() == b.dtype() &&
           std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

// The model's forward pass in double precision, written from the layer definitions (Keras
// semantics), independent of the engine's kernels.
std::vector<double> referenceForward(const ModelWeights& w, const float* sample) {
    auto layout = weightLayout(w.model);
    TD_ASSERT(layout.ok());
    ModelSpec m = w.model;
    std::vector<double> x(sample, sample + numElements((*layout)[0].inputShape));
    auto act = [](ActivationKind a, const LayerSpec& l, std::vector<double>& v) {
        if (a == ActivationKind::Softmax) {
            double mx = -1e300, sum = 0;
            for (double e : v) mx = std::max(mx, e);
            for (double& e : v) sum += (e = std::exp(e - mx));
            for (double& e : v) e /= sum;
            return;
        }
        for (double& e : v) switch (a) {
                case ActivationKind::Relu:
                    e = std::max(0.0, e);
                    break;
                case ActivationKind::LeakyRelu:
                    e = e < 0 ? l.negativeSlope * e : e;
                    break;
                case ActivationKind::Elu:
                    e = e < 0 ? l.eluAlpha * (std::exp(e) - 1) : e;
                    break;
                case ActivationKind::Gelu:
                    e = 0.5 * e * (1 + std::erf(e / std::sqrt(2.0)));
                    break;
                case ActivationKind::Sigmoid:
                    e = 1 / (1 + std::exp(-e));
                    break;
                case ActivationKind::Tanh:
                    e = std::tanh(e);
                    break;
                default:
                    break;
            }
    };
    for (const LayerWeights& lw : *layout) {
        const LayerSpec& l = m.layers[lw.layerIndex];
        if (l.type == LayerType::Dense) {
            const Tensor& k = w.params.at(l.name + "/kernel");
            const int64_t in = k.dim(0), out = k.dim(1);
            std::vector<double> y(static_cast<size_t>(out), 0.0);
            for (int64_t j = 0; j < out; ++j) {
                double s = l.useBias ? w.params.at(l.name + "/bias").data<float>()[j] : 0.0;
                for (int64_t i = 0; i < in; ++i)
                    s += x[static_cast<size_t>(i)] * k.data<float>()[i * out + j];
                y[static_cast<size_t>(j)] = s;
            }
            act(l.activation, l, y);
            x = y;
        } else if (l.type == LayerType::Activation) {
            act(l.activation, l, x);
        }
    }
    return x;
}

// ---- a minimal protobuf reader, to read the ONNX file back
// ---------------------------------------

struct Field {
    int number = 0;
    int wire = 0;
    uint64_t varint = 0;
    std::string bytes;  // wire type 2
    float f32 = 0;      // wire type 5
};

std::vector<Field> parseMessage(const std::string& s) {
    std::vector<Field> out;
    size_t at = 0;
    auto varint = [&]() {
        uint64_t v = 0;
        for (int shift = 0; at < s.size(); shift += 7) {
            const auto b = static_cast<unsigned char>(s[at++]);
            v |= uint64_t{b & 0x7fu} << shift;
            if (!(b & 0x80)) return v;
        }
        throw std::runtime_error("truncated varint");
    };
    while (at < s.size()) {
        const uint64_t key = varint();
        Field f;
        f.number = static_cast<int>(key >> 3);
        f.wire = static_cast<int>(key & 7);
        if (f.wire == 0) {
            f.varint = varint();
        } else if (f.wire == 2) {
            const uint64_t n = varint();
            if (at + n > s.size()) throw std::runtime_error("truncated bytes field");
            f.bytes = s.substr(at, n);
            at += n;
        } else if (f.wire == 5) {
            std::memcpy(&f.f32, s.data() + at, 4);
            at += 4;
        } else {
            throw std::runtime_error("unexpected wire type " + std::to_string(f.wire));
        }
        out.push_back(std::move(f));
    }
    return out;
}

std::vector<Field> fields(const std::vector<Field>& m, int number) {
    std::vector<Field> out;
    for (const Field& f : m)
        if (f.number == number) out.push_back(f);
    return out;
}
std::string str(const std::vector<Field>& m, int number) {
    auto v = fields(m, number);
    return v.empty() ? std::string() : v[0].bytes;
}
std::vector<int64_t> packedInts(const std::string& bytes) {
    std::vector<int64_t> out;
    std::string key;  // re-read as a message of varints with a fake key per value
    for (size_t at = 0; at < bytes.size();) {
        uint64_t v = 0;
        for (int shift = 0;; shift += 7) {
            const auto b = static_cast<unsigned char>(bytes[at++]);
            v |= uint64_t{b & 0x7fu} << shift;
            if (!(b & 0x80)) break;
        }
        out.push_back(static_cast<int64_t>(v));
    }
    return out;
}

// The nodes of an ONNX GraphProto in order: op types, INT/INTS attributes by node name, and
// whether they form a chain from "input" (every node reads what the one before wrote).
struct OnnxNodes {
    std::vector<std::string> ops;
    std::map<std::string, std::map<std::string, std::vector<int64_t>>> ints;
    std::string last = "input";  // the last node's output
    std::string brokenAt;        // the first node that does not read its predecessor's output
};
OnnxNodes onnxNodes(const std::vector<Field>& graph) {
    OnnxNodes out;
    for (const Field& n : fields(graph, 1)) {
        const auto node = parseMessage(n.bytes);
        out.ops.push_back(str(node, 4));
        bool readsPrevious = false;
        for (const Field& in : fields(node, 1))
            readsPrevious = readsPrevious || in.bytes == out.last;
        if (!readsPrevious && out.brokenAt.empty()) out.brokenAt = str(node, 3);
        out.last = str(node, 2);
        for (const Field& a : fields(node, 5)) {
            const auto attr = parseMessage(a.bytes);
            std::vector<int64_t> values;
            for (const Field& v : fields(attr, 8)) values.push_back(int64_t(v.varint));
            for (const Field& v : fields(attr, 3)) values.push_back(int64_t(v.varint));
            out.ints[str(node, 3)][str(attr, 1)] = values;
        }
    }
    return out;
}

// The float initializers of an ONNX GraphProto by name (an empty Tensor where the raw bytes do
// not match the dims).
std::map<std::string, Tensor> onnxFloatInitializers(const std::vector<Field>& graph) {
    std::map<std::string, Tensor> inits;
    for (const Field& f : fields(graph, 5)) {
        const auto t = parseMessage(f.bytes);
        if (fields(t, 2).at(0).varint != 1) continue;  // float only
        const auto dims = packedInts(fields(t, 1).at(0).bytes);
        Tensor v(DType::F32, Shape(dims.begin(), dims.end()));
        const std::string raw = str(t, 9);
        if (raw.size() != v.bytes()) {
            inits[str(t, 8)] = Tensor();
            continue;
        }
        std::memcpy(v.raw(), raw.data(), raw.size());
        inits[str(t, 8)] = v;
    }
    return inits;
}

// Raw deflate (no zlib header), as zip's method 8 stores it.
std::string deflateRaw(const std::string& in) {
    z_stream zs{};
    deflateInit2(&zs, 9, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
    std::string out(deflateBound(&zs, in.size()), '\0');
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
    zs.avail_in = static_cast<uInt>(in.size());
    zs.next_out = reinterpret_cast<Bytef*>(out.data());
    zs.avail_out = static_cast<uInt>(out.size());
    deflate(&zs, Z_FINISH);
    out.resize(zs.total_out);
    deflateEnd(&zs);
    return out;
}

void writeBytes(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary) << bytes;
}

// An f32 .npy file (version 1.0).
void writeNpy(const std::string& path, const Tensor& t) {
    std::string shape = "(";
    for (size_t i = 0; i < t.rank(); ++i) shape += std::to_string(t.dim(i)) + ",";
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + "), }";
    header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
    header += '\n';
    std::string out = std::string("\x93NUMPY\x01\x00", 8);
    out += static_cast<char>(header.size() & 0xff);
    out += static_cast<char>(header.size() >> 8);
    writeBytes(path, out + header + std::string(static_cast<const char*>(t.raw()), t.bytes()));
}

struct Run {
    int code = -1;
    std::string out, err;
};
Run traindeck(const QStringList& args) {
    QProcess p;
    p.start(td::dev::kBinary, args);
    Run r;
    if (!p.waitForFinished(120000)) return r;
    r.code = p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1;
    r.out = p.readAllStandardOutput().toStdString();
    r.err = p.readAllStandardError().toStdString();
    return r;
}

// Largest absolute difference of two equally shaped f32 tensors (infinity when the shapes differ).
double maxAbsDiff(const Tensor& a, const Tensor& b) {
    if (a.shape() != b.shape()) return INFINITY;
    double d = 0;
    for (int64_t i = 0; i < a.size(); ++i)
        d = std::max(d, std::abs(double(a.data<float>()[i]) - double(b.data<float>()[i])));
    return d;
}

// projects/csv_iris_like.json for a short run in a test: its data paths absolute, `epochs`
// epochs, no callbacks (the trained weights are the last epoch's), run checkpoints on or off.
std::string irisProjectJson(int epochs, bool runCheckpoints) {
    const std::string src = std::string(td::dev::kSourceDir) + "/projects/";
    std::ifstream in(src + "csv_iris_like.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j["data"]["source"]["train"] = src + "data/iris_like_train.csv";
    j["data"]["source"]["test"] = src + "data/iris_like_test.csv";
    j["training"]["epochs"] = epochs;
    j["training"]["callbacks"] = nlohmann::json::array();
    j["training"]["evaluate_test"] = false;
    j["training"]["run_checkpoints"] = runCheckpoints;
    return j.dump(2);
}

}  // namespace

class TestExport : public QObject {
    Q_OBJECT

    std::string dir_;

  private slots:
    void initTestCase() {
        dir_ = (fs::temp_directory_path() / ("td_export_" + std::to_string(::getpid()))).string();
        fs::create_directories(dir_);
    }
    void cleanupTestCase() { fs::remove_all(dir_); }

    void zipRoundTripAndDeflate() {
        std::string big(100000, 'a');
        for (size_t i = 0; i < big.size(); i += 7) big[i] = static_cast<char>('a' + i % 26);
        auto bytes = zipArchiveBytes({{"a.txt", "hello"}, {"dir/b.bin", big}, {"empty", ""}});
        TD_VERIFY_OK(bytes);
        auto back = readZipArchive(*bytes, "t.zip");
        TD_VERIFY_OK(back);
        QCOMPARE(back->size(), size_t{3});
        QCOMPARE((*back)[0].name, std::string("a.txt"));
        QCOMPARE((*back)[0].bytes, std::string("hello"));
        QVERIFY((*back)[1].bytes == big);
        QVERIFY((*back)[2].bytes.empty());

        // A deflated member (as other zip writers produce): rewrite member 1's data and header.
        const std::string packed = deflateRaw(big);
        auto le32 = [](uint32_t v) {
            std::string s;
            for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
            return s;
        };
        const uint32_t crc = static_cast<uint32_t>(
            crc32(0, reinterpret_cast<const Bytef*>(big.data()), static_cast<uInt>(big.size())));
        std::string local = std::string("PK\x03\x04", 4) +
                            std::string("\x14\x00\x00\x00\x08\x00", 6) + std::string(4, '\0') +
                            le32(crc) + le32(uint32_t(packed.size())) + le32(uint32_t(big.size())) +
                            std::string("\x01\x00\x00\x00", 4) + "x" + packed;
        std::string central = std::string("PK\x01\x02", 4) +
                              std::string("\x14\x03\x14\x00\x00\x00\x08\x00", 8) +
                              std::string(4, '\0') + le32(crc) + le32(uint32_t(packed.size())) +
                              le32(uint32_t(big.size())) + std::string("\x01\x00", 2) +
                              std::string(12, '\0') + le32(0) + "x";
        std::string archive = local + central + std::string("PK\x05\x06", 4) +
                              std::string(4, '\0') + std::string("\x01\x00\x01\x00", 4) +
                              le32(uint32_t(central.size())) + le32(uint32_t(local.size())) +
                              std::string(2, '\0');
        auto deflated = readZipArchive(archive, "d.zip");
        TD_VERIFY_OK(deflated);
        QVERIFY((*deflated)[0].bytes == big);
        QVERIFY(packed.size() < big.size() / 2);

        // Damage: a flipped data byte fails the CRC; a cut archive has no end record.
        std::string bad = *bytes;
        bad[30 + 5 + 1] ^= 0x20;  // inside "hello"
        TD_VERIFY_ERROR(readZipArchive(bad, "t.zip"), "t.zip: member 'a.txt': CRC-32 mismatch");
        TD_VERIFY_ERROR(readZipArchive(bytes->substr(0, bytes->size() / 2), "t.zip"),
                        "t.zip: not a zip archive (no end-of-central-directory record)");
        TD_VERIFY_ERROR(readZipArchive("hello", "t.zip"), "t.zip: not a zip archive");
        TD_VERIFY_ERROR(readZipArchive(*bytes, "t.zip", 1000), "member 'dir/b.bin': 100000 bytes");
    }

    void snakeCase() {
        QCOMPARE(kerasSnakeCase("Dense"), std::string("dense"));
        QCOMPARE(kerasSnakeCase("BatchNormalization"), std::string("batch_normalization"));
        QCOMPARE(kerasSnakeCase("Conv2D"), std::string("conv2d"));
        QCOMPARE(kerasSnakeCase("MaxPooling2D"), std::string("max_pooling2d"));
        QCOMPARE(kerasSnakeCase("ReLU"), std::string("re_lu"));
        QCOMPARE(kerasSnakeCase("GlobalAveragePooling2D"), std::string("global_average_pooling2d"));
    }

    void weightLayoutOfLayers() {
        auto layout = weightLayout(shaped());
        TD_VERIFY_OK(layout);
        QCOMPARE(layout->size(), size_t{6});
        QCOMPARE((*layout)[1].variables.size(), size_t{1});  // dense without bias
        QCOMPARE((*layout)[1].variables[0].shape, (Shape{12, 5}));
        QCOMPARE((*layout)[5].variables[0].shape, (Shape{5, 2}));
        QCOMPARE((*layout)[5].variables[1].param, std::string("dense_1/bias"));
        QVERIFY((*layout)[2].variables.empty());  // reshape

        // Image layers, in Keras' variable order and shapes.
        auto image = weightLayout(cnn());
        TD_VERIFY_OK(image);
        std::vector<std::string> vars;
        for (const LayerWeights& lw : *image)
            for (const WeightSlot& s : lw.variables)
                vars.push_back(s.param + " " + shapeToString(s.shape));
        QCOMPARE(vars,
                 (std::vector<std::string>{
                     "conv2d/kernel [3,3,2,4]", "conv2d/bias [4]", "batch_normalization/gamma [4]",
                     "batch_normalization/beta [4]", "batch_normalization/moving_mean [4]",
                     "batch_normalization/moving_variance [4]", "conv2d_1/kernel [2,2,2,4]",
                     "conv2d_1/bias [4]", "layer_normalization/gamma [4]",
                     "layer_normalization/beta [4]", "dense/kernel [24,3]", "dense/bias [3]"}));
        vars.clear();
        auto gapLayout = weightLayout(cnnGap());
        TD_VERIFY_OK(gapLayout);
        for (const LayerWeights& lw : *gapLayout)
            for (const WeightSlot& s : lw.variables) vars.push_back(s.param);
        QCOMPARE(vars, (std::vector<std::string>{
                           "conv2d/kernel", "batch_normalization/gamma",
                           "batch_normalization/moving_mean", "batch_normalization/moving_variance",
                           "layer_normalization/beta", "dense/kernel", "dense/bias"}));

        ModelWeights w = randomWeights(mlp(), 1);
        auto lay = weightLayout(w.model);
        TD_VERIFY_OK(checkWeights(*lay, w.params, "w"));
        w.params["dense_1/kernel"] = Tensor(DType::F32, {16, 9});
        TD_VERIFY_ERROR(
            checkWeights(*lay, w.params, "w.keras"),
            "w.keras: layer 3 'dense_1' (Dense): kernel has shape [16,9], expected [16,8]");
        w.params.erase("dense_1/kernel");
        TD_VERIFY_ERROR(checkWeights(*lay, w.params, "w.keras"),
                        "layer 3 'dense_1' (Dense): no kernel (expected shape [16,8])");
        w = randomWeights(mlp(), 1);
        w.params["ghost/kernel"] = Tensor(DType::F32, {1});
        TD_VERIFY_ERROR(checkWeights(*lay, w.params, "w.keras"),
                        "weights 'ghost/kernel' belong to no layer");
    }

    void h5LayoutAsKeras() {
        ModelWeights w = randomWeights(mlp(), 2);
        auto bytes = kerasArchiveBytes(w);
        TD_VERIFY_OK(bytes);
        auto members = readZipArchive(*bytes, "m.keras");
        TD_VERIFY_OK(members);
        QCOMPARE(members->size(), size_t{3});
        QCOMPARE((*members)[0].name, std::string("metadata.json"));
        QCOMPARE((*members)[1].name, std::string("config.json"));
        QCOMPARE((*members)[2].name, std::string("model.weights.h5"));
        auto groups = readKerasWeightsH5((*members)[2].bytes, "h5");
        TD_VERIFY_OK(groups);
        // Keras' layout: layers/<snake class>[_n]/vars/<i>, every layer (not the InputLayer).
        std::vector<std::string> paths;
        for (const auto& [p, v] : *groups) paths.push_back(p);
        QCOMPARE(paths,
                 (std::vector<std::string>{"", "layers/activation", "layers/dense",
                                           "layers/dense_1", "layers/dense_2", "layers/dropout"}));
        QCOMPARE(groups->at("layers/dense").size(), size_t{2});
        QVERIFY(sameBits(groups->at("layers/dense_1")[0], w.params.at("dense_1/kernel")));
        QVERIFY(sameBits(groups->at("layers/dense_2")[1], w.params.at("dense_2/bias")));
        QVERIFY(groups->at("layers/dropout").empty());
        // Files on disk named like the member do not matter (the HDF5 file lives in memory).
        const fs::path cwd = fs::current_path();
        fs::current_path(dir_);
        writeBytes("model.weights.h5", "unrelated");
        auto again = readKerasWeightsH5((*members)[2].bytes, "h5");
        auto rewritten = kerasArchiveBytes(w);
        fs::current_path(cwd);
        TD_VERIFY_OK(again);
        TD_VERIFY_OK(rewritten);
        QCOMPARE(again->size(), groups->size());
        std::ifstream junk(dir_ + "/model.weights.h5");
        QCOMPARE(std::string((std::istreambuf_iterator<char>(junk)), {}), std::string("unrelated"));
        TD_VERIFY_ERROR(readKerasWeightsH5("not hdf5 at all", "m.keras: model.weights.h5"),
                        "m.keras: model.weights.h5: not an HDF5 file");
        std::string cut = (*members)[2].bytes.substr(0, (*members)[2].bytes.size() / 3);
        TD_VERIFY_ERROR(readKerasWeightsH5(cut, "m.keras: model.weights.h5"),
                        "m.keras: model.weights.h5");
    }

    void kerasRoundTrip_data() {
        QTest::addColumn<int>("which");
        QTest::newRow("mlp") << 0;
        QTest::newRow("flatten-reshape-no-bias") << 1;
        QTest::newRow("cnn") << 2;
        QTest::newRow("cnn-global-pooling") << 3;
    }
    void kerasRoundTrip() {
        QFETCH(int, which);
        const ModelSpec models[] = {mlp(), shaped(), cnn(), cnnGap()};
        ModelWeights w = randomWeights(models[which], 3);
        const std::string path = dir_ + "/rt.keras";
        TD_VERIFY_OK(saveKerasArchive(w, path));
        auto back = loadKerasArchive(path);
        TD_VERIFY_OK(back);
        QCOMPARE(back->kerasVersion.substr(0, 2), std::string("3."));
        ModelSpec named = w.model;
        QVERIFY(inferShapes(named).ok());
        QCOMPARE(modelToKerasJson(back->weights.model), modelToKerasJson(named));
        // Keras' config names every window layer's strides; empty strides mean the default.
        for (LayerSpec& l : named.layers)
            if (l.type == LayerType::Conv2D || l.type == LayerType::MaxPooling2D ||
                l.type == LayerType::AveragePooling2D)
                l.strides = effectiveStrides(l);
        QVERIFY(back->weights.model == named);
        QCOMPARE(back->weights.params.size(), w.params.size());
        for (const auto& [name, t] : w.params)
            QVERIFY2(sameBits(back->weights.params.at(name), t), name.c_str());

        // Predictions: the engine on the original and on the re-read model, bit for bit, and
        // against a double-precision reference.
        auto loaded = loadModelFile(path);
        TD_VERIFY_OK(loaded);
        QCOMPARE(loaded->kind, std::string("keras"));
        LoadedModel original;
        original.weights = w;
        const Tensor x = randomInput(37, (*weightLayout(w.model))[0].inputShape, 4);
        auto y0 = predictWithModel(original, x);
        auto y1 = predictWithModel(*loaded, x);
        TD_VERIFY_OK(y0);
        TD_VERIFY_OK(y1);
        QVERIFY(sameBits(*y0, *y1));
        if (which >= 2) return;  // the image layers' numbers: interop.py, against Keras and ORT
        const int64_t k = y0->dim(1);
        const int64_t inValues = x.size() / x.dim(0);
        double worst = 0;
        for (int64_t i = 0; i < x.dim(0); ++i) {
            const auto ref = referenceForward(w, x.data<float>() + i * inValues);
            for (int64_t j = 0; j < k; ++j)
                worst = std::max(worst, std::abs(ref[static_cast<size_t>(j)] -
                                                 double(y0->data<float>()[i * k + j])));
        }
        QVERIFY2(worst < 1e-4, qPrintable(QString("max abs diff %1").arg(worst)));
    }

    void kerasArchiveErrors() {
        ModelWeights w = randomWeights(mlp(), 5);
        auto good = kerasArchiveBytes(w);
        TD_VERIFY_OK(good);
        auto members = *readZipArchive(*good, "x");
        auto rezip = [&](std::vector<ZipMember> m) { return *zipArchiveBytes(m); };

        TD_VERIFY_ERROR(parseKerasArchive(rezip({members[0], members[2]}), "m.keras"),
                        "m.keras: no config.json in the archive");
        TD_VERIFY_ERROR(parseKerasArchive(rezip({members[0], members[1]}), "m.keras"),
                        "m.keras: no model.weights.h5 in the archive");
        TD_VERIFY_ERROR(
            parseKerasArchive(rezip({members[0], {"config.json", "{oops"}, members[2]}), "m.keras"),
            "m.keras: config.json: invalid JSON");
        TD_VERIFY_ERROR(
            parseKerasArchive(
                rezip(
                    {{"metadata.json", R"({"keras_version": "2.15.0"})"}, members[1], members[2]}),
                "m.keras"),
            "keras_version 2.15.0 (expected a file written by Keras 3)");
        // Weights of another shape: dense_1 with 9 units in the file.
        ModelWeights other = w;
        other.model.layers[3].units = 9;
        other.params["dense_1/kernel"] = Tensor(DType::F32, {16, 9});
        other.params["dense_1/bias"] = Tensor(DType::F32, {9});
        other.params["dense_2/kernel"] = Tensor(DType::F32, {9, 3});
        auto otherMembers = *readZipArchive(*kerasArchiveBytes(other), "x");
        TD_VERIFY_ERROR(
            parseKerasArchive(rezip({members[0], members[1], otherMembers[2]}), "m.keras"),
            "m.keras: model.weights.h5: layers/dense_1/vars/0: shape [16,9], expected "
            "[16,8] (kernel of layer 3 'dense_1' (Dense))");
        // A file with fewer layers than its config.
        ModelWeights small = randomWeights(shaped(), 6);
        auto smallMembers = *readZipArchive(*kerasArchiveBytes(small), "x");
        TD_VERIFY_ERROR(
            parseKerasArchive(rezip({members[0], members[1], smallMembers[2]}), "m.keras"),
            "m.keras: model.weights.h5: layers/dense/vars: 1 variable, expected 2 "
            "(kernel [12,16], bias [16]) for layer 1 'dense' (Dense)");
        // Unknown Keras layer class in config.json.
        std::string cfg = members[1].bytes;
        cfg.replace(cfg.find("\"Dropout\""), 9, "\"SpatialDropout1D\"");
        TD_VERIFY_ERROR(
            parseKerasArchive(rezip({members[0], {"config.json", cfg}, members[2]}), "m.keras"),
            "m.keras: config.json: ");
        TD_VERIFY_ERROR(
            parseKerasArchive(rezip({members[0], {"config.json", cfg}, members[2]}), "m.keras"),
            "SpatialDropout1D");
        TD_VERIFY_ERROR(loadKerasArchive(dir_ + "/missing.keras"), "missing.keras: no such file");
        // A Dense activation parameter Keras' activation string cannot carry.
        ModelWeights slope = randomWeights(shaped(), 12);
        slope.model.layers[2].negativeSlope = 0.3;
        TD_VERIFY_ERROR(kerasArchiveBytes(slope),
                        "layer 2 'dense' (Dense): activation leaky_relu with negative_slope 0.3");
        writeBytes(dir_ + "/text.keras", "just text");
        TD_VERIFY_ERROR(loadKerasArchive(dir_ + "/text.keras"), "text.keras: not a zip archive");
        TD_VERIFY_ERROR(loadModelFile(dir_ + "/text.keras"),
                        "text.keras: not a model file TrainDeck reads");
    }

    // The image preprocessing layers as Keras 3 writes them: every field read, written back
    // with the keys and values Keras wrote, and read again to the same model; what TrainDeck
    // cannot compute is refused naming the key.
    void kerasPreprocessingLayers() {
        std::vector<std::string> warnings;
        auto m = modelFromKerasJson(kKerasPreprocessingJson, &warnings);
        TD_VERIFY_OK(m);
        QVERIFY2(warnings.empty(), warnings.empty() ? "" : warnings[0].c_str());
        const std::vector<LayerSpec>& L = m->layers;
        QCOMPARE(L.size(), size_t(10));
        QCOMPARE(L[1].type, LayerType::Resizing);
        QCOMPARE(L[1].targetHeight, int64_t(24));
        QCOMPARE(L[1].targetWidth, int64_t(26));
        QCOMPARE(L[1].interpolation, InterpolationKind::Nearest);
        QVERIFY(L[1].padToAspectRatio && !L[1].cropToAspectRatio);
        QCOMPARE(L[1].fillValue, 0.5);
        QCOMPARE(L[2].type, LayerType::CenterCrop);
        QCOMPARE(L[3].seed, std::optional<uint64_t>(3));
        QCOMPARE(L[4].flipMode, FlipModeKind::Vertical);
        QCOMPARE(L[5].factor, (FactorRange{-0.2, 0.1}));
        QCOMPARE(L[5].fillMode, FillModeKind::Wrap);
        QCOMPARE(L[5].interpolation, InterpolationKind::Nearest);
        QCOMPARE(L[6].heightFactor, (FactorRange{-0.1, 0.1}));
        QCOMPARE(L[6].widthFactor, std::optional<FactorRange>(FactorRange{-0.3, 0.2}));
        QCOMPARE(L[6].fillMode, FillModeKind::Constant);
        QCOMPARE(L[6].fillValue, 1.0);
        QCOMPARE(L[7].widthFactor, std::optional<FactorRange>(FactorRange{-0.2, 0.2}));
        QCOMPARE(L[7].fillMode, FillModeKind::Nearest);
        QCOMPARE(L[8].factor, (FactorRange{0.0, 0.2}));  // Keras' RandomContrast(0.2)
        QCOMPARE(L[8].valueHigh, 1.0);
        QCOMPARE(L[9].factor, (FactorRange{-0.3, 0.3}));
        QCOMPARE(L[9].valueLow, -1.0);  // (1, -1) sorted, as Keras does
        QVERIFY(inferShapes(*m).ok());

        // Written back: each layer's config holds exactly Keras' keys with Keras' values.
        const auto keras = nlohmann::ordered_json::parse(kKerasPreprocessingJson);
        const auto ours = nlohmann::ordered_json::parse(modelToKerasJson(*m));
        for (size_t i = 1; i < L.size(); ++i) {
            const auto& want = keras["config"]["layers"][i]["config"];
            const auto& got = ours["config"]["layers"][i]["config"];
            QCOMPARE(got.size(), want.size());
            for (auto it = want.begin(); it != want.end(); ++it)
                QVERIFY2(got.contains(it.key()) && got[it.key()] == it.value(),
                         qPrintable(q(L[i].name + "." + it.key() + ": " +
                                      (got.contains(it.key()) ? got[it.key()].dump() : "none") +
                                      ", Keras " + it.value().dump())));
        }
        auto again = modelFromKerasJson(modelToKerasJson(*m));
        TD_VERIFY_OK(again);
        QVERIFY(*again == *m);

        auto refused = [](const std::string& from, const std::string& to) {
            std::string text = kKerasPreprocessingJson;
            const size_t at = text.find(from);
            if (at == std::string::npos) qFatal("%s not in the fixture", from.c_str());
            return modelFromKerasJson(text.replace(at, from.size(), to));
        };
        TD_VERIFY_ERROR(refused(R"("data_format": "channels_last", "height": 20)",
                                R"("data_format": "channels_first", "height": 20)"),
                        "layers[2].config.data_format: only \"channels_last\" images");
        TD_VERIFY_ERROR(refused(R"("interpolation": "nearest", "crop_to_aspect_ratio")",
                                R"("interpolation": "bicubic", "crop_to_aspect_ratio")"),
                        "layers[1].config.interpolation: expected one of \"bilinear\", "
                        "\"nearest\", got \"bicubic\"");
        TD_VERIFY_ERROR(refused(R"("antialias": false)", R"("antialias": true)"),
                        "antialias true is not supported");
        TD_VERIFY_ERROR(refused(R"("fill_mode": "constant", "fill_value": 0.5)",
                                R"("fill_mode": "reflect", "fill_value": 0.5)"),
                        "layers[1].config.fill_mode: expected one of \"constant\"");
        TD_VERIFY_ERROR(refused(R"("height_factor": 0.1, "width_factor": [-0.3, 0.2])",
                                R"("height_factor": -1, "width_factor": [-0.3, 0.2])"),
                        "layers[6].config.height_factor: expected a number or two numbers "
                        "[lower, upper] in (-1, 1], got -1");
        TD_VERIFY_ERROR(refused(R"("factor": [-0.2, 0.1])", R"("factor": 1.5)"),
                        "layers[5].config.factor");
        TD_VERIFY_ERROR(
            refused(R"("seed": 1, "mode": "vertical")", R"("seed": 1, "mode": "diagonal")"),
            "layers[4].config.mode: expected one of");
        TD_VERIFY_ERROR(refused(R"("seed": 1, "mode": "vertical")",
                                R"("seed": 1, "mode": "vertical", "probability": 0.5)"),
                        "probability");
        TD_VERIFY_ERROR(refused(R"("height_factor": 0.1, "width_factor": 0.2)",
                                R"("height_factor": 0.1, "width_factor": null)"),
                        "RandomTranslation needs a width_factor");
    }

    // A model with preprocessing and augmentation layers exported: the .keras file reads back to
    // the same model and weights; ONNX has Slice and Resize for Resizing and CenterCrop and no
    // node for the Random* layers (interop.py runs both in Keras and ONNX Runtime).
    void preprocessingLayersExport() {
        ModelWeights w = randomWeights(preprocessed(), 31);
        const std::string path = dir_ + "/preprocessed.keras";
        TD_VERIFY_OK(saveKerasArchive(w, path));
        auto back = loadKerasArchive(path);
        TD_VERIFY_OK(back);
        ModelSpec named = w.model;
        QVERIFY(inferShapes(named).ok());
        QVERIFY(back->weights.model == named);
        for (const auto& [name, t] : w.params)
            QVERIFY2(sameBits(back->weights.params.at(name), t), name.c_str());
        auto bytes = onnxModelBytes(w);
        TD_VERIFY_OK(bytes);
        const OnnxNodes nodes =
            onnxNodes(parseMessage(fields(parseMessage(*bytes), 7).at(0).bytes));
        QVERIFY2(nodes.brokenAt.empty(), nodes.brokenAt.c_str());
        // Resizing: the centred 10x10 cut out (rows 0..10, columns 1..11), resized channels-first
        // to sizes [batch, 2, 8, 8]; CenterCrop: rows and columns 1.. of the 8x8 (axes 2, 3).
        QCOMPARE(nodes.ops, (std::vector<std::string>{
                                "Slice", "Transpose", "Shape", "Slice", "Concat", "Resize", "Slice",
                                "Conv", "Transpose", "Flatten", "Gemm", "Softmax", "Identity"}));
        // The Random* layers only in training programs: prediction is the same with or without.
        ModelWeights plain = w;
        plain.model.layers.erase(plain.model.layers.begin() + 4);  // RandomContrast
        plain.model.layers.erase(plain.model.layers.begin() + 2);  // RandomFlip
        const Tensor x = randomInput(5, {10, 13, 2}, 32);
        LoadedModel a, b;
        a.weights = w;
        b.weights = plain;
        auto ya = predictWithModel(a, x), yb = predictWithModel(b, x);
        TD_VERIFY_OK(ya);
        TD_VERIFY_OK(yb);
        QVERIFY(sameBits(*ya, *yb));
    }

    void onnxStructure() {
        ModelWeights w = randomWeights(mlp(), 7);
        auto bytes = onnxModelBytes(w);
        TD_VERIFY_OK(bytes);
        const auto model = parseMessage(*bytes);
        QCOMPARE(fields(model, 1).at(0).varint, uint64_t{8});  // ir_version
        const auto opset = parseMessage(fields(model, 8).at(0).bytes);
        QCOMPARE(str(opset, 1), std::string());
        QCOMPARE(fields(opset, 2).at(0).varint, uint64_t{17});
        QCOMPARE(str(model, 2), std::string("TrainDeck"));
        const auto graph = parseMessage(fields(model, 7).at(0).bytes);
        const OnnxNodes nodes = onnxNodes(graph);
        QVERIFY2(nodes.brokenAt.empty(), nodes.brokenAt.c_str());
        QCOMPARE(nodes.last, std::string("output"));
        QCOMPARE(nodes.ops,
                 (std::vector<std::string>{"Gemm", "Relu", "Gemm", "Div", "Erf", "Add", "Mul",
                                           "Mul", "Tanh", "Gemm", "Softmax", "Identity"}));
        const std::map<std::string, Tensor> inits = onnxFloatInitializers(graph);
        for (const auto& [name, t] : w.params) QVERIFY2(sameBits(inits.at(name), t), name.c_str());
        // Input: float [batch, 12] with a symbolic batch dimension.
        const auto input = parseMessage(fields(graph, 11).at(0).bytes);
        QCOMPARE(str(input, 1), std::string("input"));
        const auto type = parseMessage(str(parseMessage(str(input, 2)), 1));
        QCOMPARE(fields(type, 1).at(0).varint, uint64_t{1});
        const auto dims = fields(parseMessage(str(type, 2)), 1);
        QCOMPARE(dims.size(), size_t{2});
        QCOMPARE(str(parseMessage(dims[0].bytes), 2), std::string("batch"));
        QCOMPARE(fields(parseMessage(dims[1].bytes), 1).at(0).varint, uint64_t{12});

        // Flatten, Reshape to [-1, 5, 1], MatMul for a Dense without bias, LeakyRelu's alpha.
        auto shapedBytes = onnxModelBytes(randomWeights(shaped(), 8));
        TD_VERIFY_OK(shapedBytes);
        const auto g2 = parseMessage(fields(parseMessage(*shapedBytes), 7).at(0).bytes);
        std::vector<std::string> ops;
        std::vector<float> alphas;
        for (const Field& n : fields(g2, 1)) {
            const auto node = parseMessage(n.bytes);
            ops.push_back(str(node, 4));
            if (str(node, 4) == "LeakyRelu")
                alphas.push_back(fields(parseMessage(str(node, 5)), 2).at(0).f32);
        }
        QCOMPARE(ops,
                 (std::vector<std::string>{"Flatten", "MatMul", "LeakyRelu", "Reshape", "LeakyRelu",
                                           "Flatten", "Gemm", "Elu", "Identity"}));
        QCOMPARE(alphas, (std::vector<float>{0.2f, 0.1f}));
        for (const Field& f : fields(g2, 5)) {
            const auto t = parseMessage(f.bytes);
            if (str(t, 8) != "reshape/shape") continue;
            QCOMPARE(fields(t, 2).at(0).varint, uint64_t{7});
            const std::string raw = str(t, 9);
            std::vector<int64_t> v(raw.size() / 8);
            std::memcpy(v.data(), raw.data(), raw.size());
            QCOMPARE(v, (std::vector<int64_t>{-1, 5, 1}));
        }
        TD_VERIFY_ERROR(saveOnnxModel(w, dir_ + "/no/such/dir/m.onnx"), "m.onnx: cannot write");
    }

    void onnxImageLayers() {
        // Channels-last values go channels-first for a run of Conv / pooling / BatchNormalization
        // and back where the last axis is read as channels (LayerNormalization, Flatten).
        const ModelWeights w = randomWeights(cnn(), 21);
        auto bytes = onnxModelBytes(w);
        TD_VERIFY_OK(bytes);
        const auto graph = parseMessage(fields(parseMessage(*bytes), 7).at(0).bytes);
        const OnnxNodes nodes = onnxNodes(graph);
        QVERIFY2(nodes.brokenAt.empty(), nodes.brokenAt.c_str());
        const auto& ops = nodes.ops;
        auto intsOf = nodes.ints;
        QCOMPARE(ops, (std::vector<std::string>{
                          "Mul", "Add", "Pad", "Transpose", "Conv", "Relu", "BatchNormalization",
                          "Conv", "MaxPool", "Transpose", "LayerNormalization", "Transpose",
                          "AveragePool", "Transpose", "Flatten", "Gemm", "Softmax", "Identity"}));
        QCOMPARE(intsOf["conv2d/to_channels_first"]["perm"], (std::vector<int64_t>{0, 3, 1, 2}));
        QCOMPARE(intsOf["layer_normalization/to_channels_last"]["perm"],
                 (std::vector<int64_t>{0, 2, 3, 1}));
        // Same padding of 10x11 with a 3x3 kernel, stride 2: 1 row at the bottom; 1 column each
        // side. ONNX orders pads [top, left, bottom, right].
        QCOMPARE(intsOf["conv2d/conv"]["pads"], (std::vector<int64_t>{0, 1, 1, 1}));
        QCOMPARE(intsOf["conv2d/conv"]["strides"], (std::vector<int64_t>{2, 2}));
        QCOMPARE(intsOf["conv2d_1/conv"]["dilations"], (std::vector<int64_t>{2, 1}));
        QCOMPARE(intsOf["conv2d_1/conv"]["group"], (std::vector<int64_t>{2}));
        QCOMPARE(intsOf["max_pooling2d/max_pool"]["kernel_shape"], (std::vector<int64_t>{2, 2}));
        QCOMPARE(intsOf["average_pooling2d/avg_pool"]["count_include_pad"],
                 (std::vector<int64_t>{0}));
        // The kernel as [filters, in / groups, kh, kw]; the moving statistics as they are.
        const std::map<std::string, Tensor> inits = onnxFloatInitializers(graph);
        const Tensor& k = w.params.at("conv2d_1/kernel");  // [2, 2, 2, 4]
        const Tensor& ko = inits.at("conv2d_1/kernel");
        QCOMPARE(ko.shape(), (Shape{4, 2, 2, 2}));
        for (int64_t y = 0; y < 2; ++y)
            for (int64_t x = 0; x < 2; ++x)
                for (int64_t c = 0; c < 2; ++c)
                    for (int64_t o = 0; o < 4; ++o)
                        QCOMPARE(ko.data<float>()[((o * 2 + c) * 2 + y) * 2 + x],
                                 k.data<float>()[((y * 2 + x) * 2 + c) * 4 + o]);
        QVERIFY(sameBits(inits.at("batch_normalization/moving_variance"),
                         w.params.at("batch_normalization/moving_variance")));

        // Global pooling ends the channels-first run itself; a missing beta is zeros, a missing
        // gamma ones.
        auto gapBytes = onnxModelBytes(randomWeights(cnnGap(), 22));
        TD_VERIFY_OK(gapBytes);
        const auto g2 = parseMessage(fields(parseMessage(*gapBytes), 7).at(0).bytes);
        QCOMPARE(onnxNodes(g2).ops,
                 (std::vector<std::string>{"Transpose", "Conv", "Tanh", "BatchNormalization",
                                           "Transpose", "LayerNormalization", "Transpose",
                                           "GlobalAveragePool", "Flatten", "Gemm", "Identity"}));
        for (const Field& f : fields(g2, 5)) {
            const auto t = parseMessage(f.bytes);
            const std::string name = str(t, 8);
            if (name != "batch_normalization/beta" && name != "layer_normalization/gamma") continue;
            std::vector<float> v(str(t, 9).size() / 4);
            std::memcpy(v.data(), str(t, 9).data(), v.size() * 4);
            QCOMPARE(v, std::vector<float>(3, name == "batch_normalization/beta" ? 0.f : 1.f));
        }
    }

    void initialWeightsThroughProject() {
        // An imported .keras file becomes a project whose parameters start from its weights.
        ModelWeights w = randomWeights(mlp(), 9);
        const std::string kerasPath = dir_ + "/init.keras";
        TD_VERIFY_OK(saveKerasArchive(w, kerasPath));
        Project like;
        like.data.source.type = "synthetic";
        like.data.source.sampleShape = {12};
        like.data.source.classes = 3;
        like.data.source.samples = 64;
        like.data.source.testSamples = 0;
        like.training.epochs = 1;
        like.training.batchSize = 16;
        auto imported = importKerasModel(kerasPath, &like);
        TD_VERIFY_OK(imported);
        QCOMPARE(imported->project.initialWeights,
                 fs::absolute(kerasPath).lexically_normal().string());
        QCOMPARE(imported->project.name, std::string("init"));

        // Saved next to the weights: written relative, read back absolute, equal project.
        const std::string projectPath = dir_ + "/imported.json";
        TD_VERIFY_OK(saveProject(imported->project, projectPath));
        std::ifstream in(projectPath);
        const std::string text((std::istreambuf_iterator<char>(in)), {});
        QVERIFY2(text.find("\"initial_weights\": \"init.keras\"") != std::string::npos,
                 text.c_str());
        auto reloaded = loadProject(projectPath);
        TD_VERIFY_OK(reloaded);
        QCOMPARE(projectDifference(*reloaded, imported->project), std::string());

        auto session = Session::create(*reloaded, SessionOptions{});
        TD_VERIFY_OK(session);
        auto params = (*session)->parameters();
        TD_VERIFY_OK(params);
        for (const auto& [name, t] : w.params)
            QVERIFY2(sameBits(params->at(name), t), name.c_str());
        // Trained further: one epoch moves the weights away from the imported ones.
        TD_VERIFY_OK((*session)->fit());
        auto trained = sessionModelWeights(**session);
        TD_VERIFY_OK(trained);
        QVERIFY(!sameBits(trained->params.at("dense/kernel"), w.params.at("dense/kernel")));
        // ... and the trained model exports and reads back with the session's predictions.
        const std::string trainedPath = dir_ + "/trained.keras";
        TD_VERIFY_OK(exportModel(*trained, ExportFormat::Keras, trainedPath));
        auto reread = loadModelFile(trainedPath);
        TD_VERIFY_OK(reread);
        const Tensor x = randomInput(10, {12}, 10);
        auto ySession = (*session)->predict(x);
        auto yFile = predictWithModel(*reread, x);
        TD_VERIFY_OK(ySession);
        TD_VERIFY_OK(yFile);
        QVERIFY(sameBits(*ySession, *yFile));

        // Mismatches name the file, the layer and what was expected.
        Project p = *reloaded;
        p.model.layers[3].units = 9;
        p.model.layers[5].kernelInitializer = InitializerSpec{};
        auto bad = Session::create(p, SessionOptions{});
        TD_VERIFY_ERROR(bad, "initial_weights: " + kerasPath +
                                 ": layer 3 'dense_1' (Dense): kernel has shape [16,8] in the "
                                 "file, expected [16,9]");
        p = *reloaded;
        p.model.layers[1].name = "hidden";
        TD_VERIFY_ERROR(Session::create(p, SessionOptions{}),
                        "layer 1 'hidden' (Dense): no layer of that name in the file (its layers "
                        "with weights: dense, dense_1, dense_2)");
        p = *reloaded;
        p.initialWeights = dir_ + "/absent.keras";
        TD_VERIFY_ERROR(Session::create(p, SessionOptions{}),
                        "initial_weights: " + dir_ + "/absent.keras: no such file");
    }

    // Without a project to take the setup from, the loss fits the model's output.
    void importChoosesLoss_data() {
        QTest::addColumn<int>("units");
        QTest::addColumn<int>("activation");
        QTest::addColumn<QString>("loss");
        QTest::addColumn<bool>("fromLogits");
        QTest::addColumn<bool>("accuracy");
        QTest::newRow("softmax") << 3 << int(ActivationKind::Softmax)
                                 << "sparse_categorical_crossentropy" << false << true;
        QTest::newRow("logits") << 3 << int(ActivationKind::Linear)
                                << "sparse_categorical_crossentropy" << true << true;
        QTest::newRow("sigmoid") << 1 << int(ActivationKind::Sigmoid) << "binary_crossentropy"
                                 << false << true;
        QTest::newRow("regression")
            << 1 << int(ActivationKind::Linear) << "mean_squared_error" << false << false;
    }
    void importChoosesLoss() {
        QFETCH(int, units);
        QFETCH(int, activation);
        QFETCH(QString, loss);
        QFETCH(bool, fromLogits);
        QFETCH(bool, accuracy);
        ModelSpec m = mlp();
        m.layers.back().units = units;
        m.layers.back().activation = static_cast<ActivationKind>(activation);
        const std::string path = dir_ + "/loss.keras";
        TD_VERIFY_OK(saveKerasArchive(randomWeights(m, 15), path));
        auto imported = importKerasModel(path, nullptr);
        TD_VERIFY_OK(imported);
        Project p = imported->project;
        QCOMPARE(q(p.training.loss.name), loss);
        QCOMPARE(p.training.loss.fromLogits, fromLogits);
        QCOMPARE(!p.training.metrics.empty(), accuracy);
        // It trains (on data of the model's shape).
        p.data.source = SourceConfig{};
        p.data.source.type = "synthetic";
        p.data.source.sampleShape = {12};
        p.data.source.classes = 2;
        p.data.source.samples = 32;
        p.data.source.testSamples = 0;
        p.training.epochs = 1;
        auto session = Session::create(p, SessionOptions{});
        TD_VERIFY_OK(session);
        TD_VERIFY_OK((*session)->fit());
    }

    // model.compile's optimizer, loss and metrics (config.json's compile_config) become the
    // imported project's training setup when TrainDeck reads them; otherwise a warning says so.
    void importTakesCompileConfig() {
        auto members = *readZipArchive(*kerasArchiveBytes(randomWeights(mlp(), 16)), "x");
        auto withCompile = [&](const std::string& cc) {
            nlohmann::json config = nlohmann::json::parse(members[1].bytes);
            config["compile_config"] = nlohmann::json::parse(cc);
            const std::string path = dir_ + "/compiled.keras";
            writeBytes(path,
                       *zipArchiveBytes({members[0], {"config.json", config.dump()}, members[2]}));
            return importKerasModel(path, nullptr);
        };
        auto sgd = withCompile(R"({"optimizer": {"module": "keras.optimizers", "class_name": "SGD",
            "config": {"name": "SGD", "learning_rate": 0.05, "momentum": 0.9, "nesterov": false},
            "registered_name": null}, "loss": "categorical_crossentropy", "loss_weights": null,
            "metrics": ["accuracy"], "weighted_metrics": null, "run_eagerly": false,
            "steps_per_execution": 1, "jit_compile": false})");
        TD_VERIFY_OK(sgd);
        QCOMPARE(sgd->project.training.optimizer.name, std::string("sgd"));
        QCOMPARE(sgd->project.training.optimizer.learningRate, 0.05);
        QCOMPARE(sgd->project.training.optimizer.momentum, 0.9);
        QCOMPARE(sgd->project.training.loss.name, std::string("categorical_crossentropy"));
        QVERIFY(sgd->warnings.empty());
        auto lion = withCompile(R"({"optimizer": {"class_name": "Lion", "config": {}},
            "loss": "sparse_categorical_crossentropy"})");
        TD_VERIFY_OK(lion);
        QCOMPARE(lion->project.training.optimizer.name, std::string("adam"));
        QCOMPARE(lion->warnings.size(), size_t{1});
        QVERIFY2(lion->warnings[0].find("compile_config not applied (compile_config: "
                                        "training.optimizer") == 0,
                 lion->warnings[0].c_str());
        // A project to take the setup from wins over compile_config.
        Project like;
        like.training.optimizer.name = "rmsprop";
        auto liked =
            withCompile(R"({"optimizer": "sgd", "loss": "sparse_categorical_crossentropy"})");
        TD_VERIFY_OK(liked);
        QCOMPARE(liked->project.training.optimizer.name, std::string("sgd"));
        auto withLike = importKerasModel(dir_ + "/compiled.keras", &like);
        TD_VERIFY_OK(withLike);
        QCOMPARE(withLike->project.training.optimizer.name, std::string("rmsprop"));
    }

    void projectFieldValidation() {
        const std::string base = R"({"format": "traindeck-project", "model": {"class_name":
            "Sequential", "config": {"layers": [{"class_name": "InputLayer", "config":
            {"batch_shape": [null, 4]}}, {"class_name": "Dense", "config": {"units": 2}}]}}})";
        auto withKey = [&](const std::string& kv) {
            return base.substr(0, base.size() - 1) + ", " + kv + "}";
        };
        TD_VERIFY_ERROR(parseProject(withKey(R"("initial_weights": 3)"), "p.json"),
                        "p.json: initial_weights: expected a non-empty string");
        TD_VERIFY_ERROR(parseProject(withKey(R"("initial_weights": "")"), "p.json"),
                        "p.json: initial_weights");
        auto ok = parseProject(withKey(R"("initial_weights": "w.keras")"), "p.json");
        TD_VERIFY_OK(ok);
        QCOMPARE(ok->initialWeights, std::string("w.keras"));
        TD_VERIFY_ERROR(parseProject(withKey(R"("initial_weight": "w.keras")"), "p.json"),
                        "did you mean 'initial_weights'");
        auto plain = parseProject(base, "p.json");
        TD_VERIFY_OK(plain);
        QVERIFY(projectToJson(*plain).find("initial_weights") == std::string::npos);
        QCOMPARE(projectDifference(*plain, *ok), std::string("initial_weights"));
    }

    // The command line: results, exit codes and messages that name the file and what was wrong.
    void commandLine() {
        const QString d = q(dir_);
        ModelWeights w = randomWeights(mlp(), 13);
        TD_VERIFY_OK(saveKerasArchive(w, dir_ + "/cli.keras"));
        const Tensor x = randomInput(6, {12}, 14);
        writeNpy(dir_ + "/x.npy", x);
        writeNpy(dir_ + "/x11.npy", randomInput(6, {11}, 14));

        Run r = traindeck({"predict", d + "/cli.keras", d + "/x.npy", "-o", d + "/y.npy"});
        QVERIFY2(r.code == 0, r.err.c_str());
        auto y = readNpy(dir_ + "/y.npy");
        TD_VERIFY_OK(y);
        LoadedModel m;
        m.weights = w;
        auto expected = predictWithModel(m, x);
        TD_VERIFY_OK(expected);
        QVERIFY(sameBits(*y, *expected));
        r = traindeck({"predict", d + "/cli.keras", d + "/x.npy"});
        QCOMPARE(r.code, 0);
        QVERIFY(r.out.rfind("row,class,probability,output_0,output_1,output_2\n0,", 0) == 0);

        r = traindeck({"export", d + "/cli.keras", "-o", d + "/m.onnx"});
        QVERIFY2(r.code == 0, r.err.c_str());
        auto onnxBytes = readWholeFile(dir_ + "/m.onnx", 1 << 20);
        TD_VERIFY_OK(onnxBytes);
        QVERIFY(*onnxBytes == *onnxModelBytes(w));

        auto expectError = [&](const QStringList& args, int code, const std::string& fragment) {
            Run e = traindeck(args);
            QVERIFY2(e.code == code,
                     qPrintable(q("exit " + std::to_string(e.code) + ": " + e.err)));
            QVERIFY2(e.err.find(fragment) != std::string::npos, qPrintable(q(e.err)));
        };
        expectError({"predict", d + "/none.keras", d + "/x.npy"}, 2, "none.keras: no such file");
        writeBytes(dir_ + "/cut.keras",
                   readWholeFile(dir_ + "/cli.keras", 1 << 20)->substr(0, 300));
        expectError({"predict", d + "/cut.keras", d + "/x.npy"}, 2,
                    "cut.keras: not a zip archive (no end-of-central-directory record)");
        expectError({"import", d + "/cut.keras", "-o", d + "/p.json"}, 2, "cut.keras: not a zip");
        expectError(
            {"predict", d + "/cli.keras", d + "/x11.npy"}, 2,
            "the model expects samples of shape [12] (12 values), got input of shape [6,11]");
        expectError({"predict", d + "/cli.keras", d + "/x.npy", "-o", d + "/y.txt"}, 2,
                    "y.txt: expected a .csv or .npy output file");
        expectError({"export", d + "/cli.keras", "-o", d + "/m.txt"}, 2,
                    "m.txt: cannot tell the format from the extension '.txt'");
        expectError({"export", d + "/cli.keras", "--format", "tflite", "-o", d + "/m.x"}, 2,
                    "unknown export format 'tflite' (expected onnx or keras)");
        expectError({"export", "-o", d + "/m.onnx"}, 2,
                    "give a model file or a stored run (id or name), or --project with --weights");

        // export --project --weights: the project's model must match the weights.
        Project p;
        p.model = shaped();
        TD_VERIFY_OK(saveProject(p, dir_ + "/shaped.json"));
        expectError({"export", "--project", d + "/shaped.json", "--weights", d + "/cli.keras", "-o",
                     d + "/s.onnx"},
                    2,
                    "cli.keras: layer 2 'dense' (Dense): kernel has shape [12,16] in the file, "
                    "expected [12,5]");
        Run t = traindeck({"train", d + "/shaped.json", "--save-model", d + "/out.h5"});
        QVERIFY(t.code != 0);
        QVERIFY2(t.err.find("expected a .keras or .onnx file") != std::string::npos, t.err.c_str());
    }

    // A stored run's model: trained into a store, `export RUN` (by name or id) writes the weights
    // of its latest checkpoint, and `predict` on that checkpoint (the project's normalize step
    // applied to raw CSV rows) and on the exported .keras (input normalized by hand: a .keras
    // model has no map steps) predict what Session::predict of the trained session does.
    void runExportAndCheckpointPredict() {
        const QString d = q(dir_);
        const std::string db = dir_ + "/runs/runs.db";
        fs::create_directories(dir_ + "/runs");
        writeBytes(dir_ + "/iris.json", irisProjectJson(3, true));
        writeBytes(dir_ + "/iris_off.json", irisProjectJson(1, false));
        auto project = loadProject(dir_ + "/iris.json");
        TD_VERIFY_OK(project);
        const std::string testCsv =
            std::string(td::dev::kSourceDir) + "/projects/data/iris_like_test.csv";
        auto csv = readCsv(testCsv, "label");
        TD_VERIFY_OK(csv);
        const Tensor& x = csv->x;  // raw features, [60, 4]

        SessionOptions opt;
        opt.storePath = db;
        opt.runName = "iris";
        auto session = Session::create(*project, opt);
        TD_VERIFY_OK(session);
        QVERIFY((*session)->fit().ok());
        const int64_t runId = (*session)->runId();
        auto expected = (*session)->predict(x);
        TD_VERIFY_OK(expected);
        QCOMPARE(expected->shape(), (Shape{60, 3}));

        // The checkpoint the store has for the run's end: `predict` on it takes raw rows.
        auto catalog = api::RunCatalog::open(db);
        TD_VERIFY_OK(catalog);
        auto rows = (*catalog)->checkpoints(runId);
        TD_VERIFY_OK(rows);
        QCOMPARE(rows->size(), size_t(2));  // the run's own: the last two epochs' ends
        const std::string ckpt = rows->front().path;
        QVERIFY(QString::fromStdString(ckpt).endsWith(".tdckpt"));
        auto unavailable = runModelUnavailable(**catalog, runId);
        TD_VERIFY_OK(unavailable);
        QCOMPARE(*unavailable, std::string());
        Run r = traindeck({"predict", q(ckpt), q(testCsv), "-o", d + "/ckpt_pred.npy"});
        QVERIFY2(r.code == 0, r.err.c_str());
        auto fromCkpt = readNpy(dir_ + "/ckpt_pred.npy");
        TD_VERIFY_OK(fromCkpt);
        QVERIFY2(maxAbsDiff(*fromCkpt, *expected) < 2e-6,
                 qPrintable(q("checkpoint predict differs by " +
                              std::to_string(maxAbsDiff(*fromCkpt, *expected)))));
        // By content, not by name: the same checkpoint under another name reads the same.
        fs::copy_file(ckpt, dir_ + "/renamed.bin", fs::copy_options::overwrite_existing);
        r = traindeck({"predict", d + "/renamed.bin", q(testCsv), "-o", d + "/renamed.npy"});
        QVERIFY2(r.code == 0, r.err.c_str());
        QVERIFY(sameBits(*readNpy(dir_ + "/renamed.npy"), *fromCkpt));

        // export RUN by name to .keras, by id to .onnx.
        r = traindeck({"export", "iris", "--db", q(db), "-o", d + "/run.keras"});
        QVERIFY2(r.code == 0, r.err.c_str());
        QVERIFY2(r.out.find("Exported run " + std::to_string(runId) + " (iris)") == 0 &&
                     r.out.find(ckpt) != std::string::npos &&
                     r.out.find("after epoch 3") != std::string::npos,
                 r.out.c_str());
        // The same run exported again a second later: the same bytes (metadata.json dates the
        // archive by its checkpoint's write time, not by the time of the export).
        QTest::qWait(1100);
        r = traindeck({"export", "iris", "--db", q(db), "-o", d + "/run_again.keras"});
        QVERIFY2(r.code == 0, r.err.c_str());
        QVERIFY(*readWholeFile(dir_ + "/run.keras", 1 << 20) ==
                *readWholeFile(dir_ + "/run_again.keras", 1 << 20));
        {
            char when[32];
            const std::time_t mtime = static_cast<std::time_t>(
                QFileInfo(QString::fromStdString(ckpt)).lastModified().toSecsSinceEpoch());
            std::tm tm{};
            gmtime_r(&mtime, &tm);
            std::strftime(when, sizeof when, "%Y-%m-%d@%H:%M:%S", &tm);
            auto members =
                readZipArchive(*readWholeFile(dir_ + "/run.keras", 1 << 20), "run.keras");
            TD_VERIFY_OK(members);
            QCOMPARE(QString::fromStdString(members->front().name), QString("metadata.json"));
            QCOMPARE(
                QString::fromStdString(
                    nlohmann::json::parse(members->front().bytes)["date_saved"].get<std::string>()),
                QString(when));
        }
        r = traindeck({"export", q(std::to_string(runId)), "--db", q(db), "--format", "onnx", "-o",
                       d + "/run.onnx"});
        QVERIFY2(r.code == 0, r.err.c_str());
        auto trained = sessionModelWeights(**session);
        TD_VERIFY_OK(trained);
        auto onnxBytes = readWholeFile(dir_ + "/run.onnx", 1 << 20);
        TD_VERIFY_OK(onnxBytes);
        QVERIFY(*onnxBytes == *onnxModelBytes(*trained));
        auto keras = loadKerasArchive(dir_ + "/run.keras");
        TD_VERIFY_OK(keras);
        for (const auto& [name, t] : trained->params)
            QVERIFY2(sameBits(keras->weights.params.at(name), t), name.c_str());

        // The exported .keras on normalized input (the project's step: (x - 4.0) / 1.9).
        Tensor xn(DType::F32, x.shape());
        for (int64_t i = 0; i < x.size(); ++i)
            xn.data<float>()[i] = (x.data<float>()[i] - 4.0f) / 1.9f;
        writeNpy(dir_ + "/xn.npy", xn);
        r = traindeck({"predict", d + "/run.keras", d + "/xn.npy", "-o", d + "/keras_pred.npy"});
        QVERIFY2(r.code == 0, r.err.c_str());
        auto fromKeras = readNpy(dir_ + "/keras_pred.npy");
        TD_VERIFY_OK(fromKeras);
        QVERIFY2(maxAbsDiff(*fromKeras, *expected) < 2e-6,
                 qPrintable(q("exported .keras predict differs by " +
                              std::to_string(maxAbsDiff(*fromKeras, *expected)))));

        auto expectError = [&](const QStringList& args, int code, const std::string& fragment) {
            Run e = traindeck(args);
            QVERIFY2(e.code == code,
                     qPrintable(q("exit " + std::to_string(e.code) + ": " + e.err)));
            QVERIFY2(e.err.find(fragment) != std::string::npos, qPrintable(q(e.err)));
        };
        // Unknown run, a store that is not there, a run without checkpoints.
        expectError({"export", "nosuch", "--db", q(db), "-o", d + "/x.onnx"}, 2,
                    "export: nosuch: no such model file, and no run 'nosuch' in " + db);
        expectError({"export", "iris", "--db", d + "/none/runs.db", "-o", d + "/x.onnx"}, 2,
                    "iris: no such model file, and no run store at " + dir_ + "/none/runs.db");
        QVERIFY(!fs::exists(dir_ + "/none/runs.db"));
        Run off = traindeck({"train", d + "/iris_off.json", "--db", q(db), "--run-name",
                             "no checkpoints", "--plain"});
        QVERIFY2(off.code == 0, off.err.c_str());
        expectError({"export", "no checkpoints", "--db", q(db), "-o", d + "/x.onnx"}, 2,
                    "run " + std::to_string(runId + 1) + " ('no checkpoints') in " + db +
                        " has no checkpoint: its project had training.run_checkpoints off");
        auto why = runModelUnavailable(**catalog, runId + 1);
        TD_VERIFY_OK(why);
        QVERIFY2(why->find("training.run_checkpoints off") != std::string::npos, why->c_str());
        QVERIFY(!fs::exists(dir_ + "/x.onnx"));

        // A damaged checkpoint given to predict: refused, naming the file and the damage.
        std::string bytes = *readWholeFile(ckpt, 1 << 24);
        bytes[bytes.size() / 2] ^= 0x5a;
        writeBytes(dir_ + "/damaged.tdckpt", bytes);
        expectError({"predict", d + "/damaged.tdckpt", q(testCsv)}, 2,
                    dir_ +
                        "/damaged.tdckpt: not a usable TrainDeck checkpoint: checksum mismatch "
                        "(the file is damaged)");
        writeBytes(dir_ + "/cut.tdckpt", bytes.substr(0, 30));
        expectError({"predict", d + "/cut.tdckpt", q(testCsv)}, 2, dir_ + "/cut.tdckpt: ");
        writeBytes(dir_ + "/text.tdckpt", "epoch,loss\n1,0.5\n");
        expectError({"predict", d + "/text.tdckpt", q(testCsv)}, 2,
                    "text.tdckpt: not a model file TrainDeck reads (expected a Keras 3 .keras "
                    "archive or a TrainDeck checkpoint .tdckpt)");

        // The run's newest checkpoint damaged: export falls back to the one before, and says so.
        const std::string older = (*rows)[1].path;
        writeBytes(ckpt, bytes);
        r = traindeck({"export", "iris", "--db", q(db), "-o", d + "/older.onnx"});
        QVERIFY2(r.code == 0, r.err.c_str());
        QVERIFY2(r.out.find("from checkpoint " + older + " (after epoch 2") != std::string::npos,
                 r.out.c_str());
        QVERIFY2(
            r.err.find("warning: run " + std::to_string(runId) + ": skipped the newer checkpoint " +
                       ckpt + ": not a usable TrainDeck checkpoint: checksum mismatch") !=
                std::string::npos,
            r.err.c_str());
        auto olderModel = loadModelFile(older);
        TD_VERIFY_OK(olderModel);
        QCOMPARE(olderModel->kind, std::string("checkpoint"));
        QCOMPARE(olderModel->epoch, 2);
        QVERIFY(*readWholeFile(dir_ + "/older.onnx", 1 << 20) ==
                *onnxModelBytes(olderModel->weights));
        // Every checkpoint damaged: each named with its reason.
        fs::remove(older);
        expectError({"export", "iris", "--db", q(db), "-o", d + "/x.onnx"}, 2,
                    "run " + std::to_string(runId) + " in " + db +
                        ": none of its checkpoints can be used:");
        // Every file gone: said so, and the panel's check says the same without reading any.
        fs::remove(ckpt);
        expectError({"export", "iris", "--db", q(db), "-o", d + "/x.onnx"}, 2,
                    "run " + std::to_string(runId) + " ('iris') in " + db +
                        " has no checkpoint file left: its 2 registered checkpoints were deleted");
        why = runModelUnavailable(**catalog, runId);
        TD_VERIFY_OK(why);
        QVERIFY2(why->find("has no checkpoint file left") != std::string::npos, why->c_str());
        QVERIFY(!fs::exists(dir_ + "/x.onnx"));
    }

    void predictInputChecks() {
        ModelWeights w = randomWeights(mlp(), 11);
        LoadedModel m;
        m.weights = w;
        TD_VERIFY_ERROR(
            predictWithModel(m, Tensor(DType::F32, {5, 11})),
            "the model expects samples of shape [12] (12 values), got input of shape [5,11]");
        // u8 and i32 input are accepted as Keras would (cast to float).
        Tensor u(DType::U8, {2, 3, 4});
        for (int64_t i = 0; i < u.size(); ++i) u.data<uint8_t>()[i] = static_cast<uint8_t>(i);
        auto y = predictWithModel(m, u);
        TD_VERIFY_OK(y);
        QCOMPARE(y->shape(), (Shape{2, 3}));
        QVERIFY(std::abs(y->data<float>()[0] + y->data<float>()[1] + y->data<float>()[2] - 1.f) <
                1e-5f);
    }
};

QTEST_GUILESS_MAIN(TestExport)
#include "test_export.moc"
