// Layer specs of a Keras-style Sequential model, shape inference and the model.summary() table.
// This is the one place that maps Keras names (class names, activation, initializer and
// regularizer names) to the engine's specs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/result.h"
#include "engine/core/tensor.h"

namespace td {

enum class LayerType {
    Input,
    Flatten,
    Reshape,
    Dense,
    Dropout,
    Activation,
    Conv2D,
    MaxPooling2D,
    AveragePooling2D,
    GlobalAveragePooling2D,
    BatchNormalization,
    LayerNormalization,
    ZeroPadding2D,
    Rescaling,
    // Image preprocessing and augmentation (Keras 3's keras.layers of these names): Resizing and
    // CenterCrop always run; the Random* layers run in training steps only and are the identity
    // in evaluation, prediction and export (RandomCrop: Keras' inference crop, smart_resize's).
    Resizing,
    CenterCrop,
    RandomCrop,
    RandomFlip,
    RandomRotation,
    RandomZoom,
    RandomTranslation,
    RandomContrast,
    RandomBrightness,
};
enum class ActivationKind { Linear, Relu, LeakyRelu, Elu, Gelu, Sigmoid, Tanh, Softmax };

const char* layerTypeName(LayerType t);  // Keras class name: "InputLayer", "Dense", ...
Result<LayerType> parseLayerType(const std::string& kerasClassName);
const char* activationName(ActivationKind a);  // "linear", "relu", "leaky_relu", ...
Result<ActivationKind> parseActivation(const std::string& name);

// The image preprocessing layers' options, by Keras' names ("bilinear", "reflect", "horizontal",
// ...). The parse functions list the valid names in their errors.
enum class InterpolationKind { Bilinear, Nearest };
enum class FillModeKind { Reflect, Wrap, Constant, Nearest };
enum class FlipModeKind { HorizontalAndVertical, Horizontal, Vertical };
const char* interpolationName(InterpolationKind k);
Result<InterpolationKind> parseInterpolation(const std::string& name);
const char* fillModeName(FillModeKind k);
Result<FillModeKind> parseFillMode(const std::string& name);
const char* flipModeName(FlipModeKind k);
Result<FlipModeKind> parseFlipMode(const std::string& name);

// The Random* layers (RandomCrop ... RandomBrightness).
bool isRandomImageLayer(LayerType t);
// Resizing, CenterCrop and the Random* layers: channels-last images in, computed on the device.
bool isImagePreprocessingLayer(LayerType t);

// A random factor's range as Keras keeps it after its layer normalized the argument: a number f
// is (-f, f) (RandomContrast: (0, f)), a pair is sorted.
struct FactorRange {
    double lower = 0.0, upper = 0.0;

    bool operator==(const FactorRange&) const = default;
};

// Keras initializer names. Accepts snake_case names ("glorot_uniform", also "zero", "uniform",
// "normal") and Keras class names ("GlorotUniform", "Zeros", "RandomNormal"); returns the canonical
// snake_case name stored in InitializerSpec::name. Errors list the valid names.
Result<std::string> canonicalInitializerName(const std::string& name);
// Keras class name of a canonical initializer name: "glorot_uniform" -> "GlorotUniform".
const char* initializerClassName(const std::string& canonicalName);

// Keras initializer by name with its config values. The variance-scaling family (glorot_*, he_*,
// lecun_*) are variance_scaling with a fixed scale, mode and distribution; they keep their own
// name so that a file round-trips to the same class.
struct InitializerSpec {
    std::string name = "glorot_uniform";   // glorot_uniform, glorot_normal, he_uniform,
                                           // he_normal, lecun_uniform, lecun_normal,
                                           // variance_scaling, zeros, ones, constant,
                                           // random_uniform, random_normal, truncated_normal,
                                           // orthogonal, identity
    double value = 0.0;                    // constant
    double minval = -0.05, maxval = 0.05;  // random_uniform
    double mean = 0.0, stddev = 0.05;      // random_normal, truncated_normal
    double scale = 1.0;                    // variance_scaling (> 0)
    std::string mode = "fan_in";           // variance_scaling: fan_in, fan_out, fan_avg
    std::string distribution = "truncated_normal";  // variance_scaling: truncated_normal,
                                                    // untruncated_normal, uniform
    double gain = 1.0;                              // orthogonal, identity
    // Variance scaling (Keras 3.15 input_axes / output_axes): the axes whose sizes multiply into
    // fan_in and fan_out; both empty: Keras' compute_fans defaults (a kernel [in, out]).
    std::vector<int64_t> inputAxes, outputAxes;
    std::optional<uint64_t> seed;

    bool operator==(const InitializerSpec&) const = default;
};

// Initializers that need a matrix (rank >= 2): Keras refuses them for a bias.
bool initializerNeedsMatrix(const std::string& canonicalName);

struct RegularizerSpec {
    double l1 = 0.0;
    double l2 = 0.0;
    bool active() const { return l1 != 0.0 || l2 != 0.0; }

    bool operator==(const RegularizerSpec&) const = default;
};

struct LayerSpec {
    LayerType type = LayerType::Dense;
    std::string name;  // unique within the model; generated ("dense_1") when empty
    bool trainable = true;
    Shape inputShape;  // InputLayer / first layer's input shape, without batch dim
    // Dense
    int64_t units = 0;
    bool useBias = true;
    InitializerSpec kernelInitializer;
    InitializerSpec biasInitializer{.name = "zeros"};
    RegularizerSpec kernelRegularizer;
    RegularizerSpec biasRegularizer;
    // Dense and Activation
    ActivationKind activation = ActivationKind::Linear;
    double negativeSlope = 0.2;  // leaky_relu (Keras 3 default 0.2)
    double eluAlpha = 1.0;
    // Dropout
    double rate = 0.0;
    std::optional<uint64_t> seed;
    // Reshape
    Shape targetShape;  // may hold one -1
    // Conv2D (kernel/bias initializers, regularizers, use_bias and activation as Dense)
    int64_t filters = 0;
    Shape kernelSize{3, 3};    // [h, w]
    Shape strides;             // [h, w]; empty: 1x1 (Conv2D), the pool size (pooling)
    bool samePadding = false;  // padding "same" (else "valid")
    Shape dilationRate{1, 1};
    int64_t groups = 1;
    // MaxPooling2D, AveragePooling2D
    Shape poolSize{2, 2};
    // BatchNormalization, LayerNormalization (axis -1 only)
    double momentum = 0.99;  // BatchNormalization
    double epsilon = 1e-3;
    bool center = true;  // beta
    bool scale = true;   // gamma
    InitializerSpec gammaInitializer{.name = "ones"};
    InitializerSpec betaInitializer{.name = "zeros"};
    InitializerSpec movingMeanInitializer{.name = "zeros"};
    InitializerSpec movingVarianceInitializer{.name = "ones"};
    // ZeroPadding2D: [top, bottom, left, right]
    Shape zeroPadding{1, 1, 1, 1};
    // Rescaling: x * rescale + offset
    double rescale = 1.0;
    double offset = 0.0;
    // Resizing, CenterCrop, RandomCrop: the output's height and width (Keras' height, width)
    int64_t targetHeight = 0, targetWidth = 0;
    // Resizing, RandomRotation, RandomZoom, RandomTranslation
    InterpolationKind interpolation = InterpolationKind::Bilinear;
    bool cropToAspectRatio = false, padToAspectRatio = false;  // Resizing (at most one)
    // RandomRotation, RandomZoom, RandomTranslation: how positions outside the image are filled
    // (Resizing's padding is always "constant", the only mode Keras has for it)
    FillModeKind fillMode = FillModeKind::Reflect;
    double fillValue = 0.0;  // "constant" fill, Resizing's padding
    FlipModeKind flipMode = FlipModeKind::HorizontalAndVertical;  // RandomFlip
    // RandomRotation (fractions of 2 pi), RandomContrast, RandomBrightness (Keras' `factor`)
    FactorRange factor;
    // RandomZoom, RandomTranslation: height_factor and width_factor (RandomZoom without one zooms
    // the width as the height; RandomTranslation needs one)
    FactorRange heightFactor;
    std::optional<FactorRange> widthFactor;
    // RandomContrast, RandomBrightness: value_range, the values are clipped to
    double valueLow = 0.0, valueHigh = 255.0;
    // Dropout and the Random* layers: `seed` above (none: derived from the training seed)

    bool operator==(const LayerSpec&) const = default;  // field by field (tests, round trips)
};

struct ModelSpec {
    std::string name = "sequential";
    std::vector<LayerSpec> layers;  // may start with an Input layer

    bool operator==(const ModelSpec&) const = default;
};

// Per-layer result of shape inference.
struct LayerInfo {
    std::string name;
    std::string typeName;  // "Dense"
    Shape outputShape;     // without batch dim
    int64_t params = 0;
    int64_t trainableParams = 0;
};

struct ModelInfo {
    Shape inputShape;  // without batch dim
    Shape outputShape;
    std::vector<LayerInfo> layers;  // excludes the Input layer, as Keras' summary does
    int64_t totalParams = 0;
    int64_t trainableParams = 0;
    int64_t nonTrainableParams = 0;
    // f32 forward activations, for the memory estimate: the sum over the layers in `layers` (so
    // not the InputLayer, nor the input batch itself) of numElements(outputShape) * 4 bytes.
    // Weights, gradients and optimizer slots are not counted; a training step keeps roughly twice
    // this (activations plus their gradients), which callers multiply in themselves.
    int64_t activationBytesPerSample = 0;
    // f32 bytes per sample of the forward values a training step keeps until its backward pass
    // reads them (a Dense/Conv2D input for its kernel gradient, a normalization's input, a max
    // pooling's input, an activation's output or input), the part of a step's memory that grows
    // with the batch besides the activations themselves.
    int64_t keptForBackwardBytesPerSample = 0;
};

// The geometry of a 2-D window (Keras/TensorFlow padding rules): "same" gives ceil(in / stride)
// outputs with the padding split evenly, the odd one at the bottom / right; "valid" gives
// floor((in - span) / stride) + 1, where span = (k - 1) * dilation + 1.
struct Window2D {
    int64_t outH = 0, outW = 0;
    Shape pads{0, 0, 0, 0};  // top, bottom, left, right
};
// Errors say what does not fit ("kernel 5x5 is larger than the input 3x3 with padding valid").
Result<Window2D> windowGeometry(int64_t h, int64_t w, const Shape& kernel, const Shape& strides,
                                const Shape& dilation, bool same, const char* what);

// The initializer of a parameter by its name's suffix ("kernel", "bias", "gamma", "beta",
// "moving_mean", "moving_variance").
const InitializerSpec& initializerFor(const LayerSpec& layer, const std::string& suffix);
// Strides as a window layer uses them (its default when empty).
Shape effectiveStrides(const LayerSpec& layer);

// The part of an h x w image that a resizing layer resizes to its target size: rows
// [top, top + height), columns [left, left + width). It reaches outside the image where Resizing
// pads to the aspect ratio (those positions read its fill_value). `crop` says it is a plain crop
// of the target's size (nothing is resized).
struct ResizeBox {
    int64_t top = 0, left = 0, height = 0, width = 0;
    bool crop = false;

    bool operator==(const ResizeBox&) const = default;
};
// Keras' smart_resize: the largest centered box of the target's aspect ratio, at least one pixel
// each way (float32: the arithmetic of TensorFlow's graph, as Resizing's crop_to_aspect_ratio;
// else Python's doubles, as smart_resize on static shapes).
ResizeBox smartResizeBox(int64_t h, int64_t w, int64_t targetH, int64_t targetW, bool float32);
// Resizing (the whole image, or cropped or padded to the aspect ratio as Keras 3 does), CenterCrop
// (a centered crop, or smart_resize where the image is smaller than the target) and RandomCrop at
// inference (smart_resize); other layers: none (an empty box).
ResizeBox resizeBoxFor(const LayerSpec& layer, int64_t h, int64_t w);

// Keras' default name prefix of a layer type: "input_layer", "flatten", "reshape", "dense",
// "dropout", "activation". Generated names are prefix, prefix_1, prefix_2, ... per type.
const char* defaultLayerNamePrefix(LayerType t);

// Validates the model and infers shapes. Errors name the layer index (0-based position in
// model.layers, the same index as "layers[i]" in the Keras JSON), its name and what was expected,
// e.g. "layer 2 'reshape': cannot reshape [784] into [30,30]".
// Fills in generated names for layers with an empty name; duplicate explicit names are an error.
// The input shape comes from an InputLayer at position 0 or from layers[0].inputShape; a later
// layer's non-empty inputShape must equal the shape that reaches it.
Result<ModelInfo> inferShapes(ModelSpec& model);

// Keras-style model.summary() text, in the classic Keras 2 layout (plain ASCII '_' and '=' rules,
// "Layer (type)  Output Shape  Param #", shapes as "(None, 128)", counts with thousands separators,
// then Total / Trainable / Non-trainable params). Every line ends with '\n'; no trailing spaces.
std::string summaryTable(const ModelSpec& model, const ModelInfo& info);

// 101770 -> "101,770"
std::string formatThousands(int64_t n);

}  // namespace td
