// Project files: one JSON schema holding model, data, training, precision, fusion and strategy.
// The "model" member is Keras model.to_json() topology of a Sequential model.
#pragma once

#include <string>
#include <vector>

#include "engine/core/data_config.h"
#include "engine/core/result.h"
#include "engine/core/run_config.h"
#include "engine/core/train_config.h"
#include "engine/model/layers.h"

namespace td {

struct Project {
    std::string name = "untitled";
    std::string description;
    ModelSpec model;
    DataConfig data;
    TrainConfig training;
    PrecisionPolicy precision = PrecisionPolicy::Float32;
    // mixed_float16's dynamic loss scaling ("loss_scale"; Keras' LossScaleOptimizer arguments):
    // the scale to start from and the finite steps after which it doubles.
    double lossScaleInitial = 32768.0;
    int64_t lossScaleGrowthSteps = 2000;
    bool fusion = true;  // false: every fusing pass is off
    // Compiler passes turned off by name (checked against the compiler's list when a session is
    // created): "fusion", "fold_casts", "fuse_act_bias_grad", "fuse_elementwise",
    // "fuse_softmax_xent", "fuse_update", "dce".
    std::vector<std::string> disabledPasses;
    StrategyConfig strategy;
    // A Keras 3 .keras file whose weights the parameters start from instead of their
    // initializers ("initial_weights"; empty = none). Checked against the model when a session
    // is created. Relative paths resolve against the project's folder, as data paths do.
    std::string initialWeights;
    // Set by parseProject, never saved: keys of the Keras model that were accepted but are not
    // applied ("model.config.layers[1].config.dtype.config.name: dtype 'mixed_float16' is not
    // applied per layer; ..."). Front ends show them when they open the project.
    std::vector<std::string> warnings;
};

// Parse and validate (schema: docs/PROJECT_FORMAT.md). Errors name the file and the field path,
// e.g. "project.json: training.optimizer.config.learning_rate: expected a positive number, got -1".
// Relative data paths resolve against fileName's folder (left as written when fileName has none).
// The model is checked with inferShapes, so the returned layers all have names.
Result<Project> parseProject(const std::string& jsonText, const std::string& fileName = "project");
// Reads and parses a file; relative data paths become absolute (against the file's folder).
Result<Project> loadProject(const std::string& path);
// Every field, 2-space indent, the model in the Keras 3 to_json() form; parses back to an equal
// Project.
std::string projectToJson(const Project& p);
// Atomic (temp file in the same folder + fsync + rename). Data paths inside the target's folder are
// written relative to it.
Status saveProject(const Project& p, const std::string& path);

// The host resources a run of `p` takes, checked before anything is allocated: a memory plan
// (parameters with their gradients and optimizer state, activations of a batch, the synthetic
// source, the training and evaluation pipelines' batch slots) against hostMemoryBudget(), and the
// pipeline's thread count against maxParallelCalls() (engine/data/resource_plan.h). `info` is
// inferShapes(p.model). Errors start with the field that sizes the largest item, e.g.
// "data.pipeline.prefetch: needs about 1.8 PiB of host memory, over the budget of 15.5 GiB
// (physical memory; set TRAINDECK_MEMORY_BUDGET to change it): ...". File sources are sized by
// their readers, from their headers, before they allocate.
Status checkProjectResources(const Project& p, const ModelInfo& info);

// Field-by-field comparison (tests, round trips): "" when equal, else the project-file path of the
// first field that differs, e.g. "training.optimizer.config.beta_1" or "model.config.layers[2]".
std::string projectDifference(const Project& a, const Project& b);

// Keras model.to_json() text for a Sequential model, and back. Reads what Keras 2.x and 3.x write
// (errors name the JSON path, e.g. "config.layers[2].config.units: ..."; keys accepted but not
// applied go to `warnings` when given); does not run inferShapes, so empty names stay empty.
// Writes the Keras 3 form (compact, like to_json()) that every Keras 3 release reads; the text
// parses back to an equal ModelSpec.
Result<ModelSpec> modelFromKerasJson(const std::string& jsonText,
                                     std::vector<std::string>* warnings = nullptr);
std::string modelToKerasJson(const ModelSpec& model);

}  // namespace td
