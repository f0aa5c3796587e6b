// Project files: one JSON schema holding model, data, training, precision, fusion and strategy.
// The "model" member is Keras model.to_json() topology of a Sequential model.
#pragma once

#include <string>

#include "engine/core/result.h"
#include "engine/data/data_config.h"
#include "engine/model/layers.h"
#include "engine/train/train_config.h"

namespace td {

enum class PrecisionPolicy { Float32, MixedFloat16, MixedBfloat16 };
const char* precisionName(PrecisionPolicy p);  // "float32", "mixed_float16", "mixed_bfloat16"

struct StrategyConfig {
    std::string type = "one_device";  // "one_device", "mirrored", "multi_worker_mirrored"
    std::vector<std::string> devices;  // e.g. {"cpu:0"}; empty = default / all detected
    int replicas = 0;                  // mirrored on CPU: number of logical CPU replicas
};

struct Project {
    std::string name = "untitled";
    std::string description;
    ModelSpec model;
    DataConfig data;
    TrainConfig training;
    PrecisionPolicy precision = PrecisionPolicy::Float32;
    bool fusion = true;
    StrategyConfig strategy;
};

// Parse and validate. Errors name the file and the field path, e.g.
// "project.json: training.optimizer.learning_rate: expected a positive number, got -1".
Result<Project> parseProject(const std::string& jsonText, const std::string& fileName = "project");
Result<Project> loadProject(const std::string& path);
std::string projectToJson(const Project& p);  // pretty-printed, parses back to an equal Project
Status saveProject(const Project& p, const std::string& path);  // atomic (write temp + rename)

// Field-by-field comparison (tests, round trips): "" when equal, else the project-file path of the
// first field that differs, e.g. "training.optimizer.config.beta_1" or "model.config.layers[2]".
std::string projectDifference(const Project& a, const Project& b);

// Keras model.to_json() text for a Sequential model, and back.
Result<ModelSpec> modelFromKerasJson(const std::string& jsonText);
std::string modelToKerasJson(const ModelSpec& model);

}  // namespace td
