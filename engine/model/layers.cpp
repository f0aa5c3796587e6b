// Layer name tables, shape inference and the model.summary() table.
#include "engine/model/layers.h"
#include "engine/core/names.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>
#include <utility>

namespace td {

namespace {

struct LayerTypeEntry {
    LayerType type;
    const char* className;
    const char* prefix;
};

constexpr std::array<LayerTypeEntry, 23> kLayerTypes{{
    {LayerType::Input, "InputLayer", "input_layer"},
    {LayerType::Flatten, "Flatten", "flatten"},
    {LayerType::Reshape, "Reshape", "reshape"},
    {LayerType::Dense, "Dense", "dense"},
    {LayerType::Dropout, "Dropout", "dropout"},
    {LayerType::Activation, "Activation", "activation"},
    {LayerType::Conv2D, "Conv2D", "conv2d"},
    {LayerType::MaxPooling2D, "MaxPooling2D", "max_pooling2d"},
    {LayerType::AveragePooling2D, "AveragePooling2D", "average_pooling2d"},
    {LayerType::GlobalAveragePooling2D, "GlobalAveragePooling2D", "global_average_pooling2d"},
    {LayerType::BatchNormalization, "BatchNormalization", "batch_normalization"},
    {LayerType::LayerNormalization, "LayerNormalization", "layer_normalization"},
    {LayerType::ZeroPadding2D, "ZeroPadding2D", "zero_padding2d"},
    {LayerType::Rescaling, "Rescaling", "rescaling"},
    {LayerType::Resizing, "Resizing", "resizing"},
    {LayerType::CenterCrop, "CenterCrop", "center_crop"},
    {LayerType::RandomCrop, "RandomCrop", "random_crop"},
    {LayerType::RandomFlip, "RandomFlip", "random_flip"},
    {LayerType::RandomRotation, "RandomRotation", "random_rotation"},
    {LayerType::RandomZoom, "RandomZoom", "random_zoom"},
    {LayerType::RandomTranslation, "RandomTranslation", "random_translation"},
    {LayerType::RandomContrast, "RandomContrast", "random_contrast"},
    {LayerType::RandomBrightness, "RandomBrightness", "random_brightness"},
}};

template <class E>
struct NamedOption {
    E kind;
    const char* name;
};
constexpr NamedOption<InterpolationKind> kInterpolations[] = {
    {InterpolationKind::Bilinear, "bilinear"}, {InterpolationKind::Nearest, "nearest"}};
constexpr NamedOption<FillModeKind> kFillModes[] = {{FillModeKind::Reflect, "reflect"},
                                                    {FillModeKind::Wrap, "wrap"},
                                                    {FillModeKind::Constant, "constant"},
                                                    {FillModeKind::Nearest, "nearest"}};
constexpr NamedOption<FlipModeKind> kFlipModes[] = {
    {FlipModeKind::HorizontalAndVertical, "horizontal_and_vertical"},
    {FlipModeKind::Horizontal, "horizontal"},
    {FlipModeKind::Vertical, "vertical"}};

template <class E, size_t N>
const char* optionName(const NamedOption<E> (&table)[N], E k) {
    for (const auto& e : table)
        if (e.kind == k) return e.name;
    return "?";
}

template <class E, size_t N>
Result<E> parseOption(const NamedOption<E> (&table)[N], const char* what, const std::string& s) {
    std::string valid;
    for (const auto& e : table) {
        if (s == e.name) return e.kind;
        valid += std::string(valid.empty() ? "" : ", ") + e.name;
    }
    return err("unknown " + std::string(what) + " '" + s + "' (expected " + valid + ")");
}

struct ActivationEntry {
    ActivationKind kind;
    const char* name;
};

constexpr std::array<ActivationEntry, 8> kActivations{{
    {ActivationKind::Linear, "linear"},
    {ActivationKind::Relu, "relu"},
    {ActivationKind::LeakyRelu, "leaky_relu"},
    {ActivationKind::Elu, "elu"},
    {ActivationKind::Gelu, "gelu"},
    {ActivationKind::Sigmoid, "sigmoid"},
    {ActivationKind::Tanh, "tanh"},
    {ActivationKind::Softmax, "softmax"},
}};

struct InitializerEntry {
    const char* name;       // canonical snake_case
    const char* className;  // Keras class name
};

constexpr std::array<InitializerEntry, 15> kInitializers{{
    {"glorot_uniform", "GlorotUniform"},
    {"glorot_normal", "GlorotNormal"},
    {"he_uniform", "HeUniform"},
    {"he_normal", "HeNormal"},
    {"lecun_uniform", "LecunUniform"},
    {"lecun_normal", "LecunNormal"},
    {"variance_scaling", "VarianceScaling"},
    {"zeros", "Zeros"},
    {"ones", "Ones"},
    {"constant", "Constant"},
    {"random_uniform", "RandomUniform"},
    {"random_normal", "RandomNormal"},
    {"truncated_normal", "TruncatedNormal"},
    {"orthogonal", "Orthogonal"},
    {"identity", "Identity"},
}};

std::string layerLabel(size_t index, const std::string& name) {
    return "layer " + std::to_string(index) + " '" + name + "'";
}

// "(None, 128)", "(None, 28, 28)", "(None,)" for a scalar per sample.
std::string kerasShape(const Shape& s) {
    std::string out = "(None";
    if (s.empty()) return out + ",)";
    for (int64_t d : s) out += ", " + (d < 0 ? std::string("None") : std::to_string(d));
    return out + ")";
}

std::string squoteName(const std::string& s) {
    return "'" + s + "'";
}

// Keras indexes the parameter's shape with a variance-scaling initializer's axes: each must be
// one of its dimensions ("" when they are).
std::string badInitializerAxes(const InitializerSpec& init, int64_t rank) {
    for (const auto* axes : {&init.inputAxes, &init.outputAxes})
        for (int64_t a : *axes)
            if (a < -rank || a >= rank)
                return std::string(axes == &init.inputAxes ? "input_axes" : "output_axes") +
                       " has axis " + std::to_string(a) + ", but the parameter has " +
                       std::to_string(rank) + (rank == 1 ? " dimension" : " dimensions");
    return {};
}

std::string numberText(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

// A Reshape target as written: [-1,28] (shapeToString would print the -1 as '?').
std::string targetText(const Shape& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) {
        if (i) out += ',';
        out += std::to_string(s[i]);
    }
    return out + "]";
}

// Sizes past this are refused (they could not be allocated, and products of them would overflow).
constexpr int64_t kMaxElements = int64_t(1) << 40;

// Element count, or -1 when it exceeds kMaxElements.
int64_t checkedElements(const Shape& s) {
    int64_t n = 1;
    for (int64_t d : s) {
        if (d <= 0 || d > kMaxElements || n > kMaxElements / d) return -1;
        n *= d;
    }
    return n;
}

std::string padRight(std::string s, size_t width) {
    if (s.size() < width) s.append(width - s.size(), ' ');
    return s;
}

std::string rstrip(std::string s) {
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s;
}

}  // namespace

const char* layerTypeName(LayerType t) {
    for (const auto& e : kLayerTypes)
        if (e.type == t) return e.className;
    return "?";
}

const char* defaultLayerNamePrefix(LayerType t) {
    for (const auto& e : kLayerTypes)
        if (e.type == t) return e.prefix;
    return "layer";
}

Result<LayerType> parseLayerType(const std::string& kerasClassName) {
    for (const auto& e : kLayerTypes)
        if (kerasClassName == e.className) return e.type;
    std::string valid;
    for (const auto& e : kLayerTypes) valid += std::string(valid.empty() ? "" : ", ") + e.className;
    return err("unsupported layer class '" + kerasClassName + "' (supported: " + valid + ")");
}

const char* activationName(ActivationKind a) {
    for (const auto& e : kActivations)
        if (e.kind == a) return e.name;
    return "?";
}

const char* interpolationName(InterpolationKind k) {
    return optionName(kInterpolations, k);
}
Result<InterpolationKind> parseInterpolation(const std::string& name) {
    return parseOption(kInterpolations, "interpolation", name);
}
const char* fillModeName(FillModeKind k) {
    return optionName(kFillModes, k);
}
Result<FillModeKind> parseFillMode(const std::string& name) {
    return parseOption(kFillModes, "fill_mode", name);
}
const char* flipModeName(FlipModeKind k) {
    return optionName(kFlipModes, k);
}
Result<FlipModeKind> parseFlipMode(const std::string& name) {
    return parseOption(kFlipModes, "mode", name);
}

bool isRandomImageLayer(LayerType t) {
    switch (t) {
        case LayerType::RandomCrop:
        case LayerType::RandomFlip:
        case LayerType::RandomRotation:
        case LayerType::RandomZoom:
        case LayerType::RandomTranslation:
        case LayerType::RandomContrast:
        case LayerType::RandomBrightness:
            return true;
        default:
            return false;
    }
}

bool isImagePreprocessingLayer(LayerType t) {
    return t == LayerType::Resizing || t == LayerType::CenterCrop || isRandomImageLayer(t);
}

Result<ActivationKind> parseActivation(const std::string& name) {
    for (const auto& e : kActivations)
        if (name == e.name) return e.kind;
    std::string valid;
    for (const auto& e : kActivations) valid += std::string(valid.empty() ? "" : ", ") + e.name;
    return err("unknown activation '" + name + "' (valid: " + valid + ")");
}

Result<std::string> canonicalInitializerName(const std::string& name) {
    std::string key = squashName(name);
    if (key == "zero") key = "zeros";
    if (key == "one") key = "ones";
    if (key == "uniform") key = "randomuniform";
    if (key == "normal") key = "randomnormal";
    // Keras 3 also exports these under their long class names.
    if (key == "orthogonalinitializer") key = "orthogonal";
    if (key == "identityinitializer") key = "identity";
    for (const auto& e : kInitializers)
        if (key == squashName(e.name)) return std::string(e.name);
    std::string valid;
    for (const auto& e : kInitializers) valid += std::string(valid.empty() ? "" : ", ") + e.name;
    return err("unknown initializer '" + name + "' (valid: " + valid + ")");
}

const char* initializerClassName(const std::string& canonicalName) {
    for (const auto& e : kInitializers)
        if (canonicalName == e.name) return e.className;
    return "?";
}

bool initializerNeedsMatrix(const std::string& canonicalName) {
    return canonicalName == "orthogonal" || canonicalName == "identity";
}

std::string formatThousands(int64_t n) {
    std::string digits = std::to_string(n < 0 ? -n : n);
    std::string out;
    int count = 0;
    for (auto it = digits.rbegin(); it != digits.rend(); ++it) {
        if (count && count % 3 == 0) out += ',';
        out += *it;
        ++count;
    }
    if (n < 0) out += '-';
    std::reverse(out.begin(), out.end());
    return out;
}

Result<Window2D> windowGeometry(int64_t h, int64_t w, const Shape& kernel, const Shape& strides,
                                const Shape& dilation, bool same, const char* what) {
    Window2D g;
    const int64_t in[2] = {h, w};
    int64_t out[2] = {0, 0};
    for (int a = 0; a < 2; ++a) {
        const int64_t span = (kernel[a] - 1) * dilation[a] + 1;
        if (same) {
            out[a] = (in[a] + strides[a] - 1) / strides[a];
            const int64_t total = std::max<int64_t>((out[a] - 1) * strides[a] + span - in[a], 0);
            g.pads[2 * a] = total / 2;
            g.pads[2 * a + 1] = total - total / 2;
        } else {
            if (span > in[a])
                return err(std::string(what) + " " + std::to_string(kernel[0]) + "x" +
                           std::to_string(kernel[1]) +
                           (dilation[0] * dilation[1] > 1 ? " (dilated)" : "") +
                           " is larger than the input " + std::to_string(h) + "x" +
                           std::to_string(w) + " with padding valid");
            out[a] = (in[a] - span) / strides[a] + 1;
        }
    }
    g.outH = out[0];
    g.outW = out[1];
    return g;
}

const InitializerSpec& initializerFor(const LayerSpec& layer, const std::string& suffix) {
    if (suffix == "kernel") return layer.kernelInitializer;
    if (suffix == "gamma") return layer.gammaInitializer;
    if (suffix == "beta") return layer.betaInitializer;
    if (suffix == "moving_mean") return layer.movingMeanInitializer;
    if (suffix == "moving_variance") return layer.movingVarianceInitializer;
    return layer.biasInitializer;
}

Shape effectiveStrides(const LayerSpec& layer) {
    if (!layer.strides.empty()) return layer.strides;
    if (layer.type == LayerType::MaxPooling2D || layer.type == LayerType::AveragePooling2D)
        return layer.poolSize;
    return Shape{1, 1};
}

ResizeBox smartResizeBox(int64_t h, int64_t w, int64_t th, int64_t tw, bool float32) {
    ResizeBox b;
    if (float32) {
        b.height = static_cast<int64_t>(static_cast<float>(w * th) / static_cast<float>(tw));
        b.width = static_cast<int64_t>(static_cast<float>(h * tw) / static_cast<float>(th));
    } else {
        b.height = static_cast<int64_t>(static_cast<double>(w * th) / static_cast<double>(tw));
        b.width = static_cast<int64_t>(static_cast<double>(h * tw) / static_cast<double>(th));
    }
    b.height = std::max<int64_t>(1, std::min(h, b.height));
    b.width = std::max<int64_t>(1, std::min(w, b.width));
    b.top = (h - b.height) / 2;  // int(float(h - crop) / 2): both are non-negative
    b.left = (w - b.width) / 2;
    b.crop = b.height == th && b.width == tw;
    return b;
}

ResizeBox resizeBoxFor(const LayerSpec& layer, int64_t h, int64_t w) {
    const int64_t th = layer.targetHeight, tw = layer.targetWidth;
    switch (layer.type) {
        case LayerType::Resizing: {
            if (layer.cropToAspectRatio) return smartResizeBox(h, w, th, tw, true);
            ResizeBox b{0, 0, h, w, false};
            if (layer.padToAspectRatio) {
                // Keras 3 (TensorFlow): the short side gets int((padded - size) / 2) rows or
                // columns of fill_value on each side, then the whole is resized.
                const int64_t padH = std::max(
                    h, static_cast<int64_t>(static_cast<float>(w * th) / static_cast<float>(tw)));
                const int64_t padW = std::max(
                    w, static_cast<int64_t>(static_cast<float>(h * tw) / static_cast<float>(th)));
                const int64_t top = (padH - h) / 2, left = (padW - w) / 2;
                b = ResizeBox{-top, -left, h + 2 * top, w + 2 * left, false};
            }
            b.crop = b.top >= 0 && b.left >= 0 && b.height == th && b.width == tw;
            return b;
        }
        case LayerType::CenterCrop:
            if (h >= th && w >= tw) return ResizeBox{(h - th) / 2, (w - tw) / 2, th, tw, true};
            return smartResizeBox(h, w, th, tw, false);
        case LayerType::RandomCrop:
            return smartResizeBox(h, w, th, tw, false);
        default:
            return {};
    }
}

namespace {

// Window sizes, strides and dilations past this are refused (no image is that large, and their
// products stay far from overflowing).
constexpr int64_t kMaxWindow = int64_t(1) << 20;

// A [h, w] field of a window layer: two sizes in [min, kMaxWindow] ("" when it is).
std::string badPair(const Shape& s, const char* field, int64_t min) {
    if (s.size() != 2)
        return std::string(field) + " must be two sizes [h, w], got " + targetText(s);
    for (int64_t v : s)
        if (v < min)
            return std::string(field) + " " + targetText(s) +
                   " must hold sizes >= " + std::to_string(min);
        else if (v > kMaxWindow)
            return std::string(field) + " " + targetText(s) + " is too large (at most " +
                   std::to_string(kMaxWindow) + ")";
    return {};
}

// Shape inference of the image layers; `shape` is the incoming shape, replaced by the outgoing
// one. Errors are the text after the layer's label.
std::string inferImageLayer(const LayerSpec& layer, Shape& shape, LayerInfo& li, int64_t& kept) {
    const std::string type = layerTypeName(layer.type);
    auto needImage = [&]() -> std::string {
        if (shape.size() != 3)
            return type + " expects an image [height, width, channels] (rank 3), got " +
                   shapeToString(shape) + "; add a Reshape layer with a channel axis first";
        return {};
    };
    switch (layer.type) {
        case LayerType::Conv2D: {
            if (auto e = needImage(); !e.empty()) return e;
            if (layer.filters <= 0)
                return "filters must be a positive integer, got " + std::to_string(layer.filters);
            for (auto [v, f, m] : {std::tuple{&layer.kernelSize, "kernel_size", 1},
                                   std::tuple{&layer.dilationRate, "dilation_rate", 1}})
                if (auto e = badPair(*v, f, m); !e.empty()) return e;
            const Shape st = effectiveStrides(layer);
            if (auto e = badPair(st, "strides", 1); !e.empty()) return e;
            if ((st[0] > 1 || st[1] > 1) &&
                (layer.dilationRate[0] > 1 || layer.dilationRate[1] > 1))
                return "strides > 1 and dilation_rate > 1 cannot be combined (as in Keras)";
            if (layer.groups < 1 || shape[2] % layer.groups != 0 ||
                layer.filters % layer.groups != 0)
                return "groups " + std::to_string(layer.groups) + " must divide both the " +
                       std::to_string(shape[2]) + " input channels and the " +
                       std::to_string(layer.filters) + " filters";
            if (layer.useBias && initializerNeedsMatrix(layer.biasInitializer.name))
                return "the bias initializer " + squoteName(layer.biasInitializer.name) +
                       " needs a matrix (rank 2) and a bias is a vector";
            if (auto bad = badInitializerAxes(layer.kernelInitializer, 4); !bad.empty())
                return "kernel initializer: " + bad;
            auto g = windowGeometry(shape[0], shape[1], layer.kernelSize, st, layer.dilationRate,
                                    layer.samePadding, "kernel");
            if (!g.ok()) return g.error();
            const int64_t window = layer.kernelSize[0] * layer.kernelSize[1];  // <= 2^40
            if (shape[2] / layer.groups > kMaxElements / window) return "the kernel is too large";
            const int64_t perFilter = window * (shape[2] / layer.groups);
            if (perFilter > kMaxElements / layer.filters) return "the kernel is too large";
            li.params = perFilter * layer.filters + (layer.useBias ? layer.filters : 0);
            kept += numElements(shape);  // the kernel gradient reads the input
            shape = Shape{g->outH, g->outW, layer.filters};
            if (checkedElements(shape) < 0) return "the output is too large";
            if (layer.activation != ActivationKind::Linear) kept += numElements(shape);
            return {};
        }
        case LayerType::MaxPooling2D:
        case LayerType::AveragePooling2D: {
            if (auto e = needImage(); !e.empty()) return e;
            if (auto e = badPair(layer.poolSize, "pool_size", 1); !e.empty()) return e;
            const Shape st = effectiveStrides(layer);
            if (auto e = badPair(st, "strides", 1); !e.empty()) return e;
            auto g = windowGeometry(shape[0], shape[1], layer.poolSize, st, Shape{1, 1},
                                    layer.samePadding, "pool_size");
            if (!g.ok()) return g.error();
            if (layer.type == LayerType::MaxPooling2D) kept += numElements(shape);
            shape = Shape{g->outH, g->outW, shape[2]};
            return {};
        }
        case LayerType::GlobalAveragePooling2D:
            if (auto e = needImage(); !e.empty()) return e;
            shape = Shape{shape[2]};
            return {};
        case LayerType::ZeroPadding2D: {
            if (auto e = needImage(); !e.empty()) return e;
            if (layer.zeroPadding.size() != 4)
                return "padding must be four sizes [top, bottom, left, right], got " +
                       targetText(layer.zeroPadding);
            for (int64_t p : layer.zeroPadding)
                if (p < 0 || p > kMaxElements)
                    return "padding " + targetText(layer.zeroPadding) + " must hold sizes >= 0";
            shape = Shape{shape[0] + layer.zeroPadding[0] + layer.zeroPadding[1],
                          shape[1] + layer.zeroPadding[2] + layer.zeroPadding[3], shape[2]};
            if (checkedElements(shape) < 0) return "the output is too large";
            return {};
        }
        case LayerType::BatchNormalization:
        case LayerType::LayerNormalization: {
            if (shape.empty()) return type + " needs an input with a feature axis";
            if (!(layer.epsilon > 0.0) || !std::isfinite(layer.epsilon))
                return "epsilon must be positive, got " + numberText(layer.epsilon);
            if (layer.type == LayerType::BatchNormalization &&
                !(layer.momentum >= 0.0 && layer.momentum <= 1.0))
                return "momentum must be in [0, 1], got " + numberText(layer.momentum);
            const int64_t c = shape.back();
            const int64_t learned = (layer.scale ? c : 0) + (layer.center ? c : 0);
            li.params = learned + (layer.type == LayerType::BatchNormalization ? 2 * c : 0);
            li.trainableParams = layer.trainable ? learned : 0;
            kept += numElements(shape);
            return {};
        }
        case LayerType::Rescaling:
            if (!std::isfinite(layer.rescale) || !std::isfinite(layer.offset))
                return "scale and offset must be finite numbers";
            return {};
        case LayerType::Resizing:
        case LayerType::CenterCrop:
        case LayerType::RandomCrop: {
            if (auto e = needImage(); !e.empty()) return e;
            if (auto e =
                    badPair(Shape{layer.targetHeight, layer.targetWidth}, "height and width", 1);
                !e.empty())
                return e;
            if (layer.cropToAspectRatio && layer.padToAspectRatio)
                return "crop_to_aspect_ratio and pad_to_aspect_ratio cannot both be true (as in "
                       "Keras)";
            if (!std::isfinite(layer.fillValue)) return "fill_value must be a finite number";
            shape = Shape{layer.targetHeight, layer.targetWidth, shape[2]};
            if (checkedElements(shape) < 0) return "the output is too large";
            return {};
        }
        case LayerType::RandomFlip:
            return needImage();
        case LayerType::RandomRotation:
        case LayerType::RandomZoom:
        case LayerType::RandomTranslation:
        case LayerType::RandomContrast:
        case LayerType::RandomBrightness: {
            if (auto e = needImage(); !e.empty()) return e;
            // Keras' bounds of each factor (RandomZoom's lower bound is excluded).
            const bool zoom = layer.type == LayerType::RandomZoom;
            auto badRange = [&](const FactorRange& r, const char* field) -> std::string {
                const std::string text = std::string(field) + " [" + numberText(r.lower) + ", " +
                                         numberText(r.upper) + "]";
                if (!std::isfinite(r.lower) || !std::isfinite(r.upper) || r.lower > r.upper)
                    return text + " must be two finite numbers, the lower one first";
                if (r.lower < -1.0 || r.upper > 1.0 || (zoom && r.lower <= -1.0))
                    return text + (zoom ? " must lie in (-1, 1]" : " must lie in [-1, 1]");
                return {};
            };
            if (layer.type == LayerType::RandomZoom || layer.type == LayerType::RandomTranslation) {
                if (auto e = badRange(layer.heightFactor, "height_factor"); !e.empty()) return e;
                if (!layer.widthFactor && layer.type == LayerType::RandomTranslation)
                    return "RandomTranslation needs a width_factor";
                if (layer.widthFactor)
                    if (auto e = badRange(*layer.widthFactor, "width_factor"); !e.empty()) return e;
            } else if (auto e = badRange(layer.factor, "factor"); !e.empty()) {
                return e;
            }
            if (layer.type == LayerType::RandomContrast ||
                layer.type == LayerType::RandomBrightness) {
                if (!std::isfinite(layer.valueLow) || !std::isfinite(layer.valueHigh) ||
                    !(layer.valueLow < layer.valueHigh))
                    return "value_range [" + numberText(layer.valueLow) + ", " +
                           numberText(layer.valueHigh) +
                           "] must be two finite numbers, the lower one first";
            } else if (!std::isfinite(layer.fillValue)) {
                return "fill_value must be a finite number";
            }
            return {};
        }
        default:
            return {};
    }
}

// Whether the gradient of `layer` reaching an image [h, w, c] can pass back through it: RandomFlip
// (the same flip of the gradient) and a CenterCrop that only crops (the gradient padded with
// zeros). The other preprocessing layers have no input gradient, so nothing before them may need
// one.
bool passesGradient(const LayerSpec& layer, const Shape& in) {
    if (layer.type == LayerType::RandomFlip) return true;
    return layer.type == LayerType::CenterCrop && in.size() == 3 &&
           resizeBoxFor(layer, in[0], in[1]).crop;
}

}  // namespace

Result<ModelInfo> inferShapes(ModelSpec& model) {
    if (model.layers.empty()) return err("the model has no layers");

    // Names: explicit duplicates are an error, then empty names get Keras-style generated names
    // that avoid every explicit name.
    std::map<std::string, size_t> used;
    for (size_t i = 0; i < model.layers.size(); ++i) {
        const std::string& name = model.layers[i].name;
        if (name.empty()) continue;
        auto [it, inserted] = used.emplace(name, i);
        if (!inserted)
            return err(layerLabel(i, name) + ": duplicate layer name (layer " +
                       std::to_string(it->second) + " has the same name); layer names must be " +
                       "unique");
    }
    std::map<std::string, int> nextSuffix;
    for (size_t i = 0; i < model.layers.size(); ++i) {
        LayerSpec& layer = model.layers[i];
        if (!layer.name.empty()) continue;
        const std::string prefix = defaultLayerNamePrefix(layer.type);
        int& n = nextSuffix[prefix];
        std::string candidate;
        do {
            candidate = n == 0 ? prefix : prefix + "_" + std::to_string(n);
            ++n;
        } while (used.count(candidate));
        layer.name = candidate;
        used.emplace(candidate, i);
    }

    ModelInfo info;
    const LayerSpec& first = model.layers.front();
    if (first.inputShape.empty())
        return err(
            "the model needs an input shape: add an InputLayer or set batch_input_shape on the "
            "first layer");
    for (int64_t d : first.inputShape)
        if (d <= 0)
            return err(layerLabel(0, first.name) + ": input shape " +
                       shapeToString(first.inputShape) + " must have positive dimensions");
    if (checkedElements(first.inputShape) < 0)
        return err(layerLabel(0, first.name) + ": input shape " + shapeToString(first.inputShape) +
                   " is too large");
    info.inputShape = first.inputShape;

    Shape shape = first.inputShape;
    std::string trainableBefore;  // the first layer with trainable weights, as "layer 2 'conv2d'"
    int64_t trainableBeforeCount = 0;
    for (size_t i = 0; i < model.layers.size(); ++i) {
        const LayerSpec& layer = model.layers[i];
        const std::string label = layerLabel(i, layer.name);
        if (layer.type == LayerType::Input) {
            if (i != 0)
                return err(label +
                           ": an InputLayer can only be the first layer of a Sequential "
                           "model");
            continue;
        }
        if (i > 0 && !layer.inputShape.empty() && layer.inputShape != shape)
            return err(label + ": declared input shape " + shapeToString(layer.inputShape) +
                       " does not match the incoming shape " + shapeToString(shape));
        if (isImagePreprocessingLayer(layer.type) && !trainableBefore.empty() &&
            !passesGradient(layer, shape))
            return err(label + ": " + layerTypeName(layer.type) +
                       " has no input gradient, so it must come before any layer with trainable "
                       "weights (" +
                       trainableBefore + " has " + formatThousands(trainableBeforeCount) +
                       "); place the preprocessing and augmentation layers right after the input "
                       "(only RandomFlip, and a CenterCrop that crops, may follow such layers)");

        LayerInfo li;
        li.name = layer.name;
        li.typeName = layerTypeName(layer.type);
        switch (layer.type) {
            case LayerType::Input:
                break;
            case LayerType::Flatten:
                shape = Shape{numElements(shape)};
                break;
            case LayerType::Reshape: {
                if (layer.targetShape.empty())
                    return err(label + ": Reshape needs a non-empty target_shape");
                int unknown = -1;
                int64_t known = 1;
                for (size_t d = 0; d < layer.targetShape.size(); ++d) {
                    int64_t v = layer.targetShape[d];
                    if (v == -1) {
                        if (unknown >= 0)
                            return err(label + ": target_shape " + targetText(layer.targetShape) +
                                       " may hold at most one -1");
                        unknown = static_cast<int>(d);
                    } else if (v <= 0) {
                        return err(label + ": target_shape " + targetText(layer.targetShape) +
                                   " must hold positive dimensions (or one -1)");
                    } else if (v > kMaxElements || known > kMaxElements / v) {
                        return err(label + ": target_shape " + targetText(layer.targetShape) +
                                   " is too large");
                    } else {
                        known *= v;
                    }
                }
                const int64_t count = numElements(shape);
                Shape out = layer.targetShape;
                if (unknown >= 0) {
                    if (count % known != 0)
                        return err(label + ": cannot reshape " + shapeToString(shape) + " (" +
                                   std::to_string(count) + " elements) into " +
                                   targetText(layer.targetShape));
                    out[static_cast<size_t>(unknown)] = count / known;
                } else if (known != count) {
                    return err(label + ": cannot reshape " + shapeToString(shape) + " (" +
                               std::to_string(count) + " elements) into " +
                               targetText(layer.targetShape) + " (" + std::to_string(known) +
                               " elements)");
                }
                shape = out;
                break;
            }
            case LayerType::Dense: {
                if (shape.size() != 1)
                    return err(label + ": Dense expects a flat input (rank 1), got " +
                               shapeToString(shape) + "; add a Flatten layer first");
                if (layer.units <= 0)
                    return err(label + ": units must be a positive integer, got " +
                               std::to_string(layer.units));
                if (layer.units > kMaxElements || shape[0] > kMaxElements / layer.units)
                    return err(label + ": " + std::to_string(layer.units) + " units on " +
                               std::to_string(shape[0]) + " inputs is too large");
                if (layer.useBias && initializerNeedsMatrix(layer.biasInitializer.name))
                    return err(label + ": the bias initializer " +
                               squoteName(layer.biasInitializer.name) +
                               " needs a matrix (rank 2) and a bias is a vector");
                if (auto bad = badInitializerAxes(layer.kernelInitializer, 2); !bad.empty())
                    return err(label + ": kernel initializer: " + bad);
                if (auto bad = badInitializerAxes(layer.biasInitializer, 1);
                    layer.useBias && !bad.empty())
                    return err(label + ": bias initializer: " + bad);
                li.params = shape[0] * layer.units + (layer.useBias ? layer.units : 0);
                shape = Shape{layer.units};
                break;
            }
            case LayerType::Dropout:
                if (!(layer.rate >= 0.0 && layer.rate < 1.0))
                    return err(label + ": Dropout rate must be in [0, 1), got " +
                               numberText(layer.rate));
                break;
            case LayerType::Activation:
                if (layer.activation != ActivationKind::Linear)
                    info.keptForBackwardBytesPerSample += numElements(shape) * 4;
                break;
            default: {
                int64_t kept = 0;
                const std::string e = inferImageLayer(layer, shape, li, kept);
                if (!e.empty()) return err(label + ": " + e);
                info.keptForBackwardBytesPerSample += kept * 4;
                break;
            }
        }
        if (layer.type == LayerType::Dense) {
            // The kernel gradient reads the input; an activation's gradient its output or input.
            info.keptForBackwardBytesPerSample +=
                numElements(info.layers.empty() ? info.inputShape
                                                : info.layers.back().outputShape) *
                4;
            if (layer.activation != ActivationKind::Linear)
                info.keptForBackwardBytesPerSample += numElements(shape) * 4;
        }
        if (layer.activation == ActivationKind::Elu && !(layer.eluAlpha > 0.0))
            return err(label + ": elu alpha must be positive");
        li.outputShape = shape;
        // BatchNormalization's moving statistics are never trainable (set by the layer above).
        if (layer.type != LayerType::BatchNormalization)
            li.trainableParams = layer.trainable ? li.params : 0;
        if (trainableBefore.empty() && li.trainableParams > 0) {
            trainableBefore = label;
            trainableBeforeCount = li.trainableParams;
        }
        info.totalParams += li.params;
        info.trainableParams += li.trainableParams;
        info.activationBytesPerSample += numElements(shape) * 4;
        info.layers.push_back(std::move(li));
    }
    info.nonTrainableParams = info.totalParams - info.trainableParams;
    info.outputShape = shape;
    return info;
}

std::string summaryTable(const ModelSpec& model, const ModelInfo& info) {
    // Keras 2 print_summary positions for Sequential models: [.45, .85, 1.] of 65 columns,
    // widened when a cell does not fit (one space always separates columns).
    size_t c1 = 29, c2 = 26, c3 = 10;
    std::vector<std::array<std::string, 3>> rows;
    for (const LayerInfo& li : info.layers) {
        rows.push_back({li.name + " (" + li.typeName + ")", kerasShape(li.outputShape),
                        formatThousands(li.params)});
        c1 = std::max(c1, rows.back()[0].size() + 1);
        c2 = std::max(c2, rows.back()[1].size() + 1);
        c3 = std::max(c3, rows.back()[2].size() + 1);
    }
    const size_t width = c1 + c2 + c3;
    const std::string rule(width, '_');
    const std::string doubleRule(width, '=');
    auto row = [&](const std::string& a, const std::string& b, const std::string& c) {
        return rstrip(padRight(a, c1) + padRight(b, c2) + c) + "\n";
    };

    std::string out = "Model: \"" + model.name + "\"\n";
    out += rule + "\n";
    out += row("Layer (type)", "Output Shape", "Param #");
    out += doubleRule + "\n";
    for (size_t i = 0; i < rows.size(); ++i) {
        if (i) out += rule + "\n";
        out += row(rows[i][0], rows[i][1], rows[i][2]);
    }
    out += doubleRule + "\n";
    out += "Total params: " + formatThousands(info.totalParams) + "\n";
    out += "Trainable params: " + formatThousands(info.trainableParams) + "\n";
    out += "Non-trainable params: " + formatThousands(info.nonTrainableParams) + "\n";
    out += rule + "\n";
    return out;
}

}  // namespace td
