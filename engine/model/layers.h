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

enum class LayerType { Input, Flatten, Reshape, Dense, Dropout, Activation };
enum class ActivationKind { Linear, Relu, LeakyRelu, Elu, Gelu, Sigmoid, Tanh, Softmax };

const char* layerTypeName(LayerType t);   // Keras class name: "InputLayer", "Dense", ...
Result<LayerType> parseLayerType(const std::string& kerasClassName);
const char* activationName(ActivationKind a);  // "linear", "relu", "leaky_relu", ...
Result<ActivationKind> parseActivation(const std::string& name);

// Keras initializer by name with its config values.
struct InitializerSpec {
    std::string name = "glorot_uniform";  // glorot_uniform, glorot_normal, he_uniform,
                                          // he_normal, lecun_uniform, lecun_normal, zeros, ones,
                                          // constant, random_uniform, random_normal,
                                          // truncated_normal
    double value = 0.0;                   // constant
    double minval = -0.05, maxval = 0.05; // random_uniform
    double mean = 0.0, stddev = 0.05;     // random_normal, truncated_normal
    std::optional<uint64_t> seed;
};

struct RegularizerSpec {
    double l1 = 0.0;
    double l2 = 0.0;
    bool active() const { return l1 != 0.0 || l2 != 0.0; }
};

struct LayerSpec {
    LayerType type = LayerType::Dense;
    std::string name;           // unique within the model; generated ("dense_1") when empty
    bool trainable = true;
    Shape inputShape;           // InputLayer / first layer's input shape, without batch dim
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
    Shape targetShape;          // may hold one -1
};

struct ModelSpec {
    std::string name = "sequential";
    std::vector<LayerSpec> layers;  // may start with an Input layer
};

// Per-layer result of shape inference.
struct LayerInfo {
    std::string name;
    std::string typeName;       // "Dense"
    Shape outputShape;          // without batch dim
    int64_t params = 0;
    int64_t trainableParams = 0;
};

struct ModelInfo {
    Shape inputShape;           // without batch dim
    Shape outputShape;
    std::vector<LayerInfo> layers;  // excludes the Input layer, as Keras' summary does
    int64_t totalParams = 0;
    int64_t trainableParams = 0;
    int64_t nonTrainableParams = 0;
    int64_t activationBytesPerSample = 0;  // f32 forward activations, for the memory estimate
};

// Validates the model and infers shapes. Errors name the layer index, its name and what was
// expected, e.g. "layer 2 'reshape': cannot reshape [784] into [30,30]".
// Fills in generated names for layers with an empty name.
Result<ModelInfo> inferShapes(ModelSpec& model);

// Keras-style model.summary() text.
std::string summaryTable(const ModelSpec& model, const ModelInfo& info);

}  // namespace td
