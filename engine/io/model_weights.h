// A model's weights outside a training run: what the exporters write and the importers read.
//
// Parameters are keyed by the engine's names, "<layer name>/<variable>" ("dense/kernel",
// "dense/bias"), the names the graph builder gives its parameter nodes. weightLayout() is the one
// table of which variables each layer type has, in Keras' order and with Keras' shapes; a layer
// type missing from it cannot be exported or imported, and says so by name.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "engine/core/result.h"
#include "engine/core/tensor.h"
#include "engine/model/layers.h"

namespace td {

using ModelParams = std::map<std::string, Tensor>;  // "dense/kernel" -> f32 tensor

// A model and its weights (every parameter weightLayout() lists, f32).
struct ModelWeights {
    ModelSpec model;  // names filled in (inferShapes has run)
    ModelParams params;
};

struct WeightSlot {
    std::string param;     // "dense/kernel"
    std::string variable;  // "kernel"
    Shape shape;
};

struct LayerWeights {
    size_t layerIndex = 0;  // position in model.layers (the InputLayer included)
    std::string name;       // "dense"
    std::string typeName;   // Keras class name, "Dense"
    Shape inputShape;       // without the batch dimension
    Shape outputShape;
    std::vector<WeightSlot>
        variables;  // Keras' variable order (Dense: kernel [in, out], bias [out])
};

// Every layer after the InputLayer, in order, with its variables. Errors: an invalid model
// (inferShapes' message), or a layer type this table does not know: "layer 3 'x' (T): layer
// type T cannot be exported or imported yet". Conv2D: kernel [kh, kw, in / groups, filters],
// bias; BatchNormalization: gamma, beta (where scale / center), moving_mean, moving_variance;
// LayerNormalization: gamma, beta.
Result<std::vector<LayerWeights>> weightLayout(const ModelSpec& model);

// Checks that `params` holds every slot of the layout with its shape (f32) and nothing else.
// `source` names where the weights came from: "w.keras: layer 2 'dense_1' (Dense): kernel has
// shape [64,10], expected [128,10]".
Status checkWeights(const std::vector<LayerWeights>& layout, const ModelParams& params,
                    const std::string& source);

// Keras' snake_case of a class name ("Dense" -> "dense", "BatchNormalization" ->
// "batch_normalization", "Conv2D" -> "conv2d"), the prefix Keras names weight groups with.
std::string kerasSnakeCase(const std::string& className);

}  // namespace td
