// Keras 3 `.keras` files: a zip holding metadata.json, config.json (the model serialized as Keras'
// serialize_keras_object writes it: modelToKerasJson) and model.weights.h5
// (keras_weights_h5.h). keras.saving.load_model reads what saveKerasArchive writes;
// loadKerasArchive reads what keras' model.save("m.keras") writes, for the layers TrainDeck has.
#pragma once

#include <string>
#include <vector>

#include "engine/core/result.h"
#include "engine/io/model_weights.h"

namespace td {

// The archive's bytes; checks the weights against the model first (checkWeights).
// metadata.json's date_saved is `savedAtSeconds` (Unix time, UTC) when given, so that the same
// weights saved at the same time give the same bytes (a stored run's model exported twice, here
// or over SSH); 0: now.
Result<std::string> kerasArchiveBytes(const ModelWeights& weights, int64_t savedAtSeconds = 0);
// Atomic write (temporary file, fsync, rename). Errors name `path`.
Status saveKerasArchive(const ModelWeights& weights, const std::string& path,
                        int64_t savedAtSeconds = 0);

struct KerasArchive {
    ModelWeights weights;
    std::string kerasVersion;  // metadata.json's keras_version ("" when absent)
    // config.json's compile_config as JSON text (the optimizer, loss and metrics model.compile
    // was given); "" when the model was saved uncompiled.
    std::string compileConfigJson;
    std::vector<std::string> warnings;  // Keras keys accepted but not applied (modelFromKerasJson)
};
// Parses archive bytes; `fileName` names the file in every error: "m.keras: config.json:
// config.layers[2]: ...", "m.keras: model.weights.h5: layers/dense_1/vars: 1 variable, expected
// 2 (kernel [128,10], bias [10]) for layer 2 'dense_1' (Dense)", "m.keras: not a zip archive ...".
Result<KerasArchive> parseKerasArchive(const std::string& bytes, const std::string& fileName);
// Reads and parses a file (at most 4 GiB).
Result<KerasArchive> loadKerasArchive(const std::string& path);

// The weights of `path` for `model` (a project's initial_weights): every weighted layer of the
// model takes the variables of the file's layer with the same name, which must have the same
// type and shapes. Errors name the file and the layer: "w.keras: layer 2 'dense_1' (Dense): no
// layer of that name in the file (its layers with weights: dense, dense_2)".
Result<ModelParams> loadWeightsFor(const ModelSpec& model, const std::string& path);

}  // namespace td
